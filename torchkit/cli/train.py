"""`torchkit train`: image-classification training, one process or many (torchrun)."""

from __future__ import annotations

import os
import signal
import threading
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer._click.core import ParameterSource

from torchkit.cli import console
from torchkit.cli.completion import complete_model_name
from torchkit.cli.options import (
    DeterministicOption,
    DeviceOption,
    ForceOption,
    FormatOption,
    OutputOption,
    SeedOption,
    StatsOption,
    StrictOption,
    WorkersOption,
)
from torchkit.cli.render import OutputFormat, Table, emit
from torchkit.core.train.config import DIGITS_DEFAULTS, FOLDER_DEFAULTS, TrainConfig, resume_help

DEFAULTS = TrainConfig()


def _data_default(name: str) -> str:
    """'Default: X for digits, Y for image folders.' from the one table of data defaults."""

    def shown(value) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, tuple):
            return ",".join(f"{v:g}" for v in value)
        return str(value)

    digits, folders = shown(DIGITS_DEFAULTS[name]), shown(FOLDER_DEFAULTS[name])
    return f"Default: {digits} for digits, {folders} for image folders."


class Augment(str, Enum):
    none = "none"
    basic = "basic"
    trivialaugment = "trivialaugment"
    randaugment = "randaugment"
    autoaugment = "autoaugment"


class Interpolation(str, Enum):
    bilinear = "bilinear"
    bicubic = "bicubic"
    nearest = "nearest"


class Decode(str, Enum):
    auto = "auto"
    device = "device"
    fast = "fast"
    exact = "exact"


DATA_HELP = "Data and transforms"
OPTIM_HELP = "Optimisation"
OUT_HELP = "Outputs and checkpoints"
MODEL_HELP = "Model and fine-tuning"


class Optimizer(str, Enum):
    sgd = "sgd"
    adam = "adam"
    adamw = "adamw"
    rmsprop = "rmsprop"


class Scheduler(str, Enum):
    cosine = "cosine"
    step = "step"
    multistep = "multistep"
    exponential = "exponential"
    plateau = "plateau"
    none = "none"


class BestMetric(str, Enum):
    top1 = "top1"
    loss = "loss"


class AmpDtype(str, Enum):
    auto = "auto"
    bf16 = "bf16"
    fp16 = "fp16"


def _ints(text: str | None, option: str) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(p) for p in text.replace(",", " ").split())
    except ValueError:
        raise typer.BadParameter(
            f"expected epochs like 30,60, not {text!r}", param_hint=option
        ) from None


def _refuse_output_meant_as_out(output: Path | None, out: Path | None) -> None:
    """`train -o myrun` meant `--out myrun` (the run folder) far more often than a summary file
    without an extension: say so instead of writing a text file and a run elsewhere."""
    from torchkit.core.errors import UsageError
    from torchkit.core.outputs import is_special_file

    if output is None or out is not None or output.suffix or is_special_file(output):
        return
    raise UsageError(
        f"-o/--output names the file train's printed summary goes to, and {output} has no "
        "extension",
        f"the run folder is --out: did you mean --out {output}? (or -o {output}.json with "
        "--format json for the summary)",
    )


def train_command(
    ctx: typer.Context,
    data: Annotated[
        Optional[str],
        typer.Option(
            "--data",
            "-d",
            help="A split root (ROOT/train/, val/, test/ image folders), one image folder "
            "ROOT/<class>/<image>, a CSV index (path,label; a split column makes it split "
            "data, e.g. `split --mode manifest`'s split.csv), or `digits` (the default: 1,797 "
            "8x8 digits from scikit-learn, split 80/10/10). Data without a val split gets one "
            "held out (--val-split). The split used is written to OUT/split.csv.",
            show_default=False,
            rich_help_panel=DATA_HELP,
        ),
    ] = None,
    val_split: Annotated[
        Optional[float],
        typer.Option(
            "--val-split",
            help="Share held out for validation (stratified, seeded with --seed) when the data "
            "has no val split: of an image folder or CSV index, or of train/ of a root without "
            "val/ (as `convert cifar` writes). Default 0.1; ignored, with a warning, for data "
            "with its own val split.",
            rich_help_panel=DATA_HELP,
        ),
    ] = None,
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            "-m",
            help="torchvision model name, `convnet`, package.module:Callable, timm/NAME (a timm "
            "model, with the timm extra), or a torchkit checkpoint to fine-tune. "
            + _data_default("model"),
            rich_help_panel=MODEL_HELP,
            show_default=False,
            autocompletion=complete_model_name,
        ),
    ] = None,
    weights: Annotated[
        Optional[str],
        typer.Option(
            "--weights",
            help="Start from pretrained weights: DEFAULT (torchvision's or timm's; needs the "
            "internet or a warm cache), a timm pretrained tag, or a checkpoint / state-dict / "
            ".safetensors file. The head is replaced when the data's classes differ.",
            rich_help_panel=MODEL_HELP,
        ),
    ] = None,
    trust_checkpoint: Annotated[
        bool,
        typer.Option(
            "--trust-checkpoint",
            help="Allow --model/--weights files that hold arbitrary pickled objects (runs code "
            "from the file).",
            rich_help_panel=MODEL_HELP,
        ),
    ] = False,
    freeze_backbone: Annotated[
        bool,
        typer.Option(
            "--freeze-backbone",
            help="Train only the classifier head (backbone "
            "weights and normalisation statistics stay as they are).",
            rich_help_panel=MODEL_HELP,
        ),
    ] = DEFAULTS.freeze_backbone,
    backbone_lr: Annotated[
        Optional[float],
        typer.Option(
            "--backbone-lr",
            help="Learning rate of the backbone (the head uses --lr).",
            rich_help_panel=MODEL_HELP,
        ),
    ] = None,
    head_lr_mult: Annotated[
        Optional[float],
        typer.Option(
            "--head-lr-mult",
            help="The head's learning rate is --lr times this.",
            rich_help_panel=MODEL_HELP,
        ),
    ] = None,
    sync_bn: Annotated[
        bool,
        typer.Option(
            "--sync-bn",
            help="BatchNorm -> SyncBatchNorm under torchrun (CUDA only).",
            rich_help_panel=MODEL_HELP,
        ),
    ] = DEFAULTS.sync_bn,
    image_size: Annotated[
        Optional[int],
        typer.Option(
            "--image-size",
            min=1,
            show_default=False,
            rich_help_panel=DATA_HELP,
            help=f"Training crop size. {_data_default('image_size')}",
        ),
    ] = None,
    resize_size: Annotated[
        Optional[int],
        typer.Option(
            "--resize-size",
            min=1,
            show_default=False,
            rich_help_panel=DATA_HELP,
            help="Evaluation resize before the centre crop. Default: --image-size for "
            "digits, --image-size/0.875 for image folders.",
        ),
    ] = None,
    mean: Annotated[
        Optional[str],
        typer.Option(
            "--mean",
            rich_help_panel=DATA_HELP,
            help="Normalisation mean per channel, e.g. 0.485,0.456,0.406 (the ImageNet "
            "default; `torchkit dataset-stats` computes your data's).",
        ),
    ] = None,
    std: Annotated[
        Optional[str],
        typer.Option(
            "--std",
            rich_help_panel=DATA_HELP,
            help="Normalisation std per channel, e.g. 0.229,0.224,0.225.",
        ),
    ] = None,
    stats: StatsOption = None,
    flip: Annotated[
        Optional[bool],
        typer.Option(
            "--flip/--no-flip",
            show_default=False,
            rich_help_panel=DATA_HELP,
            help=f"Random horizontal flips. {_data_default('flip')}",
        ),
    ] = None,
    crop_scale: Annotated[
        Optional[str],
        typer.Option(
            "--crop-scale",
            show_default=False,
            rich_help_panel=DATA_HELP,
            help=f"RandomResizedCrop area range MIN,MAX. {_data_default('crop_scale')}",
        ),
    ] = None,
    augment: Annotated[
        Augment,
        typer.Option(
            "--augment",
            case_sensitive=False,
            rich_help_panel=DATA_HELP,
            help="Augmentation policy: none (resize and centre crop), basic (random resized "
            "crop and flip), or basic plus trivialaugment, randaugment or autoaugment.",
        ),
    ] = Augment(DEFAULTS.augment),
    randaugment_magnitude: Annotated[
        int,
        typer.Option(
            "--randaugment-magnitude",
            min=0,
            max=30,
            rich_help_panel=DATA_HELP,
            help="Magnitude of --augment randaugment's operations.",
        ),
    ] = DEFAULTS.randaugment_magnitude,
    random_erasing: Annotated[
        float,
        typer.Option(
            "--random-erasing",
            rich_help_panel=DATA_HELP,
            help="Probability of erasing a random rectangle of each training image.",
        ),
    ] = DEFAULTS.random_erasing,
    decode: Annotated[
        Decode,
        typer.Option(
            "--decode",
            case_sensitive=False,
            rich_help_panel=DATA_HELP,
            help="How training JPEGs are decoded: fast = at 1/2, 1/4 or 1/8 of their size where "
            "the random crop still has --image-size pixels across (the same crops; pixels within "
            "about 0.5/255 on average); exact = whole, as eval does; device = whole batches on "
            "the training device (nvJPEG on CUDA), cropped, resized and flipped there (the same "
            "crops; pixels within 1/255 of exact on the CPU; flip and crop only, no PIL "
            "policies or random erasing); auto = device when training on CUDA from JPEG files, "
            "fast otherwise.",
        ),
    ] = DEFAULTS.decode,
    interpolation: Annotated[
        Interpolation,
        typer.Option(
            "--interpolation",
            case_sensitive=False,
            rich_help_panel=DATA_HELP,
            help="Resampling of every resize, in training and (recorded in the checkpoint) in "
            "eval, predict and export.",
        ),
    ] = Interpolation(DEFAULTS.interpolation),
    epochs: Annotated[
        Optional[int],
        typer.Option(
            "--epochs",
            "-e",
            min=1,
            show_default=False,
            rich_help_panel=OPTIM_HELP,
            help=f"Epochs to train. {_data_default('epochs')}",
        ),
    ] = None,
    batch_size: Annotated[
        Optional[int],
        typer.Option(
            "--batch-size",
            "-b",
            min=1,
            show_default=False,
            rich_help_panel=OPTIM_HELP,
            help="Images per batch and process (torchrun: global = N x this). "
            + _data_default("batch_size"),
        ),
    ] = None,
    optimizer: Annotated[
        Optimizer, typer.Option("--optimizer", case_sensitive=False, rich_help_panel=OPTIM_HELP)
    ] = Optimizer(DEFAULTS.optimizer),
    lr: Annotated[
        float, typer.Option("--lr", help="Peak learning rate.", rich_help_panel=OPTIM_HELP)
    ] = DEFAULTS.lr,
    momentum: Annotated[
        float,
        typer.Option("--momentum", help="SGD / RMSprop momentum.", rich_help_panel=OPTIM_HELP),
    ] = DEFAULTS.momentum,
    nesterov: Annotated[
        bool,
        typer.Option("--nesterov", help="Nesterov momentum (SGD).", rich_help_panel=OPTIM_HELP),
    ] = DEFAULTS.nesterov,
    weight_decay: Annotated[
        float,
        typer.Option(
            "--weight-decay",
            "--wd",
            rich_help_panel=OPTIM_HELP,
            help="Weight decay (not on biases and normalisation weights).",
        ),
    ] = DEFAULTS.weight_decay,
    decay_all: Annotated[
        bool,
        typer.Option(
            "--decay-all",
            rich_help_panel=OPTIM_HELP,
            help="Weight decay on every parameter, biases and norms included.",
        ),
    ] = DEFAULTS.decay_all,
    scheduler: Annotated[
        Scheduler,
        typer.Option(
            "--scheduler",
            case_sensitive=False,
            rich_help_panel=OPTIM_HELP,
            help="cosine anneals per iteration; step, multistep and "
            "exponential decay per epoch; plateau decays when the --best-metric (val top-1 or "
            "val loss, of the EMA weights with --ema) stops improving.",
        ),
    ] = Scheduler(DEFAULTS.scheduler),
    warmup_epochs: Annotated[
        float,
        typer.Option(
            "--warmup-epochs",
            min=0,
            rich_help_panel=OPTIM_HELP,
            help="Linear warm-up, stepped per iteration (fractions allowed).",
        ),
    ] = DEFAULTS.warmup_epochs,
    min_lr: Annotated[
        float,
        typer.Option("--min-lr", min=0, help="Final lr of cosine.", rich_help_panel=OPTIM_HELP),
    ] = DEFAULTS.min_lr,
    step_size: Annotated[
        int,
        typer.Option(
            "--step-size", min=1, help="step: epochs between decays.", rich_help_panel=OPTIM_HELP
        ),
    ] = DEFAULTS.step_size,
    milestones: Annotated[
        Optional[str],
        typer.Option(
            "--milestones",
            help="multistep: epochs to decay at, e.g. 30,60.",
            rich_help_panel=OPTIM_HELP,
        ),
    ] = None,
    gamma: Annotated[
        Optional[float],
        typer.Option(
            "--gamma",
            show_default=False,
            rich_help_panel=OPTIM_HELP,
            help="Decay factor: 0.1 (step, multistep, plateau), 0.95 (exponential).",
        ),
    ] = None,
    patience: Annotated[
        int,
        typer.Option(
            "--patience",
            min=0,
            help="plateau: epochs without improvement before the lr decays.",
            rich_help_panel=OPTIM_HELP,
        ),
    ] = DEFAULTS.patience,
    label_smoothing: Annotated[
        float,
        typer.Option(
            "--label-smoothing",
            help="Cross-entropy label smoothing (0.1 is usual).",
            rich_help_panel=OPTIM_HELP,
        ),
    ] = DEFAULTS.label_smoothing,
    class_weights: Annotated[
        str,
        typer.Option(
            "--class-weights",
            rich_help_panel=OPTIM_HELP,
            help="Loss weights per class for imbalanced data: none, balanced (n / (k * n_c)) or "
            "FILE (JSON list or {class: weight}, or one weight / class,weight per line).",
        ),
    ] = DEFAULTS.class_weights,
    balanced_sampler: Annotated[
        bool,
        typer.Option(
            "--balanced-sampler",
            rich_help_panel=OPTIM_HELP,
            help="Draw training images with replacement so every class comes equally often "
            "(WeightedRandomSampler; seeded, split over torchrun ranks).",
        ),
    ] = DEFAULTS.balanced_sampler,
    mixup_alpha: Annotated[
        float,
        typer.Option(
            "--mixup-alpha", help="Mixup Beta(a, a); 0 = off.", rich_help_panel=OPTIM_HELP
        ),
    ] = DEFAULTS.mixup_alpha,
    cutmix_alpha: Annotated[
        float,
        typer.Option(
            "--cutmix-alpha",
            help="CutMix Beta(a, a); 0 = off. With mixup: one or the other per batch.",
            rich_help_panel=OPTIM_HELP,
        ),
    ] = DEFAULTS.cutmix_alpha,
    l1: Annotated[
        float,
        typer.Option(
            "--l1", help="L1 penalty weight on the decayed weights.", rich_help_panel=OPTIM_HELP
        ),
    ] = DEFAULTS.l1,
    clip_grad: Annotated[
        Optional[float],
        typer.Option(
            "--clip-grad", help="Clip the gradient norm to this.", rich_help_panel=OPTIM_HELP
        ),
    ] = None,
    accum_steps: Annotated[
        int,
        typer.Option(
            "--accum-steps",
            min=1,
            rich_help_panel=OPTIM_HELP,
            help="Accumulate gradients over this many batches per update.",
        ),
    ] = DEFAULTS.accum_steps,
    ema: Annotated[
        Optional[bool],
        typer.Option(
            "--ema/--no-ema",
            show_default=False,
            help="Keep an exponential moving average of the weights, evaluated alongside; its "
            "val metric then picks best.pt. " + _data_default("ema"),
            rich_help_panel=OPTIM_HELP,
        ),
    ] = None,
    ema_decay: Annotated[
        float,
        typer.Option(
            "--ema-decay",
            help="EMA decay per update (warmed up over the first updates).",
            rich_help_panel=OPTIM_HELP,
        ),
    ] = DEFAULTS.ema_decay,
    amp: Annotated[
        bool,
        typer.Option(
            "--amp",
            rich_help_panel=OPTIM_HELP,
            help="Mixed precision: bf16, or fp16 with a GradScaler (CUDA and CPU).",
        ),
    ] = DEFAULTS.amp,
    amp_dtype: Annotated[
        AmpDtype,
        typer.Option(
            "--amp-dtype",
            case_sensitive=False,
            rich_help_panel=OPTIM_HELP,
            help="auto: bf16 on CPUs and on GPUs that compute in it natively (Ampere and "
            "later), fp16 on older GPUs.",
        ),
    ] = AmpDtype(DEFAULTS.amp_dtype),
    channels_last: Annotated[
        Optional[bool],
        typer.Option(
            "--channels-last/--no-channels-last",
            show_default=False,
            rich_help_panel=OPTIM_HELP,
            help=f"channels-last memory format. {_data_default('channels_last')}",
        ),
    ] = None,
    compile: Annotated[
        bool, typer.Option("--compile", help="torch.compile the model.", rich_help_panel=OPTIM_HELP)
    ] = DEFAULTS.compile,
    seed: SeedOption = DEFAULTS.seed,
    deterministic: DeterministicOption = DEFAULTS.deterministic,
    device: DeviceOption = DEFAULTS.device,
    dist_timeout: Annotated[
        float,
        typer.Option(
            "--dist-timeout",
            metavar="SECONDS",
            help="torchrun: seconds a process waits for the others in a collective before the "
            "run ends with an error (a rank that died or hangs), instead of waiting forever.",
        ),
    ] = DEFAULTS.dist_timeout,
    workers: WorkersOption = None,
    strict: StrictOption = DEFAULTS.strict,
    out: Annotated[
        Optional[Path],
        typer.Option(
            "--out",
            file_okay=False,
            show_default=False,
            rich_help_panel=OUT_HELP,
            help="Run folder (default runs/<model>-<timestamp>; with --resume, the "
            "resumed run's folder).",
        ),
    ] = None,
    resume: Annotated[
        Optional[str],
        typer.Option(
            "--resume",
            rich_help_panel=OUT_HELP,
            help=resume_help(),
        ),
    ] = None,
    save_every: Annotated[
        int,
        typer.Option(
            "--save-every",
            min=0,
            rich_help_panel=OUT_HELP,
            help="Also keep epoch-NNN.pt every N epochs (0 = never).",
        ),
    ] = DEFAULTS.save_every,
    keep: Annotated[
        int,
        typer.Option(
            "--keep",
            min=0,
            rich_help_panel=OUT_HELP,
            help="Keep only the newest N epoch-NNN.pt (0 = all).",
        ),
    ] = DEFAULTS.keep,
    early_stop: Annotated[
        int,
        typer.Option(
            "--early-stop",
            min=0,
            rich_help_panel=OUT_HELP,
            help="Stop after N epochs without a better val metric, see --best-metric (0 = off).",
        ),
    ] = DEFAULTS.early_stop,
    best_metric: Annotated[
        Optional[BestMetric],
        typer.Option(
            "--best-metric",
            case_sensitive=False,
            show_default=False,
            rich_help_panel=OUT_HELP,
            help="Validation metric that picks best.pt (and that --early-stop and the plateau "
            "schedule watch). Default: top1; loss for digits, whose 180 validation images "
            "saturate top-1 within a few epochs.",
        ),
    ] = None,
    tensorboard: Annotated[
        bool,
        typer.Option(
            "--tensorboard",
            rich_help_panel=OUT_HELP,
            help="Also log to OUT/tensorboard (needs the tensorboard package).",
        ),
    ] = DEFAULTS.tensorboard,
    find_lr: Annotated[
        bool,
        typer.Option(
            "--find-lr",
            rich_help_panel=OPTIM_HELP,
            help="Instead of training, run the learning-rate range test: an exponential sweep "
            "from --lr-min to --lr-max over --find-lr-iters steps; writes lr_find.csv and "
            "lr_find.png to the run folder, prints the suggested --lr, keeps no checkpoint.",
        ),
    ] = DEFAULTS.find_lr,
    lr_min: Annotated[
        float, typer.Option("--lr-min", rich_help_panel=OPTIM_HELP, help="--find-lr's first lr.")
    ] = DEFAULTS.lr_min,
    lr_max: Annotated[
        float, typer.Option("--lr-max", rich_help_panel=OPTIM_HELP, help="--find-lr's last lr.")
    ] = DEFAULTS.lr_max,
    find_lr_iters: Annotated[
        int,
        typer.Option(
            "--find-lr-iters", rich_help_panel=OPTIM_HELP, help="--find-lr's number of steps."
        ),
    ] = DEFAULTS.find_lr_iters,
    config_file: Annotated[
        Optional[Path],
        typer.Option(
            "--config",
            rich_help_panel=OUT_HELP,
            help="Take the options of a previous run's config.json (or a JSON/YAML file of "
            "option names and values) as defaults; options given here override them. A "
            "config.json's out, resume and force are not carried over; a hand-written file's "
            "`out:` is used as --out, and `resume:` or `force:` in it is an error.",
            dir_okay=False,
        ),
    ] = None,
    print_config: Annotated[
        bool,
        typer.Option(
            "--print-config",
            rich_help_panel=OUT_HELP,
            help="Print the effective options as JSON (to -o FILE if given) and exit.",
        ),
    ] = False,
    fmt: FormatOption = OutputFormat.table,
    output: OutputOption = None,
    force: ForceOption = False,
) -> None:
    """Train an image classifier: checkpoints (last.pt, best.pt), metrics.csv, curves.png,
    config.json and split.csv (path,label,split of every image used) in the run folder, a
    summary at the end (test accuracy of best.pt).

    Examples:

      torchkit train  (convnet on the built-in digits)

      torchkit train --data flowers/ --model resnet18 --weights DEFAULT --epochs 10

      torchkit train --data images/ --val-split 0.2 --amp --ema --mixup-alpha 0.2

      torchkit train --data out/split.csv  (the manifest of `torchkit split --mode manifest`)

      torchkit train --resume runs/convnet-20250101-120000

      torchkit train --config runs/convnet-20250101-120000/config.json --seed 1

      torchrun --nproc_per_node=2 -m torchkit train --data flowers/ --batch-size 32
    """
    from torchkit.core.outputs import InputPath
    from torchkit.core.preprocessing import mean_std_options, parse_floats
    from torchkit.core.train import run_training

    if output is not None and str(output) == "-":
        output = None  # `-o -`: stdout
    _refuse_output_meant_as_out(output, out)
    mean_values, std_values = mean_std_options(mean, std, stats)
    is_main = int(os.environ.get("RANK", "0")) == 0
    config = TrainConfig(
        data=data if data is not None else DEFAULTS.data,
        val_split=val_split,
        image_size=image_size,
        resize_size=resize_size,
        mean=mean_values,
        std=std_values,
        flip=flip,
        crop_scale=parse_floats(crop_scale, "--crop-scale", 2),
        augment=augment.value,
        randaugment_magnitude=randaugment_magnitude,
        random_erasing=random_erasing,
        interpolation=interpolation.value,
        decode=Decode(decode).value,
        workers=workers,
        strict=strict,
        model=model,
        weights=weights,
        trust_checkpoint=trust_checkpoint,
        freeze_backbone=freeze_backbone,
        backbone_lr=backbone_lr,
        head_lr_mult=head_lr_mult,
        sync_bn=sync_bn,
        epochs=epochs,
        batch_size=batch_size,
        optimizer=optimizer.value,
        lr=lr,
        momentum=momentum,
        nesterov=nesterov,
        weight_decay=weight_decay,
        decay_all=decay_all,
        scheduler=scheduler.value,
        warmup_epochs=warmup_epochs,
        min_lr=min_lr,
        step_size=step_size,
        milestones=_ints(milestones, "--milestones"),
        gamma=gamma,
        patience=patience,
        label_smoothing=label_smoothing,
        class_weights=class_weights,
        balanced_sampler=balanced_sampler,
        find_lr=find_lr,
        lr_min=lr_min,
        lr_max=lr_max,
        find_lr_iters=find_lr_iters,
        mixup_alpha=mixup_alpha,
        cutmix_alpha=cutmix_alpha,
        l1=l1,
        clip_grad=clip_grad,
        accum_steps=accum_steps,
        ema=ema,
        ema_decay=ema_decay,
        amp=amp,
        amp_dtype=amp_dtype.value,
        channels_last=channels_last,
        compile=compile,
        seed=seed,
        deterministic=deterministic,
        device=device,
        dist_timeout=dist_timeout,
        out=None if out is None else str(out),
        force=force,
        resume=resume,
        save_every=save_every,
        keep=keep,
        early_stop=early_stop,
        best_metric=None if best_metric is None else best_metric.value,
        tensorboard=tensorboard,
    )
    if config_file is not None:
        config = _with_config_file(config, config_file, ctx)
    if print_config:
        from torchkit.core.train.config_file import effective_config

        emit(tables=[], data=effective_config(config), fmt=OutputFormat.json, output=output,
             force=force)  # fmt: skip
        return
    if config.find_lr and is_main:
        from torchkit.core.train.lr_find import ignored_options

        ignored = ignored_options(config)
        if ignored:
            console.note(
                f"--find-lr runs the learning-rate range test only (--find-lr-iters steps, no "
                f"training): {', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored"
            )
    if data is None and resume is None and is_main and config.data == DEFAULTS.data:
        console.note(
            "no --data given: training on digits, the 1,797 8x8 handwritten digits "
            "bundled with scikit-learn"
        )
    if not is_main:  # torchrun: rank 0 reports, the others stay quiet
        import logging

        logging.getLogger("torchkit").setLevel(logging.ERROR)
    display = _Display(enabled=is_main)
    # -o is checked (with the run folder, against every input) by run_training before any work.
    with _StopOnSignal(graceful_from_start=not is_main) as stop, display:
        display.stop = stop
        result = run_training(
            config,
            display,
            overrides=_given_options(ctx),
            inputs=[
                InputPath.of(path, what)
                for path, what in ((stats, "--stats file"), (config_file, "--config file"))
                if path is not None
            ],
            output_file=output if is_main else None,
        )
    # Under torchrun a rank may stop because another one was signalled: the run's signal.
    terminated = stop.terminated or (stop.signum is None and result.stop_signal == signal.SIGTERM)
    code = 143 if terminated else 130
    if not result.is_main:
        # Rank 0's exit code (130 or 143, whichever rank was signalled) is the run's, and
        # torchrun reports it. The other ranks end with 0 once rank 0 has their state: a
        # non-zero exit would make torchrun signal rank 0 while it writes last.pt.
        return
    word = "Terminated" if terminated else "Interrupted"
    if result.interrupted and not result.kept:
        console.stderr.print(
            f"{word} before the first checkpoint: nothing kept, {result.out_dir} is as it was",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(code)
    if config.find_lr:
        emit(tables=[lr_find_table(result)], data=result.to_dict(), fmt=fmt, output=output,
             force=force)  # fmt: skip
        return
    emit(tables=[summary_table(result)], data=result.to_dict(), fmt=fmt, output=output, force=force)
    if result.interrupted:
        console.stderr.print(
            f"{word}: saved {result.out_dir / 'last.pt'}; continue with "
            f"`torchkit train --resume {result.out_dir}`",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(code)


# CLI parameters that are not training options.
_NOT_OPTIONS = {"fmt", "output", "config_file", "print_config", "stats"}


def _with_config_file(config: TrainConfig, path: Path, ctx: typer.Context) -> TrainConfig:
    from torchkit.core.errors import UsageError
    from torchkit.core.train.config_file import apply_config_file, read_config_file

    if config.resume is not None:
        raise UsageError(
            "--config starts a new run from a recipe; --resume continues a run with its own",
            "drop one of them",
        )
    return apply_config_file(config, read_config_file(path), _given_options(ctx))


def _given_options(ctx: typer.Context) -> list[str]:
    """Names of the options given on the command line (they override a resumed run's)."""
    given = []
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if source not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            continue
        if name == "stats":  # --stats gives --mean and --std
            given += ["mean", "std"]
        elif name not in _NOT_OPTIONS:
            given.append(name)
    return given


class _StopOnSignal:
    """Ctrl-C (SIGINT) and SIGTERM during training: the first asks the run to stop after the
    current update (it saves last.pt and exits with 130, or 143 for SIGTERM); a second one
    ends it at once. Before training starts and after it ends (loading, the test evaluation)
    there is nothing to save, so a signal ends the command at once, as in every command.

    Under torchrun every rank's request is polled and all ranks stop at the same update (rank
    0 saving last.pt), whichever rank was signalled: a node without rank 0 included. Ranks other
    than 0 only note a signal, even before training (`graceful_from_start`): they end with the
    run, never alone in the middle of a collective."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, graceful_from_start: bool = False) -> None:
        self.requested = False
        self.signum: int | None = None
        self.graceful = graceful_from_start
        self._previous: dict = {}

    @property
    def terminated(self) -> bool:
        return self.signum == signal.SIGTERM

    def __enter__(self) -> _StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested or not self.graceful:
            self.signum = signum
            self._quit()
        self.requested = True
        self.signum = signum

    def _quit(self):
        """End the command now: the clean-up (run folder, workers) runs, undisturbed by
        further signals."""
        from torchkit.core.errors import Terminated

        for signum in self._previous:
            signal.signal(signum, signal.SIG_IGN)
        raise Terminated() if self.terminated else KeyboardInterrupt()

    def start_training(self) -> None:
        self.graceful = True

    def end_training(self, stopped: bool) -> None:
        """A stop asked for after the last check (in the last epoch's evaluation) ends the
        command now, before the test evaluation."""
        self.graceful = False
        if self.requested and not stopped:
            self._quit()

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, previous)


class _Display:
    """Progress bar per epoch and one log line per epoch on stderr (rank 0 only)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.stop: _StopOnSignal | None = None
        self._progress = None
        self._task = None
        self._epochs = 0
        self._topk = 5  # min(5, classes), told by on_start
        self._told_stop = False

    def __enter__(self) -> _Display:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                console=console.stderr,
                disable=not console.stderr.is_terminal,
                transient=True,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    # TrainCallbacks ---------------------------------------------------------------------------

    def on_start(self, info) -> None:
        if self.stop is not None:
            self.stop.start_training()
        if not self.enabled:
            return
        self._epochs = info.epochs
        self._topk = info.topk
        sizes = f"{info.train_size} train / {info.val_size} val"
        if info.test_size:
            sizes += f" / {info.test_size} test"
        what = "continuing" if info.resumed_from else "training"
        where = f"{info.device}" + (f" x {info.world_size}" if info.world_size > 1 else "")
        console.note(
            f"{what} {info.model} ({info.trainable:,} trainable parameters) on "
            f"{info.config.data}: {sizes} images, {len(info.classes)} classes, {where}; "
            f"writing {info.out_dir}"
        )
        if info.resumed_from:
            console.note(f"resumed from {info.resumed_from} after epoch {info.start_epoch}")
        for note in info.notes:
            console.note(note)

    def on_epoch_start(self, epoch: int, epochs: int, steps: int, done: int) -> None:
        if self._progress is None:
            return
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(
            f"epoch {epoch}/{epochs}", total=steps, completed=done, stats=""
        )

    def on_step(self, info) -> None:
        if self.stop is not None and self.stop.requested and not self._told_stop:
            self._told_stop = True
            again = "SIGTERM" if self.stop.terminated else "Ctrl-C"
            console.stderr.print(
                f"Stopping after this step ({again} again to quit at once)",
                highlight=False,
                markup=False,
            )
        if self._progress is None or self._task is None:
            return
        stats = (
            f"loss {info.loss:.4f}  top1 {info.top1:.4f}  lr {info.lr:.2e}  "
            f"{info.images_per_s:,.0f} img/s"
        )
        self._progress.update(self._task, completed=info.step, stats=stats)

    def on_eval(self, split: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, stats=f"evaluating {split}")

    def on_epoch_end(self, row: dict, is_best: bool) -> None:
        if not self.enabled:
            return
        if self._progress is not None and self._task is not None:
            self._progress.remove_task(self._task)
            self._task = None
        width = len(str(self._epochs))
        line = (
            f"epoch {row['epoch']:>{width}}/{self._epochs}  "
            f"train loss {row['train_loss']:.4f} top1 {row['train_top1']:.4f}  "
            f"val loss {row['val_loss']:.4f} top1 {row['val_top1']:.4f} "
            f"top{self._topk} {row['val_top5']:.4f}"
        )
        if "val_ema_top1" in row:  # the EMA weights' metrics pick best.pt: show both
            line += f"  ema loss {row['val_ema_loss']:.4f} top1 {row['val_ema_top1']:.4f}"
        line += (
            f"  lr {row['lr']:.2e}  {row['epoch_time_s']:.1f}s  "
            f"{row['images_per_s']:,.0f} img/s" + ("  *best" if is_best else "")
        )
        console.stderr.print(line, highlight=False, markup=False, soft_wrap=True)

    def should_stop(self) -> bool:
        return self.stop is not None and self.stop.requested

    def stop_signal(self) -> int:
        return int(self.stop.signum or 0) if self.should_stop() else 0

    def on_train_end(self, stopped: bool) -> None:
        if self.stop is not None:
            self.stop.end_training(stopped)


def lr_find_table(result) -> Table:
    """The range test's outcome."""
    suggested = (
        "none (the loss never fell)"
        if result.suggested_lr is None
        else (f"{result.suggested_lr:.3g}")
    )
    rows = [
        ("Suggested --lr", suggested),
        ("Steps", result.lr_find_iterations),
        ("Stopped on a diverging loss", result.lr_find_diverged),
        ("Files", f"{result.out_dir / 'lr_find.csv'}, {result.out_dir / 'lr_find.png'}"),
    ]
    return Table(["Learning-rate range test", "Value"], rows, title="Range test")


def summary_table(result) -> Table:
    """The end-of-run table (JSON gets `result.to_dict()`, with every epoch's metrics)."""
    sizes = f"{result.train_size} train / {result.val_size} val"
    if result.test_size:
        sizes += f" / {result.test_size} test"
    best_by = result.best_metric + (", EMA weights" if result.best_by_ema else "")
    of_weights = " (EMA weights)" if result.best_by_ema else ""
    rows: list[tuple[str, object]] = [
        ("Model", result.model),
        ("Data", f"{result.data} ({sizes})"),
        ("Epochs", result.epochs),
        ("Best epoch", f"{result.best_epoch} (by val {best_by})"),
        (f"Best val top-1{of_weights}", result.best_val_top1),
        (f"Best val top-{result.topk}{of_weights}", result.best_val_top5),
    ]
    if result.test_weights:
        weights = result.test_weights
        rows += [
            (f"Test top-1 ({weights})", result.test_top1),
            (f"Test top-{result.topk} ({weights})", result.test_top5),
            (f"Test loss ({weights})", result.test_loss),
        ]
        if result.test_ema_top1 is not None:
            rows.append((f"Test top-1, EMA weights ({weights})", result.test_ema_top1))
    rows += [
        ("Last train loss", result.last_train_loss),
        ("Train images/s", "" if result.images_per_s is None else f"{result.images_per_s:,.0f}"),
        ("Time", f"{result.total_seconds:.1f} s"),
    ]
    if result.skipped_images:
        rows.append(("Skipped (unreadable)", result.skipped_images))
    if result.stopped_early:
        rows.append(("Stopped early", True))
    if result.interrupted:
        rows.append(("Interrupted", True))
    rows.append(("Run folder", str(result.out_dir)))
    return Table(["Metric", "Value"], rows, title="Training", align_right={"Value"})


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
