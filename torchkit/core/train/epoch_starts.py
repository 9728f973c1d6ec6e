"""The next epoch's first batches, asked for while this epoch validates and saves.

A train loader with persistent workers is reset at each epoch's start, and the epoch's first
batch then waits for the workers to read and hand over their first batches: 0.3-0.5 s an epoch
on the H200 with 14 workers and resnet50 (about a fifth of its 2.2 s epochs of 7,200 images),
where validation and saving had left the workers idle for over 2 s. Starting the next epoch's
iterator right after the training steps lets the workers fill their queues meanwhile. The
sampler is set to the next epoch first and each epoch's iterator is still made once, from the
loader's own generator, so every epoch gets the batches and random draws it would have got.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class EpochStarts:
    """`start_early(epoch)` after an epoch's training steps; `batches(epoch, skip)` at the
    start of each epoch: what it iterates."""

    def __init__(self, loader: Any, sampler: Any) -> None:
        self.loader, self.sampler = loader, sampler
        self._started: tuple[int, Iterator[Any]] | None = None

    def start_early(self, epoch: int) -> None:
        """Ask for `epoch`'s batches now. Only with persistent workers: without, the epoch's
        own iterator would start new worker processes and drop these."""
        if not getattr(self.loader, "persistent_workers", False) or not self.loader.num_workers:
            return
        self.sampler.set_epoch(epoch)
        self._started = (epoch, iter(self.loader))

    def batches(self, epoch: int, skip: int = 0) -> Any:
        """Epoch `epoch`'s batches, `skip` images in (a resumed epoch): the ones started
        early for it, else the loader set to it."""
        started, self._started = self._started, None
        if started is not None and started[0] == epoch and skip == 0:
            return StartedBatches(self.loader, started[1])
        self.sampler.set_epoch(epoch, skip=skip)
        return self.loader


class StartedBatches:
    """An epoch's batches from an iterator already started: the loader's length, iterated
    once."""

    def __init__(self, loader: Any, iterator: Iterator[Any]) -> None:
        self.loader, self.iterator = loader, iterator

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return self.iterator
