"""Benchmark: `torchkit predict` (or eval/extract-features-like readers: every command that reads
in order) over a `convert shards` folder streamed from a slow web server, each next shard
fetched while one is read (as torchkit does) against each shard fetched when a reader first
needs it (as before), from an empty cache each run, in turns.

The server is python's ThreadingHTTPServer in this process, sending every response at --rate
MB/s (one connection to a remote bucket), so the figure is how much of the downloading the
fetch ahead hides behind decoding and the model. Each run is a real `torchkit predict` process;
the baseline turns `StreamedShards.read_in_order` into a no-op before the CLI starts.

    uv run python benchmarks/bench_fetch_ahead.py                 # 2,000 64x64 PNGs, 10 shards
    uv run python benchmarks/bench_fetch_ahead.py --workers 0 --rate 4 --repeat 3
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import digits_checkpoint, run_once, torchkit_command  # noqa: E402
from bench_http_shards import make_png_folder  # noqa: E402

WITHOUT_FETCH_AHEAD = (
    "import sys; from torchkit.core.data.sources import http_shards as h; "
    "h.StreamedShards.read_in_order = lambda self, locators: None; "
    "from torchkit.cli import main; sys.argv[0] = 'torchkit'; main()"
)
CHUNK = 64 * 1024


class _SlowHandler(SimpleHTTPRequestHandler):
    rate = 2e6  # bytes per second, set by main

    def log_message(self, *args) -> None:
        pass

    def copyfile(self, source, outputfile) -> None:
        while chunk := source.read(CHUNK):
            outputfile.write(chunk)
            time.sleep(len(chunk) / self.rate)  # the link's speed (a benchmark, not a test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--per-shard", type=int, default=200)
    parser.add_argument("--rate", type=float, default=8.0, help="the server's MB/s")
    parser.add_argument("--workers", type=int, help="predict --workers (default: torchkit's)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--limit-shards", type=int, default=0,
        help="TORCHKIT_CACHE_LIMIT as this many shards (0: no limit)",
    )  # fmt: skip
    args = parser.parse_args()
    _SlowHandler.rate = args.rate * 1e6

    work = Path(tempfile.mkdtemp(prefix="bench-fetch-ahead-"))
    try:
        make_png_folder(work / "images", args.images, args.size)
        run_once(
            torchkit_command(
                "convert", "shards", str(work / "images"), str(work / "served"),
                "--per-shard", str(args.per_shard), "--quiet",
            )
        )  # fmt: skip
        checkpoint = digits_checkpoint(work)
        shards = sorted((work / "served").glob("*.tar"))
        megabytes = sum(p.stat().st_size for p in shards) / 1e6
        limit = args.limit_shards * max(p.stat().st_size for p in shards)
        environment = {"TORCHKIT_CACHE_LIMIT": str(limit)} if limit else {}
        handler = functools.partial(_SlowHandler, directory=str(work / "served"))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        print(
            f"{args.images} {args.size}x{args.size} PNGs in {len(shards)} shards, "
            f"{megabytes:.1f} MB served at {args.rate:g} MB/s ({megabytes / args.rate:.1f} s "
            f"of downloading), cache limit {args.limit_shards or 'none'} shards",
            flush=True,
        )
        workers = [] if args.workers is None else ["--workers", str(args.workers)]
        predict_args = ["predict", str(checkpoint), url, "--device", "cpu", "--quiet", *workers]
        sides = {
            "fetched ahead": torchkit_command(*predict_args),
            "when needed": [sys.executable, "-c", WITHOUT_FETCH_AHEAD, *predict_args],
        }
        times: dict[str, list[float]] = {label: [] for label in sides}
        for turn in range(args.repeat):
            order = list(sides) if turn % 2 == 0 else list(reversed(sides))
            for label in order:
                rows = ["-o", str(work / f"rows-{turn}-{label[0]}.csv")]
                cache = work / f"cache-{turn}-{label[0]}"  # empty: every shard downloaded
                times[label].append(
                    run_once(
                        [*sides[label], *rows], env={"TORCHKIT_CACHE": str(cache), **environment}
                    ).wall
                )
        server.shutdown()
        medians = {label: statistics.median(values) for label, values in times.items()}
        for label, values in times.items():
            runs = ", ".join(f"{value:.2f}" for value in values)
            print(f"{label:<14} median {medians[label]:6.2f} s  ({runs})")
        ratio = medians["when needed"] / medians["fetched ahead"]
        print(f"ratio (when needed / fetched ahead; above 1: fetched ahead is faster): {ratio:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
