"""The progress bar's running loss and accuracy, read from the GPU without waiting for it.

The epoch's sums live on the device, so reading them (`float(loss_sum)`) waits for every
kernel queued so far: the GPU then runs dry while the host queues the next step. The progress
bar asked for them every 0.1 s, which on a GPU is every step or two. Here each read starts a
copy of the sums into page-locked memory behind the queued kernels, and shows the last copy
that has landed, with the image count it was taken at: the figures shown lag by a report or
two, and nothing waits. On a CPU there is nothing to wait for: the sums are read as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class SumsReadout:
    """`read(loss_sum, correct, seen)` -> (loss_sum, correct, seen) as of the newest copy that
    has reached the host (on a CPU, and at the first read: the values given). `exact` reads
    without the lag. Given `weight` too (the weight the loss sum is a sum of), it is read with
    them, and returned after them."""

    def __init__(
        self, device: Any, dtype: Any, *, make_event: Callable[[], Any] | None = None
    ) -> None:
        import torch

        self.lagging = torch.device(device).type == "cuda" or make_event is not None
        self.landed: tuple | None = None
        self._copy: Any = None  # (event, seen) of the copy on its way
        if self.lagging:
            self._make_event = make_event or torch.cuda.Event
            host = torch.zeros(3, dtype=dtype)
            self._host = host.pin_memory() if torch.device(device).type == "cuda" else host

    def read(self, loss_sum: Any, correct: Any, seen: int, weight: Any = None) -> tuple:
        if not self.lagging or self.landed is None:
            # The first read of an epoch waits once, so the bar never shows a made-up figure.
            self.landed = self.exact(loss_sum, correct, seen, weight)
            return self.landed
        import torch

        if self._copy is not None:
            event, copied_seen = self._copy
            if event.query():  # landed: page-locked host memory, read without a sync
                landed = (float(self._host[0]), float(self._host[1]), copied_seen)
                self.landed = landed if weight is None else (*landed, float(self._host[2]))
                self._copy = None
        if self._copy is None:
            read = [loss_sum, correct] + ([] if weight is None else [weight])
            self._host[: len(read)].copy_(torch.stack(read), non_blocking=True)
            event = self._make_event()
            event.record()
            self._copy = (event, seen)
        return self.landed

    @staticmethod
    def exact(loss_sum: Any, correct: Any, seen: int, weight: Any = None) -> tuple:
        """The sums now (waits for the device)."""
        if weight is None:
            return float(loss_sum), float(correct), seen
        return float(loss_sum), float(correct), seen, float(weight)
