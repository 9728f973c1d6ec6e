"""`torchkit split` never loses a file (issue #13), seen as a user sees it: exit codes, the
`Error:` line, and the bytes of every input file before and after; signals in real processes.

OUT is never ROOT, inside it, around it or `.`; `--force` only over an earlier split; a locked OUT
is refused; `--mode move` keeps symbolic links pointing at their files, refuses split names that
are torchkit's own, says a finished move is done; SIGTERM mid-copy puts the earlier split back,
mid-move leaves every file in exactly one place and a rerun finishes it; a full disk is an error.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
from pathlib import Path

import pytest
from disks import paused_io_env, slow_io_env
from image_folders import make_class_files as make_files
from output_checks import error_line, tree_digest
from processes import (
    processes_in_group,
    run_each_in_process,
    run_torchkit_in_process,
    signal_and_wait,
    start_torchkit_process,
    wait_until,
)

from torchkit.core.split.files import moving_out_of


def contents(root: Path) -> dict[str, str]:
    """File name -> SHA-256 of the images under `root`, torchkit's own folders left out (names
    are unique in these tests)."""
    return {
        Path(path).name: digest
        for path, digest in tree_digest(root).items()
        if path.endswith(".png") and ".torchkit" not in path
    }


def split(*args, **kwargs):
    return run_torchkit_in_process("split", *args, **kwargs)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_files(tmp_path / "data", {"cat": 5, "dog": 4})


# --------------------------------------------------------------------------- OUT and the inputs


@pytest.mark.parametrize("mode", ["move", "manifest"])
def test_out_that_is_in_or_holds_the_dataset_is_refused_and_nothing_moves(tmp_path, data, mode):
    index = tmp_path / "index.csv"
    index.write_text("path,label\ndata/cat/cat_00.png,cat\ndata/dog/dog_00.png,dog\n")
    holder = tmp_path / "holder"  # an earlier split that holds the dataset in one of its splits
    make_files(holder / "train", {"cat": 2})
    (holder / "split.csv").write_text("path,label,split,source\n")
    before = tree_digest(tmp_path)
    cases = [
        ([data, data], "is the data folder"),
        ([data, data / "splits"], "lies inside the data folder"),
        ([data / "cat", data, "--force"], "contains the data folder"),
        ([holder / "train", holder, "--force"], "contains the data folder"),
        ([data, tmp_path, "--force"], "contains the data folder"),
        ([index, data / "cat" / "out"], "lies inside the images of"),
        ([index, tmp_path / "data", "--force"], "contains the"),
    ]
    results = run_each_in_process([["split", *args, "--mode", mode] for args, _ in cases])
    for (args, message), result in zip(cases, results, strict=True):
        assert result.returncode == 1, (args, result.stderr)
        assert message in error_line(result.stderr), args
    # `.` and its parents: never, whatever they hold.
    here = [["split", data, out, "--force", "--mode", mode] for out in (".", "..")]
    for result in run_each_in_process(here, cwd=tmp_path / "holder"):
        assert result.returncode == 1 and "working directory" in error_line(result.stderr)
    assert tree_digest(tmp_path) == before  # not a byte changed, nothing created, no lock left


def test_data_named_up_from_a_link_inside_out_is_refused(tmp_path, data):
    """`split OUT/link/.. OUT --force` (OUT/link a link to a class folder): the data folder is
    named through OUT, whose replacement takes the name away: refused, nothing written."""
    out = tmp_path / "out"
    assert split(data, out, "--mode", "manifest").returncode == 0  # an earlier split
    (out / "link").symlink_to(data / "cat", target_is_directory=True)
    before = tree_digest(tmp_path)
    result = split(out / "link" / "..", out, "--force")
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert f"output folder {out} contains the data folder {out / 'link' / '..'}" in line
    assert tree_digest(tmp_path) == before


def test_force_over_a_folder_that_is_not_a_split_is_refused(tmp_path, data):
    mine = tmp_path / "mine"
    make_files(mine, {"train": 2})  # a `train/` of the user's own, no split.csv, no marker
    (mine / "notes.txt").write_text("precious")
    before, data_before = tree_digest(mine), tree_digest(data)
    for mode in ("move", "copy"):
        result = split(data, mine, "--force", "--mode", mode)
        assert result.returncode == 1
        assert "was not written by torchkit" in error_line(result.stderr)
    assert tree_digest(mine) == before and tree_digest(data) == data_before


def test_force_over_another_commands_output_is_refused(tmp_path, data):
    # `split DATA RUN --force` merged a split into a train run: the run's split.csv, which
    # `eval --split val` reuses, was replaced by this split's.
    from torchkit.core.io.force import write_marker

    run = tmp_path / "run"
    run.mkdir()
    write_marker(run, "train")
    (run / "split.csv").write_text("path,label,split\ncat/cat_00.png,cat,val\n")
    (run / "best.pt").write_bytes(b"weights")
    before = tree_digest(run)
    for force in ((), ("--force",)):
        result = split(data, run, *force)
        assert result.returncode == 1, result.stderr
        assert "holds the output of torchkit train, not a split" in error_line(result.stderr)
    assert tree_digest(run) == before


def test_force_replaces_an_earlier_split_and_keeps_other_files(tmp_path, data):
    out = tmp_path / "out"
    assert split(data, out, "--names", "a,b,c").returncode == 0
    (out / "keep.txt").write_text("mine")  # --force replaces the split, not this
    assert split(data, out, "--force", "--ratio", "1:1").returncode == 0
    assert sorted(p.name for p in out.iterdir()) == [
        ".torchkit",
        "keep.txt",
        "split.csv",
        "train",
        "val",
    ]
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "first, yours",
    [
        ([], "train/cat/mine.png"),  # put into a split folder of the earlier split
        (["--ratio", "1:1"], "test/mine.png"),  # a folder of its name beside a two-part split
        (["--mode", "manifest"], "train/mine.png"),  # a manifest's OUT has no split folders
    ],
)
def test_force_refuses_files_in_split_folders_that_the_earlier_split_did_not_write(
    tmp_path, data, first, yours
):
    """Before: --force set the split folders aside whole and deleted them, with every file of
    yours in them, exit 0 and not a word."""
    out = tmp_path / "out"
    assert split(data, out, *first).returncode == 0
    (out / yours).parent.mkdir(parents=True, exist_ok=True)
    (out / yours).write_text("mine")
    before = tree_digest(out)
    # Without --force the refusal is the same, not a hint to pass --force (refused in turn).
    for force in (["--force"], []):
        result = split(data, out, *force, "--seed", "1")
        assert result.returncode == 1, result.stderr
        assert error_line(result.stderr) == (
            f"Error: output folder {out} holds files in its split folders that the earlier "
            f"split did not write, which --force would delete with them: {yours} (move them "
            "out of those folders, or choose another output folder)"
        )
    assert tree_digest(out) == before
    (out / yours).unlink()  # gone: the earlier split is replaced as before, and what a file
    (out / yours).with_name(".DS_Store").write_text("")  # browser left there goes with it
    assert split(data, out, "--force", "--seed", "1").returncode == 0


def test_force_over_an_unmarked_folder_with_a_split_csv_is_refused(tmp_path, data):
    # Another tool's split: a split.csv whose `split` column names the folders beside it. It
    # looked like an earlier torchkit split and --force replaced its folders.
    out = tmp_path / "theirs"
    make_files(out / "train", {"cat": 2})
    make_files(out / "val", {"dog": 1})
    (out / "split.csv").write_text(
        "path,label,split\ntrain/cat/cat_00.png,cat,train\nval/dog/dog_00.png,dog,val\n"
    )
    before = tree_digest(out)
    result = split(data, out, "--force")
    assert result.returncode == 1, result.stderr
    assert "was not written by torchkit" in error_line(result.stderr)
    assert tree_digest(out) == before


def test_report_file_may_not_be_an_input_or_a_file_the_split_writes(tmp_path, data):
    index = tmp_path / "index.csv"
    index.write_text("path,label\ndata/cat/cat_00.png,cat\ndata/dog/dog_00.png,dog\n")
    out = tmp_path / "out"
    before = tree_digest(tmp_path)
    cases = [
        ([index, out, "-o", index, "--force"], "is the data file"),
        ([data, out, "-o", data / "cat" / "report.json"], "lies inside the data folder"),
        ([data, out, "-o", out / "split.csv", "--force"], "a file the split writes"),
        ([data, out, "-o", out / "train" / "r.json"], "a file the split writes"),
        ([data, out, "-o", out, "--force"], "the output folder"),
    ]
    results = run_each_in_process([["split", *args, "--mode", "move"] for args, _ in cases])
    for (args, message), result in zip(cases, results, strict=True):
        assert result.returncode == 1, (args, result.stderr)
        assert message in error_line(result.stderr), args
    assert tree_digest(tmp_path) == before
    # A report of your own beside the split is fine.
    assert split(data, out, "-o", out / "report.txt").returncode == 0
    assert "total" in (out / "report.txt").read_text()


def test_a_second_split_into_a_locked_out_is_refused_at_once(tmp_path, data):
    from torchkit.core.io.output_locks import FolderLock

    out = tmp_path / "out"
    before = tree_digest(data)
    lock = FolderLock(out, "output folder")  # as another torchkit process writing OUT would
    try:
        for mode in ("move", "copy"):
            result = split(data, out, "--mode", mode)
            assert result.returncode == 1
            line = error_line(result.stderr)
            assert "being written by another torchkit process" in line
            assert f"PID {os.getpid()}" in line
    finally:
        lock.release()
    assert tree_digest(data) == before and not out.exists()
    assert split(data, out, "--mode", "move").returncode == 0  # once it is free


# --------------------------------------------------------------------------- --mode move


def test_move_keeps_every_symbolic_link_pointing_at_its_file(tmp_path, data):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "pool.png").write_bytes(b"pooled")
    (data / "cat" / "out_rel.png").symlink_to("../../shared/pool.png")  # leaves the dataset
    (data / "cat" / "out_abs.png").symlink_to(shared / "pool.png")
    # To a file that moves too (in its class: one file in two classes is refused).
    (data / "dog" / "more").mkdir()
    (data / "dog" / "more" / "in_rel.png").symlink_to("../dog_00.png")
    (data / "dog" / "in_abs.png").symlink_to(data / "dog" / "dog_01.png")
    expected = {p.name: p.read_bytes() for p in data.rglob("*.png")}
    out = tmp_path / "out"
    result = split(data, out, "--mode", "move", "--ratio", "1:1")
    assert result.returncode == 0, result.stderr
    moved = {p.name: p for p in out.rglob("*.png")}
    assert {name: p.read_bytes() for name, p in moved.items()} == expected
    assert not list(data.rglob("*.png"))
    # Links to files that moved along are relative inside OUT; others absolute.
    assert not os.path.isabs(os.readlink(moved["in_rel.png"]))
    assert not os.path.isabs(os.readlink(moved["in_abs.png"]))
    assert os.readlink(moved["out_rel.png"]) == str(shared / "pool.png")
    # They hold when the emptied dataset folder is deleted and when OUT itself is moved.
    for folder in sorted(data.rglob("*"), reverse=True):
        folder.rmdir()
    data.rmdir()
    out.rename(tmp_path / "elsewhere")
    again = {p.name: p.read_bytes() for p in (tmp_path / "elsewhere").rglob("*.png")}
    assert again == expected


@pytest.mark.parametrize("link", ["bird", os.path.join("cat", "bird")])
def test_move_never_empties_a_folder_that_a_class_folder_links_to(tmp_path, data, link):
    """Before: a class folder linked to one outside ROOT was emptied into OUT (exit 0). A
    folder linked inside a class folder is read as ImageFolder reads it: refused alike."""
    elsewhere = make_files(tmp_path / "elsewhere", {"bird": 4})
    (data / link).symlink_to(elsewhere / "bird", target_is_directory=True)
    before, kept = tree_digest(data), tree_digest(elsewhere)
    for mode in ("move", "copy"):
        result = split(data, tmp_path / mode, "--mode", mode)
        if mode == "move":
            assert result.returncode == 2
            assert error_line(result.stderr) == (
                f"Error: --mode move would empty {elsewhere / 'bird'}, outside {data}: "
                f"{data / link} leads there through a symbolic link (use --mode copy, symlink "
                "or hardlink, or put the folder itself in ROOT)"
            )
            assert not (tmp_path / "move").exists()
        else:  # copying reads the files where the link leads, and leaves them
            assert result.returncode == 0, result.stderr
        assert tree_digest(data) == before and tree_digest(elsewhere) == kept


def test_move_refuses_a_class_folder_linked_to_another_class_folder(tmp_path, data):
    """Before: ROOT/kitty -> cat listed cat's files twice; the move stopped half-way (exit 1)
    with `kitty/cat_0.png disappeared during the move`, and its rerun said another process had
    deleted them. Now every reader refuses it, each of cat's files being in two classes."""
    (data / "kitty").symlink_to("cat", target_is_directory=True)
    before = tree_digest(data)
    result = split(data, tmp_path / "out", "--mode", "move")
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        f"Error: {data / 'cat' / 'cat_00.png'} and {data / 'kitty' / 'cat_00.png'} are one file "
        f"in two classes, cat and kitty (and 4 more) (an image has one label: remove the link "
        f"{data / 'kitty'} -> cat)"
    )
    assert tree_digest(data) == before and not (tmp_path / "out").exists()


def test_a_second_move_out_of_the_same_root_meanwhile_is_refused(tmp_path, data):
    """Before: two moves out of one ROOT into two OUTs at once: the second stopped half-way
    (`X disappeared during the move`), and its rerun took every file for one another process
    had deleted (exit 0, an empty split). A move holds a flock on ROOT itself."""
    import fcntl

    before = tree_digest(data)
    first = os.open(data, os.O_RDONLY)  # the flock a first move holds while it runs
    try:
        fcntl.flock(first, fcntl.LOCK_EX)
        result = split(data, tmp_path / "second", "--mode", "move")
    finally:
        os.close(first)
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        f"Error: another torchkit split is moving files out of or into {data} or a folder in "
        "it (wait for it to finish; then split what it left, if anything)"
    )
    assert tree_digest(data) == before and not (tmp_path / "second").exists()
    assert split(data, tmp_path / "copy", "--mode", "copy").returncode == 0  # copies need none
    assert split(data, tmp_path / "after", "--mode", "move").returncode == 0  # released


def test_split_names_torchkit_keeps_for_itself_are_usage_errors(tmp_path, data):
    before = tree_digest(data)
    names = [
        "train,val,.torchkit-split.json",
        "train,.TorchKit,test",
        "train,val,split.csv",
        "train,a/b,test",
        "train,..,test",
        "train,val," + "x" * 256,
        ".git,val,test",  # hidden, or a folder readers skip: a split nobody would see
        "train,__MACOSX,test",
    ]
    cases = [["split", data, tmp_path / "out", "--mode", "move", "--names", n] for n in names]
    for given, result in zip(names, run_each_in_process(cases), strict=True):
        assert result.returncode == 2, (given, result.stderr)
        assert "cannot be a split folder name" in error_line(result.stderr)
    assert tree_digest(data) == before and not (tmp_path / "out").exists()


def test_rerunning_a_finished_move_says_it_is_done_and_touches_nothing(tmp_path, data):
    out = tmp_path / "out"
    args = [data, out, "--mode", "move", "--seed", "3", "--format", "json"]
    first = split(*args)
    assert first.returncode == 0, first.stderr
    after = tree_digest(out)
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = split(*args)
    assert again.returncode == 0, again.stderr
    assert "already done" in again.stderr
    # Not followed by "moved 20 files into out": this run moved none.
    notes = [line for line in again.stderr.splitlines() if line.startswith("Note: ")]
    assert re.match(rf"Note: \d+ files in {re.escape(str(out))} \(ratio ", notes[1])
    assert not any(" moved " in f" {line}" for line in notes)
    assert json.loads(again.stdout) == json.loads(first.stdout)  # the same summary
    assert tree_digest(out) == after and {p: p.stat().st_mtime_ns for p in out.rglob("*")} == stamps
    # Another split over those only copies is still refused, with or without --force.
    other = split(data, out, "--mode", "move", "--seed", "4", "--force")
    assert other.returncode == 1 and "the only copies" in error_line(other.stderr)
    assert tree_digest(out) == after


# --------------------------------------------------------------------------- signals, full disk


def test_sigterm_mid_move_leaves_every_file_in_one_place_and_a_rerun_finishes(tmp_path):
    data = make_files(tmp_path / "data", {"cat": 8, "dog": 7})
    expected = contents(data)
    out = tmp_path / "out"
    process = start_torchkit_process(
        "split", str(data), str(out), "--mode", "move", env=slow_io_env(tmp_path, out)
    )
    wait_until(lambda: len(list(out.rglob("*.png"))) >= 3, process=process, what="a few moves")
    code, _, err = signal_and_wait(process, signal.SIGTERM)
    assert code == 143 and "Terminated" in err and "Traceback" not in err
    assert f"finish it with: torchkit split {data} {out} --mode move" in err
    assert not processes_in_group(process.pid)
    in_root, in_out = contents(data), contents(out)
    assert 3 <= len(in_out) < len(expected)
    assert not set(in_root) & set(in_out)  # in exactly one place...
    assert in_root | in_out == expected  # ...each of them, unchanged
    assert json.loads((out / ".torchkit-split.json").read_text())["state"] == "moving"

    result = split(data, out, "--mode", "move")
    assert result.returncode == 0, result.stderr
    assert "finishing the interrupted move" in result.stderr
    assert contents(out) == expected and not contents(data)
    assert json.loads((out / ".torchkit-split.json").read_text())["state"] == "done"


def test_a_move_across_file_systems_onto_a_full_disk_loses_nothing_and_leaves_no_half_copy(
    tmp_path, small_tmpfs, monkeypatch
):
    from disks import fill_disk

    from torchkit.core.split import run as split_run

    data = make_files(tmp_path / "data", {"cat": 10, "dog": 10})  # a 4 KiB page a file there
    expected = contents(data)
    disk = fill_disk(small_tmpfs(256), leave=48 * 1024)  # room for about half of them
    # A disk another writer fills as the move runs: the room counted as it began is gone
    # (a disk too small to begin with is refused before any file moves).
    monkeypatch.setattr(split_run, "check_room_for_move", lambda *args, **kwargs: None)
    out = disk / "out"
    result = split(data, out, "--mode", "move")
    assert result.returncode == 1, result.stderr
    assert f"cannot write {out}" in error_line(result.stderr, besides="warnings")
    assert "stopped half-way" in result.stderr
    in_root, in_out = contents(data), contents(out)
    assert in_out and not set(in_root) & set(in_out) and in_root | in_out == expected
    assert not [p for p in out.rglob("*") if p.name.startswith(".torchkit-move-")]  # half copy

    (disk / "filler").unlink()  # room made: the rerun finishes the move
    result = split(data, out, "--mode", "move")
    assert result.returncode == 0, result.stderr
    assert contents(out) == expected and not contents(data)


def test_a_root_half_moved_by_a_killed_move_is_refused_to_another_move_and_to_readers(tmp_path):
    # The second move went ahead: ROOT ended split across two outputs, each with half a split.
    # And a copy split, dataset-stats, train and eval of ROOT read the half left there as if it
    # were all of it.
    data = make_files(tmp_path / "data", {"cat": 8, "dog": 7})
    out, other = tmp_path / "out", tmp_path / "other"
    # Stopped at its fourth move (a rename into OUT): three files moved, twelve not.
    env, paused = paused_io_env(tmp_path, f"{out}{os.sep}", calls=("os.rename",), at=4)
    process = start_torchkit_process("split", str(data), str(out), "--mode", "move", env=env)
    wait_until(paused.exists, process=process, what="a few moves")
    code, _, _ = signal_and_wait(process, signal.SIGKILL)
    assert len(list(out.rglob("*.png"))) == 3
    assert code == -signal.SIGKILL
    before = tree_digest(tmp_path)
    refused = split(data, other, "--mode", "move")
    assert refused.returncode == 1
    assert error_line(refused.stderr) == (
        f"Error: {data} is half moved into {out}: a split --mode move into it stopped (finish "
        f"that move first: torchkit split {data} {out} --mode move)"
    )
    assert tree_digest(tmp_path) == before  # nothing moved, no other made
    readers = [
        ["split", data, other, "--mode", mode] for mode in ("copy", "symlink", "manifest")
    ] + [
        ["dataset-stats", data],
        ["train", "--data", data, "--model", "nets:TinyNet", "--out", other, "--epochs", "1"],
        ["eval", "--model", "convnet", "--allow-untrained", "--data", data],
    ]
    for args, result in zip(readers, run_each_in_process(readers), strict=True):
        assert result.returncode == 1, (args, result.stderr)
        assert error_line(result.stderr) == error_line(refused.stderr), args
    # A move that runs now holds ROOT's lock (here the test's): it is not called stopped.
    with moving_out_of(data):
        running = run_each_in_process(readers[:1] + readers[3:4])
    for result in running:
        assert result.returncode == 1, result.stderr
        assert error_line(result.stderr) == (
            f"Error: {data} is being moved into {out} by a torchkit split --mode move running "
            f"now (wait for it to finish, then read {out})"
        )
    assert tree_digest(tmp_path) == before

    assert split(data, out, "--mode", "move").returncode == 0  # as the error says
    assert not contents(data) and not (data / ".torchkit-split-moving.json").exists()


def test_a_move_killed_before_its_journal_is_undone_by_the_same_command(tmp_path):
    # split.csv went to disk before the move's journal: killed between the two, OUT held a
    # split.csv of files still in ROOT, which readers took for a finished split and the same
    # command refused ("output folder already exists ... pass --force").
    data = make_files(tmp_path / "data", {"cat": 6, "dog": 6})
    expected = contents(data)
    out = tmp_path / "out"
    journal = out / ".torchkit-split.json"
    # Stopped once split.csv is in place: the kill lands before the journal says "moving".
    env, paused = paused_io_env(tmp_path, out / "split.csv", calls=("os.replace",), after=True)
    process = start_torchkit_process("split", str(data), str(out), "--mode", "move", env=env)
    wait_until(paused.exists, process=process, what="split.csv")
    assert json.loads(journal.read_text())["state"] == "copying"
    code, _, _ = signal_and_wait(process, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert contents(data) == expected and not contents(out)  # nothing moved yet
    refused = run_torchkit_in_process("dataset-stats", out)
    assert refused.returncode == 1 and "unfinished split" in error_line(refused.stderr)

    result = split(data, out, "--mode", "move")
    assert result.returncode == 0, result.stderr
    assert contents(out) == expected and not contents(data)
    assert json.loads(journal.read_text())["state"] == "done"


@pytest.mark.parametrize("mode", ["move", "copy"])
def test_a_split_killed_before_its_first_journal_is_redone_by_the_same_command(tmp_path, mode):
    # Killed once OUT was made and marked, before any journal: OUT held only the marker, and
    # the same command refused it ("output folder already exists ... pass --force").
    data = make_files(tmp_path / "data", {"cat": 4, "dog": 4})
    expected = contents(data)
    out = tmp_path / "out"
    # Stopped as the journal's temporary is renamed into place: the kill lands there.
    env, paused = paused_io_env(tmp_path, out / ".torchkit-split.json", calls=("os.replace",))
    process = start_torchkit_process("split", str(data), str(out), "--mode", mode, env=env)
    wait_until(paused.exists, process=process, what="the journal's rename")
    code, _, _ = signal_and_wait(process, signal.SIGKILL)
    assert code == -signal.SIGKILL
    temporary, marker = sorted(os.listdir(out))  # all that OUT holds
    assert marker == ".torchkit" and temporary.startswith("..torchkit-split.json.")
    result = split(data, out, "--mode", mode)
    assert result.returncode == 0, result.stderr
    assert contents(out) == expected


def test_a_split_killed_as_it_writes_its_marker_is_redone_by_the_same_command(tmp_path):
    # The marker was written in place: killed between its file's creation and its text, OUT
    # held an empty marker, which names no command, and the same command refused it ("output
    # folder already exists ... pass --force"). Now the marker is renamed into place whole.
    data = make_files(tmp_path / "data", {"cat": 4, "dog": 4})
    out = tmp_path / "out"
    # Stopped once the first hidden file in OUT (the marker, or its temporary) is opened.
    opens = ("io.open", "os.open")
    env, paused = paused_io_env(tmp_path, f"{out}{os.sep}.", calls=opens, after=True)
    process = start_torchkit_process("split", str(data), str(out), env=env)
    wait_until(paused.exists, process=process, what="the marker's write")
    code, _, _ = signal_and_wait(process, signal.SIGKILL)
    assert code == -signal.SIGKILL
    result = split(data, out)
    assert result.returncode == 0, result.stderr
    assert contents(out) == contents(data)
    assert sorted(os.listdir(out)) == [".torchkit", "split.csv", "test", "train", "val"]


def test_sigterm_mid_copy_with_force_puts_the_earlier_split_back(tmp_path):
    data = make_files(tmp_path / "data", {"cat": 10, "dog": 10})
    out = tmp_path / "out"
    assert split(data, out, "--names", "a,b,c").returncode == 0
    before, data_before = tree_digest(out), tree_digest(data)
    process = start_torchkit_process(
        "split", str(data), str(out), "--force", env=slow_io_env(tmp_path, out / "train")
    )
    wait_until(
        lambda: len(list((out / "train").rglob("*.png"))) >= 2, process=process, what="copies"
    )
    assert (out / ".torchkit-split-replaced" / "a").is_dir()  # the earlier split, set aside
    code, _, err = signal_and_wait(process, signal.SIGTERM)
    assert code == 143 and "Traceback" not in err
    assert tree_digest(out) == before and tree_digest(data) == data_before
    assert sorted(os.listdir(tmp_path)) == ["data", "out", "slow-io"]  # no lock, no leftovers


def kill_mid_copy(tmp_path: Path, data: Path, out: Path, *args: str) -> None:
    """`split DATA OUT ARGS`, SIGKILLed once it has copied 2 images into OUT/train (stopped at
    the third, and each copy into OUT/train that a thread starts after it)."""
    env, paused = paused_io_env(tmp_path, out / "train", calls=("shutil.copy2",), at=3)
    process = start_torchkit_process("split", str(data), str(out), *args, env=env)
    wait_until(paused.exists, process=process, what="copies")
    code, _, _ = signal_and_wait(process, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert json.loads((out / ".torchkit-split.json").read_text())["state"] == "copying"


def test_a_killed_copy_is_no_split_to_readers_and_the_rerun_redoes_it(tmp_path):
    data = make_files(tmp_path / "data", {"cat": 10, "dog": 10})
    out = tmp_path / "out"
    kill_mid_copy(tmp_path, data, out)
    for command in (["dataset-stats", out], ["train", "--data", out, "--epochs", "1"]):
        refused = run_torchkit_in_process(*command)
        assert refused.returncode == 1
        assert error_line(refused.stderr) == (
            f"Error: {out} is an unfinished split (a torchkit split was stopped while writing "
            "it) (run the split command again)"
        )
    result = split(data, out)  # the same command: no --force needed
    assert result.returncode == 0, result.stderr
    assert "removed the unfinished split" in result.stderr
    assert contents(out) == contents(data)
    assert sorted(os.listdir(out)) == [".torchkit", "split.csv", "test", "train", "val"]


def test_a_killed_grouped_oversampled_copy_journals_the_names_its_repeats_take(tmp_path):
    """--oversample --group stem where ROOT holds `000-repeat1.png` already: the journal of a
    copy killed part-way lists the names the pair's repeats take (`000-repeat1-1.jpg` with
    `000-repeat1-1.png`), those the finished split writes, so the next run removes every file
    the killed one wrote and redoes the split whole."""
    data = tmp_path / "data"
    for folder, count in {"cat": 6, "dog": 2}.items():
        (data / folder).mkdir(parents=True)
        for i in range(count):
            for suffix in (".jpg", ".png"):
                (data / folder / f"{i:03d}{suffix}").write_bytes(f"{folder}{i}{suffix}".encode())
    (data / "dog" / "000-repeat1.png").write_bytes(b"a file of its own")
    (data / "dog" / "001-repeat1.png").write_bytes(b"another one")
    out = tmp_path / "out"
    args = ("--group", "stem", "--fixed", "1", "--oversample")
    kill_mid_copy(tmp_path, data, out, *args)
    dests = json.loads((out / ".torchkit-split.json").read_text())["dests"]
    renamed = [dest for dest in dests if "-repeat1-1." in dest]
    assert len(renamed) == 2 and {dest.rsplit(".", 1)[0] for dest in renamed} in (
        {"train/dog/000-repeat1-1"},
        {"train/dog/001-repeat1-1"},
    )
    result = split(data, out, *args)
    assert result.returncode == 0, result.stderr
    assert "removed the unfinished split" in result.stderr
    with (out / "split.csv").open(newline="") as handle:
        paths = [row["path"] for row in csv.DictReader(handle)]
    assert paths == dests  # the same plan, the same names
    written = {
        path.relative_to(out).as_posix()
        for path in out.rglob("*")
        if path.is_file() and ".torchkit" not in path.name and path.name != "split.csv"
    }
    assert written == set(dests)


def test_a_killed_force_copy_is_redone_and_your_own_files_in_out_stay(tmp_path):
    data = make_files(tmp_path / "data", {"cat": 10, "dog": 10})
    out = tmp_path / "out"
    assert split(data, out, "--names", "a,b,c").returncode == 0
    (out / "notes.txt").write_text("mine")
    kill_mid_copy(tmp_path, data, out, "--force")
    refused = run_torchkit_in_process("dataset-stats", out)
    assert refused.returncode == 1 and "unfinished split" in error_line(refused.stderr)
    result = split(data, out, "--force")
    assert result.returncode == 0, result.stderr
    assert contents(out) == contents(data)
    assert sorted(os.listdir(out)) == [
        ".torchkit",
        "notes.txt",
        "split.csv",
        "test",
        "train",
        "val",
    ]
    assert (out / "notes.txt").read_text() == "mine"


def test_a_killed_force_copy_leaves_a_file_put_in_its_split_folder_to_the_next_run(tmp_path):
    """SIGKILL mid-copy of a --force split over an earlier one, then a file of the user's put
    into a split folder the killed run made: the next run removes only what the killed run
    copied (its journal lists the files), puts the earlier split back, keeps that folder with
    the user's file in it and says so."""
    data = make_files(tmp_path / "data", {"cat": 10, "dog": 10})
    out = tmp_path / "out"
    assert split(data, out, "--names", "a,b,c").returncode == 0
    before = tree_digest(out)
    kill_mid_copy(tmp_path, data, out, "--force")
    (out / "train" / "mine.txt").write_text("mine")
    result = split(data, out)  # the next run on OUT: refused (no --force), after the recovery
    # Named, as --force would be refused for it (not "already exists (pass --force ...)").
    assert result.returncode == 1 and "train/mine.txt (move them" in error_line(result.stderr)
    assert "removed the unfinished split" in result.stderr
    assert "it holds files the killed split did not write (train)" in result.stderr
    mine = tree_digest(out / "train")
    assert tree_digest(out) == before | {"train": "dir", "train/mine.txt": mine["mine.txt"]}


def test_a_killed_force_split_is_put_back_by_the_next_run(tmp_path):
    data = make_files(tmp_path / "data", {"cat": 10, "dog": 10})
    out = tmp_path / "out"
    assert split(data, out).returncode == 0
    before = tree_digest(out)
    # Stopped once the first folder of the earlier split is set aside.
    aside = out / ".torchkit-split-replaced"
    env, paused = paused_io_env(tmp_path, aside, calls=("os.replace",), after=True)
    process = start_torchkit_process(
        "split", str(data), str(out), "--force", "--seed", "1", env=env
    )
    wait_until(paused.exists, process=process, what="aside")
    code, _, _ = signal_and_wait(process, signal.SIGKILL)
    assert code == -signal.SIGKILL
    result = split(data, out)  # the next run on OUT, even one that is refused
    assert "put back the earlier split" in result.stderr
    assert result.returncode == 1 and "already exists" in error_line(result.stderr)
    assert tree_digest(out) == before


def test_a_full_disk_is_an_error_that_names_out_and_leaves_nothing(tmp_path, small_tmpfs):
    disk = small_tmpfs(64)  # 16 files of one 4 KiB page each
    data = make_files(tmp_path / "data", {"cat": 20, "dog": 20})
    before = tree_digest(data)
    result = split(data, disk / "out")
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert f"cannot write {disk / 'out'}" in line and "No space left" in line
    assert tree_digest(data) == before and os.listdir(disk) == []


def test_a_disk_with_no_room_for_the_lock_is_an_error_and_the_earlier_split_stays(
    data, small_tmpfs
):
    from disks import fill_disk

    disk = small_tmpfs(64)
    assert split(data, disk / "out", "--mode", "manifest").returncode == 0
    before = tree_digest(disk)
    fill_disk(disk)  # room for a name (the lock's), not for a byte (its PID)
    result = split(data, disk / "out", "--mode", "manifest", "--force")
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert f"cannot write {disk / 'out'}: No space left" in line, line
    (disk / "filler").unlink()
    assert tree_digest(disk) == before  # no lock file left beside OUT


@pytest.mark.parametrize("mode", ["copy", "manifest"])
def test_a_disk_with_room_for_the_lock_but_not_the_marker_leaves_no_out(data, small_tmpfs, mode):
    from disks import fill_disk

    disk = fill_disk(small_tmpfs(64), leave=4096)  # one page: the lock's PID, no marker
    result = split(data, disk / "out", "--mode", mode)
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert f"cannot write {disk / 'out'}" in line and "No space left" in line, line
    assert os.listdir(disk) == ["filler"]  # no OUT holding an empty .torchkit marker


@pytest.mark.parametrize("forced", [False, True])
def test_a_failed_split_keeps_files_copied_into_out_while_it_ran(tmp_path, forced):
    """A file the user copies into OUT (or into a split folder) while the split copies is not
    the split's: the clean-up of a failed split removes the split's own files only, and the
    error says why OUT is still there."""
    from torchkit.core.io.errors import InputError, OutputExistsError
    from torchkit.core.split import split_dataset

    data = make_files(tmp_path / "data", {"ant": 4, "bee": 4})
    out = tmp_path / "out"
    if forced:
        split_dataset(data, out, mode="copy")
    before = tree_digest(out) if forced else None

    def progress(done: int, total: int) -> None:  # every file copied: then a failure
        if done == total:
            (out / "notes.txt").write_text("the user's\n")
            (out / "train" / "ant" / "mine.png").write_bytes(b"the user's")
            raise InputError("cannot read data/bee/bee_03.png")

    with pytest.raises(InputError) as raised:
        split_dataset(data, out, mode="copy", force=forced, progress=progress)
    assert raised.value.message.startswith(
        "cannot read data/bee/bee_03.png; output folder "
        f"{out} was kept: it holds files this run did not write ("
    ), raised.value.message
    if forced:  # the earlier split is back, but for the folder the user's file is in
        assert "the earlier split is still set aside" in raised.value.message
        assert os.listdir(out / "train" / "ant") == ["mine.png"]
        assert (out / "notes.txt").is_file() and (out / "split.csv").is_file()
        with pytest.raises(OutputExistsError, match="holds part of an earlier split"):
            split_dataset(data, out, mode="copy", force=True)  # never over the user's file
        assert os.listdir(out / "train" / "ant") == ["mine.png"]
        (out / "train" / "ant" / "mine.png").unlink()
        (out / "notes.txt").unlink()
        split_dataset(data, out, mode="copy", force=True)  # the earlier split back, replaced
        assert tree_digest(out) == before
    else:
        assert sorted(os.listdir(out)) == ["notes.txt", "train"]  # no marker, no split.csv
        assert os.listdir(out / "train") == ["ant"]
        assert os.listdir(out / "train" / "ant") == ["mine.png"]


@pytest.mark.parametrize(
    ("name", "shown"),
    [("my out", "'{}/my out'"), ("my\nout", "$'{}/my\\nout'")],
    ids=["space", "newline"],
)
def test_the_commands_that_finish_a_move_quote_its_folders(tmp_path, caplog, name, shown):
    """`torchkit split my data my out --mode move` would be six words: the command shown is
    pasted as it is, on one line whatever the folders' names hold."""
    from torchkit.core.io.errors import UsageError
    from torchkit.core.split.run import _finish_hint, _resume_move

    data, out = tmp_path / "my data", tmp_path / name
    command = f"torchkit split '{data}' {shown.format(tmp_path)} --mode move"
    with pytest.raises(KeyboardInterrupt), _finish_hint(data, out):
        raise KeyboardInterrupt
    assert caplog.messages[-1].endswith(f"; finish it with: {command}")
    with pytest.raises(UsageError) as refused:
        journal = {"root": str(data), "names": ["a", "b"], "ratio": [1, 1], "seed": 0}
        _resume_move(tmp_path / "other", out, journal | {"stratified": True}, "move", None)
    assert refused.value.hint == f"finish it with: {command}"


def test_a_split_being_written_now_is_no_split_to_readers_nor_one_stopped(tmp_path):
    """OUT of a split that runs now (its journal says `copying`, its lock is held) is refused
    as one being written, not as one a stopped split left (`run the split command again`,
    which the lock refuses)."""
    from torchkit.core.io.output_locks import FolderLock

    out = tmp_path / "out"
    (out / "train" / "cat").mkdir(parents=True)
    (out / "train" / "cat" / "a.png").write_bytes(b"\x89PNG")
    (out / ".torchkit-split.json").write_text(json.dumps({"state": "copying", "mode": "copy"}))
    lock = FolderLock(out, "output folder")
    try:
        refused = run_torchkit_in_process("dataset-stats", out)
    finally:
        lock.release()
    assert refused.returncode == 1
    assert error_line(refused.stderr) == (
        f"Error: {out} is an unfinished split: a torchkit split is writing it now "
        "(wait for it to finish)"
    )
    stopped = run_torchkit_in_process("dataset-stats", out)
    assert "was stopped while writing it" in error_line(stopped.stderr)
