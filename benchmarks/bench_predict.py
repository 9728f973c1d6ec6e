"""Benchmark: `torchkit predict` against timm's inference loop pattern in plain PyTorch.

Both classify the same folder of unlabelled JPEGs with the same torchkit checkpoint, in the same
run, with the same batch size, workers, threads and preprocessing, and write one CSV row per
image (path, class, probability; torchkit's rows also carry `label` and `error`). The baseline is
what timm's `inference.py` does, in plain PyTorch: `torch.load` the checkpoint, build the
architecture and `load_state_dict`, a Dataset over the sorted files, a DataLoader,
model.eval() under no_grad, softmax, topk, csv.writer. torchkit is timed from its core
(`PredictRun.records()`, written by the CLI's `write_csv`, as `predict --format csv` does).
Each side's time covers loading the checkpoint, finding the images, the whole pass and writing.

The two run in turns (baseline then torchkit, then the other way round, ...); each turn gives
the ratio of the two rates, and the median over turns is the figure reported, with its range,
so another job loading a shared machine for a while skews neither side. The best rate of each
side is printed too. Before timing, both outputs are checked to agree (same paths in the same
order, same classes, probabilities within 1e-6).

    uv run python benchmarks/bench_predict.py [--images 500] [--model resnet18] [--size 64]
        [--batch-size 64] [--workers 1] [--threads 0] [--repeats 7]
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_eval import make_checkpoint, make_folder
from PIL import Image

from torchkit.cli.predict import write_csv
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.transforms import eval_transform
from torchkit.core.inference.options import InferenceOptions
from torchkit.core.models import ModelSpec
from torchkit.core.predict import PredictRequest, PredictRun


def plain_pytorch(checkpoint: Path, root: Path, batch_size: int, workers: int) -> str:
    """timm's inference pattern; returns the CSV it wrote."""
    import torchvision

    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    model = torchvision.models.get_model(ckpt["arch"], num_classes=ckpt["num_classes"])
    model.load_state_dict(ckpt["model"])
    model.eval()
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
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["path", "class", "probability"])
    position = 0
    with torch.no_grad():
        for images in loader:
            probs = model(images).softmax(1)
            top_prob, top = probs.topk(1, dim=1)
            for p, c in zip(top_prob[:, 0].tolist(), top[:, 0].tolist(), strict=True):
                writer.writerow([os.path.relpath(paths[position], root), classes[c], p])
                position += 1
    return out.getvalue()


def torchkit_predict(checkpoint: Path, root: Path, batch_size: int, workers: int) -> str:
    """`torchkit predict CHECKPOINT ROOT --format csv`, from its core; returns the CSV."""
    run = PredictRun(
        PredictRequest(
            spec=ModelSpec(str(checkpoint)),
            images=[str(root)],
            run=InferenceOptions(batch_size=batch_size, workers=workers, device="cpu"),
        )
    )
    run.setup()
    out = io.StringIO()
    write_csv(run.records(), run.columns(run.resolved.num_outputs), out)
    run.close()
    return out.getvalue()


def check_agreement(base_csv: str, kit_csv: str) -> int:
    """Both CSVs name the same images in the same order with the same classes and
    probabilities (within 1e-6: softmax and exp(log_softmax) may differ in the last bit)."""
    base = list(csv.DictReader(io.StringIO(base_csv)))
    kit = list(csv.DictReader(io.StringIO(kit_csv)))
    assert [r["path"] for r in base] == [r["path"] for r in kit], "different images or order"
    assert [r["class"] for r in base] == [r["class"] for r in kit], "different classes"
    for b, k in zip(base, kit, strict=True):
        assert abs(float(b["probability"]) - float(k["probability"])) <= 1e-6, (b, k)
    return len(base)


def cpu_seconds() -> float:
    """User + system time of this process and its finished children (DataLoader workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--model", default="resnet18", help="a torchvision model name")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7, help="turns of each side")
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
            f"{args.images} JPEG images {args.size}x{args.size}, {args.model}, batch "
            f"{args.batch_size}, {args.workers} worker(s), {torch.get_num_threads()} threads, "
            f"{args.repeats} alternating turns, {os.cpu_count()} CPUs, load average {load()}"
        )
        sides = {"base": plain_pytorch, "kit": torchkit_predict}
        # Warm-up (page cache, lazy imports) and the check that both give the same rows.
        n = check_agreement(
            *(sides[s](checkpoint, root, args.batch_size, args.workers) for s in sides)
        )
        rates: dict[str, list[float]] = {"base": [], "kit": []}
        cpus: dict[str, list[float]] = {"base": [], "kit": []}
        for turn in range(args.repeats):
            for side in ("base", "kit") if turn % 2 == 0 else ("kit", "base"):
                start, cpu = time.perf_counter(), cpu_seconds()
                sides[side](checkpoint, root, args.batch_size, args.workers)
                rates[side].append(n / (time.perf_counter() - start))
                cpus[side].append(cpu_seconds() - cpu)
        ratios = [k / b for k, b in zip(rates["kit"], rates["base"], strict=True)]
        turns = ", ".join(f"{r:.3f}" for r in ratios)
        for side, label in (
            ("base", "plain PyTorch (timm's pattern)"),
            ("kit", "torchkit predict"),
        ):
            print(
                f"{label:31s}: best {max(rates[side]):7.1f}  median "
                f"{statistics.median(rates[side]):7.1f} images/s; CPU (process + workers) "
                f"median {statistics.median(cpus[side]):.2f} s"
            )
        print(
            f"ratio torchkit / plain, median of turns: {statistics.median(ratios):.3f}  "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}; target >= 1.0)"
        )
        print(
            f"per turn: {turns}; ratio of best rates {max(rates['kit']) / max(rates['base']):.3f}"
        )
        cpu_ratios = [b / k for k, b in zip(cpus["kit"], cpus["base"], strict=True)]
        print(
            f"CPU time ratio plain / torchkit, median of turns: {statistics.median(cpu_ratios):.3f}"
            f" (range {min(cpu_ratios):.3f}-{max(cpu_ratios):.3f})"
        )
        print(f"load average at the end {load()}")


if __name__ == "__main__":
    main()
