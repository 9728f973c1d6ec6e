"""Benchmark: the digits job's training loop by its parts (thread CPU ms per training batch: the
train loader's `next`, the epoch sums' `add`, the forward and backward, the weight update, and the
whole epoch per batch), this checkout against an older one (`--before DIR`), in turns.

    uv run python benchmarks/bench_loop_parts.py --before DIR [--repeat 3] [-- MORE TRAIN OPTIONS]

Each run is `torchkit train --data digits` in a process of its own, the checkout's torchkit first
on `sys.path`, with timers wrapped around those functions (the timers' own cost falls on both
sides alike). Both sides must compute the same numbers: the script compares their metrics.csv
(but for the time columns) and stops when they differ. Prints each part's median over the runs
and the ratio (below 1: faster). Make DIR with `git worktree add DIR COMMIT`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Run in the child: times the loop's parts, writes them as JSON to $LOOP_PARTS_OUT at the end.
HARNESS = r"""
import json, os, sys, time, collections
import torch.utils.data.dataloader as dataloader
from torchkit.core.train import loaders, loop, step_sums
spent = collections.Counter()
calls = collections.Counter()
def timed(owner, name, part, only=None):
    real = getattr(owner, name)
    def wrapper(*args, **kwargs):
        started = time.thread_time()
        try:
            return real(*args, **kwargs)
        finally:
            if only is None or only(*args):
                spent[part] += time.thread_time() - started
                calls[part] += 1
    setattr(owner, name, wrapper)
timed(dataloader._BaseDataLoaderIter, "__next__", "train loader next",
      only=lambda it: isinstance(it._dataset, loaders.SeededDataset))
timed(step_sums.StepSums, "add", "epoch sums add")
timed(loop, "_forward_backward", "forward and backward (with the sums)")
timed(loop, "_update_weights", "weight update (with the EMA)")
timed(loop, "train_one_epoch", "the epoch")
sys.argv = ["loop-parts", *sys.argv[1:]]  # not "torchkit": that would exit at the end
from torchkit.cli import main
try:
    main()
except SystemExit:
    pass
batches = calls["epoch sums add"]
with open(os.environ["LOOP_PARTS_OUT"], "w") as out:
    json.dump({part: spent[part] / batches * 1e3 for part in spent}, out)
"""

TIME_COLUMNS = {"epoch_time_s", "images_per_s"}


def run(checkout: Path, folder: Path, extra: list[str]) -> dict[str, float]:
    parts = folder.with_suffix(".json")
    env = {**os.environ, "PYTHONPATH": str(checkout), "LOOP_PARTS_OUT": str(parts)}
    command = [sys.executable, "-c", HARNESS, "train", "--data", "digits", "--force", "-q"]
    command += ["--out", str(folder), *extra]
    # In the checkout: `-c` puts the working folder first on sys.path.
    subprocess.run(command, env=env, cwd=checkout, capture_output=True, check=True)
    return json.loads(parts.read_text())


def metrics(folder: Path) -> list[dict[str, str]]:
    with open(folder / "metrics.csv", newline="") as file:
        return [
            {k: v for k, v in row.items() if k not in TIME_COLUMNS} for row in csv.DictReader(file)
        ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="an older checkout (git worktree)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side, in turns")
    parser.add_argument("extra", nargs="*", help="more train options for every run")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    sides = {"this checkout": here, "before": Path(args.before).resolve()}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for round_no in range(args.repeat):
            names = list(sides) if round_no % 2 == 0 else list(reversed(sides))
            for name in names:
                folder = Path(tmp) / name.replace(" ", "-")
                results[name].append(run(sides[name], folder, args.extra))
            if metrics(Path(tmp) / "this-checkout") != metrics(Path(tmp) / "before"):
                raise SystemExit("the two sides' metrics.csv differ: not the same numbers")
    parts = list(results["before"][0])
    print(f"{'thread CPU ms per training batch':<40} {'now':>7} {'before':>7} {'ratio':>6}")
    for part in parts:
        now = statistics.median(r[part] for r in results["this checkout"])
        before = statistics.median(r[part] for r in results["before"])
        print(f"{part:<40} {now:7.3f} {before:7.3f} {now / before:6.3f}")
    print("metrics.csv the same on both sides (but for its time columns): yes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
