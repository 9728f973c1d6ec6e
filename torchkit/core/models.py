"""Building models by name: torchvision classifiers, the built-in `convnet`, `module:Callable`,
or a torchkit checkpoint; replacing the classifier head; loading pretrained weights."""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
from pathlib import Path
from typing import Any

from torchkit.core.errors import CheckpointError, InputError, OfflineError, UsageError

BUILTIN_MODELS = ("convnet",)


def _convnet_class():
    import torch
    from torch import nn

    class ConvNet(nn.Module):
        """The classic two-convolution MNIST network (PyTorch's examples/mnist), made to accept any
        channel count and input size: the flattened size is computed from `image_size`."""

        def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 28):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(in_channels, 32, 3),
                nn.ReLU(inplace=True),
                nn.Conv2d(32, 64, 3),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
                nn.Dropout(0.25),
            )
            side = (image_size - 4) // 2
            if side < 1:
                raise UsageError(f"convnet needs images of at least 6x6, not {image_size}")
            self.classifier = nn.Sequential(
                nn.Flatten(),
                nn.Linear(64 * side * side, 128),
                nn.ReLU(inplace=True),
                nn.Dropout(0.5),
                nn.Linear(128, num_classes),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.features(x))

    return ConvNet


def list_models() -> list[str]:
    """Names `--model` accepts besides `module:Callable` and checkpoint paths."""
    import torchvision

    return sorted([*BUILTIN_MODELS, *torchvision.models.list_models(module=torchvision.models)])


def suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    if close:
        return "did you mean " + ", ".join(close) + "?"
    return "run `torchkit summary --list` for the model names"


def is_checkpoint_path(name: str) -> bool:
    return os.sep in name or name.endswith((".pt", ".pth", ".ckpt", ".bin")) or Path(name).is_file()


def build_model(
    name: str,
    num_classes: int,
    *,
    weights: str | None = None,
    image_size: int = 224,
    in_channels: int = 3,
):
    """Build `name` with a head of `num_classes` outputs.

    `weights` is None (random init), "DEFAULT" (torchvision's pretrained weights; needs the
    internet or a warm cache), or a path to a state dict / checkpoint. With pretrained weights the
    model is built with its original head, loaded, then the head is replaced.
    """
    if name in BUILTIN_MODELS:
        model = _convnet_class()(num_classes, in_channels, image_size)
        if weights not in (None, ""):
            _load_pretrained_path(model, weights, replace_head_for=num_classes)
        return model
    if ":" in name and not os.path.exists(name):
        return _build_from_callable(name, num_classes, weights)
    import torchvision

    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        raise UsageError(f"unknown model {name!r}", suggest(name, [*BUILTIN_MODELS, *available]))
    if weights is None or weights == "":
        extra = {"image_size": image_size} if name.startswith("vit_") else {}
        return torchvision.models.get_model(name, weights=None, num_classes=num_classes, **extra)
    if not os.path.exists(weights):
        if is_checkpoint_path(weights):
            raise InputError(f"weights file not found: {weights}", "check the path")
        model = _torchvision_pretrained(name, weights)
        replace_head(model, num_classes)
        return model
    model = torchvision.models.get_model(name, weights=None)
    _load_pretrained_path(model, weights, replace_head_for=num_classes)
    return model


def _torchvision_pretrained(name: str, weights: str):
    import urllib.error

    import torchvision

    try:
        return torchvision.models.get_model(name, weights=weights)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise OfflineError(
            f"cannot download the {weights} weights of {name}: {error}",
            "connect to the internet once so they are cached in ~/.cache/torch, "
            "or pass --weights PATH to a local file",
        ) from error
    except ValueError as error:
        raise UsageError(f"unknown weights {weights!r} for {name}: {error}") from error


def _load_pretrained_path(model, path: str, *, replace_head_for: int) -> None:
    from torchkit.core.checkpoint import extract_state_dict, load_checkpoint, load_weights_into

    state = extract_state_dict(load_checkpoint(path))
    head_name, head = find_head(model)
    head_weight = state.get(f"{head_name}.weight")
    if head_weight is not None and head_weight.shape[0] != _out_features(head):
        replace_head(model, head_weight.shape[0])
    load_weights_into(model, state, source=path)
    if _out_features(find_head(model)[1]) != replace_head_for:
        replace_head(model, replace_head_for)


def call_model_factory(spec: str, *, num_classes: int | None = None) -> tuple[Any, bool]:
    """Import `package.module:Callable` and call it, with `num_classes` when it is given and the
    callable accepts it. Returns (the nn.Module it built, whether num_classes was passed)."""
    import torch

    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise UsageError(
            f"cannot import model {spec!r}: {error}", "use package.module:Callable"
        ) from error
    takes_classes = num_classes is not None and "num_classes" in _accepted_params(factory)
    model = factory(num_classes=num_classes) if takes_classes else factory()
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{spec} returned a {type(model).__name__}, not a torch.nn.Module")
    return model, takes_classes


def _build_from_callable(spec: str, num_classes: int, weights: str | None):
    model, took_classes = call_model_factory(spec, num_classes=num_classes)
    if not took_classes:
        replace_head(model, num_classes)
    if weights:
        _load_pretrained_path(model, weights, replace_head_for=num_classes)
    return model


def _accepted_params(factory) -> set[str]:
    try:
        return set(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return set()


def find_head(model) -> tuple[str, Any]:
    """The classifier layer: the last `nn.Linear` in registration order (or the final 1x1
    convolution of SqueezeNet-style heads)."""
    from torch import nn

    last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = (name, module)
    if last is None:
        for name, module in model.named_modules():
            if isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1):
                last = (name, module)
    if last is None:
        raise UsageError("cannot find the classifier layer of the model (no nn.Linear)")
    return last


def _out_features(layer) -> int:
    return layer.out_features if hasattr(layer, "out_features") else layer.out_channels


def replace_head(model, num_classes: int) -> None:
    """Swap the classifier for a freshly initialised one with `num_classes` outputs."""
    from torch import nn

    name, head = find_head(model)
    if _out_features(head) == num_classes:
        return
    if isinstance(head, nn.Linear):
        new = nn.Linear(head.in_features, num_classes, bias=head.bias is not None)
    else:
        new = nn.Conv2d(head.in_channels, num_classes, kernel_size=1)
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)
    if hasattr(model, "num_classes"):
        model.num_classes = num_classes


def model_from_checkpoint(checkpoint: dict):
    """Rebuild the model a torchkit checkpoint was trained with and load its weights."""
    from torchkit.core.checkpoint import extract_state_dict, load_weights_into

    try:
        arch = checkpoint["arch"]
        num_classes = int(checkpoint["num_classes"])
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"checkpoint lacks {error}", "is it a torchkit checkpoint?"
        ) from error
    preprocess = checkpoint.get("preprocess") or {}
    model = build_model(
        arch,
        num_classes,
        image_size=int(preprocess.get("image_size", 224)),
        in_channels=int(preprocess.get("in_channels", 3)),
    )
    load_weights_into(model, extract_state_dict(checkpoint), source=f"the {arch} checkpoint")
    return model
