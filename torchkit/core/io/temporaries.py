"""The temporaries `atomic_write` and `atomic_path` write beside a file, each flocked by its
writer for as long as that writer lives: a temporary whose flock can be taken is a killed
writer's (a SIGKILL cannot be caught, but the kernel drops the lock). The flock is held through
a descriptor no forked child keeps (`folder_locks.open_unshared`): a loader worker that outlives
a killed writer does not make its temporary look like a live writer's."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from pathlib import Path, PurePath

from torchkit.core.io.folder_locks import close_lock, open_unshared

try:
    import fcntl
except ImportError:  # Windows: no flock to tell a dead writer from a live one
    fcntl = None

# The names `atomic_write` (`.NAME.XXXXXXXX.tmp`) and `atomic_path` (`.STEM.XXXXXXXX.tmp.SUFFIX`)
# give their temporaries: mkstemp's 8 random characters (any name, a newline in it too). A
# NAME (STEM) too long for that to fit in a file name is shortened (`temporary_affixes`).
TEMPORARY = re.compile(r"\.(?P<stem>.+)\.[a-z0-9_]{8}\.tmp(?P<suffix>\.[^.]+)?", re.DOTALL)

# The bytes of a file name (ext4, XFS, Btrfs, APFS, NTFS's 255 UTF-16 units at least).
NAME_MAX = 255
_RANDOM = 8  # mkstemp's random characters
# A SUFFIX kept in the temporary's name at most: a writer goes by a file's extension (np.save
# adds `.npy` to a name without it); a longer one is no extension any writer knows.
_SUFFIX_MAX = 16


def temporary_affixes(stem: str, suffix: str = "") -> tuple[str, str]:
    """mkstemp's prefix and suffix of a temporary of the file `stem + suffix`: `.STEM.` and
    `.tmp.SUFFIX` (`.tmp` without one), STEM `fitting` a file name with the rest (a valid
    output name of 242 bytes or more is not: its temporary's STEM is shortened)."""
    if len(os.fsencode(suffix)) > _SUFFIX_MAX:
        stem, suffix = stem + suffix, ""
    ending = f".tmp{suffix}"
    return f".{fitting(stem, 2 + _RANDOM + len(os.fsencode(ending)), suffix)}.", ending


def fitting(name: str, extra: int, hashed_tail: str = "") -> str:
    """`name`, or where `extra` bytes more would not fit in a file name (what a hidden file
    beside it adds: a dot, a random part, a suffix), its head cut, whole characters at a time,
    ending in `~` and 8 hex digits of the hash of `name + hashed_tail` (the whole name it is
    cut from): still one name for each, so that a writer finds its killed predecessors' files
    by the name it writes."""
    room = NAME_MAX - extra
    if len(os.fsencode(name)) <= room:
        return name
    digest = hashlib.sha256(os.fsencode(name + hashed_tail)).hexdigest()[:8]
    return f"{cut_to_bytes(name, room - len(f'~{digest}'))}~{digest}"


def cut_to_bytes(text: str, budget: int) -> str:
    """`text`'s head, whole characters at a time, of at most `budget` bytes as the file system
    encodes it."""
    while len(os.fsencode(text)) > budget:
        text = text[: min(len(text) - 1, budget)]
    return text


def temporary_stems(name: str) -> set[str]:
    """What `TEMPORARY` reads (its stem and suffix joined) from the names of the temporaries
    `atomic_write` and `atomic_path` give the file `name`: `name` itself, or the shortened
    names of a long one."""
    path = PurePath(name)
    stems = set()
    for stem, suffix in ((name, ""), (path.stem, path.suffix)):
        prefix, ending = temporary_affixes(stem, suffix)
        stems.add(prefix[1:-1] + ending[len(".tmp") :])
    return stems


def temporary_stem(name: str) -> str | None:
    """What `TEMPORARY` reads from the file name `name` (stem and suffix joined: the name of
    the file it is a temporary of, or of a long one its shortened name), or None: not one."""
    found = TEMPORARY.fullmatch(name)
    return None if found is None else found["stem"] + (found["suffix"] or "")


def _open_unlocked(path: Path) -> int | None:
    """A descriptor of the regular file `path` that holds its flock, or None: not there, a
    link, not a regular file, or a live writer holds the flock (or there is no flock)."""
    if fcntl is None:
        return None
    try:  # a process forked meanwhile keeps no copy: the flock is this process's alone
        fd = open_unshared(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # gone, a link, or not ours to read: left alone
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
    except OSError:  # a live writer holds it (or this file system has no flock)
        pass
    close_lock(fd)
    return None


def is_unlocked(path: Path) -> bool:
    """`path` is a regular file whose flock nobody holds: no writer is alive to finish it."""
    fd = _open_unlocked(path)
    if fd is None:
        return False
    close_lock(fd)
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
        close_lock(fd)
