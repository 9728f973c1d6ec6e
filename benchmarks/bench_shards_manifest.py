"""Benchmark: what `convert shards` writes into `manifest.partial.json` (the record a stopped run
resumes from) over a run of thousands of shards, in this checkout against an older one
(`--before DIR`: a checkout or `git archive` of an earlier commit), in the same run.

    uv run python benchmarks/bench_shards_manifest.py --before /tmp/old
    uv run python benchmarks/bench_shards_manifest.py --before /tmp/old --shards 500,2000

The data: N tiny PNGs (8x8, 10 classes, hard links of a few distinct files) in an image folder
under --root. Each side runs `convert_shards` in a process of its own, with its checkout first
on sys.path, once per shard count (`--per-shard` N / shards). Real shards of a gigabyte take
seconds each (read from a disk or the web); here they take milliseconds, so the child's
`time.monotonic` is moved on by --shard-seconds at each shard closed: a rewrite schedule that
goes by the clock sees the shards as long as they are in a real run.

The figure is the bytes written into manifest.partial.json, seen from outside the code that
writes it: after every sample the file is looked at, a new file (another inode) counts its
whole size, the same file what it grew by. Also printed: the run's wall seconds (in-process,
without the pretend shard time) and the most shards complete but not yet listed in the file at
any look (what a kill then would write again). Bytes per shard that stay flat as the shards
grow in number: a linear cost.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from _timing import checkout_sides, json_from_checkout

ROOT = Path(__file__).resolve().parent.parent
DISTINCT = 50
CLASSES = 10

CHILD = """
import json, os, sys, time

sys.path.insert(0, os.getcwd())
from torchkit.core.convert import shards

source, out = sys.argv[1], sys.argv[2]
per_shard, shard_seconds = int(sys.argv[3]), float(sys.argv[4])
pretend = [0.0]  # seconds of shard work the clock is moved on by
real_monotonic = time.monotonic
time.monotonic = lambda: real_monotonic() + pretend[0]
close = shards._ShardFile.close

def closed(self):
    done = close(self)
    pretend[0] += shard_seconds
    closed_count[0] += 1
    return done

closed_count = [0]
shards._ShardFile.close = closed
partial = os.path.join(out, shards.PARTIAL_MANIFEST)
seen = {"inode": None, "size": 0, "bytes": 0, "behind": 0}

def listed():
    try:
        with open(partial, "rb") as handle:
            text = handle.read().decode()
    except OSError:
        return 0
    return text.count('"sha256"')

def look(done, total):
    try:
        status = os.stat(partial)
    except OSError:
        return
    if status.st_ino != seen["inode"]:
        seen["bytes"] += status.st_size
    else:
        seen["bytes"] += max(0, status.st_size - seen["size"])
    seen["inode"], seen["size"] = status.st_ino, status.st_size
    if done % 997 == 0:  # now and then: reading the file is itself a cost
        seen["behind"] = max(seen["behind"], closed_count[0] - listed())

options = shards.shard_options(per_shard=per_shard, shuffle=True)
started = time.perf_counter()
report = shards.convert_shards(source, out, options=options, workers=0, progress=look)
seconds = time.perf_counter() - started
print(json.dumps({"bytes": seen["bytes"], "shards": len(report.shards), "seconds": seconds,
                  "behind": seen["behind"]}))
"""


def make_images(root: Path, images: int) -> Path:
    """An image folder of `images` 8x8 PNGs in CLASSES classes (made once, reused)."""
    folder = root / f"images-{images}"
    if (folder / ".complete").exists():
        return folder
    import numpy as np
    from PIL import Image

    shutil.rmtree(folder, ignore_errors=True)
    distinct = []
    for number in range(DISTINCT):
        path = root / f"distinct-{number}.png"
        pixels = np.random.default_rng(number).integers(0, 256, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)
        distinct.append(path)
    for index in range(images):
        target = folder / f"class{index % CLASSES}" / f"img{index:07d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(distinct[index % DISTINCT], target)
    (folder / ".complete").write_text("")
    return folder


def run_side(checkout: Path, source: Path, out: Path, per_shard: int, seconds: float) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    found = json_from_checkout(checkout, CHILD, str(source), str(out), str(per_shard), str(seconds))
    shutil.rmtree(out, ignore_errors=True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the older checkout (else: this one only)")
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--shards", default="250,1000,4000", help="shard counts to write")
    parser.add_argument("--shard-seconds", type=float, default=5.0,
                        help="pretend seconds a shard takes (1 GB shards: 5-20 s)")  # fmt: skip
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench_shards_manifest"))
    options = parser.parse_args()
    options.root.mkdir(parents=True, exist_ok=True)
    source = make_images(options.root, options.images)
    sides = checkout_sides(ROOT, options.before)
    print(f"convert shards of {options.images:,} images, each shard taking "
          f"{options.shard_seconds:g} s on the clock")  # fmt: skip
    print(f"{'side':<7} {'shards':>7} {'partial MB':>11} {'bytes/shard':>12} "
          f"{'run s':>7} {'most unlisted':>14}")  # fmt: skip
    for count in (int(text) for text in options.shards.split(",")):
        per_shard = max(1, options.images // count)
        for name, checkout in sides.items():
            found = run_side(checkout, source, options.root / "out", per_shard,
                             options.shard_seconds)  # fmt: skip
            print(f"{name:<7} {found['shards']:>7,} {found['bytes'] / 1e6:>11.2f} "
                  f"{found['bytes'] / found['shards']:>12,.0f} {found['seconds']:>7.2f} "
                  f"{found['behind']:>14,}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
