"""Content hashes of image files: exact (the bytes) and perceptual (what the image looks like).

- `file_digest(path)`: SHA-256 of the bytes. Byte-identical files have the same digest.
- `content_groups(paths)`: the groups of byte-identical files among `paths`, cheaply: files are
  first grouped by size (one `stat` each), then by a hash of their first 64 KiB, and only files
  that still collide are hashed whole. Compressed images rarely share a size, so a folder of
  JPEGs or PNGs is mostly stat-ed, not read.
- `phash_bytes(data)` / `phash_image(image)`: a 64-bit perceptual hash (pHash), as imagededup's
  PHash defines it: the image in grayscale, resized to 32x32, its 2-D DCT-II, the top-left 8x8
  coefficients, each bit set when a coefficient is >= the median of the 63 that are not the DC
  term (bits in row-major order, the first the most significant). The resize is a box filter,
  the mean of each of the 32x32 cells: images over 255 pixels a side are first box-reduced by
  an integer factor to 128 to 255 pixels (exact means, cheap), then PIL's box filter averages
  the pixels whose centres fall in each cell (cheaper than the Hamming or Lanczos filters, and
  as robust on the benchmark). An image made of equal blocks gives back its 32x32 pattern, and
  a 32x32 image is not resized, so its hash is exactly imagededup's. A JPEG is
  decoded straight to grayscale at 1/2, 1/4 or 1/8 of its size (PIL's `draft()`, the DCT
  scaling of libjpeg) but no smaller than 128 pixels a side. A PNG has no reduced decode (zlib,
  then row filters that each depend on the row above): its whole decode is most of the cost of
  its hash (OpenCV's libpng decodes it about 10% faster than PIL, which the extra copy to
  PIL's gray conversion takes back: not used). Re-encoded or resized copies of an image land a
  few bits apart (the threshold: see `core.neardup`), unrelated images about 32. `phash_image`
  of an image decoded whole (what dataset-stats decodes anyway) agrees with the reduced decode
  of a JPEG to within a few bits (identical for most images).

Images are read as every loader reads them (`core.image_files`: regular files only, 16-bit
images scaled to 8 bits, 32-bit ones that no fixed scale reads right refused with
`UnsupportedSamples`, the pixels as stored: the EXIF orientation is not applied, so a photo
and its rotated-by-tag copy hash as the pictures a model is fed). Nothing here prints or
imports anything heavy at import time.
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

HASH_BITS = 64
_SIDE = 32  # the image is resized to _SIDE x _SIDE before the DCT
_KEEP = 8  # the top-left _KEEP x _KEEP DCT coefficients make the hash
_DRAFT = 4 * _SIDE  # a JPEG is decoded at the smallest DCT scale at least this big
_REDUCED = 4 * _SIDE  # larger images are box-reduced by an integer factor to at least this
_PREFIX = 64 * 1024  # bytes hashed first, before whole files
_BLOCK = 1 << 20
# DCT coefficients of 8-bit pixels below this are rounding noise (float64 error ~1e-11 on
# sums of 1,024 products of pixels and cosines)
_NOISE = 1e-6

_dct_matrix: Any = None


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
    sorted, groups by their first index). Files that cannot be read belong to no group. The
    same file listed twice (or two links to it) is a group too."""
    names = [os.fspath(p) for p in paths]
    by_size: dict[int, list[int]] = {}
    for index, path in enumerate(names):
        try:
            info = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            by_size.setdefault(info.st_size, []).append(index)
    # Sizes up to the prefix length are settled by the prefix hash itself.
    small = [g for size, g in by_size.items() if len(g) > 1 and size <= _PREFIX]
    large = [g for size, g in by_size.items() if len(g) > 1 and size > _PREFIX]
    settled = _refine(small, names, _prefix_digest)
    settled += _refine(_refine(large, names, _prefix_digest), names, file_digest)
    return sorted(sorted(group) for group in settled)


# --------------------------------------------------------------------------- perceptual hash


def _dct() -> Any:
    """The first _KEEP rows of the unnormalised DCT-II matrix of size _SIDE (what
    `scipy.fft.dct(x)` computes, up to a factor 2 that no bit depends on)."""
    global _dct_matrix
    if _dct_matrix is None:
        import numpy as np

        k = np.arange(_KEEP)[:, None]
        n = np.arange(_SIDE)[None, :]
        _dct_matrix = np.cos(np.pi * k * (2 * n + 1) / (2 * _SIDE))
    return _dct_matrix


def _gray(image: Any) -> Any:
    """`image` as 8-bit grayscale: 16-bit scaled first, palette and alpha images through RGB
    (alpha dropped, as imagededup does). A 32-bit image no fixed scale reads right raises
    `UnsupportedSamples`, as every loader does (PIL would clip it: float images of 0..1, all
    but black, would hash alike)."""
    refuse_unscalable_samples(image)
    image = to_8bit(image)
    if image.mode == "L":
        return image
    # RGBA straight to L: the same pixels as through RGB (PIL's L ignores alpha), a copy less.
    if image.mode not in ("RGB", "RGBA", "1", "I", "F"):
        image = image.convert("RGB")
    return image.convert("L")


def _cell_means(image: Any) -> Any:
    """`image` as the _SIDE x _SIDE gray image the hash is made of: the mean of each cell."""
    from PIL import Image

    gray = _gray(image)
    factor = min(gray.size) // _REDUCED
    if factor >= 2:  # an integer box reduction first: exact means, and cheap
        gray = gray.reduce(factor)
    if gray.size != (_SIDE, _SIDE):  # the mean of the pixels whose centres fall in each cell
        gray = gray.resize((_SIDE, _SIDE), Image.Resampling.BOX)
    return gray


def phash_image(image: Any) -> int:
    """The 64-bit pHash of a PIL image (see the module docstring)."""
    import numpy as np

    pixels = np.asarray(_cell_means(image), dtype=np.float64)
    matrix = _dct()
    coefficients = (matrix @ pixels @ matrix.T).ravel()
    # Coefficients that are 0 in exact arithmetic (of an image flat along one axis or mirror
    # symmetric: blank images, gradients, stripes, a centred shape on a plain background) come
    # out as float noise of either sign, ~1e-11; where they are the median, their bits would
    # be set by that noise (a half-size copy of stripes landed 12 bits away). Snapped
    # to 0 they are >= a median of 0, as in imagededup; no other bit changes, since a median
    # that is not 0 lies at least _NOISE from every snapped coefficient.
    coefficients[np.abs(coefficients) < _NOISE] = 0.0
    bits = coefficients >= np.median(coefficients[1:])
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def _reduced_phash(image: Any) -> int:
    """`phash_image` of an opened image, from a reduced decode where the format allows it."""
    if image.format == "JPEG":
        image.draft("L", (_DRAFT, _DRAFT))
    return phash_image(image)


def phash_bytes(data: bytes) -> int:
    """The 64-bit pHash of an image file's contents, from a reduced decode where the format
    allows it (JPEG). Raises `core.image_files.unreadable_image_errors()` for data that is not
    a readable image."""
    with opened_image(data) as image:
        return _reduced_phash(image)


def phash_file(path: str | os.PathLike) -> int:
    """`phash_bytes` of the file at `path` (regular files only; errors name the path)."""
    with opened_image(path, in_memory=True) as image:
        return _reduced_phash(image)


def hash_file(path: str | os.PathLike, *, perceptual: bool = True) -> tuple[bytes, int | None]:
    """(SHA-256 of the bytes, pHash or None) of one file, reading it once. The pHash is None
    when `perceptual` is off or the bytes are not an image PIL can decode; OSError when the
    file cannot be read at all."""
    data = read_regular_file(path)
    digest = hashlib.sha256(data).digest()
    if not perceptual:
        return digest, None
    try:
        return digest, phash_bytes(data)
    except Exception:  # noqa: BLE001 - any decoder failure: no perceptual hash
        return digest, None


def hex_hash(value: int) -> str:
    """A 64-bit hash as 16 hexadecimal digits (imagededup's spelling)."""
    return f"{value:016x}"
