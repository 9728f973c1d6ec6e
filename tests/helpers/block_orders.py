"""Train's shuffled epoch order over images read in blocks (parquet row groups, streamed
shards): the order, and how many runs of one block's images it makes."""

from __future__ import annotations

from collections.abc import Sequence

from torchkit.core.data.stored_image import Blocks, read_blocks
from torchkit.core.train.loaders import EpochSampler


def shuffled_block_order(paths: Sequence, seed: int = 3) -> tuple[Blocks, list[int], int]:
    """The blocks of `paths`, epoch 0's shuffled order of their images (checked to hold each
    image once), and the number of runs of consecutive images from one block in it: one run
    a block where each block is a window of its own, more where blocks are mixed."""
    blocks = read_blocks(paths)
    assert blocks is not None
    sampler = EpochSampler(len(paths), shuffle=True, seed=seed, blocks=blocks)
    sampler.set_epoch(0)
    order = [index for _, index in sampler]
    assert sorted(order) == list(range(len(paths)))
    pairs = zip(order, order[1:], strict=False)
    runs = sum(1 for a, b in pairs if blocks.ids[a] != blocks.ids[b]) + 1
    return blocks, order, runs
