"""Benchmark: one torchkit command line, whole process, wall time, in this checkout against an
older one (`--before DIR`: a checkout or `git worktree` of an earlier commit), in turns.

    uv run python benchmarks/bench_before_after.py --before /tmp/old -- summary resnet50
    uv run python benchmarks/bench_before_after.py --before /tmp/old --repeat 7 -- summary convnet

Each side runs `python -m torchkit ARGS` with its checkout as the working directory (so that
checkout's torchkit is imported) and this environment's Python; which side goes first
alternates. Prints each side's median and all runs, and the ratio (less than 1: faster now).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cwd: Path, args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torchkit", *args], cwd=cwd, check=True,
                   capture_output=True)  # fmt: skip
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each side")
    parser.add_argument("args", nargs="+", help="the torchkit command line (after --)")
    options = parser.parse_args()
    sides = {"now": ROOT, "before": options.before.resolve()}
    for folder in sides.values():  # bytecode and page cache warm for both
        timed(folder, options.args)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for turn in range(options.repeat):
        order = list(sides) if turn % 2 == 0 else list(reversed(sides))
        for name in order:
            times[name].append(timed(sides[name], options.args))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print("torchkit " + " ".join(options.args))
    for name, values in times.items():
        runs = ", ".join(f"{value:.2f}" for value in values)
        print(f"  {name:<7} median {medians[name]:6.2f} s  ({runs})")
    print(f"  ratio now / before: {medians['now'] / medians['before']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
