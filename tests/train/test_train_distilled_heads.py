"""Models with two classifier heads whose outputs they average (timm's distilled DeiT and PiT:
`head` and `head_dist`; LeViT: two NormLinear heads, a BatchNorm and a Linear each) train both
as the head: --freeze-backbone leaves both trainable, --head-lr-mult and --backbone-lr give both
the head's rate, and new classes replace both. So do the other layers timm makes anew for new
classes (an MLP head's hidden layer, VOLO's aux_head...). The truths are the models' own module
names."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

from torchkit.core.models import replace_head
from torchkit.core.models.heads import class_layers
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.optim import freeze_backbone, frozen_norms_to_eval, param_groups

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
    frozen_norms_to_eval(model)()
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


def _small(name: str) -> torch.nn.Module:
    """Small models of timm's families whose head is more than one Linear layer."""
    timm = importlib.import_module("timm")
    if name == "metaformer":  # caformer/convformer: an MLP head (fc1, norm, fc2)
        return timm.models.metaformer.MetaFormer(num_classes=3, depths=(1,) * 4, dims=(8, 8, 8, 16))
    if name == "volo":  # the class token's head plus the aux_head on the other tokens
        return timm.models.volo.VOLO(
            layers=(1,) * 4, num_classes=3, img_size=32, embed_dims=(16,) * 4, num_heads=(1,) * 4
        )
    kwargs = {
        "crossvit_tiny_240": {  # one head per branch, their logits averaged
            "img_size": (32, 32), "depth": ((1, 1, 0),), "embed_dim": (16, 32),
            "num_heads": (1, 1), "patch_size": (8, 16),
        },
        "repvit_m1": {"embed_dim": (8, 16, 16, 16), "depth": (1,) * 4},  # head and head_dist
        "levit_512_s8": {  # not distilled: one NormLinear (BatchNorm, Linear)
            "img_size": 32, "embed_dim": (16,) * 3, "depth": (1,) * 3, "num_heads": (1,) * 3,
            "key_dim": 8,
        },
    }[name]  # fmt: skip
    return timm.create_model(name, num_classes=3, **kwargs)


@pytest.mark.parametrize(
    ("name", "head"),
    [
        ("metaformer", ["head.fc.fc1", "head.fc.norm", "head.fc.fc2"]),  # not head.norm: kept
        ("volo", ["head", "aux_head"]),
        ("crossvit_tiny_240", ["head.0", "head.1"]),
        ("repvit_m1", ["head.head", "head.head_dist"]),
        ("levit_512_s8", ["head.bn", "head.linear"]),
    ],
)
def test_every_layer_made_anew_for_new_classes_trains_as_the_head(name, head):
    model = _small(name)
    expected = {
        n for n, _ in model.named_parameters() if any(n.startswith(f"{h}.") for h in head)
    } or pytest.fail(f"{name} has none of {head}")
    groups = param_groups(model, TrainConfig(lr=0.1, head_lr_mult=10.0))
    assert {n for g in groups if g.name.startswith("head") for n in g.names} == expected
    freeze_backbone(model)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == expected


@pytest.mark.parametrize(
    ("name", "layers"),
    [
        ("deit_tiny_distilled_patch16_224", ["head", "head_dist"]),
        ("levit_128s", ["head.linear", "head_dist.linear"]),
        ("metaformer", ["head.fc.fc2"]),  # not fc1: its outputs are the hidden layer's
        ("volo", ["head", "aux_head"]),
        ("crossvit_tiny_240", ["head.0", "head.1"]),
        ("repvit_m1", ["head.head.l", "head.head_dist.l"]),
    ],
)
def test_every_layer_of_the_classes_outputs_is_sized_for_a_new_num_classes(name, layers):
    # What --num-classes is checked against memory with: each of them holds classes x inputs.
    model = two_headed(name) if name in TWO_HEADS else _small(name)
    assert sorted(n for n, _ in class_layers(model)) == sorted(layers)


def test_new_classes_keep_repvits_distillation_head():
    """timm's RepViT drops its distillation head on reset_classifier unless told to keep it: new
    classes keep the model timm builds for the name (whose checkpoint then loads into it)."""
    model = _small("repvit_m1")
    built = set(model.state_dict())
    replace_head(model, 2)
    assert set(model.state_dict()) == built
    assert [layer.out_features for _, layer in class_layers(model)] == [2, 2]
    with torch.no_grad():
        assert model.eval()(torch.zeros(1, 3, 32, 32)).shape == (1, 2)
