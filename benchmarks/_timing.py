"""Timing helpers for benchmark scripts that run a command in a fresh process.

    from _timing import best_of, compare, compare_timings, measure, measure_all, torchkit_command

`best_of` is the best (minimum) wall time of N runs after a warm-up run, which keeps the page
cache warm and filters out the noise of other processes; the minimum is the figure least
disturbed by a busy machine. `measure` also gives the best CPU time (user + system, of the
process and its children), which a shared machine disturbs far less than wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import resource
except ImportError:  # Windows: wall time only
    resource = None


@dataclass(frozen=True)
class Timing:
    wall: float  # seconds, best of the runs
    cpu: float | None  # seconds of user + system time, best of the runs (None where unknown)


def torchkit_command(*args: str) -> list[str]:
    """How a user runs torchkit: the console script beside this Python, else `python -m`."""
    script = Path(sys.executable).parent / ("torchkit.exe" if os.name == "nt" else "torchkit")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "torchkit", *args]


def _children_cpu() -> float | None:
    if resource is None:
        return None
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(
    command: Sequence[str], *, env: Mapping[str, str] | None = None, ok_codes=(0,)
) -> Timing:
    """Wall and CPU time of one run; output discarded; an unexpected exit code raises."""
    cpu_before = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(
        list(command),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        check=False,
    )
    wall = time.perf_counter() - start
    cpu_after = _children_cpu()
    if done.returncode not in ok_codes:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}: {done.stderr.decode()[-500:]}"
        )
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return Timing(wall, cpu)


def measure(
    command: Sequence[str],
    repeat: int = 5,
    *,
    warmup: int = 1,
    env: Mapping[str, str] | None = None,
    ok_codes=(0,),
) -> Timing:
    """Best wall and best CPU time of `repeat` runs of `command`, after `warmup` untimed runs."""
    for _ in range(warmup):
        run_once(command, env=env, ok_codes=ok_codes)
    runs = [run_once(command, env=env, ok_codes=ok_codes) for _ in range(max(1, repeat))]
    cpus = [run.cpu for run in runs if run.cpu is not None]
    return Timing(min(run.wall for run in runs), min(cpus) if cpus else None)


def measure_all(
    commands: Mapping[str, Sequence[str]],
    repeat: int = 5,
    *,
    warmup: int = 1,
    envs: Mapping[str, Mapping[str, str]] | None = None,
    ok_codes=(0,),
) -> dict[str, Timing]:
    """`measure` for several commands, run in turns (a, b, a, b, ...) so that a change in the
    machine's load during the benchmark hits all of them alike. Label -> best timings."""
    envs = envs or {}
    for _ in range(warmup):
        for label, command in commands.items():
            run_once(command, env=envs.get(label), ok_codes=ok_codes)
    runs: dict[str, list[Timing]] = {label: [] for label in commands}
    for _ in range(max(1, repeat)):
        for label, command in commands.items():
            runs[label].append(run_once(command, env=envs.get(label), ok_codes=ok_codes))
    best = {}
    for label, timings in runs.items():
        cpus = [t.cpu for t in timings if t.cpu is not None]
        best[label] = Timing(min(t.wall for t in timings), min(cpus) if cpus else None)
    return best


def best_of(
    command: Sequence[str],
    repeat: int = 5,
    *,
    warmup: int = 1,
    env: Mapping[str, str] | None = None,
    ok_codes=(0,),
) -> float:
    """Best wall time in seconds of `repeat` runs of `command`, after `warmup` untimed runs."""
    return measure(command, repeat, warmup=warmup, env=env, ok_codes=ok_codes).wall


def compare(label: str, seconds: float, baseline_label: str, baseline_seconds: float) -> float:
    """Print both figures and the ratio; return the ratio (torchkit / baseline)."""
    ratio = seconds / baseline_seconds
    width = max(len(label), len(baseline_label))
    print(f"{label:<{width}}  {seconds:8.3f} s")
    print(f"{baseline_label:<{width}}  {baseline_seconds:8.3f} s")
    print(f"ratio (torchkit / baseline): {ratio:.3f}  ({1 / ratio:.1f}x faster)")
    return ratio


def compare_timings(label: str, timing: Timing, baseline_label: str, baseline: Timing) -> float:
    """Print wall and CPU time of both and their ratios; return the wall-time ratio."""
    width = max(len(label), len(baseline_label))
    print(f"{'':<{width}}  {'wall':>9}  {'cpu':>9}")
    for name, value in ((label, timing), (baseline_label, baseline)):
        cpu = "n/a" if value.cpu is None else f"{value.cpu:7.3f} s"
        print(f"{name:<{width}}  {value.wall:7.3f} s  {cpu:>9}")
    ratio = timing.wall / baseline.wall
    line = f"ratio (torchkit / baseline): wall {ratio:.3f}"
    if timing.cpu and baseline.cpu:
        line += f", cpu {timing.cpu / baseline.cpu:.3f}"
    print(line)
    return ratio


def digits_checkpoint(folder: Path) -> Path:
    """best.pt of a one-epoch `train --data digits` run in `folder`/run: a model to time
    eval, predict or plots with (its accuracy does not matter)."""
    run = Path(folder) / "run"
    subprocess.run(
        [sys.executable, "-m", "torchkit", "train", "--data", "digits", "--epochs", "1",
         "--out", str(run), "-q"],
        check=True, capture_output=True,
    )  # fmt: skip
    return run / "best.pt"


def checkout_sides(now: Path, before: Path | None) -> dict[str, Path]:
    """The checkouts a `--before DIR` benchmark compares: this one ("now"), and the older one
    ("before") where given."""
    sides = {"now": now}
    if before is not None:
        sides["before"] = before.resolve()
    return sides


def json_from_checkout(checkout: Path, code: str, *args: str) -> Any:
    """Run `python -c CODE ARGS` in `checkout` (CODE puts the working folder first on sys.path,
    so that checkout's torchkit is the one timed) and read the JSON its last stdout line holds."""
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=checkout, check=True,
                          capture_output=True, text=True)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def runs_in_turns(sides: dict[str, Path], repeat: int, code: str, *args: str):
    """`json_from_checkout` of each side `repeat` times, the sides' order turned each round (so
    that neither always runs in the other's wake): yields (side, its JSON)."""
    for turn in range(repeat):
        order = list(sides.items()) if turn % 2 == 0 else list(sides.items())[::-1]
        for name, checkout in order:
            yield name, json_from_checkout(checkout, code, *args)


def print_best_ratio(best: dict[str, float]) -> None:
    """The before/now ratio of each side's best CPU seconds, where a before side ran."""
    if "before" in best:
        print(f"        best CPU s: before / now = {best['before'] / best['now']:.2f}x")


def write_index_once(index: Path, rows: int, line_of_row) -> Path:
    """A `path,label` CSV index of `rows` rows (`line_of_row(row)` each, its newline included),
    written once (through a partial file) and kept for later runs."""
    if not index.exists():
        index.parent.mkdir(parents=True, exist_ok=True)
        partial = index.with_suffix(".partial")
        with open(partial, "w", encoding="utf-8") as out:
            out.write("path,label\n")
            for row in range(rows):
                out.write(line_of_row(row))
        partial.replace(index)
    return index
