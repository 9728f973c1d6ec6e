"""Issue #13 for `torchkit train`: the run folder (--out) and the summary (-o) never are, contain
or lie inside an input (the data, a CSV index and its images, --weights, --stats, the checkpoint
it resumes); --force replaces only an earlier torchkit run, and only once the new run has saved
its first checkpoint; SIGTERM is handled like Ctrl-C (exit 143, last.pt saved, workers stopped);
a second run on the same folder is refused while the first runs; a full disk is one `Error:
cannot write` line with the last good checkpoints intact. Signals and locks held by a running
train are real processes; refusals, finished runs and full disks run in this process."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from disks import fill_disk
from format_files import tensorboard_events
from image_folders import write_image_folder
from output_checks import error_line, hidden_siblings, tree_digest
from processes import (
    processes_in_group,
    run_each_in_process,
    run_torchkit_in_process,
    start_torchkit_process,
    wait_until,
)
from suite_paths import HELPERS

from torchkit.core.io.force import note_starting_log, noting_started, write_marker
from torchkit.core.io.output_proofs import is_tensorboard_events

# A tiny run: 2 classes x 6 images of 8x8, 8 train / 4 val with --val-split 0.3.
TINY = ["--model", "convnet", "--image-size", "8", "--batch-size", "4", "--workers", "0"]
DATA = ["--data", "ds", "--val-split", "0.3"]


def old_run(folder: Path, *, marker: bool = True) -> Path:
    """An earlier run: with torchkit's marker, or without (a run made before the marker
    existed); only files that train writes (a file of the user's makes --force refuse it)."""
    folder.mkdir(parents=True)
    if marker:
        (folder / ".torchkit").write_text('{"written_by": "torchkit", "command": "train"}\n')
    config = {"options": {"seed": 99}, "arch": "convnet", "classes": ["a", "b"], "preprocess": {}}
    (folder / "config.json").write_text(json.dumps(config) + "\n")
    (folder / "metrics.csv").write_text("epoch,train_loss\n1,0.5\n2,0.4\n")
    for name in ("last.pt", "best.pt", "epoch-002.pt"):  # torchkit's keys: --force's proof
        checkpoint = {"format_version": 1, "torchkit_version": "0.1.0", "model": torch.rand(700)}
        torch.save(checkpoint, folder / name)
    (folder / "tensorboard").mkdir()
    (folder / "tensorboard" / "events.out.tfevents.1.host").write_bytes(tensorboard_events())
    return folder


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """`ds` (an image folder), `index.csv` naming its images, `old` (an earlier torchkit run
    holding a weights file and a stats file), `mine` (a folder of the user's) and `yolo`
    (another trainer's best.pt and last.pt)."""
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    rows = [f"ds/{c}/{c}_{i}.png,{c}" for c in "ab" for i in range(6)]
    (tmp_path / "index.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    old = old_run(tmp_path / "old")
    (old / "w.pt").write_bytes(os.urandom(1000))
    (old / "stats.json").write_text('{"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}\n')
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("\\documentclass{article}\n")
    (tmp_path / "yolo").mkdir()  # another trainer's weights: names a run has, no config.json
    (tmp_path / "yolo" / "best.pt").write_bytes(os.urandom(1000))
    (tmp_path / "yolo" / "last.pt").write_bytes(os.urandom(1000))
    return tmp_path


def test_outputs_that_overlap_an_input_are_refused_and_nothing_is_touched(world):
    ds = world / "ds"
    cases = [
        # The example: the dataset set aside, 0 images trained, the dataset discarded.
        ([*DATA, "--out", "ds", "--force"], world, "run folder ds is the data folder ds"),
        ([*DATA, "--out", "ds/run"], world, "run folder ds/run lies inside the data folder ds"),
        ([*DATA, "--out", "ds/a", "--force"], world, "lies inside the data folder ds"),
        ([*DATA, "--out", "."], world, "run folder . is the working directory"),
        (["--data", ".", "--out", "..", "--force"], ds, "is a parent of the working directory"),
        (["--data", "index.csv", "--out", "ds", "--force"], world, "contains the images of"),
        (
            [*DATA, "--weights", "old/w.pt", "--out", "old", "--force"],
            world,
            "run folder old contains the --weights file old/w.pt",
        ),
        (
            [*DATA, "--stats", "old/stats.json", "--out", "old", "--force"],
            world,
            "run folder old contains the --stats file old/stats.json",
        ),
        ([*DATA, "--out", "mine", "--force"], world, "not empty and was not written by torchkit"),
        ([*DATA, "--out", "yolo", "--force"], world, "not empty and was not written by torchkit"),
        ([*DATA, "--out", "old"], world, "run folder already exists: old (pass --resume old"),
        # Not a run: the hint was --resume (no last.pt there) or --force (refused, as above).
        ([*DATA, "--out", "mine"], world, "mine (it was not written by torchkit, which --force"),
        # Another trainer's last.pt: --resume is refused (not torchkit's), and so is --force.
        ([*DATA, "--out", "yolo"], world, "yolo (it was not written by torchkit, which --force"),
        # A run holding files of the user's: --resume goes on, --force refuses to delete them.
        ([*DATA, "--out", "old"], world, "it holds old/stats.json that torchkit did not write"),
        (
            [*DATA, "--out", "new", "-o", "ds/summary.json"],
            world,
            "-o ds/summary.json lies inside the data folder ds",
        ),
        (
            ["--data", "index.csv", "--out", "new2", "-o", "index.csv", "--force"],
            world,
            "-o index.csv is the data file index.csv",
        ),
    ]
    before = tree_digest(world)
    results = run_each_in_process(
        [["train", *TINY, *args] for args, _, _ in cases], cwd=[cwd for _, cwd, _ in cases]
    )
    for (args, _, expected), result in zip(cases, results, strict=True):
        assert result.returncode == 1, (args, result.stderr)
        assert expected in error_line(result.stderr), args
    assert tree_digest(world) == before  # not a byte changed, no run folder, no lock left behind


def killed_start(folder: Path, config: Path) -> Path:
    """What a SIGKILL before the first checkpoint leaves of `train --tensorboard --out FOLDER`
    (seen with a real process): the marker, config.json, split.csv and the TensorBoard log."""
    folder.mkdir()
    (folder / ".torchkit").write_text('{"written_by": "torchkit", "command": "train"}\n')
    (folder / "config.json").write_text(config.read_text())
    (folder / "split.csv").write_text("path,label,split\na/a_0.png,a,train\n")
    (folder / "tensorboard").mkdir()
    (folder / "tensorboard" / "events.out.tfevents.1.host.1.0").write_bytes(tensorboard_events())
    # recorded in the marker as the run records them (see the real kill's test below)
    for name in ("config.json", "split.csv"):
        noting_started(folder, name)(folder / name)
    note_starting_log(folder, "tensorboard/events.out.tfevents.*.host.1.0")
    return folder


def test_a_sigkilled_start_is_started_again_but_a_users_file_of_its_names_is_kept(tmp_path):
    """A real run of `train --tensorboard` SIGKILLed in its first step (no checkpoint yet) is
    started again without --force, its files replaced; the same folder where a split.csv of
    the user's (a `split --mode manifest` file: the same header) took the run's place is
    refused, and that file kept. It was judged by its name (and header) and deleted."""
    import shutil

    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    options, env, gate = gated(tmp_path, at=1)
    options[options.index("--workers") + 1] = "0"
    killed = start_torchkit_process(
        "train", *options, "--epochs", "1", "--tensorboard", "--out", "run", cwd=tmp_path, env=env
    )
    wait_until(gate.exists, process=killed, what="the first step")
    os.killpg(killed.pid, signal.SIGKILL)
    killed.communicate()
    gate.unlink()
    run = tmp_path / "run"
    (event,) = (run / "tensorboard").iterdir()
    assert sorted(p.name for p in run.iterdir()) == [
        ".torchkit",
        "config.json",
        "split.csv",
        "tensorboard",
    ]
    shutil.copytree(run, tmp_path / "mine")
    manifest = "path,label,split\nds/a/a_0.png,a,val\n"  # the user's split of the data
    (tmp_path / "mine" / "split.csv").write_text(manifest)
    before = tree_digest(tmp_path / "mine")

    mine, again = run_each_in_process(
        [["train", *TINY, *DATA, "--epochs", "1", "--out", out] for out in ("mine", "run")],
        cwd=tmp_path,
    )
    assert mine.returncode == 1 and "run folder already exists: mine" in error_line(mine.stderr)
    assert tree_digest(tmp_path / "mine") == before
    assert again.returncode == 0, again.stderr
    assert (run / "last.pt").is_file() and not (run / "tensorboard").exists()
    assert not event.exists() and hidden_siblings(run) == []


# A sitecustomize: the process SIGKILLs itself as it renames split.csv's finished temporary into
# place, config.json written (a split.csv of a million images is seconds of writing before).
KILLED_WRITING_SPLIT_CSV = """
import os, signal, sys

def _hook(event, args):
    if event in ("os.rename", "os.replace", "os.link") and str(args[1]).endswith("split.csv"):
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(_hook)
"""


def test_a_run_sigkilled_as_it_writes_split_csv_is_started_again_without_force(tmp_path):
    """config.json is recorded in the marker as written, not after split.csv too: a run killed
    between the two is a killed start. It was refused, `run folder already exists: run (its
    run was stopped before its first checkpoint ... pass --force to start it again ...)`."""
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(KILLED_WRITING_SPLIT_CSV)
    args = ["train", *TINY, *DATA, "--epochs", "1", "--out", "run"]
    env = {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{HELPERS}"}
    killed = start_torchkit_process(*args, cwd=tmp_path, env=env)
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    run = tmp_path / "run"
    names = sorted(p.name for p in run.iterdir())
    assert names[1:] == [".torchkit", "config.json"] and names[0].startswith(".split.csv.")

    again = run_torchkit_in_process(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".split")) == []
    assert (run / "last.pt").is_file() and (run / "split.csv").is_file()


# A sitecustomize: the process SIGKILLs itself at the first file it opens once TensorBoard's
# writer has made its event file (the marker, read to record that file, where it was recorded
# once made).
KILLED_AFTER_THE_EVENT_FILE = """
import os, signal, sys

made = []

def _hook(event, args):
    if event != "open":
        return
    if os.path.basename(str(args[0])).startswith("events.out.tfevents."):
        made.append(True)
    elif made:
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(_hook)
"""


def test_a_run_sigkilled_as_its_tensorboard_log_is_made_is_started_again_without_force(
    tmp_path,
):
    """The event file is recorded in the marker (by a pattern its name ends with, given to the
    writer) before the writer makes it: a run killed just after is a killed start. Recorded
    once made, such a run was refused, "run folder already exists: run (its run was stopped
    before its first checkpoint ... pass --force to start it again ...)"."""
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(KILLED_AFTER_THE_EVENT_FILE)
    args = ["train", *TINY, *DATA, "--epochs", "1", "--tensorboard", "--out", "run"]
    env = {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{HELPERS}"}
    killed = start_torchkit_process(*args, cwd=tmp_path, env=env)
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    run = tmp_path / "run"
    assert sorted(p.name for p in run.iterdir()) == [
        ".torchkit",
        "config.json",
        "split.csv",
        "tensorboard",
    ]
    (event,) = (run / "tensorboard").iterdir()

    again = run_torchkit_in_process(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (run / "last.pt").is_file() and not event.exists()
    (log,) = (run / "tensorboard").iterdir()  # the new run's, its name of the same form
    assert log.name.startswith("events.out.tfevents.") and is_tensorboard_events(log)


def test_resume_of_a_run_killed_before_its_config_json_says_to_start_it_again(tmp_path):
    """A run killed as soon as it marked its folder (before config.json): --resume says there
    is nothing to resume and to start it again, as for one killed after config.json. It was
    "no last.pt in run (give the run folder of an earlier `torchkit train`)", which it is."""
    (tmp_path / "run").mkdir()
    write_marker(tmp_path / "run", "train")
    resumed = run_torchkit_in_process("train", "--resume", "run", cwd=tmp_path)
    assert resumed.returncode == 1
    assert "run: its run was stopped before its first checkpoint" in error_line(resumed.stderr)
    assert "the command that started it, without --resume" in error_line(resumed.stderr)


def test_a_run_killed_before_its_first_checkpoint_starts_again_without_force(world):
    # It was "run folder already exists: killed (its run was stopped before its first
    # checkpoint, so there is nothing to resume: pass --force to start it again ...)".
    killed = killed_start(world / "killed", world / "old" / "config.json")
    before = tree_digest(killed)
    resumed, failed = run_each_in_process(
        [
            ["train", "--resume", "killed"],
            ["train", *TINY, *DATA, "--model", "no_such_module:Net", "--out", "killed"],
        ],
        cwd=world,
    )
    assert resumed.returncode == 1
    assert "stopped before its first checkpoint" in error_line(resumed.stderr)
    assert "the command that started it, without --resume" in error_line(resumed.stderr)
    assert failed.returncode == 2 and "no_such_module" in error_line(failed.stderr)
    assert tree_digest(killed) == before  # a run that fails puts the killed start back
    again = run_torchkit_in_process(
        "train", *TINY, *DATA, "--epochs", "1", "--out", "killed", cwd=world
    )
    assert again.returncode == 0, again.stderr
    assert (killed / "last.pt").is_file() and not (killed / "tensorboard").exists()
    assert hidden_siblings(killed) == []


def copied_with_new_times(source: Path, target: Path) -> Path:
    """`source` copied file by file as `cp -r` or `rsync` without -t copy it: the same bytes,
    new modification times (set apart from the originals' on purpose: a coarse clock could give
    the same)."""
    import shutil

    for path in sorted(source.rglob("*")):
        copy = target / path.relative_to(source)
        if path.is_dir():
            copy.mkdir(parents=True)
            continue
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, copy)
        later = path.stat().st_mtime_ns + 7_000_000_000
        os.utime(copy, ns=(later, later))
    return target


def test_a_killed_start_copied_with_new_times_starts_again_without_force(world):
    """Before: a killed start was known by its files' sizes and times only, so the same folder
    copied (`cp -r`, `rsync` without -t) was "run folder already exists ... pass --force". Now
    the marker records their content's digest too: the copy starts again without --force,
    while a copy whose split.csv holds other bytes of the same size (the user's) is refused
    and kept."""
    killed = killed_start(world / "killed", world / "old" / "config.json")
    copied = copied_with_new_times(killed, world / "copied")
    theirs = copied_with_new_times(killed, world / "theirs")
    split = (theirs / "split.csv").read_text()
    (theirs / "split.csv").write_text(split.replace("train", "trian"))  # the same size
    assert (theirs / "split.csv").stat().st_size == (killed / "split.csv").stat().st_size
    before = tree_digest(theirs)
    again, refused = run_each_in_process(
        [["train", *TINY, *DATA, "--epochs", "1", "--out", out] for out in ("copied", "theirs")],
        cwd=world,
    )
    assert again.returncode == 0, again.stderr
    assert (copied / "last.pt").is_file() and not (copied / "tensorboard").exists()
    assert hidden_siblings(copied) == []
    assert refused.returncode == 1
    assert "run folder already exists: theirs" in error_line(refused.stderr)
    assert tree_digest(theirs) == before


@pytest.mark.parametrize("mine", ["notes.txt", "tensorboard/notes.txt"])
def test_a_killed_start_holding_a_users_file_still_needs_force(world, mine):
    killed = killed_start(world / "killed", world / "old" / "config.json")
    (killed / mine).write_text("my notes\n")
    before = tree_digest(world)
    again, forced = run_each_in_process(
        [["train", *TINY, *DATA, "--out", "killed", *force] for force in ([], ["--force"])],
        cwd=world,
    )
    assert again.returncode == 1 and "--resume" not in error_line(again.stderr)
    assert "stopped before its first checkpoint" in error_line(again.stderr)
    # --force refuses to delete the user's file: the hint names it (it offered --force).
    assert f"it holds killed/{mine} that torchkit did not write" in error_line(again.stderr)
    assert forced.returncode == 1 and f"killed/{mine}" in error_line(forced.stderr)
    assert tree_digest(world) == before


def test_a_run_stopped_in_its_first_epoch_saves_last_pt_over_a_killed_start(world):
    """Ctrl-C or SIGTERM inside the first epoch of a run that replaces a killed start saves
    last.pt (as in a new folder): the killed start held nothing worth more than that epoch."""
    from torchkit.core.io.outputs import OutputFolder
    from torchkit.core.train.outputs import START_FILES
    from torchkit.core.train.run_folder import RunFolder

    killed = killed_start(world / "killed", world / "old" / "config.json")
    folder = RunFolder()
    folder.output = OutputFolder(killed, command="train", start_files=START_FILES)
    assert folder.output.replaces_killed_start
    folder.path = folder.output.begin()
    assert folder.save_stopped({"epoch": 1, "model": {}})
    folder.release(ok=True)
    assert sorted(p.name for p in killed.iterdir()) == [".torchkit", "last.pt"]
    assert hidden_siblings(killed) == []


@pytest.fixture
def trained(tmp_path: Path) -> Path:
    """A finished one-epoch run in `runs/run`, on `ds`."""
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    done = run_torchkit_in_process(
        "train", *TINY, *DATA, "--epochs", "1", "--out", "runs/run", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    return tmp_path / "runs" / "run"


def test_resume_never_overwrites_the_run_it_reads_and_continues_in_place(trained):
    world = trained.parent.parent
    before = tree_digest(world)
    cases = [
        # The summary may not replace a file of the run (best.pt here: it exists, --force).
        (["--resume", "runs/run", "-o", "runs/run/best.pt", "--force"], "run's own best.pt"),
        # best.pt is behind last.pt: continuing it in place would overwrite last.pt.
        (["--resume", "runs/run/best.pt"], "would overwrite runs/run/last.pt"),
        (["--resume", "runs/run", "--out", "runs", "--force"], "contains the checkpoint to"),
    ]
    results = run_each_in_process([["train", *args] for args, _ in cases], cwd=world)
    for (args, expected), result in zip(cases, results, strict=True):
        assert result.returncode == 1, (args, result.stderr)
        assert expected in error_line(result.stderr), args
    assert tree_digest(world) == before

    # --resume FILE --out ITS_FOLDER --force continues the run in place: --force has nothing to
    # replace, and the run's epochs so far are kept. A summary beside the run's files is fine.
    summary = trained / "summary.json"
    done = run_torchkit_in_process(
        "train", "--resume", "runs/run/last.pt", "--out", "runs/run", "--force", "--epochs", "2",
        "--format", "json", "-o", str(summary), cwd=world,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(summary.read_text())["epochs"] == 2
    last = torch.load(trained / "last.pt", weights_only=True)
    assert last["epoch"] == 2 and [row["epoch"] for row in last["history"]] == [1, 2]
    assert (trained / "metrics.csv").read_text().count("\n") == 3  # header + epochs 1 and 2
    assert hidden_siblings(trained) == []
    assert tree_digest(world / "ds") == {k[3:]: v for k, v in before.items() if k.startswith("ds/")}


def gated(tmp_path: Path, at: int) -> tuple[list[str], dict[str, str], Path]:
    """Options and environment for a run of nets:GatedNet that waits at its `at`-th
    training step until the test removes the gate file (returned)."""
    gate = tmp_path / f"gate-{at}"
    env = {
        "PYTHONPATH": str(HELPERS),
        "TORCHKIT_TEST_GATE_FILE": str(gate),
        "TORCHKIT_TEST_GATE_AT": str(at),
    }
    args = ["--model", "nets:GatedNet", "--image-size", "8", "--batch-size", "2"]
    return [*args, "--workers", "2", *DATA], env, gate


def test_sigkill_then_sigterm_in_the_first_epoch_of_force_give_the_old_run_back(tmp_path):
    """A run killed (SIGKILL) after it set the old run aside leaves it hidden beside the folder;
    the next run on the folder puts it back, and a SIGTERM during that run's first epoch puts
    it back again, byte for byte, with no process of the command left."""
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    run = old_run(tmp_path / "run")
    original = tree_digest(run)
    options, env, gate = gated(tmp_path, at=2)  # the first epoch's second step (of 4)
    args = ["train", *options, "--epochs", "1", "--out", "run", "--force"]

    killed = start_torchkit_process(*args, cwd=tmp_path, env=env)
    wait_until(gate.exists, process=killed, what="the first epoch")
    os.killpg(killed.pid, signal.SIGKILL)
    killed.communicate()
    gate.unlink()
    leftover = [p.name for p in tmp_path.glob(".run.*.replaced")]
    assert len(leftover) == 1 and tree_digest(tmp_path / leftover[0]) == original
    assert (tmp_path / "run" / ".torchkit").is_file()  # the killed run's own folder

    again = start_torchkit_process(*args, cwd=tmp_path, env=env)
    wait_until(gate.exists, process=again, what="the first epoch")
    assert [p.name for p in tmp_path.glob(".run.*.replaced")] != leftover  # set aside anew
    again.send_signal(signal.SIGTERM)
    gate.unlink()  # the step finishes; the run stops before the next one
    _, stderr = again.communicate(timeout=120)
    assert again.returncode == 143, stderr
    assert "put back" in stderr  # the warning of the run that found the leftover
    assert "Terminated before the first checkpoint" in stderr and "Traceback" not in stderr
    assert tree_digest(run) == original
    assert hidden_siblings(run) == []
    assert processes_in_group(again.pid) == []


def test_sigterm_after_the_first_checkpoint_keeps_the_run_and_a_second_run_is_locked_out(
    tmp_path,
):
    """--force over a run made before the marker existed: once the new run has saved last.pt
    it is kept. A second run on the same folder meanwhile is refused with the first one's PID.
    SIGTERM to the whole process group (as `timeout` sends it) saves last.pt, stops the
    DataLoader workers and exits 143; --resume continues from it."""
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    run = old_run(tmp_path / "run", marker=False)
    options, env, gate = gated(tmp_path, at=6)  # the second epoch's second step
    args = ["train", *options, "--epochs", "3", "--out", "run", "--force"]
    first = start_torchkit_process(*args, "--seed", "1", cwd=tmp_path, env=env)
    wait_until(gate.exists, process=first, what="the second epoch")
    # The first epoch's last.pt is written beside the second epoch: on a busy machine it may
    # land after the gate is reached.
    wait_until((run / "last.pt").exists, process=first, what="the first epoch's last.pt")
    assert torch.load(run / "last.pt", weights_only=True)["epoch"] == 1

    second = run_torchkit_in_process(*args, "--seed", "2", cwd=tmp_path)  # not the lock holder
    assert second.returncode == 1, second.stderr
    line = error_line(second.stderr)
    assert "being written by another torchkit process" in line and f"PID {first.pid}" in line

    os.killpg(first.pid, signal.SIGTERM)
    gate.unlink()
    _, stderr = first.communicate(timeout=120)
    assert first.returncode == 143, stderr
    assert "Terminated: saved run/last.pt" in stderr and "--resume run" in stderr
    assert processes_in_group(first.pid) == []
    assert hidden_siblings(run) == []
    # The first run's files only: the old run (and the second run) left nothing in it.
    assert json.loads((run / "config.json").read_text())["options"]["seed"] == 1
    assert not (run / "epoch-002.pt").exists() and not (run / "tensorboard").exists()
    saved = torch.load(run / "last.pt", weights_only=True)
    assert (saved["config"]["seed"], saved["epoch"], saved["epoch_progress"]["batches"]) == (
        1,
        1,
        2,
    )

    resumed = run_torchkit_in_process(  # nets is importable here
        "train", "--resume", "run", "--workers", "0", "--format", "json", "--trust-checkpoint",
        cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["epochs"] == 3
    assert torch.load(run / "last.pt", weights_only=True)["epoch"] == 3


def test_a_full_disk_is_an_error_and_keeps_the_last_good_checkpoints(tmp_path, small_tmpfs):
    """On a file system with room for the first epoch's two checkpoints but not a third:
    `Error: cannot write`, exit 1, the first epoch's last.pt and best.pt intact, no temporary
    left. Then --force over that run, with no room for any checkpoint: the new run fails and
    the old one is back, byte for byte."""
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    # convnet's checkpoint for 2 classes is 643 KiB: 2 fit in 1600 KiB with the small files.
    run = small_tmpfs(1600) / "run"
    args = [*TINY, *DATA, "--out", str(run)]
    full = run_torchkit_in_process("train", *args, "--epochs", "3", cwd=tmp_path)
    assert full.returncode == 1, full.stderr
    assert error_line(full.stderr).startswith(f"Error: cannot write {run}/")
    for name in ("last.pt", "best.pt"):
        assert torch.load(run / name, weights_only=True)["epoch"] == 1
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == [".torchkit"]
    assert hidden_siblings(run) == []
    kept = tree_digest(run)

    forced = run_torchkit_in_process("train", *args, "--epochs", "1", "--force", cwd=tmp_path)
    assert forced.returncode == 1, forced.stderr
    assert error_line(forced.stderr).startswith(f"Error: cannot write {run}/")
    assert tree_digest(run) == kept
    assert hidden_siblings(run) == []


def test_the_lock_holder_pid_is_in_the_refusal_even_before_any_file_is_written(tmp_path):
    """The lock is taken before the data is read: a run refused by it costs nothing. (The
    lock is an flock of its own open file: held here, it refuses a run in this process too.)"""
    from torchkit.core.io.output_locks import FolderLock

    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    lock = FolderLock(tmp_path / "run", "run folder")
    try:
        done = run_torchkit_in_process("train", *TINY, *DATA, "--out", "run", cwd=tmp_path)
    finally:
        lock.release()
    assert done.returncode == 1
    assert f"(PID {os.getpid()})" in error_line(done.stderr)
    assert not (tmp_path / "run").exists()


def test_runs_started_in_the_same_second_get_their_own_default_folders(tmp_path, monkeypatch):
    """runs/<model>-<timestamp> is taken by a run that holds its lock even before its folder
    exists: the next run started in that second gets the next name instead of being refused
    (or, before the lock existed, mixing its files into the other run's)."""
    from torchkit.core.io.output_locks import FolderLock
    from torchkit.core.runtime.distributed import DistContext
    from torchkit.core.train import TrainConfig, run_folder
    from torchkit.core.train.setup import plan_run

    class Frozen:
        @staticmethod
        def now():
            import datetime

            return datetime.datetime(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(run_folder, "datetime", Frozen)
    monkeypatch.chdir(tmp_path)
    first = run_folder.default_out("convnet")
    assert first == Path("runs/convnet-20260102-030405")
    lock = FolderLock(first, "run folder")
    try:
        assert run_folder.default_out("convnet") == Path("runs/convnet-20260102-030405-2")
        folder = run_folder.RunFolder()
        # The race: the name looked free when picked, then the lock says otherwise.
        monkeypatch.setattr(run_folder, "lock_path", lambda folder: tmp_path / "no-such-lock")
        out, in_place = folder.open(DistContext(), plan_run(TrainConfig(model="convnet"), None))
        assert out == Path("runs/convnet-20260102-030405-2") and not in_place
        folder.release(ok=False)
    finally:
        lock.release()
    assert list(tmp_path.glob("runs/*")) == []  # no folder made, no lock left


def test_a_run_failing_before_its_first_checkpoint_keeps_files_put_in_its_folder(
    tmp_path, make_image_folder
):
    """A file the user copies into the run folder while the first epoch runs is not the run's:
    the clean-up of a run that fails then removes config.json, split.csv, tensorboard/ and the
    marker, and keeps the folder with the user's file, saying so."""
    from torchkit.core.io.errors import InputError
    from torchkit.core.train import TrainCallbacks, TrainConfig, run_training

    out = tmp_path / "run"

    class FailsInTheFirstEpoch(TrainCallbacks):
        def on_epoch_start(self, epoch: int, epochs: int, steps: int, done: int) -> None:
            (out / "notes.txt").write_text("the user's\n")
            raise InputError("cannot read a.png")

    data = make_image_folder(tmp_path / "data", {"a": 4, "b": 4})
    config = TrainConfig(
        data=str(data), model="convnet", image_size=8, batch_size=4, val_split=0.25,
        device="cpu", workers=0, epochs=1, out=str(out), tensorboard=True,
    )  # fmt: skip
    with pytest.raises(InputError) as raised:
        run_training(config, FailsInTheFirstEpoch())
    assert os.listdir(out) == ["notes.txt"]
    assert raised.value.message == (
        f"cannot read a.png; run folder {out} was kept: it holds files this run did not write "
        "(notes.txt)"
    )


def test_a_disk_full_when_tensorboard_starts_is_one_error_line(tmp_path, small_tmpfs, monkeypatch):
    """`--tensorboard` on a disk that fills as its event file is started: one `cannot write
    RUN/tensorboard` line (was an `OSError: [Errno 28]` line without a path, under the
    traceback of TensorBoard's writer thread), and nothing left of the run."""
    from torchkit.core.train import outputs

    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    disk = small_tmpfs(64)
    real = outputs.summary_writer_class()

    def filled_first():
        fill_disk(disk)
        return real

    monkeypatch.setattr(outputs, "summary_writer_class", filled_first)
    run = disk / "run"
    done = run_torchkit_in_process(
        "train", *TINY, *DATA, "--epochs", "1", "--tensorboard", "--out", run, cwd=tmp_path
    )
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr)
    assert line.startswith(f"Error: cannot write {run}/tensorboard: No space left on device")
    assert "Exception in thread" not in done.stderr
    assert os.listdir(disk) == ["filler"]


def test_tensorboard_scalars_on_a_full_disk_are_one_error_line(tmp_path, monkeypatch):
    """The epoch's scalars, written by TensorBoard's thread, meet a full disk: one `cannot
    write RUN/tensorboard` line, not an `OSError` line without a path."""
    import errno

    from tensorboard.compat.tensorflow_stub.io import gfile

    def full(self, filename, file_content, binary_mode=False):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(gfile.LocalFileSystem, "append", full)  # every record after the first
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    run = tmp_path / "run"
    done = run_torchkit_in_process(
        "train", *TINY, *DATA, "--epochs", "1", "--tensorboard", "--out", run, cwd=tmp_path
    )
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr)
    assert line.startswith(f"Error: cannot write {run}/tensorboard: No space left on device")
    assert "Exception in thread" not in done.stderr
    assert hidden_siblings(run) == []


# -- the -o summary on a full disk --------------------------------------------------------------


def full_report(small_tmpfs) -> Path:
    """An earlier summary on a file system with no byte free: the next one cannot be written."""
    disk = small_tmpfs(64)
    report = disk / "summary.json"
    report.write_text('{"old": "summary"}\n')
    fill_disk(disk)
    return report


def test_a_summary_the_full_disk_refuses_says_the_finished_run_is_kept_and_where(
    tmp_path, small_tmpfs
):
    """train's exception to "a report the disk refuses costs nothing": a finished run is worth
    more than its summary, so the new run (which replaced the old one at its first checkpoint)
    stays, and the error line says so and where; the old summary is as it was."""
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    old_run(tmp_path / "run")
    report = full_report(small_tmpfs)
    args = [*TINY, *DATA, "--epochs", "1", "--out", "run", "--force", "-o", report]
    done = run_torchkit_in_process("train", *args, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr).startswith(
        f"Error: cannot write {report}: No space left on device; the finished run is kept in run ("
    )
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["epoch"] == 1  # the new
    assert report.read_text() == '{"old": "summary"}\n'
    assert sorted(os.listdir(report.parent)) == ["filler", "summary.json"]
    assert hidden_siblings(tmp_path / "run") == []


def test_kept_note_of_an_interrupted_run_says_how_to_continue_it():
    """An interrupted run whose summary cannot be written: the note names last.pt's run and
    the --resume that continues it (the line the summary's failure took the place of)."""
    from types import SimpleNamespace

    from torchkit.cli.train import _kept_run

    stopped = SimpleNamespace(out_dir=Path("runs/r1"), interrupted=True, model="convnet")
    assert _kept_run(stopped) == (
        "the run is kept in runs/r1 (last.pt saved; continue with "
        "`torchkit train --resume runs/r1`)"
    )
    # A command that works as pasted: the folder quoted, and the trust that model code needs.
    stopped = SimpleNamespace(out_dir=Path("my runs/r1"), interrupted=True, model="nets:TinyNet")
    assert _kept_run(stopped).endswith(
        "continue with `torchkit train --resume 'my runs/r1' --trust-checkpoint`)"
    )


def test_a_range_test_summary_the_full_disk_refuses_leaves_the_earlier_run(tmp_path, small_tmpfs):
    """`train --find-lr --out RUN --force -o REPORT` where REPORT's disk is full: the range
    test's files had replaced the earlier run in RUN while the command failed. A range test is
    no finished training: its report is written before its files replace RUN, so RUN and
    REPORT are as they were; with room, the same command writes both."""
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    run = old_run(tmp_path / "run")
    before = tree_digest(run)
    report = full_report(small_tmpfs)
    args = [*TINY, *DATA, "--find-lr", "--find-lr-iters", "3", "--out", "run", "--force"]
    done = run_torchkit_in_process("train", *args, "-o", report, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr)
    assert line.startswith(f"Error: cannot write {report}: No space left on device ("), line
    assert tree_digest(run) == before
    assert hidden_siblings(run) == []
    assert report.read_text() == '{"old": "summary"}\n'
    assert sorted(os.listdir(report.parent)) == ["filler", "summary.json"]

    (report.parent / "filler").unlink()
    done = run_torchkit_in_process("train", *args, "-o", report, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"Note: wrote {report}" in done.stderr
    assert json.loads(report.read_text())["lr_find_iterations"] == 3
    names = [".torchkit", "config.json", "lr_find.csv", "lr_find.png", "split.csv"]
    assert sorted(os.listdir(run)) == names  # the range test's run, in place of the earlier


@pytest.mark.parametrize(
    ("name", "shown"),
    [("my old", "'my old'"), ("my\nold", "$'my\\nold'")],
    ids=["space", "newline"],
)
def test_the_commands_that_refusals_of_a_run_folder_show_quote_its_path(tmp_path, name, shown):
    """`--resume my old` would be two words: the hint shows a word the user can paste, and a
    line break in the folder's name keeps the Error line one line."""
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    old_run(tmp_path / name)
    escaped = name.encode("unicode_escape").decode()
    exists, summary = run_each_in_process(
        [
            ["train", *TINY, *DATA, "--out", name],
            ["train", *TINY, *DATA, "--out", name, "-o", f"{name}/metrics.csv", "--force"],
        ],
        cwd=tmp_path,
    )
    assert exists.returncode == 1
    assert exists.stderr.strip().splitlines()[-1] == (
        f"Error: run folder already exists: {escaped} (pass --resume {shown} to continue that "
        "run, --force to overwrite it, or choose another --out)"
    )
    assert summary.returncode == 1
    quoted = shown.replace("old'", "old/summary.json'")
    assert summary.stderr.strip().splitlines()[-1] == (
        f"Error: -o {escaped}/metrics.csv would overwrite the run's own metrics.csv (write the "
        f"summary elsewhere, e.g. -o {quoted})"
    )


def test_continuing_an_earlier_checkpoint_in_place_shows_the_resume_of_the_quoted_folder(
    tmp_path,
):
    from torchkit.core.io.overlap import OutputOverlapError
    from torchkit.core.train.run_folder import _check_in_place_resume

    out = old_run(tmp_path / "my old")
    with pytest.raises(OutputOverlapError) as refused:
        _check_in_place_resume(out / "epoch-002.pt", out)
    assert refused.value.hint == (
        f"continue the run from its last checkpoint with --resume '{out}', or start a new run "
        f"from {out}/epoch-002.pt with --out NEW_FOLDER"
    )
