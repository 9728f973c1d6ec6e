"""`torchkit extract-features` layer by layer against its peers on tiny models with traps:
torchvision's create_feature_extractor (same node names, same values on the same tensors) and
hand-written forward hooks (what a model torch.fx cannot trace falls back to). Where torchkit
differs on purpose (a layer followed by an in-place op), the test says which one it follows."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from image_folders import write_image_folder
from output_checks import error_line
from torch import nn
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

from torchkit.cli import app
from torchkit.core.features.layers import FeatureExtractor, LayerGraph
from torchkit.core.io.errors import UsageError

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
    with pytest.raises(Exception):  # noqa: B017 - torch.fx's TraceError, whatever its type
        create_feature_extractor(model, ["block"])
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


class Sized(nn.Module):
    """`getitem` is the batch size, an int: no layer of features."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(x.mean(dim=(2, 3)).reshape(x.shape[0], -1))


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
            "Error: layer attention gives a tuple, not a tensor (ask for its items, layers of "
            "their own: getitem is item 0, getitem_1 is item 1)",
        ),
        (
            Sized,
            "getitem",
            "Error: layer getitem gives an int, not a tensor (pick another layer: --list-layers "
            "lists them)",
        ),
        (
            Branch,
            "extra",
            "Error: tk_against_fx_models:model has no layer 'extra' (module extra is never "
            "called in the forward pass torch.fx traced: a branch not taken, or code that "
            "computes nothing; `torchkit extract-features tk_against_fx_models:model "
            "--list-layers` lists them)",
        ),
    ],
    ids=["tuple", "int", "branch-not-taken"],
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
    assert result.exit_code == 2  # the layer asked for is the mistake
    assert error_line(result.stderr) == expected
    assert not out.exists()


def test_a_module_never_called_is_named_wherever_it_is_among_the_unknown_names():
    """Only the first unknown name was looked up among the modules: a typo before it hid it."""
    graph = LayerGraph(Branch().eval(), arch="Branch")
    with pytest.raises(UsageError) as raised:
        graph.resolve(["stem", "nosuch", "extra"])
    assert raised.value.message == "Branch has no layer 'nosuch', 'extra'"
    assert raised.value.hint.startswith("module extra is never called in the forward pass")


def _resnet18_in_place() -> dict[str, Any]:
    # bn1 and each block's bn1 and residual sum feed ReLU(inplace=True); `out += identity` is
    # traced as an out-of-place add, so bn2 is the same in both
    blocks = [f"layer{stage}.{block}" for stage in range(1, 5) for block in range(2)]
    names = ["bn1", *(f"{b}.{layer}" for b in blocks for layer in ("bn1", "add"))]
    return dict.fromkeys(names, torch.relu)


def _mobilenet_v3_small_in_place() -> dict[str, Any]:
    # features.0 and the like are torchvision.ops blocks (Conv2dNormActivation), one node
    # there and traced through here; classifier.0 feeds Hardswish(inplace=True)
    return {"classifier.0": nn.functional.hardswish}


@pytest.mark.parametrize(
    ("arch", "in_place"),
    [("resnet18", _resnet18_in_place), ("mobilenet_v3_small", _mobilenet_v3_small_in_place)],
)
def test_every_name_create_feature_extractor_takes_gives_its_values(arch, in_place):
    """Each eval-mode name get_graph_node_names lists is a layer, with create_feature_extractor's
    values bitwise, but for a layer an in-place op changes afterwards: torchvision returns the
    changed tensor, torchkit the layer's own value, which that op turns into torchvision's."""
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(num_classes=3).eval()
    names = get_graph_node_names(model)[1]
    x = torch.randn(2, 3, 32, 32)
    ours = extract(model, names, x)
    with torch.inference_mode():
        theirs = create_feature_extractor(model, names)(x)

    changed = in_place()
    assert {name for name in names if not torch.equal(ours[name], theirs[name])} == set(changed)
    for name, op in changed.items():
        assert torch.equal(op(ours[name].clone()), theirs[name]), name
    if arch == "mobilenet_v3_small":
        assert "features.0" in names and "features.0" not in LayerGraph(model).nodes


class FixedWeights(nn.Module):
    """Weights drawn from a generator of its own: the test builds the very model the command
    builds, whatever --seed does."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))

    def forward(self, x):
        return self.fc(self.conv(x).mean(dim=(2, 3)))


@pytest.mark.parametrize("pool", ["none", "avg"])
def test_the_written_input_tensors_give_create_feature_extractors_values_bitwise(
    runner, tmp_path, models_module, pool
):
    """What the docs promise: `-l x --pool none` writes the tensors the model gets, and on those
    create_feature_extractor's values are a layer's rows, bitwise, pooled as asked."""
    import numpy as np

    models_module.model = FixedWeights
    images = write_image_folder(tmp_path / "imgs", {"a": 2, "b": 1}, size=16)
    common = ["--allow-untrained", "--device", "cpu", "-j", "0", "--image-size", "16",
              "--resize-size", "16"]  # fmt: skip
    model_spec = f"{MODELS_MODULE}:model"
    inputs, out = tmp_path / "inputs", tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "extract-features",
            model_spec,
            str(images),
            str(inputs),
            "-l",
            "x",
            "--pool",
            "none",
            *common,
        ],  # fmt: skip
    )
    assert result.exit_code == 0, result.stderr
    result = runner.invoke(
        app,
        [
            "extract-features",
            model_spec,
            str(images),
            str(out),
            "-l",
            "conv",
            "--pool",
            pool,
            *common,
        ],  # fmt: skip
    )
    assert result.exit_code == 0, result.stderr

    x = torch.from_numpy(np.load(inputs / "x.npy"))
    assert x.shape == (3, 3, 16, 16)
    with torch.inference_mode():
        conv = create_feature_extractor(FixedWeights().eval(), ["conv"])(x)["conv"]
    expected = conv if pool == "none" else conv.mean(dim=(2, 3))
    assert torch.equal(torch.from_numpy(np.load(out / "conv.npy")), expected)


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(3, 4, 1)
        self.second = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.first(x), self.second(x)


class TwoMaps(nn.Module):
    """A block traced through whose code returns a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        a, b = self.pair(x)
        return self.head(torch.cat([a, b], dim=1).mean(dim=(2, 3)))


def test_a_block_returning_a_tuple_is_the_last_item_it_computes_as_create_feature_extractor():
    torch.manual_seed(0)
    model = TwoMaps().eval()
    x = torch.randn(2, 3, 8, 8)
    ours = extract(model, ["pair"], x)
    with torch.inference_mode():
        theirs = create_feature_extractor(model, ["pair"])(x)
        second = model.pair.second(x)
    assert torch.equal(ours["pair"], theirs["pair"]) and torch.equal(ours["pair"], second)


class Gated(nn.Module):
    """torch.fx cannot trace it (a branch on a tensor's value); `extra` never runs here."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3)
        self.extra = nn.Conv2d(4, 4, 1)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.stem(x)
        if x.abs().sum() > 1e9:
            x = self.extra(x)
        return self.head(x.mean(dim=(2, 3)))


def test_a_model_fx_cannot_trace_is_read_with_hooks_and_a_module_that_does_not_run_stops_it(
    runner, tmp_path, models_module
):
    models_module.model = Gated
    images = write_image_folder(tmp_path / "imgs", {"a": 2}, size=16)
    common = ["--allow-untrained", "--device", "cpu", "-j", "0", "--image-size", "16",
              "--resize-size", "16"]  # fmt: skip
    spec = f"{MODELS_MODULE}:model"
    with pytest.raises(Exception):  # noqa: B017 - torch.fx's TraceError, whatever its type
        create_feature_extractor(Gated().eval(), ["stem"])

    ok = runner.invoke(
        app, ["extract-features", spec, str(images), str(tmp_path / "ok"), "-l", "stem", *common]
    )
    assert ok.exit_code == 0, ok.stderr
    assert ok.stderr.startswith(f"Warning: torch.fx cannot trace {spec} (")
    assert "layers are module names, read with hooks" in ok.stderr.splitlines()[0]

    out = tmp_path / "out"
    result = runner.invoke(app, ["extract-features", spec, str(images), str(out), "-l", "extra",
                                 *common])  # fmt: skip
    assert result.exit_code == 1
    assert error_line(result.stderr) == (
        f"Error: layer extra of {spec} did not run in the forward pass (pick another layer: "
        "--list-layers lists them)"
    )
    assert not out.exists()
