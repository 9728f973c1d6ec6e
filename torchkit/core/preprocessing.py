"""`--image-size/--resize-size/--mean/--std` given on the command line, applied on top of the
preprocessing a model comes with (its checkpoint's, its torchvision weights', or ImageNet's)."""

from __future__ import annotations

from dataclasses import replace

from torchkit.core.data import Preprocess
from torchkit.core.errors import UsageError


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
        ratio = preprocess.resize_size / preprocess.image_size
        result = replace(result, image_size=image_size, resize_size=round(image_size * ratio))
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
    if len(values) == 1:
        return tuple(values) * channels
    if len(values) != channels:
        raise UsageError(
            f"{option} has {len(values)} values but the images have {channels} channels",
            f"give 1 or {channels} comma-separated values",
        )
    return tuple(float(v) for v in values)


def parse_floats(text: str | None, option: str) -> tuple[float, ...] | None:
    """`0.485,0.456,0.406` (commas or spaces) -> a tuple of floats."""
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
    return values
