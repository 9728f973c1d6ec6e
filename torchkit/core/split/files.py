"""The file operations of a split: files copied, linked or moved into OUT (a move never loses a
file, and Ctrl-C or SIGTERM never cuts one in two), split.csv written, a stopped move finished."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from torchkit.core.data.hashing import file_digest
from torchkit.core.data.image_files import unreadable_reason
from torchkit.core.io.claims import check_claimed, reporting_write_errors
from torchkit.core.io.csv_rows import CsvWriter
from torchkit.core.io.errors import InputError, OutputExistsError, OutputWriteError, UsageError
from torchkit.core.io.files import atomic_write
from torchkit.core.io.folder_locks import (
    close_lock,
    flock_path,
    held_exclusively,
)
from torchkit.core.io.output_locks import OutputLockedError
from torchkit.core.io.output_paths import remove_tree
from torchkit.core.io.progress import Progress
from torchkit.core.io.sizes import disk_room, format_megabytes
from torchkit.core.runtime.ahead import read_ahead
from torchkit.core.runtime.signals import signals_held
from torchkit.core.split.options import MANIFEST
from torchkit.core.split.plan import Plan

MOVE_TEMP = ".torchkit-move-"  # prefix of a cross-device copy that is not verified yet
_COPY_THREADS = 8


def _relative_folder(folder: str, out: str) -> str:
    """`folder` relative to `out` as the system reads it from there: `..` in OUT/split.csv
    leaves OUT's real folder, so where a symbolic link on the way to OUT (or to `folder`) makes
    the spelled path lead elsewhere, the path between the real folders is written."""
    try:
        relative = os.path.relpath(folder, out)
    except ValueError:  # another Windows drive
        return folder
    try:
        if os.path.samefile(os.path.join(out, relative), folder):
            return relative
    except OSError:
        pass
    try:
        return os.path.relpath(os.path.realpath(folder), os.path.realpath(out))
    except ValueError:
        return folder


def _relative_to(sources: list[str], out: Path) -> list[str]:
    """The sources as "/"-separated paths relative to OUT (absolute on another Windows drive)."""
    out_path = os.path.abspath(out)
    relative_dirs: dict[str, str] = {}  # relpath is slow; the sources share a few folders
    paths = []
    for source in sources:
        folder, name = os.path.split(source)
        relative = relative_dirs.get(folder)
        if relative is None:
            relative = _relative_folder(folder, out_path).replace(os.sep, "/")
            relative_dirs[folder] = relative
        paths.append(f"{relative}/{name}")
    return paths


def write_manifest(out: Path, plan: Plan, names: list[str], mode: str) -> None:
    """OUT/split.csv: path (relative to OUT, so the file works as a CSV index), label, split,
    source (absolute); and `repeat` (0 for a file, k for its k-th extra copy) when the train
    classes were oversampled."""
    paths = plan.dests if mode != "manifest" else _relative_to(plan.sources, out)
    split_names = [names[j] for j in plan.splits]
    columns = [paths, plan.labels, split_names, plan.sources]
    header = ["path", "label", "split", "source"]
    if plan.repeats is not None:
        columns.append(plan.repeats)
        header.append("repeat")
    with atomic_write(out / MANIFEST, "w", encoding="utf-8", newline="") as handle:
        writer = CsvWriter(handle)
        writer.writerow(header)
        writer.writerows(zip(*columns, strict=True))


class LinkTargets:
    """Where a moved symbolic link must point so that it keeps pointing at the same file.

    A link to a file that the same move moves points to that file's new place, as a relative
    link inside OUT (so OUT can itself be moved later). Any other relative link is rewritten as
    an absolute one (not re-relativised: an absolute link survives OUT being moved too): the
    system reads a relative target from the link's own folder, so the real path of the folder
    that target text names (its `..` resolved after symbolic links, as the system does),
    followed by its last name, is the very same file from anywhere, and no longer depends on
    ROOT's folders, which are empty after the move. The last name is not resolved, so a link
    to a link stays one. An absolute link keeps its text."""

    def __init__(self, sources: Sequence[str], targets: Sequence[str]) -> None:
        self._pairs = (sources, targets)
        self._moved_to: dict[str, str] | None = None  # built on the first link only

    def _moved(self) -> dict[str, str]:
        if self._moved_to is None:
            sources, targets = self._pairs
            real_dirs: dict[str, str] = {}  # the files share a few folders: resolve those once
            self._moved_to = {}
            for source, target in zip(sources, targets, strict=True):
                if os.path.islink(source):
                    continue
                folder, name = os.path.split(source)
                if folder not in real_dirs:
                    real_dirs[folder] = os.path.realpath(folder)
                # Already moved or not, a file that is no link is at its folder's real path.
                self._moved_to[os.path.join(real_dirs[folder], name)] = target
        return self._moved_to

    def __call__(self, link: str, dest: str) -> str:
        text = os.readlink(link)
        moved_to = self._moved().get(os.path.realpath(link))
        if moved_to is not None:
            return os.path.relpath(moved_to, os.path.dirname(dest))
        if os.path.isabs(text):
            return text
        folder, name = os.path.split(os.path.join(os.path.dirname(link), text))
        return os.path.join(os.path.realpath(folder), name)


def vanished(source: str) -> InputError:
    """A source that something else removed while the move ran: it is neither in ROOT nor in
    OUT, and a rerun finishes the move without it."""
    return InputError(
        f"{source} disappeared during the move", "rerun the same command to finish without it"
    )


@contextlib.contextmanager
def moving_out_of(
    *roots: str | os.PathLike, locked: Sequence[str | os.PathLike] = ()
) -> Iterator[None]:
    """`flock`s held while a move takes files out of `roots`: exclusive on each (a folder, or a
    CSV index's file: nothing is written in it), shared on every folder above one that is not
    one of them. So a second move out of ROOT, out of a folder inside it (`ROOT/cat`) or out of
    a folder holding it, is refused: it would find the first one's files gone, stop half-way,
    and its rerun would take every file for one another process deleted. Moves out of folders
    side by side share the locks above them. A command reading ROOT, a folder in it or a CSV
    index listing files in it holds a shared one on ROOT (`lock_for_reading`): the move is
    refused while it reads, and it while the move runs. `locked`: the roots of an earlier call
    this process still holds, where the shared locks stop (a second flock on a folder, through
    another descriptor, would be refused as another move's). (No flock, as on Windows: none.)"""
    held: list[int] = []
    try:
        reals = {os.path.realpath(root): root for root in roots}
        held_already = {os.path.realpath(folder) for folder in locked}
        above: dict[str, str | os.PathLike] = {}
        for real, root in reals.items():
            folder = os.path.dirname(real)
            while folder not in above and folder not in reals and folder not in held_already:
                above[folder] = root
                if os.path.dirname(folder) == folder:
                    break
                folder = os.path.dirname(folder)
        for root in reals.values():
            _lock(root, True, held, f"{root} or a folder in it")
        for folder, root in above.items():
            _lock(folder, False, held, f"{folder}, which holds {root}")
        yield
    finally:
        for fd in held:
            close_lock(fd)


def _lock(path: str | os.PathLike, exclusive: bool, held: list[int], what: str) -> None:
    """A non-blocking flock on `path` (a missing one needs none: what follows says so, or needs
    no ROOT, as a finished move), its fd added to `held`; an OutputLockedError where another
    process holds one: another move's, or (shared, where this one is exclusive) those of the
    commands that read `path` (`core.data.sources.moving.lock_for_reading`)."""
    try:
        fd = flock_path(path, exclusive=exclusive)
    except BlockingIOError:
        from torchkit.core.io.folder_locks import lock_holder

        holder = lock_holder(path)
        if holder.pid is not None and not holder.torchkit:  # `flock DIR CMD` in a script
            raise OutputLockedError(
                f"{path} is locked by {holder}", "wait for it to finish"
            ) from None
        if exclusive and not held_exclusively(path):
            raise OutputLockedError(
                f"another torchkit command is reading {path}, or another torchkit split is "
                "moving files out of a folder in it",
                "wait for it to finish",
            ) from None
        raise OutputLockedError(
            f"another torchkit split is moving files out of or into {what}",
            "wait for it to finish; then split what it left, if anything",
        ) from None
    if fd is not None:  # `flock_path`'s: held by none of the processes this one forks
        held.append(fd)


def move_file(source: str, dest: str, links: LinkTargets | None = None) -> None:
    """Move one file so that it is never lost: a rename where possible (atomic: the file is in
    exactly one place at every moment); across filesystems a copy to a temporary name beside
    `dest`, flushed to disk and compared byte for byte (SHA-256) with the source, renamed into
    place, and only then is the source removed.

    A symbolic link is not renamed (a relative one would point elsewhere from its new folder):
    a new link with the target `links` gives (see `LinkTargets`; the same target, absolute,
    without it) is made beside `dest`, renamed into place, and the old link removed.

    A source that another process deletes meanwhile is an InputError naming it (`vanished`)."""
    try:
        _move_file(source, dest, links)
    except FileNotFoundError:
        if os.path.lexists(source):
            raise
        raise vanished(source) from None


def _move_file(source: str, dest: str, links: LinkTargets | None) -> None:
    if os.path.lexists(dest):
        raise OutputExistsError(f"{dest} already exists", "it would be overwritten by the move")
    folder, name = os.path.split(dest)
    temporary = os.path.join(folder, f"{MOVE_TEMP}{name}")
    if os.path.islink(source):
        target = (links or LinkTargets((), ()))(source, dest)
        remove_tree(Path(temporary), ignore_errors=False)  # a stale one of a killed move
        os.symlink(target, temporary)
        with signals_held():  # never the link in both places, nor in none
            os.replace(temporary, dest)
            _remove_source(source)
        return
    size = os.stat(source).st_size
    try:
        os.rename(source, dest)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
    else:
        if os.lstat(dest).st_size != size:  # a rename cannot change a file; checked anyway
            raise InputError(f"{dest} does not match {source} after the move")
        return
    require_readable(source, "move")  # to be copied onto the other file system
    try:
        shutil.copy2(source, temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
    except BaseException:
        # A full disk (or a stop) part-way: the source is whole where it was; the half copy
        # goes, not left to hold the space the user must free before the rerun.
        remove_tree(Path(temporary))
        raise
    if os.stat(temporary).st_size != size or file_digest(temporary) != file_digest(source):
        remove_tree(Path(temporary), ignore_errors=False)
        raise InputError(f"the copy of {source} in {folder} differs from it; the source is kept")
    with signals_held():
        os.replace(temporary, dest)
        _remove_source(source)


def _remove_source(source: str) -> None:
    """The source of a copy now in place: one another process deleted meanwhile is moved."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(source)


def _copy_all(sources: list[str], targets: list[str], progress: Progress | None) -> None:
    total = len(sources)
    # Copies wait on the disk, not the CPU: a few threads keep it busy. On an error, Ctrl-C or
    # SIGTERM the copies not started yet are dropped, not made.
    copies = read_ahead(_copy_pair, zip(sources, targets, strict=True), _COPY_THREADS)
    with contextlib.closing(copies):
        for done, _ in enumerate(copies, 1):
            if progress and (done % 256 == 0 or done == total):
                progress(done, total)


def _copy_pair(pair: tuple[str, str]) -> None:
    source, target = pair
    require_readable(source, "copy")
    shutil.copy2(source, target)


def require_readable(source: str, verb: str) -> None:
    """A source to copy (`verb`: "copy", a move's "move", a refused hard link's "link") that
    cannot be read (no read permission) is the data's fault, one error said as every command
    says why a file cannot be read, in every mode, not a PermissionError of the copy. (One
    gone since it was listed is named by the caller: "disappeared during the split".)"""
    try:
        os.close(os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)))
    except FileNotFoundError:
        raise
    except OSError as error:
        raise InputError(
            f"cannot {verb} {source}: {unreadable_reason(error)}",
            "make it readable, or move it out of the data",
        ) from None


def _hardlink(source: str, target: str) -> None:
    """A hard link to `source` at `target`. The system may refuse to link a file this user
    neither owns nor may read and write (Linux's protected_hardlinks): one error naming it."""
    try:
        os.link(source, target)
    except PermissionError:
        require_readable(source, "link")
        raise InputError(
            f"cannot link {source}: the system lets a user hard-link only the files it owns "
            "or may write to",
            "use --mode copy or symlink",
        ) from None


def check_hardlinks(plan: Plan, out: Path) -> None:
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    out_device = os.stat(existing).st_dev
    if any(os.stat(s).st_dev != out_device for s in plan.sources):
        raise UsageError(
            "--mode hardlink needs ROOT and OUT on the same filesystem",
            "use --mode symlink or --mode copy",
        )


def refuse_temporary_names(plan: Plan) -> None:
    """A move copies a file across file systems to `.torchkit-move-NAME` beside its place, and
    its rerun deletes such copies of the files still in ROOT: a file of the data named so (in
    any case) would be overwritten or deleted in OUT, where it is the only copy."""
    for source, dest in zip(plan.sources, plan.dests, strict=True):
        if dest.rpartition("/")[2].casefold().startswith(MOVE_TEMP):
            raise InputError(
                f"{source} is named like the temporary copies a move makes ({MOVE_TEMP}...), "
                "which the move would overwrite and its rerun delete",
                "rename that file, or use --mode copy, symlink or hardlink",
            )


def check_room_for_move(
    sources: Sequence[str],
    out: Path,
    hint: str = "no file was moved: free some space, or choose an output folder on a disk "
    "with room",
    freed: Sequence[str | os.PathLike] = (),
    folders: int = 0,
) -> None:
    """A move onto another file system copies each file into OUT before it removes it from
    ROOT: a disk without room for them all is refused before the first file moves, where it was
    found full part-way and left the data half in OUT, to be finished once there was room. Each
    file counts in whole blocks of OUT's file system, and it or a link (made anew) as one name
    (an inode, where the file system bounds them), as do the `folders` the move makes in OUT; a
    file renamed in place (on OUT's file system) takes neither, a link no blocks. The files
    and folders `freed` (an earlier split in OUT that --force replaces, deleted before the first
    file moves) give their room back. Where the free space is unknown (no statvfs), nothing is
    checked: a full disk is still an error that leaves every file in one place."""
    folder = out
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    room = disk_room(folder)
    try:
        device = os.stat(folder).st_dev
    except OSError:
        return
    if room is None:
        return
    needed, copies = 0, 0
    devices: dict[str, int | None] = {}  # a folder's: its files are on it (one stat a folder
    # where the move is renames, as most are, not one a file)
    for source in sources:
        parent = os.path.dirname(source)
        if parent not in devices:
            try:
                devices[parent] = os.stat(parent or os.curdir).st_dev
            except OSError:
                devices[parent] = None
        if devices[parent] == device:
            continue
        try:
            status = os.lstat(source)
        except OSError:
            continue  # gone, or not to be reached: the move names it
        if status.st_dev == device:
            continue
        copies += 1  # a file copied, or a link made anew: a name in OUT either way
        if not stat.S_ISLNK(status.st_mode):
            needed += -(-status.st_size // room.block) * room.block
    names = copies + folders if copies else 0  # where all are renames, the folders fit
    names_short = room.names is not None and names > room.names
    if needed <= room.free and not names_short:
        return
    gained, names_gained = _room_freed(freed, device)
    if needed > room.free + gained:
        more = f" ({format_megabytes(gained / 1e6)} MB more once the split it replaces is deleted)"
        raise OutputWriteError(
            f"cannot write {out}: its disk has {format_megabytes(room.free / 1e6)} MB free"
            + (more if gained else "")
            + f", and the files to move onto it take {format_megabytes(needed / 1e6)} MB",
            hint,
        )
    if room.names is not None and names > room.names + names_gained:
        more = f" ({names_gained:,} more once the split it replaces is deleted)"
        raise OutputWriteError(
            f"cannot write {out}: its disk has room for {room.names:,} more files and folders "
            "(inodes)" + (more if names_gained else "") + f", and the move makes {names:,} there",
            hint,
        )


def _room_freed(paths: Sequence[str | os.PathLike], device: int) -> tuple[int, int]:
    """The bytes and the names (inodes) that deleting `paths` (files, or folders with all in
    them) gives back on `device`: each file there that has no other name (a hard link's
    stay) gives its blocks and its inode, each folder its inode."""
    freed, names = 0, 0
    for path in paths:
        try:
            status = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(status.st_mode):
            more = _file_freed(status, device)
            freed, names = freed + more[0], names + more[1]
            continue
        for folder, subfolders, files in os.walk(path):
            names += 1  # the folder (os.walk enters no link to a folder: one of its names)
            for name in files + [f for f in subfolders if os.path.islink(os.path.join(folder, f))]:
                with contextlib.suppress(OSError):
                    more = _file_freed(os.lstat(os.path.join(folder, name)), device)
                    freed, names = freed + more[0], names + more[1]
    return freed, names


def _file_freed(status: os.stat_result, device: int) -> tuple[int, int]:
    if status.st_dev != device or status.st_nlink != 1:
        return 0, 0
    return getattr(status, "st_blocks", 0) * 512, 1


def check_sources_removable(sources: Sequence[str]) -> None:
    """A move takes each file out of its folder: a folder the system will not let this process
    change (a read-only file system, no write permission) is refused before anything moves,
    rather than after the first file is copied into OUT and cannot be removed from ROOT."""
    checked: set[str] = set()
    for source in sources:
        folder = os.path.dirname(source) or os.curdir
        if folder in checked:
            continue
        checked.add(folder)
        if os.access(folder, os.W_OK | os.X_OK):
            continue
        room = disk_room(folder)
        read_only = room is not None and room.read_only
        reason = "it is on a read-only file system" if read_only else "no permission to change it"
        raise InputError(
            f"--mode move cannot take the files out of {folder}: {reason}",
            "use --mode copy, symlink or manifest, or make the folder writable",
        )


def place_files(plan: Plan, out: Path, mode: str, progress: Progress | None) -> None:
    """Copy, link or move every file of the plan into OUT; a name the file system refuses as
    too long is one OutputWriteError naming it (not a full disk's, nor a bare OSError), a
    source that another process deleted meanwhile one InputError naming it (a move's: see
    `move_file`)."""
    try:
        _place_files(plan, out, mode, progress)
    except FileNotFoundError as error:
        source = error.filename
        if mode == "move" or os.path.lexists(source) or source not in set(plan.sources):
            raise
        raise InputError(
            f"{source} disappeared during the split",
            "run the same command again: it splits the files that are there",
        ) from None
    except OSError as error:
        if error.errno != errno.ENAMETOOLONG:
            raise
        name = error.filename2 if error.filename2 is not None else error.filename
        raise OutputWriteError(
            f"file name too long: {name}",
            "the file system takes shorter names: rename the file in the dataset, "
            "or use --mode manifest",
        ) from None


def _place_files(plan: Plan, out: Path, mode: str, progress: Progress | None) -> None:
    total = len(plan.sources)
    check_claimed(out)  # still the OUT begun: a removed one is not made again by the mkdirs
    for folder in sorted({os.path.dirname(d) for d in plan.dests}):
        (out / folder).mkdir(parents=True, exist_ok=True)
    targets = [os.path.join(out, d) for d in plan.dests]
    if mode == "copy":
        _copy_all(plan.sources, targets, progress)
        return
    links = LinkTargets(plan.sources, targets)
    operation: Callable[[str, str], Any] = {
        "symlink": _symlink,
        "hardlink": _hardlink,
        "move": lambda s, d: move_file(s, d, links=links),
    }[mode]
    for done, (source, target) in enumerate(zip(plan.sources, targets, strict=True), 1):
        operation(source, target)
        if progress and (done % 256 == 0 or done == total):
            progress(done, total)


def _symlink(source: str, dest: str) -> None:
    """A link to `source` at `dest`; a source deleted meanwhile is an error, not a link to
    nothing in the split."""
    if not os.path.lexists(source):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), source)
    os.symlink(source, dest)


def finish_rows(sources, targets, out: Path, links: LinkTargets, progress) -> list[int]:
    """Finish each row of an interrupted move; returns the rows whose file is in neither place
    (another process deleted it from ROOT before it was moved): gone, so left for the caller to
    drop from the split."""
    lost = []
    for done, (source_file, target) in enumerate(zip(sources, targets, strict=True), 1):
        have_source, have_target = os.path.lexists(source_file), os.path.lexists(target)
        if have_source and not have_target:
            with reporting_write_errors(out):
                os.makedirs(os.path.dirname(target), exist_ok=True)
            move_file(source_file, target, links=links)
        elif have_source and have_target:  # stopped between the copy and removing the source
            if not _same_file(source_file, target):
                raise InputError(
                    f"{source_file} and {target} both exist and differ", "compare them by hand"
                )
            _remove_source(source_file)
        elif not have_target:
            lost.append(done - 1)
        if progress:
            progress(done, len(sources))
    return lost


def _same_file(source: str, target: str) -> bool:
    """A source that is still there beside its moved copy: the same bytes (for a link, the
    same file it points to; one that points nowhere is a link the move had made already)."""
    if os.path.islink(source) != os.path.islink(target):
        return False  # e.g. a link to the source: removing the source would lose it
    if os.path.islink(source):
        try:
            return os.path.samestat(os.stat(source), os.stat(target))
        except OSError:
            return True
    return file_digest(source) == file_digest(target)
