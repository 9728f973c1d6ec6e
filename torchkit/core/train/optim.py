"""Parameter groups, the optimiser and the learning-rate schedule.

Groups: weight decay only on the weights of convolutions and linear layers, not on biases and
normalisation parameters (decaying those only hurts; `--decay-all` turns it off), and the
classifier head apart from the backbone so it can get a larger learning rate.

The schedule is a pure function of the optimiser update count (plus the plateau state), set on
every update: warm-up ramps linearly per iteration, cosine anneals per iteration, step /
multistep / exponential decay at epoch boundaries (their options are in epochs), plateau decays
after `patience` epochs without a better validation metric (--best-metric). Resuming restores
it exactly.
"""

from __future__ import annotations

import fnmatch
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchkit.core.train.config import TrainConfig

log = logging.getLogger("torchkit")

NORM_TYPES_NAMES = ("BatchNorm", "GroupNorm", "LayerNorm", "InstanceNorm", "LocalResponseNorm")


@dataclass
class ParamGroupSpec:
    name: str  # backbone/head + decay/no_decay
    params: list
    names: list[str]
    lr: float
    weight_decay: float


def _is_norm(module: Any) -> bool:
    from torch import nn

    norms = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)
    return isinstance(module, norms) or any(n in type(module).__name__ for n in NORM_TYPES_NAMES)


def no_decay_names(model: Any, *, patterns: bool = True) -> set[str]:
    """Parameters that get no weight decay: biases, normalisation weights, and every other
    parameter of one dimension (scales, offsets); plus what the model's `no_weight_decay()`
    names (position embeddings and class tokens of vision transformers): a parameter's full
    name, a pattern of them (XCiT's `pos_embed.*`, read with fnmatch as timm reads it) or the
    last part of its name. `patterns=False`: the rule of torchkit before it read patterns,
    whose runs decayed what a pattern names (resuming one moves its optimiser state)."""
    names: set[str] = set()
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        for param_name, param in module.named_parameters(recurse=False):
            if param.ndim <= 1 or param_name == "bias" or _is_norm(module):
                names.add(prefix + param_name)
    extra = getattr(model, "no_weight_decay", None)
    if callable(extra):
        wanted = set(extra())
        # Strings only: fnmatch raises on anything else (which never named a parameter).
        globs = [name for name in wanted if isinstance(name, str)] if patterns else []
        names |= {
            n
            for n, _ in model.named_parameters()
            if n in wanted
            or n.split(".")[-1] in wanted
            or any(fnmatch.fnmatchcase(n, pattern) for pattern in globs)
        }
    return names


def backbone_trains(config: TrainConfig) -> bool:
    """Whether the backbone's weights train: not with --freeze-backbone, nor at --backbone-lr 0,
    where its parameters need no gradients (computing them only costs backward time and
    memory). Only --freeze-backbone also keeps its normalisation statistics
    (`frozen_norms_to_eval`): at lr 0 they go on following the data, as in timm or torch."""
    return not config.freeze_backbone and config.backbone_lr != 0


def freeze_backbone(model: Any) -> int:
    """requires_grad=False on everything but the heads; returns the number frozen."""
    from torchkit.core.models.heads import head_names, in_heads

    heads = head_names(model)
    frozen = 0
    for name, param in model.named_parameters():
        if not in_heads(name, heads):
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def frozen_norms_to_eval(model: Any) -> Callable[[], None]:
    """What keeps the normalisation layers of a frozen backbone in eval mode (call it after
    every `model.train()`), so their running statistics stay those of the pretrained weights
    (frozen means frozen). The layers are found once: finding the head copies the structure of
    a timm model."""
    from torchkit.core.models.heads import head_names, in_heads

    heads = head_names(model)
    norms = [m for n, m in model.named_modules() if n and not in_heads(n, heads) and _is_norm(m)]

    def to_eval() -> None:
        for module in norms:
            module.eval()

    return to_eval


def param_groups(
    model: Any,
    config: TrainConfig,
    heads: Sequence[str] | None = None,
    skip_decay: set[str] | None = None,
) -> list[ParamGroupSpec]:
    """Backbone and head groups, each split into decayed and not decayed parameters (the head:
    `heads`, module names, by default `head_names`: every layer timm makes anew for new
    classes, both heads of a distilled DeiT or LeViT; not decayed: `skip_decay`, parameter
    names, by default `no_decay_names`, none with --decay-all). A backbone that does not train
    (`backbone_trains`) has no group."""
    from torchkit.core.models.heads import head_names, in_heads

    heads = head_names(model) if heads is None else heads
    backbone = backbone_trains(config)
    if skip_decay is None:
        skip_decay = set() if config.decay_all else no_decay_names(model)
    head_lr, backbone_lr = config.lr, config.lr
    if config.backbone_lr is not None:
        backbone_lr = config.backbone_lr
    if config.head_lr_mult is not None:
        head_lr = config.lr * config.head_lr_mult
    buckets: dict[str, ParamGroupSpec] = {}
    for name, param in model.named_parameters():
        part = "head" if in_heads(name, heads) else "backbone"
        # A frozen backbone has no group, also when `heads` are not those it was frozen by.
        if not param.requires_grad or (part == "backbone" and not backbone):
            continue
        decay = name not in skip_decay
        key = f"{part}_{'decay' if decay else 'no_decay'}"
        if key not in buckets:
            buckets[key] = ParamGroupSpec(
                name=key,
                params=[],
                names=[],
                lr=head_lr if part == "head" else backbone_lr,
                weight_decay=config.weight_decay if decay else 0.0,
            )
        buckets[key].params.append(param)
        buckets[key].names.append(name)
    order = ("backbone_decay", "backbone_no_decay", "head_decay", "head_no_decay")
    return [buckets[k] for k in order if k in buckets and buckets[k].lr > 0]


def build_optimizer(groups: list[ParamGroupSpec], config: TrainConfig):
    """The optimiser over `groups`; each group remembers its `base_lr` for the schedule."""
    import torch

    from torchkit.core.io.errors import UsageError

    if not groups:
        raise UsageError("no parameters to train", "did --freeze-backbone freeze everything?")
    torch_groups = [
        {
            "params": g.params,
            "lr": g.lr,
            "base_lr": g.lr,
            "weight_decay": g.weight_decay,
            "group_name": g.name,
        }
        for g in groups
    ]
    params = [param for group in groups for param in group.params]
    # Fused kernels: one call per step instead of a dozen tensor ops per parameter (on CPU the
    # default single-tensor AdamW step took 2.1 ms for the convnet, fused 0.5 ms; same values).
    fused = {"fused": True} if _fused_supported(config.optimizer, params) else {}
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            torch_groups, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov, **fused
        )
    if config.optimizer == "adam":
        return torch.optim.Adam(torch_groups, lr=config.lr, **fused)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(torch_groups, lr=config.lr, **fused)
    return torch.optim.RMSprop(torch_groups, lr=config.lr, momentum=config.momentum, alpha=0.9)


def _fused_supported(optimizer: str, params: list) -> bool:
    """torch has fused SGD/Adam/AdamW steps for floating-point parameters on CPU and CUDA."""
    import torch

    floating = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
    return optimizer in ("sgd", "adam", "adamw") and all(
        p.device.type in ("cpu", "cuda") and p.dtype in floating and not p.is_sparse for p in params
    )


# The hyperparameters of a parameter group that come from the options (not from the state).
OPTION_KEYS = ("base_lr", "weight_decay", "momentum", "nesterov")


def load_optimizer_state(optimizer, state: dict) -> None:
    """Load a checkpoint's optimiser state (moments, step counts) into `optimizer`, keeping
    the hyperparameters `optimizer` was built with: torch's `load_state_dict` also restores
    every group's lr, weight decay and momentum as saved, which would train a run resumed with
    a new --lr, --weight-decay or --momentum with the old values. (The lr itself is set by the
    schedule from `base_lr`.) ValueError when the groups do not correspond."""
    wanted = [{k: g[k] for k in OPTION_KEYS if k in g} for g in optimizer.param_groups]
    names = [g.get("group_name") for g in optimizer.param_groups]
    saved_names = [g.get("group_name") for g in state.get("param_groups", [])]
    if None not in saved_names and saved_names != names:
        raise ValueError(
            f"its parameter groups are {', '.join(saved_names)}, this run's {', '.join(names)}"
        )
    _check_state_shapes(optimizer, state)
    optimizer.load_state_dict(state)
    for group, values in zip(optimizer.param_groups, wanted, strict=True):
        group.update(values)
    _match_momentum_buffers(optimizer)


def _check_state_shapes(optimizer, state: dict) -> None:
    """ValueError where a parameter's saved moments are not of its shape, or its step count
    not one number: torch's `load_state_dict` takes them as they are, and the first step then
    read past them (a damaged checkpoint crashed the process: segmentation fault). Groups that
    do not correspond are left to `load_state_dict`'s own ValueError."""
    import torch

    saved = state.get("state")
    groups = state.get("param_groups")
    if not isinstance(saved, Mapping) or not isinstance(groups, list):
        raise ValueError("it holds no per-parameter state and parameter groups")
    indexes = [i for group in groups if isinstance(group, Mapping) for i in group.get("params", [])]
    params = [param for group in optimizer.param_groups for param in group["params"]]
    if len(indexes) != len(params):
        return
    for number, (index, param) in enumerate(zip(indexes, params, strict=True)):
        values = saved.get(index, {})
        for name, value in values.items() if isinstance(values, Mapping) else ():
            if not isinstance(value, torch.Tensor):
                continue
            fits = value.numel() == 1 if name == "step" else value.shape == param.shape
            if not fits:
                raise ValueError(
                    f"its {name} of parameter {number} is of shape {tuple(value.shape)}, "
                    f"the parameter of shape {tuple(param.shape)}"
                )


def _match_momentum_buffers(optimizer) -> None:
    """The momentum buffers of a run resumed with another --momentum, as at a first step.

    RMSprop keeps a buffer only while its momentum is on, and its step reads one for every
    parameter that has a state: a run trained with --momentum 0 and resumed with a momentum
    gets zero buffers (SGD starts a missing one itself). Resumed with --momentum 0, the
    buffers are dropped: torch leaves them as they were, and a later resume with a momentum
    would start from the direction of the epochs before the pause (up to 1 / (1 - momentum)
    times a gradient) instead of afresh."""
    import torch

    if not isinstance(optimizer, (torch.optim.SGD, torch.optim.RMSprop)):
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param)
            if not state:
                continue
            if group["momentum"] <= 0:
                state.pop("momentum_buffer", None)
            elif isinstance(optimizer, torch.optim.RMSprop) and "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(
                    param, memory_format=torch.preserve_format
                )


def warn_if_warmup_too_short(config: TrainConfig, updates_per_epoch: int) -> None:
    """A warm-up of under 1.5 updates rounds to 0 or 1 update, and the ramp starts at 1/that:
    the first update already runs at the full lr. Say so, once, before the run (as for the other
    options that have no effect, only when given: the default on a tiny dataset is not)."""
    from torchkit.core.train.validation import set_away_from_defaults

    updates = config.warmup_epochs * max(1, updates_per_epoch)
    given = set_away_from_defaults(config, ["warmup_epochs"])
    if given and config.warmup_epochs > 0 and round(updates) < 2:
        log.warning(
            "--warmup-epochs %g is %g optimizer update(s): too short to ramp the learning "
            "rate; give at least 2 updates' worth or 0",
            config.warmup_epochs,
            updates,
        )


def warn_if_accumulating_past_an_epoch(config: TrainConfig, steps_per_epoch: int) -> None:
    """An --accum-steps beyond the batches of an epoch: each epoch makes one update, of all its
    batches (its last update takes the batches left, as timm's and Lightning's do). Not
    refused, as they do not: said, so that a run of one update an epoch is not taken for the
    number of updates asked for."""
    if config.accum_steps > steps_per_epoch > 0:
        batches = f"{steps_per_epoch:,} batch{'' if steps_per_epoch == 1 else 'es'}"
        log.warning(
            "--accum-steps %s is more than the %s of an epoch: each epoch makes one optimizer "
            "update, of its %s",
            f"{config.accum_steps:,}",
            batches,
            batches,
        )


class LRSchedule:
    """Sets each group's lr to base_lr x factor(update) after every optimiser update.

    `updates_per_epoch` is the number of optimiser updates in one epoch (batches / accum).
    """

    def __init__(self, optimizer, config: TrainConfig, updates_per_epoch: int) -> None:
        self.optimizer = optimizer
        self.kind = config.scheduler
        self.epochs = config.epochs
        self.per_epoch = max(1, updates_per_epoch)
        self.warmup = int(round(config.warmup_epochs * self.per_epoch))
        self.total = config.epochs * self.per_epoch
        self.gamma = config.gamma_value()
        self.step_size = config.step_size
        self.milestones = sorted(config.milestones)
        self.patience = config.patience
        self.min_lr = config.min_lr
        self.base_lr = config.lr
        self.updates = 0
        # Plateau state: best validation metric, epochs without a better one, current scale.
        self.plateau_best: float | None = None
        self.plateau_bad = 0
        self.plateau_scale = 1.0
        self._apply()

    def factor(self, update: int) -> float:
        """Multiplier of the base lr for optimiser update number `update` (0-based)."""
        ramp = min(1.0, (update + 1) / self.warmup) if self.warmup > 0 else 1.0
        epoch = update // self.per_epoch
        if self.kind == "cosine":
            span = max(1, self.total - self.warmup)
            t = min(max(update - self.warmup, 0), span) / span
            floor = self.min_lr / self.base_lr if self.base_lr > 0 else 0.0
            decay = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))
        elif self.kind == "step":
            decay = self.gamma ** (epoch // self.step_size)
        elif self.kind == "multistep":
            decay = self.gamma ** sum(1 for m in self.milestones if epoch >= m)
        elif self.kind == "exponential":
            decay = self.gamma**epoch
        elif self.kind == "plateau":
            decay = self.plateau_scale
        else:
            decay = 1.0
        return ramp * decay

    def _apply(self) -> None:
        scale = self.factor(self.updates)
        for group in self.optimizer.param_groups:
            group["lr"] = group["base_lr"] * scale

    def step(self) -> None:
        """Call after each optimiser update: sets the lr for the next one."""
        self.updates += 1
        self._apply()

    def epoch_end(self, metric: float | None, *, higher_is_better: bool = True) -> None:
        """Plateau: a validation metric not better than the best for `patience` + 1 epochs in a
        row multiplies the lr by gamma (ReduceLROnPlateau with threshold 1e-4, relative)."""
        if self.kind != "plateau" or metric is None:
            return
        best = self.plateau_best
        if higher_is_better:
            improved = best is None or metric > best * (1 + 1e-4)
        else:
            improved = best is None or metric < best * (1 - 1e-4)
        if improved:
            self.plateau_best = metric
            self.plateau_bad = 0
        else:
            self.plateau_bad += 1
            if self.plateau_bad > self.patience:
                self.plateau_scale *= self.gamma
                self.plateau_bad = 0
        self._apply()

    def continue_at(self, update: int) -> None:
        """Go on from optimiser update number `update` (0-based) of this schedule."""
        self.updates = update
        self._apply()

    def current_lr(self) -> float:
        """The lr of the first group: the backbone's, or the head's when the backbone does not
        train (--freeze-backbone, --backbone-lr 0)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self) -> dict:
        return {
            "updates": self.updates,
            "plateau_best": self.plateau_best,
            "plateau_bad": self.plateau_bad,
            "plateau_scale": self.plateau_scale,
        }

    def load_state_dict(self, state: dict) -> None:
        self.updates = int(state["updates"])
        self.plateau_best = state.get("plateau_best")
        self.plateau_bad = int(state.get("plateau_bad", 0))
        self.plateau_scale = float(state.get("plateau_scale", 1.0))
        self._apply()
