"""--resume of a run that an earlier torchkit trained with fewer layers as the head (a distilled
DeiT's head_dist alone, LeViT's head_dist.linear alone): its optimiser state is moved, parameter
by parameter, onto the groups this version builds, and the run goes on with a warning."""

from __future__ import annotations

import importlib
import importlib.util
import logging
from pathlib import Path

import pytest
import torch

from torchkit.core.io.errors import CheckpointError
from torchkit.core.models.heads import find_head
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.optim import (
    LRSchedule,
    backbone_trains,
    build_optimizer,
    freeze_backbone,
    param_groups,
)
from torchkit.core.train.resume import restore_training

pytestmark = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")

# Two heads each, about 16,000 parameters, 32 px images.
TINY = {
    "deit_tiny_distilled_patch16_224": {"depth": 1, "embed_dim": 16, "num_heads": 1},
    "levit_128s": {"embed_dim": (16,) * 3, "depth": (1,) * 3, "num_heads": (1,) * 3, "key_dim": 8},
}


def tiny(name: str) -> torch.nn.Module:
    timm = importlib.import_module("timm")
    torch.manual_seed(0)
    return timm.create_model(name, num_classes=3, img_size=32, **TINY[name])


def saved_by_the_earlier_rule(model, config: TrainConfig) -> tuple[dict, dict]:
    """A checkpoint of `model` after one step, its optimiser over the groups torchkit made when
    the head was the one layer `find_head` names; and each parameter's state, by name."""
    heads = [find_head(model)[0]]
    if not backbone_trains(config):
        for name, param in model.named_parameters():
            param.requires_grad_(name.startswith(f"{heads[0]}."))
    return saved_after_a_step(model, config, param_groups(model, config, heads))


def saved_after_a_step(model, config: TrainConfig, groups) -> tuple[dict, dict]:
    """A checkpoint of `model` after one step of an optimiser over `groups`, and each trained
    parameter's state, by name."""
    optimizer = build_optimizer(groups, config)
    model.train()(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": LRSchedule(optimizer, config, 1).state_dict(),
    }
    states = {
        n: dict(optimizer.state[p]) for n, p in model.named_parameters() if p.grad is not None
    }
    return checkpoint, states


def resumed(name: str, config: TrainConfig, checkpoint: dict, path: str = "R/last.pt"):
    model = tiny(name)
    if not backbone_trains(config):
        freeze_backbone(model)
    groups = param_groups(model, config)
    optimizer = build_optimizer(groups, config)
    restore_training(
        checkpoint, Path(path), model=model, config=config, groups=groups,
        optimizer=optimizer, schedule=LRSchedule(optimizer, config, 1), scaler=None,
    )  # fmt: skip
    return model, optimizer


@pytest.mark.parametrize(
    ("name", "options", "heads"),
    [
        (
            "deit_tiny_distilled_patch16_224",
            {"optimizer": "adamw", "head_lr_mult": 10.0},
            "head, head_dist",
        ),
        ("levit_128s", {"optimizer": "sgd", "freeze_backbone": True}, "head, head_dist"),
    ],
)
def test_the_optimizer_state_moves_onto_this_versions_head_groups(name, options, heads, caplog):
    config = TrainConfig(epochs=1, lr=0.1, **options)
    checkpoint, states = saved_by_the_earlier_rule(tiny(name), config)
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        model, optimizer = resumed(name, config, checkpoint)
    assert "R/last.pt was saved by an earlier torchkit that trained only head_dist" in caplog.text
    assert f"it goes on with {heads} as the head, the optimizer state moved along" in caplog.text
    by_name = dict(model.named_parameters())
    for param_name, saved in states.items():
        for key, value in saved.items():
            assert torch.equal(optimizer.state[by_name[param_name]][key], value), param_name
    assert optimizer.state  # and the run's next step works (fused SGD's buffers all set)
    model.train()(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()


def test_other_groups_than_an_earlier_rule_makes_are_still_refused():
    # The backbone frozen at --backbone-lr 0, resumed at 0.01 (the CLI refuses that before,
    # from the options): the groups differ by more.
    name = "levit_128s"
    checkpoint, _ = saved_by_the_earlier_rule(
        tiny(name), TrainConfig(epochs=1, lr=0.1, backbone_lr=0.0)
    )
    # A run folder whose name has a space: the --weights the hint shows is one shell word.
    with pytest.raises(
        CheckpointError, match=r"the optimizer state in my run/last.pt does not fit"
    ) as e:
        config = TrainConfig(epochs=1, lr=0.1, backbone_lr=0.01)
        resumed(name, config, checkpoint, "my run/last.pt")
    assert e.value.hint == (
        "it was saved with other parameter groups, perhaps by another torchkit version; "
        "start a new run from its weights with --weights 'my run/last.pt'"
    )


def test_a_run_that_decayed_what_a_no_weight_decay_pattern_names_goes_on(caplog, monkeypatch):
    """XCiT's no_weight_decay() names `pos_embed.*`: torchkit decayed its positional
    encoding's convolution until it read patterns, so the resumed run's groups were of other
    sizes ("does not fit", start anew from --weights). The state moves onto this version's
    groups instead, with a warning that the convolution gets no weight decay from now on."""
    from torchkit.core.train import optim

    timm = importlib.import_module("timm")
    kwargs = {"depth": 1, "embed_dim": 16, "num_heads": 2, "img_size": 32, "num_classes": 3}
    config = TrainConfig(epochs=1, lr=0.1, optimizer="adamw", weight_decay=0.05)

    def xcit():
        torch.manual_seed(0)
        return timm.create_model("xcit_nano_12_p16_224", **kwargs)

    model = xcit()
    before = optim.no_decay_names(model, patterns=False)
    assert optim.no_decay_names(model) - before == {"pos_embed.token_projection.weight"}
    checkpoint, states = saved_after_a_step(
        model, config, param_groups(model, config, skip_decay=before)
    )
    model = xcit()
    groups = param_groups(model, config)
    optimizer = build_optimizer(groups, config)
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        restore_training(
            checkpoint, Path("R/last.pt"), model=model, config=config, groups=groups,
            optimizer=optimizer, schedule=LRSchedule(optimizer, config, 1), scaler=None,
        )  # fmt: skip
    assert caplog.messages == [
        "R/last.pt was saved by an earlier torchkit that gave weight decay to "
        "pos_embed.token_projection.weight, which the model's no_weight_decay() names by a "
        "pattern: it goes on without weight decay on it, the optimizer state moved along"
    ]
    by_name = dict(model.named_parameters())
    for param_name, saved in states.items():
        for key, value in saved.items():
            assert torch.equal(optimizer.state[by_name[param_name]][key], value), param_name
    conv = by_name["pos_embed.token_projection.weight"]
    spared = [g for g in optimizer.param_groups if any(p is conv for p in g["params"])]
    assert [g["weight_decay"] for g in spared] == [0.0]
