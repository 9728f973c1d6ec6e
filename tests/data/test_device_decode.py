"""Training JPEGs decoded on the device (`core.device_decode`, `train --decode device`), tested
with device="cpu" (torchvision decodes JPEG batches with libjpeg-turbo there), and on CUDA where
there is a GPU (`-m cuda`).

The tolerance (measured on photo-like 500x375 and 375x500 JPEGs, quality 90, RGB and grayscale,
40 seeds, 64 and 224 px crops): on the CPU the device path's 8-bit crops are within 1 level of
255 of the exact PIL path's (PIL decodes whole, crops, resizes, flips), mean 0.09-0.17 levels
(bilinear, bicubic), identical for nearest; the tests hold max 1, mean 0.25. Against the fast
path (reduced decode) the mean stays under 2.5 levels, the fast path's own distance from exact.
The crop boxes and flips are the fast and exact paths' own, draw for draw.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from photos import (  # the same photo-like test images
    MAX_LEVELS,
    MEAN_LEVELS,
    device_decode_cases,
    jpeg_split_folder,
    level_differences,
    photo,
)
from PIL import Image
from seeding import seed_cpu
from torchvision import transforms as T

from torchkit.core.data.batches import Batch, collate_skipping_unreadable
from torchkit.core.data.crop_resize import resize_crop, resize_crops
from torchkit.core.data.dataset import make_dataset
from torchkit.core.data.decode import NormalizedPixels, pil_resample
from torchkit.core.data.device_decode import (
    DeviceDecodeTransform,
    EncodedImages,
    EncodedJpeg,
    collate_encoded,
    decode_jpegs,
    decoded_batch,
    decoded_on_cpu,
    resolve_decode,
)
from torchkit.core.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.transforms import train_transform
from torchkit.core.io.errors import UsageError

SIZE = 64
PREPROCESS = Preprocess(image_size=SIZE, resize_size=73)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return device_decode_cases(tmp_path_factory.mktemp("device-decode"))


def _dataset(paths: list[Path], decode: str, **options):
    samples = Samples(["a", "b"], [i % 2 for i in range(len(paths))], paths=[str(p) for p in paths])
    transform = train_transform(PREPROCESS, decode=decode, **options)
    return make_dataset(samples, transform, pixels=True), transform


def _items(paths: list[Path], decode: str, **options) -> list[tuple]:
    """Item i of the train dataset drawn with torch seeded i (as the loaders seed each image)."""
    dataset, _ = _dataset(paths, decode, **options)
    items = []
    for index in range(len(paths)):
        seed_cpu(index)
        items.append(dataset[index])
    return items


def _exact_pixels(path: Path, seed: int, interpolation: str = "bilinear", size: int = SIZE):
    """The exact path's 8-bit crop: PIL decodes whole, RandomResizedCrop, RandomHorizontalFlip."""
    return _exact_crop(Image.open(path).convert("RGB"), seed, interpolation, size)


def _exact_crop(image: Image.Image, seed: int, interpolation: str = "bilinear", size: int = SIZE):
    """`_exact_pixels` of the RGB image PIL decoded whole (the transforms leave it as it is)."""
    mode = T.InterpolationMode(interpolation)
    steps = T.Compose([T.RandomResizedCrop(size, interpolation=mode), T.RandomHorizontalFlip()])
    seed_cpu(seed)
    return T.PILToTensor()(steps(image))


@pytest.fixture(scope="module")
def whole_decodes(files) -> dict[str, Image.Image]:
    """Each photo of `files` as PIL decodes it whole, in RGB: decoded once, cropped many times."""
    return {
        name: Image.open(path).convert("RGB")
        for name, path in files.items()
        if name in ("wide.jpg", "tall.jpg", "gray.jpg", "big.jpg", "mpo.jpg")
    }


def _decoded(items: list[tuple], device: str = "cpu") -> Batch:
    return decoded_batch(collate_encoded(items), device)


def test_crop_boxes_and_flips_are_the_fast_and_exact_paths_draws(files):
    # The same random numbers in the same order: the box and the flip of each seed are
    # RandomResizedCrop.get_params' and RandomHorizontalFlip's, and torch's generator is left
    # where the fast path leaves it.
    _, transform = _dataset([], "device")
    _, fast = _dataset([], "fast")
    for name in ("wide.jpg", "tall.jpg", "gray.jpg", "big.jpg", "trailing.jpg"):
        path = files[name]
        image = Image.open(path)
        flips = 0
        for seed in range(25):
            seed_cpu(seed)
            item = transform.pixels_from_file(path, "RGB")
            after = torch.rand(1)
            if name == "trailing.jpg":  # bytes after the end marker: today's path
                assert isinstance(item, torch.Tensor)
                continue
            assert isinstance(item, EncodedJpeg)
            seed_cpu(seed)
            expected = T.RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3])
            flip = bool(torch.rand(1) < 0.5)
            assert item.box == expected and item.flip == flip, (name, seed)
            flips += flip
            seed_cpu(seed)
            fast.pixels_from_file(path, "RGB")
            assert torch.equal(torch.rand(1), after)
        assert name == "trailing.jpg" or 0 < flips < 25
    seed_cpu(0)
    no_flip = train_transform(PREPROCESS, decode="device", flip=False)
    assert no_flip.pixels_from_file(files["wide.jpg"], "RGB").flip is False


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
def test_pixels_resized_either_way_are_within_the_stated_tolerance_of_the_exact_path(
    files, whole_decodes, interpolation, monkeypatch
):
    # Both ways to resize (core.crop_resize): the CPU's own (image by image) and CUDA's (the
    # whole batch in two products), each through the whole decode path, on the same draws
    # (the exact path's crops are made once for both).
    resize = {"batched": False}
    monkeypatch.setattr(
        "torchkit.core.data.device_decode.resize_crops",
        lambda *args, **kwargs: resize_crops(*args, **kwargs, batched=resize["batched"]),
    )
    preprocess = Preprocess(image_size=SIZE, resize_size=73, interpolation=interpolation)
    names = ["wide.jpg", "tall.jpg", "gray.jpg", "big.jpg", "mpo.jpg"]
    samples = Samples(["a"], [0] * len(names), paths=[str(files[n]) for n in names])
    dataset = make_dataset(samples, train_transform(preprocess, decode="device"), pixels=True)
    differences: dict[bool, list[torch.Tensor]] = {False: [], True: []}
    for seed in range(12):
        items = []
        for index in range(len(names)):
            seed_cpu(seed * 100 + index)
            items.append(dataset[index])
        assert collate_encoded(items).images.encoded_at == [0, 1, 2, 3, 4]  # all on the device
        expected = [
            _exact_crop(whole_decodes[name], seed * 100 + index, interpolation)
            for index, name in enumerate(names)
        ]
        for batched in (False, True):
            resize["batched"] = batched
            batch = _decoded(items)
            assert batch.images.dtype == torch.uint8 and batch.images.shape == (5, 3, SIZE, SIZE)
            for index in range(len(names)):
                differences[batched].append(level_differences(batch.images[index], expected[index]))
    for batched, found in differences.items():
        levels = torch.stack(found)
        if interpolation == "nearest":
            assert levels.max() == 0, batched  # nearest-exact picks PIL's pixel
        assert levels.max() <= MAX_LEVELS and levels.mean() <= MEAN_LEVELS, (
            batched,
            float(levels.max()),
            float(levels.mean()),
        )


def test_gray_jpegs_give_three_equal_channels_as_pil_converts_them(files):
    seed_cpu(3)
    batch = _decoded([_dataset([files["gray.jpg"]], "device")[0][0]])
    image = batch.images[0].to(torch.int16)
    assert torch.equal(image[0], image[1]) and torch.equal(image[1], image[2])


def test_the_fast_path_is_as_far_from_exact_as_ever(files):
    # Reduced decoding (fast) against whole decoding (device, exact): the same crops, a few
    # levels apart on average, as test_decode measures for fast against exact.
    paths = [files["big.jpg"], files["wide.jpg"], files["tall.jpg"]]
    device = _decoded(_items(paths, "device")).images
    fast = torch.stack([item[0] for item in _items(paths, "fast")])
    assert level_differences(device, fast).mean() < 2.5


def test_interpolate_is_closer_to_pil_than_roi_align(files):
    # Why the crops are resized with PIL's filter (F.interpolate(antialias=True), or the batched
    # products of core.crop_resize) rather than by one torchvision.ops.roi_align over the
    # batch: roi_align averages bilinear samples and lands several levels from PIL's filter.
    from torchvision.ops import roi_align

    data = files["wide.jpg"].read_bytes()
    image = decode_jpegs([torch.frombuffer(bytearray(data), dtype=torch.uint8)], "cpu")[0]
    full = Image.open(files["wide.jpg"]).convert("RGB")
    ours, roi = [], []
    for seed in range(10):
        seed_cpu(seed)
        top, left, height, width = T.RandomResizedCrop.get_params(full, [0.08, 1], [3 / 4, 4 / 3])
        crop = full.crop((left, top, left + width, top + height))
        expected = T.PILToTensor()(crop.resize((SIZE, SIZE), pil_resample("bilinear")))
        resized = resize_crop(image, (top, left, height, width), SIZE, "bilinear")
        ours.append(level_differences(resized.round(), expected))
        batched = resize_crops([image], [(top, left, height, width)], [False], SIZE, "bilinear",
                               batched=True)  # fmt: skip
        ours.append(level_differences(batched[0], expected))
        box = torch.tensor([[0, left, top, left + width, top + height]], dtype=torch.float32)
        aligned = roi_align(image[None].float(), box, (SIZE, SIZE), 1.0, -1, aligned=True)
        roi.append(level_differences(aligned[0].round(), expected))
    assert torch.stack(ours).mean() < torch.stack(roi).mean() / 2
    assert torch.stack(ours).max() <= MAX_LEVELS < torch.stack(roi).max()


def test_what_is_not_a_plain_jpeg_takes_todays_path_in_the_worker(files):
    # PNGs (by suffix or by content), CMYK JPEGs and JPEGs with bytes after their end: the fast
    # path's own crop, bit for bit, from the same draws.
    names = ["rgb.png", "png_named.jpg", "cmyk.jpg", "trailing.jpg"]
    paths = [files[name] for name in names]
    device, fast = _items(paths, "device"), _items(paths, "fast")
    for name, item, reference in zip(names, device, fast, strict=True):
        assert isinstance(item[0], torch.Tensor) and item[0].dtype == torch.uint8, name
        assert torch.equal(item[0], reference[0]) and item[1:] == reference[1:], name


def test_a_batch_mixes_both_paths_in_order(files):
    names = ["wide.jpg", "rgb.png", "gray.jpg", "cmyk.jpg", "tall.jpg"]
    paths = [files[name] for name in names]
    items = _items(paths, "device")
    batch = collate_encoded(items)
    assert isinstance(batch.images, EncodedImages) and len(batch.images) == 5
    assert batch.images.encoded_at == [0, 2, 4] and batch.images.pixels_at == [1, 3]
    assert batch.images.data.numel() == sum(files[n].stat().st_size for n in names[::2])
    decoded = decoded_batch(batch, "cpu")
    assert decoded.images.shape == (5, 3, SIZE, SIZE) and decoded.errors == []
    assert decoded.indices.tolist() == [0, 1, 2, 3, 4]
    assert decoded.labels.tolist() == [0, 1, 0, 1, 0]
    for index in (1, 3):
        assert torch.equal(decoded.images[index], items[index][0])
    for index in (0, 2, 4):
        expected = _exact_pixels(paths[index], index)
        assert level_differences(decoded.images[index], expected).max() <= MAX_LEVELS
    # No JPEG for the device: exactly what the other paths' collate gives.
    plain = collate_encoded([items[1], items[3]])
    reference = collate_skipping_unreadable([items[1], items[3]])
    assert torch.equal(plain.images, reference.images) and plain.errors == reference.errors
    assert decoded_batch(plain, "cpu") is plain


def test_the_two_halves_of_a_decode_give_what_it_gives(files):
    # What the two decoding threads do (`core.decode_ahead`): the JPEG decoder, then the crops.
    from torchkit.core.data.device_decode import DecodedJpegs, cropped_batch, jpegs_decoded

    paths = [files[name] for name in ["wide.jpg", "rgb.png", "gray.jpg"]]
    batch = collate_encoded(_items(paths, "device"))
    started = jpegs_decoded(batch, "cpu")
    assert isinstance(started, DecodedJpegs) and len(started.decoded) == 2  # the 2 JPEGs
    halves, whole = cropped_batch(started, "cpu"), decoded_batch(batch, "cpu")
    assert torch.equal(halves.images, whole.images) and halves.errors == whole.errors
    assert torch.equal(halves.labels, whole.labels)
    plain = collate_encoded(_items([files["rgb.png"]], "device"))  # no JPEG: as it is
    assert jpegs_decoded(plain, "cpu") is plain and cropped_batch(plain, "cpu") is plain


def test_unreadable_files_are_reported_and_skipped_as_today(files):
    # Truncated (no end marker) and unidentifiable files fail in the worker, a corrupt scan in
    # the main process (the decoder, then PIL): the same `path: reason` as today's path, and
    # the batch keeps the readable images with their labels.
    names = ["truncated.jpg", "wide.jpg", "garbage.jpg", "corrupt.jpg", "magic.jpg", "tall.jpg"]
    paths = [files[name] for name in names]
    device, fast = _items(paths, "device"), _items(paths, "fast")
    batch = _decoded(device)
    expected = [item[3] for item in fast if item[0] is None]
    assert len(expected) == 4 and sorted(batch.errors) == sorted(expected)
    assert any("broken data stream" in error for error in batch.errors)
    assert any("truncated" in error for error in batch.errors)
    assert f"{files['garbage.jpg']}: not an image PIL can read" in batch.errors
    assert batch.indices.tolist() == [1, 5] and batch.labels.tolist() == [1, 1]
    assert batch.images.shape == (2, 3, SIZE, SIZE)
    # Every image unreadable: no images, the errors.
    nothing = _decoded([device[3]])
    assert nothing.images is None and nothing.labels is None and len(nothing.errors) == 1


def test_a_jpeg_the_device_cannot_decode_is_decoded_by_pil(files, monkeypatch):
    # nvJPEG refuses some JPEGs libjpeg reads: PIL decodes those in the main process with the
    # box and flip drawn for them, as the exact path would.
    from torchkit.core.data import device_decode

    real = device_decode.decode_jpegs
    monkeypatch.setattr(
        device_decode,
        "decode_jpegs",
        lambda chunks, device: [None if i == 1 else x for i, x in enumerate(real(chunks, device))],
    )
    paths = [files["wide.jpg"], files["tall.jpg"], files["gray.jpg"]]
    batch = _decoded(_items(paths, "device"))
    assert batch.errors == [] and batch.images.shape == (3, 3, SIZE, SIZE)
    assert torch.equal(batch.images[1], _exact_pixels(files["tall.jpg"], 1))


def test_a_decoder_that_takes_no_lists_decodes_one_by_one_from_then_on(files, monkeypatch):
    # torchvision 0.19 decodes lists of JPEGs on CUDA only: on the CPU each image is decoded
    # alone, and the list is not offered again.
    import torchvision.io

    from torchkit.core.data import device_decode

    decode_jpeg = torchvision.io.decode_jpeg
    calls = []

    def no_lists(data, **kwargs):
        calls.append(type(data).__name__)
        if isinstance(data, list):
            raise RuntimeError("Expected a value of type 'Tensor' for argument 'data'")
        return decode_jpeg(data, **kwargs)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", no_lists)
    monkeypatch.setattr(device_decode, "_NO_LISTS", set())
    paths = [files["wide.jpg"], files["tall.jpg"]]
    expected = _decoded(_items(paths, "device")).images
    assert calls == ["list", "Tensor", "Tensor"]
    calls.clear()
    assert torch.equal(_decoded(_items(paths, "device")).images, expected)
    assert calls == ["Tensor", "Tensor"]


def test_a_decoder_that_refuses_everything_leaves_it_to_pil_and_says_so(files, monkeypatch, caplog):
    # torchvision built without nvJPEG, say: every JPEG still trains (PIL, in the main
    # process), and one warning says why the run is slow.
    import torchvision.io

    from torchkit.core.data import device_decode

    def refuse(*args, **kwargs):
        raise RuntimeError("no JPEG decoder on this device")

    monkeypatch.setattr(torchvision.io, "decode_jpeg", refuse)
    monkeypatch.setattr(device_decode, "_WARNED", set())
    paths = [files["wide.jpg"], files["gray.jpg"]]
    with caplog.at_level("WARNING", logger="torchkit"):
        for _ in range(2):
            batch = _decoded(_items(paths, "device"))
    assert batch.errors == [] and batch.images.shape == (2, 3, SIZE, SIZE)
    for index, path in enumerate(paths):
        assert torch.equal(batch.images[index], _exact_pixels(path, index))
    warnings = [r.getMessage() for r in caplog.records if "refused every image" in r.getMessage()]
    assert len(warnings) == 1 and "no JPEG decoder on this device" in warnings[0]


def test_from_file_is_the_decoded_crop_normalised(files):
    # make_dataset without `pixels`: one image decoded on the CPU as the device path decodes it.
    samples = Samples(["a"], [0], paths=[str(files["wide.jpg"])])
    transform = train_transform(PREPROCESS, decode="device")
    assert isinstance(transform, DeviceDecodeTransform)
    seed_cpu(4)
    tensor = make_dataset(samples, transform)[0][0]
    seed_cpu(4)
    pixels = _decoded([make_dataset(samples, transform, pixels=True)[0]]).images
    assert torch.equal(tensor, NormalizedPixels(IMAGENET_MEAN, IMAGENET_STD)(pixels)[0])
    failed = make_dataset(Samples(["a"], [0], paths=[str(files["corrupt.jpg"])]), transform)[0]
    assert failed[0] is None and "broken data stream" in failed[3]


@pytest.mark.parametrize(
    "options",
    [{"augment": "trivialaugment"}, {"augment": "randaugment"}, {"augment": "autoaugment"},
     {"augment": "basic", "random_erasing": 0.5}, {"augment": "none"}],
    ids=["trivialaugment", "randaugment", "autoaugment", "erasing", "none"],
)  # fmt: skip
def test_pil_policies_are_refused_on_the_device_and_keep_fast_under_auto(options):
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.validation import resolve_defaults

    with pytest.raises(UsageError, match="--decode device cannot run these transforms"):
        train_transform(PREPROCESS, decode="device", **options)
    with pytest.raises(UsageError, match="--decode device cannot run these transforms"):
        resolve_defaults(TrainConfig(data="x", decode="device", **options), is_digits=False)
    decode, note = resolve_decode(
        "auto",
        device_type="cuda",
        paths=["a.jpg"],
        augment=options["augment"],
        random_erasing=options.get("random_erasing", 0.0),
    )
    assert decode == "fast" and "--decode fast" in note


def test_auto_is_device_on_cuda_from_jpeg_files_and_fast_otherwise():
    def resolved(decode="auto", device_type="cuda", paths=("a.jpg", "b.JPEG", "c.png")):
        return resolve_decode(
            decode, device_type=device_type, paths=list(paths) if paths else paths,
            augment="basic", random_erasing=0.0,
        )  # fmt: skip

    assert resolved() == ("device", None)
    assert resolved(device_type="cpu") == ("fast", None)  # today's default on CPUs
    assert resolved(device_type="mps") == ("fast", None)
    assert resolved(paths=("a.png", "b.png", "c.jpg")) == ("fast", None)
    assert resolved(paths=None) == ("fast", None)  # in-memory images (digits)
    for explicit in ("device", "fast", "exact"):
        assert resolved(explicit, device_type="cpu") == (explicit, None)


def test_decode_options_are_validated():
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.validation import resolve_defaults

    assert TrainConfig().decode == "auto"
    with pytest.raises(UsageError, match="unknown --decode 'gpu'"):
        resolve_defaults(TrainConfig(data="x", decode="gpu"), is_digits=False)
    with pytest.raises(UsageError, match="unknown --decode 'auto'"):
        train_transform(PREPROCESS, decode="auto")  # resolved by the run, never by a transform


def _jpeg_folder(root: Path, *, train: int, val: int) -> Path:
    jpeg_split_folder(root, train=train, val=val, size=(60, 45))
    (root / "train" / "a" / "odd.png").write_bytes(  # one non-JPEG among them
        _png_bytes(photo(40, 30, 99))
    )
    return root


def _png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_seeded_batches_are_the_same_with_workers_or_without(tmp_path):
    # Workers read the bytes and draw; the main process decodes: the same batches whoever reads
    # them (the bytes reach the main process through one shared-memory block per batch).
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import build_loaders, load_splits, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    root = _jpeg_folder(tmp_path / "data", train=5, val=1)
    batches = []
    for workers in (0, 2):
        config = resolve_defaults(
            TrainConfig(data=str(root), image_size=16, workers=workers, batch_size=8, seed=5,
                        decode="device"),
            is_digits=False,
        )  # fmt: skip
        loaders = build_loaders(load_splits(config).splits, preprocess_for(config), config)
        try:
            loaders.train_sampler.set_epoch(1)
            raw = next(iter(loaders.train))
            assert isinstance(raw.images, EncodedImages) and len(raw.images.pixels_at) <= 1
            batches.append(decoded_batch(raw, "cpu"))
        finally:
            loaders.close()
    assert torch.equal(batches[0].images, batches[1].images)
    assert torch.equal(batches[0].indices, batches[1].indices)
    assert torch.equal(batches[0].labels, batches[1].labels)


def test_drop_last_is_asked_for_and_never_drops_the_only_batch(tmp_path):
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import build_loaders, load_splits, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    root = _jpeg_folder(tmp_path / "data", train=5, val=1)  # 11 training images
    lengths = {}
    for batch_size, drop_last in ((4, False), (4, True), (16, True)):
        config = resolve_defaults(
            TrainConfig(data=str(root), image_size=16, workers=0, batch_size=batch_size),
            is_digits=False,
        )
        loaders = build_loaders(
            load_splits(config).splits, preprocess_for(config), config, drop_last=drop_last
        )
        lengths[batch_size, drop_last] = len(loaders.train)
    assert lengths == {(4, False): 3, (4, True): 2, (16, True): 1}


def _train(runner, root: Path, out: Path, *options: str):
    """`torchkit train` of TinyNet at 16 px, batches of 4, on the CPU, in this process."""
    from torchkit.cli import app

    return runner.invoke(
        app,
        ["train", "--data", str(root), "--model", "nets:TinyNet", "--image-size",
         "16", "--batch-size", "4", "--device", "cpu", "-j", "0", "--out", str(out), *options],
    )  # fmt: skip


def test_train_decode_device_on_the_cpu_decodes_in_the_loop_and_writes_checkpoints(
    runner, tmp_path, monkeypatch
):
    # Every training step gets normalised float images from uint8 crops the loop decoded
    # (channels-last too), and the run records what it was asked.
    from torchkit.core.train import loop

    seen: list = []
    to_device = loop.to_device

    def recording(batch, ctx):
        if torch.is_grad_enabled():
            seen.append((type(batch.images), batch.images.dtype, batch.images.device.type))
        return to_device(batch, ctx)

    monkeypatch.setattr(loop, "to_device", recording)
    root = _jpeg_folder(tmp_path / "data", train=4, val=1)
    out = tmp_path / "run"
    result = _train(
        runner, root, out, "--epochs", "2", "--decode", "device", "--format", "json",
        "--decode-cpu-share", "0.5", "--channels-last",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert seen and set(seen) == {(torch.Tensor, torch.uint8, "cpu")}
    summary = json.loads(result.stdout)
    assert len(summary["history"]) == 2
    assert all(np.isfinite(row["train_loss"]) for row in summary["history"])
    assert (out / "last.pt").is_file() and (out / "best.pt").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["decode"] == "device"
    assert config["options"]["decode_cpu_share"] == 0.5
    assert config["options"]["channels_last"] is True
    assert "decode" not in config["defaults_from_data"]  # asked for
    checkpoint = torch.load(out / "last.pt", weights_only=True)
    assert checkpoint["config"]["decode"] == "device"
    assert checkpoint["drop_last"] is False  # a CPU run batches its epochs as before


def test_the_default_on_the_cpu_is_fast_recorded_as_chosen_and_drops_a_cpu_share(
    runner, tmp_path, monkeypatch
):
    # auto takes fast on a CPU, recorded as chosen (a replay chooses again): nothing to share,
    # and a resume must not meet a fast run with a share (which validation refuses).
    from torchkit.cli import app

    root = _jpeg_folder(tmp_path / "data", train=2, val=1)
    out = tmp_path / "run"
    result = _train(runner, root, out, "--epochs", "1", "--decode-cpu-share", "0.4")
    assert result.exit_code == 0, result.stderr
    assert "--decode-cpu-share 0.4 has nothing to share: --decode auto chose fast" in " ".join(
        result.stderr.split()
    )
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["options"]["decode"] == "fast"
    assert "decode" in recorded["defaults_from_data"]  # a replay chooses again
    assert recorded["options"]["decode_cpu_share"] == 0.0
    resumed = runner.invoke(
        app, ["train", "--resume", str(out), "--epochs", "2", "--trust-checkpoint"]
    )
    assert resumed.exit_code == 0, resumed.stderr


def test_the_cpu_share_is_a_stable_fraction_of_the_files():
    paths = [f"/data/train/class{i % 7}/image_{i:05d}.jpg" for i in range(20000)]
    for share in (0.0, 0.3, 0.5, 1.0):
        chosen = [path for path in paths if decoded_on_cpu(path, share)]
        assert abs(len(chosen) / len(paths) - share) < 0.015, share
    # The same files every time (no salted hash), and a larger share keeps the smaller's.
    assert decoded_on_cpu(paths[0], 0.3) == decoded_on_cpu(paths[0], 0.3)
    smaller = {path for path in paths if decoded_on_cpu(path, 0.3)}
    assert smaller <= {path for path in paths if decoded_on_cpu(path, 0.5)}


def test_the_cpu_share_is_decoded_by_the_fast_path_with_the_same_draws(files):
    # The files given to the workers get the fast path's own crop, bit for bit, from the same
    # random numbers; the others reach the batch as bytes, as before.
    names = ["wide.jpg", "tall.jpg", "gray.jpg", "big.jpg", "mpo.jpg"]
    paths = [files[name] for name in names]
    shared = _items(paths, "device", decode_cpu_share=0.5)
    device = _items(paths, "device")
    fast = _items(paths, "fast")
    on_cpu = [decoded_on_cpu(str(path), 0.5) for path in paths]
    assert 0 < sum(on_cpu) < len(paths)  # both kinds among these five
    for item, device_item, fast_item, cpu in zip(shared, device, fast, on_cpu, strict=True):
        if cpu:
            assert torch.equal(item[0], fast_item[0])
        else:
            assert isinstance(item[0], EncodedJpeg) and item[0].box == device_item[0].box
    batch = _decoded(shared)
    assert batch.images.shape == (5, 3, SIZE, SIZE) and batch.labels.tolist() == [0, 1, 0, 1, 0]
    assert collate_encoded(shared).images.pixels_at == [at for at, cpu in enumerate(on_cpu) if cpu]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--decode-cpu-share", "1.5"], "--decode-cpu-share is a fraction in [0, 1], not 1.5"),
        (["--decode-cpu-share", "nan"], "--decode-cpu-share"),
        (
            ["--decode", "fast", "--decode-cpu-share", "0.3"],
            "--decode fast decodes nothing there (use --decode device, or auto on CUDA)",
        ),
    ],
)
def test_a_bad_cpu_share_is_one_error_line(runner, tmp_path, args, message):
    from torchkit.cli import app

    result = runner.invoke(app, ["train", "--data", str(tmp_path), *args])
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_refused_on_the_command_line_with_a_pil_policy(runner, tmp_path):
    from torchkit.cli import app

    result = runner.invoke(
        app, ["train", "--data", str(tmp_path), "--decode", "device", "--augment", "randaugment"]
    )
    assert result.exit_code == 2
    assert "--decode device cannot run these transforms" in result.stderr


# -- CUDA ----------------------------------------------------------------------------------------


@pytest.mark.cuda
@needs_cuda
def test_gpu_decode_is_the_cpu_decode_within_tolerance(files):
    # nvJPEG's IDCT and chroma upsampling are not libjpeg's: a few levels apart at most.
    names = ["wide.jpg", "tall.jpg", "gray.jpg", "big.jpg", "rgb.png", "corrupt.jpg"]
    items = _items([files[name] for name in names], "device")
    cpu = _decoded(items, "cpu")
    gpu = _decoded(items, "cuda")
    assert gpu.images.device.type == "cuda" and gpu.images.dtype == torch.uint8
    assert len(cpu.errors) == 1 and "corrupt.jpg" in cpu.errors[0]
    # nvJPEG decodes through the run of 0xFF bytes that libjpeg stops at (measured on an H100):
    # that image trains on nvJPEG's pixels. The others are the same images in the same order.
    assert gpu.errors in ([], cpu.errors)
    kept = [i for i, index in enumerate(gpu.indices.tolist()) if index in cpu.indices.tolist()]
    assert gpu.indices[kept].tolist() == cpu.indices.tolist()
    assert torch.equal(gpu.labels[kept], cpu.labels)
    levels = level_differences(gpu.images[kept].cpu(), cpu.images)
    assert levels.mean() <= 1.0 and levels.max() <= 12, (float(levels.mean()), levels.max())


@pytest.mark.cuda
@needs_cuda
def test_the_gpu_decoder_never_writes_memory_that_queued_kernels_still_read(files):
    """nvJPEG's hardware engine writes without waiting for its stream (pytorch/vision#9606):
    given blocks just freed on the caller's stream, it overwrote them while reductions queued
    there still had to read them, which made training's loss NaN within three steps on an H100.
    Here the freed blocks are exactly the decoded images' size, so the allocator would hand
    them to the decoder if it allocated on the caller's stream."""
    chunks = [torch.frombuffer(bytearray(files[name].read_bytes()), dtype=torch.uint8)
              for name in ("wide.jpg", "tall.jpg")]  # fmt: skip
    floats = 3 * 500 * 375 // 4  # a decoded image's bytes, as float32 values
    for _ in range(30):
        victims = [torch.full((floats,), float(i + 1), device="cuda") for i in range(4)]
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)  # keeps the reductions below queued
        sums = [victim.sum() for victim in victims]
        del victims  # freed on the caller's stream while its reductions wait
        decoded = decode_jpegs(chunks, "cuda")
        torch.cuda.synchronize()
        assert [float(total) for total in sums] == [float((i + 1) * floats) for i in range(4)]
        assert [tuple(image.shape) for image in decoded] == [(3, 375, 500), (3, 500, 375)]


def _pinned_device_loaders(root: Path, train: int) -> Any:
    """The train loaders of `--decode device` over a folder of `train` JPEGs a class (and one
    PNG), 2 workers, batches of 4, pinned as on CUDA."""
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import build_loaders, load_splits, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    root = _jpeg_folder(root, train=train, val=1)
    config = resolve_defaults(
        TrainConfig(data=str(root), image_size=16, workers=2, batch_size=4, decode="device"),
        is_digits=False,
    )
    return build_loaders(
        load_splits(config).splits, preprocess_for(config), config, pin_memory=True
    )


@pytest.mark.cuda
@needs_cuda
def test_pinned_batches_reach_the_gpu(tmp_path):
    loaders = _pinned_device_loaders(tmp_path / "data", train=4)
    try:
        loaders.train_sampler.set_epoch(0)
        for raw in loaders.train:
            if isinstance(raw.images, EncodedImages):
                assert raw.images.data.is_pinned() and raw.labels.is_pinned()
            batch = decoded_batch(raw, "cuda")
            assert batch.images.device.type == "cuda" and batch.images.dtype == torch.uint8
    finally:
        loaders.close()


@pytest.mark.cuda
@needs_cuda
def test_decoding_ahead_on_the_gpu_gives_the_loops_batches(tmp_path):
    from torchkit.core.data.decode_ahead import DecodedAhead

    loaders = _pinned_device_loaders(tmp_path / "data", train=6)
    try:
        runs = []
        for ahead in (False, True):  # decoded in the loop, then in the decoding threads
            loaders.train_sampler.set_epoch(0)
            if ahead:
                batches = list(DecodedAhead(loaders.train, "cuda"))
            else:
                batches = [decoded_batch(raw, "cuda") for raw in loaders.train]
            runs.append([(batch.images.cpu(), batch.labels.tolist()) for batch in batches])
        for run in runs[1:]:
            assert len(run) == len(runs[0])
            for (images, labels), (expected, expected_labels) in zip(run, runs[0], strict=True):
                assert torch.equal(images, expected) and labels == expected_labels
    finally:
        loaders.close()
