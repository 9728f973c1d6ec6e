"""`torchrun --nproc_per_node=2 -m torchkit train` on CPUs (Gloo): it trains, only rank 0
writes and prints, and the result matches one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, write_image_folder

from torchkit.cli import app

TESTS = Path(__file__).resolve().parent


def recipe(data: Path, out: Path, batch_size: int) -> list[str]:
    # Augmentation stays on (random crops and flips): it is seeded per image, so two processes
    # see exactly the images one process sees. TinyNet has no dropout or BatchNorm, whose
    # per-process randomness and batch statistics would legitimately differ.
    return [
        "train", "--data", str(data), "--model", "test_train_nets:TinyNet", "--image-size", "8",
        "--batch-size", str(batch_size), "--epochs", "2", "--optimizer", "sgd", "--lr", "0.2",
        "--workers", "0", "--device", "cpu", "--out", str(out), "--format", "json",
    ]  # fmt: skip


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tmp_path, runner):
    data = tmp_path / "data"
    write_image_folder(data / "train", {"a": 8, "b": 8}, seed=1)  # 2 global batches of 8
    write_image_folder(data / "val", {"a": 3, "b": 2}, seed=2)  # odd: uneven shards
    write_image_folder(data / "test", {"a": 2, "b": 3}, seed=3)

    single = runner.invoke(app, recipe(data, tmp_path / "single", batch_size=8))
    assert single.exit_code == 0, single.stderr

    env = {**os.environ, "PYTHONPATH": str(TESTS), "OMP_NUM_THREADS": "1"}
    env.pop("TORCHKIT_DEBUG", None)
    out = tmp_path / "ddp"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "torchkit", *recipe(data, out, batch_size=4)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    # Rank 0 alone printed the summary and wrote one set of files.
    summary = json.loads(done.stdout)
    assert summary["world_size"] == 2
    assert done.stderr.count("epoch 2/2") == 1
    assert sorted(p.name for p in out.iterdir()) == [
        ".torchkit",
        "best.pt",
        "config.json",
        "curves.png",
        "last.pt",
        "metrics.csv",
        "split.csv",
    ]
    # One split.csv, rank 0's, the same as the single process's.
    assert (out / "split.csv").read_text() == (tmp_path / "single" / "split.csv").read_text()
    config = json.loads((out / "config.json").read_text())
    assert (config["world_size"], config["global_batch_size"]) == (2, 8)

    reference = json.loads(single.stdout)
    ours = torch.load(out / "last.pt", weights_only=True)
    theirs = torch.load(tmp_path / "single" / "last.pt", weights_only=True)
    assert ours["global_step"] == theirs["global_step"] == 4
    for key, value in theirs["model"].items():
        assert torch.allclose(ours["model"][key], value, atol=1e-5), key
    for ddp_row, row in zip(summary["history"], reference["history"], strict=True):
        topk = f"val_top{summary['topk']}"  # named for the k used
        for name in ("train_loss", "train_top1", "val_loss", "val_top1", topk):
            assert ddp_row[name] == pytest.approx(row[name], abs=1e-5), name
    assert summary["test_top1"] == pytest.approx(reference["test_top1"], abs=1e-9)
    assert summary["test_size"] == reference["test_size"] == 5


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_a_refusal_on_rank_0_is_an_error_on_every_rank_not_a_hang(tmp_path):
    """Only rank 0 checks and locks the run folder: when it is refused (here: locked by another
    process), every rank ends with the same error instead of waiting for rank 0 forever."""
    from torchkit.core.outputs import FolderLock

    data = tmp_path / "data"
    write_image_folder(data / "train", {"a": 2, "b": 2}, seed=1)
    write_image_folder(data / "val", {"a": 1, "b": 1}, seed=2)
    out = tmp_path / "run"
    lock = FolderLock(out, "run folder")  # this test process is "the other torchkit run"
    try:
        env = {**os.environ, "PYTHONPATH": str(TESTS), "OMP_NUM_THREADS": "1"}
        env.pop("TORCHKIT_DEBUG", None)
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
             "-m", "torchkit", *recipe(data, out, batch_size=2)],
            capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
        )  # fmt: skip
    finally:
        lock.release()
    assert done.returncode != 0
    refusal = f"being written by another torchkit process (PID {os.getpid()})"
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 2 and all(refusal in line for line in errors), done.stderr[-3000:]
    assert not out.exists()
