"""What the exact-resume tests share (train/test_train_resume.py, and the resumes of parquet and
streamed shard data): the recipe of a run that exercises every random draw, and the bitwise
comparison of two of its checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch


def recipe(data: Path, out: Path, workers: int) -> list[str]:
    return [
        "train", "--data", str(data), "--model", "nets:NoisyNet", "--image-size",
        "8", "--batch-size", "4", "--epochs", "3", "--deterministic", "--seed", "7",
        "--mixup-alpha", "0.4", "--ema", "--lr", "0.01", "--workers", str(workers),
        "--out", str(out), "--device", "cpu",  # bitwise comparisons: the CPU's kernels
    ]  # fmt: skip


def assert_bitwise_equal(ours: dict, reference: dict) -> None:
    assert ours["epoch"] == reference["epoch"] == 3
    assert ours["global_step"] == reference["global_step"]
    for part in ("model", "model_ema"):
        for key, value in reference[part].items():
            assert torch.equal(ours[part][key], value), f"{part}.{key}"
    for index, state in reference["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(ours["optimizer"]["state"][index][name], value), name
    assert _without_timings(ours["history"]) == _without_timings(reference["history"])


def _without_timings(history: list[dict]) -> list[dict]:
    return [
        {k: v for k, v in row.items() if k not in ("epoch_time_s", "images_per_s")}
        for row in history
    ]


def stderr_of(result) -> str:
    return result.stderr + (repr(result.exception) if result.exception else "")
