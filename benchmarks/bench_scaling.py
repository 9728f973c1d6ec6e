"""Benchmark: how the set-up of every command that lists or indexes data grows with the number
of images (10k, 100k, 1M), in seconds and peak memory.

The data: tiny 8x8 PNGs (a few hundred distinct ones, hard-linked) spread over 100 classes,
built once under ROOT/n<N>/ and reused: ROOT/n<N>/images/<class>/<image> (an image folder) and
ROOT/n<N>/index.csv (a CSV index `path,label` of the same files); `--classes K` spreads them
over K classes instead, under ROOT/n<N>-c<K>/. Each command runs as a real
`python -m torchkit` process, once per data layout and size, with stderr on a pseudo-terminal
so that its progress bar is drawn; the figure is the time until:

- train (convnet, 8x8): its first optimiser step (the bar's first step; SIGTERM then stops it
  cleanly after that step);
- eval, predict (`--format csv -o`) and extract-features (untrained convnet): the first batch is
  counted;
- dataset-stats: the listing is done (the bar shows its total) and, up to --full-stats-max
  images, the whole run (every image is read: that part is linear by nature);
- split --mode manifest: the whole run.

`--layouts stdin` pipes the files' absolute paths (ROOT/n<N>/paths.txt) to `extract-features
convnet - OUT` (the other commands take no stdin) and runs it to the end: the figure is still its
first batch, the peak that of the whole run (rows and index.csv written as the paths come).

A command still running after --timeout seconds is stopped and reported as such. Peak memory
is the largest resident set of the process tree (`wait4`'s ru_maxrss: the main process or one
of its workers, not their sum). The growth factor is how much the figure grows per 10x images:
about 10 is linear, well over 10 super-linear, under 10 a fixed cost still dominating.

    uv run python benchmarks/bench_scaling.py                   # 10k and 100k
    uv run python benchmarks/bench_scaling.py --sizes 1000000 --timeout 600
    cd OLD_CHECKOUT && python /path/to/bench_scaling.py --tree .  # an older torchkit
    uv run python benchmarks/bench_scaling.py --sizes 100000 --profile /tmp/prof  # cProfile
    uv run python benchmarks/bench_scaling.py --commands extract-features --layouts stdin \
        --sizes 5000,50000    # `find ... | torchkit extract-features convnet - OUT`, whole run

Benchmarks are not tests: they print figures (and, with --json FILE, save them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CLASSES = 100
DISTINCT = 300  # distinct PNGs, hard-linked over and over (ext4 allows 65,000 links a file)
LAYOUTS = ("folder", "csv")  # and "stdin", asked for: extract-features only
STDIN_COMMANDS = ("extract-features",)
LAYOUT_NAMES = {"folder": "image folder", "csv": "CSV index", "stdin": "paths piped for -"}
COMMANDS = ("train", "eval", "extract-features", "predict", "dataset-stats", "split")
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")
COUNT = re.compile(r"(\d+)/(\d+|\?)")  # a progress bar's done/total


def build_data(root: Path, images: int) -> Path:
    """ROOT/n<images>/ with images/<class>/img_<i>.png and index.csv (made once, then reused)."""
    import numpy as np
    from PIL import Image

    folder = root / (f"n{images}" if CLASSES == 100 else f"n{images}-c{CLASSES}")
    index = folder / "index.csv"
    if index.exists():
        return folder
    sources = root / "sources"
    sources.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(DISTINCT):
        pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        if not (sources / f"s{i:03d}.png").exists():
            Image.fromarray(pixels).save(sources / f"s{i:03d}.png")
    started = time.perf_counter()
    for c in range(CLASSES):
        (folder / "images" / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    partial = folder / "index.csv.partial"
    with open(partial, "w", encoding="utf-8") as out:
        out.write("path,label\n")
        for i in range(images):
            label = f"class_{i % CLASSES:03d}"
            relative = f"images/{label}/img_{i:07d}.png"
            target = folder / relative
            if not target.exists():
                os.link(sources / f"s{i % DISTINCT:03d}.png", target)
            out.write(f"{relative},{label}\n")
    partial.replace(index)
    print(f"built {folder} ({images:,} images) in {time.perf_counter() - started:.1f} s")
    return folder


def path_list(folder: Path) -> Path:
    """FOLDER/paths.txt: the absolute paths of index.csv's files, one a line (made once)."""
    listed = folder / "paths.txt"
    if not listed.exists():
        lines = (folder / "index.csv").read_text(encoding="utf-8").splitlines()[1:]
        partial = folder / "paths.txt.partial"
        partial.write_text(
            "".join(f"{folder.resolve() / line.split(',')[0]}\n" for line in lines),
            encoding="utf-8",
        )
        partial.replace(listed)
    return listed


@dataclass
class Run:
    seconds: float | None  # the figure (None: the mark never came)
    peak_mb: float
    exit_code: int
    timed_out: bool = False
    marks: dict[str, float] = field(default_factory=dict)
    last_line: str = ""  # of stderr: an error names itself there
    figure: str = ""  # the mark that is the figure

    def notes(self) -> str:
        """The error of a failed run, else the marks other than the figure."""
        if self.exit_code not in (0, 143) and not self.timed_out:
            return self.last_line
        others = [(k, v) for k, v in self.marks.items() if k not in (self.figure, "exit")]
        return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in others)


def run_watched(
    command: list[str],
    cwd: Path,
    marks: dict,
    stop_after: str | None,
    timeout: float,
    stdin: Path | None = None,
) -> Run:
    """Run `command` with stderr on a pseudo-terminal; `marks` maps a name to a predicate on a
    progress line (`(done, total)` of its bar, or the text); the time of each mark's first
    match is kept. Once `stop_after` is marked, SIGTERM asks the command to stop (every
    command then ends cleanly, train after its current step)."""
    leader, follower = os.openpty()
    env = {**os.environ, "COLUMNS": "250", "TERM": "xterm"}
    started = time.perf_counter()
    piped = open(stdin, "rb") if stdin else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        command, cwd=cwd, stdin=piped, stdout=subprocess.DEVNULL, stderr=follower, env=env,
    )  # fmt: skip
    os.close(follower)
    if stdin:
        piped.close()  # the child has its own
    found: dict[str, float] = {}
    text = last_line = ""
    status = None
    stopped = timed_out = False
    deadline = started + timeout
    try:
        while status is None:
            ready, _, _ = select.select([leader], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(leader, 1 << 16)
                except OSError:  # the terminal closed: every writer has exited
                    chunk = b""
                now = time.perf_counter() - started
                text += ANSI.sub("", chunk.decode("utf-8", "replace")).replace("\r", "\n")
                *lines, text = text.split("\n")
                for line in lines:
                    last_line = line.strip() or last_line
                    counts = COUNT.findall(line)
                    count = counts[-1] if counts else None
                    for name, matches in marks.items():
                        if name not in found and matches(line, count):
                            found[name] = now
                if stop_after in found and not stopped:
                    process.send_signal(signal.SIGTERM)
                    stopped = True
            pid, wait_status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                status = wait_status
                break
            if time.perf_counter() > deadline and not timed_out:
                timed_out = True
                process.send_signal(signal.SIGTERM)
                deadline += 30  # then SIGKILL
            elif timed_out and time.perf_counter() > deadline:
                process.kill()
    finally:
        os.close(leader)
    process.returncode = os.waitstatus_to_exitcode(status)
    found["exit"] = time.perf_counter() - started
    return Run(None, usage.ru_maxrss / 1024, process.returncode, timed_out, found, last_line)


def listed(images: int):
    return lambda line, count: count is not None and count[1] == str(images)


def first_counted(line: str, count) -> bool:
    return count is not None and count[0] != "0"


def plans(data: Path, layout: str, images: int, work: Path, full_stats: bool) -> dict:
    """command -> (torchkit arguments, marks, the mark that is the figure, stop after)."""
    spec = {"folder": str(data / "images"), "csv": str(data / "index.csv"), "stdin": "-"}[layout]
    out = work / f"out-{layout}-{images}"
    model = ["--image-size", "8"]
    untrained = ["--model", "convnet", "--allow-untrained", *model]
    return {
        "train": (
            [
                "train",
                "--data",
                spec,
                "--model",
                "convnet",
                *model,
                "--epochs",
                "1",
                "--out",
                str(out / "train"),
                "--force",
            ],
            {
                "first step": lambda line, count: (
                    line.startswith("epoch ") and first_counted(line, count)
                )
            },
            "first step",
            "first step",
        ),  # fmt: skip
        "eval": (
            ["eval", *untrained, "--num-classes", str(CLASSES), "--data", spec],
            {"first batch": first_counted},
            "first batch",
            "first batch",
        ),  # fmt: skip
        "extract-features": (
            ["extract-features", *untrained, spec, str(out / "features"), "--force"],
            {"first batch": first_counted},
            "first batch",
            None if layout == "stdin" else "first batch",  # stdin: the whole run's memory
        ),  # fmt: skip
        "predict": (
            [
                "predict",
                *untrained,
                spec,
                "--format",
                "csv",
                "-o",
                str(out / "predict.csv"),
                "--force",
            ],
            {"first batch": first_counted},
            "first batch",
            "first batch",
        ),  # fmt: skip
        "dataset-stats": (
            ["dataset-stats", spec],
            {"listed": listed(images)},
            "exit" if full_stats else "listed",
            None if full_stats else "listed",
        ),  # fmt: skip
        "split": (
            ["split", spec, str(out / "split"), "--mode", "manifest", "--force"],
            {},
            "exit",
            None,
        ),  # fmt: skip
    }


def measure(
    command: str, layout: str, images: int, data: Path, work: Path, args: argparse.Namespace
) -> Run:
    """One run of `command` on `images` images laid out as `layout`."""
    full = images <= args.full_stats_max
    arguments, marks, figure, stop_after = plans(data, layout, images, work, full)[command]
    torchkit = [sys.executable, "-m", "torchkit"]
    if args.profile:
        profile = args.profile / f"{command}-{layout}-{images}.prof"
        torchkit = [sys.executable, __file__, "--run-profiled", str(profile), "--"]
    stdin = path_list(data) if layout == "stdin" else None
    watched = [*torchkit, *arguments], args.tree, marks, stop_after, args.timeout, stdin
    run = run_watched(*watched)
    if run.exit_code == 2 and "--allow-untrained" in run.last_line:
        # An older torchkit ran untrained models without being asked.
        arguments.remove("--allow-untrained")
        run = run_watched(*watched)
    run.figure = figure
    run.seconds = run.marks.get(figure)
    return run


def growth(previous: tuple[int, float] | None, images: int, value: float | None) -> str:
    """The factor `value` grows by per 10x images, from the previous size's figure."""
    if previous is None or value is None or not previous[1]:
        return ""
    decades = math.log10(images / previous[0])
    return f"{(value / previous[1]) ** (1 / decades):.1f}x" if decades else ""


def run_profiled(output: str, arguments: list[str]) -> None:
    """`python -m torchkit ARGUMENTS` (of the working directory's torchkit) under cProfile,
    the profile written at exit: a stopped command ends through its atexit handlers and
    `os._exit`, which `python -m cProfile` never sees."""
    import atexit
    import cProfile
    import runpy

    profile = cProfile.Profile()

    def save() -> None:
        profile.disable()
        profile.dump_stats(output)

    atexit.register(save)
    sys.path.insert(0, os.getcwd())
    sys.argv = ["torchkit", *arguments]
    profile.enable()
    runpy.run_module("torchkit", run_name="__main__", alter_sys=True)


def main() -> None:
    global CLASSES
    if sys.argv[1:2] == ["--run-profiled"]:  # the --profile runs: OUTPUT -- ARGUMENTS
        run_profiled(sys.argv[2], sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="numbers of images, e.g. 10000")
    parser.add_argument("--commands", default=",".join(COMMANDS))
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="folder, csv, stdin")
    parser.add_argument("--root", type=Path, default=Path("/tmp/scaling"))
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose torchkit runs (default: this one)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--full-stats-max", type=int, default=100_000,
                        help="dataset-stats reads every image up to this many images")  # fmt: skip
    parser.add_argument("--profile", type=Path, help="write a cProfile of each run here")
    parser.add_argument("--classes", type=int, default=CLASSES, help="classes of the data")
    parser.add_argument("--json", type=Path, help="also save the figures to this file")
    args = parser.parse_args()
    CLASSES = args.classes
    sizes = [int(s) for s in args.sizes.split(",")]
    commands = args.commands.split(",")
    layouts = args.layouts.split(",")
    work = args.root / "runs"
    work.mkdir(parents=True, exist_ok=True)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    data = {n: build_data(args.root, n) for n in sizes}
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; torchkit from "
          f"{args.tree.resolve()}")  # fmt: skip
    results: dict[str, dict[str, dict[int, dict]]] = {}
    for command in commands:
        for layout in layouts:
            if layout == "stdin" and command not in STDIN_COMMANDS:
                continue
            print(f"\n{command} ({LAYOUT_NAMES[layout]})")
            print(f"{'images':>10}  {'figure':<12} {'seconds':>8}  {'growth':>7}  "
                  f"{'peak MB':>8}  {'growth':>7}  exit")  # fmt: skip
            previous = None
            rows = results.setdefault(command, {}).setdefault(layout, {})
            for n in sizes:
                run = measure(command, layout, n, data[n], work, args)
                shown = "timed out" if run.timed_out else f"{run.seconds or float('nan'):8.2f}"
                print(
                    f"{n:>10,}  {run.figure:<12} {shown:>8}  "
                    f"{growth(previous and previous[:2], n, run.seconds):>7}  "
                    f"{run.peak_mb:8.0f}  "
                    f"{growth(previous and (previous[0], previous[2]), n, run.peak_mb):>7}  "
                    f"{run.exit_code:>4}  {run.notes()}",
                    flush=True,
                )
                if not run.timed_out:
                    previous = (n, run.seconds, run.peak_mb)
                rows[n] = {
                    "figure": run.figure,
                    "seconds": run.seconds,
                    "peak_mb": round(run.peak_mb, 1),
                    "exit_code": run.exit_code,
                    "timed_out": run.timed_out,
                    "marks": {k: round(v, 3) for k, v in run.marks.items()},
                }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
