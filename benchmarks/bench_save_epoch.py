"""Benchmark: the checkpoints of an epoch that was the best (best.pt and last.pt), written as
`train` writes them (`checkpoints.save_epoch`: serialized once, then copied in the kernel)
against one `save_checkpoint` per name (serialized twice, as before 2026-11-27's third
session), same run, in turns (which goes first alternates: each leaves dirty pages behind).

    uv run python benchmarks/bench_save_epoch.py [--model resnet50] [--repeat 3]

The checkpoint: the model's weights and an AdamW state for them (two more tensors a weight), as
a resnet50 run saves them: about 300 MB. On the H200 (2026-11-27) saving took 2.2-2.8 s of
resnet50's three epochs, as long as validation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a torchvision model name")
    parser.add_argument("--repeat", type=int, default=3, help="timed saves of each, in turns")
    args = parser.parse_args()
    import torch
    import torchvision

    from torchkit.core.models.checkpoint import save_checkpoint
    from torchkit.core.train.checkpoints import save_epoch

    model = getattr(torchvision.models, args.model)(num_classes=1000)
    weights = model.state_dict()
    state = {
        index: {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p), "step": 1}
        for index, p in enumerate(model.parameters())
    }
    checkpoint = {"epoch": 1, "model": weights, "optimizer": {"state": state}}
    size = sum(t.numel() * t.element_size() for t in weights.values()) * 3 / 2**20
    seconds: dict[str, list[float]] = {"once, copied": [], "twice": []}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as folder:
        run = Path(folder)
        for turn in range(args.repeat + 1):  # the first turn warms the page cache: not counted
            for side in ("once", "twice") if turn % 2 else ("twice", "once"):
                os.sync()  # each side starts with no dirty pages left by the other
                started = time.perf_counter()
                if side == "once":
                    save_epoch(run, checkpoint, is_best=True, save_every=0, keep=0)
                    copied = time.perf_counter() - started
                else:
                    save_checkpoint(checkpoint, run / "best.pt")
                    save_checkpoint(checkpoint, run / "last.pt")
                    twice = time.perf_counter() - started
            if turn:
                seconds["once, copied"].append(copied)
                seconds["twice"].append(twice)
    print(f"{args.model} checkpoint with an AdamW state: about {size:.0f} MB; best.pt and last.pt")
    for name, values in seconds.items():
        print(f"  {name:14s} median {statistics.median(values):6.2f} s   turns: "
              + ", ".join(f"{v:.2f}" for v in values))  # fmt: skip
    ratio = statistics.median(seconds["once, copied"]) / statistics.median(seconds["twice"])
    print(f"  ratio (torchkit / before): {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
