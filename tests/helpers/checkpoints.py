"""Checkpoints for tests: the built-in convnet written as torchkit saves it (no training), and a
checkpoint file read back as torch reads it."""

from __future__ import annotations

from pathlib import Path


def write_convnet_checkpoint(path: Path, *, in_channels: int, image_size: int, classes: str):
    """A torchkit checkpoint of the built-in convnet for `in_channels` x `image_size` images,
    one class per letter of `classes`; returns its model."""
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
            "preprocess": {"image_size": image_size, "in_channels": in_channels},
        },
        path,
    )
    return model


def write_tied_convnet_checkpoint(path: Path, *, image_size: int, classes: str) -> None:
    """`write_convnet_checkpoint` (RGB) with a zeroed last layer: every image gets the same
    logit for every class, a tie that only the ranking rule breaks."""
    from torchkit.core.models.checkpoint import save_checkpoint

    write_convnet_checkpoint(path, in_channels=3, image_size=image_size, classes=classes)
    checkpoint = read_checkpoint(path)
    state = checkpoint["model"]
    head = [name for name in state if name.endswith(".weight")][-1].rsplit(".", 1)[0]
    state[f"{head}.weight"].zero_()
    state[f"{head}.bias"].zero_()
    save_checkpoint(checkpoint, path)


def read_checkpoint(path: Path) -> dict:
    """A checkpoint file as torch reads it (on the CPU, weights only)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)
