"""Benchmark: `torchkit predict` against timm's inference loop pattern in plain PyTorch.

Both classify the same folder of unlabelled JPEGs with the same torchkit checkpoint, in the same
run, with the same batch size, workers and preprocessing, and write one CSV row per image
(path, class, probability). The baseline is what timm's `inference.py` does: a Dataset over the
files, a DataLoader, model.eval() under no_grad, softmax, topk, csv.writer. torchkit is timed
from its core (`PredictRun`, the rows written by csv.DictWriter as the CLI does). Each side's
time covers loading the checkpoint, finding the images and the whole pass; runs alternate and
the best of `--repeats` is kept.

    uv run python benchmarks/bench_predict.py [--images 500] [--model resnet18] [--size 64]
"""

from __future__ import annotations

import argparse
import csv
import io
import tempfile
import time
from pathlib import Path

import torch
from bench_eval import make_checkpoint, make_folder
from PIL import Image

from torchkit.core.checkpoint import load_checkpoint
from torchkit.core.data import Preprocess, eval_transform
from torchkit.core.models import model_from_checkpoint
from torchkit.core.predict import PredictRequest, PredictRun


def plain_pytorch(checkpoint: Path, root: Path, batch_size: int, workers: int) -> list[str]:
    """timm's inference pattern; returns the predicted classes in path order."""
    ckpt = load_checkpoint(checkpoint)
    model = model_from_checkpoint(ckpt).eval()
    classes = ckpt["classes"]
    transform = eval_transform(Preprocess.from_dict(ckpt["preprocess"]))
    paths = sorted(str(p) for p in root.rglob("*.jpg"))

    class Files(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, index: int):
            with Image.open(paths[index]) as image:
                return transform(image.convert("RGB"))

    loader = torch.utils.data.DataLoader(Files(), batch_size=batch_size, num_workers=workers)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["path", "class", "probability"])
    predicted, position = [], 0
    with torch.no_grad():
        for images in loader:
            probs = model(images).softmax(1)
            top_prob, top = probs.topk(1, dim=1)
            for p, c in zip(top_prob[:, 0].tolist(), top[:, 0].tolist(), strict=True):
                writer.writerow([paths[position], classes[c], p])
                predicted.append(classes[c])
                position += 1
    return predicted


def torchkit_predict(checkpoint: Path, root: Path, batch_size: int, workers: int) -> list[str]:
    run = PredictRun(
        PredictRequest(
            model=str(checkpoint),
            images=[str(root)],
            batch_size=batch_size,
            workers=workers,
            device="cpu",
        )
    )
    run.setup()
    columns = run.columns(run.resolved.num_outputs)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    predicted = []
    for row in run.rows():
        writer.writerow(row)
        predicted.append(row["class"])
    run.close()
    return predicted


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

    with tempfile.TemporaryDirectory() as tmp:
        root, checkpoint = Path(tmp) / "images", Path(tmp) / "model.pt"
        make_folder(root, args.images, args.classes, args.size)
        make_checkpoint(checkpoint, args.model, args.classes, args.size)
        print(
            f"{args.images} JPEG images {args.size}x{args.size}, {args.model}, batch "
            f"{args.batch_size}, {args.workers} worker(s), {torch.get_num_threads()} threads, "
            f"best of {args.repeats}"
        )
        plain_pytorch(checkpoint, root, args.batch_size, args.workers)  # warm-up
        best_base = best_kit = float("inf")
        for repeat in range(args.repeats):
            for side in ("base", "kit") if repeat % 2 == 0 else ("kit", "base"):
                start = time.perf_counter()
                if side == "base":
                    base = plain_pytorch(checkpoint, root, args.batch_size, args.workers)
                    best_base = min(best_base, time.perf_counter() - start)
                else:
                    kit = torchkit_predict(checkpoint, root, args.batch_size, args.workers)
                    best_kit = min(best_kit, time.perf_counter() - start)
        assert kit == base, "torchkit predict and the plain loop disagree"
        n = len(base)
        base_rate, kit_rate = n / best_base, n / best_kit
        print(f"plain PyTorch (timm's pattern) : {base_rate:8.1f} images/s")
        print(f"torchkit predict               : {kit_rate:8.1f} images/s")
        print(f"ratio                          : {kit_rate / base_rate:8.3f}  (target >= 1.0)")


if __name__ == "__main__":
    main()
