"""Benchmark: the CPU threads of eval, predict, extract-features and train, before and after
they shared one policy (core.runtime.threads).

Before, eval, predict and extract-features (and train on image folders) computed on torch's
default, one thread per core, beside their loader workers; now on the cores the workers leave
free (the digits on one). Each command runs in this process with its default workers, the
"before" side with torch's thread count left alone (OMP_NUM_THREADS set, which the policy
honours; `--threads 0` for train), the "after" side as it runs now; the sides alternate, and
the median of `--repeats` runs after a warm-up is kept (images/s, model loading included).
`--grid` also runs each command at every thread count and worker count up to the cores.

    uv run python benchmarks/bench_threads.py [--images 500] [--size 64] [--repeats 3] [--grid]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_eval import make_checkpoint, make_folder

from torchkit.cli import app
from torchkit.core.data.dataset import default_workers
from torchkit.core.runtime.cpus import usable_cpus
from torchkit.core.runtime.threads import THREADS_VARIABLE, compute_threads


def run(args: list[str]) -> None:
    try:
        app(args, standalone_mode=False, prog_name="torchkit")
    except SystemExit as error:
        if error.code:
            raise RuntimeError(f"torchkit {' '.join(args)} exited with {error.code}") from None


class Commands:
    """The command lines timed, each writing to a fresh output."""

    def __init__(self, tmp: Path, images: int, size: int) -> None:
        self.tmp, self.images = tmp, images
        self.root, self.model = tmp / "images", tmp / "model.pt"
        make_folder(self.root, images, 10, size)
        make_checkpoint(self.model, "resnet18", 10, size)
        run(["train", "--data", "digits", "--epochs", "1", "--out", str(tmp / "digits"), "-q"])
        self.digits = tmp / "digits" / "best.pt"
        self.count = 0

    def line(self, name: str, workers: int | None) -> tuple[list[str], int]:
        """The command line of `name` and the images it reads."""
        self.count += 1
        out = str(self.tmp / f"out{self.count}")
        jobs = [] if workers is None else ["-j", str(workers)]
        root, model = str(self.root), str(self.model)
        lines = {
            "eval": (["eval", model, "--data", root, "-o", f"{out}.json"], self.images),
            "predict": (["predict", model, root, "-o", f"{out}.csv"], self.images),
            "extract-features": (["extract-features", model, root, out], self.images),
            "eval digits": (
                ["eval", str(self.digits), "--data", "digits", "-o", f"{out}.json"],
                1797,
            ),
            "train": (
                ["train", "--model", "resnet18", "--data", root, "--image-size", "64"]
                + ["--epochs", "1", "--out", out],
                self.images,  # the train and validation splits: every image once
            ),
        }
        args, images = lines[name]
        return [*args, *jobs, "-q"], images


def timed(commands: Commands, name: str, workers: int | None, threads: int | None) -> float:
    """images/s of one run: `threads` None is the policy's count, else torch's count is set to
    it and left alone (OMP_NUM_THREADS set; train: --threads)."""
    args, images = commands.line(name, workers)
    saved = os.environ.get(THREADS_VARIABLE)
    before = torch.get_num_threads()
    if threads is not None:
        os.environ[THREADS_VARIABLE] = str(threads)
        torch.set_num_threads(threads)
        if name == "train":
            args += ["--threads", str(threads)]
    else:
        os.environ.pop(THREADS_VARIABLE, None)
    try:
        start = time.perf_counter()
        run(args)
        return images / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
        if saved is None:
            os.environ.pop(THREADS_VARIABLE, None)
        else:
            os.environ[THREADS_VARIABLE] = saved


def median_rates(commands: Commands, name: str, sides: dict, repeats: int) -> dict[str, float]:
    """The median images/s of each side ({label: (workers, threads)}), alternating."""
    rates: dict[str, list[float]] = {label: [] for label in sides}
    for workers, threads in sides.values():
        timed(commands, name, workers, threads)  # warm-up: caches, imports, helper processes
    for repeat in range(repeats):
        order = list(sides.items())
        for label, (workers, threads) in order if repeat % 2 == 0 else order[::-1]:
            rates[label].append(timed(commands, name, workers, threads))
    return {label: statistics.median(values) for label, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grid", action="store_true", help="every threads x workers as well")
    parser.add_argument(
        "--commands", default="eval,predict,extract-features,eval digits,train", help="comma list"
    )
    args = parser.parse_args()
    os.environ.pop(THREADS_VARIABLE, None)
    cores, torch_default = usable_cpus(), torch.get_num_threads()
    workers = default_workers()
    print(
        f"torch {torch.__version__}, {cores} usable cores, torch's default {torch_default} "
        f"threads, default loader workers {workers}; {args.images} JPEGs at {args.size} px, "
        f"resnet18 (digits: the convnet); images/s, median of {args.repeats}; load average "
        f"{os.getloadavg()[0]:.1f} at the start"
    )
    with tempfile.TemporaryDirectory() as tmp:
        commands = Commands(Path(tmp), args.images, args.size)
        for name in args.commands.split(","):
            digits = name == "eval digits"
            own = 0 if digits else workers
            policy = compute_threads(own, tiny_inputs=digits)
            sides = {"before": (None, torch_default), "after": (None, None)}
            if args.grid:
                sides.update(
                    {
                        f"{t} thread(s), {w} worker(s)": (w, t)
                        for t in range(1, cores + 1)
                        for w in range(cores)
                    }
                )
            rates = median_rates(commands, name, sides, args.repeats)
            before, after = rates.pop("before"), rates.pop("after")
            print(
                f"{name:17s} before ({torch_default} threads, {own} workers) {before:7.1f}   "
                f"after ({policy} thread(s)) {after:7.1f}   ratio {after / before:5.2f}",
                flush=True,
            )
            for label, rate in rates.items():
                print(f"{'':17s}   {label:24s} {rate:7.1f}", flush=True)


if __name__ == "__main__":
    main()
