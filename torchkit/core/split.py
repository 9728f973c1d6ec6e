"""`split`: a stratified, seeded train/val/test split of an image dataset.

The assignment is decided by names alone: each file (or `--group`) is ranked by a SHA-256 of
(seed, its path relative to ROOT), so the split is the same on every machine and run whatever
order the filesystem lists files in. Counts per class are allocated by largest remainder (19
files at 8:1:1 give 15/2/2), with at least one file of a class in every split when it has enough.

Byte-identical files (the same photo saved twice) always land in the same split, as if they were
one file (`dedup`, on by default; combined with `--group` when both apply): found by size first,
then content hash (`core.hashing.content_groups`), so only files that share a size are read.
`fixed` takes N images per class for val (and M for test) and leaves the rest in train, as
split-folders' `fixed` does; `oversample` balances the train classes by repeating images
(round-robin over each class's files in their seeded order) up to the largest class: extra
copies or links under distinct names (`<stem>-repeat<k><suffix>`), or repeated rows in a
manifest, each numbered in split.csv's `repeat` column (0 for the image itself).

Files are copied, linked or moved into OUT/<split>/<class>/..., or only listed (`manifest`); every
mode writes OUT/split.csv (path, label, split, source; and repeat with `oversample`). `move` is
safe against a crash: the plan is written first, each file is renamed (atomic) or copied,
verified and only then removed, and rerunning the same command finishes an interrupted move
(or, once it is done, says so).

OUT goes through `core.outputs` (never the dataset, inside it or holding it, nor `.`; locked while
it is written; `--force` only over an empty folder or an earlier split). `--force` replaces only
the earlier split (its split folders and split.csv; other files in OUT stay): they are set aside
in OUT/.torchkit-split-replaced and put back if the new split fails or is interrupted, and by the
next run on OUT if it was killed.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import threading
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from torchkit import __version__
from torchkit.core.data.hashing import content_groups
from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.sources.splitting import SPLIT_NAMES, stratified_split
from torchkit.core.io.errors import InputError, OutputExistsError, UsageError
from torchkit.core.io.files import atomic_write, atomic_write_text
from torchkit.core.io.outputs import (
    MARKER,
    OutputFolder,
    OutputOverlapError,
    check_not_protected,
    check_output_file,
    check_overlap,
    check_replaceable,
    discard_tree,
    remove_marker,
    remove_tree,
    reporting_write_errors,
    write_marker,
)
from torchkit.core.io.progress import Progress

log = logging.getLogger("torchkit")

SPLIT_MODES = ("copy", "symlink", "hardlink", "move", "manifest")
MANIFEST = "split.csv"
JOURNAL = ".torchkit-split.json"  # move mode only: the record that OUT holds the only copies
_MOVE_TEMP = ".torchkit-move-"  # prefix of a cross-device copy that is not verified yet
RESERVED_PREFIX = ".torchkit"  # the marker, the journal, temporaries: never a split name
_REPLACED = ".torchkit-split-replaced"  # the earlier split, set aside while --force replaces it
_DISCARDED = ".torchkit-split-discarded"  # the same, being deleted once the new split is kept
_COPY_THREADS = 8
WHAT = "output folder"


@dataclass
class SplitResult:
    source: str
    out: str
    mode: str
    names: list[str]
    ratio: list[float]  # normalised to sum to 1
    seed: int
    stratified: bool
    group: str | None
    groups: int | None  # number of groups with --group
    classes: list[str]
    counts: list[list[int]]  # [class][split]
    manifest: str
    resumed: bool = False
    already_done: bool = False  # a rerun of a finished move: nothing was touched
    dedup: bool = True  # byte-identical files kept in one split
    dedup_groups: int = 0  # groups of byte-identical files (two or more) kept together
    dedup_files: int = 0  # the files in them
    fixed: list[int] | None = None  # --fixed: images per class in the second (and third) split
    repeats: list[int] | None = None  # --oversample: extra train copies per class

    @property
    def totals(self) -> list[int]:
        return [sum(row[j] for row in self.counts) for j in range(len(self.names))]

    @property
    def oversample(self) -> bool:
        return self.repeats is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "out": self.out,
            "mode": self.mode,
            "ratio": self.ratio,
            "seed": self.seed,
            "stratified": self.stratified,
            "group": self.group,
            "groups": self.groups,
            "dedup_groups": self.dedup_groups if self.dedup else None,
            "dedup_files": self.dedup_files if self.dedup else None,
            "fixed": self.fixed,
            "oversample": self.oversample,
            "files": sum(self.totals),
            "repeats": sum(self.repeats) if self.repeats is not None else 0,
            "splits": dict(zip(self.names, self.totals, strict=True)),
            "classes": [
                {
                    "name": name,
                    **dict(zip(self.names, row, strict=True)),
                    "total": sum(row),
                    **({"repeats": self.repeats[i]} if self.repeats is not None else {}),
                }
                for i, (name, row) in enumerate(zip(self.classes, self.counts, strict=True))
            ],
            "manifest": self.manifest,
            "resumed": self.resumed,
        }


# --------------------------------------------------------------------------- options


_RATIO_PART = re.compile(r"(?=.{1,32}$)(\d+(\.\d*)?|\.\d+|\d+/\d+)")


def parse_ratio(text: str | Sequence[float]) -> list[Fraction]:
    """`8:1:1`, `0.7,0.3`, `70:20:10`...: two or three positive parts, as exact fractions of 1.

    Parts that add up to 1 are fractions; otherwise they are proportions, each at least 1 (so a
    mistyped `0.7,0.2` is an error, not a silent 78/22 split).
    """
    raw = [str(p) for p in text] if not isinstance(text, str) else re.split(r"[:,]", text)
    hint = "write it like 8:1:1 or 0.7,0.3 (two or three parts)"
    # Plain numbers only, and short ones: Fraction("1e100000000") would compute a number of
    # 100 million digits (the command would hang and run out of memory).
    if any(not _RATIO_PART.fullmatch(p.strip()) for p in raw):
        raise UsageError(f"cannot read --ratio {text!r}", hint)
    try:
        parts = [Fraction(p.strip()) for p in raw]
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"cannot read --ratio {text!r}", hint) from None
    if len(parts) not in (2, 3):
        raise UsageError(f"--ratio needs two or three parts, not {len(parts)}", hint)
    if any(p <= 0 for p in parts):
        raise UsageError(f"every part of --ratio must be positive: {text!r}", hint)
    total = sum(parts)
    if total != 1 and any(p < 1 for p in parts):
        raise UsageError(
            f"--ratio {text!r} adds up to {float(total):g}, not 1",
            "fractions must add up to 1; or give proportions like 8:1:1",
        )
    return [p / total for p in parts]


def parse_fixed(text: str | Sequence[int]) -> list[int]:
    """`N` or `N,M`: N images per class in the second split (val), M in the third (test)."""
    raw = [str(p).strip() for p in text] if not isinstance(text, str) else text.split(",")
    hint = "e.g. --fixed 10 (10 per class in val) or --fixed 10,20 (and 20 in test)"
    if len(raw) not in (1, 2) or not all(re.fullmatch(r"\d{1,9}", p.strip()) for p in raw):
        raise UsageError(f"cannot read --fixed {text!r}", hint)
    counts = [int(p) for p in raw]
    if any(c < 1 for c in counts):
        raise UsageError(f"every count of --fixed must be at least 1: {text!r}", hint)
    return counts


def check_names(names: Sequence[str], parts: int) -> list[str]:
    names = [n.strip() for n in names]
    if len(names) != parts:
        raise UsageError(
            f"--names gives {len(names)} split name(s) for a {parts}-part --ratio",
            "give one name per part, e.g. --names train,val,test",
        )
    for name in names:
        if not is_folder_name(name):
            raise UsageError(f"{name!r} cannot be a split folder name", "use names like train")
        if name.casefold() == MANIFEST or name.casefold().startswith(RESERVED_PREFIX):
            # casefold: on macOS and Windows `.TorchKit-split.json` is the journal too
            raise UsageError(
                f"{name!r} cannot be a split folder name: torchkit keeps its own files in OUT "
                f"under {MANIFEST} and names starting with {RESERVED_PREFIX}",
                "use names like train",
            )
    if len({n.casefold() for n in names}) != len(names):
        raise UsageError(f"split names must differ: {', '.join(names)}", "e.g. train,val,test")
    return names


def is_folder_name(name: str) -> bool:
    """A name that can be one folder on this system: not empty, `.` or `..`, no separator or NUL,
    encodable, at most 255 bytes."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        return False
    try:
        return len(os.fsencode(name)) <= 255
    except UnicodeError:
        return False


def group_names(samples: Samples, keys: Sequence[str], pattern: str) -> tuple[list[str], int]:
    """The group of each file: the first capture group (or the whole match) of `pattern`
    searched in its file name; a file that does not match is a group of its own."""
    try:
        regex = re.compile(pattern)
    except re.error as error:
        raise UsageError(
            f"--group {pattern!r} is not a valid regular expression ({error})",
            r"e.g. '^(patient\d+)_' groups files by the text the parentheses capture",
        ) from None
    groups, unmatched = [], 0
    for key in keys:
        found = regex.search(key.rsplit("/", 1)[-1])
        value = None if found is None else found.group(1 if regex.groups else 0)
        if value is None:
            unmatched += 1
            groups.append("file\0" + key)
        else:
            groups.append("group\0" + value)
    if unmatched == len(keys):
        example = keys[0].rsplit("/", 1)[-1]
        raise UsageError(
            f"--group {pattern!r} matches no file name",
            f"it is searched in names such as {example!r}",
        )
    if unmatched:
        log.warning(f"{unmatched} file name(s) do not match --group; each is a group of its own")
    return groups, len(set(groups))


# --------------------------------------------------------------------------- planning


@dataclass
class _Plan:
    sources: list[str]  # absolute
    labels: list[str]  # class name per file
    dests: list[str]  # relative to OUT, "/"-separated
    splits: list[int]  # index into names
    repeats: list[int] | None = None  # --oversample: 0 for a file, k for its k-th repeat


def dedup_units(
    paths: Sequence[str], keys: Sequence[str], groups: Sequence[str] | None
) -> tuple[list[str] | None, int, int]:
    """(the unit of each file, groups of byte-identical files, files in them): files with the
    same bytes share a unit, and so do files of one `--group` (`groups`, else each file is its
    own unit, named by its key). A unit is named by the smallest name among its members' own,
    so a dataset without duplicates is split exactly as before. None: no duplicates at all."""
    identical = content_groups(paths)
    if not identical:
        return (None if groups is None else list(groups)), 0, 0
    own = list(groups) if groups is not None else list(keys)
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        root = name
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(name, name) != root:  # path compression
            parent[name], name = root, parent[name]
        return root

    for members in identical:
        roots = {find(own[i]) for i in members}
        smallest = min(roots)
        for root in roots:
            parent[root] = smallest
    units = [find(name) for name in own]
    return units, len(identical), sum(len(members) for members in identical)


def _unit_rank(seed: int, name: str) -> bytes:
    """The seeded rank of a unit (file or group), as `core.datasource.splitting.stratified_split`
    ranks them."""
    return hashlib.sha256(f"{seed}\0".encode() + name.encode("utf-8", "surrogateescape")).digest()


def fixed_split(
    labels: Sequence[int],
    fixed: Sequence[int],
    seed: int,
    units: Sequence[str],
    classes: Sequence[str],
    names: Sequence[str],
    stratify: bool,
) -> list[list[int]]:
    """Indices per split for `--fixed N[,M]`: N images of each class in the second split, M in
    the third, the rest in the first. Units (files or groups) are taken in their seeded order
    (as the ratio split takes them), each to the split furthest below its count; a group never
    splits, so with groups the counts are met as closely as groups allow. A class with fewer
    than N + M + 1 images is an InputError naming it."""
    by_class: dict[int, int] = {}
    for label in labels:
        by_class[label] = by_class.get(label, 0) + 1
    need = sum(fixed) + 1
    wanted = ", ".join(f"{n} in {name}" for n, name in zip(fixed, names[1:], strict=True))
    for label, count in sorted(by_class.items()):
        if count < need:
            what = f"class {classes[label] or '(unlabelled)'!r}" if stratify else "the dataset"
            raise InputError(
                f"{what} has {count} image(s): --fixed {','.join(map(str, fixed))} needs at "
                f"least {need}: {wanted} and 1 in {names[0]}",
                "lower --fixed, or add images" + (" to that class" if stratify else ""),
            )
    members: dict[str, list[int]] = {}
    for index, name in enumerate(units):
        members.setdefault(name, []).append(index)
    strata: dict[int, list[tuple[bytes, str]]] = {}
    for name, indices in members.items():
        votes: dict[int, int] = {}
        for index in indices:
            votes[labels[index]] = votes.get(labels[index], 0) + 1
        label = min(votes, key=lambda lab: (-votes[lab], lab))  # majority, then smallest
        strata.setdefault(label, []).append((_unit_rank(seed, name), name))
    parts: list[list[int]] = [[] for _ in range(len(fixed) + 1)]
    for label in sorted(strata):
        ranked = [members[name] for _, name in sorted(strata[label])]
        total = sum(len(unit) for unit in ranked)
        targets = [total - sum(fixed), *fixed]
        filled = [0] * len(targets)
        for unit in ranked:
            part = max(range(len(targets)), key=lambda j: (targets[j] - filled[j], -j))
            parts[part].extend(unit)
            filled[part] += len(unit)
    return [sorted(part) for part in parts]


def oversample_repeats(
    labels: Sequence[int], split_of: Sequence[int], keys: Sequence[str], seed: int, classes: int
) -> tuple[list[tuple[int, int]], list[int]]:
    """([(file index, repeat number)], extra copies per class) that bring every class of the
    first split (train) up to its largest class: each class's files in their seeded order,
    round-robin, so no file is repeated twice before every other one is repeated once."""
    train: dict[int, list[int]] = {}
    for index, (label, part) in enumerate(zip(labels, split_of, strict=True)):
        if part == 0:
            train.setdefault(label, []).append(index)
    extra = [0] * classes
    if not train:
        return [], extra
    largest = max(len(files) for files in train.values())
    repeats: list[tuple[int, int]] = []
    for label in sorted(train):
        files = sorted(train[label], key=lambda i: _unit_rank(seed, keys[i]))
        extra[label] = largest - len(files)
        repeats += [(files[r % len(files)], r // len(files) + 1) for r in range(extra[label])]
    return repeats, extra


def _repeat_dest(dest: str, number: int, taken: set[str]) -> str:
    """`<split>/<class>/<stem>-repeat<k><suffix>` beside `dest`, not yet in `taken`."""
    folder, name = dest.rsplit("/", 1) if "/" in dest else ("", dest)
    stem, suffix = os.path.splitext(name)
    prefix = f"{folder}/" if folder else ""
    candidate, extra = f"{prefix}{stem}-repeat{number}{suffix}", 0
    while candidate.casefold() in taken:
        extra += 1
        candidate = f"{prefix}{stem}-repeat{number}-{extra}{suffix}"
    taken.add(candidate.casefold())
    return candidate


def _sample_keys(samples: Samples) -> list[str]:
    """Stable names for hashing: "/"-separated and Unicode-NFC, so macOS (NFD) and Linux agree."""
    return [unicodedata.normalize("NFC", i.replace(os.sep, "/")) for i in samples.ids]


def _destinations(samples: Samples, split_of: list[int], names: list[str], is_csv: bool):
    """OUT-relative destinations: <split>/<id> for folders (class folder and subfolders kept),
    <split>/<label>/<file name> for CSV indexes (made unique where names collide)."""
    if not is_csv:
        ids = samples.ids
        return [f"{names[s]}/{i.replace(os.sep, '/')}" for s, i in zip(split_of, ids, strict=True)]
    for name in samples.classes:
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise InputError(
                f"label {name!r} cannot be a folder name", "fix the label, or use --mode manifest"
            )
    taken: set[str] = set()
    dests = []
    for s, path, label in zip(split_of, samples.paths, samples.labels, strict=True):
        base = f"{names[s]}/{samples.classes[label]}/"
        stem, suffix = os.path.splitext(os.path.basename(path))
        candidate, n = base + stem + suffix, 0
        while candidate.casefold() in taken:  # casefold: also distinct on macOS/Windows
            n += 1
            candidate = f"{base}{stem}-{n}{suffix}"
        taken.add(candidate.casefold())
        dests.append(candidate)
    return dests


def _check_csv_sources(samples: Samples, source: Path) -> None:
    missing = [i for i, p in zip(samples.ids, samples.paths, strict=True) if not os.path.isfile(p)]
    if missing:
        raise InputError(
            f"{len(missing)} file(s) listed in {source} do not exist: {', '.join(missing[:3])}"
            + (" ..." if len(missing) > 3 else ""),
            "fix the paths (relative ones are relative to the CSV's folder)",
        )
    seen: dict[str, str] = {}
    for ident, path in zip(samples.ids, samples.paths, strict=True):
        real = os.path.normcase(os.path.abspath(path))
        if real in seen:
            raise InputError(
                f"{source} lists the same file twice: {seen[real]} and {ident}",
                "remove the repeated row, or it could land in two splits",
            )
        seen[real] = ident


# --------------------------------------------------------------------------- the output folder


def _read_journal(out: Path) -> dict | None:
    try:
        record = json.loads((out / JOURNAL).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read {out / JOURNAL}: {error}") from None
    if not isinstance(record, dict):
        raise InputError(f"cannot read {out / JOURNAL}: not a torchkit split journal")
    return record


def _write_journal(out: Path, record: dict) -> None:
    atomic_write_text(out / JOURNAL, json.dumps(record, indent=2) + "\n")


def _previous_split_names(out: Path) -> set[str]:
    """The split folders of the earlier split in OUT, as its split.csv names them."""
    try:
        with (out / MANIFEST).open(newline="", encoding="utf-8") as handle:
            names = {row.get("split") or "" for row in csv.DictReader(handle)}
    except (OSError, csv.Error, UnicodeDecodeError):
        return set()
    return {n for n in names if is_folder_name(n) and not n.startswith(RESERVED_PREFIX)}


def _known_files(out: Path) -> list[str]:
    """What an earlier split (one written before OUT carried torchkit's marker) holds: split.csv
    and the split folders it names. Without a split.csv nothing is known, so `--force` needs the
    marker: a bare `train/` may be anybody's."""
    if not (out / MANIFEST).is_file():
        return []
    return [MANIFEST, *(glob_escape(n) for n in sorted(_previous_split_names(out)))]


def glob_escape(name: str) -> str:
    """`name` as an fnmatch pattern that matches only itself."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def _discard_replaced(out: Path) -> None:
    """Delete the set-aside earlier split: renamed first (atomic), so that a kill half-way
    through the delete never leaves a half-deleted split that looks like one to put back."""
    aside, gone = out / _REPLACED, out / _DISCARDED
    if gone.is_dir():
        remove_tree(gone)
    if aside.is_dir():
        discard_tree(aside, gone)


def _put_back_replaced(out: Path) -> list[str]:
    """Put the set-aside earlier split back in place of a new one that did not finish (whatever
    a killed run left under those names is its own unfinished output)."""
    aside = out / _REPLACED
    if not aside.is_dir():
        return []
    names = sorted(os.listdir(aside))
    for name in names:
        remove_tree(out / name, ignore_errors=False)
        os.replace(aside / name, out / name)
    aside.rmdir()
    return names


def recover_split_leftovers(out: Path) -> None:
    """What a killed split left in OUT, with OUT's lock held: an earlier split still set aside
    is put back (a move that had started, with its journal written, had discarded it already),
    one being deleted is deleted."""
    if (out / _DISCARDED).exists():
        remove_tree(out / _DISCARDED)
    if (out / _REPLACED).is_dir():
        journal = _read_journal(out)
        if journal is not None and journal.get("mode") == "move":
            _discard_replaced(out)  # killed after the move's plan was written: it is finished
        else:
            names = _put_back_replaced(out)
            log.warning(
                f"put back the earlier split in {out} ({', '.join(names)}), which a killed "
                "torchkit split had set aside"
            )


class _SplitOutput:
    """OUT while one split writes it: made and marked, the earlier split set aside, and on
    failure everything this run wrote removed and the earlier split put back."""

    def __init__(self, out: Path, doomed: list[str]) -> None:
        self.out = out
        self.doomed = doomed
        self.existed = out.is_dir()
        self.marked = False
        self.created: list[str] = []  # names this run writes at the top of OUT

    def begin(self, names: list[str], mode: str) -> None:
        # Everything this run may write at the top of OUT (the journal only exists for a move,
        # and an earlier move's journal never gets this far): removed again by abandon().
        self.created = [*names, MANIFEST] + ([JOURNAL] if mode == "move" else [])
        with reporting_write_errors(self.out):
            self.out.mkdir(parents=True, exist_ok=True)
            if not (self.out / MARKER).exists():
                write_marker(self.out, "split")
                self.marked = True
            present = [n for n in self.doomed if os.path.lexists(self.out / n)]
            if present:
                (self.out / _REPLACED).mkdir()
                for name in present:
                    os.replace(self.out / name, self.out / _REPLACED / name)

    def keep(self) -> None:
        with reporting_write_errors(self.out):
            _discard_replaced(self.out)

    def abandon(self) -> None:
        for name in self.created:
            remove_tree(self.out / name, ignore_errors=False)
        _put_back_replaced(self.out)
        if self.marked:
            remove_marker(self.out)
        if not self.existed:
            with contextlib.suppress(OSError):
                self.out.rmdir()


def check_report_file(
    output: str | os.PathLike,
    force: bool,
    source: str | os.PathLike,
    out: str | os.PathLike,
    names: Sequence[str] | None = None,
) -> None:
    """Check the `-o FILE` report of a split before any work: not the dataset nor inside it (the
    output-safety rules), and not OUT nor a file the split writes there (split.csv, its own
    `.torchkit*` files, anything inside a split folder: in move mode the only copies). A file
    of your own beside the split is fine."""
    check_output_file(output, force, data_inputs(source), what="output")
    if str(output).startswith(("/dev/", "/proc/")):
        return
    inside = os.path.relpath(os.path.realpath(output), os.path.realpath(out))
    if inside == os.pardir or inside.startswith(os.pardir + os.sep):
        return
    first = inside.split(os.sep)[0].casefold()
    split_folders = {n.casefold() for n in (names or SPLIT_NAMES)}
    ours = first in split_folders | {MANIFEST} or first.startswith(RESERVED_PREFIX)
    if inside != "." and not ours:
        return
    raise OutputOverlapError(
        f"output {output} is "
        + ("the output folder" if inside == "." else "a file the split writes in")
        + f" {out}",
        "choose another output file",
    )


# --------------------------------------------------------------------------- file operations


def _relative_to(sources: list[str], out: Path) -> list[str]:
    """The sources as "/"-separated paths relative to OUT (absolute on another Windows drive)."""
    out_real = os.path.abspath(out)
    relative_dirs: dict[str, str] = {}  # relpath is slow; the sources share a few folders
    paths = []
    for source in sources:
        folder, name = os.path.split(source)
        relative = relative_dirs.get(folder)
        if relative is None:
            try:
                relative = os.path.relpath(folder, out_real).replace(os.sep, "/")
            except ValueError:
                relative = folder.replace(os.sep, "/")
            relative_dirs[folder] = relative
        paths.append(f"{relative}/{name}")
    return paths


def _write_manifest(out: Path, plan: _Plan, names: list[str], mode: str) -> None:
    """OUT/split.csv: path (relative to OUT, so the file works as a CSV index), label, split,
    source (absolute); and `repeat` (0 for a file, k for its k-th extra copy) when the train
    classes were oversampled."""
    paths = plan.dests if mode != "manifest" else _relative_to(plan.sources, out)
    split_names = [names[j] for j in plan.splits]
    columns = [paths, plan.labels, split_names, plan.sources]
    header = ["path", "label", "split", "source"]
    if plan.repeats is not None:
        columns.append(plan.repeats)
        header.append("repeat")
    with atomic_write(out / MANIFEST, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(zip(*columns, strict=True))


def _add_repeats(plan: _Plan, repeats: list[tuple[int, int]], mode: str) -> None:
    """Append --oversample's repeats to the plan: the same source and label in the first
    split, under a name of its own (none in a manifest: the row is repeated)."""
    plan.repeats = [0] * len(plan.sources)
    taken = {d.casefold() for d in plan.dests}
    for index, number in repeats:
        plan.sources.append(plan.sources[index])
        plan.labels.append(plan.labels[index])
        plan.splits.append(plan.splits[index])
        plan.repeats.append(number)
        if mode != "manifest":
            plan.dests.append(_repeat_dest(plan.dests[index], number, taken))


def _file_digest(path: str | os.PathLike) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.digest()


@contextlib.contextmanager
def _signals_deferred():
    """SIGINT and SIGTERM wait until the block is done (then raise as usual): for the few steps
    that leave a file in two places if they are cut short."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "pthread_sigmask"
    ):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class LinkTargets:
    """Where a moved symbolic link must point so that it keeps pointing at the same file.

    A link to a file that the same move moves points to that file's new place, as a relative
    link inside OUT (so OUT can itself be moved later). Any other relative link is rewritten as
    an absolute one (not re-relativised: an absolute link survives OUT being moved too): the
    system reads a relative target from the link's own folder, so the real path of the folder
    that target text names (its `..` resolved after symbolic links, as the system does),
    followed by its last name, is the very same file from anywhere, and no longer depends on
    ROOT's folders, which are empty after the move. The last name is not resolved, so a link
    to a link stays one. An absolute link keeps its text."""

    def __init__(self, sources: Sequence[str], targets: Sequence[str]) -> None:
        self._pairs = (sources, targets)
        self._moved_to: dict[str, str] | None = None  # built on the first link only

    def _moved(self) -> dict[str, str]:
        if self._moved_to is None:
            sources, targets = self._pairs
            real_dirs: dict[str, str] = {}  # the files share a few folders: resolve those once
            self._moved_to = {}
            for source, target in zip(sources, targets, strict=True):
                if os.path.islink(source):
                    continue
                folder, name = os.path.split(source)
                if folder not in real_dirs:
                    real_dirs[folder] = os.path.realpath(folder)
                # Already moved or not, a file that is no link is at its folder's real path.
                self._moved_to[os.path.join(real_dirs[folder], name)] = target
        return self._moved_to

    def __call__(self, link: str, dest: str) -> str:
        text = os.readlink(link)
        moved_to = self._moved().get(os.path.realpath(link))
        if moved_to is not None:
            return os.path.relpath(moved_to, os.path.dirname(dest))
        if os.path.isabs(text):
            return text
        folder, name = os.path.split(os.path.join(os.path.dirname(link), text))
        return os.path.join(os.path.realpath(folder), name)


def move_file(source: str, dest: str, links: LinkTargets | None = None) -> None:
    """Move one file so that it is never lost: a rename where possible (atomic: the file is in
    exactly one place at every moment); across filesystems a copy to a temporary name beside
    `dest`, flushed to disk and compared byte for byte (SHA-256) with the source, renamed into
    place, and only then is the source removed.

    A symbolic link is not renamed (a relative one would point elsewhere from its new folder):
    a new link with the target `links` gives (see `LinkTargets`; the same target, absolute,
    without it) is made beside `dest`, renamed into place, and the old link removed."""
    if os.path.lexists(dest):
        raise OutputExistsError(f"{dest} already exists", "it would be overwritten by the move")
    folder, name = os.path.split(dest)
    temporary = os.path.join(folder, f"{_MOVE_TEMP}{name}")
    if os.path.islink(source):
        target = (links or LinkTargets((), ()))(source, dest)
        if os.path.lexists(temporary):
            os.unlink(temporary)
        os.symlink(target, temporary)
        with _signals_deferred():  # never the link in both places, nor in none
            os.replace(temporary, dest)
            os.unlink(source)
        return
    size = os.stat(source).st_size
    try:
        os.rename(source, dest)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
    else:
        if os.lstat(dest).st_size != size:  # a rename cannot change a file; checked anyway
            raise InputError(f"{dest} does not match {source} after the move")
        return
    shutil.copy2(source, temporary)
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    if os.stat(temporary).st_size != size or _file_digest(temporary) != _file_digest(source):
        os.unlink(temporary)
        raise InputError(f"the copy of {source} in {folder} differs from it; the source is kept")
    with _signals_deferred():
        os.replace(temporary, dest)
        os.unlink(source)


def _copy_all(sources: list[str], targets: list[str], progress: Progress | None) -> None:
    from concurrent.futures import ThreadPoolExecutor

    total = len(sources)
    # Copies wait on the disk, not the CPU: a few threads keep it busy.
    pool = ThreadPoolExecutor(_COPY_THREADS)
    try:
        for done, _ in enumerate(pool.map(shutil.copy2, sources, targets), 1):
            if progress and (done % 256 == 0 or done == total):
                progress(done, total)
    finally:
        # On an error, Ctrl-C or SIGTERM the copies not started yet are dropped, not made.
        pool.shutdown(wait=True, cancel_futures=True)


def _check_hardlinks(plan: _Plan, out: Path) -> None:
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    out_device = os.stat(existing).st_dev
    if any(os.stat(s).st_dev != out_device for s in plan.sources):
        raise UsageError(
            "--mode hardlink needs ROOT and OUT on the same filesystem",
            "use --mode symlink or --mode copy",
        )


def _place_files(plan: _Plan, out: Path, mode: str, progress: Progress | None) -> None:
    total = len(plan.sources)
    for folder in sorted({os.path.dirname(d) for d in plan.dests}):
        (out / folder).mkdir(parents=True, exist_ok=True)
    targets = [os.path.join(out, d) for d in plan.dests]
    if mode == "copy":
        _copy_all(plan.sources, targets, progress)
        return
    links = LinkTargets(plan.sources, targets)
    operation: Callable[[str, str], Any] = {
        "symlink": lambda s, d: os.symlink(s, d),
        "hardlink": os.link,
        "move": lambda s, d: move_file(s, d, links=links),
    }[mode]
    for done, (source, target) in enumerate(zip(plan.sources, targets, strict=True), 1):
        operation(source, target)
        if progress and (done % 256 == 0 or done == total):
            progress(done, total)


# --------------------------------------------------------------------------- the command


def split_dataset(
    source: str | os.PathLike,
    out: str | os.PathLike,
    *,
    ratio: str | Sequence[float] | None = None,
    names: Sequence[str] | None = None,
    seed: int = 0,
    stratify: bool = True,
    group: str | None = None,
    mode: str = "copy",
    force: bool = False,
    progress: Progress | None = None,
    dedup: bool = True,
    fixed: str | Sequence[int] | None = None,
    oversample: bool = False,
) -> SplitResult:
    """Split the image folder, flat folder or CSV index `source` into `out`/<split>/... (data
    that is split already is refused: see `load_split_input`).

    `ratio` (8:1:1 by default) or `fixed` (`N[,M]` images per class in val[, test], the rest in
    train) sets the sizes; `dedup` keeps byte-identical files in one split; `oversample`
    balances train's classes by repeating images (not with `mode="move"`).

    See the module docstring. Raises UsageError for bad options, InputError for bad input,
    OutputOverlapError for an OUT that is, holds or lies inside the dataset (or is `.`),
    OutputExistsError for a non-empty `out` without `force` (or, with it, one that is not an
    earlier split) and OutputLockedError while another process writes `out`.
    """
    if mode not in SPLIT_MODES:
        raise UsageError(f"unknown --mode {mode!r}", "use one of: " + ", ".join(SPLIT_MODES))
    if fixed is not None and ratio is not None:
        raise UsageError("--fixed and --ratio both set the sizes of the splits", "give one of them")
    if oversample and mode == "move":
        raise UsageError(
            "--oversample cannot --mode move: the repeats need the files where they are",
            "use --mode copy, symlink, hardlink or manifest",
        )
    counts = None if fixed is None else parse_fixed(fixed)
    fractions = None if counts is not None else parse_ratio("8:1:1" if ratio is None else ratio)
    parts = len(counts) + 1 if counts is not None else len(fractions)
    names = check_names(SPLIT_NAMES[:parts] if names is None else names, parts)
    options = _Options(fractions, counts, names, seed, stratify, group, mode, dedup, oversample)
    out = Path(out)
    inputs = data_inputs(source)
    # Before anything else, even the journal: OUT is never the dataset, in it or around it.
    check_not_protected(out, WHAT)
    check_overlap(out, WHAT, inputs)
    journal = _read_journal(out) if out.is_dir() else None
    if journal is not None and journal.get("state") == "moving":
        with OutputFolder(out, command="split", inputs=inputs, what=WHAT, resume=True):
            journal = _read_journal(out)  # under the lock: another run may have finished it
            if journal is not None and journal.get("state") == "moving":
                return _resume_move(source, out, journal, mode, progress)
    if journal is not None and journal.get("mode") == "move":
        if mode == "move" and _same_move(journal, source, options):
            return _move_result(source, out, journal, already_done=True)
        raise OutputExistsError(
            f"{out} holds files moved there from {journal.get('root')}: the only copies",
            "move them elsewhere first, or choose another output folder",
        )

    # The lock first (and what a killed split left put back), then the --force rules.
    with OutputFolder(out, command="split", inputs=inputs, what=WHAT, resume=True):
        recover_split_leftovers(out)
        check_replaceable(
            out,
            force,
            what=WHAT,
            known_files=_known_files(out),
            hint="pass --force to replace the split in it",
        )
        return _split_into(source, out, options, progress)


def load_split_input(source: str | os.PathLike) -> tuple[Samples, list[str], bool]:
    """(samples, non-image files left out, whether it is a CSV index) of the data to split:
    an image folder, a flat folder or a CSV index, read by `core.datasource`. Data that is
    split already (a split root, a CSV with a split column, digits) is refused."""
    from torchkit.core.data.sources import non_image_files, open_data
    from torchkit.core.data.stored_image import is_stored

    data = open_data(source, allow_unlabelled=True)
    if data.is_split:
        hint = (
            f"split one of its parts (e.g. {Path(data.spec) / 'train'}), or the data it came from"
            if data.kind == "split root"
            else "give the data it came from"
            + (", or drop the CSV's split column" if data.kind == "split csv" else "")
        )
        raise InputError(f"{data.describe()} is split already", hint)
    if data.whole.paths and is_stored(data.whole.paths[0]):
        # Its images lie inside container files: there are no files to copy, link or name.
        raise InputError(
            f"{data.describe()} holds its images in container files, not as image files",
            "train holds a validation split out itself (--val-split), recorded in RUN/split.csv",
        )
    return data.whole, non_image_files(data), data.kind == "csv"


@dataclass
class _Options:
    fractions: list[Fraction] | None  # --ratio, or None with --fixed
    fixed: list[int] | None
    names: list[str]
    seed: int
    stratify: bool
    group: str | None
    mode: str
    dedup: bool
    oversample: bool

    @property
    def ratio(self) -> list[float] | None:
        return None if self.fractions is None else [float(f) for f in self.fractions]


def _split_into(source, out: Path, options: _Options, progress) -> SplitResult:
    names, seed, stratify = options.names, options.seed, options.stratify
    group, mode = options.group, options.mode
    samples, non_images, is_csv = load_split_input(source)
    root = Path(source)
    if non_images:
        log.warning(f"skipped {len(non_images)} non-image file(s), e.g. {non_images[0]}")
    empty = [n for n, c in zip(samples.classes, samples.class_counts(), strict=True) if not c]
    if empty:
        log.warning(f"class folder(s) with no images are left out: {', '.join(empty[:10])}")
    if is_csv:
        _check_csv_sources(samples, root)
        sources = [os.path.abspath(p) for p in samples.paths]
    else:  # ids are relative to ROOT: one abspath instead of 100,000
        base = os.path.abspath(root) + os.sep
        sources = [base + i for i in samples.ids]
        if mode == "move":
            _refuse_linked_folders(sources, root)
    keys = _sample_keys(samples)
    groups, n_groups = group_names(samples, keys, group) if group else (None, None)
    units, dedup_groups, dedup_files = (
        dedup_units(sources, keys, groups) if options.dedup else (groups, 0, 0)
    )
    labels = samples.labels if stratify else [0] * len(samples)
    if options.fixed is not None:
        parts = fixed_split(
            labels, options.fixed, seed, units or keys, samples.classes, names, stratify
        )
    else:
        parts = stratified_split(
            labels, options.fractions, seed, keys=keys, groups=units, at_least_one=True
        )
    split_of = [0] * len(samples)
    for j, members in enumerate(parts):
        for index in members:
            split_of[index] = j
    counts = [[0] * len(names) for _ in samples.classes]
    for label, j in zip(samples.labels, split_of, strict=True):
        counts[label][j] += 1
    if options.fixed is None:
        _warn_small(samples.classes, counts, names, stratify)

    plan = _Plan(
        sources=sources,
        labels=[samples.classes[label] for label in samples.labels],
        dests=[] if mode == "manifest" else _destinations(samples, split_of, names, is_csv),
        splits=split_of,
    )
    extra = None
    if options.oversample:
        repeats, extra = oversample_repeats(
            samples.labels, split_of, keys, seed, len(samples.classes)
        )
        _add_repeats(plan, repeats, mode)
    if mode == "hardlink":
        _check_hardlinks(plan, out)
    totals = [sum(row[j] for row in counts) for j in range(len(names))]
    result = SplitResult(
        source=str(root),
        out=str(out),
        mode=mode,
        names=names,
        ratio=options.ratio or [t / max(1, sum(totals)) for t in totals],
        seed=seed,
        stratified=stratify,
        group=group,
        groups=n_groups,
        classes=list(samples.classes),
        counts=counts,
        manifest=str(out / MANIFEST),
        dedup=options.dedup,
        dedup_groups=dedup_groups,
        dedup_files=dedup_files,
        fixed=options.fixed,
        repeats=extra,
    )

    writing = _SplitOutput(out, sorted(set(names) | _previous_split_names(out) | {MANIFEST}))
    try:
        writing.begin(names, mode)
        if mode == "move":
            # The plan goes to disk before the first file moves: an interrupted move can be
            # finished, so from here on nothing is undone; the earlier split is discarded.
            _write_manifest(out, plan, names, mode)
            record = {
                "state": "moving",
                "mode": "move",
                "root": os.path.realpath(root),
                "names": names,
                "ratio": result.ratio,
                "fixed": options.fixed,
                "seed": seed,
                "stratified": stratify,
                "group": group,
                "groups": n_groups,
                "dedup": options.dedup,
                "dedup_groups": dedup_groups,
                "dedup_files": dedup_files,
                "classes": list(samples.classes),
                "counts": counts,
                "torchkit_version": __version__,
            }
            _write_journal(out, record)
    except BaseException:
        writing.abandon()
        raise
    if mode == "move":
        writing.keep()
        with _finish_hint(root, out), reporting_write_errors(out):
            _place_files(plan, out, mode, progress)
            _write_journal(out, record | {"state": "done"})
        return result
    try:
        with reporting_write_errors(out):
            if mode != "manifest":
                _place_files(plan, out, mode, progress)
            _write_manifest(out, plan, names, mode)
    except BaseException:
        writing.abandon()
        raise
    writing.keep()
    if progress and mode == "manifest":
        progress(len(samples), len(samples))
    return result


def _refuse_linked_folders(sources: list[str], root: Path) -> None:
    """--mode move takes only what lies in ROOT: a folder of ROOT that is a symbolic link to
    one elsewhere (`ROOT/bird -> /data/birds`) would have that folder emptied. (A linked file
    is moved as the link it is.)"""
    real_root = os.path.realpath(root)
    for folder in sorted({os.path.dirname(source) for source in sources}):
        real = os.path.realpath(folder)
        if os.path.commonpath([real, real_root]) != real_root:
            raise UsageError(
                f"--mode move would empty {real}, outside {root}: {folder} leads there "
                "through a symbolic link",
                "use --mode copy, symlink or hardlink, or put the folder itself in ROOT",
            )


def _warn_small(classes: list[str], counts: list[list[int]], names: list[str], stratify: bool):
    if not stratify:
        totals = [sum(row[j] for row in counts) for j in range(len(names))]
        empty = [n for n, t in zip(names, totals, strict=True) if not t]
        if empty:
            log.warning(f"too few files: split(s) {', '.join(empty)} are empty")
        return
    short = [
        f"{name or '(unlabelled)'} ({sum(row)}: none in "
        + "/".join(n for n, c in zip(names, row, strict=True) if not c)
        + ")"
        for name, row in zip(classes, counts, strict=True)
        if sum(row) and not all(row)
    ]
    if short:
        log.warning(
            f"{len(short)} class(es) have too few images for every split: {', '.join(short[:5])}"
            + (" ..." if len(short) > 5 else "")
        )


@contextlib.contextmanager
def _finish_hint(root: Path, out: Path):
    """A move that stops half-way (an error, Ctrl-C, SIGTERM) says how to finish it."""
    try:
        yield
    except BaseException:
        log.warning(
            f"the move into {out} stopped half-way: every file is in {root} or in {out}; "
            f"finish it with: torchkit split {root} {out} --mode move"
        )
        raise


def _same_move(journal: dict, source, options: _Options) -> bool:
    """Is this command line the one that made the (finished) move recorded in `journal`?
    (A journal older than --fixed and dedup groups had neither: it matches the defaults.)"""
    return (
        journal.get("root") == os.path.realpath(source)
        and journal.get("names") == list(options.names)
        and journal.get("fixed") == options.fixed
        and (options.fixed is not None or journal.get("ratio") == options.ratio)
        and journal.get("seed") == options.seed
        and journal.get("stratified") == options.stratify
        and journal.get("group") == options.group
        and journal.get("dedup", options.dedup) == options.dedup
    )


def _plan_rows(out: Path) -> list[dict[str, str]]:
    try:
        with (out / MANIFEST).open(newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))
    except (OSError, csv.Error, UnicodeDecodeError) as error:
        raise InputError(f"cannot read the plan {out / MANIFEST}: {error}") from None


def _move_result(
    source, out: Path, journal: dict, *, rows=None, resumed=False, already_done=False
) -> SplitResult:
    """The summary of the move recorded in `journal`: what the first run reported."""
    names = list(journal["names"])
    classes, counts = journal.get("classes"), journal.get("counts")
    if classes is None or counts is None:  # a journal of torchkit 0.x: count the plan
        rows = _plan_rows(out) if rows is None else rows
        classes = sorted({row["label"] for row in rows})
        index = {name: i for i, name in enumerate(classes)}
        counts = [[0] * len(names) for _ in classes]
        for row in rows:
            counts[index[row["label"]]][names.index(row["split"])] += 1
    return SplitResult(
        source=str(source),
        out=str(out),
        mode="move",
        names=names,
        ratio=list(journal["ratio"]),
        seed=int(journal["seed"]),
        stratified=bool(journal["stratified"]),
        group=journal.get("group"),
        groups=journal.get("groups"),
        classes=list(classes),
        counts=[list(row) for row in counts],
        manifest=str(out / MANIFEST),
        resumed=resumed,
        already_done=already_done,
        dedup=bool(journal.get("dedup", False)),
        dedup_groups=int(journal.get("dedup_groups") or 0),
        dedup_files=int(journal.get("dedup_files") or 0),
        fixed=journal.get("fixed"),
    )


def _resume_move(
    source: str | os.PathLike, out: Path, journal: dict, mode: str, progress: Progress | None
) -> SplitResult:
    """Finish a move that was interrupted, following the plan in OUT/split.csv."""
    root = Path(source)
    if mode != "move" or journal.get("root") != os.path.realpath(root):
        raise UsageError(
            f"{out} holds an unfinished move from {journal.get('root')}",
            f"finish it with: torchkit split {journal.get('root')} {out} --mode move",
        )
    log.warning(f"finishing the interrupted move into {out} (its recorded plan is used)")
    rows = _plan_rows(out)
    with reporting_write_errors(out):
        _discard_replaced(out)  # killed before it was discarded: the move had started
        for row in rows:
            target = os.path.join(out, row["path"])
            stale = os.path.join(os.path.dirname(target), _MOVE_TEMP + os.path.basename(target))
            if os.path.lexists(stale):  # an unverified copy: the source is still there
                os.unlink(stale)
    sources = [row["source"] for row in rows]
    targets = [os.path.join(out, row["path"]) for row in rows]
    links = LinkTargets(sources, targets)
    with _finish_hint(root, out):
        _finish_rows(sources, targets, out, links, progress)
    _write_journal(out, journal | {"state": "done"})
    return _move_result(root, out, journal, rows=rows, resumed=True)


def _finish_rows(sources, targets, out: Path, links: LinkTargets, progress) -> None:
    for done, (source_file, target) in enumerate(zip(sources, targets, strict=True), 1):
        have_source, have_target = os.path.lexists(source_file), os.path.lexists(target)
        if have_source and not have_target:
            with reporting_write_errors(out):
                os.makedirs(os.path.dirname(target), exist_ok=True)
            move_file(source_file, target, links=links)
        elif have_source and have_target:  # stopped between the copy and removing the source
            if not _same_file(source_file, target):
                raise InputError(
                    f"{source_file} and {target} both exist and differ", "compare them by hand"
                )
            os.unlink(source_file)
        elif not have_target:
            raise InputError(f"{target} is neither in {out} nor at {source_file}")
        if progress:
            progress(done, len(sources))


def _same_file(source: str, target: str) -> bool:
    """A source that is still there beside its moved copy: the same bytes (for a link, the
    same file it points to; one that points nowhere is a link the move had made already)."""
    if os.path.islink(source) != os.path.islink(target):
        return False  # e.g. a link to the source: removing the source would lose it
    if os.path.islink(source):
        try:
            return os.path.samestat(os.stat(source), os.stat(target))
        except OSError:
            return True
    return _file_digest(source) == _file_digest(target)
