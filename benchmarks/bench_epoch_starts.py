"""Benchmark: the next epoch's batches asked for while an epoch validates and saves
(`core/train/epoch_starts.py`), against each epoch starting its own iterator (the early start
turned off), on the same JPEGs, in fresh processes taken in turns.

The figures: the wait for each steady epoch's first batch (epochs 2 onwards; `train -v`'s
"first batch after X s"), the steady epochs' images/s (metrics.csv, which times the training
steps only: the early start moves data work into the validation's time), and the whole run's
wall time. The data: photo-like 500x375 JPEGs (`make_jpegs.py`), decoded by the loader
workers (`--decode fast`), a small model so that the data path shows.

    uv run python benchmarks/bench_epoch_starts.py                 # CPU: 2 workers
    uv run python benchmarks/bench_epoch_starts.py --device cuda --workers 14 --images 8000 \\
        --model resnet18 --size 224 --batch-size 256 --decode device
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _train_ab import jpeg_parser, train_in_turns  # noqa: E402

WITHOUT = (
    "from torchkit.core.train import epoch_starts; "
    "epoch_starts.EpochStarts.start_early = lambda self, epoch: None"
)
FIRST_BATCH = re.compile(r"epoch (\d+): first batch after ([0-9.]+) s")


def read(stderr: str, out: Path) -> tuple[list[float], float]:
    """(first-batch waits of epochs 2.., mean images/s of epochs 2..) of one run."""
    waits = [float(s) for epoch, s in FIRST_BATCH.findall(stderr) if int(epoch) > 1]
    with open(out / "metrics.csv") as rows:
        rates = [float(row["images_per_s"]) for row in csv.DictReader(rows)][1:]
    return waits, statistics.mean(rates)


def main() -> None:
    parser = jpeg_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--decode", default="fast")
    args = parser.parse_args()
    results = train_in_turns(args, WITHOUT, ["--decode", args.decode], read)
    print(
        f"{args.images} JPEGs at {args.size} px, batch {args.batch_size}, {args.workers} "
        f"workers, {args.device}, {args.model}, --decode {args.decode}, {args.turns} turns"
    )
    wait = {side: statistics.median(w for (waits, _), _ in runs for w in waits)
            for side, runs in results.items()}  # fmt: skip
    rate = {side: statistics.median(r for (_, r), _ in runs) for side, runs in results.items()}
    wall = {side: statistics.median(w for _, w in runs) for side, runs in results.items()}
    print(f"steady epochs' first-batch wait, median s: early start {wait['with']:.3f}, "
          f"none {wait['without']:.3f}")  # fmt: skip
    print(f"steady epochs' images/s, median: early start {rate['with']:,.0f}, "
          f"none {rate['without']:,.0f}, ratio {rate['with'] / rate['without']:.2f}")  # fmt: skip
    print(f"the whole run's wall s, median: early start {wall['with']:.2f}, "
          f"none {wall['without']:.2f}, ratio {wall['with'] / wall['without']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
