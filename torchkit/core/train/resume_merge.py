"""`--resume`'s options: the saved run's, with the options given again where they may change."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from torchkit.core.io.errors import CheckpointError, UsageError
from torchkit.core.io.shell_words import shell_word
from torchkit.core.train.config import TRAIN_OPTIONS, TrainConfig
from torchkit.core.train.defaults import with_pre_option_values
from torchkit.core.train.resume_rules import (
    CHOSEN_FOR_THE_MACHINE,
    FIXED_ON_RESUME,
    IGNORED_ON_RESUME,
    NEW_RUN_ONLY,
)
from torchkit.core.train.validation import option_name, show_value, three_channels


def merge_for_resume(
    saved: Mapping[str, Any],
    config: TrainConfig,
    overrides: Collection[str] | None,
    resumed_from: Path | None = None,
) -> TrainConfig:
    """The saved run's options, with `overrides` (option names) taken from `config`.

    With `overrides` None, every option of `config` that differs from the default counts as
    given. An option of FIXED_ON_RESUME given with another value than the checkpoint's is a
    CheckpointError naming both values; --weights is a UsageError. `resumed_from`: the
    checkpoint resumed, whose run's weights the refusals' hints name.
    """
    new_run = _new_run_hint(resumed_from)
    base = TrainConfig.from_dict(with_pre_option_values(saved))
    known = TRAIN_OPTIONS.keys()
    overrides = given_options(config, overrides)
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
                f"the checkpoint was trained with {option_name(name)} {_shown(name, old)}, "
                f"not {show_value(value)}",
                f"{option_name(name)} cannot change on resume: {FIXED_ON_RESUME[name]}; drop "
                f"it to continue the run, or {new_run}",
            )
        changes[name] = value
    _one_ratio(changes)
    merged = dataclasses.replace(base, **changes)
    _refuse_backbone_lr_to_or_from_zero(base, merged, new_run)
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


def given_options(config: TrainConfig, overrides: Collection[str] | None) -> list[str]:
    """The options given again to a resumed run: `overrides`, or (None) those of `config` that
    differ from the defaults."""
    if overrides is not None:
        return list(overrides)
    defaults = TrainConfig()
    return [name for name in TRAIN_OPTIONS if getattr(config, name) != getattr(defaults, name)]


# Both set the head/backbone ratio (only one may be given): one given again replaces the run's.
RATIO_OPTIONS = ("backbone_lr", "head_lr_mult")


def _one_ratio(changes: dict[str, Any]) -> None:
    """The run's --backbone-lr or --head-lr-mult unset when the other is given again (they
    both set the ratio: kept, the two were refused as given together)."""
    for given, other in (RATIO_OPTIONS, RATIO_OPTIONS[::-1]):
        if changes.get(given) is not None and other not in changes:
            changes[other] = None


def _new_run_hint(resumed_from: Path | None) -> str:
    """How to start a new run from the resumed run's weights, naming the file to give (its
    best.pt where there is one, else the checkpoint resumed) so the hint works as written."""
    if resumed_from is None:
        return "start a new run from its weights with --weights"
    from torchkit.core.train.checkpoints import BEST

    best = resumed_from.parent / BEST
    weights = best if best.is_file() else resumed_from
    return f"start a new run from its weights with --weights {shell_word(weights)} --out NEW"


def _refuse_backbone_lr_to_or_from_zero(
    base: TrainConfig, merged: TrainConfig, new_run: str
) -> None:
    """--backbone-lr may change on resume, but not to or from 0: at 0 the backbone is frozen
    and has no parameter group, so the optimiser state is not of the parameters that would
    train (refused here, before any work, not when the state does not load)."""
    if (base.backbone_lr == 0) == (merged.backbone_lr == 0):
        return
    option, value = "--backbone-lr", show_value(merged.backbone_lr)
    if merged.head_lr_mult is not None:  # given instead (`_one_ratio`)
        option = "--head-lr-mult"
        value = f"{option} {show_value(merged.head_lr_mult)}"
    raise CheckpointError(
        f"the checkpoint was trained with --backbone-lr {show_value(base.backbone_lr)}, not "
        f"{value}",
        "--backbone-lr cannot change to or from 0 on resume: the optimizer state is of the "
        f"parameters that trained, and at 0 the backbone does not train; drop {option} to "
        f"continue the run, or {new_run}",
    )


def _shown(name: str, old: Any) -> str:
    """The saved value as the run used it: a run not given --val-split held out the default
    share, which "unset" would hide."""
    if name == "val_split" and old is None:
        from torchkit.core.data.sources.select import DEFAULT_VAL_SPLIT

        return f"{show_value(DEFAULT_VAL_SPLIT)} (the default)"
    return show_value(old)


def _same(name: str, value: Any, old: Any) -> bool:
    """Equal as the run would use them (one --mean value stands for three; a run not given
    --val-split held out the default share)."""
    if name == "val_split":
        from torchkit.core.data.sources.select import DEFAULT_VAL_SPLIT

        return (DEFAULT_VAL_SPLIT if value is None else value) == (
            DEFAULT_VAL_SPLIT if old is None else old
        )
    if name in ("mean", "std") and value is not None and old is not None:
        return three_channels(tuple(value), ()) == three_channels(tuple(old), ())
    if isinstance(value, (tuple, list)) and isinstance(old, (tuple, list)):
        return tuple(value) == tuple(old)
    return value == old
