"""Benchmark: the device path's crop and resize (`core.crop_resize`), image by image
(F.interpolate with antialiasing, what the device path did before) against the whole batch at
once (two batched products, the default on CUDA), on the same decoded images, boxes and flips.

Two figures per side, in milliseconds per batch (median of --turns, the sides taken in turns):
- host: until the call returns, which is what the loop's host pays; on a GPU the steps' own
  launches wait behind it, so it is what bounds a launch-bound training run;
- done: until the device has finished too (the same as host on a CPU).

    uv run python benchmarks/bench_crop_resize.py                 # CPU: tiny crops, then 224 px
    python benchmarks/bench_crop_resize.py --device cuda          # 256 crops of 500x375 to 224

`benchmarks/gpu_check.sh` runs it and puts the host figures in its table (`--json FILE`).

The tiny case (12x16 images, 4 px crops) leaves the CPU almost no arithmetic: it measures what
each way costs the host in operators, as a GPU's host pays for them. With real sizes a CPU does
the arithmetic itself, where the batched products' dense matrices are many times the work of the
per-image filter: the reason the CPU keeps the per-image way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _batch(count: int, height: int, width: int, device):
    """Random images and RandomResizedCrop's boxes and flips for them, seeded."""
    import torch
    from torchvision.transforms import RandomResizedCrop

    torch.manual_seed(0)
    images, boxes, flips = [], [], []
    for at in range(count):
        # Photos come in both orientations.
        shape = (3, height, width) if at % 2 == 0 else (3, width, height)
        image = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
        images.append(image)
        boxes.append(tuple(RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3])))
        flips.append(bool(torch.rand(1) < 0.5))
    return images, boxes, flips


def _timed(images, boxes, flips, size, batched, device) -> tuple[float, float]:
    import torch

    from torchkit.core.data.crop_resize import resize_crops

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    resize_crops(images, boxes, flips, size, "bilinear", batched=batched)
    host = time.perf_counter() - start
    if cuda:
        torch.cuda.synchronize(device)
    return host * 1000, (time.perf_counter() - start) * 1000


def run_case(name, count, height, width, size, device, turns) -> dict:
    images, boxes, flips = _batch(count, height, width, device)
    figures = {False: ([], []), True: ([], [])}
    for batched in (False, True):  # warm-up: first calls allocate, load kernels
        _timed(images, boxes, flips, size, batched, device)
    for _ in range(turns):
        for batched in (False, True):
            host, done = _timed(images, boxes, flips, size, batched, device)
            figures[batched][0].append(host)
            figures[batched][1].append(done)
    per_image = [statistics.median(values) for values in figures[False]]
    batched = [statistics.median(values) for values in figures[True]]
    print(f"{name}: {count} images {height}x{width} and {width}x{height}, crops to {size} px")
    for label, index in (("host", 0), ("done", 1)):
        print(
            f"  {label}: per-image {per_image[index]:8.2f} ms  batched {batched[index]:8.2f} ms  "
            f"per-image / batched {per_image[index] / batched[index]:5.2f}x"
        )
    return {
        "name": name,
        "images": count,
        "size": size,
        "per_image_host_ms": per_image[0],
        "batched_host_ms": batched[0],
        "per_image_done_ms": per_image[1],
        "batched_done_ms": batched[1],
    }


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, device {device}, {args.threads} CPU thread(s)")
    if device.type == "cpu":
        cases = [
            run_case("tiny", args.batch_size, 12, 16, 4, device, args.turns),
            run_case("real", 32, 375, 500, 224, device, max(3, args.turns // 2)),
        ]
    else:
        cases = [run_case("real", args.batch_size, 375, 500, 224, device, args.turns)]
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": str(device), "cases": cases}, handle, indent=1)


if __name__ == "__main__":
    main()
