"""`--find-batch-size`: the largest batch that fits, by doubling from the start batch until a
trial does not fit (out of memory, or over `--memory-limit`), then bisecting between the last
batch that fitted and the first that did not, until the two are within `PRECISION` (10%) of each
other: a batch within 10% of the largest that fits is found in a few trials, where an exact
search would run several more of the largest, slowest trials for the last few percent.
`--max-batch-size` caps the doubling. A batch too small to train on (one image through a
BatchNorm whose feature map is 1x1 there) is no bound: the search goes on from the next one up.

The search itself is pure logic over a `try_batch` function, so it is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from torchkit.core.io.errors import TorchkitError
from torchkit.core.io.sizes import format_megabytes

FITS = "fits"
OUT_OF_MEMORY = "out of memory"
OVER_LIMIT = "over the memory limit"
PREDICTED_OVER = "would not fit in the available memory (not run)"
MAX_BATCH = "max batch size"
TOO_SMALL = "too small to train (BatchNorm needs more than 1 value per channel)"
PRECISION = 0.1  # stop once the smallest batch that did not fit is <= 110% of the largest that did

SearchProgress = Callable[[str, int, list["Trial"], bool], None]
"""(mode, batch, the trials run so far, searching): called before each trial with searching
True, and once the search is over with the batch found (about to be timed) and False."""


@dataclass
class Trial:
    batch_size: int
    fits: bool
    peak_memory_mb: float | None  # None when the trial was not run, or ran out of memory
    reason: str  # FITS, OUT_OF_MEMORY, OVER_LIMIT, PREDICTED_OVER or TOO_SMALL

    @property
    def too_big(self) -> bool:
        """Did not fit for its size (a batch TOO_SMALL did not run for the opposite reason)."""
        return not self.fits and self.reason != TOO_SMALL


@dataclass
class BatchSearch:
    """What `--find-batch-size` found for one mode."""

    mode: str
    batch_size: int  # the largest batch that fitted
    memory_limit_mb: float | None  # None on CUDA without --memory-limit: out of memory decides
    stopped_by: str  # OUT_OF_MEMORY, OVER_LIMIT, PREDICTED_OVER or MAX_BATCH
    trials: list[Trial] = field(default_factory=list)
    precision: float = PRECISION  # the search stopped once not_fitting <= batch_size * (1 + this)
    not_fitting: int | None = None  # the smallest batch that did not fit (None: MAX_BATCH)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def search_batch_size(
    try_batch: Callable[[int, list[Trial]], Trial],
    *,
    start: int,
    max_batch: int,
    precision: float = PRECISION,
    limit_mb: float | None = None,
) -> tuple[int, str, list[Trial]]:
    """(largest batch that fits, why the search stopped, the trials in the order run).
    `try_batch(batch, trials_so_far)` runs one trial. Assumes that a batch fits when a larger
    one does (memory grows with the batch). The bisection stops once the smallest batch that
    did not fit is at most `precision` (a fraction) above the largest that fitted: the batch
    found is then within that much of the largest that fits; `precision=0` searches exactly.
    `limit_mb`, the limit the trials' peaks were held to, is named beside a peak over it when
    not even the first batch fits."""
    trials: list[Trial] = []

    def attempt(batch: int) -> Trial:
        trial = try_batch(batch, list(trials))
        trials.append(trial)
        return trial

    first = attempt(start)
    while first.reason == TOO_SMALL and start < max_batch:
        start = min(start * 2, max_batch)
        first = attempt(start)
    if not first.fits:
        if first.reason == TOO_SMALL:
            hint = "start at 2 or more with --batch-size, and let --max-batch-size above it"
        else:
            hint = "start lower with --batch-size, raise --memory-limit, or use --amp"
        raise TorchkitError(
            f"batch {start} does not fit: {first.reason}" + _peak(first, limit_mb), hint
        )
    good, bad = start, None
    while bad is None:
        if good >= max_batch:
            return good, MAX_BATCH, trials
        batch = min(good * 2, max_batch)
        trial = attempt(batch)
        if trial.fits:
            good = batch
        else:
            bad, reason = batch, trial.reason
    while bad - good > max(1, precision * good):
        middle = (good + bad) // 2
        trial = attempt(middle)
        if trial.fits:
            good = middle
        else:
            bad, reason = middle, trial.reason
    return good, reason, trials


def _peak(trial: Trial, limit_mb: float | None) -> str:
    """What a trial's error line adds: its peak and the limit it was held to, in one format
    (`(peak 0.800 MB, limit 0.300 MB)`); nothing for a trial with no peak (out of memory)."""
    if trial.peak_memory_mb is None:
        return ""
    peak = f"peak {format_megabytes(trial.peak_memory_mb)} MB"
    if limit_mb is None:
        return f" ({peak})"
    return f" ({peak}, limit {format_megabytes(limit_mb)} MB)"


def predicted_peak(batch: int, trials: list[Trial]) -> float | None:
    """Peak memory (MB) expected at `batch`, scaled from the largest batch that fitted:
    memory grows at most in proportion with the batch (weights and fixed buffers do not grow),
    so this errs on the high side. None before any trial fitted."""
    fitted = [t for t in trials if t.fits and t.peak_memory_mb is not None]
    if not fitted:
        return None
    largest = max(fitted, key=lambda t: t.batch_size)
    return largest.peak_memory_mb * batch / largest.batch_size
