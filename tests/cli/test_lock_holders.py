"""A lock that refuses a command names the process holding it: any process may hold a flock
(`flock .out.torchkit-lock CMD` serialising runs in a script, a backup tool), and the refusal
said "another torchkit process" whoever held it. The holder is read from Linux's /proc/locks;
a torchkit run's own refusals keep their words (tests/stats/test_safety_split.py,
tests/train/test_safety_train.py, tests/cli/test_replaced_file_leftovers.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from image_folders import make_class_files
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.io import folder_locks
from torchkit.core.io.file_outputs import ReplacedFiles
from torchkit.core.io.output_locks import FolderLock, OutputLockedError, lock_path

pytestmark = pytest.mark.skipif(
    shutil.which("flock") is None or not os.path.exists("/proc/locks"),
    reason="needs util-linux's flock and Linux's /proc/locks",
)


@contextlib.contextmanager
def held_by_flock(path: Path) -> Iterator[subprocess.Popen]:
    """`flock PATH` (util-linux) holding its lock on `path` while the block runs: the process
    that holds it (its command, `cat`, waits on its stdin)."""
    holder = subprocess.Popen(
        ["flock", str(path), "-c", "echo held; exec cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()


def test_an_output_folder_locked_by_another_program_names_it_not_torchkit(tmp_path):
    data = make_class_files(tmp_path / "data", {"cat": 2, "dog": 2})
    out = tmp_path / "out"
    lock = lock_path(out)
    lock.write_text("999999\n")  # a killed torchkit run's PID, left in the file
    with held_by_flock(lock) as holder:
        refused = run_torchkit_in_process("split", data, out)
    assert refused.returncode == 1, refused.stderr
    assert error_line(refused.stderr) == (
        f"Error: output folder {out} is locked by another process (PID {holder.pid}, flock), "
        f"which holds {lock} (wait for it to finish, or choose another folder)"
    )
    assert not out.exists()


def test_a_holder_that_cannot_be_told_may_be_torchkit_or_not(tmp_path, monkeypatch):
    """Without /proc/locks (another system) or a PID in the lock file: no guess either way."""
    out = tmp_path / "out"
    monkeypatch.setattr(folder_locks, "flock_holder", lambda path: None)
    with held_by_flock(lock_path(out)), pytest.raises(OutputLockedError) as refused:
        FolderLock(out, "output folder")
    assert refused.value.message == (
        f"output folder {out} is locked by another process (a torchkit run?), which holds "
        f"{lock_path(out)}"
    )


def test_a_file_locked_by_another_program_is_not_taken_for_a_torchkit_run(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("{}")
    with held_by_flock(target) as holder, pytest.raises(OutputLockedError) as refused:
        ReplacedFiles().set_aside(target)
    assert refused.value.message == (
        f"{target} is locked by another process (PID {holder.pid}, flock)"
    )
    assert os.listdir(tmp_path) == ["report.json"]  # nothing set aside


def test_a_data_folder_locked_by_another_program_is_named_by_split_move(tmp_path):
    data = make_class_files(tmp_path / "data", {"cat": 2, "dog": 2})
    with held_by_flock(data) as holder:
        refused = run_torchkit_in_process("split", data, tmp_path / "out", "--mode", "move")
    assert refused.returncode == 1, refused.stderr
    line = error_line(refused.stderr)
    assert f"is locked by another process (PID {holder.pid}, flock)" in line, line
    assert "torchkit" not in line
    assert sorted(p.name for p in (data / "cat").iterdir()) == ["cat_00.png", "cat_01.png"]
