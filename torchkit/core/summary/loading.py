"""The model an inspection command names: a torchvision classifier, `convnet`,
`package.module:Callable`, a torchkit checkpoint, or a pickled `nn.Module` (trusted loading only).
Always built with random weights unless a weights file is given: nothing is downloaded."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchkit.core.errors import CheckpointError, InputError, UsageError
from torchkit.core.models import (
    BUILTIN_MODELS,
    build_model,
    call_model_factory,
    is_checkpoint_path,
)
from torchkit.core.outputs import InputPath

DEFAULT_IMAGE_SHAPE = (3, 224, 224)
CONVNET_IMAGE_SHAPE = (3, 28, 28)
# torchvision builders whose position embeddings fix the image size at construction.
IMAGE_SIZE_KWARGS = {"vit_": "image_size", "maxvit_": "input_size"}


@dataclass
class LoadedModel:
    model: Any
    arch: str
    origin: str  # "torchvision", "built-in", "callable", "torchkit checkpoint", "pickled model"
    sample_shape: tuple[int, ...] | None  # the default input of one sample, when known
    image_model: bool  # True when the model takes N,C,H,W images
    checkpoint: Mapping[str, Any] | None = None


def is_model_file(spec: str) -> bool:
    """A path to a checkpoint or pickled model (as opposed to a model name)."""
    return os.path.isfile(spec) or (":" not in spec and is_checkpoint_path(spec))


def model_inputs(spec: str | None, weights: str | None = None) -> list[InputPath]:
    """The files a model spec reads, which no output of the command may replace: a checkpoint
    or pickled model, the source of a `package.module:Callable` found under the working
    directory, and a `--weights` file. Nothing is imported or loaded."""
    inputs: list[InputPath] = []
    if spec and is_model_file(spec):
        inputs.append(InputPath.of(spec, "model file"))
    elif spec and ":" in spec and spec.split(":", 1)[0] not in BUILTIN_MODELS:
        parts = spec.split(":", 1)[0].split(".")
        for candidate in (os.path.join(*parts) + ".py", os.path.join(*parts, "__init__.py")):
            if os.path.isfile(candidate):
                inputs.append(InputPath.of(candidate, "model source"))
                break
    if weights and weights != "DEFAULT" and os.path.exists(weights):
        inputs.append(InputPath.of(weights, "weights file"))
    return inputs


def load_model(
    spec: str,
    *,
    num_classes: int | None = None,
    weights: str | None = None,
    trust: bool = False,
    sample_shape: Sequence[int] | None = None,
) -> LoadedModel:
    """Build or load the model `spec` names. `sample_shape` (C, H, W) sizes the models whose
    layers depend on the image size (`convnet`, ViT)."""
    if is_model_file(spec):
        if weights:
            raise UsageError("--weights goes with a model name, not with a checkpoint file")
        return _from_file(spec, num_classes=num_classes, trust=trust)
    if ":" in spec and spec.split(":", 1)[0] not in BUILTIN_MODELS:
        return _from_callable(spec, num_classes=num_classes, weights=weights)
    if spec in BUILTIN_MODELS:
        shape = tuple(sample_shape) if sample_shape else CONVNET_IMAGE_SHAPE
        _require_image_shape(shape, spec)
        model = build_model(
            spec,
            num_classes or 10,
            weights=weights,
            image_size=shape[-1],
            in_channels=shape[0],
        )
        return LoadedModel(model, spec, "built-in", shape, True)
    shape = tuple(sample_shape) if sample_shape else DEFAULT_IMAGE_SHAPE
    model = _torchvision(spec, num_classes or 1000, weights, shape)
    return LoadedModel(model, spec, "torchvision", shape, True)


def _require_image_shape(shape: Sequence[int], name: str) -> None:
    if len(shape) != 3:
        raise UsageError(
            f"{name} takes images: give the input size as C,H,W (or N,C,H,W), not "
            f"{','.join(map(str, shape))}"
        )


def _torchvision(name: str, num_classes: int, weights: str | None, shape: Sequence[int]):
    size_kwarg = next(
        (kw for prefix, kw in IMAGE_SIZE_KWARGS.items() if name.startswith(prefix)), None
    )
    if size_kwarg and not weights and len(shape) == 3 and tuple(shape[1:]) != (224, 224):
        import torchvision

        if name not in torchvision.models.list_models(module=torchvision.models):
            return build_model(name, num_classes)  # raises the unknown-model error
        size = shape[1] if size_kwarg == "image_size" else (shape[1], shape[2])
        if size_kwarg == "image_size" and shape[1] != shape[2]:
            raise UsageError(f"{name} takes square images, not {shape[1]}x{shape[2]}")
        try:
            return torchvision.models.get_model(
                name, weights=None, num_classes=num_classes, **{size_kwarg: size}
            )
        except (ValueError, AssertionError) as error:
            raise UsageError(
                f"cannot build {name} for {shape[1]}x{shape[2]} images: {error}"
            ) from error
    return build_model(name, num_classes, weights=weights)


def _from_callable(spec: str, *, num_classes: int | None, weights: str | None) -> LoadedModel:
    """`package.module:Callable`. Without --num-classes the factory is called with no arguments,
    so models without a classifier head (feature extractors, two-input networks) work too."""
    if num_classes is not None or weights:
        model = build_model(spec, num_classes or 1000, weights=weights)
        return LoadedModel(model, spec, "callable", None, False)
    model, _ = call_model_factory(spec)
    return LoadedModel(model, spec, "callable", None, False)


def _from_file(path: str, *, num_classes: int | None, trust: bool) -> LoadedModel:
    import torch

    from torchkit.core.checkpoint import is_torchkit_checkpoint, load_checkpoint
    from torchkit.core.models import model_from_checkpoint

    loaded = load_checkpoint(path, trust=trust)
    if is_torchkit_checkpoint(loaded):
        if num_classes is not None and int(loaded.get("num_classes", -1)) != num_classes:
            raise UsageError(
                f"--num-classes {num_classes} does not match the checkpoint's "
                f"{loaded.get('num_classes')} classes",
                "leave --num-classes out for a checkpoint",
            )
        model = model_from_checkpoint(loaded)
        preprocess = loaded.get("preprocess") or {}
        side = int(preprocess.get("image_size", 224))
        shape = (int(preprocess.get("in_channels", 3)), side, side)
        return LoadedModel(
            model, str(loaded["arch"]), "torchkit checkpoint", shape, True, checkpoint=loaded
        )
    module = pickled_module(loaded)
    if module is not None:
        return LoadedModel(module, type(module).__name__, "pickled model", None, False)
    if (
        isinstance(loaded, Mapping)
        and loaded
        and all(isinstance(v, torch.Tensor) for v in loaded.values())
    ):
        raise InputError(
            f"{path} holds only weights (a state dict), not the model's architecture",
            "name the architecture as MODEL and pass this file as --weights PATH",
        )
    raise CheckpointError(
        f"{path} is neither a torchkit checkpoint nor a pickled model",
        "name the architecture as MODEL and pass the weights as --weights PATH",
    )


def pickled_module(loaded: Any) -> Any:
    """The `nn.Module` of a whole pickled model, or of a dict holding one (`{'model': net}`)."""
    import torch

    if isinstance(loaded, torch.nn.Module):
        return loaded
    if isinstance(loaded, Mapping):
        for value in loaded.values():
            if isinstance(value, torch.nn.Module):
                return value
    return None
