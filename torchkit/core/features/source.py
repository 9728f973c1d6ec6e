"""Where the model and its preprocessing come from: a torchvision name (random, `DEFAULT` or a
weights file), the built-in `convnet`, `module:Callable`, or a torchkit checkpoint."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from torchkit.core.data import Preprocess
from torchkit.core.errors import CheckpointError, UsageError
from torchkit.core.models import BUILTIN_MODELS, call_model_factory, is_checkpoint_path

# The crop and resize a built-in `convnet` (MNIST-sized) expects when nothing else says.
CONVNET_PREPROCESS = Preprocess(image_size=28, resize_size=28)


@dataclass
class ModelSource:
    """A model ready for inference, with the preprocessing it expects."""

    model: Any
    spec: str  # MODEL as the user gave it
    arch: str
    weights: str | None
    classes: list[str] | None
    preprocess: Preprocess
    preprocess_source: str  # checkpoint | torchvision | defaults (then maybe "+ options")


def load_model_source(
    spec: str,
    *,
    weights: str | None = None,
    trust: bool = False,
    image_size: int | None = None,
    in_channels: int | None = None,
) -> ModelSource:
    """Build MODEL with its own classifier head (never replaced) and find its preprocessing.

    `image_size`/`in_channels` only matter for a randomly initialised `convnet`, whose first
    linear layer depends on them.
    """
    weights = weights or None
    if _is_checkpoint(spec):
        if weights is not None:
            raise UsageError(
                "--weights is for model names; MODEL is already a checkpoint",
                "drop --weights, or name the architecture as MODEL",
            )
        return _from_checkpoint_file(spec, trust)
    if ":" in spec:
        return _from_callable(spec, weights, trust)
    return _from_name(spec, weights, trust, image_size, in_channels)


def _is_checkpoint(spec: str) -> bool:
    if ":" in spec and not os.path.exists(spec):
        return False
    return spec not in BUILTIN_MODELS and is_checkpoint_path(spec)


def _from_checkpoint_file(path: str, trust: bool) -> ModelSource:
    import torch

    from torchkit.core.checkpoint import is_torchkit_checkpoint, load_checkpoint
    from torchkit.core.models import model_from_checkpoint

    checkpoint = load_checkpoint(path, trust=trust)
    if isinstance(checkpoint, torch.nn.Module):  # a whole pickled model (--trust-checkpoint)
        arch = type(checkpoint).__name__
        return ModelSource(checkpoint, path, arch, None, None, Preprocess(), "defaults")
    if not is_torchkit_checkpoint(checkpoint):
        raise CheckpointError(
            f"{path} holds weights but not the architecture they belong to",
            f"name the architecture and pass the file as weights: "
            f"torchkit extract-features resnet18 --weights {path} ...",
        )
    model = model_from_checkpoint(checkpoint)
    has_preprocess = bool(checkpoint.get("preprocess"))
    return ModelSource(
        model,
        path,
        str(checkpoint["arch"]),
        None,
        _classes(checkpoint.get("classes")),
        Preprocess.from_dict(checkpoint.get("preprocess")),
        "checkpoint" if has_preprocess else "defaults",
    )


def _from_callable(spec: str, weights: str | None, trust: bool) -> ModelSource:
    model, _ = call_model_factory(spec)
    source = ModelSource(model, spec, spec, weights, None, Preprocess(), "defaults")
    if weights is not None:
        _load_weights_file(source, weights, trust)
    return source


def _from_name(
    name: str,
    weights: str | None,
    trust: bool,
    image_size: int | None,
    in_channels: int | None,
) -> ModelSource:
    from torchkit.core.models import build_model

    if name in BUILTIN_MODELS:
        preprocess = replace(
            CONVNET_PREPROCESS,
            image_size=image_size or CONVNET_PREPROCESS.image_size,
            in_channels=in_channels or CONVNET_PREPROCESS.in_channels,
        )
        model = build_model(
            name, 10, image_size=preprocess.image_size, in_channels=preprocess.in_channels
        )
        source = ModelSource(model, name, name, weights, None, preprocess, "defaults")
        if weights is not None:
            _load_weights_file(source, weights, trust)
        return source

    enum = _torchvision_weights_enum(name)
    if weights is not None and not os.path.exists(weights) and not is_checkpoint_path(weights):
        # A torchvision weights name such as DEFAULT or IMAGENET1K_V1.
        try:
            chosen = enum.verify(weights) if enum is not None else None
        except (KeyError, ValueError):
            chosen = None
        if chosen is None:
            names = ", ".join(["DEFAULT", *(w.name for w in enum)]) if enum else "none"
            raise UsageError(
                f"unknown weights {weights!r} for {name}",
                f"torchvision has: {names}; or pass --weights PATH to a file",
            )
        categories = list(chosen.meta.get("categories") or [])
        model = build_model(name, len(categories) or 1000, weights=weights)
        return ModelSource(
            model,
            name,
            name,
            weights,
            categories or None,
            _preprocess_of(chosen),
            "torchvision",
        )

    model = build_model(name, 1000)  # build_model reports unknown names with suggestions
    preprocess = _preprocess_of(enum.DEFAULT) if enum is not None else Preprocess()
    source = ModelSource(
        model,
        name,
        name,
        weights,
        None,
        preprocess,
        "torchvision" if enum is not None else "defaults",
    )
    if weights is not None:
        _load_weights_file(source, weights, trust)
    return source


def _torchvision_weights_enum(name: str):
    import torchvision

    try:
        return torchvision.models.get_model_weights(name)
    except (ValueError, KeyError):
        return None


def _preprocess_of(weights_enum_member) -> Preprocess:
    """torchvision's eval transform for these weights, as a Preprocess."""
    transform = weights_enum_member.transforms()
    return Preprocess(
        image_size=int(transform.crop_size[0]),
        resize_size=int(transform.resize_size[0]),
        mean=tuple(float(v) for v in transform.mean),
        std=tuple(float(v) for v in transform.std),
        in_channels=3,
        interpolation=transform.interpolation.value,
    )


def _load_weights_file(source: ModelSource, path: str, trust: bool) -> None:
    """Load a state dict or checkpoint into `source.model`, sizing the head to fit the file
    (features of the model as it was trained, not of a re-initialised head)."""
    from torchkit.core.checkpoint import (
        extract_state_dict,
        is_torchkit_checkpoint,
        load_checkpoint,
        load_weights_into,
    )
    from torchkit.core.models import find_head, replace_head

    if not os.path.exists(path) and not is_checkpoint_path(path):
        raise UsageError(
            f"--weights {path}: there is no such file",
            "weight names such as DEFAULT exist only for torchvision models; give a PATH",
        )
    checkpoint = load_checkpoint(path, trust=trust)
    state = extract_state_dict(checkpoint)
    try:
        head_name, _ = find_head(source.model)
    except UsageError:
        head_name = None
    head_weight = state.get(f"{head_name}.weight") if head_name else None
    if head_weight is not None and hasattr(head_weight, "shape"):
        replace_head(source.model, int(head_weight.shape[0]))
    load_weights_into(source.model, state, source=path)
    if is_torchkit_checkpoint(checkpoint):
        source.classes = _classes(checkpoint.get("classes"))
        if checkpoint.get("preprocess"):
            source.preprocess = Preprocess.from_dict(checkpoint["preprocess"])
            source.preprocess_source = "checkpoint"


def _classes(value: Any) -> list[str] | None:
    return [str(c) for c in value] if value else None
