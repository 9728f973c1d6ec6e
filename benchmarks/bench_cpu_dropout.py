"""Benchmark: the digits convnet's training step with its dropout masks drawn as float64 uniforms
below 1 - p (`uniform_dropout` here: the very masks torch's CPU `bernoulli_` draws, in the same
memory order, the generator left in the same state) against torch's CPU dropout, the weights of
both checked bitwise equal after every block; and the two dropouts alone. Measured and not kept
in torchkit: the saving is mostly lost inside the step (docs/performance.md).

    uv run python benchmarks/bench_cpu_dropout.py [--blocks 200] [--steps 10]

A hand-written loop over one random batch (the convnet at 12 px, channels-last, batch 32,
torchkit's fused AdamW, label smoothing 0.1, one torch thread; no data path, no EMA), the two
sides in turns, a block of `--steps` steps each, both seeded alike before each block so they draw
the same masks: thread CPU ms per step, each side's median block, and the median over rounds of
the ratio of the blocks of one round (below 1: faster).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=200, help="rounds of the two sides")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    args = parser.parse_args()
    import torch

    from torchkit.core.models import convnet
    from torchkit.core.train import fused_step
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.optim import build_optimizer, param_groups

    torch.set_num_threads(1)
    images = torch.randn(32, 3, 12, 12).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (32,))
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    config = TrainConfig(data="digits")
    torch_dropout = torch.nn.functional.dropout

    def uniform_dropout(x, p=0.5, training=True, inplace=False):
        if not training:
            return x
        keep = 1 - p
        draws = torch.rand(x.numel(), dtype=torch.float64) < keep
        return x * draws.to(x.dtype).div_(keep).as_strided(x.size(), x.stride())

    sides = []
    for uniforms in (False, True):
        torch.manual_seed(0)
        model = convnet.convnet_class()(10, 3, 12).to(memory_format=torch.channels_last)
        sides.append((model, build_optimizer(param_groups(model, config), config), uniforms))

    def block(model, optimizer, uniforms: bool, steps: int, seed: int) -> float:
        # nn.Dropout looks F.dropout up at each call
        torch.nn.functional.dropout = uniform_dropout if uniforms else torch_dropout
        torch.manual_seed(seed)
        started = time.thread_time()
        for _ in range(steps):
            criterion(model(images), labels).backward()
            fused_step.step(optimizer) or optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        elapsed = time.thread_time() - started
        torch.nn.functional.dropout = torch_dropout
        return elapsed / steps * 1e3

    for side in sides:  # oneDNN builds its kernels on the first calls; the state is made
        block(*side, 30, seed=0)
    times: list[list[float]] = [[], []]
    for round_no in range(args.blocks):
        order = (0, 1) if round_no % 2 == 0 else (1, 0)
        for index in order:
            times[index].append(block(*sides[index], args.steps, seed=round_no + 1))
        for mine, theirs in zip(sides[0][0].parameters(), sides[1][0].parameters(), strict=True):
            if not torch.equal(mine, theirs):
                raise SystemExit("the two sides' weights differ: the masks are not torch's")

    features = torch.randn(32, 64, 4, 4).contiguous(memory_format=torch.channels_last)
    hidden = torch.randn(32, 128)
    alone = {}
    shapes = (("first dropout (32x64x4x4)", features, 0.25), ("second (32x128)", hidden, 0.5))
    for name, x, p in shapes:
        rounds: dict[str, list[float]] = {"torch": [], "uniforms": []}
        for _ in range(30):
            for side, dropout in (("torch", torch_dropout), ("uniforms", uniform_dropout)):
                started = time.thread_time()
                for _ in range(200):
                    dropout(x, p, True)
                rounds[side].append((time.thread_time() - started) / 200 * 1e3)
        alone[name] = rounds

    print(f"{'measurement':<34} {'torch ms':>9} {'uniforms ms':>12} {'ratio':>6}")
    ratio = statistics.median(b / a for a, b in zip(times[0], times[1], strict=True))
    medians = [statistics.median(t) for t in times]
    print(f"{'the step':<34} {medians[0]:9.3f} {medians[1]:12.3f} {ratio:6.3f}")
    for name, rounds in alone.items():
        a, b = statistics.median(rounds["torch"]), statistics.median(rounds["uniforms"])
        print(f"{name:<34} {a:9.3f} {b:12.3f} {b / a:6.3f}")
    print("weights bitwise equal after every block: yes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
