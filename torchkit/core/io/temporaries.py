"""The temporaries `atomic_write` and `atomic_path` write beside a file, each flocked by its
writer for as long as that writer lives: a temporary whose flock can be taken is a killed
writer's (a SIGKILL cannot be caught, but the kernel drops the lock)."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock to tell a dead writer from a live one
    fcntl = None

# The names `atomic_write` (`.NAME.XXXXXXXX.tmp`) and `atomic_path` (`.STEM.XXXXXXXX.tmp.SUFFIX`)
# give their temporaries: mkstemp's 8 random characters (any name, a newline in it too).
TEMPORARY = re.compile(r"\.(?P<stem>.+)\.[a-z0-9_]{8}\.tmp(?P<suffix>\.[^.]+)?", re.DOTALL)


def _open_unlocked(path: Path) -> int | None:
    """A descriptor of the regular file `path` that holds its flock, or None: not there, a
    link, not a regular file, or a live writer holds the flock (or there is no flock)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # gone, a link, or not ours to read: left alone
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
    except OSError:  # a live writer holds it (or this file system has no flock)
        pass
    os.close(fd)
    return None


def is_unlocked(path: Path) -> bool:
    """`path` is a regular file whose flock nobody holds: no writer is alive to finish it."""
    fd = _open_unlocked(path)
    if fd is None:
        return False
    os.close(fd)
    return True


def remove_if_unlocked(path: Path) -> bool:
    """Remove the regular file `path` if nobody holds its flock; whether it is gone."""
    fd = _open_unlocked(path)
    if fd is None:
        return not os.path.lexists(path)
    try:
        with contextlib.suppress(FileNotFoundError):  # renamed into place meanwhile: done
            os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
