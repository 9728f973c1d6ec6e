"""`torchkit convert tensor`: every conversion checked against what the PyTorch / NumPy idiom
gives (`to_tensor`, `np.asarray(Image.open(...))`, `make_grid`, `ImageOps.exif_transpose`), round
trips checked pixel for pixel, and bad files checked for one clear error line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from format_files import npy
from hostile_pickles import RunsShell
from image_folders import write_sixteen_bit_colour_tiff
from output_checks import error_line
from PIL import Image, ImageOps
from safetensors.torch import load_file, save_file
from torchvision.transforms.functional import to_tensor
from torchvision.utils import make_grid
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.convert import pixels as px
from torchkit.core.convert.tensor import read_image
from torchkit.core.io import files

runner = CliRunner()
RNG = np.random.default_rng(0)


def convert(*args: str | Path):
    return runner.invoke(app, ["convert", "tensor", *map(str, args)])


def ok(*args: str | Path):
    result = convert(*args)
    assert result.exit_code == 0, result.stderr
    return result


def random_image(mode: str, size=(7, 5)) -> Image.Image:
    """A (width 7, height 5) image with random pixels in `mode`."""
    width, height = size
    channels = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}[mode]
    shape = (height, width) if channels == 1 else (height, width, channels)
    return Image.fromarray(RNG.integers(0, 256, shape, dtype=np.uint8), mode)


def load_pt(path: Path) -> torch.Tensor:
    return torch.load(path, weights_only=True)


# --- the conventions ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", "LA"])
def test_image_to_pt_is_to_tensor_and_to_npy_is_asarray(tmp_path, mode):
    src = tmp_path / "a.png"
    random_image(mode).save(src)
    ok(src, tmp_path / "a.pt")
    ok(src, tmp_path / "a.npy")
    with Image.open(src) as image:
        expected_tensor = to_tensor(image)
        expected_array = np.asarray(image)
    tensor = load_pt(tmp_path / "a.pt")
    assert tensor.dtype == torch.float32
    assert torch.equal(tensor, expected_tensor)  # bit for bit, not approximately
    array = np.load(tmp_path / "a.npy")
    assert array.dtype == np.uint8 and array.shape == expected_array.shape
    np.testing.assert_array_equal(array, expected_array)


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_round_trip_png_npy_pt_png_is_exact(tmp_path, mode):
    image = random_image(mode)
    image.save(tmp_path / "a.png")
    ok(tmp_path / "a.png", tmp_path / "a.npy")
    ok(tmp_path / "a.npy", tmp_path / "a.pt")
    ok(tmp_path / "a.pt", tmp_path / "b.safetensors")
    ok(tmp_path / "b.safetensors", tmp_path / "b.png")
    with Image.open(tmp_path / "b.png") as back:
        assert back.mode == mode
        np.testing.assert_array_equal(np.asarray(back), np.asarray(image))


def test_float16_tensor_round_trip_is_exact(tmp_path):
    image = random_image("RGB")
    image.save(tmp_path / "a.png")
    ok(tmp_path / "a.png", tmp_path / "a.pt", "--dtype", "float16")
    assert load_pt(tmp_path / "a.pt").dtype == torch.float16
    ok(tmp_path / "a.pt", tmp_path / "b.png")
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "b.png")), np.asarray(image))


def test_layout_dtype_and_scale_options(tmp_path):
    image = random_image("RGB")
    image.save(tmp_path / "a.png")
    pixels = np.array(image)
    ok(tmp_path / "a.png", tmp_path / "a.npy", "--layout", "chw", "--dtype", "float32")
    np.testing.assert_array_equal(
        np.load(tmp_path / "a.npy"), pixels.transpose(2, 0, 1).astype(np.float32) / np.float32(255)
    )
    ok(tmp_path / "a.png", tmp_path / "b.pt", "--layout", "hwc", "--scale", "255")
    assert torch.equal(load_pt(tmp_path / "b.pt"), torch.from_numpy(pixels.astype(np.float32)))
    ok(tmp_path / "a.png", tmp_path / "d.npy", "--scale", "255")
    np.testing.assert_array_equal(np.load(tmp_path / "d.npy"), pixels.astype(np.float32))
    ok(tmp_path / "a.png", tmp_path / "c.pt", "--dtype", "uint8")
    assert torch.equal(load_pt(tmp_path / "c.pt"), torch.from_numpy(pixels).permute(2, 0, 1))
    # Reading back: the same options describe the input when the output is an image.
    ok(tmp_path / "b.pt", tmp_path / "b.png", "--layout", "hwc", "--scale", "255")
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "b.png")), pixels)
    ok(tmp_path / "c.pt", tmp_path / "c.png")
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "c.png")), pixels)


def test_float_outside_unit_range_is_clamped_with_a_warning(tmp_path):
    values = torch.tensor([[[-0.5, 0.0, 0.5, 1.0, 1.5, 300.0]]])  # (1, 1, 6)
    torch.save(values, tmp_path / "t.pt")
    result = ok(tmp_path / "t.pt", tmp_path / "t.png")
    assert "Warning:" in result.stderr and "3 values outside [0, 1] were clamped" in result.stderr
    # round(x * 255) after clamping; `.byte()` would have wrapped -0.5 to 129 and 1.5 to 126.
    np.testing.assert_array_equal(
        np.asarray(Image.open(tmp_path / "t.png")), [[0, 0, 128, 255, 255, 255]]
    )


def test_infinities_are_clamped_and_nan_is_zero(tmp_path):
    # +inf was set to 0 with NaN: a saturated pixel black, where clamping (the docs, and
    # torchvision's save_image) makes it white.
    values = torch.tensor([[[float("nan"), float("inf"), -float("inf"), 0.5]]])  # (1, 1, 4)
    torch.save(values, tmp_path / "t.pt")
    result = ok(tmp_path / "t.pt", tmp_path / "t.png")
    assert "1 NaN values were set to 0" in result.stderr
    assert "2 values outside [0, 1] were clamped" in result.stderr
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "t.png")), [[0, 255, 0, 128]])


def test_sixteen_bit_gray_and_colour_keep_their_depth(tmp_path):
    gray = RNG.integers(0, 65536, (5, 7), dtype=np.uint16)
    Image.fromarray(gray).save(tmp_path / "g.png")
    colour = RNG.integers(0, 65536, (5, 7, 3), dtype=np.uint16)
    cv2.imwrite(str(tmp_path / "c.png"), colour[..., ::-1])  # OpenCV is BGR
    for name, truth in (("g", gray), ("c", colour)):
        ok(tmp_path / f"{name}.png", tmp_path / f"{name}.npy")
        array = np.load(tmp_path / f"{name}.npy")
        assert array.dtype == np.uint16
        np.testing.assert_array_equal(array, truth)
        ok(tmp_path / f"{name}.npy", tmp_path / f"{name}.tiff")
        back = cv2.imread(str(tmp_path / f"{name}.tiff"), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(back if back.ndim == 2 else back[..., ::-1], truth)
        ok(tmp_path / f"{name}.png", tmp_path / f"{name}.pt")
        tensor = load_pt(tmp_path / f"{name}.pt")
        expected = truth.astype(np.float32) / np.float32(65535)
        expected = expected[None] if expected.ndim == 2 else expected.transpose(2, 0, 1)
        assert torch.equal(tensor, torch.from_numpy(expected))
    result = ok(tmp_path / "g.png", tmp_path / "g.jpg")
    assert "16-bit values were scaled to 8 bits" in result.stderr


def test_palette_images_keep_their_colours(tmp_path):
    rgb = random_image("RGB").quantize(colors=6)
    rgb.save(tmp_path / "p.png")
    transparent = random_image("RGB").quantize(colors=4)
    transparent.info["transparency"] = 0
    transparent.save(tmp_path / "t.png", transparency=0)
    ok(tmp_path / "p.png", tmp_path / "p.npy")
    ok(tmp_path / "t.png", tmp_path / "t.npy")
    with Image.open(tmp_path / "p.png") as image:
        np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), np.asarray(image.convert("RGB")))
    with Image.open(tmp_path / "t.png") as image:
        expected = np.asarray(image.convert("RGBA"))
    np.testing.assert_array_equal(np.load(tmp_path / "t.npy"), expected)
    assert (expected[..., 3] == 0).any()


def _saved_with_orientation(tmp_path, orientation: int, *names: str):
    """(a random 6x4 image, its pixels as PIL's exif_transpose turns them) saved in tmp_path
    under each of `names` (the first a PNG) with the EXIF orientation `orientation`."""
    image = random_image("RGB", size=(6, 4))
    exif = Image.Exif()
    exif[0x0112] = orientation
    for name in names:
        image.save(tmp_path / name, exif=exif)
    with Image.open(tmp_path / names[0]) as opened:
        return image, np.asarray(ImageOps.exif_transpose(opened))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_like_pil(tmp_path, orientation):
    image, expected = _saved_with_orientation(tmp_path, orientation, "o.png")
    np.testing.assert_array_equal(read_image(tmp_path / "o.png").array, expected)
    raw = read_image(tmp_path / "o.png", exif=False).array
    np.testing.assert_array_equal(raw, np.asarray(image))


@pytest.mark.parametrize("orientation", [3, 5, 6, 7, 8])
def test_a_tiff_is_turned_once_by_its_orientation(tmp_path, orientation):
    # Pillow's TIFF loader turns the pixels itself: turned again, a TIFF came out turned twice
    # (3 not turned, 6 and 8 upside down) where the same PNG came out right; without EXIF it
    # came out turned, not as stored.
    image, expected = _saved_with_orientation(tmp_path, orientation, "o.png", "o.tif")
    np.testing.assert_array_equal(read_image(tmp_path / "o.tif").array, expected)
    raw = read_image(tmp_path / "o.tif", exif=False).array
    np.testing.assert_array_equal(raw, np.asarray(image))


@pytest.mark.parametrize("orientation", [3, 6])
def test_a_16_bit_colour_tiff_is_turned_once_by_its_orientation(tmp_path, orientation):
    # OpenCV, which decodes 16-bit colour, turns a TIFF by its tag as Pillow's loader turns an
    # 8-bit one: turned again, it came out turned twice (--no-exif: turned); under Pillow 10,
    # which sizes a TIFF as stored until loaded, one of 6 was refused as undecodable.
    stored = np.random.default_rng(orientation).integers(0, 65536, (4, 6, 3), dtype=np.uint16)
    write_sixteen_bit_colour_tiff(tmp_path / "o.tif", stored, orientation)
    turned = {3: np.rot90(stored, 2), 6: np.rot90(stored, -1)}[orientation]
    np.testing.assert_array_equal(read_image(tmp_path / "o.tif").array, turned)
    np.testing.assert_array_equal(read_image(tmp_path / "o.tif", exif=False).array, stored)


def test_no_exif_option(tmp_path):
    image = random_image("RGB", size=(6, 4))
    exif = Image.Exif()
    exif[0x0112] = 6
    image.save(tmp_path / "o.png", exif=exif)
    ok(tmp_path / "o.png", tmp_path / "turned.npy")
    ok(tmp_path / "o.png", tmp_path / "raw.npy", "--no-exif")
    assert np.load(tmp_path / "turned.npy").shape == (6, 4, 3)
    np.testing.assert_array_equal(np.load(tmp_path / "raw.npy"), np.asarray(image))


# --- tensors, dicts, batches --------------------------------------------------------------------


def test_dict_of_tensors_needs_key_when_ambiguous(tmp_path):
    image = torch.rand(3, 4, 5)
    torch.save({"image": image, "mask": torch.rand(1, 4, 5), "epoch": 3}, tmp_path / "d.pt")
    result = convert(tmp_path / "d.pt", tmp_path / "d.png")
    assert result.exit_code == 2
    assert "holds 2 tensors" in result.stderr and "--key" in result.stderr
    ok(tmp_path / "d.pt", tmp_path / "d.png", "--key", "image")
    expected = torch.round(image * 255).to(torch.uint8).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "d.png")), expected)
    result = convert(tmp_path / "d.pt", tmp_path / "e.png", "--key", "nope")
    assert result.exit_code == 2 and "no key 'nope'" in result.stderr


def test_a_checkpoint_whose_tensors_are_nested_is_not_said_to_hold_none(tmp_path):
    """Before: a training checkpoint (tensors under `model`) was 'holds no tensors', as a file
    with none at all, with no word of --key's reach or of `convert checkpoint`."""
    checkpoint = {"epoch": 3, "model": {"conv.weight": torch.rand(2, 3, 1, 1)}}
    torch.save(checkpoint, tmp_path / "best.pt")
    torch.save({"epoch": 3, "lr": 0.1}, tmp_path / "plain.pt")
    result = convert(tmp_path / "best.pt", tmp_path / "x.png")
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert "holds its tensors inside nested dicts" in line and "keys are: epoch, model" in line
    assert "torchkit convert checkpoint" in line
    result = convert(tmp_path / "plain.pt", tmp_path / "x.png")
    assert result.exit_code == 1
    assert "holds no tensors (its keys are: epoch, lr)" in error_line(result.stderr)
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("target", ["a.npy", "a.pt", "folder"])
def test_key_where_no_tensor_is_read_or_named_is_refused(tmp_path, target):
    # --key names the tensor of a .pt/.safetensors source or of a .safetensors output: an image
    # made into .npy or .pt (whose one tensor has no name) would ignore it.
    random_image("RGB").save(tmp_path / "a.png")
    source = tmp_path if target == "folder" else tmp_path / "a.png"
    extra = ["--to", "npy"] if target == "folder" else []
    result = convert(source, tmp_path.parent / f"{tmp_path.name}-{target}", *extra, "--key", "x")
    assert result.exit_code == 2
    assert "--key x has no effect" in error_line(result.stderr, besides="nothing")
    assert sorted(p.name for p in tmp_path.parent.glob(f"{tmp_path.name}*")) == [tmp_path.name]
    assert [p.name for p in tmp_path.iterdir()] == ["a.png"]
    ok(tmp_path / "a.png", tmp_path / "a.safetensors", "--key", "x")  # named there: taken
    assert list(load_file(tmp_path / "a.safetensors")) == ["x"]


def test_layout_scale_and_no_exif_where_nothing_is_read_or_written_so_are_refused(tmp_path):
    """--layout and --scale describe a .npy/.pt/.safetensors side, --no-exif how an image is
    read: PNG to JPEG with --scale 255, or .npy to .pt with --no-exif, wrote what it would have
    written without them (exit 0), where --key and --dtype given so are refused."""
    (tmp_path / "in").mkdir()
    random_image("RGB").save(tmp_path / "in" / "a.png")
    np.save(tmp_path / "a.npy", np.asarray(random_image("RGB")))
    cases = [
        (tmp_path / "in" / "a.png", tmp_path / "a.jpg", ["--scale", "255"], "--scale 255"),
        (tmp_path / "in" / "a.png", tmp_path / "a.bmp", ["--layout", "chw"], "--layout chw"),
        (tmp_path / "in", tmp_path / "out", ["--to", "webp", "--scale", "1"], "--scale 1"),
        (tmp_path / "a.npy", tmp_path / "a.pt", ["--no-exif"], "--no-exif"),
    ]
    for source, target, options, named in cases:
        result = convert(source, target, *options)
        assert result.exit_code == 2, options
        assert error_line(result.stderr, besides="nothing").startswith(
            f"Error: {named} has no effect here"
        )
        assert not target.exists()
    # Where the option has a side to describe, it is taken.
    ok(tmp_path / "a.npy", tmp_path / "a.png", "--layout", "hwc", "--scale", "1")
    ok(tmp_path / "in" / "a.png", tmp_path / "raw.pt", "--no-exif")


@pytest.mark.parametrize("folder", [False, True])
def test_key_that_safetensors_keeps_for_its_header_is_refused(tmp_path, folder):
    # Written, a tensor named __metadata__ made a file no safetensors reader parses (exit 0).
    (tmp_path / "in").mkdir()
    random_image("RGB").save(tmp_path / "in" / "a.png")
    source = tmp_path / "in" if folder else tmp_path / "in" / "a.png"
    out = tmp_path / ("out" if folder else "a.safetensors")
    extra = ["--to", "safetensors"] if folder else []
    result = convert(source, out, *extra, "--key", "__metadata__")
    assert result.exit_code == 2
    assert error_line(result.stderr, besides="nothing").startswith(
        "Error: --key __metadata__ cannot name a tensor of a .safetensors file"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_safetensors_in_and_out(tmp_path):
    image = random_image("RGB")
    image.save(tmp_path / "a.png")
    ok(tmp_path / "a.png", tmp_path / "a.safetensors")
    tensors = load_file(tmp_path / "a.safetensors")
    assert list(tensors) == ["image"]
    assert torch.equal(tensors["image"], to_tensor(image))
    save_file({"x": to_tensor(image).to(torch.bfloat16)}, tmp_path / "b.safetensors")
    ok(tmp_path / "b.safetensors", tmp_path / "b.npy")
    expected = torch.round(to_tensor(image).to(torch.bfloat16).float() * 255).to(torch.uint8)
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), expected.permute(1, 2, 0).numpy())


def test_batch_becomes_one_image_per_item_or_a_grid(tmp_path):
    batch = torch.randint(0, 256, (3, 3, 4, 5), dtype=torch.uint8)
    torch.save(batch, tmp_path / "batch.pt")
    result = ok(tmp_path / "batch.pt", tmp_path / "out", "--to", "png")
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["batch_0.png", "batch_1.png", "batch_2.png"]
    assert "batch_2.png" in result.stdout
    for i in range(3):
        np.testing.assert_array_equal(
            np.asarray(Image.open(tmp_path / "out" / f"batch_{i}.png")),
            batch[i].permute(1, 2, 0).numpy(),
        )
    ok(tmp_path / "batch.pt", tmp_path / "grid.png", "--grid", "--nrow", "2")
    expected = make_grid(batch, nrow=2).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "grid.png")), expected)
    result = convert(tmp_path / "batch.pt", tmp_path / "one.png")
    assert result.exit_code == 2
    assert "batch of 3 images" in result.stderr and "--grid" in result.stderr


@pytest.mark.parametrize(
    ("count", "channels", "nrow"), [(1, 3, 8), (5, 1, 2), (10, 3, 8), (9, 4, 3)]
)
def test_grid_matches_torchvision_make_grid(count, channels, nrow):
    batch = torch.rand(count, channels, 3, 4)
    expected = make_grid(batch, nrow=nrow).permute(1, 2, 0).numpy()
    grid = px.make_grid(px.Pixels(batch.permute(0, 2, 3, 1).numpy()), nrow=nrow)
    np.testing.assert_array_equal(grid.array, expected)


def test_npy_batch_and_ambiguous_shapes(tmp_path):
    batch = RNG.integers(0, 256, (2, 4, 5, 3), dtype=np.uint8)  # NHWC
    np.save(tmp_path / "b.npy", batch)
    ok(tmp_path / "b.npy", tmp_path / "b.pt")
    assert torch.equal(load_pt(tmp_path / "b.pt"), to_tensor_batch(batch))
    np.save(tmp_path / "mnist.npy", RNG.integers(0, 256, (10, 28, 28), dtype=np.uint8))
    result = convert(tmp_path / "mnist.npy", tmp_path / "m.png")
    assert result.exit_code == 1
    assert "channel axis: Nx1xHxW" in result.stderr


def to_tensor_batch(batch: np.ndarray) -> torch.Tensor:
    return torch.stack([to_tensor(image) for image in batch])


# --- folders ------------------------------------------------------------------------------------


def make_tree(root: Path) -> dict[str, np.ndarray]:
    """Good images in nested folders, plus a corrupt PNG, a zero-byte .npy and a text file."""
    truth = {}
    for relative in ("a.png", "sub/b.png", "sub/deeper/c.bmp", "d.tiff"):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        image = random_image("RGB")
        image.save(path)
        truth[relative] = np.array(image)
    np.save(root / "sub" / "e.npy", RNG.integers(0, 256, (5, 7, 3), dtype=np.uint8))
    truth["sub/e.npy"] = np.load(root / "sub" / "e.npy")
    good = (root / "a.png").read_bytes()
    (root / "sub" / "broken.png").write_bytes(good[: len(good) // 2])
    (root / "empty.npy").write_bytes(b"")
    (root / "notes.txt").write_text("not an image")
    return truth


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


@pytest.mark.parametrize("workers", ["0", "2"])
def test_folder_converts_good_files_and_counts_the_rest(tmp_path, workers):
    src = tmp_path / "src"
    truth = make_tree(src)
    before = snapshot(src)
    dst = tmp_path / "dst"
    result = convert(src, dst, "--to", "pt", "--workers", workers, "--format", "json")
    # As `cp -r`: the good files are converted and the command fails, saying how many did not.
    assert result.exit_code == 1, result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"Error: 2 of 7 files could not be converted into {dst} "
        "(the warnings above say which and why; --strict stops at the first)"
    )
    summary = json.loads(result.stdout)
    assert summary["converted"] == 5
    assert summary["failed"] == 2
    assert summary["skipped"] == 1
    assert summary["skipped_files"] == ["notes.txt"]
    assert sorted(f["path"] for f in summary["failures"]) == ["empty.npy", "sub/broken.png"]
    assert "is empty (0 bytes)" in result.stderr
    assert "failed to convert sub/broken.png: truncated file" in result.stderr
    written = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file())
    expected = [str(Path(r).with_suffix(".pt")) for r in truth]
    assert written == sorted([".torchkit", *expected])  # the marker: torchkit wrote this folder
    for relative, pixels in truth.items():
        tensor = load_pt(dst / Path(relative).with_suffix(".pt"))
        assert torch.equal(tensor, to_tensor(pixels))
    assert snapshot(src) == before  # inputs are never modified
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]


def test_folder_strict_stops_and_writes_nothing(tmp_path):
    src = tmp_path / "src"
    make_tree(src)
    result = convert(src, tmp_path / "dst", "--to", "npy", "--strict", "-j", "0")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ")
    assert "--strict" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_folder_table_output_and_existing_destination(tmp_path):
    src = tmp_path / "src"
    make_tree(src)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "old.txt").write_text("keep")
    result = convert(src, dst, "--to", "png", "-j", "0")
    assert result.exit_code == 1 and "already exists" in result.stderr
    assert (dst / "old.txt").exists()
    # --force replaces only a folder torchkit wrote, never one of the user's own files.
    result = convert(src, dst, "--to", "png", "-j", "0", "--force")
    assert result.exit_code == 1 and "not written by torchkit" in result.stderr
    assert sorted(p.name for p in dst.iterdir()) == ["old.txt"]
    (dst / "old.txt").unlink()
    result = convert(src, dst, "--to", "npy", "-j", "0")  # an empty folder needs no --force
    assert result.exit_code == 1 and "2 of 7 files could not be converted" in result.stderr
    (dst / "stale.npy").write_bytes(npy())  # as if from an earlier conversion: replaced
    result = convert(src, dst, "--to", "png", "-j", "0", "--force", "--format", "csv")
    assert result.exit_code == 1 and "2 of 7 files could not be converted" in result.stderr
    assert result.stdout.splitlines() == [
        "converted,skipped,failed,files written,destination",
        f"5,1,2,5,{dst}",
    ]
    assert not list(dst.rglob("*.npy"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]
    np.testing.assert_array_equal(
        np.asarray(Image.open(dst / "sub" / "e.png")), np.load(src / "sub" / "e.npy")
    )


def test_folder_outputs_that_would_collide(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    random_image("RGB").save(src / "x.png")
    random_image("RGB").save(src / "x.bmp")
    result = convert(src, tmp_path / "dst", "--to", "npy")
    assert result.exit_code == 2
    assert "would both become x.npy" in result.stderr


def test_a_batch_whose_images_are_named_as_another_files_output_is_refused(tmp_path):
    # x.pt, a batch of two, becomes x_0.png and x_1.png: x_0.png's own output would be one of
    # them, and one image would silently replace the other.
    src = tmp_path / "src"
    src.mkdir()
    torch.save(torch.rand(2, 3, 4, 4), src / "x.pt")
    random_image("RGB").save(src / "x_0.png")
    result = convert(src, tmp_path / "dst", "--to", "png", "-j", "1")
    assert result.exit_code == 2, result.stderr
    assert "x.pt and x_0.png would both become x_0.png" in error_line(result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize(
    ("names", "twins"),
    [(["A.png", "a.png"], "A.npy and a.npy"), (["Cat/x.png", "cat/y.png"], "Cat and cat")],
)
def test_folder_outputs_that_differ_only_by_case_on_a_case_folding_disk(
    tmp_path, monkeypatch, names, twins
):
    # Two files on Linux; on an exFAT disk, macOS or a Samba share one file (or one folder
    # taking in another's files): refused before anything is written, naming the two.
    src = tmp_path / "src"
    for name in names:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        random_image("RGB").save(src / name)
    monkeypatch.setattr(files, "folds_case", lambda folder: True)
    result = convert(src, tmp_path / "dst", "--to", "npy", "-j", "1")
    assert result.exit_code == 1, result.stderr
    line = error_line(result.stderr)
    assert f"{twins} would be one" in line and "upper and lower case" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    monkeypatch.undo()  # a file system that tells case apart keeps both, as before
    ok(src, tmp_path / "dst", "--to", "npy", "-j", "1")
    assert len(list((tmp_path / "dst").rglob("*.npy"))) == 2


def test_folder_converts_every_image_file_the_datasets_read(tmp_path):
    """GIF, PPM, PGM and JFIF files, which train and every dataset reader take, were skipped as
    non-images: the arrays lacked them, with exit code 0. They are read, never written."""
    src = tmp_path / "src" / "cat"
    src.mkdir(parents=True)
    images = {"a.gif": random_image("RGB").convert("P"), "b.ppm": random_image("RGB")}
    images |= {"c.pgm": random_image("L"), "d.jfif": random_image("RGB")}
    for name, image in images.items():
        image.save(src / name, format="JPEG" if name.endswith(".jfif") else None)
    dst = tmp_path / "dst"
    summary = json.loads(ok(src.parent, dst, "--to", "npy", "-j", "0", "--format", "json").stdout)
    assert (summary["converted"], summary["skipped"]) == (4, 0)
    for name in images:
        with Image.open(src / name) as image:
            expected = np.asarray(image.convert("RGB") if image.mode == "P" else image)
        np.testing.assert_array_equal(
            np.load(dst / "cat" / Path(name).with_suffix(".npy")), expected
        )
    result = convert(src / "b.ppm", tmp_path / "x.gif")
    assert result.exit_code == 2 and error_line(result.stderr).startswith(
        "Error: .gif files are read, not written"
    )


def test_folder_needs_to_and_must_not_overlap(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    random_image("RGB").save(src / "x.png")
    assert convert(src, tmp_path / "dst").exit_code == 2
    result = convert(src, src / "inner", "--to", "npy")
    assert result.exit_code == 1 and "lies inside the source folder" in result.stderr
    result = convert(src, tmp_path, "--to", "npy", "--force")
    assert result.exit_code == 1 and "contains the source folder" in result.stderr
    assert (src / "x.png").exists()


# --- bad input ----------------------------------------------------------------------------------


def test_bad_single_files(tmp_path):
    random_image("RGBA").save(tmp_path / "rgba.png")
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "text.npy").write_text("hello")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    good = (tmp_path / "rgba.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(good[:60])
    marker = tmp_path / "pwned"
    torch.save({"x": RunsShell(marker)}, tmp_path / "object.pt")
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04garbage")
    (tmp_path / "png.pt").write_bytes(good)
    (tmp_path / "text.pt").write_text("hello\n")
    (tmp_path / "junk.pt").write_bytes(b"\x80\x02garbage")
    os.mkfifo(tmp_path / "fifo.npy")  # was opened and waited on for good, deaf to SIGTERM
    cases = [
        (("missing.png", "x.npy"), 1, "Error: source not found"),
        (("rgba.png", "x.xyz"), 2, "Error: unknown file extension '.xyz'"),
        (("notes.txt", "x.npy"), 2, "unknown file extension '.txt'"),
        (("empty.npy", "x.png"), 1, "is empty (0 bytes)"),
        (("text.npy", "x.png"), 1, "is not a .npy file"),
        (("objects.npy", "x.png"), 1, "holds Python objects"),
        (("cut.png", "x.npy"), 1, "cannot read image"),
        (
            ("object.pt", "x.png"),
            1,
            "holds a pickled Python object, not tensors (only tensors and dicts of tensors are "
            "read, with weights_only=True, so loading never runs code from the file)",
        ),
        (("cut.pt", "x.png"), 1, "cannot read"),
        (("fifo.npy", "x.png"), 1, "fifo.npy: not a regular file (a FIFO) (give a file)"),
        # were "holds a pickled Python object" and "KeyError: 101 (set TORCHKIT_DEBUG=1 ...)"
        (("png.pt", "x.png"), 1, "png.pt: not a PyTorch file (neither torch.save's"),
        (("text.pt", "x.png"), 1, "text.pt: not a PyTorch file (neither torch.save's"),
        (("junk.pt", "x.png"), 1, "junk.pt: not a pickle of tensors that torch.save"),
        (("rgba.png", "x.jpg"), 1, "JPEG cannot store an alpha channel"),
        # written, Pillow and OpenCV read it back as RGB: its alpha was lost without a word
        (("rgba.png", "x.bmp"), 1, "BMP cannot store an alpha channel"),
        (
            ("rgba.png", "x.png", "--dtype", "float32"),
            2,
            "--dtype sets the dtype of .npy/.pt/.safetensors outputs (image files are 8-bit, or "
            "16-bit for 16-bit PNG/TIFF sources)",
        ),
        (("rgba.png", "rgba.png", "--force"), 1, "is the source"),
    ]
    (tmp_path / "notes.txt").write_text("x")
    for args, code, message in cases:
        src, *rest = args
        result = convert(tmp_path / src, *(tmp_path / a if "." in a else a for a in rest))
        assert result.exit_code == code, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not marker.exists()
    assert (tmp_path / "rgba.png").read_bytes() == good
    assert not (tmp_path / "x.npy").exists() and not (tmp_path / "x.png").exists()


def test_a_file_the_file_system_will_not_read_is_hinted_so(tmp_path, monkeypatch):
    """An image without read permission (chmod 000) or a FIFO named .png: the error says why
    and what to do (was no hint at all, and before that 'the file is truncated, corrupt or not
    an image', which it is not)."""
    Image.new("RGB", (4, 4)).save(tmp_path / "locked.png")
    real_open = os.open

    def refusing(path, flags, *args, **kwargs):  # as the kernel answers for a chmod 000 file
        if os.fspath(path).endswith("locked.png"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(os, "open", refusing)
        result = convert(tmp_path / "locked.png", tmp_path / "locked.npy")
    assert result.exit_code == 1
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: cannot read image {tmp_path / 'locked.png'}: permission denied (make it "
        "readable, or give another file)"
    )
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe.png")
        result = convert(tmp_path / "pipe.png", tmp_path / "pipe.npy")
        assert result.exit_code == 1
        assert error_line(result.stderr, besides="nothing") == (
            f"Error: cannot read image {tmp_path / 'pipe.png'}: not a regular file (a FIFO) "
            "(give an image file)"
        )
    assert not (tmp_path / "locked.npy").exists() and not (tmp_path / "pipe.npy").exists()


def test_a_file_whose_bytes_are_at_fault_is_hinted_so_and_strict_says_how_to_skip(tmp_path):
    """A cut image or text named .png: why, and that the file is at fault; --strict's error for
    a file that is no unreadable image (an empty .npy) says how to skip such files."""
    noise = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "whole.png")
    whole = (tmp_path / "whole.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "text.png").write_text("not an image\n")
    for name, reason in (("cut.png", "truncated file"), ("text.png", "not an image PIL can read")):
        result = convert(tmp_path / name, tmp_path / f"{name}.npy")
        assert result.exit_code == 1
        assert error_line(result.stderr, besides="nothing") == (
            f"Error: cannot read image {tmp_path / name}: {reason} (the file is truncated, "
            "corrupt or not an image)"
        )
    src = tmp_path / "src"
    src.mkdir()
    (src / "empty.npy").write_bytes(b"")
    result = convert(src, tmp_path / "dst", "--to", "npy", "--strict", "-j", "0")
    assert result.exit_code == 1
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: empty.npy: {src / 'empty.npy'} is empty (0 bytes) (it is not a NumPy array "
        "file) (leave out --strict to skip files that fail)"
    )
    assert not (tmp_path / "dst").exists()


def test_a_32_bit_tiff_past_16_bits_is_named_an_unsupported_range_not_a_corrupt_file(tmp_path):
    """Before: a readable mode-I TIFF with samples past 65535 was hinted 'the file is truncated,
    corrupt or not an image'."""
    wide = np.array([[-1, 70_000]], dtype=np.int32)
    Image.fromarray(wide, mode="I").save(tmp_path / "wide.tif")
    result = convert(tmp_path / "wide.tif", tmp_path / "wide.npy")
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="nothing")
    assert "32-bit integer samples lie in -1..70000, outside 0..65535" in line
    assert line.endswith("(an unsupported sample range: save it as 16-bit or as 32-bit float)")
    assert "corrupt" not in line and not (tmp_path / "wide.npy").exists()


def test_tensors_numpy_lacks_and_images_too_large_for_the_encoder(tmp_path):
    float8 = torch.rand(3, 4, 4).to(torch.float8_e4m3fn)
    torch.save(float8, tmp_path / "float8.pt")
    torch.save(float8.float(), tmp_path / "float32.pt")
    torch.save(torch.rand(3, 4, 4).to_sparse(), tmp_path / "sparse.pt")
    # was "Error: NotImplementedError: Cannot copy out of meta tensor; no data!"
    torch.save(torch.empty(3, 4, 4, device="meta"), tmp_path / "meta.pt")
    np.save(tmp_path / "wide.npy", np.zeros((1, 65_501, 3), np.uint8))
    np.save(tmp_path / "webp.npy", np.zeros((16_384, 1, 3), np.uint8))
    cases = [
        (
            "sparse.pt",
            "x.png",
            "a sparse_coo tensor is not an image (save `tensor.to_dense()` instead)",
        ),
        ("meta.pt", "x.png", "a meta tensor holds no values, only a shape (save the tensor"),
        ("wide.npy", "x.jpg", "JPEG cannot store a 65501x1 image"),
        ("webp.npy", "x.webp", "WEBP cannot store a 1x16384 image"),
    ]
    for src, dst, message in cases:
        result = convert(tmp_path / src, tmp_path / dst)
        assert result.exit_code == 1
        assert error_line(result.stderr).startswith(f"Error: {message}"), result.stderr
        assert not (tmp_path / dst).exists()
    # float8, which NumPy lacks, is read as the float32 of the same values
    ok(tmp_path / "float8.pt", tmp_path / "float8.png")
    ok(tmp_path / "float32.pt", tmp_path / "float32.png")
    assert np.array_equal(
        np.asarray(Image.open(tmp_path / "float8.png")),
        np.asarray(Image.open(tmp_path / "float32.png")),
    )


def test_existing_file_needs_force(tmp_path):
    random_image("RGB").save(tmp_path / "a.png")
    (tmp_path / "a.npy").write_bytes(b"old")
    result = convert(tmp_path / "a.png", tmp_path / "a.npy")
    assert result.exit_code == 1
    assert "already exists" in result.stderr and "--force" in result.stderr
    assert (tmp_path / "a.npy").read_bytes() == b"old"
    ok(tmp_path / "a.png", tmp_path / "a.npy", "--force")
    assert np.load(tmp_path / "a.npy").shape == (5, 7, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "a.png"]  # no temp files
    # An existing -o report is refused before anything is converted.
    (tmp_path / "report.json").write_text("{}")
    result = convert(
        tmp_path / "a.png", tmp_path / "b.pt", "--format", "json", "-o", tmp_path / "report.json"
    )
    assert result.exit_code == 1 and "already exists" in result.stderr
    assert not (tmp_path / "b.pt").exists()
    ok(
        tmp_path / "a.png",
        tmp_path / "b.pt",
        "--format",
        "json",
        "-o",
        tmp_path / "report.json",
        "--force",
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["written"] == [
        {"path": str(tmp_path / "b.pt"), "shape": [3, 5, 7], "dtype": "float32"}
    ]


def test_a_new_destination_without_extension_is_not_said_to_be_a_folder(tmp_path):
    """Was 'Error: out is a folder' for a name that did not exist."""
    image = tmp_path / "a.png"
    Image.new("RGB", (4, 4)).save(image)
    result = CliRunner().invoke(app, ["convert", "tensor", str(image), str(tmp_path / "out")])
    assert result.exit_code == 2
    line = error_line(result.stderr)
    assert "out has no extension: a new folder" in line and "--to" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("to", ["npy", "png", "safetensors"])
def test_a_pipe_without_an_extension_takes_the_format_of_to(tmp_path, to):
    """`convert tensor x.png /dev/stdout --to npy`: "--to npy contradicts the extension of
    /dev/stdout", which has none; a pipe's name (/dev/stdout, /dev/fd/N, a FIFO) says no format,
    so --to says it. numpy and PIL seek as they write a file, which a pipe cannot: they write
    their bytes in order. A pipe of this process stands for stdout."""
    import io

    source = tmp_path / "x.png"
    pixels = RNG.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(source)
    read_end, write_end = os.pipe()
    try:
        ok(source, f"/dev/fd/{write_end}", "--to", to)
        refused = convert(source, f"/dev/fd/{write_end}")
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        written = reader.read()
    assert refused.exit_code == 2
    assert "has no extension to say its format" in error_line(refused.stderr)
    if to == "npy":
        assert np.array_equal(np.load(io.BytesIO(written)), pixels)
    elif to == "png":
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(written))), pixels)
    else:
        from safetensors.torch import load

        assert load(written)["image"].shape == (3, 5, 7)


def test_a_file_written_to_stdout_sends_the_result_table_to_stderr(tmp_path):
    """`convert tensor x.png /dev/stdout --to npy | ...` (and export, convert-syncbn): the
    result table was printed on stdout after the file's bytes, which the reader took for the
    file's. stdout carries the file alone; the table goes to stderr."""
    import io

    from processes import run_torchkit_process

    pixels = RNG.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "x.png")
    done = run_torchkit_process(
        "convert", "tensor", "x.png", "/dev/stdout", "--to", "npy", "--layout", "hwc",
        "--dtype", "uint8", cwd=tmp_path, text=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = io.BytesIO()
    np.save(expected, pixels)
    assert done.stdout == expected.getvalue()
    assert "/dev/stdout" in done.stderr.decode() and "5x7x3" in done.stderr.decode()


def test_a_fifo_named_safetensors_is_written_into_not_replaced(tmp_path):
    """safetensors writes a temporary file beside its path and renames it over it: a FIFO
    `x.safetensors` (or /dev/stdout itself, with --to safetensors) was replaced by a regular
    file."""
    from disks import FifoReader
    from safetensors.torch import load

    source = tmp_path / "x.png"
    Image.fromarray(RNG.integers(0, 256, (5, 7, 3), dtype=np.uint8)).save(source)
    reader = FifoReader(tmp_path / "x.safetensors")
    ok(source, reader.path)
    assert load(reader.result())["image"].shape == (3, 5, 7)


def test_a_npy_shorter_than_its_header_declares_is_truncated_before_any_allocation(tmp_path):
    """np.load allocates the declared array first: 100 bytes declaring 2**40 float64 values
    were 'MemoryError: Unable to allocate 8.00 TiB', not a truncated file."""
    with open(tmp_path / "cut.npy", "wb") as handle:
        header = {"descr": "<f8", "fortran_order": False, "shape": (1 << 40,)}
        np.lib.format.write_array_header_1_0(handle, header)
        handle.write(bytes(100))
    result = convert(tmp_path / "cut.npy", tmp_path / "out.png")
    assert result.exit_code == 1
    line = error_line(result.stderr, besides="nothing")
    assert "declares a 1099511627776 float64 array of 8,796,093,022,208 bytes" in line
    assert "and 100 follow it (the file is truncated or corrupt)" in line
    assert not (tmp_path / "out.png").exists()


def test_a_pt_whose_records_expand_far_beyond_the_file_is_refused_unread(tmp_path, monkeypatch):
    """torch.load unpacks deflated records (torch.save never writes any): a 292 KB .pt held
    300 MB of zeros, which `convert tensor` read into memory (1.5 GB at its peak) and wrote
    out, where `convert checkpoint` refused the same file (the floor lowered here to keep the
    file tiny)."""
    import zipfile

    from torchkit.core.models import checkpoint

    monkeypatch.setattr(checkpoint, "EXPANSION_FLOOR", 2**20)
    plain, bomb = tmp_path / "plain.pt", tmp_path / "bomb.pt"
    torch.save(torch.zeros(1, 512, 1024), plain)  # 2 MiB of zeros
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as out:
        for name in source.namelist():
            out.writestr(name, source.read(name))
    assert bomb.stat().st_size < 2**15
    result = convert(bomb, tmp_path / "out.png")
    assert result.exit_code == 1
    assert "holds compressed records that would expand from" in error_line(result.stderr)
    assert not (tmp_path / "out.png").exists()


@pytest.mark.parametrize(
    ("mode", "opaque", "channels", "said"),
    [
        ("L", False, 3, "WebP has no grayscale"),
        ("LA", False, 4, "WebP has no grayscale"),
        ("LA", True, 3, "WebP has no grayscale"),
        ("RGBA", True, 3, "WebP drops an alpha channel that is opaque everywhere"),
    ],
)
def test_webp_reports_the_channels_its_file_holds(tmp_path, mode, opaque, channels, said):
    # libwebp has no grayscale: a gray image was written as RGB while the table and the JSON
    # said 5x7 (one channel), and an opaque alpha, which libwebp drops, was said to be there.
    image = random_image(mode)
    if opaque:
        image.putalpha(255)
    image.save(tmp_path / "in.png")
    result = ok(tmp_path / "in.png", tmp_path / "out.webp", "--format", "json")
    (written,) = json.loads(result.stdout)["written"]
    with Image.open(tmp_path / "out.webp") as back:
        held = np.asarray(back).shape
    assert written["shape"] == [5, 7, channels] == list(held)
    assert said in result.stderr


def test_a_folder_says_what_webp_did_once(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / "in" / name).mkdir(parents=True)
        random_image("L").save(tmp_path / "in" / name / "x.png")
    result = ok(tmp_path / "in", tmp_path / "out", "--to", "webp", "-j", "1")
    assert result.stderr.count("WebP has no grayscale") == 1
    assert "(3 files)" in result.stderr


def test_a_sixteen_bit_image_keeps_its_bits_through_a_float_pt(tmp_path):
    # 16-bit PNG -> .pt (v / 65535) -> PNG came back with 8 bits, without a word.
    gray = RNG.integers(0, 65536, (5, 7), dtype=np.uint16)
    Image.fromarray(gray).save(tmp_path / "g.png")
    colour = RNG.integers(0, 65536, (5, 7, 3), dtype=np.uint16)
    cv2.imwrite(str(tmp_path / "c.png"), colour[..., ::-1])
    for name, truth in (("g", gray), ("c", colour)):
        ok(tmp_path / f"{name}.png", tmp_path / f"{name}.pt")
        for extension in (".png", ".tiff"):
            back = tmp_path / f"{name}-back{extension}"
            result = ok(tmp_path / f"{name}.pt", back, "--format", "json")
            assert json.loads(result.stdout)["written"][0]["dtype"] == "uint16"
            held = cv2.imread(str(back), cv2.IMREAD_UNCHANGED)
            np.testing.assert_array_equal(held if held.ndim == 2 else held[..., ::-1], truth)
            assert "Warning" not in result.stderr
    result = ok(tmp_path / "g.pt", tmp_path / "g.jpg")
    assert "JPEG holds 8 bits a channel: 16-bit values were scaled to 8 bits" in result.stderr
    result = ok(tmp_path / "c.pt", tmp_path / "c.webp")
    assert "WebP holds 8 bits a channel: 16-bit values were scaled to 8 bits" in result.stderr


def test_floats_of_eight_bits_or_of_a_model_stay_eight_bit_images(tmp_path):
    eight = RNG.integers(0, 256, (3, 5, 7), dtype=np.uint8)
    torch.save(torch.from_numpy(eight.astype(np.float32) / np.float32(255)), tmp_path / "e.pt")
    torch.save(torch.rand(3, 5, 7), tmp_path / "m.pt")
    for name in ("e", "m"):
        result = ok(tmp_path / f"{name}.pt", tmp_path / f"{name}.png")
        assert "Warning" not in result.stderr
        with Image.open(tmp_path / f"{name}.png") as image:
            assert image.mode == "RGB"
    np.testing.assert_array_equal(
        np.asarray(Image.open(tmp_path / "e.png")), eight.transpose(1, 2, 0)
    )


def test_a_sixteen_bit_batch_warns_once_for_an_eight_bit_format(tmp_path):
    batch = RNG.integers(0, 65536, (4, 1, 5, 7), dtype=np.uint16)
    batch[0] = 0  # a black frame holds 8-bit values too: the batch decides, as a whole
    torch.save(torch.from_numpy(batch.astype(np.float32) / np.float32(65535)), tmp_path / "b.pt")
    ok(tmp_path / "b.pt", tmp_path / "png", "--to", "png")
    for index in range(4):
        held = cv2.imread(str(tmp_path / "png" / f"b_{index}.png"), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(held, batch[index, 0])
    result = ok(tmp_path / "b.pt", tmp_path / "bmp", "--to", "bmp")
    assert result.stderr.count("16-bit values were scaled to 8 bits") == 1
