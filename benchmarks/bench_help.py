"""Benchmark: `torchkit --help` against `python -c "import torch, torchvision"`, same run.

    uv run python benchmarks/bench_help.py [--repeat 5]

The CLI must not import torch for help or completion (fast start: heavy imports live inside the
functions that need them); the target is under a quarter of the time it takes just to import
torch and torchvision. Exits 1 if missed.
Also times `torchkit env --help` and a bash completion request, which must be as light.
"""

from __future__ import annotations

import argparse
import sys

from _timing import compare_timings, measure_all, torchkit_command

TARGET = 0.25


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each (best is kept)")
    args = parser.parse_args()

    complete = {"_TORCHKIT_COMPLETE": "complete_bash", "COMP_WORDS": "torchkit ", "COMP_CWORD": "1"}
    timings = measure_all(
        {
            "baseline": [sys.executable, "-c", "import torch, torchvision"],
            "help": torchkit_command("--help"),
            "env_help": torchkit_command("env", "--help"),
            "completion": torchkit_command(),
        },
        args.repeat,
        envs={"completion": complete},
    )
    baseline, help_time = timings["baseline"], timings["help"]
    env_help, completion = timings["env_help"], timings["completion"]
    ratio = compare_timings("torchkit --help", help_time, "import torch, torchvision", baseline)
    print(
        f"torchkit env --help: {env_help.wall:.3f} s; "
        f"bash completion of the commands: {completion.wall:.3f} s (wall)"
    )
    met = ratio < TARGET
    print(f"target: under {TARGET:.2f} of the import time: {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
