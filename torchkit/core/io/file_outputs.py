"""File outputs: checked before any work (`check_output_file`), published atomically only over
what was checked (`publish_file`), an old file set aside while its run lives (`ReplacedFiles`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from torchkit.core.io.claims import lstat_id, reporting_write_errors, synced_when_kept
from torchkit.core.io.durability import fsync_directory
from torchkit.core.io.errors import (
    OutputExistsError,
    OutputWriteError,
)
from torchkit.core.io.file_kinds import file_kind
from torchkit.core.io.folder_locks import close_lock, lock_holder, open_unshared
from torchkit.core.io.mounts import is_mount_point
from torchkit.core.io.open_outputs import closed, opened
from torchkit.core.io.output_locks import OutputLockedError
from torchkit.core.io.output_paths import (
    REPLACED_SUFFIX,
    FileId,
    leftovers,
    remove_tree,
    shown,
    sibling,
)
from torchkit.core.io.overlap import InputPath, check_overlap
from torchkit.core.io.special_files import (
    check_block_device,
    check_not_a_folder,
    check_not_folder_name,
    check_not_socket,
    check_not_stdout,
    check_own_descriptor_open,
    check_terminal_present,
    is_special_file,
    note_stdout,
)
from torchkit.core.io.temporaries import (
    apply_umask,
    discarded_on_failure,
    keep_replaced_permissions,
    open_temporary,
    remove_if_unlocked,
    temporary_affixes,
)
from torchkit.deferred_signals import signals_deferred

log = logging.getLogger("torchkit")


def check_folders_above(path: str | os.PathLike, what: str) -> None:
    """The nearest existing folder above `path` is one: a file there (`-o notes.txt/x.json`)
    would fail the write only at the end, after all the work, as "File exists"."""
    for above in Path(os.path.abspath(path)).parents:
        if above.is_dir():
            return
        if above.exists() or above.is_symlink():
            kind = file_kind((os.stat if above.exists() else os.lstat)(above).st_mode)
            raise OutputWriteError(
                f"cannot write {what} {shown(path)}: {shown(above)} is {kind}, not a folder",
                "give a path inside a folder",
            )


def check_folder_writable(path: str | os.PathLike) -> None:
    """The folder a file output `path` goes into takes a new file, before any work (a probe
    made and removed there; a folder still to be made, the nearest one above it): a read-only
    disk or a folder without write permission is found now, not when the result of a long run
    is written. Special files are written into, never beside: not probed."""
    import tempfile

    target = Path(path)
    if is_special_file(target):
        return
    existing = target.absolute().parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():  # below a file: `check_folders_above` says so
        return
    with reporting_write_errors(target):
        prefix, suffix = temporary_affixes(target.stem)
        try:
            fd, probe = tempfile.mkstemp(suffix, prefix, dir=existing)
        except FileNotFoundError as error:  # a folder that is there takes no file: /proc
            raise OutputWriteError(
                f"cannot write {shown(target)}: {shown(existing)} takes no new files",
                "choose another output, on a disk that holds files",
            ) from error
        os.close(fd)
        remove_tree(Path(probe), ignore_errors=False)


def check_output_file(
    path: str | os.PathLike,
    force: bool,
    inputs: Iterable[InputPath | None] = (),
    *,
    what: str = "output",
) -> Path:
    """Check a file output (`-o FILE`, DST) before any work: not `-` (stdout), not a name that
    ends in `/` (`check_not_folder_name`), not an input nor inside an input folder, not a
    folder, not below a file, not an existing file unless `force`, and in a folder that takes
    a new file (`check_folder_writable`). Special files are written into: they pass unless
    they cannot be written (a socket, a descriptor closed or open for reading only), hold data
    (a block device, without `force`) or are an input (`/dev/stdout >> FILE`)."""
    check_not_stdout(path, what)
    check_not_folder_name(path, what)
    target = Path(path)
    note_stdout(target)
    if is_special_file(target):
        check_own_descriptor_open(target, what)
        check_not_socket(target, what)
        check_terminal_present(target, what)
        check_block_device(target, force, what)
        if os.path.isfile(target):  # `-o /dev/stdout >> FILE`: appended to FILE, an input?
            check_overlap(target, what, inputs)
        return target
    check_overlap(target, what, inputs)
    check_folders_above(target, what)
    check_not_a_folder(target, what)
    if target.is_file() and not target.is_symlink() and is_mount_point(target):
        # A file bind-mounted at its name (`docker run -v ./report.json:/out/report.json`) is
        # never renamed over, nor hard-linked aside to another mount: refused now, not with a
        # raw EBUSY or EXDEV once the work is done.
        raise OutputExistsError(
            f"{what} {shown(target)} is a mount point (a file mounted there), which torchkit "
            "cannot replace",
            "give another file name, and copy the result there yourself",
        )
    if (target.exists() or target.is_symlink()) and not force:
        raise OutputExistsError(f"{what} already exists: {target}", "pass --force to overwrite it")
    # A read-only disk (or a folder without permission) is found before any work, not when the
    # file is written at the end: after a split, a conversion or an eval, with --force, had
    # replaced its main output by then. Probed at every check, never taken from an earlier one:
    # a process that lives on (the library used from Python) sees a folder made read-only or
    # remounted since. A probe costs about half a millisecond, a written file (fsynced) tens.
    check_folder_writable(target)
    _CHECKED_FILES[os.path.abspath(target)] = (_file_state(target), what)
    return target


# Absolute path -> (what `check_output_file` found at a file output, None for nothing; what the
# output is): the finished file replaces that only (`publish_file`), never a file another
# process wrote at its name while the command ran. An entry ends with the write it was for.
_CHECKED_FILES: dict[str, tuple[tuple[int, int, int] | None, str]] = {}


def _file_state(path: str | os.PathLike) -> tuple[int, int, int] | None:
    """What is at `path` itself (a link is not followed): device, inode and change time, so that
    a new file that got the inode of one deleted meanwhile is another file; None: nothing."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino, info.st_ctime_ns)


def publish_file(temporary: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename the finished `temporary` (beside `target`) to `target`. A target that
    `check_output_file` judged gets only what the check found there replaced: a file made or
    replaced at its name since (by another command writing the same `-o`) stays, the finished
    file is kept beside it (`NAME.new`), and OutputExistsError says where."""
    checked = _CHECKED_FILES.pop(os.path.abspath(target), None)
    if checked is None:
        os.replace(temporary, target)
        return
    found, what = checked
    now = _file_state(target)
    if now is not None and now == found:
        os.replace(temporary, target)  # what the check found (--force): replaced
        return
    if now is None and _rename_if_free(temporary, target):
        return
    kept = os.fspath(temporary)
    for number in range(1, 100):
        name = f"{os.fspath(target)}.new" + (f"-{number}" if number > 1 else "")
        if _rename_if_free(temporary, name):
            kept = name
            break
    raise OutputExistsError(
        f"{what} {shown(target)} was written by another process while this command ran; "
        f"this command's output is at {shown(kept)}",
        f"nothing at {shown(target)} was changed: compare the two, keep what you want",
    )


# What `os.link` raises on a file system (or a file) that takes no hard link: FAT/exFAT, some
# network and FUSE file systems, a file at its filesystem's link limit.
NO_HARD_LINK = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS)


@contextlib.contextmanager
def folders_made_above(target: Path) -> Iterator[None]:
    """Make the folders above the file `target` that are not there (`-o new/sub/preds.csv`);
    if the block fails, those this call made and nothing was put in are removed again, so that
    a failed run leaves no empty folders where it wrote no file. A folder another process made
    meanwhile is not this call's, and stays."""
    missing: list[Path] = []
    folder = target.absolute().parent
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    made: list[Path] = []
    try:
        with reporting_write_errors(target):
            for folder in reversed(missing):  # outermost first
                try:
                    folder.mkdir()
                except FileExistsError:
                    continue
                made.append(folder)
            target.parent.mkdir(parents=True, exist_ok=True)  # a file above: its error
        yield
    except BaseException:
        for folder in reversed(made):  # deepest first: those left empty
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise


@contextlib.contextmanager
def replaced_whole(
    target: Path, mode: str = "w", *, check: Callable[[Path], None] | None = None, **open_kwargs
) -> Iterator[IO]:
    """`target` written whole or not at all, through a flocked temporary beside it
    (`temporaries.open_temporary`) renamed into place when the block (and `check`, given the
    complete temporary) succeeds: the core of `files.atomic_write`, and how the marker is
    written, so that a run killed as it writes leaves a temporary, never a cut-short file."""
    with folders_made_above(target):
        with reporting_write_errors(target):
            fd, temporary = open_temporary(target, *temporary_affixes(target.name))
        tmp_name = temporary.name
        # Its flock is held after the handle closes: through `check` and the rename.
        with discarded_on_failure(temporary), reporting_write_errors(target):
            apply_umask(tmp_name)
            synced_later = synced_when_kept(target)  # one sync for all, before the swap
            with os.fdopen(fd, mode, **open_kwargs) as handle:
                yield handle
                handle.flush()
                if not synced_later:
                    os.fsync(handle.fileno())
            if check is not None:
                check(Path(tmp_name))
            rename_into_place(tmp_name, target, synced_later)


def rename_into_place(temporary: str, target: Path, synced_later: bool) -> None:
    """The finished (and, unless `synced_later`, fsynced) temporary renamed to `target`, then
    the rename made durable: its folder fsynced (see durability.py). The file it replaces
    keeps its permissions."""
    keep_replaced_permissions(temporary, target)
    publish_file(temporary, target)
    if not synced_later:
        fsync_directory(target.parent)


def _rename_if_free(source: str | os.PathLike, name: str | os.PathLike) -> bool:
    """Rename `source` to `name` only where nothing is at `name` (a hard link, then the old
    name removed: a rename would replace what another process put there at the same moment).
    False: something is there."""
    try:
        os.link(source, name, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError as error:  # a file system without hard links: a plain rename, checked first
        if error.errno not in NO_HARD_LINK:
            raise
        if os.path.lexists(name):
            return False
        os.rename(source, name)
        return True
    os.unlink(source)
    return True


class ReplacedFiles:
    """The file outputs of one command whose later steps can still fail (export's OUT, then its
    `-o` report): an old file that `--force` replaces is set aside first, as an old output
    folder is (`.NAME.<hex>.replaced` beside it; here a hard link, so that the name keeps the
    old file until the new one is renamed over it), and a failure before `keep()` removes every
    new file and puts every old one back (`put_back`). Without it, a disk that filled while the
    report was written left the new OUT in place of the old one, with the command failed.
    Open (`open_outputs`) from the first `set_aside` until kept or put back: a stop where no
    clean-up of its own is in place (as `__exit__` or `keep` is entered) is finished by the end
    of the command (`close_unfinished`), so no old file is left set aside beside its output."""

    def __init__(self) -> None:
        self._files: list[tuple[Path, Path | None]] = []  # (an output, its old file set aside)
        self._new: dict[Path, FileId | None] = {}  # the new files where none was set aside
        self._missing: list[Path] = []  # folders above the outputs not there yet, deepest first
        self._held: list[int] = []  # descriptors holding the flock of each old file set aside
        self._when_kept: list[Callable[[], None]] = []  # `when_kept`'s, in order
        self._keeping = False  # `keep()` entered: the new files are the result
        self._token: int | None = None

    def __enter__(self) -> ReplacedFiles:
        return self

    def __exit__(self, exc_type, *_: object) -> None:
        """The block's outputs are kept when it ends well, and put back when it raises
        (SIGINT and SIGTERM included)."""
        if exc_type is None:
            self.keep()
        else:
            self.put_back()

    def set_aside(self, path: str | os.PathLike | None) -> None:
        """Before `path` is written, and before its last `check_output_file` (which records the
        old file's change time: the link changes it). Stdout and special files, written into
        and never replaced, have nothing to set aside."""
        if path is None or os.fspath(path) == "-" or is_special_file(path):
            return
        if self._token is None:  # before anything is held or made
            self._token = opened(self)
        target = Path(path)
        aside = None
        folder = target.absolute().parent
        while not os.path.lexists(folder) and folder != folder.parent:
            self._missing.append(folder)  # made by the writer: removed again on failure
            folder = folder.parent
        if os.path.lexists(target) and not os.path.isdir(target):
            # The old file's flock is held until the end (a hard link shares it): a second run
            # replacing the same file is refused, and the next run after a SIGKILL can tell a
            # killed run's set-aside from a live one's (`remove_dead_replaced_files`).
            held = len(self._held)
            if self._hold(target):
                try:
                    notes = remove_dead_replaced_files(target)
                except OutputLockedError:  # not this run's to hold, even without put_back
                    for fd in self._held[held:]:
                        close_lock(fd)
                    del self._held[held:]
                    raise
                for note in notes:
                    log.warning(note)
            aside = sibling(target, REPLACED_SUFFIX)
            # Listed before it is made: a stop right after the link still removes it.
            self._files.append((target, aside))
            with reporting_write_errors(target):
                _link_or_copy(target, aside)
            if lstat_id(aside) != lstat_id(target):  # a copy: a file of its own to hold
                self._hold(aside)
        else:
            self._files.append((target, aside))

    def _hold(self, path: Path) -> bool:
        """Take the flock of the regular file `path` until `keep()` or `put_back()`; whether it
        was taken (not a link, readable, a file system with flock). Held by another process: a
        live torchkit run is replacing the same file, refused. A file this run holds already
        (one file under two of its output names, hard links) is held: flock would refuse the
        second descriptor as if another run held it."""
        with contextlib.suppress(OSError):
            here = os.lstat(path)
            if any(os.path.samestat(os.fstat(fd), here) for fd in self._held):
                return True
        with signals_deferred():  # a descriptor taken is listed, to be released
            fd = _locked_file(path)
            if fd is None:
                return False
            self._held.append(fd)  # `_locked_file`'s: never held by a forked child
        return True

    def _release(self) -> None:
        held, self._held = self._held, []
        for fd in held:
            close_lock(fd)

    def wrote(self, path: str | os.PathLike | None) -> None:
        """`path` holds its new file now: where nothing was set aside, a failure removes that
        file (and no other that someone put there since)."""
        for target, aside in self._files:
            if path is not None and target == Path(path) and aside is None:
                self._new[target] = lstat_id(target)

    def when_kept(self, then: Callable[[], None]) -> None:
        """Call `then` (the caller's "wrote FILE" note) once the new files are kept, and never
        if they are put back: a note before a failure named a file the failure took back."""
        self._when_kept.append(then)

    def keep(self) -> None:
        """The new files are the result: the old ones set aside are deleted."""
        self._keeping = True
        try:
            # Each forgotten once deleted: a stop half-way leaves the rest to `close_unfinished`.
            while self._files:
                _, aside = self._files[0]
                if aside is not None:
                    remove_tree(aside)
                del self._files[0]
        finally:
            self._release()
        self._new.clear()
        self._missing.clear()
        self._close()
        then, self._when_kept = self._when_kept, []
        for function in then:
            function()

    def put_back(self) -> None:
        """The command failed: each old file goes back to its name (over the new one), each new
        file that replaced nothing is removed, and the folders made for them that this leaves
        empty."""
        self._when_kept.clear()
        try:
            # Each forgotten once done (or failed): a stop half-way leaves the rest listed, and
            # `close_unfinished` puts them back.
            while self._files:
                target, aside = self._files[-1]
                try:
                    if aside is None:
                        new = self._new.get(target)
                        if new is not None and lstat_id(target) == new:
                            remove_tree(target)
                    elif lstat_id(aside) is not None and lstat_id(aside) == lstat_id(target):
                        remove_tree(aside)  # never replaced: the old file is still at its name
                    elif os.path.lexists(aside):
                        os.replace(aside, target)
                except Exception:
                    del self._files[-1]
                    raise
                del self._files[-1]
        finally:
            self._release()
        self._new.clear()
        missing, self._missing = self._missing, []
        for made in missing:  # those left empty
            with contextlib.suppress(OSError):
                os.rmdir(made)
        self._close()

    def _close(self) -> None:
        """Kept or put back: nothing is left to close."""
        token, self._token = self._token, None
        self._keeping = False
        closed(token)

    def close_unfinished(self, error: BaseException | None) -> None:
        """Left open by a stopped command: kept where `keep()` had begun (the new files are
        whole and in place, only the old ones' delete was left), else put back."""
        if self._keeping:
            self.keep()
        else:
            self.put_back()


def _locked_file(path: Path, name: Path | None = None) -> int | None:
    """A descriptor of the regular file `path` holding its flock, or None where it cannot be
    taken (a link, not readable, no flock here). `OutputLockedError` where another process
    holds it: a live run replacing the same file (`name`, if not `path` itself)."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock
        return None
    try:
        fd = open_unshared(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
    except BlockingIOError:
        # Any process may hold a flock on the file (`flock report.json CMD`); a torchkit run
        # replacing it holds it through its set-aside, a hard link beside it (or is that file).
        holder = lock_holder(fd)
        if name is not None or _held_as_set_aside(path, os.fstat(fd)):
            holder = dataclasses.replace(holder, torchkit=True)
        close_lock(fd)
        doing = "is being replaced by" if holder.torchkit else "is locked by"
        raise OutputLockedError(
            f"{name or path} {doing} {holder}", "wait for it to finish, or choose another name"
        ) from None
    except OSError:  # no flock on this file system
        pass
    close_lock(fd)
    return None


def _held_as_set_aside(path: Path, info: os.stat_result) -> bool:
    """Whether the file `path` (of stat `info`) has a set-aside of `ReplacedFiles` beside it
    (`.NAME.<hex>.replaced`, a hard link of it): a torchkit run is replacing it."""
    for aside in leftovers(path, REPLACED_SUFFIX):
        with contextlib.suppress(OSError):
            if os.path.samestat(os.lstat(aside), info):
                return True
    return False


def remove_dead_replaced_files(target: Path) -> list[str]:
    """Remove the old files of `target` (`.NAME.<hex>.replaced`) that `ReplacedFiles` of killed
    runs set aside (SIGKILL, a power cut: no `put_back` ran), with the flock of `target` held
    by the caller; returns what was done, as sentences for a warning. A live run holds its
    set-aside's flock: `OutputLockedError`, as where it still holds `target` (it put a new file
    there and may yet put the old one back over this run's). `target` itself is never changed:
    it is whole (files are renamed into place), the old file where that run never replaced it,
    else the complete new file it wrote, kept as a whole output folder is (`recover_leftovers`).
    """
    notes: list[str] = []
    for aside in leftovers(target, REPLACED_SUFFIX):
        if lstat_id(aside) == lstat_id(target):  # never replaced: the same file, twice
            with contextlib.suppress(OSError):
                os.unlink(aside)
            continue
        if os.path.lexists(aside) and remove_if_unlocked(aside):  # not a live run's
            notes.append(
                f"removed {aside}: the earlier {target}, set aside by a torchkit run that was "
                f"killed after it had put a new {target.name} in its place"
            )
        elif os.path.lexists(aside):
            fd = _locked_file(aside, target)  # OutputLockedError: a live run's
            if fd is not None:
                close_lock(fd)
    return notes


def _link_or_copy(source: Path, name: Path) -> None:
    """A second name for the file (or link) `source`: a hard link, or a copy on a file system
    without them."""
    try:
        os.link(source, name, follow_symlinks=False)
    except OSError as error:
        if error.errno not in NO_HARD_LINK:
            raise
        shutil.copy2(source, name, follow_symlinks=False)
