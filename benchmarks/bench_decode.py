"""Benchmark: decode-bound training on a JPEG folder, torchkit against timm's train.py data path.

The data: a folder of photo-like JPEGs (500x375 or 375x500, quality 90: a smooth random
background, a fine grain, and several shapes of the image's class: 10 classes, all symmetric
left-right so that flips keep the label), split train/val 90/10. Generated once per run, or kept
with --keep DIR.

The baseline is timm's `train.py` data path: `timm.data.create_dataset("", root, split="train")`
(PIL decodes every image whole) with `timm.data.create_transform(is_training=True)` (random
resized crop 8-100%, flip, to tensor, normalise; no colour jitter, auto-augment or random
erasing, bilinear), a DataLoader with the same batch size and workers (persistent), and the same
model, AdamW and plain cross-entropy. torchkit is `run_training` (what `torchkit train` runs) on
the same folder, timed by its recorded train images/s (the train pass of each epoch); its
`--decode exact` (every JPEG decoded whole, like timm) is timed too, to show what the reduced
decoding (`torchkit.core.data.decode`) brings by itself.

Figures, all in one run, taken in turns (timm, torchkit, torchkit exact, repeated), each turn
giving ratios of the best epoch after the first, the median over turns reported, so another job
loading the machine for a while skews no side:

1. data-loader images/s (iterating the train loader, no model): isolates decoding;
2. training images/s (forward, backward, step of a small model);
3. the pixels: the fast path's train crops against the exact path's for the same seeds, and the
   reductions it chose;
4. learning: final val top-1 of torchkit fast and exact, same seeds (--accuracy-epochs).

    uv run python benchmarks/bench_decode.py                     # 64 px, tiny convnet
    uv run python benchmarks/bench_decode.py --size 128 --model mobilenet_v3_small

The default model, `bench_decode:tiny_cnn` (three strided 3x3 convolutions of 8, 16 and 32
channels: about 0.35 ms of CPU a 64 px image for forward, backward and step), keeps training
decode-bound on a 2-core CPU, as a GPU keeps a real model; torchvision's small models
(mobilenet_v3_small, several ms an image on such a CPU) make it model-bound. The trainer runs
with one torch thread (--threads) on both sides: the workers decode on the same cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

SHAPES = (
    "disc",
    "square",
    "triangle",
    "triangle_down",
    "plus",
    "cross",
    "ring",
    "bar",
    "column",
    "diamond",
)


def tiny_cnn(num_classes: int = 10):
    """Three strided 3x3 convolutions, global pooling, a linear head: a model so cheap that
    training it on a CPU is bound by decoding images."""
    import torch.nn as nn

    def block(cin: int, cout: int) -> list:
        return [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True)]  # fmt: skip

    return nn.Sequential(
        *block(3, 8), *block(8, 16), *block(16, 32),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )  # fmt: skip


def _draw_shape(draw, kind: str, cx: float, cy: float, r: float, colour: tuple) -> None:
    """One shape of the class `kind`, centred at (cx, cy), radius r: all symmetric left-right."""
    t = r / 3  # stroke
    if kind == "disc":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif kind == "square":
        draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif kind == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=colour)
    elif kind == "triangle_down":
        draw.polygon([(cx, cy + r), (cx + r, cy - r), (cx - r, cy - r)], fill=colour)
    elif kind == "plus":
        draw.rectangle((cx - t, cy - r, cx + t, cy + r), fill=colour)
        draw.rectangle((cx - r, cy - t, cx + r, cy + t), fill=colour)
    elif kind == "cross":
        draw.line((cx - r, cy - r, cx + r, cy + r), fill=colour, width=int(2 * t))
        draw.line((cx - r, cy + r, cx + r, cy - r), fill=colour, width=int(2 * t))
    elif kind == "ring":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=colour, width=int(t))
    elif kind == "bar":
        draw.rectangle((cx - r, cy - t, cx + r, cy + t), fill=colour)
    elif kind == "column":
        draw.rectangle((cx - t, cy - r, cx + t, cy + r), fill=colour)
    else:  # diamond
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=colour)


def make_jpeg_folder(root: Path, images: int, *, classes: int = 10, seed: int = 0) -> None:
    """ROOT/train and ROOT/val (10%) of photo-like JPEGs, 500x375 or 375x500, quality 90."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    grain = rng.normal(0, 5, (600, 600, 3)).astype(np.int16)  # cropped at random per image
    for index in range(images):
        label = index % classes
        split = "val" if (index // classes) % 10 == 0 else "train"
        folder = root / split / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        width, height = (500, 375) if rng.random() < 0.7 else (375, 500)
        coarse = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((width, height), Image.BICUBIC)
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(5, 10))):
            r = float(rng.uniform(18, 48))
            cx, cy = float(rng.uniform(r, width - r)), float(rng.uniform(r, height - r))
            colour = tuple(int(v) for v in rng.integers(0, 256, 3))
            _draw_shape(draw, SHAPES[label], cx, cy, r, colour)
        image = image.filter(ImageFilter.BoxBlur(1))  # soft edges, as a lens gives
        y, x = rng.integers(0, 600 - height + 1), rng.integers(0, 600 - width + 1)
        pixels = np.asarray(image, dtype=np.int16) + grain[y : y + height, x : x + width]
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
            folder / f"img_{index:05d}.jpg", quality=90
        )


def train_config(**options):
    from torchkit.core.train import TrainConfig

    return TrainConfig(**options)


def timm_loader(root: Path, size: int, batch_size: int, workers: int):
    """timm's train.py data path on ROOT/train."""
    import torch
    from timm.data import create_dataset, create_transform

    dataset = create_dataset("", root=str(root), split="train", is_training=True)
    dataset.transform = create_transform(
        input_size=size, is_training=True, color_jitter=None, auto_augment=None, re_prob=0.0,
        interpolation="bilinear", hflip=0.5, scale=(0.08, 1.0),
    )  # fmt: skip
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
        persistent_workers=workers > 0,
    )  # fmt: skip


def torchkit_loaders(config):
    from torchkit.core.train.loaders import build_loaders, load_splits, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    config = resolve_defaults(config, is_digits=False)
    data = load_splits(config)
    return build_loaders(data.splits, preprocess_for(config), config)


def loader_rate_timm(root: Path, args) -> float:
    loader = timm_loader(root, args.size, args.batch_size, args.workers)
    rates = []
    for _ in range(args.epochs):
        start, seen = time.perf_counter(), 0
        for images, _labels in loader:
            seen += images.shape[0]
        rates.append(seen / (time.perf_counter() - start))
    del loader
    return max(rates[1:] or rates)


def loader_rate_torchkit(config, args) -> float:
    loaders = torchkit_loaders(config)
    rates = []
    try:
        for epoch in range(args.epochs):
            loaders.train_sampler.set_epoch(epoch)
            start, seen = time.perf_counter(), 0
            for batch in loaders.train:
                seen += batch.images.shape[0]
            rates.append(seen / (time.perf_counter() - start))
    finally:
        loaders.close()
    return max(rates[1:] or rates)


def train_rate_timm(root: Path, args) -> float:
    """timm's data path under the classic loop: forward, loss, zero_grad, backward, step."""
    import torch

    from torchkit.core.models import build_model

    loader = timm_loader(root, args.size, args.batch_size, args.workers)
    torch.manual_seed(0)
    model = build_model(args.model, 10, image_size=args.size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    criterion = torch.nn.CrossEntropyLoss()
    rates = []
    for _ in range(args.epochs):
        model.train()
        start, seen = time.perf_counter(), 0
        for images, labels in loader:
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += labels.shape[0]
        rates.append(seen / (time.perf_counter() - start))
    del loader
    return max(rates[1:] or rates)


def train_run(config):
    from torchkit.core.train import run_training

    result = run_training(config)
    shutil.rmtree(config.out, ignore_errors=True)
    return result


def train_rate_torchkit(config) -> float:
    """Best recorded train images/s (metrics.csv's images_per_s) after the first epoch."""
    rows = train_run(config).history
    return max(row["images_per_s"] for row in rows[1:] or rows)


def in_turns(label: str, contenders: dict, repeat: int) -> None:
    """Run each contender once per turn, in order; print rates and ratios to the first."""
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, measure in contenders.items():
            rates[name].append(measure())
    names = list(contenders)
    base = names[0]
    print(f"\n{label} ({repeat} turns; best epoch after the first; load {_load()})")
    for name in names:
        print(f"  {name:26s} median {statistics.median(rates[name]):7.0f} images/s   turns: "
              + ", ".join(f"{r:.0f}" for r in rates[name]))  # fmt: skip
    for name in names[1:]:
        ratios = sorted(o / t for o, t in zip(rates[name], rates[base], strict=True))
        print(f"  ratio {name} / {base}: median {statistics.median(ratios):.2f}  (per turn: "
              + ", ".join(f"{r:.2f}" for r in ratios) + ")", flush=True)  # fmt: skip


def compare_pixels(root: Path, size: int, count: int = 200) -> None:
    """The fast path's train crops against the exact path's, same seed per image."""
    import numpy as np
    import torch

    from torchkit.core.data.dataset import make_dataset
    from torchkit.core.data.decode import ReducedDecodeCrop
    from torchkit.core.data.preprocessing import IMAGENET_STD, Preprocess
    from torchkit.core.data.sources.discovery import discover_image_folder
    from torchkit.core.data.transforms import train_transform

    samples = discover_image_folder(root / "train")
    samples = samples.subset(range(0, len(samples), max(1, len(samples) // count)))
    preprocess = Preprocess(image_size=size, resize_size=round(size / 0.875))
    outputs = {}
    for decode in ("exact", "fast"):
        dataset = make_dataset(samples, train_transform(preprocess, decode=decode))
        items = []
        for index in range(len(samples)):
            torch.manual_seed(index)
            items.append(dataset[index][0])
        outputs[decode] = torch.stack(items)
    scale = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255  # back to 8-bit steps
    difference = ((outputs["fast"] - outputs["exact"]) * scale).abs()
    mse = float((difference**2).mean())
    crop = ReducedDecodeCrop(size)
    reductions = []
    for index, path in enumerate(samples.paths):
        torch.manual_seed(index)
        reductions.append(crop.decode(path, "RGB")[2])
    counts = {k: int(np.sum(np.array(reductions) == k)) for k in (1, 2, 4, 8)}
    print(
        f"\npixels: fast vs exact train crops of {len(samples)} images at {size} px, same "
        f"seeds: mean |difference| {float(difference.mean()):.2f} of 255, 99th percentile "
        f"{float(difference.flatten().quantile(0.99)):.1f}, PSNR "
        f"{10 * np.log10(255**2 / max(mse, 1e-12)):.1f} dB; decoded at 1/1, 1/2, 1/4, 1/8: "
        + ", ".join(str(counts[k]) for k in (1, 2, 4, 8)),
        flush=True,
    )


def compare_learning(root: Path, args, work: Path) -> None:
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"\nlearning: val top-1 after {args.accuracy_epochs} epochs (last epoch, best epoch)")
    finals: dict[str, list[float]] = {"fast": [], "exact": []}
    for seed in seeds:
        for decode in ("fast", "exact"):
            config = _config(root, args, work / f"acc-{decode}-{seed}", decode)
            config = dataclasses.replace(config, epochs=args.accuracy_epochs, seed=seed)
            result = train_run(config)
            last = result.history[-1]["val_top1"]
            finals[decode].append(last)
            print(f"  seed {seed} {decode:5s}: {last:.3f} (best {result.best_val_top1:.3f})",
                  flush=True)  # fmt: skip
    for decode, values in finals.items():
        print(f"  {decode:5s} mean of last-epoch val top-1: {statistics.mean(values):.3f}")


def _config(root: Path, args, out: Path, decode: str):
    return train_config(
        data=str(root), model=args.model, image_size=args.size, epochs=args.epochs,
        batch_size=args.batch_size, workers=args.workers, label_smoothing=0.0, lr=3e-3,
        device="cpu", out=str(out), force=True, decode=decode,
    )  # fmt: skip


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64, help="--image-size")
    parser.add_argument("--model", default="bench_decode:tiny_cnn")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3, help="per timed run")
    parser.add_argument("--repeat", type=int, default=3, help="turns")
    parser.add_argument("--accuracy-epochs", type=int, default=10, help="0: skip")
    parser.add_argument("--seeds", default="0,1", help="of the learning comparison")
    parser.add_argument("--skip", default="", help="comma-separated: loader,train,pixels")
    parser.add_argument("--keep", type=Path, help="generate the JPEGs here once, reuse them")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the trainer")
    args = parser.parse_args()

    import torch

    # Both sides train with the same intra-op threads. One by default: the workers decode on
    # the same cores, and OpenMP threads that wait on busy cores slow a step down many times.
    torch.set_num_threads(args.threads)

    work = Path(tempfile.mkdtemp(prefix="tk-bench-decode-"))
    root = args.keep or work / "jpegs"
    if not (root / "train").is_dir():
        started = time.perf_counter()
        make_jpeg_folder(root, args.images)
        print(f"generated {args.images} JPEGs in {time.perf_counter() - started:.0f} s")
    skip = set(args.skip.split(","))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"load {_load()}; {args.images} JPEGs ~500x375 q90, --image-size {args.size}, "
        f"model {args.model}, batch {args.batch_size}, {args.workers} workers"
    )
    try:
        if "loader" not in skip:
            in_turns(
                "data loader only (train split, no model)",
                {
                    "timm train.py data path": lambda: loader_rate_timm(root, args),
                    "torchkit (fast decode)": lambda: loader_rate_torchkit(
                        _config(root, args, work / "x", "fast"), args
                    ),
                    "torchkit --decode exact": lambda: loader_rate_torchkit(
                        _config(root, args, work / "x", "exact"), args
                    ),
                },
                args.repeat,
            )
        if "train" not in skip:
            in_turns(
                f"training ({args.model})",
                {
                    "timm train.py data path": lambda: train_rate_timm(root, args),
                    "torchkit train": lambda: train_rate_torchkit(
                        _config(root, args, work / "run", "fast")
                    ),
                    "torchkit --decode exact": lambda: train_rate_torchkit(
                        _config(root, args, work / "run", "exact")
                    ),
                },
                args.repeat,
            )
        if "pixels" not in skip:
            compare_pixels(root, args.size)
        if args.accuracy_epochs > 0:
            compare_learning(root, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
