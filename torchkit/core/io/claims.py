"""The folders being written: a write into an output folder that was removed or replaced while
the command ran stops the command (`check_claimed`) instead of making a new, incomplete folder;
a write error inside a block is told as one (`reporting_write_errors`) or as a full disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from torchkit.core.io.errors import (
    OutputWriteError,
    TorchkitError,
    first_and_more,
)
from torchkit.core.io.non_utf8_names import json_text
from torchkit.core.io.output_paths import FileId, remove_tree, shown
from torchkit.core.io.write_errors import as_write_error

log = logging.getLogger("torchkit")


class OutputFolderReplacedError(TorchkitError):
    """An output folder removed, renamed away or replaced while a command wrote into it."""


@dataclass(frozen=True)
class Claim:
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
            f"{self.what} {shown(self.shown)} was removed or replaced while {self.command} was "
            f"writing into it: {change}",
            self.hint or "nothing more was written there; run the command again",
        )


def lstat_id(path: Path) -> FileId | None:
    """The identity of what is at `path` itself (a link is not followed); None: nothing."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


def what_is_at(path: Path) -> str:
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
CLAIMED: dict[str, Claim] = {}


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
    CLAIMED[os.path.abspath(folder)] = Claim(
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
    claim = CLAIMED.get(os.path.abspath(folder))
    return set() if claim is None or claim.written is None else set(claim.written)


def synced_when_kept(target: str | os.PathLike) -> bool:
    """Whether `target` is written into the hidden folder of an atomic output, which is made
    durable as a whole before it is swapped into place: its files need no fsync each."""
    if not CLAIMED:
        return False
    text = os.path.abspath(os.fspath(target))
    return any(
        claim.synced_when_kept and text.startswith(prefix.rstrip(os.sep) + os.sep)
        for prefix, claim in list(CLAIMED.items())
    )


def claimed_change(folder: str | os.PathLike) -> str | None:
    """How the claimed output `folder` changed since it was claimed (None: it did not, or it
    is not claimed): what stands there now is not the command's to delete."""
    claim = CLAIMED.get(os.path.abspath(folder))
    return None if claim is None else claim.change()


def check_claimed(target: str | os.PathLike, *, writing: bool = False) -> None:
    """Before writing `target`: each claimed output folder that holds it is still the folder
    the command made (one stat), else OutputFolderReplacedError. `writing`: `target` is about
    to be written, and recorded as the command's own where its folder records that."""
    if not CLAIMED:
        return
    text = os.path.abspath(os.fspath(target))
    for prefix, claim in list(CLAIMED.items()):
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
    listed = first_and_more(names, 3)
    return f"{what} {shown(folder)} was kept: it holds files {run} did not write ({listed})"


def tell_note(note: str, error: BaseException | None) -> None:
    """Add `note` to the error line of the failure that is ending the command (a TorchkitError),
    or log it as a warning (an interrupt, an unexpected error)."""
    if isinstance(error, TorchkitError):
        error.message = f"{error.message}; {note}"
        error.args = (error.message,)
    else:
        log.warning(note)
