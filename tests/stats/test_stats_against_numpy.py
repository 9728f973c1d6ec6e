"""dataset-stats' mean/std against NumPy over every pixel (not per image), on a folder of the
modes and sizes a real dataset mixes: L, LA, RGBA, P with a transparent entry, 16-bit gray PNG,
CMYK JPEG and an EXIF-rotated JPEG. The reference decodes each file with PIL alone, as
torchvision's ImageFolder does (`convert("RGB")`: alpha dropped, not composited; the pixels as
stored, EXIF orientation not applied), 16-bit samples scaled to 8 bits as round(v / 257)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from torchkit.core.stats import compute_dataset_stats

EXIF_ORIENTATION = 0x0112


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mixed_modes")
    rng = np.random.default_rng(7)
    for name in ("cat", "dog"):
        (root / name).mkdir()

    def noise(*shape: int, high: int = 256, dtype=np.uint8) -> np.ndarray:
        return rng.integers(0, high, shape, dtype=dtype)

    Image.fromarray(noise(5, 7), "L").save(root / "cat" / "gray.png")
    Image.fromarray(noise(6, 3, 2), "LA").save(root / "cat" / "gray_alpha.png")
    # transparent pixels keep a colour of their own: counted as stored, as training sees them
    Image.fromarray(noise(4, 9, 4), "RGBA").save(root / "cat" / "rgba.png")
    palette = Image.fromarray(noise(8, 5, high=4), "P")
    palette.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30])
    palette.save(root / "cat" / "palette.png", transparency=2)
    Image.fromarray(noise(7, 6, high=65536, dtype=np.uint16)).save(root / "dog" / "deep.png")
    Image.fromarray(noise(10, 12, 4), "CMYK").save(root / "dog" / "cmyk.jpg", quality=95)
    photo = Image.fromarray(noise(6, 11, 3), "RGB")
    exif = photo.getexif()
    exif[EXIF_ORIENTATION] = 6  # viewed turned 90 degrees; stored 11 wide, 6 high
    photo.save(root / "dog" / "rotated.jpg", exif=exif, quality=95)
    return root


def _decoded(path: Path, mode: str) -> Image.Image:
    """One file in `mode` (RGB or L), decoded by PIL alone."""
    with Image.open(path) as image:
        if image.mode in ("I", "I;16"):  # 16-bit gray: scaled to 8 bits, then converted
            scaled = np.rint(np.asarray(image, dtype=np.float64) / 257).astype(np.uint8)
            return Image.fromarray(scaled, "L").convert(mode)
        return image.convert(mode)


def _pixels(image: Image.Image) -> np.ndarray:
    """(pixels, channels) in [0, 1]."""
    return np.asarray(image, dtype=np.float64).reshape(image.width * image.height, -1) / 255


@pytest.mark.parametrize("mode, pil_mode", [("rgb", "RGB"), ("gray", "L")])
def test_mean_and_std_are_numpys_over_every_pixel(mixed_folder, mode, pil_mode):
    stats = compute_dataset_stats(mixed_folder, mode=mode, workers=0)
    files = sorted(mixed_folder.glob("*/*"))
    per_file = [_pixels(_decoded(path, pil_mode)) for path in files]
    every_pixel = np.concatenate(per_file)
    np.testing.assert_allclose(stats.mean, every_pixel.mean(axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(stats.std, every_pixel.std(axis=0), rtol=0, atol=1e-12)
    # the seed recipe's average of per-image means is another number on images of mixed sizes
    per_image_mean = np.mean([pixels.mean(axis=0) for pixels in per_file], axis=0)
    assert np.abs(per_image_mean - stats.mean).max() > 0.01
    assert stats.modes == {"L": 1, "LA": 1, "RGBA": 1, "P": 1, "I;16": 1, "CMYK": 1, "RGB": 1}


def test_resize_measures_what_torchvisions_resize_gives(mixed_folder):
    """--resize N: each image's shorter side to N (of its size as stored: the EXIF-rotated
    JPEG is 11 wide), bilinear with antialias, as `transforms.Resize(N)` on the PIL image."""
    from torchvision import transforms

    resize = transforms.Resize(4)
    every_pixel = [_pixels(resize(_decoded(path, "RGB"))) for path in mixed_folder.glob("*/*")]
    every_pixel = np.concatenate(every_pixel)
    stats = compute_dataset_stats(mixed_folder, mode="rgb", resize=4, workers=0)
    np.testing.assert_allclose(stats.mean, every_pixel.mean(axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(stats.std, every_pixel.std(axis=0), rtol=0, atol=1e-12)


def test_native_keeps_alpha_and_sixteen_bits(tmp_path):
    """--mode native: RGBA and a palette with a transparent entry are 4 channels, the alpha
    measured (the palette's transparent index has alpha 0); 16-bit gray in [0, 1] over 65535."""
    rng = np.random.default_rng(3)
    colour = tmp_path / "colour" / "a"
    colour.mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (4, 9, 4), dtype=np.uint8), "RGBA").save(colour / "x.png")
    palette = Image.fromarray(rng.integers(0, 4, (8, 5), dtype=np.uint8), "P")
    palette.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30])
    palette.save(colour / "y.png", transparency=2)
    every_pixel = []
    for path in sorted(colour.iterdir()):
        with Image.open(path) as image:
            every_pixel.append(np.asarray(image.convert("RGBA"), np.float64).reshape(-1, 4))
    every_pixel = np.concatenate(every_pixel) / 255
    stats = compute_dataset_stats(tmp_path / "colour", mode="native", workers=0)
    assert stats.channels == ["R", "G", "B", "A"]
    np.testing.assert_allclose(stats.mean, every_pixel.mean(axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(stats.std, every_pixel.std(axis=0), rtol=0, atol=1e-12)

    deep = tmp_path / "deep" / "a"
    deep.mkdir(parents=True)
    planes = [rng.integers(0, 65536, shape, dtype=np.uint16) for shape in ((7, 6), (3, 5))]
    for index, plane in enumerate(planes):
        Image.fromarray(plane).save(deep / f"{index}.png")
    values = np.concatenate([plane.ravel() for plane in planes]) / 65535
    stats = compute_dataset_stats(tmp_path / "deep", mode="native", workers=0)
    assert stats.mean == pytest.approx([values.mean()], abs=1e-12)
    assert stats.std == pytest.approx([values.std()], abs=1e-12)
