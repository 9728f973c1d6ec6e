"""The output-safety layer: every output a command writes goes through here, so the rule that
torchkit never loses a user's file is enforced in one place.

- An output may not be, contain or lie inside an input of the same command (`check_overlap`).
- `--force` replaces a folder only if it is empty or the same command wrote it (a `.torchkit`
  marker naming it, or only files that command writes beside the record it always writes:
  `holds_json_record`), and only if it holds nothing that command does not write
  (`folder_contents`: a user's notes.txt is refused, never deleted with the folder); `/`, `~`,
  the working directory and its parents never. A folder holding only the same command's
  marker (and its dead writers' temporaries) is empty: a run killed before its first file
  (`clear_killed_start`).
- A folder being written is locked (`.NAME.torchkit-lock` beside it, `flock`); a second command
  on the same folder is refused at once with the holder's PID.
- An old output replaced with `--force` is set aside (`.NAME.<hex>.replaced`) and put back if
  the new run fails, is interrupted or terminated before it has written something worth keeping;
  one left behind by a killed run is put back (or reported) by the next run on that folder,
  which removes only the names the killed run wrote (`.torchkit-written`, appended before each).
  An old file output is set aside the same way (`ReplacedFiles`, flocked while its run lives);
  one a killed run left is removed by the next run replacing that file.

Everything is checked before any work; nothing here prints (warnings go to the `torchkit` log).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import IO

from torchkit import __version__
from torchkit.core.io.durability import fsync_directory, sync_file_system
from torchkit.core.io.errors import (
    NAME_TOO_LONG_HINT,
    OutputExistsError,
    OutputWriteError,
    TorchkitError,
    UsageError,
    first_and_more,
    first_line,
)
from torchkit.core.io.file_kinds import file_kind
from torchkit.core.io.folder_contents import foreign_entries, path_inside
from torchkit.core.io.folder_locks import close_lock, open_unshared
from torchkit.core.io.non_utf8_names import json_text
from torchkit.core.io.open_outputs import closed, opened
from torchkit.core.io.temporaries import (
    TEMPORARY,
    apply_umask,
    discarded_on_failure,
    fitting,
    is_unlocked,
    open_temporary,
    remove_dead_temporaries,
    remove_if_unlocked,
    temporary_affixes,
    temporary_stem,
    temporary_stems,
)
from torchkit.deferred_signals import signals_deferred
from torchkit.program import closed_at_start

log = logging.getLogger("torchkit")

MARKER = ".torchkit"
LOCK_SUFFIX = ".torchkit-lock"
WRITTEN_JOURNAL = ".torchkit-written"  # the names a run that set an old output aside writes
PARTIAL_SUFFIX = ".partial"
REPLACED_SUFFIX = ".replaced"
DISCARDED_SUFFIX = ".discarded"

# errno values that only writing causes, and those that reading an input can cause too (these
# count as write errors only when they name the output or nothing).
WRITE_ONLY_ERRNOS = frozenset((errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG))
WRITE_ERRNOS = WRITE_ONLY_ERRNOS | {errno.EACCES, errno.EPERM, errno.EIO, errno.ENAMETOOLONG}


class OutputOverlapError(TorchkitError):
    """An output that is, contains or lies inside an input of the same command."""


class OutputLockedError(TorchkitError):
    """Another process holds the lock of an output: a torchkit run writing it, or any other
    process holding a flock on it (`folder_locks.lock_holder` says which, where it can)."""


class OutputFolderReplacedError(TorchkitError):
    """An output folder removed, renamed away or replaced while a command wrote into it."""


@dataclass(frozen=True)
class InputPath:
    """Something a command reads: a file, or a folder whose whole tree it reads."""

    path: Path
    what: str

    @classmethod
    def of(cls, path: str | os.PathLike, what: str) -> InputPath:
        return cls(Path(path), what)


def _real(path: str | os.PathLike) -> Path:
    """The path with `..` and symlinks resolved (as far as it exists). A `~` is left as it is:
    the shell expands it, and a quoted `'~/x'` is written as a folder named `~`, so it is
    checked as one (expanded, an output inside an input `./~/x` passed as outside it)."""
    return Path(os.path.realpath(os.fspath(path)))


class _Resolver:
    """Real paths of the inputs of one overlap check, and whether each is named through the
    output folder (`--data OUT/link`, a link inside OUT to data elsewhere: gone from its name
    once OUT is replaced). Each path is walked a name at a time from `/`, as realpath walks it,
    and each folder's result is kept (`walked`): a million input folders `ID/` below one data
    folder cost an lstat each, not a dozen (realpath's). The output folder is recognised
    however either path spells it: `//OUT`, `.` segments, a link to a folder on the way."""

    def __init__(self, output: Path | None) -> None:
        self.output = output  # the real output folder where it exists (else nothing is through)
        self.cwd: str | None = None  # at a relative path: absolute ones pass a deleted cwd
        # each folder's (real path, named through OUT, a link inside OUT followed on the way)
        self.walked: dict[str, tuple[str, bool, bool]] = {"": ("/", False, False)}

    def resolve(self, path: str | os.PathLike) -> tuple[Path, bool]:
        """`_real(path)`, and whether `path` goes through the output folder on its way. A `..`
        after a link inside OUT is taken from the link's target (as the kernel takes it), but
        the name still hangs on the link (`OUT/link/..`): through OUT, wherever it leads."""
        text = os.fspath(path)
        if os.name != "posix":  # names compare without case there: realpath's and Path's rules
            named = Path(os.path.abspath(text))
            return _real(text), self.output is not None and _is_within(named, self.output)
        if not text.startswith("/") and self.cwd is None:
            self.cwd = os.getcwd()
        absolute = text if text.startswith("/") else f"{self.cwd}/{text}"
        # `//` and `/./` are `/` (POSIX leaves a leading `//` to the system; Linux: `/`)
        names = [name for name in absolute.split("/") if name not in ("", ".")]
        known = len(names)
        while "/".join(names[:known]) not in self.walked:
            known -= 1
        real, through, linked = self.walked["/".join(names[:known])]
        for index in range(known, len(names)):
            name = names[index]
            if name == "..":
                real = os.path.dirname(real)
                # `OUT/sub/..` leaves OUT by name; `OUT/link/..` never does (`linked`)
                through = linked or (
                    self.output is not None and _is_within(Path(real), self.output)
                )
            else:
                candidate = os.path.join(real, name)
                # the name itself inside OUT, before a link is followed: the link goes with OUT
                through = through or (
                    self.output is not None and _is_within(Path(candidate), self.output)
                )
                if os.path.islink(candidate):
                    linked = linked or through
                    real = os.path.realpath(candidate)
                else:
                    real = candidate
            if index < len(names) - 1:  # the folders on the way, not each input (a million)
                self.walked["/".join(names[: index + 1])] = (real, through, linked)
        return Path(real), through


def _is_within(inner: Path, outer: Path) -> bool:
    if inner == outer:
        return True
    if os.name != "posix":  # names compare without case there: Path's own comparison
        return outer in inner.parents
    # `outer in inner.parents` made a Path of each folder above `inner`: with an input folder
    # per image (`ID/image.png`), most of an overlap check of a million of them. Both are
    # normalised, so their text compares (`.parts` would be kept on each input's Path).
    return str(inner).startswith(str(outer).rstrip("/") + "/")


def _shown(path: str | os.PathLike) -> str:
    return os.fspath(path)


FileId = tuple[int, int]  # (st_dev, st_ino): one file or folder, whatever path names it


def _file_ids(
    path: Path, known: dict[Path, FileId | None], chains: dict[Path, list[FileId]]
) -> list[FileId]:
    """The identities of `path` and the existing folders above it, nearest first (`known`
    caches each place's identity, `chains` the list of each folder above an input, across the
    inputs of one check: a folder's list is its own identity and its parent's list, so inputs
    that share folders stat and walk each folder once). Walked in a loop, not by recursion: a
    folder a thousand deep (2,000 characters of `d/d/...`) is a path like any other."""
    places = []  # `path` and the folders above it up to the nearest with a list already
    place = path
    while place not in chains:
        places.append(place)
        parent = place.parent
        if parent == place:  # the root: nothing above it
            chain: list[FileId] = []
            break
        place = parent
    else:
        chain = chains[place]
    for place in reversed(places):
        if place not in known:
            try:
                info = os.stat(place)
                known[place] = (info.st_dev, info.st_ino)
            except (OSError, ValueError):
                known[place] = None
        identity = known[place]
        chain = chain if identity is None else [identity, *chain]
        if place is not path:  # a folder above inputs (an input's own list is asked for once)
            chains[place] = chain
    return chain


def check_overlap(output: str | os.PathLike, what: str, inputs: Iterable[InputPath | None]) -> None:
    """Refuse an output that is an input, contains one (so replacing it would delete the input)
    or lies inside an input folder (so writing it would change the input). Paths are compared
    resolved, and by identity where they exist: a second path to the same folder (a bind
    mount, another case of the name on a case-insensitive disk) is the same folder. A bind
    mount that shows the output, or a folder of its tree, at another path (OUT mounted inside
    an input, an input's folder mounted inside OUT) is checked at that path too."""
    out = _real(output)
    known: dict[Path, FileId | None] = {}
    chains: dict[Path, list[FileId]] = {}
    out_chain = _file_ids(out, known, chains)
    out_id = known[out]
    out_is_dir = out_id is not None and os.path.isdir(out)
    # An input named through the output folder (`--data OUT/link`, the link to a folder
    # elsewhere) is gone from its name once OUT is replaced, however it resolves.
    resolver = _Resolver(out if out_is_dir else None)
    places: list[MountedPlace] | None = None
    for item in inputs:
        if item is None:
            continue
        source, named_through_out = resolver.resolve(item.path)
        source_chain = _file_ids(source, known, chains)
        source_id = known[source]
        if out == source or (out_id is not None and out_id == source_id):
            raise OutputOverlapError(
                f"{what} {_shown(output)} is the {item.what} {_shown(item.path)}",
                "choose another output",
            )
        if _is_within(source, out) or (out_is_dir and out_id in source_chain) or named_through_out:
            raise OutputOverlapError(
                f"{what} {_shown(output)} contains the {item.what} {_shown(item.path)}",
                "choose an output outside the inputs",
            )
        inside = _is_within(out, source) or (source_id is not None and source_id in out_chain)
        if inside and os.path.isdir(source):
            raise OutputOverlapError(
                f"{what} {_shown(output)} lies inside the {item.what} {_shown(item.path)}",
                "choose an output outside the inputs",
            )
        if places is None:  # read once, at the first input: most checks have none
            places = _mounted_places(out, out_is_dir)
        if places:
            _check_mounted_overlap(output, what, item, source, places)


# A place where a bind mount shows the output's folder, or a folder inside its tree: (the folder
# of the output's tree it shows, whether it is the output whole, the place).
MountedPlace = tuple[str, bool, str]


def _mounted_places(out: Path, out_is_dir: bool) -> list[MountedPlace]:
    """Where bind mounts show the output `out` (or a part of it) at another path: the output
    itself (`OUT` mounted inside an input), or a mount inside the output folder (an input's
    folder mounted inside OUT, which replacing OUT would empty)."""
    from torchkit.core.io.mounts import MountTable

    table = MountTable.read()
    pieces = [str(out), *(table.points_below(str(out)) if out_is_dir else ())]
    found = []
    for piece in pieces:
        whole, parts = table.places(piece)
        found += [(piece, piece == str(out), place) for place in whole]  # OUT itself whole
        found += [(piece, False, place) for place in parts]
    return found


def _check_mounted_overlap(
    output: str | os.PathLike, what: str, item: InputPath, source: Path, places: list[MountedPlace]
) -> None:
    """`check_overlap` for the other paths of the output's tree (`_mounted_places`)."""
    out = os.fspath(_real(output))
    for piece, is_whole, place in places:
        if _is_within(source, Path(place)):
            relation = "contains"
        elif _is_within(Path(place), source) and os.path.isdir(source):
            # OUT there whole, a folder of OUT there, or a folder of the input mounted in OUT
            relation = (
                "lies inside"
                if is_whole
                else "lies partly inside"
                if piece == out
                else "contains a folder of"
            )
        else:
            continue
        if is_whole:
            how = f"it is mounted at {place} too"
        elif piece == out:
            how = f"a folder in it is mounted at {place}"
        else:
            how = f"{piece} in it is a mount of {place}"
        raise OutputOverlapError(
            f"{what} {_shown(output)} {relation} the {item.what} {_shown(item.path)} ({how})",
            "choose an output outside the inputs, or unmount what joins them",
        )


def folders_of_files(paths: Iterable[str | os.PathLike], what: str) -> list[InputPath]:
    """The distinct folders that hold `paths` (e.g. the images a CSV index names), as inputs: an
    output folder may not contain them nor lie inside one."""
    texts = [os.fspath(p) for p in paths]
    # A file's folder is abspath(dirname(p)): made absolute once per folder, not per file (a
    # million CSV rows in a hundred folders). A path ending in `/`, `.` or `..` names no file
    # in a folder: its own abspath says where it is.
    ends = tuple(sep + name for sep in (os.sep, os.altsep) if sep for name in ("", ".", ".."))
    odd = {t for t in texts if t.endswith(ends) or t in ("", ".", "..")}
    heads = {os.path.dirname(t) for t in texts if t not in odd}
    folders = {os.path.abspath(head) for head in heads}
    folders |= {os.path.dirname(os.path.abspath(t)) for t in odd}
    return [InputPath(Path(folder), what) for folder in sorted(folders)]


def _protected_reason(real: Path) -> str | None:
    cwd = _real(os.getcwd())
    if real == cwd:
        return "the working directory"
    if real in cwd.parents:
        return "a parent of the working directory"
    if real == _real(Path.home()):
        return "the home folder"
    return None


def check_not_protected(folder: str | os.PathLike, what: str) -> None:
    """`/`, the home folder, the working directory and its parents are never an output folder."""
    reason = _protected_reason(_real(folder))
    if reason:
        raise OutputOverlapError(
            f"{what} {_shown(folder)} is {reason}",
            "torchkit never writes over it: give a new folder",
        )


def check_distinct_outputs(*outputs: tuple[str | os.PathLike | None, str]) -> None:
    """Two outputs of one command (`-o` and `--plot`, DST and `-o`) may not be one file: one
    would overwrite the other. A device (/dev/null, a terminal) may take several; a FIFO or
    this process's stdout (a pipe) may not: its reader would get one file after the other."""
    seen: dict[object, str] = {}
    for path, what in outputs:
        if path is None or os.fspath(path) == "-":
            continue
        if is_special_file(path):
            try:
                info = os.stat(path)
            except OSError:  # a closed descriptor: refused by check_output_file
                continue
            if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
                continue
            real: object = (info.st_dev, info.st_ino)
        else:
            real = _real(path)
        if real in seen:
            raise OutputOverlapError(
                f"{what} {_shown(path)} is the same file as {seen[real]}",
                "give each output its own file",
            )
        seen[real] = f"{what} {_shown(path)}"


def check_not_written_in(
    report: str | os.PathLike,
    folder: str | os.PathLike,
    writes: Callable[[PurePath], bool],
    what: str,
) -> None:
    """A `-o` report inside the output `folder` (fine: `OUT/report.json`) may not be a file the
    command writes there (`writes(path relative to folder)`): with --force the report would
    overwrite it after the work, without it the run would fail only after all the work."""
    if os.fspath(report) == "-" or is_special_file(report):
        return
    inside = path_inside(report, folder)
    if inside is None or not writes(inside):
        return
    raise OutputOverlapError(
        f"report {_shown(report)} is a file the command writes in the {what} {_shown(folder)}",
        "choose another output file",
    )


# -- special files ----------------------------------------------------------------------------


def is_special_file(path: str | os.PathLike) -> bool:
    """A FIFO, device, socket or /dev/stdout: written into, never replaced by a regular file.
    A regular file under /dev or /proc (/dev/shm/x.json) is a file like any other: refused
    when it exists, unless --force, and replaced atomically."""
    text = os.fspath(path)
    if own_descriptor(text) is not None:  # also a `>> log.txt` stdout, or a closed one
        return True
    try:
        mode = os.stat(text).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


# This process's own file descriptors by name: /dev/stdin, /dev/stdout, /dev/stderr,
# /dev/fd/N, /proc/self/fd/N, /proc/thread-self/fd/N.
_OWN_DESCRIPTOR = re.compile(
    r"/(?:dev/(?:(?P<std>stdin|stdout|stderr)|fd/(?P<fd>\d+))"
    r"|proc/(?:self|thread-self)/fd/(?P<proc>\d+))"
)
_STANDARD = {"stdin": 0, "stdout": 1, "stderr": 2}


def own_descriptor(path: str | os.PathLike) -> int | None:
    """The file descriptor of this process that `path` names (`/dev/stdout`: 1), else None."""
    found = _OWN_DESCRIPTOR.fullmatch(os.path.normpath(os.fspath(path)))
    if found is None:
        return None
    if found["std"]:
        return _STANDARD[found["std"]]
    return int(found["fd"] or found["proc"])


def shares_stdout(path: str | os.PathLike) -> bool:
    """What is written to `path` lands on this process's standard output, where a report printed
    there would be mixed into it: stdout by its name (/dev/stdout, /dev/fd/1), or the same FIFO,
    socket or regular file as stdout, found by identity rather than by name (a link to
    /dev/stdout, `--plot FIFO > FIFO`, `--plot out.png --force > out.png`, also once that file
    was replaced: `check_output_file` saw it). A terminal or another device shared with stdout
    is not: it takes both streams as they come (`-o /dev/tty` on a terminal)."""
    if own_descriptor(path) == 1:
        return True
    stdout = _stream_identity(1)
    if stdout is None:
        return False
    seen = _STDOUT_WHEN_CHECKED.get(os.path.abspath(path))
    return stdout in (seen, _stream_identity(path))


def _stream_identity(target: str | os.PathLike | int) -> tuple[int, int] | None:
    """Device and inode of the FIFO, socket or regular file at `target` (a path, links
    followed, or a file descriptor); None for anything else (a terminal, /dev/null, nothing)."""
    try:
        info = os.fstat(target) if isinstance(target, int) else os.stat(target)
    except OSError:
        return None
    mode = info.st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISREG(mode):
        return (info.st_dev, info.st_ino)
    return None


# Absolute path -> the identity of stdout, for a file output that was stdout when checked
# (`--plot out.png --force > out.png`): written atomically, it no longer is when the report is
# printed, into the replaced file where nobody sees it.
_STDOUT_WHEN_CHECKED: dict[str, tuple[int, int]] = {}


def _note_stdout(path: str | os.PathLike) -> None:
    stdout = _stream_identity(1)
    if stdout is not None and _stream_identity(path) == stdout:
        _STDOUT_WHEN_CHECKED[os.path.abspath(path)] = stdout


def check_own_descriptor_open(path: str | os.PathLike, what: str) -> None:
    """`-o /dev/stdout` with stdout closed (`>&-`): refused before any work. The write at the
    end failed as "FileNotFoundError: ... '/dev/stdout'" (or a bare "Bad file descriptor"),
    after all of it."""
    fd = own_descriptor(path)
    if fd is None:
        return
    name = {0: "standard input", 1: "standard output", 2: "standard error"}
    named = name.get(fd, f"file descriptor {fd}")
    try:
        if closed_at_start(fd):  # opened on /dev/null since: still closed to the user
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        import fcntl

        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError as error:
        raise OutputWriteError(
            f"cannot write {what} {_shown(path)}: {error.strerror}",
            f"{named} is closed: send it to a file or to /dev/null, or choose another output",
        ) from None
    if mode == os.O_RDONLY:
        # Opened again by its name for writing, a pipe's read end became its write end (the
        # command wrote into its own input); with --force, a file's name (`-o /dev/stdin <
        # x.csv`) was replaced: the link /dev/stdin itself, by root.
        raise OutputWriteError(
            f"cannot write {what} {_shown(path)}: {named} is open for reading only",
            "choose another output",
        )


def check_not_socket(path: str | os.PathLike, what: str) -> None:
    """A Unix socket (or a link to one) at a file output cannot be opened to be written: the
    write at the end failed as "No such device or address", after all the work. This
    process's own descriptor that is a socket (`-o /dev/stdout` under a service manager) is
    written through the descriptor, not opened by its name."""
    if own_descriptor(path) is not None:
        return
    try:
        socket = stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return
    if socket:
        raise OutputExistsError(
            f"{what} is a socket, not a file: {_shown(path)}",
            "torchkit cannot open a socket to write into it: give a file, a FIFO or a device",
        )


def check_terminal_present(path: str | os.PathLike, what: str) -> None:
    """`-o /dev/tty` in a process with no terminal (cron, CI, `setsid`) cannot be opened: the
    write at the end failed as "No such device or address", after all the work. Opening the
    terminal does nothing else, so it is tried now (other devices are not: opening some of
    them acts, a tape rewinds when closed)."""
    if os.path.realpath(path) != "/dev/tty":
        return
    try:
        os.close(os.open("/dev/tty", os.O_WRONLY | os.O_NOCTTY))
    except OSError as error:
        raise OutputWriteError(
            f"cannot write {what} {_shown(path)}: {error.strerror}",
            "this process has no terminal: choose another output",
        ) from None


def check_block_device(path: str | os.PathLike, force: bool, what: str) -> None:
    """A block device (a disk, a partition) holds data that writing into it overwrites from
    its first byte: like an existing file, it needs `force`. Other devices (/dev/null, a
    terminal) take a stream."""
    try:
        block = stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return
    if block and not force:
        raise OutputExistsError(
            f"{what} is a block device: {_shown(path)}",
            "writing into it overwrites what it holds: pass --force to write into it anyway",
        )


def check_folders_above(path: str | os.PathLike, what: str) -> None:
    """The nearest existing folder above `path` is one: a file there (`-o notes.txt/x.json`)
    would fail the write only at the end, after all the work, as "File exists"."""
    for above in Path(os.path.abspath(path)).parents:
        if above.is_dir():
            return
        if above.exists() or above.is_symlink():
            kind = file_kind((os.stat if above.exists() else os.lstat)(above).st_mode)
            raise OutputWriteError(
                f"cannot write {what} {_shown(path)}: {_shown(above)} is {kind}, not a folder",
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
                f"cannot write {_shown(target)}: {_shown(existing)} takes no new files",
                "choose another output, on a disk that holds files",
            ) from error
        os.close(fd)
        remove_tree(Path(probe), ignore_errors=False)


def check_not_stdout(path: str | os.PathLike, what: str) -> None:
    """`-` is standard output only where a command prints its report (`-o -`, which the callers
    take as stdout before they get here): a file or folder a command makes that is named `-`
    is a slip for stdout, refused rather than made under that name."""
    if os.fspath(path) == "-":
        raise UsageError(
            f"{what} cannot go to standard output: '-' is stdout only for -o",
            "give a name; for a file or folder called '-', its full path, e.g. \"$PWD/-\"",
        )


def names_a_folder(path: str | os.PathLike) -> bool:
    """The name as given ends in a path separator (`newdir/`): whoever typed it meant a folder.
    A Path drops that separator (Path('newdir/') is Path('newdir')), so this is asked of the
    text before it becomes one (`cli.app` does so for every file-valued parameter)."""
    text = os.fsdecode(path)
    return text.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep))


def check_not_folder_name(path: str | os.PathLike, what: str) -> None:
    """A file output (or any file-valued name) ending in `/` is refused, never written as a
    file named without the slash: `-o reports/` made a FILE `reports`, where the user meant a
    folder. No file name is made up for it: give one."""
    if names_a_folder(path):
        raise UsageError(
            f"{what} {_shown(path)} names a folder (ends in {os.sep})",
            "give a file name",
        )


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
    _note_stdout(target)
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
    if target.is_dir():
        raise OutputExistsError(f"{what} is a folder, not a file: {target}", "give a file name")
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
        f"{what} {_shown(target)} was written by another process while this command ran; "
        f"this command's output is at {_shown(kept)}",
        f"nothing at {_shown(target)} was changed: compare the two, keep what you want",
    )


# What `os.link` raises on a file system (or a file) that takes no hard link: FAT/exFAT, some
# network and FUSE file systems, a file at its filesystem's link limit.
NO_HARD_LINK = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS)


@contextlib.contextmanager
def replaced_whole(
    target: Path, mode: str = "w", *, check: Callable[[Path], None] | None = None, **open_kwargs
) -> Iterator[IO]:
    """`target` written whole or not at all, through a flocked temporary beside it
    (`temporaries.open_temporary`) renamed into place when the block (and `check`, given the
    complete temporary) succeeds: the core of `files.atomic_write`, and how the marker is
    written, so that a run killed as it writes leaves a temporary, never a cut-short file."""
    with reporting_write_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
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
    the rename made durable: its folder fsynced (see durability.py)."""
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
            aside = _sibling(target, REPLACED_SUFFIX)
            # Listed before it is made: a stop right after the link still removes it.
            self._files.append((target, aside))
            with reporting_write_errors(target):
                _link_or_copy(target, aside)
            if _lstat_id(aside) != _lstat_id(target):  # a copy: a file of its own to hold
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
                self._new[target] = _lstat_id(target)

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
                        if new is not None and _lstat_id(target) == new:
                            remove_tree(target)
                    elif _lstat_id(aside) is not None and _lstat_id(aside) == _lstat_id(target):
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
        from torchkit.core.io.folder_locks import lock_holder

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
    for aside in _leftovers(path, REPLACED_SUFFIX):
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
    for aside in _leftovers(target, REPLACED_SUFFIX):
        if _lstat_id(aside) == _lstat_id(target):  # never replaced: the same file, twice
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


# -- write errors -----------------------------------------------------------------------------


def is_write_error(error: BaseException, target: str | os.PathLike | None = None) -> bool:
    """An error that says the output side cannot be written (full disk, read-only, no
    permission), including torch.save's RuntimeError from its zip writer. A permission or I/O
    error that names a file other than `target` (or its temporary sibling) is an input's."""
    # NumPy's short write ("49152 requested and 28544 written") is an OSError without errno:
    # the file system below decides, as for torch.save's RuntimeError.
    if isinstance(error, OSError) and error.errno is not None:
        if error.errno in WRITE_ONLY_ERRNOS:
            return True
        if error.errno not in WRITE_ERRNOS:
            return False
        if error.filename is None or target is None:
            return True
        named = os.path.abspath(os.fspath(error.filename))
        out = os.path.abspath(os.fspath(target))
        # the output, something inside it, or its temporary sibling (`.NAME.<hex>.tmp`)
        temporary = os.path.dirname(named) == os.path.dirname(out) and _is_temporary_of(
            os.path.basename(named), os.path.basename(out)
        )
        return named == out or temporary or _is_within(Path(named), Path(out))
    text = str(error).lower()
    if "(os error 28)" in text or "no space left" in text:  # safetensors' SafetensorError
        return True
    if isinstance(error, RuntimeError) or (isinstance(error, OSError) and error.errno is None):
        # torch.save's C++ stream ("file write failed", "unexpected pos 576 vs 534",
        # "basic_ios::clear: iostream error") and NumPy's tofile ("120000 requested and 12160
        # written") do not say why: ask the file system whether it is full or read-only.
        if target is not None and _file_system_full_or_read_only(target):
            return True
        return isinstance(error, RuntimeError) and any(
            sign in text
            for sign in (
                "file write failed",
                "unexpected pos",
                "inline_container",
                "iostream error",
            )
        )
    return False


def _is_temporary_of(name: str, output: str) -> bool:
    """Whether the file `name` is a temporary written for the file `output` beside it: one of
    `atomic_write`'s or `atomic_path`'s, or another (`.STEM.` anything) of a plot's arrays or
    a writability probe's."""
    stem, suffix = Path(output).stem, Path(output).suffix
    prefixes = {
        f".{stem}.",
        temporary_affixes(output)[0],  # atomic_write's
        temporary_affixes(stem, suffix)[0],  # atomic_path's, which keeps the suffix
        temporary_affixes(stem)[0],
    }
    return any(name.startswith(prefix) for prefix in prefixes)


def _file_system_full_or_read_only(target: str | os.PathLike) -> bool:
    return _file_system_problem(target) is not None


def _file_system_problem(target: str | os.PathLike) -> int | None:
    """EROFS or ENOSPC when the file system that holds `target` is read-only or (nearly) full:
    of bytes, or of inodes."""
    try:
        stats = os.statvfs(os.path.dirname(os.path.abspath(os.fspath(target))))
    except OSError:
        return None
    if stats.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if stats.f_bavail * stats.f_frsize < _NEARLY_FULL or (stats.f_files and not stats.f_favail):
        return errno.ENOSPC
    return None


_NEARLY_FULL = 64 * 1024  # bytes free: a writer that failed here ran out of space
# safetensors reports a full disk as "I/O error: No space left on device (os error 28)".
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def write_error(target: str | os.PathLike, error: BaseException) -> OutputWriteError:
    return OutputWriteError(
        f"cannot write {_shown(target)}: {write_failure_reason(target, error)}",
        _WRITE_HINTS.get(getattr(error, "errno", None), _WRITE_HINT),
    )


_WRITE_HINT = "free some space, check the permissions, or choose another output"
# Where the errno says which: space and permissions are no help with a name too long.
_WRITE_HINTS = {
    errno.ENAMETOOLONG: NAME_TOO_LONG_HINT,
}


SHARED_MEMORY = Path("/dev/shm")  # where worker processes' semaphores and batches live
_SHARED_MEMORY_SIGNS = ("</torch_", "shared memory", "shm")


def shared_memory_full(error: BaseException) -> OutputWriteError | None:
    """The error that `error` means where it is a full /dev/shm: the semaphores of a worker
    pool (an OSError ENOSPC naming no file) or torch's shared memory for a DataLoader worker's
    batch ("unable to write to file </torch_...>: No space left on device (28)"). A container's
    is 64 MB unless made larger; the output's disk, which a bare ENOSPC was blamed on, may
    have all the room it needs. None: not that, or /dev/shm has room."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG):
        named = error.filename
        if named is not None and not os.path.abspath(os.fspath(named)).startswith(
            f"{SHARED_MEMORY}{os.sep}"
        ):
            return None
    else:
        text = str(error)
        if not any(sign in text for sign in _SHARED_MEMORY_SIGNS) or not (
            "No space left" in text or "(28)" in text
        ):
            return None
    if _file_system_problem(SHARED_MEMORY / "x") != errno.ENOSPC:
        return None
    return OutputWriteError(
        f"no space left in {SHARED_MEMORY}, the shared memory that worker processes pass "
        "their work through",
        "free some there, use --workers 0, or give it more room: docker run --shm-size=1g",
    )


def write_failure_reason(target: str | os.PathLike, error: BaseException) -> str:
    """errno's words where there is an errno; otherwise what the file system says now (torch's
    and NumPy's writers report a short write without the reason)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).lower()
    if "(os error 28)" in text or "no space left" in text:
        return os.strerror(errno.ENOSPC)
    problem = _file_system_problem(target)
    return os.strerror(problem) if problem else first_line(error) or "the write failed"


def as_write_error(error: BaseException, target: str | os.PathLike) -> OutputWriteError | None:
    """The OutputWriteError that `error`, raised while writing `target`, means; None when it is
    not about the output side. Writers report a full disk in many ways: an OSError with an
    errno, safetensors' "I/O error: ... (os error 28)", torch.save's C++ stream ("unexpected pos
    576 vs 534"), NumPy's "120000 requested and 12160 written" (the file system says why)."""
    if isinstance(error, OutputWriteError):
        return error
    if _file_system_problem(target) is None:  # the output's disk has room: another one's?
        shared = shared_memory_full(error)
        if shared is not None:
            return shared
    if is_write_error(error, target):
        return write_error(target, error)
    text = str(error)
    match = _OS_ERROR.search(text)
    if match and "I/O error" in text:
        code = int(match.group(1))
        cause = OSError(code, os.strerror(code))
        if is_write_error(cause, target):
            return write_error(target, cause)
    return None


@contextlib.contextmanager
def reporting_write_errors(target: str | os.PathLike) -> Iterator[None]:
    """Turn a full disk or read-only output inside the block into one fatal OutputWriteError
    (a full disk must never look like a bad input)."""
    try:
        yield
    except OutputWriteError:
        raise
    except Exception as error:
        if isinstance(error, OSError):  # failed because its output folder went?
            try:
                check_claimed(target)
            except OutputFolderReplacedError as replaced:
                raise replaced from error
        found = as_write_error(error, target)
        if found is None:
            raise
        raise found from error


def named_as_final(error: OutputWriteError, temporary: str, final: str) -> OutputWriteError:
    """The write error with a hidden temporary path replaced by the output's, so that the
    message names what the user asked for."""
    return OutputWriteError(error.message.replace(temporary, final), error.hint)


# -- the marker and --force ---------------------------------------------------------------------


def write_marker(
    folder: Path, command: str, *, replaces: str | None = None, reports: Iterable[str] = ()
) -> None:
    """`replaces`: the name the old output will be set aside under when this (whole, atomic)
    folder takes its place, so that a run killed between the swap and the old output's delete
    leaves a folder the next run knows to be the complete new output. `reports`: the -o files
    (paths relative to the folder, `/`-separated) the run writes inside it (`REPORTS_KEY`)."""
    record: dict[str, object] = {
        "written_by": "torchkit",
        "command": command,
        "torchkit_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if replaces is not None:
        record["replaces"] = replaces
    if reports:
        record[REPORTS_KEY] = [{"path": path} for path in reports]
    # Whole or not at all: written in place, a run killed between the file's creation and its
    # text left an empty marker, which names no command, so that the folder of a run that wrote
    # nothing was refused as "already exists" by the same command. A killed writer's temporary
    # is removed by the next run (`recover_leftovers`); a failed write leaves none.
    with replaced_whole(folder / MARKER, "w", encoding="utf-8", newline="") as handle:
        handle.write(json_text(record) + "\n")


def _marker_field(folder: Path, key: str) -> str | None:
    """A text field of the folder's marker, or None: no marker, no such field, or one that
    cannot be read."""
    record = _json_record(folder / MARKER)
    value = record.get(key) if isinstance(record, dict) else None
    return value if isinstance(value, str) else None


def marker_command(folder: Path) -> str | None:
    """The command the folder's marker names (`train`, `split`...), or None: no marker, or one
    that cannot be read."""
    return _marker_field(folder, "command")


def remove_marker(folder: Path) -> None:
    """Take back the marker `write_marker` left (a run that wrote nothing else)."""
    (folder / MARKER).unlink(missing_ok=True)


# The marker's list of the -o reports its command wrote inside the folder (`-o OUT/report.json`),
# each {"path": relative path, "bytes": size, "mtime_ns": time} once written (`note_report`):
# the next `--force` of the command replaces them as its own (`recorded_reports`), also under a
# name its own -o no longer gives. A name the marker lists but whose file differs from what was
# recorded (never written, changed or put there since) is the user's.
REPORTS_KEY = "reports"


def note_report(report: str | os.PathLike) -> None:
    """Record the size and time of the -o file `report`, just written, in the marker of the
    nearest folder above it where that marker lists it (`write_marker`'s `reports`). Nothing
    where none does; a marker that cannot be rewritten leaves the report the user's (the next
    `--force` refuses it): never an error of the run that wrote it."""
    real = Path(os.path.realpath(report))
    folder = next((above for above in real.parents if (above / MARKER).is_file()), None)
    if folder is None:
        return
    marker = folder / MARKER
    record = _json_record(marker)
    entries = record.get(REPORTS_KEY) if isinstance(record, dict) else None
    if not isinstance(record, dict) or not isinstance(entries, list):
        return
    name = real.relative_to(folder).as_posix()
    try:
        info = os.stat(real)
    except OSError:
        return
    listed = False
    for entry in entries:
        if isinstance(entry, dict) and entry.get("path") == name:
            entry.update(bytes=info.st_size, mtime_ns=info.st_mtime_ns)
            listed = True
    if not listed or not stat.S_ISREG(info.st_mode):
        return
    with (
        contextlib.suppress(OutputWriteError, OSError),
        replaced_whole(marker, "w", encoding="utf-8", newline="") as handle,
    ):
        handle.write(json_text(record) + "\n")


def recorded_reports(folder: Path) -> list[str]:
    """Exact patterns (`folder_contents`) of the reports the marker of `folder` lists as written
    there whose file is still the one recorded: regular, of the recorded size and time."""
    from torchkit.core.io.folder_contents import exact_pattern

    record = _json_record(folder / MARKER)
    entries = record.get(REPORTS_KEY) if isinstance(record, dict) else None
    found = []
    for entry in entries if isinstance(entries, list) else ():
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not path or PurePath(path).is_absolute():
            continue
        if ".." in PurePath(path).parts:
            continue
        try:
            info = os.lstat(folder / path)
        except OSError:
            continue
        same = (info.st_size, info.st_mtime_ns) == (entry.get("bytes"), entry.get("mtime_ns"))
        if stat.S_ISREG(info.st_mode) and same:
            found.append(exact_pattern(path))
    return found


def is_torchkit_folder(folder: Path, known_files: Collection[str] = ()) -> bool:
    """Written by torchkit: it carries the marker, or (for folders written before the marker
    existed) holds only names the command writes (`known_files`, shell-style patterns)."""
    if (folder / MARKER).is_file():
        return True
    if not known_files:
        return False
    from fnmatch import fnmatch

    names = [entry.name for entry in os.scandir(folder)]
    return bool(names) and all(any(fnmatch(n, pattern) for pattern in known_files) for n in names)


def holds_json_record(path: Path, keys: Collection[str]) -> bool:
    """`path` is a JSON object with every one of `keys`: how a command recognises a folder it
    wrote before torchkit marked its outputs, by the record it always wrote there (config.json,
    metrics.json). Names alone are anybody's: another trainer's `best.pt` and `last.pt`, another
    tool's `metrics.json`, photos called `IMG_20240315_142530.png`."""
    record = _json_record(path, _RUN_RECORD_LIMIT)
    return isinstance(record, dict) and all(key in record for key in keys)


_RECORD_LIMIT = 1 << 20  # markers are a few KB
# A run's config.json lists its classes, an eval's metrics.json a record per class and every
# skipped file: 1.4 MB at 30,000 classes, and more. Under a smaller limit such a record read as
# another tool's file, and --force refused the command's own output folder.
_RUN_RECORD_LIMIT = 64 << 20  # read whole: 64 MB is about 0.5 s of json.loads


def _json_record(path: Path, limit: int = _RECORD_LIMIT) -> object:
    """The JSON value in the regular file `path` of at most `limit` bytes, or None: not there,
    not JSON, too large, or not a regular file. Opened without blocking and read only when
    regular, so a FIFO or a device planted under a record's name cannot hang the check (or feed
    it without end)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return json.loads(handle.read(limit).decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _is_empty_dir(folder: Path) -> bool:
    with os.scandir(folder) as entries:
        return next(entries, None) is None


def killed_start_leftovers(
    folder: Path, command: str, start_files: Collection[str] = ()
) -> list[Path] | None:
    """What is in `folder` besides the marker when all it holds is what a run of `command`
    killed before its first result left: the marker naming `command`, temporaries no live
    writer holds, and the files `start_files` names (what the command writes before anything
    worth keeping: train's config.json, split.csv and TensorBoard log, see `_is_start_file`).
    None when it holds anything else (or another command's marker, or none). To that command
    such a folder is as good as empty (with `start_files`: replaced without `--force`)."""
    if not folder.is_dir() or folder.is_symlink() or marker_command(folder) != command:
        return None
    leftovers = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:  # a folder of a million files: judged by its first few
                if entry.name == MARKER:
                    continue
                path = folder / entry.name
                temporary = TEMPORARY.fullmatch(entry.name) and is_unlocked(path)
                if not (temporary or _is_start_file(entry, start_files)):
                    return None
                leftovers.append(path)
    except OSError:
        return None
    return leftovers


def _is_start_file(entry: os.DirEntry, start_files: Collection[str]) -> bool:
    """Whether `entry` is one of `start_files` (fnmatch patterns): a regular file whose name
    matches one, or a folder holding only regular files that `FOLDER/PATTERN` patterns match
    (a TensorBoard log's event files, never a user's notes put beside them)."""
    from fnmatch import fnmatchcase

    if entry.is_file(follow_symlinks=False):
        return any(fnmatchcase(entry.name, pattern) for pattern in start_files)
    inside = [p.split("/", 1)[1] for p in start_files if p.startswith(f"{entry.name}/")]
    if not inside or not entry.is_dir(follow_symlinks=False):
        return False
    with os.scandir(entry.path) as files:
        return all(
            file.is_file(follow_symlinks=False)
            and any(fnmatchcase(file.name, pattern) for pattern in inside)
            for file in files
        )


def clear_killed_start(folder: Path, command: str) -> bool:
    """Empty `folder` (its lock held) when `killed_start_leftovers` finds only a killed run's
    start in it, so that running the command again is not refused as "already exists" and an
    atomic output can take the folder's place. Whether it was emptied."""
    leftovers = killed_start_leftovers(folder, command)
    if leftovers is None or not all([remove_if_unlocked(path) for path in leftovers]):
        return False
    remove_marker(folder)
    return True


def check_replaceable(
    folder: Path,
    force: bool,
    *,
    what: str,
    known_files: Collection[str] = (),
    hint: str = "",
    command: str | None = None,
    owned: Collection[str] | None = None,
) -> bool:
    """May `folder` be written? Returns whether it has content that `--force` will replace:
    with `command`, only an output of that command (`eval --out RUN --force` never deletes a
    training run whose marker says `train`); with `owned` (the patterns of what the command
    writes there, see `folder_contents`), only a folder holding nothing else."""
    if not (folder.exists() or folder.is_symlink()):
        return False
    if folder.is_symlink():
        raise OutputExistsError(
            f"{what} is a symbolic link: {folder}", "give the real folder or a new name"
        )
    if not folder.is_dir():  # a file, or a FIFO, socket or device: said which
        kind = file_kind(os.stat(folder).st_mode)
        raise OutputExistsError(f"{what} is {kind}, not a folder: {folder}", "give a folder name")
    if _is_empty_dir(folder):
        return False
    if command is not None and killed_start_leftovers(folder, command) is not None:
        return False  # emptied by `OutputFolder` (`clear_killed_start`), its lock held
    if not force:
        raise OutputExistsError(
            f"{what} already exists: {folder}",
            hint
            or force_refusal_hint(folder, known_files, command)
            or foreign_entries_hint(folder, owned)
            or "pass --force to overwrite it",
        )
    if not is_torchkit_folder(folder, known_files):
        raise OutputExistsError(
            f"{what} {folder} is not empty and was not written by torchkit",
            "--force only replaces torchkit's own outputs: choose another folder, or remove "
            "it yourself",
        )
    other = marker_command(folder)
    if command is not None and other is not None and other != command:
        raise OutputExistsError(
            f"{what} {folder} holds the output of torchkit {other}, not of {command}",
            f"--force only replaces an earlier output of {command}: choose another folder",
        )
    if owned is not None:  # the -o reports an earlier run of the command wrote there: its own
        refuse_foreign_entries(folder, (*owned, *recorded_reports(folder)), what=what)
    refuse_mounts_inside(folder, what=what)
    return True


def refuse_mounts_inside(folder: Path, *, what: str) -> None:
    """`--force` replaces `folder` whole: refused where a file system or a bind mount is
    mounted inside it, whose files (another folder's, shown there) it would delete."""
    from torchkit.core.io.mounts import MountTable

    points = MountTable.read().points_below(os.fspath(_real(folder)))
    if points:
        more = f" and {len(points) - 1} more" if len(points) > 1 else ""
        raise OutputExistsError(
            f"{what} {_shown(folder)} holds a mount at {sorted(points)[0]}{more}, whose files "
            "--force would delete with it",
            f"unmount it, or choose another folder than {_shown(folder)}",
        )


def force_refusal_hint(
    folder: Path, known_files: Collection[str] = (), command: str | None = None
) -> str | None:
    """What to do about an existing folder that --force would refuse too (`check_replaceable`),
    where "pass --force" sent the user to a second refusal: None where --force may replace it."""
    if not folder.is_dir() or folder.is_symlink():
        return None
    if not is_torchkit_folder(folder, known_files):
        return (
            "it was not written by torchkit, which --force does not replace: choose another "
            "folder, or empty it yourself"
        )
    other = marker_command(folder)
    if command is not None and other is not None and other != command:
        return (
            f"it holds torchkit {other}'s output, which {command} --force does not replace: "
            "choose another folder"
        )
    return None


def foreign_entries_hint(folder: Path, owned: Collection[str] | None) -> str | None:
    """The files of the user's in an earlier output, which --force refuses to delete with it
    (`refuse_foreign_entries`): None where there are none."""
    if owned is None:
        return None
    owned = (*owned, *recorded_reports(folder))
    foreign = foreign_entries(folder, owned, top_level=(MARKER, WRITTEN_JOURNAL))
    if not foreign:
        return None
    return (
        f"it holds {_shown(folder / foreign[0])} that torchkit did not write, so --force is "
        "refused too: move it out first, or choose another folder"
    )


def refuse_foreign_entries(folder: Path, owned: Collection[str], *, what: str) -> None:
    """`--force` replaces `folder` whole: refused, before any work, where it holds an entry that
    `owned` (what the command writes there) does not name, which would be deleted with it (your
    notes.txt in a run folder, a plot, a folder of analysis, a link)."""
    foreign = foreign_entries(folder, owned, top_level=(MARKER, WRITTEN_JOURNAL))
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise OutputExistsError(
            f"{what} {_shown(folder)} holds {_shown(folder / foreign[0])}"
            f"{'/' if foreign[0].endswith('/') else ''}{more} that torchkit did not write, "
            "which --force would delete with it",
            f"move them out of {_shown(folder)}, or delete them yourself",
        )


# -- locking -------------------------------------------------------------------------------------


def lock_path(folder: Path) -> Path:
    return folder.parent / f".{_sibling_base(folder)}{LOCK_SUFFIX}"


def _sibling_base(folder: Path) -> str:
    """The name of `folder` in the names of the files beside it that its writer makes: its lock
    (`.NAME.torchkit-lock`) and `.NAME.<12 hex>.partial`, `.replaced`, `.discarded`; cut
    (`fitting`) where those would not fit in a file name (a NAME of 232 bytes or more)."""
    return fitting(folder.name, len(".") + len(".") + 12 + len(DISCARDED_SUFFIX))


def _lock_error(folder: Path, lock: Path, what: str, error: OSError) -> OutputWriteError:
    """A lock file the folder above the output does not take. Where that folder is there and
    says "no such file" (`/proc`, a pseudo file system: `split data /proc/self --force`), the
    error names the folder that refused and what to do; errno's words alone, "cannot write
    /proc/self: No such file or directory (free some space...)", named a folder that is there
    and advice that cannot help."""
    if error.errno == errno.ENOENT and lock.parent.is_dir():
        return OutputWriteError(
            f"{what} {_shown(folder)} cannot be written: {_shown(lock.parent)} takes no new "
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
                from torchkit.core.io.folder_locks import lock_holder

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


# -- the folders being written ------------------------------------------------------------------


@dataclass(frozen=True)
class _Claim:
    """An output folder this process writes into, and what it was when the command made it."""

    path: Path  # where it is written (a hidden temporary folder of an atomic output)
    shown: Path  # the output, as the user named it
    identity: FileId
    what: str
    command: str
    hint: str
    # Its files are made durable together when it is kept (a hidden folder of an atomic
    # output: one sync before the swap), not one by one as they are written.
    synced_when_kept: bool = False
    # The absolute paths written into it (a folder written in place): a failed run removes
    # these and no other name, so that files put there meanwhile by someone else stay.
    written: set[str] | None = None
    # Where each name is appended before it is written (`WRITTEN_JOURNAL`), when a kill would
    # leave the next run to clean up (an old output set aside): an open binary file, or None.
    journal: IO[bytes] | None = None

    def change(self) -> str | None:
        """How the folder at `path` differs from the one claimed (None: it is that one)."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return "it is gone"
        except OSError:
            return None  # unreadable now: the write itself reports it
        if (info.st_dev, info.st_ino) != self.identity:
            return (
                "another folder is at its place now"
                if stat.S_ISDIR(info.st_mode)
                else ("a file is at its place now")
            )
        return None

    def error(self, change: str) -> OutputFolderReplacedError:
        return OutputFolderReplacedError(
            f"{self.what} {_shown(self.shown)} was removed or replaced while {self.command} was "
            f"writing into it: {change}",
            self.hint or "nothing more was written there; run the command again",
        )


def _lstat_id(path: Path) -> FileId | None:
    """The identity of what is at `path` itself (a link is not followed); None: nothing."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


def _what_is_at(path: Path) -> str:
    """What stands at `path`, in words, for an error."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "something else is at its place now"
    if stat.S_ISDIR(mode):
        return "a folder with something in it is at its place now"
    return "a link is at its place now" if stat.S_ISLNK(mode) else "a file is at its place now"


# Absolute path -> claim, for every output folder this process is writing (`OutputFolder.begin`
# to `release`): a write into a folder that was removed or replaced stops the command instead
# of making a new, incomplete folder at the same name (or writing into someone else's).
_CLAIMED: dict[str, _Claim] = {}


def claim_folder(
    folder: Path,
    *,
    what: str,
    command: str,
    hint: str = "",
    shown: Path | None = None,
    synced_when_kept: bool = False,
    records_written: bool = False,
    journal: IO[bytes] | None = None,
) -> None:
    """Record `folder` as it is now as an output folder being written (see `check_claimed`):
    `OutputFolder.begin` does, and a command that makes its folder itself under an
    `OutputFolder`'s lock; the claim ends with that lock. `records_written`: the paths written
    into it through `atomic_write`/`atomic_path` are recorded (`written_into`), and appended to
    `journal` too."""
    info = os.stat(folder)
    _CLAIMED[os.path.abspath(folder)] = _Claim(
        folder,
        shown or folder,
        (info.st_dev, info.st_ino),
        what,
        command,
        hint,
        synced_when_kept,
        set() if records_written else None,
        journal,
    )


def written_into(folder: str | os.PathLike) -> set[str]:
    """The absolute paths recorded as written into the claimed `folder` (see `claim_folder`)."""
    claim = _CLAIMED.get(os.path.abspath(folder))
    return set() if claim is None or claim.written is None else set(claim.written)


def synced_when_kept(target: str | os.PathLike) -> bool:
    """Whether `target` is written into the hidden folder of an atomic output, which is made
    durable as a whole before it is swapped into place: its files need no fsync each."""
    if not _CLAIMED:
        return False
    text = os.path.abspath(os.fspath(target))
    return any(
        claim.synced_when_kept and text.startswith(prefix.rstrip(os.sep) + os.sep)
        for prefix, claim in list(_CLAIMED.items())
    )


def claimed_change(folder: str | os.PathLike) -> str | None:
    """How the claimed output `folder` changed since it was claimed (None: it did not, or it
    is not claimed): what stands there now is not the command's to delete."""
    claim = _CLAIMED.get(os.path.abspath(folder))
    return None if claim is None else claim.change()


def check_claimed(target: str | os.PathLike, *, writing: bool = False) -> None:
    """Before writing `target`: each claimed output folder that holds it is still the folder
    the command made (one stat), else OutputFolderReplacedError. `writing`: `target` is about
    to be written, and recorded as the command's own where its folder records that."""
    if not _CLAIMED:
        return
    text = os.path.abspath(os.fspath(target))
    for prefix, claim in list(_CLAIMED.items()):
        inside = text.startswith(prefix.rstrip(os.sep) + os.sep)
        if text == prefix or inside:
            change = claim.change()
            if change is not None:
                raise claim.error(change)
            if writing and inside and claim.written is not None and text not in claim.written:
                claim.written.add(text)
                if claim.journal is not None:  # on record before the name exists: a kill
                    name = os.path.relpath(text, prefix)  # after it leaves it to remove
                    with reporting_write_errors(claim.shown):
                        claim.journal.write(json_text(name).encode("utf-8") + b"\n")
                        claim.journal.flush()


def remove_written(folder: Path, written: Iterable[str | os.PathLike]) -> list[str]:
    """Remove what a failed run wrote into `folder` (`written`: files, or folders that are
    wholly its own), then the folders on their way up that this leaves empty (not `folder`
    itself). Nothing else is touched: returns the names still at the top of `folder`, files
    someone else put there while the run worked ([] when it is empty or gone)."""
    top = os.path.abspath(folder)
    parents: set[str] = set()
    for path in written:
        text = os.path.abspath(os.fspath(path))
        if not text.startswith(top.rstrip(os.sep) + os.sep):
            continue
        remove_tree(Path(text))
        parent = os.path.dirname(text)
        while parent != top and parent.startswith(top + os.sep):
            parents.add(parent)
            parent = os.path.dirname(parent)
    for parent in sorted(parents, key=len, reverse=True):  # the deepest first
        with contextlib.suppress(OSError):  # one with something else in it stays
            os.rmdir(parent)
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def kept_note(what: str, folder: Path, names: list[str], run: str = "this run") -> str:
    """Why a failed (or killed: `run`) run left its output folder: files it did not write are
    in it."""
    shown = first_and_more(names, 3)
    return f"{what} {_shown(folder)} was kept: it holds files {run} did not write ({shown})"


def tell_note(note: str, error: BaseException | None) -> None:
    """Add `note` to the error line of the failure that is ending the command (a TorchkitError),
    or log it as a warning (an interrupt, an unexpected error)."""
    if isinstance(error, TorchkitError):
        error.message = f"{error.message}; {note}"
        error.args = (error.message,)
    else:
        log.warning(note)


# -- set aside, put back --------------------------------------------------------------------------


def _sibling(folder: Path, suffix: str) -> Path:
    return folder.parent / f".{_sibling_base(folder)}.{uuid.uuid4().hex[:12]}{suffix}"


def _leftovers(folder: Path, suffix: str) -> list[Path]:
    prefix = f".{_sibling_base(folder)}."
    try:
        names = os.listdir(folder.parent)
    except OSError:
        return []
    return sorted(
        folder.parent / n
        for n in names
        if n.startswith(prefix) and n.endswith(suffix) and len(n) == len(prefix) + 12 + len(suffix)
    )


def remove_tree(path: Path, *, ignore_errors: bool = True) -> None:
    """Delete `path`: a folder with everything in it, or a file or link (never what a link
    points to); a missing path is nothing to do. `ignore_errors=False` raises what the delete
    raises, for a caller whose next step needs the path gone."""
    try:
        is_folder = stat.S_ISDIR(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError:  # a name the file system refuses (too long: it was never made), EACCES...
        if ignore_errors:
            return
        raise
    if is_folder:
        shutil.rmtree(path, ignore_errors=ignore_errors)
    elif ignore_errors:
        with contextlib.suppress(OSError):
            os.unlink(path)
    else:
        os.unlink(path)


def discard_tree(path: Path, gone: Path | None = None) -> None:
    """Rename first (atomic) to `gone`, then delete: a kill half-way through the delete leaves
    a folder named as discarded, never a half-deleted one that looks like a set-aside output."""
    if gone is None:
        gone = path.with_name(path.name.rsplit(".", 1)[0] + DISCARDED_SUFFIX)
    try:
        try:
            os.replace(path, gone)
        except OSError:
            gone = path
        remove_tree(gone)
    except BaseException:
        # Ctrl-C or SIGTERM half-way (the CLI ignores a second one): the delete decided is
        # finished, not left as a hidden folder of the old output until a next run.
        remove_tree(gone if os.path.lexists(gone) else path)
        raise


def recover_leftovers(folder: Path) -> list[str]:
    """Clean up after a torchkit run on `folder` that was killed (SIGKILL, power cut), with the
    folder's lock held: half-written temporaries are removed, a set-aside old output is put back
    when the killed run had not written anything worth keeping. Returns what was done, as
    sentences for a warning."""
    notes: list[str] = []
    if folder.is_dir() and not folder.is_symlink():
        # A run killed as it wrote the marker left the marker's temporary: without it, the
        # folder is what a run killed just before its marker left (empty, or its own files).
        remove_dead_temporaries(folder / MARKER)
    for leftover in _leftovers(folder, PARTIAL_SUFFIX) + _leftovers(folder, DISCARDED_SUFFIX):
        remove_tree(leftover)
    for aside in _leftovers(folder, REPLACED_SUFFIX):
        # A whole (atomic) output in place names the set-aside it replaced in its marker: it got
        # there whole, so its run was killed after the swap, before deleting the old output.
        whole = folder.is_dir() and not folder.is_symlink()
        replaced = _marker_field(folder, "replaces") if whole else None
        if aside.name == replaced:
            discard_tree(aside)
            notes.append(
                f"kept {folder}, the complete output of a torchkit run killed just after putting "
                f"it in place, and removed the earlier output it replaced (set aside at {aside})"
            )
            continue
        current = folder.exists() or folder.is_symlink()
        # Only a folder that a torchkit run created and never marked as worth keeping (the
        # set-aside would be gone) makes room: the names that run wrote are removed, and the
        # folder once that leaves it empty; files someone else put there stay, and so does it.
        if (
            current
            and replaced is None  # never a whole output, which is complete
            and folder.is_dir()
            and not folder.is_symlink()
            and (_is_empty_dir(folder) or (folder / MARKER).is_file())
        ):
            others = remove_written(folder, _killed_runs_names(folder))
            if others:
                notes.append(
                    kept_note("output folder", folder, others, "a killed torchkit run")
                    + f"; an earlier output of it, which that run had set aside, is at {aside}:"
                    " move it back"
                )
                continue
            with contextlib.suppress(OSError):
                folder.rmdir()
            current = os.path.lexists(folder)
        if current:
            notes.append(
                f"an earlier output of {folder}, set aside by a torchkit run that was killed, is "
                f"still at {aside}: move it back or remove it"
            )
            continue
        os.replace(aside, folder)
        notes.append(f"put back {folder}, which a killed torchkit run had set aside")
    return notes


def _killed_runs_names(folder: Path) -> list[str]:
    """What a killed run that had set an old output aside wrote into `folder`: the names in its
    `WRITTEN_JOURNAL` (a torn last line is one it never began), the temporaries of those names
    (no one writes them now: the folder is locked), its marker and the journal itself."""
    journal = folder / WRITTEN_JOURNAL
    names = []
    with contextlib.suppress(OSError):
        for line in journal.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                name = json.loads(line)
                if isinstance(name, str) and not os.path.isabs(name):
                    names.append(os.path.normpath(os.path.join(folder, name)))
    by_parent: dict[str, set[str]] = {}  # what `temporary_stem` reads from their temporaries
    for path in names:
        by_parent.setdefault(os.path.dirname(path), set()).update(
            temporary_stems(os.path.basename(path))
        )
    for parent, own in by_parent.items():
        with contextlib.suppress(OSError):
            for entry in os.listdir(parent):
                if temporary_stem(entry) in own:
                    names.append(os.path.join(parent, entry))
    return [*names, os.fspath(folder / MARKER), os.fspath(journal)]


def _close_quietly(journal: IO[bytes]) -> None:
    """Close a `WRITTEN_JOURNAL`: a line its failed flush left in the buffer (the disk filled)
    fails the close again, which stopped `abandon` before the old output went back (left set
    aside, hidden, behind a raw OSError). The file is closed all the same; the names it lists
    are in `written_into` too, and the journal is removed with them."""
    with contextlib.suppress(OSError):
        journal.close()


class OutputFolder:
    """One output folder of one command, from the checks to the end of the run.

    Create it before the slow work (the checks and the lock happen at once), call `begin()` when
    the first file is about to be written (an old output is set aside, the folder made and
    marked), `keep()` once the new output is worth more than the old one, and `finish(ok)` at
    the end (or use it as a context manager): a run that fails before `keep()` leaves the old
    output back in place and no trace of itself.

    `resume=True` continues an existing folder in place: no `--force` rules, nothing set aside.
    `owned` names what the command writes into the folder (`folder_contents`): `--force` refuses
    a folder holding anything else, which replacing it whole would delete. `reports`: the -o
    files of the run, which are its own where they lie inside the folder (`REPORTS_KEY`).
    `start_files` names what the command writes before anything worth keeping
    (`killed_start_leftovers`): a folder holding only those, the marker and temporaries, is a
    run of the command killed before its first result, replaced without `--force` (set aside
    like an old output, and put back if the new run keeps nothing: `replaces_killed_start`).
    `atomic=True` fills a hidden temporary folder that replaces the output only at the end, so
    the output never holds a half-written result.

    From `begin()` on, every write through `atomic_write`/`atomic_path` (and `check()`) checks
    that the folder is still the one begun: one removed, renamed away or replaced stops the
    command (`replaced_hint` says what to do then) and is never made again nor deleted.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        command: str,
        force: bool = False,
        inputs: Iterable[InputPath | None] = (),
        known_files: Collection[str] = (),
        what: str = "output folder",
        resume: bool = False,
        atomic: bool = False,
        exists_hint: str | Callable[[], str] = "",
        replaced_hint: str = "",
        start_files: Collection[str] = (),
        owned: Collection[str] | None = None,
        reports: Iterable[str | os.PathLike | None] = (),
    ) -> None:
        from torchkit.core.io.folder_contents import exact_pattern

        check_not_stdout(path, what)
        self.final = Path(path)
        # The -o files this run writes inside the folder: its own to replace, and recorded in
        # the marker as the command's (`note_report`), so that the next --force replaces them.
        self.reports = [
            inside.as_posix()
            for report in reports
            if report is not None and os.fspath(report) != "-"
            for inside in [path_inside(report, self.final)]
            if inside is not None
        ]
        if owned is not None:
            owned = (*owned, *(exact_pattern(name) for name in self.reports))
        self.replaced_hint = replaced_hint
        self._claim: _Claim | None = None
        self.command = command
        self.what = what
        self.resume = resume
        self.atomic = atomic
        self.notes: list[str] = []
        self._aside: Path | None = None
        self._swap_aside: Path | None = None  # atomic: where `_swap_in` sets the old output aside
        self._began = False
        self._kept = False
        self._lock: FolderLock | None = None
        self._journal: IO[bytes] | None = None  # WRITTEN_JOURNAL, while an old output is aside
        if not resume:  # continuing in place replaces nothing, wherever it is
            check_not_protected(self.final, what)
        check_overlap(self.final, what, inputs)
        check_folders_above(self.final, what)
        # Open from before its lock until released: a stop anywhere in between, also where no
        # try of this class is running (as `__exit__` or `finish` is entered, or in the
        # caller's steps before its `with`), is closed by the end of the command.
        self._token: int | None = opened(self)
        try:
            # Lock first: a second command is refused with the holder's PID whatever its
            # options, and a killed run's set-aside is put back before the folder is judged.
            # Signals deferred: the lock file is made and its descriptor kept, or neither.
            with signals_deferred():
                self._lock = FolderLock(self.final, what)
            self.notes = recover_leftovers(self.final)
            for note in self.notes:
                log.warning(note)
            if not resume:  # a run of this command killed before its first file
                clear_killed_start(self.final, command)
            self._existed = self.final.is_dir()
            self.replaces_killed_start = (
                not resume
                and bool(start_files)
                and killed_start_leftovers(self.final, command, start_files) is not None
            )
            if not resume:
                # A callable hint judges the folder as it is now: a killed run's leftovers gone
                hint = exists_hint() if callable(exists_hint) else exists_hint
                self.has_content = check_replaceable(
                    self.final,
                    force or self.replaces_killed_start,
                    what=what,
                    known_files=known_files,
                    hint=hint,
                    command=command,
                    owned=owned,
                )
            else:
                self.has_content = self.final.is_dir() and not _is_empty_dir(self.final)
            # The old output judged replaceable here: an atomic `keep()` replaces that folder
            # only, never one made at its place while the command ran.
            self._replacing = _lstat_id(self.final) if self.has_content else None
        except BaseException:
            self.release()
            raise
        self.path = self.final  # where to write; a temporary folder once begun with `atomic`

    def begin(self) -> Path:
        """Set the old output aside (with `--force`), make the folder and mark it."""
        if self._began:
            return self.path
        self._began = True
        with reporting_write_errors(self.final):
            if self.atomic:
                self.path = _sibling(self.final, PARTIAL_SUFFIX)
                self.path.mkdir(parents=True)
                # Claimed before the marker is written into it: the marker too is synced with
                # the whole folder before the swap, not on its own.
                self._claim_folder()
                if self._replacing is not None:
                    self._swap_aside = _sibling(self.final, REPLACED_SUFFIX)
            else:
                if self.has_content and not self.resume:
                    # Named before the rename: a signal that lands as the rename returns still
                    # finds the old output to put back (`abandon` checks that it moved).
                    self._aside = _sibling(self.final, REPLACED_SUFFIX)
                    os.replace(self.final, self._aside)
                self.final.mkdir(parents=True, exist_ok=True)
            if not (self.path / MARKER).exists():
                replaces = None if self._swap_aside is None else self._swap_aside.name
                try:
                    write_marker(self.path, self.command, replaces=replaces, reports=self.reports)
                except OutputWriteError as error:  # name the output, not the hidden temporary
                    raise write_error(self.final, error.__cause__ or error) from error
            if self._aside is not None:  # a kill leaves the next run to remove what it wrote
                self._journal = open(self.final / WRITTEN_JOURNAL, "ab")  # noqa: SIM115
            self._claim_folder()
        return self.path

    def _claim_folder(self) -> None:
        """Record what the folder being written is (see `check_claimed`)."""
        self._unclaim()
        claim_folder(
            self.path,
            what=self.what,
            command=self.command,
            hint=self.replaced_hint,
            shown=self.final,
            synced_when_kept=self.atomic and self.path != self.final,
            records_written=self.path == self.final,
            journal=self._journal,
        )
        self._claim = _CLAIMED[os.path.abspath(self.path)]

    def wrote(self, path: str | os.PathLike) -> None:
        """Record `path` (a file, or a folder wholly the command's own) as written into the
        folder by a writer that does not go through `atomic_write`/`atomic_path`: a failed run
        removes what was recorded, and no other name (see `abandon`)."""
        check_claimed(path, writing=True)

    def _unclaim(self) -> None:
        if self._claim is not None:
            _CLAIMED.pop(os.path.abspath(self._claim.path), None)
            self._claim = None

    def _changed(self) -> str | None:
        return None if self._claim is None else self._claim.change()

    def check(self) -> None:
        """The folder begun is still in place (one stat): for writers that do not go through
        `atomic_write`/`atomic_path`, before each write."""
        change = self._changed()
        if change is not None:
            raise self._claim.error(change)

    @contextlib.contextmanager
    def reporting_write_errors(self) -> Iterator[Path]:
        """Write errors inside the block name the output folder, not its hidden temporary."""
        try:
            yield self.path
        except OutputFolderReplacedError:
            raise
        except OSError as error:
            change = self._changed()
            if change is not None:  # a write that failed because the folder went
                raise self._claim.error(change) from error
            if is_write_error(error, self.path):
                raise write_error(self.final, error) from error
            raise
        except OutputWriteError as error:
            change = self._changed()
            if change is not None:
                raise self._claim.error(change) from error
            if self.path == self.final:
                raise
            raise write_error(self.final, error.__cause__ or error) from error
        except RuntimeError as error:
            if is_write_error(error, self.path):
                raise write_error(self.final, error) from error
            raise

    def keep(self) -> None:
        """The new output is worth keeping: the set-aside old one is deleted, and a later
        failure leaves the new one in place."""
        if self._kept or not self._began:
            return
        if self.atomic:
            self.check()  # the hidden folder filled is still there, whole, to be swapped in
            with reporting_write_errors(self.final):
                # On disk before the swap: a power cut after it finds the whole new output,
                # never its names over empty files with the old output deleted.
                sync_file_system(self.path)
                self._swap_in()
                fsync_directory(self.final.parent)
            self.path = self.final
            if self._claim is not None:
                self._claim_folder()
        else:
            self._make_durable()  # before the old output set aside is deleted
            if self._aside is not None:
                discard_tree(self._aside)
                self._aside = None
            self._close_journal(remove=True)  # nothing is left for a next run to clean up
        self._kept = True

    def _close_journal(self, *, remove: bool) -> None:
        if self._journal is not None:
            journal, self._journal = self._journal, None
            if self._claim is not None:  # no more appends; the names written stay recorded
                self._claim = dataclasses.replace(self._claim, journal=None)
                _CLAIMED[os.path.abspath(self._claim.path)] = self._claim
            _close_quietly(journal)
            if remove:
                with contextlib.suppress(OSError):
                    os.unlink(self.final / WRITTEN_JOURNAL)

    def _make_durable(self) -> None:
        """What was written into the (non-atomic) folder so far on disk: files written without
        an fsync each (copies, encoded images) are whole after a power cut."""
        if not self.final.is_dir():  # removed or replaced meanwhile: `check` reports that
            return
        with reporting_write_errors(self.final):
            sync_file_system(self.final)
            fsync_directory(self.final.parent)

    def _swap_in(self) -> None:
        """Rename the finished temporary folder to the output's name: over the old output
        judged at the checks (set aside, then deleted), or where nothing or an empty folder
        stood. Anything else there now was made by another process while the command ran: it
        is neither deleted nor merged into (`_refuse_swap`)."""
        if self._replacing is not None and os.path.lexists(self.final):
            # The name the new output's marker records: a kill after the second rename leaves
            # the next run to delete it (`recover_leftovers`).
            old = self._swap_aside or _sibling(self.final, REPLACED_SUFFIX)
            ours = False
            try:
                os.replace(self.final, old)
                # Checked once set aside, under a name no one else knows: what is deleted
                # below is the old output, whatever came and went at its name meanwhile.
                ours = _lstat_id(old) == self._replacing
                if ours:
                    os.replace(self.path, self.final)
                    # In the block: a signal raised as the delete is entered, before its own
                    # clean-up is in place, left the old output hidden until a next run.
                    discard_tree(old)
            except BaseException:
                # A signal (or an error) between the two renames: the old output goes back,
                # not left hidden with no output in its place.
                if os.path.lexists(old) and not os.path.lexists(self.final):
                    os.replace(old, self.final)
                    remove_tree(self.path)  # the new one goes, as `abandon` drops it
                elif ours and os.path.lexists(old):  # the new output is whole and in place
                    discard_tree(old)
                raise
            if not ours:
                self._refuse_swap(_what_is_at(old), put_back=old)
            return
        try:
            # The kernel replaces nothing or an empty folder only: a file, or a folder with
            # something in it (put there while the command ran), fails the rename.
            os.replace(self.path, self.final)
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            self._refuse_swap(_what_is_at(self.final))

    def _refuse_swap(self, found: str, *, put_back: Path | None = None) -> None:
        """Something not judged at the checks stands at the output's name: it stays (put back
        from `put_back`, where it was set aside to be checked), and the finished output is
        renamed beside it under a visible name (`NAME.new`), so that neither is lost."""
        if put_back is not None:
            try:
                os.rename(put_back, self.final)
            except OSError:
                found += f" (set aside at {put_back}: move it back)"
        kept = self.path
        for number in range(1, 100):
            name = self.final.with_name(
                self.final.name + (f".new-{number}" if number > 1 else ".new")
            )
            if not os.path.lexists(name):
                with contextlib.suppress(OSError):
                    os.rename(self.path, name)
                    kept = name
                break
        self._unclaim()
        self._began = False  # nothing of this run is left to remove
        self.path = kept
        raise OutputFolderReplacedError(
            f"{self.what} {_shown(self.final)} was made or changed by another process while "
            f"{self.command} was writing: {found}; the finished output is at {_shown(kept)}",
            f"nothing at {_shown(self.final)} was changed: compare the two, keep what you want",
        )

    def abandon(self, error: BaseException | None = None) -> None:
        """The run failed before `keep()`: remove what it wrote and put the old output back.
        Files that someone else put into the folder meanwhile stay, and so does the folder:
        `error` (the failure ending the command) says so."""
        if self._began and not self._kept:
            if self._changed() is not None:
                self._abandon_replaced()
            elif self.atomic:
                # Still the output's own name where the stop came before the hidden folder
                # was named (`begin`): the old output there is not this run's to delete.
                if self.path != self.final:
                    remove_tree(self.path)
            else:
                if self._aside is not None and not os.path.lexists(self._aside):
                    self._aside = None  # stopped before the rename: the old output is in place
                if not self.resume and (self._aside is not None or not self.has_content):
                    self._remove_written(error)
                if self._aside is not None:
                    os.replace(self._aside, self.final)
                    self._aside = None
            self.path = self.final
        self._began = False
        if self._lock is None:  # released before (`finish` after a failed keep): all done
            closed(self._token)

    def _remove_written(self, error: BaseException | None) -> None:
        """Remove the names this run wrote into the folder (it made the folder, or found it
        empty), then the folder if this run made it and nothing else is in it."""
        self._close_journal(remove=False)  # removed below with the rest
        written = written_into(self.final) | {
            os.path.abspath(self.final / name) for name in (MARKER, WRITTEN_JOURNAL)
        }
        others = remove_written(self.final, written)
        if others:
            note = kept_note(self.what, self.final, others)
            if self._aside is not None:  # the earlier output cannot go back over them
                note += f"; the earlier output is at {_shown(self._aside)}: move it back"
                self._aside = None
            tell_note(note, error)
        elif not self._existed or self._aside is not None:
            with contextlib.suppress(OSError):
                self.final.rmdir()

    def _abandon_replaced(self) -> None:
        """The folder begun was removed or replaced: what is at its place now is not this
        run's to delete; an old output set aside goes back only to an empty place."""
        aside, self._aside = self._aside, None
        if aside is None or not os.path.lexists(aside):
            return
        if self.atomic or os.path.lexists(self.final):
            log.warning(
                f"an earlier output of {self.final}, set aside by this run, is still at {aside}: "
                "move it back or remove it"
            )
            return
        os.replace(aside, self.final)

    def release(self) -> None:
        if self._journal is not None:
            _close_quietly(self._journal)
            self._journal = None
        self._unclaim()
        _CLAIMED.pop(os.path.abspath(self.final), None)  # one made under this lock
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if not (self._began and not self._kept):  # else still to abandon: open until then
            closed(self._token)

    def close_unfinished(self, error: BaseException | None) -> None:
        """Left open by its command (stopped where none of this class's clean-up was in
        place): abandoned unless kept, and released."""
        self.finish(False, error)

    def finish(self, ok: bool, error: BaseException | None = None) -> None:
        """Keep the output (`ok`) or abandon it; `error` is the failure ending the command."""
        try:
            if ok:
                try:
                    if self._kept and self._began and not self.atomic:
                        self._make_durable()  # what was written since `keep()`, before success
                    self.keep()
                except BaseException as failure:  # not made durable (an I/O error): failed
                    self.abandon(failure)
                    raise
            else:
                self.abandon(error)
        finally:
            self.release()

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(exc_type is None, exc)
