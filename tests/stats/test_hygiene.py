"""Data hygiene (issue #20): exact and perceptual hashes, the near-duplicate search, leakage
between splits in `dataset-stats`, `split` keeping byte-identical files together, `--fixed` and
`--oversample`, and train's warning about copies across its splits."""

from __future__ import annotations

import csv
import io
import json
import logging
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from image_folders import write_image_folder
from PIL import Image, ImageDraw

from torchkit.cli import app
from torchkit.cli import dataset_stats as dataset_stats_cli
from torchkit.core.data import hashing, neardup
from torchkit.core.data.image_files import UnsupportedSamples
from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.split import split_dataset
from torchkit.core.stats import compute_dataset_stats

ERROR_LINE = re.compile(r"^Error: .+ \(.+\)$", re.M)


def scene(seed: int, width: int = 96, height: int = 72) -> Image.Image:
    """A small structured picture (smooth background and shapes): what photos look like to a
    perceptual hash, unlike noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width] / max(width, height)
    a, b, p = rng.uniform(-1, 1, 3)
    background = 128 + 90 * np.sin(3 * a * xx + 3 * b * yy + 6 * p)
    pixels = np.repeat(background[..., None], 3, axis=2) * rng.uniform(0.5, 1.0, 3)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(5):
        x0, y0 = rng.uniform(-0.2, 0.9, 2) * (width, height)
        w, h = rng.uniform(0.15, 0.5, 2) * (width, height)
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        draw.ellipse([x0, y0, x0 + w, y0 + h], fill=colour)
    return image


def save(image: Image.Image, path: Path, **options) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **options)
    return path


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def bits_apart(a: int, b: int) -> int:
    return bin(a ^ b).count("1")


# --------------------------------------------------------------------------- hashes


def test_content_groups_by_size_then_bytes(tmp_path):
    big = bytes(range(256)) * 400  # 100 KiB: more than the prefix that is hashed first
    files = {
        "a.png": b"same bytes",
        "b.png": b"same bytes",
        "c.png": b"same bytez",  # same size, other bytes
        "d.png": b"other size!",
        "e.bin": big + b"x",
        "f.bin": big + b"y",  # same size and prefix, differs at the end
        "g.bin": big + b"x",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    paths = [tmp_path / name for name in files] + [tmp_path / "missing.png"]
    assert hashing.content_groups(paths) == [[0, 1], [4, 6]]
    assert hashing.file_digest(tmp_path / "a.png") == hashing.file_digest(tmp_path / "b.png")


def reference_phash(data: bytes) -> int:
    """imagededup's PHash written out from its definition: the file's pixels as stored (no EXIF
    turn), any mode but RGB through RGBA to RGB, PIL's Lanczos to 32x32, gray by PIL's integer
    luma (ITU-R 601-2, rounded), DCT-II along both axes, the top-left 8x8, >= the median of the
    63 AC terms, row-major, the first bit most significant. 16-bit samples scaled to 8 bits
    first (where imagededup clips them)."""
    import scipy.fft

    with Image.open(io.BytesIO(data)) as image:
        if image.mode == "I" or image.mode.startswith("I;16"):  # Pillow 10 opens 16-bit PNGs as I
            image = Image.fromarray(np.rint(np.asarray(image) / 257).astype(np.uint8))
        if image.mode != "RGB":
            image = image.convert("RGBA").convert("RGB")
        rgb = np.asarray(image.resize((32, 32), Image.Resampling.LANCZOS), dtype=np.int64)
    gray = (rgb @ np.array([19595, 38470, 7471]) + 0x8000) >> 16
    coefficients = scipy.fft.dct(scipy.fft.dct(gray.astype(np.float64), axis=0), axis=1)
    coefficients = coefficients[:8, :8].ravel()
    bits = coefficients >= np.median(coefficients[1:])
    return int("".join("1" if bit else "0" for bit in bits), 2)


def image_kinds() -> dict[str, bytes]:
    """Small image files of every kind the hash meets: photos, line art, gray, RGBA, palette
    (with a transparent entry), bilevel, gray with alpha, CMYK JPEG, tiny and odd sizes, an
    EXIF-turned JPEG, a 16-bit PNG, a symmetric scan and its half-size copy, blank, stripes."""
    photo = scene(21, 150, 100)
    alpha = photo.convert("RGBA")
    alpha.putalpha(Image.fromarray(np.random.default_rng(0).integers(0, 256, (100, 150), np.uint8)))
    line_art = Image.new("L", (180, 120), 255)
    draw = ImageDraw.Draw(line_art)
    for k in range(9):
        draw.line([(k * 20, 0), (180 - k * 13, 119)], fill=0, width=2)
    yy, xx = np.mgrid[0:240, 0:240]
    scan = Image.fromarray(
        np.where((xx - 120) ** 2 + (yy - 120) ** 2 < 70**2, 200, 30).astype(np.uint8)
    )
    exif = Image.Exif()
    exif[0x0112] = 6
    deep = np.asarray(scene(22, 90, 70).convert("L"), dtype=np.uint16) * 257
    stripes = Image.fromarray(np.tile((np.arange(200) // 25 % 2 * 255).astype(np.uint8), (150, 1)))
    return {
        "photo.png": encoded(photo, "PNG"),
        "photo.jpg": encoded(photo, "JPEG", quality=80),
        "large.jpg": encoded(scene(23, 640, 480), "JPEG", quality=90),
        "gray.png": encoded(photo.convert("L"), "PNG"),
        "gray.jpg": encoded(photo.convert("L"), "JPEG"),
        "line_art.png": encoded(line_art, "PNG"),
        "rgba.png": encoded(alpha, "PNG"),
        "palette.png": encoded(photo.convert("P"), "PNG", transparency=3),
        "palette.gif": encoded(photo.convert("P"), "GIF"),
        "bilevel.png": encoded(photo.convert("1"), "PNG"),
        "gray_alpha.png": encoded(alpha.convert("LA"), "PNG"),
        "cmyk.jpg": encoded(photo.convert("CMYK"), "JPEG"),
        "tiny_5x5.png": encoded(scene(24, 5, 5), "PNG"),
        "one_pixel.png": encoded(scene(25, 1, 1), "PNG"),
        "odd_33x31.bmp": encoded(scene(26, 33, 31), "BMP"),
        "exif_turned.jpg": encoded(scene(27, 120, 80), "JPEG", exif=exif.tobytes()),
        "sixteen_bit.png": encoded(Image.fromarray(deep), "PNG"),
        "scan.png": encoded(scan, "PNG"),
        "scan_half.png": encoded(scan.resize((120, 120), Image.Resampling.LANCZOS), "PNG"),
        "blank.png": encoded(Image.new("RGB", (50, 40), (90, 90, 90)), "PNG"),
        "stripes.png": encoded(stripes, "PNG"),
    }


def test_phash_is_imagededups_bit_for_bit():
    """The exact hash (floor 0, --exact-phash): every kind of image hashes as the reference
    written from imagededup's definition, the resize PIL's Lanczos from the whole image, not a
    box filter (which gave other bits for large, tiny, odd-sized and bilevel images). The
    default too on images under twice the floor (512 px) a side, which it resizes whole."""
    kinds = image_kinds()
    for name, data in kinds.items():
        reference = reference_phash(data)
        assert hashing.phash_bytes(data, floor=0) == reference, name
        with Image.open(io.BytesIO(data)) as image:  # dataset-stats' whole decode: the same
            image.load()
            assert hashing.phash_image(image, floor=0) == reference, name
            if max(image.size) < 2 * hashing.PHASH_FLOOR:
                assert hashing.phash_bytes(data) == reference, name
    # A symmetric scan and its half-size copy: 2 bits apart, as in imagededup (the box filter
    # and reduced decode put them 12 apart).
    scan, half = hashing.phash_bytes(kinds["scan.png"]), hashing.phash_bytes(kinds["scan_half.png"])
    assert bits_apart(scan, half) == 2


def test_phash_of_a_large_jpeg_is_from_its_whole_decode(tmp_path):
    """The exact hash: a JPEG large enough for a reduced decode hashes from its whole decode,
    as imagededup's. The default decodes it at half its size (PIL's draft(): both sides stay
    >= 256 px) and lands 2 bits off, as the old box filter's reduced decode did 4."""
    data = encoded(scene(37, 1200, 900), "JPEG", quality=85)
    (tmp_path / "large.jpg").write_bytes(data)
    exact = hashing.hash_file(tmp_path / "large.jpg", floor=0)[1]
    assert exact == reference_phash(data)
    assert bits_apart(hashing.hash_file(tmp_path / "large.jpg")[1], exact) == 2
    for floor, decoded in ((0, (1200, 900)), (hashing.PHASH_FLOOR, (600, 450))):
        with Image.open(io.BytesIO(data)) as image:
            hashing.phash_image(image, floor=floor)
            assert image.size == decoded


def symmetric_scan(side: int) -> Image.Image:
    yy, xx = np.mgrid[0:side, 0:side]
    disc = (xx - side / 2) ** 2 + (yy - side / 2) ** 2 < (side * 7 / 24) ** 2
    return Image.fromarray(np.where(disc, 200, 30).astype(np.uint8))


def test_default_phash_of_a_large_symmetric_scan_keeps_its_geometry():
    """The default reduces a 2,400 px scan by 9 per side, which does not divide 2,400: resized
    as if its last, partial pixel were a whole one, the disc moved off centre by a fraction
    of a pixel, and coefficients that are 0 by symmetry took bits by sign (36 bits from the
    exact hash). PIL's reducing_gap resizes the reduced pixels with the image's own box: 2
    bits from the exact hash, and as far from a half-size copy (4 bits) as the exact one."""
    scan = symmetric_scan(2400)
    half = scan.resize((1200, 1200), Image.Resampling.LANCZOS)
    default = hashing.phash_image(scan)
    assert bits_apart(default, hashing.phash_image(scan, floor=0)) <= 2
    assert bits_apart(default, hashing.phash_image(half)) <= 4


def test_phash_matches_imagededup_when_installed(tmp_path):
    """The exact hash (--exact-phash) is imagededup's own, on every kind of image."""
    phash_module = pytest.importorskip("imagededup.methods")
    phash = phash_module.PHash(verbose=False)
    for name, data in image_kinds().items():
        if name == "sixteen_bit.png":  # imagededup clips 16-bit samples: scaled here
            continue
        path = tmp_path / name
        path.write_bytes(data)
        ours = f"{hashing.phash_file(path, floor=0):016x}"  # imagededup's spelling
        assert ours == phash.encode_image(str(path)), name


def test_copies_are_near_and_other_images_far():
    original = scene(11, 320, 240)
    base = hashing.phash_bytes(encoded(original, "PNG"))
    copies = [
        encoded(original, "JPEG", quality=50),
        encoded(original.resize((160, 120), Image.Resampling.LANCZOS), "JPEG", quality=85),
        encoded(original.resize((480, 360), Image.Resampling.BICUBIC), "PNG"),
        encoded(original.convert("L"), "PNG"),
    ]
    for data in copies:
        assert bits_apart(hashing.phash_bytes(data), base) <= 6
    others = [hashing.phash_bytes(encoded(scene(seed, 320, 240), "PNG")) for seed in range(8)]
    assert min(bits_apart(h, base) for h in others) > neardup.DEFAULT_NEAR_THRESHOLD


def test_phash_of_16_bit_and_palette_images():
    gray = np.asarray(scene(2).convert("L"), dtype=np.uint16) * 257
    sixteen = hashing.phash_bytes(encoded(Image.fromarray(gray), "PNG"))
    eight = hashing.phash_bytes(encoded(scene(2).convert("L"), "PNG"))
    assert bits_apart(sixteen, eight) <= 2  # scaled to 8 bits, not clipped white
    palette = hashing.phash_bytes(encoded(scene(2).convert("P"), "PNG"))
    assert bits_apart(palette, hashing.phash_bytes(encoded(scene(2), "PNG"))) <= 6
    with pytest.raises(Exception):  # noqa: B017 - whatever PIL raises for garbage
        hashing.phash_bytes(b"not an image")


def test_coefficients_that_are_zero_do_not_set_bits_by_rounding_noise():
    """An image flat along one axis (stripes, a gradient) or blank has DCT coefficients that
    are 0 in exact arithmetic, most of the 63 and so the median: a DCT by matrix products set
    their bits by float noise of either sign (a half-size copy of stripes lay 12 bits away, a
    black and a white image 31 apart). scipy's DCT, imagededup's, gives them as 0: 0 >= 0."""
    columns = (np.arange(200) // 25 % 2 * 255).astype(np.uint8)
    stripes = Image.fromarray(np.repeat(columns[None, :], 150, axis=0))
    half = stripes.resize((100, 75), Image.Resampling.BICUBIC)
    assert bits_apart(hashing.phash_image(stripes), hashing.phash_image(half)) == 0
    ramp = Image.fromarray(np.tile(np.arange(256, dtype=np.uint8), (100, 1)))
    ramp_copy = ramp.resize((300, 117), Image.Resampling.BICUBIC)
    assert hashing.phash_image(ramp) == hashing.phash_image(ramp_copy)
    # Blank: every coefficient but the DC term is 0, so every bit is set (imagededup: 16 f's).
    for value in (0, 128, 254, 255):
        assert hashing.phash_image(Image.new("L", (100, 100), value)) == 2**64 - 1


# --------------------------------------------------------------------------- the search


def _brute_force(values: np.ndarray, threshold: int) -> set[tuple[int, int, int]]:
    distances = neardup.popcount(values[:, None] ^ values[None, :])
    a, b = np.nonzero(np.triu(distances <= threshold, 1))
    return {(int(i), int(j), int(distances[i, j])) for i, j in zip(a, b, strict=True)}


@pytest.mark.parametrize("threshold", [0, 1, 4, 8, 10, 13])
def test_near_pairs_equal_brute_force(threshold):
    rng = np.random.default_rng(threshold)
    base = rng.integers(0, 2**63, 1500, dtype=np.uint64) * np.uint64(2)
    flips = np.zeros(400, dtype=np.uint64)
    for i in range(400):  # planted copies up to a few bits beyond the threshold
        for bit in rng.choice(64, int(rng.integers(0, threshold + 3)), replace=False):
            flips[i] |= np.uint64(1) << np.uint64(int(bit))
    values = np.concatenate([base, base[:400] ^ flips, base[:5]])  # and equal hashes
    a, b, d = neardup.near_pairs(values, threshold)
    assert set(zip(a.tolist(), b.tolist(), d.tolist(), strict=True)) == _brute_force(
        values, threshold
    )


def test_large_sets_use_multi_index_hashing_not_all_pairs(monkeypatch):
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2**63, 6000, dtype=np.uint64)
    values = np.concatenate([values, values[:100] ^ np.uint64(0b1011)])
    assert neardup.plan_search(len(values), 10) > 0
    monkeypatch.setattr(neardup, "_all_pairs", lambda *a: pytest.fail("compared all pairs"))
    a, b, d = neardup.near_pairs(values, 10)
    expected = {(i, 6000 + i) for i in range(100)}
    assert expected <= set(zip(a.tolist(), b.tolist(), strict=True))
    assert (d[np.isin(b, np.arange(6000, 6100))] <= 3).all()


def test_find_pairs_names_each_copy_once_with_its_split():
    ids = ["train/a/1.png", "train/a/2.png", "val/a/3.png", "test/a/4.png", "val/a/5.png"]
    splits = ["train", "train", "val", "test", "val"]
    same = b"x" * 32
    digests = [same, same, same, b"y" * 32, b"z" * 32]
    phashes = [0b1111, 0b1111, 0b1111, 0b0111, 0b1111 ^ (1 << 40)]
    leak, within = neardup.find_pairs(ids, splits, digests, phashes, threshold=3, within=True)
    got = [(p.path_a, p.split_a, p.path_b, p.split_b, p.kind, p.distance) for p in leak]
    # 1, 2 and 3 are one content (X); 4 (Y) and 5 (Z) are 1 bit from X, 2 from each other.
    assert got == [
        ("train/a/1.png", "train", "val/a/3.png", "val", "exact", 0),  # 2 is in 1's split
        ("train/a/1.png", "train", "test/a/4.png", "test", "near", 1),
        ("train/a/1.png", "train", "val/a/5.png", "val", "near", 1),
        ("val/a/5.png", "val", "test/a/4.png", "test", "near", 2),
    ]
    assert [(p.path_a, p.path_b, p.distance) for p in within] == [("val/a/3.png", "val/a/5.png", 1)]


def test_find_pairs_pairs_the_names_of_one_file_with_each_other_and_marks_them():
    """A file hard-linked from train into test, beside a byte copy of it in train (its
    content's first file): the link's pair was the copy's, and nothing told a link from a
    copy. Now it pairs with its own file's train name, marked same_file; a file no name of
    which could be read is still one content with its other names."""
    ids = ["train/a/copy.png", "train/a/x.png", "test/a/link.png", "val/u.png", "test/u.png"]
    splits = ["train", "train", "test", "val", "test"]
    digests = [b"x" * 32, b"x" * 32, b"x" * 32, None, None]
    same_file = [None, 0, 0, 1, 1]
    leak, _ = neardup.find_pairs(
        ids, splits, digests, [5, 5, 5, None, None], threshold=8, same_file=same_file
    )
    assert [(p.path_a, p.path_b, p.kind, p.same_file) for p in leak] == [
        ("train/a/x.png", "test/a/link.png", "exact", True),
        ("val/u.png", "test/u.png", "exact", True),
    ]
    plain, _ = neardup.find_pairs(ids, splits, digests, [5, 5, 5, None, None], threshold=8)
    assert [(p.path_a, p.path_b, p.same_file) for p in plain] == [
        ("train/a/copy.png", "test/a/link.png", False)
    ]


def test_every_near_copy_in_another_split_is_named_not_only_the_first_of_its_phash():
    """A brightened half-size copy saved as JPEG and PNG in val (one pHash, 4 bits from the
    train original): only the JPEG, the first of the two, was named; removing it left the
    PNG leaked. Each is named once, by the train file."""
    ids = ["train/a/p.png", "val/a/p_edit.jpg", "val/a/p_edit.png", "val/a/other.png"]
    splits = ["train", "val", "val", "val"]
    digests = [b"p" * 32, b"j" * 32, b"n" * 32, b"o" * 32]
    phashes = [0, 0b1111, 0b1111, 2**64 - 1]
    leak, _ = neardup.find_pairs(ids, splits, digests, phashes, threshold=8)
    assert [(p.path_a, p.path_b, p.kind, p.distance) for p in leak] == [
        ("train/a/p.png", "val/a/p_edit.jpg", "near", 4),
        ("train/a/p.png", "val/a/p_edit.png", "near", 4),
    ]


def test_many_images_with_one_phash_give_a_pair_each_not_all_pairs():
    """3,000 different blank images (one pHash): n - 1 pairs, linked to the first one."""
    n = 3000
    splits = ["train" if i % 2 else "val" for i in range(n)]
    ids = [f"{split}/x/{i:05d}.png" for i, split in enumerate(splits)]
    digests = [i.to_bytes(4, "big") for i in range(n)]
    leak, within = neardup.find_pairs(ids, splits, digests, [0] * n, threshold=8, within=True)
    assert len(leak) == 1500 and len(within) == 1499
    assert {p.path_a for p in leak} == {"train/x/00001.png"} and leak[0].distance == 0


def test_the_search_holds_no_python_objects_for_each_file():
    """dataset-stats --near-duplicates held a list, dicts and tuples for every file while it
    searched (about 1.4 KB a file: 1.4 GB at a million images, let go at the end). Only the
    contents of several files and the clusters paired are Python objects now; the pairs are
    the same (a tenth of the files a near copy of the one before)."""
    import tracemalloc

    n = 20_000
    splits = ["val" if i % 4 == 0 else "train" for i in range(n)]
    ids = [f"{split}/c/{i:06d}.png" for i, split in enumerate(splits)]
    digests = [i.to_bytes(32, "big") for i in range(n)]
    phashes = np.random.default_rng(0).integers(0, 2**63, n, dtype=np.uint64).tolist()
    for i in range(0, n, 10):
        phashes[i + 1] = phashes[i] ^ 0b101
    tracemalloc.start()
    try:
        leak, within = neardup.find_pairs(ids, splits, digests, phashes, threshold=8, within=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak / n < 700  # about 400 B (the lists given read into arrays); 1,450 before
    copies, in_val = [{ids[i], ids[i + 1]} for i in range(0, n, 10)], set(ids[::4])
    assert [{p.path_a, p.path_b} for p in leak] == [c for c in copies if c & in_val]
    assert [{p.path_a, p.path_b} for p in within] == [c for c in copies if not c & in_val]
    assert {(p.split_a, p.distance) for p in leak + within} == {("train", 2)}


def test_masked_arrays_give_the_pairs_lists_with_none_give():
    """dataset-stats hands the search one array of SHA-256s and one of pHashes, masked where a
    file has none (not read, not decodable), in place of a Python object a file."""
    ids = ["train/a.png", "train/b.png", "val/c.png", "val/d.png", "test/e.png", "test/f.png"]
    splits = [name.split("/")[0] for name in ids]
    digests = [b"a" * 32, b"b" * 32, b"a" * 32, None, b"e" * 32, None]
    phashes = [1, 0b111, 1, None, 0b110, None]
    same_file = [None, None, None, 7, None, 7]
    masked_digests = np.ma.masked_all(len(ids), dtype="V32")
    masked_phashes = np.ma.masked_all(len(ids), dtype=np.uint64)
    for i, (digest, phash) in enumerate(zip(digests, phashes, strict=True)):
        if digest is not None:
            masked_digests[i], masked_phashes[i] = np.frombuffer(digest, dtype="V32")[0], phash
    given = {"threshold": 2, "within": True, "same_file": same_file}
    from_lists = neardup.find_pairs(ids, splits, digests, phashes, **given)
    from_arrays = neardup.find_pairs(ids, splits, masked_digests, masked_phashes, **given)
    assert from_arrays == from_lists
    assert [(p.path_a, p.path_b, p.kind, p.distance, p.same_file) for p in from_lists[0]] == [
        ("train/a.png", "val/c.png", "exact", 0, False),
        ("val/d.png", "test/f.png", "exact", 0, True),
        ("train/b.png", "test/e.png", "near", 1, False),
        ("train/b.png", "val/c.png", "near", 2, False),
    ]
    assert [(p.path_a, p.path_b, p.distance) for p in from_lists[1]] == [
        ("train/a.png", "train/b.png", 2)
    ]


def test_the_search_holds_memory_for_its_hashes_not_for_every_chunk_value():
    """Past about 60,000 distinct pHashes the search cuts them into three chunks of 22 and 21
    bits, and looked each up in a table of every value: 48 MB at once whatever the number of
    hashes (730 B a hash at 65,000). Its tables now hold a few buckets a hash, and the
    candidates are checked a block at a time."""
    import tracemalloc

    values = np.random.default_rng(1).integers(0, 2**63, 2_000, dtype=np.uint64)
    values[1] = values[0] ^ np.uint64(0b11)
    neardup._multi_index_pairs(values[:10], 2, 3)  # numpy's first-call allocations
    tracemalloc.start()
    try:
        a, b, d = neardup._multi_index_pairs(values, 2, 3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20
    assert (0, 1, 2) in set(zip(a.tolist(), b.tolist(), d.tolist(), strict=True))


@pytest.mark.parametrize(("chunks", "threshold"), [(2, 5), (3, 8), (4, 8)])
def test_buckets_narrower_than_a_chunk_find_every_pair(chunks, threshold):
    """A chunk's table holds fewer buckets than the chunk has values (about 8 to 16 a hash), so
    a bucket holds other values too: every pair is still found, and no other, among many near
    copies of one image and equal hashes."""
    rng = np.random.default_rng(chunks)
    base = rng.integers(0, 2**64, 2000, dtype=np.uint64)
    cluster = np.full(400, base[0])
    for _ in range(5):  # 400 hashes within 5 bits of one
        flipped = rng.random(400) < 0.5
        bits = rng.integers(0, 64, int(flipped.sum())).astype(np.uint64)
        cluster[flipped] ^= np.uint64(1) << bits
    values = np.unique(np.concatenate([base, base[:300] ^ np.uint64(0b1001), cluster]))
    assert neardup._bucket_bits(len(values), 64 // chunks) < 64 // chunks
    a, b, d = neardup._multi_index_pairs(values, threshold, chunks)
    got = set(zip(a.tolist(), b.tolist(), d.tolist(), strict=True))
    assert got == _brute_force(values, threshold)
    assert len(got) > 5_000


# --------------------------------------------------------------------------- dataset-stats


@pytest.fixture
def leaky_root(tmp_path: Path) -> Path:
    """train/val/test of distinct scenes, plus: an exact copy of a train image in val, a
    resized JPEG of another in test, and a re-encoded copy of a train image in train."""
    root = tmp_path / "leaky"
    seed = 100
    for split, per_class in (("train", 4), ("val", 2), ("test", 2)):
        for name in ("cat", "dog"):
            for i in range(per_class):
                seed += 1
                save(scene(seed), root / split / name / f"{name}{i}.png")
    original = root / "train" / "cat" / "cat0.png"
    (root / "val" / "cat" / "copy.png").write_bytes(original.read_bytes())
    resized = Image.open(root / "train" / "dog" / "dog1.png").resize((64, 48))
    save(resized, root / "test" / "dog" / "small.jpg", quality=80)
    save(Image.open(root / "train" / "dog" / "dog2.png"), root / "train" / "dog" / "again.jpg")
    return root


def pairs_of(report: list[dict]) -> set[tuple]:
    return {(p["path_a"], p["split_a"], p["path_b"], p["split_b"], p["kind"]) for p in report}


def test_leakage_finds_planted_copies_with_splits_and_kinds(leaky_root):
    stats = compute_dataset_stats(leaky_root, workers=1)
    assert stats.split == "train" and stats.files == 9  # the statistics are of train only
    assert stats.leakage_checked and stats.hashed_files == 9 + 5 + 5
    assert pairs_of([p.to_dict() for p in stats.leakage]) == {
        ("train/cat/cat0.png", "train", "val/cat/copy.png", "val", "exact"),
        ("train/dog/dog1.png", "train", "test/dog/small.jpg", "test", "near"),
    }
    assert stats.near_duplicates == []
    within = compute_dataset_stats(leaky_root, workers=2, near_duplicates=True)
    assert pairs_of([p.to_dict() for p in within.near_duplicates]) == {
        ("train/dog/again.jpg", "train", "train/dog/dog2.png", "train", "near")
    }
    assert within.leakage == stats.leakage  # worker processes: the same pairs
    strict = compute_dataset_stats(leaky_root, workers=1, near_threshold=0)
    assert {p.kind for p in strict.leakage} <= {"exact", "near"}
    assert all(p.distance == 0 for p in strict.leakage)


def test_leakage_of_every_split_measured_and_no_leakage(leaky_root):
    everything = compute_dataset_stats(leaky_root, split="all", workers=1)
    assert everything.files == 19 and len(everything.leakage) == 2
    off = compute_dataset_stats(leaky_root, workers=1, leakage=False)
    assert not off.leakage_checked and off.leakage == [] and off.hashed_files == 0
    assert off.mean == compute_dataset_stats(leaky_root, workers=1).mean
    folder = compute_dataset_stats(leaky_root / "train", workers=1)
    assert not folder.leakage_checked and folder.near_threshold is None
    with pytest.raises(UsageError, match="no splits to compare"):
        compute_dataset_stats(leaky_root / "train", workers=1, pairs_required=True)
    # Of split data, the hint is to drop --no-leakage (it said to give split data).
    with pytest.raises(UsageError) as nothing:
        compute_dataset_stats(leaky_root, workers=1, leakage=False, pairs_required=True)
    assert nothing.value.hint.startswith("drop --no-leakage, or add --near-duplicates")
    with pytest.raises(UsageError, match="--near-threshold"):
        compute_dataset_stats(leaky_root, near_threshold=40)


def test_float_tiffs_take_no_part_in_the_duplicate_search(tmp_path, caplog):
    """32-bit float images, which every loader refuses, were hashed clipped by PIL: two
    different ones of 0..1 both as black, a false leak at distance 0. Now they have no pHash:
    measured by --mode native, left out of the search, with a warning for each kind."""
    ramp = np.linspace(0, 0.99, 64 * 48, dtype=np.float32).reshape(48, 64)
    save(Image.fromarray(ramp), tmp_path / "train" / "a" / "ramp.tif")
    save(Image.fromarray(ramp[::-1, ::-1].copy()), tmp_path / "val" / "a" / "turned.tif")
    with pytest.raises(UnsupportedSamples, match="float samples lie in 0..0.99"):
        hashing.phash_file(tmp_path / "val" / "a" / "turned.tif")
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        stats = compute_dataset_stats(tmp_path, mode="native", workers=1)
    assert stats.images == 1 and stats.leakage_checked and stats.leakage == []
    assert stats.hashed_files == 0
    assert "1 image(s) have 32-bit samples" in caplog.text
    assert "1 file(s) of the other splits are not images torchkit can hash" in caplog.text


def test_byte_identical_undecodable_files_in_two_splits_are_an_exact_leak(tmp_path, caplog):
    """A damaged file copied into val and test (and one in train) has no pHash, but its SHA-256
    still finds the copies: exact pairs, as for any other copy, the first in train measured
    (listed unreadable) and the others hashed, not measured."""
    damaged = encoded(scene(31, 64, 48), "JPEG")[:300]
    for split in ("train", "val", "test"):
        save(scene(32 + len(split), 64, 48), tmp_path / split / "a" / "fine.png")
        (tmp_path / split / "a" / "damaged.jpg").write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        stats = compute_dataset_stats(tmp_path, workers=1)
    pairs = [(p.split_a, p.split_b, p.kind, p.distance) for p in stats.leakage]
    assert pairs == [("train", "test", "exact", 0), ("train", "val", "exact", 0)]
    assert [p.path_b for p in stats.leakage] == ["test/a/damaged.jpg", "val/a/damaged.jpg"]
    assert [u.path for u in stats.unreadable] == ["train/a/damaged.jpg"]
    assert "2 file(s) of the other splits are not images torchkit can hash" in caplog.text


def test_cli_json_table_and_pair_csv(runner, leaky_root, tmp_path):
    pairs_csv = tmp_path / "pairs.csv"
    args = ["dataset-stats", str(leaky_root), "-j", "1", "--near-duplicates"]
    result = runner.invoke(app, [*args, "--format", "json", "--leakage-csv", str(pairs_csv)])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["leakage_checked"] is True and data["near_threshold"] == 8
    assert data["leakage_exact"] == 1 and data["leakage_near"] == 1
    for pair in data["leakage"] + data["near_duplicates"]:
        assert list(pair) == [
            *("path_a", "split_a", "path_b", "split_b", "kind", "distance", "same_file")
        ]
        assert isinstance(pair["distance"], int) and pair["kind"] in ("exact", "near")
        assert pair["same_file"] is False
    assert len(data["near_duplicates"]) == 1
    assert "1 exact and 1 near duplicate pair(s) cross splits" in result.stderr
    assert "also reading val, test (10 files" in result.stderr
    with pairs_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3 and rows[0]["kind"] == "exact" and rows[0]["split_b"] == "val"
    again = runner.invoke(app, [*args, "--leakage-csv", str(pairs_csv)])
    assert again.exit_code == 1 and "--force" in again.stderr  # not replaced without --force
    table = runner.invoke(app, [*args, "--leakage-csv", str(pairs_csv), "--force"])
    assert table.exit_code == 0, table.stderr
    assert "Leakage: the same image in different splits (2 pairs)" in table.stdout
    assert "leakage across splits" in table.stdout and "1 exact, 1 near" in table.stdout
    assert "Near duplicates within a split (1 pairs)" in table.stdout
    long = runner.invoke(app, ["dataset-stats", str(leaky_root), "-j", "1", "--format", "csv"])
    assert "summary,leakage_exact,1" in long.stdout and "summary,leakage_near,1" in long.stdout


def test_exact_phash_option_reaches_every_hash(runner, tmp_path, monkeypatch):
    """--exact-phash hashes the measured split's images and the other splits' files from their
    whole decode (floor 0); without it, both are reduced to the default floor first."""
    for seed, split in enumerate(("train", "train", "val", "test")):
        save(scene(50 + seed), tmp_path / split / "a" / f"{seed}.png")
    floors: list[int] = []
    phash_image = hashing.phash_image

    def recorded(image, *, floor=hashing.PHASH_FLOOR):
        floors.append(floor)
        return phash_image(image, floor=floor)

    monkeypatch.setattr(hashing, "phash_image", recorded)
    args = ["dataset-stats", str(tmp_path), "-j", "1", "--near-duplicates", "--format", "json"]
    for option, floor in (["--exact-phash"], 0), ([], hashing.PHASH_FLOOR):
        floors.clear()
        result = runner.invoke(app, [*args, *option])
        assert result.exit_code == 0, result.stderr
        assert floors == [floor] * 4  # 2 measured (train), 2 hashed (val, test)
        data = json.loads(result.stdout)
        assert data["leakage_checked"] is True
        assert data["exact_phash"] is (floor == 0)  # the report says which hash it used
    no_hash = runner.invoke(app, [*args[:4], "--no-leakage", "--format", "json"])
    assert no_hash.exit_code == 0, no_hash.stderr
    assert json.loads(no_hash.stdout)["exact_phash"] is None


def test_exact_phash_in_worker_processes(tmp_path):
    """A JPEG in val (hashed, not measured) and a PNG of its decoded pixels in train: with
    `exact_phash` both hash from the same whole pixels in the worker processes, distance 0;
    by default the JPEG is decoded at half its size and this one lands 2 bits off."""
    jpeg = encoded(scene(40, 600, 520), "JPEG", quality=85)
    (tmp_path / "val" / "a").mkdir(parents=True)
    (tmp_path / "val" / "a" / "photo.jpg").write_bytes(jpeg)
    save(Image.open(io.BytesIO(jpeg)).convert("RGB"), tmp_path / "train" / "a" / "photo.png")
    save(scene(41), tmp_path / "train" / "a" / "other.png")
    for exact, workers, distance in ((True, 2, 0), (False, 1, 2)):
        stats = compute_dataset_stats(tmp_path, workers=workers, exact_phash=exact)
        assert [(p.path_b, p.distance) for p in stats.leakage] == [("val/a/photo.jpg", distance)]


def test_near_duplicates_not_looked_for_are_not_reported_as_none_found(runner, leaky_root):
    """Split data without --near-duplicates: --format csv said `near_duplicates,0` and JSON had
    an empty list, as if none were found; the within-split search never ran."""
    args = ["dataset-stats", str(leaky_root), "-j", "1"]
    long = runner.invoke(app, [*args, "--format", "csv"])
    assert "summary,near_threshold,8" in long.stdout
    assert "near_duplicates" not in long.stdout
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    assert data["near_duplicates_checked"] is False and data["near_duplicates"] == []
    asked = runner.invoke(app, [*args, "--near-duplicates", "--format", "csv"])
    assert "summary,near_duplicates,1" in asked.stdout
    data = json.loads(runner.invoke(app, [*args, "--near-duplicates", "--format", "json"]).stdout)
    assert data["near_duplicates_checked"] is True and len(data["near_duplicates"]) == 1


def test_cli_pair_csv_refusals(runner, leaky_root, tmp_path):
    inside = runner.invoke(
        app, ["dataset-stats", str(leaky_root), "--leakage-csv", str(leaky_root / "p.csv")]
    )
    assert inside.exit_code == 1 and ERROR_LINE.search(inside.stderr)
    same = tmp_path / "same.csv"
    both = runner.invoke(
        app, ["dataset-stats", str(leaky_root), "-o", str(same), "--leakage-csv", str(same)]
    )
    assert both.exit_code != 0 and "same file" in both.stderr
    unsplit = runner.invoke(
        app, ["dataset-stats", str(leaky_root / "train"), "--leakage-csv", str(same)]
    )
    assert unsplit.exit_code == 2 and "no splits to compare" in unsplit.stderr
    assert not same.exists()
    bad = runner.invoke(app, ["dataset-stats", str(leaky_root), "--near-threshold", "99"])
    assert bad.exit_code == 2


def test_near_duplicates_within_data_without_splits(runner, leaky_root):
    args = ["dataset-stats", str(leaky_root / "train"), "-j", "1", "--near-duplicates"]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["leakage_checked"] is False and data["leakage"] == []
    assert pairs_of(data["near_duplicates"]) == {
        ("dog/again.jpg", None, "dog/dog2.png", None, "near")
    }
    table = runner.invoke(app, args)
    assert "near duplicates" in table.stdout and "1 pairs (pHash distance <= 8)" in table.stdout
    assert "Near duplicates (1 pairs)" in table.stdout and "leakage across" not in table.stdout


def test_split_csv_index_reports_leakage_that_dedup_prevents(runner, tmp_path):
    """The pipeline: a folder with 19 copies of one photo, split as a manifest without and
    with dedup groups, then checked by dataset-stats on the split.csv."""
    raw = tmp_path / "raw"
    for i in range(12):
        save(scene(200 + i), raw / ("a" if i % 2 else "b") / f"img{i}.png")
    for k in range(19):
        (raw / "a" / f"copy{k:02d}.png").write_bytes((raw / "a" / "img1.png").read_bytes())
    loose = split_dataset(raw, tmp_path / "loose", mode="manifest", dedup=False)
    assert loose.dedup_groups == 0 and loose.to_dict()["dedup_groups"] is None
    leaked = compute_dataset_stats(tmp_path / "loose" / "split.csv", workers=1)
    assert leaked.leakage and {p.kind for p in leaked.leakage} == {"exact"}
    kept = split_dataset(raw, tmp_path / "kept", mode="manifest")
    assert (kept.dedup_groups, kept.dedup_files) == (1, 20)
    clean = compute_dataset_stats(tmp_path / "kept" / "split.csv", workers=1)
    assert clean.leakage == [] and clean.leakage_checked


# --------------------------------------------------------------------------- split


def make_files(root: Path, counts: dict[str, int]) -> Path:
    for name, count in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (root / name / f"{name}_{i:02d}.png").write_bytes(f"{name}/{i}".encode() * 3)
    return root


def rows(out: Path) -> list[dict[str, str]]:
    with (out / "split.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def splits_by_name(out: Path) -> dict[str, str]:
    return {Path(r["source"]).name: r["split"] for r in rows(out)}


def test_split_keeps_byte_identical_files_together_and_opt_out(tmp_path):
    raw = make_files(tmp_path / "raw", {"cat": 30, "dog": 30})
    copies = [f"dup_{k:02d}.png" for k in range(19)]
    for name in copies:
        (raw / "cat" / name).write_bytes((raw / "cat" / "cat_00.png").read_bytes())
    spread = 0
    for seed in range(4):
        kept = split_dataset(raw, tmp_path / f"kept{seed}", mode="manifest", seed=seed)
        where = splits_by_name(tmp_path / f"kept{seed}")
        assert len({where[n] for n in [*copies, "cat_00.png"]}) == 1
        assert kept.dedup_groups == 1 and kept.dedup_files == 20
        loose = split_dataset(
            raw, tmp_path / f"loose{seed}", mode="manifest", seed=seed, dedup=False
        )
        where = splits_by_name(tmp_path / f"loose{seed}")
        spread += len({where[n] for n in [*copies, "cat_00.png"]}) > 1
        assert loose.dedup is False
    assert spread == 4  # 20 files at 8:1:1 never all land in one split by chance


def test_split_without_copies_is_unchanged_by_dedup(tmp_path):
    raw = make_files(tmp_path / "raw", {"cat": 23, "dog": 11})
    split_dataset(raw, tmp_path / "a", mode="manifest", seed=5)
    split_dataset(raw, tmp_path / "b", mode="manifest", seed=5, dedup=False)
    assert splits_by_name(tmp_path / "a") == splits_by_name(tmp_path / "b")
    assert list(rows(tmp_path / "a")[0]) == ["path", "label", "split", "source"]


def test_dedup_combines_with_group(tmp_path):
    raw = tmp_path / "raw"
    for patient in range(12):
        for shot in range(2):
            path = raw / "x" / f"p{patient:02d}_{shot}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"{patient}/{shot}".encode() * 4)
    # patient 3's first shot is byte-identical to patient 7's: both patients are one unit
    (raw / "x" / "p07_0.png").write_bytes((raw / "x" / "p03_0.png").read_bytes())
    for seed in range(6):
        out = tmp_path / f"o{seed}"
        result = split_dataset(raw, out, mode="manifest", seed=seed, group=r"^(p\d+)_")
        where = splits_by_name(out)
        assert len({where[n] for n in ("p03_0.png", "p03_1.png", "p07_0.png", "p07_1.png")}) == 1
        assert result.groups == 12 and result.dedup_groups == 1


def test_fixed_counts_per_class_and_errors(runner, tmp_path):
    raw = make_files(tmp_path / "raw", {"cat": 20, "dog": 9, "eel": 6})
    result = split_dataset(raw, tmp_path / "out", fixed="2,3", mode="manifest")
    assert result.names == ["train", "val", "test"] and result.fixed == [2, 3]
    assert result.counts == [[15, 2, 3], [4, 2, 3], [1, 2, 3]]
    two = split_dataset(raw, tmp_path / "two", fixed=[4], mode="manifest")
    assert two.names == ["train", "val"] and [row[1] for row in two.counts] == [4, 4, 4]
    with pytest.raises(InputError, match="class 'eel' has 6 image"):
        split_dataset(raw, tmp_path / "x", fixed="3,3", mode="manifest")
    pooled = split_dataset(raw, tmp_path / "pool", fixed="5", stratify=False, mode="manifest")
    assert pooled.totals == [30, 5]
    cli = runner.invoke(app, ["split", str(raw), str(tmp_path / "c"), "--fixed", "2,2"])
    assert cli.exit_code == 0, cli.stderr
    assert "fixed: 2 in val, 2 in test per class" in cli.stderr
    assert len(list((tmp_path / "c" / "val" / "dog").iterdir())) == 2
    for args, message in [
        (["--fixed", "2", "--ratio", "8:2"], "give one of them"),
        (["--fixed", "two"], "cannot read --fixed"),
        (["--fixed", "1,2,3"], "cannot read --fixed"),
        (["--fixed", "0"], "at least 1"),
        (
            ["--fixed", "2", "--names", "a,b,c"],
            "--names gives 3 split names for the 2 splits of --fixed",
        ),
    ]:
        bad = runner.invoke(app, ["split", str(raw), str(tmp_path / "bad"), *args])
        assert bad.exit_code == 2 and message in bad.stderr, (args, bad.stderr)
    short = runner.invoke(app, ["split", str(raw), str(tmp_path / "s"), "--fixed", "4,2"])
    assert short.exit_code == 1 and "'eel' has 6 image(s): --fixed 4,2 needs at least 7" in (
        short.stderr
    )
    assert not (tmp_path / "s").exists() and not (tmp_path / "bad").exists()


def test_fixed_with_groups_gives_every_split_a_group_and_warns_of_other_counts(tmp_path, caplog):
    """--fixed with groups larger than its counts put every group of a class in train (three
    patients of 5 images, --fixed 2,2: 10/5/0 or 15/0/0), test empty without a word."""
    raw = tmp_path / "raw"
    for name in ("cat", "dog"):
        (raw / name).mkdir(parents=True)
        for patient in range(3):
            for shot in range(5):
                path = raw / name / f"{name}{patient}_{shot}.png"
                path.write_bytes(f"{name}/{patient}/{shot}".encode())
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        result = split_dataset(
            raw, tmp_path / "out", fixed="2,2", group=r"^(\w+\d)_", mode="manifest"
        )
    assert result.counts == [[5, 5, 5], [5, 5, 5]]
    assert (
        "--fixed (val 2, test 2) is not met with whole groups for 2 class(es): "
        "cat (val 5, test 5), dog (val 5, test 5)" in caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        plain = split_dataset(raw, tmp_path / "plain", fixed="2,2", mode="manifest")
    assert plain.counts == [[11, 2, 2], [11, 2, 2]] and "--fixed" not in caplog.text


@pytest.mark.parametrize("mode", ["copy", "symlink", "manifest"])
def test_oversample_balances_train_with_numbered_repeats(tmp_path, mode):
    raw = make_files(tmp_path / "raw", {"cat": 20, "dog": 6})
    out = tmp_path / "out"
    result = split_dataset(raw, out, fixed="1,1", oversample=True, mode=mode)
    assert result.counts == [[18, 1, 1], [4, 1, 1]] and result.repeats == [0, 14]
    data = result.to_dict()
    assert data["oversample"] is True and data["repeats"] == 14
    assert [c["repeats"] for c in data["classes"]] == [0, 14]
    table = rows(out)
    assert list(table[0]) == ["path", "label", "split", "source", "repeat"]
    dog_train = [r for r in table if r["label"] == "dog" and r["split"] == "train"]
    assert len(dog_train) == 18
    per_source: dict[str, list[int]] = {}
    for row in dog_train:
        per_source.setdefault(row["source"], []).append(int(row["repeat"]))
    assert sorted(len(v) for v in per_source.values()) == [4, 4, 5, 5]  # round-robin
    assert all(sorted(v) == list(range(len(v))) for v in per_source.values())
    if mode == "manifest":
        assert len({r["path"] for r in dog_train}) == 4  # the rows repeat
    else:
        assert len({r["path"] for r in dog_train}) == 18  # every repeat a file of its own
        names = sorted(p.name for p in (out / "train" / "dog").iterdir())
        repeated = [n for n in names if re.fullmatch(r"dog_\d\d-repeat[1-5]\.png", n)]
        assert len(names) == 18 and len(repeated) == 14
        for row in dog_train:
            assert (out / row["path"]).read_bytes() == Path(row["source"]).read_bytes()
    assert all(r["repeat"] == "0" for r in table if r["split"] != "train")


def test_oversample_with_ratio_and_move_refused(runner, tmp_path):
    raw = make_files(tmp_path / "raw", {"cat": 30, "dog": 10})
    result = split_dataset(raw, tmp_path / "out", oversample=True, mode="manifest")
    assert result.counts[0][0] == 24 and result.counts[1][0] + result.repeats[1] == 24
    refused = runner.invoke(
        app, ["split", str(raw), str(tmp_path / "m"), "--oversample", "--mode", "move"]
    )
    assert refused.exit_code == 2 and "--oversample cannot --mode move" in refused.stderr
    assert (raw / "cat" / "cat_00.png").exists()


def long_named_files(root: Path) -> Path:
    """8 cats and 3 dogs whose 253-byte names leave no room for `-repeat1`."""
    make_files(root, {"cat": 8})
    (root / "dog").mkdir()
    for i in range(3):  # "é" is 2 bytes: a cut in the middle of one would not be UTF-8
        (root / "dog" / f"dog_{'é' * 122}{i}.png").write_bytes(f"dog/{i}".encode())
    return root


@pytest.mark.parametrize("mode", ["copy", "symlink", "hardlink"])
def test_oversample_repeats_of_long_names_are_shortened_to_fit(tmp_path, mode):
    raw = long_named_files(tmp_path / "raw")
    out = tmp_path / "out"
    result = split_dataset(raw, out, fixed="1", oversample=True, mode=mode)
    assert result.repeats == [0, 5]
    names = [p.name for p in (out / "train" / "dog").iterdir()]
    assert len(names) == 7 and all(len(n.encode()) <= 255 for n in names)
    # Both train dogs shortened to one stem: `-repeat1` and `-repeat1-1` keep them apart.
    repeats = sorted(re.sub("^dog_é+", "", n) for n in names if "-repeat" in n)
    assert repeats == [
        "-repeat1-1.png",
        "-repeat1.png",
        "-repeat2-1.png",
        "-repeat2.png",
        "-repeat3.png",
    ]
    for row in rows(out):
        assert (out / row["path"]).read_bytes() == Path(row["source"]).read_bytes()


@pytest.mark.parametrize("mode", ["copy", "symlink", "hardlink"])
def test_a_name_the_file_system_refuses_as_too_long_is_one_error_line(
    runner, tmp_path, monkeypatch, mode
):
    from torchkit.core.split import plan

    # A file system with shorter names than the 255 bytes torchkit shortens names to.
    monkeypatch.setattr(plan, "NAME_MAX", 4096, raising=False)
    raw = long_named_files(tmp_path / "raw")
    out = tmp_path / "out"
    args = ["split", str(raw), str(out), "--fixed", "1", "--oversample", "--mode", mode]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"Error: file name too long: {out / 'train' / 'dog' / 'dog_é'}")
    assert line.endswith(
        "-repeat1.png (the file system takes shorter names: rename the file "
        "in the dataset, or use --mode manifest)"
    )
    assert not out.exists()


def test_cli_reports_dedup_groups(runner, tmp_path):
    raw = make_files(tmp_path / "raw", {"cat": 10, "dog": 10})
    for k in range(3):
        (raw / "dog" / f"same{k}.png").write_bytes((raw / "cat" / "cat_01.png").read_bytes())
    args = ["split", str(raw), str(tmp_path / "out"), "--mode", "manifest", "--format", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["dedup_groups"] == 1 and data["dedup_files"] == 4
    assert data["fixed"] is None and data["oversample"] is False and data["repeats"] == 0
    assert "kept 1 group(s) of byte-identical files (4 files) in one split each" in result.stderr
    off = runner.invoke(
        app, [*args[:2], str(tmp_path / "off"), "--no-dedup-groups", "--format", "json"]
    )
    assert off.exit_code == 0 and json.loads(off.stdout)["dedup_groups"] is None
    assert "byte-identical" not in off.stderr


def test_identical_files_in_two_classes_are_warned_of_listed_and_kept(runner, tmp_path):
    """The same image filed under two classes (a label conflict, common in scraped data): split
    keeps the group in one split, every file in its own class, and says so in a warning that
    names the files and in its JSON (`label_conflicts`); dataset-stats counts such groups.
    A copy within one class is no conflict."""
    raw = write_image_folder(tmp_path / "raw", {"cat": 10, "dog": 10})
    (raw / "dog" / "also_cat.png").write_bytes((raw / "cat" / "cat_1.png").read_bytes())
    (raw / "cat" / "again.png").write_bytes((raw / "cat" / "cat_2.png").read_bytes())
    out = tmp_path / "out"
    result = runner.invoke(app, ["split", str(raw), str(out), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["dedup_groups"] == 2
    (conflict,) = data["label_conflicts"]
    assert conflict["paths"] == ["cat/cat_1.png", "dog/also_cat.png"]
    assert conflict["classes"] == ["cat", "dog"]
    assert (out / conflict["split"] / "cat" / "cat_1.png").is_file()
    assert (out / conflict["split"] / "dog" / "also_cat.png").is_file()
    assert len(rows(out)) == 22 and sorted(f.name for f in raw.rglob("*.png")) == sorted(
        Path(r["source"]).name for r in rows(out)
    )
    assert (
        "Warning: 1 group(s) of byte-identical files are filed under more than one class (a "
        "label conflict): cat/cat_1.png = dog/also_cat.png (cat, dog); each group is kept in "
        "one split, every file in its own class (--format json lists them as label_conflicts)"
    ) in " ".join(result.stderr.split())
    off = runner.invoke(
        app, ["split", str(raw), str(tmp_path / "off"), "--no-dedup-groups", "--format", "json"]
    )
    assert off.exit_code == 0 and json.loads(off.stdout)["label_conflicts"] is None
    stats = runner.invoke(app, ["dataset-stats", str(raw), "--format", "json", "-j", "0"])
    assert stats.exit_code == 0, stats.stderr
    assert json.loads(stats.stdout)["duplicate_label_conflicts"] == 1
    assert "cat/cat_1.png = dog/also_cat.png (cat, dog)" in " ".join(stats.stderr.split())


def test_dataset_stats_table_and_csv_count_the_label_conflicts(runner, tmp_path):
    """The table's duplicate row says how many of its groups span classes, and the CSV's
    summary rows count them (duplicate_label_conflicts); a copy within one class is none."""
    raw = write_image_folder(tmp_path / "raw", {"cat": 4, "dog": 4})
    (raw / "dog" / "also_cat.png").write_bytes((raw / "cat" / "cat_1.png").read_bytes())
    (raw / "cat" / "again.png").write_bytes((raw / "cat" / "cat_2.png").read_bytes())
    table = runner.invoke(app, ["dataset-stats", str(raw), "-j", "0"])
    assert table.exit_code == 0, table.stderr
    assert "2 (in 2 groups; 1 across classes)" in table.stdout
    one = SimpleNamespace(duplicate_files=1, duplicates=[None], label_conflicts=[])
    assert dataset_stats_cli._duplicates_cell(one) == "1 (in 1 group)"
    out = tmp_path / "stats.csv"
    args = ["dataset-stats", str(raw), "--format", "csv", "-o", str(out), "-j", "0"]
    assert runner.invoke(app, args).exit_code == 0
    written = csv.DictReader(out.read_text().splitlines())
    summary = {row["name"]: row["value"] for row in written if row["section"] == "summary"}
    assert summary["duplicate_files"] == "2" and summary["duplicate_label_conflicts"] == "1"


def test_a_finished_move_reports_its_label_conflicts_again(tmp_path):
    """A move's journal keeps its label conflicts: the same move run again (nothing left to
    move) reports the groups the first run found."""
    raw = write_image_folder(tmp_path / "raw", {"cat": 4, "dog": 4})
    (raw / "dog" / "also_cat.png").write_bytes((raw / "cat" / "cat_1.png").read_bytes())
    out = tmp_path / "out"
    moved = split_dataset(raw, out, mode="move")
    assert [c["paths"] for c in moved.label_conflicts] == [["cat/cat_1.png", "dog/also_cat.png"]]
    again = split_dataset(raw, out, mode="move")
    assert again.already_done and again.label_conflicts == moved.label_conflicts


def test_a_label_conflict_across_many_classes_is_named_by_its_first_classes(runner, tmp_path):
    """A placeholder image filed under every class (a scraper's "no image" picture in 1,000
    classes) is one group: its warning names the first three classes and counts the rest,
    where it listed every class in one line; the JSON lists them all."""
    classes = [f"class_{i}" for i in range(6)]
    raw = write_image_folder(tmp_path / "raw", dict.fromkeys(classes, 5))
    placeholder = encoded(Image.new("RGB", (8, 8)), "PNG")
    for name in classes:
        (raw / name / "placeholder.png").write_bytes(placeholder)
    said = (
        "1 group(s) of byte-identical files are filed under more than one class (a label "
        "conflict): class_0/placeholder.png = class_1/placeholder.png and 4 more (class_0, "
        "class_1, class_2 and 3 more classes)"
    )
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["split", str(raw), str(out), "--mode", "manifest", "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    assert f"Warning: {said}; each group is kept" in " ".join(result.stderr.split())
    (conflict,) = json.loads(result.stdout)["label_conflicts"]
    assert conflict["classes"] == classes and len(conflict["paths"]) == 6
    stats = runner.invoke(app, ["dataset-stats", str(raw), "-j", "0", "--format", "json"])
    assert stats.exit_code == 0, stats.stderr
    assert f"Warning: {said} (listed under" in " ".join(stats.stderr.split())


def test_copies_of_a_file_that_is_no_image_are_no_label_conflict(runner, tmp_path):
    """A scraper's saved error page (HTML named .jpg) in two classes: split called the copies
    "the same image labelled twice" (a label conflict) where dataset-stats, as every command
    that reads images, skips them as unreadable; they are still one group kept in one split."""
    raw = write_image_folder(tmp_path / "raw", {"cat": 10, "dog": 10})
    page = b"<html><body>404 Not Found</body></html>\n"
    (raw / "cat" / "img_17.jpg").write_bytes(page)
    (raw / "dog" / "img_903.jpg").write_bytes(page)
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["split", str(raw), str(out), "--mode", "manifest", "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["dedup_groups"] == 1 and data["label_conflicts"] == []
    assert "label conflict" not in result.stderr
    splits = splits_by_name(out)
    assert splits["img_17.jpg"] == splits["img_903.jpg"]
    stats = runner.invoke(app, ["dataset-stats", str(raw), "-j", "0", "--format", "json"])
    assert stats.exit_code == 0, stats.stderr
    assert json.loads(stats.stdout)["duplicate_label_conflicts"] == 0


def test_a_label_conflict_of_a_large_image_prints_no_raw_pil_warning(
    runner, tmp_path, monkeypatch, recwarn
):
    """The header read that tells an image from other bytes is every reader's: a 10,000 x
    10,000 px PNG in two classes is a label conflict, without PIL's raw
    'DecompressionBombWarning: Image size (100000000 pixels) exceeds limit ...' lines."""
    import struct
    import zlib

    from torchkit.core.data import image_files

    monkeypatch.setattr(image_files, "_pil_warnings_quiet", False)  # as in a new process

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", 10_000, 10_000, 8, 0, 0, 0, 0))
    large = b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(b"\0" * 100))
    raw = write_image_folder(tmp_path / "raw", {"cat": 10, "dog": 10})
    (raw / "cat" / "large.png").write_bytes(large + chunk(b"IEND", b""))
    (raw / "dog" / "large.png").write_bytes(large + chunk(b"IEND", b""))
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["split", str(raw), str(out), "--mode", "manifest", "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    (conflict,) = json.loads(result.stdout)["label_conflicts"]
    assert conflict["paths"] == ["cat/large.png", "dog/large.png"]
    assert not [w for w in recwarn if "DecompressionBomb" in type(w.message).__name__]
    assert "DecompressionBomb" not in result.stderr


def test_an_unlabelled_copy_of_a_labelled_image_is_no_label_conflict(tmp_path, caplog):
    """Shards whose test split has no labels: its image with a train image's bytes is a copy,
    no label conflict (dataset-stats warned of one, "(, cat)"); a group with labelled copies
    in two classes is one, its unlabelled copy not named among the classes ("(, cat, dog)")."""
    import tarfile

    def image(colour: tuple[int, int, int]) -> bytes:
        return encoded(Image.new("RGB", (4, 4), colour), "PNG")

    def shards(folder: Path, labels: dict[str, list[tuple[str, bytes]]]) -> Path:
        folder.mkdir()
        for split, samples in labels.items():
            with tarfile.open(folder / f"{split}-000000.tar", "w") as tar:
                for number, (label, data) in enumerate(samples):
                    for extension, member in (
                        ("png", data),
                        ("json", b'{"label": %s}' % label.encode()),
                    ):
                        info = tarfile.TarInfo(f"{split}{number}.{extension}")
                        info.size = len(member)
                        tar.addfile(info, io.BytesIO(member))
        return folder

    a, b, c = image((1, 2, 3)), image((4, 5, 6)), image((7, 8, 9))
    copy = shards(
        tmp_path / "copy",
        {"train": [('"cat"', a), ('"dog"', b), ('"cat"', c)], "test": [("null", a)]},
    )
    conflict = shards(
        tmp_path / "conflict",
        {"train": [('"cat"', a), ('"dog"', a), ('"dog"', b), ('"cat"', c)], "test": [("null", a)]},
    )
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        copied = compute_dataset_stats(copy, split="all", workers=0, leakage=False)
    assert len(copied.duplicates) == 1 and copied.to_dict()["duplicate_label_conflicts"] == 0
    assert "label conflict" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        conflicted = compute_dataset_stats(conflict, split="all", workers=0, leakage=False)
    assert conflicted.to_dict()["duplicate_label_conflicts"] == 1
    assert "train1.png and 1 more (cat, dog) (listed under duplicates" in caplog.text


def test_empty_files_are_no_group_of_byte_identical_files(runner, tmp_path):
    """Empty files (an interrupted download leaves many) are no images and no copies of one:
    as one group of byte-identical files they went to one split whole, whatever their classes,
    and the split's other files were cut around them (val and test of 2 and 3 files of 40)."""
    raw = make_files(tmp_path / "raw", {"cat": 10, "dog": 10})
    for name in ("cat", "dog"):
        for k in range(10):
            (raw / name / f"empty{k}.jpg").write_bytes(b"")
    assert hashing.content_groups(sorted(raw.rglob("empty*.jpg"))) == []
    args = ["split", str(raw), str(tmp_path / "out"), "--mode", "manifest", "--format", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["dedup_groups"], data["dedup_files"]) == (0, 0)
    assert "byte-identical" not in result.stderr
    with open(tmp_path / "out" / "split.csv", encoding="utf-8", newline="") as index:
        rows = list(csv.DictReader(index))
    counts = Counter((row["split"], row["label"]) for row in rows)
    assert counts == {
        ("train", "cat"): 16, ("val", "cat"): 2, ("test", "cat"): 2,
        ("train", "dog"): 16, ("val", "dog"): 2, ("test", "dog"): 2,
    }  # fmt: skip


# --------------------------------------------------------------------------- train


def test_train_warns_about_copies_across_its_splits(tmp_path, caplog):
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import cross_split_copies, load_splits

    root = tmp_path / "data"
    write_image_folder(root / "train", {"ant": 4, "bee": 4}, seed=1)
    write_image_folder(root / "val", {"ant": 2, "bee": 2}, seed=2)
    write_image_folder(root / "test", {"ant": 2, "bee": 2}, seed=3)
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        data = load_splits(TrainConfig(data=str(root)))
    assert not [r for r in caplog.records if "byte-identical" in r.getMessage()]
    assert cross_split_copies(data.splits) == (0, 0)
    for split in ("val", "test"):
        (root / split / "ant" / "leak.png").write_bytes((root / "train/ant/ant_0.png").read_bytes())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        load_splits(TrainConfig(data=str(root)))
    (line,) = [r.getMessage() for r in caplog.records if "byte-identical" in r.getMessage()]
    assert line == (
        "3 images have a byte-identical copy in another of the run's splits (train/val/test; "
        "1 group): val and test figures are inflated; see them with "
        f"`torchkit dataset-stats {root}` (`torchkit split` keeps copies in one split)"
    )
    digits = load_splits(TrainConfig(data="digits"))
    assert cross_split_copies(digits.splits) == (0, 0)  # in memory: nothing to hash


def test_train_cli_prints_the_warning_once(runner, tmp_path, monkeypatch):
    root = tmp_path / "data"
    write_image_folder(root / "train", {"ant": 4, "bee": 4}, seed=1)
    write_image_folder(root / "val", {"ant": 2, "bee": 2}, seed=2)
    (root / "val" / "bee" / "leak.png").write_bytes((root / "train/bee/bee_1.png").read_bytes())
    args = ["--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "4"]
    result = runner.invoke(
        app,
        ["train", "--data", str(root), *args, "--workers", "0", "--epochs", "1"]
        + ["--out", str(tmp_path / "run")],
    )
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "byte-identical" in line]
    assert len(warnings) == 1 and warnings[0].startswith("Warning: 2 images have")
