"""flocks on a folder (or a file) itself, through a read-only descriptor of it: no lock file is
made, so a read-only dataset is locked like any other. Where no flock can be had (no fcntl, as
on Windows; a file system without flock, or an NFS mount that refuses one on a folder; a path
that cannot be opened) there is none, and no error: these locks keep torchkit's own commands
from running into each other, and never stand in the way of reading data.

A lock a command holds to its end (a reader's, `core.data.sources.moving.lock_for_reading`) is
kept by `hold` until `held_until_the_command_ends` (entered around every command) is left.

No process forked from a command holds its locks: a child shares the parent's open file (and
so its flock) until the child closes its copy of the descriptor, and a DataLoader worker whose
parent was SIGKILLed lives on a while (until its PR_SET_PDEATHSIG signal lands, or torch's next
look at its parent, up to 5 s), refusing a rerun at once on the same output as "being written
by another torchkit process". The locks
`hold` keeps and the descriptors given to `close_in_forked_children` are closed in every
forked child at once (`_forget_in_child`); `open_unshared` opens a descriptor that is so from
the start, and `close_lock` closes one, with no fork in between."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass


def flock_path(path: str | os.PathLike, *, exclusive: bool) -> int | None:
    """A descriptor of `path` holding a non-blocking flock on it (shared, or `exclusive`), or
    None where no lock can be had (above); no forked child holds it (`open_unshared`: close
    it with `close_lock`). Raises BlockingIOError where another descriptor holds one that
    conflicts (another process; or this one, through another descriptor)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        # O_NONBLOCK: a FIFO is not waited on.
        fd = open_unshared(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        close_lock(fd)
        raise
    except OSError:  # no flock there
        close_lock(fd)
        return None
    return fd


def held_exclusively(path: str | os.PathLike) -> bool:
    """Does another descriptor hold an exclusive flock on `path` (as opposed to shared ones)?"""
    try:
        fd = flock_path(path, exclusive=False)
    except BlockingIOError:
        return True
    if fd is not None:
        close_lock(fd)
    return False


@dataclass(frozen=True)
class LockHolder:
    """The process holding a flock that refused torchkit, as far as can be told: any process
    may hold one (`flock FILE CMD` in a script, a backup tool), not only another torchkit run."""

    pid: int | None
    name: str | None  # its command name (`flock`), where known
    torchkit: bool  # known to be torchkit: it wrote its PID in the lock file, or runs torchkit

    def __str__(self) -> str:
        if self.torchkit:
            return "another torchkit process" + (f" (PID {self.pid})" if self.pid else "")
        if self.pid is None:
            return "another process (a torchkit run?)"
        return f"another process (PID {self.pid}" + (f", {self.name})" if self.name else ")")


def lock_holder(path: str | os.PathLike | int, recorded_pid: int | None = None) -> LockHolder:
    """Who holds the flock on `path` (a path or a descriptor of it): the PID in Linux's
    /proc/locks, taken for torchkit where it is `recorded_pid` (the PID a torchkit lock file
    holds) or its command line runs torchkit. Without /proc/locks, `recorded_pid` alone."""
    pid = flock_holder(path)
    if pid is None:
        return LockHolder(recorded_pid, None, torchkit=recorded_pid is not None)
    torchkit = pid == recorded_pid or _runs_torchkit(pid)
    return LockHolder(pid, _command_name(pid), torchkit=torchkit)


def flock_holder(path: str | os.PathLike | int) -> int | None:
    """The PID of a process holding a flock on `path` (a writer before readers) as Linux's
    /proc/locks lists it (`1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146553 0 EOF`: device major
    and minor in hex, then the inode); None where it cannot be told (no /proc/locks, a holder
    in another PID namespace, shown as 0 or -1). Read only once a lock has refused a command."""
    try:
        found = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    file_id = (os.major(found.st_dev), os.minor(found.st_dev), found.st_ino)
    holders: list[tuple[bool, int]] = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":  # "N: -> FLOCK ...": a waiter, not a holder
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            lock_id = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        if lock_id == file_id and pid > 0:
            holders.append((fields[3] != "WRITE", pid))
    return min(holders)[1] if holders else None


def _command_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def _runs_torchkit(pid: int) -> bool:
    """Whether process `pid` is this one or runs torchkit (`torchkit ...`, `python -m
    torchkit ...`), from its command line."""
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    named = any(os.path.basename(word) == "torchkit" for word in words[:2])
    return named or ("-m", "torchkit") in itertools.pairwise(words)


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
            close_lock(fd)


def is_held(key: str) -> bool:
    """Does this process hold a lock kept under `key` by `hold`?"""
    return any(key in scope for scope in _scopes)


def hold(key: str, fd: int) -> None:
    """Keep `fd` (and its lock) open until the command ends. Outside a command (core called
    from Python) it is closed at once: the lock was a check."""
    if not _scopes or key in _scopes[-1]:
        close_lock(fd)
    else:
        _scopes[-1][key] = fd


# Descriptors holding a lock this process keeps (`close_in_forked_children`), by number, with
# the (device, inode) of their file: a number the parent reused for another file since (a
# descriptor closed without `close_lock`) is not closed in a child.
_lock_descriptors: dict[int, tuple[int, int]] = {}


# Held while a descriptor is opened and registered (`open_unshared`), or unregistered and
# closed (`close_lock`), and across every fork: a process forked between the two steps would
# keep its copy of the descriptor, and with it the flock.
_opening = threading.RLock()  # re-entrant: a fork in a signal handler run inside never waits


def close_in_forked_children(fd: int) -> int:
    """Have every process forked from this one close `fd` (a descriptor holding a lock) first
    thing, so that the lock is this process's alone and goes when this process dies; close it
    with `close_lock`. Returns `fd`."""
    with contextlib.suppress(OSError):
        info = os.fstat(fd)
        _lock_descriptors[fd] = (info.st_dev, info.st_ino)
    return fd


def open_unshared(path: str | os.PathLike, flags: int, mode: int = 0o666) -> int:
    """`os.open(path, flags | O_CLOEXEC, mode)` for a descriptor that is to hold a flock: given
    to `close_in_forked_children` before another thread can fork (a DataLoader started beside
    a download thread), so that no child ever shares it. Close it with `close_lock`."""
    with _opening:
        cloexec = getattr(os, "O_CLOEXEC", 0)  # none on Windows, which has no fork either
        return close_in_forked_children(os.open(path, flags | cloexec, mode))


def close_lock(fd: int) -> None:
    """Close `fd`, given to `close_in_forked_children` (or not)."""
    with _opening:  # a child forked between the two would keep it open, and hold its lock
        _lock_descriptors.pop(fd, None)
        os.close(fd)


def _forget_in_child() -> None:
    _opening.release()  # taken by the thread of the parent that forked (`_before_fork`)
    # A forked worker (DataLoader, process pool) outlives a SIGKILLed command for a while, and
    # one that outlived the command would keep its locks after the command ends: the parent's
    # descriptors hold them alone.
    for scope in _scopes:
        for fd in scope.values():
            with contextlib.suppress(OSError):
                os.close(fd)
    _scopes.clear()
    for fd, file_id in list(_lock_descriptors.items()):
        with contextlib.suppress(OSError):
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) == file_id:
                os.close(fd)
    _lock_descriptors.clear()


def _before_fork() -> None:
    _opening.acquire()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(
        before=_before_fork, after_in_parent=_opening.release, after_in_child=_forget_in_child
    )
