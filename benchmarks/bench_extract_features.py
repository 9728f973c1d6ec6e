"""Benchmark: `torchkit extract-features` against the classic per-image loop.

The classic recipe (the cheat-sheets' "ResNet GAP feature"): the model without its fc layer as an
nn.Sequential, then for every image: open it, transform it, `model(x.unsqueeze(0))` under
`torch.no_grad()`, collect the rows and save them. torchkit runs the same model on the same folder
in the same process, batched, with DataLoader workers decoding ahead, writing to a memory-mapped
.npy. Both are timed end to end (model built, every image read, features saved); torch's import
is not counted. Both produce the same features, which the script checks.

    uv run python benchmarks/bench_extract_features.py [--images 64] [--model resnet18]
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path


def make_images(root: Path, count: int, size: int) -> list[Path]:
    """`count` random JPEGs of `size`x`size` in two class folders (seeded)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for index in range(count):
        folder = root / ("a" if index % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{index:05d}.jpg"
        # Smooth noise compresses like a photo rather than like static.
        small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        Image.fromarray(small).resize((size, size), Image.BICUBIC).save(path, quality=90)
        paths.append(path)
    return sorted(paths)


def classic_loop(paths: list[Path], model_name: str, out: Path, seed: int) -> float:
    """The per-image recipe; returns seconds."""
    import numpy as np
    import torch
    import torchvision
    from PIL import Image
    from torchvision import transforms as T

    started = time.perf_counter()
    torch.manual_seed(seed)
    model = torchvision.models.get_model(model_name)
    model = torch.nn.Sequential(collections.OrderedDict(list(model.named_children())[:-1]))
    model.eval()
    transform = T.Compose(
        [
            T.Resize(256),
            T.CenterCrop(224),
            T.ToTensor(),
            T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    rows = []
    with torch.no_grad():
        for path in paths:
            image = Image.open(path).convert("RGB")
            x = transform(image)
            rows.append(model(x.unsqueeze(0)).flatten(1)[0].numpy())
    np.save(out, np.stack(rows))
    return time.perf_counter() - started


def torchkit_run(root: Path, model_name: str, out: Path, seed: int, args) -> float:
    from torchkit.core.features import FeatureRequest, extract_features
    from torchkit.core.inference.options import InferenceOptions
    from torchkit.core.models import ModelSpec

    started = time.perf_counter()
    extract_features(
        FeatureRequest(
            spec=ModelSpec(model_name, build_seed=seed),
            images=str(root),
            out=str(out),
            layers=["penultimate"],
            run=InferenceOptions(
                batch_size=args.batch_size, workers=args.workers, channels_last=args.channels_last
            ),
            force=True,
        )
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--size", type=int, default=256, help="side of the generated JPEGs")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=None, help="default: torchkit's choice")
    parser.add_argument("--channels-last", action="store_true")
    args = parser.parse_args()

    import numpy as np
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "images"
        paths = make_images(root, args.images, args.size)
        baseline_file = Path(tmp) / "classic.npy"
        out = Path(tmp) / "torchkit"
        print(
            f"{args.images} {args.size}x{args.size} JPEGs, {args.model} penultimate features "
            f"at 224x224, torch {torch.__version__}, {torch.get_num_threads()} threads"
        )
        # Warm-up on a few images so that neither side pays one-time costs (allocator, oneDNN).
        classic_loop(paths[:2], args.model, Path(tmp) / "warm.npy", seed=0)
        classic_seconds = classic_loop(paths, args.model, baseline_file, seed=0)
        torchkit_seconds = torchkit_run(root, args.model, out, 0, args)

        difference = np.abs(np.load(out / "penultimate.npy") - np.load(baseline_file)).max()
        classic_rate = len(paths) / classic_seconds
        torchkit_rate = len(paths) / torchkit_seconds
        print(f"classic per-image loop: {classic_seconds:7.2f} s  {classic_rate:7.1f} images/s")
        settings = f"batch {args.batch_size}" + (", channels-last" if args.channels_last else "")
        print(
            f"torchkit extract-features ({settings}): {torchkit_seconds:7.2f} s  "
            f"{torchkit_rate:7.1f} images/s"
        )
        print(f"speed-up: {torchkit_rate / classic_rate:.2f}x   max |difference|: {difference:.2e}")


if __name__ == "__main__":
    main()
