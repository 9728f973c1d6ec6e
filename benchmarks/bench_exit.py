"""Benchmark: a torchkit command's whole process, ending without the interpreter's teardown
(`cli.app.exit_without_teardown`, what the `torchkit` script and `python -m torchkit` do)
against the same command ending as Python ends by itself, same run.

    uv run python benchmarks/bench_exit.py [--repeat 5] [-- COMMAND ARGS...]

The baseline runs the same Typer app in the same way but returns from it, so Python tears its
modules and torch's libraries down before the process ends. Default command: the digits main
job for one epoch (`train --data digits --epochs 1`), whose run folder is a temporary one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _timing import compare_timings, measure_all

# The same app, called as `main` calls it, minus the fast exit.
TEARDOWN = (
    "import sys; from torchkit.cli import app; sys.argv[0] = 'torchkit'; app(prog_name='torchkit')"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each, in turns")
    parser.add_argument("command", nargs="*", help="the torchkit command and its arguments")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        words = args.command or [
            "train", "--data", "digits", "--epochs", "1", "--force",
            "--out", str(Path(folder) / "run"),
        ]  # fmt: skip
        timings = measure_all(
            {
                "fast exit": [sys.executable, "-m", "torchkit", *words],
                "teardown": [sys.executable, "-c", TEARDOWN, *words],
            },
            args.repeat,
        )
    print(f"torchkit {' '.join(words[:4])} ...")
    compare_timings("without the teardown", timings["fast exit"], "with it", timings["teardown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
