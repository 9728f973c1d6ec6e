"""Benchmark: whole runs of `predict` and `extract-features` at 10k, 100k (and 1M) images:
set-up until the first batch, CPU per image, and how the memory grows while rows are written.

The data is bench_scaling.py's (ROOT/n<N>/images/<class>/img_<i>.png, 300 distinct 8x8 PNGs
hard-linked in 100 classes, and ROOT/n<N>/index.csv of the same files); the model a `convnet`
checkpoint from one epoch on the built-in digits (8x8, trained once under ROOT/model/). Each run
is one `python -m torchkit` process with stderr on a pseudo-terminal (its progress bar drawn,
each count seen as it comes). Figures of a run:

- first batch: wall and main-process CPU seconds until the bar's first count (the listing, the
  label tables, the output checks, the model, the loader's workers forked), and the main
  process's anonymous memory then (`RssAnon`: Python's objects, not a memory map's pages);
- whole run: CPU seconds of the process and its loader workers (`wait4`), the peak resident set
  of the largest of them, and the output's bytes;
- growth: how much the main process's `RssAnon` (and `RssFile`, the pages of memory-mapped
  files: extract-features' arrays were, before they were written with `pwrite`) grew from 10% of
  the images done to 90%, per image: what the run keeps for every image it has written (0 where
  rows are streamed and let go); and the main process's CPU per image over the same stretch
  (its workers decode the images: the rest of the run's CPU).

CPU per image is the whole run's CPU over the images; the slope between two sizes (the start,
torch's import and the model, is a fixed cost) is what an image costs at any size: linear
means the same slope at every pair of sizes.

    uv run python benchmarks/bench_inference_scale.py --sizes 10000,100000
    uv run python benchmarks/bench_inference_scale.py --sizes 1000000 --commands predict-csv

Data is built once under --root and reused (100k: 100k links, 10 MB of index); remove it when
done. Benchmarks are not tests: they print figures.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scaling  # noqa: E402

TREE = Path(__file__).resolve().parents[1]


def commands(model: Path, data: str, out: Path, layer: str | None = None) -> dict[str, list[str]]:
    """name -> torchkit arguments (each writes under `out`); extract-features of `layer`."""
    predict = ["predict", str(model), data, "--format"]
    features = ["extract-features", str(model), data, str(out / "features")]
    features += ["-l", layer] if layer else []
    return {
        "predict-csv": [*predict, "csv", "-o", str(out / "p.csv")],
        "predict-jsonl": [*predict, "jsonl", "-o", str(out / "p.jsonl")],
        "extract-features": features,
        "extract-features-safetensors": [*features, "--array-format", "safetensors"],
        "extract-features-pt": [*features, "--array-format", "pt"],
    }


def trained_model(root: Path) -> Path:
    """ROOT/model/best.pt: convnet, one epoch on digits (made once)."""
    best = root / "model" / "best.pt"
    if not best.exists():
        subprocess.run(
            [sys.executable, "-m", "torchkit", "train", "--epochs", "1", "--device", "cpu",
             "--out", str(root / "model"), "--force"],
            cwd=TREE, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    return best


def status(pid: int) -> dict[str, int]:
    """The process's RssAnon, RssFile and VmHWM in bytes (nothing once it has gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found


def cpu_seconds(pid: int) -> float:
    """The process's own user + system CPU seconds so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def watched(arguments: list[str], images: int, timeout: float) -> dict:
    """One `python -m torchkit ARGUMENTS` process, stderr on a pseudo-terminal."""
    leader, follower = os.openpty()
    env = {**os.environ, "COLUMNS": "250", "TERM": "xterm"}
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "torchkit", *arguments], cwd=TREE, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=follower, env=env,
    )  # fmt: skip
    os.close(follower)
    marks: dict[str, dict] = {}  # first batch, 10%, 90%: wall, main CPU, memory
    wanted = {"first": 1, "10%": images // 10, "90%": images * 9 // 10}
    text = last_line = ""
    wait_status = usage = None
    timed_out = False
    try:
        while wait_status is None:
            ready, _, _ = select.select([leader], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(leader, 1 << 16)
                except OSError:
                    chunk = b""
                text += bench_scaling.ANSI.sub("", chunk.decode("utf-8", "replace"))
                *lines, text = text.replace("\r", "\n").split("\n")
                for line in lines:
                    last_line = line.strip() or last_line
                    counts = bench_scaling.COUNT.findall(line)
                    done = int(counts[-1][0]) if counts else 0
                    for name, at in wanted.items():
                        if name not in marks and done >= max(1, at):
                            marks[name] = {
                                "wall": time.perf_counter() - started,
                                "cpu": cpu_seconds(process.pid),
                                "done": done,
                                **status(process.pid),
                            }
            pid, wait_status_now, usage_now = os.wait4(process.pid, os.WNOHANG)
            if pid:
                wait_status, usage = wait_status_now, usage_now
                break
            if time.perf_counter() - started > timeout and not timed_out:
                timed_out = True
                process.send_signal(signal.SIGTERM)
    finally:
        os.close(leader)
    return {
        "wall": time.perf_counter() - started,
        "cpu": usage.ru_utime + usage.ru_stime,
        "peak_mb": usage.ru_maxrss / 1024,
        "exit": os.waitstatus_to_exitcode(wait_status),
        "timed_out": timed_out,
        "marks": marks,
        "last": last_line,
    }


def growth(marks: dict, key: str) -> float | None:
    """How much of `key` (bytes, CPU s) the main process gained per image from 10% done to 90%."""
    low, high = marks.get("10%"), marks.get("90%")
    if not low or not high or key not in low or high["done"] <= low["done"]:
        return None
    return (high[key] - low[key]) / (high["done"] - low["done"])


def shown(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="numbers of images")
    parser.add_argument("--commands", default="predict-csv,predict-jsonl,extract-features")
    parser.add_argument("--layouts", default="folder,csv", help="folder, csv")
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench_inference_scale"))
    parser.add_argument("--timeout", type=float, default=480.0, help="seconds a run")
    parser.add_argument(
        "--layer",
        help="extract-features' layer (default its own: penultimate, 128 float32 an image; "
        "classifier.0: 1,024)",
    )
    args = parser.parse_args()
    model = trained_model(args.root)
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {when} UTC, "
          f"load {os.getloadavg()[0]:.1f}; model {model}")  # fmt: skip
    print(
        f"{'run':<38} {'images':>9}  {'first batch: s, CPU s, anon MB':>31}  "
        f"{'whole: wall s, CPU s, peak MB':>30}  {'CPU us/img':>10}  "
        f"{'grows B/img: anon, file':>23}  {'main us/img':>11}  {'output MB':>9}  exit"
    )
    previous: dict[str, tuple[int, float]] = {}
    for images in [int(s) for s in args.sizes.split(",")]:
        folder = bench_scaling.build_data(args.root, images)
        layouts = {"folder": str(folder / "images"), "csv": str(folder / "index.csv")}
        for command in args.commands.split(","):
            for layout in args.layouts.split(","):
                out = args.root / "runs" / f"{command}-{layout}-{images}"
                out.mkdir(parents=True, exist_ok=True)
                arguments = [*commands(model, layouts[layout], out, args.layer)[command], "--force"]
                result = watched(arguments, images, args.timeout)
                first = result["marks"].get("first", {})
                written = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
                anon, file = growth(result["marks"], "RssAnon"), growth(result["marks"], "RssFile")
                main_cpu = growth(result["marks"], "cpu")
                name = f"{command} ({layout})"
                slope = ""
                if name in previous and not result["timed_out"]:
                    n0, cpu0 = previous[name]
                    slope = f"  slope {(result['cpu'] - cpu0) / (images - n0) * 1e6:.0f} us/img"
                if not result["timed_out"] and result["exit"] == 0:
                    previous[name] = (images, result["cpu"])
                print(
                    f"{name:<38} {images:>9,}  "
                    f"{shown(first.get('wall'), 9, 2)}, {shown(first.get('cpu'), 6, 2)}, "
                    f"{shown(first.get('RssAnon', 0) / 2**20, 6, 0)}   "
                    f"{result['wall']:9.1f}, {result['cpu']:7.1f}, {result['peak_mb']:6.0f}  "
                    f"{result['cpu'] / images * 1e6:10.0f}  "
                    f"{shown(anon, 12, 1)}, {shown(file, 9, 1)}  "
                    f"{shown(main_cpu and main_cpu * 1e6, 11, 0)}  "
                    f"{written / 1e6:9.1f}  {result['exit']}"
                    + (" TIMED OUT" if result["timed_out"] else "")
                    + (f"  {result['last']}" if result["exit"] not in (0,) else "")
                    + slope,
                    flush=True,
                )
                for path in sorted(out.rglob("*"), reverse=True):  # the output is not kept
                    path.unlink() if path.is_file() else path.rmdir()


if __name__ == "__main__":
    main()
