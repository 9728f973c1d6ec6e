"""`convert_batchnorm(model, process_group=G)` under a real process group: Gloo, world size 1,
in this process (a FileStore in the test's folder, so no port is taken), with sub-groups made by
`torch.distributed.new_group` as torch's `convert_sync_batchnorm` documentation makes them.

A group passed is meant for every SyncBatchNorm layer of the result: the new ones, and those the
model held already, which keep their objects and take it in place (they kept their old group, so
a model converted again for a sub-group synchronised over two groups)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from torchkit.core.convert.syncbn import convert_batchnorm
from torchkit.core.io.errors import UsageError


@pytest.fixture
def gloo_world(tmp_path):
    """A default Gloo group of one process (this one), destroyed after the test with every
    group made in it."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with Gloo is not available")
    assert not dist.is_initialized()
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()


def groups_of(model: nn.Module) -> list:
    return [m.process_group for m in model.modules() if isinstance(m, nn.SyncBatchNorm)]


def model_with_sync_layers(first_group, second_group=None) -> nn.Sequential:
    """BatchNorm layers to convert beside SyncBatchNorm layers made elsewhere, on other groups
    (or, None, on the world)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.SyncBatchNorm(4, process_group=first_group),
        nn.Sequential(nn.SyncBatchNorm(4, process_group=second_group), nn.BatchNorm2d(4)),
    )
    model.train()
    for _ in range(2):  # running statistics of their own, not the defaults
        model[1](torch.randn(4, 4, 5, 5))
        model[3][1](torch.randn(4, 4, 5, 5))
    return model.eval()


def test_a_group_passed_reaches_every_sync_layer_the_model_held_already(gloo_world):
    old, sub = dist.new_group([0]), dist.new_group([0])
    assert old is not sub and sub is not gloo_world
    model = model_with_sync_layers(old)
    held = [model[2], model[3][0]]
    params = [p for layer in held for p in layer.parameters()]
    x = torch.randn(2, 3, 7, 7)
    expected = model(x)  # (a process group does not deepcopy: the model itself, before)

    synced, rows = convert_batchnorm(model, process_group=sub)

    assert [row["name"] for row in rows] == ["1", "3.1"]  # listed: only what was converted
    assert groups_of(synced) == [sub] * 4
    # taken in place: the same layers, holding the same parameters
    assert synced[2] is held[0] and synced[3][0] is held[1]
    assert [p for layer in held for p in layer.parameters()] == params
    assert torch.equal(synced(x), expected)  # eval: each computes what BatchNorm computes
    # torch's converter puts every layer on the group too, rebuilding those it held (a
    # SyncBatchNorm is a BatchNorm to it): new layers, their hooks left behind
    twin = model_with_sync_layers(old)
    twins_held = twin[2]
    torchs = nn.SyncBatchNorm.convert_sync_batchnorm(twin, sub)
    assert groups_of(torchs) == [sub] * 4 and torchs[2] is not twins_held


def test_converting_again_for_another_group_moves_every_layer_and_no_group_moves_none(gloo_world):
    first, second = dist.new_group([0]), dist.new_group([0])
    model, _ = convert_batchnorm(model_with_sync_layers(None), process_group=first)
    assert groups_of(model) == [first] * 4
    layers = [m for m in model.modules() if isinstance(m, nn.SyncBatchNorm)]

    again, rows = convert_batchnorm(model, process_group=second)
    assert rows == [] and again is model
    assert groups_of(again) == [second] * 4
    assert [m for m in again.modules() if isinstance(m, nn.SyncBatchNorm)] == layers

    # Without a group the layers keep theirs (a new layer synchronises over the world) ...
    model.append(nn.BatchNorm2d(4))
    kept, rows = convert_batchnorm(model)
    assert [row["name"] for row in rows] == ["4"]
    assert groups_of(kept) == [second] * 4 + [None]
    # ... and the world's group, passed, brings them all back to it.
    world, _ = convert_batchnorm(model, process_group=dist.group.WORLD)
    assert groups_of(world) == [gloo_world] * 5


def test_a_refused_conversion_leaves_every_layer_on_its_group(gloo_world):
    """The group is handed over once every layer is known to convert, as the hooks are."""
    old, sub = dist.new_group([0]), dist.new_group([0])
    model = nn.Sequential(nn.SyncBatchNorm(4, process_group=old), nn.LazyBatchNorm2d())
    with pytest.raises(UsageError, match="lazy BatchNorm"):
        convert_batchnorm(model, process_group=sub)
    assert groups_of(model) == [old]


def test_reverting_with_a_group_passed_ignores_it(gloo_world):
    sub = dist.new_group([0])
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.SyncBatchNorm(4), nn.BatchNorm2d(4))
    reverted, rows = convert_batchnorm(model, to="bn", process_group=sub)
    assert [row["name"] for row in rows] == ["1"]
    assert groups_of(reverted) == []


def test_timms_sync_layers_take_the_group_too_and_keep_their_activation(gloo_world):
    """timm's SyncBatchNormAct is a SyncBatchNorm: one the model holds takes the group in place,
    its activation kept; a BatchNormAct2d converted now becomes one on the group."""
    norm_act = pytest.importorskip("timm.layers.norm_act")
    old, sub = dist.new_group([0]), dist.new_group([0])
    held = norm_act.SyncBatchNormAct(4, process_group=old)
    held.act = nn.ReLU()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), held, norm_act.BatchNormAct2d(4)).eval()
    x = torch.randn(2, 3, 7, 7)
    expected = model(x)

    synced, rows = convert_batchnorm(model, process_group=sub)

    assert [(row["name"], row["to_type"]) for row in rows] == [("2", "SyncBatchNormAct")]
    assert synced[1] is held and isinstance(held.act, nn.ReLU)
    assert [type(m).__name__ for m in synced.modules() if isinstance(m, nn.SyncBatchNorm)] == [
        "SyncBatchNormAct",
        "SyncBatchNormAct",
    ]
    assert groups_of(synced) == [sub, sub]
    assert torch.equal(synced(x), expected)
    assert (expected >= 0).all()  # the activations ran
    # timm's converter builds a plain SyncBatchNorm of the one held: its activation never runs
    twin = norm_act.SyncBatchNormAct(4, process_group=old)
    twin.act = nn.ReLU()
    timms = norm_act.convert_sync_batchnorm(nn.Sequential(twin).eval(), sub)
    assert type(timms[0]) is nn.SyncBatchNorm and timms[0].process_group is sub
    assert (timms(torch.randn(2, 4, 3, 3)) < 0).any()


def test_reverting_a_model_on_a_group_names_the_smallest_input_it_takes(gloo_world):
    """An input too small for the model is refused naming the smallest side it takes, found on
    a meta-device copy of the model: a layer holding a process group, which cannot be deep-
    copied ("cannot pickle ProcessGroup"), left the refusal a bare 'check --input-size'."""
    from torchkit.core.models.image_size import ImageSizeError, meta_copy

    sub = dist.new_group([0])
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.SyncBatchNorm(4, process_group=sub))
    with pytest.raises(ImageSizeError, match="the smallest it takes is 3"):
        convert_batchnorm(model, to="bn", example_inputs=[torch.zeros(1, 3, 2, 2)])
    copied = meta_copy(model)
    assert copied[1].process_group is sub and copied[1].weight.is_meta
    assert not model[1].weight.is_meta
