"""The CPU threads torch computes with in every command that runs a model (core.runtime.threads;
train's are in train/test_train_threads.py): the cores the loader workers leave free, one for the
digits, OMP_NUM_THREADS where set. eval, predict and extract-features ran on torch's one thread
per core beside their loader worker (on 2 cores, 3 busy threads: a third of the one-thread speed
on a busy machine)."""

from __future__ import annotations

import pytest
import torch
from checkpoints import write_convnet_checkpoint
from processes import run_torchkit_in_process

from torchkit.core.runtime import threads as thread_policy
from torchkit.core.runtime.threads import compute_threads, torch_threads

CORES = 3  # the usable cores the tests pretend to have


@pytest.fixture
def seen(monkeypatch):
    """torch's thread count at every convolution the command runs, on CORES cores with no
    OMP_NUM_THREADS (the suite sets it), and the process's own count checked afterwards."""
    counts: list[int] = []
    forward = torch.nn.Conv2d.forward

    def counting(self, x):
        counts.append(torch.get_num_threads())
        return forward(self, x)

    monkeypatch.setattr(torch.nn.Conv2d, "forward", counting)
    monkeypatch.setattr(thread_policy, "usable_cpus", lambda: CORES)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # not the one thread the suite runs on, which the digits get
    try:
        yield counts
        assert torch.get_num_threads() == 2  # put back
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.pt"
    write_convnet_checkpoint(path, in_channels=3, image_size=8, classes="ab")
    return path


def _inference(command: str, model, images, out, workers: int) -> list[object]:
    if command == "eval":
        return ["eval", model, "--data", images, "-j", workers, "-o", f"{out}.json"]
    if command == "predict":
        return ["predict", model, images, "-j", workers, "-o", f"{out}.csv"]
    return ["extract-features", model, images, out, "-j", workers]


@pytest.mark.parametrize("command", ["eval", "predict", "extract-features"])
def test_inference_computes_on_the_cores_its_workers_leave(
    command, seen, model, image_folder, tmp_path
):
    for workers in (0, 1):
        seen.clear()
        out = tmp_path / f"out{workers}"
        result = run_torchkit_in_process(*_inference(command, model, image_folder, out, workers))
        assert result.returncode == 0, result.stderr
        assert set(seen) == {CORES - workers}, workers


@pytest.mark.parametrize("command", ["eval", "predict", "extract-features"])
def test_inference_on_the_digits_computes_on_one_thread(command, seen, tmp_path):
    digits = tmp_path / "digits.pt"
    write_convnet_checkpoint(digits, in_channels=1, image_size=8, classes="0123456789")
    args = _inference(command, digits, "digits", tmp_path / "out", 0)
    result = run_torchkit_in_process(*args, "--split", "test")
    assert result.returncode == 0, result.stderr
    assert seen and set(seen) == {1}


def test_omp_num_threads_leaves_torchs_count(seen, model, image_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    result = run_torchkit_in_process(*_inference("predict", model, image_folder, tmp_path, 1))
    assert result.returncode == 0, result.stderr
    assert set(seen) == {before}


def test_benchmark_and_summary_compute_on_every_core(seen, model):
    for args in (
        ["summary", model],
        ["benchmark", model, "--batch-size", "2", "--seconds", "0.01", "--warmup", "0"],
    ):
        seen.clear()
        result = run_torchkit_in_process(*args)
        assert result.returncode == 0, result.stderr
        assert seen and set(seen) == {CORES}, args[0]


def test_the_policy():
    assert compute_threads(0, 4) == 4 and compute_threads(7, 0) is None  # --threads
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(thread_policy, "usable_cpus", lambda: 2)
        patch.delenv("OMP_NUM_THREADS", raising=False)
        assert [compute_threads(workers) for workers in (0, 1, 2, 8)] == [2, 1, 1, 1]
        assert compute_threads(0, tiny_inputs=True) == 1
        patch.setenv("OMP_NUM_THREADS", "2")
        assert compute_threads(0) is None and compute_threads(0, tiny_inputs=True) is None
    before = torch.get_num_threads()
    with torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    with torch_threads(None):
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before
