"""Benchmark: a command line's options converted without pydantic, against Typer's own
conversion (pydantic TypeAdapters), same run.

    uv run python benchmarks/bench_option_conversion.py [--repeat 7]

Each side is a fresh Python that imports the app and parses a `train` and an `env` command
line as a run does (every value converted, the command not run): "typer" with Typer's
conversion put back, "torchkit" as torchkit runs. The difference is what each command line
paid for importing pydantic and building its adapters.
"""

from __future__ import annotations

import argparse
import sys

from _timing import compare_timings, measure_all

PARSE = r"""
import sys
from typer.main import get_command
from torchkit.cli import app
if sys.argv[1] == "typer":
    from typer.core import TyperArgument, TyperOption
    from torchkit.cli.app import TorchkitArgument, TorchkitOption
    TorchkitOption.get_runtime_param = TyperOption.get_runtime_param
    TorchkitArgument.get_runtime_param = TyperArgument.get_runtime_param
group = get_command(app)
for words in (
    ["train", "--data", "digits", "--epochs", "3", "--lr", "0.1", "--batch-size", "64",
     "--format", "json", "-o", "/tmp/x.json", "--seed", "1"],
    ["env", "--format", "json"],
):
    with group.make_context("torchkit", list(words), resilient_parsing=False) as ctx:
        sub = group.get_command(ctx, words[0])
        sub.make_context(words[0], list(words[1:]), parent=ctx)
assert ("pydantic" in sys.modules) == (sys.argv[1] == "typer"), sys.modules.keys()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed runs of each (best kept)")
    args = parser.parse_args()
    timings = measure_all(
        {side: [sys.executable, "-c", PARSE, side] for side in ("torchkit", "typer")},
        args.repeat,
    )
    compare_timings(
        "parse, torchkit's conversion", timings["torchkit"],
        "parse, Typer's (pydantic)", timings["typer"],
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
