"""Every option of `torchkit train`, as one dataclass that round-trips to the config.json dict.

Options left as None are filled by `resolve_defaults` from the data: the built-in 8x8 digits get
their own image size, crop range and no flips (a mirrored 2 is not a 2); image folders get the
ImageNet recipe. config.json records the resolved values and which ones came from the data.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from torchkit.core.data.decode import DECODE_CHOICES
from torchkit.core.data.preprocessing import INTERPOLATIONS, parse_floats
from torchkit.core.data.transforms import AUGMENT_POLICIES
from torchkit.core.input_size import parse_image_side
from torchkit.core.io.errors import CheckpointError, UsageError
from torchkit.core.train.option_specs import (
    DATA_PANEL,
    MODEL_PANEL,
    OPTIM_PANEL,
    OUTPUTS_PANEL,
    OptionSpec,
    default_flag,
    option,
    option_specs,
)

log = logging.getLogger("torchkit")

OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop")
SCHEDULERS = ("cosine", "step", "multistep", "exponential", "plateau", "none")
AMP_DTYPES = ("auto", "bf16", "fp16")
BEST_METRICS = ("top1", "loss")

# The default decay factor of each scheduler that decays by a factor.
DEFAULT_GAMMA = {"step": 0.1, "multistep": 0.1, "exponential": 0.95, "plateau": 0.1}

# Defaults that depend on the data (see `resolve_defaults`).
DIGITS_DEFAULTS: dict[str, Any] = {
    "model": "convnet",
    # The 8x8 digits upsampled 1.5x: the convnet's two 3x3 convolutions need room. The size,
    # batch size and epochs were chosen over seeds 0-7 (README, Performance): 12 px with
    # batches of 32 for 25 epochs is at least as accurate as 16 px, 64, 20 epochs, and faster.
    "image_size": 12,
    "batch_size": 32,
    "epochs": 25,
    "channels_last": True,  # about 15% faster convolutions on CPUs for this convnet
    "flip": False,  # mirrored digits are other symbols
    "crop_scale": (0.85, 1.0),  # RandomResizedCrop's 8% would cut most of the stroke away
    # 180 validation images: top-1 moves in steps of 0.56% and saturates within a few epochs,
    # so it would keep an early, lucky checkpoint; the continuous val loss keeps improving.
    "best_metric": "loss",
    # ...and the val loss of one model's weights still jumps from epoch to epoch at 180 images:
    # the weight average is steadier, so it picks best.pt (measured over 8 seeds: test errors
    # of best.pt 1-2 of 179 with it, up to 3 without).
    "ema": True,
}
FOLDER_DEFAULTS: dict[str, Any] = {
    "model": "resnet18",
    "image_size": 224,
    "batch_size": 64,
    "epochs": 20,
    "channels_last": False,
    "flip": True,
    "crop_scale": (0.08, 1.0),
    "best_metric": "top1",
    "ema": False,
}


def data_default_help(name: str) -> str:
    """'Default: X for digits, Y for image folders.' of an option whose default depends on the
    data, for its help text."""

    def shown(value: Any) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, tuple):
            return ",".join(f"{v:g}" for v in value)
        return str(value)

    digits, folders = shown(DIGITS_DEFAULTS[name]), shown(FOLDER_DEFAULTS[name])
    return f"Default: {digits} for digits, {folders} for image folders."


# The seeds torch.manual_seed takes (an int64 or a uint64).
SEEDS = (-(2**63), 2**64 - 1)


def parse_milestones(text: str | None, flag: str) -> tuple[int, ...]:
    """`--milestones 30,60` (commas or spaces) -> (30, 60); not given -> (). An
    OptionSpec.parse: a ValueError is a bad value of `flag`."""
    if not text:
        return ()
    try:
        return tuple(int(p) for p in text.replace(",", " ").split())
    except ValueError:
        raise ValueError(f"expected epochs like 30,60, not {text!r}") from None


# What `--resume` does with options given again. Those below define the checkpoint's weights,
# its optimiser state, the data split or what an epoch and an update are: a different value is
# refused, naming both values. Every other option applies from the resumed step on (the
# learning rates and weight decay too: see `optim.load_optimizer_state`), and config.json
# records the values the run trains with.
FIXED_ON_RESUME: dict[str, str] = {
    "model": "the weights are of that model",
    "image_size": "the weights were trained at that size",
    "resize_size": "the validation metrics so far were measured at that size",
    "mean": "the weights expect inputs normalised that way",
    "interpolation": "the weights were trained on images resized that way",
    "std": "the weights expect inputs normalised that way",
    "sync_bn": "the weights and the optimiser state are of that model",
    "optimizer": "the optimiser state is of that optimiser",
    "freeze_backbone": "the optimiser state is of those parameters",
    "decay_all": "the optimiser's parameter groups would change",
    "batch_size": "the schedule and the place inside the epoch count batches of that size",
    "accum_steps": "the schedule counts updates of that many batches",
    "seed": "the data order, the augmentation and --val-split's split follow the seed",
    "balanced_sampler": "the place inside the epoch counts images of that order",
    "val_split": "another split would move validation images into training",
    "best_metric": "best.pt and the best epoch so far were picked by it",
}
# Options whose default the run chose for its machine (core.train.setup): a resumed run not
# given one chooses again, for the machine it continues on (a digits run recorded on a GPU
# with --cuda-graphs may resume on a CPU).
CHOSEN_FOR_THE_MACHINE = ("cuda_graphs",)
# Options that only make sense for a run that starts from scratch: refused with --resume.
NEW_RUN_ONLY = {"weights": "the run continues from the checkpoint's weights"}
# Not training options: how this invocation runs, never compared.
IGNORED_ON_RESUME = (
    "resume",
    "force",
    "out",
    "data_defaults",
    "dist_timeout",
    "trust_checkpoint",
    "profile_steps",
)


def resume_help() -> str:
    """What `--resume` says about options given again (its help text). Written before the
    options table exists, so the names are the fields' plain spellings (a test holds them to
    the table)."""
    fixed = ", ".join(default_flag(name) for name in FIXED_ON_RESUME)
    return (
        "Continue a run exactly: its folder (last.pt) or a checkpoint file. Options given again "
        "apply from the resumed step on (--epochs extends the run and its schedule; --lr, "
        "--weight-decay, the schedule, regularisation, --device, --workers... take effect), "
        f"except {fixed}, which cannot change."
    )


@dataclass
class TrainConfig:
    """The options of one training run. None means "chosen from the data" (see module doc).

    Each field is also the command-line option of the same name: its metadata (`option`) is
    the option's help, panel and spelling, and `torchkit train` is generated from it. The field
    order is the order of `--help`, panel by panel.
    """

    # Data
    data: str = option(
        "digits",
        panel=DATA_PANEL,
        flags=("--data", "-d"),
        show_default=False,
        help="A split root (ROOT/train/, val/, test/ image folders), one image folder "
        "ROOT/<class>/<image>, a CSV index (path,label; a split column makes it split data, "
        "e.g. `split --mode manifest`'s split.csv), or `digits` (the default: 1,797 8x8 digits "
        "from scikit-learn, split 80/10/10). Data without a val split gets one held out "
        "(--val-split). The split used is written to OUT/split.csv.",
    )
    val_split: float | None = option(
        None,
        panel=DATA_PANEL,
        help="Share held out for validation (stratified, seeded with --seed) when the data has "
        "no val split: of an image folder or CSV index, or of train/ of a root without val/ (as "
        "`convert cifar` writes). Default 0.1; ignored, with a warning, for data with its own "
        "val split.",
    )
    image_size: int | None = option(
        None,
        panel=DATA_PANEL,
        flags=("--image-size", "--input-size"),
        metavar="N",
        parse=parse_image_side,
        show_default=False,
        help=f"Training crop size. {data_default_help('image_size')} Also spelled --input-size; "
        "C,N,N is read as N.",
    )
    resize_size: int | None = option(
        None,
        panel=DATA_PANEL,
        minimum=1,
        show_default=False,
        help="Evaluation resize before the centre crop. Default: --image-size for digits, "
        "--image-size/0.875 for image folders.",
    )
    mean: tuple[float, ...] | None = option(
        None,
        panel=DATA_PANEL,
        parse=parse_floats,
        help="Normalisation mean per channel, e.g. 0.485,0.456,0.406 (the ImageNet default; "
        "`torchkit dataset-stats` computes your data's).",
    )
    std: tuple[float, ...] | None = option(
        None,
        panel=DATA_PANEL,
        parse=parse_floats,
        help="Normalisation std per channel, e.g. 0.229,0.224,0.225.",
    )
    flip: bool | None = option(
        None,
        panel=DATA_PANEL,
        flags=("--flip/--no-flip",),
        show_default=False,
        help=f"Random horizontal flips. {data_default_help('flip')}",
    )
    crop_scale: tuple[float, float] | None = option(
        None,
        panel=DATA_PANEL,
        parse=functools.partial(parse_floats, count=2),
        show_default=False,
        help=f"RandomResizedCrop area range MIN,MAX. {data_default_help('crop_scale')}",
    )
    augment: str = option(
        "basic",
        panel=DATA_PANEL,
        choices=AUGMENT_POLICIES,
        help="Augmentation policy: none (resize and centre crop), basic (random resized crop and "
        "flip), or basic plus trivialaugment, randaugment or autoaugment.",
    )
    randaugment_magnitude: int = option(
        9,
        panel=DATA_PANEL,
        minimum=0,
        maximum=30,
        help="Magnitude of --augment randaugment's operations.",
    )
    random_erasing: float = option(
        0.0,
        panel=DATA_PANEL,
        help="Probability of erasing a random rectangle of each training image.",
    )
    # fast | exact | device | auto: training JPEGs decoded at 1/2..1/8 where the random crop
    # keeps image-size pixels across (core.decode); exact decodes them whole; device decodes
    # them on the training device (core.device_decode); auto (chosen when the run starts, and
    # recorded resolved): device when training on CUDA from JPEG files, fast otherwise.
    decode: str = option(
        "auto",
        panel=DATA_PANEL,
        choices=DECODE_CHOICES,
        help="How training JPEGs are decoded: fast = at 1/2, 1/4 or 1/8 of their size where the "
        "random crop still has --image-size pixels across (the same crops; pixels within about "
        "0.5/255 on average); exact = whole, as eval does; device = whole batches on the "
        "training device (nvJPEG on CUDA), cropped, resized and flipped there (the same crops; "
        "pixels within 1/255 of exact on the CPU; flip and crop only, no PIL policies or random "
        "erasing); auto = device when training on CUDA from JPEG files, fast otherwise.",
    )
    # With device decoding, a share of the JPEGs (by a hash of their paths: the same files every
    # epoch) is decoded by the loader workers as `fast` decodes them: a GPU's JPEG decoder and
    # the CPU's cores then work side by side (DALI's hardware/CPU split).
    decode_cpu_share: float = option(
        0.0,
        panel=DATA_PANEL,
        help="With --decode device: the fraction of training JPEGs (the same files every epoch, "
        "by a hash of their paths) that the loader workers decode as --decode fast does, beside "
        "the device's decoder; the same crops. 0 = all on the device.",
    )
    interpolation: str = option(  # of every resize, train and eval; in the checkpoint
        "bilinear",
        panel=DATA_PANEL,
        choices=INTERPOLATIONS,
        help="Resampling of every resize, in training and (recorded in the checkpoint) in eval, "
        "predict and export.",
    )
    # Model and fine-tuning
    model: str | None = option(
        None,
        panel=MODEL_PANEL,
        flags=("--model", "-m"),
        show_default=False,
        completion="model",
        help="torchvision model name, `convnet`, package.module:Callable, timm/NAME (a timm "
        "model, with the timm extra), or a torchkit checkpoint to fine-tune. "
        + data_default_help("model"),
    )
    weights: str | None = option(
        None,
        panel=MODEL_PANEL,
        help="Start from pretrained weights: DEFAULT (torchvision's or timm's; needs the internet "
        "or a warm cache), a timm pretrained tag, or a checkpoint / state-dict / .safetensors "
        "file. The head is replaced when the data's classes differ.",
    )
    trust_checkpoint: bool = option(  # pickles allowed in --model/--weights files
        False,
        panel=MODEL_PANEL,
        help="Allow --model/--weights files that hold arbitrary pickled objects (runs code from "
        "the file).",
    )
    freeze_backbone: bool = option(
        False,
        panel=MODEL_PANEL,
        help="Train only the classifier head (backbone weights and normalisation statistics stay "
        "as they are).",
    )
    backbone_lr: float | None = option(
        None, panel=MODEL_PANEL, help="Learning rate of the backbone (the head uses --lr)."
    )
    head_lr_mult: float | None = option(
        None, panel=MODEL_PANEL, help="The head's learning rate is --lr times this."
    )
    sync_bn: bool = option(
        False, panel=MODEL_PANEL, help="BatchNorm -> SyncBatchNorm under torchrun (CUDA only)."
    )
    # Optimisation
    epochs: int | None = option(
        None,
        panel=OPTIM_PANEL,
        flags=("--epochs", "-e"),
        minimum=1,
        show_default=False,
        help=f"Epochs to train. {data_default_help('epochs')}",
    )
    batch_size: int | None = option(
        None,
        panel=OPTIM_PANEL,
        flags=("--batch-size", "-b"),
        minimum=1,
        show_default=False,
        help="Images per batch and process (torchrun: global = N x this). "
        + data_default_help("batch_size"),
    )
    optimizer: str = option(
        "adamw",
        panel=OPTIM_PANEL,
        choices=OPTIMIZERS,
        help="sgd (with --momentum and --nesterov), adam, adamw or rmsprop (with --momentum).",
    )
    lr: float = option(3e-3, panel=OPTIM_PANEL, help="Peak learning rate.")
    momentum: float = option(0.9, panel=OPTIM_PANEL, help="SGD / RMSprop momentum.")
    nesterov: bool = option(False, panel=OPTIM_PANEL, help="Nesterov momentum (SGD).")
    weight_decay: float = option(
        0.05,
        panel=OPTIM_PANEL,
        flags=("--weight-decay", "--wd"),
        help="Weight decay (not on biases and normalisation weights).",
    )
    decay_all: bool = option(
        False,
        panel=OPTIM_PANEL,
        help="Weight decay on every parameter, biases and norms included.",
    )
    scheduler: str = option(
        "cosine",
        panel=OPTIM_PANEL,
        choices=SCHEDULERS,
        help="cosine anneals per iteration; step, multistep and exponential decay per epoch; "
        "plateau decays when the --best-metric (val top-1 or val loss, of the EMA weights with "
        "--ema) stops improving.",
    )
    warmup_epochs: float = option(
        1.0,
        panel=OPTIM_PANEL,
        minimum=0,
        help="Linear warm-up, stepped per iteration (fractions allowed).",
    )
    min_lr: float = option(0.0, panel=OPTIM_PANEL, minimum=0, help="Final lr of cosine.")
    step_size: int = option(30, panel=OPTIM_PANEL, minimum=1, help="step: epochs between decays.")
    milestones: tuple[int, ...] = option(
        (),
        panel=OPTIM_PANEL,
        parse=parse_milestones,
        help="multistep: epochs to decay at, e.g. 30,60.",
    )
    gamma: float | None = option(
        None,
        panel=OPTIM_PANEL,
        show_default=False,
        help="Decay factor: 0.1 (step, multistep, plateau), 0.95 (exponential).",
    )
    patience: int = option(
        5,
        panel=OPTIM_PANEL,
        minimum=0,
        help="plateau: epochs without improvement before the lr decays.",
    )
    label_smoothing: float = option(
        0.1, panel=OPTIM_PANEL, help="Cross-entropy label smoothing (0.1 is usual)."
    )
    class_weights: str = option(  # none | balanced | FILE (core.train.class_weights)
        "none",
        panel=OPTIM_PANEL,
        help="Loss weights per class for imbalanced data: none, balanced (n / (k * n_c)) or FILE "
        "(JSON list or {class: weight}, or one weight / class,weight per line).",
    )
    balanced_sampler: bool = option(
        False,
        panel=OPTIM_PANEL,
        help="Draw training images with replacement so every class comes equally often "
        "(WeightedRandomSampler; seeded, split over torchrun ranks).",
    )
    mixup_alpha: float = option(0.0, panel=OPTIM_PANEL, help="Mixup Beta(a, a); 0 = off.")
    cutmix_alpha: float = option(
        0.0,
        panel=OPTIM_PANEL,
        help="CutMix Beta(a, a); 0 = off. With mixup: one or the other per batch.",
    )
    l1: float = option(0.0, panel=OPTIM_PANEL, help="L1 penalty weight on the decayed weights.")
    clip_grad: float | None = option(
        None, panel=OPTIM_PANEL, help="Clip the gradient norm to this."
    )
    accum_steps: int = option(
        1,
        panel=OPTIM_PANEL,
        minimum=1,
        help="Accumulate gradients over this many batches per update.",
    )
    ema: bool | None = option(  # with EMA on, its weights' val metric picks best.pt
        None,
        panel=OPTIM_PANEL,
        flags=("--ema/--no-ema",),
        show_default=False,
        help="Keep an exponential moving average of the weights, evaluated alongside; its val "
        "metric then picks best.pt. " + data_default_help("ema"),
    )
    ema_decay: float = option(
        0.999,
        panel=OPTIM_PANEL,
        help="EMA decay per update (warmed up over the first updates).",
    )
    amp: bool = option(
        False,
        panel=OPTIM_PANEL,
        help="Mixed precision: bf16, or fp16 with a GradScaler (CUDA and CPU).",
    )
    amp_dtype: str = option(
        "auto",
        panel=OPTIM_PANEL,
        choices=AMP_DTYPES,
        help="auto: bf16 on CPUs and on GPUs that compute in it natively (Ampere and later), "
        "fp16 on older GPUs.",
    )
    channels_last: bool | None = option(
        None,
        panel=OPTIM_PANEL,
        flags=("--channels-last/--no-channels-last",),
        show_default=False,
        help=f"channels-last memory format. {data_default_help('channels_last')}",
    )
    compile: bool = option(False, panel=OPTIM_PANEL, help="torch.compile the model.")
    cudnn_benchmark: bool | None = option(
        None,
        panel=OPTIM_PANEL,
        flags=("--cudnn-benchmark/--no-cudnn-benchmark",),
        show_default=False,
        help="On CUDA, let cuDNN time its algorithms for each new input shape and keep the "
        "fastest (torch.backends.cudnn.benchmark; a new run then drops each epoch's last "
        "partial training batch, so one shape is tuned; a resumed run keeps its checkpoint's "
        "batches). The tuning is paid in the first epoch: on an H200 it cost resnet50's 11 s "
        "and bought its steady epochs nothing, so it is off by default (on with "
        "--cudnn-benchmark-limit); --deterministic cannot use it.",
    )
    cudnn_benchmark_limit: int | None = option(
        None,
        panel=OPTIM_PANEL,
        metavar="N",
        show_default=False,
        help="cuDNN's autotuning on (unless --no-cudnn-benchmark), timing this many of its "
        "algorithms for each convolution (torch.backends.cudnn.benchmark_limit; 0: all of "
        "them). Fewer shortens the first epoch, at the risk of missing the fastest "
        "algorithm. Default: torch's (10), when --cudnn-benchmark is given.",
    )
    cuda_graphs: bool | None = option(
        None,
        panel=OPTIM_PANEL,
        flags=("--cuda-graphs/--no-cuda-graphs",),
        show_default=False,
        help="On CUDA, record the whole training step (forward, backward, optimiser, EMA) once "
        "as a CUDA graph and replay it for every batch: for small models, whose steps wait "
        "on Python and kernel launches rather than on the GPU (the digits convnet). A new run "
        "drops each epoch's last partial batch. One process, --optimizer sgd, adam or adamw, "
        "--accum-steps 1, no --mixup, --cutmix or --compile, and no float16 --amp (bf16 is "
        "fine). Default: on for digits on one CUDA GPU where those allow it, else off.",
    )
    # How this run executes (the options every command shares, in the general panel)
    seed: int = option(0, shared=True)
    deterministic: bool = option(False, shared=True)
    device: str = option("auto", shared=True)
    # torchrun: seconds a collective waits for the other ranks before the run fails.
    dist_timeout: float = option(
        1800.0,
        metavar="SECONDS",
        help="torchrun: seconds a process waits for the others in a collective before the run "
        "ends with an error (a rank that died or hangs), instead of waiting forever.",
    )
    workers: int | None = option(None, shared=True)
    strict: bool = option(False, shared=True)
    # Outputs
    out: str | None = option(
        None,
        panel=OUTPUTS_PANEL,
        folder=True,
        show_default=False,
        help="Run folder (default runs/<model>-<timestamp>; with --resume, the resumed run's "
        "folder).",
    )
    force: bool = option(False, shared=True)
    resume: str | None = option(None, panel=OUTPUTS_PANEL, help=resume_help())
    save_every: int = option(
        0,
        panel=OUTPUTS_PANEL,
        minimum=0,
        help="Also keep epoch-NNN.pt every N epochs (0 = never).",
    )
    keep: int = option(
        0,
        panel=OUTPUTS_PANEL,
        minimum=0,
        help="Keep only the newest N epoch-NNN.pt (0 = all).",
    )
    early_stop: int = option(
        0,
        panel=OUTPUTS_PANEL,
        minimum=0,
        help="Stop after N epochs without a better val metric, see --best-metric (0 = off).",
    )
    best_metric: str | None = option(  # "top1" or "loss" of the validation set
        None,
        panel=OUTPUTS_PANEL,
        choices=BEST_METRICS,
        show_default=False,
        help="Validation metric that picks best.pt (and that --early-stop and the plateau "
        "schedule watch). Default: top1; loss for digits, whose 180 validation images saturate "
        "top-1 within a few epochs.",
    )
    tensorboard: bool = option(
        False,
        panel=OUTPUTS_PANEL,
        help="Also log to OUT/tensorboard (needs the tensorboard package).",
    )
    profile_steps: int = option(
        0,
        panel=OUTPUTS_PANEL,
        minimum=0,
        metavar="N",
        help="Profile the first N optimiser steps (N x --accum-steps batches) of the first two "
        "epochs this run trains "
        "(torch.profiler; CPU, and CUDA on a GPU): OUT/profile/epoch-K.txt lists the "
        "operators by self time, epoch-K.json is the trace for Perfetto or chrome://tracing, "
        "and on a GPU epoch-K-gpu.txt says how busy each CUDA stream was and what the host "
        "waited for. The first epoch shows what a run pays once, the second what each step costs. "
        "0 = off.",
    )
    # --find-lr: the learning-rate range test instead of training (core.train.lr_find).
    find_lr: bool = option(
        False,
        panel=OPTIM_PANEL,
        help="Instead of training, run the learning-rate range test: an exponential sweep from "
        "--lr-min to --lr-max over --find-lr-iters steps; writes lr_find.csv and lr_find.png to "
        "the run folder, prints the suggested --lr, keeps no checkpoint.",
    )
    lr_min: float = option(1e-7, panel=OPTIM_PANEL, help="--find-lr's first lr.")
    lr_max: float = option(10.0, panel=OPTIM_PANEL, help="--find-lr's last lr.")
    find_lr_iters: int = option(100, panel=OPTIM_PANEL, help="--find-lr's number of steps.")
    # Filled by resolve_defaults: the option names whose value came from the data (not an option).
    data_defaults: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (tuples become lists), for config.json and checkpoints."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """The inverse of `to_dict`; keys this version does not know are ignored."""
        known = {f.name: f for f in fields(cls)}
        values = {}
        for name, value in data.items():
            if name not in known:
                continue
            if isinstance(value, list):
                value = tuple(value)
            values[name] = value
        return cls(**values)

    def gamma_value(self) -> float:
        return self.gamma if self.gamma is not None else DEFAULT_GAMMA.get(self.scheduler, 0.1)


# Every option of `torchkit train`, by field name, in the order of its help.
TRAIN_OPTIONS: dict[str, OptionSpec] = option_specs(TrainConfig)


# Options added after runs were already being recorded, with the value those runs trained with
# where it is not today's default: a recorded run's options (a checkpoint's, a config.json's)
# without the key get this value, so resuming or replaying an old run repeats it exactly.
BEFORE_THE_OPTION_EXISTED: dict[str, Any] = {"decode": "exact"}


def with_pre_option_values(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded run's options, with the values of options it predates filled in."""
    return {**BEFORE_THE_OPTION_EXISTED, **recorded}


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def resolve_defaults(config: TrainConfig, *, is_digits: bool) -> TrainConfig:
    """Fill the None options from the data; the names filled go into `data_defaults`."""
    from torchkit.core.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD

    table = DIGITS_DEFAULTS if is_digits else FOLDER_DEFAULTS
    chosen = {name: value for name, value in table.items() if getattr(config, name) is None}
    if config.resize_size is None:
        # digits: no centre crop; images: torchvision's 256/224 resize-then-crop ratio.
        image_size = chosen.get("image_size", config.image_size)
        chosen["resize_size"] = image_size if is_digits else int(round(image_size / 0.875))
    resolved = dataclasses.replace(config, **chosen)
    resolved.mean = _three(resolved.mean, IMAGENET_MEAN)
    resolved.std = _three(resolved.std, IMAGENET_STD)
    resolved.data_defaults = tuple(sorted(set(config.data_defaults) | set(chosen)))
    validate(resolved)
    return resolved


def _three(values: tuple[float, ...] | None, default: tuple[float, ...]) -> tuple[float, ...]:
    """Per-channel statistics for RGB input: one value stands for all three channels."""
    if values is None:
        return tuple(default)
    return tuple(values) * 3 if len(values) == 1 else tuple(values)


def validate(config: TrainConfig) -> None:
    """Refuse contradictory or out-of-range options before anything is loaded; warn of
    options that work against each other."""

    def bad(message: str, hint: str | None = None) -> None:
        raise UsageError(message, hint)

    check_finite(config)
    if config.optimizer not in OPTIMIZERS:
        bad(f"unknown optimizer {config.optimizer!r}", "use " + ", ".join(OPTIMIZERS))
    if config.scheduler not in SCHEDULERS:
        bad(f"unknown scheduler {config.scheduler!r}", "use " + ", ".join(SCHEDULERS))
    if config.best_metric is not None and config.best_metric not in BEST_METRICS:
        bad(f"unknown --best-metric {config.best_metric!r}", "use " + ", ".join(BEST_METRICS))
    if config.augment not in AUGMENT_POLICIES:
        bad(f"unknown --augment {config.augment!r}", "use " + ", ".join(AUGMENT_POLICIES))
    if config.interpolation not in INTERPOLATIONS:
        bad(
            f"unknown --interpolation {config.interpolation!r}",
            "use " + ", ".join(INTERPOLATIONS),
        )
    if not 0 <= config.randaugment_magnitude <= 30:
        bad(f"--randaugment-magnitude must be in 0..30, not {config.randaugment_magnitude}")
    if config.decode not in DECODE_CHOICES:
        bad(f"unknown --decode {config.decode!r}", "use " + ", ".join(DECODE_CHOICES))
    if config.decode == "device":
        from torchkit.core.data.device_decode import check_device_decode

        check_device_decode(config.augment, config.random_erasing)
    if not 0 <= config.random_erasing <= 1:
        bad(f"--random-erasing is a probability in [0, 1], not {config.random_erasing}")
    if not 0 <= config.decode_cpu_share <= 1:
        bad(f"--decode-cpu-share is a fraction in [0, 1], not {config.decode_cpu_share}")
    if config.decode_cpu_share > 0 and config.decode in ("fast", "exact"):
        bad(
            f"--decode-cpu-share shares the decoding with the device, and --decode "
            f"{config.decode} decodes nothing there",
            "use --decode device (or auto, on CUDA)",
        )
    if config.amp_dtype not in AMP_DTYPES:
        bad(f"unknown --amp-dtype {config.amp_dtype!r}", "use " + ", ".join(AMP_DTYPES))
    if config.epochs is not None and config.epochs < 1:
        bad(f"--epochs must be at least 1, not {config.epochs}")
    if config.batch_size is not None and config.batch_size < 1:
        bad(f"--batch-size must be at least 1, not {config.batch_size}")
    if config.accum_steps < 1:
        bad(f"--accum-steps must be at least 1, not {config.accum_steps}")
    if config.lr <= 0:
        bad(f"--lr must be positive, not {config.lr}")
    if config.backbone_lr is not None and config.head_lr_mult is not None:
        bad("--backbone-lr and --head-lr-mult both set the head/backbone ratio", "give one")
    if config.backbone_lr is not None and config.backbone_lr < 0:
        bad(f"--backbone-lr must not be negative, not {config.backbone_lr}")
    if config.head_lr_mult is not None and config.head_lr_mult <= 0:
        bad(f"--head-lr-mult must be positive, not {config.head_lr_mult}")
    if config.freeze_backbone and (config.backbone_lr is not None):
        bad("--freeze-backbone trains no backbone, so --backbone-lr has nothing to do")
    if config.nesterov and (config.optimizer != "sgd" or config.momentum <= 0):
        bad("--nesterov needs --optimizer sgd with a positive --momentum")
    if not 0 <= config.label_smoothing < 1:
        bad(f"--label-smoothing must be in [0, 1), not {config.label_smoothing}")
    for name in ("mixup_alpha", "cutmix_alpha", "l1", "weight_decay", "min_lr", "warmup_epochs"):
        if getattr(config, name) < 0:
            bad(f"{option_name(name)} must not be negative, not {getattr(config, name)}")
    if not 0 <= config.momentum < 1:
        bad(f"--momentum must be in [0, 1), not {config.momentum}")
    if config.gamma is not None and not 0 < config.gamma <= 1:
        bad(f"--gamma is a decay factor: it must be in (0, 1], not {config.gamma}")
    if config.min_lr > config.lr:
        bad(
            f"--min-lr {config.min_lr} is larger than --lr {config.lr}",
            "the schedule anneals from --lr down to --min-lr",
        )
    if config.clip_grad is not None and config.clip_grad <= 0:
        bad(f"--clip-grad must be positive, not {config.clip_grad}")
    if not 0 < config.ema_decay < 1:
        bad(f"--ema-decay must be between 0 and 1, not {config.ema_decay}")
    if config.val_split is not None and not 0 < config.val_split < 1:
        bad(f"--val-split must be between 0 and 1, not {config.val_split}")
    if config.crop_scale is not None:
        low, high = config.crop_scale
        if not 0 < low <= high <= 1:
            bad(f"--crop-scale must satisfy 0 < MIN <= MAX <= 1, not {low} {high}")
    if config.image_size is not None and config.image_size < 1:
        bad(f"--image-size must be positive, not {config.image_size}")
    if config.image_size is not None or config.resize_size is not None:
        from torchkit.core.data.preprocessing import check_image_memory

        given = [("--image-size", config.image_size), ("--resize-size", config.resize_size)]
        option, side = max(((o, v) for o, v in given if v is not None), key=lambda ov: ov[1])
        check_image_memory(side, 3, f"{option} {side}")
    if (
        config.resize_size is not None
        and config.image_size is not None
        and config.resize_size < config.image_size
    ):
        bad(
            f"--resize-size {config.resize_size} is smaller than --image-size {config.image_size}",
            "the centre crop must fit inside the resized image",
        )
    for name in ("mean", "std"):
        values = getattr(config, name)
        if values is not None and len(values) not in (1, 3):
            bad(f"--{name} takes 3 values (one per RGB channel) or 1, not {len(values)}")
    if config.std is not None and any(v <= 0 for v in config.std):
        bad("--std values must be positive")
    if config.scheduler == "multistep" and not config.milestones:
        bad("--scheduler multistep needs --milestones", "e.g. --milestones 30,60")
    if any(milestone < 1 for milestone in config.milestones):
        given = ",".join(map(str, config.milestones))
        bad(
            f"--milestones are the epochs after which the learning rate drops, from 1: not {given}",
            "e.g. --milestones 30,60",
        )
    if not SEEDS[0] <= config.seed <= SEEDS[1]:
        bad(f"--seed {config.seed} is outside torch's seeds, {SEEDS[0]} to {SEEDS[1]}")
    if config.step_size < 1:
        bad(f"--step-size must be at least 1, not {config.step_size}")
    for name in ("save_every", "keep", "early_stop", "patience"):
        if getattr(config, name) < 0:
            bad(f"{option_name(name)} must not be negative")
    if config.workers is not None and config.workers < 0:
        bad(f"--workers must not be negative, not {config.workers}")
    if config.find_lr:
        if not 0 < config.lr_min < config.lr_max:
            bad(f"--lr-min {config.lr_min} and --lr-max {config.lr_max}: need 0 < MIN < MAX")
        if config.find_lr_iters < 2:
            bad(f"--find-lr-iters must be at least 2, not {config.find_lr_iters}")
        if config.resume is not None:
            bad("--find-lr starts from the model's weights; it does not continue a run")
        if config.profile_steps:
            bad("--profile-steps profiles training epochs, and --find-lr trains none")
    if config.cudnn_benchmark and config.deterministic:
        bad(
            "--cudnn-benchmark picks algorithms by timing them, which --deterministic rules out",
            "drop one of the two",
        )
    # Not refused with the autotuning off: a resumed run keeps its limit when given
    # --no-cudnn-benchmark, and there is no value that says "none".
    if config.cudnn_benchmark_limit is not None and config.cudnn_benchmark_limit < 0:
        bad(f"--cudnn-benchmark-limit must not be negative, not {config.cudnn_benchmark_limit}")
    if config.cuda_graphs:
        _check_graphable(config)
    if not config.dist_timeout > 0:
        bad(f"--dist-timeout must be a positive number of seconds, not {config.dist_timeout}")
    if config.balanced_sampler and config.class_weights != "none":
        log.warning(
            "--class-weights %s and --balanced-sampler both correct the class imbalance: "
            "together they over-correct (rare classes end up outweighing common ones); use one "
            "of them",
            config.class_weights,
        )


def _check_graphable(config: TrainConfig) -> None:
    """--cuda-graphs records one fixed update: nothing in it may vary from step to step on
    the host (mixing draws on the host; accumulation and --compile change the step)."""
    reason = graph_refusal(config)
    if reason is not None:
        raise UsageError(f"--cuda-graphs {reason}", "drop --cuda-graphs, or the other option")


def graph_refusal(config: TrainConfig) -> str | None:
    """Why the options rule out --cuda-graphs (the end of its error), or None."""
    refusals = (
        (
            config.optimizer not in ("sgd", "adam", "adamw"),
            f"needs a fused optimiser (sgd, adam or adamw), not {config.optimizer}",
        ),
        (config.accum_steps > 1, "records one batch per update: it cannot use --accum-steps"),
        (
            config.mixup_alpha > 0 or config.cutmix_alpha > 0,
            "cannot use --mixup or --cutmix: they draw on the host at each step",
        ),
        (config.compile, "cannot record a compiled model's step: use one of the two"),
        (config.find_lr, "speeds up training epochs, and --find-lr trains none"),
    )
    return next((reason for refused, reason in refusals if refused), None)


def option_name(field_name: str) -> str:
    """The command-line spelling of a TrainConfig field: `min_lr` -> `--min-lr`."""
    spec = TRAIN_OPTIONS.get(field_name)
    return spec.name if spec is not None else default_flag(field_name)


def check_finite(config: TrainConfig) -> None:
    """Every floating-point option (and each value of a tuple of them) is a finite number: a
    NaN passes every `<` and `>` check, and would train, or freeze part of the model, quietly."""
    for f in fields(config):
        value = getattr(config, f.name)
        values = value if isinstance(value, tuple) else (value,)
        for item in values:
            if isinstance(item, float) and not math.isfinite(item):
                shown = _show(value)
                raise UsageError(
                    f"{option_name(f.name)} must be a finite number, not {shown}",
                    "nan and inf are not option values",
                )


def merge_for_resume(
    saved: Mapping[str, Any], config: TrainConfig, overrides: Collection[str] | None
) -> TrainConfig:
    """The saved run's options, with `overrides` (option names) taken from `config`.

    With `overrides` None, every option of `config` that differs from the default counts as
    given. An option of FIXED_ON_RESUME given with another value than the checkpoint's is a
    CheckpointError naming both values; --weights is a UsageError.
    """
    base = TrainConfig.from_dict(with_pre_option_values(saved))
    defaults = TrainConfig()
    known = TRAIN_OPTIONS.keys()
    if overrides is None:
        overrides = [name for name in known if getattr(config, name) != getattr(defaults, name)]
    changes: dict[str, Any] = {}
    for name in overrides:
        if name in IGNORED_ON_RESUME or name not in known:
            continue
        value = getattr(config, name)
        if name in NEW_RUN_ONLY:
            if value:
                raise UsageError(
                    f"{option_name(name)} cannot be used with --resume",
                    NEW_RUN_ONLY[name] + f"; drop {option_name(name)}",
                )
            continue
        old = getattr(base, name)
        if name in FIXED_ON_RESUME:
            if value is None or _same(name, value, old):
                continue
            raise CheckpointError(
                f"the checkpoint was trained with {option_name(name)} {_show(old)}, "
                f"not {_show(value)}",
                f"{option_name(name)} cannot change on resume: {FIXED_ON_RESUME[name]}; drop "
                f"it to continue the run, or start a new run from its weights with --weights",
            )
        changes[name] = value
    merged = dataclasses.replace(base, **changes)
    merged.resume = config.resume
    merged.force = config.force
    merged.dist_timeout = config.dist_timeout
    merged.trust_checkpoint = config.trust_checkpoint  # this invocation's say, not the saved run's
    merged.profile_steps = config.profile_steps  # profiles this invocation, never a saved one
    merged.out = config.out
    merged.weights = None  # the checkpoint's weights replace any pretrained start
    for name in CHOSEN_FOR_THE_MACHINE:
        if name in base.data_defaults and name not in changes:
            setattr(merged, name, None)  # chosen again where the run goes on
    return merged


def _same(name: str, value: Any, old: Any) -> bool:
    """Equal as the run would use them (one --mean value stands for three)."""
    if name in ("mean", "std") and value is not None and old is not None:
        return _three(tuple(value), ()) == _three(tuple(old), ())
    if isinstance(value, (tuple, list)) and isinstance(old, (tuple, list)):
        return tuple(value) == tuple(old)
    return value == old


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return " ".join(str(v) for v in value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    return str(value)
