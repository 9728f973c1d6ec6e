"""Benchmark: how far ahead the device path decodes while the training loop is held up, as by a
model's slow first steps (on the H200, resnet50's first 5 steps took 1.13 s against 0.31 s
later): the decoded batches held to two (a budget of 0, as before 2026-11-27's third session)
against a budget of bytes (`core.decode_ahead.ahead_budget`), and the epoch's
decode started during a set-up of the same length (`DecodedAhead.start()`, as
`core.train.epoch_starts` starts it while the model is built).

A simulated loop, not a model: it takes each decoded batch, waits --stall seconds after its first
(the slow first steps) and --step seconds after each (a step shorter than a batch's decode, so
the decode bounds the epoch, as it bounds resnet50 on the H200). Figures: the epoch's seconds
from the loop's start, median over turns (taken in turns), for each side, and their ratios.

    uv run python benchmarks/bench_decode_ahead.py                      # CPU, 64 px
    uv run python benchmarks/bench_decode_ahead.py --device cuda --size 224 --batch-size 256 \\
        --workers 14 --images 7200 --stall 0.8 --step 0.03

On a CPU the decode takes the same cores as the loader workers: the figures show what the budget
buys a held-up loop, not a GPU's rates.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decode import make_jpeg_folder  # noqa: E402
from bench_device_decode import _loaders  # noqa: E402

SIDES = {
    "two batches (budget 0)": (0, False),
    "budget": (None, False),
    "budget, started during the set-up": (None, True),
}


def epoch_seconds(loaders, device, budget: int, early: bool, args, epoch: int) -> float:
    """One epoch's seconds from the loop's start: a `DecodedAhead` with `budget` bytes,
    started --stall seconds before the loop when `early`."""
    import torch

    from torchkit.core.data.decode_ahead import DecodedAhead

    loaders.train_sampler.set_epoch(epoch)
    ahead = DecodedAhead(loaders.train, device, budget=budget)
    if early:
        ahead.start()
        time.sleep(args.stall)  # the set-up: the model built and moved to the device
    started = time.perf_counter()
    with ahead:
        for index, batch in enumerate(ahead):
            if batch.images is not None:
                batch.images.float().sum().item()  # the batch used, as a step would
            time.sleep(args.stall if index == 0 else args.step)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--images", type=int, default=640)
    parser.add_argument("--size", type=int, default=64, help="--image-size")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--stall", type=float, default=1.0, help="seconds of the slow start")
    parser.add_argument("--step", type=float, default=0.0, help="seconds of each later step")
    parser.add_argument("--budget-mb", type=float, default=512, help="the budget side's MiB")
    parser.add_argument("--repeat", type=int, default=3, help="turns")
    parser.add_argument("--keep", type=Path, help="generate the JPEGs here once, reuse them")
    args = parser.parse_args()

    import torch

    device = torch.device(args.device)
    work = Path(tempfile.mkdtemp(prefix="tk-bench-decode-ahead-"))
    root = args.keep or work / "jpegs"
    try:
        if not (root / "train").is_dir():
            make_jpeg_folder(root, args.images)
        args.epochs = 1
        loaders, _ = _loaders(root, args, "device", device)
        load = f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"
        print(
            f"torch {torch.__version__}, device {device}, {os.cpu_count()} CPUs, load {load}; "
            f"{args.images} JPEGs ~500x375 q90, --image-size {args.size}, batch "
            f"{args.batch_size} ({len(loaders.train)} batches), {args.workers} workers; the loop "
            f"held {args.stall:g} s after its first batch, {args.step:g} s after each other"
        )
        seconds: dict[str, list[float]] = {name: [] for name in SIDES}
        try:
            epoch_seconds(loaders, device, 0, False, args, 0)  # the workers and decoder warm
            for turn in range(args.repeat):
                for name, (budget, early) in SIDES.items():
                    budget = int(args.budget_mb * 2**20) if budget is None else budget
                    seconds[name].append(
                        epoch_seconds(loaders, device, budget, early, args, turn + 1)
                    )
        finally:
            loaders.close()
        print(f"\nepoch seconds from the loop's start ({args.repeat} turns, median)")
        for name, values in seconds.items():
            print(f"  {name:42s} {statistics.median(values):6.2f} s   turns: "
                  + ", ".join(f"{v:.2f}" for v in values))  # fmt: skip
        base = list(SIDES)[0]
        for name in list(SIDES)[1:]:
            ratios = [b / s for b, s in zip(seconds[base], seconds[name], strict=True)]
            print(f"  {base} / {name}: median {statistics.median(ratios):.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
