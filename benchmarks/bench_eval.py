"""Benchmark: `torchkit eval` against a minimal hand-written evaluation loop.

Both evaluate the same torchkit checkpoint on the same folder of images, in the same run, with
the same batch size, workers and preprocessing. The baseline is the textbook loop: ImageFolder,
DataLoader, model.eval(), torch.no_grad(), argmax, accumulate. Each side's time covers loading
the checkpoint, finding the images and the whole pass over them; runs alternate and the best of
`--repeats` is kept. Then the time `eval --out` spends writing its reports is measured.

    uv run python benchmarks/bench_eval.py [--images 500] [--model resnet18] [--size 64]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.transforms import eval_transform
from torchkit.core.evaluate import EvalOptions, ModelSpec, evaluate
from torchkit.core.inference.options import InferenceOptions
from torchkit.core.models import build_model, model_from_checkpoint
from torchkit.core.models.checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint


def make_folder(root: Path, images: int, classes: int, size: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(images):
        folder = root / f"class_{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:05d}.jpg", quality=90)


def make_checkpoint(path: Path, arch: str, classes: int, size: int) -> Preprocess:
    torch.manual_seed(0)
    preprocess = Preprocess(image_size=size, resize_size=size)
    model = build_model(arch, classes, image_size=size)
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "torchkit_version": "bench",
            "arch": arch,
            "num_classes": classes,
            "classes": [f"class_{c:02d}" for c in range(classes)],
            "model": model.state_dict(),
            "preprocess": preprocess.to_dict(),
            "config": {},
        },
        path,
    )
    return preprocess


def hand_written(checkpoint: Path, root: Path, batch_size: int, workers: int) -> tuple[float, int]:
    """The baseline: returns (accuracy, images)."""
    from torchvision.datasets import ImageFolder

    ckpt = load_checkpoint(checkpoint)
    model = model_from_checkpoint(ckpt)
    model.eval()
    dataset = ImageFolder(root, transform=eval_transform(Preprocess.from_dict(ckpt["preprocess"])))
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers)
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            predicted = model(images).argmax(1)
            correct += int((predicted == labels).sum())
            total += len(labels)
    return correct / total, total


def torchkit_eval(checkpoint: Path, root: Path, batch_size: int, workers: int, out=None):
    return evaluate(
        ModelSpec(model=str(checkpoint)),
        EvalOptions(
            data=str(root),
            run=InferenceOptions(batch_size=batch_size, workers=workers),
            out_dir=out,
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # torchkit keeps it (its thread policy)

    with tempfile.TemporaryDirectory() as tmp:
        root, checkpoint = Path(tmp) / "images", Path(tmp) / "model.pt"
        make_folder(root, args.images, args.classes, args.size)
        make_checkpoint(checkpoint, args.model, args.classes, args.size)
        print(
            f"{args.images} JPEG images {args.size}x{args.size}, {args.classes} classes, "
            f"{args.model}, batch {args.batch_size}, {args.workers} worker(s), "
            f"{torch.get_num_threads()} threads, best of {args.repeats}"
        )
        hand_written(checkpoint, root, args.batch_size, args.workers)  # warm-up (caches, JIT)
        best_base = best_kit = float("inf")
        for repeat in range(args.repeats):
            # Alternate which side goes first, so a drift in machine load hits both alike.
            for side in ("base", "kit") if repeat % 2 == 0 else ("kit", "base"):
                start = time.perf_counter()
                if side == "base":
                    base_accuracy, n = hand_written(checkpoint, root, args.batch_size, args.workers)
                    best_base = min(best_base, time.perf_counter() - start)
                else:
                    result = torchkit_eval(checkpoint, root, args.batch_size, args.workers)
                    best_kit = min(best_kit, time.perf_counter() - start)
        assert result.num_images == n and result.metrics.accuracy == base_accuracy, (
            "torchkit eval and the hand-written loop disagree"
        )
        base_rate, kit_rate = n / best_base, n / best_kit
        print(f"hand-written loop : {base_rate:8.1f} images/s  (accuracy {base_accuracy:.4f})")
        kit_accuracy = result.metrics.accuracy
        print(f"torchkit eval     : {kit_rate:8.1f} images/s  (accuracy {kit_accuracy:.4f})")
        print(f"ratio             : {kit_rate / base_rate:8.3f}  (target >= 0.95)")

        reported = torchkit_eval(checkpoint, root, args.batch_size, args.workers, Path(tmp) / "out")
        print(
            f"writing the reports (--out, 6 files, {args.classes} classes, {n} predictions): "
            f"{reported.report_seconds:.2f} s"
        )


if __name__ == "__main__":
    main()
