"""Benchmark: the wall time of `torchkit eval CHECKPOINT --data digits --out DIR`, with
confusion_matrix.png and errors.png drawn by eval's helper process, which imports matplotlib
after scikit-learn beside eval's start-up (as torchkit does), and drawn in the process after
importing it there (as before).

Each run is a fresh `python -m torchkit` process writing a new folder; the two ways alternate
and the median of `--repeats` is kept. A digits checkpoint is trained first (1 epoch) unless one
is given. Both ways use the scikit-learn helper as eval does.

    uv run python benchmarks/bench_plots.py [--repeats 5] [--checkpoint best.pt]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _timing import digits_checkpoint

# The same command with the plot helper turned off where eval looks it up: no helper is started.
WITHOUT_HELPER = (
    "import sys; import torchkit.core.runtime.plot_helper as p; "
    "p.IN_HELPER = False; "
    "from torchkit.cli import main; sys.argv[0] = 'torchkit'; main()"
)


def timed(command: list[str]) -> tuple[float, float]:
    """Wall seconds, and CPU seconds of the process and its helpers (what a busy machine
    charges: there the helper's import finds no idle core to run on)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = args.checkpoint or digits_checkpoint(Path(scratch))
        runs = iter(range(1_000_000))

        def command(prefix: list[str]) -> list[str]:
            out = Path(scratch) / f"eval{next(runs)}"
            return [*prefix, "eval", str(checkpoint), "--data", "digits", "--out", str(out), "-q"]

        helper = [sys.executable, "-m", "torchkit"]
        in_process = [sys.executable, "-c", WITHOUT_HELPER]
        timed(command(helper))  # bytecode and page cache warm for both
        timed(command(in_process))
        with_times, without_times = [], []
        for _ in range(args.repeats):
            with_times.append(timed(command(helper)))
            without_times.append(timed(command(in_process)))
    with_s, without_s = (
        statistics.median(t[0] for t in times) for times in (with_times, without_times)
    )
    with_cpu, without_cpu = (
        statistics.median(t[1] for t in times) for times in (with_times, without_times)
    )
    print(f"eval --out on digits, median of {args.repeats} runs each ({os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f})")  # fmt: skip
    print("                                          wall s     CPU s")
    print(f"  plots drawn by eval's helper process  {with_s:6.2f}    {with_cpu:6.2f}")
    print(f"  plots drawn in the process             {without_s:6.2f}    {without_cpu:6.2f}")
    print(f"  ratio (in process / helper), wall      {without_s / with_s:6.2f}x")


if __name__ == "__main__":
    main()
