"""Fast decoding of training JPEGs (`core.decode`, `train_transform(decode="fast")`): the
reduction rule, the same crops as the exact path (pixel for pixel where nothing is reduced, within
a few levels where a JPEG is), every kind of file and every policy through the train dataset,
seeding, and eval pixels left exactly as they were."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from image_folders import SIXTEEN_BIT_GRAY
from photos import jpeg_split_folder, photo
from PIL import Image
from seeding import seed_cpu
from torchvision import transforms as T

from torchkit.core.data.dataset import make_dataset
from torchkit.core.data.decode import (
    CropDraws,
    HorizontalFlip,
    NormalizedPixels,
    NormalizedTensor,
    PixelTensor,
    ReducedDecodeCrop,
    model_input,
    reduction_for,
)
from torchkit.core.data.image_files import load_image
from torchkit.core.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.transforms import eval_transform, train_transform
from torchkit.core.io.errors import UsageError

SIZE = 64
PREPROCESS = Preprocess(image_size=SIZE, resize_size=73)
LEVELS = torch.tensor(IMAGENET_STD).view(3, 1, 1) * 255  # normalised units -> 8-bit levels


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("decode")
    paths = {name: folder / name for name in (
        "big.jpg", "small.jpg", "photo.jpg", "gray.jpg", "cmyk.jpg", "rgb.png", "gray16.png",
        "exif_small.jpg", "exif_big.jpg", "truncated.jpg", "garbage.jpg", "corrupt.jpg",
    )}  # fmt: skip
    # Large photos upsampled from small ones: smooth, and quick to make.
    big = Image.fromarray(photo(500, 375)).resize((2000, 1500), Image.BICUBIC)
    big.save(paths["big.jpg"], quality=90)
    Image.fromarray(photo(100, 100, 1)).save(paths["small.jpg"], quality=90)
    Image.fromarray(photo(500, 375, 2)).save(paths["photo.jpg"], quality=90)
    Image.fromarray(photo(600, 450, 3)).convert("L").save(paths["gray.jpg"], quality=90)
    Image.fromarray(photo(600, 450, 4)).convert("CMYK").save(paths["cmyk.jpg"], quality=90)
    Image.fromarray(photo(120, 90, 5)).save(paths["rgb.png"])
    sixteen = (photo(120, 90, 6)[..., 0].astype(np.uint16) * 257).astype(np.uint16)
    Image.fromarray(sixteen).save(paths["gray16.png"])  # I;16
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees to display": neither path applies it
    Image.fromarray(photo(100, 80, 7)).save(paths["exif_small.jpg"], quality=90, exif=exif)
    turned = Image.fromarray(photo(400, 300, 8)).resize((1600, 1200), Image.BICUBIC)
    turned.save(paths["exif_big.jpg"], quality=90, exif=exif)
    data = paths["photo.jpg"].read_bytes()
    paths["truncated.jpg"].write_bytes(data[: len(data) // 2])
    paths["garbage.jpg"].write_bytes(b"not an image at all")
    # Whole, but a run of 0xFF bytes in the middle of its scan: libjpeg stops on it with an
    # error (after the rows above it decoded fine, so a decode that stopped early would not).
    corrupt = bytearray(paths["big.jpg"].read_bytes())
    corrupt[len(corrupt) // 3 : len(corrupt) // 3 + 8] = b"\xff" * 8
    paths["corrupt.jpg"].write_bytes(bytes(corrupt))
    return paths


def _items(paths: list[Path], decode: str, **options) -> list[tuple]:
    """(tensor, label, index, error) of each file through the train dataset, item i drawn
    with torch seeded i (what the training loaders do, per image and epoch)."""
    samples = Samples(["a"], [0] * len(paths), paths=[str(p) for p in paths])
    dataset = make_dataset(samples, train_transform(PREPROCESS, decode=decode, **options))
    items = []
    for index in range(len(paths)):
        seed_cpu(index)
        items.append(dataset[index])
    return items


def test_the_reduction_rule():
    # The largest of 1/2/4/8 that leaves the crop's shorter side at least image_size pixels.
    assert reduction_for(1500, 1500, 64) == 8
    assert reduction_for(5000, 4000, 64) == 8  # libjpeg goes no further than 1/8
    assert reduction_for(600, 256, 64) == 4
    assert reduction_for(600, 255, 64) == 2
    assert reduction_for(200, 150, 64) == 2
    assert reduction_for(128, 900, 64) == 2
    assert reduction_for(127, 900, 64) == 1
    assert reduction_for(400, 300, 224) == 1


def test_a_large_jpeg_decodes_reduced_and_a_small_one_whole(files):
    crop = ReducedDecodeCrop(SIZE)
    for seed in range(4):
        seed_cpu(seed)
        image, box, reduction = crop.decode(files["big.jpg"], "RGB")
        # Any crop of 8-100% of 2000x1500 is at least 424 px across: at least 1/4 at 64 px.
        assert reduction in (4, 8)
        assert image.size == (math.ceil(2000 / reduction), math.ceil(1500 / reduction))
        left, top, right, bottom = box
        assert 0 <= left < right <= image.width and 0 <= top < bottom <= image.height
        # The crop kept at least SIZE pixels across, and 1/(2k) would not have.
        assert min(right - left, bottom - top) >= SIZE
        assert reduction == 8 or min(right - left, bottom - top) < 2 * SIZE
    seed_cpu(0)
    image, box, reduction = crop.decode(files["small.jpg"], "RGB")
    assert reduction == 1 and image.size == (100, 100)


def test_the_crop_is_the_exact_paths_crop(files):
    # The same crop box, drawn from the same random numbers, decoded at 1/k: the pixels stay
    # within a few levels of the exact path's (a wrong box would be a different picture).
    crop = ReducedDecodeCrop(SIZE)
    full = Image.open(files["big.jpg"]).convert("RGB")
    for seed in range(4):
        seed_cpu(seed)
        fast = np.asarray(crop.from_file(files["big.jpg"], "RGB"), dtype=np.float32)
        seed_cpu(seed)
        exact = np.asarray(crop(full), dtype=np.float32)
        assert fast.shape == exact.shape == (SIZE, SIZE, 3)
        assert np.abs(fast - exact).mean() < 2.0


def test_every_kind_of_file_through_the_train_dataset(files):
    names = ["big.jpg", "photo.jpg", "small.jpg", "gray.jpg", "cmyk.jpg", "rgb.png",
             "gray16.png", "exif_small.jpg", "exif_big.jpg"]  # fmt: skip
    paths = [files[name] for name in names]
    fast, exact = _items(paths, "fast"), _items(paths, "exact")
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    low, high = (0 - mean) / torch.tensor(IMAGENET_STD).view(3, 1, 1), (1 - mean) * 255 / LEVELS
    for name, (tensor, _, _, error), reference in zip(names, fast, exact, strict=True):
        assert error == "" and reference[3] == "", name
        assert tensor.shape == reference[0].shape == (3, SIZE, SIZE), name
        assert tensor.dtype == reference[0].dtype == torch.float32, name
        assert (tensor >= low - 1e-6).all() and (tensor <= high + 1e-6).all(), name
        difference = ((tensor - reference[0]) * LEVELS).abs()
        if name in ("small.jpg", "rgb.png", "gray16.png", "exif_small.jpg"):
            # Never reduced (too small to, or not a JPEG): the exact path's tensor, bit for bit.
            assert torch.equal(tensor, reference[0]), name
        else:
            assert difference.mean() < 2.5, (name, difference.mean())
    gray = fast[names.index("gray.jpg")][0] * LEVELS + mean * 255  # back to 8-bit levels
    assert (gray.max(0).values - gray.min(0).values).max() < 0.01  # gray in RGB: equal channels
    sixteen = fast[names.index("gray16.png")][0]
    assert sixteen.mean() < high.mean() - 0.5  # scaled to 8 bits, not clipped to white


def test_exif_orientation_is_not_applied_as_by_the_exact_path(files):
    seed_cpu(0)
    image, _, reduction = ReducedDecodeCrop(SIZE).decode(files["exif_big.jpg"], "RGB")
    assert reduction > 1 and image.width > image.height  # stored 1600x1200, not turned


def test_unreadable_files_are_reported_as_by_the_exact_path(files):
    paths = [files["truncated.jpg"], files["garbage.jpg"], files["corrupt.jpg"]]
    fast, exact = _items(paths, "fast"), _items(paths, "exact")
    for path, item, reference in zip(paths, fast, exact, strict=True):
        assert item[0] is None and reference[0] is None
        assert item[3] == reference[3] and item[3].startswith(f"{path}: ")
    assert "truncated" in fast[0][3] and fast[1][3].endswith(": not an image PIL can read")
    assert "broken data stream" in fast[2][3]
    # Whatever crop is drawn (one in the rows above the damage included), in every epoch.
    crop = ReducedDecodeCrop(SIZE)
    for seed in range(6):
        seed_cpu(seed)
        with pytest.raises(OSError, match="broken data stream"):
            crop.from_file(files["corrupt.jpg"], "RGB")


@pytest.mark.parametrize(
    "options",
    [{"augment": "trivialaugment"}, {"augment": "randaugment"}, {"augment": "autoaugment"},
     {"augment": "basic", "random_erasing": 1.0}, {"augment": "basic", "flip": False}],
    ids=["trivialaugment", "randaugment", "autoaugment", "erasing", "no-flip"],
)  # fmt: skip
def test_policies_draw_the_same_random_numbers_and_are_seeded(files, options):
    paths = [files["small.jpg"], files["big.jpg"]]
    fast, exact = _items(paths, "fast", **options), _items(paths, "exact", **options)
    again = _items(paths, "fast", **options)
    # Not reduced: the same image out of the same draws, whatever the policy did to it.
    assert torch.equal(fast[0][0], exact[0][0])
    assert torch.equal(fast[1][0], again[1][0])  # reduced: still seeded
    assert fast[1][0].shape == (3, SIZE, SIZE)


def test_seeded_batches_with_workers_or_without(tmp_path):
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import build_loaders, load_splits, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    jpeg_split_folder(tmp_path / "data", train=4, val=1, size=(400, 300))
    batches = []
    for workers in (0, 2, 0):
        config = TrainConfig(data=str(tmp_path / "data"), image_size=32, workers=workers,
                             batch_size=8, seed=5)  # fmt: skip
        config = resolve_defaults(config, is_digits=False)
        loaders = build_loaders(load_splits(config).splits, preprocess_for(config), config)
        try:
            loaders.train_sampler.set_epoch(1)
            batches.append(next(iter(loaders.train)))
        finally:
            loaders.close()
    assert all(torch.equal(b.images, batches[0].images) for b in batches[1:])
    assert all(torch.equal(b.indices, batches[0].indices) for b in batches[1:])


def test_in_memory_images_and_the_none_policy_keep_the_exact_path():
    images = np.stack([photo(40, 30, seed) for seed in range(3)])
    samples = Samples(["a"], [0, 0, 0], images=images)
    for augment in ("basic", "none"):
        datasets = [
            make_dataset(samples, train_transform(PREPROCESS, augment=augment, decode=decode))
            for decode in ("fast", "exact")
        ]
        for index in range(3):
            outputs = []
            for dataset in datasets:
                seed_cpu(index)
                outputs.append(dataset[index][0])
            assert torch.equal(*outputs)
    assert not hasattr(train_transform(PREPROCESS, augment="none", decode="fast"), "from_file")


def test_normalized_tensor_is_to_tensor_then_normalize_bit_for_bit():
    statistics = {
        "RGB": (IMAGENET_MEAN, IMAGENET_STD),
        "L": ((0.45,), (0.27,)),
        "RGBA": ((0.4, 0.5, 0.6, 0.5), (0.2, 0.3, 0.25, 0.3)),  # not 8-bit RGB/L: torchvision's
    }
    for mode, (mean, std) in statistics.items():
        image = Image.fromarray(photo(33, 21)).convert(mode)
        expected = T.Compose([T.ToTensor(), T.Normalize(mean, std)])(image)
        result = NormalizedTensor(mean, std)(image)
        assert result.is_contiguous() and torch.equal(result, expected), mode


def test_eval_pixels_are_unchanged(files):
    # eval, predict and extract-features read files through load_image and eval_transform:
    # PIL's pixels, resized and cropped by torchvision, as before.
    names = ["photo.jpg", "big.jpg", "cmyk.jpg", "gray16.png"]
    samples = Samples(["a"], [0] * len(names), paths=[str(files[n]) for n in names])
    dataset = make_dataset(samples, eval_transform(PREPROCESS))
    reference = T.Compose([T.Resize(73), T.CenterCrop(SIZE), T.ToTensor(),
                           T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])  # fmt: skip
    for index, name in enumerate(names):
        image = Image.open(files[name])
        if image.mode == SIXTEEN_BIT_GRAY:
            image = Image.fromarray(np.rint(np.asarray(image) / 257.0).astype(np.uint8))
        expected = image.convert("RGB")
        assert np.array_equal(np.asarray(load_image(files[name], "RGB")), np.asarray(expected))
        assert torch.equal(dataset[index][0], reference(expected)), name


@pytest.mark.parametrize("channels", [3, 1])
def test_eval_pixels_normalised_on_the_device_are_the_float_transform_bit_for_bit(files, channels):
    # eval, predict, extract-features and training's validation pass 8-bit crops between
    # processes and normalise whole batches where the model runs (core.decode.model_input).
    mode = "RGB" if channels == 3 else "L"
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.45,), (0.27,))
    preprocess = Preprocess(
        image_size=SIZE, resize_size=73, in_channels=channels, mean=mean, std=std
    )
    names = ["photo.jpg", "big.jpg", "cmyk.jpg", "gray16.png", "rgb.png"]
    samples = Samples(["a"], [0] * len(names), paths=[str(files[n]) for n in names])
    floats = make_dataset(samples, eval_transform(preprocess), mode=mode)
    pixels = make_dataset(samples, eval_transform(preprocess, pixels=True), mode=mode)
    crops = torch.stack([pixels[i][0] for i in range(len(names))])
    assert crops.dtype == torch.uint8 and crops.shape == (len(names), channels, SIZE, SIZE)
    expected = torch.stack([floats[i][0] for i in range(len(names))])
    normalized = NormalizedPixels(mean, std)
    for layout in (torch.contiguous_format, torch.channels_last):
        result = model_input(crops, torch.device("cpu"), normalized, layout)
        assert result.is_contiguous(memory_format=layout) and torch.equal(result, expected)
    # float batches (in-memory data's loaders) are moved as they are
    assert torch.equal(model_input(expected, torch.device("cpu"), None), expected)
    with pytest.raises(TypeError, match="no normalisation"):
        model_input(crops, torch.device("cpu"), None)


def test_an_unknown_decode_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown --decode 'turbo'"):
        train_transform(PREPROCESS, decode="turbo")


@pytest.mark.parametrize(
    ("scale", "ratio"), [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 0.9), (0.2, 5.0))]
)
def test_crop_draws_are_get_params_draw_for_draw(scale, ratio):
    # The same boxes from the same seeds, and the generator left in the same state, for
    # images from tiny and extreme (the centre-crop fallback) to large.
    draws = CropDraws(scale, ratio)
    sizes = [(500, 375), (375, 500), (2000, 1500), (64, 64), (3, 1), (1, 2), (1000, 40)]
    for seed in range(60):
        for width, height in sizes:
            image = Image.new("L", (width, height))
            seed_cpu(seed)
            expected = T.RandomResizedCrop.get_params(image, list(scale), list(ratio))
            after = torch.rand(1)
            seed_cpu(seed)
            assert draws.draw(width, height) == expected, (seed, width, height)
            assert torch.equal(torch.rand(1), after)


def test_horizontal_flip_is_random_horizontal_flip():
    image = Image.fromarray(photo(20, 10))
    for seed in range(20):
        seed_cpu(seed)
        expected = np.asarray(T.RandomHorizontalFlip()(image))
        seed_cpu(seed)
        assert np.array_equal(np.asarray(HorizontalFlip()(image)), expected)


def test_pixels_then_normalised_batches_are_to_tensor_then_normalize():
    mean, std = IMAGENET_MEAN, IMAGENET_STD
    images = [Image.fromarray(photo(17, 13, seed)) for seed in range(5)]
    pixels = torch.stack([PixelTensor()(image) for image in images])
    assert pixels.dtype == torch.uint8 and pixels.shape == (5, 3, 13, 17)
    for image, item in zip(images, pixels, strict=True):
        assert torch.equal(item, T.PILToTensor()(image))
    gray = Image.fromarray(photo(9, 7)).convert("L")
    assert torch.equal(PixelTensor()(gray), T.PILToTensor()(gray))
    expected = torch.stack([T.Compose([T.ToTensor(), T.Normalize(mean, std)])(i) for i in images])
    normalized = NormalizedPixels(mean, std)
    plain = normalized(pixels)
    assert plain.is_contiguous() and torch.equal(plain, expected)
    last = normalized(pixels, torch.channels_last)
    assert last.is_contiguous(memory_format=torch.channels_last) and torch.equal(last, expected)


def test_the_train_dataset_gives_pixels_unless_random_erasing_needs_tensors(files):
    paths = [files["big.jpg"], files["small.jpg"], files["cmyk.jpg"], files["gray16.png"]]
    samples = Samples(["a"], [0] * len(paths), paths=[str(p) for p in paths])
    for erasing in (0.0, 1.0):
        transform = train_transform(PREPROCESS, decode="fast", random_erasing=erasing)
        pixels = make_dataset(samples, transform, pixels=True)
        tensors = make_dataset(samples, transform)
        for index in range(len(paths)):
            seed_cpu(index)
            item = pixels[index][0]
            seed_cpu(index)
            reference = tensors[index][0]
            assert reference.dtype == torch.float32
            if erasing:
                assert torch.equal(item, reference)
            else:
                assert item.dtype == torch.uint8 and item.shape == (3, SIZE, SIZE)
                assert torch.equal(transform.normalized(item), reference)


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory) -> Path:
    """A split root of JPEG photos (6 train, 2 val a class), read by both training tests."""
    root = tmp_path_factory.mktemp("pixel-training") / "data"
    jpeg_split_folder(root, train=6, val=2, size=(300, 200))
    return root


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels-last"])
def test_training_on_pixel_batches_ends_with_the_weights_of_tensor_batches(
    photo_folder, tmp_path, monkeypatch, channels_last
):
    # The train loader passes 8-bit pixels and the loop normalises them on the device: the
    # model sees the very floats the per-image ToTensor + Normalize gave, so a run's weights
    # are bit for bit those of a run whose loader normalised each image (after an epoch's
    # three steps: any step on other floats leaves other weights).
    import dataclasses

    from torchkit.core.train import TrainConfig, loaders, loop, run_training

    config = TrainConfig(
        data=str(photo_folder), model="nets:TinyNet", image_size=32,
        batch_size=4, epochs=1, seed=3, deterministic=True, workers=0, ema=False,
        channels_last=channels_last, device="cpu", out=str(tmp_path / "pixels"),
    )  # fmt: skip
    dtypes: list = []
    to_device = loop.to_device

    def recording(batch, ctx):
        if torch.is_grad_enabled():  # a training step (evaluation runs without gradients)
            dtypes.append(batch.images.dtype)
        images, labels = to_device(batch, ctx)
        assert images.dtype == torch.float32
        assert images.is_contiguous(
            memory_format=torch.channels_last if channels_last else torch.contiguous_format
        )
        return images, labels

    monkeypatch.setattr(loop, "to_device", recording)
    run_training(config)
    assert dtypes and set(dtypes) == {torch.uint8}
    dtypes.clear()
    make_dataset_ = loaders.make_dataset
    monkeypatch.setattr(
        loaders, "make_dataset", lambda *a, pixels=False, **k: make_dataset_(*a, **k)
    )
    run_training(dataclasses.replace(config, out=str(tmp_path / "tensors")))
    assert dtypes and set(dtypes) == {torch.float32}
    ours, reference = (
        torch.load(tmp_path / name / "last.pt", weights_only=True)["model"]
        for name in ("pixels", "tensors")
    )
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[key], reference[key]) for key in reference)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pixels_normalised_on_the_gpu_are_to_tensor_and_normalize_bit_for_bit():
    # Every level in every channel: divided by a CPU scalar, CUDA would multiply by 1/255.
    levels = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(2, 3, 16, 16)
    expected = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)(levels.float() / 255)
    normalized = NormalizedPixels(IMAGENET_MEAN, IMAGENET_STD)
    assert torch.equal(normalized(levels.cuda()).cpu(), expected)
