"""Benchmark: commands that write thousands of files into one output folder, whole process,
wall time, in this checkout against an older one (`--before DIR`), in turns, as
bench_before_after.py does: `convert tensor` folder -> npy, or `video-info --extract-frames`
with --frames. The output is replaced with --force each run, so every run ends with the
folder's swap (and its one sync of the file system).

    uv run python benchmarks/bench_folder_outputs.py --before /tmp/old --files 5000
    uv run python benchmarks/bench_folder_outputs.py --before /tmp/old --frames 2000

The images are 8x8 PNGs in 5 classes, the video 16x16 MJPEG, made once under --work (a
temporary folder by default): the time is the per-file cost (write, rename, sync), not decoding.

`--single MB [MB ...]` times one file output instead (`-o FILE`, convert checkpoint, plots:
`atomic_path` and `atomic_write_bytes`, fsynced before the rename and the folder after), each
size written `--writes` times in one process of each checkout, median per write:

    uv run python benchmarks/bench_folder_outputs.py --before /tmp/old --single 0.001 100
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench_before_after import ROOT, timed


def make_images(folder: Path, count: int) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for index in range(count):
        target = folder / f"class{index % 5}" / f"{index:07d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(target)
    return folder


def make_video(path: Path, frames: int) -> Path:
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 25, (16, 16))
    for _ in range(frames):
        writer.write(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
    writer.release()
    return path


# One process of a checkout: `writes` files of `size` bytes through atomic_path and through
# atomic_write_bytes, each over the one before; prints the median seconds a write of each.
SINGLE = """
import os, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from torchkit.core.io.files import atomic_path, atomic_write_bytes
size, writes, folder = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
data = os.urandom(min(size, 1 << 20)) * max(1, size >> 20)
target = os.path.join(folder, "out.bin")
medians = []


def by_path():
    with atomic_path(target) as temporary:
        with open(temporary, "wb") as handle:
            handle.write(data)


for write in (by_path, lambda: atomic_write_bytes(target, data)):
    took = []
    for _ in range(writes):
        started = time.perf_counter()
        write()
        took.append(time.perf_counter() - started)
    medians.append(statistics.median(took))
print(*medians)
"""


def single_files(options: argparse.Namespace, work: Path) -> int:
    import subprocess

    sides = {"now": ROOT, "before": options.before.resolve()}
    print(f"one output file, median of {options.writes} writes (atomic_path | atomic_write_bytes)")
    for megabytes in options.single:
        size = max(1, int(megabytes * 2**20))
        for name, root in sides.items():
            folder = work / f"single-{name}"
            folder.mkdir(exist_ok=True)
            args = [str(root), str(size), str(options.writes), str(folder)]
            found = subprocess.run(
                [sys.executable, "-c", SINGLE, *args], check=True, capture_output=True, text=True
            ).stdout.split()
            by_path, by_bytes = (float(value) * 1000 for value in found)
            print(f"  {megabytes:>8g} MB  {name:<7} {by_path:8.2f} ms | {by_bytes:8.2f} ms")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--files", type=int, default=5000, help="images converted")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each side")
    parser.add_argument("--to", default="npy", help="the output format (convert tensor --to)")
    parser.add_argument("--frames", type=int, help="extract this many frames of a video instead")
    parser.add_argument("--work", type=Path, help="folder for the images and outputs")
    parser.add_argument("--single", type=float, nargs="+", help="time one file of these MB")
    parser.add_argument("--writes", type=int, default=10, help="writes of each --single size")
    options = parser.parse_args()
    work = options.work or Path(tempfile.mkdtemp(prefix="bench-folder-outputs-"))
    work.mkdir(parents=True, exist_ok=True)
    if options.single:
        return single_files(options, work)
    if options.frames:
        video = make_video(work / "clip.avi", options.frames + 1)
        command = ["video-info", str(video), "--segments", str(options.frames), "--extract-frames"]
        count, shown = (
            options.frames,
            f"video-info CLIP --segments {options.frames} --extract-frames OUT",
        )
    else:
        images = make_images(work / "images", options.files)
        command = ["convert", "tensor", str(images), "--to", options.to, "--out"]
        count, shown = options.files, f"convert tensor IMAGES --to {options.to} --out OUT"
    sides = {"now": ROOT, "before": options.before.resolve()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for turn in range(options.repeat + 1):  # the first turn warms the page cache and bytecode
        for name in sides if turn % 2 == 0 else reversed(list(sides)):
            out = work / f"out-{name}"
            took = timed(sides[name], [*command, str(out), "--force", "-q"])
            if turn:
                times[name].append(took)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"torchkit {shown} --force ({count} files)")
    for name, values in times.items():
        runs = ", ".join(f"{value:.2f}" for value in values)
        per_file = medians[name] / count * 1000
        print(f"  {name:<7} median {medians[name]:6.2f} s  {per_file:.2f} ms a file  ({runs})")
    print(f"  ratio now / before: {medians['now'] / medians['before']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
