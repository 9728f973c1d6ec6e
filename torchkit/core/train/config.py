"""Every option of `torchkit train`, as one dataclass that round-trips to the config.json dict.

Options left as None are filled from the data by `validation.resolve_defaults`: the built-in
8x8 digits get their own image size, crop range and no flips (a mirrored 2 is not a 2); image
folders get the ImageNet recipe. config.json records the resolved values and which ones came
from the data. The defaults tables live in `defaults`, what --resume keeps in `resume_rules`,
the checks in `validation`, the resume merge in `resume_merge`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from torchkit.core.data.decode import DECODE_CHOICES
from torchkit.core.data.preprocessing import CROP_MODES, INTERPOLATIONS, parse_floats
from torchkit.core.data.transforms import AUGMENT_POLICIES, AUTOAUGMENT_POLICIES
from torchkit.core.input_size import parse_rgb_image_side
from torchkit.core.io.errors import short_repr
from torchkit.core.io.option_lists import number_items
from torchkit.core.io.redaction import redact_url
from torchkit.core.runtime.device import AMP_DTYPES
from torchkit.core.train.defaults import DEFAULT_GAMMA, data_default_help
from torchkit.core.train.option_specs import (
    DATA_PANEL,
    MODEL_PANEL,
    OPTIM_PANEL,
    OUTPUTS_PANEL,
    OptionSpec,
    option,
    option_specs,
)
from torchkit.core.train.resume_rules import resume_help

OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop")
SCHEDULERS = ("cosine", "step", "multistep", "exponential", "plateau", "none")
BEST_METRICS = ("top1", "loss")
# The most epochs a run takes: a million epochs of one step each is days of training, while
# --epochs 99999999999999999999 started a run that could never end, its progress line 20
# digits wide.
MOST_EPOCHS = 1_000_000
# The most batches one update accumulates: beyond any epoch's batches, where an epoch makes one
# update of all of them (as timm and Lightning do), while --accum-steps 99999999999999999999
# was recorded as the images of each update.
MOST_ACCUM_STEPS = 1_000_000


def parse_milestones(text: str | None, flag: str) -> tuple[int, ...]:
    """`--milestones 30,60` (commas or spaces) -> (30, 60); not given -> (). An
    OptionSpec.parse: a ValueError is a bad value of `flag`; an empty item a UsageError."""
    if text is None:
        return ()
    try:
        return tuple(number_items(text, flag, int, spaces=True, hint="give epochs like 30,60"))
    except ValueError:
        raise ValueError(f"expected epochs like 30,60, not {short_repr(text)}") from None


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
        parse=parse_rgb_image_side,
        show_default=False,
        help=f"Crop size. {data_default_help('image_size')} Fine-tuning a torchkit checkpoint, "
        "the size it was trained at; a timm model, its pretrained config's (weights loaded or "
        "not, as timm's train.py takes it). Validation crops to it, and eval, predict and "
        "export through the checkpoint; training too, unless --train-crop-size. "
        "Also spelled --input-size; 3,N,N is read as N.",
    )
    # torchvision's reference recipes train at a smaller crop than they evaluate at (176 and 224:
    # FixRes's train-test resolution discrepancy); only the training transform reads it.
    train_crop_size: int | None = option(
        None,
        panel=DATA_PANEL,
        minimum=1,
        metavar="N",
        show_default=False,
        help="Random crop size of training alone, where it differs from --image-size (which "
        "validation, eval, predict and export crop to), e.g. 176 with --image-size 224. "
        "Default: --image-size.",
    )
    resize_size: int | None = option(
        None,
        panel=DATA_PANEL,
        minimum=1,
        show_default=False,
        help="Evaluation resize before the centre crop. Default: --image-size for digits, "
        "--image-size/0.875 for image folders; fine-tuning a torchkit checkpoint, its "
        "resize-to-crop ratio; a timm model, its pretrained config's (crop_pct).",
    )
    mean: tuple[float, ...] | None = option(
        None,
        panel=DATA_PANEL,
        parse=parse_floats,
        help="Normalisation mean per channel, e.g. 0.485,0.456,0.406 (the ImageNet default; "
        "fine-tuning a torchkit checkpoint, the one it was trained on; a timm model, its "
        "pretrained config's; `torchkit dataset-stats` computes your data's).",
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
        parse=functools.partial(parse_floats, count=2, example="0.08,1"),
        show_default=False,
        help=f"RandomResizedCrop area range MIN,MAX. {data_default_help('crop_scale')}",
    )
    augment: str = option(
        "basic",
        panel=DATA_PANEL,
        choices=AUGMENT_POLICIES,
        help="Augmentation policy: none (resize and centre crop), basic (random resized crop and "
        "flip), or basic plus trivialaugment, randaugment, autoaugment or augmix "
        "(torchvision's transforms).",
    )
    autoaugment_policy: str = option(
        "imagenet",
        panel=DATA_PANEL,
        choices=AUTOAUGMENT_POLICIES,
        help="Which of AutoAugment's policies --augment autoaugment runs.",
    )
    randaugment_magnitude: int = option(
        9,
        panel=DATA_PANEL,
        minimum=0,
        maximum=30,
        help="Magnitude of --augment randaugment's operations.",
    )
    augmix_severity: int = option(
        3,
        panel=DATA_PANEL,
        minimum=1,
        maximum=10,
        help="Severity of --augment augmix's operations.",
    )
    random_erasing: float = option(
        0.0,
        panel=DATA_PANEL,
        help="Probability of erasing a random rectangle of each training image.",
    )
    # fast | exact | device | auto: training JPEGs decoded at 1/2..1/8 where the random crop
    # keeps the training crop's size across (train-crop-size, else image-size; core.decode);
    # exact decodes them whole; device decodes them on the training device (core.device_decode);
    # auto (chosen when the run starts, and recorded resolved): device when training on CUDA
    # from JPEG files, fast otherwise.
    decode: str = option(
        "auto",
        panel=DATA_PANEL,
        choices=DECODE_CHOICES,
        help="How training JPEGs are decoded: fast = at 1/2, 1/4 or 1/8 of their size where the "
        "random crop still has the training crop's size across (--train-crop-size, else "
        "--image-size; the same crops; pixels within about 0.5/255 on average); exact = whole, "
        "as eval does; device = whole batches on the training device (nvJPEG on CUDA), cropped, "
        "resized and flipped there (the same crops; pixels within 1/255 of exact on the CPU; "
        "flip and crop only, no PIL policies or random erasing); auto = device when training "
        "on CUDA from JPEG files, fast otherwise.",
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
    interpolation: str | None = option(  # of every resize, train and eval; in the checkpoint
        None,
        panel=DATA_PANEL,
        choices=INTERPOLATIONS,
        show_default=False,
        help="Resampling of every resize, in training and (recorded in the checkpoint) in eval, "
        "predict and export. Default: bilinear; fine-tuning a torchkit checkpoint, the one it "
        "was trained with; a timm model, its pretrained config's.",
    )
    crop_mode: str | None = option(  # of the eval transform; in the checkpoint
        None,
        panel=DATA_PANEL,
        choices=CROP_MODES,
        show_default=False,
        help="How validation (and, recorded in the checkpoint, eval, predict and export) fits "
        "images to --image-size: center = the shorter side resized to --resize-size, then a "
        "centre crop; squash = both sides resized to --resize-size (the aspect ratio is not "
        "kept), then a centre crop; border = the longer side resized, the rest padded with the "
        "mean colour. Default: center; a timm model's own (its pretrained config's); "
        "fine-tuning a torchkit checkpoint, the one it records.",
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
        None,
        panel=MODEL_PANEL,
        help="Learning rate of the backbone (the head uses --lr). 0 trains the head alone, as "
        "--freeze-backbone does, but with the backbone's normalisation statistics following the "
        "data.",
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
        maximum=MOST_EPOCHS,
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
    # The negations turn off on --resume what the run was started with.
    nesterov: bool = option(
        False,
        panel=OPTIM_PANEL,
        flags=("--nesterov/--no-nesterov",),
        help="Nesterov momentum (SGD).",
    )
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
    min_lr: float = option(
        0.0,
        panel=OPTIM_PANEL,
        minimum=0,
        help="Final lr of cosine, of --lr; --backbone-lr ends at the same fraction of its own.",
    )
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
        maximum=MOST_ACCUM_STEPS,
        help="Accumulate gradients over this many batches per update (an epoch's last update "
        "takes the batches left).",
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
        flags=("--amp/--no-amp",),  # --no-amp: a run resumed in full precision
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
    compile: bool = option(
        False, panel=OPTIM_PANEL, flags=("--compile/--no-compile",), help="torch.compile the model."
    )
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
        "--accum-steps 1, no --mixup-alpha, --cutmix-alpha or --compile, and no float16 --amp "
        "(bf16 is fine). Default: on for digits on one CUDA GPU where those allow it, else off.",
    )
    # How this run executes (the options every command shares, in the general panel)
    seed: int = option(0, shared=True)
    # Not the shared flags of the other commands: the negations turn off what a --config recipe
    # or a resumed run set (both apply from the resumed step on).
    deterministic: bool = option(
        False,
        flags=("--deterministic/--no-deterministic",),
        help="Also make cuDNN and torch use deterministic algorithms.",
    )
    device: str = option("auto", shared=True)
    # torchrun: seconds a collective waits for the other ranks before the run fails.
    dist_timeout: float = option(
        1800.0,
        metavar="SECONDS",
        help="torchrun: seconds a process waits for the others in a collective before the run "
        "ends with an error (a rank that died or hangs), instead of waiting forever.",
    )
    workers: int | None = option(None, shared=True)
    threads: int | None = option(
        None,
        minimum=0,
        metavar="N",
        show_default=False,
        help="CPU threads torch computes with (torch.set_num_threads; 0: torch's default, one "
        "per core). Small models run faster on one thread on a machine shared with other jobs, "
        "and compute the same numbers whatever the core count. Default: 1 for digits; for "
        "image folders OMP_NUM_THREADS where set, else the cores the --workers leave free "
        "(at least 1), as eval and predict.",
    )
    strict: bool = option(
        False,
        flags=("--strict/--no-strict",),
        help="Stop at the first unreadable file instead of skipping it.",
    )
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
        flags=("--tensorboard/--no-tensorboard",),
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
        """Plain JSON-able values (tuples become lists), for config.json, checkpoints and
        --print-config: a URL's password or token as `***` (never saved; a replay asks for it)."""
        plain = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        plain["data"] = redact_url(plain["data"])
        return plain

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

    def images_per_update(self, world_size: int) -> int:
        """The images one optimizer step learns from: a batch on every rank, --accum-steps
        times (a last update of an epoch may have fewer)."""
        return self.batch_size * world_size * self.accum_steps


# Every option of `torchkit train`, by field name, in the order of its help.
TRAIN_OPTIONS: dict[str, OptionSpec] = option_specs(TrainConfig)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
