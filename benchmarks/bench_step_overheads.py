"""Benchmark: the digits job's training step (the convnet at 12 px, channels-last, batches of 32,
torchkit's AdamW parameter groups with the fused step, label smoothing 0.1, one torch thread) with
and without each of two savings that leave every number bitwise the same: the fused AdamW update
by its kernels alone (`core.train.fused_step`, instead of torch's `step()`), and max-pool's
backward given a channels-last gradient (`core.models.convnet`).

    uv run python benchmarks/bench_step_overheads.py [--blocks 300] [--steps 10]

A hand-written loop over one random batch (no data path, no EMA). The variants run in turns, a
block of `--steps` steps each, so a shared machine's slow seconds fall on all of them alike; thread
CPU time per step, each variant's median and fastest block, and the median over rounds of its
ratio to the old step's block of the same round (below 1: faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

VARIANTS = ("before: torch's step", "kernels alone", "channels-last pool gradient", "both (now)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=300, help="rounds of the variants")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    args = parser.parse_args()
    import torch

    from torchkit.core.models import convnet
    from torchkit.core.train import fused_step
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.optim import build_optimizer, param_groups

    torch.set_num_threads(1)
    hook = convnet._gradient_as_channels_last
    images = torch.randn(32, 3, 12, 12).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (32,))
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    config = TrainConfig(data="digits")
    runs = []
    for kernels, pool in ((False, False), (True, False), (False, True), (True, True)):
        torch.manual_seed(0)
        model = convnet.convnet_class()(10, 3, 12).to(memory_format=torch.channels_last)
        runs.append((model, build_optimizer(param_groups(model, config), config), kernels, pool))

    def block(model, optimizer, kernels: bool, pool: bool, steps: int) -> float:
        convnet._gradient_as_channels_last = hook if pool else (lambda features: None)
        started = time.thread_time()
        for _ in range(steps):
            criterion(model(images), labels).backward()
            if not (kernels and fused_step.step(optimizer)):
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        convnet._gradient_as_channels_last = hook
        return (time.thread_time() - started) / steps * 1e3

    for run in runs:  # oneDNN builds its kernels on the first calls
        block(*run, 30)
    times: list[list[float]] = [[] for _ in runs]
    for round_no in range(args.blocks):
        order = range(len(runs)) if round_no % 2 == 0 else reversed(range(len(runs)))
        for index in order:
            times[index].append(block(*runs[index], args.steps))
    print(f"{'variant':<30} {'median ms':>9} {'fastest':>8} {'ratio':>6}")
    for name, mine in zip(VARIANTS, times, strict=True):
        ratio = statistics.median(a / b for a, b in zip(mine, times[0], strict=True))
        print(f"{name:<30} {statistics.median(mine):9.3f} {min(mine):8.3f} {ratio:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
