"""`--image-size/--resize-size/--mean/--std` given on the command line, applied on top of the
preprocessing a model comes with (its checkpoint's, its torchvision weights', or ImageNet's)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

from torchkit.core.data import Preprocess
from torchkit.core.errors import InputError, UsageError


def apply_overrides(
    preprocess: Preprocess,
    *,
    image_size: int | None = None,
    resize_size: int | None = None,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
) -> Preprocess:
    """`--image-size/--resize-size/--mean/--std` on top of the model's preprocessing.

    A new `--image-size` keeps the model's resize-to-crop ratio (256/224 for ImageNet models)
    unless `--resize-size` is given too. One mean/std value is used for every channel.
    """
    result = preprocess
    if image_size is not None:
        if image_size < 1:
            raise UsageError(f"--image-size must be positive, not {image_size}")
        resize = preprocess.resize_size  # kept when the model's sizes give no ratio to keep
        if preprocess.image_size > 0 and preprocess.resize_size > 0:
            ratio = preprocess.resize_size / preprocess.image_size
            resize = max(1, round(image_size * ratio))
        result = replace(result, image_size=image_size, resize_size=resize)
    if resize_size is not None:
        if resize_size < 1:
            raise UsageError(f"--resize-size must be positive, not {resize_size}")
        result = replace(result, resize_size=resize_size)
    channels = result.in_channels
    if mean is not None:
        result = replace(result, mean=_per_channel(mean, channels, "--mean"))
    if std is not None:
        values = _per_channel(std, channels, "--std")
        if any(v <= 0 for v in values):
            raise UsageError(f"--std values must be positive, not {list(values)}")
        result = replace(result, std=values)
    return result


def _per_channel(values: tuple[float, ...], channels: int, option: str) -> tuple[float, ...]:
    if not values or not all(math.isfinite(v) for v in values):
        raise UsageError(f"{option} must be finite numbers, not {list(values)}")
    if len(values) == 1:
        return tuple(values) * channels
    if len(values) != channels:
        raise UsageError(
            f"{option} has {len(values)} values but the images have {channels} channels",
            f"give 1 or {channels} comma-separated values",
        )
    return tuple(float(v) for v in values)


def parse_floats(
    text: str | None, option: str, count: int | None = None
) -> tuple[float, ...] | None:
    """`0.485,0.456,0.406` (commas or spaces) -> a tuple of floats (exactly `count` if given)."""
    if text is None:
        return None
    parts = [p for p in text.replace(",", " ").split() if p]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError as error:
        raise UsageError(
            f"{option} must be numbers like 0.485,0.456,0.406, not {text!r}"
        ) from error
    if not values:
        raise UsageError(f"{option} needs at least one number")
    if count is not None and len(values) != count:
        raise UsageError(f"{option} needs {count} numbers, not {text!r}")
    if not all(math.isfinite(v) for v in values):
        raise UsageError(f"{option} must be finite numbers, not {text!r}")
    return values


def read_stats_file(path: str | os.PathLike) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) from `torchkit dataset-stats --format json -o FILE`, for `--stats FILE`."""
    source = Path(path)
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"stats file not found: {source}") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise InputError(
            f"cannot read stats file {source}: {type(error).__name__}",
            "write it with `torchkit dataset-stats ROOT --format json -o FILE`",
        ) from error
    mean = data.get("mean") if isinstance(data, dict) else None
    std = data.get("std") if isinstance(data, dict) else None
    if not _numbers(mean) or not _numbers(std) or len(mean) != len(std):
        raise InputError(
            f"{source} has no per-channel mean and std",
            "write it with `torchkit dataset-stats ROOT --format json -o FILE`",
        )
    if len(mean) not in (1, 3):
        mode = data.get("mode", "?")
        raise InputError(
            f"{source} has statistics for {len(mean)} channels (mode {mode}), not 1 or 3",
            "compute them with `torchkit dataset-stats --mode rgb` or `--mode gray`",
        )
    if any(v <= 0 for v in std):
        raise InputError(f"{source} has a std of 0: some channel is constant in that data")
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def _numbers(values) -> bool:
    return (
        isinstance(values, list)
        and len(values) > 0
        and all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)
    )


def mean_std_options(
    mean: str | None, std: str | None, stats: str | os.PathLike | None
) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """`--mean`, `--std` and `--stats FILE` (which stands for both) as numbers."""
    if stats is not None:
        if mean is not None or std is not None:
            raise UsageError("--stats gives the mean and std: drop --mean/--std, or drop --stats")
        return read_stats_file(stats)
    return parse_floats(mean, "--mean"), parse_floats(std, "--std")
