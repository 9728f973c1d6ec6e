"""eval, predict and extract-features fork their DataLoader workers before any thread of the
command exists (train's: train/test_train_worker_forks.py): a process forked beside a thread may
deadlock in the child on a lock that thread held (Python 3.12+ warns of it: "This process is
multi-threaded, use of fork() may lead to deadlocks"). They loaded the model on torch's threads
first, and its weights' copies started OpenMP's pool, whose threads the workers were forked
beside. An ONNX model's onnxruntime started threads as the model was read (importing it starts
one, its session a pool): the file is read with onnx, its session made at the first batch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sklearn.metrics  # noqa: F401 - eval scores in this process, with no helper to wait for
import torch
from checkpoints import write_convnet_checkpoint
from process_threads import thread_ids
from processes import run_torchkit_in_process

from torchkit.cli import app

pytestmark = pytest.mark.skipif(
    not hasattr(os, "register_at_fork") or not os.path.isdir("/proc/self/task"),
    reason="Linux forks (the process's threads in /proc)",
)

# torch's thread count while a test watches: more than any OpenMP pool the tests before it
# started (a pool, once started, stays), so that a copy on every thread starts new threads.
_threads_watched = [8]  # one more at each test
_watch: dict = {}  # while a test watches: "before" (the threads then) and "forks"


def _note_fork() -> None:
    if "forks" in _watch:
        _watch["forks"].append(sorted(thread_ids() - _watch["before"]))


if hasattr(os, "register_at_fork"):  # once per process; idle unless a test watches
    os.register_at_fork(before=_note_fork)


@pytest.fixture
def model(tmp_path) -> Path:
    """A checkpoint with a layer of 294,912 weights (16x16 inputs): loaded, it is copied on
    every thread. Written before any test watches (writing it starts threads of its own)."""
    path = tmp_path / "model.pt"
    write_convnet_checkpoint(path, in_channels=3, image_size=16, classes="ab")
    return path


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory) -> Path:
    """`model`'s convnet exported to ONNX, unverified (verifying would import onnxruntime
    here), once for the module."""
    folder = tmp_path_factory.mktemp("onnx")
    write_convnet_checkpoint(folder / "model.pt", in_channels=3, image_size=16, classes="ab")
    result = run_torchkit_in_process(
        "export", folder / "model.pt", folder / "model.onnx", "--no-verify"
    )
    assert result.returncode == 0, result.stderr
    return folder / "model.onnx"


@pytest.fixture
def forks(model, image_folder):
    """The threads started since the test began that run beside each fork, one list a fork."""
    before = torch.get_num_threads()
    _threads_watched[0] += 1
    torch.set_num_threads(_threads_watched[0])
    _watch.update(before=thread_ids(), forks=[])
    try:
        yield _watch["forks"]
    finally:
        _watch.pop("forks", None)
        torch.set_num_threads(before)


def _command(command: str, model: Path, images: object, out: Path) -> list[object]:
    if command == "eval":
        return ["eval", model, "--data", images, "-j", 2, "-o", f"{out}.json"]
    if command == "predict":
        return ["predict", model, images, "-j", 2, "-o", f"{out}.csv"]
    return ["extract-features", model, images, out, "-j", 2]


@pytest.mark.parametrize("command", ["eval", "predict", "extract-features"])
def test_workers_are_forked_before_the_model_starts_a_thread(
    command, forks, model, image_folder, tmp_path
):
    result = run_torchkit_in_process(*_command(command, model, image_folder, tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert forks == [[], []], forks  # two workers, no thread beside either


@pytest.mark.parametrize("command", ["eval", "predict"])
def test_workers_are_forked_before_an_onnx_model_starts_a_thread(
    command, onnx_model, forks, image_folder, tmp_path
):
    result = run_torchkit_in_process(*_command(command, onnx_model, image_folder, tmp_path / "o"))
    assert result.returncode == 0, result.stderr
    assert forks == [[], []], forks


@pytest.mark.parametrize("command", ["predict", "extract-features"])
def test_streamed_workers_are_forked_before_the_model_starts_a_thread(
    command, forks, model, image_folder, tmp_path, runner
):
    """Paths on stdin: the persistent workers are forked before the first paths are read."""
    paths = sorted(str(path) for path in image_folder.rglob("*.png"))
    args = [str(arg) for arg in _command(command, model, "-", tmp_path / "out")]
    result = runner.invoke(app, args, input="\n".join(paths))
    assert result.exit_code == 0, result.stderr
    assert forks == [[], []], forks
