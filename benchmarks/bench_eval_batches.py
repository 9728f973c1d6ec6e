"""Benchmark: validation's batches sized so that every loader worker has some
(`core.train.loaders.eval_batch_size`) against validation in batches of --batch-size, on the same
JPEGs, in fresh processes taken in turns.

A worker reads and decodes a whole batch alone, so a validation set of a few batches leaves
most workers idle: the figure is `train -v`'s "validation took X s" per epoch (median), and
the whole run's wall time. The data: photo-like 500x375 JPEGs (`make_jpegs.py`; a tenth of
them are the validation set), decoded in the workers.

    uv run python benchmarks/bench_eval_batches.py                 # CPU: 2 workers
    uv run python benchmarks/bench_eval_batches.py --device cuda --workers 14 --images 8000 \\
        --model resnet50 --size 224 --batch-size 256
"""

from __future__ import annotations

import argparse
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
# Runs torchkit's CLI with validation in batches of --batch-size, in a fresh process.
WITHOUT = (
    "import sys; from torchkit.core.train import loaders; "
    "loaders.eval_batch_size = lambda images, batch_size, workers: batch_size; "
    "from torchkit.cli import main; sys.argv[0] = 'torchkit'; main()"
)
VALIDATION = re.compile(r"epoch \d+: validation took ([0-9.]+) s")


def run(side: str, data: Path, out: Path, args) -> tuple[float, float]:
    """(median validation seconds an epoch, the run's wall seconds) of one run."""
    command = [
        "train", "--data", str(data), "--model", args.model, "--image-size", str(args.size),
        "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--workers",
        str(args.workers), "--device", args.device, "--out", str(out), "--force", "-v",
    ]  # fmt: skip
    python = ["-c", WITHOUT] if side == "without" else ["-m", "torchkit"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *python, *command], capture_output=True, text=True, env=env, timeout=900
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{side} failed:\n{done.stderr[-2000:]}")
    return statistics.median(float(s) for s in VALIDATION.findall(done.stderr)), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--model", default="test_train_nets:TinyNet")
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "jpegs"
        subprocess.run([sys.executable, str(HERE / "make_jpegs.py"), str(data), str(args.images)],
                       check=True, capture_output=True)  # fmt: skip
        results: dict[str, list[tuple[float, float]]] = {"without": [], "with": []}
        for _ in range(args.turns):
            for side in results:
                results[side].append(run(side, data, Path(work) / side, args))
    print(
        f"{args.images} JPEGs ({args.images // 10} to validate) at {args.size} px, batch "
        f"{args.batch_size}, {args.workers} workers, {args.device}, {args.model}, "
        f"{args.turns} turns"
    )
    valid = {side: statistics.median(v for v, _ in runs) for side, runs in results.items()}
    wall = {side: statistics.median(w for _, w in runs) for side, runs in results.items()}
    for what, figures, digits in (
        ("validation s an epoch", valid, 3),
        ("the run's wall s", wall, 2),
    ):
        ours, theirs = figures["with"], figures["without"]
        print(f"{what}, median: shared batches {ours:.{digits}f}, batches of --batch-size "
              f"{theirs:.{digits}f}, ratio {ours / theirs:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
