"""`train --force` over an earlier run sets that run aside until its first checkpoint: a run
SIGKILLed before it leaves the earlier run hidden beside the folder, which holds only the killed
run's start. `--resume FOLDER` then goes on with the earlier run, put back first (as any next
run on the folder puts it back); where it cannot be put back (`--print-config`, which writes
nothing), the refusal names where the earlier run is kept and what puts it back. It said "its
run was stopped before its first checkpoint" and to start it again, as if nothing else was
there. A file of the user's in that folder keeps the earlier run aside, and the refusal says
what to move."""

from __future__ import annotations

import os
import signal

import torch
from image_folders import write_image_folder
from output_checks import error_line, hidden_siblings, tree_digest
from processes import run_torchkit_in_process, start_torchkit_process
from suite_paths import HELPERS

TINY = ["--model", "convnet", "--image-size", "8", "--batch-size", "4", "--workers", "0"]
DATA = ["--data", "ds", "--val-split", "0.3"]

# A sitecustomize: the process SIGKILLs itself as it renames split.csv's finished temporary into
# place: config.json written, no checkpoint yet.
KILLED_WRITING_SPLIT_CSV = """
import os, signal, sys

def _hook(event, args):
    if event in ("os.rename", "os.replace", "os.link") and str(args[1]).endswith("split.csv"):
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(_hook)
"""


def test_resume_after_a_force_run_killed_before_its_first_checkpoint_puts_the_old_run_back(
    tmp_path,
):
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    first = run_torchkit_in_process(
        "train", *TINY, *DATA, "--epochs", "1", "--out", "run", cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr
    run = tmp_path / "run"
    original = tree_digest(run)

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(KILLED_WRITING_SPLIT_CSV)
    env = {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{HELPERS}"}
    killed = start_torchkit_process(
        "train", *TINY, *DATA, "--epochs", "1", "--out", "run", "--force", "--seed", "1",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    (aside,) = tmp_path.glob(".run.*.replaced")
    assert tree_digest(aside) == original and not (run / "last.pt").exists()

    shown = run_torchkit_in_process("train", "--resume", "run", "--print-config", cwd=tmp_path)
    assert shown.returncode == 1
    line = error_line(shown.stderr)
    assert "no last.pt in run: the run that replaced its earlier run (--force) was stopped" in line
    assert f"the earlier run is kept at {aside.name} (torchkit train --resume run, run in" in line
    as_file = run_torchkit_in_process(
        "train", "--resume", "run/last.pt", "--print-config", cwd=tmp_path
    )
    assert as_file.returncode == 1
    assert error_line(as_file.stderr).startswith(
        f"Error: run/last.pt is not there: the run that replaced its earlier run (--force) was "
        f"stopped before its first checkpoint; the earlier run is kept at {aside.name}"
    )
    assert aside.is_dir() and not (run / "last.pt").exists()  # nothing written

    # A file of the user's put in the killed run's folder keeps the earlier run where it is.
    (run / "notes.txt").write_text("mine\n")
    kept = run_torchkit_in_process("train", "--resume", "run", "--epochs", "2", cwd=tmp_path)
    assert kept.returncode == 1
    assert f"the earlier run is kept at {aside.name} (move the other files out of run, then " in (
        error_line(kept.stderr)
    )
    assert aside.is_dir() and sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    (run / "notes.txt").unlink()

    resumed = run_torchkit_in_process("train", "--resume", "run", "--epochs", "2", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "put back run, which a killed torchkit run had set aside" in resumed.stderr
    last = torch.load(run / "last.pt", weights_only=True)
    assert [row["epoch"] for row in last["history"]] == [1, 2]
    assert last["config"]["seed"] == 0  # the earlier run's, not the killed one's
    assert hidden_siblings(run) == []
