"""`convert_batchnorm` against its peers: torch's `SyncBatchNorm.convert_sync_batchnorm` and
timm's `convert_sync_batchnorm` convert the same layers, into layers with the same state and the
same outputs; where torchkit differs on purpose (hooks kept, a shared layer kept shared, a
SyncBatchNorm left as it is), the difference is checked against a hand-written reference."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from torchkit.core.convert.syncbn import convert_batchnorm
from torchkit.core.io.errors import InputError


class Branches(nn.Module):
    """BatchNorm layers in a ModuleList and a ModuleDict, one level down each."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Sequential(nn.BatchNorm2d(4)))
        self.blocks = nn.ModuleList([nn.Sequential(nn.BatchNorm2d(4, momentum=None), nn.ReLU())])
        self.heads = nn.ModuleDict({"a": nn.BatchNorm2d(4, affine=False), "b": nn.GroupNorm(2, 4)})

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.heads["b"](self.heads["a"](x))


def branches() -> nn.Module:
    return Branches()


def one_dimensional() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4, track_running_stats=False, bias=False),  # a weight, no bias
        nn.Flatten(2),  # (N, C, L): BatchNorm1d over a sequence
        nn.BatchNorm1d(4),
        nn.Flatten(),
        nn.Linear(144, 5),
        nn.BatchNorm1d(5, eps=1e-3, momentum=0.5),
    )


def volume() -> nn.Module:
    return nn.Sequential(
        nn.Unflatten(1, (1, 3)), nn.Conv3d(1, 2, 1), nn.BatchNorm3d(2), nn.InstanceNorm3d(2)
    )


def lazy() -> nn.Module:
    """A lazy BatchNorm after its first input: a BatchNorm2d now."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyBatchNorm2d())
    model(torch.randn(2, 3, 8, 8))
    return model


def others_untouched() -> nn.Module:
    """Normalisation layers that are no BatchNorm: neither converter touches them."""
    from timm.layers import FrozenBatchNormAct2d
    from torchvision.ops.misc import FrozenBatchNorm2d

    return nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.InstanceNorm2d(4, affine=True, track_running_stats=True),
        FrozenBatchNorm2d(4),
        FrozenBatchNormAct2d(4),
        nn.GroupNorm(2, 4),
        nn.LayerNorm([4, 6, 6]),
    )


def mobilenet() -> nn.Module:
    import torchvision

    return torchvision.models.mobilenet_v3_small(num_classes=3)


@pytest.mark.parametrize(
    "make", [branches, one_dimensional, volume, lazy, others_untouched, mobilenet]
)
def test_the_layers_torch_converts_are_converted_with_their_state_and_outputs(make):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8) if make is not mobilenet else torch.randn(2, 3, 32, 32)
    model = make().train()
    with torch.no_grad():
        for _ in range(2):  # running statistics (and cumulative averages) off their defaults
            model(x)
    model.eval()
    expected = model(x)
    torchs = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))

    synced, rows = convert_batchnorm(model)

    def converted(net):
        return [name for name, m in net.named_modules() if isinstance(m, nn.SyncBatchNorm)]

    assert [row["name"] for row in rows] == converted(synced) == converted(torchs)
    state, reference = synced.state_dict(), torchs.state_dict()
    assert list(state) == list(reference)
    assert all(torch.equal(state[k], reference[k]) for k in reference)
    for mine, theirs in zip(synced.modules(), torchs.modules(), strict=True):
        assert type(mine) is type(theirs)
        if isinstance(theirs, nn.SyncBatchNorm):
            for attr in ("eps", "momentum", "affine", "track_running_stats", "num_features"):
                assert getattr(mine, attr) == getattr(theirs, attr), attr
    assert torch.equal(synced(x), expected) and torch.equal(torchs(x), expected)


def test_a_timm_model_converts_as_timms_converter_converts_it():
    import timm
    from timm.layers import norm_act

    torch.manual_seed(0)
    model = timm.create_model("mobilenetv3_small_050", num_classes=3).eval()
    x = torch.randn(2, 3, 32, 32)
    expected = model(x)
    timms = norm_act.convert_sync_batchnorm(copy.deepcopy(model))

    synced, rows = convert_batchnorm(model)

    # (timm's puts each layer's `act` before its `drop`; torchkit keeps the order they had)
    assert {n: type(m) for n, m in synced.named_modules()} == {
        n: type(m) for n, m in timms.named_modules()
    }
    assert {row["to_type"] for row in rows} == {"SyncBatchNormAct"}
    state, reference = synced.state_dict(), timms.state_dict()
    assert list(state) == list(reference)
    assert all(torch.equal(state[k], reference[k]) for k in reference)
    assert torch.equal(synced(x), expected)
    # torch's own converter makes plain SyncBatchNorm layers of them: the activations are gone
    torchs = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(timms))
    assert {type(m) for m in torchs.modules() if isinstance(m, nn.SyncBatchNorm)} == {
        nn.SyncBatchNorm
    }
    assert not torch.equal(torchs(x), expected)


def test_the_layers_torchkit_refuses_fail_in_torchs_converter_too():
    """A lazy layer that has seen no input: torch's converter makes a SyncBatchNorm of 0
    features that fails at its first input; a pruned weight: a TypeError. (torchkit refuses
    both before converting: test_syncbn.py.)"""
    from torch.nn.utils import prune

    lazy = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.LazyBatchNorm2d()))
    assert lazy[0].num_features == 0
    with pytest.raises(ValueError, match="uninitialized parameter"):
        lazy(torch.randn(2, 3, 4, 4))
    pruned = nn.BatchNorm2d(4)
    prune.l1_unstructured(pruned, "weight", amount=0.5)
    with pytest.raises(TypeError):
        nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(pruned))


# --- where torchkit differs on purpose -------------------------------------------------------


def double_output(module, inputs, output):
    """A forward hook, at module level so a model holding it pickles."""
    return output * 2


def test_hooks_on_a_layer_act_on_its_conversion_and_back():
    """torch's (and timm's) converter drops the hooks of every layer it replaces: the model's
    output changed silently. The hand-written reference: the same model with its hooks, never
    converted."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.BatchNorm2d(4)).eval()
    x = torch.randn(2, 3, 6, 6)
    calls: list[str] = []
    model[1].register_forward_hook(double_output)
    kept = model[2].register_forward_pre_hook(lambda m, args: calls.append(type(m).__name__))
    model[2].register_load_state_dict_pre_hook(
        lambda m, *args: calls.append(f"load {type(m).__name__}")
    )
    expected = model(x)
    assert calls == ["BatchNorm2d"]
    torchs = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    assert not torch.equal(torchs(x), expected)  # the peer's loss, which torchkit avoids

    synced, _ = convert_batchnorm(model)
    assert torch.equal(synced(x), expected)
    synced.load_state_dict(synced.state_dict())  # handed the new layer, not a dead one
    assert calls == ["BatchNorm2d", "SyncBatchNorm", "load SyncBatchNorm"]

    reverted, _ = convert_batchnorm(synced, to="bn")
    assert torch.equal(reverted(x), expected)
    kept.remove()  # a handle taken before converting still removes its hook
    reverted(x)
    assert calls == ["BatchNorm2d", "SyncBatchNorm", "load SyncBatchNorm", "BatchNorm2d"]


def test_a_timm_features_model_keeps_the_feature_map_a_norm_layer_hands_on():
    """mobilenetv3's first feature map is its stem's BatchNormAct2d output, taken by a hook:
    converted by timm's converter (or torchkit's, before) the model handed 4 feature maps of 5."""
    import timm

    model = timm.create_model("mobilenetv3_small_050", features_only=True, feature_cls="hook")
    model.eval()
    x = torch.randn(1, 3, 32, 32)
    expected = model(x)
    assert len(expected) == 5

    synced, _ = convert_batchnorm(model)

    features = synced(x)
    assert len(features) == 5
    assert all(torch.equal(a, b) for a, b in zip(features, expected, strict=True))


def test_a_shared_layer_stays_one_layer_and_a_sync_layer_stays_as_it_is():
    """torch's converter makes two layers of one held by two parents (sharing its tensors,
    but no longer its mode or its hooks), and a new SyncBatchNorm of one that is already."""
    shared = nn.BatchNorm2d(4)
    model = nn.Sequential(nn.Sequential(shared), nn.Sequential(shared), nn.SyncBatchNorm(4))
    torchs = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    assert torchs[0][0] is not torchs[1][0]
    already = model[2]

    synced, rows = convert_batchnorm(model)

    assert [row["name"] for row in rows] == ["0.0"]
    assert synced[0][0] is synced[1][0] and isinstance(synced[0][0], nn.SyncBatchNorm)
    assert synced[2] is already


class ScaledBatchNorm(nn.BatchNorm2d):
    """A subclass with a forward and an extra state of its own."""

    def __init__(self, num_features: int) -> None:
        super().__init__(num_features)
        self.scale = 2.0

    def forward(self, x):
        return super().forward(x) * self.scale

    def get_extra_state(self):
        return {"scale": self.scale}

    def set_extra_state(self, state):
        self.scale = state["scale"]


class InitOnlyBatchNorm(nn.BatchNorm2d):
    def __init__(self, num_features: int) -> None:
        super().__init__(num_features, eps=1e-3)


class ReprSyncBatchNorm(nn.SyncBatchNorm):
    """A SyncBatchNorm subclass with a method of its own."""

    def extra_repr(self) -> str:
        return "repr of its own"


def test_a_subclass_becomes_a_plain_sync_layer_with_a_warning_naming_what_it_loses(caplog):
    """As torch's converter does; the warning said "its own forward() is not kept" of any
    subclass, then "not its own methods" of one that has none, and nothing of its other
    methods and attributes, nor of a SyncBatchNorm subclass that reverting made a plain
    BatchNorm2d. Said once every layer is known to convert."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), ScaledBatchNorm(4), InitOnlyBatchNorm(4))
    torchs = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    with caplog.at_level("WARNING", logger="torchkit"):
        synced, _ = convert_batchnorm(model)
    assert [type(m) for m in synced[1:]] == [type(m) for m in torchs[1:]] == [nn.SyncBatchNorm] * 2
    assert "1._extra_state" not in synced.state_dict()
    assert synced[2].eps == 1e-3
    assert [record.getMessage() for record in caplog.records] == [
        "1 (ScaledBatchNorm, a BatchNorm subclass) becomes a plain SyncBatchNorm, which keeps "
        "its weights and statistics, not its own forward(), its extra state (get_extra_state) "
        "nor its attribute scale",
        "2 (InitOnlyBatchNorm, a BatchNorm subclass) becomes a plain SyncBatchNorm, the same "
        "but for its class (it adds no method and no attribute)",
    ]
    caplog.clear()

    model = nn.Sequential(nn.Conv2d(3, 4, 3), ReprSyncBatchNorm(4), nn.SyncBatchNorm(4))
    with caplog.at_level("WARNING", logger="torchkit"):
        reverted, _ = convert_batchnorm(model, to="bn")
    assert [type(m) for m in reverted[1:]] == [nn.BatchNorm2d] * 2
    assert [record.getMessage() for record in caplog.records] == [
        "1 (ReprSyncBatchNorm, a SyncBatchNorm subclass) becomes a plain BatchNorm2d, which "
        "keeps its weights and statistics, not its method extra_repr"
    ]


def test_a_refused_conversion_leaves_the_hooks_working_and_warns_of_nothing(caplog):
    """The layers before a refused one had handed their hooks over already: a load_state_dict
    pre-hook then pointed at a layer thrown away ("the hook of a dead Module"), and a
    subclass's warning had been given of a conversion that never happened."""
    import gc

    from torch.nn.utils import prune

    pruned = nn.BatchNorm2d(4)
    prune.l1_unstructured(pruned, "weight", amount=0.5)
    model = nn.Sequential(ScaledBatchNorm(4), pruned)
    calls: list[str] = []
    model[0].register_load_state_dict_pre_hook(lambda m, *args: calls.append(type(m).__name__))
    with caplog.at_level("WARNING", logger="torchkit"), pytest.raises(InputError):
        convert_batchnorm(model)
    gc.collect()
    assert caplog.records == []
    assert type(model[0]) is ScaledBatchNorm
    model.load_state_dict(model.state_dict())
    assert calls == ["ScaledBatchNorm"]


def test_a_layer_timms_converter_made_reverts_by_its_type_alone():
    """timm's SyncBatchNormAct only ever stands for a BatchNormAct2d: one with no layer of
    known dimensionality beside it was refused ("cannot tell whether 0 stands for BatchNorm1d,
    2d or 3d"), and one after a convolution was said to be "like" it."""
    from timm.layers import norm_act

    model = nn.Sequential(norm_act.BatchNormAct2d(4), nn.Identity(), norm_act.BatchNormAct2d(4))
    timms = norm_act.convert_sync_batchnorm(model)  # records nothing

    reverted, rows = convert_batchnorm(timms, to="bn")

    assert [type(m) for m in reverted] == [
        norm_act.BatchNormAct2d,
        nn.Identity,
        norm_act.BatchNormAct2d,
    ]
    assert [row["dim_source"] for row in rows] == ["its type (SyncBatchNormAct)"] * 2


def test_a_sync_layer_without_an_activation_reverts_without_one():
    """timm's SyncBatchNormAct applies the `act` it holds; one holding none reverted to a
    BatchNormAct2d with a ReLU of its own, which clamped the layer's output."""
    from timm.layers import norm_act

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), norm_act.SyncBatchNormAct(4)).eval()
    x = torch.randn(2, 3, 4, 4)
    expected = model(x)
    assert (expected < 0).any()

    reverted, _ = convert_batchnorm(model, to="bn")

    assert type(reverted[1]) is norm_act.BatchNormAct2d
    assert torch.equal(reverted(x), expected)


def test_converting_twice_changes_nothing_and_reverting_a_plain_model_neither():
    """The second conversion finds no layer to convert: the same layers, state and hooks (not
    a hook twice), no row; so does --revert of a model without SyncBatchNorm."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
    x = torch.randn(2, 3, 6, 6)
    model[1].register_forward_hook(double_output)
    expected = model(x)
    plain = copy.deepcopy(model)

    once, _ = convert_batchnorm(model)
    layer, state = once[1], once.state_dict()
    twice, rows = convert_batchnorm(once)
    assert rows == [] and twice is once and twice[1] is layer
    assert list(twice.state_dict()) == list(state)
    assert all(torch.equal(twice.state_dict()[k], state[k]) for k in state)
    assert torch.equal(twice(x), expected)

    kept = plain[1]
    reverted, rows = convert_batchnorm(plain, to="bn")
    assert rows == [] and reverted[1] is kept and torch.equal(reverted(x), expected)


def test_a_layer_shared_by_two_parents_is_one_layer_there_and_back():
    shared = nn.BatchNorm2d(4)
    model = nn.Sequential(nn.Sequential(nn.Conv2d(3, 4, 1), shared), nn.Sequential(shared))
    calls: list[str] = []
    shared.register_forward_pre_hook(lambda m, args: calls.append(type(m).__name__))

    synced, rows = convert_batchnorm(model)
    reverted, back = convert_batchnorm(synced, to="bn")

    assert [row["name"] for row in rows] == [row["name"] for row in back] == ["0.1"]
    assert reverted[0][1] is reverted[1][0] and type(reverted[1][0]) is nn.BatchNorm2d
    assert reverted[0][1].weight is shared.weight
    assert back[0]["dim_source"] == "recorded at conversion"
    reverted.eval()(torch.randn(2, 3, 4, 4))
    assert calls == ["BatchNorm2d", "BatchNorm2d"]  # the one layer, called by both parents


def test_backward_and_state_dict_hooks_act_on_the_converted_layer():
    """Every kind of hook torch keeps on a module moves, not only the forward ones."""
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)).train()
    calls: list[str] = []
    layer = model[1]
    layer.register_full_backward_hook(
        lambda m, gi, go: calls.append(f"backward {type(m).__name__}")
    )
    layer.register_full_backward_pre_hook(lambda m, go: calls.append(f"pre {type(m).__name__}"))
    layer.register_state_dict_post_hook(lambda m, *a: calls.append(f"state {type(m).__name__}"))
    layer.register_load_state_dict_post_hook(
        lambda m, k: calls.append(f"loaded {type(m).__name__}")
    )
    layer.register_forward_hook(
        lambda m, args, kwargs, out: calls.append(f"kwargs {type(m).__name__}"), with_kwargs=True
    )

    synced, _ = convert_batchnorm(model)
    synced(torch.randn(2, 3, 4, 4, requires_grad=True)).sum().backward()
    synced.load_state_dict(synced.state_dict())

    assert calls == [
        "kwargs SyncBatchNorm",
        "pre SyncBatchNorm",
        "backward SyncBatchNorm",
        "state SyncBatchNorm",
        "loaded SyncBatchNorm",
    ]
