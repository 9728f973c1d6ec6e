"""A side file of shards on a web server (classes.txt, manifest.json) is read into memory whole:
a server that sends more than any side file holds (an endless body, or a small gzip of gigabytes
of zeros, decoded as `curl --compressed` does) took all of the memory; now it is one error line
naming the URL once it passes the bound, and nothing of it is cached."""

from __future__ import annotations

from pathlib import Path

import pytest
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process
from shards import serving, write_shards

from torchkit.core.data.sources import http_shards


@pytest.fixture
def served(tmp_path: Path) -> Path:
    """served/shards: 2 ShardWriter shards and a classes.txt of 4 MiB (zeros gzip it to 4 kB)."""
    images = write_image_folder(tmp_path / "images", {"a": 2, "b": 2})
    shards = tmp_path / "served" / "shards"
    shards.mkdir(parents=True)
    write_shards(str(shards / "shard-%06d.tar"), images, maxcount=2)
    (shards / "classes.txt").write_bytes(b"a\nb\n" + bytes(4 << 20))
    return tmp_path / "served"


def test_a_side_file_larger_than_the_bound_is_one_error_and_not_cached(
    served, tmp_path, monkeypatch
):
    monkeypatch.setattr(http_shards, "_SIDE_FILE_BYTES", 1 << 20, raising=False)
    with serving(served, tmp_path / "cache", monkeypatch) as server:
        url = f"{server.url}/gzip/shards/shard-{{000000..000001}}.tar"
        result = run_torchkit_in_process("dataset-stats", url, "--workers", "0")
    assert result.returncode != 0
    line = error_line(result.stderr)
    assert line.startswith("Error: cannot download ")
    assert "/gzip/shards/classes.txt: it holds more than 1 MiB" in line
    assert "Traceback" not in result.stderr
    cached = [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert "classes.txt" not in cached
