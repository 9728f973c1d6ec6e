"""`split`: a stratified, seeded train/val/test split of an image dataset.

The assignment is decided by names alone: each file (or `--group`) is ranked by a SHA-256 of
(seed, its path relative to ROOT), so the split is the same on every machine and run whatever
order the filesystem lists files in. Counts per class are allocated by largest remainder (19
files at 8:1:1 give 15/2/2), with at least one file of a class in every split when it has enough.

Files are copied, linked or moved into OUT/<split>/<class>/..., or only listed (`manifest`); every
mode writes OUT/split.csv (path, label, split, source). `move` is safe against a crash: the plan
is written first, each file is renamed (atomic) or copied, verified and only then removed, and
rerunning the same command finishes an interrupted move.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from torchkit import __version__
from torchkit.core.data import SPLIT_NAMES, Samples, scan_image_set, stratified_split
from torchkit.core.errors import InputError, OutputExistsError, UsageError
from torchkit.core.files import atomic_write, atomic_write_text
from torchkit.core.progress import Progress

log = logging.getLogger("torchkit")

SPLIT_MODES = ("copy", "symlink", "hardlink", "move", "manifest")
MANIFEST = "split.csv"
JOURNAL = ".torchkit-split.json"  # move mode only: the record that OUT holds the only copies
_MOVE_TEMP = ".torchkit-move-"  # prefix of a cross-device copy that is not verified yet
_COPY_THREADS = 8


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

    @property
    def totals(self) -> list[int]:
        return [sum(row[j] for row in self.counts) for j in range(len(self.names))]

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
            "files": sum(self.totals),
            "splits": dict(zip(self.names, self.totals, strict=True)),
            "classes": [
                {"name": name, **dict(zip(self.names, row, strict=True)), "total": sum(row)}
                for name, row in zip(self.classes, self.counts, strict=True)
            ],
            "manifest": self.manifest,
            "resumed": self.resumed,
        }


# --------------------------------------------------------------------------- options


def parse_ratio(text: str | Sequence[float]) -> list[Fraction]:
    """`8:1:1`, `0.7,0.3`, `70:20:10`...: two or three positive parts, as exact fractions of 1.

    Parts that add up to 1 are fractions; otherwise they are proportions, each at least 1 (so a
    mistyped `0.7,0.2` is an error, not a silent 78/22 split).
    """
    raw = [str(p) for p in text] if not isinstance(text, str) else re.split(r"[:,]", text)
    hint = "write it like 8:1:1 or 0.7,0.3 (two or three parts)"
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


def check_names(names: Sequence[str], parts: int) -> list[str]:
    names = [n.strip() for n in names]
    if len(names) != parts:
        raise UsageError(
            f"--names gives {len(names)} split name(s) for a {parts}-part --ratio",
            "give one name per part, e.g. --names train,val,test",
        )
    for name in names:
        if not name or name in (".", "..") or "/" in name or "\\" in name or name == MANIFEST:
            raise UsageError(f"{name!r} cannot be a split folder name", "use names like train")
    if len({n.casefold() for n in names}) != len(names):
        raise UsageError(f"split names must differ: {', '.join(names)}", "e.g. train,val,test")
    return names


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


def _is_within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


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
        return json.loads((out / JOURNAL).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read {out / JOURNAL}: {error}") from None


def _write_journal(out: Path, record: dict) -> None:
    atomic_write_text(out / JOURNAL, json.dumps(record, indent=2) + "\n")


def _previous_split_names(out: Path) -> set[str]:
    try:
        with (out / MANIFEST).open(newline="", encoding="utf-8") as handle:
            return {row.get("split") or "" for row in csv.DictReader(handle)}
    except (OSError, csv.Error, UnicodeDecodeError):
        return set()


def _check_out(out: Path, force: bool, journal: dict | None) -> None:
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"output folder is a file: {out}", "choose a folder")
    if not (out.is_dir() and any(out.iterdir())):
        return
    if not force:
        raise OutputExistsError(
            f"output folder is not empty: {out}", "pass --force to replace the split in it"
        )
    if journal is not None and journal.get("mode") == "move":
        raise OutputExistsError(
            f"{out} holds files moved there from {journal.get('root')}: the only copies",
            "move them elsewhere first, or choose another output folder",
        )


def _prepare_out(out: Path, names: list[str], force: bool, protected: list[str]) -> None:
    """Make OUT ready: it must be empty, or (with `force`) an earlier split in it is removed:
    its split folders and split.csv only, never other files, and never the only copies left by
    an earlier `--mode move`. `protected` are real paths (the inputs) that must survive."""
    _check_out(out, force, _read_journal(out) if out.is_dir() else None)
    if out.is_dir() and any(out.iterdir()):
        doomed = [
            out / name
            for name in sorted(set(names) | _previous_split_names(out))
            if name and name not in (".", "..") and "/" not in name and "\\" not in name
        ]
        for folder in doomed:
            real = os.path.realpath(folder)
            if any(_is_within(p, real) for p in protected):
                raise UsageError(
                    f"--force would delete {folder}, which holds the input",
                    "choose another output folder",
                )
        for folder in doomed:
            if folder.is_symlink() or folder.is_file():
                folder.unlink()
            elif folder.is_dir():
                shutil.rmtree(folder)
        (out / MANIFEST).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


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
    source (absolute)."""
    paths = plan.dests if mode != "manifest" else _relative_to(plan.sources, out)
    split_names = [names[j] for j in plan.splits]
    with atomic_write(out / MANIFEST, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["path", "label", "split", "source"])
        writer.writerows(zip(paths, plan.labels, split_names, plan.sources, strict=True))


# --------------------------------------------------------------------------- file operations


def _file_digest(path: str | os.PathLike) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.digest()


def move_file(source: str, dest: str) -> None:
    """Move one file so that it is never lost: a rename where possible (atomic: the file is in
    exactly one place at every moment); across filesystems a copy to a temporary name beside
    `dest`, flushed to disk and compared byte for byte (SHA-256) with the source, renamed into
    place, and only then is the source removed."""
    if os.path.lexists(dest):
        raise OutputExistsError(f"{dest} already exists", "it would be overwritten by the move")
    size = os.stat(source).st_size
    try:
        os.rename(source, dest)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
    else:
        if os.stat(dest).st_size != size:  # a rename cannot change a file; checked anyway
            raise InputError(f"{dest} does not match {source} after the move")
        return
    folder, name = os.path.split(dest)
    temporary = os.path.join(folder, f"{_MOVE_TEMP}{name}")
    shutil.copy2(source, temporary)
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    if os.stat(temporary).st_size != size or _file_digest(temporary) != _file_digest(source):
        os.unlink(temporary)
        raise InputError(f"the copy of {source} in {folder} differs from it; the source is kept")
    os.replace(temporary, dest)
    os.unlink(source)


def _place_files(plan: _Plan, out: Path, mode: str, progress: Progress | None) -> None:
    total = len(plan.sources)
    for folder in sorted({os.path.dirname(d) for d in plan.dests}):
        (out / folder).mkdir(parents=True, exist_ok=True)
    targets = [os.path.join(out, d) for d in plan.dests]
    if mode == "copy":
        from concurrent.futures import ThreadPoolExecutor

        # Copies wait on the disk, not the CPU: a few threads keep it busy.
        with ThreadPoolExecutor(_COPY_THREADS) as pool:
            for done, _ in enumerate(pool.map(shutil.copy2, plan.sources, targets), 1):
                if progress and (done % 256 == 0 or done == total):
                    progress(done, total)
        return
    if mode == "hardlink":
        out_device = os.stat(out).st_dev
        if any(os.stat(s).st_dev != out_device for s in plan.sources):
            raise UsageError(
                "--mode hardlink needs ROOT and OUT on the same filesystem",
                "use --mode symlink or --mode copy",
            )
    operation: Callable[[str, str], Any] = {
        "symlink": lambda s, d: os.symlink(s, d),
        "hardlink": os.link,
        "move": move_file,
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
    ratio: str | Sequence[float] = "8:1:1",
    names: Sequence[str] | None = None,
    seed: int = 0,
    stratify: bool = True,
    group: str | None = None,
    mode: str = "copy",
    force: bool = False,
    progress: Progress | None = None,
) -> SplitResult:
    """Split the image folder, flat folder or CSV index `source` into `out`/<split>/...

    See the module docstring. Raises UsageError for bad options, InputError for bad input and
    OutputExistsError for a non-empty `out` without `force`.
    """
    if mode not in SPLIT_MODES:
        raise UsageError(f"unknown --mode {mode!r}", "use one of: " + ", ".join(SPLIT_MODES))
    fractions = parse_ratio(ratio)
    names = check_names(SPLIT_NAMES[: len(fractions)] if names is None else names, len(fractions))
    out = Path(out)
    journal = _read_journal(out) if out.is_dir() else None
    if journal is not None and journal.get("state") == "moving":
        return _resume_move(source, out, journal, mode, progress)
    _check_out(out, force, journal)  # before the scan, not after it

    samples, non_images = scan_image_set(source)
    root = Path(source)
    is_csv = root.is_file()
    if non_images:
        log.warning(f"skipped {len(non_images)} non-image file(s), e.g. {non_images[0]}")
    empty = [n for n, c in zip(samples.classes, samples.class_counts(), strict=True) if not c]
    if empty:
        log.warning(f"class folder(s) with no images are left out: {', '.join(empty[:10])}")
    if is_csv:
        _check_csv_sources(samples, root)
    root_real = os.path.realpath(root.parent if is_csv else root)
    out_real = os.path.realpath(out)
    if not is_csv and _is_within(out_real, root_real):
        raise UsageError(
            f"the output folder {out} is inside the dataset {root}",
            "choose an output folder outside it",
        )

    keys = _sample_keys(samples)
    groups, n_groups = group_names(samples, keys, group) if group else (None, None)
    labels = samples.labels if stratify else [0] * len(samples)
    parts = stratified_split(labels, fractions, seed, keys=keys, groups=groups, at_least_one=True)
    split_of = [0] * len(samples)
    for j, members in enumerate(parts):
        for index in members:
            split_of[index] = j
    counts = [[0] * len(names) for _ in samples.classes]
    for label, j in zip(samples.labels, split_of, strict=True):
        counts[label][j] += 1
    _warn_small(samples.classes, counts, names, stratify)

    if is_csv:
        sources = [os.path.abspath(p) for p in samples.paths]
    else:  # ids are relative to ROOT: one abspath instead of 100,000
        base = os.path.abspath(root) + os.sep
        sources = [base + i for i in samples.ids]
    plan = _Plan(
        sources=sources,
        labels=[samples.classes[label] for label in samples.labels],
        dests=[] if mode == "manifest" else _destinations(samples, split_of, names, is_csv),
        splits=split_of,
    )
    protected = [root_real] + ([os.path.realpath(p) for p in sources] if is_csv else [])
    _prepare_out(out, names, force, protected)
    if mode == "move":
        # The plan goes to disk before the first file moves: an interrupted move can be finished.
        _write_manifest(out, plan, names, mode)
        record = {
            "state": "moving",
            "mode": "move",
            "root": os.path.realpath(root),
            "names": names,
            "ratio": [float(f) for f in fractions],
            "seed": seed,
            "stratified": stratify,
            "group": group,
            "torchkit_version": __version__,
        }
        _write_journal(out, record)
        _place_files(plan, out, mode, progress)
        _write_journal(out, record | {"state": "done"})
    else:
        if mode != "manifest":
            _place_files(plan, out, mode, progress)
        _write_manifest(out, plan, names, mode)
    if progress and mode == "manifest":
        progress(len(samples), len(samples))
    return SplitResult(
        source=str(root),
        out=str(out),
        mode=mode,
        names=names,
        ratio=[float(f) for f in fractions],
        seed=seed,
        stratified=stratify,
        group=group,
        groups=n_groups,
        classes=list(samples.classes),
        counts=counts,
        manifest=str(out / MANIFEST),
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
    names = list(journal["names"])
    try:
        with (out / MANIFEST).open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as error:
        raise InputError(f"cannot read the plan {out / MANIFEST}: {error}") from None
    for row in rows:
        target = os.path.join(out, row["path"])
        stale = os.path.join(os.path.dirname(target), _MOVE_TEMP + os.path.basename(target))
        if os.path.lexists(stale):  # an unverified copy: the source is still there
            os.unlink(stale)
    for done, row in enumerate(rows, 1):
        source_file, target = row["source"], os.path.join(out, row["path"])
        have_source, have_target = os.path.lexists(source_file), os.path.lexists(target)
        if have_source and not have_target:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            move_file(source_file, target)
        elif have_source and have_target:  # stopped between the copy and removing the source
            if _file_digest(source_file) != _file_digest(target):
                raise InputError(
                    f"{source_file} and {target} both exist and differ", "compare them by hand"
                )
            os.unlink(source_file)
        elif not have_target:
            raise InputError(f"{row['path']} is neither in {out} nor at {source_file}")
        if progress:
            progress(done, len(rows))
    _write_journal(out, journal | {"state": "done"})
    classes = sorted({row["label"] for row in rows})
    index = {name: i for i, name in enumerate(classes)}
    counts = [[0] * len(names) for _ in classes]
    for row in rows:
        counts[index[row["label"]]][names.index(row["split"])] += 1
    return SplitResult(
        source=str(root),
        out=str(out),
        mode="move",
        names=names,
        ratio=list(journal["ratio"]),
        seed=int(journal["seed"]),
        stratified=bool(journal["stratified"]),
        group=journal.get("group"),
        groups=None,
        classes=classes,
        counts=counts,
        manifest=str(out / MANIFEST),
        resumed=True,
    )
