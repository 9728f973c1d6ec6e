"""convert shards' `manifest.partial.json` lists every shard written so far (and each of its
samples' extension and class): it was rewritten whole after a shard, as often as every 2 s or
ten times as long as its last rewrite took, so a run of shards that take seconds each (1 GB
shards) rewrote the growing list after every one of them, bytes written growing with the square
of the data, while a shard complete in the last seconds was not listed at all. Each shard is now
one line appended to it, on disk before the next shard begins."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

from image_folders import write_image_folder

from torchkit.core.convert import shards

SHARD_SECONDS = 5.0  # a 1 GB shard, read and written


def partial_bytes_written(tmp_path: Path, images: int, monkeypatch) -> int:
    """Bytes written into OUT's partial manifest by `convert shards --per-shard 1` of `images`
    images whose shards take SHARD_SECONDS each on the module's clock, seen from outside the
    writer after every sample: a new file (another inode) counts whole, the same file its
    growth."""
    source = write_image_folder(tmp_path / f"images-{images}", {"a": images - images // 2})
    write_image_folder(source, {"b": images // 2}, seed=1)
    out = tmp_path / f"out-{images}"
    pretend = [0.0]
    clock = SimpleNamespace(
        monotonic=lambda: time.monotonic() + pretend[0], perf_counter=time.perf_counter
    )
    monkeypatch.setattr(shards, "time", clock)
    close = shards._ShardFile.close

    def slow_close(self: shards._ShardFile) -> tuple[int, str]:
        done = close(self)
        pretend[0] += SHARD_SECONDS
        return done

    monkeypatch.setattr(shards._ShardFile, "close", slow_close)
    seen = {"inode": None, "size": 0, "bytes": 0}

    def look(done: int, total: int) -> None:
        try:
            status = os.stat(out / shards.PARTIAL_MANIFEST)
        except FileNotFoundError:
            return
        grown = status.st_size - (seen["size"] if status.st_ino == seen["inode"] else 0)
        seen["bytes"] += max(0, grown)
        seen["inode"], seen["size"] = status.st_ino, status.st_size

    options = shards.shard_options(per_shard=1)
    report = shards.convert_shards(source, out, options=options, workers=0, progress=look)
    assert len(report.shards) == images
    return seen["bytes"]


def test_the_partial_manifest_grows_linearly_with_the_shards(tmp_path, monkeypatch):
    few, many = (partial_bytes_written(tmp_path, n, monkeypatch) for n in (8, 32))
    # 4x the shards: 4x the records (and one header line). Rewritten whole after each shard,
    # it was 15x.
    assert many < 4.5 * few, (few, many)


def test_each_shard_is_listed_before_the_next_begins(tmp_path):
    source = write_image_folder(tmp_path / "images", {"a": 3, "b": 3})
    out = tmp_path / "out"
    unlisted = []

    def look(done: int, total: int) -> None:
        # Shards complete now: every .tar in OUT (each renamed into place whole).
        written = sorted(path.name for path in out.glob("*.tar"))
        partial = shards.read_partial(out)
        listed = sorted(entry["name"] for entry in partial["shards"]) if partial else []
        unlisted.append(sorted(set(written) - set(listed)))

    options = shards.shard_options(per_shard=1)
    shards.convert_shards(source, out, options=options, workers=0, progress=look)
    assert len(unlisted) == 7 and not any(unlisted), unlisted  # a rewrite every 2 s listed 1


def test_a_torn_last_line_lists_nothing_and_a_later_line_replaces_a_shard(tmp_path):
    (tmp_path / shards.MARKER).write_text("{}")
    header = {"written_by": "torchkit convert shards", "format_version": shards.FORMAT_VERSION}
    first = {"name": "shard-000000.tar", "start": 0, "end": 2, "unreadable": []}
    second = {"name": "shard-000001.tar", "start": 2, "end": 4, "unreadable": []}
    grown = {**second, "end": 5, "unreadable": [{"position": 4, "path": "x.png", "reason": "?"}]}
    lines = [json.dumps(value) for value in (header, first, second, grown)]
    torn = json.dumps({"name": "shard-000002.tar", "start": 5, "end": 7})[:-9]
    (tmp_path / shards.PARTIAL_MANIFEST).write_text("\n".join([*lines, torn]))
    partial = shards.read_partial(tmp_path)
    assert partial["shards"] == [first, grown]
    assert partial["format_version"] == shards.FORMAT_VERSION
