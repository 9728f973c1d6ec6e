"""The batches of a DataLoader over `core.dataset.make_dataset`: images, labels, sample indices
and the errors of the unreadable files the batch left out. Its own module, below the loaders and
`core.device_decode`, which both build batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchkit.core.io.errors import InputError


@dataclass
class Batch:
    images: Any
    labels: Any
    indices: Any
    errors: list[str]

    def pin_memory(self) -> Batch:
        """The same batch in page-locked memory: what DataLoader(pin_memory=True) calls on a
        batch that is not a tensor, list or mapping, so that `.to(device, non_blocking=True)`
        copies asynchronously (without this method the batch stays in pageable memory)."""
        tensors = (self.images, self.labels, self.indices)
        return Batch(*(None if t is None else t.pin_memory() for t in tensors), self.errors)


def collate_skipping_unreadable(items: list | Batch) -> Batch:
    import torch

    if isinstance(items, Batch):  # collated by the dataset (`SeededDataset.__getitems__`)
        return items
    good = [item for item in items if item[0] is not None]
    errors = [item[3] for item in items if item[0] is None]
    if not good:
        return Batch(None, None, None, errors)
    labels = torch.tensor([item[1] for item in good], dtype=torch.long)
    indices = torch.tensor([item[2] for item in good], dtype=torch.long)
    if torch.utils.data.get_worker_info() is not None:
        # Into shared memory here, as the images are, not later in the queue's feeder thread:
        # a full /dev/shm there lost the batch with a printed traceback, and the main process
        # waited for it for ever. Here it is the worker's error, which the main process reports.
        labels.share_memory_()
        indices.share_memory_()
    return Batch(
        # default_collate stacks a DataLoader worker's batch straight into shared memory: a
        # plain stack would be copied there again to reach the main process, and fresh pages
        # for every batch cost as much kernel time as the copy.
        torch.utils.data.default_collate([item[0] for item in good]),
        labels,
        indices,
        errors,
    )


def none_read(count: int, source: str, hint: str | None = None) -> InputError:
    """The error of a run that could read none of its `count` images (eval, predict,
    extract-features: some unreadable ones are counted, none readable is a failure), in one
    wording: `source` is the data as the user named it, a URL redacted."""
    return InputError(f"none of the {count} images in {source} could be read", hint)
