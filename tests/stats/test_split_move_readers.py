"""`split --mode move` and the commands that read the folder it empties: a reader holds a shared
flock on what it reads (and the folders above it) until it ends, a move an exclusive one on what
it empties, so neither starts while the other runs; a folder inside a half-moved ROOT is refused
like ROOT; a read-only folder, or one without flock, is still read."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
from pathlib import Path

import pytest
from image_folders import make_class_files as make_files
from output_checks import error_line, tree_digest
from processes import (
    run_each_in_process,
    run_torchkit_in_process,
    start_torchkit_process,
    wait_until,
)
from split_moves import stop_move_after

from torchkit.core.data.sources import open_data
from torchkit.core.io.folder_locks import held_until_the_command_ends
from torchkit.core.split.files import moving_out_of


def read_shared(path: Path) -> bool:
    """Does a reader hold `path` (a shared flock, which an exclusive one cannot join)?"""
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # and no move's exclusive one
            return True
        return False
    finally:
        os.close(fd)


def test_a_move_is_refused_while_a_command_reads_root_and_runs_once_it_has_ended(
    tmp_path, make_image_folder
):
    # Before: a reader listed ROOT, then a move emptied it while the reader still ran (train
    # and eval read for minutes after listing): classes vanished, listed files were gone.
    data = make_image_folder(tmp_path / "data", {"cat": 2, "dog": 2})
    before = tree_digest(data)
    fifo = tmp_path / "report"
    os.mkfifo(fifo)  # the reader ends by writing its report: it waits there for this test
    reader = start_torchkit_process("dataset-stats", str(data), "-o", str(fifo), "--format", "json")
    try:
        wait_until(lambda: read_shared(data), process=reader, what="the reader's lock")
        refused = run_each_in_process(
            [["split", where, tmp_path / "out", "--mode", "move"] for where in (data, tmp_path)]
        )
        assert refused[0].returncode == 1
        assert error_line(refused[0].stderr) == (
            f"Error: another torchkit command is reading {data}, or another torchkit split is "
            "moving files out of a folder in it (wait for it to finish)"
        )
        # A move out of the folder holding ROOT would empty it too.
        assert refused[1].returncode == 1
        assert f"command is reading {tmp_path}," in error_line(refused[1].stderr)
        assert tree_digest(data) == before and not (tmp_path / "out").exists()
        report = json.loads(fifo.read_text())
        _, err = reader.communicate(timeout=120)
    finally:
        reader.kill()
        reader.wait()
    assert reader.returncode == 0, err
    assert report["images"] == 4 and report["num_classes"] == 2  # none vanished
    moved = run_torchkit_in_process("split", data, tmp_path / "out", "--mode", "move")
    assert moved.returncode == 0, moved.stderr  # the reader's lock went with it


@pytest.fixture
def half_moved(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(ROOT, OUT): a move of ROOT into OUT stopped after 4 files."""
    data = make_files(tmp_path / "data", {"cat": 6, "dog": 5})
    stop_move_after(4, monkeypatch, data, tmp_path / "out")
    return data, tmp_path / "out"


def test_a_folder_inside_a_half_moved_root_is_refused_like_root(tmp_path, half_moved):
    # Before: ROOT itself was refused, but `--data ROOT/cat` read the cat images left in ROOT
    # as the whole class, and `split ROOT/cat OTHER --mode move` moved them into a second OUT.
    data, out = half_moved
    cat, other = data / "cat", tmp_path / "other"
    readers = [
        ["dataset-stats", cat],
        ["split", cat, other, "--mode", "copy"],
        ["split", cat, other, "--mode", "move"],
        ["dataset-stats", data / "index.csv"],  # a CSV index in it
    ]
    (data / "index.csv").write_text("path,label\ndog/dog_04.png,dog\n")
    before = tree_digest(tmp_path)
    real = os.path.realpath(data)
    for args, result in zip(readers, run_each_in_process(readers), strict=True):
        where = args[1]
        assert result.returncode == 1, (args, result.stderr)
        assert error_line(result.stderr) == (
            f"Error: {where} lies in {real}, which is half moved into {out}: a split --mode "
            f"move into it stopped (finish that move first: torchkit split {real} {out} "
            "--mode move)"
        ), args
    # While that move runs (it holds ROOT: here the test does), it says so.
    with moving_out_of(data):
        running = run_torchkit_in_process("dataset-stats", cat)
    assert running.returncode == 1
    assert error_line(running.stderr) == (
        f"Error: {cat} lies in {real}, which is being moved into {out} by a torchkit split "
        f"--mode move running now (wait for it to finish, then read {out})"
    )
    assert tree_digest(tmp_path) == before
    assert run_torchkit_in_process("split", real, out, "--mode", "move").returncode == 0
    assert run_torchkit_in_process("dataset-stats", cat).returncode == 1  # empty now: no images


def test_data_holding_a_half_moved_folder_is_refused(tmp_path, monkeypatch):
    # Before: with `split ROOT/cat OUT --mode move` stopped (or running), `train --data ROOT`
    # read the cat images left in ROOT/cat as the whole class, and `split ROOT OUT2 --mode
    # move` moved them into a second OUT.
    data = make_files(tmp_path / "data", {"cat": 6, "dog": 5})
    cat, out = data / "cat", tmp_path / "out"
    stop_move_after(4, monkeypatch, cat, out)
    before = tree_digest(tmp_path)
    readers = [
        ["dataset-stats", data],
        ["split", data, tmp_path / "other", "--mode", "copy"],
        ["split", data, tmp_path / "other", "--mode", "move"],
    ]
    for args, result in zip(readers, run_each_in_process(readers), strict=True):
        assert result.returncode == 1, (args, result.stderr)
        assert error_line(result.stderr) == (
            f"Error: {cat} is half moved into {out}: a split --mode move into it stopped "
            f"(finish that move first: torchkit split {cat} {out} --mode move)"
        ), args
    with moving_out_of(cat):  # that move runs now
        running = run_torchkit_in_process("dataset-stats", data)
    assert running.returncode == 1
    assert error_line(running.stderr) == (
        f"Error: {cat} is being moved into {out} by a torchkit split --mode move running now "
        "(wait for it to finish)"
    )
    assert tree_digest(tmp_path) == before
    assert run_torchkit_in_process("split", cat, out, "--mode", "move").returncode == 0
    assert run_torchkit_in_process("split", data, tmp_path / "other").returncode == 0


def test_a_move_that_has_not_recorded_its_out_yet_refuses_readers_too(tmp_path):
    # Before: a move still planning (hashing ROOT for duplicates) had written no record yet,
    # so a reader went ahead and read ROOT while it was emptied.
    data = make_files(tmp_path / "data", {"cat": 2, "dog": 2})
    with moving_out_of(data):
        results = run_each_in_process([["dataset-stats", data], ["dataset-stats", data / "cat"]])
    assert [r.returncode for r in results] == [1, 1]
    assert error_line(results[0].stderr) == (
        f"Error: {data} is being emptied or written by a torchkit split running now (wait for "
        "it to finish)"
    )
    assert error_line(results[1].stderr) == (
        f"Error: {data / 'cat'} lies in {os.path.realpath(data)}, which is being emptied or "
        "written by a torchkit split running now (wait for it to finish)"
    )


def test_a_read_only_dataset_is_read_and_nothing_is_written_in_it(tmp_path, make_image_folder):
    data = make_image_folder(tmp_path / "data", {"cat": 2, "dog": 2})
    folders = [data, data / "cat", data / "dog"]
    for folder in folders:
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        before = sorted(os.listdir(tmp_path)), tree_digest(data)
        result = run_torchkit_in_process("dataset-stats", data, "--format", "json", "-j", "0")
        assert result.returncode == 0, result.stderr
        assert (sorted(os.listdir(tmp_path)), tree_digest(data)) == before
    finally:
        for folder in folders:
            folder.chmod(stat.S_IRWXU)


def test_without_flock_on_folders_readers_and_moves_go_ahead(
    tmp_path, make_image_folder, monkeypatch
):
    # NFS (and other file systems) may refuse a flock on a folder: no lock then, and no error.
    data = make_image_folder(tmp_path / "data", {"cat": 3, "dog": 3})
    real_flock = fcntl.flock

    def no_flock_on_folders(fd, operation):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.ENOLCK, "No locks available")
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", no_flock_on_folders)
    results = run_each_in_process(
        [["dataset-stats", data, "-j", "0"], ["split", data, tmp_path / "out", "--mode", "move"]]
    )
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert not list(data.rglob("*.png"))


def test_the_folders_a_csv_index_lists_are_held_and_looked_at_too(tmp_path, monkeypatch):
    # Before: with the index in lists/ and its images in data/, a move out of data/ went ahead
    # while the index was read, and the index was read after a move out of data/ had stopped.
    data = make_files(tmp_path / "data", {"cat": 6, "dog": 5})
    (tmp_path / "lists").mkdir()
    index = tmp_path / "lists" / "index.csv"
    rows = [f"../data/{p.parent.name}/{p.name},{p.parent.name}" for p in data.rglob("*.png")]
    index.write_text("path,label\n" + "\n".join(sorted(rows)) + "\n")
    out, real = tmp_path / "out", os.path.realpath(data)
    with held_until_the_command_ends():  # a command reading the index, as the CLI runs one
        open_data(index)
        refused = run_torchkit_in_process("split", data, out, "--mode", "move")
    assert refused.returncode == 1
    assert error_line(refused.stderr).startswith(
        f"Error: another torchkit command is reading {data}, or"
    )
    stop_move_after(4, monkeypatch, data, out)
    stopped = run_torchkit_in_process("dataset-stats", index)
    assert stopped.returncode == 1
    assert error_line(stopped.stderr) == (
        f"Error: {real}/cat lies in {real}, which is half moved into {out}: a split --mode move "
        f"into it stopped (finish that move first: torchkit split {real} {out} --mode move)"
    )


def test_a_move_out_of_a_class_folder_is_refused_while_its_root_is_read(tmp_path):
    # Before: `split ROOT/cat OUT --mode move` went ahead while `train --data ROOT` read ROOT:
    # the cat images vanished under it.
    data = make_files(tmp_path / "data", {"cat": 2, "dog": 2})
    with held_until_the_command_ends():  # a command reading ROOT, as the CLI runs one
        open_data(data, allow_unlabelled=True)
        refused = run_torchkit_in_process("split", data / "cat", tmp_path / "out", "--mode", "move")
    assert refused.returncode == 1
    assert error_line(refused.stderr).startswith(
        f"Error: another torchkit command is reading {data / 'cat'}, or"
    )
    moved = run_torchkit_in_process("split", data / "cat", tmp_path / "out", "--mode", "move")
    assert moved.returncode == 0, moved.stderr


def test_the_move_to_finish_is_a_command_to_paste_for_paths_with_spaces(tmp_path, monkeypatch):
    data = make_files(tmp_path / "my data", {"cat": 6, "dog": 5})
    out = tmp_path / "split out"
    stop_move_after(4, monkeypatch, data, out)
    real = os.path.realpath(data)
    inside = run_torchkit_in_process("dataset-stats", data / "cat")
    assert error_line(inside.stderr) == (
        f"Error: {data / 'cat'} lies in {real}, which is half moved into {out}: a split --mode "
        f"move into it stopped (finish that move first: torchkit split '{real}' '{out}' "
        "--mode move)"
    )
    holding = run_torchkit_in_process("dataset-stats", tmp_path)
    assert error_line(holding.stderr) == (
        f"Error: {data} is half moved into {out}: a split --mode move into it stopped "
        f"(finish that move first: torchkit split '{data}' '{out}' --mode move)"
    )


def test_the_folders_a_stopped_move_of_a_csv_index_emptied_are_refused(tmp_path, monkeypatch):
    # Before: with `split lists/index.csv OUT --mode move` stopped, the index was refused, but
    # `dataset-stats data` (the folder it lists images in) read the images left there as the
    # whole dataset, and `split data OTHER --mode move` moved them into a second OUT.
    data = make_files(tmp_path / "data", {"cat": 6, "dog": 5})
    (tmp_path / "lists").mkdir()
    index = tmp_path / "lists" / "index.csv"
    rows = [f"../data/{p.parent.name}/{p.name},{p.parent.name}" for p in data.rglob("*.png")]
    index.write_text("path,label\n" + "\n".join(sorted(rows)) + "\n")
    out, real = tmp_path / "out", os.path.realpath(index)
    stop_move_after(4, monkeypatch, index, out)
    before = tree_digest(tmp_path)
    readers = [
        ["dataset-stats", data],
        ["dataset-stats", data / "cat"],
        ["split", data, tmp_path / "other", "--mode", "move"],
    ]
    for args, result in zip(readers, run_each_in_process(readers), strict=True):
        assert result.returncode == 1, (args, result.stderr)
        line = error_line(result.stderr)
        assert "half moved into" in line and f"a split --mode move of {real}" in line, args
        assert line.endswith(f"(finish that move first: torchkit split {real} {out} --mode move)")
    assert tree_digest(tmp_path) == before
    assert run_torchkit_in_process("split", index, out, "--mode", "move").returncode == 0
    assert sorted(p.name for p in tmp_path.rglob(".*moving*")) == []  # every record gone


def test_a_finished_move_of_a_csv_index_leaves_no_record_where_only_non_images_were(
    tmp_path, monkeypatch
):
    """The stopped move recorded itself in every folder the index lists files in, one that
    lists only a file left out (not an image) too; finished by a rerun, which took its
    folders from the plan (images only), it left that record there for good. The folders
    noted are kept in the journal now, and only those files move out of."""
    data = make_files(tmp_path / "data", {"cat": 6, "dog": 5})
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("not an image\n")
    index = tmp_path / "index.csv"
    rows = [f"data/{p.parent.name}/{p.name},{p.parent.name}" for p in data.rglob("*.png")]
    index.write_text("path,label\n" + "\n".join([*sorted(rows), "docs/notes.txt,cat"]) + "\n")
    out = tmp_path / "out"
    stop_move_after(4, monkeypatch, index, out)
    assert (data / "cat" / ".torchkit-split-moving.json").exists()
    assert not (tmp_path / "docs" / ".torchkit-split-moving.json").exists()
    assert run_torchkit_in_process("split", index, out, "--mode", "move").returncode == 0
    assert sorted(p.name for p in tmp_path.rglob(".*moving*")) == []  # every record gone


def test_a_stopped_move_of_an_index_beside_more_folders_than_are_locked_is_refused_there(
    tmp_path, monkeypatch
):
    """An index listing images in 66 folders beside it (more than a move holds open, so their
    parent, which holds the index, stands for them): the record went nowhere, and a folder
    half emptied read as whole data. It goes in that parent now, and the rerun removes it."""
    data = tmp_path / "data"
    rows = []
    for i in range(66):
        make_files(data / f"set{i:02d}", {"cat": 1, "dog": 1})
        rows += [f"set{i:02d}/{name}/{name}_00.png,{name}" for name in ("cat", "dog")]
    index = data / "index.csv"
    index.write_text("path,label\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    stop_move_after(4, monkeypatch, index, out)
    result = run_torchkit_in_process("dataset-stats", data / "set65")
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert f"lies in {os.path.realpath(data)}, which is half moved into" in line, line
    assert run_torchkit_in_process("split", index, out, "--mode", "move").returncode == 0
    assert sorted(p.name for p in tmp_path.rglob(".*moving*")) == []  # every record gone


@pytest.mark.parametrize("indexed", [False, True], ids=["folder", "csv-index"])
def test_a_move_whose_journal_cannot_be_written_leaves_no_record_beside_the_data(
    tmp_path, monkeypatch, indexed
):
    """The records beside ROOT (and in the folders a CSV index lists files in) are written
    just before the journal that says the move runs: where that write failed (a full disk,
    Ctrl-C), the split was undone and they stayed in the data for good."""
    from torchkit.core.io.errors import OutputWriteError
    from torchkit.core.split import run as split_run
    from torchkit.core.split import split_dataset

    root = tmp_path / "data"
    make_files(root, {"cat": 3, "dog": 3})
    source = root
    if indexed:
        source = tmp_path / "index.csv"
        rows = [f"data/{p.parent.name}/{p.name},{p.parent.name}" for p in root.rglob("*.png")]
        source.write_text("path,label\n" + "\n".join(sorted(rows)) + "\n")
    before = tree_digest(root)
    real_write = split_run.write_journal

    def full_disk(out, record):
        if record.get("state") == "moving":
            raise OutputWriteError(f"cannot write {out}: No space left on device")
        real_write(out, record)

    out = tmp_path / "out"
    with monkeypatch.context() as patched:
        patched.setattr(split_run, "write_journal", full_disk)
        with pytest.raises(OutputWriteError):
            split_dataset(source, out, mode="move")
    assert sorted(p.name for p in tmp_path.rglob(".*moving*")) == []
    assert tree_digest(root) == before and not out.exists()
    split_dataset(source, out, mode="move")  # and the rerun moves
    assert sorted(p.name for p in tmp_path.rglob(".*moving*")) == []
    assert len(list(out.rglob("*.png"))) == 6


def test_a_stopped_move_another_user_recorded_is_not_finished(tmp_path, monkeypatch):
    """Another user who can write a folder above the data (/tmp) leaves there the record of
    a "stopped move" into a folder of theirs, whose plan names this user's files: readers of
    the data refuse it and show the command that finishes that move, which moved the files
    into the other user's folder. The plan is another user's: refused, nothing moved."""
    shared = tmp_path / "shared"
    make_files(shared / "mine", {"cat": 1})
    (victim,) = (shared / "mine").rglob("*.png")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / ".torchkit-split.json").write_text(
        json.dumps({"state": "moving", "mode": "move", "root": os.path.realpath(shared)})
    )
    (theirs / "split.csv").write_text(
        f"path,label,split,source\ntrain/cat/x.png,cat,train,{victim}\n"
    )
    (shared / ".torchkit-split-moving.json").write_text(json.dumps({"out": str(theirs)}))
    refused = run_torchkit_in_process("dataset-stats", shared / "mine")
    assert refused.returncode == 1 and "finish that move first" in refused.stderr
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # the files are not ours
    result = run_torchkit_in_process("split", shared, theirs, "--mode", "move")
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        f"Error: {theirs / '.torchkit-split.json'} belongs to another user (uid {os.getuid()}): "
        "torchkit finishes only a move it started as this user, and moves no file to it "
        f"(finish it as the user who started it, or remove {theirs / '.torchkit-split.json'} "
        "if that move is not yours)"
    )
    assert victim.is_file() and not (theirs / "train").exists()


def test_another_users_record_in_a_folder_everyone_writes_does_not_refuse_the_data(
    tmp_path, monkeypatch
):
    """Anyone may leave a record in /tmp: another user's "stopped move" of /tmp refused every
    read of this user's data under it, for as long as they pleased (a record there cannot be
    removed but by its owner). Theirs is passed over where everyone may write the folder; a
    record of this user's own, or one in a folder not everyone may write, still refuses."""
    shared = tmp_path / "shared"
    make_files(shared / "mine", {"cat": 1, "dog": 1})
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / ".torchkit-split.json").write_text(
        json.dumps({"state": "moving", "mode": "move", "root": os.path.realpath(shared)})
    )
    (shared / ".torchkit-split-moving.json").write_text(json.dumps({"out": str(theirs)}))
    from torchkit.core.io.errors import InputError

    me = os.geteuid()
    for everyone_writes, owner, refused in [
        (True, me + 1, False),
        (True, me, True),
        (False, me + 1, True),
    ]:
        shared.chmod(0o777 if everyone_writes else 0o775)
        monkeypatch.setattr(os, "geteuid", lambda owner=owner: me if owner == me else me + 7)
        with held_until_the_command_ends():  # a command reading it, as the CLI runs one
            if refused:
                with pytest.raises(InputError, match="which is half moved into"):
                    open_data(shared / "mine")
            else:
                assert open_data(shared / "mine").classes == ["cat", "dog"]
