"""Benchmark: `torchkit env` against `python -m torch.utils.collect_env`, same run.

    uv run python benchmarks/bench_env.py [--repeat 3]

Both report the torch build, CUDA, cuDNN, GPUs and package versions. collect_env runs pip (and
conda, nvidia-smi where present) in subprocesses; torchkit env reads package metadata in-process
and checks torchvision's operators without importing torchvision's model zoo.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from _timing import compare_timings, measure_all, torchkit_command


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each (best is kept)")
    args = parser.parse_args()

    timings = measure_all(
        {
            "baseline": [sys.executable, "-m", "torch.utils.collect_env"],
            "table": torchkit_command("env"),
            "json": torchkit_command("env", "--format", "json"),
        },
        args.repeat,
    )
    baseline, table, as_json = timings["baseline"], timings["table"], timings["json"]
    compare_timings("torchkit env", table, "python -m torch.utils.collect_env", baseline)
    print(f"torchkit env --format json: {as_json.wall:.3f} s wall")
    pip = importlib.util.find_spec("pip") is not None
    print(f"pip in this environment: {'yes' if pip else 'no (collect_env skips `pip list`)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
