"""Checkpoints for tests: the built-in convnet written as torchkit saves it (no training), and a
checkpoint file read back as torch reads it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def write_convnet_checkpoint(
    path: Path,
    *,
    in_channels: int,
    image_size: int,
    classes: str | list[str],
    preprocess: dict | None = None,
):
    """A torchkit checkpoint of the built-in convnet for `in_channels` x `image_size` images,
    one class per letter of `classes` (and `preprocess` as recorded, if given); returns its
    model."""
    from torchkit.core.models import resolve_model
    from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint

    model = resolve_model(
        "convnet", in_channels=in_channels, image_size=image_size, num_classes=len(classes)
    ).model
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": len(classes),
            "classes": list(classes),
            "model": model.state_dict(),
            "preprocess": preprocess or {"image_size": image_size, "in_channels": in_channels},
        },
        path,
    )
    return model


def write_tied_convnet_checkpoint(path: Path, *, image_size: int, classes: str) -> None:
    """`write_convnet_checkpoint` (RGB) with a zeroed last layer: every image gets the same
    logit for every class, a tie that only the ranking rule breaks."""
    write_constant_convnet_checkpoint(path, image_size=image_size, classes=classes)


def write_constant_convnet_checkpoint(
    path: Path, *, image_size: int, classes: str | list[str], logits: list[float] | None = None
) -> None:
    """`write_convnet_checkpoint` (RGB) whose last layer gives every image `logits` (zeros:
    a tie), so that which class each image is taken for is known."""
    import torch

    from torchkit.core.models.checkpoint import save_checkpoint

    write_convnet_checkpoint(path, in_channels=3, image_size=image_size, classes=classes)
    checkpoint = read_checkpoint(path)
    state = checkpoint["model"]
    head = [name for name in state if name.endswith(".weight")][-1].rsplit(".", 1)[0]
    state[f"{head}.weight"].zero_()
    state[f"{head}.bias"].copy_(torch.tensor(logits or [0.0] * len(classes)))
    save_checkpoint(checkpoint, path)


def read_checkpoint(path: Path) -> dict:
    """A checkpoint file as torch reads it (on the CPU, weights only)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def add_ema_weights(path: Path, ema_model) -> None:
    """Store `ema_model`'s weights as the EMA copy of the checkpoint at `path`, as train
    saves torch's AveragedModel: `module.` names and its `n_averaged` counter."""
    import torch

    from torchkit.core.models.checkpoint import save_checkpoint

    checkpoint = read_checkpoint(path)
    state = {f"module.{name}": value for name, value in ema_model.state_dict().items()}
    checkpoint["model_ema"] = {**state, "n_averaged": torch.tensor(3)}
    save_checkpoint(checkpoint, path)


def ema_refusals(folder: Path, checkpoint: Path) -> dict[str, list[str]]:
    """MODEL arguments that --ema refuses (eval's errors, which every command repeats): a
    torchkit checkpoint without EMA weights, a model name, a name with a plain state dict and
    an exported file (refused before it is read: a stand-in does)."""
    import torch

    state_dict = folder / "plain.pt"
    torch.save(read_checkpoint(checkpoint)["model"], state_dict)
    exported = folder / "model.onnx"
    exported.write_bytes(b"refused before it is read")
    return {
        "no EMA weights": [str(checkpoint)],
        "a model name": ["convnet"],
        "a state dict": ["convnet", "--weights", str(state_dict)],
        "an exported file": [str(exported)],
    }


def save_torchkit_checkpoint(path: Path, arch: str, model: torch.nn.Module, size: int) -> None:
    """`model` as train saves it: its arch, classes a b, preprocessing for `size` px RGB."""
    from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint

    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": arch,
            "num_classes": 2,
            "classes": ["a", "b"],
            "model": model.state_dict(),
            "preprocess": {"image_size": size, "in_channels": 3},
        },
        path,
    )
