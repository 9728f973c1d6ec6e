"""Making written files durable: on disk, not only in the page cache, before a command reports
success or swaps a file or folder into place.

A single file (`atomic_write`, `atomic_path`) is fsynced before it is renamed into place and its
folder after, so that a power cut leaves the old file or the whole new one, never its name over
an empty file.

One `syncfs` of the file system costs about what one `fsync` does, whatever the number of files
written since; a folder of thousands of small files pays it once instead of once a file.
"""

from __future__ import annotations

import contextlib
import os
import sys

_LIBC: object = False  # False: not looked up yet; None: no syncfs here


def _syncfs_function():
    """libc's `syncfs` (Linux), or None where there is none."""
    global _LIBC
    if _LIBC is False:
        _LIBC = None
        if sys.platform.startswith("linux"):
            import ctypes  # here: not on the start-up path of every command

            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL(None, use_errno=True)  # this process's own symbols: libc's
                libc.syncfs.argtypes = [ctypes.c_int]
                _LIBC = libc
    return None if _LIBC is None else _LIBC.syncfs


def sync_file_system(path: str | os.PathLike) -> None:
    """Flush everything written to the file system that holds `path` (a folder): Linux's
    `syncfs`, else `os.sync` (every file system), else nothing (Windows: no such call; its
    renames are not ordered after the data either way). An I/O error is raised as OSError."""
    syncfs = _syncfs_function()
    if syncfs is None:
        if hasattr(os, "sync"):
            os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            import ctypes

            number = ctypes.get_errno()
            raise OSError(number, os.strerror(number), os.fspath(path))
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    """Flush the data of the file at `path`, written and closed by a writer that only takes a
    name (torch.save, savefig, safetensors), to disk. An I/O error is raised as OSError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(folder: str | os.PathLike) -> None:
    """Make the entries of `folder` (a rename into it) durable. Where a folder cannot be opened
    or synced (Windows, some network file systems) this is left to the file system."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
