"""Benchmark: `torchkit train` against a minimal hand-written PyTorch loop, in the same run.

The baseline is the classic loop: a torchvision `ImageFolder` (or, for digits, a ten-line
Dataset) with the same transforms, a `DataLoader` (shuffle, same batch size and workers,
persistent workers, pinned memory on CUDA), then forward, loss, zero_grad, backward, step. Both
train the same model on the same images with the same batch size; both are timed on the training
pass only (torchkit's `epoch_time_s`, which leaves out its validation pass), epoch 1 left out as
warm-up, with the same loss (plain cross-entropy: torchkit's default label smoothing is turned
off here, as is the weight average digits train with by default). They run in turns (baseline
then torchkit, repeated), each turn gives the ratio of the two best epoch rates, and the median
over turns is reported, so another job loading a shared machine for a while skews neither side.

    uv run python benchmarks/bench_train.py                      # digits and a PNG folder
    uv run python benchmarks/bench_train.py --target --seeds 0,1,2  # + the README main job
    uv run python benchmarks/bench_train.py --data folder --device cuda --model resnet50 \\
        --size 224 --images 5000 --amp --channels-last              # GPU: AMP vs plain fp32

`--target` also runs `torchkit train` with its defaults (digits) as a real process per seed and
prints wall time, CPU time (user + system of the process tree) and the test accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_png_folder(root: Path, images: int, size: int, classes: int = 10) -> None:
    """ROOT/train and ROOT/val (10%) of `images` random RGB PNGs, `size` pixels square."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for index in range(images):
        split = "val" if (index // classes) % 10 == 0 else "train"
        folder = root / split / f"class_{index % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 256, (1, 1, 3))  # a colour per image, plus noise
        pixels = np.clip(base + rng.normal(0, 40, (size, size, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"img_{index:06d}.png")


def torchkit_rate(config) -> float:
    """Best training images/s over the epochs after the first."""
    from torchkit.core.train import run_training

    result = run_training(config)
    rows = result.history[1:] or result.history
    return max(row["images_per_s"] for row in rows)


def baseline_rate(config, device_name: str) -> float:
    """The classic loop on the same data, model, transforms, batch size and workers."""
    import torch
    import torchvision
    from PIL import Image

    from torchkit.core.data.sources.digits import digits_splits
    from torchkit.core.data.transforms import train_transform
    from torchkit.core.models import build_model
    from torchkit.core.train.loaders import default_workers_for, preprocess_for
    from torchkit.core.train.validation import resolve_defaults

    config = resolve_defaults(config, is_digits=config.data == "digits")
    device = torch.device(device_name)
    transform = train_transform(
        preprocess_for(config), flip=bool(config.flip), crop_scale=tuple(config.crop_scale)
    )
    if config.data == "digits":
        train = digits_splits()["train"]

        class Digits(torch.utils.data.Dataset):
            def __len__(self):
                return len(train)

            def __getitem__(self, i):
                image = Image.fromarray(train.images[i]).convert("RGB")
                return transform(image), train.labels[i]

        dataset = Digits()
    else:
        dataset = torchvision.datasets.ImageFolder(str(Path(config.data) / "train"), transform)
    workers = config.workers if config.workers is not None else default_workers_for(config.data)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=config.batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=device.type == "cuda",
    )
    torch.manual_seed(config.seed)
    model = build_model(config.model, 10, image_size=config.image_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    criterion = torch.nn.CrossEntropyLoss()
    rates = []
    for _ in range(config.epochs):
        model.train()
        start, seen = time.perf_counter(), 0
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += labels.shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize()
        rates.append(seen / (time.perf_counter() - start))
    return max(rates[1:] or rates)


def compare(label: str, config, device: str, repeat: int, work: Path) -> float:
    import dataclasses

    ours, theirs = [], []
    for turn in range(repeat):
        theirs.append(baseline_rate(config, device))
        out = work / f"run-{label}-{turn}"
        ours.append(torchkit_rate(dataclasses.replace(config, out=str(out), force=True)))
        shutil.rmtree(out, ignore_errors=True)
    # Each turn runs the loop then torchkit back to back: the ratio of a turn compares them under
    # the same load, and the median over turns drops the turns another job disturbed.
    ratios = sorted(o / t for o, t in zip(ours, theirs, strict=True))
    ratio = statistics.median(ratios)
    print(
        f"\n{label}: training images/s (best epoch of each turn; {repeat} turns x "
        f"{config.epochs} epochs)"
    )
    print(f"  hand-written loop  median {statistics.median(theirs):6.0f}   turns: {_rates(theirs)}")
    print(f"  torchkit train     median {statistics.median(ours):6.0f}   turns: {_rates(ours)}")
    print(
        f"  ratio torchkit / loop, median over turns: {ratio:.3f}  "
        f"(per turn: {', '.join(f'{r:.3f}' for r in ratios)})",
        flush=True,
    )
    return ratio


def _rates(values: list[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values)


def run_target(seeds: list[int], work: Path) -> None:
    """`torchkit train` with its defaults, as a user runs it: wall, CPU and test accuracy."""
    print("\n`torchkit train` with the defaults (digits), a real process per seed:")
    for seed in seeds:
        out = work / f"target-{seed}"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "torchkit", "train", "--seed", str(seed), "--out", str(out),
             "--format", "json"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        summary = json.loads(done.stdout)
        ema = summary.get("test_ema_top1")
        print(
            f"  seed {seed}: test top-1 {summary['test_top1']:.4f} (best.pt, epoch "
            f"{summary['best_epoch']}"
            + ("" if ema is None else f"; its EMA weights {ema:.4f}")
            + f"), wall {wall:.1f} s, cpu {cpu:.1f} s",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("both", "digits", "folder", "none"), default="both")
    parser.add_argument("--model", default="convnet")
    parser.add_argument("--images", type=int, default=2000, help="PNG folder size")
    parser.add_argument("--size", type=int, default=32, help="PNG side and --image-size")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--target", action="store_true", help="also time the default run")
    parser.add_argument("--seeds", default="0")
    args = parser.parse_args()

    import torch

    from torchkit.core.train import TrainConfig

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
        f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}"
    )
    # The loop's plain cross-entropy, so both train with the same loss (torchkit's default adds
    # label smoothing 0.1), and no weight average (on by default for digits), so both do the same
    # work per step; everything else is torchkit's default recipe.
    common = dict(
        label_smoothing=0.0, ema=False,
        model=args.model, epochs=args.epochs, batch_size=args.batch_size, workers=args.workers,
        device=args.device, amp=args.amp, channels_last=args.channels_last,
    )  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="tk-bench-train-"))
    try:
        if args.data in ("both", "digits"):
            compare("digits", TrainConfig(data="digits", **common), args.device, args.repeat, work)
        if args.data in ("both", "folder"):
            root = work / "pngs"
            make_png_folder(root, args.images, args.size)
            config = TrainConfig(data=str(root), image_size=args.size, **common)
            compare(
                f"PNG folder ({args.images} x {args.size}px)",
                config,
                args.device,
                args.repeat,
                work,
            )
        if args.target:
            run_target([int(s) for s in args.seeds.split(",")], work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
