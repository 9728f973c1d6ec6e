"""A/B runs of `torchkit train` on generated JPEGs, for benchmarks of one change: each run in a
fresh process, the change turned off on one side by Python code run before the CLI.

    from _train_ab import jpeg_parser, train_in_turns

`jpeg_parser` gives the options every such benchmark takes; `train_in_turns(args, without,
extra, read)` makes the JPEGs once, then runs `torchkit train` with and without the change in
turns and returns each side's `read(stderr, out)` results with the run's wall seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIDES = ("without", "with")


def jpeg_parser(description: str, **defaults: Any) -> argparse.ArgumentParser:
    """The shared options (device, workers, images, size, batch size, epochs, model, turns),
    with `defaults` for this benchmark."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--model", default="test_train_nets:TinyNet")
    parser.add_argument("--turns", type=int, default=3)
    parser.set_defaults(**defaults)
    return parser


def train_in_turns(
    args: argparse.Namespace,
    without: str,
    extra: Sequence[str],
    read: Callable[[str, Path], Any],
) -> dict[str, list[tuple[Any, float]]]:
    """{side: [(read(stderr, run folder), wall seconds), ...]} over `args.turns` turns.
    `without`: Python statements that turn the change off before the CLI runs."""
    results: dict[str, list[tuple[Any, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "jpegs"
        subprocess.run([sys.executable, str(HERE / "make_jpegs.py"), str(data), str(args.images)],
                       check=True, capture_output=True)  # fmt: skip
        for _ in range(args.turns):
            for side in SIDES:
                out = Path(work) / side
                command = [
                    "train", "--data", str(data), "--model", args.model, "--image-size",
                    str(args.size), "--batch-size", str(args.batch_size), "--epochs",
                    str(args.epochs), "--workers", str(args.workers), "--device", args.device,
                    "--out", str(out), "--force", "-v", *extra,
                ]  # fmt: skip
                cli = "from torchkit.cli import main; sys.argv[0] = 'torchkit'; main()"
                code = (
                    f"import sys; {without}; {cli}" if side == "without" else f"import sys; {cli}"
                )
                env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
                started = time.perf_counter()
                done = subprocess.run([sys.executable, "-c", code, *command], capture_output=True,
                                      text=True, env=env, timeout=900)  # fmt: skip
                wall = time.perf_counter() - started
                if done.returncode != 0:
                    sys.exit(f"{side} failed:\n{done.stderr[-2000:]}")
                results[side].append((read(done.stderr, out), wall))
    return results
