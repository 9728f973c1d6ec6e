"""The temporaries `atomic_write` and `atomic_path` (and the `.torchkit` marker) write beside a
file, made here (`held_temporary`), each flocked by its writer for as long as that writer lives: a
temporary whose flock can be taken is a killed writer's (a SIGKILL cannot be caught, but the kernel
drops the lock). The flock is held through a descriptor no forked child keeps
(`folder_locks.open_unshared`): a loader worker that outlives a killed writer does not make its
temporary look like a live writer's."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePath

from torchkit.core.io.folder_locks import close_lock, open_unshared
from torchkit.core.io.open_outputs import closed, opened
from torchkit.deferred_signals import signals_deferred

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


def held_temporary(target: Path, prefix: str, suffix: str) -> tuple[int, str, int]:
    """mkstemp's (fd, name) for a temporary of `target`, and a descriptor of it holding its
    flock (-1 where there is none) until `close_lock` closes it (a kill closes it too), after
    removing the temporaries of `target` that killed writers left: the ones whose flock nobody
    holds. The flock is held through a descriptor of its own, never the one written through:
    the processes this one forks (loader workers started while a report streams into the
    file) keep neither, and a writer SIGKILLed with such a child alive leaves a temporary the
    next run removes, not one it must take for a live writer's."""
    _remove_dead_temporaries(target, prefix, suffix)
    while True:
        fd, tmp_name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=target.parent)
        if fcntl is None:
            return fd, tmp_name, -1
        try:
            lock_fd = open_unshared(tmp_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:  # another writer took it for dead before the flock
            os.close(fd)
            continue
        except OSError:  # not to be opened again by its name: written unlocked, as below
            return fd, tmp_name, -1
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        except OSError:  # a file system without flock: written unlocked, and never removed
            close_lock(lock_fd)
            return fd, tmp_name, -1
        try:  # still the file made? another writer may have taken it for dead before the flock
            if os.path.samestat(os.fstat(lock_fd), os.fstat(fd)) and os.path.samestat(
                os.stat(tmp_name), os.fstat(fd)
            ):
                return fd, tmp_name, lock_fd
        except FileNotFoundError:
            pass
        close_lock(lock_fd)
        os.close(fd)


def remove_dead_temporaries(target: str | os.PathLike) -> None:
    """Remove the temporaries of `target` (`atomic_write`'s `.NAME.XXXXXXXX.tmp`) that killed
    writers left beside it, for a caller that asks what their folder holds before it writes
    `target` again; a live writer's stays."""
    target = Path(target)
    _remove_dead_temporaries(target, *temporary_affixes(target.name))


def _remove_dead_temporaries(target: Path, prefix: str, suffix: str) -> None:
    """Remove the temporaries named `prefix`XXXXXXXX`suffix` (mkstemp's) beside `target`
    whose flock can be taken at once: a killed writer's (a SIGKILL cannot be caught, the
    kernel drops the lock), never a live one's. Names that are not exactly that are left."""
    if fcntl is None:  # Windows: no flock to tell a dead writer from a live one
        return
    candidates = _temporaries_in(target.parent)
    if not candidates:
        return
    exact = re.compile(re.escape(prefix) + "[a-z0-9_]{8}" + re.escape(suffix))
    for name in [name for name in candidates if exact.fullmatch(name)]:
        if remove_if_unlocked(target.parent / name):
            with contextlib.suppress(ValueError):  # another thread took it off already
                candidates.remove(name)


# Folder -> the names in it that look like temporaries, listed at the first write into it in
# this process: one listing a folder, not one a file (thousands of frames or shards). A killed
# writer's temporary is there before this process starts, so the first listing finds it.
_FOLDER_TEMPORARIES: dict[tuple[str, int, int], list[str]] = {}


def _temporaries_in(folder: Path) -> list[str]:
    try:
        status = os.stat(folder)
    except OSError:
        return []
    key = (os.path.abspath(folder), status.st_dev, status.st_ino)
    names = _FOLDER_TEMPORARIES.get(key)
    if names is None:
        try:
            names = [name for name in os.listdir(folder) if TEMPORARY.fullmatch(name)]
        except OSError:
            names = []
        if len(_FOLDER_TEMPORARIES) >= 4096:  # a long-lived process: stay small
            _FOLDER_TEMPORARIES.clear()
        _FOLDER_TEMPORARIES[key] = names
    return names


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _current_umask()


def apply_umask(path: str) -> None:
    """mkstemp makes files 0600; give outputs the usual permissions (0666 less the umask)."""
    os.chmod(path, 0o666 & ~UMASK)


def keep_replaced_permissions(path: str | os.PathLike, target: str | os.PathLike) -> None:
    """The finished temporary `path` gets the permissions of the regular file at `target` that
    it is about to replace, as `>` and `cp` keep them: a report made private (`chmod 600`) or
    read-only stays so when `--force` or `--append` writes it anew, where the new file had the
    umask's (0644). Its group is kept too where this user may give it (a member of the
    group; root: the owner as well), so that a report shared with a project's group stays
    readable by the group. Set-ID bits are not carried over; a symbolic link or nothing at
    `target` leaves the umask's permissions."""
    try:
        status = os.lstat(target)
    except OSError:
        return
    if not stat.S_ISREG(status.st_mode):
        return
    made = os.lstat(path)
    owner = status.st_uid if status.st_uid != made.st_uid and os.geteuid() == 0 else -1
    group = status.st_gid if status.st_gid != made.st_gid else -1
    if owner != -1 or group != -1:
        with contextlib.suppress(OSError):  # not a member of the group: the umask's group
            os.chown(path, owner, group)
    os.chmod(path, stat.S_IMODE(status.st_mode) & 0o777)  # after chown, which may clear bits


def folder_permissions(path: str | os.PathLike) -> int | None:
    """The permissions of the folder at `path` itself (a link is not followed), which a new
    output folder made in its place takes (`give_folder_permissions`); None: no folder."""
    try:
        status = os.lstat(path)
    except OSError:
        return None
    return stat.S_IMODE(status.st_mode) & 0o777 if stat.S_ISDIR(status.st_mode) else None


def give_folder_permissions(folder: str | os.PathLike, permissions: int | None) -> None:
    """The new output `folder` gets the `permissions` of the folder it replaces, as `>`
    keeps a file's: a run folder made private (`chmod 700`) stays so under `--force`, where it
    became 0755. The owner keeps read, write and search, which the command writes with."""
    if permissions is not None:
        os.chmod(folder, permissions | stat.S_IRWXU)


class OpenTemporary:
    """A `held_temporary` from its making until it is renamed into place or removed: open
    (`open_outputs`) all that time, so that a stop where its writer's clean-up is not in place
    (as `discarded_on_failure` is entered) still removes it at the end of the command."""

    def __init__(self, name: str, lock_fd: int) -> None:
        self.name = name
        self.lock_fd = lock_fd  # -1: none held (or released)
        self._token: int | None = opened(self)

    def remove(self) -> None:
        """The temporary gone (one renamed into place is not at its name any more)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.name)

    def release(self) -> None:
        """Its flock released; nothing of it is left to close."""
        lock_fd, self.lock_fd = self.lock_fd, -1
        if lock_fd >= 0:
            close_lock(lock_fd)
        closed(self._token)

    def close_unfinished(self, error: BaseException | None) -> None:
        self.remove()
        self.release()


def open_temporary(target: Path, prefix: str, suffix: str) -> tuple[int, OpenTemporary]:
    """`held_temporary`'s descriptor and temporary, the temporary registered as open before a
    signal that came while it was made is raised (its name is known only once it is made)."""
    with signals_deferred():
        fd, name, lock_fd = held_temporary(target, prefix, suffix)
        return fd, OpenTemporary(name, lock_fd)


@contextlib.contextmanager
def discarded_on_failure(temporary: OpenTemporary) -> Iterator[None]:
    """An `open_temporary`'s clean-up: the temporary removed if the block fails (it was not
    renamed into place), and its flock released either way."""
    try:
        yield
    except BaseException:
        temporary.remove()
        raise
    finally:
        temporary.release()
