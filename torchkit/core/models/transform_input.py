"""googlenet and inception_v3 checkpoints trained with torchvision's `transform_input`.

Before checkpoint format 2, `train --model googlenet --weights DEFAULT` (any of torchvision's
weight names; inception_v3 alike) trained the model torchvision builds for its weights, which
re-normalises its input inside (`transform_input=True`: channel c becomes x * S[c] / 0.5 +
(M[c] - 0.5) / 0.5, M and S ImageNet's mean and std), fed images normalised with the mean and
std the checkpoint records. Every command rebuilds these models without it (see
`builders.TRANSFORM_INPUT_MODELS`), so such a checkpoint is fed what training fed its weights by
normalising with mean m - s (M - 0.5) / S and std 0.5 s / S instead of its recorded m and s: for
ImageNet's (what train chose then), mean 0.5 and std 0.5, what train has chosen since.

A format-1 checkpoint that records mean and std 0.5 was trained without it (as train does now);
one that records ImageNet's was trained with it (train's default then). One with a mean/std of
its own may be either (a --mean given before or after the change): warned about, not changed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from torchkit.core.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from torchkit.core.models.builders import (
    TRANSFORM_INPUT_MEAN_STD,
    TRANSFORM_INPUT_MODELS,
    torchvision_weights_enum,
)

log = logging.getLogger("torchkit")

# The first checkpoint format whose googlenet/inception_v3 never carry transform_input.
WITHOUT_TRANSFORM_INPUT_FROM = 2
_warned: set[str] = set()


def preprocess_as_trained(
    checkpoint: Mapping[str, Any], source: str, *, command: str | None = None
) -> Preprocess:
    """The preprocessing a torchkit checkpoint records, with an older googlenet's or
    inception_v3's mean/std as the model every command rebuilds (without transform_input)
    must be fed to answer as it was trained. `command` reads the checkpoint: the warning's
    advice is what that command can do (None: one that takes --mean/--std)."""
    preprocess = Preprocess.from_dict(checkpoint.get("preprocess"), source)
    if not _maybe_transform_input(checkpoint):
        return preprocess
    as_trained = _as_trained(checkpoint, preprocess, source, command)
    if as_trained is None:
        return preprocess
    return replace(preprocess, mean=as_trained[0], std=as_trained[1])


def mean_std_as_trained(
    checkpoint: Mapping[str, Any], source: str
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(mean, std) that feed the model rebuilt from `checkpoint` what its training fed it,
    where that differs from what it records (a googlenet or inception_v3 trained with
    transform_input); None where it does not. A checkpoint that may or may not have been
    trained so is warned about once (naming `source`) and left as it records."""
    if not _maybe_transform_input(checkpoint):
        return None
    return _as_trained(
        checkpoint, Preprocess.from_dict(checkpoint.get("preprocess"), source), source
    )


def _as_trained(
    checkpoint: Mapping[str, Any], recorded: Preprocess, source: str, command: str | None = None
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """`mean_std_as_trained` of a checkpoint `_maybe_transform_input` holds, which records
    `recorded`."""
    mean, std = recorded.mean, recorded.std
    if len(mean) != 3 or len(std) != 3:
        return None  # not the RGB images these models take: refused when they are fed
    if _close(mean, TRANSFORM_INPUT_MEAN_STD) and _close(std, TRANSFORM_INPUT_MEAN_STD):
        return None  # trained without it, as train does now
    if _close(mean, IMAGENET_MEAN) and _close(std, IMAGENET_STD):
        return TRANSFORM_INPUT_MEAN_STD, TRANSFORM_INPUT_MEAN_STD
    if source not in _warned:
        _warned.add(source)
        log.warning(
            f"{source}: a {checkpoint.get('arch')} trained from torchvision's weights with a "
            "mean/std of its own; if torchkit trained it before checkpoint format 2, it trained "
            "with torchvision's transform_input, and feeding it as trained takes "
            + _how_to_feed(command, *_equivalent(mean, std))
        )
    return None


# The commands whose images are normalised with --mean/--std (train; eval, predict and
# extract-features through their inference options).
TAKE_MEAN_STD = ("train", "eval", "predict", "extract-features")


def _how_to_feed(command: str | None, mean: Sequence[float], std: Sequence[float]) -> str:
    """The end of the warning: what the user of `command` does to feed the model `mean` and
    `std` (export takes no --mean/--std: what it writes records the checkpoint's)."""
    options = f"--mean {_listed(mean)} --std {_listed(std)}"
    if command is None or command in TAKE_MEAN_STD:
        return options
    if command == "export":
        return (
            f"mean {_listed(mean)} and std {_listed(std)}; the export records the checkpoint's "
            f"own: give {options} to eval or predict of the exported file, or normalise with "
            "them wherever it runs"
        )
    return f"{options} in eval, predict and extract-features"


def _maybe_transform_input(checkpoint: Mapping[str, Any]) -> bool:
    """Whether `checkpoint` is a format-1 googlenet or inception_v3 run that built its model
    from torchvision's named weights (DEFAULT, IMAGENET1K_V1...), as torchvision builds it for
    them: with transform_input. A weights file was loaded into a model built without it."""
    arch = checkpoint.get("arch")
    config = checkpoint.get("config")
    version = checkpoint.get("format_version", 1)
    if arch not in TRANSFORM_INPUT_MODELS or not isinstance(config, Mapping):
        return False
    if not isinstance(version, int) or version >= WITHOUT_TRANSFORM_INPUT_FROM:
        return False
    weights = config.get("weights")
    if config.get("model") != arch or not isinstance(weights, str):
        return False
    enum = torchvision_weights_enum(arch)
    try:
        return enum is not None and enum.verify(weights) is not None
    except (KeyError, ValueError):
        return False


def _close(values: Sequence[float], wanted: Sequence[float]) -> bool:
    return all(math.isclose(v, w, rel_tol=1e-6) for v, w in zip(values, wanted, strict=True))


def _equivalent(mean: Sequence[float], std: Sequence[float]) -> tuple[tuple, tuple]:
    """The mean/std whose normalisation is `mean`/`std`'s followed by transform_input."""
    scale = [s / big for s, big in zip(std, IMAGENET_STD, strict=True)]
    fed_mean = tuple(
        m - big_m * k + 0.5 * k for m, big_m, k in zip(mean, IMAGENET_MEAN, scale, strict=True)
    )
    return fed_mean, tuple(0.5 * k for k in scale)


def _listed(values: Sequence[float]) -> str:
    return ",".join(f"{value:.6g}" for value in values)
