"""The record a `split --mode move` keeps beside the data it empties, and what readers make of
it: a ROOT half moved into OUT holds part of its images, read as data it would pass for whole."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from torchkit.core.data.sources.splitting import split_journal
from torchkit.core.io.errors import InputError

# Beside the data a move empties (in ROOT, hidden: no reader takes it for data; beside a CSV
# index), while the move runs: the OUT it moves into.
MOVING = ".torchkit-split-moving.json"


def moving_record(root: Path) -> Path:
    """Where a move out of `root` (a folder or a CSV index) records its OUT."""
    return root / MOVING if root.is_dir() else root.with_name(f".{root.name}{MOVING}")


def half_moved_into(root: Path) -> Path | None:
    """The OUT of a move out of `root` that has begun and not finished (its journal still says
    the move runs: stopped half-way, or running now), or None (no record, or one whose move was
    finished or whose OUT is gone)."""
    try:
        record = json.loads(moving_record(root).read_text(encoding="utf-8"))
        out = Path(record["out"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    journal = split_journal(out)
    moving = journal is not None and journal.get("state") == "moving"
    return out if moving and journal.get("root") == os.path.realpath(root) else None


def stopped_move_error(root: str | os.PathLike, out: Path) -> InputError:
    return InputError(
        f"{root} is half moved into {out}: a split --mode move into it stopped",
        f"finish that move first: torchkit split {root} {out} --mode move",
    )


def refuse_half_moved(root: Path) -> None:
    """Data to read that a move has half emptied: an InputError that says how to finish the
    move, or, where the move holds `root`'s lock (`core.split.files.moving_out_of`), that it is
    being moved now. The shared lock taken here keeps a move from starting while it looks."""
    if not moving_record(root).exists():  # the common case: one stat
        return
    with _shared_lock(root) as free:
        out = half_moved_into(root)
    if out is None:
        return
    if not free:
        raise InputError(
            f"{root} is being moved into {out} by a torchkit split --mode move running now",
            f"wait for it to finish, then read {out}",
        )
    raise stopped_move_error(root, out)


@contextlib.contextmanager
def _shared_lock(path: Path):
    """A non-blocking shared flock on `path`, held inside: whether it was free (True where
    there is no flock to ask)."""
    try:
        import fcntl
    except ImportError:
        yield True
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            free = True
        except BlockingIOError:
            free = False
        except OSError:  # a file system without flock
            free = True
        yield free
    finally:
        os.close(fd)
