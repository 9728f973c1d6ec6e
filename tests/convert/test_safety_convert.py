"""Issue #13 for `convert tensor`, `convert cifar` and `convert checkpoint`: no output (DST, -o)
may be, contain or lie inside an input; `--force` replaces only torchkit's own folders; a full
disk is one `Error: cannot write` line, never a skipped input, and leaves no half-written DST;
SIGTERM and SIGINT stop the workers of `-j 2` at once and leave the old DST as it was; special
files are written into, never replaced."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from disks import FifoReader, fill_disk, slow_io_env
from format_files import npy
from image_folders import write_image_folder
from output_checks import check_refused_untouched, error_line, tree_digest
from processes import (
    processes_in_group,
    run_torchkit_in_process,
    run_torchkit_process,
    signal_and_wait,
    start_torchkit_process,
    wait_until,
)

from torchkit.cli import app

CLASSES = [f"class_{i}" for i in range(10)]


def write_cifar10(root: Path, *, train: int = 10, test: int = 10, seed: int = 0) -> Path:
    """A CIFAR-10 python folder (one training batch) in the real format: pickled dicts of
    3072-byte uint8 rows and labels."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    for name, count in (("data_batch_1", train), ("test_batch", test)):
        batch = {
            b"data": rng.integers(0, 256, (count, 3072), dtype=np.uint8),
            b"labels": [int(x) for x in rng.integers(0, 10, count)],
        }
        (root / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {b"label_names": [name.encode() for name in CLASSES]}
    (root / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return root


def write_state_dict(path: Path) -> Path:
    import torch

    torch.manual_seed(0)
    torch.save({"module.w": torch.rand(4, 4), "module.b": torch.rand(4)}, path)
    return path


@pytest.fixture(scope="module")
def _template(tmp_path_factory) -> Path:
    """Every kind of input these commands read, made once: an image folder `src`, one image,
    a CIFAR-10 folder `data/cifar` and the same as `cifar.tar.gz`, a checkpoint `ck.pt` and a
    symlink to it, and `mine/`, a folder of the user's own files."""
    root = tmp_path_factory.mktemp("template")
    write_image_folder(root / "src", {"a": 3, "b": 2})
    shutil.copy(root / "src" / "a" / "a_0.png", root / "one.png")
    write_cifar10(root / "data" / "cifar")
    with tarfile.open(root / "cifar.tar.gz", "w:gz") as tar:
        tar.add(root / "data" / "cifar", arcname="cifar-10-batches-py")
    write_state_dict(root / "ck.pt")
    (root / "ck-link.pt").symlink_to("ck.pt")
    (root / "src-link").symlink_to("src")
    (root / "mine").mkdir()
    (root / "mine" / "thesis.txt").write_text("years of work")
    return root


# -- outputs that are, contain or lie inside an input: refused before any work ------------------


REFUSED = {
    "tensor DST=SRC folder": (
        ["convert", "tensor", "src", "src", "--to", "npy", "--force"],
        "output folder src is the source folder src",
    ),
    "tensor DST inside SRC": (
        ["convert", "tensor", "src", "src/arrays", "--to", "npy"],
        "lies inside the source folder src",
    ),
    "tensor SRC inside DST": (
        ["convert", "tensor", "src/a", "src", "--to", "npy", "--force"],
        "output folder src contains the source folder src/a",
    ),
    "tensor DST=.": (
        ["convert", "tensor", "src", ".", "--to", "npy", "--force"],
        "is the working directory",
    ),
    "tensor DST=..": (
        ["convert", "tensor", "src", "..", "--to", "npy", "--force"],
        "is a parent of the working directory",
    ),
    "tensor DST a link to SRC": (
        ["convert", "tensor", "src", "src-link", "--to", "npy", "--force"],
        "is the source folder src",
    ),
    "tensor --force over the user's folder": (
        ["convert", "tensor", "src", "mine", "--to", "npy", "--force"],
        "mine is not empty and was not written by torchkit",
    ),
    "tensor DST=SRC file": (
        ["convert", "tensor", "one.png", "one.png", "--force"],
        "output one.png is the source one.png",
    ),
    "tensor file into its own folder": (
        ["convert", "tensor", "src/a/a_0.png", "src/a", "--to", "png", "--force"],
        "is the source src/a/a_0.png",
    ),
    "tensor -o SRC": (
        ["convert", "tensor", "one.png", "one.npy", "-o", "one.png", "--force"],
        "report one.png is the source one.png",
    ),
    "tensor -o inside SRC": (
        ["convert", "tensor", "src", "arrays", "--to", "npy", "-o", "src/a/report.txt"],
        "report src/a/report.txt lies inside the source src",
    ),
    "tensor -o DST": (
        ["convert", "tensor", "one.png", "one.npy", "-o", "one.npy", "--force"],
        "report one.npy is the destination one.npy",
    ),
    "cifar DST=SRC": (
        ["convert", "cifar", "data/cifar", "data/cifar", "--force"],
        "is the CIFAR source data/cifar",
    ),
    "cifar DST inside SRC": (
        ["convert", "cifar", "data/cifar", "data/cifar/png"],
        "lies inside the CIFAR source data/cifar",
    ),
    "cifar SRC inside DST": (
        ["convert", "cifar", "data/cifar", "data", "--force"],
        "output folder data contains the CIFAR source data/cifar",
    ),
    "cifar DST=.": (["convert", "cifar", "cifar.tar.gz", ".", "--force"], "working directory"),
    "cifar DST=archive": (
        ["convert", "cifar", "cifar.tar.gz", "cifar.tar.gz", "--force"],
        "output folder cifar.tar.gz is the CIFAR source cifar.tar.gz",
    ),
    "cifar -o SRC": (
        ["convert", "cifar", "cifar.tar.gz", "png", "-o", "cifar.tar.gz", "--force"],
        "report cifar.tar.gz is the source cifar.tar.gz",
    ),
    "cifar --force over the user's folder": (
        ["convert", "cifar", "cifar.tar.gz", "mine", "--force"],
        "mine is not empty and was not written by torchkit",
    ),
    "checkpoint DST=SRC": (
        ["convert", "checkpoint", "ck.pt", "ck.pt", "--force"],
        "output ck.pt is the source checkpoint ck.pt",
    ),
    "checkpoint DST=SRC through a link": (
        ["convert", "checkpoint", "ck-link.pt", "ck.pt", "--force"],
        "output ck.pt is the source checkpoint ck-link.pt",
    ),
    "checkpoint -o SRC": (
        ["convert", "checkpoint", "ck.pt", "w.safetensors", "-o", "ck.pt", "--force"],
        "report ck.pt is the source ck.pt",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_output_over_an_input_is_refused_and_nothing_changes(work, case):
    check_refused_untouched(*REFUSED[case], cwd=work)


def test_force_replaces_torchkits_own_output_folder(work):
    convert = ["convert", "tensor", "src", "arrays", "--to", "npy", "-j", "0"]
    first = run_torchkit_in_process(*convert, cwd=work)
    assert first.returncode == 0, first.stderr
    assert json.loads((work / "arrays" / ".torchkit").read_text())["command"] == "convert tensor"
    again = run_torchkit_in_process(*convert, cwd=work)
    assert again.returncode == 1
    assert "already exists" in error_line(again.stderr, besides="warnings")
    (work / "arrays" / "stale.npy").write_bytes(npy())  # an earlier run's
    forced = run_torchkit_in_process(
        "convert", "tensor", "src", "arrays", "--to", "bmp", "--force", "-j", "0", cwd=work
    )
    assert forced.returncode == 0, forced.stderr
    names = sorted(str(p.relative_to(work / "arrays")) for p in (work / "arrays").rglob("*"))
    expected = ["a", "a/a_0.bmp", "a/a_1.bmp", "a/a_2.bmp", "b", "b/b_0.bmp", "b/b_1.bmp"]
    assert names == [".torchkit", *expected]  # stale.npy and the old .npy files are gone
    assert sorted(p.name for p in work.iterdir() if p.name.startswith(".")) == []


# -- a full or read-only disk: one error line, exit 1, the old DST as it was ----------------------


def old_output(folder: Path) -> dict[str, str]:
    """An earlier torchkit output at `folder` (it carries the marker): --force may replace it."""
    (folder / "a").mkdir(parents=True)
    (folder / ".torchkit").write_text('{"written_by": "torchkit"}\n')
    (folder / "a" / "old.npy").write_bytes(npy((7.0,)))
    return tree_digest(folder)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_convert_tensor_on_a_full_disk_is_an_error_not_skipped_inputs(work, small_tmpfs, workers):
    write_image_folder(work / "many", {"a": 30, "b": 30}, size=8)
    before = tree_digest(work)
    disk = small_tmpfs(96)  # a page per file: room for about 20 of the 60
    dst = disk / "dst"
    old = old_output(dst)
    done = run_torchkit_in_process(
        "convert", "tensor", "many", str(dst), "--to", "npy", "-j", workers, "--force", cwd=work
    )
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr, besides="warnings")
    assert line.startswith(f"Error: cannot write {dst}/")
    assert "No space left on device" in line
    assert "skipped" not in done.stderr and "Warning" not in done.stderr
    assert tree_digest(dst) == old  # the old output as it was, nothing half-written in it
    assert sorted(os.listdir(disk)) == ["dst"]  # no temporary folder, no lock left
    assert tree_digest(work) == before


def test_convert_tensor_short_write_on_a_full_disk_is_an_error(work, small_tmpfs):
    # Arrays of several pages: NumPy writes part of one and says "30000 requested and 16256
    # written", an OSError without errno, which must still read as the full disk it is.
    write_image_folder(work / "large", {"a": 8}, size=100)
    disk = small_tmpfs(152)  # 38 pages: four arrays of 8, the marker, and 4 pages of a fifth
    dst = disk / "dst"
    done = run_torchkit_in_process(
        "convert", "tensor", "large", str(dst), "--to", "npy", "-j", "0", cwd=work
    )
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr, besides="nothing")
    assert line.startswith(f"Error: cannot write {dst}/a/") and "No space left" in line
    assert os.listdir(disk) == []  # no half-written DST, no temporary folder


@pytest.mark.parametrize("suffix", ["safetensors", "png"])
def test_convert_tensor_file_on_a_full_disk_is_an_error(work, small_tmpfs, suffix):
    disk = fill_disk(small_tmpfs(64))
    np.save(work / "big.npy", np.zeros((64, 64, 3), dtype=np.uint8))
    target = disk / f"big.{suffix}"
    done = run_torchkit_in_process("convert", "tensor", "big.npy", str(target), cwd=work)
    assert done.returncode == 1
    assert f"Error: cannot write {target}: No space left" in error_line(
        done.stderr, besides="warnings"
    )
    assert os.listdir(disk) == ["filler"]  # no half-written file, no temporary


def test_convert_cifar_on_a_full_disk_is_an_error(work, small_tmpfs):
    disk = small_tmpfs(64)
    write_cifar10(work / "big", train=40, test=10)  # 50 PNGs of 3 KiB: more than 64 KiB
    done = run_torchkit_in_process(
        "convert", "cifar", "big", str(disk / "png"), "-j", "2", cwd=work
    )
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr, besides="warnings")
    assert line.startswith(f"Error: cannot write {disk}/png/") and "No space left" in line
    assert os.listdir(disk) == []


def test_convert_checkpoint_on_a_full_disk_is_an_error(work, small_tmpfs):
    disk = fill_disk(small_tmpfs(64))
    target = disk / "w.pt"  # torch.save says "unexpected pos" or "iostream error", no errno
    done = run_torchkit_in_process("convert", "checkpoint", "ck.pt", str(target), cwd=work)
    assert done.returncode == 1
    assert f"Error: cannot write {target}: No space left" in error_line(
        done.stderr, besides="warnings"
    )
    assert os.listdir(disk) == ["filler"]


def test_convert_tensor_on_a_read_only_disk_is_an_error(work, small_tmpfs):
    disk = small_tmpfs(64)
    remounted = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True)
    if remounted.returncode != 0:
        pytest.skip("cannot remount the tmpfs read-only")
    done = run_torchkit_in_process(
        "convert", "tensor", "src", str(disk / "dst"), "--to", "npy", cwd=work
    )
    assert done.returncode == 1
    line = error_line(done.stderr, besides="warnings")
    assert line.startswith(f"Error: cannot write {disk / 'dst'}") and "Read-only" in line
    assert os.listdir(disk) == []


# -- SIGTERM and SIGINT: workers stopped at once, nothing left behind ---------------------------


@pytest.fixture(scope="module")
def many_images(tmp_path_factory) -> Path:
    """200 tiny images: `-j 2` takes 5 s or more over them in `slowed_conversion`."""
    return write_image_folder(tmp_path_factory.mktemp("many") / "many", {"a": 100, "b": 100})


def slowed_conversion(many_images: Path, tmp_path: Path) -> dict[str, str]:
    """The environment of a conversion of `many_images` into TMP_PATH/dst whose every file
    put in place in the hidden folder that becomes DST takes 50 ms more (once it is there): a
    run that a signal reaches while it converts on any machine, at a few images' CPU, where
    2,000 images took a couple of seconds of both workers' CPU and a fast machine could finish
    first. (The hook's sitecustomize lies beside `many_images`: TMP_PATH holds DST alone.)"""
    return slow_io_env(
        many_images.parent,
        f"{tmp_path}{os.sep}.dst.",
        calls=("os.link", "os.rename", "os.replace"),
        delay=0.05,
        after=True,
    )


@pytest.mark.parametrize(
    ("signum", "to_group", "code", "said", "had_old"),
    [
        (signal.SIGTERM, False, 143, "Terminated.", False),  # kill PID, timeout
        (signal.SIGINT, False, 130, "Interrupted.", True),
        (signal.SIGTERM, True, 143, "Terminated.", True),  # kill -TERM -PGID, a scheduler
    ],
)
def test_signal_stops_the_workers_and_keeps_the_old_output(
    many_images, tmp_path, signum, to_group, code, said, had_old
):
    before = tree_digest(many_images)
    dst = tmp_path / "dst"
    old = old_output(dst) if had_old else None
    process = start_torchkit_process(
        "convert", "tensor", str(many_images), str(dst), "--to", "npy", "-j", "2", "--force",
        env=slowed_conversion(many_images, tmp_path),
    )  # fmt: skip

    def converting() -> bool:  # the hidden folder that becomes DST at the end has files
        return any(
            entry.is_dir() and any(entry.rglob("*.npy"))
            for entry in tmp_path.glob(".dst.*.partial")
        )

    wait_until(converting, process=process, what="the workers to write")
    if to_group:  # the workers get it too, and die of it: still a clean 143
        os.killpg(process.pid, signum)
    returncode, _, stderr = signal_and_wait(process, signum)
    assert returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == said
    assert processes_in_group(process.pid) == []  # no worker left running
    assert sorted(os.listdir(tmp_path)) == (["dst"] if had_old else [])  # no temporary, no lock
    if had_old:
        assert tree_digest(dst) == old
    assert tree_digest(many_images) == before


def test_killed_parent_takes_its_workers_along_and_frees_the_output_folder(many_images, tmp_path):
    """SIGKILL on the main process of `-j 2` (no handler runs): the workers end with it instead
    of waiting for work forever, holding DST's lock and the command's pipes."""
    dst = tmp_path / "dst"
    args = ("convert", "tensor", str(many_images), str(dst), "--to", "npy", "-j", "2")
    process = start_torchkit_process(*args, env=slowed_conversion(many_images, tmp_path))

    def converting() -> bool:
        return any(any(entry.rglob("*.npy")) for entry in tmp_path.glob(".dst.*.partial"))

    wait_until(converting, process=process, what="the workers to write")
    # Its pipes close (`torchkit ... | cat` ends) and no worker is left: they waited for work
    # for ever; waited for here as events, bounded for a loaded machine.
    returncode, _, _ = signal_and_wait(process, signal.SIGKILL, timeout=30)
    assert returncode == -signal.SIGKILL
    wait_until(lambda: not processes_in_group(process.pid), timeout=30, what="the workers to end")
    # DST is free: a new conversion into it runs (of four images: not the 2,000 again).
    few = write_image_folder(tmp_path / "few", {"a": 2, "b": 2})
    result = run_torchkit_in_process("convert", "tensor", str(few), str(dst), "--to", "npy")
    assert result.returncode == 0, result.stderr
    assert len(list(dst.rglob("*.npy"))) == 4


def _fail_or_sleep(chunk: int) -> int:
    import time

    from torchkit.core.io.errors import OutputWriteError

    if chunk == 0:
        raise OutputWriteError("cannot write x: full", "free some")
    if chunk == 1:
        return chunk
    time.sleep(300)  # far past the bound below: a busy machine's start of the workers fits
    return chunk


def _interrupt_on(value: int) -> None:
    if value == 1:
        raise KeyboardInterrupt


@pytest.mark.parametrize("how", ["worker error", "interrupt"])
def test_map_chunks_stops_at_once_and_leaves_no_worker(how):
    """The first error in a worker, or an interrupt in the parent, ends `map_chunks` without
    waiting for the running and queued chunks; a worker's TorchkitError reaches the parent as
    the same error, hint included."""
    import multiprocessing
    import time

    from torchkit.core.io.errors import OutputWriteError
    from torchkit.core.runtime.pool import map_chunks

    chunks = list(range(40)) if how == "worker error" else list(range(1, 40))
    expected = OutputWriteError if how == "worker error" else KeyboardInterrupt
    started = time.monotonic()
    with pytest.raises(expected) as raised:
        on_result = _interrupt_on if how == "interrupt" else (lambda _: None)
        map_chunks(_fail_or_sleep, chunks, workers=2, on_result=on_result)
    assert time.monotonic() - started < 100  # the running 300 s chunks were not waited for
    assert multiprocessing.active_children() == []
    if how == "worker error":
        assert raised.value.message == "cannot write x: full"
        assert raised.value.hint == "free some"


@pytest.mark.parametrize(
    "args",
    [
        ["tensor", "src", "arrays", "--to", "npy", "-j", "0", "-o", "arrays/a/a_0.npy"],
        ["cifar", "cifar.tar.gz", "png", "-j", "0", "-o", "png/train/class_0/0.png"],
        ["cifar", "cifar.tar.gz", "png", "-j", "0", "-o", "png/.torchkit"],
        ["shards", "src", "shards", "-o", "shards/manifest.json"],
        ["shards", "src", "shards", "-o", "shards/CLASSES.txt"],
        ["shards", "src", "shards", "-o", "shards/shard-000000.tar"],
    ],
    ids=["tensor-array", "cifar-png", "cifar-marker", "manifest", "classes", "shard"],
)
def test_a_report_that_is_a_file_the_conversion_writes_is_refused_before_any_work(work, args):
    # With --force the report overwrote it after the work (a shards folder's manifest.json
    # became the report); without, the run failed only after all the work, its output left.
    check_refused_untouched(
        ["convert", *args, "--force"], "is a file the command writes in the destination", cwd=work
    )


def test_a_report_of_its_own_inside_the_destination_folder_is_written(work):
    done = run_torchkit_in_process(
        "convert", "shards", "src", "shards", "-o", "shards/report.json", cwd=work
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((work / "shards" / "report.json").read_text())["samples"] == 5
    assert json.loads((work / "shards" / "manifest.json").read_text())["shards"]


# -- special files: written into, never replaced ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["tensor", "src", "arrays", "--to", "npy", "-j", "0"], "converted"),
        (["cifar", "cifar.tar.gz", "png", "-j", "0"], "images"),
        (["checkpoint", "ck.pt", "w.safetensors"], "tensors"),
    ],
)
def test_report_to_a_fifo_is_written_into(runner, work, monkeypatch, args, key):
    monkeypatch.chdir(work)
    reader = FifoReader(work / "report.fifo")
    result = runner.invoke(
        app, ["convert", *args, "--format", "json", "-o", "report.fifo", "--force"]
    )
    data = reader.result()
    assert result.exit_code == 0, result.stderr
    assert json.loads(data)[key] > 0


def test_report_to_dev_stdout(work):
    done = run_torchkit_process(
        "convert", "tensor", "one.png", "one.npy", "--format", "json", "-o", "/dev/stdout",
        "--force", cwd=work,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["written"][0]["shape"] == [8, 8, 3]
    assert os.path.islink("/dev/stdout")  # still the link to the process's stdout


def test_report_beside_the_outputs_in_the_working_directory(work):
    """DST `.` is fine for a single file (written into the folder, not replacing it), and so is
    a report in it: only the destination file itself is refused as a report."""
    done = run_torchkit_in_process(
        "convert", "tensor", "one.png", ".", "--to", "npy", "--format", "json",
        "-o", "report.json", cwd=work,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((work / "report.json").read_text())
    assert report["written"] == [{"path": "one.npy", "shape": [8, 8, 3], "dtype": "uint8"}]
    assert np.load(work / "one.npy").shape == (8, 8, 3)


def _old_dst_and_source(kind: str, folder: Path) -> tuple[list[str], Path]:
    """(the command line before DST, the DST it writes) of one file-writing convert command."""
    if kind == "checkpoint":
        return ["convert", "checkpoint", str(write_state_dict(folder / "src.pt"))], folder / "d.pt"
    if kind == "average":
        sources = [write_state_dict(folder / f"src{i}.pt") for i in range(2)]
        return ["convert", "checkpoint", "--average", *map(str, sources)], folder / "d.pt"
    if kind == "tensor":
        np.save(folder / "src.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
        return ["convert", "tensor", str(folder / "src.npy")], folder / "d.pt"
    from checkpoints import write_convnet_checkpoint

    source = folder / "convnet.pt"
    write_convnet_checkpoint(source, in_channels=3, image_size=8, classes="ab")
    return ["convert-syncbn", str(source)], folder / "d.pt"


@pytest.mark.parametrize("kind", ["checkpoint", "average", "tensor", "syncbn"])
def test_a_report_the_full_disk_refuses_leaves_the_old_dst_and_report(tmp_path, small_tmpfs, kind):
    """`convert ... SRC DST -o REPORT --force` where REPORT's disk is full: the new DST was left
    in place of the old one while the command failed. Both old files are as they were, and
    nothing is left beside them."""
    folder = tmp_path / "models"
    folder.mkdir()
    before, dst = _old_dst_and_source(kind, folder)
    dst.write_bytes(b"the old result")
    disk = small_tmpfs(64)
    report = disk / "report.json"
    report.write_text('{"old": "report"}\n')
    fill_disk(disk)
    done = run_torchkit_in_process(*before, dst, "-o", report, "--force")
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr).startswith(f"Error: cannot write {report}: No space left")
    assert report.read_text() == '{"old": "report"}\n'
    assert sorted(os.listdir(disk)) == ["filler", "report.json"]
    assert dst.read_bytes() == b"the old result"
    assert not [name for name in os.listdir(folder) if name.startswith(".")]


def test_a_report_the_full_disk_refuses_leaves_the_old_folder_dst(tmp_path, small_tmpfs):
    """`convert tensor SRC_DIR DST_DIR --to npy --force -o REPORT` where REPORT's disk is full:
    the new DST folder had replaced the old one while the command failed. DST and the report
    are as they were."""
    source = tmp_path / "arrays"
    source.mkdir()
    np.save(source / "a.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
    dst = tmp_path / "out"
    args = ["convert", "tensor", source, dst, "--to", "pt"]
    assert run_torchkit_in_process(*args).returncode == 0
    shutil.copy(dst / "a.pt", dst / "old-only.pt")  # gone if the folder is replaced
    before = tree_digest(dst)
    disk = small_tmpfs(64)
    report = disk / "report.json"
    report.write_text('{"old": "report"}\n')
    fill_disk(disk)
    done = run_torchkit_in_process(*args, "--force", "-o", report)
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr).startswith(f"Error: cannot write {report}: No space left")
    assert report.read_text() == '{"old": "report"}\n'
    assert sorted(os.listdir(disk)) == ["filler", "report.json"]
    assert tree_digest(dst) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["arrays", disk.name, "out"])


def test_a_report_the_full_disk_refuses_leaves_the_old_file_in_a_folder_dst(tmp_path, small_tmpfs):
    """`convert tensor FILE FOLDER --to pt --force -o REPORT` where REPORT's disk is full: the
    file it wrote into FOLDER had replaced the old one there. The old file, the folder's other
    files and the report are as they were."""
    source = tmp_path / "one.npy"
    np.save(source, np.arange(12, dtype=np.float32).reshape(3, 4))
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "one.pt").write_bytes(b"the old result")
    (dst / "other.txt").write_text("kept")
    before = tree_digest(dst)
    disk = small_tmpfs(64)
    report = disk / "report.json"
    report.write_text('{"old": "report"}\n')
    fill_disk(disk)
    done = run_torchkit_in_process(
        "convert", "tensor", source, dst, "--to", "pt", "--force", "-o", report
    )
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr).startswith(f"Error: cannot write {report}: No space left")
    assert report.read_text() == '{"old": "report"}\n'
    assert sorted(os.listdir(disk)) == ["filler", "report.json"]
    assert tree_digest(dst) == before
