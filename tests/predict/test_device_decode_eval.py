"""`--decode device` in eval, predict and extract-features (`core.device_decode.
DeviceEvalTransform`): JPEGs reach the batch as bytes and are decoded, resized and centre-cropped
where the model runs, tested with device="cpu" (libjpeg-turbo, whose pixels are PIL's). The
tolerance is training's: within 1 level of 255 of torchvision's eval transform on PIL (Resize
then CenterCrop), mean at most 0.25; identical for nearest. Everything else (other formats,
CMYK, truncated files, crops larger than the resized image) takes the exact path's pixels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from photos import MAX_LEVELS, MEAN_LEVELS, device_decode_cases, level_differences, photo
from PIL import Image
from torchvision import transforms as T
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.data.crop_resize import resize_crops
from torchkit.core.data.dataset import make_dataset
from torchkit.core.data.device_decode import (
    EncodedJpeg,
    collate_encoded,
    collate_encoded_with_failures,
    decoded_batch,
    decoded_with_indices,
    eval_view,
    pil_errors,
)
from torchkit.core.data.image_files import unreadable_image_errors
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.transforms import eval_transform
from torchkit.core.models import build_model
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint

DEVICE_NAMES = ["wide.jpg", "tall.jpg", "gray.jpg", "big.jpg", "mpo.jpg"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return device_decode_cases(tmp_path_factory.mktemp("device-decode"))


def _device(preprocess: Preprocess):
    return eval_transform(preprocess, pixels=True, decode="device")


def _exact(path, preprocess: Preprocess) -> torch.Tensor:
    """torchvision's eval transform on the PIL image, as uint8 (what --decode exact gives)."""
    mode = T.InterpolationMode(preprocess.interpolation)
    steps = T.Compose(
        [T.Resize(preprocess.resize_size, interpolation=mode), T.CenterCrop(preprocess.image_size)]
    )
    return T.PILToTensor()(steps(Image.open(path).convert("RGB")))


@pytest.mark.parametrize("batched", [False, True], ids=["per-image", "batched"])
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
@pytest.mark.parametrize("sizes", [(73, 64), (256, 224), (64, 64), (90, 41)])
def test_pixels_are_within_the_stated_tolerance_of_the_eval_transform(
    files,
    interpolation,
    batched,
    sizes,
    monkeypatch,
):
    monkeypatch.setattr(
        "torchkit.core.data.device_decode.resize_crops",
        lambda *args, **kwargs: resize_crops(*args, **kwargs, batched=batched),
    )
    resize_size, image_size = sizes
    preprocess = Preprocess(
        image_size=image_size, resize_size=resize_size, interpolation=interpolation
    )
    samples = Samples(["a"], [0] * len(DEVICE_NAMES), paths=[str(files[n]) for n in DEVICE_NAMES])
    dataset = make_dataset(samples, _device(preprocess), pixels=True)
    items = [dataset[index] for index in range(len(DEVICE_NAMES))]
    assert all(isinstance(item[0], EncodedJpeg) for item in items)  # all on the device
    batch = decoded_batch(collate_encoded(items), "cpu")
    assert batch.images.dtype == torch.uint8
    assert batch.images.shape == (len(DEVICE_NAMES), 3, image_size, image_size)
    levels = torch.stack(
        [
            level_differences(batch.images[index], _exact(files[name], preprocess))
            for index, name in enumerate(DEVICE_NAMES)
        ]
    )
    if interpolation == "nearest":
        assert levels.max() == 0  # nearest-exact picks PIL's pixel
    assert levels.max() <= MAX_LEVELS and levels.mean() <= MEAN_LEVELS, (
        float(levels.max()),
        float(levels.mean()),
    )


def test_the_view_is_torchvisions_resize_and_centre_crop():
    for width, height in [(500, 375), (375, 500), (64, 64), (1000, 3), (7, 913), (257, 256)]:
        for resize_size, image_size in [(256, 224), (73, 64), (64, 64), (5, 3)]:
            view = eval_view(width, height, resize_size, image_size)
            resized = T.Resize(resize_size)(Image.new("L", (width, height)))
            assert view[:2] == (resized.height, resized.width)
            # CenterCrop's corner, as torchvision computes it
            top = int(round((resized.height - image_size) / 2.0))
            left = int(round((resized.width - image_size) / 2.0))
            assert view[2:] == (top, left)
    assert eval_view(500, 375, 200, 224) is None  # smaller than the crop: CenterCrop pads


@pytest.mark.parametrize("crop_mode", ["squash", "border"])
def test_timms_crop_modes_decode_on_the_device_within_the_tolerance_or_take_pils_path(
    files, crop_mode
):
    """squash: both sides resized, on the device; border: resized on the device where no side
    is padded, PIL's path (the mean colour's padding) where one is."""
    fits = Preprocess(image_size=48, resize_size=73, crop_mode=crop_mode)
    padded = Preprocess(image_size=64, resize_size=64, crop_mode=crop_mode)
    for settings in (fits, padded):
        samples = Samples(["a"], [0, 0], paths=[str(files["wide.jpg"]), str(files["tall.jpg"])])
        ours = make_dataset(samples, _device(settings), pixels=True)
        exact = make_dataset(samples, eval_transform(settings, pixels=True), pixels=True)
        on_device = crop_mode == "squash" or settings is fits
        for index in range(2):
            item = ours[index][0]
            assert isinstance(item, EncodedJpeg) == on_device
            if on_device:
                pixels = decoded_batch(collate_encoded([ours[index]]), "cpu").images[0]
                levels = level_differences(pixels, exact[index][0])
                assert levels.max() <= MAX_LEVELS and levels.mean() <= MEAN_LEVELS
            else:
                assert torch.equal(item, exact[index][0])


def test_everything_else_is_the_exact_paths_pixels(files):
    preprocess = Preprocess(image_size=64, resize_size=73)
    small = Preprocess(image_size=64, resize_size=50)  # the crop is larger: padded by PIL
    for name, settings in [
        ("cmyk.jpg", preprocess),
        ("rgb.png", preprocess),
        ("png_named.jpg", preprocess),
        ("trailing.jpg", preprocess),
        ("truncated.jpg", preprocess),
        ("wide.jpg", small),
        # a filter only PIL has, as a checkpoint's preprocessing may name it
        ("wide.jpg", Preprocess(image_size=64, resize_size=73, interpolation="lanczos")),
    ]:
        samples = Samples(["a"], [0], paths=[str(files[name])])
        ours = make_dataset(samples, _device(settings), pixels=True)[0]
        exact = make_dataset(samples, eval_transform(settings, pixels=True), pixels=True)[0]
        assert not isinstance(ours[0], EncodedJpeg), name
        if exact[0] is None:  # truncated: unreadable, with the same reason
            assert ours[0] is None and ours[3] == exact[3], name
        else:
            assert torch.equal(ours[0], exact[0]), name


def test_unreadable_files_are_reported_by_index_as_the_exact_path_does(files):
    # what the device path's PIL fallback catches is what the exact path's loader catches
    assert set(pil_errors()) == set(unreadable_image_errors())
    preprocess = Preprocess(image_size=64, resize_size=73)
    names = ["wide.jpg", "garbage.jpg", "corrupt.jpg", "tall.jpg"]
    samples = Samples(["a"], [0] * len(names), paths=[str(files[n]) for n in names])
    ours = make_dataset(samples, _device(preprocess), pixels=True)
    exact = make_dataset(samples, eval_transform(preprocess, pixels=True), pixels=True)
    items = [ours[index] for index in range(len(names))]
    pixels, kept, failed = decoded_with_indices(collate_encoded_with_failures(items), "cpu")
    assert kept == [0, 3]
    # the same files fail, with the same reasons, whether the worker or the decoder finds them
    expected = [(index, exact[index][3]) for index in range(len(names)) if exact[index][0] is None]
    assert sorted(failed) == expected
    assert pixels.shape == (2, 3, 64, 64)


# --- the commands ---------------------------------------------------------------------------


@pytest.fixture
def world(tmp_path):
    torch.manual_seed(0)
    preprocess = Preprocess(image_size=24, resize_size=28)
    classes = [f"c{i}" for i in range(4)]
    model = build_model("convnet", len(classes), image_size=24)
    checkpoint = tmp_path / "model.pt"
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": len(classes),
            "classes": classes,
            "model": model.state_dict(),
            "preprocess": preprocess.to_dict(),
        },
        checkpoint,
    )
    data = tmp_path / "images"
    for index in range(10):
        folder = data / classes[index % 4]
        folder.mkdir(parents=True, exist_ok=True)
        size = (60 + 7 * index, 45 + 3 * index) if index % 2 else (40 + index, 70)
        Image.fromarray(photo(*size, index)).save(folder / f"{index}.jpg", quality=90)
    Image.fromarray(photo(50, 40, 99)).save(data / "c0" / "other.png")  # the exact path
    (data / "c1" / "broken.jpg").write_bytes(b"not an image")  # skipped, as always
    return {"checkpoint": checkpoint, "data": data, "tmp": tmp_path}


def _invoke(*args: str):
    result = CliRunner().invoke(app, [*args, "--device", "cpu", "-j", "0"])
    assert result.exit_code == 0, result.stderr
    return result


def test_predict_on_the_device_gives_the_exact_rows_within_tolerance(world):
    rows = {}
    for decode in ("exact", "device"):
        result = _invoke(
            "predict", str(world["checkpoint"]), str(world["data"]), "--decode", decode,
            "--format", "json", "--logits",
        )  # fmt: skip
        rows[decode] = {row["path"]: row for row in json.loads(result.stdout)}
    assert rows["device"].keys() == rows["exact"].keys() and len(rows["exact"]) == 12
    for path, exact in rows["exact"].items():
        ours = rows["device"][path]
        assert ours["error"] == exact["error"], path
        if exact["error"]:
            assert "broken.jpg" in path
            continue
        logits = [[row[f"logit_{i}"] for i in range(4)] for row in (ours, exact)]
        assert np.allclose(*logits, atol=0.05), path


def test_eval_and_extract_features_on_the_device(world):
    reports = {}
    for decode in ("exact", "device"):
        result = _invoke(
            "eval", str(world["checkpoint"]), "--data", str(world["data"]), "--decode", decode,
            "--format", "json",
        )  # fmt: skip
        reports[decode] = json.loads(result.stdout)
    exact, ours = reports["exact"], reports["device"]
    assert ours["num_images"] == exact["num_images"] == 11  # the broken file is skipped
    assert ours["loss"] == pytest.approx(exact["loss"], abs=0.02)
    features = {}
    for decode in ("exact", "device"):
        out = world["tmp"] / f"features-{decode}"
        _invoke(
            "extract-features", str(world["checkpoint"]), str(world["data"]), str(out),
            "--decode", decode, "--format", "npy",
        )  # fmt: skip
        features[decode] = out
    for name in sorted(p.name for p in features["exact"].glob("*.npy")):
        exact_array = np.load(features["exact"] / name)
        ours_array = np.load(features["device"] / name)
        assert ours_array.shape == exact_array.shape and len(exact_array) == 11
        scale = np.abs(exact_array).max()
        assert np.abs(ours_array - exact_array).max() <= 0.05 * scale, name


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_eval_decode_is_the_cpu_decode_within_tolerance(files):
    # nvJPEG's IDCT and chroma upsampling are not libjpeg's: a few levels apart at most, as in
    # training; the resize and crop are the batched products on CUDA.
    preprocess = Preprocess(image_size=224, resize_size=256)
    names = ["wide.jpg", "tall.jpg", "gray.jpg", "big.jpg"]
    samples = Samples(["a"], [0] * len(names), paths=[str(files[n]) for n in names])
    dataset = make_dataset(samples, _device(preprocess), pixels=True)
    items = [dataset[index] for index in range(len(names))]
    cpu = decoded_batch(collate_encoded(items), "cpu")
    gpu = decoded_batch(collate_encoded(items), "cuda")
    assert gpu.images.device.type == "cuda" and gpu.images.shape == cpu.images.shape
    levels = level_differences(gpu.images.cpu(), cpu.images)
    assert levels.mean() <= 1.0 and levels.max() <= 12, (float(levels.mean()), levels.max())


@pytest.mark.parametrize("batched", [False, True], ids=["per-image", "batched"])
def test_bicubic_clips_its_first_pass_as_pil_does(tmp_path, batched, monkeypatch):
    # Binary noise: bicubic overshoots past 0 and 255 in the width's pass, which PIL stores in
    # 8 bits. Unclipped, the crop landed up to 27 levels from PIL's (landscape images, where
    # every Pillow resizes the width first).
    monkeypatch.setattr(
        "torchkit.core.data.device_decode.resize_crops",
        lambda *args, **kwargs: resize_crops(*args, **kwargs, batched=batched),
    )
    rng = np.random.default_rng(0)
    path = tmp_path / "noise.jpg"
    noise = (rng.random((375, 500, 3)) > 0.5).astype(np.uint8) * 255
    Image.fromarray(noise).save(path, quality=95)
    preprocess = Preprocess(image_size=224, resize_size=256, interpolation="bicubic")
    samples = Samples(["a"], [0], paths=[str(path)])
    dataset = make_dataset(samples, _device(preprocess), pixels=True)
    batch = decoded_batch(collate_encoded([dataset[0]]), "cpu")
    assert level_differences(batch.images[0], _exact(path, preprocess)).max() <= MAX_LEVELS


def test_an_unknown_decode_is_a_usage_error():
    from torchkit.core.io.errors import UsageError

    with pytest.raises(UsageError, match="unknown --decode 'turbo'"):
        eval_transform(Preprocess(), pixels=True, decode="turbo")


def test_extract_features_resumes_only_with_the_decode_it_started_with(world):
    # Other pixels, other features: a store is not continued with another --decode.
    out = world["tmp"] / "features"
    args = ["extract-features", str(world["checkpoint"]), str(world["data"]), str(out)]
    _invoke(*args, "--decode", "device")
    other = CliRunner().invoke(app, [*args, "--resume", "--device", "cpu", "-j", "0"])
    assert other.exit_code == 2
    assert "another model, layers, options, images or labels" in other.stderr
    same = _invoke(*args, "--resume", "--decode", "device")
    assert "already complete" in same.stderr
