"""What the resume tests share: the recipe of a run that exercises every random draw and the
bitwise comparison of two of its checkpoints (train/test_train_resume.py, and the resumes of
parquet and streamed shard data), and the runs on a folder and on an index beside it that the
resumes on another spelling of the same images copy."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


def runs_on_folder_and_index(
    root: Path, data: Path, index: Path, train: Callable[..., Any], options: Sequence[str]
) -> tuple[Path, Path]:
    """(a run started on the folder `data`, one started on the CSV `index` of its images), each
    `train(--data SPEC, *options, --out RUN)` in `root`, for the resume-on-another-spelling
    tests to copy."""
    runs = root / "on-folder", root / "on-index"
    for spec, run in zip((data, index), runs, strict=True):
        result = train("--data", spec, *options, "--out", run)
        assert result.exit_code == 0, result.stderr
    return runs


def copied_project(
    data: Path, on_folder: Path, on_index: Path, into: Path
) -> tuple[Path, Path, Path]:
    """A copy in `into` of `data`'s parent folder (the data, the index beside it) and of both
    runs (`runs_on_folder_and_index`): (the data, the run on the folder, the run on the index)."""
    project = Path(shutil.copytree(data.parent, into / "project"))
    return (
        project / data.name,
        Path(shutil.copytree(on_folder, into / "on-folder")),
        Path(shutil.copytree(on_index, into / "on-index")),
    )
