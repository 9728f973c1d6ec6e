"""What preprocessing a model expects (`Preprocess`, recorded in every checkpoint and exported
model), and `--image-size/--resize-size/--mean/--std` given on the command line, applied on top
of the preprocessing a model comes with (its checkpoint's, its torchvision weights', or
ImageNet's)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torchkit.core.io.errors import CheckpointError, InputError, UsageError, short_repr
from torchkit.core.io.option_lists import number_items
from torchkit.core.io.sizes import gigabytes_text
from torchkit.core.io.wording import counted
from torchkit.core.runtime.memory import CGROUP, CGROUP_LIMIT, memory_total

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
# What a model file may record: the --interpolation choices and PIL's other filters, which every
# eval path resizes with (torchvision's InterpolationMode and PIL's Resampling both name them).
RECORDED_INTERPOLATIONS = (*INTERPOLATIONS, "lanczos", "box", "hamming")
# How the eval transform fits an image to the crop (timm's crop modes, `core.eval_crop`): the
# shorter side resized then centre-cropped, both sides resized, or the longer side resized and
# the rest padded. A model file that records none is `center`, as it was evaluated before.
CROP_MODES = ("center", "squash", "border")
# The largest finite float32, the type images are normalised in.
FLOAT32_MAX = 3.4028234663852886e38
# The share of the resized image an eval centre crop keeps where nothing records the resize:
# torchvision's 224 of 256, timm's default crop_pct.
CROP_FRACTION = 0.875
# Mode PIL converts images to for a given channel count.
IMAGE_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def image_mode(in_channels: int) -> str:
    """The PIL mode images are fed to a model with `in_channels` input channels in (L, RGB,
    RGBA): the one rule of eval, predict and extract-features. Other counts are a UsageError."""
    mode = IMAGE_MODES.get(in_channels)
    if mode is None:
        raise UsageError(f"cannot feed images to a model with {in_channels} channels")
    return mode


def resize_for_crop(image_size: int) -> int:
    """The side images are resized to before a centre crop of `image_size` when nothing says
    otherwise: image_size / 0.875 (torchvision's 256 for 224, timm's crop_pct)."""
    return int(round(image_size / CROP_FRACTION))


@dataclass
class Preprocess:
    """What eval-time preprocessing a model expects; stored in every torchkit checkpoint."""

    image_size: int = 224
    resize_size: int = 256
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    in_channels: int = 3
    interpolation: str = "bilinear"
    crop_mode: str = "center"

    def to_dict(self) -> dict:
        return {
            "image_size": self.image_size,
            "resize_size": self.resize_size,
            "mean": list(self.mean),
            "std": list(self.std),
            "in_channels": self.in_channels,
            "interpolation": self.interpolation,
            "crop_mode": self.crop_mode,
        }

    @classmethod
    def from_dict(cls, data: dict | None, source: str | None = None) -> Preprocess:
        """The preprocessing a checkpoint or an exported file records (`to_dict`'s keys; a
        missing one takes the default, a missing resize_size the recorded image_size's,
        `resize_for_crop`). A value of the wrong kind (a size that is not a whole
        number, a mean that is not numbers) is a CheckpointError naming `source` (the file;
        "the model's file" when not given) and the field. Whether the values can be used is
        `check`'s question: commands that feed images ask it once overrides are applied."""
        data = data or {}
        default = cls()
        where = source or "the model's file"
        if not isinstance(data, Mapping):
            raise CheckpointError(
                f"the preprocessing recorded in {where} is unusable: it is a "
                f"{type(data).__name__}, not a table of values",
                "the file is damaged or was not written by torchkit",
            )

        def bad(name: str, why: str) -> CheckpointError:
            return CheckpointError(
                f"the preprocessing recorded in {where} is unusable: {name} is "
                f"{_shown_value(data.get(name))}, {why}",
                "the file is damaged or was not written by torchkit",
            )

        def whole(name: str, fallback: int) -> int:
            value = data.get(name, fallback)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad(name, "not a whole number")
            if isinstance(value, float) and not value.is_integer():
                raise bad(name, "not a whole number")
            # No torchkit writes a size or channel count below 1, and the model is built from
            # them before any option could stand in: 0 or -3 channels failed as a tensor of
            # negative dimension, or as weights that do not fit, in export and summary.
            if value < 1:
                raise bad(name, "not a positive whole number")
            return int(value)

        def numbers(name: str, fallback: tuple[float, ...]) -> tuple[float, ...]:
            values = data.get(name, fallback)
            if isinstance(values, (int, float)) and not isinstance(values, bool):
                values = [values]
            try:
                if isinstance(values, (str, bytes, dict)) or any(
                    isinstance(v, (bool, str, bytes)) for v in values
                ):
                    raise TypeError(name)
                return tuple(float(v) for v in values)
            except (TypeError, ValueError):
                raise bad(name, "not a list of numbers") from None

        channels = whole("in_channels", default.in_channels)
        mean, std = default.mean, default.std
        if channels != len(mean):  # not recorded: ImageNet's, averaged over a non-RGB stem's
            mean, std = (sum(mean) / len(mean),) * channels, (sum(std) / len(std),) * channels
        image_size = whole("image_size", default.image_size)
        # A crop recorded without its resize (a hand-made checkpoint) is resized in proportion:
        # 256 before an 8 px crop showed the model a 32x smaller view than the image.
        resize_size = default.resize_size
        if "image_size" in data and image_size > 0:
            resize_size = resize_for_crop(image_size)
        return cls(
            image_size=image_size,
            resize_size=whole("resize_size", resize_size),
            mean=numbers("mean", mean),
            std=numbers("std", std),
            in_channels=channels,
            interpolation=str(data.get("interpolation", default.interpolation)),
            crop_mode=str(data.get("crop_mode", default.crop_mode)),
        )

    def problem(self) -> tuple[str, str] | None:
        """(field, what is wrong with it) for the first value images cannot be preprocessed
        with, None when all can: sizes and channels positive whole numbers, mean and std one
        finite value per input channel (or one for all), std above 0 (dividing by 0 turns
        every pixel into inf or NaN), an interpolation images can be resized with, a crop
        mode of CROP_MODES."""
        for name in ("image_size", "resize_size", "in_channels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return name, f"{name} is {value!r}, not a positive whole number"
        for name in ("mean", "std"):
            values = list(getattr(self, name))
            if len(values) not in (1, self.in_channels):
                return name, (
                    f"{name} has {len(values)} value(s) for {self.in_channels}-channel images "
                    f"({_shown_value(values)})"
                )
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                return name, f"{name} {_shown_value(values)} is not all finite numbers"
        if any(v <= 0 for v in self.std):
            return "std", (
                f"std {_shown_value(list(self.std))} has a value that is not above 0 (images "
                "would be divided by it)"
            )
        if self.interpolation not in RECORDED_INTERPOLATIONS:
            return "interpolation", (
                f"interpolation {self.interpolation!r} is not one of "
                + ", ".join(RECORDED_INTERPOLATIONS)
            )
        if self.crop_mode not in CROP_MODES:
            return "crop_mode", (
                f"crop_mode {self.crop_mode!r} is not one of " + ", ".join(CROP_MODES)
            )
        return None

    def check(self, source: str) -> Preprocess:
        """`self`, or a CheckpointError naming `source` (the model file it came from) and the
        first unusable value (see `problem`): one error before any image is read, instead of
        every image failing, or a shape error after the output has begun."""
        found = self.problem()
        if found is not None:
            name, what = found
            option = {
                "image_size": "--image-size",
                "resize_size": "--resize-size",
                "crop_mode": "--crop-mode",
            }.get(name, f"--{name}")
            raise CheckpointError(
                f"the preprocessing recorded in {source} is unusable: {what}",
                f"it is the model file's fault, not the images'; give {option} to override it"
                if name != "in_channels"
                else "the file is damaged or was not written by torchkit",
            )
        return self


def _shown_value(value: Any) -> str:
    """A recorded value for a message: short, lists as lists, floats as written."""
    if isinstance(value, (list, tuple)):
        shown = [float(v) if isinstance(v, (int, float)) else v for v in list(value)[:8]]
        return repr(shown)[:-1] + (", ...]" if len(value) > 8 else "]")
    return repr(value)


def apply_overrides(
    preprocess: Preprocess,
    *,
    image_size: int | None = None,
    resize_size: int | None = None,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    crop_mode: str | None = None,
    interpolation: str | None = None,
    stats: str | None = None,
) -> Preprocess:
    """`--image-size/--resize-size/--mean/--std/--crop-mode/--interpolation` on top of the
    model's preprocessing.

    A new `--image-size` keeps the model's resize-to-crop ratio (256/224 for ImageNet models)
    unless `--resize-size` is given too. One mean/std value is used for every channel.
    `stats`: the file (`--stats FILE`) `mean` and `std` were read from, which their errors
    name, as the user gave that and not --mean/--std.
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
    if image_size is not None or resize_size is not None:
        # Refused only where the user's sizes make the crop larger than the resized image (it
        # would be padded with zeros): a model that records such sizes still loads.
        own = 0 < preprocess.resize_size < preprocess.image_size
        if result.resize_size < result.image_size and (resize_size is not None or not own):
            raise UsageError(
                f"--resize-size {result.resize_size} is smaller than --image-size "
                f"{result.image_size}",
                "the centre crop must fit inside the resized image",
            )
        check_fits_in_memory(result, channels, resize_given=resize_size is not None)
    if mean is not None:
        result = replace(result, mean=_per_channel(mean, channels, "--mean", stats))
    if std is not None:
        values = _per_channel(std, channels, "--std", stats)
        if any(v <= 0 for v in values):
            raise UsageError(f"--std values must be positive, not {list(values)}")
        result = replace(result, std=values)
    if mean is not None or std is not None:
        check_normalization(result.mean, result.std)
    if crop_mode is not None:
        if crop_mode not in CROP_MODES:
            raise UsageError(f"unknown --crop-mode {crop_mode!r}", "use " + ", ".join(CROP_MODES))
        result = replace(result, crop_mode=crop_mode)
    if interpolation is not None:
        if interpolation not in INTERPOLATIONS:
            raise UsageError(
                f"unknown --interpolation {interpolation!r}", "use " + ", ".join(INTERPOLATIONS)
            )
        result = replace(result, interpolation=interpolation)
    return result


def check_normalization(mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    """Refuse a mean and (positive) std whose normalised pixels, (pixel - mean) / std for pixels
    in [0, 1], are not finite float32 numbers: a --mean of 1e308 is inf in float32 and a --std
    of 1e-40 makes every pixel inf, so the model's outputs are all NaN, blamed on the weights
    or on a diverged training run instead of on the option."""
    hint = "give the mean and std of pixel values in [0, 1], e.g. 0.485,0.456,0.406"
    for option, values in (("--mean", mean), ("--std", std)):
        if any(abs(v) > FLOAT32_MAX for v in values):
            raise UsageError(
                f"{option} {_shown(values)} does not fit in float32 (largest {FLOAT32_MAX:.3g}), "
                "which images are normalised in",
                hint,
            )
    farthest = max(max(abs(m), abs(1 - m)) for m in mean)
    if farthest / min(std) > FLOAT32_MAX:
        raise UsageError(
            f"--std {_shown(std)} is too small for --mean {_shown(mean)}: (pixel - mean) / std "
            f"reaches {farthest / min(std):.3g}, beyond float32's largest number "
            f"({FLOAT32_MAX:.3g})",
            hint,
        )


def _shown(values: tuple[float, ...]) -> str:
    return ",".join(f"{v:g}" for v in values)


def check_fits_in_memory(preprocess: Preprocess, channels: int, *, resize_given: bool) -> None:
    """`check_image_memory` for the sizes `apply_overrides` made, naming the option the user
    gave: `--resize-size N` where given (the larger side, as the crop must fit in it), else
    `--image-size N` and the resize its ratio made of it."""
    side = max(preprocess.image_size, preprocess.resize_size)
    image, resize = short_repr(preprocess.image_size), short_repr(preprocess.resize_size)
    if resize_given:
        shown = f"--resize-size {resize}"
    elif preprocess.resize_size > preprocess.image_size:
        shown = f"--image-size {image} (resized to {resize} first)"
    else:
        shown = f"--image-size {image}"
    check_image_memory(side, channels, shown)


def check_image_memory(side: int, channels: int, shown: str) -> None:
    """One `side`x`side` image in float32 fits in half the memory this process may have (the
    machine's, or its cgroup memory limit where less: a container's): a size beyond it
    (`--image-size 100000`, 120 GB an image) would have the kernel's OOM killer end a loader
    worker, the command, or another process, rather than give an error."""
    needed = max(channels, 3) * side * side * 4
    memory = memory_total()
    if memory is None:
        return  # no way to tell here
    if needed > memory / 2:
        if memory.bound == CGROUP:
            whose = f"the {gigabytes_text(memory)} {CGROUP_LIMIT}"
        else:
            whose = f"this machine's {gigabytes_text(memory, 0)}"
        raise UsageError(
            f"{shown} needs {gigabytes_text(needed)} for each image, more than half {whose}",
            "give a smaller size",
        )


def _per_channel(
    values: tuple[float, ...], channels: int, option: str, stats: str | None = None
) -> tuple[float, ...]:
    """`values` for each of `channels` (one value stands for all); `stats`: the --stats file
    they came from, else they are `option`'s."""
    if not values or not all(math.isfinite(v) for v in values):
        raise UsageError(f"{option} must be finite numbers, not {list(values)}")
    if len(values) == 1:
        return tuple(values) * channels
    if len(values) != channels:
        images = f"the images have {counted(channels, 'channel')}"  # as the model takes them
        if stats is not None:
            mode = {1: " --mode gray", 3: " --mode rgb"}.get(channels, "")
            raise UsageError(
                f"--stats {stats} holds a mean and std for {len(values)} channels but {images}",
                f"compute them for {counted(channels, 'channel')} with "
                f"`torchkit dataset-stats{mode} ROOT -o FILE.json`, or give --mean and --std",
            )
        raise UsageError(
            f"{option} has {counted(len(values), 'value')} but {images}",
            "give 1 value" if channels == 1 else f"give 1 or {channels} comma-separated values",
        )
    return tuple(float(v) for v in values)


def parse_floats(
    text: str | None, option: str, count: int | None = None, example: str | None = None
) -> tuple[float, ...] | None:
    """`0.485,0.456,0.406` (commas or spaces) -> a tuple of floats (exactly `count` if given);
    `example`: a value of the option for its error lines."""
    if text is None:
        return None
    if example is None:
        example = "0.485,0.456,0.406" if count is None else ",".join(["0.5"] * count)
    hint = f"give numbers like {example}"
    try:
        values = tuple(number_items(text, option, float, spaces=True, hint=hint))
    except ValueError as error:
        raise UsageError(
            f"{option} must be numbers like {example}, not {short_repr(text)}"
        ) from error
    if count is not None and len(values) != count:
        raise UsageError(f"{option} needs {count} numbers, not {short_repr(text)}")
    if not all(math.isfinite(v) for v in values):
        raise UsageError(f"{option} must be finite numbers, not {short_repr(text)}")
    return values


def read_stats_file(path: str | os.PathLike) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) from `torchkit dataset-stats ROOT -o FILE.json`, for `--stats FILE`."""
    source = Path(path)
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"stats file not found: {source}") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise InputError(
            f"cannot read stats file {source}: {type(error).__name__}",
            "write it with `torchkit dataset-stats ROOT -o FILE.json`",
        ) from error
    mean = data.get("mean") if isinstance(data, dict) else None
    std = data.get("std") if isinstance(data, dict) else None
    if not _numbers(mean) or not _numbers(std) or len(mean) != len(std):
        raise InputError(
            f"{source} has no per-channel mean and std",
            "write it with `torchkit dataset-stats ROOT -o FILE.json`",
        )
    if len(mean) not in (1, 3):
        mode = data.get("mode", "?")
        raise InputError(
            f"{source} has statistics for {len(mean)} channels (mode {mode}), not 1 or 3",
            "compute them with `torchkit dataset-stats --mode rgb` or `--mode gray`",
        )
    if any(v <= 0 for v in std):
        raise InputError(f"{source} has a std of 0: some channel is constant in that data")
    if any(not 0 <= v <= 1 for v in [*mean, *std]):
        # `dataset-stats --mode native` measures 32-bit images in their own values; the
        # loaders feed every image in [0, 1], which such a mean and std would not normalise.
        raise InputError(
            f"{source} has a mean or std outside [0, 1] (mode {data.get('mode', '?')}): "
            "statistics in the images' own values, not in the [0, 1] the images are fed in",
            "compute them with `torchkit dataset-stats --mode rgb` or `--mode gray`",
        )
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
