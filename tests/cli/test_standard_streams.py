"""A torchkit process started with a standard descriptor closed (`2>&-`, `>&-`) or with a
stderr that cannot be written (`2>/dev/full`): the work and its exit status are the same."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

from output_checks import error_line
from processes import CLOSED, run_torchkit_process, start_torchkit_process

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


def _full_stderr() -> int:
    """`2>/dev/full`'s descriptor: a stderr every write to which fails (the caller closes it)."""
    return os.open("/dev/full", os.O_WRONLY)


def test_a_closed_stderr_is_not_taken_by_the_lock_file(tmp_path, make_image_folder):
    """`train 2>&-`: the run folder's lock file, the next file opened, became descriptor 2, and
    every C-level write to stderr (a library's warning, a crashing worker) landed in it. Now
    descriptor 2 is /dev/null while the command runs."""
    make_image_folder(tmp_path / "images", {"a": 3, "b": 3})
    (tmp_path / "probe.py").write_text(PROBE)
    args = ["train", "--data", "images", "--model", "probe:Probe", "--epochs", "1", "-j", "0"]
    # A fork of a preloaded torch started as a shell's `2>&-` starts one: descriptor 2 closed
    # and sys.stderr None, as a fresh interpreter's start-up leaves them (nothing holds 2).
    done = run_torchkit_process(
        *args, "--out", "run", "--format", "json", stderr=CLOSED, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout
    assert (tmp_path / "fd2.txt").read_text() == os.devnull
    written = [path for path in (tmp_path / "run").rglob("*") if path.is_file()]
    assert written and not any(b"STRAY" in path.read_bytes() for path in written)


def test_an_output_naming_a_closed_stdout_is_still_refused(tmp_path, make_image_folder):
    """Descriptor 1 is /dev/null by the time the output is checked: `-o /dev/stdout >&-` is
    refused all the same, as the descriptor the user closed."""
    make_image_folder(tmp_path / "images", {"a": 2})
    done = run_torchkit_process(
        "dataset-stats", "images", "-o", "/dev/stdout", stdout=CLOSED, cwd=tmp_path
    )
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
    descriptor 3 is closed". A descriptor given (`N>stats.json`) is written."""
    args = ["train", "--data", "digits", "--epochs", "1", "--out", "run", "-o", "/dev/fd/3"]
    done = run_torchkit_process(*args, cwd=tmp_path)  # descriptors 0-2 only, as a shell's
    assert done.returncode == 1
    assert error_line(done.stderr, besides="warnings") == (
        "Error: cannot write -o /dev/fd/3: Bad file descriptor (file descriptor 3 is closed: "
        "send it to a file or to /dev/null, or choose another output)"
    )
    assert done.stdout == "" and not (tmp_path / "run").exists()
    make_image_folder(tmp_path / "images", {"a": 2})
    with open(tmp_path / "stats.json", "w") as stats:
        fd = stats.fileno()
        args = ["dataset-stats", "images", "-o", f"/dev/fd/{fd}", "--format", "json"]
        given = run_torchkit_process(*args, pass_fds=[fd], cwd=tmp_path)
    assert given.returncode == 0, given.stderr
    assert json.loads((tmp_path / "stats.json").read_text())["files"] == 2


def test_the_terminal_as_output_without_one_is_refused_before_any_work(tmp_path):
    """`train -o /dev/tty` from cron or CI (no terminal; here a new session has none): the run
    trained, then ended in "Error: OSError: [Errno 6] No such device or address"."""
    args = ["train", "--data", "digits", "--epochs", "1", "--out", "run", "-o", "/dev/tty"]
    with start_torchkit_process(*args, cwd=tmp_path) as process:  # a new session: no terminal
        out, err = process.communicate(timeout=300)
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
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
    full = _full_stderr()
    try:
        args = ["split", "images", "out", "--format", "csv"]
        done = run_torchkit_process(*args, stderr=full, cwd=tmp_path)
        refused = run_torchkit_process("split", "missing", "out2", stderr=full, cwd=tmp_path)
    finally:
        os.close(full)
    assert done.returncode == 0
    assert done.stdout.splitlines()[0] == "class,train,val,test,total"
    assert (tmp_path / "out" / "split.csv").is_file()
    assert refused.returncode == 1 and refused.stdout == ""


def test_training_with_a_full_stderr_trains(tmp_path, make_image_folder):
    """`train 2>/dev/full`: a long run must not die because its log stream is full. (Six
    images: its notes, epoch line and warnings are written as for any data; digits' 1,797 cost
    a second more of CPU.)"""
    make_image_folder(tmp_path / "images", {"a": 3, "b": 3})
    args = ["--data", "images", "--model", "convnet", "--image-size", "8", "--epochs", "1"]
    full = _full_stderr()
    try:
        done = run_torchkit_process(
            "train", *args, "-j", "0", "--out", "run", "--format", "json",
            stderr=full, cwd=tmp_path,
        )  # fmt: skip
    finally:
        os.close(full)
    assert done.returncode == 0
    assert json.loads(done.stdout)["epochs"] == 1
    assert (tmp_path / "run" / "best.pt").is_file()
