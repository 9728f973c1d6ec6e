"""Benchmark: the train data path with JPEGs decoded on the device (`--decode device`) against
the fast path (`--decode fast`: PIL in the loader workers, reduced DCT), on the same JPEGs.

The data: photo-like JPEGs (500x375 or 375x500, quality 90; `bench_decode.make_jpeg_folder`),
generated once per run, or kept with --keep DIR. Both sides are torchkit's own train loader
(`build_loaders`: the same sampler, seeds, workers and batch size) and what the training loop
does with each batch before the model: the fast path copies the uint8 crops to the device
(`non_blocking`) and normalises them there; the device path decodes the batch's bytes on the
device (`core.device_decode.decoded_batch`: one batched decode_jpeg, then crop, resize, flip),
then normalises. No model: this is the data path alone, which bounds a training run's rate.

Figures: images/s of each side (the best epoch after the first, the median over turns taken in
turns, so a busy machine skews neither) and the ratio device / fast.

    uv run python benchmarks/bench_device_decode.py                      # CPU, 64 px
    uv run python benchmarks/bench_device_decode.py --device cuda --size 224 --workers 8
    ... --cpu-share 0.35     # and the device path with a share decoded by the workers
    ... --ahead              # and decoded ahead in the decoding threads (as training does)

On a CPU the device path decodes every JPEG whole, in the main process: expect it slower than
the fast path there (that is why `--decode auto` keeps `fast` on CPUs). On a GPU, nvJPEG decodes
the batch while the workers only read files and draw crops.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decode import make_jpeg_folder  # noqa: E402


def _loaders(root: Path, args, decode: str, device, share: float = 0.0):
    from torchkit.core.train import TrainConfig
    from torchkit.core.train.loaders import build_loaders, load_splits, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    config = resolve_defaults(
        TrainConfig(data=str(root), image_size=args.size, batch_size=args.batch_size,
                    workers=args.workers, decode=decode, decode_cpu_share=share, seed=0),
        is_digits=False,
    )  # fmt: skip
    data = load_splits(config)
    return build_loaders(
        data.splits, preprocess_for(config), config, pin_memory=device.type == "cuda"
    ), config


def rate(root: Path, args, decode: str, device, share: float = 0.0, ahead: bool = False) -> float:
    """Best images/s of the train loader's epochs after the first, each batch taken to the
    device as the training loop takes it (decoded there for `device`: in this loop, or with
    `ahead` in the decoding threads, `DecodedAhead`, as training on a GPU decodes),
    normalised."""
    import torch

    from torchkit.core.data.decode import NormalizedPixels
    from torchkit.core.data.decode_ahead import DecodedAhead
    from torchkit.core.data.device_decode import decoded_batch

    loaders, config = _loaders(root, args, decode, device, share)
    normalized = NormalizedPixels(config.mean, config.std)
    rates = []
    try:
        for epoch in range(args.epochs):
            loaders.train_sampler.set_epoch(epoch)
            start, seen = time.perf_counter(), 0
            if ahead:
                batches = DecodedAhead(loaders.train, device)
            else:
                batches = (decoded_batch(batch, device) for batch in loaders.train)
            for batch in batches:
                if batch.images is None:
                    continue
                images = normalized(batch.images.to(device, non_blocking=True))
                batch.labels.to(device, non_blocking=True)
                seen += images.shape[0]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            rates.append(seen / (time.perf_counter() - start))
    finally:
        loaders.close()
    return max(rates[1:] or rates)


def pixels(root: Path, args, device, count: int = 64) -> None:
    """The device path's crops against the exact PIL path's (same seeds): 8-bit levels."""
    import torch

    from torchkit.core.data.dataset import make_dataset
    from torchkit.core.data.device_decode import collate_encoded, decoded_batch
    from torchkit.core.data.preprocessing import Preprocess
    from torchkit.core.data.sources.discovery import discover_image_folder
    from torchkit.core.data.transforms import train_transform as transform_for

    samples = discover_image_folder(root / "train")
    samples = samples.subset(range(0, len(samples), max(1, len(samples) // count)))
    preprocess = Preprocess(image_size=args.size, resize_size=round(args.size / 0.875))
    crops = {}
    for decode in ("exact", "device"):
        dataset = make_dataset(samples, transform_for(preprocess, decode=decode), pixels=True)
        items = []
        for index in range(len(samples)):
            torch.manual_seed(index)
            items.append(dataset[index])
        if decode == "device":
            crops[decode] = decoded_batch(collate_encoded(items), device).images.cpu()
        else:  # uint8 crops: ToTensor + Normalize undone exactly by the pixel path
            crops[decode] = torch.stack([_pixels(item[0], preprocess) for item in items])
    levels = (crops["device"].float() - crops["exact"].float()).abs()
    print(
        f"\npixels: device ({device.type}) vs exact PIL crops of {len(samples)} images at "
        f"{args.size} px, same seeds: max {float(levels.max()):.0f}, mean "
        f"{float(levels.mean()):.3f} levels of 255",
        flush=True,
    )


def _pixels(tensor, preprocess):
    """A normalised (C, H, W) tensor back to its 8-bit pixels."""
    import torch

    mean = torch.tensor(preprocess.mean).view(-1, 1, 1)
    std = torch.tensor(preprocess.std).view(-1, 1, 1)
    return ((tensor * std + mean) * 255).round().clamp(0, 255).to(torch.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--size", type=int, default=64, help="--image-size")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3, help="per timed run (first: warm-up)")
    parser.add_argument("--repeat", type=int, default=3, help="turns")
    parser.add_argument("--keep", type=Path, help="generate the JPEGs here once, reuse them")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, main process")
    parser.add_argument(
        "--cpu-share", type=float, default=0.0, help="also time --decode-cpu-share F (device)"
    )
    parser.add_argument(
        "--ahead",
        action="store_true",
        help="also time the device path decoded ahead in the decoding threads (DecodedAhead)",
    )
    parser.add_argument("--json", help="also write the median images/s to this file")
    parser.add_argument("--no-pixels", action="store_true", help="skip the pixel comparison")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    work = Path(tempfile.mkdtemp(prefix="tk-bench-device-decode-"))
    root = args.keep or work / "jpegs"
    try:
        if not (root / "train").is_dir():
            started = time.perf_counter()
            make_jpeg_folder(root, args.images)
            print(f"generated {args.images} JPEGs in {time.perf_counter() - started:.0f} s")
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        load = f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"
        print(
            f"torch {torch.__version__}, device {device} ({name}), {os.cpu_count()} CPUs, "
            f"load {load}; {args.images} JPEGs ~500x375 q90 (train split), --image-size "
            f"{args.size}, batch {args.batch_size}, {args.workers} workers, "
            f"{torch.get_num_threads()} main-process threads"
        )
        sides = {"fast": ("fast", 0.0, False), "device": ("device", 0.0, False)}
        if args.cpu_share > 0:
            share_side = f"device, --decode-cpu-share {args.cpu_share:g}"
            sides[share_side] = ("device", args.cpu_share, False)
        if args.ahead:
            sides["device, ahead"] = ("device", 0.0, True)
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.repeat):
            for name, (decode, share, ahead) in sides.items():
                rates[name].append(rate(root, args, decode, device, share, ahead))
        print(f"\ntrain data path to {device} ({args.repeat} turns, best epoch after the first)")
        for name, values in rates.items():
            print(f"  --decode {name:26s} median {statistics.median(values):7.0f} images/s   "
                  "turns: " + ", ".join(f"{v:.0f}" for v in values))  # fmt: skip
        pairs = [(name, "fast") for name in list(rates)[1:]]
        if args.ahead:
            pairs.append(("device, ahead", "device"))
        for name, against in pairs:
            ratios = sorted(d / f for d, f in zip(rates[name], rates[against], strict=True))
            print(
                f"  ratio {name} / {against}: median {statistics.median(ratios):.2f}  (per "
                "turn: " + ", ".join(f"{r:.2f}" for r in ratios) + ")",
                flush=True,
            )
        if args.json:
            medians = {name: statistics.median(values) for name, values in rates.items()}
            with open(args.json, "w") as handle:
                json.dump({"device": str(device), "images_per_s": medians}, handle, indent=1)
        if not args.no_pixels:
            pixels(root, args, device)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
