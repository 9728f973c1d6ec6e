"""Benchmark: one torchkit command line, whole process, wall time, in this checkout against an
older one (`--before DIR`: a checkout or `git worktree` of an earlier commit), in turns.

    uv run python benchmarks/bench_before_after.py --before /tmp/old -- summary resnet50
    uv run python benchmarks/bench_before_after.py --before /tmp/old --repeat 7 -- summary convnet

Each side runs `python -m torchkit ARGS` with its checkout as the working directory (so that
checkout's torchkit is imported) and this environment's Python; which side goes first
alternates. Prints each side's median and all runs, and the ratio (less than 1: faster now), of
wall time and of CPU time (user + system, the process and its children: the figure other jobs on
a shared machine disturb least).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cwd: Path, args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torchkit", *args], cwd=cwd, check=True,
                   capture_output=True)  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each side")
    parser.add_argument("args", nargs="+", help="the torchkit command line (after --)")
    options = parser.parse_args()
    sides = {"now": ROOT, "before": options.before.resolve()}
    for folder in sides.values():  # bytecode and page cache warm for both
        timed(folder, options.args)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for turn in range(options.repeat):
        order = list(sides) if turn % 2 == 0 else list(reversed(sides))
        for name in order:
            times[name].append(timed(sides[name], options.args))
    print("torchkit " + " ".join(options.args))
    for column, measure in enumerate(("wall", "CPU")):
        medians = {
            name: statistics.median(run[column] for run in runs) for name, runs in times.items()
        }
        for name, runs in times.items():
            listed = ", ".join(f"{run[column]:.2f}" for run in runs)
            print(f"  {measure:<4} {name:<7} median {medians[name]:6.2f} s  ({listed})")
        print(f"  {measure:<4} ratio now / before: {medians['now'] / medians['before']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
