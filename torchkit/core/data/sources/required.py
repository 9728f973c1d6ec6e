"""Whether the data a command names is there, checked before its outputs without reading
anything: a missing or mistyped input is then said as such, not as an output that "already
exists". Above `source` and the shard readers (which import `source`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from torchkit.core.data.sources.digits import DIGITS
from torchkit.core.data.sources.source import not_found
from torchkit.core.io.errors import InputError
from torchkit.core.io.files import refuse_unreachable
from torchkit.core.io.redaction import list_parts
from torchkit.core.io.shell_words import shell_word

log = logging.getLogger("torchkit")


def names_no_path(spec: str) -> bool:
    """`digits`, a URL or a shard pattern: its reader says what is missing."""
    from torchkit.core.data.sources.http_shards import is_url  # the readers, when asked
    from torchkit.core.data.sources.shards import is_shard_pattern

    return spec == DIGITS or is_url(spec) or is_shard_pattern(spec)


def require_data(spec: str | os.PathLike) -> None:
    """`open_data`'s "dataset not found" for a `spec` that names a missing path."""
    text = os.fspath(spec)
    if names_no_path(text):
        return
    refuse_unreachable(text)
    if not Path(text).exists():
        raise not_found(text)


def recorded_data_from_here(spec: str, record: dict | None, resumed_from: os.PathLike) -> str:
    """The --data a resumed run reads, `spec` as its checkpoint records it (`record`: the
    checkpoint's `data` entry): as given, so a path of it that is relative was read from the
    working directory the run trained in (`record["workdir"]`). Resumed from another one (a
    requeued job), it is read there where it still is: the data the run trained on, not what
    the same relative path names here (another folder, or nothing: "dataset not found" with
    the data grammar's hint), with a note naming that folder (a copied run folder's record
    may name other data on this machine), a warning where the path names other data here.
    Else from here, where it exists; else the error
    names where the data was when the run trained."""
    if not reads_relative_paths(spec):
        return spec
    record = record if isinstance(record, dict) else {}
    then = recorded_workdir(record)
    moved = bool(then) and not same_place(then, ".")
    there = _from(spec, then) if then else ""
    if moved and _exists(there):
        here = _exists(spec)
        if not here:  # a requeued job's usual case: said, as the data is read elsewhere
            _note_read_in(then, spec, resumed_from)
        elif not all(map(same_place, _paths(spec), _paths(there))):
            # Two data of that name: a warning, which --quiet keeps (a job script's).
            log.warning(
                "--data %s, which %s records, is read in %s, where the run trained, not here "
                "(give --data %s to train on the data here)",
                *(spec, resumed_from, then, shell_word(spec)),
            )
        return there
    if _in_part(spec):
        return spec  # here, or in part: its reader names what is missing
    if moved and _in_part(there):  # a shard gone: its reader names it, not "not found"
        _note_read_in(then, spec, resumed_from)
        return there
    # Where the run trained is known (`workdir`): the data is no longer there either.
    root = record.get("root")
    trained_at = there or (root if isinstance(root, str) else "")
    where = f", at {trained_at} when it trained" if trained_at else ""
    raise InputError(
        f"dataset not found: {spec}, the --data that {resumed_from} records{where}",
        "give --data again where the data is now"
        if then
        else "resume from the folder the run started in, or give --data again as a path from here",
    )


def reads_relative_paths(spec: str) -> bool:
    """Whether --data `spec` names a local path relative to the working directory (a part of
    a `::` list or pattern too): what the working directory is recorded for."""
    return spec != DIGITS and any(_relative_path(part) for part in list_parts(spec))


def recorded_workdir(record: dict) -> str:
    """The absolute working directory a checkpoint's `data` entry records; "" where it records
    none (written before it was, or --data held no relative path) or something else (a
    checkpoint made by hand)."""
    return absolute_folder(record.get("workdir"))


def absolute_folder(value: object) -> str:
    """`value` where it is an absolute path; "" for anything else a checkpoint may hold (made
    by hand: a number, which os.stat reads as a file descriptor, a list, a NUL)."""
    if not isinstance(value, str) or "\0" in value:  # no path: os.stat raises ValueError
        return ""
    return value if os.path.isabs(value) else ""


def _relative_path(part: str) -> bool:
    from torchkit.core.data.sources.http_shards import is_url  # the readers, when asked

    return not is_url(part) and not os.path.isabs(os.path.expanduser(part))


def _from(spec: str, folder: str) -> str:
    """`spec` with each relative path of it read from `folder`."""
    return "::".join(
        os.path.join(folder, part) if _relative_path(part) else part for part in list_parts(spec)
    )


def _paths(spec: str) -> list[str]:
    """The local files and folders `spec` names (a `::` list's and brace pattern's each)."""
    from torchkit.core.data.sources.http_shards import is_url
    from torchkit.core.data.sources.shards import expand_braces

    if os.path.exists(spec):
        return [spec]
    parts = [part for part in list_parts(spec) if not is_url(part)]
    return [name for part in parts for name in expand_braces(part)]


def _exists(spec: str) -> bool:
    return all(os.path.exists(path) for path in _paths(spec))


def _note_read_in(folder: str, spec: str, resumed_from: os.PathLike) -> None:
    log.warning(
        "--data %s, which %s records, is read in %s, where the run trained, not here",
        *(spec, resumed_from, folder),
        extra={"note": True},
    )


def _in_part(spec: str) -> bool:
    return any(os.path.exists(path) for path in _paths(spec))


def same_place(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # ValueError: a NUL in a recorded path
        return False
