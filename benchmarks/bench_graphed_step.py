"""`train --cuda-graphs` against eager steps: the digits job's seconds per optimiser update.

    uv run python benchmarks/bench_graphed_step.py                  # CPU: the host's share
    python benchmarks/bench_graphed_step.py --device cuda           # a GPU: graphs recorded

Three ways, each run of the digits job in a fresh process and run folder, in turns (best of
--turns), epochs 2 on (the first pays for start-up and, on a GPU, for warm-up and capture):
- eager: the ordinary step;
- graphed: --cuda-graphs. On CUDA the step is recorded and replayed. On a CPU nothing is
  recorded and the same step runs eagerly from the static buffers: its figure shows what the
  graph's bookkeeping (static copies, device scalars) adds;
- loop only (CPU): --cuda-graphs with the step itself left out, i.e. what a replayed graph
  leaves the host to do per update (the loader, copies, scalar fills, the schedule): the floor
  of a graphed update on a GPU whose replay is quicker than the host.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def seconds_per_update(run: Path, batch_size: int) -> float:
    """Training seconds per update over epochs 2 on (metrics.csv: epoch time, images/s)."""
    with (run / "metrics.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))[1:]
    seconds = sum(float(row["epoch_time_s"]) for row in rows)
    images = sum(float(row["epoch_time_s"]) * float(row["images_per_s"]) for row in rows)
    return seconds / (images / batch_size)


def run_one(way: str, device: str, epochs: int, out: str) -> None:
    """One run of the digits job in this process (a child of `main`)."""
    from typer.testing import CliRunner

    from torchkit.cli import app
    from torchkit.core.train import graphed_step

    if device == "cpu":
        graphed_step.GRAPH_DEVICES = ("cuda", "cpu")  # the step without the recording
    if way == "loop-only":
        graphed_step.GraphedStep._body = lambda self, images, labels: None
    options = [] if way == "eager" else ["--cuda-graphs"]
    result = CliRunner().invoke(
        app,
        ["train", "--data", "digits", "--device", device, "--epochs", str(epochs), "--out", out,
         "--format", "json", *options],
    )  # fmt: skip
    if result.exit_code != 0:
        sys.exit(f"{way}: exit {result.exit_code}: {result.stderr[-500:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("WAY", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_one(args.child[0], args.device, args.epochs, args.child[1])
        return

    from torchkit.core.train.defaults import DIGITS_DEFAULTS

    ways = ["eager", "graphed"] + (["loop-only"] if args.device == "cpu" else [])
    figures: dict[str, list[float]] = {way: [] for way in ways}
    with tempfile.TemporaryDirectory() as work:
        for turn in range(args.turns):
            for way in ways:
                out = Path(work) / f"{way}-{turn}"
                child = ["--device", args.device, "--epochs", str(args.epochs)]
                subprocess.run(
                    [sys.executable, __file__, *child, "--child", way, str(out)], check=True
                )
                figures[way].append(seconds_per_update(out, DIGITS_DEFAULTS["batch_size"]))
    eager = min(figures["eager"])
    print(f"digits job, {args.device}, epochs 2-{args.epochs}, best of {args.turns}:")
    for way in ways:
        best = min(figures[way])
        print(f"  {way:<10} {best * 1e3:7.3f} ms per update   {best / eager:5.2f}x eager")


if __name__ == "__main__":
    main()
