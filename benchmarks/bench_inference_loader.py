"""Benchmark: the data path of eval, predict and extract-features (and training's validation),
with 8-bit crops normalised where the model runs (now) against float32 crops normalised in the
loader workers (before: ToTensor + Normalize in each worker).

Both sides read the same photo-like JPEGs (`make_jpegs.py`) through the same Dataset, resize and
centre-crop them the same way, and end with the same float32 batch on --device, bit for bit. No
model runs: this is the rate a model could be fed at. Each figure is images per second over the
whole folder (best of --repeats, the sides taken in turns), with the bytes each batch carries
from the workers (through shared memory, then pinned memory on CUDA, then to the device).

    uv run python benchmarks/bench_inference_loader.py [--images 512] [--workers 2]
    python benchmarks/bench_inference_loader.py --device cuda --images 4096 --workers 14
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _loader(samples, preprocess, *, pixels: bool, workers: int, batch: int, device):
    import torch

    from torchkit.core.batches import collate_skipping_unreadable
    from torchkit.core.dataset import loader_context, make_dataset
    from torchkit.core.transforms import eval_transform

    return torch.utils.data.DataLoader(
        make_dataset(samples, eval_transform(preprocess, pixels=pixels)),
        batch_size=batch,
        num_workers=workers,
        collate_fn=collate_skipping_unreadable,
        pin_memory=device.type == "cuda",
        multiprocessing_context=loader_context() if workers > 0 else None,
    )


def _rate(loader, device, normalized) -> tuple[float, int]:
    """Images per second through the loader onto the device, and the bytes of one batch."""
    import torch

    from torchkit.core.decode import model_input

    start, count, batch_bytes = time.perf_counter(), 0, 0
    for batch in loader:
        images = model_input(batch.images, device, normalized)
        count += len(images)
        batch_bytes = max(batch_bytes, batch.images.numel() * batch.images.element_size())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return count / (time.perf_counter() - start), batch_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--size", type=int, default=224, help="crop size (resize: size / 0.875)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--data", help="a folder of JPEGs to read (default: make --images)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    import torch

    from torchkit.core.datasource.samples import Samples
    from torchkit.core.decode import NormalizedPixels
    from torchkit.core.preprocessing import Preprocess

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.data) if args.data else Path(scratch) / "jpegs"
        if not args.data:
            maker = Path(__file__).with_name("make_jpegs.py")
            subprocess.run([sys.executable, str(maker), str(root), str(args.images)], check=True)
        paths = sorted(str(p) for p in root.rglob("*.jpg"))
        samples = Samples(["all"], [0] * len(paths), paths=paths)
        preprocess = Preprocess(image_size=args.size, resize_size=round(args.size / 0.875))
        normalized = NormalizedPixels(preprocess.mean, preprocess.std)
        best: dict[str, tuple[float, int]] = {}
        for _ in range(args.repeats):
            for side, pixels in (("float32 in the workers", False), ("uint8, normalised", True)):
                loader = _loader(
                    samples,
                    preprocess,
                    pixels=pixels,
                    workers=args.workers,
                    batch=args.batch_size,
                    device=device,
                )
                rate, size = _rate(loader, device, normalized)
                if rate > best.get(side, (0.0, 0))[0]:
                    best[side] = (rate, size)
    before, now = best["float32 in the workers"], best["uint8, normalised"]
    print(
        f"{len(paths)} JPEGs, {args.size} px, batch {args.batch_size}, "
        f"{args.workers} workers, {device}"
    )
    for side, (rate, size) in best.items():
        print(f"  {side:24s} {rate:8,.0f} img/s   {size / 2**20:6.1f} MiB a batch")
    print(f"  ratio (uint8 / float32)  {now[0] / before[0]:8.2f}x")
    if args.json:
        figures = {
            "images_per_s": {side: rate for side, (rate, _) in best.items()},
            "batch_bytes": {side: size for side, (_, size) in best.items()},
        }
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
