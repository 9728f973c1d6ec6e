"""Setting a run up: the options it goes by (`plan_run`), --amp (`build_amp`), then everything
that can fail on bad input, before anything is written (`prepare_state`): data, model,
optimiser, schedule, EMA and the DDP wrapper, restored from the checkpoint when resuming."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkit.core.data.decode import NormalizedPixels
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources.digits import DIGITS
from torchkit.core.io.errors import CheckpointError, UsageError
from torchkit.core.models.norms import has_batch_norm
from torchkit.core.models.transform_input import mean_std_as_trained
from torchkit.core.models.usercode import model_code_folder
from torchkit.core.runtime import distributed
from torchkit.core.runtime.device import resolve_amp_dtype, to_channels_last
from torchkit.core.runtime.distributed import DistContext
from torchkit.core.train import ddp
from torchkit.core.train.checkpoints import load_for_resume
from torchkit.core.train.class_weights import class_weights
from torchkit.core.train.config import TRAIN_OPTIONS, TrainConfig
from torchkit.core.train.config_file import DEFAULTS_FROM_DATA, data_chosen
from torchkit.core.train.epoch_starts import EpochStarts
from torchkit.core.train.loaders import (
    TrainData,
    build_loaders,
    load_splits,
    preprocess_for,
    train_preprocess,
)
from torchkit.core.train.loop import StepContext, UnreadableImages
from torchkit.core.train.resume import (
    ResumePoint,
    realign_schedule,
    restore_training,
    resume_point,
)
from torchkit.core.train.resume_data import DIGESTS, check_resumed_samples, sample_digests
from torchkit.core.train.resume_merge import given_options, merge_for_resume
from torchkit.core.train.state import Amp, TrainState
from torchkit.core.train.timeline import RunTimeline
from torchkit.core.train.validation import fitted_to_this_machine, resolve_defaults

log = logging.getLogger("torchkit")


@dataclass
class RunPlan:
    """The options a run goes by (a resumed run's own, with the options given again; defaults
    filled in for the data) and the checkpoint it continues."""

    config: TrainConfig
    resumed_from: Path | None = None
    checkpoint: dict | None = None
    # The checkpoint given as --weights or --model, read once: for its recorded preprocessing,
    # then for the model.
    model_file: Any = None


def plan_run(requested: TrainConfig, overrides, *, put_back: bool = False) -> RunPlan:
    """`requested` with `--resume`'s checkpoint read and merged (`overrides`: the options given
    again; None: those that differ from the defaults). A new run imports no torch here, but for
    a checkpoint given as --weights or --model, whose recorded mean/std it reads. `put_back`:
    the run that --resume DIR goes on with (one process): an earlier run of DIR that a killed
    --force run set aside is put back first (`resume_path`)."""
    config, resumed_from, checkpoint = requested, None, None
    not_given: list[str] = []
    if config.resume:
        resumed_from, checkpoint = load_for_resume(config.resume, put_back=put_back)
        config = merge_for_resume(checkpoint["config"], config, overrides, resumed_from)
        # The run's own values were warned of when it started (and --no-amp makes its
        # --amp-dtype unused without that value being given for nothing).
        given = set(given_options(requested, overrides))
        if "data" not in given:
            from torchkit.core.data.sources.required import recorded_data_from_here

            data = recorded_data_from_here(config.data, checkpoint.get("data"), resumed_from)
            config = dataclasses.replace(config, data=data)
        not_given = [name for name in TRAIN_OPTIONS if name not in given]
        config = fitted_to_this_machine(config, not_given, "the resumed run's")
        as_trained = mean_std_as_trained(checkpoint, str(resumed_from))
        if as_trained is not None:  # an older googlenet's transform_input, as eval feeds it
            config = dataclasses.replace(config, mean=as_trained[0], std=as_trained[1])
    model_file = _model_file(config)
    config = resolve_defaults(
        config, is_digits=config.data == DIGITS, ahead=model_file, not_given=not_given
    )
    return RunPlan(config, resumed_from, checkpoint, model_file)


def _model_file(config: TrainConfig) -> Any:
    """A `ReadAhead` of the checkpoint --weights or --model names, read when first asked for;
    None for a model name."""
    from torchkit.core.models.builders import is_checkpoint_path

    source = config.weights or config.model
    if not source or not is_checkpoint_path(str(source)):
        return None
    from torchkit.core.models.resolver import ReadAhead

    return ReadAhead(str(source), config.trust_checkpoint)


def effective_config(
    config: TrainConfig, overrides: Collection[str] | None = None
) -> dict[str, Any]:
    """What the run will use, for `--print-config`: `plan_run`'s options (data defaults filled;
    with --resume the resumed run's own, with `overrides` given again), not a new run's; and,
    as in config.json, which of them the data chose, so that the printed recipe replayed on
    other data (`--config FILE --data other/`) chooses those again, as a config.json does."""
    resolved = plan_run(config, overrides).config
    options = {name: value for name, value in resolved.to_dict().items() if name in TRAIN_OPTIONS}
    return {**options, DEFAULTS_FROM_DATA: data_chosen(options, resolved.data_defaults)}


def build_amp(device: Any, config: TrainConfig) -> Amp:
    """--amp on `device`: autocast in `resolve_amp_dtype`'s dtype (the one rule of every
    command) and, for float16, a GradScaler."""
    import torch

    if not config.amp:
        return Amp(contextlib.nullcontext, None, "float32")
    dtype = resolve_amp_dtype(config.amp_dtype, device)
    name = str(dtype).rsplit(".", 1)[-1]
    # float16 needs its loss scaled (bfloat16 has float32's range): on CUDA, MPS, and on CPUs,
    # where the same path runs (and is tested) without a GPU.
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    return Amp(lambda: torch.autocast(device.type, dtype=dtype), scaler, name)


def prepare_state(
    ctx: DistContext,
    plan: RunPlan,
    amp: Amp,
    sync_bn: bool,
    after_forks: Callable[[], None] | None = None,
) -> TrainState:
    """Data, model and training state of the run (restored from the checkpoint when resuming),
    everything checked before anything is written. The first epoch's batches are asked for
    (and, decoding on a GPU, its decoder readied) before the model is built, so that both run
    while the rest sets up; the loaders' workers are stopped again if a later step fails.
    `after_forks` runs once every loader worker is forked (under torchrun: joining the process
    group, whose threads no worker may be forked beside)."""

    split = RunTimeline(time.perf_counter(), None)  # where the set-up's time goes (`train -v`)
    checkpoint = plan.checkpoint
    run = _seeds_and_data(ctx, plan, amp)
    config, data, preprocess = run.config, run.data, run.preprocess
    split.mark("seeds and data")
    build_model = functools.cache(  # built once, by whichever asks first
        functools.partial(
            _build_model,
            ctx,
            config,
            run.arch,
            run.classes,
            preprocess,
            sync_bn,
            from_checkpoint=checkpoint is not None,
            resumed_weights=checkpoint.get("model") if checkpoint is not None else None,
            model_file=plan.model_file,
            resumed_from=plan.resumed_from,
            trained_in=model_code_folder(checkpoint),
        )
    )
    loaders, starts = _loaders_and_starts(ctx, config, run, build_model)
    split.mark("loaders")
    try:
        if len(loaders.train) == 0:
            raise UsageError("no training batches", "is the training set empty?")
        point = ResumePoint()
        if checkpoint is not None:
            point = resume_point(checkpoint, ctx, config, plan.resumed_from)
        _start_reading(ctx, config, data, preprocess, loaders, starts, point)
        split.mark("starting the workers")
        if after_forks is not None:
            after_forks()
            if ctx.is_distributed:
                split.mark("joining the ranks")
        model, arch, parameters = build_model()
        split.mark("model")
        _to_device(model, ctx, config)
        split.mark("the model to the device")
        groups, optimizer, schedule = _optimisation(model, config, len(loaders.train))
        if checkpoint is not None:
            restore_training(
                checkpoint,
                plan.resumed_from,
                model=model,
                config=config,
                groups=groups,
                optimizer=optimizer,
                schedule=schedule,
                scaler=amp.scaler,
            )
            realign_schedule(schedule, point, config, train_size_changed=run.train_size_changed)
        ema = _ema(model, config, checkpoint)
        step_ctx = _step_context(
            ctx, config, model, groups, optimizer, schedule, ema, amp, run.weights, preprocess
        )
        if config.cuda_graphs:
            from torchkit.core.train.graphed_step import GraphedStep

            step_ctx.graphed = GraphedStep(step_ctx, amp.dtype, config.batch_size)
    except BaseException:
        _stop_reading(starts, loaders)
        raise
    return TrainState(
        config=config,
        data=data,
        classes=run.classes,
        class_weights=run.weights,
        arch=arch,
        preprocess=preprocess,
        model=model,
        parameters=parameters,
        loaders=loaders,
        epoch_starts=starts,
        drop_last=run.drop_last,
        amp=amp,
        groups=groups,
        optimizer=optimizer,
        schedule=schedule,
        ema=ema,
        step_ctx=step_ctx,
        unreadable=UnreadableImages(config.strict),
        resumed_from=plan.resumed_from,
        start_epoch=point.start_epoch,
        setup_split=_marked(split, "optimiser and the rest"),
        best_metric=point.best_metric,
        best_epoch=point.best_epoch,
        history=point.history,
        progress=point.progress,
        resume_rng=point.rng,
        resumed_stopped_early=point.stopped_early,
    )


@dataclass
class _RunData:
    """What `_seeds_and_data` settled: the config as this run resolves it, its data, classes and
    preprocessing, and what a resumed run's checkpoint decided."""

    config: TrainConfig
    data: TrainData
    classes: list[str]
    weights: Any  # --class-weights: a weight per class, or None
    arch: str
    preprocess: Preprocess
    drop_last: bool
    train_size_changed: bool


def _seeds_and_data(ctx: DistContext, plan: RunPlan, amp: Amp) -> _RunData:
    """The run seeded, cuDNN set, and its data read (a resumed run takes back the split it
    recorded, labelled in its classes' order, and its architecture, trusted)."""
    from torchkit.core.runtime.seeding import seed_everything

    config, checkpoint = plan.config, plan.checkpoint
    config = _resolve_cuda_graphs(ctx, config, amp.dtype)
    if config.cuda_graphs:
        from torchkit.core.train.graphed_step import refuse_ungraphable_run

        refuse_ungraphable_run(ctx.device, distributed=ctx.is_distributed, amp_dtype=amp.dtype)
    seed_everything(config.seed, config.deterministic)
    set_cudnn_switches(ctx.device.type, config)
    # A resumed run takes back the split it recorded (held-out val images included).
    data = load_splits(config, checkpoint.get("data") if checkpoint is not None else None)
    saved: list[str] = []  # the classes of the resumed checkpoint
    if checkpoint is not None:
        saved = _saved_classes(checkpoint, str(plan.resumed_from))
        _label_in_the_runs_order(data, saved, str(config.data))
    train = data.splits["train"]
    drop_last = _drop_last(ctx, config, checkpoint)
    config = _resolve_decode(ctx, config, data)
    classes = list(train.classes)
    weights = class_weights(config.class_weights, classes, train.class_counts())
    arch = str(config.model)
    # Of the samples in the run's class order (a resumed run's relabelled above): recorded in
    # every checkpoint, which rank 0 writes, and compared on --resume by every rank (each stops
    # alike), so a new run's other ranks digest no million names for nothing.
    digests: dict[str, str] = {}
    if checkpoint is not None or ctx.rank == 0:
        held_out_of = data.record.get("held_out_of")  # (a folder named for a split: kept?)
        digests = data.record[DIGESTS] = sample_digests(data.splits, held_out_of)
    train_size_changed = False
    if checkpoint is not None:
        from torchkit.core.models.weights import checkpoint_arch, require_trusted_arch

        _check_resumed_classes(saved, classes)
        sizes = {name: len(samples) for name, samples in data.splits.items()}
        check_resumed_samples(
            checkpoint.get("data"),
            digests,
            sizes,
            Path(plan.resumed_from),
            data.splits,
            data.record.get("held_out_of"),
        )
        train_size_changed = _train_size_changed(checkpoint, len(train))
        arch, _ = checkpoint_arch(checkpoint, str(plan.resumed_from))
        require_trusted_arch(arch, str(plan.resumed_from), config.trust_checkpoint)
    preprocess = preprocess_for(config)
    return _RunData(config, data, classes, weights, arch, preprocess, drop_last, train_size_changed)


def _loaders_and_starts(
    ctx: DistContext, config: TrainConfig, run: _RunData, build_model: Callable[[], tuple]
) -> tuple[Any, EpochStarts]:
    """The loaders and what starts each epoch's batches. They come first, so that their
    workers read the first batches (and the GPU's decoder readies itself) while the model is
    built and moved to the device. They ask for the model only when an epoch would end in a
    batch of one image (BatchNorm refuses it)."""
    loaders = build_loaders(
        run.data.splits,
        run.preprocess,
        config,
        rank=ctx.rank,
        world=ctx.world_size,
        pin_memory=ctx.device.type == "cuda",
        drop_last=run.drop_last,
        drop_lone_image=lambda: has_batch_norm(build_model()[0]),
    )
    if loaders.train.drop_last and not run.drop_last:
        run.data.notes.append(
            "each epoch's last training batch is left out: it would hold 1 image, and "
            "BatchNorm cannot train on a batch of one"
        )
    starts = EpochStarts(
        loaders.train, loaders.train_sampler, decode_ahead=_early_decoding(ctx, config)
    )
    return loaders, starts


def _start_reading(
    ctx: DistContext,
    config: TrainConfig,
    data: TrainData,
    preprocess: Preprocess,
    loaders: Any,
    starts: EpochStarts,
    point: ResumePoint,
) -> None:
    """The loaders' workers forked, and the first epoch's batches asked for (the GPU's decoder
    readied), unless --find-lr, which trains no epoch."""
    if not config.find_lr:
        # Forked first: no thread runs beside them yet (the train loader's are forked with
        # the first epoch's batches below, unless that epoch is resumed in its middle).
        loaders.start_workers(train=point.progress.batches > 0)
    if point.progress.batches == 0 and not config.find_lr:
        # The workers read the first batches and the GPU's decoder readies itself while
        # the model is built and the rest is set up (first epoch: issue #30).
        starts.start_early(point.start_epoch)
        if not starts.decoding_early:  # else decoding the first batches readies it
            _warm_decoder(ctx, config, data, preprocess)


def _stop_reading(starts: EpochStarts, loaders: Any) -> None:
    """After a failed set-up: the decoding threads, then the workers they read from, stopped,
    and the decoder's warm-up waited for (not left inside CUDA calls as the process exits)."""
    starts.close()  # its decoding threads read from the workers: stopped first
    loaders.close()
    from torchkit.core.data.decoder_warm_up import wait_for_decoder_warm_up

    wait_for_decoder_warm_up()  # not left inside CUDA calls while the process exits


def set_cudnn_switches(device_type: str, config: TrainConfig) -> None:
    """On CUDA, cuDNN's autotuning on or off (`cudnn_benchmark_for`: set either way) and, when
    on, how many algorithms it times (--cudnn-benchmark-limit); the runner puts both back."""
    import torch

    if device_type != "cuda":
        return
    benchmark = cudnn_benchmark_for(device_type, config)
    torch.backends.cudnn.benchmark = benchmark
    if benchmark and config.cudnn_benchmark_limit is not None:
        torch.backends.cudnn.benchmark_limit = config.cudnn_benchmark_limit


def cudnn_benchmark_for(device_type: str, config: TrainConfig) -> bool:
    """Whether the run turns cuDNN's autotuning on: on CUDA with --cudnn-benchmark, or a
    --cudnn-benchmark-limit without --no-cudnn-benchmark, never with --deterministic (the
    runner puts torch's switch back afterwards). Off by default: on the H200 it bought
    resnet50 nothing in steady epochs (3,192 img/s with it, 3,277 without) and cost its first
    epoch 11 s (15.6 s against 4.3)."""
    if device_type != "cuda" or config.deterministic:
        return False
    if config.cudnn_benchmark is not None:
        return config.cudnn_benchmark
    return config.cudnn_benchmark_limit is not None


def _drop_last(ctx: DistContext, config: TrainConfig, checkpoint: dict | None) -> bool:
    """Whether the train loader leaves out each epoch's last partial batch: with cuDNN's
    autotuning (`cudnn_benchmark_for`), as timm does, so cuDNN tunes one batch shape only,
    and with --cuda-graphs, whose graph takes one batch shape (others step eagerly). A
    resumed run keeps what its checkpoint did (older ones: no drop), and CPU runs never drop:
    their batches and figures are as they were."""
    if checkpoint is not None:
        return bool(checkpoint.get("drop_last", False))
    return config.cuda_graphs or cudnn_benchmark_for(ctx.device.type, config)


def _marked(timeline: RunTimeline, last: str) -> list[tuple[str, float]]:
    """(step, seconds) of the set-up's timeline, its last step closed as `last`."""
    timeline.mark(last)
    return [(step, seconds) for step, seconds, _ in timeline.phases]


def _resolve_cuda_graphs(ctx: DistContext, config: TrainConfig, amp_dtype: str) -> TrainConfig:
    """The run's config with --cuda-graphs chosen where not given (recorded as chosen, so a
    resumed run or a replayed config.json chooses again): on for the digits data on one CUDA
    device where the options allow a graph. Its steps wait on the host (a few milliseconds
    each, for microseconds of GPU work); a big model's keep the GPU busy, and stay eager."""
    if config.cuda_graphs is not None:
        return config
    chosen = False
    if config.data == DIGITS:  # the graph module is imported for digits runs only
        from torchkit.core.train.graphed_step import run_refusal
        from torchkit.core.train.validation import graph_refusal

        refusal = run_refusal(ctx.device, distributed=ctx.is_distributed, amp_dtype=amp_dtype)
        chosen = refusal is None and graph_refusal(config) is None
    defaults = tuple(sorted({*config.data_defaults, "cuda_graphs"}))
    return dataclasses.replace(config, cuda_graphs=chosen, data_defaults=defaults)


def _resolve_decode(ctx: DistContext, config: TrainConfig, data: TrainData) -> TrainConfig:
    """The run's config with `--decode auto` chosen for this device and data (recorded as
    chosen from the data, so a replayed config.json chooses again)."""
    from torchkit.core.data.device_decode import resolve_decode

    decode, note = resolve_decode(
        config.decode,
        device_type=ctx.device.type,
        paths=data.splits["train"].paths,
        augment=config.augment,
        random_erasing=config.random_erasing,
    )
    if note is not None:
        data.notes.append(note)
    if decode == config.decode:
        return config
    defaults = tuple(sorted({*config.data_defaults, "decode"}))
    share = config.decode_cpu_share
    if decode != "device" and share > 0:
        # Nothing is decoded on the device to share with: the run is recorded as it trains
        # (a resume of a `fast` run with a share would be refused).
        data.notes.append(
            f"--decode-cpu-share {share:g} has nothing to share: --decode auto chose {decode} "
            "for this run, which decodes every JPEG in the loader workers"
        )
        share = 0.0
    return dataclasses.replace(
        config, decode=decode, decode_cpu_share=share, data_defaults=defaults
    )


def _label_in_the_runs_order(data: TrainData, saved: list[str], where: str) -> None:
    """The run's classes named by the data in another order (a folder sorts numbered classes
    as text, `1, 10, 2`, a CSV index of it as numbers): every split labelled in the run's
    order, in place, as the weights' outputs are. Other classes are left to
    `_check_resumed_classes`."""
    from torchkit.core.data.sources.samples import nfc
    from torchkit.core.data.sources.source import relabelled

    classes = list(data.splits["train"].classes)
    names, theirs = [nfc(name) for name in saved], [nfc(name) for name in classes]
    if names == theirs or sorted(names) != sorted(theirs) or len(set(names)) != len(names):
        return
    for split, samples in data.splits.items():
        data.splits[split] = relabelled(samples, saved, f"{where} ({split})")


def _saved_classes(checkpoint: dict, source: str) -> list[str]:
    """The classes the resumed checkpoint `source` was trained on, read as every reader of a
    model file's classes reads them (`stored_class_names`)."""
    from torchkit.core.models.stored_classes import stored_class_names

    return stored_class_names(checkpoint["classes"], f"checkpoint {source}", CheckpointError) or []


def _check_resumed_classes(saved: list[str], classes: list[str]) -> None:
    if saved != classes:
        raise CheckpointError(
            f"the checkpoint was trained on {len(saved)} classes ({_names(saved)}), the "
            f"data has {len(classes)} ({_names(classes)})",
            "resume with the data the run started with",
        )


def _train_size_changed(checkpoint: dict, images: int) -> bool:
    """Whether the data has another number of training images than the checkpoint's (files
    added to the data, or other data of the same classes), said once in a warning, as for
    another number of processes: the run goes on with the new number's updates per epoch, and
    the schedule from the resumed epoch (`resume.realign_schedule`)."""
    saved = ((checkpoint.get("data") or {}).get("sizes") or {}).get("train")
    if saved is None or int(saved) == images:
        return False
    log.warning(
        "the checkpoint was trained on %d training images, the data has %d: the run "
        "continues, but not as it would have (the updates per epoch follow the new number, "
        "the learning-rate schedule goes on from the resumed epoch; resume with the data the "
        "run started with to continue it exactly)",
        int(saved),
        images,
    )
    return True


def _names(classes: list[str]) -> str:
    shown = ", ".join(map(str, classes[:5]))
    return shown + (", ..." if len(classes) > 5 else "")


def _pickled_model_class(arch: str, blocked: str) -> str | None:
    """`module:Class` of the user's code whose instance `arch` pickles whole, where the class
    weights_only refused (`blocked`) is that object's: read from the file, nothing imported."""
    from torchkit.core.models.usercode import class_spec_of_pickled, pickled_root_class

    if not os.path.isfile(arch):
        return None
    root = pickled_root_class(arch)
    if root is None or ".".join(root) != blocked:
        return None
    return class_spec_of_pickled(*root)


def _pickled_model_refusal(arch: str, spec: str | None, *, trusted: bool) -> UsageError:
    """A pickled model given as --model: its class (`spec`, the user's code) is the
    architecture to give, the file its weights, which load only trusted."""
    hint = "name the architecture as --model and pass the file as --weights"
    if spec is not None:
        from torchkit.core.io.shell_words import shell_word

        hint = (
            f"give its class as --model {shell_word(spec)}, or a function that builds it, "
            f"and the file as --weights {shell_word(arch)}"
        )
        if not trusted:
            hint += " with --trust-checkpoint, only if you trust where it came from"
    return UsageError(
        f"{arch} is a pickled model: train needs an architecture it can rebuild "
        "for eval and --resume",
        hint,
    )


def _build_model(
    ctx: DistContext,
    config: TrainConfig,
    arch: str,
    classes: list[str],
    preprocess: Preprocess,
    sync_bn: bool,
    *,
    from_checkpoint: bool,
    resumed_weights: Any = None,
    model_file: Any = None,
    resumed_from: Path | None = None,
    trained_in: str | None = None,
) -> tuple[Any, str, int]:
    """(model on the CPU, its architecture's name, its parameter count): a new head for the
    data's classes, whatever the weights had (a resumed run's weights come later: the
    auxiliary heads are fitted to them here, before the optimiser takes the parameters).
    `trained_in`: the working directory a resumed run trained in, where its model code
    (`package.module:Callable`) is looked for first."""

    from torchkit.core.models import resolve_model
    from torchkit.core.models.checkpoint import UntrustedPickleError
    from torchkit.core.models.heads import fit_auxiliary_heads_to, switch_off_auxiliary_heads
    from torchkit.core.models.usercode import code_of_the_run_in

    try:
        with code_of_the_run_in(trained_in, resumed_from or ""):
            resolved = resolve_model(
                arch,
                weights=None if from_checkpoint else config.weights,
                num_classes=len(classes),
                trust_checkpoint=config.trust_checkpoint,
                image_size=preprocess.image_size,
                in_channels=preprocess.in_channels,
                new_head=True,  # fine-tuning: the data's classes, whatever the weights had
                command="train",
                ahead=None if from_checkpoint else model_file,
            )
    except UntrustedPickleError as refused:
        # A whole pickled model of the user's class: train refuses it trusted or not, so the
        # way to train from it is said now, not after --trust-checkpoint has loaded it.
        spec = None if from_checkpoint else _pickled_model_class(arch, refused.blocked)
        if spec is None:
            raise
        raise _pickled_model_refusal(arch, spec, trusted=False) from refused
    if model_file is not None:
        model_file.release()  # the run holds the model, not the file's copy of its weights
    if resolved.source == "pickled model":
        from torchkit.core.models.usercode import class_spec

        spec = class_spec(resolved.model)  # its class, where that is the user's code
        raise _pickled_model_refusal(arch, spec, trusted=True)
    taken = resolved.preprocess.in_channels if resolved.preprocess else preprocess.in_channels
    if taken != preprocess.in_channels:  # a checkpoint's own channels: its first layer's
        raise CheckpointError(
            f"{arch} takes {taken}-channel images, and train feeds it "
            f"{preprocess.in_channels}-channel (RGB) images",
            "fine-tune weights trained on RGB images",
        )
    model = resolved.model
    if not from_checkpoint and resolved.classes:
        _order_head_as(model, resolved.classes, classes, config.weights or arch)
    if isinstance(resumed_weights, Mapping):
        fit_auxiliary_heads_to(model, resumed_weights)  # none in a run from googlenet's DEFAULT
    parameters = sum(p.numel() for p in model.parameters())
    switch_off_auxiliary_heads(model)
    built_for = None
    if resolved.preprocess_source == "checkpoint":  # the size it records, or is rebuilt for
        built_for = int((resolved.sample_shape or (resolved.preprocess.image_size,))[-1])
    _check_image_sizes(model, resolved.arch, preprocess, config, built_for=built_for)
    from torchkit.core.train.optim import backbone_trains, freeze_backbone

    if not backbone_trains(config):
        freeze_backbone(model)
    if sync_bn:
        model = ddp.convert_sync_bn(model)
    # (a checkpoint given as --model names its architecture)
    return model, resolved.arch, parameters


def _order_head_as(model: Any, recorded: list[str], classes: list[str], source: str) -> None:
    """Fine-tuning weights that name the data's classes in another order (a folder sorts
    numbered classes as text, `1, 10, 2`, a CSV index as numbers, `1, 2, 10`): their head is
    kept for the same classes, its outputs put in the data's order (row by row of each class
    layer), so that each output goes on meaning the class it was trained on."""
    import torch

    from torchkit.core.data.sources.samples import nfc
    from torchkit.core.models.heads import class_layers

    names, wanted = [nfc(str(name)) for name in recorded], [nfc(name) for name in classes]
    if names == wanted or sorted(names) != sorted(wanted) or len(set(names)) != len(names):
        return
    position = {name: index for index, name in enumerate(names)}  # one look-up a class
    order = torch.tensor([position[name] for name in wanted])
    with torch.no_grad():
        for _, layer in class_layers(model):
            for tensor in (layer.weight, layer.bias):
                if tensor is not None:
                    tensor.copy_(tensor[order.to(tensor.device)])
    shown = ", ".join(map(str, recorded[:6])) + (" ..." if len(recorded) > 6 else "")
    log.warning(
        "%s names the data's classes in another order (%s): its head's outputs are put in "
        "the data's order, each still the class it was trained on",
        source,
        shown,
    )


def _check_image_sizes(
    model: Any, arch: str, preprocess: Preprocess, config: TrainConfig, *, built_for: int | None
) -> None:
    """Sizes a model built for one input size (the convnet's classifier) cannot train at,
    refused before the run starts (a meta-device copy tries them: no compute): an
    --image-size other than the one a checkpoint fine-tuned as --model is built for
    (`built_for`: the size it records, or the one the resolver rebuilt a ViT or another model
    built for one size for, its weights adapted as for eval), and a --train-crop-size other
    than --image-size. A model too deep for small images is left to the first batch's
    refusal, which names the smallest size it takes."""
    from torchkit.core.models.image_size import meta_runner, smallest_running_side

    side = train_preprocess(preprocess, config).image_size
    resized = built_for is not None and built_for != preprocess.image_size
    if not resized and side == preprocess.image_size:
        return
    runs = meta_runner(model, preprocess.in_channels)
    if runs is None:
        return
    if resized and not runs(preprocess.image_size):
        size = preprocess.image_size
        if smallest_running_side(runs, size) is None:
            hint = f"drop --image-size to fine-tune at {built_for}, or train a new --model {arch} "
            hint += f"at {size}"
            raise UsageError(
                f"--image-size {size}: {config.weights or config.model} ({arch}) does not run "
                f"on {size}x{size} images; it is built for the {built_for} px its checkpoint "
                "records",
                hint,
            )
    if side != preprocess.image_size and not runs(side):
        raise UsageError(
            f"--train-crop-size {side}: {arch} does not run on {side}x{side} images; it is "
            f"built for --image-size {preprocess.image_size}",
            "drop --train-crop-size, or train a model that takes any input size",
        )


def _to_device(model: Any, ctx: DistContext, config: TrainConfig) -> None:
    """The model on the run's device, channels-last with --channels-last, in place."""
    model.to(ctx.device)
    if config.channels_last:
        to_channels_last(model)


def _early_decoding(ctx: DistContext, config: TrainConfig) -> Callable[[Any], Any] | None:
    """What decodes an epoch started early (`EpochStarts`): a `DecodedAhead` when the run
    decodes ahead and may hold more than a step's batches (`decode_ahead.ahead_budget`)."""
    from torchkit.core.data import decode_ahead

    if not decode_ahead.decodes_ahead(config.decode, ctx.device):
        return None
    if decode_ahead.ahead_budget(ctx.device) == 0:
        return None
    return functools.partial(decode_ahead.DecodedAhead, device=ctx.device)


def _warm_decoder(
    ctx: DistContext, config: TrainConfig, data: TrainData, preprocess: Preprocess
) -> None:
    """Ready the GPU's JPEG decoder with the first training JPEG (`decoder_warm_up`) when the
    run decodes on the device."""
    from torchkit.core.data import decode_ahead
    from torchkit.core.data.decode import JPEG_SUFFIXES

    if not decode_ahead.decodes_ahead(config.decode, ctx.device):
        return
    paths = data.splits["train"].paths or []
    first = next((str(p) for p in paths if str(p).lower().endswith(JPEG_SUFFIXES)), None)
    if first is not None:
        from torchkit.core.data.decoder_warm_up import start_decoder_warm_up
        from torchkit.core.data.device_decode import ready_decoder

        size = train_preprocess(preprocess, config).image_size  # the training crop's
        start_decoder_warm_up(
            functools.partial(ready_decoder, first, ctx.device, size, preprocess.interpolation)
        )


def _optimisation(model: Any, config: TrainConfig, steps_per_epoch: int) -> tuple:
    """(parameter groups, optimiser, lr schedule)."""
    from torchkit.core.runtime import dynamo_free
    from torchkit.core.train.optim import (
        LRSchedule,
        build_optimizer,
        param_groups,
        warn_if_accumulating_past_an_epoch,
        warn_if_warmup_too_short,
    )

    groups = param_groups(model, config)
    if not config.compile:
        dynamo_free.mark_not_compiled()
    optimizer = build_optimizer(groups, config)
    updates_per_epoch = math.ceil(steps_per_epoch / config.accum_steps)
    if not config.find_lr:  # --find-lr runs no schedule
        warn_if_warmup_too_short(config, updates_per_epoch)
        warn_if_accumulating_past_an_epoch(config, steps_per_epoch)
    return groups, optimizer, LRSchedule(optimizer, config, updates_per_epoch)


def _ema(model: Any, config: TrainConfig, checkpoint: dict | None) -> Any:
    """--ema: the running average of `model`'s weights (the checkpoint's when resuming)."""
    if not config.ema:
        return None
    from torchkit.core.train.ema import ModelEMA

    ema = ModelEMA(model, config.ema_decay)
    if checkpoint is not None and "model_ema" in checkpoint:
        ema.load_state_dict(checkpoint["model_ema"], checkpoint.get("ema_updates", 0))
    return ema


def _step_context(
    ctx: DistContext,
    config: TrainConfig,
    model: Any,
    groups: list,
    optimizer: Any,
    schedule: Any,
    ema: Any,
    amp: Amp,
    weights: list[float] | None,
    preprocess: Preprocess,
) -> StepContext:
    """What every training step needs: the model wrapped for DDP (and compiled with
    --compile), the loss, and the step's options."""
    from torchkit.core.data import decode_ahead
    from torchkit.core.train.class_weights import training_loss
    from torchkit.core.train.optim import frozen_norms_to_eval

    side = train_preprocess(preprocess, config).image_size  # of the training batches
    wrapped = ddp.wrap_ddp(model, ctx, compiled=config.compile) if ctx.is_distributed else model
    if config.compile:
        from torchkit.core.runtime.compiled import compile_module

        wrapped = compile_module(wrapped)
    return StepContext(
        model=wrapped,
        module=model,
        optimizer=optimizer,
        schedule=schedule,
        criterion=training_loss(weights, config.label_smoothing, ctx.device),
        device=ctx.device,
        scaler=amp.scaler,
        ema=ema,
        autocast=amp.autocast,
        channels_last=config.channels_last,
        accum_steps=config.accum_steps,
        clip_grad=config.clip_grad,
        l1=config.l1,
        # L1 goes where weight decay goes: weights, not biases and norms (unless --decay-all).
        l1_params=[p for g in groups if not g.name.endswith("no_decay") for p in g.params],
        mixup_alpha=config.mixup_alpha,
        cutmix_alpha=config.cutmix_alpha,
        distributed=ctx.is_distributed,
        input_shape=(preprocess.in_channels, side, side),
        normalized_pixels=NormalizedPixels(preprocess.mean, preprocess.std),
        # On a GPU the JPEGs of the next batch are decoded while this one trains.
        decode_ahead=decode_ahead.decodes_ahead(config.decode, ctx.device),
        frozen_norms=frozen_norms_to_eval(model) if config.freeze_backbone else None,
        earliest_over_ranks=(
            functools.partial(_earliest_over_ranks, ctx) if ctx.is_distributed else None
        ),
        check_gradients=(
            functools.partial(ddp.refuse_untrained_parameters, ctx, model)
            if ctx.is_distributed
            else None
        ),
    )


def _earliest_over_ranks(ctx: DistContext, batch: int) -> int:
    """The smallest of the ranks' `batch` values that are not -1 (-1 if all are): one
    all-reduce of a slot per rank."""
    slots = [0.0] * ctx.world_size
    slots[ctx.rank] = float(batch + 1)
    found = [int(v) - 1 for v in distributed.all_reduce_sum(ctx, slots) if v > 0]
    return min(found) if found else -1
