"""Benchmark: `torchkit convert cifar` against a plain single-process loop that unpickles each batch
and writes every image with PIL (the "Cifar10 to png" recipe), on the same generated
CIFAR-10-format folder in the same run.

    uv run python benchmarks/bench_convert_cifar.py [--images 6000] [--repeats 3] [--workers N]
        [--dir FOLDER]

Prints images/s for the baseline, for torchkit in one process (`--workers 0`) and for torchkit
with its default (or given) worker count, and the ratios: best of --repeats, the three runs
interleaved, each writing a fresh folder under --dir. Both outputs are checked to hold the same
pixels before any figure is printed. Writing thousands of small files is bound by the file
system as much as by PNG encoding, so results depend on --dir (try a tmpfs such as /dev/shm).
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torchkit.core.convert.cifar import convert_cifar  # noqa: E402
from torchkit.core.runtime.pool import default_workers  # noqa: E402

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def make_cifar10(folder: Path, images: int) -> None:
    """Five training batches and one test batch in the CIFAR-10 python format. The pixels are
    smooth gradients plus noise, which compress about as well as real photos do (pure noise
    would make PNG encoding unrealistically slow)."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    per_batch = images // 6
    y, x = np.mgrid[0:32, 0:32]
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        base = rng.integers(0, 200, (per_batch, 3, 1, 1))
        slope = rng.integers(0, 3, (per_batch, 3, 1, 1))
        noise = rng.integers(0, 24, (per_batch, 3, 32, 32))
        planes = np.clip(base + slope * (x + y) + noise, 0, 255).astype(np.uint8)
        batch = {
            b"batch_label": name.encode(),
            b"labels": rng.integers(0, 10, per_batch).tolist(),
            b"data": planes.reshape(per_batch, 3072),
            b"filenames": [f"{name}_{i}.png".encode() for i in range(per_batch)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {b"label_names": [c.encode() for c in CLASSES], b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))


def baseline(source: Path, out: Path) -> int:
    """The recipe: unpickle each batch, write each image with PIL, one process."""
    with open(source / "batches.meta", "rb") as handle:
        classes = [c.decode() for c in pickle.load(handle, encoding="bytes")[b"label_names"]]
    count = 0
    for split, names in (
        ("train", [f"data_batch_{i}" for i in range(1, 6)]),
        ("test", ["test_batch"]),
    ):
        index = 0
        for name in names:
            with open(source / name, "rb") as handle:
                batch = pickle.load(handle, encoding="bytes")
            for row, label in zip(batch[b"data"], batch[b"labels"], strict=True):
                folder = out / split / classes[label]
                folder.mkdir(parents=True, exist_ok=True)
                image = row.reshape(3, 32, 32).transpose(1, 2, 0)
                Image.fromarray(image).save(folder / f"{index}.png")
                index += 1
                count += 1
    return count


def same_pixels(baseline_out: Path, torchkit_out: Path, samples: int = 200) -> bool:
    """Spot-check: a sample of images hold identical pixels on both sides."""
    paths = sorted(torchkit_out.rglob("*.png"))
    rng = np.random.default_rng(1)
    for path in rng.choice(paths, size=min(samples, len(paths)), replace=False):
        relative = path.relative_to(torchkit_out)
        other = baseline_out / relative.parent / f"{int(relative.stem)}.png"
        if not np.array_equal(np.asarray(Image.open(path)), np.asarray(Image.open(other))):
            return False
    return True


def best_times(runs: dict, root: Path, repeats: int) -> dict[str, float]:
    """Best time of each run, the runs interleaved so that load changes hit them alike. Every
    run writes a new folder; nothing is deleted until the end (deleting thousands of files
    keeps the disk busy into the next timed run)."""
    best = {name: float("inf") for name in runs}
    for repeat in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run(root / f"{name}_{repeat}")
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--dir", default=None, help="Where to write (default: the temp folder).")
    args = parser.parse_args()
    workers = default_workers() if args.workers is None else args.workers

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        source = root / "cifar-10-batches-py"
        make_cifar10(source, args.images)
        total = 6 * (args.images // 6)

        best = best_times(
            {
                "baseline": lambda out: baseline(source, out),
                "single": lambda out: convert_cifar(source, out, workers=0),
                "parallel": lambda out: convert_cifar(source, out, workers=workers),
            },
            root,
            args.repeats,
        )
        if not same_pixels(root / "baseline_0", root / "parallel_0"):
            raise SystemExit("outputs differ: the benchmark is void")
        base_s, one_s, par_s = best["baseline"], best["single"], best["parallel"]

    print(
        f"{total} CIFAR-10-format images, {os.cpu_count()} CPUs, best of {args.repeats}, "
        f"written under {args.dir or tempfile.gettempdir()}"
    )
    print(f"  baseline (PIL loop, 1 process): {total / base_s:10,.0f} images/s")
    print(
        f"  torchkit --workers 0:           {total / one_s:10,.0f} images/s"
        f"  ({base_s / one_s:.2f}x)"
    )
    print(
        f"  torchkit --workers {workers}:           {total / par_s:10,.0f} images/s"
        f"  ({base_s / par_s:.2f}x)"
    )


if __name__ == "__main__":
    main()
