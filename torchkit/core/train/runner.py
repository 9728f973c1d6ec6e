"""`run_training(config, callbacks) -> TrainResult`: the whole run, from options to best.pt."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from torchkit.core.checkpoint import load_checkpoint, load_weights_into
from torchkit.core.data import DIGITS, Samples
from torchkit.core.datasource import SPLIT_CSV, write_split_csv
from torchkit.core.decode import NormalizedPixels
from torchkit.core.errors import (
    CheckpointError,
    DeviceError,
    InputError,
    TorchkitError,
    UsageError,
    first_line,
)
from torchkit.core.outputs import (
    MARKER,
    InputPath,
    OutputFolder,
    OutputLockedError,
    OutputOverlapError,
    check_output_file,
    data_inputs,
    lock_path,
)
from torchkit.core.train import distributed as dist_utils
from torchkit.core.train.checkpoints import (
    BEST,
    LAST,
    best_checkpoint_for,
    build_checkpoint,
    copy_checkpoint,
    load_for_resume,
    save_epoch,
)
from torchkit.core.train.class_weights import class_weights
from torchkit.core.train.config import TrainConfig, merge_for_resume, resolve_defaults
from torchkit.core.train.loaders import build_loaders, load_splits, mix_seed, preprocess_for
from torchkit.core.train.loop import (
    DIVERGED_HINT,
    DivergedError,
    EpochProgress,
    StepContext,
    StepInfo,
    UnreadableImages,
    evaluate,
    train_one_epoch,
)
from torchkit.core.train.outputs import (
    RUN_FILES,
    TensorBoardLog,
    check_tensorboard,
    preload_plotting,
    versions,
    write_config_json,
    write_curves_png,
    write_metrics_csv,
)

log = logging.getLogger("torchkit")

TOPK = 5
# Plotting takes a good fraction of a second: curves.png is redrawn at most this often during
# the run, and always at its end. metrics.csv is rewritten after every epoch.
CURVES_EVERY_S = 30.0


@dataclass
class RunInfo:
    """Told to `on_start` once everything is loaded, before the first step."""

    out_dir: Path
    device: str
    world_size: int
    model: str
    parameters: int
    trainable: int
    classes: list[str]
    train_size: int
    val_size: int
    test_size: int
    epochs: int
    start_epoch: int  # completed epochs (0 unless resumed)
    steps_per_epoch: int
    resumed_from: str | None
    best_val_top1: float | None  # of the resumed run so far
    config: TrainConfig
    topk: int = 5  # the k of the top-k metrics (val_top5...): min(5, number of classes)
    notes: list[str] = field(default_factory=list)  # about the data (a held-out val split...)


class TrainCallbacks:
    """Hooks for a progress display; every method is optional. Called on rank 0 only, except
    `should_stop` and `stop_signal`, which every rank polls: a signal to any rank stops all."""

    def on_start(self, info: RunInfo) -> None: ...

    def on_epoch_start(self, epoch: int, epochs: int, steps: int, done: int) -> None: ...

    def on_step(self, info: StepInfo) -> None: ...

    def on_eval(self, split: str) -> None: ...

    def on_epoch_end(self, row: dict, is_best: bool) -> None: ...

    def should_stop(self) -> bool:
        """Polled after each optimiser update and between epochs: True stops the run (Ctrl-C,
        SIGTERM), saving last.pt when there is a run worth keeping. Under torchrun, the ranks
        agree on it about twice a second (`distributed.StopVote`), so the run stops at the
        same update on every rank, shortly after the request."""
        return False

    def stop_signal(self) -> int:
        """The signal that made `should_stop()` true (signal.SIGINT, signal.SIGTERM), 0 if
        none or unknown: told to every rank (`TrainResult.stop_signal`)."""
        return 0

    def on_train_end(self, stopped: bool) -> None:
        """The training loop is over (`stopped`: on `should_stop()`); the test evaluation of
        best.pt may follow. A stop asked for too late to be seen can end the run here."""


@dataclass
class TrainResult:
    out_dir: Path
    model: str
    data: str
    epochs: int  # epochs completed in total (resumed runs included)
    best_epoch: int | None
    best_val_top1: float | None
    best_val_top5: float | None  # top-k with k = topk (the key keeps its name)
    best_metric: str = "top1"  # what picked best.pt: val "top1" or val "loss"...
    best_by_ema: bool = False  # ...of the EMA weights (--ema) rather than the model's
    test_top1: float | None = None
    test_top5: float | None = None
    test_loss: float | None = None
    train_size: int = 0
    val_size: int = 0
    test_size: int = 0
    test_weights: str | None = None  # which checkpoint's weights the test numbers are of
    topk: int = TOPK  # the k of the *_top5 figures: min(5, number of classes), as eval's
    suggested_lr: float | None = None  # --find-lr: the range test's suggestion
    lr_find_iterations: int = 0
    lr_find_diverged: bool = False
    test_ema_top1: float | None = None
    last_train_loss: float | None = None
    last_train_top1: float | None = None
    train_seconds: float = 0.0  # this invocation's training + evaluation time
    total_seconds: float = 0.0  # from the call to the return
    images_per_s: float | None = None
    stopped_early: bool = False
    interrupted: bool = False
    # The signal that stopped the run on some rank (0: none or unknown): under torchrun, rank 0
    # may stop because another rank was sent SIGTERM.
    stop_signal: int = 0
    # False when the run stopped (Ctrl-C, SIGTERM) before its first checkpoint with --force
    # over an earlier run: the new run was removed and the earlier one put back.
    kept: bool = True
    skipped_images: int = 0
    resumed_from: str | None = None
    is_main: bool = True
    world_size: int = 1
    history: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON report: top-k keys named for the k used (`best_val_top2`, `test_top2` and
        the history's `val_top2` with 2 classes), as in metrics.csv."""
        from torchkit.core.train.outputs import named_for_k, row_named_for_k

        data = dataclasses.asdict(self)
        data["out_dir"] = str(self.out_dir)
        data.pop("is_main")
        data.pop("kept")
        data.pop("stop_signal")
        data = {named_for_k(key, self.topk): value for key, value in data.items()}
        data["history"] = [row_named_for_k(row, self.topk) for row in self.history]
        return data


def run_training(
    config: TrainConfig,
    callbacks: TrainCallbacks | None = None,
    *,
    overrides: Collection[str] | None = None,
    inputs: Iterable[InputPath] = (),
    output_file: str | os.PathLike | None = None,
) -> TrainResult:
    """Train as `config` says. With `config.resume`, the saved run's options are used except
    those named in `overrides` (default: the options of `config` that differ from the defaults).

    `inputs` are files the caller read for the run (the --stats file): the run folder may not
    be, contain or lie inside one. `output_file` is where the caller will write the summary
    (-o FILE): it is checked with the run folder, before any work.
    """
    started = time.perf_counter()
    run = _Run(config, callbacks or TrainCallbacks(), overrides, started, inputs, output_file)
    try:
        if not config.resume and not dist_utils.launched_by_torchrun():
            # A new run in one process is checked before torch is even imported: a refused
            # run folder costs a fraction of a second.
            run.ctx = dist_utils.DistContext()
            run.open_output()
        return _run_with_torch(run, config)
    except BaseException:
        run.release_output(ok=False)
        raise


def _run_with_torch(run: _Run, config: TrainConfig) -> TrainResult:
    import torch

    flags = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    ctx = run.ctx = dist_utils.setup(config.device, config.dist_timeout)
    try:
        result = run.run()
        # Every rank leaves together: a rank tearing down Gloo while another still finishes its
        # last collective made the latter abort at exit ("terminate called without an active
        # exception", seen in about one full test run in four).
        dist_utils.barrier(ctx)
        return result
    except torch.OutOfMemoryError as error:
        raise DeviceError(
            f"the GPU ran out of memory with --batch-size {config.batch_size}",
            "use a smaller --batch-size (with --accum-steps to keep the effective batch), "
            "--amp, or a smaller --image-size",
        ) from error
    except RuntimeError as error:
        # A collective that timed out (--dist-timeout) or lost a rank: one error line.
        described = dist_utils.describe_collective_failure(ctx, error, config.dist_timeout)
        if described is None:
            raise
        raise described from error
    finally:
        dist_utils.teardown(ctx)
        if torch.are_deterministic_algorithms_enabled() != flags[0]:
            # (only when changed: the call imports torch._dynamo, seconds of start-up)
            torch.use_deterministic_algorithms(flags[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[1:]


class _Run:
    """The state of one run; `run()` drives it."""

    def __init__(self, config, callbacks, overrides, started, inputs, output_file) -> None:
        self.requested = config
        self.callbacks = callbacks
        self.overrides = overrides
        self.ctx = None  # set before anything else runs
        self.started = started
        self.checkpoint: dict | None = None
        self.resumed_from: Path | None = None
        self.extra_inputs: list[InputPath] = list(inputs)
        self.output_file: str | os.PathLike | None = output_file
        self.config: TrainConfig | None = None
        self.opened: tuple[Path, bool] | None = None
        self._taken: list[Path] = []  # default run folders locked by runs started with this one
        # The run folder (rank 0 only): checked and locked before any work, begun when the
        # first file is written, kept once the first checkpoint is saved. Until then a failure
        # or a stop removes the new run and puts an earlier one (--force) back.
        self.output: OutputFolder | None = None
        self.loaders = None
        self.plotting = None  # the thread importing matplotlib (outputs.preload_plotting)
        self.tensorboard = None

    # -- setup -------------------------------------------------------------------------------

    def _config(self) -> TrainConfig:
        if self.config is not None:
            return self.config
        config = self.requested
        if config.resume:
            self.resumed_from, self.checkpoint = load_for_resume(config.resume)
            config = merge_for_resume(self.checkpoint["config"], config, self.overrides)
        self.config = resolve_defaults(config, is_digits=config.data == DIGITS)
        return self.config

    def open_output(self) -> tuple[Path, bool]:
        """The run folder and whether it continues the resumed run in place, checked and
        locked (once)."""
        if self.opened is None:
            self.opened = self._open_output(self._config())
        return self.opened

    def _out_path(self, config: TrainConfig) -> tuple[Path, bool]:
        """The run folder, and whether it continues the resumed run in place (rank 0)."""
        if config.out:
            out = Path(config.out)
        elif self.resumed_from is not None:
            out = self.resumed_from.parent
        else:
            out = _default_out(config.model, self._taken)
        in_place = self.resumed_from is not None and os.path.realpath(out) == os.path.realpath(
            self.resumed_from.parent
        )
        return out, in_place

    def _inputs(self, config: TrainConfig, in_place: bool) -> list[InputPath]:
        """What the run reads: the data, the --weights file, the --stats file, and the
        checkpoint it resumes (unless it continues that run in place)."""
        from torchkit.core.models import model_inputs

        inputs = data_inputs(config.data) + model_inputs(config.model, config.weights)
        inputs += self.extra_inputs
        if self.resumed_from is not None and not in_place:
            inputs.append(InputPath(self.resumed_from, "checkpoint to resume"))
        return inputs

    def _open_output(self, config: TrainConfig) -> tuple[Path, bool]:
        """Check and lock the run folder (rank 0), before the data and model are loaded, and
        tell every rank the outcome: a refusal on rank 0 is the same error on every rank."""
        ctx = self.ctx
        outcome: tuple = ("ok", "", False)
        failure: BaseException | None = None
        if ctx.is_main:
            try:
                while True:
                    out, in_place = self._out_path(config)
                    inputs = self._inputs(config, in_place)
                    if in_place:
                        self._check_in_place_resume(out)
                    try:
                        self.output = OutputFolder(
                            out,
                            command="train",
                            force=config.force,
                            inputs=inputs,
                            known_files=RUN_FILES,
                            what="run folder",
                            resume=in_place,
                            exists_hint=f"pass --resume {out} to continue that run, --force "
                            "to overwrite it, or choose another --out",
                        )
                        break
                    except OutputLockedError:
                        if config.out or self.resumed_from is not None:
                            raise
                        # Another run started in the same second took the default name.
                        self._taken.append(out)
                if self.output_file is not None:
                    self._check_output_file(self.output_file, out, inputs, config.force)
                outcome = ("ok", str(out), in_place)
            except TorchkitError as error:
                failure = error
                outcome = ("error", type(error), error.message, error.hint)
            except Exception as error:
                failure = error
                outcome = ("error", TorchkitError, f"rank 0: {first_line(error)}", None)
        outcome = dist_utils.broadcast_from_main(ctx, outcome)
        if failure is not None:
            self.release_output(ok=False)
            raise failure
        if outcome[0] == "error":
            _, kind, message, hint = outcome
            raise kind(message, hint)
        return Path(outcome[1]), bool(outcome[2])

    def _check_in_place_resume(self, out: Path) -> None:
        """Continuing a run from an earlier checkpoint than its last.pt would overwrite
        last.pt and the epochs after that checkpoint: that is a new run, in a new folder."""
        last = out / LAST
        if self.resumed_from.name == LAST or not last.is_file():
            return
        if os.path.samefile(last, self.resumed_from):
            return
        raise OutputOverlapError(
            f"continuing {self.resumed_from} in {out} would overwrite {last} and the epochs "
            "after that checkpoint",
            f"continue the run from its last checkpoint with --resume {out}, or start a new "
            f"run from {self.resumed_from} with --out NEW_FOLDER",
        )

    def _check_output_file(
        self, path: str | os.PathLike, out: Path, inputs: list[InputPath], force: bool
    ) -> None:
        """-o FILE: not an input, not inside an input folder, and not one of the files the
        run writes (in the run folder, a new file such as summary.json is fine)."""
        from fnmatch import fnmatch

        target = check_output_file(path, force, inputs, what="-o")
        real_out, real = os.path.realpath(out), os.path.realpath(target)
        if real != real_out and not real.startswith(real_out.rstrip(os.sep) + os.sep):
            return
        parts = Path(os.path.relpath(real, real_out)).parts if real != real_out else ()
        if not parts:
            raise OutputOverlapError(
                f"-o {path} is the run folder", "give a file name for the summary"
            )
        if parts[0] == MARKER or any(fnmatch(parts[0], name) for name in RUN_FILES):
            raise OutputOverlapError(
                f"-o {path} would overwrite the run's own {parts[0]}",
                f"write the summary elsewhere, e.g. -o {out / 'summary.json'}",
            )

    def release_output(self, ok: bool) -> None:
        """Keep the new run or put the old one back, and unlock the folder."""
        if not ok:
            self._restore_config_json()
        if self.output is not None:
            output, self.output = self.output, None
            output.finish(ok)

    def _restore_config_json(self) -> None:
        """A run continued in place that fails before its first checkpoint (it diverged, a
        bad image) puts the run's config.json back: its checkpoints are still the old
        options', and config.json must describe them."""
        old = getattr(self, "_old_config_json", None)
        if old is None or getattr(self, "saved_any", False):
            return
        self._old_config_json = None
        from torchkit.core.files import atomic_write_bytes

        with contextlib.suppress(Exception):  # already failing: keep the first error
            atomic_write_bytes(self.out / "config.json", old)

    def _keep_output(self) -> None:
        """The first checkpoint is saved: the new run is worth keeping, the old one goes."""
        if self.output is not None:
            self.output.keep()

    def _worth_saving(self) -> bool:
        """Is a checkpoint of a run stopped in the middle of an epoch worth more than what
        the run folder held before? Yes once the run has saved a checkpoint, when it continues
        a run in place, or when the folder held nothing; not when it would replace an earlier
        run (--force) with a first, unfinished epoch."""
        output = self.output
        if output is None or output.resume or not output.has_content:
            return True
        return self.saved_any

    def _amp(self, config: TrainConfig):
        """(autocast factory, GradScaler or None, dtype name)."""
        import torch

        device = self.ctx.device
        if not config.amp:
            return contextlib.nullcontext, None, "float32"
        name = amp_dtype_for(device.type, config.amp_dtype)
        dtype = getattr(torch, name)
        # float16 needs its loss scaled (bfloat16 has float32's range): on CUDA, and on CPUs,
        # where the same path runs (and is tested) without a GPU.
        scaler = torch.amp.GradScaler(device.type) if name == "float16" else None
        return (lambda: torch.autocast(device.type, dtype=dtype)), scaler, name

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> TrainResult:
        try:
            try:
                self._setup()
                self._write_run_files()
                if self.config.find_lr:
                    self._find_lr()
                else:
                    self._announce()
                    self._train()
                    self._test()
            except BaseException:
                self._close_tensorboard()
                self.release_output(ok=False)
                raise
            self.release_output(ok=self.result.kept)
        finally:
            if self.loaders is not None:
                self.loaders.close()  # DataLoader workers stop now, whatever happened
            if self.plotting is not None:
                self.plotting.join()
        self.result.total_seconds = time.perf_counter() - self.started
        return self.result

    def _close_tensorboard(self) -> None:
        if self.tensorboard is not None:
            tensorboard, self.tensorboard = self.tensorboard, None
            with contextlib.suppress(Exception):
                tensorboard.close()

    def _setup(self) -> None:
        """Everything that can fail on bad input, before anything is written."""
        import torch

        from torchkit.core.models import resolve_model
        from torchkit.core.seeding import seed_everything

        ctx = self.ctx
        config = self._config()
        sync_bn = dist_utils.check_sync_bn(ctx, config.sync_bn)
        if config.tensorboard:
            check_tensorboard()
        self.autocast, self.scaler, self.amp_dtype = self._amp(config)
        self.out, self.in_place = self.open_output()
        self.saved_any = False  # a checkpoint of this run is on disk
        seed_everything(config.seed, config.deterministic)
        if ctx.device.type == "cuda" and not config.deterministic:
            torch.backends.cudnn.benchmark = True

        # A resumed run takes back the split it recorded (held-out val images included).
        recorded = self.checkpoint.get("data") if self.checkpoint is not None else None
        self.data = load_splits(config, recorded)
        splits = self.data.splits
        config = self._resolve_decode(config, splits["train"])
        self.classes = list(splits["train"].classes)
        self.class_weights = class_weights(
            config.class_weights, self.classes, splits["train"].class_counts()
        )
        self.arch = str(config.model)
        if self.checkpoint is not None:
            from torchkit.core.models.weights import checkpoint_arch, require_trusted_arch

            self._check_resumed_classes()
            self.arch, _ = checkpoint_arch(self.checkpoint, str(self.resumed_from))
            require_trusted_arch(self.arch, str(self.resumed_from), config.trust_checkpoint)
        self.preprocess = preprocess_for(config)
        resolved = resolve_model(
            self.arch,
            weights=config.weights if self.checkpoint is None else None,
            num_classes=len(self.classes),
            trust=config.trust_checkpoint,
            image_size=self.preprocess.image_size,
            in_channels=self.preprocess.in_channels,
            new_head=True,  # fine-tuning: the data's classes, whatever the weights had
            command="train",
        )
        if resolved.source == "pickled model":
            raise UsageError(
                f"{self.arch} is a pickled model: train needs an architecture it can rebuild "
                "for eval and --resume",
                "name the architecture as --model and pass the file as --weights",
            )
        self.arch = resolved.arch  # a checkpoint given as --model names its architecture
        model = resolved.model
        self.parameters = sum(p.numel() for p in model.parameters())
        if config.freeze_backbone:
            from torchkit.core.train.optim import freeze_backbone

            freeze_backbone(model)
        if sync_bn:
            model = dist_utils.convert_sync_bn(model)
        model.to(ctx.device)
        if config.channels_last:
            model.to(memory_format=torch.channels_last)
        self.model = model
        self.loaders = build_loaders(
            splits,
            self.preprocess,
            config,
            rank=ctx.rank,
            world=ctx.world_size,
            pin_memory=ctx.device.type == "cuda",
            drop_last=self.drop_last,
        )
        self.steps_per_epoch = len(self.loaders.train)
        if self.steps_per_epoch == 0:
            raise UsageError("no training batches", "is the training set empty?")
        self._build_training_state()

    def _resolve_decode(self, config: TrainConfig, train: Samples) -> TrainConfig:
        """The run's config with `--decode auto` chosen for this device and data (recorded as
        chosen from the data, so a replayed config.json chooses again), and `drop_last` set:
        on CUDA with cudnn.benchmark (not --deterministic) the train loader leaves out each
        epoch's last partial batch, as timm does, so cuDNN autotunes one batch shape only. A
        resumed run keeps what its checkpoint did (older ones: no drop), and CPU runs never
        drop: their batches and figures are as they were."""
        import torch

        from torchkit.core.device_decode import resolve_decode

        if self.checkpoint is not None:
            self.drop_last = bool(self.checkpoint.get("drop_last", False))
        else:
            self.drop_last = self.ctx.device.type == "cuda" and torch.backends.cudnn.benchmark
        decode, note = resolve_decode(
            config.decode,
            device_type=self.ctx.device.type,
            paths=train.paths,
            augment=config.augment,
            random_erasing=config.random_erasing,
        )
        if note is not None:
            self.data.notes.append(note)
        if decode == config.decode:
            return config
        defaults = tuple(sorted({*config.data_defaults, "decode"}))
        self.config = dataclasses.replace(config, decode=decode, data_defaults=defaults)
        return self.config

    def _resume_rank_state(self) -> None:
        """This rank's place in the resumed checkpoint's interrupted epoch (if any): its own
        epoch sums and random state, when the checkpoint was saved by as many processes as this
        run has. With another number of processes the run goes on, inexactly, and says so:
        rank 0 takes the epoch's sums so far, the epoch continues after the images already
        seen (rounded down to whole batches of the new global batch), with new random numbers."""
        checkpoint, ctx, config = self.checkpoint, self.ctx, self.config
        ranks = checkpoint.get("rank_states")
        saved_world = len(ranks) if ranks else checkpoint.get("world_size")
        # An older checkpoint (no rank_states) holds rank 0's random state only.
        self.resume_rng = checkpoint.get("rng_state")
        if ranks and len(ranks) == ctx.world_size:
            if self.progress.batches > 0:
                mine = ranks[ctx.rank]
                self.progress = EpochProgress.from_dict(mine["progress"])
                self.resume_rng = mine["rng"]
            return
        if saved_world is None and ctx.world_size == 1:
            return  # an older single-process checkpoint: its state is this process's
        saved_world = int(saved_world or 1)
        mid_epoch = self.progress.batches > 0
        if mid_epoch:
            saved = self.progress
            sums = [saved.to_dict()] if not ranks else [r["progress"] for r in ranks]
            images = saved.batches * config.batch_size * saved_world
            batches = images // (config.batch_size * ctx.world_size)

            def total(key: str) -> float:
                return sum(part[key] for part in sums) if ctx.is_main else 0.0

            self.progress = EpochProgress(
                batches=batches,
                loss_sum=total("loss_sum"),
                correct=total("correct"),
                seen=int(total("seen")),
                seconds=saved.seconds,
                last_lr=saved.last_lr,
            )
            self.resume_rng = None  # new random numbers: see _restore_rank_rng
        if saved_world != ctx.world_size:
            where = (
                f"; epoch {self.start_epoch + 1} continues after its first "
                f"{self.progress.batches * config.batch_size * ctx.world_size} images"
                if mid_epoch
                else ""
            )
            log.warning(
                "%s was saved by %d process(es), this run has %d: it continues, but not exactly "
                "as the run would have (the global batch, the steps per epoch, the schedule "
                "and the random numbers follow the new number%s)",
                self.resumed_from,
                saved_world,
                ctx.world_size,
                where,
            )

    def _restore_rank_rng(self, epoch: int) -> None:
        """The random state of this rank inside the resumed epoch: saved, or (when the
        checkpoint has none for this rank) seeded from (seed, rank, epoch, batches done)."""
        from torchkit.core.seeding import restore_rng_state, seed_everything

        if self.resume_rng is not None:
            restore_rng_state(self.resume_rng, self.ctx.device)
            return
        config = self.config
        seed = mix_seed(config.seed, self.ctx.rank, epoch, self.progress.batches)
        seed_everything(seed, config.deterministic)

    def _check_resumed_classes(self) -> None:
        saved = list(self.checkpoint["classes"])
        if saved != self.classes:
            raise CheckpointError(
                f"the checkpoint was trained on {len(saved)} classes ({_names(saved)}), the "
                f"data has {len(self.classes)} ({_names(self.classes)})",
                "resume with the data the run started with",
            )

    def _build_training_state(self) -> None:
        """Optimiser, schedule, EMA and wrappers, restored from the checkpoint when resuming."""
        import torch

        from torchkit.core.train import dynamo_free
        from torchkit.core.train.ema import ModelEMA
        from torchkit.core.train.optim import (
            LRSchedule,
            build_optimizer,
            load_optimizer_state,
            param_groups,
            set_frozen_norms_eval,
        )

        config, model, checkpoint = self.config, self.model, self.checkpoint
        updates_per_epoch = math.ceil(self.steps_per_epoch / config.accum_steps)
        self.groups = param_groups(model, config)
        if not config.compile:
            dynamo_free.mark_not_compiled()
        self.optimizer = build_optimizer(self.groups, config)
        self.schedule = LRSchedule(self.optimizer, config, updates_per_epoch)
        self.start_epoch, self.best_metric, self.best_epoch = 0, None, None
        self.history: list[dict] = []
        self.progress = EpochProgress()
        if checkpoint is not None:
            load_weights_into(model, checkpoint["model"], source=str(self.resumed_from))
            try:
                # The state, with this run's --lr, --weight-decay and --momentum.
                load_optimizer_state(self.optimizer, checkpoint["optimizer"])
            except (ValueError, KeyError) as error:
                raise CheckpointError(
                    f"the optimizer state in {self.resumed_from} does not fit: {error}",
                    "resume with the same --optimizer, --freeze-backbone and --backbone-lr "
                    "(zero or not) as the run",
                ) from error
            self.schedule.load_state_dict(checkpoint["scheduler"])
            if self.scaler is not None and checkpoint.get("scaler"):
                self.scaler.load_state_dict(checkpoint["scaler"])
            self.start_epoch = int(checkpoint["epoch"])
            self.best_metric = checkpoint.get("best_metric")
            self.best_epoch = checkpoint.get("best_epoch")
            self.history = [dict(r) for r in checkpoint.get("history", [])][: self.start_epoch]
            self.progress = EpochProgress.from_dict(checkpoint.get("epoch_progress"))
            self._resume_rank_state()
        self.ema = None
        if config.ema:
            self.ema = ModelEMA(model, config.ema_decay)
            if checkpoint is not None and "model_ema" in checkpoint:
                self.ema.load_state_dict(checkpoint["model_ema"], checkpoint.get("ema_updates", 0))
        wrapped = dist_utils.wrap_ddp(model, self.ctx) if self.ctx.is_distributed else model
        if config.compile:
            wrapped = torch.compile(wrapped)
        self.step_ctx = StepContext(
            model=wrapped,
            module=model,
            optimizer=self.optimizer,
            schedule=self.schedule,
            criterion=torch.nn.CrossEntropyLoss(
                weight=None
                if self.class_weights is None
                else torch.tensor(self.class_weights, device=self.ctx.device),
                label_smoothing=config.label_smoothing,
            ),
            device=self.ctx.device,
            scaler=self.scaler,
            ema=self.ema,
            autocast=self.autocast,
            channels_last=config.channels_last,
            accum_steps=config.accum_steps,
            clip_grad=config.clip_grad,
            l1=config.l1,
            # L1 goes where weight decay goes: weights, not biases and norms (unless --decay-all).
            l1_params=[p for g in self.groups if not g.name.endswith("no_decay") for p in g.params],
            mixup_alpha=config.mixup_alpha,
            cutmix_alpha=config.cutmix_alpha,
            distributed=self.ctx.is_distributed,
            input_shape=(self.preprocess.in_channels,) + (self.preprocess.image_size,) * 2,
            normalized_pixels=NormalizedPixels(self.preprocess.mean, self.preprocess.std),
            frozen_norms=(lambda: set_frozen_norms_eval(model)) if config.freeze_backbone else None,
            earliest_over_ranks=self._earliest_over_ranks if self.ctx.is_distributed else None,
        )

    def _earliest_over_ranks(self, batch: int) -> int:
        """The smallest of the ranks' `batch` values that are not -1 (-1 if all are): one
        all-reduce of a slot per rank."""
        ctx = self.ctx
        slots = [0.0] * ctx.world_size
        slots[ctx.rank] = float(batch + 1)
        found = [int(v) - 1 for v in dist_utils.all_reduce_sum(ctx, slots) if v > 0]
        return min(found) if found else -1

    def _write_run_files(self) -> None:
        """The run folder and config.json (rank 0), once every check has passed."""
        ctx, config, out = self.ctx, self.config, self.out
        # The barrier keeps rank 0 from writing before every rank has loaded its data.
        dist_utils.barrier(ctx)
        if ctx.is_main:
            out = self.out = self.output.begin()
            loaders = self.loaders
            if self.in_place and (out / "config.json").is_file():
                self._old_config_json = (out / "config.json").read_bytes()
            write_config_json(
                out / "config.json",
                {
                    "options": config.to_dict(),
                    "defaults_from_data": list(config.data_defaults),
                    "classes": self.classes,
                    "num_classes": len(self.classes),
                    "class_weights": self.class_weights,
                    "arch": self.arch,
                    "preprocess": self.preprocess.to_dict(),
                    "data_sizes": {
                        "train": loaders.train_size,
                        "val": loaders.val_size,
                        "test": loaders.test_size,
                    },
                    "data": {
                        key: self.data.record[key] for key in ("spec", "kind", "root", "sizes")
                    }
                    | {"split_csv": SPLIT_CSV},
                    "world_size": ctx.world_size,
                    "global_batch_size": config.batch_size * ctx.world_size,
                    "device": str(ctx.device),
                    "amp_dtype": self.amp_dtype,
                    "resumed_from": self._resumed_name(),
                    "versions": versions(),
                },
            )
            write_split_csv(out / SPLIT_CSV, self.data.splits)
        self._carry_best(out)
        dist_utils.barrier(ctx)
        self.tensorboard = (
            TensorBoardLog(out / "tensorboard", purge_step=self.start_epoch + 1)
            if config.tensorboard and ctx.is_main
            else None
        )
        self.unreadable = UnreadableImages(config.strict)
        self.result = TrainResult(
            out_dir=out,
            model=self.arch,
            data=config.data,
            epochs=self.start_epoch,
            best_epoch=self.best_epoch,
            best_val_top1=self._best_value("top1"),
            best_val_top5=self._best_value("top5"),
            best_metric=self.config.best_metric,
            best_by_ema=bool(self.config.ema),
            topk=min(TOPK, len(self.classes)),
            resumed_from=self._resumed_name(),
            train_size=self.loaders.train_size,
            val_size=self.loaders.val_size,
            test_size=self.loaders.test_size,
            is_main=ctx.is_main,
            world_size=ctx.world_size,
            history=self.history,
            config=config.to_dict(),
        )

    def _carry_best(self, out: Path) -> None:
        """A run resumed into another folder starts with the resumed run's best.pt, so the
        folder holds the best epoch the summary names. If that epoch's weights cannot be found
        (resumed from an early epoch-NNN.pt whose folder's best.pt is of a later epoch, say),
        the best epoch starts over, with a warning, rather than naming a best.pt that is not
        there. Rank 0 looks; every rank learns the outcome."""
        if self.checkpoint is None or self.in_place or self.best_epoch is None:
            return

        def carry() -> str | None:
            found = best_checkpoint_for(self.resumed_from, self.checkpoint)
            if found is not None:
                copy_checkpoint(found, out / BEST)
            return None if found is None else str(found)

        if dist_utils.on_main(self.ctx, carry) is None:
            log.warning(
                "the weights of the best epoch so far (%d) are not beside %s: best.pt will "
                "be the best of the epochs from here on",
                self.best_epoch,
                self.resumed_from,
            )
            self.best_epoch, self.best_metric = None, None

    def _resumed_name(self) -> str | None:
        return str(self.resumed_from) if self.resumed_from else None

    def _find_lr(self) -> None:
        """The learning-rate range test instead of training: lr_find.csv and lr_find.png in
        the run folder, no checkpoint, the weights as they were."""
        from torchkit.core.train.lr_find import find_lr, write_lr_find

        config, loaders = self.config, self.loaders
        if self.ctx.is_distributed:
            raise UsageError("--find-lr runs in one process", "run it without torchrun")

        def batches():
            loaders.train_sampler.set_epoch(0)
            return iter(loaders.train)

        found = find_lr(
            self.step_ctx,
            batches,
            lr_min=config.lr_min,
            lr_max=config.lr_max,
            iterations=config.find_lr_iters,
        )
        if self.ctx.is_main:
            write_lr_find(self.out, found)
            self._keep_output()
        self.result.suggested_lr = found.suggested_lr
        self.result.lr_find_iterations = len(found.lrs)
        self.result.lr_find_diverged = found.diverged

    def _announce(self) -> None:
        if not self.ctx.is_main:
            return
        self.callbacks.on_start(
            RunInfo(
                out_dir=self.out,
                device=str(self.ctx.device),
                world_size=self.ctx.world_size,
                model=self.arch,
                parameters=self.parameters,
                trainable=sum(p.numel() for g in self.groups for p in g.params),
                classes=self.classes,
                train_size=self.loaders.train_size,
                val_size=self.loaders.val_size,
                test_size=self.loaders.test_size,
                epochs=self.config.epochs,
                start_epoch=self.start_epoch,
                steps_per_epoch=self.steps_per_epoch,
                resumed_from=self._resumed_name(),
                best_val_top1=self._best_value("top1"),
                config=self.config,
                topk=min(TOPK, len(self.classes)),
                notes=list(self.data.notes),
            )
        )
        if self.start_epoch >= self.config.epochs and self.progress.batches == 0:
            log.warning(
                "the run has already trained %d of %d epochs: nothing to train "
                "(pass a larger --epochs to continue it)",
                self.start_epoch,
                self.config.epochs,
            )

    # -- epochs ------------------------------------------------------------------------------

    def _checkpoint(
        self, epochs_done: int, epoch_progress: dict | None, rank_states: list | None = None
    ) -> dict:
        """A checkpoint of the run (rank 0). `rank_states`: every rank's random state and
        epoch sums, in rank order, for a stop inside an epoch (see `_resume_rank_state`)."""
        checkpoint = build_checkpoint(
            arch=self.arch,
            classes=self.classes,
            model_state=self.model.state_dict(),
            optimizer=self.optimizer,
            schedule=self.schedule,
            scaler=self.scaler,
            ema=self.ema,
            epoch=epochs_done,
            global_step=self.schedule.updates,
            best_metric=self.best_metric,
            best_epoch=self.best_epoch,
            config=self.config.to_dict(),
            preprocess=self.preprocess.to_dict(),
            history=self.history,
            epoch_progress=epoch_progress,
        )
        checkpoint["world_size"] = self.ctx.world_size
        checkpoint["drop_last"] = self.drop_last  # a resumed run batches its epochs alike
        checkpoint["data"] = self.data.record  # what eval --split val needs to find them
        if rank_states is not None:
            checkpoint["rank_states"] = rank_states
        return checkpoint

    def _should_stop(self, force: bool = False) -> bool:
        """Whether every rank stops now (after an optimiser update, or between epochs with
        `force`): any rank's Ctrl-C or SIGTERM counts, polled about twice a second."""
        wanted = 0
        if self.callbacks.should_stop():
            wanted = int(self.callbacks.stop_signal() or 1)
        stop = self.stop_vote(wanted, force=force)
        self.result.stop_signal = self.stop_vote.signal if stop else 0
        return stop

    def _evaluate(self, module, loader, *, full_precision: bool = False) -> dict:
        """Loss, top-1 and top-5 over the whole of `loader`'s data (summed over ranks)."""
        sums = evaluate(
            module,
            loader,
            self.ctx.device,
            topk=TOPK,
            unreadable=self.unreadable,
            autocast=contextlib.nullcontext if full_precision else self.autocast,
            channels_last=self.config.channels_last and not full_precision,
        )
        loss_sum, top1, topk, count = dist_utils.all_reduce_sum(self.ctx, sums.as_list())
        if count == 0:  # every image unreadable: no metric, not a perfect loss of 0
            split = "test" if loader is self.loaders.test else "validation"
            raise InputError(
                f"none of the {len(loader.dataset)} {split} images could be read",
                "see the warnings above; fix or remove the unreadable files",
            )
        return {"loss": loss_sum / count, "top1": top1 / count, "top5": topk / count}

    def _train(self) -> None:
        from torchkit.core.seeding import capture_rng_state, seed_everything

        ctx, config, result = self.ctx, self.config, self.result
        self.stop_vote = dist_utils.StopVote(ctx)
        train_started = time.perf_counter()
        images_seen, images_seconds = 0.0, 0.0
        mid_epoch = self.progress.batches > 0
        curves_written = time.perf_counter()  # first plot after CURVES_EVERY_S, or at the end
        # Not with DataLoader workers: they are forked, and a fork while another thread holds
        # an import lock leaves the child waiting on that lock for ever.
        if ctx.is_main and self.plotting is None and self.loaders.train.num_workers == 0:
            self.plotting = preload_plotting()
        for epoch in range(self.start_epoch, config.epochs):
            # Random numbers are a function of (seed, rank, epoch), so a resumed run draws what
            # the uninterrupted one did; inside an epoch, the saved state is restored instead.
            if mid_epoch:
                self._restore_rank_rng(epoch)
                mid_epoch = False
            else:
                seed_everything(mix_seed(config.seed, ctx.rank, epoch), config.deterministic)
                self.progress = EpochProgress()
            progress = self.progress
            self.loaders.train_sampler.set_epoch(epoch, skip=progress.batches * config.batch_size)
            if ctx.is_main:
                self.callbacks.on_epoch_start(
                    epoch + 1, config.epochs, self.steps_per_epoch, progress.batches
                )
            finished = train_one_epoch(
                self.step_ctx,
                self.loaders.train,
                progress,
                self.unreadable,
                on_step=self.callbacks.on_step if ctx.is_main else None,
                should_stop=self._should_stop,
                epoch=epoch + 1,
            )
            if not finished:
                result.interrupted = True
                # Each rank's random state and epoch sums, so that a resumed run continues
                # every rank exactly (rank 0's alone would be restored on every rank).
                rank_states = dist_utils.gather_to_main(
                    ctx, {"rng": capture_rng_state(ctx.device), "progress": progress.to_dict()}
                )
                if ctx.is_main:
                    if self._worth_saving():
                        save_epoch(
                            self.out,
                            self._checkpoint(epoch, progress.to_dict(), rank_states),
                            is_best=False,
                            save_every=0,
                            keep=0,
                        )
                        self.saved_any = True
                        self._keep_output()
                    else:
                        result.kept = False
                break
            row = self._epoch_row(epoch, progress)
            images_seen += row["images_per_s"] * row["epoch_time_s"]
            images_seconds += row["epoch_time_s"]
            self.history.append(row)
            self.schedule.epoch_end(
                self._watched_value(row, config.best_metric),
                higher_is_better=config.best_metric == "top1",
            )
            is_best = self._is_best(row)
            if is_best:
                self.best_epoch = epoch + 1
                self.best_metric = self._best_value(config.best_metric)
            if ctx.is_main:
                save_epoch(
                    self.out,
                    self._checkpoint(epoch + 1, None),
                    is_best=is_best,
                    save_every=config.save_every,
                    keep=config.keep,
                )
                self.saved_any = True
                self._keep_output()
                write_metrics_csv(
                    self.out / "metrics.csv", self.history, min(TOPK, len(self.classes))
                )
                if time.perf_counter() - curves_written > CURVES_EVERY_S:
                    write_curves_png(self.out / "curves.png", self.history, self.best_epoch)
                    curves_written = time.perf_counter()
                if self.tensorboard is not None:
                    self.tensorboard.epoch(row)
                self.callbacks.on_epoch_end(row, is_best)
            result.epochs = epoch + 1
            if config.early_stop and epoch + 1 - self.best_epoch >= config.early_stop:
                result.stopped_early = True
                break
            if epoch + 1 < config.epochs and self._should_stop(force=True):
                result.interrupted = True
                break
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if ctx.is_main and self.history and result.kept:
            write_curves_png(self.out / "curves.png", self.history, self.best_epoch)
        if ctx.is_main:
            self.callbacks.on_train_end(result.interrupted)
        result.best_epoch = self.best_epoch
        result.best_val_top1 = self._best_value("top1")
        result.best_val_top5 = self._best_value("top5")
        result.skipped_images = self.unreadable.count
        if self.history:
            result.last_train_loss = self.history[-1]["train_loss"]
            result.last_train_top1 = self.history[-1]["train_top1"]
        if images_seconds > 0:
            result.images_per_s = images_seen / images_seconds
        result.train_seconds = time.perf_counter() - train_started

    def _epoch_row(self, epoch: int, progress: EpochProgress) -> dict:
        """metrics.csv's row: training sums reduced over ranks, then validation."""
        loss_sum, correct, seen = dist_utils.all_reduce_sum(
            self.ctx, [progress.loss_sum, progress.correct, float(progress.seen)]
        )
        if seen == 0:  # not a training loss of 0 that would even win --best-metric loss
            raise InputError(
                f"none of the {self.loaders.train_size} training images could be read in "
                f"epoch {epoch + 1}",
                "see the warnings above; fix or remove the unreadable files",
            )
        if self.ctx.is_main:
            self.callbacks.on_eval("val")
        # Under torchrun each rank's BatchNorm statistics moved with its own last batch: every
        # rank validates rank 0's, the ones best.pt and last.pt get (`eval best.pt` agrees).
        dist_utils.broadcast_buffers(self.ctx, self.model)
        if self.ema is not None:
            dist_utils.broadcast_buffers(self.ctx, self.ema.module)
        val = self._evaluate(self.model, self.loaders.val)
        row = {
            "epoch": epoch + 1,
            "train_loss": loss_sum / max(seen, 1.0),
            "train_top1": correct / max(seen, 1.0),
            "val_loss": val["loss"],
            "val_top1": val["top1"],
            "val_top5": val["top5"],
            "lr": progress.last_lr,
            "epoch_time_s": progress.seconds,
            "images_per_s": seen / max(progress.seconds, 1e-9),
        }
        if self.ema is not None:
            ema = self._evaluate(self.ema.module, self.loaders.val)
            row |= {
                "val_ema_loss": ema["loss"],
                "val_ema_top1": ema["top1"],
                "val_ema_top5": ema["top5"],
            }
        self._check_val_finite(row, epoch + 1)
        return row

    @staticmethod
    def _check_val_finite(row: dict, epoch: int) -> None:
        """A NaN or infinite validation loss is the divergence signal too (weights that are
        finite but so large that the logits overflow, BatchNorm statistics gone infinite): the
        run stops as for a non-finite training loss, before the epoch is saved or ranked. The
        loss is summed over ranks, so every rank stops here alike."""
        checked = (("val_loss", "validation loss"), ("val_ema_loss", "EMA validation loss"))
        for column, what in checked:
            if column in row and not math.isfinite(row[column]):
                raise DivergedError(
                    f"the {what} is not finite (NaN or infinite) at epoch {epoch}: the run "
                    "diverged",
                    DIVERGED_HINT,
                )

    @property
    def watched(self) -> str:
        """The prefix of the validation columns that pick best.pt: the EMA weights' when --ema
        is on (as timm does: the average is the model one keeps), the model's otherwise."""
        return "val_ema_" if self.config.ema else "val_"

    def _watched_value(self, row: dict, name: str) -> float | None:
        """`name` ("top1", "top5", "loss") of the watched weights in a metrics row (a run
        resumed with --ema turned on has earlier rows without the EMA columns)."""
        return row.get(self.watched + name, row.get(f"val_{name}"))

    def _best_value(self, name: str) -> float | None:
        """`name` of the watched weights at the best epoch."""
        for row in self.history:
            if row["epoch"] == self.best_epoch:
                return self._watched_value(row, name)
        return None

    def _is_best(self, row: dict) -> bool:
        """Better on --best-metric (higher top-1, or lower loss); a tie goes to the other one
        (small validation sets often tie on top-1)."""
        if self.best_epoch is None:
            return True
        best = next(r for r in self.history if r["epoch"] == self.best_epoch)

        def key(values: dict) -> tuple[float, float]:
            loss = self._watched_value(values, "loss")
            top1 = self._watched_value(values, "top1")
            return (-loss, top1) if self.config.best_metric == "loss" else (top1, -loss)

        return key(row) > key(best)

    def _test(self) -> None:
        """Test metrics of best.pt's weights, in full precision (as `torchkit eval` computes)."""
        result = self.result
        if self.loaders.test is None or result.interrupted or self.best_epoch is None:
            return
        if self.ctx.is_main:
            self.callbacks.on_eval("test")

        def load_best() -> bool:
            """best.pt into the model (and the EMA), on rank 0: whether it has EMA weights."""
            best = load_checkpoint(self.out / BEST)
            load_weights_into(self.model, best["model"], source=str(self.out / BEST))
            has_ema = self.ema is not None and "model_ema" in best
            if has_ema:
                self.ema.module.load_state_dict(best["model_ema"])
            return has_ema

        # Only rank 0 opens the run folder (the others need no shared file system): it reads
        # best.pt and sends the weights to the other ranks.
        has_ema = dist_utils.on_main(self.ctx, load_best)
        dist_utils.broadcast_module(self.ctx, self.model)
        test = self._evaluate(self.model, self.loaders.test, full_precision=True)
        result.test_top1, result.test_top5 = test["top1"], test["top5"]
        result.test_loss = test["loss"]
        result.test_weights = BEST
        if has_ema:
            dist_utils.broadcast_module(self.ctx, self.ema.module)
            ema = self._evaluate(self.ema.module, self.loaders.test, full_precision=True)
            result.test_ema_top1 = ema["top1"]


def amp_dtype_for(device_type: str, amp_dtype: str) -> str:
    """The autocast dtype of --amp: "bfloat16" or "float16" (which gets a GradScaler).

    auto: bfloat16 on CPUs, and on GPUs that compute in it natively (Ampere and later);
    float16 on older GPUs (T4, V100), where `is_bf16_supported()` is true only by emulation,
    which is slower than float32. fp16 runs on CUDA and on CPUs; other devices take bf16."""
    import torch

    if amp_dtype == "bf16":
        return "bfloat16"
    if amp_dtype == "fp16":
        if device_type not in ("cuda", "cpu"):
            raise UsageError(
                f"--amp-dtype fp16 is not supported on {device_type}",
                "use --amp-dtype bf16 (or auto), or --device cuda or cpu",
            )
        return "float16"
    if device_type == "cuda":
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return "bfloat16" if native else "float16"
    return "bfloat16"


def _default_out(model: str | None, taken: Collection[Path] = ()) -> Path:
    """runs/<model>-<timestamp>, with a suffix if a run started in the same second (its folder
    or its lock exists, or it is in `taken`)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    name = str(model).replace(":", "-").replace("/", "-").replace(".", "-")
    out = Path("runs") / f"{name}-{stamp}"
    suffix = 2
    while out.exists() or lock_path(out).exists() or out in taken:
        out = Path("runs") / f"{name}-{stamp}-{suffix}"
        suffix += 1
    return out


def _names(classes: list[str]) -> str:
    shown = ", ".join(map(str, classes[:5]))
    return shown + (", ..." if len(classes) > 5 else "")
