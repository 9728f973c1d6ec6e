"""A shard downloaded into the cache has a record beside it (`.NAME.tar.json`), read only
where it is a regular file."""

from __future__ import annotations

from pathlib import Path

from disks import fifo_never_opened


def test_a_fifo_as_a_cached_shards_record_is_no_record(tmp_path: Path):
    """The record beside a shard downloaded into the cache (`.NAME.tar.json`): a FIFO there
    waited for ever in every command reading that URL's shards."""
    from torchkit.core.data.sources import http_shards

    target = tmp_path / "a.tar"
    target.write_bytes(b"x" * 10)
    expected = {"bytes": 10, "sha256": None}
    with fifo_never_opened(tmp_path / ".a.tar.json", seconds=2):
        assert http_shards._is_current("http://host/a.tar", target, expected, None)
