"""Benchmark: the digits job's training loader, with each epoch's images transformed at its
first batch (`MemoryImages.renders_whole_epochs`) against a batch at a time, same run.

    uv run python benchmarks/bench_memory_images.py [--epochs 5] [--turns 3]

The real train loader of `torchkit train --data digits` (its defaults: 12 px, batches of 32,
no workers), no model: milliseconds of host time per batch, which on a GPU is time the
training step waits for (the loader runs in the main process). Both ways give the same pixels
(tests/data/test_memory_images.py).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from torchkit.core.train import TrainConfig, memory_images
from torchkit.core.train.loaders import build_loaders, load_splits, preprocess_for
from torchkit.core.train.validation import resolve_defaults


def ms_per_batch(epochs: int, whole: bool) -> float:
    saved = memory_images.WHOLE_EPOCH_BYTES
    memory_images.WHOLE_EPOCH_BYTES = saved if whole else 0
    try:
        config = resolve_defaults(TrainConfig(data="digits"), is_digits=True)
        loaders = build_loaders(
            load_splits(config).splits, preprocess_for(config), config, rank=0, world=1
        )
        try:
            times = []
            for epoch in range(epochs + 1):  # the first builds the resize tables: not timed
                loaders.train_sampler.set_epoch(epoch)
                started, batches = time.perf_counter(), 0
                for _ in loaders.train:
                    batches += 1
                if epoch:
                    times.append((time.perf_counter() - started) / batches * 1000)
            return statistics.median(times)
        finally:
            loaders.close()
    finally:
        memory_images.WHOLE_EPOCH_BYTES = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    whole, apart = [], []
    for _ in range(args.turns):  # in turns, so the machine's load hits both alike
        whole.append(ms_per_batch(args.epochs, whole=True))
        apart.append(ms_per_batch(args.epochs, whole=False))
    best_whole, best_apart = min(whole), min(apart)
    shown = {
        name: ", ".join(f"{t:.3f}" for t in turns) for name, turns in (("w", whole), ("a", apart))
    }
    print(f"whole epoch at once: {best_whole:.3f} ms a batch (turns {shown['w']})")
    print(f"a batch at a time:   {best_apart:.3f} ms a batch (turns {shown['a']})")
    print(f"ratio (whole / batch): {best_whole / best_apart:.3f}")


if __name__ == "__main__":
    main()
