"""`torchkit extract-features` layer by layer against its peers on tiny models with traps:
torchvision's create_feature_extractor (same node names, same values on the same tensors) and
hand-written forward hooks (what a model torch.fx cannot trace falls back to). Where torchkit
differs on purpose (a layer followed by an in-place op), the test says which one it follows."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from image_folders import write_image_folder
from output_checks import error_line
from torch import nn
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

from torchkit.cli import app
from torchkit.core.features.layers import FeatureExtractor, LayerGraph

MODELS_MODULE = "tk_against_fx_models"  # `MODULE:Callable` specs point here


@pytest.fixture
def models_module(monkeypatch):
    module = types.ModuleType(MODELS_MODULE)
    monkeypatch.setitem(sys.modules, MODELS_MODULE, module)
    return module


def extract(model: nn.Module, names: list[str], x: torch.Tensor) -> dict[str, torch.Tensor]:
    graph = LayerGraph(model, arch=type(model).__name__)
    extractor = FeatureExtractor(graph, graph.resolve(names))
    try:
        with torch.inference_mode():
            return extractor(x)
    finally:
        extractor.close()


def hooked(model: nn.Module, name: str, x: torch.Tensor) -> list[torch.Tensor]:
    """A hand-written forward hook's copies of a module's output, one per call."""
    calls: list[torch.Tensor] = []
    module = model.get_submodule(name)
    handle = module.register_forward_hook(lambda _m, _i, output: calls.append(output.clone()))
    try:
        with torch.inference_mode():
            model(x)
    finally:
        handle.remove()
    return calls


class SharedBlock(nn.Module):
    """One block called twice; `dynamic` adds a data-dependent branch torch.fx cannot trace."""

    def __init__(self, dynamic: bool = False) -> None:
        super().__init__()
        self.dynamic = dynamic
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.block = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x = self.block(self.block(self.stem(x)))
        if self.dynamic and x.sum() > 0:
            x = x * 2
        return self.fc(x.mean(dim=(2, 3)))


def test_a_block_called_twice_is_two_layers_as_create_feature_extractor_names_them():
    torch.manual_seed(0)
    model = SharedBlock().eval()
    x = torch.randn(2, 3, 8, 8)
    assert get_graph_node_names(model)[1][1:4] == ["stem", "block", "block_1"]
    ours = extract(model, ["block", "block_1"], x)
    with torch.inference_mode():
        theirs = create_feature_extractor(model, ["block", "block_1"])(x)
    first, second = hooked(model, "block", x)
    for name, expected in (("block", first), ("block_1", second)):
        assert torch.equal(ours[name], theirs[name])
        assert torch.equal(ours[name], expected)
    assert not torch.equal(first, second)


def test_a_block_called_twice_in_a_model_fx_cannot_trace_is_its_last_call():
    # Hooks on module names: the one name is the block's last call, as a hand-written hook
    # that keeps one value per module has it.
    torch.manual_seed(0)
    model = SharedBlock(dynamic=True).eval()
    x = torch.randn(2, 3, 8, 8)
    graph = LayerGraph(model)
    assert not graph.traced
    ours = extract(model, ["block"], x)
    assert torch.equal(ours["block"], hooked(model, "block", x)[-1])


class InPlaceAfter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.relu(self.conv(x)).mean(dim=(2, 3)))


def test_a_layer_before_an_in_place_relu_is_its_own_value_not_create_feature_extractors():
    # create_feature_extractor returns the conv's tensor, which the in-place ReLU has since
    # clamped: the conv's value is the hook's copy taken when it is computed.
    torch.manual_seed(0)
    model = InPlaceAfter().eval()
    x = torch.randn(2, 3, 8, 8)
    ours = extract(model, ["conv", "relu"], x)
    with torch.inference_mode():
        theirs = create_feature_extractor(model, ["conv", "relu"])(x)
    (conv,) = hooked(model, "conv", x)
    assert (conv < 0).any()  # so the ReLU changed it
    assert torch.equal(ours["conv"], conv)
    assert torch.equal(theirs["conv"], conv.clamp_min(0))
    assert torch.equal(ours["relu"], theirs["relu"])


class Attention(nn.Module):
    """nn.MultiheadAttention (a leaf for torch.fx) gives a tuple, whose items are nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 4, stride=4)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        mixed, weights = self.attention(tokens, tokens, tokens)
        return self.head(mixed.mean(dim=1) + weights.mean(dim=(1, 2)).unsqueeze(1))


class Branch(nn.Module):
    """`extra` is a module of the model that its forward pass does not call."""

    def __init__(self) -> None:
        super().__init__()
        self.use_extra = False
        self.stem = nn.Conv2d(3, 4, 3)
        self.extra = nn.Conv2d(4, 4, 1)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.stem(x)
        if self.use_extra:
            x = self.extra(x)
        return self.head(x.mean(dim=(2, 3)))


def test_an_item_of_a_tuple_layer_matches_create_feature_extractor():
    torch.manual_seed(0)
    model = Attention().eval()
    x = torch.randn(2, 3, 16, 16)
    assert "getitem" in get_graph_node_names(model)[1]
    ours = extract(model, ["getitem", "getitem_1"], x)
    with torch.inference_mode():
        theirs = create_feature_extractor(model, ["getitem", "getitem_1"])(x)
    for name in ("getitem", "getitem_1"):
        assert torch.equal(ours[name], theirs[name])


@pytest.mark.parametrize(
    ("factory", "layer", "expected"),
    [
        (
            Attention,
            "attention",
            "Error: layer attention gives a tuple, not a tensor (its items are layers getitem "
            "(item 0), getitem_1 (item 1))",
        ),
        (
            Branch,
            "extra",
            "Error: tk_against_fx_models:model has no layer 'extra' (module extra is not called "
            "in the forward pass torch.fx traced (a branch not taken, or it computes nothing); "
            "`torchkit extract-features tk_against_fx_models:model --list-layers` lists them)",
        ),
    ],
    ids=["tuple", "branch-not-taken"],
)
def test_a_layer_that_gives_no_tensor_or_never_runs_is_one_error_naming_what_to_ask_for(
    runner, tmp_path, models_module, factory, layer, expected
):
    models_module.model = factory
    images = write_image_folder(tmp_path / "imgs", {"a": 2}, size=16)
    out = tmp_path / "out"
    command = ["extract-features", f"{MODELS_MODULE}:model", str(images), str(out), "-l", layer,
               "--allow-untrained", "--device", "cpu", "-j", "0", "--image-size", "16",
               "--resize-size", "16"]  # fmt: skip
    result = runner.invoke(app, command)
    assert result.exit_code != 0
    assert error_line(result.stderr) == expected
    assert not out.exists()
