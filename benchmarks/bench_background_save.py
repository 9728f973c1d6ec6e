"""Benchmark: an epoch's checkpoints written on the writer thread while the next epoch trains
(`core.train.checkpoint_writer`) against writing them before it starts (synchronously, as
before 2026-11-29), same run, in turns.

    uv run python benchmarks/bench_background_save.py [--model resnet50] [--turns 3]
                                                      [--digits-turns 3] [--work-s 3]

1. A --model sized checkpoint (weights and an AdamW state, as bench_save_epoch.py builds it:
   about 300 MB for resnet50) saved as best.pt and last.pt, followed by --work-s seconds of
   "next epoch" (matrix products on one torch thread, which release the GIL as training does):
   the main thread's time (snapshot and hand-over, or the whole save) and the wall time of save
   plus work. Also what the snapshot costs each way: CPU tensors cloned, or the checkpoint
   serialised to bytes in the main thread.
2. `torchkit train --data digits -v` (25 epochs, one process each, sides alternating): the
   epochs' wall time and their 'saving' figure (the main thread's time on the epochs' files)
   from `-v`'s last line, and the run's total.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIDES = ("synchronous", "background")
SYNCHRONOUS = "import torchkit.core.train.checkpoint_writer as w; w.BACKGROUND = False"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a torchvision model name")
    parser.add_argument("--turns", type=int, default=3, help="timed saves of each side")
    parser.add_argument("--work-s", type=float, default=3.0, help="the next epoch's seconds")
    parser.add_argument("--digits-turns", type=int, default=3, help="digits runs of each side")
    args = parser.parse_args()
    if args.turns:
        checkpoint_through_the_writer(args)
    if args.digits_turns:
        digits_runs(args.digits_turns)
    return 0


def model_checkpoint(name: str) -> tuple[dict, float]:
    """The weights of torchvision model `name` and an AdamW state for them (two more tensors a
    weight, and a step), as a run saves them; and its size in MB."""
    import torch
    import torchvision

    model = getattr(torchvision.models, name)(num_classes=1000)
    weights = model.state_dict()
    state = {
        index: {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p),
                "step": torch.tensor(1.0)}
        for index, p in enumerate(model.parameters())
    }  # fmt: skip
    checkpoint = {"epoch": 1, "model": weights, "optimizer": {"state": state}}
    size = sum(t.numel() * t.element_size() for t in weights.values()) * 3 / 2**20
    return checkpoint, size


def next_epoch(seconds: float) -> None:
    """`seconds` of matrix products on this thread (torch releases the GIL in them)."""
    import torch

    a = torch.randn(512, 512)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = torch.tanh(a @ a)


def checkpoint_through_the_writer(args: argparse.Namespace) -> None:
    import torch

    from torchkit.core.models.checkpoint import on_cpu
    from torchkit.core.train import checkpoint_writer
    from torchkit.core.train.checkpoints import save_epoch

    torch.set_num_threads(1)  # the digits job's one torch thread: the writer has a core
    checkpoint, size = model_checkpoint(args.model)
    snapshot_s: dict[str, list[float]] = {"clone CPU tensors": [], "serialise to bytes": []}
    main_s: dict[str, list[float]] = {side: [] for side in SIDES}
    wall_s: dict[str, list[float]] = {side: [] for side in SIDES}
    writer = checkpoint_writer.CheckpointWriter()
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as folder:
        run = Path(folder)
        for turn in range(args.turns + 1):  # the first turn warms up: not counted
            for side in SIDES if turn % 2 else SIDES[::-1]:
                os.sync()  # each side starts with no dirty pages left by the other
                started = time.perf_counter()
                if side == "background":
                    snapshot = on_cpu(checkpoint, copy=True)
                    writer.submit(
                        lambda s=snapshot: save_epoch(run, s, is_best=True, save_every=0, keep=0)
                    )
                else:
                    save_epoch(run, checkpoint, is_best=True, save_every=0, keep=0)
                handed_over = time.perf_counter()
                next_epoch(args.work_s)
                writer.wait()
                if turn:
                    main_s[side].append(handed_over - started)
                    wall_s[side].append(time.perf_counter() - started)
            if turn:
                started = time.perf_counter()
                on_cpu(checkpoint, copy=True)
                snapshot_s["clone CPU tensors"].append(time.perf_counter() - started)
                started = time.perf_counter()
                torch.save(checkpoint, io.BytesIO())
                snapshot_s["serialise to bytes"].append(time.perf_counter() - started)
    print(f"{args.model} checkpoint with an AdamW state: about {size:.0f} MB; best.pt and "
          f"last.pt, then {args.work_s:.1f} s of next epoch on one torch thread")  # fmt: skip
    for side in SIDES:
        print(f"  {side:12s} main thread median {statistics.median(main_s[side]):6.2f} s, "
              f"save + next epoch median {statistics.median(wall_s[side]):6.2f} s   turns: "
              + ", ".join(f"{v:.2f}" for v in wall_s[side]))  # fmt: skip
    ratio = statistics.median(wall_s["background"]) / statistics.median(wall_s["synchronous"])
    print(f"  ratio (background / synchronous, wall): {ratio:.2f}")
    for name, values in snapshot_s.items():
        print(f"  snapshot by {name:19s} median {statistics.median(values):6.3f} s")


RUN_LINE = re.compile(r"run: ([\d.]+) s since.* (\d+) epochs ([\d.]+) s \(.*saving ([\d.]+) s")


def digits_runs(turns: int) -> None:
    """`train --data digits -v` in turns, each side in a fresh process."""
    found: dict[str, list[tuple[float, float, float]]] = {side: [] for side in SIDES}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = "from torchkit.cli import main; sys.argv[0] = 'torchkit'; main()"
    with tempfile.TemporaryDirectory() as work:
        for turn in range(turns):
            for side in SIDES if turn % 2 else SIDES[::-1]:
                code = (
                    f"import sys; {SYNCHRONOUS}; {cli}"
                    if side == SIDES[0]
                    else f"import sys; {cli}"
                )
                command = ["train", "--data", "digits", "-v", "--out", f"{work}/{side}", "--force"]
                done = subprocess.run([sys.executable, "-c", code, *command], capture_output=True,
                                      text=True, env=env, timeout=900)  # fmt: skip
                match = RUN_LINE.search(done.stderr)
                if done.returncode != 0 or match is None:
                    sys.exit(f"{side} failed:\n{done.stderr[-2000:]}")
                total, epochs, saving = (float(match.group(i)) for i in (1, 3, 4))
                found[side].append((epochs, saving, total))
    print(f"train --data digits -v, 25 epochs, {turns} runs a side (median)")
    for side in SIDES:
        epochs, saving, total = (statistics.median(v) for v in zip(*found[side], strict=True))
        print(f"  {side:12s} epochs {epochs:6.2f} s, saving {saving:5.2f} s, run {total:6.2f} s"
              "   runs: " + ", ".join(f"{e:.2f}/{s:.2f}" for e, s, _ in found[side]))  # fmt: skip
    ratio = statistics.median(e for e, _, _ in found["background"]) / statistics.median(
        e for e, _, _ in found["synchronous"]
    )
    print(f"  ratio (background / synchronous, epochs' wall): {ratio:.2f}")


if __name__ == "__main__":
    sys.exit(main())
