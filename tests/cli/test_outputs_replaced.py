"""An output folder removed, renamed away or replaced while a command writes into it: the next
write stops the command with one error (exit 1), the folder is never made again at its name,
and what stands there now is neither written into nor deleted."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.io.claims import OutputFolderReplacedError, reporting_write_errors
from torchkit.core.io.files import atomic_path, atomic_write_text
from torchkit.core.io.output_paths import MARKER
from torchkit.core.io.outputs import OutputFolder


def _remove(folder: Path) -> None:
    shutil.rmtree(folder)


def _rename_away(folder: Path) -> None:
    folder.rename(folder.with_name(folder.name + ".old"))


def _replace(folder: Path) -> None:
    _rename_away(folder)
    folder.mkdir()
    (folder / "mine.txt").write_text("the user's\n")


@pytest.mark.parametrize("change", [_remove, _rename_away])
def test_a_folder_gone_while_written_stops_the_next_write_and_is_not_made_again(tmp_path, change):
    out = tmp_path / "out"
    with (
        pytest.raises(OutputFolderReplacedError) as raised,
        OutputFolder(out, command="convert") as output,
    ):
        folder = output.begin()
        atomic_write_text(folder / "a.txt", "a\n")
        change(out)
        atomic_write_text(folder / "sub" / "b.txt", "b\n")
    assert str(raised.value).startswith(
        f"output folder {out} was removed or replaced while convert was writing into it: it is gone"
    )
    assert not out.exists()
    assert not (tmp_path / ".out.torchkit-lock").exists()  # released


def test_a_folder_replaced_while_written_is_neither_written_into_nor_deleted(tmp_path):
    out = tmp_path / "out"
    with (
        pytest.raises(OutputFolderReplacedError, match="another folder is at its place now"),
        OutputFolder(out, command="split") as output,
    ):
        output.begin()
        _replace(out)
        with atomic_path(out / "model.pt") as temporary:
            temporary.write_bytes(b"x")
    assert sorted(os.listdir(out)) == ["mine.txt"]  # not removed by the failed run's clean-up
    assert sorted(os.listdir(tmp_path / "out.old")) == [MARKER]


def test_a_forced_run_whose_folder_is_removed_puts_the_old_output_back(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text("{}\n")
    (out / "result.json").write_text("old\n")
    with (
        pytest.raises(OutputFolderReplacedError),
        OutputFolder(out, command="eval", force=True) as output,
    ):
        output.begin()
        shutil.rmtree(out)
        atomic_write_text(out / "result.json", "new\n")
    assert sorted(os.listdir(out)) == [MARKER, "result.json"]
    assert (out / "result.json").read_text() == "old\n"


def test_a_run_that_fails_after_its_folder_was_replaced_leaves_the_new_folder_alone(tmp_path):
    out = tmp_path / "out"
    with (
        pytest.raises(RuntimeError, match="a bad image"),
        OutputFolder(out, command="convert") as output,
    ):
        output.begin()
        _replace(out)
        raise RuntimeError("a bad image")
    assert sorted(os.listdir(out)) == ["mine.txt"]


def test_a_write_that_fails_because_its_folder_went_says_so(tmp_path):
    """Writers that open their files themselves (a PNG at a time) fail with ENOENT: the error
    says why."""
    out = tmp_path / "out"
    with (
        pytest.raises(OutputFolderReplacedError, match="it is gone"),
        OutputFolder(out, command="convert") as output,
    ):
        (output.begin() / "cat").mkdir()
        _rename_away(out)
        target = out / "cat" / "1.png"
        with reporting_write_errors(target), open(target, "wb") as handle:
            handle.write(b"png")


def test_an_atomic_output_whose_temporary_folder_goes_names_the_output(tmp_path):
    out = tmp_path / "out"
    with (
        pytest.raises(OutputFolderReplacedError, match=f"output folder {out} was removed"),
        OutputFolder(out, command="convert", atomic=True) as output,
    ):
        shutil.rmtree(output.begin())
        atomic_write_text(output.path / "a.txt", "a\n")
    assert not out.exists()


def test_train_stops_when_its_run_folder_is_replaced_and_resumes_where_it_went(
    tmp_path, monkeypatch
):
    from torchkit.cli import progress
    from torchkit.core.train import checkpoint_writer

    monkeypatch.setattr(checkpoint_writer, "BACKGROUND", False)  # epoch 1's files are written
    data, run = tmp_path / "data", tmp_path / "run"
    write_image_folder(data / "train", {"ant": 2, "bee": 2}, seed=1)
    write_image_folder(data / "val", {"ant": 1, "bee": 1}, seed=2)
    shown = progress.TrainProgress.on_epoch_start

    def on_epoch_start(self, epoch, *rest):  # the user moves the run while epoch 2 starts
        if epoch == 2:
            _replace(run)
        shown(self, epoch, *rest)

    monkeypatch.setattr(progress.TrainProgress, "on_epoch_start", on_epoch_start)
    tiny = ["--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "4", "--workers", "0"]
    failed = run_torchkit_in_process("train", "--data", data, "--out", run, *tiny, "--epochs", "2")
    assert failed.returncode == 1
    assert error_line(failed.stderr) == (
        f"Error: run folder {run} was removed or replaced while train was writing into it: "
        "another folder is at its place now (nothing more was written there: continue a run "
        "folder you moved with --resume NEW_PLACE, or start the run again)"
    )
    moved = tmp_path / "run.old"
    assert {"config.json", "split.csv", "last.pt", "metrics.csv", MARKER} <= set(os.listdir(moved))
    assert sorted(os.listdir(run)) == ["mine.txt"]  # not written into, not deleted
    monkeypatch.undo()
    resumed = run_torchkit_in_process("train", "--resume", moved, "--trust-checkpoint")
    assert resumed.returncode == 0, resumed.stderr
    assert len((moved / "metrics.csv").read_text().splitlines()) == 3  # header, epochs 1 and 2


@pytest.mark.parametrize("change", [_rename_away, _replace])
def test_split_stops_when_its_output_folder_is_moved_and_leaves_what_is_there_alone(
    tmp_path, change
):
    from torchkit.core.split import split_dataset

    data, out = tmp_path / "data", tmp_path / "out"
    write_image_folder(data, {"ant": 3, "bee": 3}, seed=1)

    def progress(done: int, total: int) -> None:  # every file copied: the user moves OUT
        if done == total:
            change(out)

    with pytest.raises(OutputFolderReplacedError, match=f"output folder {out} was removed"):
        split_dataset(data, out, mode="copy", progress=progress)
    if change is _replace:
        assert sorted(os.listdir(out)) == ["mine.txt"]  # not written into, not deleted
    else:
        assert not out.exists()
    assert {"train", "val", MARKER} <= set(os.listdir(tmp_path / "out.old"))


def _made_there(folder: Path) -> None:
    folder.mkdir()
    (folder / "mine.txt").write_text("the user's\n")


def _file_there(folder: Path) -> None:
    folder.write_text("the user's\n")


def _filled(folder: Path) -> None:
    (folder / "mine.txt").write_text("the user's\n")


def _old_output_moved_and_folder_made(folder: Path) -> None:
    _rename_away(folder)
    _made_there(folder)


@pytest.mark.parametrize(
    ("before", "change"),
    [
        (None, _made_there),
        (None, _file_there),
        ("empty", _filled),
        ("old output", _old_output_moved_and_folder_made),
    ],
)
def test_an_atomic_output_is_not_swapped_over_what_another_process_put_at_its_place(
    tmp_path, before, change
):
    """The finished hidden folder replaces only what the checks judged (nothing, an empty
    folder, the old output under --force): what the user put there meanwhile stays, and the
    finished output is kept beside it."""
    out = tmp_path / "out"
    if before is not None:
        out.mkdir()
    if before == "old output":
        (out / MARKER).write_text("{}\n")
        (out / "a.txt").write_text("old\n")
    with (
        pytest.raises(OutputFolderReplacedError) as raised,
        OutputFolder(out, command="convert", force=True, atomic=True) as output,
    ):
        atomic_write_text(output.begin() / "a.txt", "new\n")
        change(out)
    kept = tmp_path / "out.new"
    assert str(raised.value) == (
        f"output folder {out} was made or changed by another process while convert was "
        f"writing: a {'file' if change is _file_there else 'folder with something in it'} is at "
        f"its place now; the finished output is at {kept} (nothing at {out} was changed: "
        "compare the two, keep what you want)"
    )
    if change is _file_there:
        assert out.read_text() == "the user's\n"
    else:
        assert sorted(os.listdir(out)) == ["mine.txt"]
    assert (kept / "a.txt").read_text() == "new\n"
    if before == "old output":
        assert (tmp_path / "out.old" / "a.txt").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_an_atomic_output_still_replaces_an_empty_folder_made_meanwhile(tmp_path):
    out = tmp_path / "out"
    with OutputFolder(out, command="convert", atomic=True) as output:
        atomic_write_text(output.begin() / "a.txt", "new\n")
        out.mkdir()  # nothing in it to lose
    assert sorted(os.listdir(out)) == [MARKER, "a.txt"]


def test_convert_tensor_keeps_a_folder_made_at_dst_while_it_converted(tmp_path):
    import numpy as np

    from torchkit.core.convert.tensor import TensorOptions, convert_tensor

    source, dst = tmp_path / "arrays", tmp_path / "out"
    source.mkdir()
    np.save(source / "a.npy", np.zeros((2, 2), dtype=np.float32))

    def progress(done: int, total: int) -> None:  # the user makes DST as the last file is done
        if done == total:
            _made_there(dst)

    with pytest.raises(OutputFolderReplacedError, match="the finished output is at"):
        convert_tensor(source, dst, TensorOptions(to="pt"), workers=1, progress=progress)
    assert sorted(os.listdir(dst)) == ["mine.txt"]
    assert sorted(os.listdir(tmp_path / "out.new")) == [MARKER, "a.pt"]


def test_convert_tensor_does_not_make_its_removed_folder_again_for_a_subfolder(
    tmp_path, monkeypatch
):
    """The folder being filled goes (the user removes it, or a folder above it) after the
    first file: the next file's subfolder does not make it again, and the run stops."""
    import numpy as np

    from torchkit.core.convert import tensor
    from torchkit.core.convert.tensor import TensorOptions, convert_tensor

    source, dst = tmp_path / "arrays", tmp_path / "out"
    for sub in ("a", "b"):
        (source / sub).mkdir(parents=True)
        np.save(source / sub / "x.npy", np.zeros((2, 2), dtype=np.float32))
    convert_file = tensor.convert_file

    def then_removed(source_file, target, *args, **kwargs):
        result = convert_file(source_file, target, *args, **kwargs)
        if target.parent.name == "a":
            shutil.rmtree(target.parent.parent)  # the hidden folder being filled
        return result

    monkeypatch.setattr(tensor, "convert_file", then_removed)
    with pytest.raises(OutputFolderReplacedError, match=f"output folder {dst} was removed"):
        convert_tensor(source, dst, TensorOptions(to="pt"), workers=1)
    assert sorted(os.listdir(tmp_path)) == ["arrays"]  # nothing made again, no lock left


def test_an_atomic_output_whose_temporary_folder_goes_after_the_last_write_says_so(tmp_path):
    out = tmp_path / "out"
    with (
        pytest.raises(OutputFolderReplacedError, match="it is gone"),
        OutputFolder(out, command="convert", atomic=True) as output,
    ):
        atomic_write_text(output.begin() / "a.txt", "a\n")
        shutil.rmtree(output.path)
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("mode", ["copy", "move"])
def test_split_does_not_make_its_removed_output_folder_again_for_its_subfolders(
    tmp_path, monkeypatch, mode
):
    from torchkit.core.split import run as split_run
    from torchkit.core.split import split_dataset

    data, out = tmp_path / "data", tmp_path / "out"
    write_image_folder(data, {"ant": 3, "bee": 3}, seed=1)
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    write_journal = split_run.write_journal

    def then_removed(folder, record):  # the user removes OUT before the first file is placed
        write_journal(folder, record)
        shutil.rmtree(folder)

    monkeypatch.setattr(split_run, "write_journal", then_removed)
    with pytest.raises(OutputFolderReplacedError, match="it is gone"):
        split_dataset(data, out, mode=mode)
    assert not out.exists()
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before  # nothing moved
