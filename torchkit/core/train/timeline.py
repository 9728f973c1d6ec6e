"""Where an epoch's time goes before it runs at speed, logged at INFO (`train -v`): how long
until the first batch came (loader workers starting, the first files read), how long the first
steps took (cuDNN autotuning each new shape, CUDA loading kernels on first use, the decoder's
set-up), and the rest. A first epoch much slower than the others is then explained by its
own line, on any machine. Every epoch's line also says how long the loop waited for batches
(time the device may have idled for want of data: near zero when the model is what limits the
rate), and with `--decode device` on a GPU how the decoding threads spent their time: in the
JPEG decoder (nvJPEG holds the host until its batch is decoded), on the crops (the resize
kernels are only queued: the host's time issuing them), or waiting for the loader's workers.

At the end of the run one more line says where the whole run's wall time went (`RunTimeline`):
starting Python and the imports before the run began, set-up, the epochs (their training steps,
validation and saving), curves.png and the test, so a slow job is explained phase by phase.
"""

from __future__ import annotations

import logging
import os
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
        """Log the epoch's line; `ahead`: the epoch's `DecodedAhead`, whose threads' times
        are added (for an epoch started early, with what they did before it began)."""
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
                f" (decoding ahead: {ahead.jpeg_seconds:.2f} s in the JPEG decoder, "
                f"{ahead.crop_seconds:.2f} s on the crops, "
                f"{ahead.loader_seconds:.2f} s waiting for the loader; "
                f"{ahead.ready_at_start} batches ready when the epoch began, at most "
                f"{ahead.most_ready} waiting)"
            )
        log.info("%s", line)


def process_age() -> float | None:
    """Seconds since this process started, from Linux's /proc (None elsewhere, or when it
    cannot be read): the share of a run's wall time spent before torchkit's code ran."""
    try:
        with open("/proc/self/stat") as stat:
            # Field 22 (start time, clock ticks since boot) counts from after the command name,
            # which may itself hold spaces and parentheses.
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0])
        return max(0.0, now - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class RunTimeline:
    """The phases of a whole run, for its last `train -v` line: each `mark` closes the phase
    since the previous one; `details` adds a parenthesised split to a phase."""

    def __init__(self, started: float, before: float | None) -> None:
        self.started = self.last = started
        self.before = before  # seconds the process had run when the run began
        self.phases: list[tuple[str, float, str]] = []

    def mark(self, phase: str, details: str = "") -> None:
        now = time.perf_counter()
        self.phases.append((phase, now - self.last, details))
        self.last = now

    def line(self) -> str:
        total = self.last - self.started + (self.before or 0.0)
        since = "since the process started" if self.before is not None else "since the run began"
        parts = []
        if self.before is not None:
            parts.append(f"{self.before:.2f} s before the run began (starting Python, imports)")
        for phase, seconds, details in self.phases:
            parts.append(f"{phase} {seconds:.2f} s" + (f" ({details})" if details else ""))
        return f"run: {total:.2f} s {since}: " + ", ".join(parts)

    def report(self) -> None:
        log.info("%s", self.line())
