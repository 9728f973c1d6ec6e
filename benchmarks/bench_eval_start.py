"""Benchmark: the wall time of `torchkit eval CHECKPOINT --data digits`, with scikit-learn
imported in a helper process beside eval's start-up (as torchkit does) and imported in the
process when the metrics are computed (as before).

Each run is a fresh `python -m torchkit` process; the two ways alternate and the median of
`--repeats` is kept. A digits checkpoint is trained first (1 epoch) unless one is given.

    uv run python benchmarks/bench_eval_start.py [--repeats 7] [--checkpoint best.pt]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _timing import digits_checkpoint

# The same command with the helper turned off: the scorer is never started.
WITHOUT_HELPER = (
    "import sys; import torchkit.core.evaluate.runner as r; "
    "r.start_scorer = lambda *args, **kwargs: None; "
    "from torchkit.cli import main; sys.argv[0] = 'torchkit'; main()"
)


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = args.checkpoint or digits_checkpoint(Path(scratch))
        eval_args = ["eval", str(checkpoint), "--data", "digits", "--format", "json"]
        helper = [sys.executable, "-m", "torchkit", *eval_args]
        in_process = [sys.executable, "-c", WITHOUT_HELPER, *eval_args]
        timed(helper)  # bytecode and page cache warm for both
        with_times, without_times = [], []
        for _ in range(args.repeats):
            with_times.append(timed(helper))
            without_times.append(timed(in_process))
    with_s, without_s = statistics.median(with_times), statistics.median(without_times)
    print(f"eval on digits, median of {args.repeats} runs each (wall seconds)")
    print(f"  scikit-learn in a helper process   {with_s:6.2f} s")
    print(f"  scikit-learn imported in process   {without_s:6.2f} s")
    print(f"  ratio (in process / helper)        {without_s / with_s:6.2f}x")


if __name__ == "__main__":
    main()
