"""`torchkit train`'s options filled from the data and checked before anything is loaded."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Collection, Iterable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, NoReturn

from torchkit.core.data.decode import DECODE_CHOICES
from torchkit.core.data.preprocessing import (
    CROP_MODES,
    INTERPOLATIONS,
    Preprocess,
    apply_overrides,
    check_normalization,
)
from torchkit.core.data.transforms import AUGMENT_POLICIES, AUTOAUGMENT_POLICIES
from torchkit.core.inference.options import check_batch_fits
from torchkit.core.io.errors import UsageError, short_repr
from torchkit.core.option_specs import check_ranges, not_finite_hint
from torchkit.core.runtime.cpus import check_workers, max_workers, usable_cpus
from torchkit.core.runtime.device import AMP_DTYPES
from torchkit.core.runtime.seeding import check_seed
from torchkit.core.train.config import (
    BEST_METRICS,
    OPTIMIZERS,
    SCHEDULERS,
    TRAIN_OPTIONS,
    TrainConfig,
)
from torchkit.core.train.defaults import DIGITS_DEFAULTS, FOLDER_DEFAULTS
from torchkit.core.train.option_specs import default_flag

if TYPE_CHECKING:
    from torchkit.core.models.resolver import ReadAhead

log = logging.getLogger("torchkit")

# The largest thread count torch takes and the largest cuDNN benchmark limit: a C int each (a
# larger limit wraps, to 0 or below, silently; batches: inference.options.check_batch_fits).
C_INT_MAX = 2**31 - 1
MAX_THREADS = MAX_CUDNN_BENCHMARK_LIMIT = C_INT_MAX
# The longest --dist-timeout: torch keeps it in int64 nanoseconds (9.2e9 s), and a longer one
# wraps to a negative wait (or overflows timedelta) instead of waiting. 1e9 s is 31 years.
MAX_DIST_TIMEOUT_S = 1e9
# The smallest mixup / cutmix alpha torch's Beta(alpha, alpha) samples right (at 0.001 a
# quarter of its draws are 0.5; below float32's smallest number it raises).
MIN_MIX_ALPHA = 0.01
# The largest: torch's Beta holds alpha as a float32, whose largest is 3.4e38; above, alpha is
# inf and Beta(inf, inf) draws 1.2e-38 (the other image whole) instead of 0.5 (an even mix).
MAX_MIX_ALPHA = 3.4e38


# The options a fine-tuned torchkit checkpoint's recorded preprocessing gives when not set.
PREPROCESS_OPTIONS = ("image_size", "resize_size", "mean", "std", "interpolation", "crop_mode")


def resolve_defaults(
    config: TrainConfig,
    *,
    is_digits: bool,
    ahead: ReadAhead | None = None,
    not_given: Collection[str] = (),
) -> TrainConfig:
    """Fill the None options from the data and from what the model's weights were trained on
    (the input size, resize, mean/std, interpolation and crop mode a torchkit checkpoint
    records, or a timm model's pretrained config gives, weights loaded or not; mean/std 0.5 for
    torchvision's googlenet and inception_v3 weights); the names filled go into
    `data_defaults`. `ahead` reads the model's checkpoint, once for the model built later;
    `not_given`: see `validate`."""
    from torchkit.core.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD, resize_for_crop
    from torchkit.core.models.builders import (
        TRANSFORM_INPUT_MEAN_STD,
        takes_transform_input_mean_std,
    )

    table = DIGITS_DEFAULTS if is_digits else FOLDER_DEFAULTS
    chosen = {name: value for name, value in table.items() if getattr(config, name) is None}
    model = chosen.get("model", config.model)
    recorded = None  # what the model's weights were trained on
    if any(getattr(config, name) is None for name in PREPROCESS_OPTIONS):
        recorded = _model_preprocess(config, model, is_digits=is_digits, ahead=ahead)
    if config.interpolation is None:
        chosen["interpolation"] = (recorded or Preprocess()).interpolation
    if config.crop_mode is None:
        chosen["crop_mode"] = (recorded or Preprocess()).crop_mode
    if recorded is not None:
        # The weights' input size and resize ratio, as eval takes them, not the data's defaults
        # (a 12 px digits convnet at 224 px, a 384 px timm tag at 224 px).
        sizes = apply_overrides(
            recorded, image_size=config.image_size, resize_size=config.resize_size
        )
        for name in ("image_size", "resize_size"):
            if getattr(config, name) is None:
                chosen[name] = getattr(sizes, name)
    if config.resize_size is None and "resize_size" not in chosen:
        # digits: no centre crop; images: torchvision's 256/224 resize-then-crop ratio.
        image_size = chosen.get("image_size", config.image_size)
        chosen["resize_size"] = image_size if is_digits else resize_for_crop(image_size)
    resolved = dataclasses.replace(config, **chosen)
    mean, std = IMAGENET_MEAN, IMAGENET_STD
    if takes_transform_input_mean_std(str(config.model), config.weights):
        mean = std = TRANSFORM_INPUT_MEAN_STD  # what the weights expect (see builders)
    elif recorded is not None:  # what the weights were trained on
        mean, std = three_channels(recorded.mean, ()), three_channels(recorded.std, ())
    resolved.mean = three_channels(resolved.mean, mean)
    resolved.std = three_channels(resolved.std, std)
    # Recorded as chosen, as the data's choices are: a replay with another --model or --weights
    # chooses them again (a googlenet recipe's 0.5 is not resnet18's).
    normalization = [name for name in ("mean", "std") if getattr(config, name) is None]
    resolved.data_defaults = tuple(
        sorted(set(config.data_defaults) | set(chosen) | set(normalization))
    )
    validate(resolved, not_given=not_given)
    return resolved


def _model_preprocess(
    config: TrainConfig, model: str | None, *, is_digits: bool, ahead: ReadAhead | None
) -> Preprocess | None:
    """What the model's weights were trained on: the preprocessing recorded in a torchkit
    checkpoint (`--weights FILE`, or `--model FILE` without --weights), else, for
    `timm/NAME[.TAG]`, the pretrained config of its tag (the one `--weights DEFAULT|TAG`
    loads), also from random weights or a file that records nothing, as timm's train.py takes
    it (`resolve_data_config(model=...)`: the model's pretrained_cfg, whatever its weights);
    None for any other model, and for a timm model from random weights on `digits`, whose
    defaults are those of its 8 px images (a 224 px input would cost 350 times as much and
    match no weights)."""
    import os

    from torchkit.core.models.builders import is_checkpoint_path, is_timm_spec
    from torchkit.core.models.resolver import recorded_preprocess

    source = config.weights or str(model)
    if is_checkpoint_path(source):
        recorded = recorded_preprocess(
            source, trust_checkpoint=config.trust_checkpoint, ahead=ahead
        )
        if recorded is not None:
            _check_taken_values(recorded, config, source)
            return recorded
    if is_timm_spec(str(model)):
        from torchkit.core.models.timm_models import timm_weights_preprocess

        # A tag named by --weights, told from a weights file as the model builder tells them
        # (_build_timm).
        tag = config.weights if config.weights and not os.path.exists(config.weights) else None
        if tag is None and not config.weights and is_digits:
            return None
        return timm_weights_preprocess(str(model), tag)
    return None


def _check_taken_values(recorded: Preprocess, config: TrainConfig, source: str) -> None:
    """The recorded values the run takes (those its options leave unset) are usable: a damaged
    file's value is named with the file, never blamed on the option it stands in for."""
    given = [name for name in PREPROCESS_OPTIONS if getattr(config, name) is not None]
    stand_in = Preprocess(mean=(0.5,), std=(0.5,))  # usable values for those the options give
    taken = dataclasses.replace(recorded, **{name: getattr(stand_in, name) for name in given})
    taken.check(source)
    if config.interpolation is None and recorded.interpolation not in INTERPOLATIONS:
        raise UsageError(
            f"{source} records interpolation {recorded.interpolation!r}, which train does not "
            "resize with",
            "give --interpolation " + ", ".join(INTERPOLATIONS),
        )


def three_channels(
    values: tuple[float, ...] | None, default: tuple[float, ...]
) -> tuple[float, ...]:
    """Per-channel statistics for RGB input: one value stands for all three channels."""
    if values is None:
        return tuple(default)
    return tuple(values) * 3 if len(values) == 1 else tuple(values)


def fitted_to_this_machine(config: TrainConfig, names: Collection[str], whose: str) -> TrainConfig:
    """`config` with its --threads and --workers among `names` (values this command line did
    not give: a resumed run's own, a recipe's) chosen again, as without the option, where they
    are more than this machine can use, with a warning naming `whose` they were. Given on the
    command line, such a value is refused (`validate`); recorded on a larger machine, it only
    moves the run to this one (a run resumed on a laptop was refused for the --threads 32 it
    was started with)."""
    cores, workers = usable_cpus(), max_workers()
    bounds = {
        "threads": (cores, f"the {cores} core{'' if cores == 1 else 's'} this process may use"),
        "workers": (workers, f"this machine can use (at most {workers})"),
    }
    changes: dict[str, Any] = {}
    for name, (bound, room) in bounds.items():
        value = getattr(config, name)
        if name in names and value is not None and value > bound:
            flag = option_name(name)
            log.warning(
                "%s %s %d is more than %s: training with what a run without %s takes (give %s "
                "to choose)",
                *(whose, flag, value, room, flag, flag),
            )
            changes[name] = None
    return dataclasses.replace(config, **changes) if changes else config


def validate(config: TrainConfig, *, not_given: Collection[str] = ()) -> None:
    """Refuse contradictory or out-of-range options before anything is loaded; warn of
    options that work against each other. `not_given`: options this invocation did not give (a
    resumed run's own values), whose lack of effect is not warned of (`--no-amp` on a run
    trained with `--amp-dtype fp16`: that value is the run's, not an option given for nothing)."""
    check_finite(config)
    _check_names(config)
    _check_augmentation(config)
    _check_decoding(config)
    _check_precision_and_batches(config)
    _check_optimization(config)
    _check_data_and_preprocessing(config)
    _check_schedule(config)
    _check_seed_and_counts(config)
    check_ranges(config)  # each option's own bounds (OptionSpec), after the checks above
    _check_workers_and_threads(config)
    _check_find_lr(config)
    _check_cudnn_and_graphs(config)
    _check_dist_timeout(config)
    _warn_of_options_at_odds(config, not_given)


def _check_names(config: TrainConfig) -> None:
    """Options that name one of a list of choices."""
    if config.optimizer not in OPTIMIZERS:
        _refuse(f"unknown --optimizer {config.optimizer!r}", "use " + ", ".join(OPTIMIZERS))
    if config.scheduler not in SCHEDULERS:
        _refuse(f"unknown --scheduler {config.scheduler!r}", "use " + ", ".join(SCHEDULERS))
    if config.best_metric is not None and config.best_metric not in BEST_METRICS:
        _refuse(f"unknown --best-metric {config.best_metric!r}", "use " + ", ".join(BEST_METRICS))
    if config.augment not in AUGMENT_POLICIES:
        _refuse(f"unknown --augment {config.augment!r}", "use " + ", ".join(AUGMENT_POLICIES))
    if config.autoaugment_policy not in AUTOAUGMENT_POLICIES:
        _refuse(
            f"unknown --autoaugment-policy {config.autoaugment_policy!r}",
            "use " + ", ".join(AUTOAUGMENT_POLICIES),
        )
    if config.interpolation is not None and config.interpolation not in INTERPOLATIONS:
        _refuse(
            f"unknown --interpolation {config.interpolation!r}",
            "use " + ", ".join(INTERPOLATIONS),
        )
    if config.crop_mode is not None and config.crop_mode not in CROP_MODES:
        _refuse(f"unknown --crop-mode {config.crop_mode!r}", "use " + ", ".join(CROP_MODES))


def _check_augmentation(config: TrainConfig) -> None:
    """The strength of the augmentations, and AugMix's resampling."""
    if not 0 <= config.randaugment_magnitude <= 30:
        _refuse(f"--randaugment-magnitude must be in 0..30, not {config.randaugment_magnitude}")
    if not 1 <= config.augmix_severity <= 10:
        _refuse(f"--augmix-severity must be in 1..10, not {config.augmix_severity}")
    if config.augment == "augmix" and config.interpolation == "bicubic":
        # AugMix runs its operations on tensors, which torchvision resamples with nearest or
        # bilinear only: its shears and rotations would fail in the loader workers.
        # Not given, bicubic is what the model's weights were trained with (a timm tag's), or
        # at random init its pretrained config's.
        what = "--interpolation bicubic"
        if "interpolation" in config.data_defaults:
            from torchkit.core.models.builders import is_timm_spec

            what = "bicubic, the weights' interpolation"
            if config.weights is None and is_timm_spec(str(config.model)):
                what = "bicubic, the interpolation of the model's pretrained config"
        _refuse(
            f"--augment augmix cannot use {what} (torchvision's AugMix resamples with bilinear "
            "or nearest)",
            "give --interpolation bilinear, or another --augment",
        )


def _check_decoding(config: TrainConfig) -> None:
    """--decode and what it can run (the range of --random-erasing is checked after the
    device decoder's refusal of it), --decode-cpu-share."""
    if config.decode not in DECODE_CHOICES:
        _refuse(f"unknown --decode {config.decode!r}", "use " + ", ".join(DECODE_CHOICES))
    if config.decode == "device":
        from torchkit.core.data.device_decode import check_device_decode

        check_device_decode(config.augment, config.random_erasing)
    if not 0 <= config.random_erasing <= 1:
        _refuse(
            f"--random-erasing is a probability in [0, 1], not {show_value(config.random_erasing)}"
        )
    if not 0 <= config.decode_cpu_share <= 1:
        _refuse(
            f"--decode-cpu-share is a fraction in [0, 1], not {show_value(config.decode_cpu_share)}"
        )
    if config.decode_cpu_share > 0 and config.decode in ("fast", "exact"):
        _refuse(
            f"--decode-cpu-share shares the decoding with the device, and --decode "
            f"{config.decode} decodes nothing there",
            "use --decode device, or auto on CUDA",
        )


def _check_precision_and_batches(config: TrainConfig) -> None:
    """--amp-dtype, --epochs, the batch size and the accumulation."""
    if config.amp_dtype not in AMP_DTYPES:
        _refuse(f"unknown --amp-dtype {config.amp_dtype!r}", "use " + ", ".join(AMP_DTYPES))
    if config.epochs is not None and config.epochs < 1:
        _refuse(f"--epochs must be at least 1, not {config.epochs}")
    if config.batch_size is not None and config.batch_size < 1:
        _refuse(f"--batch-size must be at least 1, not {config.batch_size}")
    if config.batch_size is not None:
        check_batch_fits(config.batch_size)
    if config.accum_steps < 1:
        _refuse(f"--accum-steps must be at least 1, not {config.accum_steps}")


def _check_optimization(config: TrainConfig) -> None:
    """Learning rates, the optimiser, the loss, the mixing and the EMA."""
    if config.lr <= 0:
        _refuse(f"--lr must be positive, not {show_value(config.lr)}")
    if config.backbone_lr is not None and config.head_lr_mult is not None:
        _refuse("--backbone-lr and --head-lr-mult both set the head/backbone ratio", "give one")
    if config.backbone_lr is not None and config.backbone_lr < 0:
        _refuse(f"--backbone-lr must not be negative, not {show_value(config.backbone_lr)}")
    if config.head_lr_mult is not None and config.head_lr_mult <= 0:
        _refuse(f"--head-lr-mult must be positive, not {show_value(config.head_lr_mult)}")
    if config.freeze_backbone and (config.backbone_lr is not None):
        _refuse("--freeze-backbone trains no backbone, so --backbone-lr has nothing to do")
    if config.nesterov and (config.optimizer != "sgd" or config.momentum <= 0):
        _refuse(
            "--nesterov needs --optimizer sgd with a positive --momentum",
            "a run resumed with --momentum 0 needs --no-nesterov too",
        )
    if not 0 <= config.label_smoothing < 1:
        _refuse(f"--label-smoothing must be in [0, 1), not {show_value(config.label_smoothing)}")
    for name in ("mixup_alpha", "cutmix_alpha", "l1", "weight_decay", "min_lr", "warmup_epochs"):
        if getattr(config, name) < 0:
            _refuse(
                f"{option_name(name)} must not be negative, not {show_value(getattr(config, name))}"
            )
    for name in ("mixup_alpha", "cutmix_alpha"):
        alpha = getattr(config, name)
        if 0 < alpha < MIN_MIX_ALPHA:
            _refuse(
                f"{option_name(name)} {alpha} is too small: below {MIN_MIX_ALPHA} torch's Beta "
                "sampler draws 0.5 (the most mixing) instead of nearly 0 or 1, or fails",
                "0 turns it off",
            )
        if alpha > MAX_MIX_ALPHA:
            _refuse(
                f"{option_name(name)} {alpha:g} is too large: above {MAX_MIX_ALPHA:g} torch's "
                "Beta sampler draws nearly 0 (the other image whole) instead of 0.5",
                "an alpha of 100 already mixes nearly evenly",
            )
    if config.epochs is not None and config.warmup_epochs > config.epochs and not config.find_lr:
        _refuse(
            f"--warmup-epochs {show_value(config.warmup_epochs)} is longer than the run (--epochs "
            f"{config.epochs}): the learning rate would never reach --lr",
            "give at most --epochs",
        )
    if not 0 <= config.momentum < 1:
        _refuse(f"--momentum must be in [0, 1), not {show_value(config.momentum)}")
    if config.gamma is not None and not 0 < config.gamma <= 1:
        _refuse(f"--gamma is a decay factor: it must be in (0, 1], not {show_value(config.gamma)}")
    if config.min_lr > config.lr:
        _refuse(
            f"--min-lr {show_value(config.min_lr)} is larger than --lr {show_value(config.lr)}",
            "the schedule anneals from --lr down to --min-lr",
        )
    if config.clip_grad is not None and config.clip_grad <= 0:
        _refuse(f"--clip-grad must be positive, not {show_value(config.clip_grad)}")
    if not 0 < config.ema_decay < 1:
        _refuse(f"--ema-decay must be between 0 and 1, not {show_value(config.ema_decay)}")


def _check_data_and_preprocessing(config: TrainConfig) -> None:
    """The validation share, the crops and sizes (their memory), mean and std."""
    if config.val_split is not None and not 0 < config.val_split < 1:
        _refuse(f"--val-split must be between 0 and 1, not {show_value(config.val_split)}")
    if config.crop_scale is not None:
        low, high = config.crop_scale
        if not 0 < low <= high <= 1:
            _refuse(f"--crop-scale must satisfy 0 < MIN <= MAX <= 1, not {low} {high}")
    if config.image_size is not None and config.image_size < 1:
        _refuse(f"--image-size must be positive, not {config.image_size}")
    if config.train_crop_size is not None and config.train_crop_size < 1:
        _refuse(f"--train-crop-size must be positive, not {config.train_crop_size}")
    if config.image_size is not None or config.resize_size is not None:
        from torchkit.core.data.preprocessing import check_image_memory

        given = [("--image-size", config.image_size), ("--resize-size", config.resize_size)]
        option, side = max(((o, v) for o, v in given if v is not None), key=lambda ov: ov[1])
        shown = f"{option} {short_repr(side)}"
        if option == "--resize-size" and "resize_size" in config.data_defaults:
            # The resize follows the crop (its ratio): name the option the user gave, as
            # eval's check does (preprocessing.check_fits_in_memory).
            shown = f"--image-size {config.image_size} (resized to {short_repr(side)} first)"
        check_image_memory(side, 3, shown)
    if (
        config.resize_size is not None
        and config.image_size is not None
        and config.resize_size < config.image_size
        # The weights' own ratio may pad the crop (timm's crop_pct above 1): eval takes it too.
        and "resize_size" not in config.data_defaults
    ):
        _refuse(
            f"--resize-size {config.resize_size} is smaller than --image-size {config.image_size}",
            "the centre crop must fit inside the resized image",
        )
    for name in ("mean", "std"):
        values = getattr(config, name)
        if values is not None and len(values) not in (1, 3):
            _refuse(f"--{name} takes 3 values (one per RGB channel) or 1, not {len(values)}")
    if config.std is not None and any(v <= 0 for v in config.std):
        _refuse("--std values must be positive")
    if config.mean is not None and config.std is not None:
        check_normalization(config.mean, config.std)


def _check_schedule(config: TrainConfig) -> None:
    """The milestones a multistep schedule needs."""
    if config.scheduler == "multistep" and not config.milestones:
        _refuse("--scheduler multistep needs --milestones", milestones_example(config.epochs))
    if any(milestone < 1 for milestone in config.milestones):
        given = ",".join(map(str, config.milestones))
        _refuse(
            f"--milestones are the epochs after which the learning rate drops, from 1: not {given}",
            milestones_example(config.epochs),
        )


def milestones_example(epochs: int | None) -> str:
    """An example --milestones within a run of `epochs` (None: not chosen yet): after half and
    three quarters of it (`30,60` in a run of 2 epochs never drops the rate, and warns so)."""
    if epochs is None:
        return "e.g. --milestones 30,60"
    drops = sorted({max(1, epochs // 2), max(1, epochs * 3 // 4)})
    return f"e.g. --milestones {','.join(map(str, drops))} for a run of {epochs} epochs"


def _check_seed_and_counts(config: TrainConfig) -> None:
    """The seed, the step size and the counts that must not be negative."""
    check_seed(config.seed)
    if config.step_size < 1:
        _refuse(f"--step-size must be at least 1, not {config.step_size}")
    for name in ("save_every", "keep", "early_stop", "patience", "profile_steps"):
        if getattr(config, name) < 0:
            _refuse(f"{option_name(name)} must not be negative")


def _check_workers_and_threads(config: TrainConfig) -> None:
    """Loader workers and torch threads, against what this process may use."""
    if config.workers is not None and config.workers < 0:
        _refuse(f"--workers must not be negative, not {config.workers}")
    check_workers(config.workers)
    if config.threads is not None and config.threads < 0:
        _refuse(f"--threads must not be negative, not {config.threads}", "0 is torch's default")
    if config.threads is not None and config.threads > MAX_THREADS:
        _refuse(f"--threads {config.threads} is more than torch takes ({MAX_THREADS})")
    cores = usable_cpus()
    if config.threads is not None and config.threads > cores:
        # Torch's threads meet at a barrier after each operation: more than the cores means
        # some wait for the scheduler at every one (1000 on 2 cores trained about 5x slower).
        # Refused, as too many --workers are, rather than run slow (a warning did) or on fewer
        # threads than asked (other numbers than the count given computes).
        _refuse(
            f"--threads {config.threads} is more than the {cores} core{'' if cores == 1 else 's'}"
            " this process may use: the extra threads would only wait for each other and slow "
            "every step down",
            f"give at most {cores}, or 0 for one per core",
        )


def _check_find_lr(config: TrainConfig) -> None:
    """--find-lr's range and what it cannot be combined with."""
    if config.find_lr:
        if not 0 < config.lr_min < config.lr_max:
            _refuse(
                f"--lr-min {show_value(config.lr_min)} and --lr-max "
                f"{show_value(config.lr_max)}: need 0 < MIN < MAX"
            )
        if config.find_lr_iters < 2:
            _refuse(f"--find-lr-iters must be at least 2, not {config.find_lr_iters}")
        if config.resume is not None:
            _refuse("--find-lr starts from the model's weights; it does not continue a run")
        if config.profile_steps:
            _refuse("--profile-steps profiles training epochs, and --find-lr trains none")


def _check_cudnn_and_graphs(config: TrainConfig) -> None:
    """cuDNN's autotuning, and --cuda-graphs."""
    if config.cudnn_benchmark and config.deterministic:
        _refuse(
            "--cudnn-benchmark picks algorithms by timing them, which --deterministic rules out",
            "drop one of the two",
        )
    # Not refused with the autotuning off: a resumed run keeps its limit when given
    # --no-cudnn-benchmark, and there is no value that says "none".
    if config.cudnn_benchmark_limit is not None and config.cudnn_benchmark_limit < 0:
        _refuse(f"--cudnn-benchmark-limit must not be negative, not {config.cudnn_benchmark_limit}")
    if (config.cudnn_benchmark_limit or 0) > MAX_CUDNN_BENCHMARK_LIMIT:
        _refuse(
            f"--cudnn-benchmark-limit {config.cudnn_benchmark_limit} is more than cuDNN takes "
            f"({MAX_CUDNN_BENCHMARK_LIMIT})",
            "0 times all of its algorithms",
        )
    if config.cuda_graphs:
        _check_graphable(config)


def _check_dist_timeout(config: TrainConfig) -> None:
    """--dist-timeout, within what torch can wait."""
    if not config.dist_timeout > 0:
        _refuse(
            "--dist-timeout must be a positive number of seconds, not "
            f"{show_value(config.dist_timeout)}"
        )
    if config.dist_timeout > MAX_DIST_TIMEOUT_S:
        _refuse(
            f"--dist-timeout {config.dist_timeout:g} is longer than torch can wait "
            f"({MAX_DIST_TIMEOUT_S:g} s)"
        )


def _warn_of_options_at_odds(config: TrainConfig, not_given: Collection[str]) -> None:
    """Warn of options that work against each other or have no effect; `not_given` as
    `validate` takes it."""
    if config.balanced_sampler and config.class_weights != "none":
        log.warning(
            "--class-weights %s and --balanced-sampler both correct the class imbalance: "
            "together they over-correct (rare classes end up outweighing common ones); use one "
            "of them",
            config.class_weights,
        )
    if not config.find_lr:  # --find-lr has its own note of what it ignores
        for name, users in unused_options(config):
            if name in not_given:
                continue
            log.warning(
                "%s %s has no effect: only %s uses it%s",
                option_name(name),
                show_value(getattr(config, name)),
                users,
                _meant_instead(name, config),
            )
        _warn_of_drops_after_the_run(config)


def _refuse(message: str, hint: str | None = None) -> NoReturn:
    raise UsageError(message, hint)


def _warn_of_drops_after_the_run(config: TrainConfig) -> None:
    """Warn of a step or multistep schedule whose drops all come after the last epoch (epoch
    indices from 0: a drop after epoch N needs more than N epochs). Not refused: a --resume to
    more epochs later reaches them."""
    if config.epochs is None:  # not resolved yet
        return
    if config.scheduler == "multistep":
        late = [m for m in sorted(config.milestones) if m >= config.epochs]
        if late:
            log.warning(
                "--milestones %s: the run ends after --epochs %d, before the learning rate "
                "drops after epoch %s (it drops there only in a run resumed to more epochs)",
                ",".join(map(str, config.milestones)),
                config.epochs,
                ",".join(map(str, late)),
            )
    elif config.scheduler == "step" and config.step_size >= config.epochs:
        log.warning(
            "--step-size %d: the run ends after --epochs %d, before the learning rate first "
            "drops (after epoch %d), so it never drops in this run",
            config.step_size,
            config.epochs,
            config.step_size,
        )


# The options only some schedules read, and those schedules.
SCHEDULER_USERS = {
    "min_lr": ("cosine",),
    "step_size": ("step",),
    "milestones": ("multistep",),
    "gamma": ("step", "multistep", "exponential", "plateau"),
    "patience": ("plateau",),
}


def unused_options(config: TrainConfig) -> list[tuple[str, str]]:
    """The options of a resolved `config` set away from their defaults that the rest of it
    leaves without effect (a --patience for a cosine schedule), each with what would use it."""
    unused = []
    for name, kinds in SCHEDULER_USERS.items():
        if config.scheduler not in kinds:
            named = ", ".join(kinds[:-1]) + " or " + kinds[-1] if len(kinds) > 1 else kinds[0]
            unused.append((name, f"--scheduler {named}"))
    if not config.ema:
        unused.append(("ema_decay", "--ema"))
    if config.augment != "randaugment":
        unused.append(("randaugment_magnitude", "--augment randaugment"))
    if config.augment != "augmix":
        unused.append(("augmix_severity", "--augment augmix"))
    if config.augment != "autoaugment":
        unused.append(("autoaugment_policy", "--augment autoaugment"))
    if config.augment == "none":  # resize and centre crop: no random crop, no flip
        random_crop = "a random crop (--augment other than none)"
        unused += [(name, random_crop) for name in ("crop_scale", "flip", "train_crop_size")]
    if config.batch_size == 1:  # a batch is mixed with itself reversed: one image, nothing
        pairs = "a --batch-size of 2 or more (a batch mixes its own images)"
        unused += [("mixup_alpha", pairs), ("cutmix_alpha", pairs)]
    if not config.save_every:  # only epoch-NNN.pt files are pruned
        unused.append(("keep", "--save-every"))
    if config.optimizer in ("adam", "adamw"):
        unused.append(("momentum", "--optimizer sgd or rmsprop"))
    if not config.weight_decay:
        unused.append(("decay_all", "a positive --weight-decay"))
    if not config.amp:
        unused.append(("amp_dtype", "--amp"))
    if not config.find_lr:
        unused += [(name, "--find-lr") for name in ("lr_min", "lr_max", "find_lr_iters")]
    moved = set(set_away_from_defaults(config, [name for name, _ in unused]))
    return [(name, users) for name, users in unused if name in moved]


def _meant_instead(name: str, config: TrainConfig) -> str:
    """The end of an unused option's warning naming the option a user likely meant:
    torchvision's reference script spells the cosine schedule's floor --lr-min, which here is
    --find-lr's first lr."""
    if name != "lr_min":
        return ""
    if config.scheduler == "cosine":
        return "; the cosine schedule's final lr is --min-lr"
    return "; --min-lr is the final lr of --scheduler cosine"


def set_away_from_defaults(config: TrainConfig, names: Iterable[str]) -> list[str]:
    """The `names` whose value in `config` is not TrainConfig's default (a config file's list
    is the default's tuple when their items are), nor one the data chose (`data_defaults`)."""
    defaults = {f.name: f.default for f in fields(TrainConfig)}

    def moved(name: str) -> bool:
        if name in config.data_defaults:
            return False
        value, default = getattr(config, name), defaults.get(name)
        if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
            return tuple(value) != tuple(default)
        return value != default

    return [name for name in names if moved(name)]


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
            "cannot use --mixup-alpha or --cutmix-alpha: they draw on the host at each step",
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
                shown = show_value(value)
                spec = TRAIN_OPTIONS.get(f.name)
                low, high = (spec.minimum, spec.maximum) if spec else (None, None)
                raise UsageError(
                    f"{option_name(f.name)} must be a finite number, not {shown}",
                    not_finite_hint(low, high),
                )


def show_value(value: Any) -> str:
    """An option's value as the command line gives it: `5` for --warmup-epochs 5 (a float
    option, held as 5.0), `on`/`off` for a flag."""
    if isinstance(value, (tuple, list)):
        return " ".join(show_value(v) for v in value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)
