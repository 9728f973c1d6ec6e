"""Benchmark: the output-overlap check of a command given a CSV index whose images each lie in a
folder of their own (`images/ID/image.png`: an input folder per row), in this checkout against
an older one (`--before DIR`: a checkout or `git archive` of an earlier commit), the sides in
turns.

    uv run python benchmarks/bench_overlap_folders.py --before /tmp/old
    uv run python benchmarks/bench_overlap_folders.py --before /tmp/old --sizes 1000000

The data: a CSV index `path,label` of N rows under --root (made once; no image file is needed:
the check compares the folders' names, and stats the ones that exist). Each side runs in a
process of its own, with its checkout first on sys.path; the figure is the CPU time of one
`check_overlap` of an output folder against the index's input folders (`data_inputs`, read
before the clock starts), the best of two in the process.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _timing import checkout_sides, print_best_ratio, runs_in_turns, write_index_once

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, resource, sys, time

sys.path.insert(0, os.getcwd())
from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.io.outputs import check_overlap

inputs = data_inputs(sys.argv[1])
times = []
for _ in range(2):
    started = time.process_time()
    check_overlap(sys.argv[2], "--out", inputs)
    times.append(time.process_time() - started)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": min(times), "inputs": len(inputs), "peak_mb": peak}))
"""


def make_index(root: Path, rows: int) -> Path:
    return write_index_once(
        root / f"ids-{rows}.csv",
        rows,
        lambda row: f"images/{row:07d}/image.png,class_{row % 100:03d}\n",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the older checkout (else: this one only)")
    parser.add_argument("--sizes", default="10000,100000", help="rows (and folders) of the index")
    parser.add_argument("--repeat", type=int, default=2, help="processes of each side, in turns")
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench_overlap_folders"))
    options = parser.parse_args()
    sides = checkout_sides(ROOT, options.before)
    out = options.root / "runs" / "out"
    print(f"{'side':<7} {'folders':>9} {'check s':>8} {'peak MB':>8}")
    for rows in (int(text) for text in options.sizes.split(",")):
        index = make_index(options.root, rows)
        best: dict[str, float] = {}
        for name, found in runs_in_turns(sides, options.repeat, CHILD, str(index), str(out)):
            best[name] = min(best.get(name, found["seconds"]), found["seconds"])
            print(f"{name:<7} {found['inputs']:>9,} {found['seconds']:>8.2f} "
                  f"{found['peak_mb']:>8.0f}")  # fmt: skip
        print_best_ratio(best)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
