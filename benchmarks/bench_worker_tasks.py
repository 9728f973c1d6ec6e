"""Benchmark: `dataset-stats -j N` of parquet as its row groups grow, the images the same.

Writes HF-style parquet files of N small PNGs (--kb each, 50 distinct ones over and over,
no dictionary encoding) twice: in row groups of 1,000 rows, and in one row group (pyarrow's
and pandas' default for up to a million rows), then times `python -m torchkit dataset-stats
FILE -j WORKERS --format json -o` of each, for each N in --sizes. Prints the seconds, the
ratio of one row group to row groups of 1,000, and each size's time over the first size's.

Each worker is sent the images in chunks of 64, each with a copy of their reader: where each
copy started with an empty cache, a row group was read again for every chunk of its rows, and
a file of one row group cost its rows squared (40,000 images of 3 KB: 232 s where row groups
of 1,000 took 7). Now both layouts grow linearly:

    uv run python benchmarks/bench_worker_tasks.py --sizes 10000,40000
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_parquet(path: Path, rows: int, group_rows: int, kb: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(0)
    side = max(8, int((kb * 1024 / 3) ** 0.5))
    images = []
    for _ in range(50):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buffer, "PNG")
        images.append(buffer.getvalue())
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    column = pa.array([{"bytes": images[i % 50], "path": None} for i in range(rows)], kind)
    table = pa.table({"image": column, "label": pa.array([i % 10 for i in range(rows)])})
    pq.write_table(table, path, row_group_size=group_rows, use_dictionary=False)


def timed_stats(data: Path, workers: int, out: Path) -> float:
    command = [sys.executable, "-m", "torchkit", "dataset-stats", str(data), "-j", str(workers)]
    command += ["--format", "json", "-o", str(out), "--force", "-q"]
    start = time.perf_counter()
    subprocess.run(command, check=True, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,40000", help="images, comma-separated")
    parser.add_argument("--kb", type=int, default=3, help="bytes of each PNG, in KB")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        first: dict[str, float] = {}
        print(f"{'images':>8} {'groups of 1,000 s':>18} {'one group s':>12} {'ratio':>6}")
        for rows in sizes:
            seconds = {}
            for layout, group_rows in (("groups", 1000), ("one", rows)):
                data = root / f"{layout}-{rows}.parquet"
                write_parquet(data, rows, group_rows, args.kb)
                seconds[layout] = timed_stats(data, args.workers, root / "stats.json")
                data.unlink()
                first.setdefault(layout, seconds[layout])
            growth = " ".join(
                f"{layout} x{seconds[layout] / first[layout]:.1f}" for layout in seconds
            )
            print(
                f"{rows:>8} {seconds['groups']:>18.1f} {seconds['one']:>12.1f} "
                f"{seconds['one'] / seconds['groups']:>6.1f}  (over the first size: {growth})"
            )


if __name__ == "__main__":
    main()
