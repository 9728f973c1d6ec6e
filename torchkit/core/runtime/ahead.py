"""`read_ahead`: a function over many items in a few threads, results in order, with only a few
items in flight, so that a million items cost a million results, not a million futures too."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def read_ahead(function: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """`function(item)` for each item, in order, computed by `workers` threads a few items
    ahead (reading files and parsing headers wait on the disk or release the GIL). Unlike
    `ThreadPoolExecutor.map`, which submits every item at once (a future of about 2 KB each),
    at most `4 * workers` items are in flight; when the caller stops early (an error, Ctrl-C)
    the items not started are dropped and the running ones finish before this returns."""
    if workers <= 0:
        yield from map(function, items)
        return
    from concurrent.futures import ThreadPoolExecutor

    pending: deque = deque()
    iterator = iter(items)
    with ThreadPoolExecutor(workers, thread_name_prefix="torchkit-ahead") as pool:
        try:
            for item in iterator:
                pending.append(pool.submit(function, item))
                if len(pending) >= 4 * workers:
                    break
            while pending:
                result = pending.popleft().result()
                for item in iterator:
                    pending.append(pool.submit(function, item))
                    break
                yield result
        finally:
            for future in pending:
                future.cancel()
