"""Benchmark: `torchkit split` against the split-folders package on the same large folder.

Generates a folder of N files in C classes (split never decodes images, so only their bytes
being distinct matters: byte-identical files are kept together in one split; `--file-bytes`
pads them to a size), then times, in the same run:

- split-folders' ratio split (`splitfolders.ratio(..., move="symlink")`), the usual baseline;
- torchkit's split in symlink mode and in manifest mode (library call), and in symlink mode as a
  real `python -m torchkit split` process (start-up and all);
- with `--copy`, both tools' default, copying the files: split-folders' `ratio(...)` against
  `python -m torchkit split` (the whole process).

split-folders is not a torchkit dependency; run this with it added for the occasion:

    uv run --with split-folders python benchmarks/bench_split.py --files 100000
    uv run --with split-folders python benchmarks/bench_split.py --files 10000 --copy
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_folder(root: Path, files: int, classes: int, file_bytes: int = 6) -> None:
    padding = b"\0" * max(0, file_bytes - 6)
    for c in range(classes):
        folder = root / f"class_{c:03d}"
        folder.mkdir(parents=True)
        for i in range(c, files, classes):
            with open(folder / f"img_{i:07d}.jpg", "wb") as handle:
                # Distinct bytes: split keeps byte-identical files together in one split, so
                # identical files would all land in train.
                handle.write(b"\xff\xd8" + i.to_bytes(4, "big") + padding)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--file-bytes", type=int, default=6, help="size of each file")
    parser.add_argument(
        "--copy", action="store_true", help="also time both tools copying (their default)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds, every other one in reverse order; medians compared",
    )
    args = parser.parse_args()
    if args.repeat < 1 or args.files < 1 or args.classes < 1:
        parser.error("--files, --classes and --repeat must be at least 1")

    from torchkit.core.split import split_dataset

    try:
        import splitfolders
    except ImportError:
        splitfolders = None

    work = Path(tempfile.mkdtemp(prefix="tk-bench-split-"))
    try:
        root = work / "data"
        start = time.perf_counter()
        make_folder(root, args.files, args.classes, args.file_bytes)
        print(f"generated {args.files} files in {args.classes} classes in "
              f"{time.perf_counter() - start:.2f} s")  # fmt: skip
        print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
        torchkit_cli = [sys.executable, "-m", "torchkit", "split", str(root)]
        sf_cli = [sys.executable, "-c", "from splitfolders.cli import run; run()", str(root)]
        sf_args = ["--seed", "1337", "--ratio", "0.8", "0.1", "0.1"]

        def process(command: list[str]):
            return lambda out: subprocess.run(command(out), check=True, capture_output=True)

        # name -> what it runs, given a fresh OUT
        cases = {}
        if splitfolders is not None:
            cases["split-folders symlink"] = lambda out: splitfolders.ratio(
                str(root), output=str(out), seed=1337, ratio=(0.8, 0.1, 0.1), move="symlink"
            )
        else:
            print("split-folders is not installed: run with `uv run --with split-folders ...`")
        cases["torchkit symlink"] = lambda out: split_dataset(root, out, mode="symlink")
        cases["torchkit manifest"] = lambda out: split_dataset(root, out, mode="manifest")
        cases["torchkit CLI symlink"] = process(
            lambda out: [*torchkit_cli, str(out), "--mode", "symlink"]
        )
        if args.copy:
            if splitfolders is not None:
                cases["split-folders copy"] = lambda out: splitfolders.ratio(
                    str(root), output=str(out), seed=1337, ratio=(0.8, 0.1, 0.1)
                )
                cases["split-folders CLI copy"] = process(
                    lambda out: [*sf_cli, "--output", str(out), *sf_args]
                )
            cases["torchkit CLI copy"] = process(lambda out: [*torchkit_cli, str(out)])
        times: dict[str, list[float]] = {name: [] for name in cases}
        for round_ in range(args.repeat):
            # Every other round runs the cases in reverse order: no case always runs first (on
            # cold caches) or last.
            order = list(enumerate(cases.items()))
            for index, (name, action) in order[:: -1 if round_ % 2 else 1]:
                out = work / f"out-{index}-{round_}"
                start = time.perf_counter()
                action(out)
                times[name].append(time.perf_counter() - start)
                print(f"round {round_ + 1}: {name:<24} {times[name][-1]:8.2f} s", flush=True)
                shutil.rmtree(out, ignore_errors=True)
        results = {name: statistics.median(seconds) for name, seconds in times.items()}
        print(f"\nmedian of {args.repeat} (best), {args.files} files:")
        for name, seconds in results.items():
            best = min(times[name])
            print(
                f"{name:<24} {seconds:8.2f} s ({best:.2f})  {args.files / seconds:>10,.0f} files/s"
            )
        for name, baseline in (
            ("torchkit symlink", "split-folders symlink"),
            ("torchkit manifest", "split-folders symlink"),
            ("torchkit CLI symlink", "split-folders symlink"),
            ("torchkit CLI copy", "split-folders copy"),
            ("torchkit CLI copy", "split-folders CLI copy"),
        ):
            if name in results and baseline in results:
                speed_up = results[baseline] / results[name]
                print(f"speed-up {name} vs {baseline}: {speed_up:.1f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
