"""The output-safety layer (core/io/outputs.py) on its own: overlap with inputs, protected folders,
`--force` only over torchkit's folders, the lock, set-aside and put back (also across SIGTERM and
SIGKILL of a real process), write errors and special files."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from output_checks import tree_digest
from processes import processes_in_group, signal_and_wait, wait_until

from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.io.claims import reporting_write_errors
from torchkit.core.io.errors import OutputExistsError, OutputWriteError, UsageError
from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.io.files import atomic_path, atomic_write_text, torch_save
from torchkit.core.io.force import force_hint, write_marker
from torchkit.core.io.output_locks import FolderLock, OutputLockedError
from torchkit.core.io.output_paths import MARKER
from torchkit.core.io.outputs import OutputFolder, recover_leftovers
from torchkit.core.io.overlap import (
    InputPath,
    OutputOverlapError,
    check_not_protected,
    check_overlap,
)
from torchkit.core.io.special_files import is_special_file
from torchkit.core.io.temporaries import temporary_affixes
from torchkit.core.io.write_errors import as_write_error, is_write_error


def _old_run(folder: Path) -> Path:
    """A folder torchkit wrote earlier (it carries the marker)."""
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("{}\n")
    (folder / "result.json").write_text('{"old": true}\n')
    return folder


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    (root / "cat").mkdir(parents=True)
    (root / "cat" / "1.png").write_bytes(b"png")
    return root


# Overlap with inputs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("ds", "is the data folder"),
        ("ds/run", "lies inside the data folder"),
        ("ds/cat/1.png", "lies inside the data folder"),
        (".", "contains the data folder"),
    ],
)
def test_overlap_with_a_data_folder_is_refused(tmp_path, dataset, monkeypatch, output, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputOverlapError, match=message):
        check_overlap(output, "output folder", [InputPath.of("ds", "data folder")])


def test_overlap_sees_through_symlinks_and_dotdot(tmp_path, dataset):
    link = tmp_path / "link"
    link.symlink_to(dataset)
    with pytest.raises(OutputOverlapError, match="is the data folder"):
        check_overlap(link, "output folder", [InputPath.of(dataset, "data folder")])
    with pytest.raises(OutputOverlapError, match="lies inside"):
        check_overlap(
            tmp_path / "x" / ".." / "ds" / "new", "-o", [InputPath(dataset, "data folder")]
        )


def test_an_input_named_through_the_output_folder_is_refused(tmp_path):
    """`train --data OLD/link --out OLD --force`, the link (to a folder elsewhere) inside an
    earlier run: set aside with OLD, every image was unreadable ('none of the 8 training
    images could be read'); eval deleted the link with OLD. Now refused, nothing touched."""
    from image_folders import write_image_folder
    from output_checks import error_line
    from processes import run_torchkit_in_process

    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    old = _old_run(tmp_path / "old")
    (old / "dslink").symlink_to(tmp_path / "ds")
    before = tree_digest(tmp_path)
    args = ["--data", "old/dslink", "--val-split", "0.3", "--out", "old", "--force"]
    tiny = ["--model", "convnet", "--image-size", "8", "--epochs", "1", "--workers", "0"]
    result = run_torchkit_in_process("train", *args, *tiny, cwd=tmp_path)
    assert result.returncode == 1
    assert "run folder old contains the data folder old/dslink" in error_line(result.stderr)
    assert tree_digest(tmp_path) == before


def test_overlap_sees_a_second_path_to_the_same_folder(tmp_path, bind_view):
    """eval --data VIEW --out OUT --force, VIEW another path to OUT (a split output): the
    reports replaced OUT, and the images were deleted."""
    from checkpoints import write_convnet_checkpoint
    from image_folders import write_image_folder
    from output_checks import error_line
    from processes import run_torchkit_in_process

    split = tmp_path / "split"
    write_image_folder(split, {"a": 2, "b": 2})
    (split / MARKER).write_text("{}")
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="ab")
    before = tree_digest(split)
    view = bind_view(split)
    for data, out, message in (
        (view, split, "is the data folder"),
        (view / "a", split, "contains the data folder"),
        (view, split / "a" / "new", "lies inside the data folder"),
    ):
        result = run_torchkit_in_process(
            "eval", tmp_path / "m.pt", "--data", data, "--out", out, "--force", "-j", "0"
        )
        assert result.returncode == 1 and message in error_line(result.stderr), result.stderr
    assert tree_digest(split) == before


def test_a_quoted_tilde_is_checked_as_the_folder_it_writes(tmp_path, monkeypatch):
    """`split ./~/images '~/images/out'`: the shell expands `~`, torchkit does not, so the
    output is written in the folder named `~` here, inside the input. The checks expanded it
    (to $HOME/images/out), found no overlap, and the split was written into the images."""
    from image_folders import write_image_folder
    from output_checks import error_line
    from processes import run_torchkit_in_process

    images = write_image_folder(tmp_path / "~" / "images", {"a": 2, "b": 2})
    before = tree_digest(images)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    done = run_torchkit_in_process("split", "./~/images", "~/images/out", cwd=tmp_path)
    assert done.returncode == 1
    assert error_line(done.stderr).startswith("Error: output folder ~/images/out lies inside")
    assert tree_digest(images) == before
    check_not_protected("~", "--out")  # a folder named `~`, not the home folder


def test_overlap_with_a_file_input(tmp_path):
    checkpoint = tmp_path / "run" / "best.pt"
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"weights")
    inputs = [InputPath(checkpoint, "checkpoint"), None]
    with pytest.raises(OutputOverlapError, match="is the checkpoint"):
        check_overlap(checkpoint, "-o", inputs)
    with pytest.raises(OutputOverlapError, match="contains the checkpoint"):
        check_overlap(tmp_path / "run", "--out", inputs)
    check_overlap(tmp_path / "run" / "eval", "--out", inputs)  # beside a file input is fine


def test_data_inputs_of_a_csv_index_are_the_file_and_its_image_folders(tmp_path, dataset):
    index = tmp_path / "index.csv"
    index.write_text("\ufeffpath,label\nds/cat/1.png,cat\n", encoding="utf-8")
    inputs = data_inputs(index)
    assert [(i.path, i.what) for i in inputs] == [
        (index, "data file"),
        (dataset / "cat", f"images of {index}"),
    ]
    check_overlap(tmp_path / "stats.json", "-o", inputs)  # beside the index: fine
    with pytest.raises(OutputOverlapError, match="is the data file"):
        check_overlap(index, "-o", inputs)
    with pytest.raises(OutputOverlapError, match="contains the images of"):
        check_overlap(dataset, "--out", inputs)
    assert data_inputs("digits") == [] and data_inputs(None) == []
    assert data_inputs(dataset) == [InputPath(dataset, "data folder")]


def test_the_image_folders_of_a_csv_index_are_made_absolute_once_per_folder(tmp_path, monkeypatch):
    """A million rows in a hundred folders: one abspath per row took seconds (issue #48)."""
    rows = "".join(f"images/c{i % 3}/{i}.png,c\n" for i in range(1000))
    index = tmp_path / "index.csv"
    index.write_text("path,label\n" + rows + "images/c1/../c2/x.png,c\n../up/y.png,c\n")
    made_absolute = []
    abspath = os.path.abspath
    monkeypatch.setattr(os.path, "abspath", lambda p: made_absolute.append(p) or abspath(p))
    inputs = data_inputs(index)
    assert len(made_absolute) < 10
    images = f"images of {index}"
    assert inputs == [
        InputPath(index, "data file"),
        *(InputPath(tmp_path / "images" / c, images) for c in ("c0", "c1", "c2")),
        InputPath(tmp_path.parent / "up", images),
    ]


def test_the_working_directory_its_parents_and_home_are_never_outputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for folder, reason in [
        (".", "is the working directory"),
        ("..", "is a parent of the working directory"),
        ("/", "is a parent of the working directory"),
        (str(tmp_path), "is the working directory"),
        (str(Path.home()), "is the home folder"),
    ]:
        with pytest.raises(OutputOverlapError, match=reason):
            check_not_protected(folder, "output folder")
    check_not_protected("new", "output folder")


# --force and the marker ------------------------------------------------------------------------


def test_an_existing_folder_that_force_would_refuse_is_not_hinted_force(tmp_path):
    """Before: 'output folder already exists: photos (pass --force to overwrite it)' for the
    user's folder or another command's output, and --force was then refused: a dead end.
    Where --force does replace the folder (an earlier output of the command), it still says so."""
    user = tmp_path / "photos"
    user.mkdir()
    (user / "holiday.jpg").write_bytes(b"jpg")
    with pytest.raises(OutputExistsError) as refused:
        OutputFolder(user, command="eval")
    assert "pass --force" not in str(refused.value)
    assert "it was not written by torchkit, which --force does not replace" in str(refused.value)
    trained = _old_run(tmp_path / "run")
    (trained / MARKER).write_text('{"written_by": "torchkit", "command": "train"}\n')
    with pytest.raises(OutputExistsError, match="holds torchkit train's output, which eval"):
        OutputFolder(trained, command="eval")
    with pytest.raises(OutputExistsError, match="already exists.*pass --force to overwrite it"):
        OutputFolder(trained, command="train", owned=["result.json"])
    (trained / "notes.txt").write_text("mine\n")  # which --force would refuse to delete
    with pytest.raises(OutputExistsError, match="notes.txt that torchkit did not write, so --f"):
        OutputFolder(trained, command="train", owned=["result.json"])
    assert (user / "holiday.jpg").read_bytes() == b"jpg"


def test_force_replaces_only_empty_or_torchkit_folders(tmp_path):
    user = tmp_path / "photos"
    user.mkdir()
    (user / "holiday.jpg").write_bytes(b"jpg")
    with pytest.raises(OutputExistsError, match="was not written by torchkit"):
        OutputFolder(user, command="eval", force=True)
    with pytest.raises(OutputExistsError, match="already exists.*pass --force"):
        OutputFolder(_old_run(tmp_path / "run"), command="eval")
    (tmp_path / "empty").mkdir()
    for path, known in [(tmp_path / "run", ()), (tmp_path / "empty", ()), (user, ("*.jpg",))]:
        OutputFolder(path, command="eval", force=True, known_files=known).release()
    assert (user / "holiday.jpg").read_bytes() == b"jpg"  # checks touch nothing
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputExistsError, match="is a file, not a folder"):
        OutputFolder(tmp_path / "file", command="eval", force=True)
    (tmp_path / "link").symlink_to(tmp_path / "run")
    with pytest.raises(OutputExistsError, match="symbolic link"):
        OutputFolder(tmp_path / "link", command="eval", force=True)


def test_a_hint_towards_force_says_a_symbolic_link_is_refused_too(tmp_path):
    """A refusal that would send the user to --force says instead why --force is refused too,
    in the words of its own refusal: a symbolic link at OUT is never replaced."""
    run = tmp_path / "run"
    run.mkdir()
    write_marker(run, "eval")
    (tmp_path / "link").symlink_to(run)
    assert force_hint(run, "pass --force", command="eval") == "pass --force"
    assert force_hint(tmp_path / "link", "pass --force", subject="OUT") == (
        "OUT is a symbolic link, which --force does not replace: give the real folder or a new name"
    )


def test_force_replaces_only_an_output_of_the_same_command(tmp_path):
    """A marker names the command that wrote the folder: --force of another command (eval
    --out, --extract-frames, convert over a training run) refuses it and touches nothing."""
    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text('{"written_by": "torchkit", "command": "train"}\n')
    (run / "best.pt").write_bytes(b"weights")
    before = tree_digest(run)
    for command in ("eval", "video-info", "convert tensor", "extract-features"):
        with pytest.raises(OutputExistsError, match=f"torchkit train, not of {command}"):
            OutputFolder(run, command=command, force=True)
    assert tree_digest(run) == before
    assert sorted(os.listdir(tmp_path)) == ["run"]  # no lock file left
    OutputFolder(run, command="train", force=True).release()


def test_a_folder_holding_only_the_same_commands_marker_is_empty_to_it(tmp_path):
    """What a run killed between marking its folder and writing its first file leaves: the
    marker and a dead writer's temporary. The same command starts again without --force and
    finds the folder empty; another command, a live writer's temporary or any other file in it
    is refused as before, and nothing is touched."""
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    write_marker(out, "eval")
    (out / ".metrics.json.abcd1234.tmp").write_text("half")
    before = tree_digest(out)
    with pytest.raises(OutputExistsError, match="already exists"):
        OutputFolder(out, command="train")
    with pytest.raises(OutputExistsError, match="torchkit eval, not of train"):
        OutputFolder(out, command="train", force=True)
    with open(out / ".metrics.json.abcd1234.tmp") as live:  # its writer is alive
        fcntl.flock(live, fcntl.LOCK_EX)
        with pytest.raises(OutputExistsError, match="already exists"):
            OutputFolder(out, command="eval")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="already exists"):
        OutputFolder(out, command="eval")
    (out / "notes.txt").unlink()
    assert tree_digest(out) == before
    with OutputFolder(out, command="eval", atomic=True) as folder:
        assert os.listdir(out) == [] and not folder.has_content
        atomic_write_text(folder.begin() / "metrics.json", "{}\n")
    assert sorted(os.listdir(out)) == [MARKER, "metrics.json"]


def test_a_new_output_is_marked_and_replaces_the_old_only_when_kept(tmp_path):
    run = _old_run(tmp_path / "run")
    before = tree_digest(run)
    with pytest.raises(RuntimeError), OutputFolder(run, command="eval", force=True) as out:
        atomic_write_text(out.begin() / "partial.json", "{}")
        raise RuntimeError("the new run failed")
    assert tree_digest(run) == before  # put back, byte for byte
    assert sorted(os.listdir(tmp_path)) == ["run"]  # no lock file, no set-aside left
    with OutputFolder(run, command="eval", force=True) as out:
        (out.begin() / "new.json").write_text("{}")
    assert sorted(os.listdir(run)) == [MARKER, "new.json"]
    assert '"command": "eval"' in (run / MARKER).read_text()
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_after_keep_a_failure_leaves_the_new_output(tmp_path):
    run = _old_run(tmp_path / "run")
    out = OutputFolder(run, command="train", force=True)
    (out.begin() / "last.pt").write_bytes(b"new")
    out.keep()
    out.finish(ok=False)
    assert (run / "last.pt").read_bytes() == b"new" and not (run / "result.json").exists()
    assert sorted(os.listdir(tmp_path)) == ["run"]


@pytest.mark.parametrize("stopped", ["as the rename returns", "before the rename"])
def test_a_signal_as_the_old_output_is_set_aside_leaves_it_in_place(tmp_path, monkeypatch, stopped):
    out = _old_run(tmp_path / "out")
    before = tree_digest(out)
    rename = os.replace

    def interrupted(source, target):  # SIGINT handled around the rename that sets OUT aside
        if str(target).endswith(".replaced"):
            if stopped == "as the rename returns":
                rename(source, target)
            raise KeyboardInterrupt
        rename(source, target)

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt), OutputFolder(out, command="t", force=True) as folder:
        folder.begin()
    assert tree_digest(out) == before
    assert sorted(os.listdir(tmp_path)) == ["out"]  # nothing set aside, no lock


@pytest.mark.parametrize("stopped", ["between the renames", "as the new one's rename returns"])
def test_a_signal_as_a_whole_output_takes_the_old_ones_place(tmp_path, monkeypatch, stopped):
    """`eval --out`, `convert tensor/cifar`, `--extract-frames` (atomic outputs) over an older
    output with --force: SIGTERM or Ctrl-C between setting the old one aside and renaming the
    new one into place puts the old one back; once the new one is in place, it stays."""
    run = _old_run(tmp_path / "frames")
    before = tree_digest(run)
    out = OutputFolder(run, command="convert", force=True, atomic=True)
    (out.begin() / "a.png").write_bytes(b"new")
    rename, renames = os.replace, []

    def interrupted(source, target):  # one signal, handled as the rename returns
        rename(source, target)
        renames.append(target)
        if len(renames) == (1 if stopped == "between the renames" else 2):
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        out.finish(ok=True)
    monkeypatch.undo()
    if stopped == "between the renames":
        assert tree_digest(run) == before
    else:
        assert (run / "a.png").read_bytes() == b"new" and not (run / "result.json").exists()
    assert os.listdir(tmp_path) == ["frames"]  # nothing hidden left beside it, no lock


def test_a_failed_run_keeps_the_users_empty_folder(tmp_path):
    empty = tmp_path / "out"
    empty.mkdir()
    out = OutputFolder(empty, command="eval")
    atomic_write_text(out.begin() / "x", "x")
    out.finish(ok=False)
    assert empty.is_dir() and os.listdir(empty) == []
    fresh = OutputFolder(tmp_path / "new" / "deeper", command="eval")
    fresh.begin()
    fresh.finish(ok=False)
    assert not (tmp_path / "new").exists()  # nor the parent made for it


def test_atomic_output_appears_whole_or_not_at_all(tmp_path):
    run = _old_run(tmp_path / "frames")
    before = tree_digest(run)
    out = OutputFolder(run, command="convert", force=True, atomic=True)
    partial = out.begin()
    assert partial != run and partial.name.endswith(".partial")
    (partial / "a.png").write_bytes(b"a")
    assert tree_digest(run) == before  # nothing visible until kept
    out.finish(ok=True)
    assert sorted(os.listdir(run)) == [MARKER, "a.png"]
    assert sorted(os.listdir(tmp_path)) == ["frames"]


# The lock --------------------------------------------------------------------------------------


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path):
    first = OutputFolder(tmp_path / "run", command="train")
    with pytest.raises(
        OutputLockedError, match=f"another torchkit process \\(PID {os.getpid()}\\)"
    ):
        OutputFolder(tmp_path / "run", command="train")
    first.release()
    OutputFolder(tmp_path / "run", command="train").release()
    assert not list(tmp_path.iterdir())  # the lock file goes with the lock


def _holding_process(script: str) -> subprocess.Popen:
    """A Python running `script`, which prints `ready` once it holds what it holds (a lock, a
    half-written file) and then waits on its stdin until it is killed."""
    holder = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "ready"
    return holder


def test_the_lock_is_held_across_processes_and_dropped_when_the_holder_is_killed(tmp_path):
    holder = _holding_process(
        "import sys, pathlib; from torchkit.core.io.output_locks import FolderLock; "
        f"FolderLock(pathlib.Path({str(tmp_path / 'run')!r}), 'x'); "
        "print('ready', flush=True); sys.stdin.read()"
    )
    with pytest.raises(OutputLockedError, match=f"PID {holder.pid}"):
        FolderLock(tmp_path / "run", "output folder")
    holder.kill()  # SIGKILL: no clean-up ran, the kernel drops the lock
    holder.wait()
    FolderLock(tmp_path / "run", "output folder").release()


# Leftovers of killed runs ----------------------------------------------------------------------


def test_recover_puts_back_a_set_aside_output(tmp_path):
    aside = _old_run(tmp_path / ".run.0123456789ab.replaced")
    partial = tmp_path / ".run.ba9876543210.partial"
    partial.mkdir()
    notes = recover_leftovers(tmp_path / "run")
    assert notes == [f"put back {tmp_path / 'run'}, which a killed torchkit run had set aside"]
    assert (tmp_path / "run" / "result.json").exists()
    assert not aside.exists() and not partial.exists()


def test_recover_replaces_a_killed_runs_marked_folder_but_never_a_users(tmp_path):
    _old_run(tmp_path / ".run.0123456789ab.replaced")
    killed = tmp_path / "run"
    killed.mkdir()
    (killed / MARKER).write_text("{}")
    recover_leftovers(killed)
    assert (killed / "result.json").exists()  # the old output is back in its place

    _old_run(tmp_path / ".data.0123456789ab.replaced")
    user = tmp_path / "data"
    user.mkdir()
    (user / "mine.txt").write_text("mine")
    notes = recover_leftovers(user)
    assert "is still at" in notes[0] and (user / "mine.txt").read_text() == "mine"
    assert (tmp_path / ".data.0123456789ab.replaced").is_dir()


def test_a_run_killed_as_it_wrote_its_marker_left_a_folder_the_next_run_takes(tmp_path):
    """The marker was written in place: a kill between its file's creation and its text left
    an empty one, which names no command ("already exists" to the same command). It is renamed
    into place whole now; a run killed before the rename leaves the marker's temporary, which
    the next run removes: its new folder is empty again, and an old output it set aside goes
    back."""
    prefix, suffix = temporary_affixes(MARKER)
    killed_marker = prefix + "abcd1234" + suffix  # mkstemp's name, no writer holding it
    new = tmp_path / "new"
    new.mkdir()
    (new / killed_marker).write_text('{"written_by": "tor')
    OutputFolder(new, command="demo").release()
    assert os.listdir(new) == []

    _old_run(tmp_path / ".run.0123456789ab.replaced")
    killed = tmp_path / "run"
    killed.mkdir()
    (killed / killed_marker).write_text("")
    notes = recover_leftovers(killed)
    assert notes == [f"put back {killed}, which a killed torchkit run had set aside"]
    assert sorted(os.listdir(killed)) == [MARKER, "result.json"]


def test_a_whole_output_killed_once_in_place_is_kept_and_the_old_one_removed(tmp_path, monkeypatch):
    """`eval --out`, `convert`, `--extract-frames` with --force, killed after the new output was
    renamed into place and before the old one (set aside) was deleted: the next run keeps the
    new output, marker and all, deletes the old one and says so; an older set-aside of an
    earlier kill is not this run's to delete and stays, named."""
    run = _old_run(tmp_path / "frames")
    out = OutputFolder(run, command="convert", force=True, atomic=True)
    (out.begin() / "a.png").write_bytes(b"new")
    older = _old_run(tmp_path / ".frames.0123456789ab.replaced")  # another run's, unresolved
    # What a SIGKILL at that point leaves (checked with a real process): the old output is
    # still set aside beside the new one.
    monkeypatch.setattr("torchkit.core.io.outputs.discard_tree", lambda *args, **kwargs: None)
    out.finish(ok=True)
    monkeypatch.undo()
    (aside,) = [p for p in tmp_path.iterdir() if p.name.endswith(".replaced") and p != older]
    new = tree_digest(run)
    notes = recover_leftovers(run)  # as the next run on that folder does, under its lock
    kept = (
        f"kept {run}, the complete output of a torchkit run killed just after putting it in "
        f"place, and removed the earlier output it replaced (set aside at {aside})"
    )
    still = (
        f"an earlier output of {run}, set aside by a torchkit run that was killed, is still at "
        f"{older}: move it back or remove it"
    )
    assert sorted(notes) == sorted([kept, still])
    assert tree_digest(run) == new and sorted(os.listdir(run)) == [MARKER, "a.png"]
    assert sorted(os.listdir(tmp_path)) == [older.name, "frames"]
    with OutputFolder(run, command="convert", force=True, atomic=True) as again:  # replaceable
        (again.begin() / "b.png").write_bytes(b"b")
    assert sorted(os.listdir(run)) == [MARKER, "b.png"]


# Real processes: SIGTERM and SIGKILL -----------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import sys, typer
    from pathlib import Path
    from torchkit.cli.app import TorchkitGroup
    from torchkit.core.io.files import atomic_write_text
    from torchkit.core.io.outputs import OutputFolder

    app = typer.Typer(cls=TorchkitGroup, pretty_exceptions_enable=False)

    @app.callback()
    def root() -> None:
        pass

    @app.command()
    def write(out: Path, force: bool = False, workers: int = 0) -> None:
        import multiprocessing, time
        children = [multiprocessing.Process(target=time.sleep, args=(600,), daemon=True)
                    for _ in range(workers)]
        for child in children:
            child.start()
        with OutputFolder(out, command="demo", force=force) as folder:
            atomic_write_text(folder.begin() / "new.txt", "half")
            print("writing", flush=True)
            while True:
                time.sleep(0.05)

    app()
    """
)


@pytest.fixture
def writer_script(tmp_path: Path) -> Path:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    return script


def _start(script: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(script), "write", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.parametrize(
    ("signum", "code", "word"), [(15, 143, "Terminated."), (2, 130, "Interrupted.")]
)
def test_sigterm_and_sigint_put_the_old_output_back(tmp_path, writer_script, signum, code, word):
    run = _old_run(tmp_path / "run")
    before = tree_digest(run)
    process = _start(writer_script, str(run), "--force", "--workers", "1")
    wait_until(lambda: (run / "new.txt").exists(), process=process, what="the new output")
    rc, _, err = signal_and_wait(process, signum)
    assert (rc, err.strip().splitlines()[-1]) == (code, word)
    assert tree_digest(run) == before
    assert sorted(os.listdir(tmp_path)) == ["run", "writer.py"]
    wait_until(lambda: not processes_in_group(process.pid), what="the children to go")


def test_sigterm_keeps_files_copied_into_a_new_output_folder_while_it_was_written(
    tmp_path, writer_script
):
    """A real run terminated (SIGTERM) after the user copied a file into its new folder: the
    run's own file and marker go, the folder and the user's file stay, and stderr says why."""
    out = tmp_path / "out"
    process = _start(writer_script, str(out))
    wait_until(lambda: (out / "new.txt").exists(), process=process, what="the new output")
    (out / "mine.txt").write_text("the user's\n")
    rc, _, err = signal_and_wait(process, signal.SIGTERM)
    assert rc == 143, err
    assert os.listdir(out) == ["mine.txt"]
    assert f"output folder {out} was kept: it holds files this run did not write (mine.txt)" in err
    assert sorted(os.listdir(tmp_path)) == ["out", "writer.py"]  # no lock left


def _sigkill_once_it_wrote(writer_script, run) -> None:
    """A `--force` run of the writer over `run`, SIGKILLed once its new output has a file."""
    process = _start(writer_script, str(run), "--force")
    wait_until(lambda: (run / "new.txt").exists(), process=process, what="the new output")
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()


def test_a_sigkilled_runs_set_aside_is_put_back_by_the_next_run(tmp_path, writer_script):
    run = _old_run(tmp_path / "run")
    before = tree_digest(run)
    _sigkill_once_it_wrote(writer_script, run)
    assert any(name.endswith(".replaced") for name in os.listdir(tmp_path))
    OutputFolder(run, command="demo", force=True).release()  # the next run on that folder
    assert tree_digest(run) == before
    assert sorted(os.listdir(tmp_path)) == ["run", "writer.py"]


def test_a_sigkilled_runs_folder_keeps_a_file_put_in_after_the_kill(
    tmp_path, writer_script, caplog
):
    """SIGKILL after the run set the old output aside and wrote into its new folder, then a file
    of the user's copied in: the next run removes only what the killed run wrote (its journal),
    keeps the folder with the user's file, the old output set aside, and says where."""
    run = _old_run(tmp_path / "run")
    before = tree_digest(run)
    _sigkill_once_it_wrote(writer_script, run)
    (run / "mine.txt").write_text("the user's\n")
    (aside,) = [p for p in tmp_path.iterdir() if p.name.endswith(".replaced")]
    with pytest.raises(OutputExistsError, match="not written by torchkit"):
        OutputFolder(run, command="demo", force=True)  # the next run on that folder
    assert os.listdir(run) == ["mine.txt"] and tree_digest(aside) == before
    assert (
        f"output folder {run} was kept: it holds files a killed torchkit run did not write "
        f"(mine.txt); an earlier output of it, which that run had set aside, is at {aside}: "
        "move it back"
    ) in caplog.text
    assert sorted(os.listdir(tmp_path)) == [aside.name, "run", "writer.py"]


def test_a_killed_writers_temporary_goes_at_the_next_write_of_that_file_and_nothing_else(tmp_path):
    import fcntl

    dead = [".pred.csv.abcd1234.tmp", ".model.x_y9zzzz.tmp.pt"]
    kept = [
        ".other.csv.abcd1234.tmp",  # another output's
        ".pred.csv.abcd12345.tmp",  # not mkstemp's 8 characters
        "pred.csv.abcd1234.tmp",  # not hidden: a user's
        ".pred.csv.notes",
        ".pred.csv.live0000.tmp",  # a live writer's: its flock is held
    ]
    for name in dead + kept:
        (tmp_path / name).write_text("partial")
    with open(tmp_path / ".pred.csv.live0000.tmp") as live:
        fcntl.flock(live, fcntl.LOCK_EX)
        atomic_write_text(tmp_path / "pred.csv", "new\n")
        with atomic_path(tmp_path / "model.pt") as tmp:
            tmp.write_bytes(b"model")
        assert sorted(os.listdir(tmp_path)) == sorted([*kept, "pred.csv", "model.pt"])
    atomic_write_text(tmp_path / "pred.csv", "again\n")  # its writer is gone now
    assert ".pred.csv.live0000.tmp" not in os.listdir(tmp_path)


def test_a_sigkilled_writers_temporary_is_kept_while_it_lives_and_removed_after(tmp_path):
    target = tmp_path / "out" / "pred.csv"
    holder = _holding_process(
        "import sys; from torchkit.core.io.files import atomic_write\n"
        f"with atomic_write({str(target)!r}) as handle:\n"
        "    handle.write('half'); print('ready', flush=True); sys.stdin.read()"
    )
    (holding,) = os.listdir(target.parent)
    atomic_write_text(target, "mine\n")  # another writer of the same file, meanwhile
    assert sorted(os.listdir(target.parent)) == sorted([holding, "pred.csv"])
    holder.kill()  # SIGKILL: its clean-up never runs, the kernel drops its flock
    holder.wait()
    atomic_write_text(target, "rerun\n")
    assert os.listdir(target.parent) == ["pred.csv"]
    assert target.read_text() == "rerun\n"


# Write errors and special files ----------------------------------------------------------------


def test_write_errors_are_told_from_input_errors(tmp_path):
    assert is_write_error(OSError(errno.ENOSPC, "No space left on device"))
    assert is_write_error(OSError(errno.EROFS, "Read-only file system", "/elsewhere"))
    out = tmp_path / "out.csv"
    assert is_write_error(OSError(errno.EACCES, "Permission denied", str(out)), out)
    assert not is_write_error(OSError(errno.EACCES, "Permission denied", "/data/x.png"), out)
    assert not is_write_error(OSError(errno.ENOENT, "No such file", str(out)), out)
    assert is_write_error(RuntimeError("[enforce fail at inline_container.cc] file write failed"))
    assert not is_write_error(RuntimeError("shape mismatch"))


def test_every_writer_s_way_of_saying_the_disk_is_full_is_one_write_error(tmp_path, monkeypatch):
    """safetensors' "(os error 28)" (not an OSError), and a short write on a file system out
    of inodes (torch.save's C++ stream says only "unexpected pos"), are write errors naming the
    output, through the one `reporting_write_errors` every command uses."""
    out = tmp_path / "w.safetensors"

    class SafetensorError(Exception):
        pass

    full = pytest.raises(OutputWriteError, match=f"cannot write {out}: No space left")
    with full, reporting_write_errors(out):
        raise SafetensorError("Error while serializing: I/O error: (os error 28)")
    other = pytest.raises(ValueError, match="not about the output")  # passes through
    with other, reporting_write_errors(out):
        raise ValueError("not about the output")

    real = os.statvfs(tmp_path)

    class NoInodes:
        f_flag, f_bavail, f_frsize = 0, real.f_bavail, real.f_frsize
        f_files, f_favail = 1000, 0

    monkeypatch.setattr(os, "statvfs", lambda path: NoInodes)
    found = as_write_error(RuntimeError("unexpected pos 576 vs 534"), out)
    assert isinstance(found, OutputWriteError) and "No space left" in found.message
    # NumPy's short write is an OSError without errno: the file system says why.
    found = as_write_error(OSError("49152 requested and 28544 written"), out)
    assert isinstance(found, OutputWriteError) and "No space left" in found.message
    monkeypatch.undo()  # on a disk with room, the same words are not the output's problem
    assert not is_write_error(OSError("49152 requested and 28544 written"), out)


def test_a_full_disk_is_one_error_naming_the_output_and_leaves_no_temporary(small_tmpfs):
    disk = small_tmpfs(64)
    target = disk / "report.csv"
    with pytest.raises(OutputWriteError, match=f"cannot write {target}: No space left"):
        atomic_write_text(target, "x" * 200_000)
    with pytest.raises(OutputWriteError, match="cannot write"), atomic_path(disk / "m.pt") as tmp:
        tmp.write_bytes(b"x" * 200_000)
    assert os.listdir(disk) == []


def test_a_temporary_folder_that_cannot_be_made_is_named_not_the_special_output(
    tmp_path, monkeypatch
):
    """The file for a special-file output is written in TMPDIR first: a TMPDIR removed since
    it was looked up was reported as "cannot write /dev/null: No such file or directory"."""
    import tempfile

    gone = tmp_path / "gone"
    monkeypatch.setattr(tempfile, "tempdir", str(gone))
    expected = f"/dev/null: No such file .* in {gone}, .*TMPDIR"
    with pytest.raises(OutputWriteError, match=expected), atomic_path("/dev/null") as staged:
        staged.write_bytes(b"x")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    unreadable = OSError(errno.EACCES, "Permission denied", str(tmp_path / "input.png"))
    with pytest.raises(OSError) as raised, atomic_path("/dev/null"):
        raise unreadable  # an input's error, not the temporary folder's
    assert raised.value is unreadable


# Run in a mount namespace of its own (`in_mount_namespace`) whose /dev/shm is a small tmpfs,
# through the app in-process: 16 KiB has no room for a worker pool's semaphores, 64 KiB for its
# first batches' images, not for their labels.
FULL_SHARED_MEMORY = (
    ("16k", "predict -m ck.pt images -j 2 -b 5 -o out/p.csv"),
    ("16k", "eval ck.pt -d images -j 2 -b 5"),
    ("64k", "eval ck.pt -d images -j 2 -b 5"),
)


def _in_a_small_dev_shm(cwd: Path) -> list:
    """[exit code, stderr] of each of FULL_SHARED_MEMORY, run with a /dev/shm of its size;
    killed with its workers after 120 s (the hang)."""
    from mount_namespaces import MS_REMOUNT, in_mount_namespace
    from processes import run_torchkit_in_process

    def work(mount) -> list:
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=16k")
        answer = []
        for size, args in FULL_SHARED_MEMORY:
            mount(None, "/dev/shm", flags=MS_REMOUNT, data=f"size={size}")
            result = run_torchkit_in_process(*args.split(), cwd=cwd)
            answer.append([result.returncode, result.stderr])
        return answer

    answer = in_mount_namespace(work)
    assert isinstance(answer, list), answer
    return answer


def test_a_full_dev_shm_is_named_not_blamed_on_the_output_nor_a_hang(tmp_path, image_folder):
    """A full /dev/shm (Docker's is 64 MB) failed predict as "cannot write out/p.csv: No space
    left on device", on a disk with room, eval as "OSError: [Errno 28] No space left on
    device", and, where the labels of a batch found no room, eval waited for good."""
    from checkpoints import write_convnet_checkpoint

    write_convnet_checkpoint(tmp_path / "ck.pt", in_channels=3, image_size=8, classes="ab")
    for code, stderr in _in_a_small_dev_shm(tmp_path):
        assert code == 1
        line = [text for text in stderr.splitlines() if text.startswith("Error:")]
        assert line == [
            "Error: no space left in /dev/shm, the shared memory that worker processes pass "
            "their work through (free some there, use --workers 0, or give it more room: "
            "docker run --shm-size=1g)"
        ], stderr
    assert not list(tmp_path.glob("out/*"))  # no file, whole or half


def test_a_full_disk_is_one_error_when_locking_and_leaves_no_lock(small_tmpfs):
    from disks import fill_disk

    disk = fill_disk(small_tmpfs(64))
    with pytest.raises(OutputWriteError, match=f"cannot write {disk / 'new' / 'out'}: No space"):
        OutputFolder(disk / "new" / "out", command="test")
    assert os.listdir(disk) == ["filler"]  # no lock file, no folder made for it


def test_special_files_are_written_into_never_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert is_special_file(fifo) and is_special_file("/dev/stdout")
    assert not is_special_file(tmp_path / "plain")
    assert check_output_file(fifo, force=False) == fifo
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    atomic_write_text(fifo, "through the pipe\n")
    reader.join(timeout=10)
    assert received == [b"through the pipe\n"]
    assert is_special_file(fifo) and sorted(os.listdir(tmp_path)) == ["pipe"]
    atomic_write_text("/dev/null", "discarded")


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="needs a writable /dev/shm")
def test_a_regular_file_under_dev_is_a_file_like_any_other():
    """Every path under /dev and /proc was taken for a special file: `-o /dev/shm/x.json`
    overwrote an existing file without --force, in place (not atomically)."""
    from processes import run_torchkit_in_process

    path = Path("/dev/shm") / f"torchkit-test-{os.getpid()}-{threading.get_ident()}.json"
    path.write_text("precious\n")
    try:
        assert not is_special_file(path)
        done = run_torchkit_in_process("env", "-o", path)
        assert done.returncode == 1 and "already exists" in done.stderr
        assert path.read_text() == "precious\n"
    finally:
        path.unlink()


def _seeking_renaming_writer(path):
    """What writers given a name do: seek back (PIL, torch's zip), read the file back
    (export's verification), write a file beside the name and rename it over it
    (safetensors' save_file)."""
    with open(path, "w+b") as handle:
        handle.write(b"xxxx tail")
        handle.seek(0)
        handle.write(b"head")
        handle.seek(0)
        assert handle.read() == b"head tail"
    beside = path.with_name(path.name + ".new")
    beside.write_bytes(path.read_bytes() + b"\n")
    os.replace(beside, path)


def test_atomic_path_gives_a_fifo_the_finished_file_and_leaves_it_a_fifo(tmp_path):
    """atomic_path handed a FIFO (or /dev/stdout a pipe) to the writer itself: a seek failed
    (ESPIPE), a read back waited forever, a rename replaced the FIFO with a regular file. The
    writer gets a regular temporary file, whose bytes go into the FIFO when it is done."""
    from disks import FifoReader

    reader = FifoReader(tmp_path / "model.onnx")
    link = tmp_path / "linked.onnx"  # a link to the FIFO: the FIFO is written, the link stays
    link.symlink_to(reader.path)
    with atomic_path(link) as temporary:
        assert temporary.suffix == ".onnx" and not is_special_file(temporary)
        _seeking_renaming_writer(temporary)
    assert reader.result() == b"head tail\n"
    assert link.is_symlink() and sorted(os.listdir(tmp_path)) == ["linked.onnx", "model.onnx"]
    with atomic_path("/dev/null") as temporary:  # a discard
        _seeking_renaming_writer(temporary)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("name", ["/dev/fd/{fd}", "/proc/self/fd/{fd}"])
def test_an_output_that_names_a_descriptor_of_a_file_is_added_to_it_not_truncated(tmp_path, name):
    """`-o /dev/stdout >> log.txt`: opened again by its name, log.txt was truncated (its lines
    lost) and written from its start. Written through the descriptor, the output is added
    where the descriptor stands: text from `atomic_write`, bytes from `atomic_path`'s
    writers (torch.save, savefig)."""
    from torchkit.core.io.files import atomic_path

    log = tmp_path / "log.txt"
    log.write_text("precious\n")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        atomic_write_text(name.format(fd=fd), "text\n")
        with atomic_path(name.format(fd=fd)) as path:
            Path(path).write_bytes(b"bytes\n")
    finally:
        os.close(fd)
    assert log.read_text() == "precious\ntext\nbytes\n"
    assert os.listdir(tmp_path) == ["log.txt"]


@pytest.mark.parametrize("name", ["/dev/fd/{fd}", "/proc/self/fd/{fd}"])
def test_an_output_that_names_a_descriptor_of_a_socket_is_written_through_it(name):
    """`-o /dev/stdout` where stdout is a socket (a service manager's): a socket cannot be
    opened by its name, so the write at the end failed as "OSError: [Errno 6] No such device
    or address: '/dev/stdout'", after all the work."""
    import socket

    from torchkit.core.io.files import atomic_path

    ours, reader = socket.socketpair()
    with ours, reader:
        output = name.format(fd=ours.fileno())
        assert check_output_file(output, force=False) == Path(output)
        atomic_write_text(output, "text\n")
        with atomic_path(output) as path:
            Path(path).write_bytes(b"bytes\n")
        ours.shutdown(socket.SHUT_WR)
        assert b"".join(iter(lambda: reader.recv(1 << 16), b"")) == b"text\nbytes\n"


@pytest.mark.parametrize(("option", "what"), [("-o", "output"), ("--plot", "plot")])
def test_an_output_naming_a_closed_descriptor_is_refused_before_any_work(
    image_folder, option, what
):
    """`-o /dev/stdout` with stdout closed (`>&-`): the command did all its work, then ended
    in "Error: FileNotFoundError: ... '/dev/stdout'" (`--plot`: "OSError: [Errno 9] Bad file
    descriptor"). A descriptor far above the ones this process uses stands for it."""
    from output_checks import error_line
    from processes import run_torchkit_in_process

    fd = 987
    with pytest.raises(OSError):
        os.fstat(fd)
    extra = ["--format", "csv", "-o", os.devnull] if option == "--plot" else []
    done = run_torchkit_in_process("dataset-stats", image_folder, option, f"/dev/fd/{fd}", *extra)
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr, besides="nothing") == (
        f"Error: cannot write {what} /dev/fd/{fd}: Bad file descriptor (file descriptor {fd} is"
        " closed: send it to a file or to /dev/null, or choose another output)"
    )
    assert done.stdout == ""


@pytest.mark.parametrize("name", ["/dev/fd/{fd}", "/proc/thread-self/fd/{fd}"])
def test_an_output_naming_a_descriptor_open_for_reading_is_refused_before_any_work(
    image_folder, tmp_path, name
):
    """`-o /dev/stdin < notes.txt --force` replaced /dev/stdin (the link itself, for root) with
    the report, and a pipe on stdin was opened again at its write end: the command wrote into
    its own input."""
    from output_checks import error_line
    from processes import run_torchkit_in_process

    from torchkit.core.io.special_files import own_descriptor

    assert [own_descriptor(f"/dev/std{n}") for n in ("in", "out", "err")] == [0, 1, 2]
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    fd = os.open(notes, os.O_RDONLY)
    try:
        output = name.format(fd=fd)
        done = run_torchkit_in_process("dataset-stats", image_folder, "-o", output, "--force")
    finally:
        os.close(fd)
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr, besides="nothing") == (
        f"Error: cannot write output {output}: file descriptor {fd} is open for reading only "
        "(choose another output)"
    )
    assert done.stdout == "" and notes.read_text() == "mine\n"


def test_a_block_device_is_an_existing_output(tmp_path):
    """`-o /dev/sdb` overwrote the disk from its first byte without --force: a block device
    holds data, as an existing file does."""
    disk = tmp_path / "disk"
    try:  # a device number no driver has (240-254: for local use): nothing is ever written
        os.mknod(disk, stat.S_IFBLK | 0o600, os.makedev(251, 0))
    except PermissionError:
        pytest.skip("cannot make a device node here (needs root)")
    link = tmp_path / "link"
    link.symlink_to(disk)
    for path in (disk, link):
        with pytest.raises(OutputExistsError, match=f"output is a block device: {path} .*--force"):
            check_output_file(path, force=False)
        assert check_output_file(path, force=True) == path
    assert stat.S_ISBLK(os.lstat(disk).st_mode)


def test_check_output_file(tmp_path, dataset):
    existing = tmp_path / "stats.json"
    existing.write_text("{}")
    with pytest.raises(OutputExistsError, match="pass --force"):
        check_output_file(existing, force=False)
    assert check_output_file(existing, force=True) == existing
    with pytest.raises(UsageError, match="is a folder, not a file"):  # exit 2, as the CLI's
        check_output_file(dataset, force=True)
    with pytest.raises(OutputOverlapError, match="lies inside the data folder"):
        check_output_file(dataset / "stats.json", True, data_inputs(dataset), what="-o")


def test_a_folder_made_read_only_after_a_check_fails_the_next_check(small_tmpfs):
    """A process that lives on (the library used from Python) checks a folder again: one found
    writable earlier and remounted read-only since is refused, not taken as still writable."""
    disk = small_tmpfs(64)
    assert check_output_file(disk / "first.json", force=False) == disk / "first.json"
    if subprocess.run(["mount", "-o", "remount,ro", str(disk)]).returncode != 0:
        pytest.skip("cannot remount the tmpfs read-only")
    with pytest.raises(OutputWriteError, match="Read-only file system"):
        check_output_file(disk / "second.json", force=False)


def test_torch_save_on_a_full_disk_raises_no_space_with_its_errno(small_tmpfs):
    # Given a path, torch 2.4 wrote this small a checkpoint to a full disk as an empty file and
    # returned; later versions raise C++ stream text ("iostream error") with no errno.
    import torch
    from disks import fill_disk

    disk = fill_disk(small_tmpfs(64))
    with pytest.raises(OSError) as raised:
        torch_save({"w": torch.ones(3)}, disk / "w.pt")
    assert raised.value.errno == errno.ENOSPC


def test_a_file_where_a_folder_should_be_is_refused_before_any_work(tmp_path):
    """Before: `-o notes.txt/x.json` failed only after the whole run, as an internal
    FileExistsError, and `--out notes.txt/run` as "File exists (free some space...)"."""
    from processes import run_torchkit_in_process

    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    cases = {
        "train -o": ["train", "--epochs", "1", "--out", tmp_path / "run", "-o", notes / "x.json"],
        "train --out": ["train", "--epochs", "1", "--out", notes / "deeper" / "run"],
        "eval -o": [
            "eval",
            "convnet",
            "--num-classes",
            "10",
            "--data",
            "digits",
            "-o",
            notes / "x.json",
        ],
        "split OUT": ["split", "digits", notes / "split"],
    }
    for name, args in cases.items():
        done = run_torchkit_in_process(*args, cwd=tmp_path)
        assert done.returncode == 1, (name, done.stderr)
        assert (
            done.stderr.strip()
            .splitlines()[-1]
            .endswith(f": {notes} is a file, not a folder (give a path inside a folder)")
        ), (name, done.stderr)
        assert notes.read_text() == "mine\n" and not (tmp_path / "run").exists()


def test_a_fifo_above_an_output_is_named_for_what_it_is(tmp_path):
    """`-o FIFO/x.json` was refused as "FIFO is a file, not a folder"."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "gone").symlink_to(tmp_path / "nothing")
    for above, kind in [("fifo", "a FIFO"), ("gone", "a symbolic link")]:
        with pytest.raises(OutputWriteError) as raised:
            check_output_file(tmp_path / above / "x.json", force=False)
        assert raised.value.message.endswith(f"{tmp_path / above} is {kind}, not a folder")


# A failed run removes what it wrote, and nothing else ------------------------------------------


@pytest.mark.parametrize("before", ["absent", "empty", "an earlier output (--force)"])
def test_a_failed_run_removes_only_what_it_wrote_and_keeps_files_put_in_its_folder(
    tmp_path, before
):
    """Files copied into a folder the run is writing (while it works) are not the run's: its
    clean-up removes its own files, keeps the folder with the user's, and says so."""
    from torchkit.core.io.errors import InputError

    out = tmp_path / "out"
    old = None
    if before == "empty":
        out.mkdir()
    elif before != "absent":
        old = tree_digest(_old_run(out))
    with (
        pytest.raises(InputError) as raised,
        OutputFolder(out, command="split", force=True) as folder,
    ):
        atomic_write_text(folder.begin() / "cat" / "run.txt", "the run's\n")
        (out / "mine.txt").write_text("the user's\n")
        (out / "cat" / "mine.txt").write_text("the user's\n")
        raise InputError("cannot read a.png")
    assert sorted(os.listdir(out)) == ["cat", "mine.txt"]  # no marker, no run.txt
    assert os.listdir(out / "cat") == ["mine.txt"]
    message = raised.value.message
    assert message.startswith(
        f"cannot read a.png; output folder {out} was kept: it holds files this run did not "
        "write (cat, mine.txt)"
    ), message
    left = sorted(os.listdir(tmp_path))
    if old is None:
        assert left == ["out"]  # no lock left
    else:  # the earlier output cannot go back over the user's files: it stays set aside
        (aside,) = [name for name in left if name.endswith(".replaced")]
        assert f"the earlier output is at {tmp_path / aside}: move it back" in message
        assert tree_digest(tmp_path / aside) == old


def test_a_failed_run_with_nothing_put_in_its_folder_leaves_no_trace(tmp_path):
    out = tmp_path / "new" / "out"
    with pytest.raises(RuntimeError), OutputFolder(out, command="train") as folder:
        atomic_write_text(folder.begin() / "config.json", "{}\n")
        folder.wrote(out / "tensorboard")
        (out / "tensorboard").mkdir()
        (out / "tensorboard" / "events").write_text("x")
        raise RuntimeError("a bad image")
    assert os.listdir(tmp_path) == []


# A file written where stdout goes: the report goes to stderr ---------------------------------


@contextlib.contextmanager
def _stdout_on(fd: int):
    """Descriptor 1 is `fd` (closed afterwards) while the block runs, as `> TARGET` makes it."""
    saved = os.dup(1)
    os.dup2(fd, 1)
    os.close(fd)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _convert_into(image: Path, target: object, *extra: str):
    from processes import run_torchkit_in_process

    args = ["convert", "tensor", image, target, "--to", "npy", "--layout", "hwc", "--dtype"]
    return run_torchkit_in_process(*args, "uint8", *extra)


def _npy_image(tmp_path: Path) -> tuple[Path, bytes]:
    """A PNG, and the .npy bytes `convert tensor` writes of it."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    Image.fromarray(pixels).save(tmp_path / "x.png")
    expected = io.BytesIO()
    np.save(expected, pixels)
    return tmp_path / "x.png", expected.getvalue()


@pytest.mark.parametrize("name", ["link", "/proc/self/fd/1"])
def test_a_file_written_into_a_piped_stdout_by_another_name_sends_the_report_to_stderr(
    tmp_path, name
):
    """`convert tensor x.png LINK | ...` with LINK a link to /dev/stdout: the result table was
    printed on stdout after the file's bytes, because stdout was recognised by its name only."""
    image, expected = _npy_image(tmp_path)
    (tmp_path / "link").symlink_to("/dev/stdout")
    read_end, write_end = os.pipe()
    piped: list[bytes] = []
    reader = threading.Thread(target=lambda: piped.append(os.fdopen(read_end, "rb").read()))
    reader.start()
    with _stdout_on(write_end):
        done = _convert_into(image, tmp_path / name if name == "link" else name)
    reader.join(30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "5x7x3" in done.stderr
    assert piped == [expected]


def test_a_fifo_that_is_also_stdout_gets_the_file_alone(tmp_path):
    """`convert tensor x.png FIFO --force > FIFO`: the result table went into the FIFO after the
    file's bytes."""
    from disks import FifoReader

    image, expected = _npy_image(tmp_path)
    reader = FifoReader(tmp_path / "fifo")
    with _stdout_on(os.open(reader.path, os.O_WRONLY)):
        done = _convert_into(image, reader.path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "5x7x3" in done.stderr
    assert reader.result() == expected


def test_a_file_that_is_also_stdout_is_replaced_and_the_report_goes_to_stderr(tmp_path):
    """`convert tensor x.png out.npy --force > out.npy`: the result table was printed into the
    file the shell opened, which the output replaced: lost, seen by nobody."""
    image, expected = _npy_image(tmp_path)
    out = tmp_path / "out.npy"
    with _stdout_on(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        done = _convert_into(image, out, "--force")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "5x7x3" in done.stderr
    assert out.read_bytes() == expected


def test_a_terminal_shared_with_stdout_keeps_the_report_on_stdout(tmp_path):
    """`-o /dev/pts/N` on that terminal: a terminal takes both streams as they come, so the
    report stays where it always goes."""
    image, _ = _npy_image(tmp_path)
    controller, terminal = os.openpty()
    try:
        with _stdout_on(os.dup(terminal)):
            done = _convert_into(image, os.ttyname(terminal))
    finally:
        os.close(terminal)
        os.close(controller)
    assert done.returncode == 0, done.stderr
    assert "5x7x3" in done.stdout and "5x7x3" not in done.stderr


def test_torch_save_stopped_in_a_write_raises_the_stop_not_a_stream_error(tmp_path, monkeypatch):
    # Ctrl-C or SIGTERM raises where the file object checks for signals: inside a write that
    # torch's C++ writer made. The writer then failed its end of file on a position it had not
    # advanced, and that RuntimeError ("[enforce fail at inline_container.cc] unexpected pos
    # ...") replaced the stop: `convert-syncbn` stopped so ended with exit 1 and "cannot write
    # DST ... (free some space ...)", not "Terminated." (143).
    import io

    import torch

    from torchkit.core.io import files

    class StoppedOnThirdWrite(io.BufferedWriter):
        writes = 0

        def write(self, data):
            written = super().write(data)  # written, then the signal's exception
            StoppedOnThirdWrite.writes += 1
            if StoppedOnThirdWrite.writes == 3:
                raise KeyboardInterrupt
            return written

    monkeypatch.setattr(
        files, "open", lambda path, mode: StoppedOnThirdWrite(io.FileIO(path, mode)), raising=False
    )
    with pytest.raises(KeyboardInterrupt):
        torch_save({f"w{i}": torch.ones(64) for i in range(8)}, tmp_path / "w.pt")


def test_a_fifo_or_device_under_a_records_name_is_no_record_and_does_not_hang(tmp_path):
    # `--force` recognises an older output by its config.json/metrics.json and a marked one by
    # .torchkit; both were read with read_text, which waited for ever on a FIFO planted there.
    from torchkit.core.io.force import holds_json_record, marker_command

    folder = tmp_path / "out"
    folder.mkdir()
    os.mkfifo(folder / "metrics.json")
    os.mkfifo(folder / ".torchkit")
    answers: list[object] = []
    reader = threading.Thread(
        target=lambda: answers.extend(
            [holds_json_record(folder / "metrics.json", ["accuracy"]), marker_command(folder)]
        ),
        daemon=True,
    )
    reader.start()
    reader.join(10)
    assert answers == [False, None]
    assert holds_json_record(Path("/dev/zero"), ["accuracy"]) is False
    (folder / "config.json").write_text('{"options": {}, "arch": "convnet"}')
    assert holds_json_record(folder / "config.json", ["options", "arch"])
