"""The one CSV writer of every CSV torchkit writes (split.csv, predictions, eval's reports,
extract-features' index.csv, dataset-stats, video-info, metrics.csv, `--format csv`): lines end
in `\\n`, and a field is quoted where a CSV reader needs it to read the field back whole.

Python's csv writer quotes a field that holds the delimiter, a quote or a character of its line
terminator: with `\\n` line ends, a carriage return in a file or class name (Linux allows it) was
written bare, and every reader (Python's csv, pandas, torchkit's CSV index) split that row in
two. Such rows are written as a writer ending its lines in `\\r\\n` writes them (which quotes
fields holding either character), with the `\\n` line end.

A field with spaces around it (a class folder `" cat"` or `"cat "`) is quoted too: readers that
strip the spaces around an unquoted field (torchkit's CSV index reads a hand-written
`a.png, cat` as class `cat`) keep those of a quoted one.

A missing value (None) is an empty field, and an empty string a quoted one (`""`): `env
--format csv` tells CUDA_VISIBLE_DEVICES unset from set to "" (which hides every GPU). This is
the convention of PostgreSQL's CSV and of Python's `csv.QUOTE_NOTNULL` (whose reader, from
Python 3.13, reads an unquoted empty field as None); readers that do not tell them apart read
both as empty, as before. (A row of one field writes either as `""`, as the csv module does:
an empty line is no row.)
"""

from __future__ import annotations

import csv
import io
import itertools
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

# Whitespace (but a line end) at either end of a field in rendered rows: where a field may have
# spaces around it. Quoted fields may match too; such rows are looked at field by field.
_SPACED = re.compile(r"(?:^|[,\r\n])[^\S\r\n]|[^\S\r\n](?:[,\r\n]|$)")
# The ASCII characters `_SPACED` calls whitespace. The pattern tries every position of a chunk
# (as long as writing the rows); a substring search for each of these is a hundred times faster.
_ASCII_SPACES = " \t\x0b\x0c\x1c\x1d\x1e\x1f"
# Where rendered rows hold an empty field (None or ""): these are looked at row by row.
_EMPTY_FIELD = re.compile(r"^,|,,|,$|,\r?\n|\n,", re.MULTILINE)
# Rows rendered at once: the rendered text of a million rows (a split.csv) held whole took
# several times the memory of the rows themselves.
_CHUNK_ROWS = 1000


def _spaced(value: Any) -> bool:
    """Whether `value` is text with whitespace at either end (what a reader may strip)."""
    return isinstance(value, str) and value != value.strip()


def _may_be_spaced(text: str) -> bool:
    """Whether rendered `text` may hold a field with whitespace at either end (`_SPACED`)."""
    if text.isascii() and not any(char in text for char in _ASCII_SPACES):
        return False
    return _SPACED.search(text) is not None


def _empty_text(row: tuple) -> bool:
    """Whether `row`, of more than one field, holds an empty string (written `""`, above)."""
    return len(row) > 1 and any(value == "" and isinstance(value, str) for value in row)


def _field(value: Any) -> str:
    """`value` as one field as the csv module writes it, quoted where it holds a comma, a
    quote or a line end, has spaces around it, or is an empty string (None: an empty field)."""
    if value is None:
        return ""
    text = str(value)
    if not text or _spaced(text) or any(char in text for char in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


class CsvWriter:
    """`csv.writer(handle, lineterminator=...)` (`writerow`, `writerows`) that also quotes a
    field holding a carriage return, with spaces around it, or empty, None being an empty
    field (above). Rows are rendered at C speed; only text that holds a carriage return, an
    empty field or spaces beside a comma or a line end is rendered again row by row."""

    def __init__(self, handle: IO[str], lineterminator: str = "\n") -> None:
        self._handle, self._end = handle, lineterminator
        self._buffer = io.StringIO()
        self._writer = csv.writer(self._buffer, lineterminator=lineterminator)
        # A terminator holding both characters makes the writer quote fields with either.
        self._quoting = None if "\r" in lineterminator else csv.writer(self._buffer)

    def writerow(self, row: Iterable[Any]) -> None:
        self.writerows((row,))

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        """Every row of `rows`, a few thousand at a time (each taken before it is written):
        rows that come one at a time (a stream to a pipe) go through `writerow` each."""
        remaining = iter(rows)
        while chunk := [tuple(row) for row in itertools.islice(remaining, _CHUNK_ROWS)]:
            self._write_chunk(chunk)

    def _write_chunk(self, rows: list[tuple]) -> None:
        self._writer.writerows(rows)  # rows are read twice when a field needs quoting
        text = self._taken()
        carriage = self._quoting is not None and "\r" in text
        if carriage or _may_be_spaced(text) or _EMPTY_FIELD.search(text):
            text = "".join(self._quoted_line(row) for row in rows)
        self._handle.write(text)

    def _quoted_line(self, row: tuple) -> str:
        """`row` as one line, its fields quoted where a reader needs it (above)."""
        if _empty_text(row) or any(_spaced(value) for value in row):
            return ",".join(_field(value) for value in row) + self._end
        self._writer.writerow(row)
        line = self._taken()
        if self._quoting is not None and "\r" in line:
            self._quoting.writerow(row)
            line = self._taken()[:-2] + self._end  # "\r\n" -> the line end
        return line

    def _taken(self) -> str:
        """What the writers wrote into the buffer since the last call."""
        text = self._buffer.getvalue()
        self._buffer.seek(0)
        self._buffer.truncate()
        return text


def csv_text(rows: Iterable[Iterable[Any]], lineterminator: str = "\n") -> str:
    """`rows` (the header first) as CSV text, written by `CsvWriter`."""
    buffer = io.StringIO()
    CsvWriter(buffer, lineterminator).writerows(rows)
    return buffer.getvalue()


def write_csv_file(
    path: str | os.PathLike,
    rows: Iterable[Iterable[Any]],
    *,
    header: Iterable[Any] | None = None,
    check: Callable[[Path], None] | None = None,
) -> None:
    """`header` (if given) and `rows` written to `path` as `csv_text` writes them, byte for
    byte, atomically (`atomic_write`: a temporary file renamed into place) and streamed in
    chunks as they are taken from `rows`: a million rows' text (a split.csv of 60 MB, eval's
    predictions.csv of 200 MB) is never held whole."""
    from torchkit.core.io.files import atomic_write

    with atomic_write(path, "w", check=check, encoding="utf-8", newline="") as handle:
        writer = CsvWriter(handle)
        if header is not None:
            writer.writerow(header)
        writer.writerows(rows)
