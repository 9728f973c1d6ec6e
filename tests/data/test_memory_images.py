"""In-memory training images (digits) in torch: RandomResizedCrop's crops, PIL's pixels."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from torchkit.core.data.batches import Batch, collate_skipping_unreadable
from torchkit.core.data.dataset import (
    default_workers,
    inference_dataset,
    inference_workers,
    make_dataset,
)
from torchkit.core.data.in_memory import InMemoryEvalImages
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources.digits import _sklearn_digits, digits_splits
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.transforms import eval_transform
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.loaders import (
    SeededDataset,
    eval_dataset,
    mix_seed,
    preprocess_for,
    train_dataset,
)
from torchkit.core.train.memory_images import MemoryImages, axis_matrix, supports, uniforms
from torchkit.core.train.validation import resolve_defaults


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
def test_train_items_are_the_pil_resized_crops_of_their_draws(digits, flip):
    import torchvision.transforms.functional as TF

    config = resolve_defaults(TrainConfig(), is_digits=True)
    preprocess = preprocess_for(config)
    scale = tuple(config.crop_scale) if not flip else (0.3, 1.0)
    images = MemoryImages(digits["train"], preprocess, train=True, flip=flip, crop_scale=scale)
    memory = SeededDataset(images, seed=3)
    keys = [(epoch, index) for epoch in (0, 5) for index in range(0, len(digits["train"]), 7)]
    draws = images.draw([memory.item_seed(epoch, index) for epoch, index in keys])
    assert any(draw[4] for draw in draws) == flip
    state = torch.get_rng_state()
    got = memory.__getitems__(keys)
    # The model's generator is left as it was (dropout draws do not depend on the data).
    assert torch.equal(state, torch.get_rng_state())
    one_level = 1.0 / 255 / min(preprocess.std) + 1e-6  # PIL rounds its fixed-point filter
    size = [preprocess.image_size] * 2
    for (_, index), (top, left, h, w, flipped), item in zip(keys, draws, got, strict=True):
        pil = Image.fromarray(digits["train"].images[index]).convert("RGB")
        pil = TF.resized_crop(pil, top, left, h, w, size, TF.InterpolationMode.BILINEAR)
        want = TF.normalize(TF.to_tensor(TF.hflip(pil) if flipped else pil), *_mean_std(preprocess))
        have, label, got_index, error = item
        assert (label, got_index, error) == (digits["train"].labels[index], index, "")
        assert have.shape == want.shape == (3, *size) and have.dtype == torch.float32
        assert (have - want).abs().max().item() <= one_level


def _mean_std(preprocess):
    return list(preprocess.mean), list(preprocess.std)


def test_draws_depend_on_the_image_seed_alone_and_follow_random_resized_crop(digits):
    from torchvision.transforms import RandomResizedCrop

    preprocess = preprocess_for(resolve_defaults(TrainConfig(), is_digits=True))
    images = MemoryImages(digits["train"], preprocess, train=True, flip=True, crop_scale=(0.3, 1))
    seeds = [mix_seed(7, index) for index in range(4000)]
    draws = images.draw(seeds)
    assert images.draw(seeds[10:20][::-1]) == draws[10:20][::-1]  # batch order does not matter
    other_run = SeededDataset(images, seed=8)
    assert images.draw([other_run.item_seed(0, index) for index in range(20)]) != images.draw(
        [SeededDataset(images, seed=7).item_seed(0, index) for index in range(20)]
    )
    boxes = np.array([draw[:4] for draw in draws])
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 8).all() and (left + w <= 8).all()
    flips = np.array([draw[4] for draw in draws])
    assert 0.45 < flips.mean() < 0.55
    # Same distribution as torchvision's get_params (area and aspect draws, tries, fallback).
    torch.manual_seed(0)
    blank = torch.zeros(1, 8, 8)
    reference = np.array(
        [RandomResizedCrop.get_params(blank, (0.3, 1.0), (3 / 4, 4 / 3)) for _ in range(4000)]
    )
    assert np.abs(boxes.mean(0) - reference.mean(0)).max() < 0.1
    assert np.abs(boxes.std(0) - reference.std(0)).max() < 0.1
    whole = (boxes[:, 2:] == 8).all(1).mean(), (reference[:, 2:] == 8).all(1).mean()
    assert abs(whole[0] - whole[1]) < 0.02


def test_uniforms_are_uniform_and_independent():
    values = uniforms(np.arange(50_000, dtype=np.uint64), 3)
    assert values.shape == (50_000, 3) and values.min() >= 0 and values.max() < 1
    assert np.abs(np.histogram(values[:, 0], bins=10, range=(0, 1))[0] / 5000 - 1).max() < 0.05
    assert abs(np.corrcoef(values[:, 0], values[:, 1])[0, 1]) < 0.02
    assert abs(np.corrcoef(values[:-1, 2], values[1:, 2])[0, 1]) < 0.02


@pytest.mark.parametrize(
    ("image_size", "resize_size", "interpolation"),
    [(12, 12, "bilinear"), (16, 16, "bilinear"), (10, 13, "bicubic"), (9, 9, "nearest")],
)
def test_eval_items_equal_the_pil_eval_transform_exactly(
    digits, image_size, resize_size, interpolation
):
    config = TrainConfig(
        image_size=image_size, resize_size=resize_size, interpolation=interpolation
    )
    preprocess = preprocess_for(resolve_defaults(config, is_digits=True))
    pil = make_dataset(digits["test"], eval_transform(preprocess))
    memory = eval_dataset(digits["test"], preprocess)
    assert isinstance(memory, MemoryImages)
    for index in range(len(pil)):
        assert torch.equal(memory[index][0], pil[index][0])


@pytest.mark.parametrize(
    ("image_size", "resize_size", "interpolation", "mode"),
    [(12, 12, "bilinear", "RGB"), (16, 18, "bicubic", "RGB"), (10, 13, "bilinear", "L"),
     (9, 9, "nearest", "L")],
)  # fmt: skip
def test_inference_crops_of_images_in_memory_are_the_eval_transforms_without_torchvision(
    digits, image_size, resize_size, interpolation, mode
):
    """What eval, predict and extract-features read from the built-in digits: the 8-bit crops of
    the pixel eval transform, to the bit, made once without torchvision; no loader workers."""
    config = TrainConfig(
        image_size=image_size, resize_size=resize_size, interpolation=interpolation
    )
    preprocess = preprocess_for(resolve_defaults(config, is_digits=True))
    samples = digits["test"]
    ours = inference_dataset(samples, preprocess, mode=mode, decode="exact")
    assert isinstance(ours, InMemoryEvalImages)
    transform = eval_transform(preprocess, pixels=True)
    reference = make_dataset(samples, transform, mode=mode, pixels=True)
    assert len(ours) == len(reference) == len(samples)
    for index in range(len(samples)):
        crop, label, position, error = ours[index]
        want = reference[index]
        assert crop.dtype == torch.uint8 and torch.equal(crop, want[0])
        assert (label, position, error) == want[1:]
    assert inference_workers(samples, None) == 0
    assert inference_workers(samples, 3) == 3
    files = Samples(paths=["a.png"], labels=[0], classes=["a"])
    assert inference_workers(files, None) == default_workers()
    # JPEG bytes for the device are the files' way: in-memory images go through it unchanged
    assert not isinstance(inference_dataset(samples, preprocess, mode=mode, decode="device"),
                          InMemoryEvalImages)  # fmt: skip


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
    config = resolve_defaults(TrainConfig(interpolation="bicubic"), is_digits=True)
    bicubic = preprocess_for(config)
    assert not isinstance(train_dataset(digits["train"], bicubic, config), MemoryImages)
    assert isinstance(eval_dataset(digits["test"], bicubic), MemoryImages)
    config = resolve_defaults(TrainConfig(), is_digits=True)
    assert isinstance(train_dataset(digits["train"], preprocess, config), MemoryImages)


def test_decode_is_validated_and_recorded():
    from torchkit.core.io.errors import UsageError
    from torchkit.core.train.validation import validate

    with pytest.raises(UsageError, match="unknown --decode 'sloppy'"):
        validate(resolve_defaults(TrainConfig(decode="sloppy"), is_digits=True))
    assert TrainConfig().decode == "auto"  # fast unless training on CUDA from JPEGs


def test_train_decode_option_is_recorded_and_checked(runner, tmp_path, monkeypatch):
    from torchkit.cli import app

    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", "digits", "--epochs", "1", "--decode", "exact", "--out", str(out),
         "--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "512",
         "-j", "0", "--format", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert json.loads((out / "config.json").read_text())["options"]["decode"] == "exact"
    refused = runner.invoke(app, ["train", "--data", "digits", "--decode", "sloppy"])
    assert refused.exit_code == 2 and "--decode" in refused.stderr


def test_a_whole_epoch_transformed_at_once_gives_each_batch_the_same_pixels(digits, monkeypatch):
    from torchkit.core.train import memory_images

    preprocess = preprocess_for(resolve_defaults(TrainConfig(), is_digits=True))
    images = MemoryImages(digits["train"], preprocess, train=True, flip=True, crop_scale=(0.3, 1))
    assert images.renders_whole_epochs  # the digits: 1,438 images of 3x12x12
    order = np.random.default_rng(0).permutation(len(images)).tolist()
    keys = [(epoch, index) for epoch in (0, 1, 0) for index in order]  # an epoch again, too
    whole = SeededDataset(images, seed=3)
    for start in range(0, len(keys), 32):
        batch = keys[start : start + 32]
        got = whole.__getitems__(batch)
        if len({epoch for epoch, _ in batch}) == 1:
            assert isinstance(got, Batch)  # collated already: the loader's collate passes it on
            assert collate_skipping_unreadable(got) is got
        else:  # a batch across two epochs (no loader makes one) is items, as any dataset's
            got = collate_skipping_unreadable(got)
        # the batch transformed on its own, as data too large for a whole epoch is, then
        # collated as every other dataset's items are
        draws = images.draw_arrays([whole.item_seed(epoch, index) for epoch, index in batch])
        want = collate_skipping_unreadable(images.items([index for _, index in batch], draws))
        for name in ("images", "labels", "indices"):
            mine, theirs = getattr(got, name), getattr(want, name)
            assert mine.dtype == theirs.dtype and mine.is_contiguous(), name
            assert torch.equal(mine, theirs), name
        assert got.errors == want.errors == []
    assert whole._rendered is not None  # the whole-epoch path was the one taken
    # larger data takes the batch-at-a-time path compared with above
    monkeypatch.setattr(memory_images, "WHOLE_EPOCH_BYTES", 1024)
    assert not images.renders_whole_epochs
    apart = SeededDataset(images, seed=3)
    apart.__getitems__(keys[:32])
    assert apart._rendered is None
    # evaluation images are transformed once, not per epoch
    assert not MemoryImages(digits["val"], preprocess, train=False).renders_whole_epochs


def test_a_loader_worker_transforms_its_batches_not_the_whole_epoch(digits, monkeypatch):
    preprocess = preprocess_for(resolve_defaults(TrainConfig(), is_digits=True))
    images = MemoryImages(digits["train"], preprocess, train=True)
    dataset = SeededDataset(images, seed=3)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())  # in a worker
    keys = [(0, index) for index in range(32)]
    got = dataset.__getitems__(keys)
    assert dataset._rendered is None  # each worker would have transformed all 1,438 images
    monkeypatch.undo()
    worker_batch = collate_skipping_unreadable(got)
    main_batch = dataset.__getitems__(keys)  # the whole epoch's, cut
    assert dataset._rendered is not None
    assert torch.equal(worker_batch.images, main_batch.images)
    assert torch.equal(worker_batch.labels, main_batch.labels)
    # one item at a time (the map-style protocol) gives items, not a batch
    image, label, index, error = dataset[keys[5]]
    assert torch.equal(image, main_batch.images[5]) and (label, index, error) == (
        int(main_batch.labels[5]),
        5,
        "",
    )


@pytest.mark.parametrize(("image_size", "resize_size"), [(12, 9), (11, 8), (10, 8)])
def test_crops_larger_than_the_resized_digits_are_padded_as_torchvision_pads_them(
    digits, image_size, resize_size
):
    # A model may record a resize smaller than its crop: eval, predict and extract-features
    # on the built-in digits must pad it with zeros where torchvision's CenterCrop does.
    preprocess = Preprocess(image_size=image_size, resize_size=resize_size)
    samples = digits["test"]
    ours = inference_dataset(samples, preprocess, mode="RGB", decode="exact")
    assert isinstance(ours, InMemoryEvalImages)
    reference = make_dataset(samples, eval_transform(preprocess, pixels=True), pixels=True)
    for index in range(20):
        assert torch.equal(ours[index][0], reference[index][0])
