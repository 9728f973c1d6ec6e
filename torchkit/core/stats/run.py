"""`compute_dataset_stats`, the command's run: the data resolved (the split measured, the
other splits' files for the leakage check), the pass, the report."""

from __future__ import annotations

import logging
import os
from typing import Any

from torchkit.core.data.hashing import PHASH_FLOOR, label_conflicts_said
from torchkit.core.data.image_files import image_path, strict_unreadable_error
from torchkit.core.data.neardup import DEFAULT_NEAR_THRESHOLD, MAX_THRESHOLD
from torchkit.core.data.preprocessing import check_image_memory
from torchkit.core.data.sources.digits import DIGITS
from torchkit.core.data.sources.samples import Samples, shown_class_names
from torchkit.core.io.errors import InputError, UsageError, short_repr
from torchkit.core.io.progress import Progress
from torchkit.core.runtime.cpus import check_workers
from torchkit.core.stats.report import DatasetStats, find_duplicates, summarise
from torchkit.core.stats.scan import (
    STATS_MODES,
    Accumulator,
    ChunkResult,
    default_stats_workers,
    digest_array,
    hash_array,
    record_array,
    run_chunks,
    scan_tasks,
)

log = logging.getLogger("torchkit")


def warn_empty_classes(samples: Samples, split: str | None = None) -> list[str]:
    """The classes of `samples` (of the measured `split`) without an image, in one warning.
    Worded for every kind of data: a class of a CSV index, shards or parquet is no folder, and
    a class the val split lacks has no folder there either."""
    # By shown name: ImageNet's two `crane`s are two entries, either of which may be empty.
    counts = dict(zip(shown_class_names(samples.classes), samples.class_counts(), strict=True))
    if counts.get("") == len(samples):  # unlabelled images: they have no class to be empty
        return []
    empty = [name for name, n in counts.items() if not n and name]
    if empty:
        where = f" in the {split} split" if split and split != "all" else ""
        log.warning(
            f"{len(empty)} class(es) have no images{where}: {', '.join(empty[:10])}"
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
    samples, non_images, measured, notes, _, _ = _stats_data(source, split)
    return samples, non_images, measured, notes


def _stats_data(
    source: str | os.PathLike, split: str | None, *, leakage: bool = False
) -> tuple[Samples, list[str], str | None, list[str], Samples | None, list[tuple[str, ...]]]:
    """`load_stats_samples`, the samples of the splits not measured (None for data without
    splits or when every split is measured), and, with `leakage`, the ids of each file the
    data reaches under names in two splits (a link across splits: read under each name for
    the leakage report, where every other reader refuses it)."""
    from torchkit.core.data.sources import concatenate, non_image_files, open_data, select_split
    from torchkit.core.data.sources.discovery import files_in_two_splits_reported
    from torchkit.core.data.sources.samples import partial_labels_kept

    if os.fspath(source) == DIGITS:
        raise InputError(
            "dataset-stats reads image files, and `digits` is built in",
            "give an image folder, a split root or a CSV index; ./digits for a folder named so",
        )
    shared: list[tuple[str, ...]] = []
    # Of partly labelled data each label is kept, the samples without one counted in a row of
    # their own (class ""), as beside an unlabelled test split: read all unlabelled, the class
    # counts of the labelled samples were lost.
    with partial_labels_kept():
        if leakage:
            with files_in_two_splits_reported() as shared:
                data = open_data(source, allow_unlabelled=True)
        else:
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
    return samples, non_image_files(data, covered), measured, notes, others, shared


def check_near_threshold(threshold: int) -> None:
    if not 0 <= threshold <= MAX_THRESHOLD:
        raise UsageError(
            f"--near-threshold must be between 0 and {MAX_THRESHOLD} bits, not {threshold}",
            f"the default, {DEFAULT_NEAR_THRESHOLD}, finds re-encoded and resized copies",
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
    exact_phash: bool = False,
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
    different splits; one file reached under names in two splits (a link across splits, which
    every other reader refuses) is read under each and listed as an exact pair marked
    `same_file` (with `leakage=False` it is refused). `near_duplicates`: also list near
    duplicates within one split (of data without splits: within the data). `pairs_required`
    (a pair CSV was asked for): a UsageError, before the pass, when neither applies.
    `exact_phash`: every pHash from the whole decode, imagededup's bits exactly; else large
    images are reduced first (`core.hashing.PHASH_FLOOR`), much faster on large JPEGs and a
    few bits off on some.
    """
    _check_stats_options(mode, resize, near_threshold, workers)
    samples, non_images, measured, notes, others, shared = _stats_data(
        source, split, leakage=leakage
    )
    if non_images:
        log.warning(
            f"skipped {len(non_images)} non-image file(s), e.g. {non_images[0]}",
        )
    warn_empty_classes(samples, measured)
    checked = measured is not None and leakage
    perceptual = checked or near_duplicates
    if pairs_required and not perceptual:
        within = "add --near-duplicates to list near duplicates within a split"
        if measured is None:
            raise UsageError(
                f"--leakage-csv: {source} has no splits to compare",
                "give split data, such as a split root or a CSV with a split column, or " + within,
            )
        raise UsageError(
            "--leakage-csv with --no-leakage lists nothing", f"drop --no-leakage, or {within}"
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
    total = len(samples) + (0 if others is None else len(others))
    tasks = _stats_tasks(samples, others, workers, mode, resize, perceptual, exact_phash, total)
    tally = _ScanTally(samples, total, perceptual=perceptual, strict=strict, progress=progress)
    if progress:
        progress(0, total)
    run_chunks(tasks, workers, tally.take)
    records, hashes, digests = tally.records.rows(), tally.hashes.rows(), tally.digests.rows()
    errors = sorted(tally.errors)
    if not len(records):
        index, reason, _ = errors[0]
        raise InputError(
            f"none of the {total} image files in {_data_name(source, samples)} could be read",
            f"the first, {image_path(samples, index)}: {reason}",
        )
    _warn_of_skipped_files(tally, len(errors), mode)
    stats = summarise(
        samples, mode, resize, tally.accumulator, records, list(tally.names), errors, non_images
    )
    stats.source, stats.split, stats.notes = _data_name(source, samples), measured, notes
    _warn_of_constant_channels(stats)
    conflicts = stats.label_conflicts
    if conflicts:
        said = label_conflicts_said([(group.paths, group.classes) for group in conflicts])
        log.warning(f"{said} (listed under duplicates in the report)")
    if perceptual:
        find_duplicates(
            stats,
            samples,
            others,
            hashes,
            digests,
            checked,
            near_threshold,
            near_duplicates,
            shared,
        )
        stats.exact_phash = exact_phash
    return stats


def _check_stats_options(
    mode: str, resize: int | None, near_threshold: int, workers: int | None
) -> None:
    """Refuse a --mode, --resize, --near-threshold or --workers no pass can run with."""
    if mode not in STATS_MODES:
        raise UsageError(f"unknown --mode {mode!r}", "use one of: " + ", ".join(STATS_MODES))
    if resize is not None and resize < 1:
        raise UsageError(f"--resize must be a positive number of pixels, not {resize}")
    if resize is not None:
        # Each image is resized in memory: a side no machine holds would have the OOM killer
        # end a worker, or PIL overflow, counted as every image unreadable.
        check_image_memory(resize, 3, f"--resize {short_repr(resize)}")
    check_near_threshold(near_threshold)
    check_workers(workers)


def _stats_tasks(
    samples: Samples,
    others: Samples | None,
    workers: int,
    mode: str,
    resize: int | None,
    perceptual: bool,
    exact_phash: bool,
    total: int,
) -> list:
    """The pass's chunks: the measured files, then the other splits' (hashed, not measured)
    at the indices after them."""
    floor = 0 if exact_phash else PHASH_FLOOR
    tasks = scan_tasks(
        samples, workers, mode, resize, perceptual=perceptual, phash_floor=floor, total=total
    )
    if others is not None:
        tasks += scan_tasks(
            others,
            workers,
            mode,
            resize,
            offset=len(samples),
            measure=False,
            phash_floor=floor,
            total=total,
        )
    return tasks


class _ScanTally:
    """The pass's chunks gathered as they come (`take`): the measurements merged; one row per
    file at its index (`scan.RECORD_DTYPE`, `scan.HASH_DTYPE`), so the rows are in index order
    and no chunk's arrays are kept; the unreadable files and the counts warned of after."""

    def __init__(
        self,
        samples: Samples,
        total: int,
        *,
        perceptual: bool,
        strict: bool,
        progress: Progress | None,
    ) -> None:
        self.samples, self.total, self.strict, self.progress = samples, total, strict, progress
        self.accumulator = Accumulator()
        self.records = _RowsByIndex(record_array(), len(samples))
        self.hashes = _RowsByIndex(hash_array(), total if perceptual else 0)
        # Files without a pHash: their bytes' digests.
        self.digests = _RowsByIndex(digest_array(), total if perceptual else 0)
        self.names: dict[str, int] = {}  # mode and format names -> the codes the records use
        self.errors: list[tuple[int, str, int]] = []
        self.sixteen_bit = self.done = self.hash_errors = self.no_phash = self.unhashed = 0

    def take(self, result: ChunkResult) -> None:
        if self.strict and result.errors:
            index, reason, _ = min(result.errors)
            raise strict_unreadable_error(f"{image_path(self.samples, index)}: {reason}")
        self.accumulator.merge(result.accumulator)
        if len(result.records):
            codes = result.name_codes(self.names)
            self.records.put(result.records, mode=codes, format=codes)
        self.hashes.put(result.hashes)
        self.digests.put(result.digests)
        self.errors.extend(result.errors)
        self.hash_errors += result.hash_errors
        self.no_phash += result.no_phash
        self.unhashed += result.unhashed
        self.sixteen_bit += result.sixteen_bit
        self.done += len(result.records) + len(result.errors) + result.hash_errors + result.no_phash
        self.done += int((result.hashes["index"] >= len(self.samples)).sum())
        if self.progress:
            self.progress(self.done, self.total)


def _warn_of_constant_channels(stats: DatasetStats) -> None:
    """A channel of one value in every pixel read has std 0: `transforms.Normalize` with the
    printed std divides by zero and makes every input inf or NaN."""
    flat = [name for name, std in zip(stats.channels, stats.std, strict=True) if std == 0]
    if flat:
        log.warning(
            f"channel(s) {', '.join(flat)} hold one value in every pixel (std 0): "
            "transforms.Normalize with that std divides by zero; give it std 1 there"
        )


def _warn_of_skipped_files(tally: _ScanTally, unreadable: int, mode: str) -> None:
    """Warn of the files skipped or only partly read by the pass."""
    if unreadable:
        log.warning(f"skipped {unreadable} unreadable file(s) (listed in the report)")
    if tally.hash_errors:
        log.warning(
            f"{tally.hash_errors} file(s) of the other splits could not be read: they take no "
            "part in the duplicate search"
        )
    if tally.no_phash:
        log.warning(
            f"{tally.no_phash} file(s) of the other splits are not images torchkit can hash "
            "(not decodable, or 32-bit samples it cannot scale): only their byte-identical "
            "copies are looked for"
        )
    if tally.unhashed:
        log.warning(
            f"{tally.unhashed} image(s) have 32-bit samples that cannot be scaled to 8 bits (as "
            "the loaders refuse them): measured, but only their byte-identical copies are "
            "looked for"
        )
    if tally.sixteen_bit:
        log.warning(
            f"{tally.sixteen_bit} image(s) have 16 or 32 bits per pixel: --mode {mode} scales "
            "them to 8 bits (v / 257), as torchkit's loaders feed them to a model; --mode "
            "native measures their full range"
        )


def _data_name(source: str | os.PathLike, samples: Samples) -> str:
    """The data as the report names it: URL shards by their URL as given (its password and
    tokens `***`), not by the cache folder they were read from; other data by its root."""
    from torchkit.core.data.sources.http_shards import is_url
    from torchkit.core.io.redaction import redact_url

    given = os.fspath(source)
    return redact_url(given) if is_url(given) else samples.source


class _RowsByIndex:
    """A structured array with a row for each index below `size`, filled in any order (`put`)
    and read back (`rows`) without the indices never put, in index order."""

    def __init__(self, empty: Any, size: int) -> None:
        import numpy as np

        self._rows = np.zeros(size, dtype=empty.dtype)
        self._filled = np.zeros(size, dtype=bool)

    def put(self, rows: Any, **codes: Any) -> None:
        """`rows` (with an `index` field) in place; each field named in `codes` translated
        through its array (a chunk's codes into the run's)."""
        at = rows["index"]
        self._rows[at] = rows
        for name, table in codes.items():
            self._rows[name][at] = table[rows[name]]
        self._filled[at] = True

    def rows(self) -> Any:
        rows = self._rows if self._filled.all() else self._rows[self._filled]
        self._rows = self._filled = None  # type: ignore[assignment]
        return rows
