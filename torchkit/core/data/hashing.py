"""Content hashes of image files: exact (the bytes) and perceptual (what the image looks like).

- `file_digest(path)`: SHA-256 of the bytes. Byte-identical files have the same digest.
- `content_groups(paths)`: the groups of byte-identical files among `paths`, cheaply: files are
  first grouped by size (one `stat` each), then by a hash of their first 64 KiB, and only files
  that still collide are hashed whole. Compressed images rarely share a size, so a folder of
  JPEGs or PNGs is mostly stat-ed, not read.
- `phash_bytes(data)` / `phash_image(image)`: a 64-bit perceptual hash (pHash) of
  imagededup's PHash (0.3.x) kind: the image in RGB (any other mode through RGBA, alpha
  dropped), resized to 32x32 by PIL's Lanczos filter, then converted to gray (PIL's L), its 2-D
  DCT-II (scipy's, as imagededup computes it, so that coefficients equal in exact arithmetic
  compare as they do there), the top-left 8x8 coefficients, each bit set when a coefficient is
  >= the median of the 63 that are not the DC term (bits in row-major order, the first the
  most significant). A gray image is resized as it is, a third of the work and the same bits.
- `floor` (PHASH_FLOOR, 256 px, by default): a large image is first brought down to `floor` to
  2 x `floor` - 1 px a side, a JPEG not yet decoded by a reduced decode (PIL's `draft()`: 1/2,
  1/4 or 1/8 scale, the largest that keeps both sides >= `floor`), then any image by an
  integer `reduce()` per axis, and the Lanczos resize starts from there, with the box that
  keeps the image's geometry (PIL's `reducing_gap`: a side the factor does not divide ends in
  a partial pixel). An image under 2 x `floor` px on both sides is resized whole: its hash is
  imagededup's bit for bit. On a large one the reduced pixels differ a little, and a
  coefficient next to the median can cross it: on photo-like JPEGs of 128x96 to 4000x3000
  (benchmarks/bench_near_duplicates.py, part 5) 9-11% of the hashes differ from imagededup's
  at floor 256, each by 2 bits (every planted copy of part 1 still found at the default
  threshold), for 7.6x the speed on the other splits' files (whose decode is the hash's cost)
  and 2.2x on the measured split's. `floor=0` decodes and resizes every image whole:
  imagededup's bits exactly (dataset-stats --exact-phash). Re-encoded or resized copies of an
  image land a few bits apart (the threshold: see `core.neardup`), unrelated images about 32.

Images are read as every loader reads them (`core.image_files`: regular files only, 16-bit
images scaled to 8 bits, 32-bit ones that no fixed scale reads right refused with
`UnsupportedSamples`, the pixels as stored: the EXIF orientation is not applied, as
imagededup does not apply it either, so a photo and its rotated-by-tag copy hash as the
pictures a model is fed). The other difference from imagededup, at any floor: images of
more than 8 bits a sample, which PIL's conversion clips (a 16-bit gray PNG hashes as blank
white there) or cuts to its high byte (16-bit colour), are scaled, round(v / 257). Nothing
here prints or imports anything heavy at import time.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Sequence
from typing import Any

from torchkit.core.data.image_files import (
    open_regular_file,
    opened_image,
    read_regular_file,
    refuse_unscalable_samples,
    to_8bit,
)

_SIDE = 32  # the image is resized to _SIDE x _SIDE before the DCT
_KEEP = 8  # the top-left _KEEP x _KEEP DCT coefficients make the hash
# Large images are brought down to PHASH_FLOOR..2*PHASH_FLOOR-1 px a side before the resize
# (0: never): 7.6x the speed of the whole decode on large JPEGs, 1 hash in 10 2 bits off.
PHASH_FLOOR = 256
_PREFIX = 64 * 1024  # bytes hashed first, before whole files
_BLOCK = 1 << 20


def file_digest(path: str | os.PathLike) -> bytes:
    """SHA-256 of the file's bytes (regular files only: a FIFO raises NotARegularFile)."""
    digest = hashlib.sha256()
    with open_regular_file(path) as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest.digest()


def _prefix_digest(path: str) -> bytes:
    with open_regular_file(path) as handle:
        return hashlib.sha256(handle.read(_PREFIX)).digest()


def _refine(
    groups: list[list[int]], paths: Sequence[str], key: Callable[[str], bytes]
) -> list[list[int]]:
    """Split each group by `key(path)`; groups of one and unreadable files drop out."""
    refined: list[list[int]] = []
    for group in groups:
        by_key: dict[bytes, list[int]] = {}
        for index in group:
            try:
                value = key(paths[index])
            except OSError:  # unreadable, vanished, not a regular file: no copy of anything
                continue
            by_key.setdefault(value, []).append(index)
        refined += [members for members in by_key.values() if len(members) > 1]
    return refined


def content_groups(paths: Sequence[str | os.PathLike]) -> list[list[int]]:
    """Indices of byte-identical files among `paths`, in groups of two or more (each group
    sorted, groups by their first index). Files that cannot be read belong to no group, and
    neither do empty files: no image, no copy of one (an interrupted download leaves many, which
    as one group went to one split whole, whatever their classes). The same file listed twice
    (or two links to it) is a group too."""
    names = [os.fspath(p) for p in paths]
    by_size: dict[int, list[int]] = {}
    for index, path in enumerate(names):
        try:
            info = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_size:
            by_size.setdefault(info.st_size, []).append(index)
    # Sizes up to the prefix length are settled by the prefix hash itself.
    small = [g for size, g in by_size.items() if len(g) > 1 and size <= _PREFIX]
    large = [g for size, g in by_size.items() if len(g) > 1 and size > _PREFIX]
    settled = _refine(small, names, _prefix_digest)
    settled += _refine(_refine(large, names, _prefix_digest), names, file_digest)
    return sorted(sorted(group) for group in settled)


def named_classes(classes: Sequence[str]) -> list[str]:
    """`classes` (of a group of byte-identical files) without "": an unlabelled copy (a sample
    without a label) is of no class, so a labelled image and its unlabelled copy are no label
    conflict."""
    return [name for name in classes if name]


def is_label_conflict(classes: Sequence[str]) -> bool:
    """Whether a group of byte-identical files whose distinct classes are `classes` is filed
    under more than one class (the same image labelled twice): split's and dataset-stats' rule."""
    return len(named_classes(classes)) > 1


def label_conflicts_said(groups: Sequence[tuple[Sequence[str], Sequence[str]]]) -> str:
    """How split and dataset-stats name the groups of byte-identical files filed under more
    than one class (the same image labelled twice, common in scraped data): `groups`, each
    (its paths, its classes), the first three shown by their first two paths and first three
    classes, so that the line stays one line (a placeholder image in 1,000 classes). An
    unlabelled copy ("") is no class: not named."""

    def group(paths: Sequence[str], classes: Sequence[str]) -> str:
        more = f" and {len(paths) - 2} more" if len(paths) > 2 else ""
        named = named_classes(classes)
        others = f" and {len(named) - 3} more classes" if len(named) > 3 else ""
        return f"{' = '.join(paths[:2])}{more} ({', '.join(named[:3])}{others})"

    shown = "; ".join(group(paths, classes) for paths, classes in groups[:3])
    more = f"; and {len(groups) - 3} more group(s)" if len(groups) > 3 else ""
    return (
        f"{len(groups)} group(s) of byte-identical files are filed under more than one class "
        f"(a label conflict): {shown}{more}"
    )


# --------------------------------------------------------------------------- perceptual hash


def _hashed_pixels(image: Any, floor: int) -> Any:
    """`image` as the 32x32 8-bit gray image imagededup's PHash takes the DCT of: the 8-bit
    pixels every loader reads (16-bit scaled first, where imagededup's PIL conversion clips
    them; a 32-bit image no fixed scale reads right raises `UnsupportedSamples`), any mode but
    RGB through RGBA to RGB (alpha dropped, not composited), brought down to `floor` px a side
    (see the module docstring; 0: the whole image), resized to 32x32 by PIL's Lanczos filter,
    then converted to L. A gray image is resized as it is: its RGB copy has three equal
    channels, resized alike, whose L is the same value again."""
    from PIL import Image

    box = None  # the part of a reduced decode that is the image (its last pixel may overhang)
    if floor:
        # A JPEG not yet decoded is decoded at a reduced scale (a no-op on any other image,
        # and on one already loaded: dataset-stats' measured split, decoded whole).
        drafted = image.draft(None, (floor, floor))
        box = None if drafted is None else drafted[1]
    refuse_unscalable_samples(image)
    image = to_8bit(image)
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGBA").convert("RGB")  # before any reduce: not of indices
    # `reducing_gap`: PIL first reduce()s by (side // floor) per axis, and resizes from the
    # reduced pixels with a box that keeps the image's geometry (a side the factor does not
    # divide ends in a partial pixel: resized as a whole one, a symmetric scan shifted by a
    # fraction of a pixel lay 36 bits from its exact hash).
    gap = floor / _SIDE if floor else None
    resized = image.resize((_SIDE, _SIDE), Image.Resampling.LANCZOS, box=box, reducing_gap=gap)
    return resized.convert("L")


def phash_image(image: Any, *, floor: int = PHASH_FLOOR) -> int:
    """The 64-bit pHash of a PIL image (see the module docstring); `floor=0`: imagededup's
    bits exactly, from the whole image. A JPEG not yet loaded is decoded at a reduced scale."""
    import numpy as np
    from scipy.fftpack import dct  # imagededup's DCT: the same float rounding, the same ties

    pixels = np.asarray(_hashed_pixels(image, floor))
    coefficients = dct(dct(pixels, axis=0), axis=1)[:_KEEP, :_KEEP].ravel()
    bits = coefficients >= np.median(coefficients[1:])
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def phash_bytes(data: bytes, *, floor: int = PHASH_FLOOR) -> int:
    """The 64-bit pHash of an image file's contents (`floor`: see `phash_image`). Raises
    `core.image_files.unreadable_image_errors()` for data that is not a readable image."""
    with opened_image(data) as image:
        return phash_image(image, floor=floor)


def phash_file(path: str | os.PathLike, *, floor: int = PHASH_FLOOR) -> int:
    """`phash_bytes` of the file at `path` (regular files only; errors name the path)."""
    with opened_image(path, in_memory=True) as image:
        return phash_image(image, floor=floor)


def hash_file(
    path: str | os.PathLike, *, perceptual: bool = True, floor: int = PHASH_FLOOR
) -> tuple[bytes, int | None]:
    """(SHA-256 of the bytes, pHash or None) of one file, reading it once (`floor`: see
    `phash_image`). The pHash is None when `perceptual` is off or the bytes are not an image
    PIL can decode; OSError when the file cannot be read at all."""
    data = read_regular_file(path)
    digest = hashlib.sha256(data).digest()
    if not perceptual:
        return digest, None
    try:
        return digest, phash_bytes(data, floor=floor)
    except Exception:  # noqa: BLE001 - any decoder failure: no perceptual hash
        return digest, None
