"""timm's eval crop modes (`Preprocess.crop_mode`: center, squash, border) outside the PIL
transform: recorded in checkpoints and read back (files without one are `center`, as they were
evaluated before), the in-memory images' pixels, train's validation and the checkpoint it writes.
The PIL transform against timm's own is in models/test_timm_models.py, the device decode's
window in predict/test_device_decode_eval.py."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import read_checkpoint, write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from PIL import Image

from torchkit.cli import app
from torchkit.core.data.in_memory import eval_pixels
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.transforms import eval_transform
from torchkit.core.io.errors import CheckpointError
from torchkit.core.models.checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint
from torchkit.core.models.exported.metadata import build_metadata, preprocess_of
from torchkit.core.train.memory_images import MemoryImages

MODES = ["center", "squash", "border"]


def _images(shapes: list[tuple[int, ...]], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, shape, dtype=np.uint8) for shape in shapes]


def test_the_crop_mode_is_recorded_and_read_back_and_a_file_without_one_is_center():
    squash = Preprocess(image_size=32, resize_size=32, crop_mode="squash")
    assert squash.to_dict()["crop_mode"] == "squash"
    assert Preprocess.from_dict(squash.to_dict()) == squash
    old = {key: value for key, value in squash.to_dict().items() if key != "crop_mode"}
    assert Preprocess.from_dict(old).crop_mode == "center"
    with pytest.raises(CheckpointError, match="crop_mode 'zoom' is not one of center, squash"):
        Preprocess.from_dict({**old, "crop_mode": "zoom"}).check("model.pt")


def test_an_exported_file_records_the_crop_mode_and_an_older_one_reads_as_center():
    squash = Preprocess(image_size=32, resize_size=32, crop_mode="squash")
    metadata = build_metadata(
        fmt="onnx",
        arch="resnet18",
        classes=None,
        preprocess=squash,
        input_shape=(1, 3, 32, 32),
        batch_size=None,
        dtype="float32",
        opset=17,
        weights_source=None,
    )
    assert preprocess_of(json.loads(json.dumps(metadata))) == squash
    del metadata["preprocess"]["crop_mode"]
    assert preprocess_of(metadata).crop_mode == "center"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sizes", [(40, 32), (32, 32), (24, 32)])  # (resize, crop): some padded
@pytest.mark.parametrize(
    ("colours", "interpolation"),
    [("RGB", "bilinear"), ("L", "bicubic"), ("RGB", "nearest"), ("RGBA", "bilinear")],
)
def test_pil_only_pixels_are_torchvisions(mode, sizes, colours, interpolation):
    """The 8-bit eval crop made with PIL alone, for image files (`eval_transform(pixels=True)`,
    which imports no torchvision) and in memory (`eval_pixels`), against torchvision's own
    steps (`eval_crop_steps`: Resize + CenterCrop, `border`'s on torchvision's functions), bit
    for bit. RGBA goes through torchvision's steps themselves."""
    from torchvision import transforms as T

    from torchkit.core.data.transforms import eval_crop_steps

    resize, size = sizes
    channels = {"RGB": (3,), "L": (), "RGBA": (4,)}[colours]
    images = _images([(37, 61, *channels), (70, 29, *channels)])
    preprocess = Preprocess(
        image_size=size,
        resize_size=resize,
        mean=(0.2, 0.5, 0.9, 0.3)[: channels[0] if channels else 1],  # border's fill
        crop_mode=mode,
        interpolation=interpolation,
    )
    reference = T.Compose([*eval_crop_steps(preprocess), T.PILToTensor()])
    transform = eval_transform(preprocess, pixels=True)
    for image in images:
        expected = reference(Image.fromarray(image))
        assert torch.equal(transform(Image.fromarray(image)), expected)
        if colours != "RGBA":
            ours = eval_pixels(
                image[None], resize, size, interpolation, colours, crop_mode=mode,
                mean=preprocess.mean,
            )[0]  # fmt: skip
            assert torch.equal(ours, expected)


@pytest.mark.parametrize("shape", [(50, 3000, 3), (3000, 50, 3), (1, 100, 3)])
def test_border_keeps_a_pixel_of_a_strip_whose_shorter_side_rounds_to_none(shape):
    """Was: 'height and width must be > 0' from the resize, so eval and predict counted a
    3000 x 50 image unreadable in `border` mode. Now its shorter side keeps one pixel, padded
    with the mean colour to the crop, and the in-memory path gives the same pixels."""
    preprocess = Preprocess(image_size=16, resize_size=18, mean=(0.2, 0.5, 0.9), crop_mode="border")
    (image,) = _images([shape])
    pixels = eval_transform(preprocess, pixels=True)(Image.fromarray(image))
    assert pixels.shape == (3, 16, 16)
    filled = (pixels == torch.tensor([51, 128, 230]).view(3, 1, 1)).all(dim=0)
    assert 0 < (~filled).sum() <= 16  # one row (or column) of the image, the rest the border
    ours = eval_pixels(
        image[None], 18, 16, "bilinear", "RGB", crop_mode="border", mean=preprocess.mean
    )[0]
    assert torch.equal(ours, pixels)


def test_trains_eval_of_in_memory_gray_images_pads_with_the_mean_colour():
    """Gray images in memory (as digits are) padded in `border` mode: the RGB mean colour, as
    the PIL transform pads the image converted to RGB."""
    images = np.stack(_images([(8, 8)] * 2))
    samples = Samples(["a"], [0, 0], images=images)
    preprocess = Preprocess(
        image_size=12, resize_size=10, mean=(0.2, 0.5, 0.9), std=(0.5,) * 3, crop_mode="border"
    )
    ours = MemoryImages(samples, preprocess, train=False)
    transform = eval_transform(preprocess)
    for index, image in enumerate(images):
        expected = transform(Image.fromarray(image).convert("RGB"))
        assert torch.allclose(ours[index][0], expected, atol=1e-6, rtol=0)


def _non_square_split(root: Path) -> Path:
    """train/ and val/ of 2 classes, 20x12 and 12x20 PNGs: a crop mode changes the pixels."""
    rng = np.random.default_rng(3)
    for split in ("train", "val"):
        for label in ("a", "b"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for index, shape in enumerate([(12, 20, 3), (20, 12, 3)]):
                pixels = rng.integers(0, 256, shape, dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{index}.png")
    return root


def test_train_validates_with_the_crop_mode_and_records_it_for_eval(runner, tmp_path):
    data, out = _non_square_split(tmp_path / "data"), tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--model", "nets:TinyNet", "--image-size", "8"]
        + ["--resize-size", "10", "--crop-mode", "squash", "--epochs", "1", "--batch-size", "4"]
        + ["--workers", "0", "--device", "cpu", "--seed", "0", "--out", str(out)],
    )
    assert result.exit_code == 0, result.stderr
    assert load_checkpoint(out / "best.pt")["preprocess"]["crop_mode"] == "squash"
    # eval of best.pt measures what train's validation measured: the same pixels.
    with (out / "metrics.csv").open(newline="") as handle:
        val_loss = float(next(csv.DictReader(handle))["val_loss"])
    scored = runner.invoke(
        app,
        ["eval", str(out / "best.pt"), "--data", str(data), "--split", "val", "--format", "json"]
        + ["--device", "cpu", "--workers", "0", "--trust-checkpoint"],
    )
    assert scored.exit_code == 0, scored.stderr
    assert json.loads(scored.stdout)["loss"] == pytest.approx(val_loss, abs=1e-5)


def test_fine_tuning_a_checkpoint_keeps_its_crop_mode(runner, tmp_path):
    checkpoint = tmp_path / "border.pt"
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "nets:TinyNet",
            "num_classes": 3,
            "model": {},
            "preprocess": Preprocess(image_size=8, resize_size=8, crop_mode="border").to_dict(),
        },
        checkpoint,
    )
    for given, expected in (([], "border"), (["--crop-mode", "center"], "center")):
        result = runner.invoke(
            app,
            ["train", "--data", "digits", "--model", "nets:TinyNet", "--weights", str(checkpoint)]
            + [*given, "--print-config"],
        )
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["crop_mode"] == expected


@pytest.mark.parametrize("command", ["predict", "eval", "extract-features"])
def test_an_unknown_recorded_crop_mode_is_one_error_before_any_image(runner, tmp_path, command):
    """A damaged file's crop mode is named, never run as `center` (extract-features did)."""
    checkpoint = tmp_path / "zoom.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    recorded = read_checkpoint(checkpoint)
    recorded["preprocess"]["crop_mode"] = "zoom"
    save_checkpoint(recorded, checkpoint)
    images = write_image_folder(tmp_path / "images", {"a": 1, "b": 1})
    args = {
        "predict": [str(checkpoint), str(images)],
        "eval": [str(checkpoint), "--data", str(images)],
        "extract-features": [str(checkpoint), str(images), str(tmp_path / "features")],
    }[command]
    result = runner.invoke(app, [command, *args, "--device", "cpu"])
    assert result.exit_code == 1, result.stderr
    assert error_line(result.stderr) == (
        f"Error: the preprocessing recorded in {checkpoint} is unusable: crop_mode 'zoom' is "
        "not one of center, squash, border (it is the model file's fault, not the images'; "
        "give --crop-mode to override it)"
    )
    assert not (tmp_path / "features").exists()


def test_fine_tuning_a_checkpoint_with_an_unknown_crop_mode_names_the_file(runner, tmp_path):
    """train blamed the option it was never given (`unknown --crop-mode 'zoom'`); a --crop-mode
    given replaces the damaged value."""
    checkpoint = tmp_path / "zoom.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    recorded = read_checkpoint(checkpoint)
    recorded["preprocess"]["crop_mode"] = "zoom"
    save_checkpoint(recorded, checkpoint)
    args = ["train", "--data", "digits", "--weights", str(checkpoint), "--print-config"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.stderr
    assert error_line(result.stderr) == (
        f"Error: the preprocessing recorded in {checkpoint} is unusable: crop_mode 'zoom' is "
        "not one of center, squash, border (it is the model file's fault, not the images'; "
        "give --crop-mode to override it)"
    )
    result = runner.invoke(app, [*args, "--crop-mode", "squash"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["crop_mode"] == "squash"
    # An interpolation eval resizes with and train does not: the file's, not the option's.
    recorded["preprocess"].update(crop_mode="center", interpolation="lanczos")
    save_checkpoint(recorded, checkpoint)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.stderr
    assert error_line(result.stderr) == (
        f"Error: {checkpoint} records interpolation 'lanczos', which train does not resize "
        "with (give --interpolation bilinear, bicubic, nearest)"
    )


def test_predict_crop_mode_and_interpolation_replace_the_recorded_ones(runner, tmp_path):
    """eval, predict and extract-features take --crop-mode and --interpolation (options they
    share) over the model file's, as --image-size and --resize-size: a center file run with
    --crop-mode squash answers as the squash file, and a damaged file's mode is replaced."""
    images = _non_square_split(tmp_path / "data") / "val"
    center = tmp_path / "center.pt"
    write_convnet_checkpoint(center, in_channels=3, image_size=8, classes="ab")
    recorded = read_checkpoint(center)
    files = {}
    for mode in ("center", "squash", "zoom"):
        recorded["preprocess"].update(resize_size=10, crop_mode=mode)
        files[mode] = tmp_path / f"{mode}.pt"
        save_checkpoint(recorded, files[mode])

    def logits(checkpoint: Path, *options: str) -> list[list[float]]:
        result = runner.invoke(
            app,
            ["predict", str(checkpoint), str(images), "--logits", "--format", "json", "-j", "0"]
            + ["--device", "cpu", *options],
        )
        assert result.exit_code == 0, result.stderr
        return [[row["logit_0"], row["logit_1"]] for row in json.loads(result.stdout)]

    squashed = logits(files["squash"])
    assert logits(files["center"]) != squashed
    assert logits(files["center"], "--crop-mode", "squash") == squashed
    assert logits(files["zoom"], "--crop-mode", "squash") == squashed
    assert logits(files["squash"], "--crop-mode", "center") == logits(files["center"])
    # --interpolation alike (eval's, predict's and extract-features' resizes).
    recorded["preprocess"].update(crop_mode="center", interpolation="nearest")
    save_checkpoint(recorded, files["zoom"])
    nearest = logits(files["zoom"])
    assert nearest != logits(files["center"])
    assert logits(files["center"], "--interpolation", "nearest") == nearest
    assert logits(files["zoom"], "--interpolation", "bilinear") == logits(files["center"])
