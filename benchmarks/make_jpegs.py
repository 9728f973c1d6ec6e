#!/usr/bin/env python3
"""Photo-like JPEG classification folder for the GPU check: ROOT/train, ROOT/val (10%), 10 classes.

Each image: a smooth random background (500x375 or 375x500), 4-8 filled shapes whose kind is the
class, JPEG quality 90 (the kind of images `bench_decode.py` makes, but made in parallel, one
process per core, so that 8,000 of them take seconds on a GPU machine).

    python benchmarks/make_jpegs.py ROOT N
"""

from __future__ import annotations

import os
import sys
from multiprocessing import Pool

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

ROOT = ""


def shape(draw: ImageDraw.ImageDraw, kind: int, cx: float, cy: float, r: float, col) -> None:
    if kind == 0:
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=col)
    elif kind == 1:
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=col)
    elif kind == 2:
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=col)
    elif kind == 3:
        draw.polygon([(cx, cy + r), (cx + r, cy - r), (cx - r, cy - r)], fill=col)
    elif kind == 4:
        draw.rectangle([cx - r, cy - r / 4, cx + r, cy + r / 4], fill=col)
        draw.rectangle([cx - r / 4, cy - r, cx + r / 4, cy + r], fill=col)
    elif kind == 5:
        draw.line([cx - r, cy - r, cx + r, cy + r], fill=col, width=int(r / 3))
        draw.line([cx - r, cy + r, cx + r, cy - r], fill=col, width=int(r / 3))
    elif kind == 6:
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=col, width=int(r / 3))
    elif kind == 7:
        draw.rectangle([cx - r, cy - r / 4, cx + r, cy + r / 4], fill=col)
    elif kind == 8:
        draw.rectangle([cx - r / 4, cy - r, cx + r / 4, cy + r], fill=col)
    else:
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=col)


def one(i: int) -> None:
    rng = np.random.default_rng(i)
    label = i % 10
    split = "val" if (i // 10) % 10 == 0 else "train"
    folder = os.path.join(ROOT, split, f"c{label}")
    w, h = (500, 375) if rng.random() < 0.7 else (375, 500)
    img = Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)).resize(
        (w, h), Image.BICUBIC
    )
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 9))):
        r = float(rng.uniform(18, 48))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        shape(d, label, float(rng.uniform(r, w - r)), float(rng.uniform(r, h - r)), r, colour)
    img = img.filter(ImageFilter.BoxBlur(1))
    px = np.asarray(img, dtype=np.int16) + rng.normal(0, 4, (h, w, 3)).astype(np.int16)
    Image.fromarray(np.clip(px, 0, 255).astype(np.uint8)).save(
        os.path.join(folder, f"i{i:06d}.jpg"), quality=90
    )


def _init(root: str) -> None:
    global ROOT
    ROOT = root


def main(root: str, count: int) -> None:
    for split in ("train", "val"):
        for c in range(10):
            os.makedirs(os.path.join(root, split, f"c{c}"), exist_ok=True)
    with Pool(os.cpu_count(), initializer=_init, initargs=(root,)) as pool:
        pool.map(one, range(count), chunksize=64)
    print(f"{count} JPEGs in {root}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
