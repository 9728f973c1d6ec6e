"""CSV indexes: `path,label` with an optional `split` column (what `split --mode manifest` and
`train`'s RUN/split.csv write). UTF-8 with or without a byte-order mark (Excel's "CSV UTF-8"),
a file name that is not UTF-8 as its own bytes; relative paths are relative to the CSV's
folder (the folder of the file a symbolic link to the index leads to, or the link's own where
the files are there and not beside that file); every bad row is named by its line. Paths are
read exactly as written; labels and splits without the spaces around them (as the header's
names are: a hand-written `a.png, cat` is class `cat`), but for a quoted label, read as
written (what torchkit's CSV writer writes for a class folder `" cat"` or `"cat "`)."""

from __future__ import annotations

import csv
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchkit.core.data.sources.discovery import reported_files_in_two_splits
from torchkit.core.data.sources.samples import nfc, refuse_spelling_twins
from torchkit.core.data.sources.splitting import SPLIT_NAMES
from torchkit.core.io.errors import InputError
from torchkit.core.io.files import open_text
from torchkit.core.io.non_utf8_names import holds_non_utf8

_SHOWN = 5  # line numbers named in one error


@dataclass
class IndexRows:
    """The rows of a CSV index, in file order: paths as written, labels and splits without the
    spaces around them, quoted labels as written (`labels` is None without a label column,
    `splits` None without a split column). A row that repeats an earlier row (one file, with
    the same label and split) is left out (`repeated`: its line and the earlier row's), but
    where a `repeat` column says the rows are repeated on purpose (`split --oversample --mode
    manifest`'s, which train reads so). A row without a label that names the file of a row
    with one is no second label: it takes that label (`label_filled`: the lines of each such
    pair, the row without one and the row that gives the label, in line order), and is then
    such a repeat. Read with `labelled=False`, some rows may have no label
    (""): `unlabelled_lines` are their lines."""

    source: Path
    paths: list[str]
    labels: list[str] | None
    splits: list[str] | None
    repeated: list[tuple[int, int]] = field(default_factory=list)
    label_filled: list[tuple[int, int]] = field(default_factory=list)
    unlabelled_lines: list[int] = field(default_factory=list)

    @property
    def base(self) -> Path:
        """The folder the relative paths are relative to (`index_folder`)."""
        return index_folder(self.source, self.paths)


def index_folder(source: Path, paths: Sequence[str]) -> Path:
    """The folder a CSV index's relative `paths` are relative to: the index's own, also where it
    is reached through a symbolic link (`ln -s /data/set/index.csv here/`: the images lie
    beside the file the link leads to, as a script's imports lie beside the script). But the
    link's folder where the first relative path names a file there and none beside the file
    linked to: an index linked into its image folder from elsewhere (`ln -s ~/splits/train.csv
    /data/flowers/`), read so before links were followed."""
    if not source.is_symlink():
        return source.parent
    real = Path(os.path.realpath(source)).parent
    first = first_relative_path(paths)
    if (
        first is not None
        and not os.path.lexists(os.path.join(real, first))
        and os.path.lexists(os.path.join(source.parent, first))
    ):
        return source.parent
    return real


def first_relative_path(paths: Sequence[str]) -> str | None:
    """The first of `paths` that is relative, which decides the folder `index_folder` takes."""
    return next((path for path in paths if path.strip() and not os.path.isabs(path)), None)


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
    rows with more fields than the header, an empty path or one holding a NUL byte, an empty
    label, a split other than train, val or test, a path whose spaces around it are a typo
    (`_refuse_spaced_paths`) or that names the index itself.
    `labelled=False`: the label column may be missing, or empty in every row (unlabelled
    images: `labels` None), or in some rows (partly labelled: "" there, `unlabelled_lines`)."""
    source = Path(csv_path)
    if not source.is_file():
        raise InputError(f"CSV index not found: {source}", "check the path")
    paths: list[str] = []
    labels: list[str] = []
    splits: list[str] = []
    no_path: list[int] = []
    nul_path: list[int] = []
    too_wide: list[int] = []  # rows of more (non-empty) fields than the header names
    own_name: list[tuple[int, int]] = []  # (line, row) of paths named as the index is
    header_again: list[tuple[int, int]] = []  # (line, row) of rows that repeat the header
    own = source.name
    no_label: list[tuple[int, int]] = []  # (line, row)
    bad_split: list[tuple[int, str]] = []
    spaced: list[tuple[int, int]] = []  # (line, row) of paths with spaces around them
    spaced_labels: list[tuple[int, int, str]] = []  # (first line, row, label as written)
    spanning: list[tuple[int, list[str]]] = []  # (first line, fields) of rows spanning lines
    reader = None
    try:
        with open_text(source, "utf-8-sig") as handle:
            # csv.reader, not DictReader: a dict per row is most of the time of a million rows.
            reader = csv.reader(handle)
            header = next(reader, None)
            # "path, label" (a space after the comma) names the columns too.
            columns = [] if header is None else [name.strip() for name in header]
            if any("\0" in name for name in columns):
                raise _nul_byte_error(source, 1)
            if "path" not in columns or (labelled and "label" not in columns):
                has = ", ".join(columns) if columns else "nothing: the file is empty"
                for separator, name in ((";", "semicolons"), ("\t", "tabs")):
                    if len(columns) == 1 and "path" in columns[0].split(separator):
                        # Excel's "CSV" where the decimal mark is a comma (de, fr...): `;`.
                        raise InputError(
                            f"{source} separates its columns with {name}, not commas "
                            f"(line 1: {header[0]!r})",
                            "write it with commas between the columns, e.g. path,label",
                        )
                raise InputError(
                    f"{source} needs `path` and `label` columns (line 1 has {has})",
                    "the first line names the columns, e.g. path,label or path,label,split"
                    + ("" if labelled else "; label may be left out for unlabelled images"),
                )
            twice = [name for name in ("path", "label", "split") if columns.count(name) > 1]
            if twice:
                # Two indexes pasted side by side (`paste -d, a.csv b.csv`): which column is
                # meant is a guess (a dict of the row keeps the last, pandas the first).
                raise InputError(
                    f"{source} names the column {twice[0]} twice (line 1: {', '.join(columns)})",
                    "keep one column of each name",
                )
            path_at = _column(columns, "path")
            label_at = _column(columns, "label")
            split_at = _column(columns, "split")
            has_label, has_split = label_at is not None, split_at is not None
            line = reader.line_num
            first = line
            for row in reader:
                first, line = line + 1, reader.line_num  # a row may span lines (a quoted \n)
                if not row:  # a blank line is no row
                    continue
                if line > first:
                    spanning.append((first, row))
                width = len(row)
                if width > len(columns) and any(field.strip() for field in row[len(columns) :]):
                    too_wide.append(first)
                path = row[path_at] if path_at < width else ""
                if not path.strip():
                    no_path.append(line)
                elif "\0" in path:  # no file name holds one: open() raised ValueError
                    nul_path.append(line)
                elif path[:1].isspace() or path[-1:].isspace():
                    spaced.append((line, len(paths)))
                if path.endswith(own) and os.path.basename(path) == own:
                    own_name.append((line, len(paths)))
                if "path" in path and [f.strip().lstrip("\ufeff") for f in row] == columns:
                    header_again.append((first, len(paths)))
                paths.append(path)
                if has_label:
                    # "a.png, cat" is class cat, as "path, label" names the label column.
                    written = row[label_at] if label_at < width else ""
                    label = written.strip()
                    if label != written:
                        spaced_labels.append((first, len(labels), written))
                    if not label:
                        no_label.append((line, len(labels)))
                    labels.append(label)
                if has_split:
                    split = (row[split_at] if split_at < width else "").strip()
                    if split not in SPLIT_NAMES:
                        bad_split.append((line, split))
                    splits.append(split)
    except csv.Error as error:
        line = reader.line_num if reader is not None else 1
        if "NUL" in str(error):  # Python 3.10's csv refuses a NUL byte that 3.11 reads
            raise _nul_byte_error(source, line) from None
        hint = None
        if "field larger than field limit" in str(error):
            hint = "a quote opened and never closed makes the lines after it one field"
        raise InputError(f"cannot read {source} (line {line}): {error}", hint) from None
    if paths and line > first:
        _refuse_unclosed_quote(source, first, line)
    if spanning:
        _refuse_quotes_closed_lines_later(source, paths, path_at, spanning)
    if not paths:
        raise InputError(f"no rows in CSV index {source}", "add one row per image: path,label")
    _refuse_repeated_header(source, paths, header_again)
    if too_wide:
        # An unquoted comma in a path or label: its fields shift (`a,b.png,cat` was the file
        # `a` of class `b.png`), as pandas refuses such a row.
        raise InputError(
            f"{source} has {len(too_wide)} row(s) with more fields than its header names "
            f"(line {_lines(too_wide)})",
            'quote a path or label that holds a comma: "a,b.png",cat',
        )
    if spaced_labels:
        _keep_quoted_labels(source, label_at, labels, spaced_labels)
        no_label = [(line, row) for line, row in no_label if not labels[row]]
    _refuse_undecoded_bytes(source, paths, labels if has_label else None)
    if no_path:
        raise InputError(
            f"{source} has {len(no_path)} row(s) with an empty path (line {_lines(no_path)})",
            "every row needs a path and a label",
        )
    if nul_path:
        raise InputError(
            f"{source} has {len(nul_path)} row(s) whose path holds a NUL byte "
            f"(line {_lines(nul_path)})",
            NUL_PATH_HINT,
        )
    if no_label and not labelled and len(no_label) == len(paths):
        # Unlabelled images: what `split` writes for a flat folder (an empty label column).
        has_label, no_label = False, []
    _refuse_spaced_paths(source, paths, spaced)
    _refuse_foreign_paths(source, paths)
    _refuse_itself(source, paths, own_name)
    if bad_split:
        raise InputError(
            f"{source} has {len(bad_split)} row(s) with a split other than train, val or test "
            f"(line {_lines_and_values(bad_split)})",
            "the split column takes train, val or test",
        )
    rows = IndexRows(source, paths, labels if has_label else None, splits if has_split else None)
    kept = _drop_repeated_rows(rows, on_purpose="repeat" in columns)
    # Rows without a label, but those that took the label of another row of their file.
    line_of = dict((row, line) for line, row in no_label)
    no_label_lines = [
        line_of[row] for at, row in enumerate(kept) if row in line_of and not rows.labels[at]
    ]
    if no_label_lines and labelled:
        raise InputError(
            f"{source} has {len(no_label_lines)} row(s) with an empty label "
            f"(line {_lines(no_label_lines)})",
            "every row needs a path and a label; predict, extract-features and dataset-stats "
            "read images without one unlabelled",
        )
    # Partly labelled: the reader of a command that takes unlabelled images decides.
    rows.unlabelled_lines = no_label_lines
    return rows


def _keep_quoted_labels(
    source: Path, label_at: int, labels: list[str], spaced: list[tuple[int, int, str]]
) -> None:
    """Put back the spaces around the labels of `spaced` (first line, row, label as written)
    that were quoted: the csv module reads `a.png, cat` and `a.png," cat"` alike, so the
    quotes are looked for in the rows' lines, read again (only files with such labels)."""
    wanted = {first: (row, written) for first, row, written in spaced}
    with open_text(source, "utf-8-sig") as handle:
        lines = enumerate(handle, 1)
        for number, text in lines:
            if number not in wanted or '"' not in text:
                continue
            row, written = wanted[number]
            quoted = _quoted_fields(text)
            while quoted is None:  # a quoted field goes on in the next line
                text += next(lines, (0, '"'))[1]
                quoted = _quoted_fields(text)
            if quoted[label_at : label_at + 1] == [True]:
                labels[row] = written


def _quoted_fields(text: str) -> list[bool] | None:
    """Whether each field of the CSV row that `text` opens is quoted (opens with a quote), as
    Python's csv reader (the excel dialect) splits it; None when `text` ends inside quotes."""
    quoted: list[bool] = []
    at, inside, opening = 0, False, True
    while at < len(text):
        char = text[at]
        if opening:
            quoted.append(char == '"')
            inside, opening = char == '"', char == ","  # a comma: the field was empty
            if char in "\r\n":
                return quoted  # an empty last field
        elif inside:
            if char == '"':
                if text[at + 1 : at + 2] == '"':
                    at += 1  # "" inside quotes is one quote
                else:
                    inside = False
        elif char == ",":
            opening = True
        elif char in "\r\n":
            return quoted
        at += 1
    if inside:
        return None
    if opening:
        quoted.append(False)  # an empty last field
    return quoted


def _lines_and_values(found: list[tuple[int, str]]) -> str:
    """`2 ' a.png', 3 ' b.png', ...`: the first rows of `found` (line, value)."""
    shown = ", ".join(f"{line} {value!r}" for line, value in found[:_SHOWN])
    return shown + (", ..." if len(found) > _SHOWN else "")


def _refuse_spaced_paths(source: Path, paths: list[str], spaced: list[tuple[int, int]]) -> None:
    """A path is read exactly as written (a file name may start or end with a space), but one
    with spaces around it that names no file while the path without them does is a typo
    ("label, path": a space after the comma), refused naming its lines."""
    base = str(index_folder(source, paths))
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


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")
_DRIVE = re.compile(r"[A-Za-z]:[\\/]")


def _foreign_kind(path: str) -> str | None:
    """What kind of path, read literally here, `path` is written as for another place: `~`
    (a shell expands it, torchkit does not), a URL, a Windows path; None for other paths."""
    if path[:1] == "~":
        return "home"
    if _URL.match(path):
        return "url"
    if os.sep == "/" and _DRIVE.match(path):
        return "drive"
    if os.sep == "/" and "\\" in path:
        return "backslash"
    return None


def _refuse_foreign_paths(source: Path, paths: list[str]) -> None:
    """Paths that name no file because they are written for a shell (`~/x.png`), the web
    (`https://...`) or Windows (`C:\\data\\x.png`, `cat\\x.png`) are an error naming their
    lines, where each was an unreadable "file not found" (`CSV_FOLDER/~/x.png`). Read as
    written, relative to the index's folder (a file may be named so: then it is read)."""
    text = "".join(paths)
    if "~" not in text and ":/" not in text and "\\" not in text:
        return
    base = str(index_folder(source, paths))
    found: dict[str, list[tuple[int, str]]] = {}
    for row, path in enumerate(paths):
        kind = _foreign_kind(path)
        if kind is not None and not os.path.lexists(os.path.join(base, path)):
            found.setdefault(kind, []).append((row, path))
    if not found:
        return
    kind, rows = next(iter(found.items()))
    firsts = _row_lines(source)
    rows = [(firsts[row], path) for row, path in rows]
    what = f"{source} has {len(rows)} row(s) whose path "
    # As written: repr would double a Windows path's backslashes.
    shown = "; ".join(f"line {line}: {path}" for line, path in rows[:3])
    shown = f"({shown}{'; ...' if len(rows) > 3 else ''})"
    if kind == "home":
        raise InputError(
            f"{what}starts with ~ {shown}, which only a shell expands",
            "write the path out, e.g. /home/me/x.png, or relative to the CSV's folder",
        )
    if kind == "url":
        raise InputError(
            f"{what}is a URL {shown}: a CSV index lists image files",
            "download the images and list their files, relative to the CSV's folder",
        )
    if kind == "drive":
        raise InputError(
            f"{what}is a Windows path {shown}",
            "write paths relative to the CSV's folder, or absolute, with / between folders",
        )
    slashed = rows[0][1].replace("\\", "/")
    there = os.path.lexists(os.path.join(base, slashed))
    raise InputError(
        f"{what}holds backslashes {shown}: Windows separators, part of a file name here",
        f"write / between folders: {slashed} is there" if there else "write / between folders",
    )


NUL_PATH_HINT = "no file name holds a NUL byte: fix those paths"


def _nul_byte_error(source: Path, line: int) -> InputError:
    """A NUL byte on the header line is UTF-16 (pandas' encoding="utf-16", Excel's "Unicode
    Text") read as UTF-8; on another line, a path that holds one (no file name can)."""
    if line == 1:
        return InputError(
            f"{source} is not UTF-8 text (its first line holds NUL bytes: UTF-16?)",
            "save it as CSV UTF-8, with or without BOM",
        )
    return InputError(
        f"{source} has a row whose text holds a NUL byte (line {line})", NUL_PATH_HINT
    )


def _refuse_repeated_header(source: Path, paths: list[str], found: list[tuple[int, int]]) -> None:
    """A row that repeats the header (`cat a.csv b.csv`: two indexes joined whole) is an error
    naming its line, where no file has the path column's name: it was read as an image
    `path` of a class `label`, which train gave an output and eval called an unknown class."""
    base = str(index_folder(source, paths))
    lines = [line for line, row in found if not os.path.lexists(os.path.join(base, paths[row]))]
    if lines:
        raise InputError(
            f"{source} repeats its header in line {_lines(lines)} (indexes joined whole?)",
            "the first line alone names the columns: remove the others",
        )


def _path_keys(rows: IndexRows) -> list[str]:
    """One key per row that two rows naming one file share: the path as written, where every
    path is a plain relative one; else the normalized absolute path (`./a.png`, `a//b.png`,
    `x/../a.png` and `/data/a.png` name `a.png` too), from the text alone. A file reached
    under another name through a link (a symbolic or hard link, a linked folder) is not
    matched: that takes a stat per row, which reading an index does without."""
    text = "\n" + "\n".join(rows.paths)
    if not any(mark in text for mark in ("\n/", "\n.", "/.", "//")):
        return rows.paths
    base = os.path.abspath(rows.base)
    return [os.path.normpath(os.path.join(base, path)) for path in rows.paths]


def _refuse_unclosed_quote(source: Path, first: int, last: int) -> None:
    """InputError where the last row of the index (lines `first` to `last`) ends inside quotes:
    a quote opened and never closed (`"a.png,cat`), which Python's csv reader closes at the end
    of the file, making every line after it part of one field: those rows were read as one
    path that names no file (one unreadable image), not as rows. Only a last row spanning
    lines is read again."""
    with open_text(source, "utf-8-sig") as handle:
        for _ in range(first - 1):
            next(handle, None)
        try:
            for _ in csv.reader(handle, strict=True):
                pass
        except csv.Error as error:
            if "unexpected end of data" not in str(error):
                return  # another quirk, which the reader has read past as it always has
            raise InputError(
                f"{source}: the quote opened in line {first} is never closed, so lines "
                f"{first}-{last} read as one field",
                'close it: "a,b.png",cat; a quote inside a quoted field is written twice, '
                '"a""b.png"',
            ) from None


def _line_breaks(text: str) -> int:
    """The line breaks in `text` as the reader counts lines (`\n`, `\r\n` or `\r`)."""
    return text.count("\n") + text.count("\r") - text.count("\r\n")


def _refuse_quotes_closed_lines_later(
    source: Path, paths: list[str], path_at: int, spanning: list[tuple[int, list[str]]]
) -> None:
    """InputError naming the first row (`spanning`: the rows read from more than one line,
    each with its first line and fields) whose path holds line breaks, names no file and reads
    as rows (it holds a comma, or one of its lines names a file): a quote left
    open in one row and closed by a quote lines later (`"a.png,cat` in line 5, `b.png",dog` in
    line 9) made the lines between one path, where they were rows, without a word. A path
    holding a line break that names a file (Linux allows one) is read, and so is one that
    names none but reads as no rows (an unreadable image, as any path naming no file)."""
    base = None
    wrong = []
    for first, row in spanning:
        path = row[path_at] if path_at < len(row) else ""
        if not _line_breaks(path) or "\0" in path:
            continue
        if base is None:
            base = index_folder(source, paths)
        if not os.path.lexists(os.path.join(base, path)) and (
            "," in path
            or any(
                part and os.path.lexists(os.path.join(base, part))
                for part in path.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            )
        ):
            opened = first + sum(_line_breaks(field) for field in row[:path_at])
            wrong.append((opened, opened + _line_breaks(path)))
    if wrong:
        opened, closed = wrong[0]
        more = f" (and {len(wrong) - 1} more such row(s))" if len(wrong) > 1 else ""
        raise InputError(
            f"{source}: the quote opened in line {opened} is closed in line {closed}, so lines "
            f"{opened}-{closed} read as one path, which names no file{more}",
            f'close the quote in line {opened} on its line: "a,b.png",cat; a quote inside a '
            'quoted field is written twice, "a""b.png"',
        )


def _row_lines(source: Path) -> list[int]:
    """The line each row of the index starts on, read again (only for the rows an error or a
    warning names: a number per row of a million-row index costs its reading time)."""
    lines: list[int] = []
    with open_text(source, "utf-8-sig") as handle:
        reader = csv.reader(handle)
        next(reader, None)
        line = reader.line_num
        for row in reader:
            first, line = line + 1, reader.line_num
            if row:  # a blank line is no row, as `read_index_rows` reads them
                lines.append(first)
    return lines


def _one_file(base: str, path: str, other: str) -> bool:
    """Whether `path` and `other`, two rows' paths of one key (`_path_keys`), name one file:
    by their text, but where one goes up a folder (`sub/../a.png` is no `a.png` where `sub`
    is a linked folder), where stat agrees too (or cannot tell: a file missing). A stat only
    for such rows."""
    if path == other or (".." not in path and ".." not in other):
        return True
    try:
        return os.path.samefile(os.path.join(base, path), os.path.join(base, other))
    except (OSError, ValueError):
        return True


def _drop_repeated_rows(rows: IndexRows, *, on_purpose: bool) -> list[int]:
    """Rows naming one file: an error where they give it two labels (its label is a guess:
    train trained it as both) or put it in two splits (it leaks from one into the other), each
    naming the lines of the first such pair; else the later rows are left out of `rows`, their
    lines in `rows.repeated` (the caller warns), but where they are repeats `on_purpose`. A row
    without a label ("") beside a row of its file with one takes that label (no second label:
    `rows.label_filled`, warned of), before it is judged so. Inside
    `files_in_two_splits_reported` (dataset-stats' leakage report) a file in two splits is kept
    in each, its first row in each reported there (two labels in one split are an error still).
    Returns the rows kept (their indices in the rows read)."""
    keys = _path_keys(rows)
    if len(set(keys)) == len(keys):
        return list(range(len(keys)))
    firsts = _row_lines(rows.source)
    reported = reported_files_in_two_splits()
    labels, splits = rows.labels, rows.splits
    by_split = reported is not None and splits is not None
    # key (and split, `by_split`) -> its first row; key -> split -> the first row of its file
    first_row: dict[str | tuple[str, str], int] = {}
    split_firsts: dict[str, dict[str, int]] = {}
    base = str(rows.base)
    two_labels: list[tuple[int, int]] = []
    two_splits: list[tuple[int, int]] = []
    repeats: list[int] = []
    label_from: dict[int, int] = {}  # a row without a label -> the row whose label it took
    named_again = {key for key, count in Counter(keys).items() if count > 1}
    for row, key in enumerate(keys):
        if key not in named_again:
            continue
        if by_split:
            in_split = split_firsts.setdefault(key, {})
            first = next(iter(in_split.values()), row)
            if splits[row] not in in_split and _one_file(base, rows.paths[first], rows.paths[row]):
                in_split[splits[row]] = row
        earlier = first_row.setdefault((key, splits[row]) if by_split else key, row)
        if earlier == row or not _one_file(base, rows.paths[earlier], rows.paths[row]):
            continue
        if labels is not None and bool(labels[earlier]) != bool(labels[row]):
            # An empty label is none (partly labelled rows): the file has the other's label.
            blank, given = (earlier, row) if labels[row] else (row, earlier)
            # The row that gives the label in the file (`given` may have taken it itself:
            # blank, cat, blank names the cat row for both blank rows).
            given = label_from.get(given, given)
            labels[blank], label_from[blank] = labels[given], given
            first_line, later_line = sorted((firsts[blank], firsts[given]))
            rows.label_filled.append((first_line, later_line))
        same_label = labels is None or labels[earlier] == labels[row]
        if not same_label and nfc(labels[earlier]) != nfc(labels[row]):
            two_labels.append((earlier, row))
        elif splits is not None and splits[earlier] != splits[row]:
            two_splits.append((earlier, row))
        elif same_label:
            repeats.append(row)
            rows.repeated.append((firsts[row], firsts[earlier]))
        # else one label in two Unicode spellings: both rows kept, for `class_order` to refuse
        # the spellings by name (as "two labels: 'café' and 'café'" could not).
    for pairs, values, what, hint in (
        (two_labels, labels, "labels", "an image has one label: fix or remove one of the rows"),
        (two_splits, splits, "splits", "keep one of the rows: an image in two splits leaks"),
    ):
        if pairs:
            earlier, row = pairs[0]
            earlier = label_from.get(earlier, earlier) if what == "labels" else earlier
            more = f" (and {len(pairs) - 1} more)" if len(pairs) > 1 else ""
            raise InputError(
                f"{rows.source} gives {rows.paths[row]!r} two {what}: {values[earlier]!r} in line "
                f"{firsts[earlier]} and {values[row]!r} in line {firsts[row]}{more}",
                hint,
            )
    if reported is not None:
        reported += [
            tuple(rows.paths[row] for row in in_split.values())
            for in_split in split_firsts.values()
            if len(in_split) > 1
        ]
    if on_purpose or not repeats:
        rows.repeated = []
        return list(range(len(keys)))
    dropped = set(repeats)
    kept = [row for row in range(len(keys)) if row not in dropped]
    rows.paths = [rows.paths[row] for row in kept]
    rows.labels = None if labels is None else [labels[row] for row in kept]
    rows.splits = None if splits is None else [splits[row] for row in kept]
    return kept


def repeated_rows_warning(rows: IndexRows) -> str | None:
    """The warning for the rows `read_index_rows` left out as repeats (and the rows without a
    label that took the label of another row of their file), None for none."""
    said = []
    if rows.label_filled:
        pairs = rows.label_filled
        shown = ", ".join(f"lines {first} and {line}" for first, line in pairs[:3])
        more = ", ..." if len(pairs) > 3 else ""
        said.append(
            f"{rows.source} lists {len(pairs)} row(s) without a label beside a row of the same "
            f"image with one ({shown}{more}): an empty label is no second label: each image is "
            "read with that label"
        )
    filled = {line for pair in rows.label_filled for line in pair}
    repeated = [pair for pair in rows.repeated if not filled.issuperset(pair)]
    if repeated:
        shown = ", ".join(f"line {line} repeats line {first}" for line, first in repeated[:3])
        more = ", ..." if len(repeated) > 3 else ""
        same = "" if rows.labels is None else " with the same label"  # unlabelled: none to name
        said.append(
            f"{rows.source} lists {len(repeated)} image(s) again{same} "
            f"({shown}{more}): each is read once (a `repeat` column, as split --oversample "
            "--mode manifest writes, keeps repeated rows)"
        )
    return "; ".join(said) or None


def unlabelled_rows_warning(rows: IndexRows, splits: Sequence[str] = ()) -> str:
    """The warning for partly labelled rows (`IndexRows.unlabelled_lines`) read unlabelled, in
    the words shards and parquet files of some samples without a label are warned of: all of
    them, or (`splits`) the rows of those splits."""
    lines = rows.unlabelled_lines
    labelled = sum(1 for label in rows.labels or () if label)
    which = "its images"
    if splits:
        which = f"the images of its {', '.join(splits)} split{'s' if len(splits) > 1 else ''}"
    return (
        f"{rows.source} has {len(lines)} row(s) without a label (line {_lines(lines)}) among "
        f"{labelled} labelled ones: {which} are read unlabelled"
    )


def unlabelled_lines_of_split(rows: IndexRows, split: str) -> list[int]:
    """The lines of the rows of `split` without a label (`IndexRows.unlabelled_lines`)."""
    if rows.labels is None or rows.splits is None:
        return []
    blank_splits = [s for s, label in zip(rows.splits, rows.labels, strict=True) if not label]
    return [line for line, s in zip(rows.unlabelled_lines, blank_splits, strict=True) if s == split]


def _refuse_itself(source: Path, paths: list[str], named: list[tuple[int, int]]) -> None:
    """A row naming the index itself (`named`: the (line, row) of the paths with its name) is
    an error: it is no image, and `split --mode move` moved the index into OUT as one (a
    rerun then found no index to finish the move with)."""
    base = str(index_folder(source, paths))
    found = []
    for line, row in named:
        try:
            if os.path.samefile(os.path.join(base, paths[row]), source):
                found.append(line)
        except (OSError, ValueError):
            continue
    if found:
        raise InputError(
            f"{source} lists itself as an image (line {_lines(found)})",
            "remove that row: a CSV index lists image files",
        )


def _refuse_undecoded_bytes(source: Path, paths: list[str], labels: list[str] | None) -> None:
    """Bytes that are not UTF-8 are the bytes of a file name (what split and train write for
    a name that is not UTF-8) in a row whose path holds them and names a file; anywhere else
    the CSV is text in another encoding (Latin-1 from Excel), refused as before."""
    if not holds_non_utf8("".join(paths)) and not holds_non_utf8("".join(labels or ())):
        return
    base = str(index_folder(source, paths))
    for index, path in enumerate(paths):
        in_path = holds_non_utf8(path)
        if in_path and os.path.lexists(os.path.join(base, path)):
            continue
        if in_path or (labels is not None and holds_non_utf8(labels[index])):
            raise InputError(
                f"{source} is not UTF-8 text", "save it as CSV UTF-8, with or without BOM"
            )


def natural_key(text: str):
    """Class names that are integers sort as numbers ("2" before "10"), before the others; two
    spellings of one number ("1", "01") by their text, so the order never depends on the order
    they come in (a set's, which differs between processes)."""
    body = text.strip()
    digits = body[1:] if body[:1] == "-" else body
    # isdecimal, not isdigit: "²" is a digit that int() refuses.
    if digits.isdecimal():
        try:
            return (0, int(body), text)
        except ValueError:  # more digits than int() converts from text (4,300)
            pass
    return (1, 0, text)


def class_order(
    labels: Sequence[str], splits: Sequence[str] | None, where: str = "the data"
) -> list[str]:
    """Class names in label order: those of the train rows first (natural order), then those
    only other splits have, split by split (a name in another Unicode spelling than train's
    is train's class). InputError for two spellings of one name in one split (`where`: the
    data's name)."""
    if splits is None:
        present = set(labels)
        refuse_spelling_twins(present, f"labels of {where}:")
        return sorted(present, key=natural_key)
    names: list[str] = []
    seen: set[str] = set()  # in NFC
    for split in SPLIT_NAMES:
        found = {label for label, s in zip(labels, splits, strict=True) if s == split}
        refuse_spelling_twins(found, f"labels of {where} ({split}):")
        found = {label for label in found if nfc(label) not in seen}
        names += sorted(found, key=natural_key)
        seen.update(nfc(label) for label in found)
    return names


def _pathlib_may_respell(path: str) -> bool:
    """Whether `Path(base) / path` may spell `path` differently from `base/path` (`./a`, `a//b`,
    `a/./b`, `a/.`, a trailing slash); a few paths it keeps as they are answer yes too."""
    return "//" in path or "/." in path or path[:1] == "." or path[-1:] == "/"


def absolute_paths(rows: IndexRows) -> list[str]:
    """The files the rows name: relative paths joined to the CSV's folder (`IndexRows.base`; as
    `str(base / p)` spells them, but by concatenation where that is the same text: a million
    Path objects take seconds)."""
    base = rows.base
    if os.sep != "/":
        return [p if os.path.isabs(p) else str(base / p) for p in rows.paths]
    text = str(base)
    prefix = "" if text == "." else text if text.endswith("/") else text + "/"
    return [
        p if p[:1] == "/" else str(base / p) if _pathlib_may_respell(p) else prefix + p
        for p in rows.paths
    ]
