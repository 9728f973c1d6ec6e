"""Resuming a run that an earlier torchkit trained with fewer layers as the head.

torchkit 0.1.0 first trained as the head only the layer `find_head` names (of a distilled DeiT
`head_dist`, of LeViT `head_dist.linear`), then every classifier the output is made from
(`classifier_heads`), now every layer timm makes anew for new classes (`head_names`). The
optimiser state of such a run has parameter groups of other sizes than this version builds:
when it fits the groups an earlier rule makes, each parameter's state (moments, step counts)
is moved by parameter name onto this run's groups, and the run goes on. So also for a run that
an earlier torchkit decayed what the model's `no_weight_decay()` names by a pattern (XCiT's
`pos_embed.*`), alone or with an earlier head rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchkit.core.train.config import TrainConfig
from torchkit.core.train.optim import ParamGroupSpec, param_groups


@dataclass
class EarlierHeads:
    """An optimiser state moved onto this run's groups, the heads it was saved with, and the
    parameters it decayed that this run does not (none: the same as now)."""

    state: dict
    heads: list[str]
    decayed: list[str]


def state_under_earlier_heads(
    state: dict, *, model: Any, config: TrainConfig, groups: Sequence[ParamGroupSpec], optimizer
) -> EarlierHeads | None:
    """`state` (a checkpoint's optimiser state that does not fit `optimizer`, built over
    `groups`) for `optimizer`, when its groups are those an earlier head or weight-decay rule
    makes of `model` with `config`'s options, every parameter's state of its parameter's
    shape; else None."""
    saved, states = state.get("param_groups", []), state.get("state", {})
    layout = [(group.get("group_name"), len(group.get("params", ()))) for group in saved]
    now = [(spec.name, len(spec.params)) for spec in groups]
    for heads, skip_decay in _earlier_rules(model, config):
        earlier = param_groups(model, config, heads, skip_decay)
        shape = [(spec.name, len(spec.params)) for spec in earlier]
        if shape != layout or shape == now:  # the same groups as now: not why it did not fit
            continue
        by_name = {
            name: states[index]
            for group, spec in zip(saved, earlier, strict=True)
            for index, name in zip(group["params"], spec.names, strict=True)
            if index in states
        }
        moved = _renumbered(by_name, groups, config)
        if moved is not None:
            current = optimizer.state_dict()["param_groups"]
            decayed = sorted(_decayed(earlier) - _decayed(groups))
            return EarlierHeads({"state": moved, "param_groups": current}, heads, decayed)
    return None


def _decayed(groups: Sequence[ParamGroupSpec]) -> set[str]:
    return {name for spec in groups if spec.weight_decay for name in spec.names}


def _earlier_rules(model: Any, config: TrainConfig) -> list[tuple[list[str], set[str] | None]]:
    """(heads, parameters not decayed: None for this version's) of each earlier rule: the
    heads of each earlier head rule, oldest first, each once, with this version's decay, then
    every head rule with the decay of torchkit before it read `no_weight_decay()`'s patterns
    (where that differs)."""
    from torchkit.core.models.heads import classifier_heads, find_head, head_names
    from torchkit.core.train.optim import no_decay_names

    heads = [[find_head(model)[0]], [name for name, _ in classifier_heads(model)]]
    heads = [rule for i, rule in enumerate(heads) if rule not in heads[:i]]
    rules: list[tuple[list[str], set[str] | None]] = [(rule, None) for rule in heads]
    if not config.decay_all:
        before_patterns = no_decay_names(model, patterns=False)
        if before_patterns != no_decay_names(model):
            every = [list(head_names(model)), *heads]
            every = [rule for i, rule in enumerate(every) if rule not in every[:i]]
            rules += [(rule, before_patterns) for rule in every]
    return rules


def _renumbered(
    by_name: dict[str, dict], groups: Sequence[ParamGroupSpec], config: TrainConfig
) -> dict[int, dict] | None:
    """Each parameter's state under its index in `groups`; None where a state tensor is not of
    its parameter's shape (not the run's model). A parameter the earlier run kept frozen starts
    with none, as in a first step, except SGD's momentum: torch's fused step takes a group's
    buffers all or none, and a zero buffer is what the first step starts from."""
    import torch

    moved: dict[int, dict] = {}
    index = 0
    for spec in groups:
        for name, param in zip(spec.names, spec.params, strict=True):
            saved = by_name.get(name)
            if saved is not None:
                shapes = [v.shape for v in saved.values() if torch.is_tensor(v) and v.ndim > 0]
                if any(shape != param.shape for shape in shapes):
                    return None
                moved[index] = saved
            elif config.optimizer == "sgd" and config.momentum:
                moved[index] = {"momentum_buffer": torch.zeros_like(param)}
            index += 1
    return moved
