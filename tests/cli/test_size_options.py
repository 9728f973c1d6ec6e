"""One name for one meaning: every command that takes an input size takes it as --image-size
(the side of a square crop) and as --input-size (one sample's shape), so a user need not know
which command spells it which way."""

from __future__ import annotations

import json

import pytest
from checkpoints import write_convnet_checkpoint
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.input_size import parse_image_side, square_sample

# The commands that crop images, and the ones that take a sample's shape.
CROPPING = ["train", "eval", "predict", "export", "extract-features"]
SHAPED = ["summary", "benchmark", "convert-syncbn"]


@pytest.mark.parametrize(
    ("text", "side"), [("24", 24), ("24,24", 24), ("3,24,24", 24), ("1x24x24", 24), (None, None)]
)
def test_a_side_or_a_square_shape_gives_the_side(text, side):
    assert parse_image_side(text) == side


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3,24,32", "is not square"),
        ("0", "not a positive size"),
        ("a", "not a positive size"),
        # It said "not a positive size" of a side whose pixels no tensor holds.
        ("99999999999999999999", "more pixels than a tensor can hold"),
    ],
)
def test_what_is_not_a_square_side_is_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_image_side(text)


def test_a_side_takes_the_channels_the_model_takes():
    assert square_sample((1, 10, 10), 20) == (1, 20, 20)
    assert square_sample(None, 20) == (3, 20, 20)


@pytest.mark.parametrize("command", CROPPING + SHAPED)
def test_every_command_lists_both_names(command):
    result = run_torchkit_in_process(command, "--help")
    assert result.returncode == 0
    assert "--image-size" in result.stdout and "--input-size" in result.stdout


def test_train_takes_input_size_as_its_crop_size():
    """Train feeds its model RGB images (the digits too): a shape of other channels is refused
    (`1,16,16` trained at 16 on 3 channels, the 1 dropped unread)."""
    result = run_torchkit_in_process(
        "train", "--data", "digits", "--input-size", "3,16,16", "--print-config"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["image_size"] == 16
    gray = run_torchkit_in_process("train", "--input-size", "1,16,16", "--print-config")
    assert gray.returncode == 2 and "is a 1-channel shape" in gray.stderr


def test_extract_features_takes_input_size_as_its_crop_size():
    result = run_torchkit_in_process(
        "extract-features",
        "convnet",
        "--list-layers",
        "--input-size",
        "3,20,20",
        "--format",
        "json",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["image_size"] == 20


@pytest.mark.parametrize("command", ["predict", "train"])
def test_a_shape_that_is_not_square_is_a_usage_error(command):
    args = ["predict", "convnet", "--allow-untrained", "digits"] if command == "predict" else []
    args = args or ["train", "--data", "digits", "--print-config"]
    result = run_torchkit_in_process(*args, "--input-size", "3,16,20")
    assert result.returncode == 2
    assert "'3,16,20' is not square" in result.stderr


def test_summary_and_benchmark_take_image_size_as_a_square_input():
    summary = run_torchkit_in_process(
        "summary", "convnet", "--image-size", "20", "--format", "json"
    )
    assert summary.returncode == 0, summary.stderr
    assert json.loads(summary.stdout)["input_shapes"] == [[1, 3, 20, 20]]
    benchmark = run_torchkit_in_process(
        "benchmark",
        "convnet",
        "--image-size",
        "20",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--format",
        "json",
    )
    assert benchmark.returncode == 0, benchmark.stderr
    assert json.loads(benchmark.stdout)["input_size"] == [3, 20, 20]


def test_image_size_keeps_the_channels_of_a_checkpoint(tmp_path):
    path = tmp_path / "best.pt"
    write_convnet_checkpoint(path, in_channels=1, image_size=10, classes="abcd")
    result = run_torchkit_in_process("summary", path, "--image-size", "10", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["input_shapes"] == [[1, 1, 10, 10]]


@pytest.mark.parametrize("command", ["summary", "benchmark"])
def test_both_names_at_once_are_a_usage_error(command):
    result = run_torchkit_in_process(
        command, "convnet", "--image-size", "20", "--input-size", "3,20,20"
    )
    assert result.returncode == 2
    assert "--image-size and --input-size both give the input" in error_line(result.stderr)
