"""Output folder locks: `.NAME.torchkit-lock` beside a folder being written, flocked; a second
command on the same folder is refused at once with the holder's PID.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from torchkit.core.io.errors import (
    OutputWriteError,
    TorchkitError,
)
from torchkit.core.io.folder_locks import close_lock, lock_holder, open_unshared
from torchkit.core.io.output_paths import LOCK_SUFFIX, shown, sibling_base
from torchkit.core.io.write_errors import write_error


class OutputLockedError(TorchkitError):
    """Another process holds the lock of an output: a torchkit run writing it, or any other
    process holding a flock on it (`folder_locks.lock_holder` says which, where it can)."""


def lock_path(folder: Path) -> Path:
    return folder.parent / f".{sibling_base(folder)}{LOCK_SUFFIX}"


def _lock_error(folder: Path, lock: Path, what: str, error: OSError) -> OutputWriteError:
    """A lock file the folder above the output does not take. Where that folder is there and
    says "no such file" (`/proc`, a pseudo file system: `split data /proc/self --force`), the
    error names the folder that refused and what to do; errno's words alone, "cannot write
    /proc/self: No such file or directory (free some space...)", named a folder that is there
    and advice that cannot help."""
    if error.errno == errno.ENOENT and lock.parent.is_dir():
        return OutputWriteError(
            f"{what} {shown(folder)} cannot be written: {shown(lock.parent)} takes no new "
            f"files, not even the lock torchkit keeps beside it ({lock.name})",
            "choose an output folder on a disk that holds files",
        )
    return write_error(folder, error)


class FolderLock:
    """An exclusive `flock` on `.NAME.torchkit-lock` beside the folder. The kernel drops it when
    the process dies (even by SIGKILL), so a stale lock never blocks anyone."""

    def __init__(self, folder: Path, what: str) -> None:
        import fcntl

        self.path = lock_path(folder)
        # Parents made only for the lock are removed again on release if still empty, so a
        # command refused for bad input leaves no new folders behind.
        self.made = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise write_error(folder, error) from error
        while True:
            try:
                # Not held by the workers and helpers this process starts: they would keep the
                # folder locked after a SIGKILL of this process (see `folder_locks`).
                fd = open_unshared(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise _lock_error(folder, self.path, what, error) from error
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # Any process may hold it (`flock .NAME.torchkit-lock CMD` in a script), not
                # only a torchkit run, which writes its PID in the file.
                holder = lock_holder(fd, _read_pid(fd))
                close_lock(fd)
                if holder.torchkit:
                    raise OutputLockedError(
                        f"{what} {folder} is being written by {holder}",
                        "wait for it to finish, or choose another folder",
                    ) from None
                raise OutputLockedError(
                    f"{what} {folder} is locked by {holder}, which holds {self.path}",
                    "wait for it to finish, or choose another folder",
                ) from None
            # The holder before us may have removed the file after we opened it: only a lock
            # on the file that is still at the path counts.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            close_lock(fd)
        self.fd = fd
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as error:  # a full disk has room for the lock's name, not its PID
            self.release()  # the lock file and the folders made for it go again
            raise write_error(folder, error) from error

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        close_lock(self.fd)
        self.fd = None
        for parent in self.made:  # innermost first; rmdir refuses a folder that has content
            with contextlib.suppress(OSError):
                parent.rmdir()


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None
