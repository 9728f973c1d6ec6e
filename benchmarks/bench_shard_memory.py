"""Benchmark: the memory dataset-stats holds a sample of local WebDataset shards, against the
same images as an image folder, in this checkout and an older one (`--before DIR`: a checkout
or `git worktree` of an earlier commit).

    uv run python benchmarks/bench_shard_memory.py --before /tmp/old
    uv run python benchmarks/bench_shard_memory.py --samples 160000

The data: `--samples` 8x8 PNGs (one image, 100 classes) as `train-NNNNNN.tar` shards of 1,000
samples (`KEY.png` and `KEY.cls`) and as class folders. Each side runs `compute_dataset_stats`
(`-j 0`) in a fresh process under `tracemalloc`: the bytes a sample traced when the pass is
done (the samples, ids and readers, before the report is made) and at the peak. Prints each
side's figures and the ratio before / now.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import tempfile
from pathlib import Path

from _timing import checkout_sides, json_from_checkout

ROOT = Path(__file__).resolve().parent.parent

MEASURE = r"""
import gc, json, sys, tracemalloc
sys.path.insert(0, ".")
import torchkit.core.stats.run as run
data, count = sys.argv[1], int(sys.argv[2])
held = {}
summarise = run.summarise
def measured(*args, **kwargs):
    if tracemalloc.is_tracing():
        gc.collect()
        held["done"], held["peak"] = tracemalloc.get_traced_memory()
    return summarise(*args, **kwargs)
run.summarise = measured
run.compute_dataset_stats(data, workers=0)  # imports and first calls, untraced
tracemalloc.start()
run.compute_dataset_stats(data, workers=0)
print(json.dumps({key: value / count for key, value in held.items()}))
"""


def write_data(folder: Path, samples: int) -> tuple[Path, Path]:
    """`samples` PNGs as shards of 1,000 (FOLDER/shards) and class folders (FOLDER/images)."""
    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="PNG")
    png = buffer.getvalue()
    shards, images = folder / "shards", folder / "images"
    shards.mkdir()
    for shard in range(-(-samples // 1000)):
        with tarfile.open(shards / f"train-{shard:06d}.tar", "w") as tar:
            for i in range(shard * 1000, min(samples, (shard + 1) * 1000)):
                key = f"sample{i:08d}"
                for ext, data in (("png", png), ("cls", str(i % 100).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                (images / f"c{i % 100}").mkdir(parents=True, exist_ok=True)
                (images / f"c{i % 100}" / f"{key}.png").write_bytes(png)
    return shards, images


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--before", type=Path, help="the older checkout (else: this one only)")
    options = parser.parse_args()
    sides = checkout_sides(ROOT, options.before)
    with tempfile.TemporaryDirectory() as folder:
        shards, images = write_data(Path(folder), options.samples)
        figures = {}
        for side, checkout in sides.items():
            for kind, data in (("shards", shards), ("folder", images)):
                measured = json_from_checkout(checkout, MEASURE, str(data), str(options.samples))
                figures[side, kind] = measured
                print(f"{side:>6} {kind:>6}: {measured['done']:6.0f} B a sample held when the "
                      f"pass is done, {measured['peak']:6.0f} B at the peak")  # fmt: skip
        if "before" in sides:
            for kind in ("shards", "folder"):
                before, now = figures["before", kind], figures["now", kind]
                print(f"{kind:>6}: before / now = {before['done'] / now['done']:.2f} (held), "
                      f"{before['peak'] / now['peak']:.2f} (peak)")  # fmt: skip
    json.dump({f"{s}/{k}": v for (s, k), v in figures.items()}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
