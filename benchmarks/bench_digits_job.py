"""Benchmark: the README's main job, `torchkit train --data digits`, whole process, wall time, CPU
time (user + system: the job runs one torch thread, and a shared machine disturbs it less than wall
time) and test top-1 of best.pt; against the same job on torch's default thread count
(`--threads 0`, what it ran on before digits defaulted to one thread), in turns; then the ratio
of the two medians.

    uv run python benchmarks/bench_digits_job.py [--repeat 3] [--busy] [--before DIR]
        [--seeds 0,1,2,3,4,5,6,7] [-- MORE TRAIN OPTIONS]

`--busy` keeps one other busy process (a Python spin loop) running beside the timed runs: a
shared machine. `--before DIR` times an old checkout's job (`python -m torchkit` run in DIR, so
DIR's torchkit is imported) instead of `--threads 0`. `--seeds` then runs the job once per seed
(no baseline) and prints each seed's test top-1 of best.pt and of its EMA weights. Options after
`--` go to every run (`-- --epochs 3`: a shorter job, e.g. for `--busy`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _timing import Timing, _children_cpu, run_once, torchkit_command


def job(folder: Path, label: str, *extra: str) -> list[str]:
    """The README command, its run folder and summary in `folder`, then `extra` options."""
    return [
        "train", "--data", "digits", "--force", "--out", str(folder / label),
        "-o", str(folder / f"{label}.json"), "--format", "json", *extra,
    ]  # fmt: skip


def test_top1(folder: Path, label: str) -> tuple[float, float | None]:
    summary = json.loads((folder / f"{label}.json").read_text())
    return summary["test_top1"], summary.get("test_ema_top1")


def timed(command: list[str], cwd: str | None = None) -> Timing:
    if cwd is None:
        return run_once(command)
    cpu = _children_cpu()
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    wall = time.perf_counter() - start
    return Timing(wall, None if cpu is None else _children_cpu() - cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each, in turns")
    parser.add_argument("--busy", action="store_true", help="one busy process beside the runs")
    parser.add_argument("--before", help="an old checkout to time instead of --threads 0")
    parser.add_argument("--seeds", help="comma-separated seeds: accuracy of each, no baseline")
    parser.add_argument("extra", nargs="*", help="more train options for every run")
    args = parser.parse_args()
    busy = None
    if args.busy:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            if args.seeds:
                for seed in args.seeds.split(","):
                    label = f"seed{seed}"
                    wall = timed(
                        torchkit_command(*job(folder, label, "--seed", seed, *args.extra))
                    ).wall
                    top1, ema = test_top1(folder, label)
                    print(
                        f"seed {seed}: test top-1 {top1:.4f} (EMA weights {ema:.4f}), {wall:.2f} s"
                    )
                return 0
            commands = {
                "the job": (torchkit_command(*job(folder, "new", *args.extra)), None, "new")
            }
            if args.before:
                old = [sys.executable, "-m", "torchkit", *job(folder, "old", *args.extra)]
                commands["before"] = (old, args.before, "old")
            else:
                threads0 = torchkit_command(*job(folder, "old", "--threads", "0", *args.extra))
                commands["--threads 0"] = (threads0, None, "old")
            timings: dict[str, list[Timing]] = {name: [] for name in commands}
            for _ in range(max(1, args.repeat)):
                for name, (command, cwd, _) in commands.items():
                    timings[name].append(timed(command, cwd))
            medians: dict[str, tuple[float, float | None]] = {}
            for name, (_, _, label) in commands.items():
                top1, _ = test_top1(folder, label)
                walls = [t.wall for t in timings[name]]
                cpus = [t.cpu for t in timings[name] if t.cpu is not None]
                medians[name] = (
                    statistics.median(walls),
                    statistics.median(cpus) if cpus else None,
                )
                runs = ", ".join(f"{w:.2f}" for w in walls)
                cpu = f", CPU median {statistics.median(cpus):6.2f} s" if cpus else ""
                cpu_runs = f" ({', '.join(f'{c:.2f}' for c in cpus)})" if cpus else ""
                print(
                    f"{name:<12} wall median {statistics.median(walls):6.2f} s ({runs}){cpu}"
                    f"{cpu_runs}, test top-1 {top1:.4f}"
                )
            (job_wall, job_cpu), (base_wall, base_cpu) = medians.values()
            baseline = list(medians)[1]
            line = f"ratio (the job / {baseline}, less is faster): wall {job_wall / base_wall:.3f}"
            if job_cpu and base_cpu:
                line += f", CPU {job_cpu / base_cpu:.3f}"
            print(line)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
