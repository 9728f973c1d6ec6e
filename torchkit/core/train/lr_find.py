"""`train --find-lr`: the learning-rate range test (Smith 2015; fastai's `lr_find`).

The learning rate grows exponentially from `lr_min` to `lr_max` over `iterations` optimiser
steps on training batches; the loss is smoothed with an exponential moving average (bias
corrected) and the sweep stops once the smoothed loss exceeds `diverge` times its minimum. The
suggestion is the learning rate where the smoothed loss falls fastest (the steepest negative
slope against log lr), taken before the minimum. The model's and the optimiser's states are
restored afterwards: the range test trains nothing.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.runtime import dynamo_free
from torchkit.core.train.loop import masked_loss_error, to_device, train_mode
from torchkit.core.train.step_sums import masks_classes

_END = object()
# Steps of the sweep whose smoothed loss the suggestion does not read (see `suggest`).
SKIP_START = 10


@dataclass
class LRFindResult:
    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    suggested_lr: float | None = None
    diverged: bool = False  # stopped early on a diverging loss

    def rows(self) -> list[tuple[float, float, float]]:
        return list(zip(self.lrs, self.losses, self.smoothed, strict=True))


# Training options the range test has no use for: it runs --find-lr-iters plain optimiser steps
# (no schedule, accumulation, clipping, L1, mixup or EMA), validates nothing, saves no checkpoint.
NOT_USED_BY_FIND_LR = (
    "epochs",
    "scheduler",
    "warmup_epochs",
    "min_lr",
    "step_size",
    "milestones",
    "gamma",
    "patience",
    "accum_steps",
    "clip_grad",
    "l1",
    "mixup_alpha",
    "cutmix_alpha",
    "ema",
    "ema_decay",
    "save_every",
    "keep",
    "early_stop",
    "best_metric",
)


def ignored_options(config: Any) -> list[str]:
    """The options of `config` (a TrainConfig, before data defaults are filled) that are set
    away from their defaults but that --find-lr ignores, as `--epochs` spellings, for a note."""
    from torchkit.core.train.validation import option_name, set_away_from_defaults

    return [option_name(name) for name in set_away_from_defaults(config, NOT_USED_BY_FIND_LR)]


def lr_schedule(lr_min: float, lr_max: float, iterations: int) -> list[float]:
    """`iterations` learning rates, geometrically spaced from lr_min to lr_max."""
    return list(lr_sweep(lr_min, lr_max, iterations))


def lr_sweep(lr_min: float, lr_max: float, iterations: int) -> Iterator[float]:
    """`lr_schedule`'s rates one at a time (checked at once): a sweep longer than memory
    holds runs until it diverges or is stopped, as any long sweep does."""
    if not (0 < lr_min < lr_max) or not math.isfinite(lr_max):
        raise UsageError(f"--lr-min {lr_min} and --lr-max {lr_max}: need 0 < MIN < MAX")
    if iterations < 2:
        raise UsageError(f"--find-lr-iters must be at least 2, not {iterations}")
    ratio = (lr_max / lr_min) ** (1 / (iterations - 1))
    if ratio == 1.0:  # every step the same rate: no slope to suggest from
        raise UsageError(
            f"--lr-min {lr_min} and --lr-max {lr_max} are too close for {iterations} steps: "
            "every step would use the same learning rate",
            "widen the range or lower --find-lr-iters",
        )
    return (lr_min * ratio**i for i in range(iterations))


def suggest(lrs: list[float], smoothed: list[float]) -> float | None:
    """The lr of the steepest descent of the smoothed loss (per unit of log lr), before its
    minimum; None when the loss never falls. The first steps (up to SKIP_START, a quarter of
    a short sweep) are left out: there the smoothed loss averages a handful of losses, and one
    batch's noise read as the steepest fall (1.2e-07 suggested for digits, whose loss falls
    fastest near 1e-2), as fastai leaves them out of its suggestion too."""
    if len(smoothed) < 3:
        return None
    stop = min(range(len(smoothed)), key=smoothed.__getitem__)
    skip = min(SKIP_START, len(smoothed) // 4)
    best, chosen = 0.0, None
    for i in range(skip + 1 if stop > skip else 1, max(stop, 1) + 1):
        if lrs[i] <= lrs[i - 1]:  # two steps at one rate (rounding): no slope between them
            continue
        slope = (smoothed[i] - smoothed[i - 1]) / (math.log(lrs[i]) - math.log(lrs[i - 1]))
        if slope < best:
            best, chosen = slope, lrs[i]
    return chosen


def range_test(
    step: Callable[[Any, float], float | None],
    batches: Callable[[], Iterator[Any]],
    schedule: Iterable[float],
    *,
    smoothing: float = 0.98,
    diverge: float = 4.0,
) -> LRFindResult:
    """Run `step(batch, lr) -> loss` over `schedule`, cycling through `batches()`."""
    result = LRFindResult()
    average, best = 0.0, math.inf
    source = batches()
    for lr in schedule:
        batch = next(source, _END)
        if batch is _END:  # an epoch is shorter than the sweep: start another pass
            source = batches()
            batch = next(source, _END)
            if batch is _END:
                raise InputError("no training batches for the learning-rate range test")
        loss = step(batch, lr)
        if loss is None:
            continue
        if not math.isfinite(loss):
            result.diverged = True
            break
        average = smoothing * average + (1 - smoothing) * loss
        # Bias-corrected over the losses averaged so far (a skipped step adds none: counting it
        # halved the first smoothed loss after an unreadable first batch).
        smooth = average / (1 - smoothing ** (len(result.losses) + 1))
        result.lrs.append(lr)
        result.losses.append(loss)
        result.smoothed.append(smooth)
        best = min(best, smooth)
        if len(result.losses) > 1 and smooth > diverge * best:
            result.diverged = True
            break
    result.suggested_lr = suggest(result.lrs, result.smoothed)
    return result


def find_lr(
    step_ctx, batches, *, lr_min: float, lr_max: float, iterations: int, lr: float | None = None
) -> LRFindResult:
    """The range test on `step_ctx`'s model, optimiser and loss (train's own), restoring their
    states afterwards. `batches()` gives a fresh iterator of train's `Batch` objects. The
    sweep's rates are values of `lr` (--lr): each group keeps its ratio to it (None: to the
    largest group lr)."""

    from torchkit.core.data.device_decode import decoded_batch

    model, optimizer = step_ctx.module, step_ctx.optimizer
    saved_model = copy.deepcopy(model.state_dict())
    saved_optimizer = copy.deepcopy(optimizer.state_dict())
    # Each group keeps its ratio to --lr (--backbone-lr, --head-lr-mult), so the suggestion is
    # an --lr: with --head-lr-mult 10 the head's rate was swept, suggesting 10 x the --lr.
    base = lr or max(group["lr"] for group in optimizer.param_groups) or 1.0
    ratios = [group.get("base_lr", group["lr"]) / base for group in optimizer.param_groups]

    def step(batch, rate: float) -> float | None:
        for group, ratio in zip(optimizer.param_groups, ratios, strict=True):
            group["lr"] = rate * ratio
        batch = decoded_batch(batch, step_ctx.device)  # JPEG bytes (--decode device) decoded
        if batch.images is None:  # every image of the batch unreadable: no step
            return None
        images, labels = to_device(batch, step_ctx)
        train_mode(step_ctx)  # a frozen backbone's norms in eval mode, as training runs them
        optimizer.zero_grad(set_to_none=True)
        with step_ctx.autocast():
            outputs = step_ctx.model(images)
            loss = step_ctx.criterion(outputs, labels)
        if not math.isfinite(float(loss.detach())) and bool(masks_classes(outputs)):
            raise masked_loss_error(step_ctx.criterion, "the learning-rate range test")
        if step_ctx.scaler is not None:
            step_ctx.scaler.scale(loss).backward()
            step_ctx.scaler.step(optimizer)
            step_ctx.scaler.update()
        else:
            loss.backward()
            dynamo_free.step(optimizer)
        return float(loss.detach())

    try:
        return range_test(step, batches, lr_sweep(lr_min, lr_max, iterations))
    finally:
        model.load_state_dict(saved_model)
        optimizer.load_state_dict(saved_optimizer)
        optimizer.zero_grad(set_to_none=True)


def write_lr_find(folder, result: LRFindResult, painter: Any = None) -> list:
    """lr_find.csv (lr, loss, smoothed_loss) and lr_find.png in `folder`; the plot drawn by the
    plot helper `painter` (`core.runtime.plot_helper`) where it answers."""
    from torchkit.core.io.csv_rows import csv_text
    from torchkit.core.io.files import atomic_write_text
    from torchkit.core.train.outputs import LR_FIND_COLUMNS

    # The shared CSV writer: floats as repr writes them, so a rate read back is the one tried
    # (and JSON's suggested_lr is one of them).
    text = csv_text([LR_FIND_COLUMNS, *result.rows()])
    atomic_write_text(folder / "lr_find.csv", text)
    values = {
        "lrs": result.lrs,
        "losses": result.losses,
        "smoothed": result.smoothed,
        "suggested_lr": result.suggested_lr,
    }
    if painter is None or not painter.draw("lr_find", folder / "lr_find.png", **values):
        draw_lr_find(folder / "lr_find.png", **values)
    return [folder / "lr_find.csv", folder / "lr_find.png"]


def draw_lr_find(
    path: str | os.PathLike,
    lrs: list[float],
    losses: list[float],
    smoothed: list[float],
    suggested_lr: float | None,
) -> None:
    """lr_find.png (see `lr_find_figure`), written atomically."""
    from torchkit.core.io.files import atomic_path
    from torchkit.core.io.output_proofs import PNG_METADATA

    figure = lr_find_figure(lrs, losses, smoothed, suggested_lr)
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=100, metadata=PNG_METADATA)


def lr_find_figure(
    lrs: list[float], losses: list[float], smoothed: list[float], suggested_lr: float | None
):
    """The loss and its smoothed curve against the learning rate (log axis), and the
    suggestion: a matplotlib Figure, laid out."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    axes = figure.subplots()
    axes.plot(lrs, losses, alpha=0.3, label="loss")
    axes.plot(lrs, smoothed, label="smoothed loss")
    if suggested_lr is not None:
        axes.axvline(suggested_lr, color="tab:red", linestyle="--",
                     label=f"suggested {suggested_lr:.2e}")  # fmt: skip
    axes.set(xscale="log", xlabel="learning rate", ylabel="loss", title="learning-rate range test")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    return figure
