"""Issue #13 for `torchkit extract-features`: OUT never is, contains or lies inside an input (the
images, a CSV index and its images, the model file, --stats), --force replaces only an earlier
extract-features OUT, SIGTERM before the first rows puts nothing at risk and stops the workers,
SIGTERM after them keeps a resumable OUT, a second run on the same OUT is refused while the
first runs, and a full disk is `Error: cannot write` (exit 1), never SIGBUS, with the old OUT
back in place. Signals, a lock held by a running extraction and a full disk are real
`python -m torchkit` processes; refusals and finished runs run in this process."""

from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from disks import fill_disk
from output_checks import error_line, hidden_siblings, tree_digest
from processes import (
    processes_in_group,
    run_each_in_process,
    run_torchkit_in_process,
    run_torchkit_process,
    signal_and_wait,
    start_torchkit_process,
    wait_until,
)
from safety_world import check_locked_then_terminated, write_world

FEATURES = ["extract-features", "run/best.pt", "ds", "--workers", "0", "-l", "features.5"]
GATED = [
    "extract-features", "gatemod:Gated", "ds", "-l", "body", "--image-size", "8",
    "--resize-size", "8", "--workers", "2", "--batch-size", "2", "--allow-untrained",
]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Every input extract-features reads, made once: an image folder `ds` (6 8x8 images), a
    CSV index naming them, a torchkit checkpoint `run/best.pt`, a stats file, a gated model."""
    return write_world(tmp_path_factory.mktemp("features-safety"))


def older_output(folder: Path, *, marker: bool) -> None:
    """An OUT as an earlier extract-features wrote it (with or before the `.torchkit` marker)."""
    folder.mkdir()
    np.save(folder / "features.5.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
    (folder / "index.csv").write_text("row,path,label,error\n0,a/a_0.png,a,\n")
    meta = {"fingerprint": "0" * 64, "layers": [{"name": "features.5", "file": "features.5.npy"}]}
    (folder / "meta.json").write_text(json.dumps(meta))
    if marker:
        (folder / ".torchkit").write_text('{"written_by": "torchkit"}\n')


def refused(args: list[str], cwd: Path):
    """Run `torchkit ARGS` in `cwd`: it must fail (exit 1) with one `Error:` line."""
    result = run_torchkit_in_process(*args, cwd=cwd)
    assert result.returncode == 1, result.stderr
    error_line(result.stderr, besides="nothing")
    return result


OVERLAPS = [
    (["ds", "--force"], "output folder ds is the IMAGES folder ds"),
    (["ds/a", "--force"], "output folder ds/a lies inside the IMAGES folder ds"),
    (["ds", "--resume"], "output folder ds is the IMAGES folder ds"),
    (["run", "--force"], "output folder run contains the model file run/best.pt"),
    (["run/best.pt", "--force"], "output folder run/best.pt is the model file run/best.pt"),
    ([".", "--force"], "output folder . is the working directory"),
    (["..", "--force"], "output folder .. is a parent of the working directory"),
    (["stats.json", "--stats", "stats.json", "--force"], "is the stats file stats.json"),
]
CSV_OVERLAPS = [  # IMAGES is a CSV index: the index itself and the folders of its images
    (["index.csv", "--force"], "output folder index.csv is the IMAGES file index.csv"),
    (["ds", "--force"], "output folder ds contains the images of index.csv"),
]


def test_outputs_that_overlap_an_input_are_refused_and_nothing_changes(world):
    before = tree_digest(world)
    commands = [[*FEATURES, *args] for args, _ in OVERLAPS]
    commands += [
        ["extract-features", "run/best.pt", "index.csv", *args] for args, _ in CSV_OVERLAPS
    ]
    results = run_each_in_process(commands, cwd=world)
    for (args, message), result in zip(OVERLAPS + CSV_OVERLAPS, results, strict=True):
        assert result.returncode == 1, (args, result.stderr)
        assert message in error_line(result.stderr, besides="nothing"), args
    assert tree_digest(world) == before  # the inputs' bytes, and no new file anywhere


def test_force_replaces_an_earlier_extraction_and_nothing_else(world, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    with_extra = tmp_path / "with_extra"  # an earlier OUT the user has added a file to
    older_output(with_extra, marker=False)
    (with_extra / "notes.txt").write_text("mine too")
    for folder in (mine, with_extra):
        before = tree_digest(folder)
        result = refused([*FEATURES, str(folder), "--force"], world)
        assert "was not written by torchkit" in result.stderr
        assert tree_digest(folder) == before

    older = tmp_path / "older"
    older_output(older, marker=False)  # written before the .torchkit marker existed
    done = run_torchkit_in_process(*FEATURES, str(older), "--force", cwd=world)
    assert done.returncode == 0, done.stderr
    assert np.load(older / "features.5.npy").shape == (6, 64)
    assert json.loads((older / "meta.json").read_text())["num_rows"] == 6
    assert (older / ".torchkit").is_file() and not (older / ".partial").exists()
    assert hidden_siblings(older) == []


def test_sigterm_before_the_first_rows_leaves_the_old_out_and_no_process(world, tmp_path):
    previous = tmp_path / "previous"
    older_output(previous, marker=True)
    before = tree_digest(previous)
    started = tmp_path / "started"
    process = start_torchkit_process(
        *GATED, str(previous), "--force", cwd=world, env={"GATE_FILE": str(started)}
    )
    second = [*FEATURES, str(previous), "--force"]
    check_locked_then_terminated(process, started, second, cwd=world)
    assert tree_digest(previous) == before  # byte for byte
    assert hidden_siblings(previous) == []  # no lock, no set-aside folder


def test_sigterm_after_the_first_rows_keeps_a_resumable_out(world, tmp_path):
    out = tmp_path / "out"
    older_output(out, marker=True)
    started = tmp_path / "started"
    env = {"GATE_FILE": str(started), "GATE_AT": "2"}  # the first batch of 2 gets written
    process = start_torchkit_process(*GATED, str(out), "--force", cwd=world, env=env)
    try:
        wait_until(started.exists, process=process, what="the second batch")
    finally:
        code, _, err = signal_and_wait(process, signal.SIGTERM)
    assert code == 143, err
    assert "add --resume to continue" in err
    wait_until(lambda: not processes_in_group(process.pid), what="the workers to exit")
    progress = json.loads((out / ".partial" / "progress.json").read_text())
    assert (progress["done"], progress["rows"]) == (2, 2)
    assert not (out / "meta.json").exists() and not (out / "features.5.npy").exists()
    assert hidden_siblings(out) == []  # the replaced OUT is gone, as is the lock

    resumed = run_torchkit_in_process(*GATED, str(out), "--resume", "--workers", "0", cwd=world)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at image 3" in resumed.stderr
    assert np.load(out / "body.npy").shape == (6, 16)
    assert not (out / ".partial").exists()


def test_a_sigkilled_runs_arrays_are_cleared_but_an_array_of_yours_beside_them_is_kept(
    world, tmp_path
):
    """A run SIGKILLed once its first rows are being written leaves its arrays in .partial,
    each named with its row shape and dtype by the run's record (written before the arrays
    are made): --force clears them, --resume continues. An array of yours put there is
    refused by both, named, and kept: any valid .npy there passed --force and was deleted,
    and --resume deleted it with .partial."""
    import shutil

    out, mine, again = tmp_path / "out", tmp_path / "mine", tmp_path / "again"
    started = tmp_path / "started"
    env = {"GATE_FILE": str(started), "GATE_AT": "2"}  # the first batch of 2 is being written
    process = start_torchkit_process(*GATED, str(out), cwd=world, env=env)
    try:
        wait_until(started.exists, process=process, what="the second batch")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=60)
    assert sorted(p.name for p in (out / ".partial").iterdir()) == ["body.npy", "progress.json"]
    shutil.copytree(out, mine)
    shutil.copytree(out, again)
    np.save(mine / ".partial" / "umap.npy", np.zeros((6, 2), np.float32))  # the user's
    before = tree_digest(mine)

    forced, continued, cleared, resumed = run_each_in_process(
        [
            [*GATED, str(mine), "--force", "--workers", "0"],
            [*GATED, str(mine), "--resume", "--workers", "0"],
            [*GATED, str(out), "--force", "--workers", "0"],
            [*GATED, str(again), "--resume", "--workers", "0"],
        ],
        cwd=world,
    )
    for refused, option in ((forced, "--force"), (continued, "--resume")):
        assert refused.returncode == 1, refused.stderr
        line = error_line(refused.stderr)
        assert f"holds {mine}/.partial/umap.npy that torchkit did not write" in line
        assert f"which {option} would delete with it" in line
        place = mine / ".partial" if option == "--resume" else mine  # what it would delete
        assert f"(move them out of {place}, or delete them yourself)" in line
    assert tree_digest(mine) == before
    for done, folder in ((cleared, out), (resumed, again)):
        assert done.returncode == 0, done.stderr
        assert np.load(folder / "body.npy").shape == (6, 16)
        assert not (folder / ".partial").exists() and hidden_siblings(folder) == []


def test_full_disk_is_an_error_not_sigbus_and_the_old_out_comes_back(world, small_tmpfs):
    disk = small_tmpfs(256)
    out = disk / "out"
    older_output(out, marker=True)
    before = tree_digest(out)
    # Leave 16 KiB: less than the 6 x 32 x 6 x 6 float32 maps of the first convolution.
    fill_disk(disk, leave=16 * 1024)
    args = ["-l", "features.0", "--pool", "none", "--batch-size", "2"]
    result = run_torchkit_process(*FEATURES[:-2], str(out), *args, "--force", cwd=world)
    assert result.returncode == 1, (result.returncode, result.stderr)  # SIGBUS would be -7
    assert "Error: cannot write " in result.stderr and "No space left" in result.stderr
    assert "Traceback" not in result.stderr
    assert tree_digest(out) == before  # nothing half-written under OUT: the old one, as it was
    assert sorted(os.listdir(disk)) == ["filler", "out"]


def test_a_report_for_a_run_is_refused_before_the_old_out_is_touched(world, small_tmpfs):
    """`extract-features ... OUT --force -o REPORT`: a run has no -o report (-o is the
    --list-layers listing's), so a REPORT that a full disk would refuse can never cost OUT; the
    usage error comes first, with OUT and REPORT as they were."""
    disk = small_tmpfs(64)
    out = disk / "out"
    older_output(out, marker=True)
    before = tree_digest(out)
    report = disk / "report.json"
    report.write_text('{"old": "report"}\n')
    fill_disk(disk)
    result = run_torchkit_in_process(*FEATURES, str(out), "--force", "-o", str(report), cwd=world)
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr, besides="nothing").startswith(
        "Error: -o/--output applies to the --list-layers listing; a run writes its features to OUT"
    )
    assert tree_digest(out) == before
    assert report.read_text() == '{"old": "report"}\n'
    assert sorted(os.listdir(disk)) == ["filler", "out", "report.json"]


def test_reserving_the_arrays_falls_back_or_fails_cleanly(tmp_path, monkeypatch):
    """Where posix_fallocate is not supported a new array is filled with zeros instead (its
    header untouched); a full disk while reserving is one OutputWriteError naming OUT."""
    from numpy.lib.format import open_memmap

    from torchkit.core.features.store import reserve_space
    from torchkit.core.io.errors import OutputWriteError

    path = tmp_path / "layer.npy"
    array = open_memmap(path, mode="w+", dtype="float32", shape=(4096, 16))

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    reserve_space(path, tmp_path, zero_fill_from=array.offset)
    assert os.stat(path).st_blocks * 512 >= array.nbytes  # every data page is on disk now
    array[:] = 1.5
    array.flush()
    assert np.load(path).shape == (4096, 16) and np.all(np.load(path) == 1.5)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OutputWriteError, match=f"cannot write {tmp_path}: No space left"):
        reserve_space(path, tmp_path)


@pytest.mark.parametrize("model", [["convnet"], ["--model", "convnet"]])
def test_an_interrupt_with_out_after_model_option_keeps_its_note_and_exit_code(
    model, tmp_path, monkeypatch
):
    # With --model, OUT comes in IMAGES' place as text: the interrupt's note joined it to a name
    # and failed with `Error: TypeError ...` and exit 1, instead of 130 and the note.
    import torchkit.core.features as features

    out = tmp_path / "out"

    def interrupted(request, **_):
        (Path(request.out) / ".partial").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(features, "extract_features", interrupted)
    done = run_torchkit_in_process("extract-features", *model, "digits", out, "--allow-untrained")
    assert done.returncode == 130, done.stderr
    assert f"the rows done so far are kept in {out}; add --resume to continue" in done.stderr
