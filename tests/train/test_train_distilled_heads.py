"""Models with two classifier heads whose outputs they average (timm's distilled DeiT and PiT:
`head` and `head_dist`; LeViT: two NormLinear heads, a BatchNorm and a Linear each) train both
as the head: --freeze-backbone leaves both trainable, --head-lr-mult and --backbone-lr give both
the head's rate, and new classes replace both. The truths are the models' own module names."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

from torchkit.core.models import replace_head
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.optim import freeze_backbone, param_groups, set_frozen_norms_eval

pytestmark = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")

# Small and quick to build: 32 px images, and one block of DeiT's twelve.
TWO_HEADS = {"deit_tiny_distilled_patch16_224": {"depth": 1}, "levit_128s": {}}


def two_headed(name: str) -> torch.nn.Module:
    # timm imported here, not at collection: it imports torch._dynamo (seconds of CPU).
    timm = importlib.import_module("timm")
    return timm.create_model(name, num_classes=3, img_size=32, **TWO_HEADS[name])


def head_params(model: torch.nn.Module) -> set[str]:
    """Every parameter of `head` and `head_dist` (with LeViT's BatchNorms)."""
    names = {n for n, _ in model.named_parameters() if n.split(".")[0] in ("head", "head_dist")}
    assert any(n.startswith("head.") for n in names) and any("head_dist." in n for n in names)
    return names


@pytest.mark.parametrize("name", TWO_HEADS)
def test_freeze_backbone_leaves_both_heads_trainable(name):
    model = two_headed(name)
    freeze_backbone(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == head_params(model)

    # Their normalisation layers are the heads' (freshly initialised): they keep training.
    model.train()
    set_frozen_norms_eval(model)
    assert all(m.training for n, m in model.named_modules() if n.startswith("head"))


@pytest.mark.parametrize("name", TWO_HEADS)
@pytest.mark.parametrize(
    ("options", "head_lr", "backbone_lr"),
    [({"head_lr_mult": 10.0}, 1.0, 0.1), ({"backbone_lr": 0.01}, 0.1, 0.01)],
)
def test_both_heads_get_the_heads_learning_rate(name, options, head_lr, backbone_lr):
    model = two_headed(name)
    groups = param_groups(model, TrainConfig(lr=0.1, **options))
    in_head = {n for g in groups if g.name.startswith("head") for n in g.names}
    assert in_head == head_params(model)
    for group in groups:
        assert group.lr == pytest.approx(head_lr if group.name.startswith("head") else backbone_lr)


@pytest.mark.parametrize("name", TWO_HEADS)
def test_new_classes_replace_both_heads(name):
    model = two_headed(name)
    replace_head(model, 2)  # what fine-tuning 3-class weights on 2 classes does
    linears = [getattr(head, "linear", head) for head in (model.head, model.head_dist)]
    assert [layer.out_features for layer in linears] == [2, 2]
    with torch.no_grad():
        assert model.eval()(torch.zeros(1, 3, 32, 32)).shape == (1, 2)
