"""Benchmark: the next epoch's batches asked for while an epoch validates and saves
(`core/train/epoch_starts.py`), against each epoch starting its own iterator (the early start
turned off), on the same JPEGs, in fresh processes taken in turns.

The figures: the wait for each steady epoch's first batch (epochs 2 onwards; `train -v`'s
"first batch after X s"), the steady epochs' images/s (metrics.csv, which times the training
steps only: the early start moves data work into the validation's time), and the whole run's
wall time. The data: photo-like 500x375 JPEGs (`make_jpegs.py`), decoded by the
loader workers (`--decode fast`), a small model so that the data path shows.

    uv run python benchmarks/bench_epoch_starts.py                 # CPU: 2 workers
    uv run python benchmarks/bench_epoch_starts.py --device cuda --workers 14 --images 8000 \\
        --model resnet18 --size 224 --batch-size 256 --decode device
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Runs torchkit's CLI with the early start turned off (a no-op), in a fresh process.
WITHOUT = (
    "import sys; from torchkit.core.train import epoch_starts; "
    "epoch_starts.EpochStarts.start_early = lambda self, epoch: None; "
    "from torchkit.cli import main; sys.argv[0] = 'torchkit'; main()"
)
FIRST_BATCH = re.compile(r"epoch (\d+): first batch after ([0-9.]+) s")


def run(side: str, data: Path, out: Path, args) -> tuple[list[float], float, float]:
    """(first-batch waits of epochs 2.., mean images/s of epochs 2.., the run's wall
    seconds) of one run."""
    command = [
        "train", "--data", str(data), "--model", args.model, "--image-size", str(args.size),
        "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--workers",
        str(args.workers), "--device", args.device, "--decode", args.decode, "--out", str(out),
        "--force", "-v",
    ]  # fmt: skip
    python = [sys.executable, "-c", WITHOUT] if side == "without" else [sys.executable, "-m",
                                                                          "torchkit"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE.parent / 'tests'}"}
    started = time.perf_counter()
    done = subprocess.run([*python, *command], capture_output=True, text=True, env=env, timeout=900)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{side} failed:\n{done.stderr[-2000:]}")
    waits = [float(s) for epoch, s in FIRST_BATCH.findall(done.stderr) if int(epoch) > 1]
    with open(out / "metrics.csv") as rows:
        rates = [float(row["images_per_s"]) for row in csv.DictReader(rows)][1:]
    return waits, statistics.mean(rates), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--model", default="test_train_nets:TinyNet")
    parser.add_argument("--decode", default="fast")
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "jpegs"
        subprocess.run([sys.executable, str(HERE / "make_jpegs.py"), str(data), str(args.images)],
                       check=True, capture_output=True)  # fmt: skip
        results: dict[str, list[tuple[list[float], float, float]]] = {"without": [], "with": []}
        for _ in range(args.turns):
            for side in results:
                results[side].append(run(side, data, Path(work) / side, args))
    print(
        f"{args.images} JPEGs at {args.size} px, batch {args.batch_size}, {args.workers} "
        f"workers, {args.device}, {args.model}, --decode {args.decode}, {args.turns} turns"
    )
    wait = {side: statistics.median(w for waits, _, _ in runs for w in waits)
            for side, runs in results.items()}  # fmt: skip
    rate = {side: statistics.median(r for _, r, _ in runs) for side, runs in results.items()}
    wall = {side: statistics.median(w for _, _, w in runs) for side, runs in results.items()}
    print(f"steady epochs' first-batch wait, median s: early start {wait['with']:.3f}, "
          f"none {wait['without']:.3f}")  # fmt: skip
    print(f"steady epochs' images/s, median: early start {rate['with']:,.0f}, "
          f"none {rate['without']:,.0f}, ratio {rate['with'] / rate['without']:.2f}")  # fmt: skip
    print(f"the whole run's wall s, median: early start {wall['with']:.2f}, "
          f"none {wall['without']:.2f}, ratio {wall['with'] / wall['without']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
