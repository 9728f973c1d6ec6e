"""CSV indexes: `path,label` with an optional `split` column (what `split --mode manifest` and
`train`'s RUN/split.csv write). UTF-8 with or without a byte-order mark (Excel's "CSV UTF-8"),
a file name that is not UTF-8 as its own bytes; relative paths are relative to the CSV's
folder; every bad row is named by its line. Labels and splits are read without the spaces around
them (as the header's names are), paths exactly as written."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchkit.core.data.sources.splitting import SPLIT_NAMES
from torchkit.core.io.errors import InputError
from torchkit.core.io.files import holds_non_utf8, open_text

_SHOWN = 5  # line numbers named in one error


@dataclass
class IndexRows:
    """The rows of a CSV index, in file order: paths as written, labels and splits without the
    spaces around them (`labels` is None without a label column, `splits` None without a split
    column)."""

    source: Path
    paths: list[str]
    labels: list[str] | None
    splits: list[str] | None


def _lines(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:_SHOWN])
    return shown + (", ..." if len(numbers) > _SHOWN else "")


def _column(columns: list[str], name: str) -> int | None:
    """Where the column `name` is (the last one of that name, as a dict of the row keeps)."""
    if name not in columns:
        return None
    return len(columns) - 1 - columns[::-1].index(name)


def read_index_rows(csv_path: str | os.PathLike, *, labelled: bool = True) -> IndexRows:
    """The rows of the CSV index at `csv_path`; InputError (one line) for a missing file or
    column, text that is not UTF-8 (but for the bytes of file names) or not CSV, no rows, and
    rows with an empty path, an empty label, a split other than train, val or test or a path
    whose spaces around it are a typo (`_refuse_spaced_paths`).
    `labelled=False`: the label column may be missing, or empty in every row (unlabelled images)."""
    source = Path(csv_path)
    if not source.is_file():
        raise InputError(f"CSV index not found: {source}", "check the path")
    paths: list[str] = []
    labels: list[str] = []
    splits: list[str] = []
    no_path: list[int] = []
    no_label: list[int] = []
    bad_split: list[tuple[int, str]] = []
    spaced: list[tuple[int, int]] = []  # (line, row) of paths with spaces around them
    reader = None
    try:
        with open_text(source, "utf-8-sig") as handle:
            # csv.reader, not DictReader: a dict per row is most of the time of a million rows.
            reader = csv.reader(handle)
            header = next(reader, None)
            # "path, label" (a space after the comma) names the columns too.
            columns = [] if header is None else [name.strip() for name in header]
            if "path" not in columns or (labelled and "label" not in columns):
                has = ", ".join(columns) if columns else "nothing: the file is empty"
                raise InputError(
                    f"{source} needs `path` and `label` columns (line 1 has {has})",
                    "the first line names the columns, e.g. path,label or path,label,split"
                    + ("" if labelled else "; label may be left out for unlabelled images"),
                )
            path_at = _column(columns, "path")
            label_at = _column(columns, "label")
            split_at = _column(columns, "split")
            has_label, has_split = label_at is not None, split_at is not None
            for row in reader:
                if not row:  # a blank line is no row
                    continue
                line, width = reader.line_num, len(row)
                path = row[path_at] if path_at < width else ""
                if not path.strip():
                    no_path.append(line)
                elif path[:1].isspace() or path[-1:].isspace():
                    spaced.append((line, len(paths)))
                paths.append(path)
                if has_label:
                    # "a.png, cat" is class cat, as "path, label" names the label column.
                    label = (row[label_at] if label_at < width else "").strip()
                    if not label:
                        no_label.append(line)
                    labels.append(label)
                if has_split:
                    split = (row[split_at] if split_at < width else "").strip()
                    if split not in SPLIT_NAMES:
                        bad_split.append((line, split))
                    splits.append(split)
    except csv.Error as error:
        line = reader.line_num if reader is not None else 1
        raise InputError(f"cannot read {source} (line {line}): {error}") from None
    if not paths:
        raise InputError(f"no rows in CSV index {source}", "add one row per image: path,label")
    _refuse_undecoded_bytes(source, paths, labels if has_label else None)
    if no_path:
        raise InputError(
            f"{source} has {len(no_path)} row(s) with an empty path (line {_lines(no_path)})",
            "every row needs a path and a label",
        )
    if no_label and not labelled and len(no_label) == len(paths):
        # Unlabelled images: what `split` writes for a flat folder (an empty label column).
        has_label, no_label = False, []
    if no_label:
        raise InputError(
            f"{source} has {len(no_label)} row(s) with an empty label (line {_lines(no_label)})",
            "every row needs a path and a label",
        )
    _refuse_spaced_paths(source, paths, spaced)
    if bad_split:
        raise InputError(
            f"{source} has {len(bad_split)} row(s) with a split other than train, val or test "
            f"(line {_lines_and_values(bad_split)})",
            "the split column takes train, val or test",
        )
    return IndexRows(source, paths, labels if has_label else None, splits if has_split else None)


def _lines_and_values(found: list[tuple[int, str]]) -> str:
    """`2 ' a.png', 3 ' b.png', ...`: the first rows of `found` (line, value)."""
    shown = ", ".join(f"{line} {value!r}" for line, value in found[:_SHOWN])
    return shown + (", ..." if len(found) > _SHOWN else "")


def _refuse_spaced_paths(source: Path, paths: list[str], spaced: list[tuple[int, int]]) -> None:
    """A path is read exactly as written (a file name may start or end with a space), but one
    with spaces around it that names no file while the path without them does is a typo
    ("label, path": a space after the comma), refused naming its lines."""
    base = str(source.parent)
    typos = [
        (line, paths[row])
        for line, row in spaced
        if not os.path.lexists(os.path.join(base, paths[row]))
        and os.path.lexists(os.path.join(base, paths[row].strip()))
    ]
    if typos:
        raise InputError(
            f"{source} has {len(typos)} row(s) whose path has spaces around it that the file's "
            f"name has not (line {_lines_and_values(typos)})",
            "remove the spaces around the path: paths are read exactly as written",
        )


def _refuse_undecoded_bytes(source: Path, paths: list[str], labels: list[str] | None) -> None:
    """Bytes that are not UTF-8 are the bytes of a file name (what split and train write for
    a name that is not UTF-8) in a row whose path holds them and names a file; anywhere else
    the CSV is text in another encoding (Latin-1 from Excel), refused as before."""
    if not holds_non_utf8("".join(paths)) and not holds_non_utf8("".join(labels or ())):
        return
    base = str(source.parent)
    for index, path in enumerate(paths):
        in_path = holds_non_utf8(path)
        if in_path and os.path.lexists(os.path.join(base, path)):
            continue
        if in_path or (labels is not None and holds_non_utf8(labels[index])):
            raise InputError(
                f"{source} is not UTF-8 text", "save it as CSV UTF-8 (with or without BOM)"
            )


def natural_key(text: str):
    """Class names that are integers sort as numbers ("2" before "10"), before the others."""
    return (0, int(text), "") if text.strip().lstrip("-").isdigit() else (1, 0, text)


def class_order(labels: Sequence[str], splits: Sequence[str] | None) -> list[str]:
    """Class names in label order: those of the train rows first (natural order), then those
    only other splits have, split by split."""
    if splits is None:
        return sorted(set(labels), key=natural_key)
    names: list[str] = []
    seen: set[str] = set()
    for split in SPLIT_NAMES:
        found = {label for label, s in zip(labels, splits, strict=True) if s == split} - seen
        names += sorted(found, key=natural_key)
        seen |= found
    return names


def _pathlib_may_respell(path: str) -> bool:
    """Whether `Path(base) / path` may spell `path` differently from `base/path` (`./a`, `a//b`,
    `a/./b`, `a/.`, a trailing slash); a few paths it keeps as they are answer yes too."""
    return "//" in path or "/." in path or path[:1] == "." or path[-1:] == "/"


def absolute_paths(rows: IndexRows) -> list[str]:
    """The files the rows name: relative paths joined to the CSV's folder (as `str(base / p)`
    spells them, but by concatenation where that is the same text: a million Path objects
    take seconds)."""
    base = rows.source.parent
    if os.sep != "/":
        return [p if os.path.isabs(p) else str(base / p) for p in rows.paths]
    text = str(base)
    prefix = "" if text == "." else text if text.endswith("/") else text + "/"
    return [
        p if p[:1] == "/" else str(base / p) if _pathlib_may_respell(p) else prefix + p
        for p in rows.paths
    ]
