"""The paths piped for `-` (predict, extract-features, video-info), one per line, read as they
arrive: a command can work on the first paths while the program writing the list (`find ...`)
still runs, and never holds more of the list than it is working on.

Blank lines and a byte order mark are skipped, and a line's end is `\n` or `\r\n` (a list
saved on Windows); the bytes of a line are the file's name (os.fsdecode): a name that is not
UTF-8 opens the same file, whatever the locale's strict decoding of stdin would have said.
With `--null` (`NulSeparated`) the paths end in NUL bytes instead (`find -print0`): any name a
file can have (one with a line break, a carriage return or spaces around it) is read exactly.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from torchkit.core.io.errors import InputError, UsageError

_READ_SIZE = 1 << 16
# More than any one path a system opens (Linux's PATH_MAX is 4,096 bytes; Windows' long paths
# 32,767 characters): with --null, so much without a NUL and with line breaks is a `find` list.
_LONGEST_PATH = 1 << 20


def _lines_for_null_error() -> UsageError:
    """--null given for a list of one path per line (`find` without -print0)."""
    return UsageError(
        "the paths on stdin are separated by line breaks, not NUL bytes",
        "drop --null to read one path per line",
    )


class NulSeparated:
    """`stream` (stdin) whose paths end in NUL bytes (`--null`), as `PathStream` reads it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream


class PathStream:
    """The paths on `stdin`, taken a few at a time (`take`). Made once the first path has come:
    a list without any is an InputError naming `what` the paths are (image, video)."""

    def __init__(self, stdin: Iterable[str] | None, what: str) -> None:
        self._null = isinstance(stdin, NulSeparated)
        if self._null:
            stdin = stdin.stream  # type: ignore[union-attr]
        if stdin is None:
            raise UsageError("- reads paths from stdin, but there is none")
        # A list: paths read already (by rank 0 under torchrun, before the images), as they are.
        self._exact = self._null or isinstance(stdin, (list, tuple))
        self._fd = _pollable_fd(stdin)
        self._lines: Iterator[Any] | None = None
        if self._fd is None:  # a stream in memory (or no poll): read line by line, waiting
            source = getattr(stdin, "buffer", None) or stdin
            # NUL-separated: all of it, as one line (its pieces are split as a pipe's are)
            self._lines = iter([source.read()] if self._null else source)
        self._ready: deque[str] = deque()
        # The start of a line whose end has not come yet, as read: joined once its end comes
        # (joined at each read, a long line was copied again at every read: quadratic).
        self._partial: list[bytes] = []
        self._partial_bytes = 0
        self._partial_breaks = False  # whether it holds a line break (with --null)
        self._seen_nul = False
        self._first_line = True
        self._ended = False
        self._read_until_ready()
        if not self._ready:
            raise InputError(f"no {what} paths on stdin", "pipe one path per line, e.g. find ... |")

    def take(self, most: int) -> list[str]:
        """Up to `most` paths, in order: waits for one, then takes those piped already without
        waiting for more; [] once the list has ended."""
        self._read_until_ready()
        while len(self._ready) < most and not self._ended and self._more_now():
            self._read()
        count = min(most, len(self._ready))
        return [self._ready.popleft() for _ in range(count)]

    def _read_until_ready(self) -> None:
        while not self._ready and not self._ended:
            self._read()

    def _more_now(self) -> bool:
        """Whether reading now would not wait (a stream in memory: always)."""
        if self._fd is None:
            return True
        import select

        return bool(select.select([self._fd], [], [], 0)[0])

    def _read(self) -> None:
        """Read once: what the pipe holds (a line from a stream in memory)."""
        if self._lines is not None:
            line = next(self._lines, None)
            if line is None:
                self._ended = True
            elif self._null:
                text = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else line
                self._refuse_lines_for_null(text)
                self._add_pieces(text + b"\0")
            else:
                self._add(line)
            return
        data = os.read(self._fd, _READ_SIZE)  # type: ignore[arg-type]
        if not data:
            self._ended = True
            rest = b"".join(self._partial)
            if rest:  # a last line without its newline
                self._refuse_lines_for_null(rest)
                self._add(rest)
            return
        self._add_pieces(data)

    def _add_pieces(self, data: bytes) -> None:
        """The paths that `data`, after what came before it, ends; keeps the start of the next."""
        self._refuse_nul(data)  # at once: a `find -print0` list is one "line" until its end
        self._seen_nul = self._seen_nul or b"\0" in data
        separator = b"\0" if self._null else b"\n"
        if separator not in data:  # no line ends in it
            self._partial.append(data)
            self._partial_bytes += len(data)
            self._partial_breaks = self._partial_breaks or self._null and b"\n" in data
            if self._partial_breaks and not self._seen_nul and self._partial_bytes > _LONGEST_PATH:
                # No path is so long: a list of lines, refused now rather than at its end.
                raise _lines_for_null_error()
            return
        lines = b"".join([*self._partial, data]).split(separator)
        last = lines.pop()
        self._partial, self._partial_bytes = ([last], len(last)) if last else ([], 0)
        self._partial_breaks = self._null and b"\n" in last
        for line in lines:
            self._add(line)

    def _refuse_nul(self, data: bytes | str) -> None:
        """A NUL byte, which no file name holds, in a list read one path per line: the list of
        `find -print0` without --null, which was read as one unreadable path (exit 0)."""
        if not self._null and ("\0" if isinstance(data, str) else b"\0") in data:
            raise UsageError(
                "the paths on stdin are separated by NUL bytes (find -print0)",
                "pass --null to read them so",
            )

    def _refuse_lines_for_null(self, rest: bytes) -> None:
        """With --null, a whole list (`rest`: all that came, no NUL among it) holding line breaks:
        the list of `find` (one path per line), which was read as one unreadable path whose
        name held every line. `find -print0` ends each path, the last too, in a NUL."""
        if self._null and not self._seen_nul and b"\0" not in rest and b"\n" in rest:
            raise _lines_for_null_error()

    def _add(self, line: bytes | str) -> None:
        self._refuse_nul(line)
        if self._exact:  # as piped; only the empty piece after a last NUL is no path
            if line:
                self._ready.append(os.fsdecode(line))
            return
        path = os.fsdecode(line.rstrip(b"\r\n")) if isinstance(line, bytes) else line.rstrip("\r\n")
        if self._first_line:
            self._first_line = False
            if path.startswith("\ufeff"):  # a list saved as "UTF-8 with BOM"
                path = path[1:]
        if path.strip():
            self._ready.append(path)


def _pollable_fd(stdin: Any) -> int | None:
    """The file descriptor under `stdin` when it can be asked whether it holds more (a pipe, a
    file, a terminal on POSIX); None otherwise (a stream in memory, Windows' pipes)."""
    try:
        fd = stdin.fileno()
        import select

        select.select([fd], [], [], 0)
    except (AttributeError, OSError, ValueError, ImportError):
        return None
    return fd
