"""Train's shuffled order of streamed shards of very different sizes: a window of shards shuffled
together held as many as the largest fit in TORCHKIT_CACHE_LIMIT, so one large shard made every
window a single small shard, its images trained in a run with no other shard's among them; now a
window holds as many shards as fit in the limit together, each shard is still fetched (and
opened) once an epoch, and the cache stays within the limit."""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from block_orders import shuffled_block_order
from PIL import Image
from shards import serving, shard_downloads

from torchkit.core.data.sources import http_shards, open_data
from torchkit.core.data.sources.http_shards import StreamedShards
from torchkit.core.data.stored_image import Blocks
from torchkit.core.train.loaders import EpochSampler

SMALL_SHARDS = 12  # of 4 samples of an 8x8 PNG: 10 kB each, tar's padding included
LARGE_SIDE = 120  # one sample of a 120x120 noise PNG: a shard of about 50 kB
LIMIT = 60_000  # bytes: the large shard takes most of it, as a 10 GB one of a 12 GB limit


def png(side: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def write_uneven_shards(folder: Path) -> Path:
    """12 small shards then one large one, written by webdataset's TarWriter and listed in a
    manifest.json as `convert shards` writes it (keys `sample_POSITION`, each shard's samples'
    extensions and labels), so that the folder URL streams."""
    import webdataset as wds

    folder.mkdir(parents=True)
    samples = [[(png(8, shard * 4 + i), i % 2) for i in range(4)] for shard in range(SMALL_SHARDS)]
    samples.append([(png(LARGE_SIDE, 99), 0)])
    entries, position = [], 0
    for number, shard in enumerate(samples):
        name = f"shard-{number:06d}.tar"
        with wds.TarWriter(str(folder / name)) as sink:
            for offset, (image, label) in enumerate(shard):
                sink.write(
                    {"__key__": f"sample_{position + offset:08d}", "png": image, "cls": label}
                )
        data = (folder / name).read_bytes()
        entries.append(
            {
                "name": name,
                "split": "shard",
                "samples": len(shard),
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "start": position,
                "end": position + len(shard),
                "extensions": ["png"] * len(shard),
                "labels": [label for _, label in shard],
            }
        )
        position += len(shard)
    (folder / "manifest.json").write_text(json.dumps({"shards": entries}))
    (folder / "classes.txt").write_text("a\nb\n")
    return folder


@pytest.fixture
def server(tmp_path, monkeypatch):
    write_uneven_shards(tmp_path / "served" / "uneven")
    with serving(tmp_path / "served", tmp_path / "cache", monkeypatch) as httpd:
        monkeypatch.setenv("TORCHKIT_CACHE_LIMIT", str(LIMIT))
        yield httpd


def cached_bytes(cache: Path) -> int:
    return sum(path.stat().st_size for path in cache.rglob("*.tar"))


def test_small_shards_beside_a_large_one_are_shuffled_together_and_fetched_once(
    server, tmp_path, monkeypatch
):
    paths = open_data(f"{server.url}/uneven").whole.paths
    assert shard_downloads(server.requests) == []  # streamed: listed from manifest.json alone
    sizes = [p.stat().st_size for p in sorted((tmp_path / "served" / "uneven").glob("*.tar"))]
    assert max(sizes) <= LIMIT < max(sizes) + min(sizes)  # the large shard is a window alone
    blocks, order, runs = shuffled_block_order(paths)

    # The small shards' images are interleaved: some shard's images do not lie in one run of
    # the order (they all did, each shard a window of its own).
    assert runs > SMALL_SHARDS + 1 + 10

    # Read in that order, each shard is fetched once and opened once (held open while its
    # window is read), and the cache never holds more than the limit.
    opened: list[str] = []
    real_mark_used = http_shards._mark_used

    def counted(target: Path) -> None:
        opened.append(target.name)
        real_mark_used(target)

    monkeypatch.setattr(http_shards, "_mark_used", counted)
    most = 0
    for index in order:
        paths[index].read_bytes()
        most = max(most, cached_bytes(tmp_path / "cache"))
    assert most <= LIMIT
    fetched = Counter(shard_downloads(server.requests))
    assert sorted(fetched) == [f"/uneven/shard-{n:06d}.tar" for n in range(SMALL_SHARDS + 1)]
    assert set(fetched.values()) == {1}
    assert Counter(opened) == {f"shard-{n:06d}.tar": 1 for n in range(SMALL_SHARDS + 1)}


def test_shards_all_of_a_size_keep_the_order_a_window_of_a_count_of_them_gave():
    """Packing shards of one size into the limit gives the windows `limit // size` did: runs
    started before keep their order (and a resumed one its images)."""
    size, limit, count = 10_240, 35_000, 9
    reader = StreamedShards(
        None, [f"shard-{n:06d}.tar" for n in range(count)], [size] * count, limit
    )
    locators = [
        (shard, f"sample_{shard * 4 + i:08d}.png") for shard in range(count) for i in range(4)
    ]
    blocks = reader.blocks(locators)
    assert blocks.sizes == [size] * count and blocks.capacity == limit
    by_count = Blocks(blocks.ids, limit // size)
    for epoch in range(3):
        orders = []
        for given in (blocks, by_count):
            sampler = EpochSampler(len(locators), shuffle=True, seed=5, blocks=given)
            sampler.set_epoch(epoch)
            orders.append([index for _, index in sampler])
        assert orders[0] == orders[1]
