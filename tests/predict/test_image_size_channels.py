"""`--image-size C,N,N` in the inference commands and export: C must be the channels of the
images the model takes (train's rule, with the model's channels in place of RGB), never dropped
unread."""

from __future__ import annotations

import json

import pytest
from checkpoints import write_convnet_checkpoint
from PIL import Image
from processes import run_torchkit_in_process


@pytest.fixture(scope="module")
def gray_model(tmp_path_factory):
    """A 1-channel convnet checkpoint for 12 x 12 images and one gray image."""
    folder = tmp_path_factory.mktemp("gray")
    write_convnet_checkpoint(folder / "gray.pt", in_channels=1, image_size=12, classes="ab")
    Image.new("L", (12, 12), 90).save(folder / "x.png")
    return folder


def _commands(folder):
    model = folder / "gray.pt"
    return {
        "predict": ["predict", model, folder / "x.png", "-j", "0", "--allow-untrained"],
        "eval": ["eval", model, "--data", "digits", "-j", "0", "--allow-untrained"],
        "extract-features": ["extract-features", model, "--list-layers"],
        "export": ["export", model, folder / "gray.onnx"],
    }


@pytest.mark.parametrize("command", ["predict", "eval", "extract-features", "export"])
def test_a_shape_with_other_channels_is_refused(gray_model, command):
    result = run_torchkit_in_process(*_commands(gray_model)[command], "--image-size", "3,12,12")
    assert result.returncode == 2, result.stdout
    assert result.stderr.strip() == (
        "Error: --image-size '3,12,12' is a 3-channel shape, and convnet takes 1-channel "
        "images (give N, or 1,N,N)"
    )
    assert not (gray_model / "gray.onnx").exists()


def test_the_model_channels_are_taken(gray_model):
    result = run_torchkit_in_process(
        *_commands(gray_model)["predict"], "--input-size", "1,12,12", "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["path"].endswith("x.png") and row["class"] in ("a", "b") and row["error"] is None
