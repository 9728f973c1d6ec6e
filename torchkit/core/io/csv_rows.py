"""The one CSV writer of every CSV torchkit writes (split.csv, predictions, eval's reports,
extract-features' index.csv, dataset-stats, video-info, metrics.csv, `--format csv`): lines end
in `\\n`, and a field is quoted where a CSV reader needs it to read the field back whole.

Python's csv writer quotes a field that holds the delimiter, a quote or a character of its line
terminator: with `\\n` line ends, a carriage return in a file or class name (Linux allows it) was
written bare, and every reader (Python's csv, pandas, torchkit's CSV index) split that row in
two. Such rows are written as a writer ending its lines in `\\r\\n` writes them (which quotes
fields holding either character), with the `\\n` line end.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import IO, Any


class CsvWriter:
    """`csv.writer(handle, lineterminator=...)` (`writerow`, `writerows`) that also quotes a
    field holding a carriage return (above). Rows are rendered at C speed; only text that holds
    a carriage return is rendered again row by row."""

    def __init__(self, handle: IO[str], lineterminator: str = "\n") -> None:
        self._handle, self._end = handle, lineterminator
        self._buffer = io.StringIO()
        self._writer = csv.writer(self._buffer, lineterminator=lineterminator)
        # A terminator holding both characters makes the writer quote fields with either.
        self._quoting = None if "\r" in lineterminator else csv.writer(self._buffer)

    def writerow(self, row: Iterable[Any]) -> None:
        self.writerows((row,))

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        """Every row of `rows`, taken all before any is written: rows that come one at a time
        (a stream to a pipe) go through `writerow` each."""
        if self._quoting is None:
            self._writer.writerows(rows)
            self._handle.write(self._taken())
            return
        rows = [tuple(row) for row in rows]  # read twice when a field holds "\r"
        self._writer.writerows(rows)
        text = self._taken()
        if "\r" in text:
            lines = []
            for row in rows:
                self._quoting.writerow(row)
                lines.append(self._taken()[:-2] + self._end)  # "\r\n" -> the line end
            text = "".join(lines)
        self._handle.write(text)

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
