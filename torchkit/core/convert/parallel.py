"""Running conversion work in worker processes, chunk by chunk, with results back in the parent.

Workers only compute and write files; they never log or print. Everything they have to say comes
back in their return value, so the parent owns progress, warnings and `--strict`. A
`TorchkitError` a worker raises (an `OutputWriteError` above all: a full disk is fatal, never a
skipped input) reaches the parent as the same error, hint included.

Stopping: workers ignore SIGINT (Ctrl-C reaches the whole process group; the parent handles it)
and die on SIGTERM. When anything ends the work early (an error, Ctrl-C, SIGTERM, which the CLI
raises as `Terminated`), the parent terminates the workers at once instead of waiting for the
queued and running chunks, and waits for them to be gone before it returns, so that no worker
writes into a folder that is being removed, and none is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from torchkit.core.io.errors import TorchkitError

T = TypeVar("T")

STOP_GRACE_S = 5.0  # how long a terminated worker may take to die before it is killed


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


def _init_worker() -> None:
    # Ctrl-C goes to the whole process group: the parent handles it and stops the pool. SIGTERM
    # (from the parent stopping the pool, or sent to the group) ends a worker at once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _RaisedInWorker(Exception):
    """A TorchkitError raised in a worker, in a form that pickles with its hint (an exception
    pickles only its `args`)."""

    def __init__(self, cls: type[TorchkitError], message: str, hint: str | None) -> None:
        super().__init__(cls, message, hint)
        self.cls, self.message, self.hint = cls, message, hint

    def rebuild(self) -> TorchkitError:
        return self.cls(self.message, self.hint)


def _call(func: Callable[[Any], T], chunk: Any) -> T:
    try:
        return func(chunk)
    except TorchkitError as error:
        raise _RaisedInWorker(type(error), error.message, error.hint) from None


def _stop(executor: Any) -> None:
    """Terminate the workers (SIGTERM), wait until they are gone (SIGKILL after a grace
    period), then let the executor clean up after them: it fails the chunks not done yet.
    (Cancelling those futures here first would make the executor's own thread trip over them:
    InvalidStateError on Python 3.11.)"""
    processes = list((getattr(executor, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(Exception):
            process.terminate()
    for process in processes:
        with contextlib.suppress(Exception):
            process.join(STOP_GRACE_S)
            if process.is_alive():
                process.kill()
                process.join()
    executor.shutdown(wait=True, cancel_futures=True)


def map_chunks(
    func: Callable[[Any], T],
    chunks: Sequence[Any],
    *,
    workers: int,
    on_result: Callable[[T], None],
) -> None:
    """Call `func(chunk)` for every chunk, in `workers` processes (inline when 0 or 1), and hand
    each result to `on_result` in the parent as it arrives. An exception from `func` or from
    `on_result`, or an interrupt, stops the remaining work at once (the workers are terminated,
    not waited for) and propagates."""
    if workers <= 1 or len(chunks) <= 1:
        for chunk in chunks:
            on_result(func(chunk))
        return

    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    executor = ProcessPoolExecutor(max_workers=min(workers, len(chunks)), initializer=_init_worker)
    futures: list = []
    finished = False
    try:
        futures = [executor.submit(_call, func, chunk) for chunk in chunks]
        for future in as_completed(futures):
            try:
                result = future.result()
            except _RaisedInWorker as error:
                raise error.rebuild() from None
            on_result(result)
        finished = True
    except BrokenProcessPool as error:
        raise TorchkitError(
            f"a worker process died: {error}",
            "run with --workers 0 to see why, or free some memory",
        ) from error
    finally:
        if finished:
            executor.shutdown(wait=True)
        else:
            _stop(executor)
