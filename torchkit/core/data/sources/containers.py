"""Data stored in container files rather than as image files: which reader opens a `--data`
spec that names some (tar shards, a .tar of an image folder, parquet files).

Each reader module has `open_stored(spec, classes, allow_unlabelled, every_image=False) ->
DataSource | None` (`every_image`: as `source.open_data`'s, for folder layouts in archives):
None when `spec` is not its kind (decided from the name and a listing, never by reading the
data), else the data with `StoredImage` paths (`core.stored_image`). Readers are imported only
when `open_data` asks, so that `digits` and `--help` never import them.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchkit.core.io.errors import InputError
from torchkit.core.io.shell_words import shell_word
from torchkit.core.io.wording import counted

# The reader modules, asked in this order.
READERS: tuple[str, ...] = (
    "torchkit.core.data.sources.http_shards",  # before shards: a URL pattern names no local file
    "torchkit.core.data.sources.shards",
    "torchkit.core.data.sources.parquet",
)


def open_container_data(
    spec: str, classes: Sequence[str] | None, allow_unlabelled: bool, every_image: bool = False
) -> Any:
    """The `DataSource` `spec` names if a container reader recognises it, else None (the
    readers import `source`, which asks here: no import back). Its own class names are held
    to what a report can show, as `open_data` holds every source's (predict asks here
    first)."""
    from torchkit.core.io.files import refuse_unreachable

    refuse_unreachable(spec)  # an error naming it, before any reader looks at it
    for name in READERS:
        reader = importlib.import_module(name)
        opened = reader.open_stored(
            spec, classes, allow_unlabelled, every_image and allow_unlabelled
        )
        if opened is not None:
            if classes is None:
                from torchkit.core.data.sources.samples import refuse_unshowable_classes

                refuse_unshowable_classes(opened.classes, opened.spec)
            return opened
    return None


_NUMBERED_SHARD = re.compile(r"^(.+)-(\d+)\.tar$", re.IGNORECASE)


def numbered_shard_parts(name: str) -> tuple[str, str] | None:
    """(NAME, its digits) of a shard's file name, `NAME-NNNNNN.tar`, as webdataset and
    `convert shards` number them; None for any other name."""
    found = _NUMBERED_SHARD.match(name)
    return None if found is None else (found.group(1), found.group(2))


def is_numbered_shard_name(name: str) -> bool:
    """Whether a `.tar` file's name is a shard's (a `.tar` so named alone is read as one)."""
    return numbered_shard_parts(name) is not None


# A list of shards one a line read this far (`refuse_a_shard_list`): a list is a few KiB.
_SHARD_LIST_BYTES = 1 << 20


def refuse_a_shard_list(path: Path) -> None:
    """An InputError for the text file `path` where it lists `.tar` shards, one a line (what
    some tools write beside shards): it was "neither a folder nor a CSV index", which named no
    way to read them. The hint joins its first two as `--data` reads them, as the lines would
    be found from here."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_SHARD_LIST_BYTES + 1)
    except OSError:
        return
    if len(data) > _SHARD_LIST_BYTES or b"\0" in data:
        return
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines or not all(line.lower().endswith(".tar") for line in lines):
        return
    shown = [_found_from_here(line, path.parent) for line in lines[:2]]
    # One shell word, pasted as it is: `my data/s-000000.tar::...` unquoted was two.
    example = shell_word("::".join(shown))
    raise InputError(
        f"{path} lists {counted(len(lines), 'shard')}, one a line, which torchkit does not "
        "read as a list",
        f"join them with ::, as --data {example}, or name them with a pattern, "
        "DIR/NAME-{000000..000009}.tar",
    )


def _found_from_here(line: str, folder: Path) -> str:
    """A shard list's `line` as a path from here: as written where that is a URL, absolute, or
    names a file from here; else from the list's `folder`."""
    if "://" in line or os.path.isabs(line) or os.path.exists(line):
        return line
    return str(folder / line)
