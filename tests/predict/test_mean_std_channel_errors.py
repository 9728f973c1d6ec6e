"""A mean/std of the wrong number of channels for a 1-channel model: from `--stats FILE` it was
'--mean has 3 values but the images have 1 channels (give 1 or 1 comma-separated values)',
naming an option the user had not given, in broken grammar. The error names where the values
came from and reads as English."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers.checkpoints import write_convnet_checkpoint
from torchkit.cli import app


@pytest.fixture
def gray_model_and_images(tmp_path: Path) -> tuple[Path, Path]:
    model = tmp_path / "gray.pt"
    write_convnet_checkpoint(model, in_channels=1, image_size=8, classes="ab")
    images = tmp_path / "imgs"
    for index, name in enumerate("ab"):
        (images / name).mkdir(parents=True)
        Image.new("L", (8, 8), index * 100).save(images / name / f"{index}.png")
    return model, images


def _command(command: str, model: Path, images: Path, *options: str) -> list[str]:
    if command == "predict":
        return ["predict", str(model), str(images), "-j", "0", *options]
    return ["eval", str(model), "--data", str(images), "-j", "0", *options]


@pytest.mark.parametrize("command", ["predict", "eval"])
def test_rgb_stats_file_for_a_gray_model_names_the_stats_file(
    runner, tmp_path, gray_model_and_images, command
):
    model, images = gray_model_and_images
    stats = tmp_path / "rgb.json"
    stats.write_text(json.dumps({"mode": "rgb", "mean": [0.5, 0.4, 0.3], "std": [0.2] * 3}))
    result = runner.invoke(app, _command(command, model, images, "--stats", str(stats)))
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert line == (
        f"Error: --stats {stats} holds a mean and std for 3 channels but the images have "
        "1 channel (compute them for 1 channel with `torchkit dataset-stats --mode gray ROOT "
        "-o FILE.json`, or give --mean and --std)"
    )


def test_a_mean_of_three_values_for_a_gray_model_reads_as_english(runner, gray_model_and_images):
    model, images = gray_model_and_images
    result = runner.invoke(app, _command("predict", model, images, "--mean", "0.5,0.4,0.3"))
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "Error: --mean has 3 values but the images have 1 channel (give 1 value)"
    )
