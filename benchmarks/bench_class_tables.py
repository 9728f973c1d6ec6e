"""Benchmark: how long `split`'s table of one row per class takes to lay out (the table format,
its default) for thousands of classes, in this checkout against an older one (`--before DIR`: a
checkout or `git archive` of an earlier commit), in the same run.

    git worktree add /tmp/old a7196e68~    # or: git archive a7196e68~ | tar -x -C /tmp/old
    uv run python benchmarks/bench_class_tables.py --before /tmp/old
    uv run python benchmarks/bench_class_tables.py --before /tmp/old --classes 5000,21841

The table: split's own (`torchkit.cli.split._table`) of a result with N classes of 8-12 train, 1
val and 1 test images each, laid out three ways: to a pipe or file (`render_plain_tables`), on
a 120-column terminal and on a 40-column one, where plain lines do not fit and rich lays out
the table (`print_on_terminal`). Each side runs in a process of its own, with its checkout
first on sys.path, the sides in turns, --repeat times; the figure is the median CPU seconds of
the layout alone (no listing, no files), with the lines it printed.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from _timing import checkout_sides, json_from_checkout

ROOT = Path(__file__).resolve().parent.parent
WAYS = ("pipe", "terminal 120", "terminal 40")

CHILD = """
import io, json, os, sys, time
from types import SimpleNamespace

sys.path.insert(0, os.getcwd())
from rich.console import Console
from torchkit.cli.render import print_on_terminal, render_plain_tables
from torchkit.cli.split import _table

count = int(sys.argv[1])
counts = [[8 + index % 5, 1, 1] for index in range(count)]
result = SimpleNamespace(
    classes=[f"n{index:08d}" for index in range(count)],
    counts=counts,
    totals=[sum(column) for column in zip(*counts)],
    names=["train", "val", "test"],
    repeats=None,
)
figures = {}
for way in sys.argv[2:]:
    table = _table(result)
    started = time.process_time()
    if way == "pipe":
        text = render_plain_tables([table])
    else:
        screen = Console(file=io.StringIO(), force_terminal=True, color_system=None,
                         width=int(way.split()[1]))
        print_on_terminal([table], screen)
        text = screen.file.getvalue()
    figures[way] = [time.process_time() - started, len(text.splitlines())]
print(json.dumps(figures))
"""


def laid_out(checkout: Path, count: int) -> dict:
    return json_from_checkout(checkout, CHILD, str(count), *WAYS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the older checkout (else: this one only)")
    parser.add_argument("--classes", default="5000,20000", help="numbers of classes")
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    sides = checkout_sides(ROOT, options.before)
    print(f"{'side':<7} {'classes':>8} {'way':<13} {'median CPU s':>12} {'lines':>7}  runs")
    for count in (int(text) for text in options.classes.split(",")):
        times = {(name, way): [] for name in sides for way in WAYS}
        lines: dict[tuple[str, str], int] = {}
        for turn in range(options.repeat):
            order = list(sides) if turn % 2 == 0 else list(reversed(sides))
            for name in order:
                for way, (seconds, printed) in laid_out(sides[name], count).items():
                    times[name, way].append(seconds)
                    lines[name, way] = printed
        for (name, way), values in times.items():
            runs = ", ".join(f"{value:.3f}" for value in values)
            median = statistics.median(values)
            printed = lines[name, way]
            print(f"{name:<7} {count:>8,} {way:<13} {median:>12.3f} {printed:>7,}  {runs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
