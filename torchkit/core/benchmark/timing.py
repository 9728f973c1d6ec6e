"""The timing loop: warm-up steps first (not timed), then timed steps until `iters` of them or
`seconds` of timed work, each step timed alone so that the median and p90 latency per batch come
out along with the throughput.

On CUDA the caller passes `sync` (`torch.cuda.synchronize`): it runs once after the warm-up and
after every timed step, so each time covers the GPU work of its step, not just the kernel
launches. The clock is read once per step boundary, so the step times add up to the wall time of
the whole timed region (loop overhead included, as a real loop pays it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torchkit.core.io.errors import UsageError


@dataclass(frozen=True)
class Timings:
    """Seconds per timed step (the warm-up excluded)."""

    steps: tuple[float, ...]

    @property
    def iters(self) -> int:
        return len(self.steps)

    @property
    def total(self) -> float:
        return sum(self.steps)

    @property
    def median(self) -> float:
        return percentile(self.steps, 50)

    @property
    def p90(self) -> float:
        return percentile(self.steps, 90)

    def per_second(self, items_per_step: int) -> float:
        """Items (images) per second over the whole timed region."""
        return items_per_step * self.iters / self.total if self.total > 0 else math.inf


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between the closest ranks (NumPy's
    default), so the median of an even count is the mean of the middle two."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# The most steps --iters and --warmup take, and the most --seconds of timed work: ten million
# steps of a tiny model take minutes, a day of timing is far past any figure's need, while
# --iters 99999999999999999999 started a benchmark that never ended.
MOST_STEPS = 10_000_000
MOST_SECONDS = 86_400


def check_budget(iters: int | None, seconds: float | None, warmup: int = 0) -> None:
    """One of `iters` (a count) or `seconds` (a time budget), not both; `warmup` untimed steps
    before them: each within its bounds."""
    from torchkit.core.io.errors import short_repr
    from torchkit.core.option_specs import range_text

    if iters is not None and seconds is not None:
        raise UsageError("--iters and --seconds both given", "give one of them")
    if iters is not None and iters < 1:
        raise UsageError(f"--iters {iters}: at least 1 timed step is needed")
    if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
        raise UsageError(f"--seconds {seconds}: give a positive number of seconds")
    for option, value, least in (("--iters", iters, 1), ("--warmup", warmup, 0)):
        if value is not None and value > MOST_STEPS:
            raise UsageError(
                f"{option} {short_repr(value)} is out of range",
                f"give {range_text(least, MOST_STEPS)}",
            )
    if seconds is not None and seconds > MOST_SECONDS:
        raise UsageError(
            f"--seconds {short_repr(seconds)} is more than a day of timing",
            f"give {range_text(None, MOST_SECONDS, whole=False)}",
        )


def time_steps(
    step: Callable[[], object],
    *,
    warmup: int,
    iters: int | None = None,
    seconds: float | None = None,
    sync: Callable[[], object] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Timings:
    """Run `step` `warmup` times untimed, then time it: `iters` steps, or as many as fit in
    `seconds` of timed work (at least one). Neither given: one timed step."""
    check_budget(iters, seconds, warmup)
    for _ in range(warmup):
        step()
    if sync is not None:
        sync()  # the warm-up's queued work must not land in the first timed step
    steps: list[float] = []
    total = 0.0
    last = clock()
    while True:
        step()
        if sync is not None:
            sync()
        now = clock()
        steps.append(now - last)
        total += now - last
        last = now
        if seconds is not None:
            if total >= seconds:
                break
        elif len(steps) >= (iters or 1):
            break
    return Timings(tuple(steps))
