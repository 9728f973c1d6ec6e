"""Train's shuffled order of parquet row groups of very different sizes: a window of row groups
shuffled together held as many as the largest fit in the reader's cache, so one large row group
(a file written with other settings) made every window a single small row group, its images
trained in a run with no other group's among them; now a window holds as many row groups as fit
in the cache together, and each row group is still read once an epoch."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from block_orders import shuffled_block_order
from parquet_files import counted_row_group_reads, png

from torchkit.core.data.sources import open_data
from torchkit.core.data.sources import parquet as parquet_module

SMALL_GROUPS = 12  # of 4 images of about 100 bytes
LARGE_IMAGE = 40_000  # bytes: one row group of one image, most of the cache


def write_uneven_row_groups(path: Path) -> Path:
    """A parquet file of 12 row groups of 4 small PNGs, then one of one 40 kB image."""
    schema = pa.schema([("image", pa.binary()), ("label", pa.int64())])
    with pq.ParquetWriter(path, schema) as writer:
        for group in range(SMALL_GROUPS):
            images = [png(group * 4 + i) for i in range(4)]
            writer.write_table(pa.table({"image": images, "label": [i % 2 for i in range(4)]}))
        large = pa.table({"image": [os.urandom(LARGE_IMAGE)], "label": [0]}, schema=schema)
        writer.write_table(large)
    return path


def test_small_row_groups_beside_a_large_one_are_shuffled_together_and_read_once(
    tmp_path, monkeypatch
):
    # A cache the large row group takes most of, as a 100 MiB one takes 128 MiB's.
    monkeypatch.setattr(parquet_module, "CACHE_BYTES", 60_000)
    source = open_data(write_uneven_row_groups(tmp_path / "uneven.parquet"))
    paths = source.whole.paths
    blocks, order, runs = shuffled_block_order(paths)

    # The small row groups' images are interleaved: some row group's images do not lie in one
    # run of the order (they all did, each row group a window of its own).
    assert runs > SMALL_GROUPS + 1 + 10

    # Read in that order through the reader, each row group is read once.
    reads = counted_row_group_reads(monkeypatch)
    read = [paths[i].read_bytes() for i in order]
    assert len(read[order.index(len(paths) - 1)]) == LARGE_IMAGE
    assert sorted(reads) == list(range(SMALL_GROUPS + 1))
