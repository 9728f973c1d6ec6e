"""Benchmark: how long `convert tensor SRC DST --to ...` takes to list a folder of many files
(its `_scan`: the files to convert and the ones it skips), in this checkout against an older one
(`--before DIR`: a checkout or `git archive` of an earlier commit), in the same run.

    uv run python benchmarks/bench_convert_listing.py --before /tmp/old
    uv run python benchmarks/bench_convert_listing.py --before /tmp/old --sizes 100000,400000

The data: N empty `.png` files in 100 class folders under --root (made once, reused: the
listing reads no file). Each side lists it in a process of its own, with its checkout first on
sys.path, the sides in turns, --repeat times; the figure is the median. A linear cost takes
about 4x the time at 4x the files.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from _timing import checkout_sides, json_from_checkout

ROOT = Path(__file__).resolve().parent.parent
CLASSES = 100

CHILD = """
import json, os, sys, time
from pathlib import Path

sys.path.insert(0, os.getcwd())
from torchkit.core.convert import tensor

started = time.perf_counter()
convertible, skipped = tensor._scan(Path(sys.argv[1]))
print(json.dumps({"seconds": time.perf_counter() - started, "files": len(convertible)}))
"""


def make_files(root: Path, count: int) -> Path:
    folder = root / f"files-{count}"
    if (folder / ".complete").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    for number in range(CLASSES):
        (folder / f"class{number:03d}").mkdir(parents=True)
    for index in range(count):
        (folder / f"class{index % CLASSES:03d}" / f"img{index:07d}.png").touch()
    (folder / ".complete").touch()
    return folder


def listed(checkout: Path, folder: Path) -> dict:
    return json_from_checkout(checkout, CHILD, str(folder))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the older checkout (else: this one only)")
    parser.add_argument("--sizes", default="25000,100000", help="numbers of files")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench_convert_listing"))
    options = parser.parse_args()
    sides = checkout_sides(ROOT, options.before)
    print(f"{'side':<7} {'files':>9} {'median s':>9} {'us/file':>8}  runs")
    for count in (int(text) for text in options.sizes.split(",")):
        folder = make_files(options.root, count)
        times: dict[str, list[float]] = {name: [] for name in sides}
        for turn in range(options.repeat):
            order = list(sides) if turn % 2 == 0 else list(reversed(sides))
            for name in order:
                found = listed(sides[name], folder)
                assert found["files"] == count, found
                times[name].append(found["seconds"])
        for name, values in times.items():
            median = statistics.median(values)
            runs = ", ".join(f"{value:.2f}" for value in values)
            print(f"{name:<7} {count:>9,} {median:>9.2f} {1e6 * median / count:>8.1f}  {runs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
