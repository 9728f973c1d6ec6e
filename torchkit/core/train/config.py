"""Every option of `torchkit train`, as one dataclass that round-trips to the config.json dict.

Options left as None are filled by `resolve_defaults` from the data: the built-in 8x8 digits get
their own image size, crop range and no flips (a mirrored 2 is not a 2); image folders get the
ImageNet recipe. config.json records the resolved values and which ones came from the data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from torchkit.core.data import AUGMENT_POLICIES, INTERPOLATIONS
from torchkit.core.decode import DECODE_CHOICES
from torchkit.core.errors import CheckpointError, UsageError

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


@dataclass
class TrainConfig:
    """The options of one training run. None means "chosen from the data" (see module doc)."""

    # Data
    data: str = "digits"
    val_split: float | None = None
    image_size: int | None = None
    resize_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    flip: bool | None = None
    crop_scale: tuple[float, float] | None = None
    augment: str = "basic"  # none | basic | trivialaugment | randaugment | autoaugment
    randaugment_magnitude: int = 9
    random_erasing: float = 0.0
    interpolation: str = "bilinear"  # of every resize, train and eval; in the checkpoint
    # fast | exact | device | auto: training JPEGs decoded at 1/2..1/8 where the random crop
    # keeps image-size pixels across (core.decode); exact decodes them whole; device decodes
    # them on the training device (core.device_decode); auto (chosen when the run starts, and
    # recorded resolved): device when training on CUDA from JPEG files, fast otherwise.
    decode: str = "auto"
    workers: int | None = None
    strict: bool = False
    # Model and fine-tuning
    model: str | None = None
    weights: str | None = None
    trust_checkpoint: bool = False  # pickles allowed in --model/--weights files
    freeze_backbone: bool = False
    backbone_lr: float | None = None
    head_lr_mult: float | None = None
    sync_bn: bool = False
    # Optimisation
    epochs: int | None = None
    batch_size: int | None = None
    optimizer: str = "adamw"
    lr: float = 3e-3
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.05
    decay_all: bool = False
    scheduler: str = "cosine"
    warmup_epochs: float = 1.0
    min_lr: float = 0.0
    step_size: int = 30
    milestones: tuple[int, ...] = ()
    gamma: float | None = None
    patience: int = 5
    label_smoothing: float = 0.1
    class_weights: str = "none"  # none | balanced | FILE (core.train.class_weights)
    balanced_sampler: bool = False  # draw every class equally often (with replacement)
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    l1: float = 0.0
    clip_grad: float | None = None
    accum_steps: int = 1
    ema: bool | None = None  # with EMA on, its weights' val metric picks best.pt
    ema_decay: float = 0.999
    amp: bool = False
    amp_dtype: str = "auto"
    channels_last: bool | None = None
    compile: bool = False
    seed: int = 0
    deterministic: bool = False
    device: str = "auto"
    # torchrun: seconds a collective waits for the other ranks before the run fails.
    dist_timeout: float = 1800.0
    # Outputs
    out: str | None = None
    force: bool = False
    resume: str | None = None
    save_every: int = 0
    keep: int = 0
    early_stop: int = 0
    best_metric: str | None = None  # "top1" or "loss" of the validation set
    tensorboard: bool = False
    # --find-lr: the learning-rate range test instead of training (core.train.lr_find).
    find_lr: bool = False
    lr_min: float = 1e-7
    lr_max: float = 10.0
    find_lr_iters: int = 100
    # Filled by resolve_defaults: the option names whose value came from the data.
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
    from torchkit.core.data import IMAGENET_MEAN, IMAGENET_STD

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
    """Refuse contradictory or out-of-range options before anything is loaded."""

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
        from torchkit.core.device_decode import check_device_decode

        check_device_decode(config.augment, config.random_erasing)
    if not 0 <= config.random_erasing <= 1:
        bad(f"--random-erasing is a probability in [0, 1], not {config.random_erasing}")
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
            bad(f"--{name.replace('_', '-')} must not be negative, not {getattr(config, name)}")
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
    if config.step_size < 1:
        bad(f"--step-size must be at least 1, not {config.step_size}")
    for name in ("save_every", "keep", "early_stop", "patience"):
        if getattr(config, name) < 0:
            bad(f"--{name.replace('_', '-')} must not be negative")
    if config.workers is not None and config.workers < 0:
        bad(f"--workers must not be negative, not {config.workers}")
    if config.find_lr:
        if not 0 < config.lr_min < config.lr_max:
            bad(f"--lr-min {config.lr_min} and --lr-max {config.lr_max}: need 0 < MIN < MAX")
        if config.find_lr_iters < 2:
            bad(f"--find-lr-iters must be at least 2, not {config.find_lr_iters}")
        if config.resume is not None:
            bad("--find-lr starts from the model's weights; it does not continue a run")
    if not config.dist_timeout > 0:
        bad(f"--dist-timeout must be a positive number of seconds, not {config.dist_timeout}")


def option_name(field_name: str) -> str:
    """The command-line spelling of a TrainConfig field: `min_lr` -> `--min-lr`."""
    return "--" + field_name.replace("_", "-")


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
)


def resume_help() -> str:
    """What `--resume` says about options given again (the CLI's help text)."""
    fixed = ", ".join(option_name(name) for name in FIXED_ON_RESUME)
    return (
        "Continue a run exactly: its folder (last.pt) or a checkpoint file. Options given again "
        "apply from the resumed step on (--epochs extends the run and its schedule; --lr, "
        "--weight-decay, the schedule, regularisation, --device, --workers... take effect), "
        f"except {fixed}, which cannot change."
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
    known = {f.name for f in fields(config)}
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
    merged.out = config.out
    merged.weights = None  # the checkpoint's weights replace any pretrained start
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
