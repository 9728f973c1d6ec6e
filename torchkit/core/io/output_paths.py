"""The names torchkit gives beside an output (its lock, the set-aside of an old output, a
folder being made) and the path helpers every output check shares: real paths, "inside",
identities, the removal of a tree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from pathlib import Path

from torchkit.core.io.temporaries import fitting

MARKER = ".torchkit"
LOCK_SUFFIX = ".torchkit-lock"
WRITTEN_JOURNAL = ".torchkit-written"  # the names a run that set an old output aside writes
PARTIAL_SUFFIX = ".partial"
REPLACED_SUFFIX = ".replaced"
DISCARDED_SUFFIX = ".discarded"


def real_path(path: str | os.PathLike) -> Path:
    """The path with `..` and symlinks resolved (as far as it exists). A `~` is left as it is:
    the shell expands it, and a quoted `'~/x'` is written as a folder named `~`, so it is
    checked as one (expanded, an output inside an input `./~/x` passed as outside it)."""
    return Path(os.path.realpath(os.fspath(path)))


def is_within(inner: Path, outer: Path) -> bool:
    if inner == outer:
        return True
    if os.name != "posix":  # names compare without case there: Path's own comparison
        return outer in inner.parents
    # `outer in inner.parents` made a Path of each folder above `inner`: with an input folder
    # per image (`ID/image.png`), most of an overlap check of a million of them. Both are
    # normalised, so their text compares (`.parts` would be kept on each input's Path).
    return str(inner).startswith(str(outer).rstrip("/") + "/")


def shown(path: str | os.PathLike) -> str:
    return os.fspath(path)


FileId = tuple[int, int]  # (st_dev, st_ino): one file or folder, whatever path names it


def sibling_base(folder: Path) -> str:
    """The name of `folder` in the names of the files beside it that its writer makes: its lock
    (`.NAME.torchkit-lock`) and `.NAME.<12 hex>.partial`, `.replaced`, `.discarded`; cut
    (`fitting`) where those would not fit in a file name (a NAME of 232 bytes or more)."""
    return fitting(folder.name, len(".") + len(".") + 12 + len(DISCARDED_SUFFIX))


def sibling(folder: Path, suffix: str) -> Path:
    return folder.parent / f".{sibling_base(folder)}.{uuid.uuid4().hex[:12]}{suffix}"


def leftovers(folder: Path, suffix: str) -> list[Path]:
    prefix = f".{sibling_base(folder)}."
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
