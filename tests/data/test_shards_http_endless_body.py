"""A shard served with no Content-Length (a close-delimited body) that runs on past the size
manifest.json gives it was downloaded to its end, into the cache's disk, and judged only then:
one that never ends filled the disk. It is stopped as it passes that size; without a size from
manifest.json, as it passes $TORCHKIT_CACHE_LIMIT, else the room the cache's disk has. A body
whose size (its Content-Length, manifest.json's) is larger than that room is refused before a
byte of it is written: it was downloaded until the disk was full, or past the limit."""

from __future__ import annotations

import functools
import io
import json
import re
import tarfile
import threading
from pathlib import Path

import pytest
from output_checks import error_line
from parquet_files import png
from processes import run_torchkit_in_process
from shards import QuietFolderHandler, running_server

CHUNK = 1 << 16
ENDLESS = 64 << 20  # the zeros sent after the shard, if the client reads on


class _EndlessShards(QuietFolderHandler):
    """Serves its folder; a `.tar` whole, with no Content-Length (with `declared`: one of the
    shard and the zeros), and then ENDLESS bytes of zeros (`sent`: how many of them went out),
    `finished` set once it stops."""

    def __init__(
        self, *args, sent: list[int], finished: threading.Event, declared: bool, **kwargs
    ) -> None:
        self.sent, self.finished, self.declared = sent, finished, declared
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        if not self.path.endswith(".tar"):
            super().do_GET()
            return
        data = Path(self.translate_path(self.path)).read_bytes()
        self.send_response(200)  # HTTP/1.0, no Content-Length: the body ends with the connection
        if self.declared:
            self.send_header("Content-Length", str(len(data) + ENDLESS))
        self.end_headers()
        try:
            self.wfile.write(data)
            for _ in range(ENDLESS // CHUNK):
                self.wfile.write(bytes(CHUNK))
                self.sent[0] += CHUNK
        except OSError:  # the client hung up
            pass
        finally:
            self.close_connection = True
            self.finished.set()


def _served_shard(tmp_path: Path, manifest: bool, endless: bool = False) -> tuple[Path, Path]:
    """(the served folder, its one shard), with a manifest.json giving the shard's size (with
    `endless`: that of the shard and the zeros sent after it) or none."""
    served = tmp_path / "served"
    served.mkdir()
    shard = served / "s-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for member, data in (("k0.png", png(0)), ("k0.cls", b"0")):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    if manifest:
        entry = {"name": shard.name, "bytes": shard.stat().st_size + (ENDLESS if endless else 0)}
        (served / "manifest.json").write_text(json.dumps({"shards": [entry]}))
    return served, shard


def _stats_of_endless_shard(
    served: Path, shard: Path, cache: Path, monkeypatch, declared: bool = False
):
    """dataset-stats of the shard's URL, served endless (with `declared`: with a Content-Length
    of the shard and ENDLESS zeros), cached in `cache`: (its URL, the result, the bytes of
    zeros sent after the shard)."""
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("TORCHKIT_CACHE", str(cache))
    sent, finished = [0], threading.Event()
    handler = functools.partial(
        _EndlessShards, sent=sent, finished=finished, declared=declared, directory=str(served)
    )
    with running_server(handler) as server:
        url = f"{server.url}/{shard.name}"
        result = run_torchkit_in_process("dataset-stats", url, "--workers", "0")
        assert finished.wait(10)
    return url, result, sent[0]


def _assert_nothing_cached(cache: Path, shard: Path) -> None:
    cached = [p.name for p in cache.rglob("*") if p.is_file()]
    assert not [name for name in cached if name.startswith(shard.name)], cached


def _refused(result, sent: int, cache: Path, shard: Path) -> str:
    """The error line of a download refused (exit 1) with nothing of it in `cache`, stopped
    far short of the ENDLESS zeros (at a size or bound, not at the body's end: what went out
    is what the sockets buffer)."""
    assert result.returncode == 1, result.stdout
    assert sent < ENDLESS // 4
    _assert_nothing_cached(cache, shard)
    return error_line(result.stderr)


def test_a_body_that_runs_past_the_manifests_size_is_stopped_there(tmp_path, monkeypatch):
    served, shard = _served_shard(tmp_path, manifest=True)
    size = shard.stat().st_size
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    url, result, sent = _stats_of_endless_shard(served, shard, tmp_path / "cache", monkeypatch)
    assert _refused(result, sent, tmp_path / "cache", shard) == (
        f"Error: {url} is not the shard manifest.json describes (the server sends more than "
        f"{size} bytes) (the shards on the server changed: serve them with their new "
        "manifest.json)"
    )


def test_a_body_of_no_size_at_all_is_stopped_at_the_cache_limit(tmp_path, monkeypatch):
    """Neither manifest.json nor a Content-Length gives its size: it was read to its end."""
    served, shard = _served_shard(tmp_path, manifest=False)
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", "1MiB")
    url, result, sent = _stats_of_endless_shard(served, shard, tmp_path / "cache", monkeypatch)
    assert _refused(result, sent, tmp_path / "cache", shard) == (
        f"Error: cannot download {url}: it sends more than 1048576 bytes with no "
        "Content-Length, more than TORCHKIT_CACHE_LIMIT=1MiB lets the cache hold (check the "
        "URL, or raise TORCHKIT_CACHE_LIMIT; nothing of it was kept)"
    )


def test_a_body_of_no_size_at_all_stops_short_of_filling_the_caches_disk(
    tmp_path, small_tmpfs, monkeypatch
):
    """Without a cache limit, it is read up to the room the cache's disk has less a margin,
    never until the disk is full (a write error only then, every other program's disk full)."""
    served, shard = _served_shard(tmp_path, manifest=False)
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    cache = small_tmpfs(8192)
    url, result, sent = _stats_of_endless_shard(served, shard, cache, monkeypatch)
    assert result.returncode == 1, result.stdout
    line = error_line(result.stderr)
    bound = re.fullmatch(
        rf"Error: cannot download {re.escape(url)}: it sends more than (\d+) bytes with no "
        r"Content-Length, more than the cache's disk has room for \(keeping (\d+) bytes free\) "
        r"\(check the URL, free some space, or set TORCHKIT_CACHE to a folder with more room; "
        r"nothing of it was kept\)",
        line,
    )
    assert bound is not None, line
    assert int(bound[1]) + int(bound[2]) <= 8192 * 1024 and int(bound[2]) > 0
    # Stopped far short of its end: the bound (up to 8 MiB) and what the loopback's socket
    # buffers took in ahead of the reads (17 MiB in all once, on a busy machine) went out.
    assert sent < ENDLESS // 2
    _assert_nothing_cached(cache, shard)


# Where the size of the shard served with ENDLESS zeros after it comes from: its Content-Length
# (no manifest.json) or manifest.json (no Content-Length).
_SIZED = [(True, False, "its Content-Length is"), (False, True, "manifest.json gives it")]


@pytest.mark.parametrize(("declared", "manifest", "says"), _SIZED, ids=["header", "manifest"])
def test_a_body_sized_past_the_cache_limit_is_refused_before_a_byte_is_kept(
    tmp_path, monkeypatch, declared, manifest, says
):
    """It was downloaded whole, past the limit (a tar followed by zeros reads as the tar):
    cached."""
    served, shard = _served_shard(tmp_path, manifest=manifest, endless=True)
    size = shard.stat().st_size + ENDLESS
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", "1MiB")
    url, result, sent = _stats_of_endless_shard(
        served, shard, tmp_path / "cache", monkeypatch, declared=declared
    )
    assert _refused(result, sent, tmp_path / "cache", shard) == (
        f"Error: cannot download {url}: {says} {size} bytes, more than "
        "TORCHKIT_CACHE_LIMIT=1MiB (1048576 bytes) lets the cache hold (raise "
        "TORCHKIT_CACHE_LIMIT; nothing of it was downloaded)"
    )


@pytest.mark.parametrize(("declared", "manifest", "says"), _SIZED, ids=["header", "manifest"])
def test_a_body_sized_past_the_caches_disk_is_refused_before_it_fills_it(
    tmp_path, small_tmpfs, monkeypatch, declared, manifest, says
):
    """Without a cache limit, it was downloaded until the disk was full (every other program's
    disk full too): refused, naming its size and the room, less the margin a body of no size
    keeps."""
    served, shard = _served_shard(tmp_path, manifest=manifest, endless=True)
    size = shard.stat().st_size + ENDLESS
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    cache = small_tmpfs(8192)
    url, result, sent = _stats_of_endless_shard(
        served, shard, cache, monkeypatch, declared=declared
    )
    line = _refused(result, sent, cache, shard)
    room = re.fullmatch(
        rf"Error: cannot download {re.escape(url)}: {says} {size} bytes, more than the "
        r"cache's disk has room for \((\d+) bytes, keeping (\d+) bytes free\) \(free some "
        r"space, or set TORCHKIT_CACHE to a folder with more room; nothing of it was "
        r"downloaded\)",
        line,
    )
    assert room is not None, line
    # The margin of a body of no size: a twentieth of what is free (below 1 GiB here).
    assert int(room[2]) == (int(room[1]) + int(room[2])) // 20 > 0
    assert int(room[1]) + int(room[2]) <= 8192 * 1024
