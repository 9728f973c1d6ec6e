"""Running conversion work in worker processes, chunk by chunk, with results back in the parent.

Workers only compute and write files; they never log or print. Everything they have to say comes
back in their return value, so the parent owns progress, warnings and `--strict`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from torchkit.core.errors import TorchkitError

T = TypeVar("T")


def default_workers() -> int:
    """Every core: the parent only waits while workers encode and write."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


def chunked(items: Sequence[T], workers: int, *, most: int = 512) -> list[Sequence[T]]:
    """Split into chunks small enough to keep every worker busy (and progress moving) but large
    enough that sending work to a process costs little next to doing it."""
    if not items:
        return []
    size = max(1, min(most, -(-len(items) // (max(1, workers) * 4))))
    return [items[i : i + size] for i in range(0, len(items), size)]


def _ignore_interrupt() -> None:
    # Ctrl-C goes to the whole process group; the parent handles it and stops the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def map_chunks(
    func: Callable[[Any], T],
    chunks: Sequence[Any],
    *,
    workers: int,
    on_result: Callable[[T], None],
) -> None:
    """Call `func(chunk)` for every chunk, in `workers` processes (inline when 0 or 1), and hand
    each result to `on_result` in the parent as it arrives. An exception from `func` or from
    `on_result` stops the remaining work and propagates."""
    if workers <= 1 or len(chunks) <= 1:
        for chunk in chunks:
            on_result(func(chunk))
        return

    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    executor = ProcessPoolExecutor(
        max_workers=min(workers, len(chunks)), initializer=_ignore_interrupt
    )
    try:
        futures = [executor.submit(func, chunk) for chunk in chunks]
        for future in as_completed(futures):
            on_result(future.result())
    except BrokenProcessPool as error:
        raise TorchkitError(
            f"a worker process died: {error}",
            "run with --workers 0 to see why, or free some memory",
        ) from error
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
