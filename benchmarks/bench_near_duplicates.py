"""Benchmark: torchkit's near-duplicate hashes and search against imagededup's PHash.

Builds, in the same run, a folder of synthetic "photos" (smooth backgrounds and shapes, 128 to
640 px, half JPEG and half PNG; images come in families of four that share a background: hard
negatives) and plants copies of every third image: re-encoded (JPEG quality 50/75/95, PNG),
resized (0.5x, 0.75x, 2x, a 128 px thumbnail), slightly brighter, slightly blurred, and, reported
apart, cropped by 5% on each side. Then:

1. Quality: recall of the planted pairs and the false pairs (any other pair within the
   threshold) at thresholds 4 to 12, for torchkit's pHash (`core.hashing`, its default: images
   of 512 px or more a side reduced first; how many of its hashes, and of the exact hash's,
   differ from imagededup's is printed) and for imagededup's PHash on the same files;
   torchkit's search (`core.neardup.near_pairs`) is checked against all pairs. This is how the
   default `--near-threshold` was chosen.
2. Speed: images/s of torchkit's hash pass (`core.stats.hash_pass`: SHA-256 + pHash per file,
   worker processes) and of imagededup's `encode_images` with as many workers (its defaults
   otherwise), on the same files, JPEG and PNG apart and together (best of --repeat runs, run
   in turns). Then, in this one process, CPU ms per image of torchkit's `hash_file` and of
   imagededup's `encode_image`, and for PNG of decoding alone (PIL, which both use; OpenCV's
   libpng): a PNG must be decoded whole (no reduced decode: zlib, then row filters that each
   depend on the row above), so imagededup's time over the faster decode bounds the ratio any
   pHash can reach on PNG.
3. Scaling: the hash pass on --scale images (default 10,000; 96 to 320 px) and a fifth of
   them, and the search on those hashes and on 10k and 100k (--search-sizes; 1M takes
   minutes) random hashes with 10% planted copies: time and peak memory.
4. What the leakage check costs `dataset-stats` on a split root (--stats-images, 8:1:1, the
   JPEG/PNG folder of bench_dataset_stats.py): the default run (train measured, val and test
   hashed) against --no-leakage.
5. The reduced decode (--large-images photo-like JPEGs of 128x96 to 4000x3000): images/s of
   the exact hash (`--exact-phash`, whole decode) and of the old box filter, and their ratio;
   and of the hash from a reduced decode (`core.hashing.phash_image(image, floor=F)`: PIL's
   `draft()` and `reduce()` to --floors px a side; 256 is the default), with how many of its
   hashes differ from the exact one and by how many bits. Hash only (the other splits' files)
   and decode + hash (the measured split's).

imagededup is a dev-only dependency (`uv add --dev imagededup`); without it the comparison is
skipped with a message and an independent pHash written from imagededup's definition (DCT-II of
the 32x32 gray image, 8x8 low frequencies, >= median of the 63 AC terms) stands in for the
quality part, at full decode.

    uv run python benchmarks/bench_near_duplicates.py              # about 5 minutes on 2 cores
    uv run python benchmarks/bench_near_duplicates.py --images 400 --scale 2000   # quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

PLANTED = (
    "jpeg q50",
    "jpeg q75",
    "jpeg q95",
    "png re-encode",
    "resize 0.5x",
    "resize 0.75x (png)",
    "resize 2x",
    "thumbnail 128 px",
    "brightness +10%",
    "blur radius 1",
)
HARD = ("crop 5% a side",)


def scene(rng, width: int, height: int, family: int):
    """A synthetic photo: a smooth background shared by the family, shapes of its own, noise."""
    from PIL import Image, ImageDraw, ImageFilter

    background = np.random.default_rng(family)
    yy, xx = np.mgrid[0:height, 0:width] / max(width, height)
    base = np.zeros((height, width, 3))
    for c in range(3):
        a, b, p = background.uniform(-1, 1, 3)
        base[..., c] = 128 + 90 * np.sin(3 * a * xx + 3 * b * yy + 6 * p)
    image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = rng.uniform(-0.2, 1.0, 2) * (width, height)
        w, h = rng.uniform(0.1, 0.5, 2) * (width, height)
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        box = [x0, y0, x0 + w, y0 + h]
        kind = int(rng.integers(0, 3))
        if kind == 0:
            draw.ellipse(box, fill=colour)
        elif kind == 1:
            draw.rectangle(box, fill=colour)
        else:
            draw.line(box, fill=colour, width=int(rng.integers(2, 12)))
    pixels = np.asarray(image, dtype=np.float64) + rng.normal(0, 8, (height, width, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    return image.filter(ImageFilter.GaussianBlur(0.8))


def planted_copy(image, kind: str, path_stem: Path) -> Path:
    from PIL import Image, ImageEnhance, ImageFilter

    w, h = image.size
    jpeg = path_stem.with_suffix(".jpg")
    png = path_stem.with_suffix(".png")
    if kind.startswith("jpeg"):
        image.save(jpeg, quality=int(kind.split("q")[1]))
        return jpeg
    if kind == "png re-encode":
        image.save(png, compress_level=9)
        return png
    if kind == "resize 0.5x":
        image.resize((w // 2, h // 2), Image.Resampling.LANCZOS).save(jpeg, quality=90)
        return jpeg
    if kind == "resize 0.75x (png)":
        image.resize((w * 3 // 4, h * 3 // 4), Image.Resampling.BILINEAR).save(png)
        return png
    if kind == "resize 2x":
        image.resize((w * 2, h * 2), Image.Resampling.BICUBIC).save(jpeg, quality=90)
        return jpeg
    if kind == "thumbnail 128 px":
        image.resize((128, max(1, 128 * h // w))).save(jpeg, quality=85)
        return jpeg
    if kind == "brightness +10%":
        ImageEnhance.Brightness(image).enhance(1.1).save(jpeg, quality=90)
        return jpeg
    if kind == "blur radius 1":
        image.filter(ImageFilter.GaussianBlur(1)).save(jpeg, quality=90)
        return jpeg
    if kind == "crop 5% a side":
        image.crop((w // 20, h // 20, w - w // 20, h - h // 20)).save(jpeg, quality=90)
        return jpeg
    raise ValueError(kind)


def _make_chunk(task) -> list[tuple[str, str | None, str | None]]:
    """Images [start, stop) of the folder: (path, planted kind or None, original path)."""
    root, start, stop, seed, low, high, plant = task
    root = Path(root)
    made = []
    kinds = PLANTED + HARD
    for i in range(start, stop):
        rng = np.random.default_rng([seed, i])
        width, height = (int(v) for v in rng.integers(low, high + 1, 2))
        image = scene(rng, width, height, family=10_000 + i // 4)
        fmt = "jpeg" if i % 2 else "png"
        folder = root / fmt
        path = folder / f"img_{i:06d}.{'jpg' if fmt == 'jpeg' else 'png'}"
        image.save(path, **({"quality": 90} if fmt == "jpeg" else {}))
        made.append((str(path), None, None))
        if plant and i % 3 == 0:
            kind = kinds[(i // 3) % len(kinds)]
            copy_folder = root / "copies"
            copy = planted_copy(image, kind, copy_folder / f"copy_{i:06d}")
            made.append((str(copy), kind, str(path)))
    return made


def make_folder(root: Path, images: int, *, low: int, high: int, plant: bool, workers: int):
    """The benchmark folder, generated in worker processes."""
    import multiprocessing

    for name in ("jpeg", "png", "copies"):
        (root / name).mkdir(parents=True, exist_ok=True)
    step = max(1, images // (workers * 8))
    tasks = [
        (str(root), s, min(images, s + step), 0, low, high, plant) for s in range(0, images, step)
    ]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        chunks = pool.map(_make_chunk, tasks)
    return [item for chunk in chunks for item in chunk]


# --------------------------------------------------------------------------- hashes


def reference_phash(path: str) -> int:
    """pHash written from imagededup's definition, independently of torchkit: full decode,
    RGB, Lanczos to 32x32, gray, DCT-II (explicit matrix), 8x8, >= median of the AC terms."""
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").resize((32, 32), Image.Resampling.LANCZOS).convert("L")
    pixels = np.asarray(small, dtype=np.float64)
    n = np.arange(32)
    basis = np.cos(np.pi * np.outer(np.arange(8), 2 * n + 1) / 64)
    coefficients = (basis @ pixels @ basis.T).ravel()
    bits = coefficients >= np.median(coefficients[1:])
    return int("".join("1" if b else "0" for b in bits), 2)


def imagededup_hashes(root: Path, paths: list[str], workers: int) -> list[int]:
    import logging

    from imagededup.methods import PHash

    for name in list(logging.root.manager.loggerDict):  # its INFO lines on every call
        if name.startswith("imagededup"):
            logging.getLogger(name).setLevel(logging.WARNING)

    encoded = PHash(verbose=False).encode_images(
        image_dir=str(root), recursive=True, num_enc_workers=workers
    )
    by_name = {os.path.normpath(os.path.join(str(root), k)): v for k, v in encoded.items()}
    return [int(by_name[os.path.normpath(p)], 16) for p in paths]


def torchkit_hashes(paths: list[str], workers: int, floor: int | None = None) -> list[int]:
    """torchkit's pHashes of `paths`: the default (`floor` None), or from `floor` px."""
    from torchkit.core.stats import hash_pass

    options = {} if floor is None else {"phash_floor": floor}
    return [h[1] for h in hash_pass(paths, workers=workers, **options)]


def have_imagededup() -> bool:
    try:
        import imagededup.methods  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- the parts


def quality(made, torchkit, exact, oracle, oracle_name: str) -> None:
    from torchkit.core.data.neardup import DEFAULT_NEAR_THRESHOLD, near_pairs, popcount

    paths = [p for p, _, _ in made]
    index = {p: i for i, p in enumerate(paths)}
    truth = {
        (min(index[p], index[o]), max(index[p], index[o])): kind
        for p, kind, o in made
        if kind is not None
    }
    print(
        f"\n1. Quality: {len(paths)} images, {len(truth)} planted copies "
        f"({sum(k in HARD for k in truth.values())} of them 5% crops, reported apart)"
    )
    for name, hashes in (("torchkit (default)", torchkit), ("torchkit --exact-phash", exact)):
        differ = sum(a != b for a, b in zip(hashes, oracle, strict=True))
        print(f"   {name}: hashes that differ from {oracle_name}'s: {differ} of {len(paths)}")
    results = {}
    for name, hashes in (("torchkit", torchkit), (oracle_name, oracle)):
        values = np.array(hashes, dtype=np.uint64)
        distance = popcount(values[:, None] ^ values[None, :])
        results[name] = distance
        if name == "torchkit":  # the search finds exactly what comparing every pair finds
            a, b, _ = near_pairs(values, 12)
            brute = np.argwhere(np.triu(distance <= 12, 1))
            assert {(int(i), int(j)) for i, j in brute} == set(
                zip(a.tolist(), b.tolist(), strict=True)
            )
            print("   torchkit's search (multi-index hashing) == all pairs compared: yes")
    print("\n   distance of each planted copy to its original (mean / max):")
    print(f"   {'copy':<20} {'torchkit':>14} {oracle_name:>22}")
    for kind in PLANTED + HARD:
        pairs = [p for p, k in truth.items() if k == kind]
        cells = []
        for name in ("torchkit", oracle_name):
            d = np.array([results[name][i, j] for i, j in pairs])
            cells.append(f"{d.mean():5.2f} / {d.max():3d}")
        print(f"   {kind:<20} {cells[0]:>14} {cells[1]:>22}")
    upper = np.triu_indices(len(paths), 1)
    planted_mask = np.zeros(len(upper[0]), dtype=bool)
    hard_mask = np.zeros_like(planted_mask)
    n = len(paths)
    for (i, j), kind in truth.items():
        position = i * n - i * (i + 1) // 2 + (j - i - 1)  # the pair's place in triu order
        planted_mask[position] = True
        hard_mask[position] = kind in HARD
    easy = planted_mask & ~hard_mask
    print(
        "\n   threshold | recall (planted, crops apart) and false pairs"
        f"\n   {'':9} | {'torchkit':^30} | {oracle_name:^30}"
    )
    for threshold in range(4, 13):
        cells = []
        for name in ("torchkit", oracle_name):
            close = results[name][upper] <= threshold
            recall = close[easy].mean()
            crops = close[hard_mask].mean() if hard_mask.any() else float("nan")
            false = int((close & ~planted_mask).sum())
            cells.append(f"{100 * recall:5.1f}% ({100 * crops:5.1f}%) {false:5d} false")
        mark = " <- default" if threshold == DEFAULT_NEAR_THRESHOLD else ""
        print(f"   {threshold:>9} | {cells[0]:^30} | {cells[1]:^30}{mark}")


def best_time(action, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the pools' workers, reaped when
    each pool closes): on a shared machine a steadier figure than wall time."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def best_of_turns(actions: dict, repeat: int) -> dict[str, tuple[float, float]]:
    """Best (wall, CPU) seconds of each action, run in turns (a, b, a, b, ...) so that a
    change in the machine's load hits all of them alike."""
    best = {label: (float("inf"), float("inf")) for label in actions}
    for _ in range(repeat):
        for label, action in actions.items():
            start, cpu = time.perf_counter(), cpu_seconds()
            action()
            wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
            best[label] = (min(best[label][0], wall), min(best[label][1], cpu))
    return best


def speed(root: Path, made, workers: int, repeat: int, oracle: bool) -> None:
    originals = [p for p, kind, _ in made if kind is None]
    print(
        f"\n2. Speed: hash pass, {workers} worker processes each, best of {repeat} in turns;"
        "\n   images/s by wall time, and CPU ms per image (steadier on a shared machine)"
    )
    if not oracle:
        print("   imagededup is not installed: its timing is skipped (uv add --dev imagededup)")
    groups = {
        "jpeg": [p for p in originals if p.endswith(".jpg")],
        "png": [p for p in originals if p.endswith(".png")],
    }
    groups["both"] = groups["jpeg"] + groups["png"]
    for name, paths in groups.items():
        actions = {"torchkit": lambda paths=paths: torchkit_hashes(paths, workers)}
        if oracle:
            folders = ["jpeg", "png"] if name == "both" else [name]
            actions["imagededup"] = lambda folders=folders: [
                imagededup_hashes(root / f, groups[f], workers) for f in folders
            ]
        best = best_of_turns(actions, repeat)
        n = len(paths)
        cells = [
            f"{label} {n / wall:7.1f}/s {1000 * cpu / n:5.2f} ms CPU"
            for label, (wall, cpu) in best.items()
        ]
        line = f"   {name:<5} {n:5d} images: " + ", ".join(cells)
        if oracle:
            (tk_wall, tk_cpu), (their_wall, their_cpu) = best["torchkit"], best["imagededup"]
            line += f"  ({their_wall / tk_wall:.2f}x wall, {their_cpu / tk_cpu:.2f}x CPU)"
        print(line)
    per_image(groups, repeat=max(3, repeat), oracle=oracle)


def per_image(groups: dict[str, list[str]], repeat: int, oracle: bool) -> None:
    """CPU ms per image in this process (no pool): torchkit's hash_file and imagededup's
    encode_image, best of `repeat` in turns; for PNG also the whole decode alone (PIL, OpenCV),
    which no pHash of a PNG can skip: imagededup / decode bounds the ratio it can reach."""
    import io

    import cv2
    from PIL import Image

    from torchkit.core.data.hashing import hash_file

    phash = None
    if oracle:
        from imagededup.methods import PHash

        phash = PHash(verbose=False)
    print(f"\n   in one process, CPU ms per image (best of {repeat} in turns):")
    for name in ("jpeg", "png"):
        paths = groups[name]
        data = [Path(p).read_bytes() for p in paths]

        def pil_decode(data=data):
            for d in data:
                with Image.open(io.BytesIO(d)) as image:
                    image.load()

        actions = {"torchkit hash_file": lambda paths=paths: [hash_file(p) for p in paths]}
        if phash is not None:
            actions["imagededup encode_image"] = lambda paths=paths: [
                phash.encode_image(image_file=p) for p in paths
            ]
        if name == "png":
            actions["PIL decode only"] = pil_decode
            actions["OpenCV decode only"] = lambda data=data: [
                cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_UNCHANGED) for d in data
            ]
        best = best_of_turns(actions, repeat)
        cells = [f"{label} {1000 * cpu / len(paths):.2f}" for label, (_, cpu) in best.items()]
        print(f"   {name:<5} " + ", ".join(cells))
        if oracle:
            theirs = best["imagededup encode_image"][1]
            line = f"         imagededup / torchkit {theirs / best['torchkit hash_file'][1]:.2f}x"
            if name == "png":
                decode = min(best["PIL decode only"][1], best["OpenCV decode only"][1])
                line += f"; imagededup / the faster decode alone {theirs / decode:.2f}x (the bound)"
            print(line)


def search_scaling(sizes: list[int]) -> None:
    from torchkit.core.data.neardup import DEFAULT_NEAR_THRESHOLD, near_pairs, plan_search

    print(f"\n   search (near_pairs, threshold {DEFAULT_NEAR_THRESHOLD}) on random 64-bit hashes")
    print("   with 10% planted copies (up to 6 bits flipped):")
    rng = np.random.default_rng(0)
    for n in sizes:
        base = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2)
        planted = n // 10
        flips = np.zeros(planted, dtype=np.uint64)
        for bit_count in range(1, 7):
            chosen = rng.integers(0, 64, (planted, bit_count))
            mask = rng.random(planted) < 0.3
            for column in range(bit_count):
                flips[mask] |= np.uint64(1) << chosen[mask, column].astype(np.uint64)
        values = np.concatenate([base, base[:planted] ^ flips])
        tracemalloc.start()
        start = time.perf_counter()
        a, _, _ = near_pairs(values, DEFAULT_NEAR_THRESHOLD)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(
            f"   {len(values):9d} hashes: {seconds:7.2f} s, peak {peak / 2**20:7.1f} MiB, "
            f"{len(a)} pairs, {plan_search(len(values), DEFAULT_NEAR_THRESHOLD)} chunks"
        )


def scaling(work: Path, images: int, workers: int, sizes: list[int]) -> None:
    from torchkit.core.data.neardup import DEFAULT_NEAR_THRESHOLD, near_pairs

    print(f"\n3. Scaling: the hash pass on {images} and {images // 5} images (96 to 320 px)")
    root = work / "scale"
    start = time.perf_counter()
    made = make_folder(root, images, low=96, high=320, plant=False, workers=workers)
    print(f"   (generated in {time.perf_counter() - start:.0f} s)")
    paths = [p for p, _, _ in made]
    for count in (images // 5, images):
        subset = paths[:count]
        tracemalloc.start()  # the main process's Python memory: the paths in, the hashes out
        start = time.perf_counter()
        hashes = torchkit_hashes(subset, workers)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(
            f"   {count:7d} images: {seconds:7.2f} s, {count / seconds:8.1f} images/s, "
            f"peak {peak / 2**20:.1f} MiB in the main process"
        )
    values = np.array(hashes, dtype=np.uint64)
    tracemalloc.start()
    start = time.perf_counter()
    a, _, _ = near_pairs(values, DEFAULT_NEAR_THRESHOLD)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(
        f"   search on their {len(values)} pHashes: {seconds:.3f} s, peak {peak / 2**20:.1f} "
        f"MiB, {len(a)} pairs within {DEFAULT_NEAR_THRESHOLD} bits"
    )
    search_scaling(sizes)
    shutil.rmtree(root, ignore_errors=True)


def stats_cost(work: Path, images: int, workers: int, repeat: int) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_dataset_stats import make_folder as make_stats_folder

    from torchkit.core.stats import compute_dataset_stats

    root = work / "stats"
    make_stats_folder(root / "all", images)
    for index, path in enumerate(sorted((root / "all").rglob("*.*"))):
        split = ("train",) * 8 + ("val", "test")
        target = root / "split" / split[index % 10] / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    data = root / "split"
    print(f"\n4. dataset-stats on a split root of {images} images (8:1:1), {workers} workers")
    timings = {}
    for label, leakage in (("--no-leakage", False), ("default (leakage)", True)):
        timings[label] = best_time(
            lambda leakage=leakage: compute_dataset_stats(data, workers=workers, leakage=leakage),
            repeat,
        )
    base = timings["--no-leakage"]
    for label, seconds in timings.items():
        print(f"   {label:<18} {seconds:7.2f} s  ({seconds / base:.2f}x)")
    shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- reduced decode

LARGE_SIZES = ((128, 96), (320, 240), (640, 480), (1024, 768), (1600, 1200), (2592, 1944))
LARGE_SIZES += ((4000, 3000),)


def large_photo(index: int):
    """A photo-like JPEG subject of one of LARGE_SIZES (portrait every other one): a smooth
    background drawn small and scaled up, shapes, noise, a blur in proportion to its size."""
    from PIL import Image, ImageFilter

    width, height = LARGE_SIZES[index % len(LARGE_SIZES)]
    if index % 2:
        width, height = height, width
    rng = np.random.default_rng([1, index])
    small = scene(rng, max(16, width // 4), max(16, height // 4), family=20_000 + index)
    image = small.resize((width, height), Image.Resampling.BILINEAR)
    noise = rng.integers(-12, 13, (height, width, 3), dtype=np.int16)
    image = Image.fromarray(np.clip(np.asarray(image, np.int16) + noise, 0, 255).astype(np.uint8))
    return image.filter(ImageFilter.GaussianBlur(0.8 * max(1.0, width / 640)))


def _make_large(task) -> str:
    folder, index = task
    path = Path(folder) / f"large_{index:04d}.jpg"
    quality = int(np.random.default_rng([2, index]).integers(70, 96))
    large_photo(index).save(path, quality=quality)
    return str(path)


def box_phash(image, reduced: bool) -> int:
    """The pHash dataset-stats used before 2026-11-30, kept here to compare speeds: a JPEG
    decoded to gray at the smallest DCT scale of at least 128 px (when `reduced`), any image
    box-reduced by an integer factor to 128-255 px, then PIL's box filter to 32x32; the DCT's
    8x8 with coefficients under 1e-6 snapped to 0."""
    from PIL import Image

    if reduced and image.format == "JPEG":
        image.draft("L", (128, 128))
    gray = image.convert("L")
    factor = min(gray.size) // 128
    if factor >= 2:
        gray = gray.reduce(factor)
    pixels = np.asarray(gray.resize((32, 32), Image.Resampling.BOX), dtype=np.float64)
    basis = np.cos(np.pi * np.outer(np.arange(8), 2 * np.arange(32) + 1) / 64)
    coefficients = (basis @ pixels @ basis.T).ravel()
    coefficients[np.abs(coefficients) < 1e-6] = 0.0
    bits = coefficients >= np.median(coefficients[1:])
    return int("".join("1" if b else "0" for b in bits), 2)


def reduced_decode(work: Path, images: int, floors: list[int], workers: int) -> None:
    """Images/s of the hash from a reduced decode (per floor; the default is 256) against the
    exact hash and the old box filter, and how many hashes differ from the exact one
    (imagededup's bits), on large photo-like JPEGs."""
    import io
    import multiprocessing

    from PIL import Image

    from torchkit.core.data.hashing import phash_image

    folder = work / "large"
    folder.mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        paths = pool.map(_make_large, [(str(folder), i) for i in range(images)])
    data = [Path(p).read_bytes() for p in paths]
    print(
        f"\n5. Reduced decode: {images} JPEGs of {LARGE_SIZES[0][0]}x{LARGE_SIZES[0][1]} to "
        f"{LARGE_SIZES[-1][0]}x{LARGE_SIZES[-1][1]}, one process, images/s by CPU time;"
        "\n   hash only (the other splits: decode as the hash likes) and decode + hash (the"
        "\n   measured split: the whole decode its statistics need, then the hash); bits apart"
        "\n   from the exact hash (imagededup's), as a histogram [0, 1, 2, ...]"
    )

    def rate(hasher, reduced: bool) -> tuple[float, list[int]]:
        start = cpu_seconds()
        hashes = []
        for d in data:
            with Image.open(io.BytesIO(d)) as image:
                if not reduced:
                    image.load()
                hashes.append(hasher(image, reduced))
        return len(data) / (cpu_seconds() - start), hashes

    for reduced in (True, False):
        label = "hash only" if reduced else "decode + hash"
        # Decode + hash: the image is loaded whole first, so draft() does nothing (the
        # measured split); hash only: a JPEG is decoded at a reduced scale (the other splits).
        exact_rate, exact = rate(lambda image, r: phash_image(image, floor=0), reduced)
        old_rate, _ = rate(box_phash, reduced)
        print(
            f"   {label}: exact {exact_rate:6.1f}/s, old box filter {old_rate:6.1f}/s, "
            f"exact / old {exact_rate / old_rate:.2f}x"
        )
        for floor in floors:
            floor_rate, hashes = rate(
                lambda image, r, f=floor: phash_image(image, floor=f), reduced
            )
            apart = np.array([bin(a ^ b).count("1") for a, b in zip(hashes, exact, strict=True)])
            print(
                f"     floor {floor:5d} px: {floor_rate:6.1f}/s ({floor_rate / old_rate:.2f}x the "
                f"old), {100 * np.mean(apart == 0):5.1f}% exact, bits apart "
                f"{np.bincount(apart).tolist()}"
            )
    shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1200, help="originals of parts 1 and 2")
    parser.add_argument("--scale", type=int, default=10_000, help="images of part 3 (0: skip)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--search-sizes",
        default="10000,100000",
        help="hash counts of the search scaling (1000000 takes minutes)",
    )
    parser.add_argument("--stats-images", type=int, default=3000, help="part 4 (0: skip)")
    parser.add_argument("--large-images", type=int, default=140, help="part 5 (0: skip)")
    parser.add_argument(
        "--floors", default="1024,512,256,128,64", help="part 5's reduced decode sizes, px"
    )
    parser.add_argument("--workers", type=int, default=None, help="default: all cores")
    args = parser.parse_args()

    from torchkit.core.stats import default_stats_workers

    workers = args.workers or default_stats_workers()
    oracle = have_imagededup()
    print(f"machine: {os.cpu_count()} CPUs, {workers} workers; Python {sys.version.split()[0]}")
    work = Path(tempfile.mkdtemp(prefix="tk-bench-neardup-"))
    try:
        root = work / "data"
        start = time.perf_counter()
        made = make_folder(root, args.images, low=128, high=640, plant=True, workers=workers)
        print(f"generated {len(made)} images in {time.perf_counter() - start:.0f} s")
        paths = [p for p, _, _ in made]
        ours = torchkit_hashes(paths, workers)
        exact = torchkit_hashes(paths, workers, floor=0)
        if oracle:
            theirs = [*imagededup_hashes(root, paths, workers)]
            name = "imagededup PHash"
        else:
            print(
                "imagededup is not installed (uv add --dev imagededup): comparing with an "
                "independent pHash written from its definition instead"
            )
            theirs = [reference_phash(p) for p in paths]
            name = "reference pHash"
        quality(made, ours, exact, theirs, name)
        speed(root, made, workers, args.repeat, oracle)
        if args.scale:
            sizes = [int(n) for n in args.search_sizes.split(",") if n]
            scaling(work, args.scale, workers, sizes)
        if args.stats_images:
            stats_cost(work, args.stats_images, workers, args.repeat)
        if args.large_images:
            floors = [int(n) for n in args.floors.split(",") if n]
            reduced_decode(work, args.large_images, floors, workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
