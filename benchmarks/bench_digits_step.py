"""Benchmark: the digits convnet's training step alone, on one torch thread, for the step's
cheaper variants (bf16 autocast, larger batches, smaller inputs) against the default recipe's
(float32, batches of 32, 12 px, channels-last): what each could save before accuracy is counted.

    uv run python benchmarks/bench_digits_step.py [--steps 200] [--threads 1]

A hand-written loop over one random batch (no data path, no EMA): forward, label-smoothed
cross-entropy, backward, fused AdamW. Prints ms per step, images/s and the ratio to the default
(above 1: more images per second). bf16 is fast only on CPUs with AMX or AVX512-BF16.
"""

from __future__ import annotations

import argparse
import time

# (name, autocast bf16, batch, image size)
RECIPES = [
    ("default: float32, batch 32, 12 px", False, 32, 12),
    ("bf16, batch 32", True, 32, 12),
    ("float32, batch 64", False, 64, 12),
    ("bf16, batch 64", True, 64, 12),
    ("float32, batch 128", False, 128, 12),
    ("bf16, batch 128", True, 128, 12),
    ("float32, batch 32, 10 px", False, 32, 10),
    ("float32, batch 32, 8 px", False, 32, 8),
]


def images_per_second(bf16: bool, batch: int, size: int, steps: int) -> tuple[float, float]:
    import torch

    from torchkit.core.models.convnet import convnet_class

    torch.manual_seed(0)
    model = convnet_class()(10, 3, size).to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), 3e-3, fused=True)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    images = torch.randn(batch, 3, size, size).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (batch,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()

    for _ in range(20):  # oneDNN builds its kernels on the first calls
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    seconds = (time.perf_counter() - start) / steps
    return seconds * 1e3, batch / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps of each recipe")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the default: 1)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    baseline = None
    print(f"{'recipe':<36} {'ms/step':>8} {'images/s':>9} {'ratio':>6}")
    for name, bf16, batch, size in RECIPES:
        ms, rate = images_per_second(bf16, batch, size, args.steps)
        baseline = baseline or rate
        print(f"{name:<36} {ms:8.2f} {rate:9.0f} {rate / baseline:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
