"""--cuda-graphs: the training step recorded once as a CUDA graph and replayed for every batch.

A small model on a GPU spends its step on the host: Python, autograd and a hundred kernel
launches, for a few microseconds of GPU work each (the digits convnet: about 4 ms a step on an
H100, as long as on two CPU cores). A replayed graph launches the whole update at once.

What is recorded: forward (under autocast, its cache off, as graphs need), loss, backward,
gradient clipping, the fused optimiser's update, the EMA and the epoch's sums. What changes from
step to step comes from device scalars filled before each replay: each group's learning rate,
the EMA's decay, the batch's number. The batch is copied into static buffers. Gradients are
recorded with none present, so each replay writes them afresh.

The first WARMUP_UPDATES updates run the same step eagerly, on a side stream as torch's graph
docs ask: cuDNN and cuBLAS set themselves up and the optimiser creates its state, outside the
recording. The last of them runs with torch's sync debugging on: a step that waits for the
device (a model that reads a value on the host) cannot be recorded, so it is not tried; a
warning says why and the run goes on eagerly. A capture that fails all the same stops the run
with one error: a failed capture leaves CUDA's random generator in capture mode, so the process
cannot go on. A batch of another size than --batch-size (unreadable images left out of it)
takes the eager step.

On other devices nothing is recorded (`capture=False`): the same step runs from the same static
buffers at every batch, so CPU tests check everything but the recording itself.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from torchkit.core.io.errors import DeviceError, UsageError
from torchkit.core.runtime import dynamo_free
from torchkit.core.train.step_sums import StepSums

log = logging.getLogger("torchkit")

# Eager updates before the capture (torch's whole-network capture example uses 3).
WARMUP_UPDATES = 3
# The devices a graph is recorded on. Tests add "cpu" to run the graph's step without the
# recording (`capture=False`).
GRAPH_DEVICES = ("cuda",)


def run_refusal(device: Any, *, distributed: bool, amp_dtype: str) -> tuple[str, str] | None:
    """(message, hint) of why a --cuda-graphs run cannot record its step, or None: not on
    CUDA, several processes (DDP's hooks all-reduce on the host's schedule), or float16 AMP
    (its GradScaler decides on the host whether to step). The config's own refusals are in
    core.train.validation (`graph_refusal`)."""
    hint = "drop --cuda-graphs; a resumed run takes --no-cuda-graphs"
    if device.type not in GRAPH_DEVICES:
        return f"--cuda-graphs needs a CUDA device, and this run is on {device}", hint
    if distributed:
        return "--cuda-graphs trains in one process: not under torchrun", hint
    if amp_dtype == "float16":
        return (
            "--cuda-graphs cannot record float16 AMP's loss scaling",
            f"use --amp-dtype bf16, or {hint}",
        )
    return None


def refuse_ungraphable_run(device: Any, *, distributed: bool, amp_dtype: str) -> None:
    """The UsageError of `run_refusal`, if any."""
    refusal = run_refusal(device, distributed=distributed, amp_dtype=amp_dtype)
    if refusal is not None:
        raise UsageError(*refusal)


class GraphedStep:
    """`step(images, labels, batch_no)`: one whole optimiser update, the schedule's step and
    the EMA's count included. `ctx` is the run's StepContext (core.train.loop)."""

    def __init__(self, ctx: Any, amp_dtype: str, batch_size: int) -> None:
        import torch

        from torchkit.core.train.loop import accumulator_dtype

        self.ctx = ctx
        device = ctx.device
        self.capture = torch.device(device).type == "cuda"
        class_weight = getattr(ctx.criterion, "weight", None)  # --class-weights
        self.sums = StepSums(device, accumulator_dtype(device), class_weight, recorded=True)
        self.groups = ctx.optimizer.param_groups
        if not all(group.get("fused") for group in self.groups):
            # Only the fused steps take a device learning rate without `capturable` eager.
            raise UsageError(
                "--cuda-graphs needs the fused optimiser step, which these parameters cannot "
                "use (not floating point?)",
                "drop --cuda-graphs",
            )
        self.params = [p for group in self.groups for p in group["params"]]
        scalar = {"dtype": torch.float32, "device": device}
        # CUDA's fused steps read a device lr as float32 (a Python lr as a double: updates may
        # differ from eager ones in their last bits); CPUs' read it as a double (the same).
        lr_dtype = torch.float32 if self.capture else torch.float64
        self.lrs = [torch.zeros((), dtype=lr_dtype, device=device) for _ in self.groups]
        self.decay = torch.zeros((), **scalar)
        self.rest = torch.zeros((), **scalar)  # 1 - decay
        self.batch_no = torch.zeros((), dtype=torch.long, device=device)
        self.amp_dtype = None if amp_dtype == "float32" else getattr(torch, amp_dtype)
        self.batch_size = batch_size  # the batches the graph takes; others step eagerly
        self.images: Any = None  # the static batch, shaped by the first whole one
        self.labels: Any = None
        self.graph: Any = None
        self.warm_updates = 0
        self.replays = 0
        self.eager_updates = 0
        self.empty_updates = 0
        self.not_recorded: str | None = None  # why the step is not recorded, if it is not

    def step(self, images: Any, labels: Any, batch_no: int, *, may_capture: bool = True) -> None:
        """`may_capture` False (torch.profiler is recording: CUPTI and a capture do not mix
        safely) puts the capture off to a later update; the update steps eagerly meanwhile."""
        import torch

        self._fill(batch_no)
        if self.images is None and images.shape[0] == self.batch_size:
            self.images = torch.empty_like(images)  # the same strides (channels-last kept)
            self.labels = torch.empty_like(labels)
        if self.images is None or images.shape != self.images.shape:
            self._eager(images, labels)
        else:
            self.images.copy_(images)
            self.labels.copy_(labels)
            if self.graph is not None:
                self.graph.replay()
                self.replays += 1
            elif not self.capture or self.not_recorded is not None:
                self._eager(self.images, self.labels)
            elif self.warm_updates < WARMUP_UPDATES:
                self._warm_up()
            elif not may_capture:
                self._eager(self.images, self.labels)
            else:
                self._capture()
        self._updated()

    def update_without_batch(self) -> None:
        """An update whose images were all unreadable: no gradient, so the optimiser leaves
        the weights alone (as the eager step does); the schedule and the EMA still move on."""
        self.ctx.schedule.step()
        if self.ctx.ema is not None:
            self.ctx.ema.update()
        self.empty_updates += 1

    def summary(self) -> str:
        """For `train -v`: how the run's updates were made."""
        line = (
            f"--cuda-graphs: {self.replays} updates replayed from the graph, "
            f"{self.warm_updates} warm-up and {self.eager_updates} other eager updates"
        )
        if self.empty_updates:
            line += f", {self.empty_updates} without a readable image"
        if self.not_recorded is not None:
            line += f" (not recorded: {self.not_recorded})"
        return line

    def _fill(self, batch_no: int) -> None:
        for lr, group in zip(self.lrs, self.groups, strict=True):
            lr.fill_(group["lr"])
        if self.ctx.ema is not None:
            decay = self.ctx.ema.current_decay()
            self.decay.fill_(decay)
            self.rest.fill_(1 - decay)
        self.batch_no.fill_(batch_no)

    def _updated(self) -> None:
        self.ctx.schedule.step()
        if self.ctx.ema is not None:
            self.ctx.ema.updates += 1

    def _body(self, images: Any, labels: Any) -> None:
        """The update, with nothing in it that reads the host or a Python value that changes
        from step to step (tests/train/test_graphed_step.py records its operators to check)."""
        import torch

        ctx = self.ctx
        with self._autocast():
            outputs = ctx.model(images)
            loss = ctx.criterion(outputs, labels)
        penalty = ctx.l1_penalty()
        (loss if penalty is None else loss + penalty).backward()
        if ctx.clip_grad is not None:
            torch.nn.utils.clip_grad_norm_(self.params, ctx.clip_grad)
        with self._tensor_lrs():
            dynamo_free.step(ctx.optimizer)
        if ctx.ema is not None:
            ctx.ema.update_with(self.decay, self.rest)
        self.sums.add(loss, outputs, labels, self.batch_no, l1=penalty)

    def _eager(self, images: Any, labels: Any) -> None:
        # After a replay the gradients hold the graph's last ones: a backward would add to them.
        self.ctx.optimizer.zero_grad(set_to_none=True)
        self._body(images, labels)
        self.ctx.optimizer.zero_grad(set_to_none=True)
        self.eager_updates += 1

    def _warm_up(self) -> None:
        import torch

        side = torch.cuda.Stream(self.ctx.device)
        main = torch.cuda.current_stream(self.ctx.device)
        side.wait_stream(main)
        # The last warm-up update also finds out whether the step can be recorded at all.
        last = self.warm_updates == WARMUP_UPDATES - 1
        probe = _host_waits() if last else contextlib.nullcontext([])
        with torch.cuda.stream(side), probe as waits:
            self.ctx.optimizer.zero_grad(set_to_none=True)
            self._body(self.images, self.labels)
            self.ctx.optimizer.zero_grad(set_to_none=True)
        main.wait_stream(side)
        self.warm_updates += 1
        if waits:
            self.not_recorded = f"the step waits for the device: {waits[0]}"
            log.warning(
                "--cuda-graphs: the training step is not recorded, because it waits for the "
                "device (%s; the model reads a value on the host?): training goes on eagerly",
                waits[0],
            )

    def _capture(self) -> None:
        import torch

        from torchkit.core.io.errors import first_line

        self.ctx.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the loader's pinning thread and the decode thread go on meanwhile.
            with self._capturable(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._body(self.images, self.labels)
        except Exception as error:
            # torch re-raises the end of the capture's error; the cause is the one before it.
            cause = error.__context__ or error
            raise DeviceError(
                f"--cuda-graphs could not record the training step: {first_line(cause)}",
                "train without --cuda-graphs; a resumed run takes --no-cuda-graphs",
            ) from error
        self.graph = graph
        log.info("--cuda-graphs: captured after %d eager updates", self.warm_updates)
        graph.replay()
        self.replays += 1

    @contextlib.contextmanager
    def _tensor_lrs(self) -> Iterator[None]:
        """The groups' learning rates as the device scalars while the optimiser steps; Python
        numbers again afterwards, for the schedule and the checkpoint."""
        saved = [group["lr"] for group in self.groups]
        for group, lr in zip(self.groups, self.lrs, strict=True):
            group["lr"] = lr
        try:
            yield
        finally:
            for group, lr in zip(self.groups, saved, strict=True):
                group["lr"] = lr

    @contextlib.contextmanager
    def _capturable(self) -> Iterator[None]:
        """torch's optimisers refuse a capture unless their groups say `capturable`; only
        during it, so checkpoints keep the eager groups."""
        saved = [group.get("capturable") for group in self.groups]
        for group in self.groups:
            group["capturable"] = True
        try:
            yield
        finally:
            for group, value in zip(self.groups, saved, strict=True):
                if value is None:
                    group.pop("capturable", None)
                else:
                    group["capturable"] = value

    def _autocast(self):
        import torch

        if self.amp_dtype is None:
            return contextlib.nullcontext()
        # Autocast's cast cache would hold tensors from the capture: graphs need it off.
        return torch.autocast(self.ctx.device.type, dtype=self.amp_dtype, cache_enabled=False)


@contextlib.contextmanager
def _host_waits() -> Iterator[list[str]]:
    """The list of the synchronizing CUDA operations run meanwhile (torch's sync debug mode,
    set to warn: the operations still run, so the step is whole)."""
    import warnings

    import torch

    waits: list[str] = []
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield waits
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    waits += host_waits_among(str(w.message) for w in caught)


# What torch's sync debugging warns with, for each operation that waits for the device.
SYNC_WARNING = "called a synchronizing CUDA operation"


def host_waits_among(messages: Iterable[str]) -> list[str]:
    """The warnings that name an operation waiting for the device. Switching the debugging on
    warns too ("Synchronization debug mode is a prototype feature..."), once a process: that
    one is no wait, and counting it left every step eager on the first H200 run."""
    return [message for message in messages if SYNC_WARNING in message]
