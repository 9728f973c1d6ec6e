"""Benchmark: training from WebDataset shards and from HF parquet against the same JPEGs as an
image folder (issue #48), in one run.

The data: `--images` small JPEGs (64 px, 10 classes, 10% val) as a split root, as local
WebDataset shards (written by `torchkit convert shards`) and as HF parquet (HF's layout
`data/{train,validation}-00000-of-00001.parquet`, an Image struct {bytes, path} and a ClassLabel,
row groups of 100 rows as HF's writer makes them for images). Each is trained with the same
recipe (convnet at 32 px, --workers 1, CPU); images/s is the training pass's best epoch after the
first (torchkit's `images_per_s`). The three run in turns (folder, shards, parquet, repeated)
and each turn's ratios are taken, the median over turns reported, so another job loading a
shared machine for a while skews no kind.

`--read-order` also times reading shuffled parquet images through the reader train uses
(`StoredImage.read_bytes`, `ParquetImages`'s row-group cache) on data larger than the cache
(3,000 images of about 110 KB, row groups of 100: about 330 MB against 128 MiB): the plain
shuffle (`randperm`, what train did before) against the row-group windows train uses now.
`--profile FILE` writes cProfile statistics of one shard epoch with --workers 0.

    uv run python benchmarks/bench_shards.py
    uv run python benchmarks/bench_shards.py --images 2000 --repeat 3 --read-order
    uv run python benchmarks/bench_shards.py --repeat 1 --profile /tmp/shards.prof
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _timing import torchkit_command

CLASSES = [f"c{i}" for i in range(10)]
HF_ROW_GROUP = 100  # rows per row group HF's `datasets` writes for image features


def jpeg(seed: int, size: int, quality: int = 90, noise: float = 30.0) -> bytes:
    """A JPEG of a smooth random image with noise (larger `noise`, larger files)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).resize(
        (size, size), Image.BICUBIC
    )
    pixels = np.asarray(base, dtype=np.float32) + rng.normal(0, noise, (size, size, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
        buffer, format="JPEG", quality=quality
    )
    return buffer.getvalue()


def make_split_root(root: Path, images: int, size: int = 64) -> None:
    """ROOT/{train,val}/<class>/<i>.jpg: `images` JPEGs, one in ten of each class in val."""
    for index in range(images):
        split = "val" if (index // len(CLASSES)) % 10 == 0 else "train"
        folder = root / split / CLASSES[index % len(CLASSES)]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index:06d}.jpg").write_bytes(jpeg(index, size))


def write_hf_parquet(path: Path, images: list[bytes], labels: list[int]) -> None:
    """One parquet file as HF's `datasets` writes it: `image` {bytes, path}, `label`
    (ClassLabel named in the `huggingface` schema metadata), row groups of HF_ROW_GROUP."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": CLASSES}}
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", image), ("label", pa.int64())], metadata=metadata)
    table = pa.table(
        {"image": [{"bytes": b, "path": None} for b in images], "label": labels}, schema=schema
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=HF_ROW_GROUP)


def parquet_of_split_root(root: Path, out: Path) -> None:
    """OUT/data/{train,validation}-00000-of-00001.parquet of a split root's images."""
    for split, hf_split in (("train", "train"), ("val", "validation")):
        files = sorted((root / split).glob("*/*.jpg"))
        write_hf_parquet(
            out / "data" / f"{hf_split}-00000-of-00001.parquet",
            [f.read_bytes() for f in files],
            [CLASSES.index(f.parent.name) for f in files],
        )


def train_rate(config) -> float:
    """Best training images/s over the epochs after the first."""
    from torchkit.core.train import run_training

    rows = run_training(config).history
    return max(row["images_per_s"] for row in (rows[1:] or rows))


def compare_kinds(data: dict[str, Path], common: dict, repeat: int, work: Path) -> None:
    from torchkit.core.train import TrainConfig

    rates: dict[str, list[float]] = {kind: [] for kind in data}
    for turn in range(repeat):
        for kind, path in data.items():
            out = work / f"run-{kind}-{turn}"
            config = TrainConfig(data=str(path), out=str(out), force=True, **common)
            rates[kind].append(train_rate(config))
            shutil.rmtree(out, ignore_errors=True)
    print(f"\ntraining images/s (best epoch after the first; {repeat} turn(s)):")
    for kind, values in rates.items():
        turns = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {kind:<8} median {statistics.median(values):6.0f}   turns: {turns}")
    for kind in data:
        if kind != "folder":
            ratios = [r / f for r, f in zip(rates[kind], rates["folder"], strict=True)]
            print(
                f"  ratio {kind}/folder, median over turns: {statistics.median(ratios):.3f}  "
                f"(per turn: {', '.join(f'{r:.3f}' for r in ratios)})",
                flush=True,
            )


def profile_shards(shards: Path, common: dict, work: Path, where: str) -> None:
    """cProfile statistics of training one epoch on the shards with --workers 0."""
    import cProfile
    import pstats

    from torchkit.core.train import TrainConfig

    config = TrainConfig(
        data=str(shards), out=str(work / "profiled"), force=True, **{**common, "workers": 0}
    )
    profiler = cProfile.Profile()
    profiler.runcall(train_rate, dataclasses.replace(config, epochs=1))
    profiler.dump_stats(where)
    print(f"\nprofile of one shard epoch (--workers 0) in {where}; the top by own time:")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


def read_order(work: Path, images: int = 3000, seed: int = 0) -> None:
    """ms per image of reading shuffled parquet images larger than the reader's cache: the
    plain shuffle against the row-group windows train uses."""
    import torch

    from torchkit.core.data.sources import open_data
    from torchkit.core.data.sources.parquet import CACHE_BYTES
    from torchkit.core.data.stored_image import read_blocks
    from torchkit.core.train.loaders import windowed_order

    path = work / "large" / "data" / "train-00000-of-00001.parquet"
    started = time.perf_counter()
    data = [jpeg(i, 320, quality=95, noise=60.0) for i in range(images)]
    write_hf_parquet(path, data, [i % len(CLASSES) for i in range(images)])
    megabytes = sum(map(len, data)) / 1e6
    print(
        f"\nshuffled reads of {images} parquet images, {megabytes / images * 1000:.0f} KB each "
        f"({megabytes:.0f} MB, row groups of {HF_ROW_GROUP}; reader cache "
        f"{CACHE_BYTES >> 20} MiB; made in {time.perf_counter() - started:.0f} s):"
    )
    for name in ("in file order", "plain shuffle (before)", "row-group windows (after)"):
        paths = open_data(path).whole.paths  # a fresh reader: an empty cache
        generator = torch.Generator()
        generator.manual_seed(seed)
        if name.startswith("plain"):
            order = torch.randperm(len(paths), generator=generator).tolist()
        elif name.startswith("row-group"):
            blocks = read_blocks(paths)
            order = windowed_order(blocks, generator)
            name += f", {blocks.window} row groups a window"
        else:
            order = list(range(len(paths)))
        started = time.perf_counter()
        for index in order:
            paths[index].read_bytes()
        elapsed = time.perf_counter() - started
        print(f"  {name:<50} {elapsed / len(order) * 1000:7.2f} ms/image", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="turns of the three kinds")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--read-order", action="store_true", help="also time shuffled reads")
    parser.add_argument("--profile", metavar="FILE", help="cProfile one shard epoch into FILE")
    args = parser.parse_args()

    import torch

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; "
        f"load average {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d')}"
    )
    common = dict(
        model="convnet", image_size=32, epochs=args.epochs, batch_size=args.batch_size,
        workers=args.workers, device="cpu",
    )  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="tk-bench-shards-"))
    try:
        folder, shards, parquet = work / "folder", work / "shards", work / "parquet"
        make_split_root(folder, args.images)
        subprocess.run(
            torchkit_command("convert", "shards", str(folder), str(shards), "--quiet"),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        parquet_of_split_root(folder, parquet)
        sizes = {
            p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
            for p in (folder, shards, parquet)
        }
        print(
            f"{args.images} JPEGs of 64 px: "
            + ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in sizes.items())
        )
        data = {"folder": folder, "shards": shards, "parquet": parquet}
        compare_kinds(data, common, args.repeat, work)
        if args.profile:
            profile_shards(shards, common, work, args.profile)
        if args.read_order:
            read_order(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
