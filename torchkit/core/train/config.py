"""Every option of `torchkit train`, as one dataclass that round-trips to the config.json dict.

Options left as None are filled by `resolve_defaults` from the data: the built-in 8x8 digits get
their own image size, crop range and no flips (a mirrored 2 is not a 2); image folders get the
ImageNet recipe. config.json records the resolved values and which ones came from the data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

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
    "image_size": 16,  # the 8x8 digits upsampled 2x: the convnet's two 3x3 convolutions need room
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
    workers: int | None = None
    strict: bool = False
    # Model and fine-tuning
    model: str | None = None
    weights: str | None = None
    freeze_backbone: bool = False
    backbone_lr: float | None = None
    head_lr_mult: float | None = None
    sync_bn: bool = False
    # Optimisation
    epochs: int = 20
    batch_size: int = 64
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
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    l1: float = 0.0
    clip_grad: float | None = None
    accum_steps: int = 1
    ema: bool | None = None  # with EMA on, its weights' val metric picks best.pt
    ema_decay: float = 0.999
    amp: bool = False
    amp_dtype: str = "auto"
    channels_last: bool = False
    compile: bool = False
    seed: int = 0
    deterministic: bool = False
    device: str = "auto"
    # Outputs
    out: str | None = None
    force: bool = False
    resume: str | None = None
    save_every: int = 0
    keep: int = 0
    early_stop: int = 0
    best_metric: str | None = None  # "top1" or "loss" of the validation set
    tensorboard: bool = False
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

    if config.optimizer not in OPTIMIZERS:
        bad(f"unknown optimizer {config.optimizer!r}", "use " + ", ".join(OPTIMIZERS))
    if config.scheduler not in SCHEDULERS:
        bad(f"unknown scheduler {config.scheduler!r}", "use " + ", ".join(SCHEDULERS))
    if config.best_metric is not None and config.best_metric not in BEST_METRICS:
        bad(f"unknown --best-metric {config.best_metric!r}", "use " + ", ".join(BEST_METRICS))
    if config.amp_dtype not in AMP_DTYPES:
        bad(f"unknown --amp-dtype {config.amp_dtype!r}", "use " + ", ".join(AMP_DTYPES))
    if config.epochs < 1:
        bad(f"--epochs must be at least 1, not {config.epochs}")
    if config.batch_size < 1:
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


# Options that define what the checkpoint's weights are: a resumed run cannot change them.
FIXED_ON_RESUME = ("model", "image_size", "resize_size", "sync_bn")
# Options that only make sense for the run that starts from scratch.
IGNORED_ON_RESUME = ("weights", "resume", "force", "out", "data_defaults")


def merge_for_resume(
    saved: Mapping[str, Any], config: TrainConfig, overrides: Collection[str] | None
) -> TrainConfig:
    """The saved run's options, with `overrides` (option names) taken from `config`.

    With `overrides` None, every option of `config` that differs from the default counts as
    given. Options that define the weights (model, image size) must not change.
    """
    base = TrainConfig.from_dict(saved)
    defaults = TrainConfig()
    if overrides is None:
        overrides = [
            f.name for f in fields(config) if getattr(config, f.name) != getattr(defaults, f.name)
        ]
    changes: dict[str, Any] = {}
    for name in overrides:
        if name in IGNORED_ON_RESUME or name not in {f.name for f in fields(config)}:
            continue
        value = getattr(config, name)
        if name in FIXED_ON_RESUME and value is not None and value != getattr(base, name):
            raise CheckpointError(
                f"the checkpoint was trained with --{name.replace('_', '-')} "
                f"{_show(getattr(base, name))}, not {_show(value)}",
                f"drop --{name.replace('_', '-')} to continue the run, or start a new one "
                "without --resume",
            )
        changes[name] = value
    merged = dataclasses.replace(base, **changes)
    merged.resume = config.resume
    merged.force = config.force
    merged.out = config.out
    merged.weights = None  # the checkpoint's weights replace any pretrained start
    return merged


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return " ".join(str(v) for v in value)
    return str(value)
