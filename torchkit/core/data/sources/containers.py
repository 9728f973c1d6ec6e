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
import re
from collections.abc import Sequence
from typing import Any

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
