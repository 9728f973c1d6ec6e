"""One training epoch and one evaluation pass.

The step: (mixup/cutmix) -> forward under autocast -> cross-entropy (+ L1) / accum_steps ->
backward (gradients synchronised by DDP only on the last micro-batch) -> every accum_steps
micro-batches: unscale, clip, optimiser step, zero_grad, lr schedule, EMA.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchkit.core.errors import InputError

log = logging.getLogger("torchkit")


@dataclass
class StepInfo:
    """What the progress bar shows after a step."""

    step: int  # batches done in this epoch (this process)
    steps: int  # batches in this epoch (this process)
    loss: float  # running mean of the epoch's training loss
    top1: float  # running training accuracy
    lr: float
    images_per_s: float


@dataclass
class EpochProgress:
    """Running sums of an epoch, kept in checkpoints so an interrupted epoch resumes exactly."""

    batches: int = 0
    loss_sum: float = 0.0
    correct: float = 0.0
    seen: int = 0
    seconds: float = 0.0
    last_lr: float = 0.0  # the lr of the epoch's last update

    def to_dict(self) -> dict:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, data: dict | None) -> EpochProgress:
        return cls(**(data or {}))


@dataclass
class StepContext:
    """Everything a training step needs besides the batch."""

    model: Any  # what forward() is called on: DDP / compiled wrapper of `module`
    module: Any  # the plain nn.Module
    optimizer: Any
    schedule: Any
    criterion: Any
    device: Any
    scaler: Any = None
    ema: Any = None
    autocast: Callable[[], Any] = contextlib.nullcontext
    channels_last: bool = False
    accum_steps: int = 1
    clip_grad: float | None = None
    l1: float = 0.0
    l1_params: list = field(default_factory=list)
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    distributed: bool = False
    frozen_norms: Callable[[], None] | None = None


class UnreadableImages:
    """Counts images the loader could not read; warns once per file, or stops with --strict."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.seen: set[str] = set()

    def report(self, errors: list[str]) -> None:
        for error in errors:
            if self.strict:
                raise InputError(f"unreadable image {error}", "fix or remove it, or drop --strict")
            if error not in self.seen:
                self.seen.add(error)
                log.warning("skipped unreadable image %s", error)

    @property
    def count(self) -> int:
        return len(self.seen)


def to_device(batch, ctx: StepContext):
    import torch

    images = batch.images.to(ctx.device, non_blocking=True)
    labels = batch.labels.to(ctx.device, non_blocking=True)
    if ctx.channels_last and images.ndim == 4:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels


def train_one_epoch(
    ctx: StepContext,
    loader: Any,
    progress_state: EpochProgress,
    unreadable: UnreadableImages,
    *,
    on_step: Callable[[StepInfo], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> bool:
    """Train over `loader` (already positioned by its sampler). Updates `progress_state` in
    place. Returns False when `should_stop` asked to stop (checked after each optimiser
    update, so the saved state is always between two updates)."""
    import torch

    from torchkit.core.train.mixing import mix_batch

    ctx.model.train()
    if ctx.frozen_norms is not None:
        ctx.frozen_norms()
    total = progress_state.batches + len(loader)
    accum = ctx.accum_steps
    # Micro-batches are grouped into updates from the start of the epoch, so a resumed epoch
    # groups them as the uninterrupted one did (interruptions only happen between updates).
    started = time.perf_counter() - progress_state.seconds
    loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
    correct = torch.zeros((), dtype=torch.float64, device=ctx.device)
    base_loss, base_correct = progress_state.loss_sum, progress_state.correct
    last_report = 0.0
    for batch in loader:
        if batch.errors:
            unreadable.report(batch.errors)
        progress_state.batches += 1
        is_update = progress_state.batches % accum == 0 or progress_state.batches == total
        if batch.images is not None:
            images, labels = to_device(batch, ctx)
            mixed = mix_batch(images, labels, ctx.mixup_alpha, ctx.cutmix_alpha)
            if mixed is not None:
                images = mixed.images
            sync = ctx.model.no_sync() if ctx.distributed and not is_update else None
            with sync or contextlib.nullcontext():
                with ctx.autocast():
                    outputs = ctx.model(images)
                    if mixed is None:
                        loss = ctx.criterion(outputs, labels)
                    else:
                        loss = mixed.lam * ctx.criterion(outputs, mixed.labels_a) + (
                            1 - mixed.lam
                        ) * ctx.criterion(outputs, mixed.labels_b)
                if ctx.l1 > 0:
                    loss = loss + ctx.l1 * sum(p.abs().sum() for p in ctx.l1_params)
                scaled = loss / accum
                if ctx.scaler is not None:
                    ctx.scaler.scale(scaled).backward()
                else:
                    scaled.backward()
            with torch.no_grad():
                count = labels.shape[0]
                predicted = outputs.argmax(dim=1)
                if mixed is None:
                    hits = (predicted == labels).sum()
                else:
                    hits = (
                        mixed.lam * (predicted == mixed.labels_a).sum()
                        + (1 - mixed.lam) * (predicted == mixed.labels_b).sum()
                    )
                loss_sum += loss.detach().double() * count
                correct += hits.double()
            progress_state.seen += count
        if is_update:
            progress_state.last_lr = ctx.schedule.current_lr()
            _optimizer_step(ctx)
        now = time.perf_counter()
        progress_state.seconds = now - started
        if on_step is not None and (now - last_report > 0.1 or progress_state.batches == total):
            last_report = now
            seen = max(1, progress_state.seen)
            on_step(
                StepInfo(
                    step=progress_state.batches,
                    steps=total,
                    loss=(base_loss + float(loss_sum)) / seen,
                    top1=(base_correct + float(correct)) / seen,
                    lr=ctx.schedule.current_lr(),
                    images_per_s=progress_state.seen / max(progress_state.seconds, 1e-9),
                )
            )
        if is_update and should_stop is not None and should_stop():
            progress_state.loss_sum = base_loss + float(loss_sum)
            progress_state.correct = base_correct + float(correct)
            return False
    progress_state.loss_sum = base_loss + float(loss_sum)
    progress_state.correct = base_correct + float(correct)
    progress_state.seconds = time.perf_counter() - started
    return True


def _optimizer_step(ctx: StepContext) -> None:
    import torch

    if ctx.clip_grad is not None:
        if ctx.scaler is not None:
            ctx.scaler.unscale_(ctx.optimizer)
        params = [p for g in ctx.optimizer.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, ctx.clip_grad)
    if ctx.scaler is not None:
        ctx.scaler.step(ctx.optimizer)
        ctx.scaler.update()
    else:
        ctx.optimizer.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    ctx.schedule.step()
    if ctx.ema is not None:
        ctx.ema.update()


@dataclass
class EvalSums:
    loss_sum: float = 0.0
    top1: float = 0.0
    topk: float = 0.0
    count: float = 0.0

    def as_list(self) -> list[float]:
        return [self.loss_sum, self.top1, self.topk, self.count]


def evaluate(
    module: Any,
    loader: Any,
    device: Any,
    *,
    topk: int,
    unreadable: UnreadableImages,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    channels_last: bool = False,
) -> EvalSums:
    """Sums of cross-entropy, top-1 and top-k hits over this process's shard of `loader`
    (the caller reduces them over ranks). `module` is the plain model: no DDP collectives, so
    shards of different lengths are fine."""
    import torch
    import torch.nn.functional as F

    was_training = module.training
    module.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    ctx = StepContext(None, module, None, None, None, device, channels_last=channels_last)
    with torch.inference_mode():
        for batch in loader:
            if batch.errors:
                unreadable.report(batch.errors)
            if batch.images is None:
                continue
            images, labels = to_device(batch, ctx)
            with autocast():
                outputs = module(images)
            outputs = outputs.float()
            k = min(topk, outputs.shape[1])
            best = outputs.topk(k, dim=1).indices
            hits = best == labels[:, None]
            sums[0] += F.cross_entropy(outputs, labels, reduction="sum").double()
            sums[1] += hits[:, 0].sum()
            sums[2] += hits.any(dim=1).sum()
            sums[3] += labels.shape[0]
    module.train(was_training)
    loss_sum, top1, topk_hits, count = sums.tolist()
    return EvalSums(loss_sum, top1, topk_hits, count)
