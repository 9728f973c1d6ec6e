"""A torchkit process started with a standard descriptor closed (`2>&-`, `>&-`) or with a
stderr that cannot be written (`2>/dev/full`): the work and its exit status are the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from output_checks import error_line
from processes import INHERITED

# A model whose first forward pass writes to descriptor 2 at the C level (as torch, oneDNN or
# OpenCV warn) and records what descriptor 2 is.
PROBE = textwrap.dedent(
    """
    import os

    from torch import nn


    class Probe(nn.Module):
        def __init__(self, num_classes=2):
            super().__init__()
            self.fc = nn.Linear(3, num_classes)

        def forward(self, x):
            if not os.path.exists("fd2.txt"):
                os.write(2, b"STRAY BYTES\\n")
                with open("fd2.txt", "w") as record:
                    record.write(os.readlink("/proc/self/fd/2"))
            return self.fc(x.mean((2, 3)))
    """
)


def _torchkit(*args: object, redirect: str, cwd: Path) -> subprocess.CompletedProcess:
    """`torchkit ARGS REDIRECT` as a shell runs it (`2>&-` closes the descriptor)."""
    env = {key: value for key, value in os.environ.items() if key not in INHERITED}
    command = f'exec "$0" -m torchkit "$@" {redirect}'
    return subprocess.run(
        ["sh", "-c", command, sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def test_a_closed_stderr_is_not_taken_by_the_lock_file(tmp_path, make_image_folder):
    """`train 2>&-`: the run folder's lock file, the next file opened, became descriptor 2, and
    every C-level write to stderr (a library's warning, a crashing worker) landed in it. Now
    descriptor 2 is /dev/null while the command runs."""
    make_image_folder(tmp_path / "images", {"a": 3, "b": 3})
    (tmp_path / "probe.py").write_text(PROBE)
    args = ["train", "--data", "images", "--model", "probe:Probe", "--epochs", "1", "-j", "0"]
    done = _torchkit(*args, "--out", "run", "--format", "json", redirect="2>&-", cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    assert (tmp_path / "fd2.txt").read_text() == os.devnull
    written = [path for path in (tmp_path / "run").rglob("*") if path.is_file()]
    assert written and not any(b"STRAY" in path.read_bytes() for path in written)


def test_an_output_naming_a_closed_stdout_is_still_refused(tmp_path, make_image_folder):
    """Descriptor 1 is /dev/null by the time the output is checked: `-o /dev/stdout >&-` is
    refused all the same, as the descriptor the user closed."""
    make_image_folder(tmp_path / "images", {"a": 2})
    done = _torchkit("dataset-stats", "images", "-o", "/dev/stdout", redirect=">&-", cwd=tmp_path)
    assert done.returncode == 1
    assert error_line(done.stderr, besides="nothing") == (
        "Error: cannot write output /dev/stdout: Bad file descriptor (standard output is "
        "closed: send it to a file or to /dev/null, or choose another output)"
    )


def test_an_output_naming_a_descriptor_not_given_is_refused_before_any_work(
    tmp_path, make_image_folder
):
    """`train -o /dev/fd/3` without `3>FILE`: by the time -o was checked, descriptor 3 was
    the run folder's lock file, so the check passed; the run trained, then failed with "file
    descriptor 3 is closed". A descriptor given (`3>stats.json`) is written."""
    args = ["train", "--data", "digits", "--epochs", "1", "--out", "run", "-o", "/dev/fd/3"]
    done = _torchkit(*args, redirect="", cwd=tmp_path)
    assert done.returncode == 1
    assert error_line(done.stderr, besides="warnings") == (
        "Error: cannot write -o /dev/fd/3: Bad file descriptor (file descriptor 3 is closed: "
        "send it to a file or to /dev/null, or choose another output)"
    )
    assert done.stdout == "" and not (tmp_path / "run").exists()
    make_image_folder(tmp_path / "images", {"a": 2})
    args = ["dataset-stats", "images", "-o", "/dev/fd/3", "--format", "json"]
    given = _torchkit(*args, redirect="3>stats.json", cwd=tmp_path)
    assert given.returncode == 0, given.stderr
    assert json.loads((tmp_path / "stats.json").read_text())["files"] == 2


def test_the_terminal_as_output_without_one_is_refused_before_any_work(tmp_path):
    """`train -o /dev/tty` from cron or CI (no terminal; here a new session has none): the run
    trained, then ended in "Error: OSError: [Errno 6] No such device or address"."""
    args = ["train", "--data", "digits", "--epochs", "1", "--out", "run", "-o", "/dev/tty"]
    env = {key: value for key, value in os.environ.items() if key not in INHERITED}
    done = subprocess.run(
        [sys.executable, "-m", "torchkit", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        start_new_session=True,  # no controlling terminal
    )
    assert done.returncode == 1
    assert error_line(done.stderr, besides="warnings") == (
        "Error: cannot write -o /dev/tty: No such device or address (this process has no "
        "terminal: choose another output)"
    )
    assert done.stdout == "" and not (tmp_path / "run").exists()


def test_split_with_a_full_stderr_does_its_work(tmp_path, make_image_folder):
    """`split 2>/dev/full`: the first Note's failed write ended the command with exit 1 and no
    table on stdout (the split made all the same). Notes are best effort: exit 0, the table;
    a failure keeps its exit status."""
    make_image_folder(tmp_path / "images", {"a": 5, "b": 5})
    done = _torchkit(
        "split", "images", "out", "--format", "csv", redirect="2>/dev/full", cwd=tmp_path
    )
    assert done.returncode == 0
    assert done.stdout.splitlines()[0] == "class,train,val,test,total"
    assert (tmp_path / "out" / "split.csv").is_file()
    refused = _torchkit("split", "missing", "out2", redirect="2>/dev/full", cwd=tmp_path)
    assert refused.returncode == 1 and refused.stdout == ""


def test_training_with_a_full_stderr_trains(tmp_path):
    """`train 2>/dev/full`: a long run must not die because its log stream is full."""
    args = ["--data", "digits", "--model", "convnet", "--image-size", "8", "--epochs", "1"]
    done = _torchkit(
        "train", *args, "--batch-size", "512", "-j", "0", "--out", "run", "--format", "json",
        redirect="2>/dev/full", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0
    assert json.loads(done.stdout)["epochs"] == 1
    assert (tmp_path / "run" / "best.pt").is_file()
