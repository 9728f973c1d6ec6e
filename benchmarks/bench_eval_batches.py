"""Benchmark: validation's batches sized so that every loader worker has some
(`core.train.loaders.eval_batch_size`) against validation in batches of --batch-size, on the same
JPEGs, in fresh processes taken in turns.

A worker reads and decodes a whole batch alone, so a validation set of a few batches leaves
most workers idle: the figure is `train -v`'s "validation took X s" per epoch (median), and
the whole run's wall time. The data: photo-like 500x375 JPEGs (`make_jpegs.py`; a tenth of
them are the validation set), decoded in the workers.

    uv run python benchmarks/bench_eval_batches.py                 # CPU: 2 workers
    uv run python benchmarks/bench_eval_batches.py --device cuda --workers 14 --images 8000 \\
        --model resnet50 --size 224 --batch-size 256
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _train_ab import jpeg_parser, train_in_turns  # noqa: E402

WITHOUT = (
    "from torchkit.core.train import loaders; "
    "loaders.eval_batch_size = lambda images, batch_size, workers: batch_size"
)
VALIDATION = re.compile(r"epoch \d+: validation took ([0-9.]+) s")


def read(stderr: str, out: Path) -> float:
    """The median validation seconds an epoch of one run."""
    return statistics.median(float(s) for s in VALIDATION.findall(stderr))


def main() -> None:
    parser = jpeg_parser(__doc__.split("\n\n")[0], images=2000, batch_size=256, epochs=3)
    args = parser.parse_args()
    results = train_in_turns(args, WITHOUT, [], read)
    print(
        f"{args.images} JPEGs ({args.images // 10} to validate) at {args.size} px, batch "
        f"{args.batch_size}, {args.workers} workers, {args.device}, {args.model}, "
        f"{args.turns} turns"
    )
    valid = {side: statistics.median(v for v, _ in runs) for side, runs in results.items()}
    wall = {side: statistics.median(w for _, w in runs) for side, runs in results.items()}
    for what, figures, digits in (
        ("validation s an epoch", valid, 3),
        ("the run's wall s", wall, 2),
    ):
        ours, theirs = figures["with"], figures["without"]
        print(f"{what}, median: shared batches {ours:.{digits}f}, batches of --batch-size "
              f"{theirs:.{digits}f}, ratio {ours / theirs:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
