"""dataset-stats against the recipes it replaces (docs/commands/dataset-stats.md, "Against the
usual recipes"): the cheat-sheet's `compute_mean_and_std` (the mean of per-image means, the std
taken about that mean over every pixel), the DataLoader loop summing `ToTensor()` batches, and
hand checks of duplicates, corrupt files and leakage (hashlib over the bytes; PIL's `verify()`
and `load()`). Every reference is computed here from the pixels the test wrote, not by torchkit.
"""

from __future__ import annotations

import hashlib
import io
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from image_folders import write_sixteen_bit_colour_tiff
from PIL import Image
from processes import run_torchkit_in_process

from torchkit.core.data.image_files import load_image
from torchkit.core.stats import compute_dataset_stats
from torchkit.core.stats.scan import Accumulator

NORMALIZE_LINE = re.compile(r"Normalize\(mean=\[([^\]]*)\], std=\[([^\]]*)\]\)")


def _noise(rng, *shape: int, high: int = 256, dtype=np.uint8) -> np.ndarray:
    return rng.integers(0, high, shape, dtype=dtype)


def _to_8_bit(values: np.ndarray) -> np.ndarray:
    """16-bit samples as the loaders read them: round(v / 257)."""
    return np.rint(values.astype(np.float64) / 257).astype(np.uint8)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """A folder of images of different sizes and modes (L, RGB, RGBA, a palette with a
    transparent entry, 16-bit gray PNG, 16-bit RGB TIFF), and each file's (H, W, 3) uint8
    pixels as training sees them, worked out from the arrays written: gray repeated in R, G and
    B, alpha dropped, the palette looked up, 16-bit samples as round(v / 257)."""
    root = tmp_path_factory.mktemp("recipes") / "data"
    rng = np.random.default_rng(84)
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
    seen: dict[str, np.ndarray] = {}

    gray = _noise(rng, 37, 23)
    Image.fromarray(gray, "L").save(root / "a" / "gray.png")
    seen["a/gray.png"] = np.repeat(gray[..., None], 3, axis=2)
    rgb = _noise(rng, 64, 48, 3)
    Image.fromarray(rgb, "RGB").save(root / "a" / "rgb.png")
    seen["a/rgb.png"] = rgb
    rgba = _noise(rng, 9, 15, 4)
    Image.fromarray(rgba, "RGBA").save(root / "a" / "rgba.png")
    seen["a/rgba.png"] = rgba[..., :3]
    palette = np.array([[250, 10, 10], [10, 240, 10], [10, 10, 230], [90, 160, 30]], np.uint8)
    indices = _noise(rng, 20, 30, high=4)
    image = Image.fromarray(indices, "P")
    image.putpalette(palette.ravel().tolist())
    image.save(root / "b" / "palette.png", transparency=2)
    seen["b/palette.png"] = palette[indices]
    deep_gray = _noise(rng, 11, 7, high=65536, dtype=np.uint16)
    Image.fromarray(deep_gray).save(root / "b" / "deep_gray.png")
    seen["b/deep_gray.png"] = np.repeat(_to_8_bit(deep_gray)[..., None], 3, axis=2)
    deep_rgb = _noise(rng, 6, 10, 3, high=65536, dtype=np.uint16)
    write_sixteen_bit_colour_tiff(root / "b" / "deep_rgb.tif", deep_rgb)
    seen["b/deep_rgb.tif"] = _to_8_bit(deep_rgb)
    return root, seen


def _every_pixel(images) -> np.ndarray:
    """(pixels, 3) float64 in [0, 1], every pixel of every image."""
    return np.concatenate([image.reshape(-1, 3) for image in images]).astype(np.float64) / 255


def _seed_recipe(images) -> tuple[np.ndarray, np.ndarray]:
    """The cheat-sheet's `compute_mean_and_std`, from its description: each channel's mean is
    the average over the images of each image's mean; its std is the root of the mean squared
    deviation, over every pixel, from that mean; both divided by 255."""
    mean = np.mean([image.reshape(-1, 3).mean(axis=0) for image in images], axis=0)
    squares = sum(((image.reshape(-1, 3) - mean) ** 2).sum(axis=0) for image in images)
    pixels = sum(image.shape[0] * image.shape[1] for image in images)
    return mean / 255, np.sqrt(squares / pixels) / 255


def _per_image_std_average(images) -> np.ndarray:
    """The other hand loop's std: each image's own std, averaged over the images."""
    return np.mean([(image.reshape(-1, 3) / 255).std(axis=0) for image in images], axis=0)


def test_mixed_modes_and_sizes_are_every_pixel_and_the_seed_is_off(mixed):
    root, seen = mixed
    stats = compute_dataset_stats(root, workers=0)
    images = list(seen.values())
    every = _every_pixel(images)
    np.testing.assert_allclose(stats.mean, every.mean(axis=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(stats.std, every.std(axis=0), rtol=0, atol=1e-12)
    assert stats.pixels == len(every)
    assert stats.modes == {"L": 1, "RGB": 1, "RGBA": 1, "P": 1, "I;16": 1, "RGB;16": 1}

    seed_mean, seed_std = _seed_recipe(images)
    off = seed_mean - np.asarray(stats.mean)
    # the mean of per-image means is off on mixed sizes; the std, taken about that mean,
    # is off by exactly as much as the mean is: sqrt(std^2 + off^2)
    assert np.abs(off).max() > 0.01
    np.testing.assert_allclose(seed_std**2, np.square(stats.std) + off**2, rtol=0, atol=1e-12)


def test_the_seed_is_right_on_images_of_one_size(tmp_path):
    rng = np.random.default_rng(5)
    images = [_noise(rng, 12, 17, 3) for _ in range(4)]
    for index, image in enumerate(images):
        (tmp_path / "x").mkdir(exist_ok=True)
        Image.fromarray(image).save(tmp_path / "x" / f"{index}.png")
    stats = compute_dataset_stats(tmp_path, workers=0)
    seed_mean, seed_std = _seed_recipe(images)
    np.testing.assert_allclose(stats.mean, seed_mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(stats.std, seed_std, rtol=0, atol=1e-12)
    # averaging each image's std misses the spread between the images: too small even here
    assert (_per_image_std_average(images) < np.asarray(stats.std)).all()


def test_a_large_dark_image_and_a_small_light_one(tmp_path):
    """The docs' example: a 100x100 black image and a 10x10 white one."""
    images = [np.zeros((100, 100, 3), np.uint8), np.full((10, 10, 3), 255, np.uint8)]
    (tmp_path / "x").mkdir()
    for index, image in enumerate(images):
        Image.fromarray(image).save(tmp_path / "x" / f"{index}.png")
    stats = compute_dataset_stats(tmp_path, workers=0)
    white = 100 / 10_100
    assert stats.mean == pytest.approx([white] * 3, abs=1e-15)
    assert stats.std == pytest.approx([np.sqrt(white * (1 - white))] * 3, abs=1e-15)
    assert [round(v, 4) for v in stats.mean + stats.std] == [0.0099] * 3 + [0.0990] * 3
    seed_mean, seed_std = _seed_recipe(images)
    assert seed_mean.tolist() == [0.5] * 3 and seed_std.tolist() == [0.5] * 3
    assert _per_image_std_average(images).tolist() == [0.0] * 3


@pytest.mark.parametrize("size", [5, 80])  # every image made smaller; every one larger
def test_resize_is_the_dataloader_loop_over_resize_and_to_tensor(mixed, size):
    """--resize N against the usual loop: an ImageFolder with `Resize(N)` then `ToTensor()`,
    a DataLoader, each batch's sums and sums of squares added up in float64. Its loader reads
    the files as the docs say the loaders read them (gray and palette to RGB, alpha dropped,
    16-bit samples as round(v / 257), which PIL alone would clip)."""
    import torch
    from torchvision import datasets, transforms

    root, seen = mixed

    def loader(path: str) -> Image.Image:
        return Image.fromarray(seen[Path(path).relative_to(root).as_posix()], "RGB")

    folder = datasets.ImageFolder(
        str(root), transform=transforms.Compose([transforms.Resize(size), transforms.ToTensor()])
    )
    folder.loader = loader
    sums = torch.zeros(3, dtype=torch.float64)
    squares = torch.zeros(3, dtype=torch.float64)
    pixels = 0
    for x, _ in torch.utils.data.DataLoader(folder, batch_size=1):  # sizes differ
        x = x.double()
        sums += x.sum((0, 2, 3))
        squares += (x**2).sum((0, 2, 3))
        pixels += x.shape[0] * x.shape[2] * x.shape[3]
    mean = sums / pixels
    std = (squares / pixels - mean**2).sqrt()

    stats = compute_dataset_stats(root, resize=size, workers=0)
    assert stats.pixels == pixels
    # ToTensor's float32 division by 255 is the loop's only rounding (about 1e-8)
    np.testing.assert_allclose(stats.mean, mean.numpy(), rtol=0, atol=1e-7)
    np.testing.assert_allclose(stats.std, std.numpy(), rtol=0, atol=1e-7)
    unresized = compute_dataset_stats(root, workers=0)
    assert np.abs(np.subtract(stats.std, unresized.std)).max() > 1e-3  # resizing smooths


def test_float32_loop_drifts_on_imagenet_sized_sets_and_the_counts_do_not():
    """The DataLoader loop with float32 running sums, over 5,000 batches of 256 images of
    224x224 (about ImageNet's 1.28 million: here one image repeated, whose mean and std are
    those of the whole set), drifts by up to about 5e-5 (float64 running sums do not);
    torchkit's integer counts, as many, are exact."""
    import torch

    rng = np.random.default_rng(1)
    image = _noise(rng, 224, 224, 3)
    exact = image.reshape(-1, 3).astype(np.float64) / 255
    one = torch.from_numpy(image).permute(2, 0, 1).float().div(255)

    def off(dtype) -> float:
        """The loop's largest error in a mean or std, its running sums of `dtype` (a batch's
        sums: 256 times one image's, as summing 256 copies gives them to rounding)."""
        x = one.to(dtype)
        batch_sum, batch_squares = 256 * x.sum((1, 2)), 256 * (x**2).sum((1, 2))
        sums, squares = torch.zeros(3, dtype=dtype), torch.zeros(3, dtype=dtype)
        for _ in range(5000):
            sums += batch_sum
            squares += batch_squares
        pixels = 5000 * 256 * 224 * 224
        mean = (sums / pixels).double().numpy()
        std = np.sqrt((squares / pixels).double().numpy() - mean**2)
        return max(np.abs(mean - exact.mean(axis=0)).max(), np.abs(std - exact.std(axis=0)).max())

    assert 1e-6 < off(torch.float32) < 1e-4
    assert off(torch.float64) < 1e-7  # ToTensor's float32 division by 255 alone

    counts = Accumulator()
    counts.add_image(Image.fromarray(image), ("R", "G", "B"), "x.png")
    _, one_mean, one_std, _ = counts.moments()
    for _ in range(21):  # doubled: 2**21 copies, more than 5,000 batches of 256
        counts.merge(counts)
    _, counted_mean, counted_std, counted_pixels = counts.moments()
    assert counted_pixels == 2**21 * 224 * 224
    assert (counted_mean, counted_std) == (one_mean, one_std)  # to the last bit
    # the exact figures, in whole numbers: the mean is the float nearest sum / (255 n)
    values = image.reshape(-1, 3).astype(np.int64)
    n = len(values)
    assert counted_mean == [float(Fraction(int(s), 255 * n)) for s in values.sum(axis=0)]
    np.testing.assert_allclose(counted_std, exact.std(axis=0), rtol=0, atol=1e-14)


def test_the_printed_normalize_line_normalises_the_data(mixed):
    """The `Normalize(...)` line, pasted into torchvision's `transforms.Normalize`, gives the
    data mean 0 and std 1 to within what its 4 decimals allow (float64 throughout)."""
    import torch
    from torchvision import transforms

    root, seen = mixed
    result = run_torchkit_in_process("dataset-stats", root, "-j", "0")
    assert result.returncode == 0, result.stderr
    (match,) = NORMALIZE_LINE.finditer(result.stdout)
    mean = [float(v) for v in match.group(1).split(",")]
    std = [float(v) for v in match.group(2).split(",")]
    normalize = transforms.Normalize(mean, std)
    tensors = [torch.from_numpy(image / 255).permute(2, 0, 1) for image in seen.values()]
    normalised = torch.cat([normalize(x).reshape(3, -1) for x in tensors], dim=1)
    assert normalised.dtype == torch.float64
    allowed = 0.5e-4 / min(std) + 1e-12  # the printed figures are rounded to 4 decimals
    assert normalised.mean(dim=1).abs().max().item() <= allowed
    assert (normalised.std(dim=1, unbiased=False) - 1).abs().max().item() <= allowed
    assert allowed < 1e-3


@pytest.fixture
def damaged_splits(tmp_path) -> Path:
    """A split root: train/ with a copy filed under both classes, an image also in val/, a
    file that is no image, an empty one, a truncated PNG, a truncated JPEG and a PNG with a
    wrong checksum."""
    rng = np.random.default_rng(11)
    root = tmp_path / "splits"
    for split in ("train", "val"):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
    for index in range(4):
        Image.fromarray(_noise(rng, 8 + index, 9, 3)).save(root / "train" / "a" / f"{index}.png")
        Image.fromarray(_noise(rng, 7, 6 + index, 3)).save(root / "val" / "b" / f"{index}.png")
    (root / "train" / "b" / "twice.png").write_bytes((root / "train" / "a" / "0.png").read_bytes())
    (root / "val" / "a" / "leaked.png").write_bytes((root / "train" / "a" / "1.png").read_bytes())
    (root / "train" / "b" / "note.jpg").write_bytes(b"no image here")
    (root / "train" / "b" / "empty.png").write_bytes(b"")
    for name, fmt in (("cut.png", "PNG"), ("cut.jpg", "JPEG")):
        whole = io.BytesIO()
        Image.fromarray(_noise(rng, 48, 48, 3)).save(whole, format=fmt)
        (root / "train" / "a" / name).write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    whole = io.BytesIO()
    Image.fromarray(_noise(rng, 5, 5, 3)).save(whole, format="PNG")
    data = bytearray(whole.getvalue())
    at = data.index(b"IDAT")
    data[at + 4 + int.from_bytes(data[at - 4 : at], "big")] ^= 0xFF  # the chunk's checksum
    (root / "train" / "b" / "checksum.png").write_bytes(bytes(data))
    return root


def _pil_verify_fails(path: Path) -> bool:
    """PIL's `verify()`: the file's structure and checksums, nothing decoded."""
    try:
        with Image.open(path) as image:
            image.verify()
    except Exception:  # noqa: BLE001 - any failure is a refusal
        return True
    return False


def _pil_load_fails(path: Path) -> bool:
    """PIL's `load()`: the pixels decoded, as every loader decodes them."""
    try:
        with Image.open(path) as image:
            image.load()
    except Exception:  # noqa: BLE001 - any failure is an unreadable file
        return True
    return False


def test_duplicates_unreadable_and_leakage_are_the_hand_checks(damaged_splits):
    root = damaged_splits
    stats = compute_dataset_stats(root, workers=0)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    digest = {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in files}
    train = [path for path in files if path.relative_to(root).parts[0] == "train"]

    def name(path) -> str:  # the report's paths are relative to the root
        path = Path(path)
        return (path.relative_to(root) if path.is_absolute() else path).as_posix()

    unreadable = {name(path) for path in train if _pil_load_fails(path)}
    assert {name(u.path) for u in stats.unreadable} == unreadable
    # a PNG whose checksum alone is wrong: verify() refuses it, but it decodes, as the loaders
    # decode it for training: measured, not unreadable
    refused = {name(path) for path in train if _pil_verify_fails(path)}
    assert refused - unreadable == {"train/b/checksum.png"}
    assert load_image(root / "train" / "b" / "checksum.png", "RGB").size == (5, 5)
    assert stats.modes == {"RGB": 6} and stats.images == 6
    assert unreadable == {
        "train/a/cut.png",
        "train/a/cut.jpg",
        "train/b/note.jpg",
        "train/b/empty.png",
    }

    readable = [path for path in train if name(path) not in unreadable]
    groups: dict[str, set[str]] = {}
    for path in readable:
        groups.setdefault(digest[path], set()).add(name(path))
    copies = sorted(sorted(group) for group in groups.values() if len(group) > 1)
    assert sorted(sorted(name(p) for p in group.paths) for group in stats.duplicates) == copies
    assert copies == [["train/a/0.png", "train/b/twice.png"]]
    assert [sorted(group.classes) for group in stats.label_conflicts] == [["a", "b"]]

    leaks = {
        frozenset((name(a), name(b)))
        for a in readable
        for b in files
        if name(b).startswith("val/") and digest[a] == digest[b]
    }
    found = {frozenset((name(p.path_a), name(p.path_b))) for p in stats.leakage}
    assert {p.kind for p in stats.leakage} == {"exact"}
    assert found == leaks == {frozenset(("train/a/1.png", "val/a/leaked.png"))}
