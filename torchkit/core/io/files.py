"""Writing files so that nothing is lost: no silent overwrite, no half-written output."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

from torchkit.core.io.claims import check_claimed, synced_when_kept
from torchkit.core.io.claims import reporting_write_errors as _reporting
from torchkit.core.io.durability import fsync_file
from torchkit.core.io.errors import InputError, OutputWriteError
from torchkit.core.io.file_outputs import folders_made_above, rename_into_place, replaced_whole
from torchkit.core.io.non_utf8_names import json_text
from torchkit.core.io.output_paths import remove_tree
from torchkit.core.io.special_files import is_special_file, own_descriptor
from torchkit.core.io.temporaries import (
    apply_umask,
    discarded_on_failure,
    open_temporary,
    temporary_affixes,
    temporary_stem,
)
from torchkit.core.io.write_errors import as_write_error, write_failure_reason


def refuse_unreachable(path: str | os.PathLike) -> None:
    """InputError where `path` cannot even be looked at: a folder on its way that this user
    may not enter (`chmod 700` of another user's folder), where `Path.exists` and `is_dir`
    raise PermissionError (which ended a command in `Error: PermissionError: [Errno 13]`).
    Nothing where it exists, is missing, or is no path at all (a URL, a pattern)."""
    try:
        os.stat(path)
    except PermissionError:
        raise InputError(
            f"cannot reach {os.fspath(path)}: permission denied",
            "this user may not enter a folder on its way: check them with ls -ld",
        ) from None
    except (OSError, ValueError):
        return


def require_input(
    path: str | os.PathLike, *, what: str = "input", kind: str = "any", hint: str = "check the path"
) -> Path:
    """Return `path` if it exists (as a file or folder when `kind` says so), else a clear error
    (`hint` says what to do when it is missing; `refuse_unreachable`'s where it cannot be
    looked at)."""
    source = Path(path)
    refuse_unreachable(source)
    if not source.exists():
        raise InputError(f"{what} not found: {source}", hint)
    if kind == "file" and not source.is_file():
        raise InputError(f"{what} is not a file: {source}", _file_hint(source))
    if kind == "dir" and not source.is_dir():
        raise InputError(f"{what} is not a folder: {source}")
    return source


def _file_hint(source: Path) -> str | None:
    """What to give instead of a folder where a file is wanted: a training run's checkpoint."""
    if not source.is_dir():
        return None  # a FIFO or device: its name says enough
    for name in ("best.pt", "last.pt"):  # what a training run's folder holds
        if (source / name).is_file():
            return f"a training run folder: give its checkpoint, {source / name}"
    return "a folder with no best.pt or last.pt in it: give a checkpoint file"


def absolute_as_opened(paths: Iterable[str | os.PathLike]) -> list[str]:
    """`os.path.abspath` of each path, except that a `..` is resolved as the system resolves it
    when the file is opened (the parent of where the link before it leads), not by dropping the
    name before it: `ROOT/linked/../x` is not `ROOT/x` when `linked` is a symbolic link."""
    cwd = os.getcwd()
    real_heads: dict[str, str] = {}  # the rows of a CSV index share a few `../` folders
    found = []
    for path in paths:
        absolute = os.path.join(cwd, os.fspath(path))
        parts = absolute.split(os.sep)
        if os.pardir not in parts:
            found.append(os.path.normpath(absolute))
            continue
        last = len(parts) - parts[::-1].index(os.pardir)
        head = os.sep.join(parts[:last])
        if head not in real_heads:
            real_heads[head] = os.path.realpath(head)
        found.append(os.path.normpath(os.path.join(real_heads[head], *parts[last:])))
    return found


STDIN = "-"  # as an input: the paths piped to the command, one per line


def read_path_list(stdin: Iterable[str] | None, what: str) -> list[str]:
    """The paths piped for `-` (predict, extract-features, video-info), all of them: one per
    line, as `path_lists.PathStream` reads them; `what` they name (image, video) is in the error
    when there are none."""
    from torchkit.core.io.path_lists import PathStream

    stream = PathStream(stdin, what)
    paths: list[str] = []
    while taken := stream.take(1 << 16):
        paths += taken
    return paths


# File names are bytes on Linux; Python holds those that are not UTF-8 as lone surrogates
# ("bad\xff.png" -> "bad\udcff.png"). Text files that name them are written and read with
# surrogateescape, as stdout is: a CSV holds the name's own bytes (what `ls` shows) and reads
# back to the same str, which opens the same file. UTF-8 names give the same bytes as strict.
NAME_ERRORS = "surrogateescape"


def open_text(path: str | os.PathLike, encoding: str = "utf-8") -> IO[str]:
    """`path` opened to read text that may name files (a CSV index, split.csv, classes.txt):
    bytes that are not UTF-8 read back as the names they were written from (NAME_ERRORS);
    newline="" as the csv module wants."""
    return open(path, encoding=encoding, errors=NAME_ERRORS, newline="")


def read_text(path: str | os.PathLike, encoding: str = "utf-8") -> str:
    """The text of `path` as `open_text` reads it (newlines as written)."""
    with open_text(path, encoding) as handle:
        return handle.read()


def drawable(text: str) -> str:
    """`text` with each byte of a name that is not UTF-8 as U+FFFD, as `ls` shows it: for
    plots (matplotlib cannot draw a lone surrogate)."""
    return text.encode("utf-8", NAME_ERRORS).decode("utf-8", "replace")


def own_descriptor_written_through(path: str | os.PathLike) -> int | None:
    """The file descriptor of this process that `path` names (`-o /dev/stdout`), where it is
    written through the descriptor rather than opened again by its name: a regular file
    (`>> log.txt`), which opened by its name would be truncated and written from its start,
    over what the shell or earlier commands put there (through the descriptor, it is added
    where the descriptor stands: appended with `>>`), and a socket (stdout under a service
    manager), which cannot be opened by its name at all."""
    fd = own_descriptor(path)
    if fd is None:
        return None
    try:
        mode = os.fstat(fd).st_mode
    except OSError:  # closed (`>&-`): opening the name reports it
        return None
    return fd if stat.S_ISREG(mode) or stat.S_ISSOCK(mode) else None


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike,
    mode: str = "w",
    *,
    check: Callable[[Path], None] | None = None,
    **open_kwargs,
) -> Iterator[IO]:
    """Open a temporary file beside `path`; rename it into place only if the block succeeds
    (and `check`, given the complete temporary file, raises nothing).

    The temporary file is in the same folder so the final `os.replace` is atomic: a crash or a
    kill at any moment leaves either the old file or the new one, never a truncated mix. It is
    fsynced before the rename and its folder after it, except inside the hidden folder of an
    atomic output folder, which is synced as a whole before it replaces the output
    (`OutputFolder.keep`). Text
    is written with `errors=NAME_ERRORS` unless the caller says otherwise: file names that
    are not UTF-8 are written as their own bytes.
    """
    if "b" not in mode:
        open_kwargs.setdefault("errors", NAME_ERRORS)
    target = Path(path)
    if is_special_file(target):  # a FIFO or /dev/stdout is written into, never replaced
        own = own_descriptor_written_through(target)
        opened = target if own is None else os.dup(own)
        with _reporting(target), open(opened, mode, **open_kwargs) as handle:
            yield handle
        return
    check_claimed(target, writing=True)  # its folder is still the one begun: never made again
    with replaced_whole(target, mode, check=check, **open_kwargs) as handle:
        yield handle


def remove_stale_temporaries(folder: Path, owns: Callable[[str], bool]) -> list[str]:
    """Remove the temporaries a killed writer left in `folder` (a SIGKILL cannot be caught, so
    the writer's own clean-up never ran), for the final names `owns` accepts: only files the
    caller writes itself, in a folder it holds locked (`owns` is asked `temporary_stem`: a
    name too long for its temporary to hold comes as its shortened form). Returns the names
    removed."""
    removed = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return removed
    for name in names:
        stem = temporary_stem(name)
        if stem is None or not owns(stem):
            continue
        path = folder / name
        if path.is_file() and not path.is_symlink():
            remove_tree(path)  # one left behind (an error ignored) is clutter, not harm
            if not os.path.lexists(path):
                removed.append(name)
    return removed


def atomic_write_text(
    path: str | os.PathLike, text: str, *, check: Callable[[Path], None] | None = None
) -> None:
    with atomic_write(path, "w", check=check, encoding="utf-8", newline="") as handle:
        handle.write(text)


def atomic_write_json(
    path: str | os.PathLike,
    value: object,
    *,
    indent: int | None = 2,
    check: Callable[[Path], None] | None = None,
) -> None:
    """`value` as the JSON file `path` (`indent` None: on one line), written whole
    (`atomic_write_text`): the one writer of the JSON files in torchkit's outputs
    (metrics.json, meta.json, manifest.json, config.json...), written as stdout's JSON is
    (`json_text`): UTF-8, "café" as itself, a name that is not UTF-8 as its escape
    ("\\udcff")."""
    atomic_write_text(path, json_text(value, indent=indent) + "\n", check=check)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path, "wb") as handle:
        handle.write(data)


def add_missing_lines(path: str | os.PathLike, lines: Sequence[str]) -> list[str]:
    """Add each of `lines` that the user's text file `path` (a shell's rc file) does not hold
    yet at its end, making the file where there is none; returns the lines added. The file is
    replaced whole, by a new one with its permissions renamed into place, so that a full disk
    or a kill leaves it as it was, never cut short; through a symlink, its target is changed."""
    target = Path(os.path.realpath(path))
    try:
        with _reporting(target):
            existing = target.read_bytes()
    except FileNotFoundError:
        existing = b""
    text = existing.decode("utf-8", NAME_ERRORS)
    added = [line for line in lines if line not in text]
    if not added:
        return []
    joiner = "" if not text or text.endswith("\n") else "\n"

    with atomic_write(target, "wb") as handle:  # with the file's permissions
        handle.write(existing + (joiner + "\n".join(added) + "\n").encode("utf-8", NAME_ERRORS))
    return added


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path` for writers that want a file name (torch.save,
    savefig); it is renamed into place when the block succeeds, made durable as
    `atomic_write`'s file is."""
    target = Path(path)
    if is_special_file(target):
        # A FIFO, a device or this process's stdout (`>> log.txt` too) is never handed to the
        # writer: writers that want a name seek (PIL, torch's zip), write a file beside it and
        # rename it over the name (safetensors), or read it back (export's verification). The
        # finished temporary file is written into it, in order, once the block succeeds.
        own = own_descriptor_written_through(target)
        with _reporting(target), _staging_folder(target) as folder:
            written = folder / f"output{target.suffix}"
            try:
                yield written
            except Exception as error:
                staging = _staging_error(target, written, error)
                if staging is None:
                    raise
                raise staging from error
            opened = target if own is None else os.dup(own)  # `>>`: where the descriptor stands
            with open(written, "rb") as source, open(opened, "wb") as sink:
                shutil.copyfileobj(source, sink, 2**20)
        return
    check_claimed(target, writing=True)
    with folders_made_above(target):
        with _reporting(target):
            fd, temporary = open_temporary(target, *temporary_affixes(target.stem, target.suffix))
        tmp_name = temporary.name
        os.close(fd)  # the writer opens the name (and Windows cannot rename a file that is open)
        with discarded_on_failure(temporary), _reporting(target):
            apply_umask(tmp_name)
            yield Path(tmp_name)
            apply_umask(tmp_name)  # again: a writer may have made the file anew (safetensors)
            synced_later = synced_when_kept(target)
            if not synced_later:
                fsync_file(tmp_name)
            rename_into_place(tmp_name, target, synced_later)


@contextlib.contextmanager
def _staging_folder(target: Path) -> Iterator[Path]:
    """A new folder in TMPDIR, where the file for the special file `target` is written first
    (removed at the end); one that cannot be made names TMPDIR, not the output."""
    try:
        staging = tempfile.TemporaryDirectory()
    except OSError as error:  # a full or read-only TMPDIR, or none that can be written
        place = os.path.dirname(error.filename) if error.filename else tempfile.gettempdir()
        raise _staged_write_error(target, error.strerror or str(error), place) from error
    with staging as folder:
        yield Path(folder)


def _staging_error(target: Path, staged: Path, error: BaseException) -> OutputWriteError | None:
    """The OutputWriteError that `error`, raised while the file for `target` was written at
    `staged` (in TMPDIR), means: a full or read-only TMPDIR is named as such, not as the
    output's disk, where the user would look. None: not a write error of the staged file."""
    cause = error.__cause__ if isinstance(error, OutputWriteError) else error
    cause = cause or error
    named = getattr(cause, "filename", None)
    if named is not None and not os.path.abspath(named).startswith(f"{staged.parent}{os.sep}"):
        return None  # another file's error (an input's)
    if as_write_error(cause, staged) is None:
        return None
    return _staged_write_error(target, write_failure_reason(staged, cause), staged.parent.parent)


def _staged_write_error(target: Path, reason: str, place: str | os.PathLike) -> OutputWriteError:
    return OutputWriteError(
        f"cannot write {target}: {reason} in {place}, where a file for a FIFO, device or "
        "standard output is written first",
        "free some space there, or set TMPDIR to a writable folder with room",
    )


def copy_bytes(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """The bytes of the finished file `source` written to `target` (a temporary path of
    `atomic_path`'s), in the kernel where it can (`copy_file_range`: no pass through Python,
    and a shared extent on file systems that clone): a second file of its own, so that
    rewriting one of them in place never changes the other."""
    in_kernel = getattr(os, "copy_file_range", None)  # Linux only
    with open(source, "rb") as reading, open(target, "wb") as writing:
        size = os.fstat(reading.fileno()).st_size
        copied = 0
        try:
            while in_kernel is not None and copied < size:
                step = in_kernel(reading.fileno(), writing.fileno(), size - copied)
                if step == 0:
                    break
                copied += step
        except OSError as error:  # a full disk is the write's error; any other, not here
            if error.errno == errno.ENOSPC:
                raise
        if copied != size:  # the kernel would not copy between these two: Python does
            reading.seek(0)
            writing.seek(0)
            writing.truncate()
            shutil.copyfileobj(reading, writing, 2**22)


def torch_save(obj: object, path: str | os.PathLike) -> None:
    """`torch.save(obj, path)` through a Python file, so that every failed write raises OSError
    with its errno: given a path, torch 2.4 (which pyproject allows) writes a small object to a
    full disk as an empty file and returns, and later versions raise C++ stream messages."""
    import torch

    with open(path, "wb") as handle:
        try:
            torch.save(obj, _WritesAfterAnError(handle))
        except RuntimeError as error:
            cause = _write_or_stop_behind(error)
            if cause is None:
                raise
            raise cause from None


def _write_or_stop_behind(error: BaseException) -> BaseException | None:
    """The OSError or KeyboardInterrupt (Ctrl-C, SIGTERM) that a RuntimeError of torch.save
    replaced, if any. torch's C++ writer does not advance its position on a write that
    raised, so its end of file, written as the exception unwinds, fails on that position
    ("unexpected pos ..."), and that error replaces the write's own: a full disk's, or the
    stop Python raises inside a write (where the file object checks for signals)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError | KeyboardInterrupt):
            return error
        error = error.__context__
    return None


class _WritesAfterAnError:
    """The file torch.save writes through, which drops the writes that come after one that
    failed, or after the file was closed: a writer whose end of file was never written writes
    it when it is destroyed, after `torch_save` closed the file, and an error there
    (`write to closed file`) aborts the process."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self._failed = False

    def write(self, data) -> int:
        if self._failed or self._handle.closed:
            return memoryview(data).nbytes
        try:
            return self._handle.write(data)
        except BaseException:
            self._failed = True
            raise

    def __getattr__(self, name: str):  # flush, seek: the file's own
        return getattr(self._handle, name)


def safetensors_save(
    tensors: dict, path: str | os.PathLike, metadata: dict[str, str] | None = None
) -> None:
    """`safetensors.torch.save_file(tensors, path)` into `atomic_path`'s temporary, a regular
    file: save_file writes a file beside its path and renames it over it, which would replace
    a FIFO, or /dev/stdout itself, with a regular file."""
    from safetensors.torch import save_file

    if is_special_file(path):  # a caller outside atomic_path
        raise ValueError(f"safetensors_save needs a regular file, not {path}")
    save_file(tensors, os.fspath(path), metadata=metadata)


def tree_entries(
    folder: str | os.PathLike,
    *,
    skip_hidden: bool = False,
    unlistable: list[tuple[str, OSError]] | None = None,
) -> Iterator[tuple[str, os.DirEntry]]:
    """(path, entry) of every entry under `folder`, recursively, that is not a folder: files,
    links (to files, to folders, to nothing), FIFOs. Paths are spelled as pathlib spells them
    (no leading "./"); symlinked folders are not entered and folders that cannot be listed are
    passed over, as `Path.rglob` does (`unlistable`: given, each such folder, `folder` itself
    included, is added to it with its error, one gone meanwhile aside); `skip_hidden` leaves
    out names starting with "." and everything in such folders. One `os.scandir` a folder,
    whose entries know their type: a fraction of the time of `rglob` and a `Path` for each
    entry."""
    pending = [str(Path(folder))]
    while pending:
        directory = pending.pop()
        prefix = "" if directory == "." else directory + os.sep
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    name = entry.name
                    if skip_hidden and name.startswith("."):
                        continue
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(prefix + name)
                            continue
                    except OSError:  # vanished while listing
                        continue
                    yield prefix + name, entry
        except (FileNotFoundError, NotADirectoryError):  # gone (or replaced) while listing
            continue
        except OSError as error:  # permission denied, an I/O error
            if unlistable is not None:
                unlistable.append((directory, error))
            continue


def folds_case(folder: str | os.PathLike) -> bool:
    """Does `folder` take names that differ only by case for one name (vfat/exFAT disks,
    macOS, Windows, a Samba share; a case-folding ext4 folder)? Probed: a temporary file is
    made in it and looked up by its other-case name (one entry: where the file system makes up
    inode numbers per name, as FUSE ones may, the folder lists no such other name)."""
    fd, path = tempfile.mkstemp(prefix=".torchkit-case-probe-", dir=folder)
    os.close(fd)
    try:
        head, name = os.path.split(path)
        try:
            other = os.lstat(os.path.join(head, name.swapcase()))
        except OSError:
            return False
        return os.path.samestat(os.lstat(path), other) or name.swapcase() not in os.listdir(head)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def case_twins(names: Sequence[str]) -> tuple[str, str] | None:
    """Two `/`-separated relative names, or folders on their way, that differ only by case
    (`train/Cat` and `train/cat`, `a.JPG` and `a.jpg`): one place where the file system ignores
    case. None where every name is distinct also there."""
    folders: set[str] = set()
    for folder in {name.rpartition("/")[0] for name in names}:
        while folder and folder not in folders:
            folders.add(folder)
            folder = folder.rpartition("/")[0]
    every = itertools.chain(sorted(folders), names)
    if len(set(map(str.casefold, every))) == len(folders) + len(names):  # the common case
        return None
    seen: dict[str, str] = {}
    for name in itertools.chain(sorted(folders), names):
        first = seen.setdefault(name.casefold(), name)
        if first != name:
            return first, name
    return None


def refuse_case_twins(
    names: Sequence[str], folder: Path, hint: str, *, shown: str | os.PathLike | None = None
) -> None:
    """An InputError, before any file is written, where two of the `names` (relative to
    `folder`, taken from data on a file system that tells case apart) differ only by case and
    `folder`'s file system ignores case: the second file would overwrite the first, or a folder
    take in another's files. `shown`: the folder the error names (`folder` by default, which
    the probe writes into)."""
    twins = case_twins(names)
    if twins is None or not folds_case(folder):
        return
    kind = "file" if twins[1] in set(names) else "folder"
    raise InputError(
        f"{twins[0]} and {twins[1]} would be one {kind} in {shown or folder}: its file system "
        "does not tell upper and lower case apart",
        hint,
    )
