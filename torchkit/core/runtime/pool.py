"""Running work in worker processes, chunk by chunk, with results back in the parent: the process
pool `convert` and `dataset-stats` share.

Workers only compute and write files; they never log or print. Everything they have to say comes
back in their return value, so the parent owns progress, warnings and `--strict`. A
`TorchkitError` a worker raises (an `OutputWriteError` above all: a full disk is fatal, never a
skipped input) reaches the parent as the same error, hint included.

Stopping: workers ignore SIGINT (Ctrl-C reaches the whole process group; the parent handles it)
and die on SIGTERM, which Linux also sends them when the parent dies (a SIGKILL). When anything
ends the work early (an error, Ctrl-C, SIGTERM, which the CLI raises as `Terminated`), the parent
terminates the workers at once instead of waiting for the queued and running chunks, and waits
for them to be gone before it returns, so that no worker writes into a folder that is being
removed, and none is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from torchkit.core.io.errors import TorchkitError
from torchkit.core.runtime.cpus import usable_cpus
from torchkit.core.runtime.orphans import end_with_parent
from torchkit.core.runtime.signals import signals_held

T = TypeVar("T")

STOP_GRACE_S = 5.0  # how long a terminated worker may take to die before it is killed


def default_workers() -> int:
    """Every core (8 at most): the parent only waits while workers encode and write."""
    return max(1, min(8, usable_cpus()))


def chunked(items: Sequence[T], workers: int, *, most: int = 512) -> list[Sequence[T]]:
    """Split into chunks small enough to keep every worker busy (and progress moving) but large
    enough that sending work to a process costs little next to doing it."""
    if not items:
        return []
    size = max(1, min(most, -(-len(items) // (max(1, workers) * 4))))
    return [items[i : i + size] for i in range(0, len(items), size)]


def _init_worker(parent: int) -> None:
    # Ctrl-C goes to the whole process group: the parent handles it and stops the pool. SIGTERM
    # (from the parent stopping the pool, or sent to the group) ends a worker at once, and so
    # does its parent's death (SIGKILL): the worker would otherwise wait for work forever,
    # holding the output folder's lock and the command's pipes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    end_with_parent(parent, signal.SIGTERM)
    # A fork does not copy torch's OpenMP threads, but libgomp still counts on them: in a
    # process that had used them (a library user's training before a conversion), a worker's
    # first parallel op (a large tensor's copy) waited for them forever. One thread each, as
    # torch's DataLoader workers: the workers are the parallelism.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


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


@contextlib.contextmanager
def _without_main(*, spawned: bool) -> Iterator[None]:
    """Processes spawned in the block do not import this process's `__main__` first, as
    multiprocessing's spawn has them do: a user's script without an `if __name__ ==
    "__main__"` guard would run again in each (and die there, or start its own pool), and the
    `torchkit` script would import the whole CLI in each. The work they are sent names its
    functions by module, which they import as they unpickle it."""
    if not spawned:
        yield
        return
    from multiprocessing import spawn

    prepared = spawn.get_preparation_data

    def without_main(name: str) -> dict:
        data = prepared(name)
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
        return data

    spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        spawn.get_preparation_data = prepared


def map_chunks(
    func: Callable[[Any], T],
    chunks: Sequence[Any],
    *,
    workers: int,
    on_result: Callable[[T], None],
    preload: Callable[[], None] | None = None,
    start_fresh: bool = False,
) -> None:
    """Call `func(chunk)` for every chunk, in `workers` processes (inline when 0 or 1), and hand
    each result to `on_result` in the parent as it arrives. An exception from `func` or from
    `on_result`, or an interrupt, stops the remaining work at once (the workers are terminated,
    not waited for) and propagates. `preload` runs in the parent before the workers fork from
    it (Linux): what it imports, they have without importing it once each.

    `start_fresh`: start every worker as a new interpreter (spawn) instead of forking this
    process, for work in libraries that keep threads of their own (OpenCV, FFmpeg): a fork
    copies their locks as they are, held ones included, and a worker that takes one waits
    forever. The workers stay this process's children (they end with it); `preload` is not run
    (they would import what it imports once each anyway). They do not run this process's
    `__main__` again (`_without_main`), so a script without an `if __name__ == "__main__"`
    guard still works, and `func` must be importable by its module's name. (Not a forkserver:
    its workers are the server's children and keep it alive, so nothing ends them when this
    process is killed.)"""
    if workers <= 1 or len(chunks) <= 1:
        for chunk in chunks:
            on_result(func(chunk))
        return
    with WorkerPool(min(workers, len(chunks)), preload=preload, start_fresh=start_fresh) as pool:
        pool.map(func, chunks, on_result)


class WorkerPool:
    """`workers` processes kept for several `map`s, as `map_chunks` runs one (its options): work
    that comes a part at a time (video-info's list on stdin, read as it is piped) starts them
    once, not once a part (0.5-1 s each where they start as new interpreters). They start at
    the first `map`; leaving the `with` block waits for them to end, or, on an exception or an
    interrupt, terminates them at once."""

    def __init__(
        self,
        workers: int,
        *,
        preload: Callable[[], None] | None = None,
        start_fresh: bool = False,
    ) -> None:
        self.workers = workers
        self.preload = preload
        self.start_fresh = start_fresh
        self._executor: Any = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if kind is None:
            executor.shutdown(wait=True)
        else:
            _stop(executor)

    def map(
        self, func: Callable[[Any], T], chunks: Sequence[Any], on_result: Callable[[T], None]
    ) -> None:
        """`func(chunk)` of every chunk in the workers, each result handed to `on_result` as it
        arrives (`map_chunks`); an exception leaves the pool to be stopped by `with`."""
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        executor = self._start()
        try:
            # The workers start on the first submit: a signal then waits until they are all
            # known to the executor, so that stopping it stops every one of them.
            with signals_held(), _without_main(spawned=self._spawned):
                pending = {executor.submit(_call, func, chunk) for chunk in chunks}
            for future in as_completed(pending):
                # A done future holds its result: let it go once handed on, not at the end of
                # the run (every chunk's result at once, in memory).
                pending.discard(future)
                try:
                    result = future.result()
                except _RaisedInWorker as error:
                    raise error.rebuild() from None
                on_result(result)
        except BrokenProcessPool as error:
            raise TorchkitError(
                f"a worker process died: {error}",
                "run with --workers 0 to see why, or free some memory",
            ) from error

    @property
    def _spawned(self) -> bool:
        # fork on Linux, as torch's DataLoader does: workers start at once and share what this
        # process imported.
        return not sys.platform.startswith("linux") or self.start_fresh

    def _start(self) -> Any:
        if self._executor is not None:
            return self._executor
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        if not self._spawned and self.preload is not None:
            self.preload()
        self._executor = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn" if self._spawned else "fork"),
            initializer=_init_worker,
            initargs=(os.getpid(),),
        )
        return self._executor
