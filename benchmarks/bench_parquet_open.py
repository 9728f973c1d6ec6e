"""Benchmark: opening parquet, and the row groups' image bytes it counts (what plans the
reader's cache, `convert shards`' windows and the room for its spill), in this checkout and
an older one (`--before DIR`: a checkout or `git archive` of an earlier commit), in turns.

    uv run python benchmarks/bench_parquet_open.py --root /tmp/pq --before /tmp/old
    uv run python benchmarks/bench_parquet_open.py --root /tmp/pq --cold --large

Files (made once under --root; HF's Image struct, pyarrow's defaults: a dictionary, snappy):
`odd`: 20 row groups of 1,000 rows, 900 of one 50 kB image and 100 of 9 small (1 kB) ones;
`rare`: 10 rows of the 50 kB image and 990 of the small ones; `many`: 2,500 row groups of 40
rows, 5 distinct 2 kB images each; with --large, `large`: 2 GB, 200 row groups of 100 distinct
100 kB images, as HF writes them.

Each side runs in a process of its own, its checkout first on sys.path, and prints: the bytes
counted against pyarrow's read of the first 50 row groups (counted/read, the range over row
groups), the reads (`os.pread`) and CPU of the count alone, and the wall time of opening's
parts: the footer, the count, the label column. --cold drops the file's pages from the page
cache first (posix_fadvise DONTNEED, after an fsync: `fincore FILE` shows none left).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import os, sys, time

sys.path.insert(0, os.environ["CHECKOUT"])
import pyarrow.parquet as pq
from torchkit.core.data.sources import parquet as p

path, cold = sys.argv[1], sys.argv[2] == "cold"
if cold:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
started = time.perf_counter()
handle = pq.ParquetFile(path)
metadata = handle.metadata
footer = time.perf_counter()
reads = []
pread = os.pread
os.pread = lambda *a: reads.append(a[1]) or pread(*a)
cpu = time.process_time()
counted = p._image_bytes_read(path, metadata, "image")
cpu = time.process_time() - cpu
os.pread = pread
count = time.perf_counter()
opening = p._File.__new__(p._File)  # its label read alone (`_File._read_labels`)
opening.path = path
opening._read_labels(handle, "label")
labels = time.perf_counter()
groups = min(50, metadata.num_row_groups)
read = [p.image_bytes(handle.read_row_group(g, columns=["image"]).column(0)).nbytes
        for g in range(groups)] if not cold else []
ratio = [c / r for c, r in zip(counted, read)]
shown = f"{min(ratio):.2f}-{max(ratio):.2f}" if ratio else "-"
print(f"counted/read {shown}, {len(reads)} reads ({sum(reads) / 1e3:.0f} kB asked), "
      f"count {cpu * 1e3:.1f} ms CPU; wall: footer {(footer - started) * 1e3:.0f} ms, "
      f"count {(count - footer) * 1e3:.0f} ms, labels {(labels - count) * 1e3:.0f} ms")
"""


def png(seed: int, pad: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue() + np.random.default_rng(seed + 1).bytes(pad)


def write(path: Path, groups: Iterable[list[bytes]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", kind), ("label", pa.int64())])
    with pq.ParquetWriter(path, schema) as writer:
        for rows in groups:
            images = pa.array([{"bytes": b, "path": None} for b in rows], kind)
            labels = [row % 3 for row in range(len(rows))]
            writer.write_table(pa.table({"image": images, "label": labels}, schema=schema))


def make(root: Path, large: bool) -> list[Path]:
    import numpy as np

    root.mkdir(parents=True, exist_ok=True)

    def uneven(big_rows: int):
        for group in range(20):
            big = png(10_000 + group, 50_000)
            small = [png(20_000 + 10 * group + i, 1000) for i in range(9)]
            yield [big if row < big_rows else small[row % 9] for row in range(1000)]

    def many():
        for group in range(2500):
            images = [png(5 * group + i, 2000) for i in range(5)]
            yield [images[row % 5] for row in range(40)]

    def distinct():
        rng = np.random.default_rng(0)
        for _ in range(200):
            yield [rng.bytes(100_000) for _ in range(100)]

    files = {"odd": lambda: uneven(900), "rare": lambda: uneven(10), "many": many}
    if large:
        files["large"] = distinct
    paths = []
    for name, groups in files.items():
        path = root / f"{name}.parquet"
        if not path.exists():
            write(path, groups())
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="where the files are made")
    parser.add_argument("--before", type=Path, help="an older checkout to compare with")
    parser.add_argument("--cold", action="store_true", help="drop each file's cached pages")
    parser.add_argument("--large", action="store_true", help="also the 2 GB file")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    sides = {"after": ROOT} | ({"before": args.before.resolve()} if args.before else {})
    for path in make(args.root, args.large):
        for _ in range(args.repeat):
            for side, checkout in sides.items():
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, str(path), "cold" if args.cold else "warm"],
                    env={**os.environ, "CHECKOUT": str(checkout)},
                    cwd=args.root,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                print(f"{path.name} {side}: {done.stdout.strip()}", flush=True)


if __name__ == "__main__":
    main()
