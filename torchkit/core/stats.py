"""`dataset-stats`: exact per-channel mean/std and a health report of an image dataset.

One pass over the files, in worker processes. Each worker reads a file once: the bytes are hashed
(exact duplicates) and decoded from memory, as every loader decodes them (`core.image_files`:
16-bit scaled to 8 bits for rgb/gray, the pixels as stored). Pixels are not summed as floats but
counted into per-channel histograms (PIL's C `histogram()` for 8-bit images, `np.bincount` for
16-bit ones). Histograms add up exactly in any order, so the result does not depend on how the
work was split, and the mean and variance come out of exact integer (rational) arithmetic:
weighted by pixel, not the average of per-image means that the classic `compute_mean_and_std`
recipe returns.

Leakage between splits (issue #20). Of split data (a split root, a CSV with a split column) the
statistics are of one split (train by default), but the files of the other splits are read in
the same pass too, hashed and not measured: each file's SHA-256 (exact copies) and 64-bit pHash
(`core.hashing`: from a reduced decode, or for a measured file from the decode its statistics
need) go to `core.neardup.find_pairs`, which lists the exact
and near duplicates whose members lie in different splits (and, with `near_duplicates`, those
within one split). `leakage=False` skips that (and the other splits' files).
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import os
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from torchkit.core.data.image_files import (
    SIXTEEN_BIT_MODES,
    NotARegularFile,
    expanded_mode,
    opened_image,
    pixels_in_mode,
    read_regular_file,
)
from torchkit.core.data.neardup import DEFAULT_NEAR_THRESHOLD, MAX_THRESHOLD, DuplicatePair
from torchkit.core.data.sources.digits import DIGITS
from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.data.sources.samples import Samples
from torchkit.core.io.errors import InputError, UsageError, first_line
from torchkit.core.io.files import atomic_write_bytes, atomic_write_text
from torchkit.core.io.outputs import (
    InputPath,
    check_distinct_outputs,
    check_output_file,
    is_special_file,
)
from torchkit.core.io.progress import Progress

log = logging.getLogger("torchkit")

STATS_MODES = ("rgb", "gray", "native")
SINGLE_CHANNEL_MODES = frozenset({"1", "L", "I", "F"} | SIXTEEN_BIT_MODES)
_MAX_CHUNK = 64


@dataclass
class SizeRange:
    min: int
    median: float
    max: int


@dataclass
class ClassCount:
    name: str
    images: int


@dataclass
class Unreadable:
    path: str
    error: str


@dataclass
class DuplicateGroup:
    """Files with byte-for-byte identical contents (`paths`), and the classes they are in."""

    paths: list[str]
    classes: list[str]


@dataclass
class DatasetStats:
    source: str
    split: str | None  # the split measured (train, val, test, all) of split data; None otherwise
    mode: str
    resize: int | None
    channels: list[str]
    mean: list[float]
    std: list[float]
    pixels: int  # per channel, over all readable images
    files: int  # image files found
    images: int  # of which readable
    classes: list[ClassCount]
    imbalance_ratio: float | None  # largest class / smallest class (inf if one is empty)
    width: SizeRange | None
    height: SizeRange | None
    modes: dict[str, int]
    formats: dict[str, int]
    total_bytes: int
    unreadable: list[Unreadable]
    duplicates: list[DuplicateGroup]
    non_image_files: list[str]
    # One (width, height, label) per readable image, for the plot; not part of to_dict().
    sizes: list[tuple[int, int, int]] = field(default_factory=list, repr=False)
    # Remarks for the user (which split was measured and why); not part of to_dict().
    notes: list[str] = field(default_factory=list, repr=False)
    # Leakage (split data): exact and near duplicates whose members lie in different splits,
    # found among the files of every split; near duplicates within one split on request.
    leakage_checked: bool = False
    near_threshold: int | None = None
    leakage: list[DuplicatePair] = field(default_factory=list)
    near_duplicates: list[DuplicatePair] = field(default_factory=list)
    within_checked: bool = False  # near duplicates within a split were looked for
    hashed_files: int = 0  # files of every split that took part in the duplicate search

    def leakage_counts(self) -> dict[str, int]:
        return {kind: sum(1 for p in self.leakage if p.kind == kind) for kind in ("exact", "near")}

    @property
    def duplicate_files(self) -> int:
        """Files that are a copy of another one (each group counts all but its first file)."""
        return sum(len(group.paths) - 1 for group in self.duplicates)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "split": self.split,
            "mode": self.mode,
            "resize": self.resize,
            "channels": self.channels,
            "mean": self.mean,
            "std": self.std,
            "pixels": self.pixels,
            "files": self.files,
            "images": self.images,
            "unreadable_count": len(self.unreadable),
            "duplicate_files": self.duplicate_files,
            "non_image_files": len(self.non_image_files),
            "num_classes": len(self.classes),
            "classes": [{"name": c.name, "images": c.images} for c in self.classes],
            "imbalance_ratio": self.imbalance_ratio,
            "width": None if self.width is None else vars(self.width).copy(),
            "height": None if self.height is None else vars(self.height).copy(),
            "modes": self.modes,
            "formats": self.formats,
            "total_bytes": self.total_bytes,
            "unreadable": [{"path": u.path, "error": u.error} for u in self.unreadable],
            "duplicates": [{"paths": d.paths, "classes": d.classes} for d in self.duplicates],
            "leakage_checked": self.leakage_checked,
            "near_threshold": self.near_threshold,
            "leakage_exact": self.leakage_counts()["exact"],
            "leakage_near": self.leakage_counts()["near"],
            "leakage": [p.to_dict() for p in self.leakage],
            "near_duplicates": [p.to_dict() for p in self.near_duplicates],
        }


# --------------------------------------------------------------------------- per-image work


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


class _Accumulator:
    """Pixel counts per (channel names, full scale): an int64 histogram of shape (C, scale + 1)
    for integer images, or exact rational sums for float images (scale 1). Mergeable."""

    def __init__(self) -> None:
        self.histograms: dict[tuple[tuple[str, ...], int], Any] = {}
        self.float_sums: dict[tuple[str, ...], list] = {}  # names -> [count, sums, squares]
        self.examples: dict[tuple[str, ...], str] = {}  # a file per channel layout, for errors

    def add_image(self, image, channels: tuple[str, ...], example: str) -> None:
        import numpy as np

        self.examples.setdefault(channels, example)
        if image.mode in SIXTEEN_BIT_MODES or image.mode == "I":
            values = np.asarray(image)
            if image.mode in SIXTEEN_BIT_MODES or (values.min() >= 0 and values.max() <= 65535):
                counts = np.bincount(values.astype(np.uint16, copy=False).ravel(), minlength=65536)
                self._add_histogram(channels, 65535, counts.reshape(1, -1))
                return
        if image.mode in ("I", "F"):  # 32-bit values: summed in their own units
            values = np.asarray(image, dtype=np.float64).ravel()
            entry = self.float_sums.setdefault(channels, [0, [Fraction(0)], [Fraction(0)]])
            entry[0] += values.size
            entry[1][0] += Fraction(float(values.sum()))
            entry[2][0] += Fraction(float(np.dot(values, values)))
            return
        # 8 bits per channel: PIL counts every band in C, exactly.
        counts = np.array(image.histogram(), dtype=np.int64).reshape(len(channels), 256)
        self._add_histogram(channels, 255, counts)

    def _add_histogram(self, channels: tuple[str, ...], scale: int, counts) -> None:
        key = (channels, scale)
        if key in self.histograms:
            self.histograms[key] += counts
        else:
            self.histograms[key] = counts.astype("int64", copy=True)

    def merge(self, other: _Accumulator) -> None:
        for (channels, scale), counts in other.histograms.items():
            self._add_histogram(channels, scale, counts)
        for channels, (count, sums, squares) in other.float_sums.items():
            entry = self.float_sums.setdefault(channels, [0, [Fraction(0)], [Fraction(0)]])
            entry[0] += count
            entry[1] = [a + b for a, b in zip(entry[1], sums, strict=True)]
            entry[2] = [a + b for a, b in zip(entry[2], squares, strict=True)]
        for channels, example in other.examples.items():
            self.examples.setdefault(channels, example)

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


@dataclass
class _ChunkResult:
    records: list[tuple]  # (index, width, height, mode, format, bytes, sha256)
    errors: list[tuple[int, str, int]]  # (index, reason, bytes read or 0)
    accumulator: _Accumulator
    sixteen_bit: int = 0  # 16-bit images that --mode rgb/gray clip to 8 bits, as PIL does
    # (index, sha256, pHash) of every decodable image, with `perceptual` (leakage check)
    hashes: list[tuple[int, bytes, int]] = field(default_factory=list)
    hash_errors: int = 0  # files of other splits (hashed, not measured) that could not be read


def _describe(error: BaseException, size: int | None = None) -> str:
    from PIL import UnidentifiedImageError

    if isinstance(error, NotARegularFile):
        return str(error)
    if isinstance(error, FileNotFoundError):
        return "file not found"
    if isinstance(error, PermissionError):
        return "permission denied"
    if isinstance(error, UnidentifiedImageError):  # its message names a BytesIO object
        return "empty file" if size == 0 else "not an image PIL can read"
    return first_line(error, with_type=True)


def scan_files(
    start: int,
    paths: Sequence[str],
    ids: Sequence[str],
    mode: str,
    resize: int | None,
    measure: bool = True,
    perceptual: bool = False,
) -> _ChunkResult:
    """Read, hash, decode and count the pixels of `paths` (a chunk starting at index `start`).
    `perceptual`: also each image's pHash (`result.hashes`). Without `measure` the files are
    only read and hashed (the other splits' files of the leakage check): nothing is counted."""
    from PIL import Image

    from torchkit.core.data.hashing import phash_image

    result = _ChunkResult([], [], _Accumulator())
    if not measure:
        _hash_files(start, paths, result)
        return result
    with warnings.catch_warnings():
        # PIL's warnings (palette transparency, bomb sizes, odd EXIF) would interleave with the
        # progress bar from every worker; the files still count, or are listed as unreadable.
        warnings.simplefilter("ignore")
        for offset, path in enumerate(paths):
            index = start + offset
            try:
                data = read_regular_file(path)  # a FIFO would block forever: refused
            except OSError as error:
                result.errors.append((index, _describe(error), 0))
                continue
            phash = None
            try:
                with opened_image(data) as image:
                    native_mode, file_format, (width, height) = image.mode, image.format, image.size
                    wanted = target_mode(image.mode, image.info, mode)
                    if mode == "native":  # the file's own channels, at their own depth
                        pixels = image if image.mode == wanted else image.convert(wanted)
                        pixels.load()
                    else:  # the 8-bit pixels torchkit's loaders feed a model, as stored
                        pixels = pixels_in_mode(image, wanted, exif=False)
                    if perceptual:  # from this decode: no second one (see core.hashing)
                        phash = phash_image(image)
                    if resize:
                        size = resized_size(width, height, resize)
                        pixels = pixels.resize(size, Image.Resampling.BILINEAR)
                    channels = channel_names(pixels.mode, pixels.getbands())
                    result.accumulator.add_image(pixels, channels, ids[offset])
            except Exception as error:  # noqa: BLE001 - any decoder failure means unreadable
                result.errors.append((index, _describe(error, len(data)), len(data)))
                continue
            if (native_mode in SIXTEEN_BIT_MODES or native_mode == "I") and mode != "native":
                result.sixteen_bit += 1
            digest = hashlib.sha256(data).digest()
            result.records.append(
                (index, width, height, native_mode, file_format or "?", len(data), digest)
            )
            if phash is not None:
                result.hashes.append((index, digest, phash))
    return result


def _hash_files(start: int, paths: Sequence[str], result: _ChunkResult) -> None:
    """SHA-256 and pHash of each file (`core.hashing.hash_file`); unreadable ones are counted."""
    from torchkit.core.data.hashing import hash_file

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for offset, path in enumerate(paths):
            try:
                digest, phash = hash_file(path)
            except OSError:
                result.hash_errors += 1
                continue
            if phash is None:  # not an image PIL can decode: unreadable, no copy of anything
                result.hash_errors += 1
                continue
            result.hashes.append((start + offset, digest, phash))


def hash_pass(
    paths: Sequence[str], *, workers: int | None = None, progress: Progress | None = None
) -> list[tuple[bytes, int] | None]:
    """(SHA-256, pHash) of every file, or None for one that cannot be read or decoded: the
    pass the leakage check makes over the files it does not measure, in worker processes."""
    workers = default_stats_workers() if workers is None else workers
    n = len(paths)
    size = max(1, min(_MAX_CHUNK, math.ceil(n / max(1, workers * 4))))
    tasks = [
        (start, paths[start : start + size], paths[start : start + size], "rgb", None, False, True)
        for start in range(0, n, size)
    ]
    found: list[tuple[bytes, int] | None] = [None] * n
    done = 0
    for result in _run_chunks(tasks, workers):
        for index, digest, phash in result.hashes:
            found[index] = (digest, phash)
        done += len(result.hashes) + result.hash_errors
        if progress:
            progress(done, n)
    return found


def _scan_task(task: tuple) -> _ChunkResult:
    return scan_files(*task)


# --------------------------------------------------------------------------- orchestration


def default_stats_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _chunks(
    samples: Samples,
    workers: int,
    mode: str,
    resize: int | None,
    *,
    offset: int = 0,
    measure: bool = True,
    perceptual: bool = False,
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
        )
        for start in range(0, n, size)
    ]


def _run_chunks(tasks: list[tuple], workers: int):
    """Yield chunk results, in-process for one worker, else from a process pool."""
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield _scan_task(task)
        return
    import multiprocessing
    import sys

    # fork on Linux, as torch's DataLoader does: workers start at once and a script that calls
    # this without an `if __name__ == "__main__"` guard still works (spawn and forkserver would
    # re-run it). The CLI's progress bar refreshes without a thread, so nothing else is running.
    use_fork = sys.platform.startswith("linux")
    context = multiprocessing.get_context("fork" if use_fork else "spawn")
    if use_fork:  # import once here, not once per worker (about half a CPU-second each)
        import numpy  # noqa: F401
        from PIL import Image

        Image.init()  # every format plugin
    # A signal while the pool starts is held back until `with pool` can stop it: raised inside
    # Pool(), it would leave the workers (and the pool's thread, which replaces any that die)
    # running for good.
    held = _HeldSignals()
    with held:
        pool = context.Pool(min(workers, len(tasks)), initializer=_init_worker)
    with pool:  # any exception, Ctrl-C or SIGTERM in here terminates the workers
        held.deliver()
        yield from pool.imap_unordered(_scan_task, tasks)


def _init_worker() -> None:
    """Ctrl-C is for the parent (it reaches the whole process group), which stops the pool;
    workers dying on it one by one would print a traceback each. SIGTERM (the parent stopping
    the pool, or sent to the group) ends a worker at once."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _HeldSignals:
    """Hold SIGINT and SIGTERM back in the main thread while the block runs; `deliver()` then
    raises the first one that came, as its own handler would have. A process forked inside the
    block (a pool worker not yet initialised) that gets one dies of it as by default."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self) -> None:
        self.received: list[int] = []
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _HeldSignals:
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers belong to the main thread; nothing to hold
        owner = os.getpid()

        def hold(signum: int, frame: Any) -> None:
            if os.getpid() != owner:  # a worker forked meanwhile
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            self.received.append(signum)

        for name in self.SIGNALS:
            number = getattr(signal, name)
            self.previous[number] = signal.signal(number, hold)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        import signal

        for number, handler in self.previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        self.previous = {}
        if exc_type is not None:  # the block failed: nothing to stop, the signal comes now
            self.deliver()

    def deliver(self) -> None:
        import signal

        if self.received:
            signal.raise_signal(self.received[0])


def warn_empty_classes(samples: Samples) -> list[str]:
    empty = [name for name, n in zip(samples.classes, samples.class_counts(), strict=True) if not n]
    if empty:
        log.warning(
            f"{len(empty)} class folder(s) hold no images: {', '.join(empty[:10])}"
            + (" ..." if len(empty) > 10 else "")
        )
    return empty


STATS_SPLIT_REASON = "normalisation statistics come from training data only"


def load_stats_samples(
    source: str | os.PathLike, split: str | None = None
) -> tuple[Samples, list[str], str | None, list[str]]:
    """(samples, non-image files, the split measured, notes) of what dataset-stats measures:
    the data `source` names (`core.datasource`); of split data (a split root, a CSV with a
    split column) its `split`, train by default, with a note; `split` on other data is a
    UsageError."""
    samples, non_images, measured, notes, _ = _stats_data(source, split)
    return samples, non_images, measured, notes


def _stats_data(
    source: str | os.PathLike, split: str | None
) -> tuple[Samples, list[str], str | None, list[str], Samples | None]:
    """`load_stats_samples`, and the samples of the splits not measured (None for data
    without splits or when every split is measured)."""
    from torchkit.core.data.sources import concatenate, non_image_files, open_data, select_split

    if os.fspath(source) == DIGITS:
        raise InputError(
            "dataset-stats reads image files, and `digits` is built in",
            "give an image folder, a split root or a CSV index (./digits for a folder named so)",
        )
    data = open_data(source, allow_unlabelled=True)
    samples, notes = select_split(data, split, default="train", default_reason=STATS_SPLIT_REASON)
    measured = None
    if data.is_split:
        measured = split or "train"
    covered = None if samples.splits is None else sorted(set(samples.splits))
    others = None
    if data.is_split:
        rest = [part for name, part in data.splits.items() if name not in (covered or [])]
        rest = [part for part in rest if len(part)]
        others = concatenate(rest) if rest else None
    samples = _with_dangling_links(data, samples, covered)
    return samples, non_image_files(data, covered), measured, notes, others


def _with_dangling_links(data: Any, samples: Samples, covered: list[str] | None) -> Samples:
    """`samples` and, after them, the symbolic links named like images that point nowhere in
    the folders they were listed from. A folder listing leaves such links out, a CSV index
    names them: either way they are unreadable files, counted and listed (fatal with
    `--strict`) by the one read that every file gets."""
    from torchkit.core.data.sources import concatenate
    from torchkit.core.data.sources.discovery import list_dangling_image_links, relative_ids

    if data.kind not in ("image folder", "flat folder", "split root") or not samples.paths:
        return samples
    root = Path(data.root)
    found: list[tuple[str | None, int, str]] = []  # (split, label, path)
    if data.kind == "flat folder":
        found = [(None, 0, path) for path in list_dangling_image_links(root)]
    else:
        index_of = {name: i for i, name in enumerate(samples.classes)}
        bases = [(None, root)] if data.kind == "image folder" else []
        bases += [(name, root / name) for name in (covered or []) if data.kind == "split root"]
        for split, base in bases:
            for name in sorted(index_of):
                if (base / name).is_dir():
                    found += [
                        (split, index_of[name], path)
                        for path in list_dangling_image_links(base / name)
                    ]
    if not found:
        return samples
    paths = [path for *_, path in found]
    links = Samples(
        classes=samples.classes,
        labels=[label for _, label, _ in found],
        paths=paths,
        source=samples.source,
        ids=relative_ids(paths, root),
        splits=None if samples.splits is None else [split or "" for split, *_ in found],
    )
    return concatenate([samples, links])


def check_near_threshold(threshold: int) -> None:
    if not 0 <= threshold <= MAX_THRESHOLD:
        raise UsageError(
            f"--near-threshold must be between 0 and {MAX_THRESHOLD} bits, not {threshold}",
            f"{DEFAULT_NEAR_THRESHOLD} (the default) finds re-encoded and resized copies",
        )


def compute_dataset_stats(
    source: str | os.PathLike,
    *,
    split: str | None = None,
    mode: str = "rgb",
    resize: int | None = None,
    workers: int | None = None,
    strict: bool = False,
    progress: Progress | None = None,
    leakage: bool = True,
    near_threshold: int = DEFAULT_NEAR_THRESHOLD,
    near_duplicates: bool = False,
    pairs_required: bool = False,
) -> DatasetStats:
    """Statistics of the image folder, flat folder, split root or CSV index at `source`; of
    split data, of its `split` (train by default; `all` for every split; see
    `load_stats_samples`). Class names are the data's classes, never its split names.

    `mode`: `rgb` (as torchkit's loaders convert: 16-bit images scaled to 8 bits), `gray`, or
    `native` (the files' own channels and bit depth; all images must then have the same
    channels). `resize`: count pixels after resizing the shorter side to this many pixels
    (bilinear, as `transforms.Resize` does). Unreadable files are listed and skipped, or raise
    InputError with `strict`.

    `leakage` (split data): also read and hash the files of the splits not measured, and list
    the exact and near (pHash within `near_threshold` bits) duplicates whose members lie in
    different splits. `near_duplicates`: also list near duplicates within one split (of data
    without splits: within the data). `pairs_required` (a pair CSV was asked for): a
    UsageError, before the pass, when neither applies.
    """
    if mode not in STATS_MODES:
        raise UsageError(f"unknown --mode {mode!r}", "use one of: " + ", ".join(STATS_MODES))
    if resize is not None and resize < 1:
        raise UsageError(f"--resize must be a positive number of pixels, not {resize}")
    check_near_threshold(near_threshold)
    samples, non_images, measured, notes, others = _stats_data(source, split)
    if non_images:
        log.warning(
            f"skipped {len(non_images)} non-image file(s), e.g. {non_images[0]}",
        )
    warn_empty_classes(samples)
    checked = measured is not None and leakage
    perceptual = checked or near_duplicates
    if pairs_required and not perceptual:
        raise UsageError(
            f"--leakage-csv: {source} has no splits to compare"
            if measured is None
            else "--leakage-csv with --no-leakage lists nothing",
            "give split data (a split root or a CSV with a split column), or add "
            "--near-duplicates to list near duplicates within a split",
        )
    if not (measured is not None and (leakage or near_duplicates)):
        others = None
    if others is not None:
        splits_read = ", ".join(dict.fromkeys(others.splits or []))
        notes.append(
            f"also reading {splits_read} ({len(others)} files, hashed, not measured) to find "
            "duplicates" + ("; --no-leakage skips them" if checked else "")
        )
    workers = default_stats_workers() if workers is None else workers
    extra = 0 if others is None else len(others)
    total = len(samples) + extra
    tasks = _chunks(samples, workers, mode, resize, perceptual=perceptual, total=total)
    if others is not None:
        tasks += _chunks(
            others, workers, mode, resize, offset=len(samples), measure=False, total=total
        )
    accumulator = _Accumulator()
    records: list[tuple] = []
    errors: list[tuple[int, str, int]] = []
    hashes: list[tuple[int, bytes, int]] = []
    sixteen_bit = done = hash_errors = 0
    if progress:
        progress(0, total)
    for result in _run_chunks(tasks, workers):
        if strict and result.errors:
            index, reason, _ = min(result.errors)
            raise InputError(
                f"unreadable image {samples.ids[index]}: {reason}",
                "fix or remove it, or leave out --strict to skip unreadable files",
            )
        accumulator.merge(result.accumulator)
        records.extend(result.records)
        errors.extend(result.errors)
        hashes.extend(result.hashes)
        hash_errors += result.hash_errors
        sixteen_bit += result.sixteen_bit
        done += len(result.records) + len(result.errors)
        done += result.hash_errors + sum(1 for h in result.hashes if h[0] >= len(samples))
        if progress:
            progress(done, total)
    records.sort()
    errors.sort()
    if not records:
        index, reason, _ = errors[0]
        raise InputError(
            f"none of the {total} image files in {samples.source} could be read",
            f"the first, {samples.ids[index]}: {reason}",
        )
    if errors:
        log.warning(f"skipped {len(errors)} unreadable file(s) (listed in the report)")
    if hash_errors:
        log.warning(
            f"{hash_errors} file(s) of the other splits could not be read: they take no part "
            "in the duplicate search"
        )
    if sixteen_bit:
        log.warning(
            f"{sixteen_bit} image(s) have 16 or 32 bits per pixel: --mode {mode} scales them to "
            "8 bits (v / 257), as torchkit's loaders feed them to a model; --mode native "
            "measures their full range"
        )
    stats = _summarise(samples, mode, resize, accumulator, records, errors, non_images)
    stats.split, stats.notes = measured, notes
    if perceptual:
        _find_duplicates(stats, samples, others, hashes, checked, near_threshold, near_duplicates)
    return stats


def _find_duplicates(
    stats: DatasetStats,
    samples: Samples,
    others: Samples | None,
    hashes: list[tuple[int, bytes, int]],
    checked: bool,
    threshold: int,
    within: bool,
) -> None:
    """Fill in the leakage report of `stats` from the hashes of the pass."""
    from torchkit.core.data.neardup import find_pairs

    n = len(samples)
    ids = list(samples.ids) + ([] if others is None else list(others.ids))
    own = samples.splits if samples.splits is not None else [stats.split] * n
    splits = list(own) + ([] if others is None else list(others.splits or []))
    digests: list[bytes | None] = [None] * len(ids)
    phashes: list[int | None] = [None] * len(ids)
    for index, digest, phash in hashes:
        digests[index], phashes[index] = digest, phash
    leaked, near = find_pairs(ids, splits, digests, phashes, threshold=threshold, within=within)
    stats.leakage_checked = checked
    stats.near_threshold = threshold
    stats.leakage = leaked if checked else []
    stats.near_duplicates = near
    stats.within_checked = within
    stats.hashed_files = len(hashes)
    counts = stats.leakage_counts()
    if stats.leakage:
        log.warning(
            f"{counts['exact']} exact and {counts['near']} near duplicate pair(s) cross splits: "
            "their files are in more than one split (listed in the report)"
        )


def write_pairs_csv(stats: DatasetStats, path: str | os.PathLike, *, force: bool) -> Path:
    """Every pair of the leakage report (and the near duplicates within a split), as CSV
    `path_a,split_a,path_b,split_b,kind,distance`, written atomically."""
    import csv

    from torchkit.core.data.neardup import PAIR_COLUMNS

    target = check_output_file(path, force, data_inputs(stats.source), what="leakage CSV")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(PAIR_COLUMNS)
    for pair in [*stats.leakage, *stats.near_duplicates]:
        writer.writerow(["" if v is None else v for v in pair.to_dict().values()])
    atomic_write_text(target, buffer.getvalue())
    return target


def _summarise(
    samples: Samples,
    mode: str,
    resize: int | None,
    accumulator: _Accumulator,
    records: list[tuple],
    errors: list[tuple[int, str, int]],
    non_images: list[str],
) -> DatasetStats:
    import numpy as np

    layouts = accumulator.layouts()
    if len(layouts) > 1:
        found = "; ".join(
            f"{'/'.join(names)} (e.g. {accumulator.examples[names]})" for names in layouts
        )
        raise InputError(
            f"--mode native needs images with the same channels, found: {found}",
            "use --mode rgb or --mode gray",
        )
    if layouts:
        channels, mean, std, pixels = accumulator.moments()
    else:
        channels, mean, std, pixels = _NO_PIXELS[mode], [], [], 0
    counts = [0] * len(samples.classes)
    for index, *_ in records:
        counts[samples.labels[index]] += 1
    nonzero = [n for n in counts if n]
    imbalance = None if not nonzero else (math.inf if 0 in counts else max(counts) / min(counts))
    widths = np.array([r[1] for r in records])
    heights = np.array([r[2] for r in records])
    by_digest: dict[bytes, list[int]] = {}
    for index, *_, digest in records:
        by_digest.setdefault(digest, []).append(index)
    duplicates = [
        DuplicateGroup(
            [samples.ids[i] for i in group],
            sorted({samples.classes[samples.labels[i]] for i in group}),
        )
        for group in sorted(g for g in by_digest.values() if len(g) > 1)
    ]
    return DatasetStats(
        source=samples.source,
        split=None,
        mode=mode,
        resize=resize,
        channels=list(channels),
        mean=mean,
        std=std,
        pixels=pixels,
        files=len(samples),
        images=len(records),
        classes=[ClassCount(n, c) for n, c in zip(samples.classes, counts, strict=True)],
        imbalance_ratio=imbalance,
        width=_size_range(widths),
        height=_size_range(heights),
        modes=dict(Counter(r[3] for r in records).most_common()),
        formats=dict(Counter(r[4] for r in records).most_common()),
        total_bytes=sum(r[5] for r in records) + sum(e[2] for e in errors),
        unreadable=[Unreadable(samples.ids[i], reason) for i, reason, _ in errors],
        duplicates=duplicates,
        non_image_files=non_images,
        sizes=[(r[1], r[2], samples.labels[r[0]]) for r in records],
    )


_NO_PIXELS = {"rgb": ("R", "G", "B"), "gray": ("L",), "native": ()}


def _size_range(values) -> SizeRange | None:
    import numpy as np

    if not len(values):
        return None
    return SizeRange(int(values.min()), float(np.median(values)), int(values.max()))


# --------------------------------------------------------------------------- plot


PLOT_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def check_outputs(
    source: str | os.PathLike,
    output: str | os.PathLike | None = None,
    plot: str | os.PathLike | None = None,
    *,
    force: bool = False,
    leakage_csv: str | os.PathLike | None = None,
) -> None:
    """Check the report (`-o`), the plot and the leakage CSV before the long pass over the
    images, not after it: none may be the dataset's index, lie inside its folders, or be
    another; an existing file is replaced only with `force`."""
    inputs = data_inputs(source)
    report = output if output is not None and os.fspath(output) != "-" else None  # `-o -`
    if report is not None:
        check_output_file(report, force, inputs, what="output")
    if plot is not None:
        check_plot_output(plot, force, inputs)
    if leakage_csv is not None:
        check_output_file(leakage_csv, force, inputs, what="leakage CSV")
    check_distinct_outputs((report, "output (-o)"), (plot, "plot"), (leakage_csv, "leakage CSV"))


def plot_format(path: str | os.PathLike) -> str:
    """The image format the plot is saved in: from the name, or PNG for a special file
    without one (`--plot /dev/stdout`, a FIFO)."""
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in PLOT_FORMATS:
        if is_special_file(target):
            return "png"
        raise UsageError(
            f"cannot tell the plot format from {target.name!r}",
            "end the name in " + ", ".join(PLOT_FORMATS),
        )
    return suffix.lstrip(".")


def check_plot_output(
    path: str | os.PathLike, force: bool, inputs: Sequence[InputPath] = ()
) -> Path:
    """Refuse a plot path that is an input, exists (without `force`) or has a format we cannot
    write, before the long pass over the images rather than after it."""
    plot_format(path)
    return check_output_file(path, force, inputs, what="plot")


def plot_dataset_stats(stats: DatasetStats, path: str | os.PathLike, *, force: bool) -> Path:
    """Class histogram and image-size scatter, saved (atomically) as an image at `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    target = check_plot_output(path, force, data_inputs(stats.source))
    figure = Figure(figsize=(12, 5), layout="constrained")
    FigureCanvasAgg(figure)
    bars, scatter = figure.subplots(1, 2, width_ratios=(3, 2))
    names = [c.name or "(unlabelled)" for c in stats.classes]
    bars.bar(range(len(names)), [c.images for c in stats.classes], color="tab:blue")
    if len(names) <= 60:  # beyond that the labels are an unreadable smear
        bars.set_xticks(range(len(names)), names, rotation=90 if len(names) > 8 else 0)
    bars.set_xlabel(f"class ({len(names)})")
    bars.set_ylabel("images")
    bars.set_title(f"Images per class ({stats.images} images)")
    bars.yaxis.set_major_locator(MaxNLocator(integer=True))
    if stats.sizes:
        widths, heights, _ = zip(*stats.sizes, strict=True)
        scatter.scatter(widths, heights, s=18, alpha=0.5, color="tab:orange", linewidths=0)
        scatter.set_xlim(left=0, right=max(widths) * 1.05)
        scatter.set_ylim(bottom=0, top=max(heights) * 1.05)
    scatter.set_xlabel("width (px)")
    scatter.set_ylabel("height (px)")
    scatter.set_title("Image sizes")
    # Drawn in memory, then written in one go: savefig seeks, which a FIFO or /dev/stdout
    # cannot, and the file (or the special file) gets the whole image or nothing.
    image = io.BytesIO()
    figure.savefig(image, format=plot_format(target), dpi=100)
    atomic_write_bytes(target, image.getvalue())
    return target
