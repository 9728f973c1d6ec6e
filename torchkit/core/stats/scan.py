"""The pass over the files: each read once, hashed, decoded and its pixels counted, in worker
processes (`core.runtime.pool`)."""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from torchkit.core.data.hashing import PHASH_FLOOR
from torchkit.core.data.image_files import (
    SIXTEEN_BIT_MODES,
    UnsupportedSamples,
    declares_16_bit_samples,
    expanded_mode,
    is_sixteen_bit_colour,
    opened_image,
    pixels_in_mode,
    read_regular_file,
    sixteen_bit_colour,
    unreadable_reason,
)
from torchkit.core.data.sources.samples import Samples
from torchkit.core.io.progress import Progress
from torchkit.core.runtime.cpus import usable_cpus
from torchkit.core.runtime.pool import map_chunks

STATS_MODES = ("rgb", "gray", "native")
SINGLE_CHANNEL_MODES = frozenset({"1", "L", "I", "F"} | SIXTEEN_BIT_MODES)
_MAX_CHUNK = 64


def target_mode(image_mode: str, info: dict, mode: str) -> str:
    """The PIL mode pixels are counted in: what ImageFolder's loader gives (`rgb`), grayscale
    (`gray`), or the file's own channels (`native`; palettes are expanded, bilevel becomes L)."""
    if mode == "rgb":
        return "RGB"
    if mode == "gray":
        return "L"
    return expanded_mode(image_mode, info)


def channel_names(pil_mode: str, bands: Sequence[str]) -> tuple[str, ...]:
    return ("L",) if pil_mode in SINGLE_CHANNEL_MODES else tuple(bands)


def resized_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    """The size `torchvision.transforms.Resize(shorter)` gives (shorter side to `shorter`)."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(shorter * long / short)
    return (shorter, new_long) if width <= height else (new_long, shorter)


class NonFinitePixels(ValueError):
    """A floating-point image with NaN or infinite values (a nodata marker): no mean or std of
    its pixels exists, so it is skipped as unreadable, saying why."""


def _shifted_sums(values) -> tuple[Fraction, Fraction]:
    """(sum of `values`, sum of their squares) of a float64 array, as Fractions. Summed about
    the image's own mean c: sum(x) = n c + sum(d), sum(x^2) = n c^2 + 2 c sum(d) + sum(d^2),
    with d = x - c, whose float rounding is relative to d, not to x. Squaring x itself in float64
    loses the variance of values far from 0 (2e9 +- 1 in a 32-bit TIFF: a std of 10, not 0.8)."""
    import numpy as np

    if not values.size:
        return Fraction(0), Fraction(0)
    finite = np.isfinite(values)
    if not finite.all():
        bad = int(values.size - np.count_nonzero(finite))
        raise NonFinitePixels(
            f"{bad} of its {values.size} pixels are NaN or infinite: it has no mean or std"
        )
    shift = float(values.mean())
    deviations = values - shift
    n = values.size
    # Each float is p / q with q a power of 2: the two sums over one common denominator, in
    # Python ints (a Fraction per term costs a gcd each, 4x the time of the whole rest).
    c, cq = shift.as_integer_ratio()
    f, fq = float(deviations.sum()).as_integer_ratio()
    s, sq = float(np.dot(deviations, deviations)).as_integer_ratio()
    one = max(cq, fq)
    two = max(cq * cq, cq * fq, sq)
    return (
        Fraction(n * c * (one // cq) + f * (one // fq), one),
        Fraction(
            n * c * c * (two // (cq * cq)) + 2 * c * f * (two // (cq * fq)) + s * (two // sq), two
        ),
    )


class Accumulator:
    """Pixel counts per (channel names, full scale): an int64 histogram of shape (C, scale + 1)
    for integer images, or exact rational sums for float images (scale 1). Mergeable."""

    def __init__(self) -> None:
        self.histograms: dict[tuple[tuple[str, ...], int], Any] = {}
        self.float_sums: dict[tuple[str, ...], list] = {}  # names -> [count, sums, squares]
        self.examples: dict[tuple[str, ...], str] = {}  # a file per channel layout, for errors
        # (channel layout, measured in the images' own values) -> a file of that kind (the first
        # by name, whatever order the workers finish in), for errors
        self.unit_examples: dict[tuple[tuple[str, ...], bool], str] = {}

    def add_image(
        self, image, channels: tuple[str, ...], example: str, *, sixteen_bit: bool = False
    ) -> None:
        """Count `image`'s pixels: a PIL image, or a uint16 (H, W, C) array of 16-bit colour
        (`sixteen_bit_colour`). `sixteen_bit`: its file declares unsigned samples of at most
        16 bits (`declares_16_bit_samples`), so an `I` image is counted in [0, 65535]; any other
        `I` image, whatever its values, is 32-bit and summed in its own values."""
        import numpy as np

        self.examples.setdefault(channels, example)
        deep = isinstance(image, np.ndarray) or image.mode in SIXTEEN_BIT_MODES
        if deep or (image.mode == "I" and sixteen_bit):
            values = np.asarray(image).astype(np.uint16, copy=False)
            values = values.reshape(-1, len(channels))
            counts = [np.bincount(values[:, c], minlength=65536) for c in range(len(channels))]
            self._note_units(channels, False, example)
            self._add_histogram(channels, 65535, np.stack(counts))
            return
        if image.mode in ("I", "F"):  # 32-bit values: summed in their own units
            values = np.asarray(image, dtype=np.float64).ravel()
            self._note_units(channels, True, example)
            entry = self.float_sums.setdefault(channels, [0, [Fraction(0)], [Fraction(0)]])
            total, squares = _shifted_sums(values)
            entry[0] += values.size
            entry[1][0] += total
            entry[2][0] += squares
            return
        # 8 bits per channel: PIL counts every band in C, exactly.
        counts = np.array(image.histogram(), dtype=np.int64).reshape(len(channels), 256)
        self._note_units(channels, False, example)
        self._add_histogram(channels, 255, counts)

    def _note_units(self, channels: tuple[str, ...], own: bool, example: str) -> None:
        key = (channels, own)
        self.unit_examples[key] = min(self.unit_examples.get(key, example), example)

    def mixed_units(self) -> tuple[str, str] | None:
        """(a file measured in [0, 1], a file measured in its own values) when the images of
        the single channel layout are of both kinds, whose sums cannot be added up."""
        (channels,) = self.layouts()
        scaled = self.unit_examples.get((channels, False))
        own = self.unit_examples.get((channels, True))
        return None if scaled is None or own is None else (scaled, own)

    def _add_histogram(self, channels: tuple[str, ...], scale: int, counts) -> None:
        key = (channels, scale)
        if key in self.histograms:
            self.histograms[key] += counts
        else:
            self.histograms[key] = counts.astype("int64", copy=True)

    def merge(self, other: Accumulator) -> None:
        for (channels, scale), counts in other.histograms.items():
            self._add_histogram(channels, scale, counts)
        for channels, (count, sums, squares) in other.float_sums.items():
            entry = self.float_sums.setdefault(channels, [0, [Fraction(0)], [Fraction(0)]])
            entry[0] += count
            entry[1] = [a + b for a, b in zip(entry[1], sums, strict=True)]
            entry[2] = [a + b for a, b in zip(entry[2], squares, strict=True)]
        for channels, example in other.examples.items():
            self.examples.setdefault(channels, example)
        for (channels, own), example in other.unit_examples.items():
            self._note_units(channels, own, example)

    def layouts(self) -> list[tuple[str, ...]]:
        seen = {channels for channels, _ in self.histograms} | set(self.float_sums)
        return sorted(seen, key=len)

    def moments(self) -> tuple[tuple[str, ...], list[float], list[float], int]:
        """(channels, mean, std, pixels per channel) in [0, 1] units, exact until the final
        rounding to float. Needs a single channel layout."""
        (channels,) = self.layouts()
        pixels = 0
        sums = [Fraction(0)] * len(channels)
        squares = [Fraction(0)] * len(channels)
        for (names, scale), counts in self.histograms.items():
            if names != channels:
                continue
            pixels += int(counts[0].sum())
            for c in range(len(channels)):
                # Python ints: 16-bit squares times large counts would overflow int64.
                row = [(v, int(n)) for v, n in enumerate(counts[c].tolist()) if n]
                sums[c] += Fraction(sum(n * v for v, n in row), scale)
                squares[c] += Fraction(sum(n * v * v for v, n in row), scale**2)
        if channels in self.float_sums:
            count, float_sums, float_squares = self.float_sums[channels]
            pixels += count
            sums = [s + f for s, f in zip(sums, float_sums, strict=True)]
            squares = [s + f for s, f in zip(squares, float_squares, strict=True)]
        mean = [s / pixels for s in sums]
        variance = [q / pixels - m * m for q, m in zip(squares, mean, strict=True)]
        variance = [max(v, Fraction(0)) for v in variance]  # float-image sums may round below
        return channels, [float(m) for m in mean], [math.sqrt(v) for v in variance], pixels


# One row per readable image (`ChunkResult.records`): compact, so that a million images cost
# the main process tens of MB, not the few hundred bytes a tuple of Python objects takes each.
# `mode` and `format` are codes into the chunk's `names` (a PIL mode or format name each).
RECORD_DTYPE = [
    ("index", "<i8"),
    ("width", "<i4"),
    ("height", "<i4"),
    ("mode", "<u2"),
    ("format", "<u2"),
    ("bytes", "<i8"),
    ("sha256", "V32"),
]
# One row per hashed image (`ChunkResult.hashes`): its index, SHA-256 and 64-bit pHash.
HASH_DTYPE = [("index", "<i8"), ("sha256", "V32"), ("phash", "<u8")]
# One row per file read whose image has no pHash (`ChunkResult.digests`: not decodable, or 32-bit
# samples no fixed scale reads right): its SHA-256 still finds its byte-identical copies.
DIGEST_DTYPE = [("index", "<i8"), ("sha256", "V32")]


def record_array(rows: Sequence[tuple] = ()) -> Any:
    """`rows` (index, width, height, mode code, format code, bytes, sha256) as a RECORD_DTYPE
    array."""
    import numpy as np

    return np.array(list(rows), dtype=RECORD_DTYPE)


def hash_array(rows: Sequence[tuple] = ()) -> Any:
    """`rows` (index, sha256, pHash) as a HASH_DTYPE array."""
    import numpy as np

    return np.array(list(rows), dtype=HASH_DTYPE)


def digest_array(rows: Sequence[tuple] = ()) -> Any:
    """`rows` (index, sha256) as a DIGEST_DTYPE array."""
    import numpy as np

    return np.array(list(rows), dtype=DIGEST_DTYPE)


@dataclass
class ChunkResult:
    records: Any  # RECORD_DTYPE array, one row per readable image
    errors: list[tuple[int, str, int]]  # (index, reason, bytes read or 0)
    accumulator: Accumulator
    # Images of 16 or 32 bits a sample, which --mode rgb/gray measure as the loaders read them:
    # scaled to 8 bits, round(v / 257) (`image_files.to_8bit`), for the warning that says so
    sixteen_bit: int = 0
    # HASH_DTYPE array of every decodable image, with `perceptual` (leakage check)
    hashes: Any = None
    hash_errors: int = 0  # files of other splits (hashed, not measured) that could not be read
    # DIGEST_DTYPE array of the files read that have no pHash, with `perceptual`
    digests: Any = None
    no_phash: int = 0  # files of other splits read, but with no pHash (in `digests`)
    # Images measured (--mode native) whose 32-bit samples no fixed scale reads right: no pHash
    # (`image_files.refuse_unscalable_samples`), so no part in the duplicate search
    unhashed: int = 0
    names: list[str] = field(default_factory=list)  # what the mode and format codes stand for

    def name_codes(self, table: dict[str, int]) -> Any:
        """This chunk's codes translated into `table` (name -> code, grown as needed): an
        array to index with a record's code."""
        import numpy as np

        return np.array([table.setdefault(n, len(table)) for n in self.names], dtype="<u2")


def scan_files(
    start: int,
    paths: Sequence[str],
    ids: Sequence[str],
    mode: str,
    resize: int | None,
    measure: bool = True,
    perceptual: bool = False,
    phash_floor: int = PHASH_FLOOR,
) -> ChunkResult:
    """Read, hash, decode and count the pixels of `paths` (a chunk starting at index `start`).
    `perceptual`: also each image's pHash (`result.hashes`; `phash_floor`: see
    `core.hashing.phash_image`, 0 for imagededup's bits exactly). Without `measure` the files
    are only read and hashed (the other splits' files of the leakage check): nothing is
    counted."""
    from PIL import Image

    from torchkit.core.data.hashing import phash_image

    result = ChunkResult(
        record_array(), [], Accumulator(), hashes=hash_array(), digests=digest_array()
    )
    if not measure:
        _hash_files(start, paths, result, phash_floor)
        return result
    records: list[tuple] = []
    hashes: list[tuple] = []
    digests: list[tuple] = []  # files read without a pHash: their copies are still found
    codes: dict[str, int] = {}
    with warnings.catch_warnings():
        # PIL's warnings (palette transparency, bomb sizes, odd EXIF) would interleave with the
        # progress bar from every worker; the files still count, or are listed as unreadable.
        warnings.simplefilter("ignore")
        for offset, path in enumerate(paths):
            index = start + offset
            try:
                data = read_regular_file(path)  # a FIFO would block forever: refused
            except OSError as error:
                result.errors.append((index, unreadable_reason(error), 0))
                continue
            phash = None
            try:
                with opened_image(data) as image:
                    native_mode, file_format = image.mode, image.format
                    deep_colour = is_sixteen_bit_colour(image)
                    sixteen_bit = declares_16_bit_samples(image)
                    wanted = target_mode(image.mode, image.info, mode)
                    if mode == "native":  # the file's own channels, at their own depth
                        pixels = _native_pixels(image, wanted)
                    else:  # the 8-bit pixels torchkit's loaders feed a model, as stored
                        pixels = pixels_in_mode(image, wanted, exif=False)
                    # The size as read, not as opened: a TIFF comes turned by its Orientation
                    # tag, which Pillow 10 sizes as stored until loaded (--resize then gave
                    # the turned pixels the stored shape).
                    width, height = (
                        pixels.size
                        if isinstance(pixels, Image.Image)
                        else (pixels.shape[1], pixels.shape[0])
                    )
                    if perceptual:  # from this decode: no second one (see core.hashing)
                        try:
                            phash = phash_image(image, floor=phash_floor)
                        except UnsupportedSamples:  # measured (native), but never hashed
                            result.unhashed += 1
                    if resize:
                        pixels = _resized(pixels, resized_size(width, height, resize))
                    channels = (
                        channel_names(pixels.mode, pixels.getbands())
                        if isinstance(pixels, Image.Image)
                        else image.getbands()  # 16-bit colour, as an array: R, G, B(, A)
                    )
                    result.accumulator.add_image(
                        pixels, channels, ids[offset], sixteen_bit=sixteen_bit
                    )
            except Exception as error:  # noqa: BLE001 - any decoder failure means unreadable
                result.errors.append((index, unreadable_reason(error, len(data)), len(data)))
                if perceptual:
                    digests.append((index, hashlib.sha256(data).digest()))
                continue
            deep = native_mode in SIXTEEN_BIT_MODES or native_mode == "I" or deep_colour
            if deep and mode != "native":
                result.sixteen_bit += 1
            digest = hashlib.sha256(data).digest()
            listed = listed_mode(native_mode, deep_colour=deep_colour, sixteen_bit=sixteen_bit)
            mode_code = codes.setdefault(listed, len(codes))
            format_code = codes.setdefault(file_format or "?", len(codes))
            records.append((index, width, height, mode_code, format_code, len(data), digest))
            if phash is not None:
                hashes.append((index, digest, phash))
            elif perceptual:
                digests.append((index, digest))
    result.records, result.hashes, result.digests, result.names = (
        record_array(records),
        hash_array(hashes),
        digest_array(digests),
        list(codes),
    )
    return result


def listed_mode(pil_mode: str, *, deep_colour: bool, sixteen_bit: bool) -> str:
    """The colour mode an image is listed under: PIL's, with 16-bit samples said as such
    whatever PIL opens them as: `I;16` for grayscale (PIL's `I;16`, `I;16B`..., or `I` for a
    16-bit PNG or PGM in some Pillow versions), `RGB;16` and `RGBA;16` for colour (which PIL
    opens as `RGB` and `RGBA`: `image_files.is_sixteen_bit_colour`)."""
    if deep_colour:
        return f"{pil_mode};16"
    if pil_mode in SIXTEEN_BIT_MODES or (pil_mode == "I" and sixteen_bit):
        return "I;16"
    return pil_mode


def _native_pixels(image: Any, wanted: str) -> Any:
    """The pixels of an opened image in the file's own channels (`wanted`) at its own depth:
    a loaded PIL image, or the uint16 array of 16-bit colour, which PIL reads as 8 bits."""
    deep = sixteen_bit_colour(image)
    if deep is not None:
        return deep
    pixels = image if image.mode == wanted else image.convert(wanted)
    pixels.load()
    return pixels


def _resized(pixels: Any, size: tuple[int, int]) -> Any:
    """`pixels` (PIL, or a uint16 (H, W, C) array) resized bilinearly to `size` (w, h): an
    array channel by channel, each as the 16-bit grayscale image it is. 16-bit samples are
    resized as 32-bit `I` (the same values as `I;16`'s resize where Pillow has one): Pillow 10
    cannot resize any 16-bit mode, and later ones resize `I;16B` (big-endian TIFFs) as if its
    bytes were swapped. The result is counted as the 16-bit values it holds."""
    from PIL import Image

    if not isinstance(pixels, Image.Image):
        import numpy as np

        planes = [Image.fromarray(pixels[..., c]).convert("I") for c in range(pixels.shape[-1])]
        planes = [plane.resize(size, Image.Resampling.BILINEAR) for plane in planes]
        return np.stack([np.asarray(plane) for plane in planes], axis=-1).astype(np.uint16)
    if pixels.mode in SIXTEEN_BIT_MODES:
        pixels = pixels.convert("I")
    return pixels.resize(size, Image.Resampling.BILINEAR)


def _hash_files(start: int, paths: Sequence[str], result: ChunkResult, floor: int) -> None:
    """SHA-256 and pHash of each file (`core.hashing.hash_file`); unreadable ones are counted,
    and those read but without a pHash keep their SHA-256 (`result.digests`)."""
    from torchkit.core.data.hashing import hash_file

    hashes: list[tuple] = []
    digests: list[tuple] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for offset, path in enumerate(paths):
            try:
                digest, phash = hash_file(path, floor=floor)
            except OSError:
                result.hash_errors += 1
                continue
            if phash is None:  # not an image torchkit decodes: only its exact copies are found
                result.no_phash += 1
                digests.append((start + offset, digest))
                continue
            hashes.append((start + offset, digest, phash))
    result.hashes, result.digests = hash_array(hashes), digest_array(digests)


def hash_pass(
    paths: Sequence[str],
    *,
    workers: int | None = None,
    progress: Progress | None = None,
    phash_floor: int = PHASH_FLOOR,
) -> list[tuple[bytes, int] | None]:
    """(SHA-256, pHash) of every file, or None for one that cannot be read or decoded: the
    pass the leakage check makes over the files it does not measure, in worker processes
    (`phash_floor`: see `core.hashing.phash_image`)."""
    workers = default_stats_workers() if workers is None else workers
    n = len(paths)
    size = max(1, min(_MAX_CHUNK, math.ceil(n / max(1, workers * 4))))
    chunks = [(start, paths[start : start + size]) for start in range(0, n, size)]
    tasks = [(start, p, p, "rgb", None, False, True, phash_floor) for start, p in chunks]
    found: list[tuple[bytes, int] | None] = [None] * n
    done = 0

    def take(result: ChunkResult) -> None:
        nonlocal done
        for index, digest, phash in result.hashes.tolist():
            found[index] = (digest, phash)
        done += len(result.hashes) + result.hash_errors + result.no_phash
        if progress:
            progress(done, n)

    run_chunks(tasks, workers, take)
    return found


def _scan_task(task: tuple) -> ChunkResult:
    return scan_files(*task)


def default_stats_workers() -> int:
    return usable_cpus()


def scan_tasks(
    samples: Samples,
    workers: int,
    mode: str,
    resize: int | None,
    *,
    offset: int = 0,
    measure: bool = True,
    perceptual: bool = False,
    phash_floor: int = PHASH_FLOOR,
    total: int | None = None,
) -> list[tuple]:
    """`scan_files` tasks for `samples`, whose indices start at `offset`; chunks are sized for
    `total` files in all (all the tasks of the pass)."""
    n = len(samples)
    size = max(1, min(_MAX_CHUNK, math.ceil((total or n) / max(1, workers * 4))))
    paths, ids = samples.paths, samples.ids
    return [
        (
            offset + start,
            paths[start : start + size],
            ids[start : start + size],
            mode,
            resize,
            measure,
            perceptual,
            phash_floor,
        )
        for start in range(0, n, size)
    ]


def run_chunks(tasks: list[tuple], workers: int, on_result: Callable[[ChunkResult], None]) -> None:
    """`scan_files` for every task, in-process for one worker, else in worker processes; each
    result handed to `on_result` as it comes (an exception there stops the workers)."""
    map_chunks(_scan_task, tasks, workers=workers, on_result=on_result, preload=_preload)


def _preload() -> None:
    """Imported once in the parent, which the workers fork from, not once per worker (about half
    a CPU-second each)."""
    import numpy  # noqa: F401
    from PIL import Image

    Image.init()  # every format plugin
