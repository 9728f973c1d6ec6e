"""The epochs of a run: train, validate, save, keep the best, stop early or when asked to; then
the test evaluation of best.pt.

Random numbers are a function of (seed, rank, epoch), so a resumed run draws what the
uninterrupted one did; inside an epoch, the saved state is restored instead. Under torchrun
every figure is summed over ranks and every decision (stop, best epoch, divergence) is the
same on every rank; only rank 0 writes the run folder and calls the display.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Any

from torchkit.core.inference.masked_loss import dataset_loss
from torchkit.core.io.errors import InputError
from torchkit.core.io.wording import counted
from torchkit.core.models.checkpoint import load_checkpoint, load_weights_into
from torchkit.core.runtime import distributed
from torchkit.core.runtime.distributed import DistContext
from torchkit.core.train.checkpoints import BEST
from torchkit.core.train.interface import TOPK, TrainCallbacks, TrainResult
from torchkit.core.train.loaders import mix_seed, train_batch_images, warn_classes_never_read
from torchkit.core.train.loop import (
    DIVERGED_HINT,
    DivergedError,
    EpochProgress,
    UnreadableImages,
    evaluate,
    train_one_epoch,
)
from torchkit.core.train.resume import restore_rank_rng
from torchkit.core.train.run_folder import RunFolder
from torchkit.core.train.state import TrainState
from torchkit.core.train.step_profiler import (
    EPOCHS_PROFILED,
    PROFILE_FOLDER,
    StepProfiler,
    profiling,
)
from torchkit.core.train.timeline import EpochTimeline

log = logging.getLogger("torchkit")

# Plotting takes a good fraction of a second: curves.png is redrawn at most this often during
# the run, and always at its end. metrics.csv is rewritten after every epoch.
CURVES_EVERY_S = 30.0


class EpochDriver:
    """Runs the epochs of `state` from its start epoch to --epochs, or until --early-stop, a
    stop asked for on any rank (Ctrl-C, SIGTERM: `callbacks.should_stop`), or an error; the
    outcome goes into `result`."""

    def __init__(
        self,
        ctx: DistContext,
        state: TrainState,
        folder: RunFolder,
        callbacks: TrainCallbacks,
        result: TrainResult,
    ) -> None:
        self.ctx = ctx
        self.state = state
        self.folder = folder
        self.callbacks = callbacks
        self.result = result
        self.stop_vote = distributed.StopVote(ctx)
        self.curves_written = time.perf_counter()  # first plot after CURVES_EVERY_S
        self.images_seen = 0.0  # over this invocation's finished epochs, for images/s
        self.images_seconds = 0.0
        # Where the epochs' time outside their training steps went (`train -v`'s last line).
        self.validation_seconds = self.saving_seconds = self.curves_seconds = 0.0
        self.profiled = 0  # epochs profiled so far (--profile-steps)
        self.profiler: StepProfiler | None = None  # the epoch's, until written
        self.stopped_in_epoch = False  # a stop (Ctrl-C, SIGTERM) ended an epoch part-way
        self.profile_seconds = 0.0  # the profiler's set-up, and writing its tables and traces
        self.starts = state.epoch_starts

    def phase(self) -> str:
        """'N epochs' this invocation finished (a resumed one counts), and a stopped one."""
        finished = self.result.epochs - self.state.start_epoch
        name = counted(finished, "epoch")
        return name + (" and part of one (stopped)" if self.stopped_in_epoch else "")

    def time_split(self) -> str:
        """The epochs' wall time (`train_seconds`) split into training steps, validation,
        saving, the last curves.png (and --profile-steps' tables), for the run's timeline."""
        other = (
            self.validation_seconds
            + self.saving_seconds
            + self.curves_seconds
            + self.profile_seconds
        )
        split = (
            f"training steps {max(0.0, self.result.train_seconds - other):.2f} s, "
            f"validation {self.validation_seconds:.2f} s, saving {self.saving_seconds:.2f} s, "
            f"curves.png {self.curves_seconds:.2f} s"
        )
        if self.profiled:
            split += f", profiling {self.profile_seconds:.2f} s"
        return split

    def run(self) -> None:
        started = time.perf_counter()
        # matplotlib is imported when curves.png is first drawn, not in a thread beside the
        # first epoch: there it took the GIL from the loop (digits, 2 cores: epoch 1 took
        # 0.63-1.05 s with it, 0.27-0.44 s without) and the run's wall time gained nothing.
        try:
            self._epochs()
            # The last epoch's files are on disk (or their error raised) before anything
            # reads them (the test evaluation, the summary) or the run is called a success.
            waited = time.perf_counter()
            self.folder.wait_saved()
            self.saving_seconds += time.perf_counter() - waited
        finally:
            self.starts.close()  # an epoch started early that will not run (early stop, stop)
        self._finish()
        self.result.train_seconds = time.perf_counter() - started

    def _epochs(self) -> None:
        from torchkit.core.runtime.seeding import seed_everything

        state, config, result = self.state, self.state.config, self.result
        mid_epoch = state.progress.batches > 0
        resumed_after_early_stop = (
            not mid_epoch
            and state.start_epoch < config.epochs
            and state.patience_spent(state.start_epoch)
        )
        if resumed_after_early_stop:  # nothing to train: the runner said so
            result.stopped_early = state.resumed_stopped_early
            return
        for epoch in range(state.start_epoch, config.epochs):
            if mid_epoch:
                restore_rank_rng(state.resume_rng, self.ctx, config, epoch, state.progress)
                mid_epoch = False
            else:
                seed_everything(mix_seed(config.seed, self.ctx.rank, epoch), config.deterministic)
                state.progress = EpochProgress()
            if not self._train_epoch(epoch):
                result.interrupted = True
                self.stopped_in_epoch = True
                saving = time.perf_counter()
                self._save_stopped(epoch)  # last.pt first: a stop's grace period is short
                self.saving_seconds += time.perf_counter() - saving
                self._write_profile()
                break
            if epoch + 1 < config.epochs:
                self.starts.start_early(epoch + 1)  # the workers read while this one validates
            self._end_epoch(epoch)
            self._write_profile()
            result.epochs = epoch + 1
            if epoch + 1 == config.epochs:
                break  # every epoch trained: not stopped early, whatever --early-stop says
            if state.patience_spent(epoch + 1):
                result.stopped_early = True
                break
            if epoch + 1 < config.epochs and self.should_stop(force=True):
                result.interrupted = True
                break

    def _train_epoch(self, epoch: int) -> bool:
        """One epoch of training (from where a resumed one stopped): whether it finished."""
        state, config = self.state, self.state.config
        progress = state.progress
        batches = self.starts.batches(epoch, skip=progress.batches * config.batch_size)
        if self.ctx.is_main:
            self.callbacks.on_epoch_start(
                epoch + 1, config.epochs, state.steps_per_epoch, progress.batches
            )
        profiler = self.profiler = self._profiler(epoch + 1)
        with profiling(profiler):  # started before the epoch's clock
            return train_one_epoch(
                state.step_ctx,
                batches,
                progress,
                state.unreadable,
                on_step=self.callbacks.on_step if self.ctx.is_main else None,
                should_stop=self.should_stop,
                epoch=epoch + 1,
                profiler=profiler,
                batch_images=train_batch_images(state.loaders.train, state.loaders.train_sampler),
            )

    def _write_profile(self) -> None:
        """The epoch's --profile-steps table and trace, once the epoch is saved (outside its
        time, as the profiler's set-up was)."""
        profiler, self.profiler = self.profiler, None
        if profiler is not None:
            written = time.perf_counter()
            profiler.write()
            self.profile_seconds += time.perf_counter() - written + profiler.setup_seconds

    def _profiler(self, epoch: int) -> StepProfiler | None:
        """--profile-steps: a profiler for the first two epochs this invocation trains (rank 0)."""
        steps = self.state.config.profile_steps
        if not steps or not self.ctx.is_main or self.profiled >= EPOCHS_PROFILED:
            return None
        self.profiled += 1
        return StepProfiler(self.folder.path / PROFILE_FOLDER, epoch, steps, self.ctx.device)

    def _save_stopped(self, epoch: int) -> None:
        """last.pt of an epoch stopped in the middle, with each rank's random state and epoch
        sums, so that a resumed run continues every rank exactly (rank 0's alone would be
        restored on every rank); or, when not worth keeping, the new run goes."""
        from torchkit.core.runtime.seeding import capture_rng_state

        ctx, state = self.ctx, self.state
        rank_states = distributed.gather_to_main(
            ctx, {"rng": capture_rng_state(ctx.device), "progress": state.progress.to_dict()}
        )
        if ctx.is_main:
            progress = state.progress.to_dict()
            checkpoint = state.checkpoint(epoch, progress, ctx.world_size, rank_states)
            if not self.folder.save_stopped(checkpoint):
                self.result.kept = False

    def _end_epoch(self, epoch: int) -> None:
        """Validate a finished epoch, rank it against the best so far, and save it."""
        state, config = self.state, self.state.config
        started = time.perf_counter()
        row = epoch_row(self.ctx, state, self.callbacks, epoch)
        validated = time.perf_counter()
        self.images_seen += row["images_per_s"] * row["epoch_time_s"]
        self.images_seconds += row["epoch_time_s"]
        state.history.append(row)
        state.schedule.epoch_end(
            state.watched_value(row, config.best_metric),
            higher_is_better=config.best_metric == "top1",
        )
        is_best = state.is_best(row)
        if is_best:
            state.best_epoch = epoch + 1
            state.best_metric = state.best_value(config.best_metric)
        if self.ctx.is_main:
            # Written beside the next epoch (`saving` is the time this thread waits for it).
            checkpoint = state.checkpoint(
                epoch + 1, None, self.ctx.world_size, snapshot=self.folder.saves_in_background
            )
            self.folder.save_epoch(
                checkpoint, state.history, len(state.classes), is_best=is_best, config=config
            )
            if time.perf_counter() - self.curves_written > CURVES_EVERY_S:
                self.folder.write_curves(state.history, state.best_epoch)
                self.curves_written = time.perf_counter()
            if EpochTimeline.wanted():  # the epoch's time outside its training steps
                log.info(
                    "epoch %d: validation took %.2f s, saving %.2f s",
                    epoch + 1,
                    validated - started,
                    time.perf_counter() - validated,
                )
            self.callbacks.on_epoch_end(row, is_best)
        self.validation_seconds += validated - started
        self.saving_seconds += time.perf_counter() - validated

    def should_stop(self, force: bool = False) -> bool:
        """Whether every rank stops now (after an optimiser update, or between epochs with
        `force`): any rank's Ctrl-C or SIGTERM counts, polled about twice a second."""
        wanted = 0
        if self.callbacks.should_stop():
            wanted = int(self.callbacks.stop_signal() or 1)
        stop = self.stop_vote(wanted, force=force)
        self.result.stop_signal = self.stop_vote.signal if stop else 0
        return stop

    def _finish(self) -> None:
        """curves.png and the summary's figures, once the loop is over."""
        state, result = self.state, self.result
        share_unreadable(self.ctx, state.unreadable)  # a stopped epoch's too
        self.folder.close_tensorboard()
        if self.ctx.is_main and state.history and result.kept:
            drawn = time.perf_counter()
            # Drawn on the writer thread while best.pt is tested (`_train` waits for it).
            self.folder.write_curves(state.history, state.best_epoch, background=True)
            self.curves_seconds = time.perf_counter() - drawn
        if self.ctx.is_main:
            self.callbacks.on_train_end(result.interrupted)
        result.best_epoch = state.best_epoch
        result.best_by_ema = state.best_by_ema()
        result.best_val_top1 = state.best_value("top1")
        result.best_val_top5 = state.best_value("top5")
        result.skipped_images = state.unreadable.count
        if state.history:
            result.last_train_loss = state.history[-1]["train_loss"]
            result.last_train_top1 = state.history[-1]["train_top1"]
        if self.images_seconds > 0:
            result.images_per_s = self.images_seen / self.images_seconds


def epoch_row(ctx: DistContext, state: TrainState, callbacks: TrainCallbacks, epoch: int) -> dict:
    """metrics.csv's row of a finished epoch: training sums reduced over ranks, then
    validation (of the EMA weights too, with --ema)."""
    progress = state.progress
    loss_sum, correct, seen, l1_sum, loss_weight = distributed.all_reduce_sum(
        ctx,
        [
            progress.loss_sum,
            progress.correct,
            float(progress.seen),
            progress.l1_sum,
            progress.loss_weight,
        ],
    )
    if seen == 0:  # not a training loss of 0 that would even win --best-metric loss
        raise InputError(
            f"none of the {state.loaders.train_size} training images could be read in "
            f"epoch {epoch + 1}",
            "see the warnings above; fix or remove the unreadable files",
        )
    if ctx.is_main:
        callbacks.on_eval("val")
    # Under torchrun each rank's BatchNorm statistics moved with its own last batch: every
    # rank validates rank 0's, the ones best.pt and last.pt get (`eval best.pt` agrees).
    distributed.broadcast_buffers(ctx, state.model)
    if state.ema is not None:
        distributed.broadcast_buffers(ctx, state.ema.module)
    val = evaluate_over_ranks(ctx, state, state.model, state.loaders.val)
    row = {
        "epoch": epoch + 1,
        # The mean over the epoch's images, weighted by --class-weights: whatever the batch
        # size (a weighted mean per batch averaged over batches was not). Images all of
        # weight 0 train nothing: 0.
        "train_loss": loss_sum / loss_weight if loss_weight > 0 else 0.0,
        "train_top1": correct / max(seen, 1.0),
        "val_loss": val["loss"],
        "val_top1": val["top1"],
        "val_top5": val["top5"],
        "lr": progress.last_lr,
        "epoch_time_s": progress.seconds,
        "images_per_s": seen / max(progress.seconds, 1e-9),
    }
    if state.config.l1 > 0:  # the penalty trained on, apart from train_loss (the criterion's)
        row["train_l1"] = l1_sum / max(seen, 1.0)
    if state.ema is not None:
        ema = evaluate_over_ranks(ctx, state, state.ema.module, state.loaders.val)
        row |= {
            "val_ema_loss": ema["loss"],
            "val_ema_top1": ema["top1"],
            "val_ema_top5": ema["top5"],
        }
        if ema["masked"]:
            row["val_ema_masked"] = ema["masked"]
    if val["masked"]:  # images val_loss leaves out: their true class is masked
        row["val_masked"] = val["masked"]
    share_unreadable(ctx, state.unreadable)
    unreadable = state.unreadable
    # Rank 0 has every rank's skipped images; the classes are checked again only for new ones.
    if ctx.is_main and unreadable.count > unreadable.classes_checked_at:
        unreadable.classes_checked_at = unreadable.count
        warn_classes_never_read(
            state.data.splits["train"], unreadable.seen, unreadable.classes_warned
        )
    check_val_finite(row, epoch + 1)
    return row


def check_val_finite(row: dict, epoch: int) -> None:
    """A NaN or infinite validation loss is the divergence signal too (weights that are finite
    but so large that the logits overflow, BatchNorm statistics gone infinite): the run stops
    as for a non-finite training loss, before the epoch is saved or ranked. The loss is summed
    over ranks, so every rank stops here alike."""
    checked = (("val_loss", "validation loss"), ("val_ema_loss", "EMA validation loss"))
    for column, what in checked:
        if column in row and not math.isfinite(row[column]):
            raise DivergedError(
                f"the {what} is not finite (NaN or infinite) at epoch {epoch}: the run diverged",
                DIVERGED_HINT,
            )


def evaluate_over_ranks(
    ctx: DistContext, state: TrainState, module: Any, loader: Any, *, full_precision: bool = False
) -> dict:
    """Loss, top-1 and top-5 over the whole of `loader`'s data (summed over ranks)."""
    sums = evaluate(
        module,
        loader,
        ctx.device,
        topk=TOPK,
        unreadable=state.unreadable,
        autocast=contextlib.nullcontext if full_precision else state.amp.autocast,
        channels_last=state.config.channels_last and not full_precision,
        normalized_pixels=state.step_ctx.normalized_pixels,
    )
    loss_sum, top1, topk, count, masked = distributed.all_reduce_sum(ctx, sums.as_list())
    split = "test" if loader is state.loaders.test else "validation"
    if count == 0:  # every image unreadable: no metric, not a perfect loss of 0
        raise InputError(
            f"none of the {len(loader.dataset)} {split} images could be read",
            "see the warnings above; fix or remove the unreadable files",
        )
    measured = dataset_loss(loss_sum, count, masked)  # eval's rule: masked images left out
    if measured.loss is None:
        raise InputError(
            measured.none_left(split), "check the labels against the classes the model masks"
        )
    if masked and ctx.is_main and split not in state.masked_warned:
        state.masked_warned.add(split)
        where = "" if split == "test" else "; metrics.csv's val_masked counts them each epoch"
        log.warning("%s", measured.masked_warning(split, where))
    return {
        "loss": measured.loss,
        "top1": top1 / count,
        "top5": topk / count,
        "masked": measured.masked,
    }


def evaluate_best_on_test(
    ctx: DistContext,
    state: TrainState,
    folder: RunFolder,
    callbacks: TrainCallbacks,
    result: TrainResult,
) -> None:
    """Test metrics of best.pt's weights, in full precision (as `torchkit eval` computes)."""
    if state.loaders.test is None or result.interrupted or state.best_epoch is None:
        return
    if ctx.is_main:
        callbacks.on_eval("test")
    best_path = folder.path / BEST

    def load_best() -> bool:
        """best.pt into the model (and the EMA), on rank 0: whether it has EMA weights."""
        best = load_checkpoint(best_path)
        load_weights_into(state.model, best["model"], source=str(best_path))
        has_ema = state.ema is not None and "model_ema" in best
        if has_ema:
            load_weights_into(state.ema.module, best["model_ema"], source=str(best_path))
        return has_ema

    # Only rank 0 opens the run folder (the others need no shared file system): it reads
    # best.pt and sends the weights to the other ranks.
    has_ema = distributed.on_main(ctx, load_best)
    distributed.broadcast_module(ctx, state.model)
    test = evaluate_over_ranks(ctx, state, state.model, state.loaders.test, full_precision=True)
    result.test_top1, result.test_top5 = test["top1"], test["top5"]
    result.test_loss = test["loss"]
    result.test_weights = BEST
    if has_ema:
        distributed.broadcast_module(ctx, state.ema.module)
        ema = evaluate_over_ranks(
            ctx, state, state.ema.module, state.loaders.test, full_precision=True
        )
        result.test_ema_top1 = ema["top1"]
    share_unreadable(ctx, state.unreadable)
    result.skipped_images = state.unreadable.count  # the test's unreadable images too


def share_unreadable(ctx: DistContext, unreadable: UnreadableImages) -> None:
    """Under torchrun only rank 0 warns and reports: the images the other ranks skipped since
    the last call reach it, to be warned of and counted once. Every rank calls this at the
    same point of the run (a collective)."""
    mine, unreadable.unshared = unreadable.unshared, []
    if not ctx.is_distributed:
        return
    gathered = distributed.gather_to_main(ctx, mine)
    if gathered is not None:
        for errors in gathered[1:]:
            for error in errors:
                unreadable.add(error)
        unreadable.unshared = []
