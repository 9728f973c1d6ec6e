"""`--stats FILE` (the JSON `torchkit dataset-stats` writes) and `--mean/--std` parsing, shared by
train, eval and extract-features."""

from __future__ import annotations

import json
import re

import pytest
from image_commands import IMAGE_COMMANDS, image_command
from image_folders import write_image_folder
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.data.preprocessing import mean_std_options, parse_floats, read_stats_file
from torchkit.core.io.errors import InputError, UsageError

runner = CliRunner()


@pytest.fixture(scope="module")
def stats_file(tmp_path_factory):
    """A stats file written by the real `torchkit dataset-stats` for a split root's train/
    (STATS/../data: read, never written, by the tests)."""
    folder = tmp_path_factory.mktemp("stats")
    root = folder / "data"
    write_image_folder(root / "train", {"ant": 4, "bee": 4}, seed=1)
    write_image_folder(root / "val", {"ant": 2, "bee": 2}, seed=2)
    path = folder / "stats.json"
    result = runner.invoke(
        app,
        ["dataset-stats", str(root / "train"), "--format", "json", "-o", str(path), "-j", "0"],
    )
    assert result.exit_code == 0, result.stderr
    return path


def test_read_stats_file_gives_the_dataset_stats_numbers(stats_file):
    written = json.loads(stats_file.read_text())
    mean, std = read_stats_file(stats_file)
    assert list(mean) == written["mean"] and list(std) == written["std"] and len(mean) == 3


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "stats file not found"),
        (b"", "cannot read stats file"),
        (b"\xff\xfe not json", "cannot read stats file"),
        (b"[1, 2]", "has no per-channel mean and std"),
        (b'{"mean": [0.5, 0.5, 0.5]}', "has no per-channel mean and std"),
        (b'{"mean": [0.5, 0.5], "std": [0.2]}', "has no per-channel mean and std"),
        (b'{"mean": ["a"], "std": [0.2]}', "has no per-channel mean and std"),
        (
            b'{"mode": "native", "mean": [0.1, 0.2, 0.3, 0.4], "std": [0.1, 0.1, 0.1, 0.1]}',
            "statistics for 4 channels (mode native)",
        ),
        (b'{"mean": [0.5], "std": [0.0]}', "std of 0"),
        # `dataset-stats --mode native` of 32-bit images: their own values, not [0, 1]
        (
            b'{"mode": "native", "mean": [52092.1], "std": [28867.5]}',
            "outside [0, 1] (mode native)",
        ),
        (b'{"mean": [123.7, 116.3, 103.5], "std": [58.4, 57.1, 57.4]}', "outside [0, 1]"),
        (b'{"mean": [-0.1], "std": [0.2]}', "outside [0, 1]"),
    ],
)
def test_bad_stats_files_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "stats.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError, match=re.escape(message)):
        read_stats_file(path)


def test_stats_of_32_bit_images_in_their_own_values_are_refused(tmp_path):
    # They were taken as they are: train normalised [0, 1] pixels by a mean of about 50,000.
    import numpy as np
    from PIL import Image

    (tmp_path / "data" / "a").mkdir(parents=True)
    values = np.arange(64, dtype=np.int32).reshape(8, 8) * 1000
    Image.fromarray(values).save(tmp_path / "data" / "a" / "big.tif")
    path = tmp_path / "stats.json"
    args = ["dataset-stats", str(tmp_path / "data"), "--mode", "native", "-j", "0", "-o", str(path)]
    assert runner.invoke(app, args).exit_code == 0
    assert json.loads(path.read_text())["mean"] == [31500.0]
    with pytest.raises(InputError, match=re.escape("outside [0, 1] (mode native)")):
        read_stats_file(path)
    result = runner.invoke(app, ["train", "--data", str(tmp_path / "data"), "--stats", str(path)])
    assert result.exit_code == 1 and "outside [0, 1]" in result.stderr


def test_mean_std_options():
    assert mean_std_options("0.5", "0.25,0.25,0.25", None) == ((0.5,), (0.25, 0.25, 0.25))
    assert mean_std_options(None, None, None) == (None, None)
    with pytest.raises(UsageError, match="--stats gives the mean and std"):
        mean_std_options("0.5", None, "stats.json")
    assert parse_floats("0.08 1", "--crop-scale", 2) == (0.08, 1.0)
    for text, message in [
        ("0.1", "needs 2 numbers"),
        ("a,b", "must be numbers"),
        (",", "an empty item"),
    ]:
        with pytest.raises(UsageError, match=message):
            parse_floats(text, "--crop-scale", 2)
    with pytest.raises(UsageError, match="finite"):
        parse_floats("nan,1", "--crop-scale", 2)


def test_a_crop_scale_that_is_no_numbers_is_shown_a_crop_scale(runner):
    """Its error showed --mean's numbers: "must be numbers like 0.485,0.456,0.406"."""
    result = runner.invoke(app, ["train", "--crop-scale", "0.0_8,1", "--print-config"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "Error: --crop-scale must be numbers like 0.08,1, not '0.0_8,1'"
    )


def test_train_eval_and_extract_features_take_stats(stats_file, tmp_path):
    mean, std = read_stats_file(stats_file)
    data = stats_file.parent / "data"
    out = tmp_path / "run"
    args = ["train", "--data", str(data), "--model", "convnet", "--image-size", "8"]
    args += ["--epochs", "1", "--batch-size", "4", "--workers", "0", "--stats", str(stats_file)]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    options = json.loads((out / "config.json").read_text())["options"]
    assert (tuple(options["mean"]), tuple(options["std"])) == (mean, std)

    result = runner.invoke(app, [*args, "--mean", "0.5", "--out", str(tmp_path / "other")])
    assert result.exit_code == 2 and "--stats gives the mean and std" in result.stderr
    assert not (tmp_path / "other").exists()
    result = runner.invoke(app, [*args[:-1], str(tmp_path / "nope.json")])
    assert result.exit_code == 1 and "Error: stats file not found" in result.stderr

    evaluated = runner.invoke(
        app,
        ["eval", str(out / "best.pt"), "--data", str(data), "--split", "val", "--workers", "0",
         "--stats", str(stats_file), "--format", "json"],
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.stderr
    preprocess = json.loads(evaluated.stdout)["preprocess"]
    assert (tuple(preprocess["mean"]), tuple(preprocess["std"])) == (mean, std)

    features = tmp_path / "features"
    extracted = runner.invoke(
        app,
        ["extract-features", str(out / "best.pt"), str(data / "val"), str(features),
         "--workers", "0", "--stats", str(stats_file)],
    )  # fmt: skip
    assert extracted.exit_code == 0, extracted.stderr
    preprocess = json.loads((features / "meta.json").read_text())["preprocess"]
    assert (tuple(preprocess["mean"]), tuple(preprocess["std"])) == (mean, std)


def test_an_image_size_beyond_the_machines_memory_is_a_usage_error_before_any_work():
    """Before: eval, predict, extract-features and train with --image-size 100000 (120 GB an
    image) had the OOM killer end a loader worker (an internal error) or the command itself.
    Checked on the options alone: a regression returns here instead of allocating."""
    from torchkit.core.data.preprocessing import Preprocess, apply_overrides
    from torchkit.core.io.errors import UsageError
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.validation import validate

    imagenet = Preprocess(image_size=224, resize_size=256)
    with pytest.raises(UsageError, match=r"^--image-size 100000 \(resized to 114286 first\) "):
        apply_overrides(imagenet, image_size=100000)
    with pytest.raises(UsageError, match=r"^--image-size 100000 needs 120\.0 GB for each image"):
        validate(TrainConfig(image_size=100000))
    with pytest.raises(UsageError, match=r"^--resize-size 100000 needs"):
        validate(TrainConfig(image_size=224, resize_size=100000))
    assert apply_overrides(imagenet, image_size=4096).resize_size == 4681  # sizes people use
    validate(TrainConfig(image_size=4096))


@pytest.mark.parametrize("command", IMAGE_COMMANDS)
@pytest.mark.parametrize(
    ("side", "shown", "needed"),
    [
        (10**20, "100000000000000000000", "1.2e+32 GB"),
        (10**400, "100000000000000000...0000000000000000000", "1.2e+792 GB"),
    ],
    ids=["1e20", "1e400"],
)
def test_a_resize_size_past_memory_names_it_and_its_bytes_in_powers_of_ten(
    command, side, shown, needed, image_folder, tmp_path
):
    """Before: eval, predict and extract-features named "--image-size 8 (resized to ... first)",
    an option not given; the bytes were float noise ("120,000,000,000,000,013,645,154,049,
    064,960.0 GB"), and a side of 400 digits ended in "OverflowError: int too large to convert
    to float"."""
    from output_checks import error_line
    from processes import run_torchkit_in_process

    words = image_command(command, image_folder, tmp_path)
    result = run_torchkit_in_process(*words, "--resize-size", side)
    assert result.returncode == 2, result.stderr
    line = error_line(result.stderr)
    assert line.startswith(f"Error: --resize-size {shown} needs {needed} for each image, "), line
    assert not [path for path in tmp_path.iterdir() if path.name.startswith("out")]


def test_gigabytes_are_written_in_powers_of_ten_from_a_zettabyte():
    from torchkit.core.io.sizes import gigabytes_text

    assert gigabytes_text(120_000_000_000) == "120.0 GB"
    assert gigabytes_text(999_999_000_000_000) == "999,999.0 GB"
    assert gigabytes_text(25e9, 0) == "25 GB"
    assert gigabytes_text(1.2e15) == "1,200,000.0 GB"
    assert gigabytes_text(999_999_999_999e9) == "999,999,999,999.0 GB"
    assert gigabytes_text(1.2e21) == "1.2e+12 GB"
    assert gigabytes_text(12 * 10**40) == "1.2e+32 GB"
    assert gigabytes_text(125 * 10**798) == "1.2e+791 GB"  # beyond a float: Decimal's rounding
    assert gigabytes_text(135 * 10**798) == "1.4e+791 GB"


def test_a_crop_recorded_without_its_resize_is_resized_in_proportion(tmp_path):
    """A checkpoint recording `image_size` 8 but no `resize_size` (made by hand) was resized to
    256 and then cropped to 8: the model saw a 32x smaller view of each image. As torchvision
    and timm do, the resize follows the crop: 8 / 0.875 -> 9, as for a plain state dict."""
    from checkpoints import write_convnet_checkpoint

    from torchkit.core.data.preprocessing import Preprocess
    from torchkit.core.models import ModelSpec, resolve_spec

    assert Preprocess.from_dict({"image_size": 8}).resize_size == 9
    assert Preprocess.from_dict({"image_size": 224}).resize_size == 256
    assert Preprocess.from_dict({"image_size": 8, "resize_size": 8}).resize_size == 8
    assert Preprocess.from_dict({}).resize_size == 256
    checkpoint = tmp_path / "ck.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    for command in ("eval", "predict", "extract-features", "export"):
        resolved = resolve_spec(ModelSpec(model=str(checkpoint)), command=command)
        assert (resolved.preprocess.image_size, resolved.preprocess.resize_size) == (8, 9)
