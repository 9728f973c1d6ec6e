"""`run_training(config, callbacks) -> TrainResult`: the whole run, from options to best.pt.

The steps: the options (`setup.plan_run`), the run folder checked and locked (`run_folder`),
data, model and training state (`setup.prepare_state`), config.json and split.csv, then the
epochs (`epochs.EpochDriver`) and the test evaluation of best.pt, or the learning-rate range
test instead (--find-lr). Under torchrun every rank runs them; only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator

from torchkit.core.data.sources import SPLIT_CSV
from torchkit.core.io.errors import DeviceError, InputError, UsageError, on_every_rank
from torchkit.core.io.overlap import InputPath
from torchkit.core.io.redaction import redact_url
from torchkit.core.io.wording import counted
from torchkit.core.models.image_size import image_size_refusal, one_value_per_channel
from torchkit.core.runtime import distributed
from torchkit.core.runtime.distributed import DistContext
from torchkit.core.runtime.launch import is_main_process
from torchkit.core.runtime.threads import compute_threads, torch_threads
from torchkit.core.train import ddp
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.config_file import DEFAULTS_FROM_DATA, data_chosen
from torchkit.core.train.epochs import EpochDriver, evaluate_best_on_test
from torchkit.core.train.interface import RunInfo, TrainCallbacks, TrainResult
from torchkit.core.train.loaders import loader_workers, train_preprocess
from torchkit.core.train.outputs import check_tensorboard, versions
from torchkit.core.train.run_folder import RunFolder
from torchkit.core.train.setup import (
    RunPlan,
    build_amp,
    plan_run,
    prepare_state,
)
from torchkit.core.train.state import TrainState
from torchkit.core.train.timeline import EpochTimeline, RunTimeline

__all__ = ["RunInfo", "TrainCallbacks", "TrainResult", "run_training"]

log = logging.getLogger("torchkit")


def run_training(
    config: TrainConfig,
    callbacks: TrainCallbacks | None = None,
    *,
    overrides: Collection[str] | None = None,
    inputs: Iterable[InputPath] = (),
    output_file: str | os.PathLike | None = None,
    process_age: float | None = None,
    before_keep: Callable[[TrainResult], None] | None = None,
) -> TrainResult:
    """Train as `config` says. With `config.resume`, the saved run's options are used except
    those named in `overrides` (default: the options of `config` that differ from the defaults).

    `inputs` are files the caller read for the run (the --stats file): the run folder may not
    be, contain or lie inside one. `output_file` is where the caller will write the summary
    (-o FILE): it is checked with the run folder, before any work. `process_age`: seconds the
    process had run before this call, where the process is this run's (`train -v`'s last line
    then counts from the process's start). `before_keep(result)` (the caller's -o FILE) runs
    once a range test (--find-lr) has written its files, before they replace an earlier run
    folder: if it raises, that folder is put back. A training run is kept from its first
    checkpoint on, long before its summary: its caller writes the summary after.
    """
    started = time.perf_counter()
    folder = RunFolder(inputs, output_file, _timed(before_keep, started))
    try:
        plan = None
        if not config.resume and not distributed.joins_process_group():
            # A new run in one process is checked before torch is even imported: a refused
            # run folder costs a fraction of a second.
            plan = plan_run(config, overrides)
            folder.open(DistContext(), plan)
        if is_main_process():
            folder.start_painter()  # the plots' library (matplotlib) loads beside torch
        timeline = RunTimeline(started, process_age)
        return _run_with_torch(
            config, overrides, plan, folder, callbacks or TrainCallbacks(), timeline
        )
    except BaseException as error:
        folder.release(ok=False, error=error)
        raise


def _timed(
    before_keep: Callable[[TrainResult], None] | None, started: float
) -> Callable[[TrainResult], None] | None:
    """`before_keep` given the result with its time so far: the report written before the
    run ends counts up to that point."""
    if before_keep is None:
        return None

    def report(result: TrainResult) -> None:
        result.total_seconds = time.perf_counter() - started
        before_keep(result)

    return report


def _run_with_torch(
    config: TrainConfig,
    overrides: Collection[str] | None,
    plan: RunPlan | None,
    folder: RunFolder,
    callbacks: TrainCallbacks,
    timeline: RunTimeline,
) -> TrainResult:
    """The run in this process (one rank under torchrun), with torch's global switches
    (threads, deterministic algorithms, cuDNN) put back as they were afterwards."""
    import torch

    timeline.mark("importing torch")
    flags = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.benchmark_limit,
    )
    # The options first: a resumed run's device and collective timeout are its saved ones
    # unless given again, like every other option.
    # One process puts back an earlier run that a killed --force run of --resume's folder set
    # aside (under torchrun, the ranks would race for it: refused, naming it).
    plan = plan or plan_run(config, overrides, put_back=not distributed.joins_process_group())
    threads = compute_threads(loader_workers(plan.config), plan.config.threads)
    if plan.config.deterministic and plan.config.threads is None:
        # Numbers that do not depend on --workers: torch's one thread per core, as before the
        # rule (a resume or replay with other workers would compute other sums).
        threads = None
    try:
        with torch_threads(threads):
            return _run_on_device(plan, folder, callbacks, timeline)
    finally:
        if torch.are_deterministic_algorithms_enabled() != flags[0]:
            from torchkit.core.runtime.seeding import use_deterministic_algorithms

            use_deterministic_algorithms(flags[0])
        cudnn = torch.backends.cudnn
        cudnn.deterministic, cudnn.benchmark, cudnn.benchmark_limit = flags[1:]


def _run_on_device(
    plan: RunPlan, folder: RunFolder, callbacks: TrainCallbacks, timeline: RunTimeline
) -> TrainResult:
    """The run on its device (and process group under torchrun), its failures as one error."""
    import torch

    config = plan.config
    # The process group is joined once the loaders' workers are forked (`JoinedAfterForks`).
    ctx = distributed.place(config.device)
    join = distributed.JoinedAfterForks(ctx, config.dist_timeout, timeout_option="--dist-timeout")
    try:
        with ddp.one_line_per_failure(ctx):
            with join:
                ddp.check_ddp_device(ctx)
                result = _train(ctx, plan, folder, callbacks, timeline, join)
            # Every rank leaves together: a rank tearing down Gloo while another still finishes
            # its last collective made the latter abort at exit ("terminate called without an
            # active exception", seen in about one full test run in four).
            distributed.barrier(ctx)
            return result
    except torch.OutOfMemoryError as error:
        # Training's activations follow the training crop: --train-crop-size where given.
        crop = "--train-crop-size" if config.train_crop_size is not None else "--image-size"
        raise DeviceError(
            f"the GPU ran out of memory with --batch-size {config.batch_size}",
            f"use a smaller --batch-size, --amp, or a smaller {crop}; --accum-steps keeps the "
            "effective batch with a smaller --batch-size",
        ) from error
    except RuntimeError as error:
        # A collective that timed out (--dist-timeout) or lost a rank: one error line.
        described = ddp.describe_collective_failure(ctx, error, config.dist_timeout)
        if described is None:
            raise
        stopped = ddp.stop_that_lost_a_peer(ctx, error, callbacks.stop_signal())
        if stopped is not None:
            raise stopped from None
        raise described from error
    finally:
        distributed.teardown(ctx)


def _train(
    ctx: DistContext,
    plan: RunPlan,
    folder: RunFolder,
    callbacks: TrainCallbacks,
    timeline: RunTimeline,
    join: Callable[[], None],
) -> TrainResult:
    """This rank's part of the run: set up (joining the process group with `join` once the
    loaders' workers are forked), write the run files, train and test (or the range test). A
    failure removes a new run that saved nothing and puts an earlier one back."""
    state: TrainState | None = None
    try:
        try:
            state = _set_up(ctx, plan, folder, join)
            result = _begin(ctx, plan, state, folder)
            timeline.mark("set-up", setup_details(state, time.perf_counter() - timeline.last))
            if state.config.find_lr:
                with _image_size_checked(ctx, state):
                    _find_lr(ctx, state, folder, result)
                timeline.mark("the range test")
            else:
                _announce(ctx, state, folder, callbacks)
                epochs = EpochDriver(ctx, state, folder, callbacks, result)
                with _image_size_checked(ctx, state):
                    epochs.run()
                timeline.mark(epochs.phase(), epochs.time_split())
                _branch_without_training(ctx, plan, state, folder, result)
                if state.step_ctx.graphed is not None:
                    log.info("%s", state.step_ctx.graphed.summary())
                evaluate_best_on_test(ctx, state, folder, callbacks, result)
                if result.test_top1 is not None:
                    timeline.mark("test")
                folder.wait_saved()  # curves.png, drawn during the test
        except BaseException as error:
            folder.release(ok=False, error=error)
            raise
        folder.release(ok=result.kept)
    finally:
        if state is not None:
            state.epoch_starts.close()  # its decoding threads read from the workers: first
            state.loaders.close()  # DataLoader workers stop now, whatever happened
    timeline.mark("closing")
    result.total_seconds = time.perf_counter() - timeline.started
    if ctx.is_main and EpochTimeline.wanted():
        timeline.report()
    return result


def setup_details(state: TrainState, seconds: float) -> str:
    """The set-up phase's split for `train -v`, of its `seconds`: the data, the loaders,
    starting their workers, the model (built on the CPU), the model to the device, the
    optimiser and the rest of the training state, then what is left (the checks and the run
    folder)."""
    steps = list(state.setup_split)
    steps.append(("the run folder", seconds - sum(s for _, s in steps)))
    return ", ".join(f"{what} {max(0.0, s):.2f} s" for what, s in steps)


def _set_up(
    ctx: DistContext, plan: RunPlan, folder: RunFolder, join: Callable[[], None]
) -> TrainState:
    """Everything that can fail on bad input, before anything is written: the options' own
    checks, the run folder (checked and locked), then data, model and training state. Under
    torchrun the folder is checked once the ranks have joined (rank 0 tells the others the
    outcome), after the loaders' workers are forked: none is forked beside Gloo's threads."""
    config = plan.config
    sync_bn = ddp.check_sync_bn(ctx, config.sync_bn, plan.resumed_from)
    if config.tensorboard:
        check_tensorboard()
    amp = build_amp(ctx.device, config)
    if not ctx.is_distributed:
        folder.open(ctx, plan)  # no other rank to tell: before the data is read

    def joined() -> None:
        join()
        folder.open(ctx, plan)

    return prepare_state(ctx, plan, amp, sync_bn, after_forks=joined)


def _begin(ctx: DistContext, plan: RunPlan, state: TrainState, folder: RunFolder) -> TrainResult:
    """The run folder with config.json and split.csv (rank 0), once every check has passed,
    and the result the run fills in."""
    # Every rank has loaded its data (a collective) before rank 0 writes.
    _check_same_data(ctx, state)
    if ctx.is_main:
        folder.begin(_config_json(ctx, state), state.data.splits)
    _carry_best(ctx, plan, state, folder)
    distributed.barrier(ctx)
    config = state.config
    if config.tensorboard and ctx.is_main:
        folder.open_tensorboard(purge_step=state.start_epoch + 1)
    return TrainResult(
        out_dir=folder.path,
        model=state.arch,
        data=redact_url(config.data),
        epochs=state.start_epoch,
        best_epoch=state.best_epoch,
        best_val_top1=state.best_value("top1"),
        best_val_top5=state.best_value("top5"),
        best_metric=config.best_metric,
        best_by_ema=state.best_by_ema(),
        num_classes=len(state.classes),
        resumed_from=state.resumed_name,
        train_size=state.loaders.train_size,
        val_size=state.loaders.val_size,
        test_size=state.loaders.test_size,
        is_main=ctx.is_main,
        world_size=ctx.world_size,
        images_per_update=config.images_per_update(ctx.world_size),
        history=state.history,
        config=config.to_dict(),
    )


@contextlib.contextmanager
def _image_size_checked(ctx: DistContext, state: TrainState) -> Iterator[None]:
    """A model too deep for the training crop (--train-crop-size, else --image-size) fails at
    its first batch with torch's shape error: that becomes one line naming the smallest size it
    takes (`image_size_refusal`). A collective that timed out or lost a rank is not judged: the
    model's run on the meta device imports sympy and torch._dynamo (seconds) before that error
    is told (`_run_on_device` describes it)."""
    try:
        yield
    except ValueError as error:
        if not one_value_per_channel(error):
            raise
        # BatchNorm in training mode on a batch of one image whose feature map is 1x1 there.
        side = train_preprocess(state.preprocess, state.config).image_size
        hint = "give --batch-size 2 or more, or a larger --image-size"
        if state.config.batch_size > 1:  # a batch that unreadable images left one image of
            hint = "use a larger --image-size, or fix or remove the unreadable images"
        raise UsageError(
            f"{state.arch} cannot train on batches of one {side}x{side} image: BatchNorm in "
            "training mode needs more than one value per channel, and the model's feature map "
            "is 1x1 there",
            hint,
        ) from error
    except RuntimeError as error:
        if ddp.describe_collective_failure(ctx, error, None) is not None:
            raise
        # The training crop (--train-crop-size), the first size the model runs at.
        preprocess = train_preprocess(state.preprocess, state.config)
        refusal = image_size_refusal(
            state.model,
            state.arch,
            (1, preprocess.in_channels, preprocess.image_size, preprocess.image_size),
            error,
            doing="train on",
        )
        if refusal is None:
            raise
        raise refusal from error


def _check_same_data(ctx: DistContext, state: TrainState) -> None:
    """Every rank must read the same data: each node reads --data from its own disk, and a
    copy that differs (images added or missing, another class) made the ranks' epochs differ
    in length, so that their collectives no longer matched (Gloo aborted rank 0 mid-run, or
    the ranks waited out --dist-timeout), or trained on labels meaning other classes. The
    same error on every rank, before anything is written."""
    loaders = state.loaders
    mine = (list(state.classes), loaders.train_size, loaders.val_size, loaders.test_size)
    every = distributed.all_gather(ctx, mine)
    other = next((rank for rank, theirs in enumerate(every) if theirs != every[0]), None)
    if other is None:
        return
    if every[other][0] != every[0][0]:
        difference = f"classes {_names(every[other][0])} instead of {_names(every[0][0])}"
    else:
        difference = f"{_sizes(every[other])} instead of {_sizes(every[0])}"
    raise on_every_rank(
        InputError(
            f"rank {other} reads other data than rank 0: {difference}",
            "every node must read the same --data: copy the same files to each node",
        )
    )


def _names(classes: list[str]) -> str:
    return ", ".join(classes[:5]) + (", ..." if len(classes) > 5 else "")


def _sizes(data: tuple) -> str:
    _, train, val, test = data
    return f"{train} train / {val} val / {test} test images"


def _carry_best(ctx: DistContext, plan: RunPlan, state: TrainState, folder: RunFolder) -> None:
    """A run resumed into another folder starts with the resumed run's best.pt (one continued
    in place, with its own). If that epoch's weights cannot be found (resumed from an early
    epoch-NNN.pt whose folder's best.pt is of a later epoch, or best.pt deleted, say), the
    best epoch starts over, with a warning, rather than naming a best.pt that is not there
    (the test evaluation would fail after the training)."""
    if plan.checkpoint is None or state.best_epoch is None:
        return
    if folder.carry_best(ctx, plan.resumed_from, plan.checkpoint):
        return
    log.warning(
        "the weights of the best epoch so far (%d) are not beside %s: best.pt will "
        "be the best of the epochs from here on",
        state.best_epoch,
        plan.resumed_from,
    )
    state.best_epoch, state.best_metric = None, None


def _branch_without_training(
    ctx: DistContext, plan: RunPlan, state: TrainState, folder: RunFolder, result: TrainResult
) -> None:
    """A run resumed into another folder with nothing to train (its epochs all done, its stop
    rule met) still makes that folder a run: last.pt (the checkpoint it resumed) and
    metrics.csv beside the best.pt carried over, so that `--resume NEW` continues it (the
    folder held best.pt and config.json alone, and `--resume NEW` found no last.pt)."""
    if not ctx.is_main or plan.checkpoint is None or folder.in_place:
        return
    if folder.saved_any or result.interrupted:
        return
    folder.save_epoch(
        plan.checkpoint, state.history, len(state.classes), is_best=False, config=state.config
    )


def _config_json(ctx: DistContext, state: TrainState) -> dict:
    """config.json: the options, what the data decided, and where and how the run ran."""
    config, loaders = state.config, state.loaders
    return {
        "options": (options := config.to_dict()),
        DEFAULTS_FROM_DATA: data_chosen(options, config.data_defaults),
        "classes": state.classes,
        "num_classes": len(state.classes),
        "class_weights": state.class_weights,
        "arch": state.arch,
        "preprocess": state.preprocess.to_dict(),
        "data_sizes": {
            "train": loaders.train_size,
            "val": loaders.val_size,
            "test": loaders.test_size,
        },
        "data": {key: state.data.record[key] for key in ("spec", "kind", "root", "sizes")}
        | {"split_csv": SPLIT_CSV},
        "world_size": ctx.world_size,
        # Images a forward-backward pass sees across the ranks, and images an optimizer step
        # learns from (with --accum-steps, several such passes).
        "global_batch_size": config.batch_size * ctx.world_size,
        "images_per_update": config.images_per_update(ctx.world_size),
        "device": str(ctx.device),
        "amp_dtype": state.amp.dtype,
        "resumed_from": state.resumed_name,
        "versions": versions(),
    }


def _find_lr(ctx: DistContext, state: TrainState, folder: RunFolder, result: TrainResult) -> None:
    """The learning-rate range test instead of training: lr_find.csv and lr_find.png in the
    run folder, no checkpoint, the weights as they were."""
    from torchkit.core.train.lr_find import find_lr

    config, loaders = state.config, state.loaders
    if ctx.is_distributed:
        raise UsageError("--find-lr runs in one process", "run it without torchrun")

    def batches():
        loaders.train_sampler.set_epoch(0)
        return iter(loaders.train)

    found = find_lr(
        state.step_ctx,
        batches,
        lr_min=config.lr_min,
        lr_max=config.lr_max,
        iterations=config.find_lr_iters,
        lr=config.lr,
    )
    result.suggested_lr = found.suggested_lr
    result.lr_find_iterations = len(found.lrs)
    result.lr_find_diverged = found.diverged
    if ctx.is_main:
        folder.write_lr_find(found, result)  # the result first: its report precedes the keep


def _trained_beyond_epochs(state: TrainState) -> tuple[str, str]:
    """What a resumed run trained that leaves --epochs nothing to do, and the hint: `RUN/last.pt
    already trained 3 epochs, more than --epochs 1` (it read `trained 3 of 1 epochs`)."""
    done, epochs = state.start_epoch, state.config.epochs
    trained = f"{state.resumed_name or 'the run'} already trained {counted(done, 'epoch')}"
    if state.progress.batches > 0:  # saved inside the epoch after them
        trained += f" and part of epoch {done + 1}"
    elif done == epochs:
        hint = "pass a larger --epochs to continue it"
        return f"{trained}, all that --epochs {epochs} asks for", hint
    return (
        f"{trained}, more than --epochs {epochs}",
        f"pass --epochs {done + 1} or more to continue it",
    )


def _announce(
    ctx: DistContext, state: TrainState, folder: RunFolder, callbacks: TrainCallbacks
) -> None:
    """Tell the display what the run is about to do (rank 0)."""
    if not ctx.is_main:
        return
    config, loaders = state.config, state.loaders
    callbacks.on_start(
        RunInfo(
            out_dir=folder.path,
            device=str(ctx.device),
            world_size=ctx.world_size,
            model=state.arch,
            parameters=state.parameters,
            trainable=sum(p.numel() for g in state.groups for p in g.params),
            classes=state.classes,
            train_size=loaders.train_size,
            val_size=loaders.val_size,
            test_size=loaders.test_size,
            epochs=config.epochs,
            start_epoch=state.start_epoch,
            steps_per_epoch=state.steps_per_epoch,
            resumed_from=state.resumed_name,
            best_val_top1=state.best_value("top1"),
            config=config,
            notes=list(state.data.notes),
        )
    )
    if state.start_epoch >= config.epochs:  # also from inside a later epoch: it stays undone
        log.warning("%s: nothing to train (%s)", *_trained_beyond_epochs(state))
    elif state.progress.batches > 0:
        return  # an epoch to finish, whatever --early-stop says
    elif state.patience_spent(state.start_epoch):  # the loop trains nothing (EpochDriver)
        # A saved run whose patience ran out at its own last epoch did not stop early.
        what = (
            "the run stopped early"
            if state.resumed_stopped_early
            else "the run's --early-stop rule is met"
        )
        log.warning(
            "%s after %d epochs, %d without a better val %s (--early-stop %d): nothing to "
            "train (pass a larger --early-stop, or --early-stop 0, to continue it)",
            what,
            state.start_epoch,
            state.start_epoch - state.best_epoch,
            config.best_metric,
            config.early_stop,
        )
