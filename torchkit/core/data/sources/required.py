"""Whether the data a command names is there, checked before its outputs without reading
anything: a missing or mistyped input is then said as such, not as an output that "already
exists". Above `source` and the shard readers (which import `source`)."""

from __future__ import annotations

import os
from pathlib import Path

from torchkit.core.data.sources.digits import DIGITS
from torchkit.core.data.sources.source import not_found


def names_no_path(spec: str) -> bool:
    """`digits`, a URL or a shard pattern: its reader says what is missing."""
    from torchkit.core.data.sources.http_shards import is_url  # the readers, when asked
    from torchkit.core.data.sources.shards import is_shard_pattern

    return spec == DIGITS or is_url(spec) or is_shard_pattern(spec)


def require_data(spec: str | os.PathLike) -> None:
    """`open_data`'s "dataset not found" for a `spec` that names a missing path."""
    text = os.fspath(spec)
    if not names_no_path(text) and not Path(text).exists():
        raise not_found(text)
