"""One image-decoding module (`core.image_files`) with one EXIF rule: every entry point that
feeds a model or measures pixels (load_image and the train/eval dataset, the reduced and device
decodes of training, dataset-stats, the perceptual hash) reads the pixels as torchvision's
loader does (as stored, but a TIFF turned by its decoder, at every bit depth), and
`convert tensor` turns them by their EXIF orientation unless asked not to; 16-bit, CMYK and
palette images give the same pixels through every entry point that takes them; an unreadable
file raises the same error wherever it is read. Tiny images, in process."""

from __future__ import annotations

import inspect
import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from image_folders import SIXTEEN_BIT_GRAY, write_sixteen_bit_colour_tiff
from PIL import Image, ImageOps, UnidentifiedImageError

from torchkit.core.convert import pixels as px
from torchkit.core.convert.tensor import read_image
from torchkit.core.data.dataset import make_dataset
from torchkit.core.data.decode import ReducedDecodeCrop
from torchkit.core.data.device_decode import DeviceDecodeTransform, EncodedJpeg, decode_jpegs
from torchkit.core.data.hashing import hash_file, phash_bytes, phash_file, phash_image
from torchkit.core.data.image_files import (
    NotARegularFile,
    UnsupportedSamples,
    apply_exif_orientation,
    exif_orientation,
    load_image,
    opened_image,
    pixels_in_mode,
    uint16_to_uint8,
    unreadable_image_errors,
    unreadable_reason,
)
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.transforms import train_transform
from torchkit.core.io.errors import InputError
from torchkit.core.stats import scan_files
from torchkit.core.video import still_image_format

TURNED = 6  # EXIF "rotate 90 degrees clockwise to display"


def picture(width: int, height: int, seed: int = 0) -> np.ndarray:
    """RGB content that looks different turned: a ramp across, another down, some noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([255 * x / width, 255 * y / height, 128 + 0 * x], axis=-1)
    return np.clip(pixels + rng.normal(0, 20, pixels.shape), 0, 255).astype(np.uint8)


def with_orientation(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("image-decoding")
    paths = {name: folder / name for name in (
        "plain.jpg", "turned.jpg", "gray16.png", "rgb16.png", "cmyk.jpg", "palette.png",
        "clear_palette.png", "garbage.jpg", "truncated.jpg", "damaged.tif", "empty.jpg",
    )}  # fmt: skip
    # The same pixels encoded the same way, with and without the tag: the same scan data.
    stored = Image.fromarray(picture(48, 32))
    stored.save(paths["plain.jpg"], quality=95)
    stored.save(paths["turned.jpg"], quality=95, exif=with_orientation(TURNED))
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 65536, (20, 30), dtype=np.uint16)).save(paths["gray16.png"])
    rgb16 = rng.integers(0, 65536, (20, 30, 3), dtype=np.uint16)
    import cv2

    cv2.imwrite(str(paths["rgb16.png"]), rgb16[..., ::-1])  # PIL cannot write 16-bit colour
    Image.fromarray(picture(30, 20, 2)).convert("CMYK").save(paths["cmyk.jpg"], quality=95)
    palette = Image.fromarray(picture(30, 20, 3)).convert("P", palette=Image.Palette.ADAPTIVE)
    palette.save(paths["palette.png"])
    palette.save(paths["clear_palette.png"], transparency=0)
    # JPEG's first bytes, then nothing PIL can identify: both device and PIL paths look at it.
    paths["garbage.jpg"].write_bytes(b"\xff\xd8\xff" + b"not a picture" * 8)
    data = paths["plain.jpg"].read_bytes()
    paths["truncated.jpg"].write_bytes(data[: len(data) // 2])
    paths["damaged.tif"].write_bytes(damaged_tiff())
    paths["empty.jpg"].write_bytes(b"")
    return paths


def damaged_tiff() -> bytes:
    """A TIFF whose strip offsets are typed FLOAT: PIL fails to load it with a TypeError."""
    import struct

    buffer = io.BytesIO()
    Image.fromarray(picture(6, 4)).save(buffer, format="TIFF")
    data = bytearray(buffer.getvalue())
    ifd = struct.unpack_from("<I", data, 4)[0]  # little-endian, as PIL writes it ("II*\0")
    for entry in range(ifd + 2, ifd + 2 + 12 * struct.unpack_from("<H", data, ifd)[0], 12):
        if struct.unpack_from("<H", data, entry)[0] == 273:  # StripOffsets: LONG -> FLOAT
            struct.pack_into("<H", data, entry + 2, 11)
    return bytes(data)


def pil_stored(path: Path, mode: str = "RGB") -> np.ndarray:
    """What torchvision's ImageFolder (PIL's loader) gives: the pixels as stored (a TIFF's
    turned by its Orientation tag: Pillow's TIFF loader applies it)."""
    with Image.open(path) as image:
        return np.asarray(image.convert(mode))


def histogram(pixels: np.ndarray) -> np.ndarray:
    """(C, 256) counts of an (H, W, C) uint8 array, as dataset-stats counts pixels."""
    return np.stack([np.bincount(pixels[..., c].ravel(), minlength=256) for c in range(3)])


def scanned(path: Path, mode: str = "rgb"):
    """dataset-stats' pass over one file, pHash included."""
    return scan_files(0, [str(path)], [path.name], mode, None, True, True)


def dataset_pixels(path: Path, mode: str = "RGB") -> np.ndarray:
    """The pixels the train/eval/predict/extract-features dataset hands its transform."""
    samples = Samples(["a"], [0], paths=[str(path)])
    item, _, _, error = make_dataset(samples, np.asarray, mode=mode)[0]
    assert error == ""
    return item


def reduced_decode(path: Path, mode: str = "RGB") -> np.ndarray:
    """`train --decode fast`'s decode, at full size for an image this small."""
    image, _, reduction = ReducedDecodeCrop(64).decode(path, mode)
    assert reduction == 1
    return np.asarray(image)


def device_transform() -> DeviceDecodeTransform:
    fallback = train_transform(Preprocess(image_size=16, resize_size=18), decode="fast")
    return DeviceDecodeTransform(fallback, flip=True)


# --------------------------------------------------------------------------- the EXIF rule


def test_the_exif_rule_is_one_function_every_caller_must_answer(files):
    for function in (exif_orientation, pixels_in_mode):
        parameter = inspect.signature(function).parameters["exif"]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert parameter.default is inspect.Parameter.empty, function.__name__
    with opened_image(files["turned.jpg"]) as image:
        assert exif_orientation(image, exif=False) == 1
        assert exif_orientation(image, exif=True) == TURNED
    with opened_image(files["plain.jpg"]) as image:
        assert exif_orientation(image, exif=True) == 1


def test_a_turned_jpeg_is_read_as_stored_by_everything_that_feeds_or_measures(files):
    plain, turned = files["plain.jpg"], files["turned.jpg"]
    stored = pil_stored(plain)
    assert np.array_equal(pil_stored(turned), stored)
    viewed = np.asarray(ImageOps.exif_transpose(Image.open(turned)).convert("RGB"))
    assert viewed.shape == (48, 32, 3)  # the tag turns the 48x32 picture upright

    assert np.array_equal(np.asarray(load_image(turned, "RGB")), stored)
    assert np.array_equal(dataset_pixels(turned), stored)
    assert np.array_equal(reduced_decode(turned), stored)

    # The device path: the crop is drawn from the stored size, the bytes decoded as stored.
    torch.manual_seed(0)
    item = device_transform().pixels_from_file(turned, "RGB")
    torch.manual_seed(0)
    reference = device_transform().pixels_from_file(plain, "RGB")
    assert isinstance(item, EncodedJpeg) and item.box == reference.box
    (decoded,) = decode_jpegs([torch.frombuffer(bytearray(item.data), dtype=torch.uint8)], "cpu")
    assert np.array_equal(decoded.permute(1, 2, 0).numpy(), stored)

    # dataset-stats: the stored size, the stored pixels counted, the stored picture's pHash.
    result = scanned(turned)
    (record,) = result.records
    assert (record["width"], record["height"]) == (48, 32)
    assert np.array_equal(result.accumulator.histograms[(("R", "G", "B"), 255)], histogram(stored))
    ((_, _, stats_hash),) = result.hashes.tolist()
    assert stats_hash == phash_image(Image.fromarray(stored))
    assert stats_hash != phash_image(Image.fromarray(viewed))

    # The near-duplicate hash (dataset-stats' leakage check): a turned copy is the same picture.
    assert hash_file(turned)[1] == hash_file(plain)[1] == phash_file(turned)
    assert phash_bytes(turned.read_bytes()) == phash_bytes(plain.read_bytes())


def test_convert_tensor_turns_the_picture_unless_told_not_to(files):
    plain, turned = files["plain.jpg"], files["turned.jpg"]
    stored = read_image(plain).array
    viewed = np.asarray(ImageOps.exif_transpose(Image.open(turned)).convert("RGB"))
    assert np.array_equal(read_image(turned).array, viewed)
    assert np.array_equal(read_image(turned).array, apply_exif_orientation(stored, TURNED))
    assert np.array_equal(read_image(turned, exif=False).array, stored)
    # The same function answers both: asked for the picture as viewed, the loaders' decode
    # gives convert tensor's pixels.
    with opened_image(turned) as image:
        assert np.array_equal(np.asarray(pixels_in_mode(image, "RGB", exif=True)), viewed)


def test_a_turned_tiff_is_read_as_torchvision_reads_it_at_every_bit_depth(tmp_path):
    """Pillow's TIFF loader turns a TIFF by its Orientation tag, so torchvision's loader gives
    an 8-bit one turned; OpenCV, which decodes 16-bit colour, turns it too. One rule whatever
    the depth: turned, and once. convert tensor turned a 16-bit one twice (and --no-exif
    turned it), and under Pillow 10 (which sizes a TIFF as stored until loaded) a 16-bit one
    turned by 5..8 was unreadable everywhere."""
    eight = picture(6, 4)  # 4 rows of 6: a turn by 6 changes the shape
    sixteen = eight.astype(np.uint16) * 257  # the same 8-bit pixels once scaled
    paths = {"8-bit": tmp_path / "eight.tif", "16-bit": tmp_path / "sixteen.tif"}
    Image.fromarray(eight).save(paths["8-bit"], exif=with_orientation(TURNED))
    write_sixteen_bit_colour_tiff(paths["16-bit"], sixteen, TURNED)
    expected = pil_stored(paths["8-bit"])  # torchvision's default loader
    assert np.array_equal(expected, apply_exif_orientation(eight, TURNED))
    upright = tmp_path / "upright.png"
    Image.fromarray(expected).save(upright)

    def shrunk(path: Path) -> np.ndarray:  # dataset-stats --resize 2's counts
        scan = scan_files(0, [str(path)], [path.name], "rgb", 2, True, False)
        return scan.accumulator.histograms[(("R", "G", "B"), 255)]

    for depth, path in paths.items():
        assert np.array_equal(np.asarray(load_image(path, "RGB")), expected), depth
        assert np.array_equal(dataset_pixels(path), expected), depth
        assert np.array_equal(reduced_decode(path), expected), depth
        torch.manual_seed(0)  # train's crops: drawn from the size as read (Pillow 10: stored)
        boxes = [ReducedDecodeCrop(64).decode(path, "RGB")[1] for _ in range(20)]
        assert all(right <= 4 and bottom <= 6 for _, _, right, bottom in boxes), (depth, boxes)
        with opened_image(path) as image:  # the picture as viewed is the same: turned once
            assert np.array_equal(np.asarray(pixels_in_mode(image, "RGB", exif=True)), expected)
        result = scanned(path)
        histograms = result.accumulator.histograms[(("R", "G", "B"), 255)]
        assert np.array_equal(histograms, histogram(expected)), depth
        assert result.hashes[0][2] == phash_image(Image.fromarray(expected)), depth
        (record,) = result.records  # its size as read (Pillow 10 gave the stored one)
        assert (record["width"], record["height"]) == (4, 6), depth
        # --resize gives the picture read its own shape (Pillow 10 gave it the stored one)
        assert np.array_equal(shrunk(path), shrunk(upright)), depth
        # convert tensor: the picture as viewed (turned once), or with --no-exif as stored
        stored = eight if depth == "8-bit" else sixteen
        pixels = read_image(path).array
        assert np.array_equal(pixels, apply_exif_orientation(stored, TURNED)), depth
        assert np.array_equal(read_image(path, exif=False).array, stored), depth


def test_a_tiff_whose_orientation_is_not_a_number_is_read_as_stored(tmp_path):
    """An Orientation tag written as the text "6" turns nothing in Pillow's TIFF loader nor in
    OpenCV's (nor in ImageOps.exif_transpose): it was read as the number 6, so train's crops
    were drawn from the turned size (outside the pixels), a 16-bit colour one was refused as
    undecodable, and convert tensor --no-exif turned the stored pixels back."""
    import struct

    from PIL import TiffImagePlugin

    eight = picture(6, 4)  # 4 rows of 6: a turn by 6 changes the shape
    text_six = TiffImagePlugin.ImageFileDirectory_v2()
    text_six[0x0112], text_six.tagtype[0x0112] = "6", 2  # ASCII
    paths = {"8-bit": tmp_path / "eight.tif", "16-bit": tmp_path / "sixteen.tif"}
    Image.fromarray(eight).save(paths["8-bit"], tiffinfo=text_six)
    write_sixteen_bit_colour_tiff(paths["16-bit"], eight.astype(np.uint16) * 257, TURNED)
    data = paths["16-bit"].read_bytes()  # its Orientation entry as ASCII "6"
    entry = struct.pack("<HHI", 0x0112, 3, 1) + struct.pack("<H2x", TURNED)
    assert data.count(entry) == 1
    paths["16-bit"].write_bytes(data.replace(entry, struct.pack("<HHI", 0x0112, 2, 2) + b"6\0\0\0"))
    assert np.array_equal(pil_stored(paths["8-bit"]), eight)  # torchvision's default loader
    for depth, path in paths.items():
        assert np.array_equal(np.asarray(load_image(path, "RGB")), eight), depth
        torch.manual_seed(0)
        boxes = [ReducedDecodeCrop(64).decode(path, "RGB")[1] for _ in range(20)]
        assert all(right <= 6 and bottom <= 4 for _, _, right, bottom in boxes), (depth, boxes)
        stored = read_image(path, exif=False).array
        assert np.array_equal(read_image(path).array, stored), depth
        assert np.array_equal(
            uint16_to_uint8(stored) if stored.dtype == np.uint16 else stored, eight
        )
    # convert tensor of a PNG whose EXIF says "6" in text: as ImageOps.exif_transpose, not turned
    png = tmp_path / "text_six.png"
    exif = b"Exif\0\0II*\0" + struct.pack("<IHHHI", 8, 1, 0x0112, 2, 2) + b"6\0\0\0\0\0\0\0"
    Image.fromarray(eight).save(png, exif=exif)
    assert np.array_equal(read_image(png).array, eight)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_orientation_turns_arrays_and_images_alike(tmp_path, orientation):
    path = tmp_path / f"o{orientation}.png"  # lossless: pixels compare exactly
    Image.fromarray(picture(5, 3, orientation)).save(path, exif=with_orientation(orientation))
    viewed = np.asarray(ImageOps.exif_transpose(Image.open(path)).convert("RGB"))
    assert np.array_equal(read_image(path).array, viewed)
    with opened_image(path) as image:
        assert np.array_equal(np.asarray(pixels_in_mode(image, "RGB", exif=True)), viewed)
    assert np.array_equal(np.asarray(load_image(path, "RGB")), picture(5, 3, orientation))


# --------------------------------------------------------------------------- the same pixels


def test_a_16_bit_grayscale_png_gives_the_same_8_bit_pixels_everywhere(files):
    path = files["gray16.png"]
    with Image.open(path) as image:
        assert image.mode == SIXTEEN_BIT_GRAY
        raw = np.asarray(image).astype(np.uint16)
    eight = np.rint(raw / 257.0).astype(np.uint8)  # 65535 -> 255: scaled, not clipped
    rgb = np.repeat(eight[..., None], 3, axis=-1)

    assert np.array_equal(np.asarray(load_image(path, "L")), eight)
    assert np.array_equal(np.asarray(load_image(path, "RGB")), rgb)
    assert np.array_equal(dataset_pixels(path), rgb)
    assert np.array_equal(reduced_decode(path), rgb)
    result = scanned(path)
    assert np.array_equal(result.accumulator.histograms[(("R", "G", "B"), 255)], histogram(rgb))
    assert result.hashes[0][2] == phash_image(Image.fromarray(eight)) == phash_file(path)
    gray = scanned(path, "gray").accumulator.histograms[(("L",), 255)]
    assert np.array_equal(gray[0], np.bincount(eight.ravel(), minlength=256))
    # convert tensor keeps all 16 bits; made 8-bit, they are the loaders' pixels.
    pixels = read_image(path)
    assert pixels.array.dtype == np.uint16 and np.array_equal(pixels.array[..., 0], raw)
    assert np.array_equal(px.to_image(pixels, sixteen_bit=False), eight)


def test_a_16_bit_colour_png_gives_the_same_8_bit_pixels_everywhere(files):
    # PIL reads 16-bit colour as 8 bits itself, keeping the high byte (v >> 8, where 16-bit
    # gray is scaled): every loader scales it as it scales gray, round(v / 257).
    import cv2

    path = files["rgb16.png"]
    raw = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)[..., ::-1]
    eight = np.rint(raw / 257.0).astype(np.uint8)
    assert not np.array_equal(pil_stored(path), eight)  # PIL alone: the high byte

    _every_reader_scales_sixteen_bit_colour(path, raw)
    result = scanned(path)
    assert result.hashes[0][2] == phash_image(Image.fromarray(eight)) == phash_file(path)
    gray = np.asarray(Image.fromarray(eight).convert("L"))
    assert np.array_equal(np.asarray(load_image(path, "L")), gray)


def _every_reader_scales_sixteen_bit_colour(path, raw: np.ndarray) -> None:
    """The loaders, the reduced decode and the stats scan see round(v / 257); convert tensor
    keeps all 16 bits, which made 8-bit are the loaders' pixels."""
    eight = np.rint(raw / 257.0).astype(np.uint8)
    assert np.array_equal(np.asarray(load_image(path, "RGB")), eight)
    assert np.array_equal(dataset_pixels(path), eight)
    assert np.array_equal(reduced_decode(path), eight)
    result = scanned(path)
    assert np.array_equal(result.accumulator.histograms[(("R", "G", "B"), 255)], histogram(eight))
    assert result.sixteen_bit == 1  # counted for the warning that they are scaled
    pixels = read_image(path)
    assert pixels.array.dtype == np.uint16 and np.array_equal(pixels.array, raw)
    assert np.array_equal(px.to_image(pixels, sixteen_bit=False), eight)


def test_a_16_bit_colour_ppm_gives_the_same_8_bit_pixels_everywhere(tmp_path):
    # A P6 of maxval 65535: PIL reads it as 8 bits, round(v / 257) as every loader scales;
    # convert tensor keeps all 16 bits, as it does a 16-bit PNG's.
    raw = np.random.default_rng(5).integers(0, 65536, (4, 6, 3), dtype=np.uint16)
    raw[0, 0] = [386, 32767, 65535]  # 386 / 257 rounds up; its high byte is 1
    path = tmp_path / "rgb16.ppm"
    path.write_bytes(b"P6\n6 4\n65535\n" + raw.astype(">u2").tobytes())
    _every_reader_scales_sixteen_bit_colour(path, raw)


@pytest.mark.parametrize("name", ["cmyk.jpg", "palette.png"])
def test_cmyk_and_palette_images_give_the_same_rgb_pixels_everywhere(files, name):
    path = files[name]
    stored = pil_stored(path)
    assert np.array_equal(np.asarray(load_image(path, "RGB")), stored)
    assert np.array_equal(dataset_pixels(path), stored)
    assert np.array_equal(reduced_decode(path), stored)
    assert np.array_equal(read_image(path).array, stored)
    result = scanned(path)
    assert np.array_equal(result.accumulator.histograms[(("R", "G", "B"), 255)], histogram(stored))
    assert result.hashes[0][2] == phash_image(Image.fromarray(stored))


def test_a_transparent_palette_keeps_its_alpha_where_channels_are_kept(files):
    path = files["clear_palette.png"]
    rgba = pil_stored(path, "RGBA")
    assert (rgba[..., 3] == 0).any()
    native = scanned(path, "native").accumulator.histograms
    assert list(native) == [(("R", "G", "B", "A"), 255)]
    counts = np.stack([np.bincount(rgba[..., c].ravel(), minlength=256) for c in range(4)])
    assert np.array_equal(native[(("R", "G", "B", "A"), 255)], counts)
    assert np.array_equal(read_image(path).array, rgba)
    # The loaders feed RGB: the same colours, the alpha dropped.
    assert np.array_equal(np.asarray(load_image(path, "RGB")), rgba[..., :3])


def test_a_32_bit_integer_tiff_within_16_bits_is_scaled_as_16_bit_data(tmp_path):
    """An `I` TIFF of 0..65535: round(v / 257) from every loader (PIL's convert clips it to
    0..255: 1000 -> 255), measured so by dataset-stats."""
    raw = np.array([[0, 1000, 30000], [65535, 386, 128]], dtype=np.int32)
    path = tmp_path / "gray32.tif"
    Image.fromarray(raw, mode="I").save(path)
    eight = np.rint(raw / 257.0).astype(np.uint8)
    rgb = np.repeat(eight[..., None], 3, axis=-1)
    assert np.array_equal(np.asarray(load_image(path, "L")), eight)
    assert np.array_equal(dataset_pixels(path), rgb)
    assert np.array_equal(reduced_decode(path), rgb)
    measured = scanned(path).accumulator.histograms[(("R", "G", "B"), 255)]
    assert np.array_equal(measured, histogram(rgb))


@pytest.mark.parametrize(
    ("values", "dtype", "named"),
    [
        ([[0, 70_000]], np.int32, "32-bit integer samples lie in 0..70000, outside 0..65535"),
        ([[-1, 200]], np.int32, "32-bit integer samples lie in -1..200, outside 0..65535"),
        ([[0, 0.5]], np.float32, "32-bit float samples lie in 0..0.5, which"),
        ([[0, 255]], np.float32, "32-bit float samples lie in 0..255, which"),
    ],
    ids=["int-past-16-bits", "int-negative", "float-0-1", "float-0-255"],
)
def test_a_32_bit_tiff_no_scale_reads_right_is_refused_by_every_loader(
    tmp_path, values, dtype, named
):
    """Before: an `I` TIFF past 65535 was clipped to 255 and a float one of 0..1 read as black
    (PIL's conversion), silently. Now each reader refuses the file naming its range, as an
    unreadable one (skipped, counted); dataset-stats --mode native still measures it."""
    path = tmp_path / "deep.tif"
    Image.fromarray(np.array(values, dtype=dtype)).save(path)
    with pytest.raises(UnsupportedSamples, match=named) as caught:
        load_image(path, "RGB")
    assert isinstance(caught.value, unreadable_image_errors())
    with pytest.raises(UnsupportedSamples, match=named):
        reduced_decode(path)
    _, _, _, item_error = make_dataset(Samples(["a"], [0], paths=[str(path)]), np.asarray)[0]
    assert item_error == f"{path}: {caught.value}"
    assert [reason for _, reason, _ in scanned(path).errors] == [str(caught.value)]
    native = scanned(path, "native")
    assert not native.errors
    # No pHash either (PIL's clipped pixels would hash unlike images alike): measured, unhashed.
    with pytest.raises(UnsupportedSamples, match=named):
        phash_file(path)
    assert hash_file(path)[1] is None
    assert not len(native.hashes) and native.unhashed == 1


# --------------------------------------------------------------------------- unreadable files


def _errors_of_every_reader(path: Path) -> dict[str, BaseException]:
    """What each entry point raises for `path`."""
    readers = {
        "load_image": lambda: load_image(path, "RGB"),
        "reduced decode": lambda: ReducedDecodeCrop(64).decode(path, "RGB"),
        "device decode": lambda: device_transform().pixels_from_file(path, "RGB"),
        "phash": lambda: phash_file(path),
    }
    raised = {}
    for name, read in readers.items():
        with pytest.raises(BaseException) as caught:
            read()
        raised[name] = caught.value
    return raised


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        ("garbage.jpg", UnidentifiedImageError, "cannot identify image file"),
        # Was PIL's words alone, as for a format it does not know (dataset-stats said "empty
        # file"): an interrupted download leaves many.
        ("empty.jpg", UnidentifiedImageError, "cannot identify image file"),
        ("truncated.jpg", OSError, "truncated"),
        # Was the TypeError itself: it ended train, eval and predict ("Error: TypeError: 'float'
        # object cannot be interpreted as an integer", naming no file) instead of skipping it.
        ("damaged.tif", OSError, "damaged image data (TypeError: "),
    ],
)
def test_an_unreadable_image_is_the_same_error_everywhere(files, name, kind, message):
    path = files[name]
    raised = _errors_of_every_reader(path)
    for reader, error in raised.items():
        assert type(error) is type(raised["load_image"]), reader
        assert isinstance(error, kind) and isinstance(error, unreadable_image_errors()), reader
        assert message in str(error), reader
    if kind is UnidentifiedImageError:  # named by its path, whichever reader met it
        empty = " (an empty file)" if name == "empty.jpg" else ""
        assert {str(error) for error in raised.values()} == {
            f"cannot identify image file {os.fspath(path)!r}{empty}"
        }
    # What the commands make of it: a skipped item, a listed file, no pHash, convert's error;
    # each says why in the same words (`unreadable_reason`).
    reason = unreadable_reason(raised["load_image"])
    _, _, _, item_error = make_dataset(Samples(["a"], [0], paths=[str(path)]), np.asarray)[0]
    assert item_error == f"{path}: {reason}"
    result = scanned(path)
    assert [(index, why) for index, why, _ in result.errors] == [(0, reason)]
    assert not len(result.records)
    assert hash_file(path)[1] is None
    with pytest.raises(InputError) as converted:
        read_image(path)
    assert converted.value.message == f"cannot read image {path}: {reason}"


def _raising_in_pil(error: BaseException):
    """A method that raises `error` from a frame of PIL's own (as its decoders raise)."""
    scope = {"__name__": "PIL.ImageFile", "error": error}
    exec("def load(self):\n    raise error\n", scope)
    return scope["load"]


def test_only_pils_own_failures_count_as_damaged_files(files, monkeypatch):
    """Whatever PIL raises decoding a file is an unreadable file; running out of memory is not
    (it stops the command as before), nor is an error of the code around PIL."""
    from PIL import PngImagePlugin

    path = files["palette.png"]
    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", _raising_in_pil(IndexError("7")))
    with pytest.raises(OSError, match=r"^damaged image data \(IndexError: 7\)$"):
        load_image(path, "RGB")
    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", _raising_in_pil(MemoryError()))
    with pytest.raises(MemoryError):
        load_image(path, "RGB")
    with pytest.raises(KeyError), opened_image(path):
        raise KeyError("not PIL's")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_by_every_reader_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    for reader, error in _errors_of_every_reader(fifo).items():
        assert isinstance(error, NotARegularFile), reader
        assert str(error) == "not a regular file (a FIFO)", reader
    result = scanned(fifo)
    assert result.errors == [(0, "not a regular file (a FIFO)", 0)]
    with pytest.raises(OSError):
        hash_file(fifo)
    with pytest.raises(InputError, match=r"not a regular file \(a FIFO\)"):
        read_image(fifo)
    assert still_image_format(fifo, b"\xff\xd8\xff") is None  # video-info leaves it to FFmpeg


def test_bytes_and_paths_open_alike(files):
    data = files["turned.jpg"].read_bytes()
    with opened_image(data) as from_bytes, opened_image(files["turned.jpg"]) as from_path:
        assert from_bytes.size == from_path.size and from_bytes.format == "JPEG"
        assert np.array_equal(
            np.asarray(pixels_in_mode(from_bytes, "RGB", exif=False)),
            np.asarray(pixels_in_mode(from_path, "RGB", exif=False)),
        )
    with (
        pytest.raises(UnidentifiedImageError, match="'named.jpg'"),
        opened_image(b"junk", name="named.jpg"),
    ):
        pass


def test_pils_warnings_on_files_it_reads_anyway_stay_off_stderr(tmp_path, monkeypatch):
    """A palette PNG whose transparency is bytes, and an image past PIL's bomb warning size: read
    as before, without PIL's raw `warnings.warn` lines (printed once by every loader worker of
    train, eval, predict and extract-features; dataset-stats already kept them off)."""
    import warnings

    from torchkit.core.data import image_files

    palette = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8)).convert("P")
    palette.save(tmp_path / "palette.png", transparency=bytes([0, 10, 20, 30]))
    Image.new("L", (40, 40)).save(tmp_path / "large.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 1,600 pixels warn; 2,000 would refuse
    monkeypatch.setattr(image_files, "_pil_warnings_quiet", False, raising=False)  # fresh process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        palette_pixels = np.asarray(image_files.load_image(tmp_path / "palette.png", "RGB"))
        large = image_files.load_image(tmp_path / "large.png", "RGB")
    assert [str(w.message) for w in caught] == []
    assert palette_pixels.shape == (8, 8, 3) and large.size == (40, 40)


def test_a_16_bit_tiff_with_an_orientation_out_of_range_is_read_quietly(tmp_path, capfd):
    """libtiff's "Bad value 9 for "Orientation" tag" came through OpenCV's log on stderr at each
    read of a 16-bit colour TIFF whose pixels were read right (as stored): kept quiet for that
    read, the log level put back, and such a file OpenCV cannot decode still refused."""
    import cv2

    logging = getattr(getattr(cv2, "utils", None), "logging", cv2)
    level = logging.getLogLevel()
    stored = picture(6, 4).astype(np.uint16) * 257
    path = tmp_path / "nine.tif"
    write_sixteen_bit_colour_tiff(path, stored, 9)
    capfd.readouterr()
    assert np.array_equal(np.asarray(load_image(path, "RGB")), uint16_to_uint8(stored))
    assert np.array_equal(read_image(path).array, stored)
    assert capfd.readouterr().err == ""
    assert logging.getLogLevel() == level
    path.write_bytes(path.read_bytes()[:-20])  # the strip cut short
    with pytest.raises(OSError, match="OpenCV cannot decode"):
        load_image(path, "RGB")
    assert logging.getLogLevel() == level


def _grey_with_alpha_png(grey: np.ndarray, alpha: np.ndarray) -> bytes:
    """A 16-bit grey-with-alpha PNG (colour type 4), which neither PIL nor OpenCV writes."""
    import struct
    import zlib

    height, width = grey.shape
    samples = np.stack([grey, alpha], axis=-1).astype(">u2")
    rows = b"".join(b"\0" + samples[y].tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 16, 4, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )  # fmt: skip


def test_a_16_bit_grey_with_alpha_png_is_scaled_as_16_bit_colour(tmp_path):
    """PIL opens it as RGBA, keeping each sample's high byte: it is read at all 16 bits and
    scaled, round(v / 257), as 16-bit grey and colour are; its grey is R, G and B (as PIL
    gives it), so convert tensor keeps four 16-bit channels (docs/data.md)."""
    grey = np.array([[386, 51528, 65535], [0, 257, 32896]], np.uint16)  # 386: high byte 1
    alpha = np.array([[65535, 0, 1000], [200, 65535, 40000]], np.uint16)
    path = tmp_path / "grey_alpha16.png"
    path.write_bytes(_grey_with_alpha_png(grey, alpha))
    eight = uint16_to_uint8(grey)
    assert not np.array_equal(pil_stored(path, "L"), eight)  # PIL alone: the high byte
    assert np.array_equal(np.asarray(load_image(path, "L")), eight)
    assert np.array_equal(np.asarray(load_image(path, "RGB")), np.stack([eight] * 3, axis=-1))
    assert np.array_equal(dataset_pixels(path), np.stack([eight] * 3, axis=-1))
    assert np.array_equal(read_image(path).array, np.stack([grey, grey, grey, alpha], axis=-1))


def test_why_a_file_is_unreadable_is_said_in_one_set_of_words():
    """`unreadable_reason`: the words every command gives for each kind of unreadable file,
    whatever the reader or decoder that met it (no path, no Python error name)."""
    from PIL import UnidentifiedImageError

    said = {
        "empty file": UnidentifiedImageError("cannot identify image file 'x.png' (an empty file)"),
        "not an image PIL can read": UnidentifiedImageError("cannot identify image file 'x'"),
        "permission denied": PermissionError(13, "Permission denied", "x.png"),
        "file not found": FileNotFoundError(2, "No such file or directory", "x.png"),
        "input/output error": OSError(5, "Input/output error", "x.png"),
        "not a regular file (a folder)": NotARegularFile("not a regular file (a folder)"),
        "truncated file": OSError("image file is truncated (151 bytes not processed)"),
        "broken data stream when reading image file": OSError(
            "broken data stream when reading image file"
        ),
        "RuntimeError: a fault of the measuring code": RuntimeError(
            "a fault of the measuring code"
        ),
    }
    assert {unreadable_reason(error): reason for reason, error in said.items()} == {
        reason: reason for reason in said
    }
    assert unreadable_reason(OSError("Truncated File Read")) == "truncated file"
    assert unreadable_reason(UnidentifiedImageError("cannot identify"), size=0) == "empty file"
