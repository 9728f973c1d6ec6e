"""Benchmark: `torchkit split` against the split-folders package on the same large folder.

Generates a folder of N tiny files in C classes (split never decodes images, so only their bytes
being distinct matters: byte-identical files are kept together in one split), then times, in the
same run:

- split-folders' ratio split (`splitfolders.ratio(..., move="symlink")`), the usual baseline;
- torchkit's split in symlink mode and in manifest mode (library call), and in symlink mode as a
  real `python -m torchkit split` process (start-up and all).

split-folders is not a torchkit dependency; run this with it added for the occasion:

    uv run --with split-folders python benchmarks/bench_split.py --files 100000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_folder(root: Path, files: int, classes: int) -> None:
    for c in range(classes):
        folder = root / f"class_{c:03d}"
        folder.mkdir(parents=True)
        for i in range(c, files, classes):
            with open(folder / f"img_{i:07d}.jpg", "wb") as handle:
                # Distinct bytes: split keeps byte-identical files together in one split, so
                # identical files would all land in train.
                handle.write(b"\xff\xd8" + i.to_bytes(4, "big"))


def timed(label: str, action) -> float:
    start = time.perf_counter()
    action()
    seconds = time.perf_counter() - start
    print(f"{label:<46} {seconds:8.2f} s", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=10)
    args = parser.parse_args()

    from torchkit.core.split import split_dataset

    try:
        import splitfolders
    except ImportError:
        splitfolders = None

    work = Path(tempfile.mkdtemp(prefix="tk-bench-split-"))
    try:
        root = work / "data"
        timed(f"generate {args.files} files in {args.classes} classes", lambda: make_folder(
            root, args.files, args.classes
        ))  # fmt: skip
        print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
        results = {}
        if splitfolders is not None:
            results["split-folders symlink"] = timed(
                "split-folders ratio 8:1:1, move='symlink'",
                lambda: splitfolders.ratio(
                    str(root),
                    output=str(work / "sf"),
                    seed=1337,
                    ratio=(0.8, 0.1, 0.1),
                    move="symlink",
                ),  # fmt: skip
            )
        else:
            print("split-folders is not installed: run with `uv run --with split-folders ...`")
        results["torchkit symlink"] = timed(
            "torchkit split --mode symlink (library)",
            lambda: split_dataset(root, work / "tk-symlink", mode="symlink"),
        )
        results["torchkit manifest"] = timed(
            "torchkit split --mode manifest (library)",
            lambda: split_dataset(root, work / "tk-manifest", mode="manifest"),
        )
        command = [sys.executable, "-m", "torchkit", "split", str(root), str(work / "tk-cli")]
        results["torchkit CLI symlink"] = timed(
            "python -m torchkit split --mode symlink (process)",
            lambda: subprocess.run(
                [*command, "--mode", "symlink"], check=True, capture_output=True
            ),
        )
        print()
        for name, seconds in results.items():
            print(f"{name:<24} {args.files / seconds:>12,.0f} files/s")
        baseline = results.get("split-folders symlink")
        if baseline:
            for name in ("torchkit symlink", "torchkit manifest", "torchkit CLI symlink"):
                print(f"speed-up {name} vs split-folders symlink: {baseline / results[name]:.1f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
