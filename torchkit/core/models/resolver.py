"""`resolve_model`: the one way every command turns MODEL [--weights W] into a model.

A spec is a torchvision name, `convnet`, `package.module:Callable`, or a model file (a torchkit
checkpoint, or a pickled module under `trust`). `--weights` goes with a name: torchvision's
`DEFAULT`/`IMAGENET1K_V1`..., or a file (torchkit checkpoint, state dict with or without
`module.`/`_orig_mod.`, `.safetensors`) whose classifier sizes the head.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from torchkit.core.data import Preprocess
from torchkit.core.errors import CheckpointError, UsageError
from torchkit.core.models.builders import (
    BUILTIN_MODELS,
    is_callable_spec,
    is_checkpoint_path,
    require_torchvision_name,
    torchvision_pretrained,
    torchvision_random,
    torchvision_weights_enum,
)
from torchkit.core.models.convnet import convnet_class
from torchkit.core.models.heads import replace_head
from torchkit.core.models.specs import is_model_file
from torchkit.core.models.usercode import call_model_factory
from torchkit.core.models.weights import (
    is_state_dict,
    load_weights_file,
    model_from_checkpoint,
    pickled_module,
    read_model_file,
    weights_only_error,
)

# The crop and resize a built-in `convnet` (MNIST-sized) expects when nothing else says.
CONVNET_PREPROCESS = Preprocess(image_size=28, resize_size=28)
DEFAULT_IMAGE_SIZE = 224


@dataclass
class ResolvedModel:
    """A model ready to use, with what is known about it."""

    model: Any
    arch: str
    source: str  # torchvision | built-in | callable | torchkit checkpoint | pickled model
    classes: list[str] | None = None
    preprocess: Preprocess | None = None
    preprocess_source: str = "defaults"  # checkpoint | torchvision | defaults
    sample_shape: tuple[int, ...] | None = None  # one sample's input (C, H, W), when known
    image_model: bool = True  # True when the model takes N,C,H,W images
    checkpoint: Mapping[str, Any] | None = None  # the torchkit checkpoint it came from
    spec: str = ""
    weights: str | None = None

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def resolve_model(
    spec: str,
    *,
    weights: str | None = None,
    num_classes: int | None = None,
    classes: Sequence[str] | None = None,
    trust: bool = False,
    image_size: int | Sequence[int] | None = None,
    in_channels: int | None = None,
) -> ResolvedModel:
    """Build or load the model `spec` names.

    `num_classes` (or `len(classes)`) replaces the head; without it the head is the one the
    weights have (a fine-tuned 2-class file gives 2 outputs), else the architecture's default.
    `image_size` (an int or H, W) and `in_channels` size the models whose layers depend on them
    (`convnet`, ViT, MaxViT) when they are built with random weights. `trust` allows pickles in
    every file loaded (MODEL and `weights`).
    """
    weights = weights or None
    if classes and num_classes is None:
        num_classes = len(classes)
    if is_model_file(spec):
        if weights is not None:
            raise UsageError(
                "--weights goes with a model name; MODEL is already a checkpoint file",
                "drop --weights, or name the architecture as MODEL",
            )
        resolved = _from_file(spec, num_classes=num_classes, trust=trust)
    elif is_callable_spec(spec):
        resolved = _from_callable(spec, num_classes, weights, trust)
    elif spec in BUILTIN_MODELS:
        resolved = _from_convnet(spec, num_classes, weights, trust, image_size, in_channels)
    else:
        resolved = _from_torchvision(spec, num_classes, weights, trust, image_size)
    resolved.spec, resolved.weights = spec, weights
    if classes:
        resolved.classes = [str(c) for c in classes]
    return resolved


def _size(image_size: int | Sequence[int] | None, default: int) -> tuple[int, int]:
    if image_size is None:
        return (default, default)
    if isinstance(image_size, int):
        return (image_size, image_size)
    size = tuple(int(n) for n in image_size)
    return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])


def _from_file(path: str, *, num_classes: int | None, trust: bool) -> ResolvedModel:
    from torchkit.core.checkpoint import is_torchkit_checkpoint

    loaded = read_model_file(path, trust=trust)
    if is_torchkit_checkpoint(loaded):
        if num_classes is not None and int(loaded.get("num_classes", -1)) != num_classes:
            raise UsageError(
                f"--num-classes {num_classes} does not match the checkpoint's "
                f"{loaded.get('num_classes')} classes",
                "leave --num-classes out for a checkpoint",
            )
        model = model_from_checkpoint(loaded, trust=trust)
        preprocess = Preprocess.from_dict(loaded.get("preprocess"))
        side = preprocess.image_size
        return ResolvedModel(
            model,
            str(loaded["arch"]),
            "torchkit checkpoint",
            classes=_classes(loaded.get("classes")),
            preprocess=preprocess,
            preprocess_source="checkpoint" if loaded.get("preprocess") else "defaults",
            sample_shape=(preprocess.in_channels, side, side),
            checkpoint=loaded,
        )
    module = pickled_module(loaded)
    if module is not None:
        return ResolvedModel(
            module,
            type(module).__name__,
            "pickled model",
            preprocess=Preprocess(),
            image_model=False,
        )
    if is_state_dict(loaded):
        raise weights_only_error(path)
    raise CheckpointError(
        f"{path} is neither a torchkit checkpoint nor a pickled model",
        "name the architecture as MODEL and pass the weights as --weights PATH",
    )


def _from_callable(
    spec: str, num_classes: int | None, weights: str | None, trust: bool
) -> ResolvedModel:
    """`package.module:Callable`. Without num_classes the factory is called with no arguments,
    so models without a classifier head (feature extractors, two-input networks) work too."""
    model, took_classes = call_model_factory(spec, num_classes=num_classes)
    if num_classes is not None and not took_classes:
        replace_head(model, num_classes)
    resolved = ResolvedModel(model, spec, "callable", preprocess=Preprocess(), image_model=False)
    if weights is not None:
        _load_file_weights(resolved, weights, num_classes, trust)
    return resolved


def _from_convnet(
    name: str,
    num_classes: int | None,
    weights: str | None,
    trust: bool,
    image_size: int | Sequence[int] | None,
    in_channels: int | None,
) -> ResolvedModel:
    side = _size(image_size, CONVNET_PREPROCESS.image_size)[-1]
    channels = in_channels or CONVNET_PREPROCESS.in_channels
    preprocess = replace(CONVNET_PREPROCESS, image_size=side, in_channels=channels)
    model = convnet_class()(num_classes or 10, channels, side)
    resolved = ResolvedModel(
        model, name, "built-in", preprocess=preprocess, sample_shape=(channels, side, side)
    )
    if weights is not None:
        _load_file_weights(resolved, weights, num_classes, trust)
    return resolved


def _from_torchvision(
    name: str,
    num_classes: int | None,
    weights: str | None,
    trust: bool,
    image_size: int | Sequence[int] | None,
) -> ResolvedModel:
    require_torchvision_name(name)
    enum = torchvision_weights_enum(name)
    if weights is not None and not os.path.exists(weights) and not is_checkpoint_path(weights):
        return _torchvision_pretrained(name, weights, enum, num_classes)
    if weights is None:
        size = _size(image_size, DEFAULT_IMAGE_SIZE)
        model = torchvision_random(name, num_classes or 1000, size)
    else:
        import torchvision

        size = (DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE)
        model = torchvision.models.get_model(name, weights=None)
    resolved = ResolvedModel(
        model,
        name,
        "torchvision",
        preprocess=_preprocess_of(enum.DEFAULT) if enum is not None else Preprocess(),
        preprocess_source="torchvision" if enum is not None else "defaults",
        sample_shape=(3, *size),
    )
    if weights is not None:
        _load_file_weights(resolved, weights, num_classes, trust)
    return resolved


def _torchvision_pretrained(name: str, weights: str, enum, num_classes: int | None):
    """torchvision's own weights (DEFAULT, IMAGENET1K_V1...): downloaded once, then cached."""
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
    model = torchvision_pretrained(name, weights)
    categories = [str(c) for c in chosen.meta.get("categories") or []]
    if num_classes is not None and num_classes != len(categories):
        replace_head(model, num_classes)
        categories = []
    preprocess = _preprocess_of(chosen)
    return ResolvedModel(
        model,
        name,
        "torchvision",
        classes=categories or None,
        preprocess=preprocess,
        preprocess_source="torchvision",
        sample_shape=(3, preprocess.image_size, preprocess.image_size),
    )


def _load_file_weights(
    resolved: ResolvedModel, path: str, num_classes: int | None, trust: bool
) -> None:
    """Load a weights file into `resolved.model`, taking the classes and preprocessing of a
    torchkit checkpoint along."""
    from torchkit.core.checkpoint import is_torchkit_checkpoint

    if not os.path.exists(path) and not is_checkpoint_path(path):
        raise UsageError(
            f"--weights {path}: there is no such file",
            "weight names such as DEFAULT exist only for torchvision models; give a PATH",
        )
    loaded = load_weights_file(resolved.model, path, num_classes=num_classes, trust=trust)
    if is_torchkit_checkpoint(loaded):
        if num_classes is None:
            resolved.classes = _classes(loaded.get("classes"))
        if loaded.get("preprocess"):
            resolved.preprocess = Preprocess.from_dict(loaded["preprocess"])
            resolved.preprocess_source = "checkpoint"
            side = resolved.preprocess.image_size
            resolved.sample_shape = (resolved.preprocess.in_channels, side, side)


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


def _classes(value: Any) -> list[str] | None:
    return [str(c) for c in value] if value else None
