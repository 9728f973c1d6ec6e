"""Train's shuffled order of parquet data (issue #48): images read by row group are shuffled a
window of row groups at a time (as many as the reader's cache holds), so an epoch reads each
row group once instead of once per image; the order stays a pure function of seed, epoch and
data (exact resume), and the order of every other kind of data is unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from image_folders import write_image_folder
from parquet_files import png, write_parquet
from resume_runs import assert_bitwise_equal, recipe, stderr_of

from torchkit.cli import app
from torchkit.core.data.sources import open_data
from torchkit.core.data.sources import parquet as parquet_module
from torchkit.core.data.stored_image import Blocks, read_blocks
from torchkit.core.train.loaders import EpochSampler


def order(sampler: EpochSampler, epoch: int = 0, skip: int = 0) -> list[int]:
    sampler.set_epoch(epoch, skip)
    return [index for _, index in sampler]


def reads_with_a_cache(blocks: list[int], indices: list[int], capacity: int) -> int:
    """How many blocks an LRU cache of `capacity` blocks reads for images in this order."""
    cache: list[int] = []
    reads = 0
    for index in indices:
        block = blocks[index]
        if block in cache:
            cache.remove(block)
        else:
            reads += 1
            if len(cache) == capacity:
                cache.pop(0)
        cache.append(block)
    return reads


# 13 blocks of 1 to 7 images, not in block order (as row groups of several files may be).
BLOCK_IDS = [b for b in range(13) for _ in range(1 + b % 7)]
BLOCK_IDS = BLOCK_IDS[1::2] + BLOCK_IDS[::2]


def test_images_read_in_blocks_are_shuffled_a_window_of_blocks_at_a_time():
    blocks = Blocks(BLOCK_IDS, window=3)
    size = len(BLOCK_IDS)
    sampler = EpochSampler(size, shuffle=True, seed=4, blocks=blocks)
    first, second = order(sampler, 0), order(sampler, 1)
    assert sorted(first) == sorted(second) == list(range(size))  # each image once an epoch
    assert first != second
    assert order(EpochSampler(size, shuffle=True, seed=4, blocks=blocks), 1) == second
    assert order(EpochSampler(size, shuffle=True, seed=5, blocks=blocks), 1) != second
    assert order(sampler, 1, skip=7) == second[7:]  # a mid-epoch resume continues it
    for indices in (first, second):
        # A cache of one window reads each block once; of one block, far more often.
        assert reads_with_a_cache(BLOCK_IDS, indices, capacity=3) == 13
        assert reads_with_a_cache(BLOCK_IDS, indices, capacity=1) > 13
        # Each run of 3 blocks (a window) is shuffled together: not block by block.
        runs = [BLOCK_IDS[i] for i in indices]
        assert sum(a != b for a, b in zip(runs, runs[1:], strict=False)) > 12
    # Ranks split the one global order, as for any data.
    ranks = [
        EpochSampler(size, shuffle=True, seed=4, rank=r, world=2, blocks=blocks) for r in (0, 1)
    ]
    shares = [order(sampler, 1) for sampler in ranks]
    padded = second + second[: len(second) % 2]
    assert shares == [padded[0::2], padded[1::2]]


def test_a_window_of_one_block_keeps_each_block_together():
    indices = order(EpochSampler(len(BLOCK_IDS), shuffle=True, seed=0, blocks=Blocks(BLOCK_IDS, 1)))
    runs = [BLOCK_IDS[i] for i in indices]
    assert sum(a != b for a, b in zip(runs, runs[1:], strict=False)) == 12


@pytest.fixture
def parquet_data(tmp_path) -> Path:
    """HF layout: train 36 PNGs in 9 row groups of 4, validation 3."""
    write_parquet(
        tmp_path / "hf" / "data" / "train-00000-of-00001.parquet",
        [png(i) for i in range(36)],
        [i % 3 for i in range(36)],
    )
    write_parquet(
        tmp_path / "hf" / "data" / "validation-00000-of-00001.parquet",
        [png(100 + i) for i in range(3)],
        [0, 1, 2],
    )
    return tmp_path / "hf"


def small_cache(monkeypatch, data: Path, groups: int) -> None:
    """A reader's cache that holds `groups` of `data`'s row groups."""
    reader = open_data(data).splits["train"].paths[0].reader
    largest = max(max(sizes) for sizes in reader.group_bytes)
    monkeypatch.setattr(parquet_module, "CACHE_BYTES", groups * (largest + largest // 8))


def counted_row_group_reads(monkeypatch) -> list[int]:
    reads: list[int] = []
    read = parquet_module.image_bytes

    def counting(column):
        reads.append(1)
        return read(column)

    monkeypatch.setattr(parquet_module, "image_bytes", counting)
    return reads


def test_train_reads_each_parquet_row_group_once_an_epoch(parquet_data, monkeypatch):
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import build_loaders, load_splits, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    small_cache(monkeypatch, parquet_data, groups=3)
    config = resolve_defaults(
        TrainConfig(data=str(parquet_data), image_size=8, workers=0, batch_size=4, seed=3),
        is_digits=False,
    )
    train = load_splits(config).splits["train"]
    loaders = build_loaders({"train": train, "val": train}, preprocess_for(config), config)
    sampler = loaders.train_sampler
    assert sampler.blocks is not None and sampler.blocks.window == 3
    reads = counted_row_group_reads(monkeypatch)
    for epoch in (0, 1):
        reads.clear()
        images = [train.paths[index].read_bytes() for index in order(sampler, epoch)]
        assert sorted(images) == sorted(png(i) for i in range(36))
        # Each of the 9 row groups once (epoch 1 finds the last window's still in the cache);
        # a plain shuffle reads one for 20-35 of the 36 images.
        assert len(reads) == 9 if epoch == 0 else len(reads) <= 9


def test_folder_and_shard_data_keep_the_plain_shuffled_order(tmp_path):
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import build_loaders, load_splits, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    root = tmp_path / "data"
    write_image_folder(root / "train", {"a": 5, "b": 4}, seed=1)
    write_image_folder(root / "val", {"a": 1, "b": 1}, seed=2)
    config = resolve_defaults(
        TrainConfig(data=str(root), image_size=8, workers=0, batch_size=4, seed=3),
        is_digits=False,
    )
    splits = load_splits(config).splits
    assert read_blocks(splits["train"].paths) is None
    sampler = build_loaders(splits, preprocess_for(config), config).train_sampler
    generator = torch.Generator()
    generator.manual_seed(3 + 2)
    assert order(sampler, 2) == torch.randperm(9, generator=generator).tolist()


def test_resume_mid_epoch_on_parquet_data_is_bitwise_identical(
    parquet_data, tmp_path, runner, monkeypatch
):
    from nets import NoisyNet

    small_cache(monkeypatch, parquet_data, groups=2)
    straight = runner.invoke(app, recipe(parquet_data, tmp_path / "straight", workers=0))
    assert straight.exit_code == 0, stderr_of(straight)
    uninterrupted = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)

    out = tmp_path / "stopped"
    NoisyNet.forwards = 0
    monkeypatch.setenv("TORCHKIT_TEST_SIGINT_AT", "13")  # Ctrl-C during epoch 2's 4th step
    stopped = runner.invoke(app, recipe(parquet_data, out, workers=0))
    assert stopped.exit_code == 130, stderr_of(stopped)
    saved = torch.load(out / "last.pt", weights_only=True)
    assert saved["epoch"] == 1 and saved["epoch_progress"]["batches"] == 4
    monkeypatch.delenv("TORCHKIT_TEST_SIGINT_AT")
    resumed = runner.invoke(app, ["train", "--resume", str(out), "--trust-checkpoint"])
    assert resumed.exit_code == 0, stderr_of(resumed)
    assert_bitwise_equal(torch.load(out / "last.pt", weights_only=True), uninterrupted)
