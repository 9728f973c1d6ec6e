"""The record a `split --mode move` keeps beside the data it empties, and what readers make of
it: a ROOT half moved into OUT holds part of its images, read as data it would pass for whole;
and the lock readers hold so that no move empties what they read while they read it."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from torchkit.core.data.sources.splitting import split_journal
from torchkit.core.io.errors import InputError
from torchkit.core.io.files import refuse_unreachable
from torchkit.core.io.folder_locks import flock_path, held_exclusively, hold, is_held
from torchkit.core.io.records import open_record
from torchkit.core.io.shell_words import shell_line

# Beside the data a move empties (in ROOT, hidden: no reader takes it for data; beside a CSV
# index), while the move runs: the OUT it moves into.
MOVING = ".torchkit-split-moving.json"


def moving_record(root: Path) -> Path:
    """Where a move out of `root` (a folder or a CSV index) records its OUT."""
    return root / MOVING if root.is_dir() else root.with_name(f".{root.name}{MOVING}")


def _moving_note(root: Path) -> tuple[Path, str] | None:
    """(OUT, the ROOT moved) of the record of a move out of `root`: `root` itself, or the CSV
    index whose files lie in the folder `root` (its record there names the index), or None."""
    try:
        place = moving_record(root)
        if _strangers_record(place):
            return None
        with open_record(place) as handle:  # a FIFO planted there is no record
            record = json.load(handle)
        out = Path(record["out"])
        moved = record.get("root") or os.path.realpath(root)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return (out, moved) if isinstance(moved, str) else None


def _strangers_record(place: Path) -> bool:
    """Whether the record at `place` lies in a folder everyone may write (/tmp) and belongs to
    another user: anyone could have left it there, and believed, it refused this user's data
    under that folder, naming a move of theirs to finish. (A move's own records are written by
    the user who runs it, and read as theirs in such a folder too.)"""
    if not hasattr(os, "geteuid"):
        return False
    status = os.stat(place)  # OSError where there is none: no record
    if status.st_uid == os.geteuid():
        return False
    return bool(os.stat(place.parent).st_mode & stat.S_IWOTH)


def half_moved_into(root: Path) -> Path | None:
    """The OUT of a move out of `root` (or out of a CSV index listing files in the folder
    `root`) that has begun and not finished (its journal still says the move runs: stopped
    half-way, or running now), or None (no record, or one whose move was finished or whose OUT
    is gone)."""
    note = _moving_note(root)
    if note is None:
        return None
    out, moved = note
    journal = split_journal(out)
    moving = journal is not None and journal.get("state") == "moving"
    return out if moving and journal.get("root") == moved else None


def _moved_root(root: str | os.PathLike) -> str | os.PathLike:
    """What the move out of `root` moves: `root`, or the CSV index that lists files in it."""
    note = _moving_note(Path(root))
    if note is None or note[1] == os.path.realpath(root):
        return root
    return note[1]


def stopped_move_error(root: str | os.PathLike, out: Path) -> InputError:
    moved = _moved_root(root)
    of = "" if moved is root else f" of {moved}, which lists files in it,"
    return InputError(
        f"{root} is half moved into {out}: a split --mode move{of} into it stopped",
        "finish that move first: "
        + shell_line(["torchkit", "split", Path(moved), Path(out), "--mode", "move"]),
    )


def lock_for_reading(path: Path) -> None:
    """Hold `path` (data to read: a folder, or a CSV index) against `split --mode move` until
    the command ends (`core.io.folder_locks`), and refuse it where a move has half emptied it,
    or empties it now.

    The lock is a shared flock on `path` and on every folder above it (a move out of any of
    them empties it too); a move takes an exclusive one on what it empties (`moving_out_of` in
    `core.split.files`), so neither starts while the other runs. An InputError where a move
    holds one of them (it says into which OUT, where the move has recorded it), or where the
    record of a move out of one of them says that move stopped half-way (with the command that
    finishes it). A process that moves `path` itself (`moving_here`) takes no lock: its move's
    exclusive one would refuse it. `refuse_unreachable`'s error where `path` cannot be looked
    at."""
    refuse_unreachable(path)
    _hold_and_look(path, locking=os.path.realpath(path) not in _moving_here)


def lock_listed_for_reading(index: Path, paths: Sequence[str]) -> None:
    """`lock_for_reading` for the folders of the images `paths` the CSV index `index` lists
    (`source_folders`), where a move out of them would empty what it reads. (A move out of
    the index itself, `moving_here`, holds them exclusively: it takes them, and is refused
    there where another move holds them.)"""
    if os.path.realpath(index) in _moving_here:
        return
    for folder in source_folders(paths, index):
        _hold_and_look(Path(folder), locking=True)


def lock_subfolders_for_reading(root: Path, names: Sequence[str]) -> None:
    """`lock_for_reading` for the folders `names` of the folder `root` (its class or split
    folders), where a move out of one (`split ROOT/cat OUT --mode move`) would empty part of
    what is read; none where they are more than a command holds open (`_MOST_LOCKS`)."""
    if len(names) > _MOST_LOCKS or os.path.realpath(root) in _moving_here:
        return
    for name in names:
        _hold_and_look(root / name, locking=True)


def _hold_and_look(path: Path, *, locking: bool) -> None:
    """`lock_for_reading`'s work: the locks (where `locking`), then the records."""
    real = os.path.realpath(path)
    places = [real]
    while os.path.dirname(places[-1]) != places[-1]:
        places.append(os.path.dirname(places[-1]))
    for place in places if locking else ():
        if is_held(place):
            continue
        try:
            fd = flock_path(place, exclusive=False)
        except BlockingIOError:
            raise _being_moved_error(path, place, real) from None
        if fd is not None:
            hold(place, fd)
    for place in places:
        record = moving_record(path) if place == real else os.path.join(place, MOVING)
        if not os.path.exists(record):  # the common case: one stat
            continue
        at = path if place == real else Path(place)
        out = half_moved_into(at)
        if out is not None and place == real:
            raise stopped_move_error(path, out)
        if out is not None:
            moved = _moved_root(place)
            of = "" if moved is place else f" of {moved}, which lists files in it,"
            raise InputError(
                f"{path} lies in {place}, which is half moved into {out}: a split --mode move"
                f"{of} into it stopped",
                "finish that move first: "
                + shell_line(["torchkit", "split", Path(moved), Path(out), "--mode", "move"]),
            )


def refuse_moved_inside(folder: str) -> None:
    """A reader listing data met the record of a move out of `folder`, in it: an InputError
    where that move has not finished (it stopped, or runs now), whose files are part in
    `folder`, part in its OUT. (A move that starts later, out of a folder inside the data read,
    is not refused: the readers' locks are on the data and the folders above it.)"""
    out = half_moved_into(Path(folder))
    if out is None:
        return
    if held_exclusively(folder):
        raise InputError(
            f"{folder} is being moved into {out} by a torchkit split --mode move running now",
            "wait for it to finish",
        )
    raise stopped_move_error(folder, out)


def _being_moved_error(path: Path, place: str, real: str) -> InputError:
    """The error for reading `path` while a split holds `place` (`path`'s real path `real`, or
    a folder above it) exclusively: moving files out of it, or (as its OUT) into it."""
    what = f"{path} is" if place == real else f"{path} lies in {place}, which is"
    out = half_moved_into(path if place == real else Path(place))
    if out is None:  # a move still planning, or a split writing into `place`
        return InputError(
            f"{what} being emptied or written by a torchkit split running now",
            "wait for it to finish",
        )
    return InputError(
        f"{what} being moved into {out} by a torchkit split --mode move running now",
        f"wait for it to finish, then read {out}",
    )


_MOST_LOCKS = 64  # a descriptor is held for each folder locked


def source_folders(
    sources: Sequence[str], taken: str | os.PathLike, *, to_note: bool = False
) -> list[str]:
    """The folders of the files `sources` a CSV index (`taken`, locked already) lists, to lock:
    those a move out of it empties (`moving_out_of` in `core.split.files`), those its readers
    read. The outermost ones, less those that hold the index (the lock on it holds them, shared,
    already); their parents instead where they are too many to hold open. `to_note`: the
    folders a move notes itself in (`note_moving` in `core.split.output`), with those that
    hold the index (files in 100 folders beside it: the index's folder), not locked."""
    index = os.path.realpath(taken)
    # (realpath once a folder: a reader's index may list a million files in a few folders)
    folders = {os.path.realpath(folder) for folder in {os.path.dirname(p) for p in sources}}
    while True:
        tops = _outermost(folders, "" if to_note else index)
        parents = {os.path.dirname(folder) for folder in tops}
        if len(tops) <= _MOST_LOCKS or parents == set(tops):
            return tops
        folders = parents


def _outermost(folders: set[str], index: str) -> list[str]:
    """`folders` less those inside another of them, and those holding `index`."""
    tops: dict[str, None] = {}  # a set, in order
    for folder in sorted(folders):
        outer, inside = folder, False
        while os.path.dirname(outer) != outer and not inside:
            outer = os.path.dirname(outer)
            inside = outer in tops  # sorted: a folder comes after those holding it
        if not inside and not (index and index.startswith(folder.rstrip(os.sep) + os.sep)):
            tops[folder] = None
    return list(tops)


_moving_here: set[str] = set()  # the real paths this process moves files out of


@contextlib.contextmanager
def moving_here(root: str | os.PathLike) -> Iterator[None]:
    """This process moves files out of `root` inside: its reading of `root` takes no lock."""
    real = os.path.realpath(root)
    _moving_here.add(real)
    try:
        yield
    finally:
        _moving_here.discard(real)
