"""Where an epoch's time goes before it runs at speed, logged at INFO (`train -v`): how long
until the first batch came (loader workers starting, the first files read), how long the first
steps took (cuDNN autotuning each new shape, CUDA loading kernels on first use, the decoder's
set-up), and the rest. A first epoch much slower than the others is then explained by its
own line, on any machine. Every epoch's line also says how long the loop waited for batches
(time the device may have idled for want of data: near zero when the model is what limits the
rate), and with `--decode device` on a GPU how the decode thread spent its time: decoding
(the host's time in the decode and resize calls: nvJPEG holds it until its batch is decoded,
the resize kernels it only queues), or waiting for the loader's workers."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

log = logging.getLogger("torchkit")

FIRST_STEPS = 5


class EpochTimeline:
    """Timestamps of one epoch's first batch and first `FIRST_STEPS` optimiser steps (the
    device is synchronised once, after them, so the figure is the device's time too)."""

    def __init__(self, device: Any, started: float) -> None:
        self.device, self.started = device, started
        self.first_batch: float | None = None
        self.first_steps: float | None = None
        self.steps = 0
        self.waited = 0.0  # seconds the loop spent waiting for its next batch

    @staticmethod
    def wanted() -> bool:
        return log.isEnabledFor(logging.INFO)

    def timed(self, batches: Iterable) -> Iterator:
        """`batches`, adding the time each one took to come to `waited`."""
        iterator = iter(batches)
        while True:
            asked = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.waited += time.perf_counter() - asked
            yield batch

    def batch_arrived(self) -> None:
        if self.first_batch is None:
            self.first_batch = time.perf_counter() - self.started

    def stepped(self) -> None:
        self.steps += 1
        if self.steps == FIRST_STEPS:
            import torch

            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.first_steps = time.perf_counter() - self.started

    def report(self, epoch: int, seconds: float, ahead: Any = None) -> None:
        """Log the epoch's line; `ahead`: the epoch's `DecodedAhead`, whose thread's times
        are added."""
        if self.first_batch is None:
            return
        line = f"epoch {epoch}: first batch after {self.first_batch:.2f} s"
        if self.first_steps is not None:
            line += (
                f", {FIRST_STEPS} steps done after {self.first_steps:.2f} s, the other "
                f"{self.steps - FIRST_STEPS} steps took {seconds - self.first_steps:.2f} s"
            )
        line += f"; {self.waited:.2f} s of {seconds:.2f} s waiting for batches"
        if ahead is not None:
            line += (
                f" (the decode thread: {ahead.decode_seconds:.2f} s decoding, "
                f"{ahead.loader_seconds:.2f} s waiting for the loader)"
            )
        log.info("%s", line)
