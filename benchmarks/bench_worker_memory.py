"""Benchmark: the memory each DataLoader worker copies from the main process over one shuffled
epoch of N images (`core.data.dataset.make_dataset`, the dataset of train, eval, predict and
extract-features), in this checkout against an older one (`--before DIR`: a checkout or `git
archive` of an earlier commit), in the same run. Linux only (it reads /proc/PID/smaps_rollup).

    uv run python benchmarks/bench_worker_memory.py --before /tmp/old
    uv run python benchmarks/bench_worker_memory.py --before /tmp/old --sizes 100000,1000000
    uv run python benchmarks/bench_worker_memory.py --before /tmp/old --stored

Workers are forked: they share the main process's pages until they write to one. Each item
read from a Python list writes the reference count of its path (a str) and label (an int), so
the page holding it is copied into the worker; over a shuffled epoch every worker copies every
such page. The figure is each worker's `Private_Dirty` growth from its first batch to the end
of the epoch (what it copied; its RSS does not show it, as the pages were counted there when
shared), and the time to make the dataset (packing the paths, after) and to read the epoch.
The transform reads no file (it returns its path's length): the paths are N names like
`/data/imagenet/train/class_0123/image_000456789.JPEG` in 1,000 classes, no file behind them.
`--stored`: images stored in tar shards instead (`StoredImage`s named
`train-000012.tar/class_0123/image_000456789.jpg`, each with its (offset, size) in one of 100
shards' readers, which read nothing: the transform asks for the bytes, as a loader does).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _timing import checkout_sides, json_from_checkout

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, sys, time

sys.path.insert(0, os.getcwd())
import torch
from torchkit.core.data.dataset import make_dataset, worker_options
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.stored_image import StoredImage

count, workers, stored = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "stored"


class NoBytes:
    def read(self, locator):
        offset, size = locator  # as a tar shard's reader takes it
        return b""


if stored:
    readers = [NoBytes() for _ in range(100)]
    paths = [
        StoredImage(f"train-{i % 100:06d}.tar/class_{i % 1000:04d}/image_{i:09d}.jpg",
                    readers[i % 100], (512 * i, 3000 + i % 5000))
        for i in range(count)
    ]
else:
    paths = [f"/data/imagenet/train/class_{i % 1000:04d}/image_{i:09d}.JPEG" for i in range(count)]
samples = Samples([f"class_{c:04d}" for c in range(1000)], [i % 1000 for i in range(count)], paths)


class NoFile:
    def pixels_from_file(self, path, mode):
        return len(path.read_bytes()) if stored else len(path)


def private_dirty_kb(pid):
    with open(f"/proc/{pid}/smaps_rollup") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("Private_Dirty:"))


make_dataset(Samples([""], [], []), NoFile(), pixels=True)  # its imports, not timed
started = time.perf_counter()
dataset = make_dataset(samples, NoFile(), pixels=True)
made = time.perf_counter() - started
loader = torch.utils.data.DataLoader(
    dataset, batch_size=256, shuffle=True, num_workers=workers, collate_fn=len,
    persistent_workers=True, **worker_options(workers),  # kept after the epoch: measured then
)
started = time.perf_counter()
batches = iter(loader)
read = next(batches)
pids = [worker.pid for worker in batches._workers]
first = [private_dirty_kb(pid) for pid in pids]
read += sum(batches)
epoch = time.perf_counter() - started
last = [private_dirty_kb(pid) for pid in pids]
grown = [(b - a) / 1024 for a, b in zip(first, last)]
assert read == count, read
print(json.dumps({"make_s": made, "epoch_s": epoch, "grown_mb": grown}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the older checkout (else: this one only)")
    parser.add_argument("--sizes", default="100000,1000000", help="numbers of images")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--stored", action="store_true", help="images stored in tar shards")
    options = parser.parse_args()
    sides = checkout_sides(ROOT, options.before)
    print(
        f"{'side':<7} {'images':>9} {'make s':>7} {'epoch s':>8}  worker MB copied (bytes an image)"
    )
    figures: dict[tuple[str, int], float] = {}
    for count in (int(text) for text in options.sizes.split(",")):
        for name, checkout in sides.items():
            kind = "stored" if options.stored else "files"
            found = json_from_checkout(checkout, CHILD, str(count), str(options.workers), kind)
            grown = found["grown_mb"]
            figures[name, count] = max(grown)
            shown = ", ".join(f"{mb:.1f} ({mb * 2**20 / count:.0f})" for mb in grown)
            print(
                f"{name:<7} {count:>9,} {found['make_s']:>7.2f} {found['epoch_s']:>8.2f}  {shown}"
            )
        if ("before", count) in figures:
            ratio = figures["before", count] / max(figures["now", count], 0.01)
            print(f"        most copied by a worker: before / now = {ratio:.0f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
