"""Training on a CUDA GPU (issue #30): a bf16 step through the JPEG path that `--decode auto`
picks there (nvJPEG), torchrun with one process, and NCCL's collectives on the GPU.
Each carries the `cuda` marker: `uv run pytest -m cuda` on a machine with a CUDA GPU."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from photos import jpeg_split_folder
from suite_paths import HELPERS, REPO

from torchkit.cli import app

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = [pytest.mark.cuda, needs_cuda]

RECIPE = ["--model", "resnet18", "--image-size", "32", "--batch-size", "8", "--epochs", "1",
          "--workers", "2", "--warmup-epochs", "0", "--format", "json"]  # fmt: skip


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu-jpegs")
    jpeg_split_folder(root, train=8, val=2, size=(120, 90))
    return root


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [tensor for value in obj for tensor in _tensors(value)]
    return []


def _rows(out: Path) -> list[dict]:
    with (out / "metrics.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_bf16_training_on_cuda_decodes_jpegs_on_the_gpu(runner, jpegs, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--data", str(jpegs), *RECIPE, "--device", "cuda", "--amp",
            "--channels-last", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["amp_dtype"] == "bfloat16"  # native bf16 from Ampere on: no GradScaler
    # --decode auto, on CUDA from JPEG files: nvJPEG.
    assert config["options"]["decode"] == "device" and "decode" in config["defaults_from_data"]
    checkpoint = torch.load(out / "last.pt", weights_only=True)  # no map_location
    assert not checkpoint.get("scaler")
    # CPU tensors only: the checkpoint loads as it is on a machine without a GPU.
    assert all(tensor.device.type == "cpu" for tensor in _tensors(checkpoint))
    rows = _rows(out)
    assert len(rows) == 1 and math.isfinite(float(rows[0]["train_loss"]))


def test_nccl_collectives_on_the_gpu():
    """A one-GPU machine cannot hold two NCCL ranks (one GPU each), so the NCCL group here is the
    caller's own, of one process, which `setup` joins as it is."""
    from torchkit.core.runtime import distributed

    port = 29_500 + os.getpid() % 1000
    torch.distributed.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )
    try:
        ctx = distributed.setup("cuda")
        assert ctx.backend == "nccl" and ctx.device.type == "cuda"
        assert distributed.all_reduce_sum(ctx, [1.0, 2.5]) == [1.0, 2.5]
        assert distributed.all_reduce_max(ctx, [3.0]) == [3.0]
        assert distributed.broadcast_from_main(ctx, {"epoch": 2}) == {"epoch": 2}
        distributed.teardown(ctx)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_torchrun_with_one_nccl_process_trains(jpegs, tmp_path):
    out = tmp_path / "ddp"
    env = {**os.environ, "PYTHONPATH": str(HELPERS), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
         "-m", "torchkit", "train", "--data", str(jpegs), *RECIPE, "--amp", "--out", str(out)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["world_size"] == 1
    assert (out / "best.pt").is_file() and len(_rows(out)) == 1


def test_cudnn_benchmark_drops_the_partial_batch_and_no_cudnn_benchmark_keeps_it(
    runner, jpegs, tmp_path
):
    # 16 training images (8 a class) in batches of 6: 2 full batches and a partial one of 4
    # (not of 1, which a model with BatchNorm leaves out whatever the flag: test_batch_sizes.py).
    for flag, drop, steps in (("--cudnn-benchmark", True, 2), ("--no-cudnn-benchmark", False, 3)):
        out = tmp_path / flag
        args = ["train", "--data", str(jpegs), *RECIPE, "--batch-size", "6", "--device", "cuda",
                flag, "--out", str(out)]  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.stderr
        checkpoint = torch.load(out / "last.pt", weights_only=True)
        assert checkpoint["drop_last"] is drop
        assert checkpoint["global_step"] == steps
        assert not torch.backends.cudnn.benchmark  # the run put torch's switch back


def test_cudnn_benchmark_limit_is_the_runs_and_put_back(runner, jpegs, tmp_path, monkeypatch):
    from torchkit.core.train import setup

    seen = []
    real = setup.set_cudnn_switches

    def spy(device_type, config):
        real(device_type, config)
        seen.append((torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit))

    monkeypatch.setattr(setup, "set_cudnn_switches", spy)
    before = torch.backends.cudnn.benchmark_limit
    args = ["train", "--data", str(jpegs), *RECIPE, "--device", "cuda",
            "--cudnn-benchmark-limit", "2", "--out", str(tmp_path / "run")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert seen == [(True, 2)] and torch.backends.cudnn.benchmark_limit == before


def test_a_run_readies_the_decoder_during_its_set_up(runner, jpegs, tmp_path, monkeypatch):
    # With no budget for decoded batches (nothing decoded early), a warm-up thread readies the
    # decoder with the first training JPEG.
    from torchkit.core.data import decode_ahead, decoder_warm_up

    warmed = []
    real = decoder_warm_up.start_decoder_warm_up

    def spy(ready):
        path, device, size, _ = ready.args  # functools.partial(ready_decoder, ...)
        warmed.append((path, torch.device(device).type, size))
        return real(ready)

    monkeypatch.setattr(decoder_warm_up, "start_decoder_warm_up", spy)
    monkeypatch.setattr(decode_ahead, "ahead_budget", lambda device: 0)
    out = tmp_path / "run"
    args = ["train", "--data", str(jpegs), *RECIPE, "--device", "cuda", "--out", str(out), "-v"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    ((path, device, size),) = warmed
    assert path.startswith(str(jpegs / "train")) and path.endswith(".jpg")
    assert (device, size) == ("cuda", 32)
    assert "starting the workers" in result.stderr and len(_rows(out)) == 1


def test_a_run_decodes_epoch_1_during_its_set_up(runner, jpegs, tmp_path, monkeypatch):
    # By default (a budget of decoded batches) epoch 1's batches are decoded on the GPU while
    # the model is built: the loop gets a DecodedAhead already started, and no warm-up runs.
    from torchkit.core.data import decode_ahead, decoder_warm_up
    from torchkit.core.train import epochs

    warmed, got = [], []
    real_epoch = epochs.train_one_epoch

    def train_one_epoch(ctx, batches, *args, **kwargs):
        got.append(isinstance(batches, decode_ahead.DecodedAhead) and bool(batches._started))
        return real_epoch(ctx, batches, *args, **kwargs)

    monkeypatch.setattr(decoder_warm_up, "start_decoder_warm_up", warmed.append)
    monkeypatch.setattr(epochs, "train_one_epoch", train_one_epoch)
    assert decode_ahead.ahead_budget("cuda") > 0
    out = tmp_path / "run"
    args = ["train", "--data", str(jpegs), *RECIPE, "--device", "cuda", "--out", str(out), "-v"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert got == [True] and warmed == []
    assert "batches ready when the epoch began" in result.stderr and len(_rows(out)) == 1
