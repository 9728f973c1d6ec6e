"""flocks on a folder (or a file) itself, through a read-only descriptor of it: no lock file is
made, so a read-only dataset is locked like any other. Where no flock can be had (no fcntl, as
on Windows; a file system without flock, or an NFS mount that refuses one on a folder; a path
that cannot be opened) there is none, and no error: these locks keep torchkit's own commands
from running into each other, and never stand in the way of reading data.

A lock a command holds to its end (a reader's, `core.data.sources.moving.lock_for_reading`) is
kept by `hold` until `held_until_the_command_ends` (entered around every command) is left."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def flock_path(path: str | os.PathLike, *, exclusive: bool) -> int | None:
    """A descriptor of `path` holding a non-blocking flock on it (shared, or `exclusive`), or
    None where no lock can be had (above). Raises BlockingIOError where another descriptor
    holds one that conflicts (another process; or this one, through another descriptor)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: a FIFO is not waited on
    except OSError:
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError:  # no flock there
        os.close(fd)
        return None
    return fd


def held_exclusively(path: str | os.PathLike) -> bool:
    """Does another descriptor hold an exclusive flock on `path` (as opposed to shared ones)?"""
    try:
        fd = flock_path(path, exclusive=False)
    except BlockingIOError:
        return True
    if fd is not None:
        os.close(fd)
    return False


# The locks held until the end of each command running (nested where a command runs another
# in this process), by key (a real path).
_scopes: list[dict[str, int]] = []


@contextlib.contextmanager
def held_until_the_command_ends() -> Iterator[None]:
    """The locks `hold` keeps inside are released on leaving."""
    scope: dict[str, int] = {}
    _scopes.append(scope)
    try:
        yield
    finally:
        if scope in _scopes:
            _scopes.remove(scope)
        for fd in scope.values():
            os.close(fd)


def is_held(key: str) -> bool:
    """Does this process hold a lock kept under `key` by `hold`?"""
    return any(key in scope for scope in _scopes)


def hold(key: str, fd: int) -> None:
    """Keep `fd` (and its lock) open until the command ends. Outside a command (core called
    from Python) it is closed at once: the lock was a check."""
    if not _scopes or key in _scopes[-1]:
        os.close(fd)
    else:
        _scopes[-1][key] = fd


def _forget_in_child() -> None:
    # A forked worker (DataLoader, process pool) that outlived the command would keep its
    # locks after the command ends: the parent's descriptors hold them alone.
    for scope in _scopes:
        for fd in scope.values():
            with contextlib.suppress(OSError):
                os.close(fd)
    _scopes.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_in_child)
