"""A command started in a working folder that was deleted under the shell (`cd d; rmdir ../d`):
one `Error:` line, or the result where neither torch nor the folder is needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from output_checks import error_line
from processes import INHERITED, working_directory
from typer.testing import CliRunner

from torchkit.cli import app

GONE = "the working folder no longer exists"


def _in_a_deleted_folder(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m torchkit ARGS` started by a shell whose working folder was just deleted."""
    import os

    environment = {key: value for key, value in os.environ.items() if key not in INHERITED}
    script = 'cd gone && rmdir ../gone && exec "$0" -m torchkit "$@"'
    (tmp_path / "gone").mkdir()
    return subprocess.run(
        ["sh", "-c", script, sys.executable, *args],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_torch_is_not_loaded_in_a_deleted_working_folder(tmp_path):
    # MKL, loaded with torch, ended the process: "Intel oneMKL FATAL ERROR: Cannot load
    # .../libtorch_cpu.so." and exit 2, the status of a usage error.
    done = _in_a_deleted_folder(tmp_path, "summary", "convnet")
    assert done.returncode == 1, done.stderr
    assert GONE in error_line(done.stderr), done.stderr
    assert done.stdout == ""


def test_a_relative_path_in_a_deleted_working_folder_is_one_error_line(image_folder, tmp_path):
    # Before: "Error: FileNotFoundError: [Errno 2] No such file or directory" (os.getcwd).
    gone = tmp_path / "gone"
    gone.mkdir()
    with working_directory(gone):
        gone.rmdir()
        result = CliRunner().invoke(
            app, ["split", str(image_folder), str(tmp_path / "out"), "--mode", "manifest"]
        )
    assert result.exit_code == 1, result.stderr
    assert GONE in error_line(result.stderr), result.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_relative_input_in_a_deleted_working_folder_says_why(tmp_path):
    # Before: "Error: path not found: clip.mp4 (check the path)", sending the user to a path
    # that is right: it names nothing because the folder it is relative to is gone.
    gone = tmp_path / "gone"
    gone.mkdir()
    with working_directory(gone):
        gone.rmdir()
        result = CliRunner().invoke(app, ["video-info", "clip.mp4"])
    assert result.exit_code == 1, result.stderr
    line = error_line(result.stderr)
    assert "clip.mp4" in line and GONE in line, result.stderr
    assert "check the path" not in line
