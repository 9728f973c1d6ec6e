"""`torchkit extract-features` traces the model with torch.fx once per run: the graph that lists
and resolves the layer names also makes the extractor. Its features are checked against
torchvision's own create_feature_extractor, the independent reference."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch
import torchvision
from image_folders import write_image_folder
from torch import fx
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

from torchkit.cli import app
from torchkit.core.features.layers import FeatureExtractor, LayerGraph

MODELS_MODULE = "tk_one_trace_models"  # `MODULE:Callable` specs point here


@pytest.fixture
def models_module(monkeypatch):
    module = types.ModuleType(MODELS_MODULE)
    monkeypatch.setitem(sys.modules, MODELS_MODULE, module)
    return module


@pytest.fixture
def traces(monkeypatch) -> list[str]:
    """The class name of each model torch.fx traces from now on (every tracer's `trace`)."""
    traced: list[str] = []
    original = fx.Tracer.trace

    def counting_trace(self, root, *args, **kwargs):
        traced.append(type(root).__name__)
        return original(self, root, *args, **kwargs)

    monkeypatch.setattr(fx.Tracer, "trace", counting_trace)
    return traced


def _timm_resnet():
    timm = pytest.importorskip("timm")
    return timm.create_model("test_resnet", num_classes=2)


@pytest.mark.parametrize(
    ("factory", "layers"),
    [
        # a module name, a node name and both aliases
        (lambda: torchvision.models.resnet18(num_classes=2), ["layer3", "layer4.1.bn2"]),
        # timm's pre-logits (`penultimate`) come from a tap traced with the rest
        (_timm_resnet, ["layer2"]),
    ],
    ids=["resnet18", "timm_resnet"],
)
def test_a_run_traces_the_model_once(runner, tmp_path, models_module, traces, factory, layers):
    torch.manual_seed(0)
    model = factory()
    models_module.build = lambda: model
    images = write_image_folder(tmp_path / "imgs", {"a": 2, "b": 1}, size=32)
    names = [*layers, "penultimate", "logits"]
    command = ["extract-features", "--device", "cpu", "--allow-untrained", "-j", "0"]
    command += [f"{MODELS_MODULE}:build", str(images), str(tmp_path / "out"), "-b", "2"]
    command += ["--image-size", "32", "--resize-size", "32"]
    for name in names:
        command += ["-l", name]
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.stderr
    assert all((tmp_path / "out" / f"{name}.npy").is_file() for name in names)
    assert traces == [type(model).__name__]  # create_feature_extractor traced twice more


def _features(model, requested: list[str], x) -> dict[str, torch.Tensor]:
    graph = LayerGraph(model, arch="model")
    assert graph.traced
    extractor = FeatureExtractor(graph, graph.resolve(requested))
    try:
        with torch.no_grad():
            return extractor(x)
    finally:
        extractor.close()


def test_features_are_create_feature_extractors():
    """Module names, node names and `penultimate` give, bit for bit, what torchvision's
    create_feature_extractor gives for the same nodes on the same input."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3).eval()
    x = torch.randn(2, 3, 32, 32)
    ours = _features(model, ["layer2", "layer4.0.conv2", "layer1.0.relu", "penultimate"], x)
    nodes = {"layer2": "layer2", "layer4.0.conv2": "layer4.0.conv2"}
    nodes |= {"layer1.0.relu": "layer1.0.relu", "flatten": "penultimate"}
    reference = create_feature_extractor(model, return_nodes=nodes).eval()
    with torch.no_grad():
        expected = reference(x)
    assert set(ours) == set(expected)
    for name, value in expected.items():
        assert torch.equal(ours[name], value), name


def test_layers_inside_torchvision_ops_blocks_are_extracted():
    """MobileNetV3's Conv2dNormActivation and SqueezeExcitation blocks (torchvision.ops) are
    traced through, so the nodes listed inside them are extracted: they were listed, but the
    extractor, traced again with those blocks as leaves, could not find them. Where both can
    serve a name, the features are create_feature_extractor's."""
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(num_classes=3).eval()
    x = torch.randn(2, 3, 32, 32)
    kept = {}
    model.features[0][0].register_forward_hook(lambda m, i, output: kept.update(conv=output))
    ours = _features(model, ["features.0.0", "features", "avgpool", "penultimate"], x)
    reference = create_feature_extractor(model, return_nodes=["features", "avgpool"]).eval()
    with torch.no_grad():
        expected = reference(x)
        model(x)
    assert torch.equal(ours["features.0.0"], kept["conv"])
    assert torch.equal(ours["features"], expected["features"])
    assert torch.equal(ours["avgpool"], expected["avgpool"])
    assert torch.equal(ours["penultimate"], model.classifier[:-1](expected["avgpool"].flatten(1)))


def test_a_timm_models_listing_hides_the_pre_logits_tap_it_was_traced_with(runner):
    # The one trace of a model with timm's API carries the pre-logits tap that `penultimate`
    # reads; --list-layers lists the model's own nodes, as torchvision's tracer names them.
    import timm

    result = runner.invoke(
        app,
        ["extract-features", "timm/test_resnet", "--list-layers", "--image-size", "32"]
        + ["--format", "json"],
    )
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["layers"]
    _, eval_nodes = get_graph_node_names(timm.create_model("test_resnet", pretrained=False))
    assert [row["name"] for row in rows if row["alias_of"] is None] == eval_nodes
    aliases = {row["name"]: row["alias_of"] for row in rows if row["alias_of"] is not None}
    assert aliases == {"penultimate": "<forward_head(pre_logits=True)>", "logits": "fc"}
