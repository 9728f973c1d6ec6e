"""The commands that resize and normalise images before a model, each as its command line over
an image folder: train of a tiny convnet, and eval, predict and extract-features of a tiny convnet
checkpoint (8x8 images). For tests that give every one of them the same option."""

from __future__ import annotations

from pathlib import Path

from checkpoints import write_convnet_checkpoint

# Placeholders: {data} the image folder, {ckpt} the checkpoint, {out} the output's path.
IMAGE_COMMANDS = {
    "train": ["train", "--data", "{data}", "--model", "convnet", "--image-size", "8",
              "--epochs", "1", "--workers", "0", "--out", "{out}"],
    "eval": ["eval", "{ckpt}", "--data", "{data}", "--workers", "0", "--out", "{out}"],
    "predict": ["predict", "{ckpt}", "{data}", "--workers", "0", "-o", "{out}.csv"],
    "extract-features": ["extract-features", "{ckpt}", "{data}", "{out}", "--workers", "0"],
}  # fmt: skip


def image_command(command: str, data: Path, tmp_path: Path) -> list[str]:
    """The words of `command` (a key of IMAGE_COMMANDS) over `data`: its checkpoint written at
    `tmp_path/ck.pt` (a convnet of classes a, b at 8x8), its output at `tmp_path/out` (`.csv`
    for predict), so that a test can check nothing named `out*` was written."""
    checkpoint = tmp_path / "ck.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    out = tmp_path / "out"
    return [word.format(data=data, ckpt=checkpoint, out=out) for word in IMAGE_COMMANDS[command]]
