"""Augmentation policies, random erasing and the interpolation: shapes, dtypes and seeding of
each policy; the interpolation recorded in the checkpoint, which eval then uses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from torchkit.cli import app
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.transforms import AUGMENT_POLICIES, train_transform
from torchkit.core.models.checkpoint import load_checkpoint

PREPROCESS = Preprocess(image_size=24, resize_size=28)


@pytest.fixture(scope="module")
def image() -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 256, (40, 30, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize("policy", AUGMENT_POLICIES)
def test_each_policy_gives_a_normalised_float_tensor_and_is_seeded(image, policy):
    transform = train_transform(PREPROCESS, augment=policy, randaugment_magnitude=12)
    torch.manual_seed(3)
    first = transform(image)
    torch.manual_seed(3)
    again = transform(image)
    assert first.shape == (3, 24, 24) and first.dtype == torch.float32
    assert torch.equal(first, again)  # the same seed, the same augmentation
    if policy != "none":
        outputs = set()
        for seed in range(6):
            torch.manual_seed(seed)
            outputs.add(transform(image).sum().item())
        assert len(outputs) > 1  # and other seeds, other augmentations


def test_random_erasing_erases(image):
    torch.manual_seed(0)
    erased = train_transform(PREPROCESS, augment="none", random_erasing=1.0)(image)
    plain = train_transform(PREPROCESS, augment="none")(image)
    assert (erased == 0).sum() > 0 and not torch.equal(erased, plain)


def test_bad_augment_options_are_usage_errors(runner):
    for args, message in (
        (["--augment", "mixall"], "--augment"),
        (["--random-erasing", "1.5"], "--random-erasing is a probability"),
        (["--randaugment-magnitude", "40"], "--randaugment-magnitude"),
    ):
        result = runner.invoke(app, ["train", "--print-config", *args])
        assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_the_interpolation_and_policy_are_recorded_and_eval_uses_them(
    runner, tmp_path, make_image_folder
):
    data = tmp_path / "data"
    make_image_folder(data / "train", {"a": 4, "b": 4}, size=12)
    make_image_folder(data / "val", {"a": 2, "b": 2}, size=12, seed=1)
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--model", "convnet", "--image-size", "8", "--epochs", "1",
         "-j", "0", "--augment", "trivialaugment", "--random-erasing", "0.25",
         "--interpolation", "bicubic", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    checkpoint = load_checkpoint(out / "best.pt")
    assert checkpoint["preprocess"]["interpolation"] == "bicubic"
    options = json.loads((out / "config.json").read_text())["options"]
    assert options["augment"] == "trivialaugment" and options["random_erasing"] == 0.25
    evaluated = runner.invoke(
        app, ["eval", str(out / "best.pt"), "--data", str(data), "--split", "val", "--format",
              "json", "-j", "0"],
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["preprocess"]["interpolation"] == "bicubic"
