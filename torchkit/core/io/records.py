"""Records torchkit wrote earlier and reads back (a split's journal, extract-features'
progress.json and meta.json, an output's `.torchkit-written`, a run's config.json...), opened
only where they are regular files: a FIFO someone put under such a name (in /tmp, in a shared
folder) blocks a plain `open` for reading until something writes to it, possibly for ever. The
file is opened without blocking and `fstat`-ed before a byte is read, so the check is race-free;
anything else is `NotARegularFile`, an OSError, which every reader of a record already takes as
"no record it can read"."""

from __future__ import annotations

import io
import json
import os
import stat
from typing import IO, Any, BinaryIO

from torchkit.core.io.file_kinds import LINK_TO_NOTHING, file_kind


class NotARegularFile(OSError):
    """A path that names something other than a regular file (a FIFO, a device, a socket, a
    folder, a symbolic link to nothing)."""


def open_regular_file(path: str | os.PathLike) -> BinaryIO:
    """`open(path, "rb")` for regular files only (following symbolic links); anything else
    raises `NotARegularFile` without blocking."""
    try:
        # The opener hands the descriptor to the file object inside `open` itself: a Ctrl-C
        # or SIGTERM raised just after `os.fdopen` made the file object (which then closes
        # it) was followed by a second close here, and ended as `Bad file descriptor`, not
        # as the stop (or closed another thread's file that had taken the number meanwhile).
        return open(path, "rb", opener=regular_file_descriptor)
    except FileNotFoundError:
        if os.path.islink(path):
            raise NotARegularFile(f"not a regular file ({LINK_TO_NOTHING})") from None
        raise


def regular_file_descriptor(path: str, _flags: int) -> int:
    """`open_regular_file`'s opener: a descriptor of a regular file, opened without blocking
    (`open`'s own flags for "rb" are not used)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(f"not a regular file ({file_kind(info.st_mode)})")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_record(path: str | os.PathLike, errors: str = "strict") -> IO[str]:
    """A record opened to read as UTF-8 text (`errors`: `NAME_ERRORS` for one that names
    files), a regular file only (`NotARegularFile` otherwise, never a wait)."""
    return io.TextIOWrapper(open_regular_file(path), encoding="utf-8", errors=errors, newline="")


def read_record_bytes(path: str | os.PathLike) -> bytes:
    """The whole of the record at `path`, a regular file only."""
    with open_regular_file(path) as handle:
        return handle.read()


def read_record_text(path: str | os.PathLike) -> str:
    """The record at `path` as UTF-8 text (lines as `read_text` gives them), a regular file
    only."""
    return read_record_bytes(path).decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def read_record_json(path: str | os.PathLike) -> Any:
    """The JSON record at `path`, a regular file only (OSError, ValueError as `json.load`)."""
    return json.loads(read_record_bytes(path))
