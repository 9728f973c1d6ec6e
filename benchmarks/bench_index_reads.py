"""Benchmark: the overlap checks of a command given a CSV index, as `eval --out DIR -o FILE`
makes them (its -o FILE, then its --out folder, each against the index's image folders:
`core.data.sources.inputs.data_inputs` twice), in this checkout against an older one
(`--before DIR`: a checkout or `git archive` of an earlier commit), in the same run.

    uv run python benchmarks/bench_index_reads.py --before /tmp/old
    uv run python benchmarks/bench_index_reads.py --before /tmp/old --sizes 100000,1000000

The data: a CSV index `path,label` of N rows in 100 class folders under --root (made once; no
image file is needed: the checks read the index's text). Each side runs in a process of its
own, with its checkout first on sys.path; the figure is the CPU time of both checks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _timing import checkout_sides, json_from_checkout, write_index_once

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, sys, time

sys.path.insert(0, os.getcwd())
from torchkit.core.data.sources.inputs import data_inputs

times = []
for check in ("-o FILE", "--out DIR"):
    started = time.process_time()
    found = data_inputs(sys.argv[1])
    times.append(time.process_time() - started)
print(json.dumps({"seconds": times, "inputs": len(found)}))
"""


def make_index(root: Path, rows: int) -> Path:
    def line(row: int) -> str:
        label = f"class_{row % 100:03d}"
        return f"images/{label}/img_{row:07d}.png,{label}\n"

    return write_index_once(root / f"index-{rows}.csv", rows, line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the older checkout (else: this one only)")
    parser.add_argument("--sizes", default="100000,1000000", help="rows of the index")
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench_index_reads"))
    options = parser.parse_args()
    sides = checkout_sides(ROOT, options.before)
    print(f"{'side':<7} {'rows':>9} {'-o check s':>11} {'--out check s':>14} {'both s':>8}")
    for rows in (int(text) for text in options.sizes.split(",")):
        index = make_index(options.root, rows)
        both = {}
        for name, checkout in sides.items():
            found = json_from_checkout(checkout, CHILD, str(index))
            first, second = found["seconds"]
            both[name] = first + second
            print(f"{name:<7} {rows:>9,} {first:>11.2f} {second:>14.2f} {both[name]:>8.2f}")
        if "before" in both:
            print(f"        both checks: before / now = {both['before'] / both['now']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
