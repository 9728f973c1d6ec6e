"""Benchmark: the data path of eval, predict and extract-features (and training's validation),
with 8-bit crops normalised where the model runs (now) against float32 crops normalised in the
loader workers (before: ToTensor + Normalize in each worker), and with `--decode device` (the
workers pass the JPEGs' bytes; the main process decodes, resizes and crops them on --device).

All sides read the same photo-like JPEGs (`make_jpegs.py`) through the same Dataset, resize and
centre-crop them the same way, and end with the same float32 batch on --device (bit for bit;
--decode device within its tolerance). No
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


SIDES = {  # what the workers give: float32 crops, 8-bit crops, JPEG bytes (--decode device)
    "float32 in the workers": "float",
    "uint8, normalised": "pixels",
    "--decode device": "device",
}


def _loader(samples, preprocess, *, side: str, workers: int, batch: int, device):
    import torch

    from torchkit.core.data.batches import collate_skipping_unreadable
    from torchkit.core.data.dataset import loader_context, make_dataset
    from torchkit.core.data.device_decode import collate_encoded
    from torchkit.core.data.transforms import eval_transform

    if side == "device":
        transform = eval_transform(preprocess, pixels=True, decode="device")
        collate = collate_encoded
    else:
        transform = eval_transform(preprocess, pixels=side == "pixels")
        collate = collate_skipping_unreadable
    return torch.utils.data.DataLoader(
        make_dataset(samples, transform, pixels=True),
        batch_size=batch,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=device.type == "cuda",
        multiprocessing_context=loader_context() if workers > 0 else None,
    )


def _rate(loader, device, normalized) -> tuple[float, int]:
    """Images per second through the loader onto the device, and the bytes of one batch."""
    import torch

    from torchkit.core.data.decode import model_input
    from torchkit.core.data.device_decode import EncodedImages, decoded_batch

    start, count, batch_bytes = time.perf_counter(), 0, 0
    for batch in loader:
        shared = batch.images
        if isinstance(shared, EncodedImages):  # the JPEGs' bytes, and any 8-bit crops
            size = shared.data.numel() + (0 if shared.pixels is None else shared.pixels.numel())
        else:
            size = shared.numel() * shared.element_size()
        batch_bytes = max(batch_bytes, size)
        images = model_input(decoded_batch(batch, device).images, device, normalized)
        count += len(images)
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

    from torchkit.core.data.decode import NormalizedPixels
    from torchkit.core.data.preprocessing import Preprocess
    from torchkit.core.data.sources.samples import Samples

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
            for side, kind in SIDES.items():
                loader = _loader(
                    samples,
                    preprocess,
                    side=kind,
                    workers=args.workers,
                    batch=args.batch_size,
                    device=device,
                )
                rate, size = _rate(loader, device, normalized)
                if rate > best.get(side, (0.0, 0))[0]:
                    best[side] = (rate, size)
    before, now, device_side = (best[side] for side in SIDES)
    print(
        f"{len(paths)} JPEGs, {args.size} px, batch {args.batch_size}, "
        f"{args.workers} workers, {device}"
    )
    for side, (rate, size) in best.items():
        print(f"  {side:24s} {rate:8,.0f} img/s   {size / 2**20:6.1f} MiB a batch")
    print(f"  ratio (uint8 / float32)  {now[0] / before[0]:8.2f}x")
    print(f"  ratio (device / uint8)   {device_side[0] / now[0]:8.2f}x")
    if args.json:
        figures = {
            "images_per_s": {side: rate for side, (rate, _) in best.items()},
            "batch_bytes": {side: size for side, (_, size) in best.items()},
        }
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
