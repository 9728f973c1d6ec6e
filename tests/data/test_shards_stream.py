"""Streaming the shards of a `convert shards` folder from a web server (issue #48): the data is
listed from manifest.json alone, each shard fetched into the cache when a process first reads
from it, and with TORCHKIT_CACHE_LIMIT the least recently used shards are deleted to stay
within it, while train's order takes as many shards at a time as the cache holds (an epoch
fetches each shard about once per worker) and stays a pure function of seed and epoch."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder as write_images
from output_checks import error_line
from processes import run_json, run_torchkit_in_process
from resume_runs import assert_bitwise_equal, recipe, stderr_of
from shards import serving, shard_downloads

from torchkit.cli import app
from torchkit.core.data.sources import open_data
from torchkit.core.data.stored_image import read_blocks

CLASSES = "abc"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """served/converted: `convert shards` of a split root (6 train shards of 4 images, 2 val
    shards of 3), served/legacy: the same with the manifest.json of a torchkit that kept no
    samples per shard; images/: the split root; a convnet checkpoint."""
    root = tmp_path_factory.mktemp("stream")
    write_images(root / "images" / "train", dict.fromkeys(CLASSES, 8))
    write_images(root / "images" / "val", dict.fromkeys(CLASSES, 2), seed=1)
    converted = root / "served" / "converted"
    result = run_torchkit_in_process(
        "convert", "shards", root / "images", converted, "--per-shard", "4"
    )
    assert result.returncode == 0, result.stderr
    legacy = root / "served" / "legacy"
    shutil.copytree(converted, legacy)
    manifest = json.loads((legacy / "manifest.json").read_text())
    for entry in manifest["shards"]:
        entry.pop("extensions", None), entry.pop("labels", None)
    (legacy / "manifest.json").write_text(json.dumps(manifest))
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the same weights in every run: a comparison that fails, fails again
        write_convnet_checkpoint(root / "model.pt", in_channels=3, image_size=8, classes=CLASSES)
    return root


@pytest.fixture
def server(world, tmp_path, monkeypatch):
    with serving(world / "served", tmp_path / "cache", monkeypatch) as httpd:
        yield httpd


def shard_bytes(world: Path) -> int:
    return max(p.stat().st_size for p in (world / "served" / "converted").glob("*.tar"))


def test_a_convert_shards_folder_url_opens_from_its_manifest_without_a_shard(world, server):
    streamed = open_data(f"{server.url}/converted")
    assert shard_downloads(server.requests) == []
    local = open_data(world / "served" / "converted")
    assert streamed.kind == local.kind == "split shards"
    for split in ("train", "val"):
        mine, theirs = streamed.splits[split], local.splits[split]
        assert (mine.ids, mine.labels, mine.classes) == (theirs.ids, theirs.labels, theirs.classes)
    assert mine.ids[0] == "val-000000.tar/val_00000000.png"
    # Reading an image fetches its shard, once.
    first = streamed.splits["train"].paths[0]
    assert first.read_bytes() == local.splits["train"].paths[0].read_bytes()
    streamed.splits["train"].paths[1].read_bytes()
    assert shard_downloads(server.requests) == ["/converted/train-000000.tar"]


def test_dataset_stats_and_eval_over_the_stream_are_those_of_the_local_shards(
    world, server, monkeypatch
):
    # Both evals compute on this process's torch threads: left to themselves, -j 0 takes every
    # usable core and the stream's run the cores less its workers, and CPU matrix products sum
    # in another order on another thread count (the loss then differs in its 8th digit).
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))

    def without_source(found: dict) -> dict:
        return {k: v for k, v in found.items() if k not in ("source", "data", "root", "seconds")}

    # The stream through worker processes; the local shards, the reference, in this process.
    local = world / "served" / "converted"
    url = f"{server.url}/converted"
    stats = [
        without_source(run_json("dataset-stats", data, "--split", "all", *workers))
        for data, workers in ((local, ["-j", "0"]), (url, []))
    ]
    assert stats[0] == stats[1] and stats[0]["images"] == 30

    def metrics(data: object, *workers: str) -> dict:
        found = run_json(
            "eval", world / "model.pt", "--data", data, "--split", "val", "--device", "cpu",
            *workers,
        )  # fmt: skip
        return {
            k: v for k, v in without_source(found).items() if "per_s" not in k and "second" not in k
        }

    assert metrics(url) == metrics(local, "-j", "0")


def test_streaming_marks_a_shard_used_without_changing_what_a_pattern_run_listed(server):
    """The stream marked each shard's last use (for the cache limit) in its modification time:
    a run that had listed the folder's shards through a pattern then read one as written again."""
    pattern = open_data(f"{server.url}/converted/train-{{000000..000005}}.tar").whole
    streamed = open_data(f"{server.url}/converted").splits["train"]
    assert streamed.ids[0] == pattern.ids[0]
    assert streamed.paths[0].read_bytes() == pattern.paths[0].read_bytes()


def test_a_manifest_without_samples_per_shard_downloads_every_shard_first(world, server):
    opened = open_data(f"{server.url}/legacy")
    assert len(shard_downloads(server.requests)) == 8
    assert opened.splits["train"].ids == open_data(world / "served" / "legacy").splits["train"].ids


class CacheWatch:
    """Polls a cache folder while a run goes on: the most bytes its shards (and downloads in
    flight) took at once."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.most, self._stop = folder, 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            total = 0
            for path in self.folder.rglob("*"):
                if path.name.endswith((".tar", ".tmp")):
                    with contextlib.suppress(FileNotFoundError):
                        total += path.stat().st_size
            self.most = max(self.most, total)
            time.sleep(0.002)

    def __enter__(self) -> CacheWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_training_within_a_cache_limit_of_two_shards(world, server, tmp_path, monkeypatch):
    largest = shard_bytes(world)
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", str(2 * largest + largest // 2))
    url = f"{server.url}/converted"
    train = open_data(url).splits["train"]
    blocks = read_blocks(train.paths)
    assert blocks is not None and blocks.window == 2
    assert blocks.ids == [i // 4 for i in range(24)]  # each image's shard
    with CacheWatch(tmp_path / "cache") as watch:
        trained = run_torchkit_in_process(
            "train", "--data", url, "--model", "convnet", "--image-size", "8", "--epochs", "1",
            "--batch-size", "2", "--workers", "2", "--device", "cpu", "--out", tmp_path / "run",
            "--quiet",
        )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert 0 < watch.most <= 3 * largest  # the limit, and one download in flight
    fetched = Counter(path for path in shard_downloads(server.requests) if "/train-" in path)
    assert len(fetched) == 6 and max(fetched.values()) <= 2, fetched  # at most once a worker
    cached = list((tmp_path / "cache").rglob("*.tar"))
    assert sum(path.stat().st_size for path in cached) <= 2 * largest + largest // 2


def test_resume_mid_epoch_over_the_stream_is_bitwise_identical(
    world, server, tmp_path, runner, monkeypatch
):
    from nets import NoisyNet

    largest = shard_bytes(world)
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", str(2 * largest))
    url = f"{server.url}/converted"
    straight = runner.invoke(app, recipe(url, tmp_path / "straight", workers=0))
    assert straight.exit_code == 0, stderr_of(straight)
    uninterrupted = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)

    out = tmp_path / "stopped"
    NoisyNet.forwards = 0
    monkeypatch.setenv("TORCHKIT_TEST_SIGINT_AT", "9")  # Ctrl-C during epoch 2's 3rd step
    stopped = runner.invoke(app, recipe(url, out, workers=0))
    assert stopped.exit_code == 130, stderr_of(stopped)
    saved = torch.load(out / "last.pt", weights_only=True)
    assert saved["epoch"] == 1 and saved["epoch_progress"]["batches"] == 3
    monkeypatch.delenv("TORCHKIT_TEST_SIGINT_AT")
    resumed = runner.invoke(app, ["train", "--resume", str(out), "--trust-checkpoint"])
    assert resumed.exit_code == 0, stderr_of(resumed)
    assert_bitwise_equal(torch.load(out / "last.pt", weights_only=True), uninterrupted)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_gone_from_the_server_mid_epoch_is_one_error_naming_it(
    world, server, tmp_path, workers
):
    gone = world / "served" / f"gone{workers}"
    shutil.copytree(world / "served" / "converted", gone)
    (gone / "train-000003.tar").unlink()
    url = f"{server.url}/{gone.name}"
    started = time.monotonic()
    result = run_torchkit_in_process(
        "train", "--data", url, "--model", "convnet", "--image-size", "8", "--epochs", "1",
        "--batch-size", "2", "--workers", workers, "--device", "cpu", "--out", tmp_path / "run",
    )  # fmt: skip
    assert result.returncode == 1
    assert "24 train / 6 val images" in result.stderr  # the run started: met when read
    line = error_line(result.stderr)
    assert f"{url}/train-000003.tar" in line and "HTTP 404" in line, line
    assert time.monotonic() - started < 60


def test_a_cache_limit_is_a_size_that_holds_a_shard(world, server, monkeypatch):
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", "lots")
    result = run_torchkit_in_process("dataset-stats", f"{server.url}/converted")
    assert result.returncode == 2
    assert "TORCHKIT_CACHE_LIMIT 'lots' is not a size" in error_line(result.stderr)
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", "1KB")
    result = run_torchkit_in_process("dataset-stats", f"{server.url}/converted")
    assert result.returncode == 2
    line = error_line(result.stderr)
    assert "TORCHKIT_CACHE_LIMIT=1KB holds no shard" in line and str(shard_bytes(world)) in line


def test_a_cached_shard_opens_while_a_download_holds_the_cache_limits_lock(
    world, server, tmp_path, monkeypatch
):
    """Under a cache limit a download holds the folder's lock from making room to its end:
    a reader that needs a shard already in the cache (fetched by another process) opens it
    meanwhile instead of waiting for that download."""
    import fcntl

    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", str(3 * shard_bytes(world)))
    url = f"{server.url}/converted"
    open_data(url).splits["train"].paths[0].read_bytes()  # shard 0 in the cache
    again = open_data(url).splits["train"]  # another reader: nothing open
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
    assert shard_downloads(server.requests) == ["/converted/train-000000.tar"]


def test_a_temporary_file_a_killed_download_left_is_deleted_by_the_next(server, tmp_path):
    from torchkit.core.data.sources.http_shards import shard_cache_folder

    folder = shard_cache_folder(f"{server.url}/converted")
    folder.mkdir(parents=True)
    stale = folder / ".train-000000.tar.abcd1234.tmp"  # atomic_write's name, left before the run
    stale.write_bytes(b"half a shard")
    train = open_data(f"{server.url}/converted").splits["train"]
    train.paths[0].read_bytes()
    assert not stale.exists()
    assert (folder / "train-000000.tar").is_file()


def test_a_cached_shard_deleted_before_it_is_listed_is_fetched_again(
    world, server, tmp_path, monkeypatch
):
    """Opened without the cache's lock, a shard another process deletes (making room) before
    this one lists it is fetched again, not an error."""
    from torchkit.core.data.sources import shards

    url = f"{server.url}/converted"
    open_data(url).splits["train"].paths[0].read_bytes()  # shard 0 in the cache
    cached = next((tmp_path / "cache").rglob("train-000000.tar"))
    real_list_tar = shards.list_tar
    calls = []

    def deleted_first(path: str, **options):
        if path == str(cached):
            calls.append(path)
            if len(calls) == 1:
                cached.unlink()  # as another process's make-room does
        return real_list_tar(path, **options)

    monkeypatch.setattr(shards, "list_tar", deleted_first)
    again = open_data(url).splits["train"]
    assert again.paths[1].read_bytes() == (
        open_data(world / "served" / "converted").splits["train"].paths[1].read_bytes()
    )
    assert len(calls) == 2 and cached.is_file()
    assert shard_downloads(server.requests) == ["/converted/train-000000.tar"] * 2


def test_a_shard_deleted_to_make_room_takes_its_lock_file_with_it(
    world, server, tmp_path, monkeypatch
):
    """Each fetched shard's lock file stayed when the cache limit deleted the shard: a long
    run over many shards left one lock file per shard it ever read. A lock file goes with its
    shard, also one an earlier run left."""
    monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", str(2 * shard_bytes(world)))
    from torchkit.core.data.sources.http_shards import shard_cache_folder

    folder = shard_cache_folder(f"{server.url}/converted")
    folder.mkdir(parents=True)
    (folder / ".val-000001.tar.lock").touch()  # an earlier run's, its shard long deleted
    train = open_data(f"{server.url}/converted").splits["train"]
    for image in train.paths[::4]:  # one image of each of the 6 shards
        image.read_bytes()
    cached = sorted(p.name for p in folder.glob("*.tar"))
    assert cached == ["train-000004.tar", "train-000005.tar"]
    locks = sorted(p.name for p in folder.glob(".*.lock"))
    assert locks == [".limit.lock"] + [f".{name}.lock" for name in cached], locks


def test_a_lock_file_deleted_while_a_process_waits_for_it_is_made_again_and_locked(tmp_path):
    """A waiting process that gets the lock of a file deleted meanwhile (the cache limit's
    clean-up) locks the file there now, so two processes never download one shard at once."""
    import fcntl

    from torchkit.core.data.sources.http_shards import _locked

    path = tmp_path / ".shard-000000.tar.lock"
    held = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    inside, leave = threading.Event(), threading.Event()

    def wait_for_it() -> None:
        with _locked(path, threading.Event(), "a shard"):
            inside.set()
            leave.wait(30)

    waiting = threading.Thread(target=wait_for_it)
    waiting.start()
    try:
        while _open_count(path) < 2:  # the waiter opened it too
            assert waiting.is_alive()
            time.sleep(0.001)
        path.unlink()  # deleted while locked, as _delete_lock does
        os.close(held)
        assert inside.wait(30)
        other = os.open(path, os.O_RDWR)  # the waiter made it again
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    finally:
        leave.set()
        waiting.join()


def _open_count(path: Path) -> int:
    """How many descriptors of this process are open on `path`."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found += os.readlink(f"/proc/self/fd/{fd}") == str(path)
    return found
