"""`torchkit ... | head -1`: when the reader of stdout leaves early, torchkit ends as GNU tools
do, exit code 141 (128 + SIGPIPE) and nothing on stderr, with its loader workers stopped. Real
processes: the pipe and the process's exit are the subject."""

from __future__ import annotations

import os
import subprocess

import pytest
from image_folders import write_image_folder
from processes import processes_in_group, start_torchkit_process, wait_until
from suite_paths import REPO

fcntl = pytest.importorskip("fcntl")
if not hasattr(fcntl, "F_SETPIPE_SZ"):
    pytest.skip("needs Linux pipes of a set size", allow_module_level=True)

BROKEN_PIPE_EXIT = 141
NOISE = ("Error", "Traceback", "Exception ignored", "Broken pipe", "BrokenPipeError")


def read_first_line_and_close(*args: str, cwd: os.PathLike | str = REPO):
    """Run `python -m torchkit ARGS | head -1`: stdout a pipe of one page (so that a few KB of
    output outlast the reader), read its first line, close it. (exit code, first line, stderr,
    the PIDs of its process group still alive after it ended)."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    # Unbuffered, Python's stdout drops what a short write to a pipe leaves out, without an
    # error (a reader gone mid-write): a shell does not set it (empty is unset to Python).
    env = {"PYTHONUNBUFFERED": ""} if os.environ.get("PYTHONUNBUFFERED") else None
    # Its own session, so its process group: its workers can be found.
    try:
        process = start_torchkit_process(*args, env=env, cwd=cwd, stdout=write_end)
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        first = reader.readline().decode()
    try:
        _, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        raise
    wait_until(lambda: not processes_in_group(process.pid), what="workers gone")  # a hang only
    return process.returncode, first, err


# A model of 121 layers without torchvision's import (resnet18's was a second of the run): its
# summary table, 12 KB, outlasts the pipe's page.
DEEP = """
from torch import nn


def build(num_classes=2):
    return nn.Sequential(*[nn.Linear(12, 12) for _ in range(120)], nn.Linear(12, num_classes))
"""


def test_a_rich_table_and_the_help_into_a_closed_pipe_exit_141_silently(tmp_path):
    # The help first (this module's first process, above the predict's): where the test runs
    # under PYTHONUNBUFFERED, these processes' environment (without it) is a new one, whose
    # first process starts fresh, and --help imports no torch; the later ones fork from a
    # preloaded torch.
    code, first, err = read_first_line_and_close("train", "--help")
    assert code == BROKEN_PIPE_EXIT and err == "", err
    (tmp_path / "deep.py").write_text(DEEP)
    code, first, err = read_first_line_and_close(
        "summary", "deep:build", "--input-size", "12", cwd=tmp_path
    )
    assert first.startswith("Sequential on input")
    assert code == BROKEN_PIPE_EXIT, err
    assert not any(word in err for word in NOISE), err


def test_predict_into_a_closed_pipe_exits_141_silently_and_stops_its_workers(tmp_path):
    images = write_image_folder(tmp_path / "images", {"a": 150, "b": 150})
    code, first, err = read_first_line_and_close(
        "predict", "convnet", str(images), "--allow-untrained", "--format", "csv",
        "-b", "1", "-j", "2", "--quiet",
    )  # fmt: skip
    assert first.startswith("path,")
    assert code == BROKEN_PIPE_EXIT, err
    assert err == ""
