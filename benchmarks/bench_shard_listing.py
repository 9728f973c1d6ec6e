"""Benchmark: opening WebDataset shards (`open_data` of a folder of shards: every tar's headers
listed and every sample's `.cls` label read), in this checkout against an older one (`--before
DIR`: a checkout or `git archive` of an earlier commit), the sides in turns.

    uv run python benchmarks/bench_shard_listing.py --before /tmp/old
    uv run python benchmarks/bench_shard_listing.py --before /tmp/old --sizes 1000000

The data: N samples (`KEY.png`, a 1x1 PNG, and `KEY.cls`) in shards of 10,000 samples each,
100 classes, under --root (made once). Each side runs in a process of its own, with its
checkout first on sys.path; the figures are the wall and CPU seconds of `open_data`, the
process's peak resident set, and how many times a shard was read outside its listing
(`TarReader.read`, one `pread` each: before, once for every label).
"""

from __future__ import annotations

import argparse
import io
import tarfile
from pathlib import Path

from _timing import checkout_sides, print_best_ratio, runs_in_turns

ROOT = Path(__file__).resolve().parent.parent
PER_SHARD = 10_000

CHILD = """
import json, os, resource, sys, time

sys.path.insert(0, os.getcwd())
from torchkit.core.data.sources import shards
from torchkit.core.data.sources.source import open_data

reads = 0
real_read = shards.TarReader.read
def counted(self, locator):
    global reads
    reads += 1
    return real_read(self, locator)
shards.TarReader.read = counted
wall, cpu = time.perf_counter(), time.process_time()
source = open_data(sys.argv[1])
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"wall": wall, "cpu": cpu, "peak_mb": peak, "reads": reads}))
"""


def make_shards(root: Path, samples: int) -> Path:
    import numpy as np
    from PIL import Image

    folder = root / f"shards-{samples}"
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    encoded = io.BytesIO()
    Image.fromarray(np.zeros((1, 1, 3), np.uint8)).save(encoded, "PNG")
    png = encoded.getvalue()
    for shard in range(-(-samples // PER_SHARD)):
        name = folder / f"shard-{shard:06d}.tar"
        with tarfile.open(name, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key in range(shard * PER_SHARD, min(samples, (shard + 1) * PER_SHARD)):
                for extension, data in (("png", png), ("cls", str(key % 100).encode())):
                    member = tarfile.TarInfo(f"{key:08d}.{extension}")
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))
    done.touch()
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the older checkout (else: this one only)")
    parser.add_argument("--sizes", default="10000,100000", help="samples in all the shards")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each side, in turns")
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench_shard_listing"))
    options = parser.parse_args()
    sides = checkout_sides(ROOT, options.before)
    print(f"{'side':<7} {'samples':>9} {'wall s':>8} {'cpu s':>8} {'peak MB':>8} {'reads':>8}")
    for samples in (int(text) for text in options.sizes.split(",")):
        folder = make_shards(options.root, samples)
        best: dict[str, float] = {}
        for name, found in runs_in_turns(sides, options.repeat, CHILD, str(folder)):
            best[name] = min(best.get(name, found["cpu"]), found["cpu"])
            print(f"{name:<7} {samples:>9,} {found['wall']:>8.2f} {found['cpu']:>8.2f} "
                  f"{found['peak_mb']:>8.0f} {found['reads']:>8,}")  # fmt: skip
        print_best_ratio(best)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
