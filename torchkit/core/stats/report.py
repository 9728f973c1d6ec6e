"""What dataset-stats reports: the statistics, the health report and the duplicate pairs."""

from __future__ import annotations

import itertools
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkit.core.data.hashing import is_label_conflict
from torchkit.core.data.neardup import DuplicatePair
from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.data.sources.samples import Samples, shown_class_names
from torchkit.core.io.csv_rows import write_csv_file
from torchkit.core.io.errors import InputError
from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.stats.scan import Accumulator

log = logging.getLogger("torchkit")


@dataclass
class SizeRange:
    min: int
    median: float
    max: int


@dataclass
class ClassCount:
    name: str
    images: int
    index: int  # the class's label: two classes may share a name (ImageNet's `crane`s)
    shown: str  # the name as the table, CSV and plot show it (`shown_class_names`)


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
    # One row (width, height, label) per readable image, an N x 3 int32 array, for the plot;
    # not part of to_dict().
    sizes: Any = field(default_factory=list, repr=False)
    # Remarks for the user (which split was measured and why); not part of to_dict().
    notes: list[str] = field(default_factory=list, repr=False)
    # Where the files lie (torchkit's cache for URL shards, which `source` does not name):
    # what an output may not be written into. Not part of to_dict().
    root: str = field(default="", repr=False)
    # Leakage (split data): exact and near duplicates whose members lie in different splits,
    # found among the files of every split; near duplicates within one split on request.
    leakage_checked: bool = False
    near_threshold: int | None = None
    # the pHash from the whole decode (--exact-phash) or from a reduced one; None: no pHash
    exact_phash: bool | None = None
    leakage: list[DuplicatePair] = field(default_factory=list)
    near_duplicates: list[DuplicatePair] = field(default_factory=list)
    within_checked: bool = False  # near duplicates within a split were looked for
    hashed_files: int = 0  # files of every split that took part in the duplicate search

    def leakage_counts(self) -> dict[str, int]:
        return {kind: sum(1 for p in self.leakage if p.kind == kind) for kind in ("exact", "near")}

    @property
    def num_classes(self) -> int:
        """The classes listed; beside class names, the row of unlabelled images ("", an
        unlabelled split of split data) is no class."""
        named = sum(1 for count in self.classes if count.name)
        return named or len(self.classes)

    @property
    def label_conflicts(self) -> list[DuplicateGroup]:
        """The groups of identical files filed under more than one class (the same image
        labelled twice); an unlabelled copy ("") of a labelled image is none."""
        return [group for group in self.duplicates if is_label_conflict(group.classes)]

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
            "duplicate_label_conflicts": len(self.label_conflicts),
            "non_image_files": len(self.non_image_files),
            "num_classes": self.num_classes,
            "classes": [
                {"name": c.name, "index": c.index, "images": c.images} for c in self.classes
            ],
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
            "exact_phash": self.exact_phash,
            "leakage_exact": self.leakage_counts()["exact"],
            "leakage_near": self.leakage_counts()["near"],
            "leakage": [p.to_dict() for p in self.leakage],
            # False: not looked for (no --near-duplicates), so the empty list says nothing
            "near_duplicates_checked": self.within_checked,
            "near_duplicates": [p.to_dict() for p in self.near_duplicates],
        }


def find_duplicates(
    stats: DatasetStats,
    samples: Samples,
    others: Samples | None,
    hashes: Any,
    digests_only: Any,
    checked: bool,
    threshold: int,
    within: bool,
    shared: Sequence[tuple[str, ...]] = (),
) -> None:
    """Fill in the leakage report of `stats` from the hashes of the pass: `hashes`
    (`scan.HASH_DTYPE` rows) and the SHA-256 of the files read that have no pHash
    (`digests_only`, `scan.DIGEST_DTYPE` rows: undecodable files, found by their exact copies).
    `shared`: the ids of each file the data reaches under names in two splits (a link across
    splits), whose pairs are marked as one file."""
    import numpy as np

    from torchkit.core.data.neardup import find_pairs

    n = len(samples)
    ids = list(samples.ids) + ([] if others is None else list(others.ids))
    own = samples.splits if samples.splits is not None else [stats.split] * n
    splits = list(own) + ([] if others is None else list(others.splits or []))
    # Masked where a file has none: one array each, not a Python bytes and int a file.
    digests = np.ma.masked_all(len(ids), dtype=hashes.dtype["sha256"])
    phashes = np.ma.masked_all(len(ids), dtype=np.uint64)
    digests[hashes["index"]], phashes[hashes["index"]] = hashes["sha256"], hashes["phash"]
    digests[digests_only["index"]] = digests_only["sha256"]
    number_of = {name: number for number, names in enumerate(shared) for name in names}
    same_file = [number_of.get(name) for name in ids] if number_of else None
    leaked, near = find_pairs(
        ids, splits, digests, phashes, threshold=threshold, within=within, same_file=same_file
    )
    stats.leakage_checked = checked
    stats.near_threshold = threshold
    stats.leakage = leaked if checked else []
    stats.near_duplicates = near
    stats.within_checked = within
    stats.hashed_files = len(hashes)
    counts = stats.leakage_counts()
    if stats.leakage:
        linked = sum(pair.same_file for pair in stats.leakage)
        log.warning(
            f"{counts['exact']} exact and {counts['near']} near duplicate pair(s) cross splits: "
            "their files are in more than one split (listed in the report)"
            + (
                f"; {linked} of them one file under two names (same_file): remove the link, "
                "or the index row, that puts it in a second split"
                if linked
                else ""
            )
        )


def write_pairs_csv(stats: DatasetStats, path: str | os.PathLike, *, force: bool) -> Path:
    """Every pair of the leakage report (and the near duplicates within a split), as CSV
    `path_a,split_a,path_b,split_b,kind,distance,same_file` (`same_file` true or false, as
    JSON writes it), written atomically."""

    from torchkit.core.data.neardup import PAIR_COLUMNS

    target = check_output_file(path, force, data_inputs(stats.root), what="leakage CSV")
    pairs = itertools.chain(stats.leakage, stats.near_duplicates)
    rows = (  # None: an empty field
        [*list(pair.to_dict().values())[:-1], "true" if pair.same_file else "false"]
        for pair in pairs
    )
    write_csv_file(target, rows, header=PAIR_COLUMNS)
    return target


def summarise(
    samples: Samples,
    mode: str,
    resize: int | None,
    accumulator: Accumulator,
    records: Any,
    names: list[str],
    errors: list[tuple[int, str, int]],
    non_images: list[str],
) -> DatasetStats:
    """The report of a pass: `records` (`scan.RECORD_DTYPE`, sorted by index; mode and format
    codes into `names`), `errors` (index, reason, bytes read) sorted by index."""
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
    mixed = accumulator.mixed_units() if layouts else None
    if mixed:
        # Values / 255 or / 65535 and a 32-bit image's own values are not on one scale: their
        # sums would add up to a mean and std of neither.
        raise InputError(
            f"--mode native measures 8- and 16-bit images in [0, 1] (e.g. {mixed[0]}) and 32-bit, "
            f"signed or floating point ones in their own values (e.g. {mixed[1]}): "
            "one mean and std cannot cover both",
            "use --mode rgb or --mode gray, or measure the 32-bit images on their own",
        )
    if layouts:
        channels, mean, std, pixels = accumulator.moments()
    else:
        channels, mean, std, pixels = _NO_PIXELS[mode], [], [], 0
    indices = records["index"]
    labels = np.asarray(samples.labels, dtype=np.int64)[indices]
    counts = np.bincount(labels, minlength=len(samples.classes)).tolist()
    shown = shown_class_names(samples.classes)
    listed = [
        ClassCount(name, n, index, shown[index])
        for index, (name, n) in enumerate(zip(samples.classes, counts, strict=True))
    ]
    measured = counts
    if len(listed) > 1:
        # "" beside class names is the unlabelled split of split data (HF's test split beside
        # labelled ones): listed where this split holds such images, never a class of the ratio.
        listed = [c for c in listed if c.name or c.images]
        measured = [c.images for c in listed if c.name]
    nonzero = [n for n in measured if n]
    imbalance = (
        None if not nonzero else (math.inf if 0 in measured else max(measured) / min(measured))
    )
    widths = records["width"].astype(np.int64)
    heights = records["height"].astype(np.int64)
    duplicates = [
        DuplicateGroup(
            [samples.ids[i] for i in group],
            sorted({shown[samples.labels[i]] for i in group}),
        )
        for group in _same_digest_groups(records)
    ]
    return DatasetStats(
        source=samples.source,
        root=samples.source,
        split=None,
        mode=mode,
        resize=resize,
        channels=list(channels),
        mean=mean,
        std=std,
        pixels=pixels,
        files=len(samples),
        images=len(records),
        classes=listed,
        imbalance_ratio=imbalance,
        width=_size_range(widths),
        height=_size_range(heights),
        modes=_most_common(records["mode"], names),
        formats=_most_common(records["format"], names),
        total_bytes=int(records["bytes"].sum()) + sum(e[2] for e in errors),
        unreadable=[Unreadable(samples.ids[i], reason) for i, reason, _ in errors],
        duplicates=duplicates,
        non_image_files=non_images,
        sizes=np.stack([widths, heights, labels], axis=1).astype(np.int32),
    )


def _most_common(codes: Any, names: list[str]) -> dict[str, int]:
    """{name: count} of the `codes` (into `names`), most common first, ties in the order of
    their first occurrence (as `Counter.most_common` orders them)."""
    import numpy as np

    found, first, counts = np.unique(codes, return_index=True, return_counts=True)
    order = sorted(range(len(found)), key=lambda k: (-int(counts[k]), int(first[k])))
    return {names[int(found[k])]: int(counts[k]) for k in order}


def _same_digest_groups(records: Any) -> list[list[int]]:
    """The indices of the records (sorted by index) that share their SHA-256, for every digest
    held by more than one: each group in index order, the groups by their first index."""
    import numpy as np

    if len(records) < 2:
        return []
    # The 32-byte digests as four big-endian uint64 columns: sorted as the bytes sort.
    words = np.ascontiguousarray(records["sha256"]).view(">u8").reshape(-1, 4)
    order = np.lexsort((records["index"], words[:, 3], words[:, 2], words[:, 1], words[:, 0]))
    ranked = words[order]
    starts = np.flatnonzero(np.r_[True, (ranked[1:] != ranked[:-1]).any(axis=1)])
    sizes = np.diff(np.r_[starts, len(order)])
    indices = records["index"][order]
    groups = [indices[a : a + n].tolist() for a, n in zip(starts, sizes, strict=True) if n > 1]
    return sorted(groups, key=lambda group: group[0])


_NO_PIXELS = {"rgb": ("R", "G", "B"), "gray": ("L",), "native": ()}


def _size_range(values) -> SizeRange | None:
    import numpy as np

    if not len(values):
        return None
    return SizeRange(int(values.min()), float(np.median(values)), int(values.max()))
