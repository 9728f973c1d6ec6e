"""Benchmark: `torchkit train` for one epoch on WebDataset shards on disk against the same shards
served over HTTP by a local http.server (python's ThreadingHTTPServer, in this process), read
through torchkit's cache: first with an empty cache (every shard downloaded), then with the
cache filled (a HEAD request per shard, no download; with --manifest, not even that).

Each run is a real `torchkit train` process (start-up and all), tiny convnet, so the figures
are what the data path costs: the ratio http/local shows what the cache adds to a run.

    uv run python benchmarks/bench_http_shards.py                   # 2,000 32x32 PNGs
    uv run python benchmarks/bench_http_shards.py --images 20000 --size 64 --repeat 3
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import run_once, torchkit_command  # noqa: E402


def make_png_folder(root: Path, images: int, size: int, classes: int = 10) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for index in range(images):
        folder = root / f"class_{index % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img_{index:06d}.png")


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(folder: Path) -> ThreadingHTTPServer:
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--per-shard", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--manifest", action="store_true", help="keep convert's manifest.json beside the shards"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-http-shards-"))
    try:
        make_png_folder(work / "images", args.images, args.size)
        run_once(
            torchkit_command(
                "convert", "shards", str(work / "images"), str(work / "served"),
                "--per-shard", str(args.per_shard), "--quiet",
            )
        )  # fmt: skip
        if not args.manifest:
            (work / "served" / "manifest.json").unlink()
        shards = sorted(p.name for p in (work / "served").glob("*.tar"))
        pattern = f"shard-{{000000..{len(shards) - 1:06d}}}.tar"
        server = serve(work / "served")
        url = f"http://127.0.0.1:{server.server_address[1]}/{pattern}"
        print(f"{args.images} {args.size}x{args.size} PNGs in {len(shards)} shards", flush=True)

        def train(data: str, run: int, cache: Path):
            return run_once(
                torchkit_command(
                    "train", "--data", data, "--model", "convnet",
                    "--image-size", str(args.size), "--epochs", "1", "--batch-size", "64",
                    "--device", "cpu", "--out", str(work / f"run-{run}"), "--quiet",
                ),
                env={"TORCHKIT_CACHE": str(cache)},
            ).wall  # fmt: skip

        train(str(work / "served" / pattern), -1, work / "cache-warm-up")  # imports, page cache
        times: dict[str, list[float]] = {"local": [], "http cold": [], "http warm": []}
        for turn in range(args.repeat):  # in turns: a busy machine slows all three alike
            cache = work / f"cache-{turn}"
            times["local"].append(train(str(work / "served" / pattern), 3 * turn, cache))
            times["http cold"].append(train(url, 3 * turn + 1, cache))
            times["http warm"].append(train(url, 3 * turn + 2, cache))
        server.shutdown()
        best = {label: min(values) for label, values in times.items()}
        for label, seconds in best.items():
            spread = statistics.pstdev(times[label]) if len(times[label]) > 1 else 0.0
            print(f"{label:<10} {seconds:8.3f} s  (best of {args.repeat}, sd {spread:.3f})")
        for label in ("http cold", "http warm"):
            print(f"ratio ({label} / local): {best[label] / best['local']:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
