"""Streamed shards read in order (eval, predict, extract-features): while a process reads one
shard, the shard its order reads next is fetched on a thread, within the cache limit; a fork
stops that download first (http_shards.StreamedShards, _FetchAhead). Real local HTTP servers."""

from __future__ import annotations

import functools
import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder as write_images
from processes import run_json, run_torchkit_in_process
from shards import serving, shard_downloads

from torchkit.core.data.sources import http_shards, open_data
from torchkit.core.data.stored_image import read_in_order

CLASSES = "abc"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """served/: `convert shards` of a split root (6 train shards of 4 images, 2 val shards of
    3); a convnet checkpoint for its classes."""
    root = tmp_path_factory.mktemp("ahead")
    write_images(root / "images" / "train", dict.fromkeys(CLASSES, 8))
    write_images(root / "images" / "val", dict.fromkeys(CLASSES, 2), seed=1)
    done = run_torchkit_in_process(
        "convert", "shards", root / "images", root / "served", "--per-shard", "4"
    )
    assert done.returncode == 0, done.stderr
    write_convnet_checkpoint(root / "model.pt", in_channels=3, image_size=8, classes=CLASSES)
    return root


@pytest.fixture
def server(world, tmp_path, monkeypatch):
    with serving(world / "served", tmp_path / "cache", monkeypatch) as httpd:
        yield httpd


def fetched_ahead(paths) -> None:
    """Wait for the fetch ahead of this process, if one was started."""
    ahead = getattr(paths[0].reader, "_ahead", None)
    if ahead is not None and ahead.thread is not None:
        ahead.thread.join()


def cached(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache").rglob("*.tar"))


def test_read_in_order_the_next_shard_of_the_order_is_fetched_while_one_is_read(server, tmp_path):
    train = open_data(server.url).splits["train"]
    read_in_order(train.paths)
    train.paths[0].read_bytes()
    fetched_ahead(train.paths)
    # The next shard came before any of its images was asked for.
    assert shard_downloads(server.requests) == ["/train-000000.tar", "/train-000001.tar"]
    for path in train.paths:  # the rest, in order
        path.read_bytes()
        fetched_ahead(train.paths)
    downloads = shard_downloads(server.requests)
    assert downloads == [f"/train-{n:06d}.tar" for n in range(6)]  # each once, no val shard
    assert cached(tmp_path) == [f"train-{n:06d}.tar" for n in range(6)]


def test_without_an_order_only_the_shard_read_is_fetched(server):
    train = open_data(server.url).splits["train"]
    train.paths[0].read_bytes()
    assert train.paths[0].reader._ahead is None
    assert shard_downloads(server.requests) == ["/train-000000.tar"]


def test_within_a_cache_limit_of_two_shards_reading_in_order_stays_within_it(
    world, server, tmp_path, monkeypatch
):
    size = max(p.stat().st_size for p in (world / "served").glob("*.tar"))
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", str(2 * size))
    train = open_data(server.url).splits["train"]
    read_in_order(train.paths)
    for number, path in enumerate(train.paths):
        path.read_bytes()
        fetched_ahead(train.paths)
        # The shard read and the next one (the last: the one before it), never a third.
        shard = min(number // 4, 4)
        assert cached(tmp_path) == [f"train-{shard:06d}.tar", f"train-{shard + 1:06d}.tar"]
    assert shard_downloads(server.requests) == [f"/train-{n:06d}.tar" for n in range(6)]


def test_a_cache_limit_of_one_shard_fetches_nothing_ahead(world, server, monkeypatch):
    size = max(p.stat().st_size for p in (world / "served").glob("*.tar"))
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", str(size))
    train = open_data(server.url).splits["train"]
    read_in_order(train.paths)
    train.paths[0].read_bytes()
    assert train.paths[0].reader._ahead is None
    assert shard_downloads(server.requests) == ["/train-000000.tar"]


@pytest.mark.parametrize("command", ["eval", "predict", "extract-features"])
def test_the_commands_that_read_in_order_say_so(world, server, tmp_path, monkeypatch, command):
    orders = []
    original = http_shards.StreamedShards.read_in_order

    def spy(self, locators):
        orders.append([shard for shard, _ in locators])
        original(self, locators)

    monkeypatch.setattr(http_shards.StreamedShards, "read_in_order", spy)
    common = ["--device", "cpu", "--workers", "0"]
    if command == "eval":
        args = ["eval", world / "model.pt", "--data", server.url, "--split", "val", *common]
    elif command == "predict":
        args = ["predict", world / "model.pt", server.url, *common, "-o", tmp_path / "rows.csv"]
    else:
        args = ["extract-features", world / "model.pt", server.url, tmp_path / "f", *common]
    done = run_torchkit_in_process(*args)
    assert done.returncode == 0, done.stderr
    assert len(orders) == 1 and orders[0] == sorted(orders[0])  # the listing's order


def test_eval_over_the_stream_with_workers_is_eval_of_the_local_shards(world, server):
    def metrics(data: object) -> dict:
        found = run_json(
            "eval", world / "model.pt", "--data", data, "--split", "train", "--device", "cpu",
            "--workers", "2", "--batch-size", "3",
        )  # fmt: skip
        return {k: found[k] for k in ("num_images", "accuracy", "loss", "per_class")}

    assert metrics(server.url) == metrics(world / "served")
    assert shard_downloads(server.requests) == [f"/train-{n:06d}.tar" for n in range(6)]


class _GatedHandler(SimpleHTTPRequestHandler):
    """Serves the folder; the body of `gated` stops after its first 1,000 bytes until `gate`
    is set (`sent_part` says when it got there)."""

    gated = ""
    gate = threading.Event()
    sent_part = threading.Event()

    def log_message(self, *args) -> None:
        pass

    def copyfile(self, source, outputfile) -> None:
        if self.path != self.gated:
            return super().copyfile(source, outputfile)
        outputfile.write(source.read(1000))
        outputfile.flush()
        self.sent_part.set()
        self.gate.wait(60)
        outputfile.write(source.read())


def test_halting_before_a_fork_stops_the_download_in_flight_and_leaves_nothing(
    world, tmp_path, monkeypatch
):
    """What runs before this process forks (a DataLoader starting its workers): the fetch
    ahead in flight stops, its temporary file is deleted, and the reader fetches that shard
    itself when it gets there."""
    monkeypatch.setenv("TORCHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    handler = type("Gated", (_GatedHandler,), {"gated": "/train-000001.tar"})
    handler.gate, handler.sent_part = threading.Event(), threading.Event()
    httpd = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(world / "served"))
    )
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    try:
        train = open_data(f"http://127.0.0.1:{httpd.server_address[1]}").splits["train"]
        read_in_order(train.paths)
        train.paths[0].read_bytes()
        ahead = train.paths[0].reader._ahead
        assert handler.sent_part.wait(60)  # shard 1 is half downloaded
        halting = threading.Thread(target=http_shards._halt_fetches_ahead)
        halting.start()
        assert ahead.stop.wait(60)
        handler.gate.set()  # the rest arrives; the download sees it was stopped
        halting.join(60)
        assert not halting.is_alive() and ahead.thread is None
        folder = tmp_path / "cache"
        assert cached(tmp_path) == ["train-000000.tar"]
        assert not list(folder.rglob("*.tmp"))
        assert train.paths[4].read_bytes()  # shard 1, fetched by the reader
        fetched_ahead(train.paths)
        assert "train-000001.tar" in cached(tmp_path)
    finally:
        handler.gate.set()
        httpd.shutdown()
        httpd.server_close()


def test_a_temporary_file_a_killed_download_left_is_deleted_by_the_next(server, tmp_path):
    train = open_data(server.url).splits["train"]
    folder = next((tmp_path / "cache").rglob("manifest.json")).parent
    stale = folder / ".train-000000.tar.abc123.tmp"
    stale.write_bytes(b"half a shard")
    train.paths[0].read_bytes()
    assert not stale.exists()
    assert cached(tmp_path) == ["train-000000.tar"]


def test_a_cached_shard_opens_while_a_download_holds_the_cache_limits_lock(
    world, server, tmp_path, monkeypatch
):
    """Under a cache limit a download holds the folder's lock from making room to its end:
    a reader that needs a shard already in the cache (fetched ahead, or by another process)
    opens it meanwhile instead of waiting for that download."""
    import fcntl

    size = max(p.stat().st_size for p in (world / "served").glob("*.tar"))
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", str(3 * size))
    open_data(server.url).splits["train"].paths[0].read_bytes()  # shard 0 in the cache
    again = open_data(server.url).splits["train"]  # another reader: nothing open
    lock = os.open(next((tmp_path / "cache").rglob(".limit.lock")), os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)  # as a download in another process holds it
    read = []
    reading = threading.Thread(target=lambda: read.append(again.paths[1].read_bytes()))
    try:
        reading.start()
        reading.join(30)
        assert read, "the reader waited for the cache limit's lock"
    finally:
        os.close(lock)
        reading.join()
    assert shard_downloads(server.requests) == ["/train-000000.tar"]
