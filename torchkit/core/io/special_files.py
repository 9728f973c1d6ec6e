"""Special files as outputs: FIFOs, devices, sockets, terminals and this process's own
descriptors (`/dev/stdout`, `/dev/fd/N`) are written into, never replaced.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat

from torchkit.core.io.errors import (
    OutputExistsError,
    OutputWriteError,
    UsageError,
)
from torchkit.core.io.output_paths import shown
from torchkit.program import closed_at_start

log = logging.getLogger("torchkit")


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


def note_stdout(path: str | os.PathLike) -> None:
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
            f"cannot write {what} {shown(path)}: {error.strerror}",
            f"{named} is closed: send it to a file or to /dev/null, or choose another output",
        ) from None
    if mode == os.O_RDONLY:
        # Opened again by its name for writing, a pipe's read end became its write end (the
        # command wrote into its own input); with --force, a file's name (`-o /dev/stdin <
        # x.csv`) was replaced: the link /dev/stdin itself, by root.
        raise OutputWriteError(
            f"cannot write {what} {shown(path)}: {named} is open for reading only",
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
            f"{what} is a socket, not a file: {shown(path)}",
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
            f"cannot write {what} {shown(path)}: {error.strerror}",
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
            f"{what} is a block device: {shown(path)}",
            "writing into it overwrites what it holds: pass --force to write into it anyway",
        )


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


def check_not_a_folder(path: str | os.PathLike, what: str) -> None:
    """A file output that names an existing folder (or a link to one) is a usage error, the
    same line whichever command and whichever check (the command line's or the core's) meets
    it first."""
    if os.path.isdir(path):
        raise UsageError(f"{what} {shown(path)} is a folder, not a file", "give a file name")


def check_not_folder_name(path: str | os.PathLike, what: str) -> None:
    """A file output (or any file-valued name) ending in `/` is refused, never written as a
    file named without the slash: `-o reports/` made a FILE `reports`, where the user meant a
    folder. No file name is made up for it: give one."""
    if names_a_folder(path):
        raise UsageError(
            f"{what} {shown(path)} names a folder (ends in {os.sep})",
            "give a file name",
        )
