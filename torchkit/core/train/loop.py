"""One training epoch and one evaluation pass.

The step: (mixup/cutmix) -> forward under autocast -> cross-entropy (+ L1) / accum_steps ->
backward (gradients synchronised by DDP only on the last micro-batch) -> every accum_steps
micro-batches: unscale, clip, optimiser step, zero_grad, lr schedule, EMA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchkit.core.data.image_files import UNREADABLE_WARNINGS, strict_unreadable_error
from torchkit.core.io.errors import InputError, TorchkitError, UsageError, on_every_rank
from torchkit.core.runtime import dynamo_free
from torchkit.core.train import fused_step

log = logging.getLogger("torchkit")

# A non-finite loss is looked for every this many optimiser updates (a host sync, and under
# torchrun one small all-reduce), and always before the epoch ends or a stop saves last.pt.
FINITE_CHECK_EVERY = 50


class DivergedError(TorchkitError):
    """The training or validation loss became NaN or infinite (or the weights did): the run
    stops before saving that state."""


# What a DivergedError tells the user to do, whichever loss showed the divergence.
DIVERGED_HINT = "nothing of this epoch was saved; lower --lr, or add --clip-grad or --warmup-epochs"


def masked_loss_error(criterion: Any, where: str) -> TorchkitError:
    """The error of a training loss that a -inf logit (a model that masks classes) made
    infinite at `where`: not a divergence, and no step can train on it."""
    smoothing = getattr(criterion, "label_smoothing", 0.0)
    instead = "a large negative logit such as -1e4 instead of -inf"
    if smoothing > 0:  # its loss spreads over every class: any -inf one makes it infinite
        return UsageError(
            f"--label-smoothing {smoothing:g} needs finite logits: the model gives a class a "
            f"-inf logit (it masks the class), so the smoothed training loss is infinite "
            f"({where})",
            f"train with --label-smoothing 0, or have the model mask with {instead}",
        )
    return InputError(
        f"the training loss is infinite ({where}): the model gives a training image's true "
        "class a -inf logit (it masks that class), a loss no step can train on",
        f"check the labels against the classes the model masks, or have it mask with {instead}",
    )


def accumulator_dtype(device: Any):
    """The dtype of the metric sums kept on `device`: float64, except on MPS, which has no
    float64 (float32 there: counts stay exact up to 16 million images per epoch)."""
    import torch

    return torch.float32 if getattr(device, "type", str(device)) == "mps" else torch.float64


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
    loss_sum: float = 0.0  # the criterion's, without the --l1 penalty (in `l1_sum`)
    correct: float = 0.0
    seen: int = 0
    seconds: float = 0.0
    last_lr: float = 0.0  # the lr of the epoch's last update
    l1_sum: float = 0.0
    # What `loss_sum` is a sum of: the images seen, or with --class-weights their weights
    # (train_loss = loss_sum / loss_weight, core.train.step_sums).
    loss_weight: float = 0.0

    def to_dict(self) -> dict:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, data: dict | None) -> EpochProgress:
        data = dict(data or {})
        # A checkpoint from before the field summed each batch's mean loss per image.
        data.setdefault("loss_weight", float(data.get("seen", 0)))
        return cls(**data)


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
    # (channels, height, width) of a training image: under torchrun, a rank whose batch was
    # all unreadable runs an empty batch of that shape (see `_empty_step`).
    input_shape: tuple[int, ...] | None = None
    # The earliest of the ranks' first non-finite-loss batches (-1: none), given this rank's:
    # every rank stops at the same check (None: a single process).
    earliest_over_ranks: Callable[[int], int] | None = None
    # Under torchrun: refuses, on every rank, parameters the run's first backward gave no
    # gradient (`ddp.refuse_untrained_parameters`); cleared once it has run.
    check_gradients: Callable[[], None] | None = None
    # Turns a uint8 batch (what the train loader gives for image files) into the model's
    # input on the device: ToTensor + Normalize, bit for bit (core.decode.NormalizedPixels).
    normalized_pixels: Callable[..., Any] | None = None
    # Decode batches of JPEG bytes (--decode device) in a thread, one batch ahead of the step
    # (core.decode_ahead); otherwise the loop decodes each batch itself.
    decode_ahead: bool = False
    # --cuda-graphs: the step recorded once and replayed (core.train.graphed_step.GraphedStep).
    graphed: Any = None

    def l1_penalty(self) -> Any:
        """The --l1 penalty the step adds to the criterion's loss (None without --l1): trained
        on, but reported apart (metrics.csv's train_l1), so that train_loss measures what
        val_loss does."""
        if self.l1 <= 0:
            return None
        return self.l1 * sum(p.abs().sum() for p in self.l1_params)


class UnreadableImages:
    """Counts images the loader could not read, or stops with --strict. The first
    UNREADABLE_WARNINGS are named one warning each, then one warning says the rest are only
    counted (the summary's "Skipped (unreadable)"): thousands of broken files would bury the
    epoch lines."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.seen: set[str] = set()
        self.unshared: list[str] = []  # seen since `share_unreadable` last sent them to rank 0
        self.classes_warned: set[str] = set()  # training classes none of whose images read
        self.classes_checked_at = 0  # `count` when the classes were last checked for those

    def report(self, errors: list[str]) -> None:
        for error in errors:
            if self.strict:
                raise strict_unreadable_error(error, turn_off="pass --no-strict")
            self.add(error)

    def add(self, error: str) -> None:
        """One skipped image, warned of the first time (another rank's too, on rank 0)."""
        if error not in self.seen:
            self.seen.add(error)
            self.unshared.append(error)
            if len(self.seen) <= UNREADABLE_WARNINGS:
                log.warning("skipped unreadable image %s", error)
            elif len(self.seen) == UNREADABLE_WARNINGS + 1:
                log.warning(
                    f"more than {UNREADABLE_WARNINGS} unreadable images: the others are skipped "
                    "without a warning each (the summary counts them all; torchkit "
                    "dataset-stats lists every unreadable file)"
                )

    @property
    def count(self) -> int:
        return len(self.seen)


def to_device(batch, ctx: StepContext):
    """The batch's images and labels on the device, images as the model takes them: 8-bit
    pixels (a quarter of the bytes to copy) normalised there, in the memory format asked for."""
    import torch

    from torchkit.core.data.decode import model_input

    channels_last = ctx.channels_last and batch.images.ndim == 4
    layout = torch.channels_last if channels_last else torch.contiguous_format
    images = model_input(batch.images, ctx.device, ctx.normalized_pixels, layout)
    return images, batch.labels.to(ctx.device, non_blocking=True)


def train_mode(ctx: StepContext) -> None:
    """The model in training mode as every training step runs it: a frozen backbone's
    normalisation layers (--freeze-backbone) stay in eval mode, on their pretrained statistics."""
    ctx.model.train()
    if ctx.frozen_norms is not None:
        ctx.frozen_norms()


def train_one_epoch(
    ctx: StepContext,
    loader: Any,
    progress_state: EpochProgress,
    unreadable: UnreadableImages,
    *,
    on_step: Callable[[StepInfo], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    epoch: int = 0,
    profiler: Any = None,
    batch_images: tuple[int, int] | None = None,
) -> bool:
    """Train over `loader` (already positioned by its sampler); batches of JPEG bytes
    (`--decode device`) are decoded on the device first. Updates `progress_state` in
    place. Returns False when `should_stop` asked to stop (checked after each optimiser
    update, so the saved state is always between two updates). A NaN or infinite loss raises
    DivergedError naming `epoch` (1-based) and the batch, before the epoch ends or a stop
    returns: the diverged state never reaches a checkpoint. `profiler` (a `StepProfiler`, for
    --profile-steps, started by the caller: `step_profiler.profiling`) is told of each update.
    `batch_images` (images of a full batch, of the epoch's last one: `train_batch_images`)
    weighs the batches of an update that holds a shorter last batch by their images."""

    from torchkit.core.data.device_decode import decoded_batch
    from torchkit.core.train.readout import SumsReadout
    from torchkit.core.train.step_sums import StepSums
    from torchkit.core.train.timeline import EpochTimeline

    train_mode(ctx)
    total = progress_state.batches + len(loader)
    accum = ctx.accum_steps
    # Micro-batches are grouped into updates from the start of the epoch, so a resumed epoch
    # groups them as the uninterrupted one did (interruptions only happen between updates).
    started = time.perf_counter() - progress_state.seconds
    acc = accumulator_dtype(ctx.device)
    graphed = ctx.graphed
    # The first non-finite loss is looked at only every FINITE_CHECK_EVERY updates: that waits
    # for the device. With --cuda-graphs the graph adds to its own sums, which last the run.
    class_weight = getattr(ctx.criterion, "weight", None)  # --class-weights, on the device
    sums = graphed.sums if graphed is not None else StepSums(ctx.device, acc, class_weight)
    sums.reset()
    updates = 0
    weighted = _WeightedUpdate.of(ctx)
    # The sums of the epoch before this call (a resumed epoch's), which this call's add to.
    base = dataclasses.replace(progress_state)
    readout = SumsReadout(ctx.device, acc)
    last_report = 0.0
    timeline = EpochTimeline(ctx.device, started) if EpochTimeline.wanted() else None
    ahead, batches = _epoch_batches(loader, ctx, timeline)
    try:
        for batch in batches:
            if timeline is not None:
                timeline.batch_arrived()
            batch = decoded_batch(batch, ctx.device)  # as it is unless it holds JPEG bytes
            if batch.errors:
                unreadable.report(batch.errors)
            progress_state.batches += 1
            is_update = progress_state.batches % accum == 0 or progress_state.batches == total
            # The epoch's last update may group fewer batches: their mean, as a full batch's.
            in_update = min(accum, total - (progress_state.batches - 1) // accum * accum)
            share = _share_of_update(batch_images, progress_state.batches, total, accum, in_update)
            if graphed is not None:
                _graphed_update(ctx, batch, progress_state, profiler)
            elif batch.images is not None:
                _forward_backward(
                    ctx, batch, sums, progress_state, is_update, in_update, share, weighted
                )
            elif ctx.distributed:
                if weighted is not None and is_update:
                    weighted.close()  # before the all-reduce of the empty batch's backward
                _empty_step(ctx, is_update, progress_state.batches)
            if is_update:
                if graphed is None:
                    _update_weights(ctx, progress_state, weighted)
                updates += 1
                if timeline is not None:
                    timeline.stepped()
                if profiler is not None:
                    profiler.stepped()
                if updates % FINITE_CHECK_EVERY == 0:
                    _check_finite(ctx, sums, progress_state, epoch, total)
            now = time.perf_counter()
            progress_state.seconds = now - started
            if on_step is not None and (now - last_report > 0.1 or progress_state.batches == total):
                last_report = now
                on_step(_step_info(ctx, progress_state, total, sums, readout, base))
            if is_update and should_stop is not None and should_stop():
                _check_finite(ctx, sums, progress_state, epoch, total, weights=True)
                _add_step_sums(progress_state, base, sums)
                return False
    finally:
        if ahead is not None:
            ahead.close()
    _check_finite(ctx, sums, progress_state, epoch, total, weights=True)
    _add_step_sums(progress_state, base, sums)
    progress_state.seconds = time.perf_counter() - started
    if timeline is not None:
        timeline.report(epoch, progress_state.seconds, ahead)
    return True


def _epoch_batches(loader: Any, ctx: StepContext, timeline: Any) -> tuple[Any, Any]:
    """(the thread decoding batches one ahead or None, what the epoch iterates): `loader`, or
    with --decode device its batches decoded ahead, timed for the timeline when one is kept."""
    from torchkit.core.data.decode_ahead import DecodedAhead

    if isinstance(loader, DecodedAhead):  # started early (core.train.epoch_starts)
        ahead = loader
    else:
        ahead = DecodedAhead(loader, ctx.device) if ctx.decode_ahead else None
    batches = loader if ahead is None else ahead
    if timeline is not None:
        batches = timeline.timed(batches)
    return ahead, batches


def _graphed_update(
    ctx: StepContext, batch: Any, progress_state: EpochProgress, profiler: Any
) -> None:
    """The whole update in one replay (core.train.graphed_step): one batch each, no mixing,
    no DDP, no GradScaler (the config and set-up checked)."""
    progress_state.last_lr = ctx.schedule.current_lr()
    if batch.images is None:
        ctx.graphed.update_without_batch()
    else:
        images, labels = to_device(batch, ctx)
        recording = profiler is not None and profiler.recording
        ctx.graphed.step(images, labels, progress_state.batches, may_capture=not recording)
        progress_state.seen += labels.shape[0]


def _forward_backward(
    ctx: StepContext,
    batch: Any,
    sums: Any,
    progress_state: EpochProgress,
    is_update: bool,
    in_update: int,
    share: float | None,
    weighted: _WeightedUpdate | None,
) -> None:
    """One batch's forward (mixed under --mixup-alpha/--cutmix-alpha) and backward, its gradients
    scaled to its share of the update (synchronised under DDP only by the update's last batch,
    `is_update`); its loss and accuracy added to `sums`."""
    from torchkit.core.train.mixing import mix_batch

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
        penalty = ctx.l1_penalty()
        trained = loss if penalty is None else loss + penalty
        scaled = trained / in_update if share is None else trained * share
        if weighted is not None and in_update > 1:
            part = 1 / in_update if share is None else share
            scaled = weighted.scale(scaled, part, labels, last=is_update)
        if ctx.scaler is not None:
            ctx.scaler.scale(scaled).backward()
        else:
            scaled.backward()
    sums.add(loss, outputs, labels, progress_state.batches, mixed, l1=penalty)
    progress_state.seen += labels.shape[0]


def _update_weights(
    ctx: StepContext, progress_state: EpochProgress, weighted: _WeightedUpdate | None
) -> None:
    """The optimiser update that ends a group of --accum-steps batches (the eager step; a
    CUDA graph's replay holds its own)."""
    if weighted is not None:
        weighted.close()  # the update's last batch had no readable image
    progress_state.last_lr = ctx.schedule.current_lr()
    if ctx.check_gradients is not None:
        check, ctx.check_gradients = ctx.check_gradients, None
        check()
    _optimizer_step(ctx)


def _check_finite(
    ctx: StepContext,
    sums: Any,
    progress_state: EpochProgress,
    epoch: int,
    total: int,
    *,
    weights: bool = False,
) -> None:
    """Raise DivergedError if a loss was not finite (on any rank); with `weights`, before
    a checkpoint, also if a weight is not (a gradient overflowed while the loss did not:
    the weights are the same on every rank, so each rank finds the same)."""
    hint = DIVERGED_HINT
    local = int(sums.first_bad)
    # 2 x step, + 1 unless a mask made it infinite: the earliest step's cause on every rank.
    coded = -1 if local < 0 else 2 * local + (0 if bool(sums.bad_masked) else 1)
    if ctx.earliest_over_ranks is not None:
        coded = ctx.earliest_over_ranks(coded)
    bad = coded // 2 if coded >= 0 else -1
    # The earliest bad step of every rank and weights DDP keeps equal: the same on each.
    if bad >= 0 and coded % 2 == 0:
        where = f"epoch {epoch}, step {bad} of {total}"
        raise on_every_rank(masked_loss_error(ctx.criterion, where))
    if bad >= 0:
        raise on_every_rank(
            DivergedError(
                f"the training loss is not finite (NaN or infinite) at epoch {epoch}, step "
                f"{bad} of {total}: the run diverged",
                hint,
            )
        )
    if weights and not _all_finite(ctx.optimizer):
        raise on_every_rank(
            DivergedError(
                f"the weights are not finite (NaN or infinite) at epoch {epoch}, step "
                f"{progress_state.batches} of {total}, although the loss was: a gradient "
                "overflowed",
                hint,
            )
        )


def _step_info(
    ctx: StepContext,
    progress_state: EpochProgress,
    total: int,
    sums: Any,
    readout: Any,
    base: EpochProgress,
) -> StepInfo:
    """What the progress bar shows now: the last step's figures are exact; the others are read
    without waiting for the device (core.train.readout), so the bar never stalls a GPU."""
    read = readout.exact if progress_state.batches == total else readout.read
    shown_loss, shown_correct, shown_seen, shown_weight = read(
        sums.loss_sum, sums.correct, progress_state.seen, sums.loss_weight
    )
    shown_seen = max(1, shown_seen)
    shown_weight = base.loss_weight + shown_weight
    return StepInfo(
        step=progress_state.batches,
        steps=total,
        loss=(base.loss_sum + shown_loss) / shown_weight if shown_weight > 0 else 0.0,
        top1=(base.correct + shown_correct) / shown_seen,
        lr=ctx.schedule.current_lr(),
        images_per_s=progress_state.seen / max(progress_state.seconds, 1e-9),
    )


def _add_step_sums(progress_state: EpochProgress, base: EpochProgress, sums: Any) -> None:
    """The epoch's sums: those before this call's (`base`) plus this call's steps' (one read
    of the device's sums)."""
    progress_state.loss_sum = base.loss_sum + float(sums.loss_sum)
    progress_state.loss_weight = base.loss_weight + float(sums.loss_weight)
    progress_state.correct = base.correct + float(sums.correct)
    progress_state.l1_sum = base.l1_sum + float(sums.l1_sum)


class _WeightedUpdate:
    """--class-weights over an update of several batches (--accum-steps), exactly as one batch
    of all their images: the class-weighted mean divides by the whole update's weight total,
    not each batch by its own (the mean of the batches' weighted means gave a batch of light
    classes as much say as one of heavy ones).

    Each batch's weighted mean times its share of the update's images (`part`) is multiplied by
    its images' mean weight (so it adds its weighted sum over the update's images); the update's
    last batch, before its backward (the all-reduce under torchrun), divides the gradients so
    far and its own loss by the update's mean weight, the sum of those products. Under torchrun
    each rank divides by its own images' total, as one process per rank would."""

    def __init__(self, weight: Any, params: list) -> None:
        self.weight = weight
        self.params = params
        self.total: Any = None  # sum over the update's batches so far of part x mean weight

    @classmethod
    def of(cls, ctx: StepContext) -> _WeightedUpdate | None:
        """None without class weights, with one batch per update, or with mixup / cutmix (a
        mixed batch's two weighted means have two totals, and no single batch equals the
        update: each batch's lambda is its own)."""
        weight = getattr(ctx.criterion, "weight", None)
        if weight is None or ctx.accum_steps == 1 or ctx.mixup_alpha > 0 or ctx.cutmix_alpha > 0:
            return None
        params = [p for group in ctx.optimizer.param_groups for p in group["params"]]
        return cls(weight, params)

    def scale(self, scaled: Any, part: float, labels: Any, *, last: bool) -> Any:
        mean_weight = self.weight[labels].mean()
        share = mean_weight * part
        self.total = share if self.total is None else self.total + share
        scaled = scaled * mean_weight
        if last:
            scaled = scaled / self.close()
        return scaled

    def close(self) -> Any:
        """Divide the gradients accumulated so far by the update's mean weight, and start the
        next update; returns that divisor (1 when every image weighs 0: the gradients are 0)."""
        import torch

        if self.total is None:
            return 1.0
        total = torch.where(self.total > 0, self.total, torch.ones_like(self.total))
        self.total = None
        with torch.no_grad():
            for param in self.params:
                if param.grad is not None:
                    param.grad.div_(total)
        return total


def _share_of_update(
    batch_images: tuple[int, int] | None, batch: int, total: int, accum: int, in_update: int
) -> float | None:
    """The weight of batch `batch` (1-based, of `total`) in its update of `in_update` batches
    when that update holds the epoch's shorter last batch: its share of the update's images,
    so the update's gradient is the mean over its images, as one batch of them all gives (the
    mean of the batches' means overweighted the short batch). None: the update's batches are
    of one size, each weighs 1 / `in_update`. Nominal sizes, the same on every rank."""
    if batch_images is None or in_update == 1 or (batch - 1) // accum != (total - 1) // accum:
        return None
    full, last = batch_images
    if last == full:
        return None
    return (last if batch == total else full) / ((in_update - 1) * full + last)


def _all_finite(optimizer: Any) -> bool:
    """Whether every parameter the optimiser updates is finite (one host sync)."""
    import torch

    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params:
        return True
    return bool(torch.stack([torch.isfinite(p).all() for p in params]).all())


def _empty_step(ctx: StepContext, is_update: bool, batch: int) -> None:
    """Forward and backward of an empty batch, for a rank whose images were all unreadable:
    DDP's buffer broadcast (forward) and gradient all-reduce (backward) are collectives, so a
    rank that skipped them would leave the others waiting forever. The batch has no images, so
    it adds nothing to the gradients (the others' are averaged with this rank's zeros), nor to
    BatchNorm's running statistics, nor to the epoch's loss and accuracy."""
    import torch

    from torchkit.core.io.errors import first_line

    shape = ctx.input_shape or (3, 1, 1)
    images = torch.zeros((0, *shape), device=ctx.device)
    if ctx.channels_last and images.ndim == 4:
        images = images.contiguous(memory_format=torch.channels_last)
    sync = ctx.model.no_sync() if not is_update else None
    with sync or contextlib.nullcontext():
        try:
            with ctx.autocast():
                outputs = ctx.model(images)
        except RuntimeError as error:
            if "timed out" in str(error).lower() or "by peer" in str(error).lower():
                raise  # a collective failed: not the model's doing
            raise InputError(
                f"every image of batch {batch} of this process was unreadable, and the model "
                "cannot run an empty batch to keep in step with the other processes: "
                f"{first_line(error)}",
                "fix or remove the unreadable images the warnings name",
            ) from error
        zero = outputs.float().sum() * 0.0
        if ctx.scaler is not None:
            ctx.scaler.scale(zero).backward()
        else:
            zero.backward()


def _optimizer_step(ctx: StepContext) -> None:
    import torch

    if ctx.scaler is not None and not any(
        p.grad is not None for g in ctx.optimizer.param_groups for p in g["params"]
    ):
        # No gradient at all (every image of the update unreadable): the GradScaler has
        # nothing to check for overflows and would refuse to step. Nothing to update.
        ctx.optimizer.zero_grad(set_to_none=True)
        ctx.schedule.step()
        if ctx.ema is not None:
            ctx.ema.update()
        return
    if ctx.clip_grad is not None:
        if ctx.scaler is not None:
            ctx.scaler.unscale_(ctx.optimizer)
        params = [p for g in ctx.optimizer.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, ctx.clip_grad)
    if ctx.scaler is not None:
        with dynamo_free.undecorated_steps(ctx.optimizer):
            ctx.scaler.step(ctx.optimizer)
        ctx.scaler.update()
    elif not fused_step.step(ctx.optimizer):
        dynamo_free.step(ctx.optimizer)
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
    # Images whose true class the model gives a -inf logit (it masks it): their loss is
    # infinite and left out of `loss_sum`; they count in the accuracies as any other.
    masked: float = 0.0

    def as_list(self) -> list[float]:
        return [self.loss_sum, self.top1, self.topk, self.count, self.masked]


def evaluate(
    module: Any,
    loader: Any,
    device: Any,
    *,
    topk: int,
    unreadable: UnreadableImages,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    channels_last: bool = False,
    normalized_pixels: Callable[..., Any] | None = None,
) -> EvalSums:
    """Sums of cross-entropy, top-1 and top-k hits over this process's shard of `loader`
    (the caller reduces them over ranks). `module` is the plain model: no DDP collectives, so
    shards of different lengths are fine. Batches of 8-bit pixels are normalised on the device
    by `normalized_pixels`, as in training. The loss of an image whose true class a model that
    masks classes gives a -inf logit is infinite: counted apart (`EvalSums.masked`), not
    summed, where its other logits are scorable (a NaN or +inf is a divergence: summed)."""
    import torch
    import torch.nn.functional as F

    from torchkit.core.data.padded_batches import BatchPadder, pads_short_batches
    from torchkit.core.inference.masked_loss import masked_true_class
    from torchkit.core.inference.scoring import scorable_rows
    from torchkit.core.topk import ranked_classes

    was_training = module.training
    module.eval()
    sums = torch.zeros(5, dtype=accumulator_dtype(device), device=device)
    ctx = StepContext(
        None,
        module,
        None,
        None,
        None,
        device,
        channels_last=channels_last,
        normalized_pixels=normalized_pixels,
    )
    padder = BatchPadder(pads_short_batches(device, module))
    with torch.inference_mode():
        for batch in loader:
            if batch.errors:
                unreadable.report(batch.errors)
            if batch.images is None:
                continue
            images, labels = to_device(batch, ctx)
            with autocast():
                outputs = padder.forward(module, images)
            outputs = outputs.float()
            k = min(topk, outputs.shape[1])
            best = ranked_classes(outputs, k)  # ties ranked as eval ranks them
            hits = best == labels[:, None]
            losses = F.cross_entropy(outputs, labels, reduction="none")
            masked = masked_true_class(losses, scorable_rows(outputs))
            sums[0] += losses.masked_fill(masked, 0.0).sum().to(sums.dtype)
            sums[1] += hits[:, 0].sum()
            sums[2] += hits.any(dim=1).sum()
            sums[3] += labels.shape[0]
            sums[4] += masked.sum()
    module.train(was_training)
    return EvalSums(*sums.tolist())
