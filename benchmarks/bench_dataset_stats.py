"""Benchmark: `torchkit dataset-stats` against the classic `compute_mean_and_std` recipe.

Generates a folder of N JPEG and PNG images of varied sizes in 10 classes, then times, on that
folder in the same run:

- the classic recipe from the PyTorch cheat-sheets: iterate an ImageFolder (PIL images), add up
  per-image `np.mean` per channel, then a second pass for the squared deviations. It decodes every
  image twice and, as a bonus, averages per-image means, which is wrong when sizes differ;
- torchkit's one-pass, exact statistics with worker processes (library call), and the same as a
  real `python -m torchkit dataset-stats` process (start-up included).

    uv run python benchmarks/bench_dataset_stats.py --images 3000
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_folder(root: Path, images: int, seed: int = 0) -> None:
    """Smooth gradients plus noise (so JPEG and PNG sizes are realistic), 96 to 320 px a side."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(images):
        folder = root / f"class_{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        width, height = (int(v) for v in rng.integers(96, 321, size=2))
        ramp = np.linspace(0, 255, width)[None, :, None] * rng.uniform(0.3, 1.0, size=3)
        noise = rng.normal(0, 12, size=(height, width, 3))
        pixels = np.clip(ramp + noise + rng.uniform(0, 60), 0, 255).astype(np.uint8)
        if i % 2:
            Image.fromarray(pixels).save(folder / f"img_{i:05d}.png")
        else:
            Image.fromarray(pixels).save(folder / f"img_{i:05d}.jpg", quality=90)


def compute_mean_and_std(dataset):
    """The classic recipe (two passes, per-image means), written out as the cheat-sheets do."""
    mean_r = mean_g = mean_b = 0
    for img, _ in dataset:
        img = np.asarray(img)
        mean_r += np.mean(img[:, :, 0])
        mean_g += np.mean(img[:, :, 1])
        mean_b += np.mean(img[:, :, 2])
    mean_r /= len(dataset)
    mean_g /= len(dataset)
    mean_b /= len(dataset)
    diff_r = diff_g = diff_b = 0
    n = 0
    for img, _ in dataset:
        img = np.asarray(img)
        diff_r += np.sum(np.power(img[:, :, 0] - mean_r, 2))
        diff_g += np.sum(np.power(img[:, :, 1] - mean_g, 2))
        diff_b += np.sum(np.power(img[:, :, 2] - mean_b, 2))
        n += np.prod(img[:, :, 0].shape)
    mean = (mean_r / 255.0, mean_g / 255.0, mean_b / 255.0)
    std = tuple(float(np.sqrt(d / n)) / 255.0 for d in (diff_r, diff_g, diff_b))
    return mean, std


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (worker processes, subprocesses)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(label: str, action):
    """Wall and CPU seconds: on a shared machine the CPU time is the steadier figure."""
    start, cpu = time.perf_counter(), cpu_seconds()
    result = action()
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    print(f"{label:<52} {seconds:8.2f} s wall {cpu:8.2f} s CPU", flush=True)
    return seconds, cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=None, help="default: all cores")
    args = parser.parse_args()

    from torchvision.datasets import ImageFolder

    from torchkit.core.stats import compute_dataset_stats, default_stats_workers

    workers = default_stats_workers() if args.workers is None else args.workers
    work = Path(tempfile.mkdtemp(prefix="tk-bench-stats-"))
    try:
        root = work / "data"
        timed(f"generate {args.images} JPEG/PNG images", lambda: make_folder(root, args.images))
        print(f"machine: {os.cpu_count()} CPUs, torchkit workers: {workers}")
        base_s, base_cpu, (base_mean, base_std) = timed(
            "classic compute_mean_and_std(ImageFolder(root))",
            lambda: compute_mean_and_std(ImageFolder(str(root))),
        )
        tk_s, tk_cpu, stats = timed(
            f"torchkit compute_dataset_stats, {workers} workers (library)",
            lambda: compute_dataset_stats(root, workers=workers),
        )
        command = [sys.executable, "-m", "torchkit", "dataset-stats", str(root), "-j", str(workers)]
        cli_s, _, _ = timed(
            "python -m torchkit dataset-stats (process)",
            lambda: subprocess.run(command, check=True, capture_output=True),
        )
        n = args.images
        print()
        print(f"classic recipe   {n / base_s:8.1f} images/s")
        print(f"torchkit library {n / tk_s:8.1f} images/s  ({base_s / tk_s:.1f}x)")
        print(f"torchkit CLI     {n / cli_s:8.1f} images/s  ({base_s / cli_s:.1f}x)")
        per_image = f"classic {1000 * base_cpu / n:.2f} ms, torchkit {1000 * tk_cpu / n:.2f} ms"
        print(
            f"CPU per image: {per_image} ({base_cpu / tk_cpu:.1f}x less work; on {workers} idle "
            f"cores about {workers * base_cpu / tk_cpu:.1f}x faster)"
        )
        print()
        print("mean  torchkit (exact):", " ".join(f"{v:.6f}" for v in stats.mean))
        print("mean  classic recipe  :", " ".join(f"{v:.6f}" for v in base_mean))
        print("std   torchkit (exact):", " ".join(f"{v:.6f}" for v in stats.std))
        print("std   classic recipe  :", " ".join(f"{v:.6f}" for v in base_std))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
