"""--resume: a run goes on where its checkpoint stopped, exactly when it can.

The weights, optimiser, schedule and loss scaler come back from the checkpoint; a checkpoint
saved inside an epoch also gives every rank its own epoch sums and random state, so the epoch
continues as if never interrupted. With another number of processes the run goes on,
inexactly, and says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkit.core.io.errors import CheckpointError
from torchkit.core.io.shell_words import shell_word
from torchkit.core.models.checkpoint import load_weights_into
from torchkit.core.runtime.distributed import DistContext
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.loaders import mix_seed
from torchkit.core.train.loop import EpochProgress

log = logging.getLogger("torchkit")


@dataclass
class ResumePoint:
    """Where a run picks up: the epochs done, the best epoch so far, metrics.csv's rows, and
    this rank's place in the epoch in progress (its sums, and its random state: None seeds
    it, `restore_rank_rng`). A new run starts from the defaults."""

    start_epoch: int = 0
    best_metric: float | None = None
    best_epoch: int | None = None
    history: list[dict] = field(default_factory=list)
    progress: EpochProgress = field(default_factory=EpochProgress)
    rng: Any = None
    world_changed: bool = False
    # The saved run ended by its own --early-stop before its own --epochs (a run whose patience
    # ran out at its last epoch trained every epoch it was asked for: not stopped early).
    stopped_early: bool = False


def saved_world_size(checkpoint: dict) -> int | None:
    """The number of processes that saved `checkpoint` (None: an older one that does not say)."""
    ranks = checkpoint.get("rank_states")
    return len(ranks) if ranks else checkpoint.get("world_size")


def resume_point(
    checkpoint: dict, ctx: DistContext, config: TrainConfig, resumed_from: Path
) -> ResumePoint:
    start_epoch = int(checkpoint["epoch"])
    progress, rng = rank_progress(checkpoint, ctx, config, resumed_from)
    return ResumePoint(
        start_epoch=start_epoch,
        best_metric=checkpoint.get("best_metric"),
        best_epoch=checkpoint.get("best_epoch"),
        history=[dict(row) for row in checkpoint.get("history", [])][:start_epoch],
        progress=progress,
        rng=rng,
        world_changed=int(saved_world_size(checkpoint) or 1) != ctx.world_size,
        stopped_early=saved_run_stopped_early(checkpoint, start_epoch),
    )


def saved_run_stopped_early(checkpoint: dict, epochs_done: int) -> bool:
    """Whether the saved run stopped by its own --early-stop before its own --epochs."""
    saved = checkpoint.get("config") or {}
    patience, best = saved.get("early_stop") or 0, checkpoint.get("best_epoch")
    if not patience or best is None or epochs_done >= int(saved.get("epochs") or 0):
        return False
    return epochs_done - int(best) >= int(patience)


def restore_training(
    checkpoint: dict,
    resumed_from: Path,
    *,
    model: Any,
    config: TrainConfig,
    groups: list,
    optimizer: Any,
    schedule: Any,
    scaler: Any,
) -> None:
    """The checkpoint's weights, optimiser state (with this run's --lr, --weight-decay and
    --momentum; `groups` are the optimiser's), schedule and loss scale, in place."""
    from torchkit.core.train.optim import load_optimizer_state

    load_weights_into(model, checkpoint["model"], source=str(resumed_from))
    try:
        load_optimizer_state(optimizer, checkpoint["optimizer"])
    except (ValueError, KeyError) as error:
        _restore_earlier_heads(
            checkpoint, resumed_from, error, model=model, config=config, groups=groups,
            optimizer=optimizer,
        )  # fmt: skip
    schedule.load_state_dict(checkpoint["scheduler"])
    if scaler is not None and checkpoint.get("scaler"):
        scaler.load_state_dict(checkpoint["scaler"])


def _restore_earlier_heads(
    checkpoint: dict, resumed_from: Path, error: Exception, *, model, config, groups, optimizer
) -> None:
    """The optimiser state of a run that an earlier torchkit trained with fewer layers as the
    head, or with weight decay on what the model's `no_weight_decay()` names by a pattern,
    moved onto this run's groups (with a warning that says what changes); else the
    CheckpointError that the state does not fit."""
    from torchkit.core.models.heads import head_names
    from torchkit.core.train.earlier_heads import state_under_earlier_heads
    from torchkit.core.train.optim import backbone_trains, load_optimizer_state

    earlier = state_under_earlier_heads(
        checkpoint["optimizer"], model=model, config=config, groups=groups, optimizer=optimizer
    )
    if earlier is None:
        raise CheckpointError(
            f"the optimizer state in {resumed_from} does not fit: {error}",
            "it was saved with other parameter groups, perhaps by another torchkit version; "
            f"start a new run from its weights with --weights {shell_word(resumed_from)}",
        ) from error
    load_optimizer_state(optimizer, earlier.state)
    heads = head_names(model)
    if set(earlier.heads) != set(heads):  # not only the decay rule changed
        rest = (
            "the rest of the head, frozen with the backbone until now, starts training"
            if not backbone_trains(config)
            else "the rest of the head trains at the head's learning rate from now on"
        )
        log.warning(
            "%s was saved by an earlier torchkit that trained only %s as the head: it goes on "
            "with %s as the head, the optimizer state moved along (%s)",
            resumed_from,
            ", ".join(earlier.heads),
            ", ".join(heads),
            rest,
        )
    if earlier.decayed:
        log.warning(
            "%s was saved by an earlier torchkit that gave weight decay to %s, which the model's "
            "no_weight_decay() names by a pattern: it goes on without weight decay on %s, the "
            "optimizer state moved along",
            resumed_from,
            ", ".join(earlier.decayed),
            "it" if len(earlier.decayed) == 1 else "them",
        )


def realign_schedule(
    schedule: Any, point: ResumePoint, config: TrainConfig, *, train_size_changed: bool = False
) -> None:
    """With another number of processes or of training images an epoch has another number of
    updates: the schedule goes on from the resumed epoch and its batches done, counted in this
    run's updates (the checkpoint's count of updates, made in the old run's, would put it in
    another epoch: twice the images put epoch 3 of a step schedule at gamma^1, not gamma^2)."""
    if not (point.world_changed or train_size_changed):
        return
    # Fewer training images may leave the interrupted epoch no batch to go on with: it is done.
    within = min(point.progress.batches // config.accum_steps, schedule.per_epoch)
    schedule.continue_at(point.start_epoch * schedule.per_epoch + within)


def rank_progress(
    checkpoint: dict, ctx: DistContext, config: TrainConfig, resumed_from: Path
) -> tuple[EpochProgress, Any]:
    """This rank's place in the checkpoint's interrupted epoch (if any) and the random state
    to continue it with (None: seed it, `restore_rank_rng`).

    Its own epoch sums and random state, when the checkpoint was saved by as many processes as
    this run has. With another number of processes: rank 0 takes the epoch's sums so far, the
    epoch continues after the images already seen (rounded down to whole batches of the new
    global batch), with new random numbers."""
    progress = EpochProgress.from_dict(checkpoint.get("epoch_progress"))
    ranks = checkpoint.get("rank_states")
    saved_world = saved_world_size(checkpoint)
    # An older checkpoint (no rank_states) holds rank 0's random state only.
    rng = checkpoint.get("rng_state")
    if ranks and len(ranks) == ctx.world_size:
        if progress.batches > 0:
            mine = ranks[ctx.rank]
            return EpochProgress.from_dict(mine["progress"]), mine["rng"]
        return progress, rng
    if saved_world is None and ctx.world_size == 1:
        return progress, rng  # an older single-process checkpoint: its state is this process's
    saved_world = int(saved_world or 1)
    mid_epoch = progress.batches > 0
    if mid_epoch:
        saved = progress
        sums = [saved.to_dict()] if not ranks else [r["progress"] for r in ranks]
        images = saved.batches * config.batch_size * saved_world
        batches = images // (config.batch_size * ctx.world_size)

        def total(key: str) -> float:
            return sum(part.get(key, 0.0) for part in sums) if ctx.is_main else 0.0

        progress = EpochProgress(
            batches=batches,
            loss_sum=total("loss_sum"),
            # Before the field: each batch's mean loss summed per image.
            loss_weight=sum(p.get("loss_weight", p.get("seen", 0)) for p in sums)
            if ctx.is_main
            else 0.0,
            correct=total("correct"),
            l1_sum=total("l1_sum"),
            seen=int(total("seen")),
            seconds=saved.seconds,
            last_lr=saved.last_lr,
        )
        rng = None  # new random numbers: see restore_rank_rng
    if saved_world != ctx.world_size:
        where = (
            f"; epoch {int(checkpoint['epoch']) + 1} continues after its first "
            f"{progress.batches * config.batch_size * ctx.world_size} images"
            if mid_epoch
            else ""
        )
        log.warning(
            "%s was saved by %d process(es), this run has %d: it continues, but not exactly "
            "as the run would have (the global batch, the steps per epoch and the random "
            "numbers follow the new number; the lr schedule goes on from the same epoch%s)",
            resumed_from,
            saved_world,
            ctx.world_size,
            where,
        )
    return progress, rng


def restore_rank_rng(
    rng: Any, ctx: DistContext, config: TrainConfig, epoch: int, progress: EpochProgress
) -> None:
    """The random state of this rank inside the resumed epoch: saved (`rng`), or (when the
    checkpoint has none for this rank) seeded from (seed, rank, epoch, batches done)."""
    from torchkit.core.runtime.seeding import restore_rng_state, seed_everything

    if rng is not None:
        restore_rng_state(rng, ctx.device)
        return
    seed_everything(mix_seed(config.seed, ctx.rank, epoch, progress.batches), config.deterministic)
