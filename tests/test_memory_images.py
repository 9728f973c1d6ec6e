"""In-memory training images (digits) in torch: the same crops and pixels as the PIL path."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from torchkit.core.data import _sklearn_digits, digits_splits, eval_transform, make_dataset
from torchkit.core.data import train_transform as pil_train_transform
from torchkit.core.train.config import TrainConfig, resolve_defaults
from torchkit.core.train.loaders import SeededDataset, eval_dataset, preprocess_for, train_dataset
from torchkit.core.train.memory_images import MemoryImages, axis_matrix, supports


@pytest.fixture(scope="module")
def digits():
    return digits_splits()


def test_digits_are_read_without_sklearn_datasets_and_equal_load_digits():
    from sklearn.datasets import load_digits

    images, targets = _sklearn_digits()
    bunch = load_digits()
    assert np.array_equal(images, bunch.images)
    assert np.array_equal(targets, bunch.target)


@pytest.mark.parametrize("flip", [False, True])
def test_train_items_take_the_crops_and_pixels_of_the_pil_path(digits, flip):
    config = resolve_defaults(TrainConfig(), is_digits=True)
    preprocess = preprocess_for(config)
    scale = tuple(config.crop_scale) if not flip else (0.3, 1.0)
    pil = SeededDataset(
        make_dataset(digits["train"], pil_train_transform(preprocess, flip=flip, crop_scale=scale)),
        seed=3,
    )
    memory = SeededDataset(
        MemoryImages(digits["train"], preprocess, train=True, flip=flip, crop_scale=scale), seed=3
    )
    keys = [(epoch, index) for epoch in (0, 5) for index in range(0, len(digits["train"]), 7)]
    expected = pil.__getitems__(keys)
    got = memory.__getitems__(keys)
    one_level = 1.0 / 255 / min(preprocess.std) + 1e-6  # PIL rounds its fixed-point filter
    for (want, label, index, error), (have, label2, index2, error2) in zip(
        expected, got, strict=True
    ):
        assert (label, index, error) == (label2, index2, error2)
        assert have.shape == want.shape == (3, 16, 16) and have.dtype == torch.float32
        assert (have - want).abs().max().item() <= one_level
    # The model's generator is left as it was (dropout draws do not depend on the data).
    state = torch.get_rng_state()
    memory.__getitems__(keys[:4])
    assert torch.equal(state, torch.get_rng_state())


def test_eval_items_equal_the_pil_eval_transform_exactly(digits):
    preprocess = preprocess_for(resolve_defaults(TrainConfig(), is_digits=True))
    pil = make_dataset(digits["test"], eval_transform(preprocess))
    memory = eval_dataset(digits["test"], preprocess)
    assert isinstance(memory, MemoryImages)
    for index in range(len(pil)):
        assert torch.equal(memory[index][0], pil[index][0])


@pytest.mark.parametrize(("height", "width", "size"), [(8, 8, 16), (30, 20, 16), (64, 48, 13)])
def test_axis_matrices_resize_like_pil_bilinear(height, width, size):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (height, width), dtype=np.uint8)
    for top, h, left, w in [(0, height, 0, width), (1, height - 2, 2, width - 3)]:
        crop = Image.fromarray(pixels).crop((left, top, left + w, top + h))
        want = np.asarray(crop.resize((size, size), Image.BILINEAR)).astype(np.float32)
        rows, cols = axis_matrix(height, top, h, size), axis_matrix(width, left, w, size)
        have = (rows @ torch.from_numpy(pixels).float() @ cols.T).round().clamp(0, 255).numpy()
        assert np.abs(have - want).max() <= 1


def test_other_policies_and_files_take_the_pil_path(digits):
    preprocess = preprocess_for(resolve_defaults(TrainConfig(), is_digits=True))
    assert supports(digits["train"])
    assert not supports(digits["train"], augment="randaugment")
    assert not supports(digits["train"], random_erasing=0.5)
    config = resolve_defaults(TrainConfig(augment="trivialaugment"), is_digits=True)
    assert not isinstance(train_dataset(digits["train"], preprocess, config), MemoryImages)
    config = resolve_defaults(TrainConfig(), is_digits=True)
    assert isinstance(train_dataset(digits["train"], preprocess, config), MemoryImages)


def test_decode_is_validated_and_recorded():
    from torchkit.core.errors import UsageError
    from torchkit.core.train.config import validate

    with pytest.raises(UsageError, match="unknown --decode 'sloppy'"):
        validate(resolve_defaults(TrainConfig(decode="sloppy"), is_digits=True))
    assert TrainConfig().decode == "fast"


def test_train_decode_option_is_recorded_and_checked(runner, tmp_path):
    from torchkit.cli import app

    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", "digits", "--epochs", "1", "--decode", "exact", "--out", str(out),
         "-j", "0", "--format", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert json.loads((out / "config.json").read_text())["options"]["decode"] == "exact"
    refused = runner.invoke(app, ["train", "--data", "digits", "--decode", "sloppy"])
    assert refused.exit_code == 2 and "--decode" in refused.stderr
