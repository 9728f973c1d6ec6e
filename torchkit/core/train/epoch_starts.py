"""The next epoch's first batches, asked for while this epoch validates and saves.

A train loader with persistent workers is reset at each epoch's start, and the epoch's first
batch then waits for the workers to read and hand over their first batches: 0.3-0.5 s an epoch
on the H200 with 14 workers and resnet50 (about a fifth of its 2.2 s epochs of 7,200 images),
where validation and saving had left the workers idle for over 2 s. Starting the next epoch's
iterator right after the training steps lets the workers fill their queues meanwhile. The
sampler is set to the next epoch first and each epoch's iterator is still made once, from the
loader's own generator, so every epoch gets the batches and random draws it would have got.

With `--decode device` on a GPU the epoch started early is also decoded early: its batches go
through a `DecodedAhead` started at once (`decode_ahead`), so the GPU's decoder fills its budget
of batches while the model is built (the first epoch) or while the epoch before validates. The
decode draws no random numbers (the crops were drawn by the workers), so the batches are the
same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class EpochStarts:
    """`start_early(epoch)` after an epoch's training steps; `batches(epoch, skip)` at the
    start of each epoch: what it iterates; `close()` when no epoch follows. `decode_ahead`
    (`functools.partial(DecodedAhead, device=...)`, say) wraps the batches of an epoch started
    early, and is started at once."""

    def __init__(
        self, loader: Any, sampler: Any, decode_ahead: Callable[[Any], Any] | None = None
    ) -> None:
        self.loader, self.sampler, self.decode_ahead = loader, sampler, decode_ahead
        self._started: tuple[int, Any] | None = None

    def start_early(self, epoch: int) -> None:
        """Ask for `epoch`'s batches now. Only with persistent workers: without, the epoch's
        own iterator would start new worker processes and drop these."""
        if not getattr(self.loader, "persistent_workers", False) or not self.loader.num_workers:
            return
        self.close()
        self.sampler.set_epoch(epoch)
        batches: Any = StartedBatches(self.loader, iter(self.loader))
        if self.decode_ahead is not None:
            batches = self.decode_ahead(batches)
            batches.start()
        self._started = (epoch, batches)

    @property
    def decoding_early(self) -> bool:
        """Whether an epoch started early is being decoded already."""
        return self._started is not None and self.decode_ahead is not None

    def batches(self, epoch: int, skip: int = 0) -> Any:
        """Epoch `epoch`'s batches, `skip` images in (a resumed epoch): the ones started
        early for it (a `StartedBatches`, or what `decode_ahead` made of one), else the
        loader set to it."""
        if self._started is not None and self._started[0] == epoch and skip == 0:
            started, self._started = self._started[1], None
            return started
        self.close()
        self.sampler.set_epoch(epoch, skip=skip)
        return self.loader

    def close(self) -> None:
        """Drop an epoch started early and not asked for, stopping its decoding threads
        (before the loader's workers stop: a thread may be reading from them)."""
        started, self._started = self._started, None
        if started is not None and hasattr(started[1], "close"):
            started[1].close()


class StartedBatches:
    """An epoch's batches from an iterator already started: the loader's length, iterated
    once."""

    def __init__(self, loader: Any, iterator: Iterator[Any]) -> None:
        self.loader, self.iterator = loader, iterator

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return self.iterator
