"""SIGTERM raised where none of a command's own clean-up is in place (a signal's handler runs as
a call is entered: `OutputFolder.__enter__`/`__exit__`, a step of `begin`, a split's `keep`,
an atomic file's clean-up as it is entered): the command still ends with 143, the user's
earlier output as it was (or the new one whole), and nothing hidden left beside or in it (no
`.NAME.XXXX.partial`, no lock, no set-aside split, no `.NAME.XXXX.tmp`, no set-aside `-o`
report `.NAME.XXXX.replaced`, no lock of a CSV file rows are added to). The end of the CLI
closes every output the command left open (`open_outputs.closed_at_end`)."""

from __future__ import annotations

import json
import os
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest
from image_folders import make_class_files, write_image_folder
from output_checks import hidden_siblings, tree_digest
from processes import run_torchkit_in_process
from signal_placement import signalled_on_entry

from torchkit.core.io import file_outputs, open_outputs, output_locks, outputs
from torchkit.core.io.output_paths import PARTIAL_SUFFIX, REPLACED_SUFFIX
from torchkit.core.io.outputs import OutputFolder
from torchkit.core.split import output as split_output


def _stopped(result, signalled: list) -> None:
    assert signalled, "the signal was never placed"
    assert result.returncode == 143, result.stderr
    assert "Terminated" in result.stderr and "Traceback" not in result.stderr


def _ok_exit(_output, exc_type, *_):
    return exc_type is None  # the `with` ending as the work is done


# Where a signal left something behind (or, in `begin`, deleted the earlier output): the
# method of OutputFolder (or the module function) entered, and which call of it.
CONVERT_TENSOR_STOPS = {
    # The lock was left: the `with` never began.
    "enter": (OutputFolder, "__enter__", lambda *a, **k: True),
    # Every file written: .out.XXXX.partial and the lock were left.
    "exit": (OutputFolder, "__exit__", _ok_exit),
    # `begin` had marked the folder begun but not yet named the hidden one: the abandon that
    # followed deleted the earlier output (--force) in its place.
    "begin": (outputs, "sibling", lambda folder, suffix: suffix == PARTIAL_SUFFIX),
}


@pytest.mark.parametrize("where", CONVERT_TENSOR_STOPS)
def test_convert_tensor_stopped_keeps_the_earlier_folder_and_leaves_nothing_hidden(
    tmp_path, monkeypatch, where
):
    write_image_folder(tmp_path / "images", {"a": 2, "b": 1})
    out = tmp_path / "out"
    args = ["convert", "tensor", tmp_path / "images", out, "-j", "0"]
    assert run_torchkit_in_process(*args, "--to", "npy").returncode == 0
    before = tree_digest(out)
    signalled = signalled_on_entry(monkeypatch, *CONVERT_TENSOR_STOPS[where])
    result = run_torchkit_in_process(*args, "--to", "png", "--force")
    _stopped(result, signalled)
    assert tree_digest(out) == before  # the earlier .npy folder as it was
    assert hidden_siblings(out) == []
    assert sorted(os.listdir(tmp_path)) == ["images", "out"]


def test_convert_tensor_stopped_once_its_new_folder_is_in_place_keeps_it(tmp_path, monkeypatch):
    # The new folder swapped in and the earlier one deleted, the signal handled as `keep`
    # recorded the folder under its own name: the abandon that followed deleted the new folder
    # as if it were the hidden one, so neither output was left.
    write_image_folder(tmp_path / "images", {"a": 2, "b": 1})
    out = tmp_path / "out"
    args = ["convert", "tensor", tmp_path / "images", out, "-j", "0"]
    assert run_torchkit_in_process(*args, "--to", "npy").returncode == 0
    signalled = signalled_on_entry(
        monkeypatch, outputs, "claim_folder", lambda folder, **_: folder == out
    )
    result = run_torchkit_in_process(*args, "--to", "png", "--force")
    _stopped(result, signalled)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png")) == [
        "a/a_0.png",
        "a/a_1.png",
        "b/b_0.png",
    ]  # the new folder, whole
    assert hidden_siblings(out) == []
    assert sorted(os.listdir(tmp_path)) == ["images", "out"]


def _write_cifar10(root: Path) -> None:
    """A CIFAR-10 python folder of one training batch and the test batch, 2 images each."""
    rng = np.random.default_rng(0)
    root.mkdir()
    for name in ("data_batch_1", "test_batch"):
        batch = {
            b"batch_label": name.encode(),
            b"labels": [1, 2],
            b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8),
            b"filenames": [b"x.png", b"y.png"],
        }
        (root / name).write_bytes(pickle.dumps(batch, protocol=2))
    names = [n.encode() for n in ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j")]
    meta = {b"num_cases_per_batch": 2, b"label_names": names, b"num_vis": 3072}
    (root / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))


def test_convert_cifar_stopped_as_its_folder_is_entered_leaves_no_lock(tmp_path, monkeypatch):
    # The folder made, checked and locked, the signal handled as its `with` was entered
    # (before the read): exit 143, and `.out.torchkit-lock` stayed.
    _write_cifar10(tmp_path / "cifar-10-batches-py")
    out = tmp_path / "out"
    signalled = signalled_on_entry(monkeypatch, OutputFolder, "__enter__")
    result = run_torchkit_in_process(
        "convert", "cifar", tmp_path / "cifar-10-batches-py", out, "-j", "0"
    )
    _stopped(result, signalled)
    assert sorted(os.listdir(tmp_path)) == ["cifar-10-batches-py"]  # no output, no lock


def test_convert_shards_stopped_as_its_folder_is_finished_leaves_no_lock(tmp_path, monkeypatch):
    # Every shard written and kept, the signal handled as the folder's `with` ended: exit 143
    # with the shards whole, and `.out.torchkit-lock` stayed.
    write_image_folder(tmp_path / "images", {"a": 2, "b": 1})
    out = tmp_path / "out"
    signalled = signalled_on_entry(monkeypatch, OutputFolder, "__exit__", _ok_exit)
    result = run_torchkit_in_process("convert", "shards", tmp_path / "images", out, "-j", "0")
    _stopped(result, signalled)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(shard["samples"] for shard in manifest["shards"]) == 3
    assert hidden_siblings(out) == []
    assert sorted(os.listdir(tmp_path)) == ["images", "out"]


@pytest.mark.parametrize(
    "where",
    [
        # The earlier split not yet set aside: its split.csv and the files at the new split's
        # names were deleted as what this run had written.
        "begin",
        # Every file copied: OUT's lock stayed.
        "exit",
        # The new split written, the signal handled as it was to be kept: the earlier split
        # stayed set aside (.torchkit-split-replaced) and the new one marked unfinished.
        "keep",
        # Kept, the signal handled as the earlier split's delete began: the same was left.
        "discard",
    ],
)
def test_split_stopped_leaves_one_whole_split_and_nothing_hidden(tmp_path, monkeypatch, where):
    make_class_files(tmp_path / "data", {"a": 4, "b": 4})
    out = tmp_path / "out"
    args = ["split", tmp_path / "data", out]
    assert run_torchkit_in_process(*args, "--seed", "1").returncode == 0
    earlier = tree_digest(out, folders=False)
    stop = {
        "begin": (split_output, "claim_folder"),
        "exit": (OutputFolder, "__exit__", _ok_exit),
        "keep": (split_output.SplitOutput, "keep"),
        "discard": (split_output, "discard_replaced"),
    }[where]
    signalled = signalled_on_entry(monkeypatch, *stop)
    result = run_torchkit_in_process(*args, "--seed", "2", "--force")
    _stopped(result, signalled)
    assert hidden_siblings(out) == []
    now = tree_digest(out, folders=False)
    assert [name for name in now if name.startswith(".")] == [".torchkit"]  # no journal, no
    # set-aside split
    if where in ("begin", "keep"):
        assert now == earlier  # not kept: the earlier split back as it was
    else:  # kept: the new split whole (another seed, another split.csv), the earlier gone
        assert now["split.csv"] != earlier["split.csv"] and len(now) == len(earlier)


def test_dataset_stats_report_stopped_as_its_temporary_clean_up_begins_leaves_no_temporary(
    tmp_path, monkeypatch
):
    # The report's temporary made, the signal handled as its clean-up was entered (before it
    # was in place): exit 143, and `.report.json.XXXXXXXX.tmp` stayed beside the old report.
    write_image_folder(tmp_path / "images", {"a": 2})
    report = tmp_path / "report.json"
    args = ["dataset-stats", tmp_path / "images", "-o", report, "-j", "0"]
    assert run_torchkit_in_process(*args).returncode == 0
    earlier = report.read_bytes()
    signalled = signalled_on_entry(monkeypatch, file_outputs, "discarded_on_failure")
    result = run_torchkit_in_process(*args, "--force", "--resize", "4")
    _stopped(result, signalled)
    assert report.read_bytes() == earlier
    assert sorted(os.listdir(tmp_path)) == ["images", "report.json"]


def test_the_end_of_a_command_closes_its_own_thread_s_outputs_newest_first():
    # A background writer's file (another thread) finishes or fails in its own clean-up, never
    # removed under it; an output opened before the command is not the command's.
    closed_at_end: list[str] = []

    class Probe:
        def __init__(self, name: str) -> None:
            self.name = name
            self.token = open_outputs.opened(self)

        def close_unfinished(self, error: BaseException | None) -> None:
            closed_at_end.append(f"{self.name}: {type(error).__name__}")

    probes = [Probe("earlier")]
    with pytest.raises(KeyboardInterrupt), open_outputs.closed_at_end():
        probes += [Probe("first"), Probe("second")]
        writer = threading.Thread(target=lambda: probes.append(Probe("other thread")))
        writer.start()
        writer.join()
        raise KeyboardInterrupt
    assert closed_at_end == ["second: KeyboardInterrupt", "first: KeyboardInterrupt"]
    for probe in probes:
        open_outputs.closed(probe.token)


# Where a stop left the earlier -o report of `dataset-stats --force` set aside beside the new
# one (`.report.json.XXXX.replaced`, removed only by a next run): the step of `ReplacedFiles`
# entered, and whether the new report is kept (else the earlier one goes back).
REPORT_STOPS = {
    # The report written and renamed into place, the signal handled as the block's `with`
    # ended: nothing was kept or put back.
    "exit": ((file_outputs.ReplacedFiles, "__exit__", _ok_exit), False),
    # The same, as `keep` was entered (before it began: not kept).
    "keep": ((file_outputs.ReplacedFiles, "keep"), False),
    # Kept, the signal handled as the earlier one's delete began: the same was left.
    "discard": (
        (file_outputs, "remove_tree", lambda path, **_: path.name.endswith(REPLACED_SUFFIX)),
        True,
    ),
}


@pytest.mark.parametrize("where", REPORT_STOPS)
def test_report_replaced_with_force_stopped_leaves_one_whole_report_and_nothing_hidden(
    tmp_path, monkeypatch, where
):
    write_image_folder(tmp_path / "images", {"a": 2})
    report = tmp_path / "report.json"
    args = ["dataset-stats", tmp_path / "images", "-o", report, "--format", "json", "-j", "0"]
    assert run_torchkit_in_process(*args).returncode == 0
    earlier = report.read_bytes()
    stop, kept = REPORT_STOPS[where]
    signalled = signalled_on_entry(monkeypatch, *stop)
    result = run_torchkit_in_process(*args, "--force", "--resize", "4")
    _stopped(result, signalled)
    if kept:  # the new report, whole (resized images: other sizes)
        assert report.read_bytes() != earlier and json.loads(report.read_text())
    else:
        assert report.read_bytes() == earlier
    assert sorted(os.listdir(tmp_path)) == ["images", "report.json"]


def test_benchmark_append_stopped_as_it_takes_the_files_lock_leaves_no_lock(tmp_path, monkeypatch):
    # `benchmark --append`'s rows added under the stop handling the CLI runs every command in
    # (the real benchmark costs seconds of CPU for a fact about the lock), the signal handled
    # as the lock file, made and locked, was to get the PID: `.bench.csv.torchkit-lock` stayed.
    from torchkit.cli.app import _terminate_like_interrupt
    from torchkit.core.benchmark import COLUMNS, append_csv
    from torchkit.core.io.errors import Terminated

    header = ",".join(COLUMNS) + "\n"
    log = tmp_path / "bench.csv"
    log.write_text(header)  # an earlier log, its header alone
    lock = output_locks.lock_path(log)

    def on_the_lock(fd: int, _length: int) -> bool:
        return lock.exists() and os.path.samestat(os.fstat(fd), os.stat(lock))

    signalled = signalled_on_entry(monkeypatch, os, "ftruncate", on_the_lock)
    with pytest.raises(Terminated), _terminate_like_interrupt(), open_outputs.closed_at_end():
        append_csv(log, header + "convnet,infer,1\n")
    assert signalled, "the signal was never placed"
    assert log.read_text() == header  # as it was: no row added
    assert sorted(os.listdir(tmp_path)) == ["bench.csv"]
