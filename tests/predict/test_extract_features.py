"""`torchkit extract-features`: features checked against torchvision's create_feature_extractor and
the classic truncated nn.Sequential on the same preprocessed tensors; OUT layout, formats, resume,
unreadable images and the error lines."""

from __future__ import annotations

import csv
import json
import multiprocessing
import sys
import types
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from checkpoints import add_ema_weights, ema_refusals, write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from PIL import Image
from torch import nn
from torchvision import transforms as T
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

from torchkit.cli import app
from torchkit.core.features import FeatureRequest, extract_features
from torchkit.core.features import store as feature_store
from torchkit.core.features.layers import FeatureExtractor, LayerGraph
from torchkit.core.inference.options import InferenceOptions
from torchkit.core.io.errors import TorchkitError
from torchkit.core.models import ModelSpec
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint
from torchkit.core.models.random_init import skipped_weight_init

ATOL = 1e-5
MODELS_MODULE = "tk_extract_test_models"  # `MODULE:Callable` specs point here


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Six 40x40 RGB images in two classes, plus one 48x36 image so resizing is exercised."""
    root = write_image_folder(
        tmp_path_factory.mktemp("data") / "imgs", {"cat": 3, "dog": 2}, size=40
    )
    pixels = np.random.default_rng(1).integers(0, 256, (36, 48, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(root / "dog" / "wide.png")
    return root


@pytest.fixture
def models_module(monkeypatch):
    """A module that `MODULE:Callable` can import, holding factories the test sets."""
    module = types.ModuleType(MODELS_MODULE)
    monkeypatch.setitem(sys.modules, MODELS_MODULE, module)
    return module


def reference_batch(root: Path, paths: list[str], *, resize: int, crop: int, mean, std):
    """The preprocessing written out by hand (torchvision's eval recipe), stacked in order."""
    transform = T.Compose(
        [T.Resize(resize), T.CenterCrop(crop), T.ToTensor(), T.Normalize(mean, std)]
    )
    return torch.stack([transform(Image.open(root / p).convert("RGB")) for p in paths])


def read_index(out: Path) -> list[dict]:
    with (out / "index.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def run(runner, *args: str):
    # On the CPU, as the hand-written references compute (a later --device wins); models with
    # random weights allowed (the references are computed with the same random weights).
    command = ["extract-features", "--device", "cpu", "--allow-untrained", *args]
    return runner.invoke(app, command)


def assert_close(actual: np.ndarray, expected: torch.Tensor) -> None:
    assert actual.shape == tuple(expected.shape)
    np.testing.assert_allclose(actual, expected.numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("traced", [True, False])
def test_penultimate_of_a_distilled_deit_is_timms_pre_logits(monkeypatch, traced):
    """A distilled DeiT averages two heads, on the class and on the distillation token: its
    penultimate layer is the mean of their inputs, timm's forward_head(x, pre_logits=True),
    not the input of one head; through torch.fx or, where it cannot trace, hooks."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(
        "deit_tiny_distilled_patch16_224", pretrained=False, num_classes=2, img_size=32, depth=1
    ).eval()
    if not traced:
        monkeypatch.setattr(LayerGraph, "_trace", lambda self: 1 / 0)
    graph = LayerGraph(model, arch="deit")
    assert graph.traced is traced
    extractor = FeatureExtractor(graph, graph.resolve(["penultimate", "logits"]))
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        features = extractor(x)
        tokens = model.forward_features(x)
        pre_logits = model.forward_head(tokens, pre_logits=True)
        logits = model(x)
    torch.testing.assert_close(features["penultimate"], pre_logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(features["logits"], logits, rtol=0, atol=1e-6)
    assert not torch.allclose(features["penultimate"], tokens[:, 1], atol=1e-3)  # head_dist's


def _timm_family(name: str):
    """A small random model of a timm family and the square image side it takes."""
    timm = pytest.importorskip("timm")
    if name == "crossvit":  # two branches, a head each (a ModuleList): their tokens concatenated
        model = timm.create_model(
            "crossvit_tiny_240", img_size=48, img_scale=(1.0, 1.0), depth=((1, 1, 0),),
            embed_dim=(16, 32), num_heads=(1, 1),  # 0.1 M weights, not 1.3 M: a tenth the time
        )  # fmt: skip
        return model, 48
    if name == "deit_distilled":  # the class and distillation tokens averaged
        return timm.create_model("deit_tiny_distilled_patch16_224", img_size=32, depth=1), 32
    if name == "levit":  # two heads (BatchNorm, Linear) on one pooled feature
        from timm.models.levit import LevitDistilled

        model = LevitDistilled(
            img_size=32, embed_dim=(16, 24, 32), key_dim=4, num_heads=(1, 1, 1), depth=(1, 1, 1)
        )
        return model, 32
    if name == "convformer":  # a MetaFormer: its pre-logits are the input of its MLP head
        from timm.models.metaformer import MetaFormer, SepConv

        return MetaFormer(depths=(1, 1, 1, 1), dims=(8, 8, 8, 16), token_mixers=SepConv), 32
    if name == "test_vit":
        return timm.create_model(name, img_size=32), 32
    return timm.create_model(name), 32


@pytest.mark.parametrize(
    ("family", "hooks"),
    [
        ("crossvit", False),  # torch.fx cannot trace it: hooks
        ("deit_distilled", False),
        ("levit", False),
        ("convformer", False),
        ("convformer", True),
        ("test_vit", False),
        ("test_resnet", False),
    ],
)
def test_penultimate_of_a_timm_model_is_its_forward_head_pre_logits(monkeypatch, family, hooks):
    """Of a model with timm's API, `penultimate` is what timm defines as the features,
    forward_head(forward_features(x), pre_logits=True), through torch.fx or hooks, beside the
    logits of the same pass: also where that is no classifier's input (CrossViT's two branches
    concatenated, a MetaFormer's before its MLP head). The model is left as it was."""
    torch.manual_seed(0)
    model, side = _timm_family(family)
    model.eval()
    if hooks:
        monkeypatch.setattr(LayerGraph, "_trace", lambda self: 1 / 0)
    graph = LayerGraph(model, arch=family)
    extractor = FeatureExtractor(graph, graph.resolve(["penultimate", "logits"]))
    x = torch.randn(2, 3, side, side)
    try:
        with torch.no_grad():
            features = extractor(x)
    finally:
        extractor.close()
    assert "forward_head" not in vars(model) and not hasattr(model, "torchkit_pre_logits")
    with torch.no_grad():
        pre_logits = model.forward_head(model.forward_features(x), pre_logits=True)
        logits = model(x)
    torch.testing.assert_close(features["penultimate"], pre_logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(features["logits"], logits, rtol=0, atol=1e-6)


class _TwoBranchHeads(nn.Module):
    """CrossViT's heads in small, without timm's forward_head: one classifier per branch (a
    ModuleList that get_classifier names), on features of different widths."""

    def __init__(self) -> None:
        super().__init__()
        self.branches = nn.ModuleList([nn.Conv2d(3, 4, 3), nn.Conv2d(3, 6, 3)])
        self.head = nn.ModuleList([nn.Linear(4, 2), nn.Linear(6, 2)])

    def get_classifier(self):
        return self.head

    def reset_classifier(self, num_classes: int) -> None:
        raise NotImplementedError

    def forward(self, x):
        pooled = [branch(x).mean(dim=(2, 3)) for branch in self.branches]
        return torch.stack([head(p) for head, p in zip(self.head, pooled, strict=True)]).mean(dim=0)


@pytest.mark.parametrize("hooks", [False, True])
def test_penultimate_of_heads_on_features_of_different_widths_is_refused(monkeypatch, hooks):
    """Per-branch classifiers (a ModuleList) read features of different widths: no one of them
    is the penultimate layer (one branch's was taken); the layers are there by name."""
    if hooks:
        monkeypatch.setattr(LayerGraph, "_trace", lambda self: 1 / 0)
    graph = LayerGraph(_TwoBranchHeads().eval(), arch="two_branches")
    assert graph.head_names == ["head.0", "head.1"]
    extractor = FeatureExtractor(graph, graph.resolve(["penultimate"]))
    with pytest.raises(TorchkitError, match=r"different shapes \(4, 6\)"):
        extractor(torch.randn(2, 3, 8, 8))


class _TwoNormedHeads(nn.Module):
    """LeViT's distilled head in small: two heads (BatchNorm then Linear, traced through by
    torch.fx) on the same pooled feature, their outputs averaged, named by get_classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Conv2d(3, 4, 3)
        self.head = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2))
        self.head_dist = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2))

    def get_classifier(self):
        return self.head, self.head_dist

    def reset_classifier(self, num_classes: int) -> None:
        raise NotImplementedError

    def pooled(self, x):
        return self.features(x).mean(dim=(2, 3))

    def forward(self, x):
        x = self.pooled(x)
        return (self.head(x) + self.head_dist(x)) / 2


def test_penultimate_of_heads_that_read_one_feature_is_that_feature():
    torch.manual_seed(0)
    model = _TwoNormedHeads().eval()
    for norm in (model.head[0], model.head_dist[0]):  # statistics that change what they give
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.5, 2)
    graph = LayerGraph(model, arch="two_heads")
    assert graph.traced and graph.lookup("penultimate") == "mean"
    extractor = FeatureExtractor(graph, graph.resolve(["penultimate"]))
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(extractor(x)["penultimate"], model.pooled(x), rtol=0, atol=0)


def test_resnet18_checkpoint_matches_torchvision_and_truncated_sequential(runner, images, tmp_path):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=2).eval()
    preprocess = {
        "image_size": 32,
        "resize_size": 36,
        "mean": [0.5, 0.4, 0.3],
        "std": [0.2, 0.25, 0.3],
        "in_channels": 3,
        "interpolation": "bilinear",
    }
    checkpoint = tmp_path / "resnet.pt"
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "resnet18",
            "num_classes": 2,
            "classes": ["cat", "dog"],
            "model": model.state_dict(),
            "preprocess": preprocess,
        },
        checkpoint,
    )
    out = tmp_path / "out"
    layers = ["-l", "penultimate", "-l", "layer3", "-l", "layer4.1.bn2", "-l", "logits"]
    result = run(runner, str(checkpoint), str(images), str(out), *layers, "-b", "4", "-j", "0")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""

    index = read_index(out)
    paths = [row["path"] for row in index]
    assert paths == ["cat/cat_0.png", "cat/cat_1.png", "cat/cat_2.png"] + [
        "dog/dog_0.png",
        "dog/dog_1.png",
        "dog/wide.png",
    ]
    assert [row["row"] for row in index] == [str(i) for i in range(6)]
    assert [row["label"] for row in index] == ["cat"] * 3 + ["dog"] * 3
    assert all(row["error"] == "" for row in index)

    x = reference_batch(
        images, paths, resize=36, crop=32, mean=preprocess["mean"], std=preprocess["std"]
    )
    with torch.no_grad():
        # The classic recipe: everything but the fc layer, as an nn.Sequential.
        truncated = nn.Sequential(*list(model.children())[:-1])
        penultimate = truncated(x).flatten(1)
        maps = create_feature_extractor(model, ["layer3", "layer4.1.bn2"])(x)
        logits = model(x)
    assert_close(np.load(out / "penultimate.npy"), penultimate)
    assert_close(np.load(out / "layer3.npy"), maps["layer3"].mean(dim=(2, 3)))
    assert_close(np.load(out / "layer4.1.bn2.npy"), maps["layer4.1.bn2"].mean(dim=(2, 3)))
    assert_close(np.load(out / "logits.npy"), logits)

    meta = json.loads((out / "meta.json").read_text())
    assert meta["arch"] == "resnet18"
    assert meta["classes"] == ["cat", "dog"]
    assert meta["preprocess"] == {**preprocess, "crop_mode": "center"}  # none recorded: center
    assert meta["preprocess_source"] == "checkpoint"
    assert meta["num_images"] == meta["num_rows"] == 6
    by_name = {layer["name"]: layer for layer in meta["layers"]}
    assert by_name["penultimate"]["node"] == "flatten"
    assert by_name["layer3"]["node"] == "layer3.1.relu_1"
    assert by_name["layer3"]["shape"] == [6, 256]
    assert by_name["layer3"]["output_shape"] == [256, 2, 2]
    assert by_name["logits"] == {
        "name": "logits",
        "node": "fc",
        "file": "logits.npy",
        "shape": [6, 2],
        "output_shape": [2],
        "dtype": "float32",
    }
    assert not (out / ".partial").exists()


def test_vgg11_matches_truncated_sequential_with_pool_none_flatten(
    runner, images, tmp_path, models_module
):
    # A real vgg11 (its features, its 7x7 average pool, its head's layers and names) with fc6
    # and fc7 64 wide, not 4096: the layers and their names are the subject, not their widths,
    # and 120M weights to fill and multiply cost a second of CPU. Built empty, filled with
    # seeded random weights.
    with torch.device("meta"):
        model = torchvision.models.vgg11(num_classes=3)
        for index, (width_in, width_out) in {0: (512 * 7 * 7, 64), 3: (64, 64), 6: (64, 3)}.items():
            model.classifier[index] = nn.Linear(width_in, width_out)
    model = model.to_empty(device="cpu").eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.uniform_(-0.03, 0.03, generator=generator)
    models_module.vgg = lambda: model
    out = tmp_path / "out"
    options = ["--image-size", "32", "--resize-size", "32", "--mean", "0.5", "--std", "0.25"]
    layers = ["-l", "penultimate", "-l", "classifier.3", "-l", "features", "-l", "features.18"]
    result = run(
        runner,
        f"{MODELS_MODULE}:vgg",
        str(images),
        str(out),
        *layers,
        *options,
        "--pool",
        "none",
        "--flatten",
        "-j",
        "0",
    )
    assert result.exit_code == 0, result.stderr
    paths = [row["path"] for row in read_index(out)]
    x = reference_batch(images, paths, resize=32, crop=32, mean=[0.5] * 3, std=[0.25] * 3)
    with torch.no_grad():
        pool5 = model.features(x)
        flat = torch.flatten(model.avgpool(pool5), 1)
        head = list(model.classifier.children())
        # The cheat-sheet's "fc7" cuts three layers: fc7 before its ReLU.
        fc7_linear = nn.Sequential(*head[:-3])(flat)
        # The head's input, head[:-1], is that truncation's tail on it (not fc6 again): its
        # ReLU is in place, so on a copy.
        fc7 = nn.Sequential(*head[-3:-1])(fc7_linear.clone())
        conv5_2 = model.features[:-2](x)  # before its ReLU(inplace=True)
    assert_close(np.load(out / "penultimate.npy"), fc7)
    assert_close(np.load(out / "classifier.3.npy"), fc7_linear)
    assert_close(np.load(out / "features.npy"), pool5.flatten(1))
    assert_close(np.load(out / "features.18.npy"), conv5_2.flatten(1))
    assert (conv5_2 < 0).any()  # so the in-place ReLU would have shown
    meta = json.loads((out / "meta.json").read_text())
    assert [layer["node"] for layer in meta["layers"]] == [
        "classifier.5",
        "classifier.3",
        "features.20",
        "features.18",
    ]
    assert meta["preprocess"]["mean"] == [0.5] * 3


def test_weights_path_keeps_its_head_and_uses_the_standard_transform(runner, images, tmp_path):
    torch.manual_seed(1)
    model = torchvision.models.resnet18(num_classes=5).eval()
    weights = tmp_path / "weights.pth"
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, weights)
    out = tmp_path / "out"
    result = run(
        runner, "resnet18", str(images), str(out), "--weights", str(weights), "-l", "logits",
        "--image-size", "32", "-j", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    paths = [row["path"] for row in read_index(out)]
    # torchvision's ResNet eval transform, scaled: resize 256/224 of the crop, ImageNet stats.
    x = reference_batch(
        images, paths, resize=37, crop=32, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]
    )
    with torch.no_grad():
        assert_close(np.load(out / "logits.npy"), model(x))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["preprocess_source"] == "torchvision"
    assert meta["preprocess"]["resize_size"] == 37

    plain = run(runner, str(weights), str(images), str(tmp_path / "o2"))
    assert plain.exit_code == 2
    assert "holds plain weights (a state dict)" in plain.stderr
    assert "--weights" in plain.stderr
    assert "Traceback" not in plain.stderr


def test_ema_extracts_the_checkpoints_ema_weights(runner, images, tmp_path):
    from torchkit.core.models.convnet import convnet_class

    torch.manual_seed(0)
    model, ema_model = (convnet_class()(2, 3, 16).eval() for _ in range(2))
    ckpt = tmp_path / "ema.pt"
    preprocess = {"image_size": 16, "resize_size": 16, "mean": [0.5] * 3, "std": [0.25] * 3}
    save_checkpoint(
        {"format_version": FORMAT_VERSION, "arch": "convnet", "num_classes": 2,
         "classes": ["cat", "dog"], "model": model.state_dict(), "preprocess": preprocess},
        ckpt,
    )  # fmt: skip
    add_ema_weights(ckpt, ema_model)
    features = {}
    for name, extra in (("ema", ["--ema"]), ("plain", [])):
        out = tmp_path / name
        result = run(runner, str(ckpt), str(images), str(out), "-l", "logits", "-j", "0", *extra)
        assert result.exit_code == 0, result.stderr
        assert json.loads((out / "meta.json").read_text())["ema"] is bool(extra)
        features[name] = np.load(out / "logits.npy")
    paths = [row["path"] for row in read_index(tmp_path / "ema")]
    x = reference_batch(images, paths, resize=16, crop=16, mean=[0.5] * 3, std=[0.25] * 3)
    with torch.no_grad():
        assert_close(features["ema"], ema_model(x))
        assert_close(features["plain"], model(x))
    # A run is resumed only with the weights it was started with.
    refused = run(runner, str(ckpt), str(images), str(tmp_path / "plain"), "--ema", "--resume")
    assert refused.exit_code == 2 and "another model" in error_line(refused.stderr)


@pytest.mark.parametrize(
    "case", ["no EMA weights", "a model name", "a state dict", "an exported file"]
)
def test_ema_refuses_what_eval_refuses_with_evals_error(runner, images, tmp_path, case):
    ckpt = tmp_path / "model.pt"
    write_convnet_checkpoint(ckpt, in_channels=3, image_size=16, classes="cd")
    model = ema_refusals(tmp_path, ckpt)[case]
    result = run(runner, *model, str(images), str(tmp_path / "out"), "--ema")
    evaluated = runner.invoke(app, ["eval", *model, "--data", str(images), "--ema"])
    assert result.exit_code == evaluated.exit_code == (1 if case == "no EMA weights" else 2)
    assert error_line(result.stderr) == error_line(evaluated.stderr)
    assert "--ema" in error_line(result.stderr)
    assert not (tmp_path / "out").exists()
    listing = runner.invoke(app, ["extract-features", *model, "--list-layers", "--ema"])
    assert error_line(listing.stderr) == error_line(evaluated.stderr)


def test_list_layers_names_shapes_and_aliases(runner):
    result = run(runner, "resnet18", "--list-layers", "--image-size", "32", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    layers = {row["name"]: row for row in data["layers"]}
    with skipped_weight_init():  # its graph's names need no weights
        reference = torchvision.models.resnet18()
    _, eval_nodes = get_graph_node_names(reference)
    assert [row["name"] for row in data["layers"] if row["alias_of"] is None] == eval_nodes
    assert layers["layer4.1.relu_1"]["output_shape"] == [512, 1, 1]
    assert layers["conv1"]["op"] == "Conv2d"
    assert layers["penultimate"]["alias_of"] == "flatten"
    assert layers["penultimate"]["output_shape"] == [512]
    assert layers["logits"] == {
        "name": "logits",
        "op": "alias",
        "output_shape": [1000],
        "alias_of": "fc",
    }
    assert data["image_size"] == 32 and data["traced"] is True

    table = run(runner, "resnet18", "--list-layers", "--image-size", "32", "--format", "csv")
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0] == "name,op,output_shape,alias_of"  # the JSON's keys, not display text
    assert "layer4.1.relu_1,ReLU,512x1x1," in lines and "logits,alias,1000,fc" in lines

    wrong = run(runner, "resnet18", "--list-layers", "--format", "npy")
    assert wrong.exit_code == 2
    assert "Error: --format npy does not apply to --list-layers" in wrong.stderr


class _UnusedLayer(nn.Module):
    """A layer that never runs (a ViT's attention dropout under fused attention), in a model
    torch.fx cannot trace (control flow on a tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.unused = nn.Dropout()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        x = self.conv(x).mean(dim=(2, 3))
        return self.fc(x) if x.sum() < 1e9 else self.fc(x) * 2


def test_list_layers_of_an_untraced_model_shows_the_shapes_of_the_layers_that_run():
    graph = LayerGraph(_UnusedLayer().eval(), arch="unused")
    assert not graph.traced
    shapes = {row.name: row.shape for row in graph.describe(8, 3)}
    assert shapes == {
        "conv": [4, 6, 6],
        "unused": None,
        "fc": [2],
        "penultimate": [4],
        "logits": [2],
    }


def test_list_layers_output_name_picks_the_format(runner, tmp_path):
    listing = tmp_path / "layers.json"
    result = run(runner, "convnet", "--list-layers", "--image-size", "16", "-o", str(listing))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert json.loads(listing.read_text())["model"] == "convnet"
    refused = run(runner, "convnet", "--list-layers", "-o", str(listing))
    assert refused.exit_code == 1 and "already exists" in error_line(refused.stderr)


def test_list_layers_output_is_never_the_checkpoint_it_lists_even_with_force(runner, tmp_path):
    checkpoint = tmp_path / "best.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    before = checkpoint.read_bytes()
    result = run(runner, str(checkpoint), "--list-layers", "-o", str(checkpoint), "--force")
    assert result.exit_code != 0
    assert error_line(result.stderr).startswith(f"Error: output {checkpoint} is the model file")
    assert checkpoint.read_bytes() == before


def test_format_npy_pt_safetensors_still_names_the_array_format_with_a_warning(
    runner, images, tmp_path
):
    out = tmp_path / "pt"
    result = run(runner, "convnet", str(images), str(out), "--image-size", "16", "-j", "0",
                 "--format", "pt")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "Warning: --format pt is deprecated for array files: use --array-format pt" in (
        result.stderr
    )
    assert (out / "penultimate.pt").is_file()


def test_unknown_layer_lists_close_names(runner, images, tmp_path):
    result = run(runner, "resnet18", str(images), str(tmp_path / "out"), "-l", "layer4.1.relu1")
    assert result.exit_code == 2
    assert "Error: resnet18 has no layer 'layer4.1.relu1'" in result.stderr
    assert "did you mean layer4.1.relu_1" in result.stderr
    assert "--list-layers" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


class _PairOut(nn.Module):
    """A model without an nn.Linear whose forward returns a tuple: no penultimate, no logits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3)

    def forward(self, x):
        scores = self.conv(x).mean(dim=(2, 3))
        return scores, scores.softmax(1)


def test_a_missing_alias_is_explained_not_suggested_as_itself(
    runner, images, tmp_path, models_module
):
    models_module.pair_out = _PairOut
    model = f"{MODELS_MODULE}:pair_out"
    default = run(runner, model, str(images), str(tmp_path / "a"))  # -l penultimate
    assert default.exit_code == 2
    line = error_line(default.stderr)
    assert f"Error: {model} has no layer 'penultimate' (penultimate is the input of the" in line
    assert "it has no nn.Linear classifier" in line and "did you mean" not in line
    logits = run(runner, model, str(images), str(tmp_path / "b"), "-l", "logits")
    assert logits.exit_code == 2
    line = error_line(logits.stderr)
    assert "logits is the model's output, and its forward returns a tuple: its items are the " \
        "layers mean, softmax" in line  # fmt: skip
    assert "did you mean" not in line
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_unknown_layer_names_the_model_as_given_and_how_to_list_its_layers(
    runner, images, tmp_path
):
    # Named as `convnet`, the hint listed the layers of another model (a default convnet).
    checkpoint = tmp_path / "my model.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    result = run(runner, str(checkpoint), str(images), str(tmp_path / "out"), "-l", "fetures")
    assert result.exit_code == 2
    assert error_line(result.stderr).startswith(f"Error: {checkpoint} has no layer 'fetures'")
    assert "did you mean features" in result.stderr
    listing = f"`torchkit extract-features '{checkpoint}' --list-layers` lists them"
    assert listing in result.stderr
    result = run(runner, "convnet", str(images), str(tmp_path / "out"), "--weights",
                 str(checkpoint), "--trust-checkpoint", "-l", "fetures")  # fmt: skip
    assert error_line(result.stderr).startswith("Error: convnet has no layer 'fetures'")
    listing = f"convnet --weights '{checkpoint}' --trust-checkpoint --list-layers` lists them"
    assert listing in result.stderr
    assert not (tmp_path / "out").exists()


class Branchy(nn.Module):
    """torch.fx cannot trace the data-dependent `if`: layers come from hooks on modules."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True))
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        x = self.body(x)
        if x.sum() > 0:
            x = x * 2
        return self.head(x.mean(dim=(2, 3)))


def test_untraceable_model_uses_hooks(runner, images, tmp_path, models_module):
    torch.manual_seed(0)
    model = Branchy().eval()
    models_module.branchy = lambda: model
    out = tmp_path / "out"
    result = run(
        runner, f"{MODELS_MODULE}:branchy", str(images), str(out), "-l", "penultimate",
        "-l", "body.0", "-l", "logits", "--image-size", "16", "--resize-size", "16",
        "--channels-last", "-j", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "cannot trace" in result.stderr
    paths = [row["path"] for row in read_index(out)]
    x = reference_batch(
        images, paths, resize=16, crop=16, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]
    )
    with torch.no_grad():
        conv = model.body[0](x)
        logits = model(x)
        pooled = model.body(x).mean(dim=(2, 3)) * 2
    assert_close(np.load(out / "body.0.npy"), conv.mean(dim=(2, 3)))  # before the in-place ReLU
    assert_close(np.load(out / "penultimate.npy"), pooled)
    assert_close(np.load(out / "logits.npy"), logits)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["layers"][0]["node"] == "<input of the classifier>"


class OneScore(nn.Module):
    """A model of one output per image, squeezed to (N,): a binary classifier's single logit."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(self.conv(x).mean(dim=(2, 3))).squeeze(1)


def test_normalize_l2_of_a_layer_of_one_value_per_image_gives_its_sign(
    runner, images, tmp_path, models_module
):
    torch.manual_seed(0)
    model = OneScore().eval()
    models_module.one_score = lambda: model
    out = tmp_path / "out"
    result = run(
        runner, f"{MODELS_MODULE}:one_score", str(images), str(out), "-l", "logits", "-l", "conv",
        "--normalize", "l2", "--image-size", "16", "--resize-size", "16", "-j", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    x = reference_batch(
        images, [row["path"] for row in read_index(out)], resize=16, crop=16,
        mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225],
    )  # fmt: skip
    with torch.no_grad():
        logits, conv = model(x), model.conv(x).mean(dim=(2, 3))
    assert np.load(out / "logits.npy").shape == (len(x),)
    assert_close(np.load(out / "logits.npy"), torch.sign(logits))
    assert_close(np.load(out / "conv.npy"), conv / conv.norm(dim=1, keepdim=True))


class ChannelsLast(nn.Module):
    """A Swin-style model: its stage gives a channels-last (N, H, W, C) map, normed over C."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 5, 4, stride=4)
        self.norm = nn.LayerNorm(5)
        self.head = nn.Linear(5, 2)

    def forward(self, x):
        x = self.norm(self.embed(x).permute(0, 2, 3, 1))
        return self.head(x.mean(dim=(1, 2)))


@pytest.mark.parametrize("pool", ["avg", "max"])
def test_channels_last_maps_are_pooled_over_height_and_width(
    runner, images, tmp_path, models_module, pool
):
    # torchvision's swin_t `-l norm` (7x7x768) gave 7 values an image: the mean over W and C.
    torch.manual_seed(0)
    model = ChannelsLast().eval()
    models_module.channels_last = lambda: model
    out = tmp_path / "out"
    sizes = ["--image-size", "16", "--resize-size", "16", "--mean", "0.5", "--std", "0.25"]
    result = run(
        runner, f"{MODELS_MODULE}:channels_last", str(images), str(out), "-l", "norm",
        "-l", "embed", "--pool", pool, *sizes, "-j", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    paths = [row["path"] for row in read_index(out)]
    x = reference_batch(images, paths, resize=16, crop=16, mean=[0.5] * 3, std=[0.25] * 3)
    with torch.no_grad():
        conv = model.embed(x)
        stage = model.norm(conv.permute(0, 2, 3, 1))
    reduce = torch.Tensor.mean if pool == "avg" else torch.Tensor.amax
    assert_close(np.load(out / "norm.npy"), reduce(stage, dim=(1, 2)))
    assert_close(np.load(out / "embed.npy"), reduce(conv, dim=(2, 3)))
    by_name = {
        layer["name"]: layer for layer in json.loads((out / "meta.json").read_text())["layers"]
    }
    assert by_name["norm"]["output_shape"] == [4, 4, 5]
    assert by_name["norm"]["shape"] == [6, 5]


def test_images_reach_a_4_channel_model_as_rgba_and_a_2_channel_model_is_refused(
    runner, images, tmp_path, models_module
):
    # The channel rule of eval and predict: RGBA for a 4-channel stem (an RGB file gets an
    # opaque alpha); a 2-channel stem is a usage error before any output is made.
    torch.manual_seed(0)
    four = nn.Sequential(nn.Conv2d(4, 2, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    models_module.four = lambda: four
    models_module.two = lambda: nn.Sequential(nn.Conv2d(2, 2, 1), nn.Flatten())
    sizes = ["--image-size", "16", "--resize-size", "16", "--mean", "0.5", "--std", "0.25"]
    out = tmp_path / "four"
    result = run(
        runner, f"{MODELS_MODULE}:four", str(images), str(out), "-l", "2", *sizes, "-j", "0"
    )
    assert result.exit_code == 0, result.stderr
    paths = [row["path"] for row in read_index(out)]
    transform = T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor(), T.Normalize(0.5, 0.25)])
    x = torch.stack([transform(Image.open(images / p).convert("RGBA")) for p in paths])
    with torch.no_grad():
        assert_close(np.load(out / "2.npy"), four(x))
    out = tmp_path / "two"
    result = run(runner, f"{MODELS_MODULE}:two", str(images), str(out), *sizes)
    assert result.exit_code == 2
    assert error_line(result.stderr) == "Error: cannot feed images to a model with 2 channels"
    assert not out.exists()


def test_unreadable_images_are_recorded_or_fatal_with_strict(runner, tmp_path):
    root = tmp_path / "imgs"
    write_image_folder(root, {"a": 2, "b": 2}, size=20)
    (root / "a" / "a_bad.png").write_bytes(b"not a png")
    (root / "b" / "b_0.png").write_bytes(b"")  # zero bytes
    out = tmp_path / "out"
    args = ["convnet", str(root), str(out), "--image-size", "16", "-b", "2", "-j", "0"]
    result = run(runner, *args, "-l", "features")
    assert result.exit_code == 0, result.stderr
    assert "skipped 2 unreadable image(s)" in result.stderr
    index = read_index(out)
    assert [(r["row"], r["path"]) for r in index] == [
        ("0", "a/a_0.png"),
        ("1", "a/a_1.png"),
        ("", "a/a_bad.png"),
        ("", "b/b_0.png"),
        ("2", "b/b_1.png"),
    ]
    assert index[2]["error"] == "not an image PIL can read"
    assert index[3]["error"] and index[4]["error"] == ""
    features = np.load(out / "features.npy")
    assert features.shape == (3, 64)
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["num_images"], meta["num_rows"], meta["num_skipped"]) == (5, 3, 2)

    # The rows of the readable images are their features, as in a folder without the bad ones.
    (root / "a" / "a_bad.png").unlink()
    (root / "b" / "b_0.png").unlink()
    clean = tmp_path / "clean"
    assert run(runner, *args[:2], str(clean), *args[3:], "-l", "features").exit_code == 0
    assert np.array_equal(np.load(clean / "features.npy"), features)

    (root / "a" / "a_bad.png").write_bytes(b"not a png")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    # --force whose run fails before writing a row (the bad image is in the first batch of 64)
    # puts the previous OUT back as it was.
    first_batch = [*args[:-4], "-b", "64", "-j", "1"]
    strict = run(runner, *first_batch, "-l", "features", "--strict", "--force")
    assert strict.exit_code == 1
    assert multiprocessing.active_children() == []  # its loader's worker stopped with it
    assert f"Error: unreadable image {root / 'a' / 'a_bad.png'}: " in strict.stderr
    assert "Traceback" not in strict.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not list(tmp_path.glob(".out*"))
    # Once a batch is written the new run replaces it (and can be resumed).
    strict = run(runner, *args, "-l", "features", "--strict", "--force")
    assert strict.exit_code == 1 and "a_bad.png" in strict.stderr
    assert not (out / "features.npy").exists() and not list(tmp_path.glob(".out*"))
    assert "interrupted extraction" in run(runner, *args, "-l", "features").stderr


def test_existing_out_needs_force_or_resume(runner, images, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    args = ["convnet", str(images), str(out), "--image-size", "16", "-j", "0"]
    refused = run(runner, *args)
    assert refused.exit_code == 1
    assert "Error: output folder already exists" in refused.stderr
    assert "--force" in refused.stderr
    assert (out / "notes.txt").read_text() == "keep me"

    nothing = run(runner, *args, "--resume")
    assert nothing.exit_code == 1
    assert "nothing to resume" in nothing.stderr

    both = run(runner, *args, "--resume", "--force")
    assert both.exit_code == 2
    assert "--resume and --force contradict each other" in both.stderr

    # --force replaces only what torchkit wrote: the user's folder stays as it is.
    refused = run(runner, *args, "--force")
    assert refused.exit_code == 1
    assert "was not written by torchkit" in refused.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "keep me"

    (out / "notes.txt").unlink()  # an empty folder is fine
    first = run(runner, *args)
    assert first.exit_code == 0, first.stderr
    assert (out / "penultimate.npy").is_file()  # the default layer
    forced = run(runner, *args, "--force")  # over its own OUT
    assert forced.exit_code == 0, forced.stderr

    again = run(runner, *args, "--resume")
    assert again.exit_code == 0
    assert "already complete" in again.stderr

    other = run(runner, *args, "--resume", "--normalize", "l2")
    assert other.exit_code == 2
    assert "another model, layers, options, images or labels" in other.stderr


def test_resume_after_interruption_equals_an_uninterrupted_run(runner, tmp_path):
    root = tmp_path / "imgs"
    write_image_folder(root, {"a": 4, "b": 3}, size=20)
    (root / "a" / "a_00.png").write_bytes(b"broken")  # 2nd image: before the interruption
    (root / "b" / "b_9.png").write_bytes(b"broken")  # last image: after it
    # Bitwise comparisons: the CPU's kernels (a GPU's may pick other algorithms per run).
    options = ["--image-size", "16", "-l", "features", "-l", "penultimate", "-b", "2",
               "--device", "cpu"]  # fmt: skip

    full = tmp_path / "full"
    result = run(runner, "convnet", str(root), str(full), *options, "-j", "1")
    assert result.exit_code == 0, result.stderr

    class Stop(Exception):
        pass

    calls = []

    def stop_after_two_batches(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 3:  # the initial call, then two batches
            raise Stop

    part = tmp_path / "part"
    request = FeatureRequest(
        ModelSpec("convnet", image_size=16, allow_untrained=True), str(root), str(part),
        layers=["features", "penultimate"],
        run=InferenceOptions(batch_size=2, workers=0, device="cpu"),
    )  # fmt: skip
    with pytest.raises(Stop):
        extract_features(request, progress=stop_after_two_batches)
    assert calls == [0, 2, 4]
    assert (part / ".partial" / "progress.json").is_file()
    assert not (part / "meta.json").exists()

    refused = run(runner, "convnet", str(root), str(part), *options)
    assert refused.exit_code == 1
    assert "holds an interrupted extraction" in refused.stderr
    assert "--resume" in refused.stderr
    # A file of the user's in it: --force would be refused, so the hint does not offer it.
    (part / "notes.txt").write_text("mine")
    held = run(runner, "convnet", str(root), str(part), *options)
    assert f"pass --resume to continue it; it holds {part / 'notes.txt'} that torchkit did " in (
        error_line(held.stderr)
    )
    (part / "notes.txt").unlink()

    resumed = run(runner, "convnet", str(root), str(part), *options, "--resume", "-j", "0")
    assert resumed.exit_code == 0, resumed.stderr
    assert "resumed at image 5" in resumed.stderr
    for name in ("features.npy", "penultimate.npy"):
        assert np.array_equal(np.load(part / name), np.load(full / name))
    assert (part / "index.csv").read_text() == (full / "index.csv").read_text()
    assert (part / "meta.json").read_text() == (full / "meta.json").read_text()
    assert not (part / ".partial").exists()

    # Random weights come from --seed: another seed is another model.
    other = tmp_path / "other"
    assert run(runner, "convnet", str(root), str(other), *options, "--seed", "1").exit_code == 0
    assert not np.allclose(np.load(other / "penultimate.npy"), np.load(full / "penultimate.npy"))


def test_a_stop_as_a_batch_is_recorded_does_not_write_its_rows_twice(runner, tmp_path, monkeypatch):
    import signal

    from torchkit.core.features import store as feature_store

    root = write_image_folder(tmp_path / "imgs", {"a": 3, "b": 3}, size=20)
    options = ["--image-size", "16", "-l", "penultimate", "-b", "2", "-j", "0"]
    full = tmp_path / "full"
    assert run(runner, "convnet", str(root), str(full), *options).exit_code == 0

    class SignalledProgress(feature_store.Progress):
        """Ctrl-C comes once the record counts the 2nd batch's rows, before it counts its
        images (the old record: rows 4, images 2, so --resume wrote that batch again)."""

        def __setattr__(self, name, value):
            if name == "nonfinite" and self.rows == 4 and not getattr(self, "stopped", False):
                object.__setattr__(self, "stopped", True)
                signal.raise_signal(signal.SIGINT)
            super().__setattr__(name, value)

    monkeypatch.setattr(feature_store, "Progress", SignalledProgress)
    part = tmp_path / "part"
    request = FeatureRequest(
        ModelSpec("convnet", image_size=16, allow_untrained=True), str(root), str(part),
        layers=["penultimate"], run=InferenceOptions(batch_size=2, workers=0, device="cpu"),
    )  # fmt: skip
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            extract_features(request)
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    progress = json.loads((part / ".partial" / "progress.json").read_text())
    assert (progress["done"], progress["rows"]) == (4, 4)

    resumed = run(runner, "convnet", str(root), str(part), *options, "--resume")
    assert resumed.exit_code == 0, resumed.stderr
    assert np.array_equal(np.load(part / "penultimate.npy"), np.load(full / "penultimate.npy"))
    assert (part / "index.csv").read_text() == (full / "index.csv").read_text()


def test_pt_and_safetensors_float16_l2(runner, images, tmp_path):
    from safetensors.numpy import load_file

    common = ["convnet", str(images)]
    options = ["--image-size", "16", "-l", "features", "-l", "logits", "--normalize", "l2"]
    reference = tmp_path / "npy"
    result = run(runner, *common, str(reference), *options, "--pool", "max", "-j", "0")
    assert result.exit_code == 0, result.stderr
    pt = tmp_path / "pt"
    result = run(runner, *common, str(pt), *options, "--pool", "max", "--array-format", "pt",
                 "--dtype", "float16", "-j", "0")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    st = tmp_path / "st"
    result = run(runner, *common, str(st), *options, "--pool", "none", "--array-format",
                 "safetensors", "-j", "0")  # fmt: skip
    assert result.exit_code == 0, result.stderr

    expected = np.load(reference / "features.npy")
    assert expected.shape == (6, 64)
    np.testing.assert_allclose(np.linalg.norm(expected, axis=1), 1.0, rtol=1e-5)
    from_pt = torch.load(pt / "features.pt", weights_only=True)
    assert from_pt.dtype == torch.float16 and from_pt.shape == (6, 64)
    np.testing.assert_allclose(from_pt.float().numpy(), expected, atol=1e-3)
    names = {p.name for p in pt.iterdir()}
    assert names == {"features.pt", "logits.pt", "index.csv", "meta.json", ".torchkit"}

    maps = load_file(str(st / "features.safetensors"))["features"]
    assert maps.dtype == np.float32 and maps.shape == (6, 64, 6, 6)
    np.testing.assert_allclose(np.linalg.norm(maps.reshape(6, -1), axis=1), 1.0, rtol=1e-5)
    # Unit-norm maps, max-pooled, then scaled to unit norm again, give the max-pooled reference.
    pooled = maps.max(axis=(2, 3))
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    np.testing.assert_allclose(pooled, expected, atol=1e-5)
    logits = load_file(str(st / "logits.safetensors"))["logits"]
    np.testing.assert_allclose(logits, np.load(reference / "logits.npy"), atol=1e-6)


def test_weights_default_offline_is_a_clear_error(runner, images, tmp_path, monkeypatch):
    import torchvision.models._api as api

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(api, "load_state_dict_from_url", offline)
    result = run(runner, "resnet18", str(images), str(tmp_path / "out"), "--weights", "DEFAULT")
    assert result.exit_code == 1
    assert "Error: cannot download the DEFAULT weights of resnet18" in result.stderr
    assert "--weights PATH" in result.stderr
    assert "Traceback" not in result.stderr

    unknown = run(runner, "resnet18", str(images), str(tmp_path / "out"), "--weights", "NOPE")
    assert unknown.exit_code == 2
    assert "unknown weights 'NOPE' for resnet18" in unknown.stderr

    builtin = run(runner, "convnet", str(images), str(tmp_path / "out"), "--weights", "DEFAULT")
    assert builtin.exit_code == 2
    assert "--weights DEFAULT: there is no such file" in builtin.stderr


def test_command_line_mistakes(runner, images, tmp_path):
    missing = run(runner, "resnet18")
    assert missing.exit_code == 2
    assert "IMAGES and OUT are needed" in missing.stderr
    no_images = run(runner, "resnet18", str(tmp_path / "nope"), str(tmp_path / "out"))
    assert no_images.exit_code == 1
    assert "Error:" in no_images.stderr and "nope" in no_images.stderr
    bad_format = run(runner, "convnet", str(images), str(tmp_path / "o"), "--format", "json")
    assert bad_format.exit_code == 2
    assert error_line(bad_format.stderr, besides="nothing") == (
        "Error: --format json applies to the --list-layers listing; a run writes its features "
        "to OUT (the array files' format is --array-format)"
    )
    with_images = run(runner, "resnet18", str(images), "--list-layers")
    assert with_images.exit_code == 2
    assert "--list-layers takes only MODEL" in with_images.stderr
    bad_mean = run(runner, "convnet", str(images), str(tmp_path / "o"), "--mean", "0.1,0.2")
    assert bad_mean.exit_code == 2
    assert "--mean has 2 values but the images have 3 channels" in bad_mean.stderr


def test_csv_index_and_flat_folder(runner, images, tmp_path):
    index_csv = tmp_path / "index.csv"
    index_csv.write_text(f"path,label\n{images}/dog/wide.png,dog\n{images}/cat/cat_1.png,cat\n")
    options = ["--image-size", "16", "-l", "logits", "-j", "0"]
    from_csv = tmp_path / "csv"
    assert run(runner, "convnet", str(index_csv), str(from_csv), *options).exit_code == 0
    rows = read_index(from_csv)
    assert [(r["path"], r["label"]) for r in rows] == [
        (f"{images}/dog/wide.png", "dog"),
        (f"{images}/cat/cat_1.png", "cat"),
    ]
    flat = tmp_path / "flat"
    assert run(runner, "convnet", str(images / "cat"), str(flat), *options).exit_code == 0
    flat_rows = read_index(flat)
    assert [(r["path"], r["label"]) for r in flat_rows] == [
        ("cat_0.png", ""),
        ("cat_1.png", ""),
        ("cat_2.png", ""),
    ]
    # The same image gives the same row whichever way it was listed.
    assert np.array_equal(np.load(from_csv / "logits.npy")[1], np.load(flat / "logits.npy")[1])


def test_channels_last_and_amp(runner, images, tmp_path):
    options = ["--image-size", "16", "-l", "features", "-l", "logits", "-j", "0"]
    plain, fast, amp = tmp_path / "plain", tmp_path / "fast", tmp_path / "amp"
    assert run(runner, "convnet", str(images), str(plain), *options).exit_code == 0
    result = run(runner, "convnet", str(images), str(fast), *options, "--channels-last")
    assert result.exit_code == 0, result.stderr
    result = run(runner, "convnet", str(images), str(amp), *options, "--amp")
    assert result.exit_code == 0, result.stderr
    for name in ("features.npy", "logits.npy"):
        expected = np.load(plain / name)
        np.testing.assert_allclose(np.load(fast / name), expected, atol=ATOL)
        # bfloat16 keeps about 3 significant digits.
        low = np.load(amp / name)
        assert low.dtype == np.float32
        np.testing.assert_allclose(low, expected, atol=0.05 * np.abs(expected).max())
    assert json.loads((amp / "meta.json").read_text())["amp"] is True


def test_shrinking_a_npy_in_place_keeps_the_rows(tmp_path):
    from numpy.lib.format import open_memmap

    from torchkit.core.features.store import _set_rows

    path = tmp_path / "a.npy"
    array = open_memmap(path, mode="w+", dtype="float32", shape=(1000, 3))
    array[:] = np.arange(3000, dtype=np.float32).reshape(1000, 3)
    array.flush()
    del array
    _set_rows(path, 7)
    shrunk = np.load(path)
    assert shrunk.shape == (7, 3)
    assert np.array_equal(shrunk, np.arange(21, dtype=np.float32).reshape(7, 3))
    assert path.stat().st_size == 128 + 7 * 3 * 4


def test_random_weights_are_refused_unless_allowed(runner, images, tmp_path):
    """Before: a model without weights gave random features, silently (as predict and eval
    refuse it)."""
    out = tmp_path / "feats"
    command = ["extract-features", "convnet", str(images), str(out), "--device", "cpu"]
    refused = runner.invoke(app, command)
    assert refused.exit_code == 2
    assert error_line(refused.stderr, besides="nothing") == (
        "Error: convnet has random weights (no --weights given): its answers would be noise "
        "(pass a checkpoint as MODEL or --weights FILE; --allow-untrained to run it anyway)"
    )
    assert not out.exists()
    allowed = runner.invoke(app, [*command, "--allow-untrained", "--image-size", "16", "-j", "0"])
    assert allowed.exit_code == 0, allowed.stderr
    assert (out / "penultimate.npy").is_file()


def test_digits_and_paths_on_stdin_are_images_as_predict_reads_them(runner, images, tmp_path):
    """IMAGES is read as predict reads it: `digits`, and `-` for paths on stdin (one per line;
    a listed file that is gone is a row with its error). Before: "IMAGES not found"."""
    digits = run(runner, "convnet", "digits", str(tmp_path / "d"), "--split", "test",
                 "--image-size", "8", "-j", "0")  # fmt: skip
    assert digits.exit_code == 0, digits.stderr
    rows = read_index(tmp_path / "d")
    assert len(rows) == 179 and {row["split"] for row in rows} == {"test"}
    assert np.load(tmp_path / "d" / "penultimate.npy").shape == (179, 128)

    files = sorted(str(p) for p in images.rglob("*.png"))[:3]
    listed = "\n".join([*files, str(images / "gone.png")]) + "\n"
    out = tmp_path / "s"
    command = ["extract-features", "--device", "cpu", "--allow-untrained", "convnet", "-", str(out)]
    piped = runner.invoke(app, [*command, "--image-size", "16", "-j", "0"], input=listed)
    assert piped.exit_code == 0, piped.stderr
    rows = read_index(out)
    assert [row["path"] for row in rows] == [*files, str(images / "gone.png")]
    assert [row["row"] for row in rows] == ["0", "1", "2", ""]
    assert rows[3]["error"] == "file not found"
    assert np.load(out / "penultimate.npy").shape == (3, 128)


def test_out_may_not_hold_the_images_listed_on_stdin(runner, images, tmp_path):
    """OUT --force over an earlier torchkit output that holds the images piped for `-` deleted
    them (the listed images were no input of the overlap check)."""
    marked = tmp_path / "marked"
    first = run(runner, "convnet", str(images), str(marked), "--image-size", "16", "-j", "0")
    assert first.exit_code == 0, first.stderr
    (marked / "photos").mkdir()
    (marked / "photos" / "a.png").write_bytes((images / "cat" / "cat_0.png").read_bytes())
    command = ["extract-features", "--device", "cpu", "--allow-untrained", "convnet", "-"]
    refused = runner.invoke(
        app,
        [*command, str(marked), "--force", "--image-size", "16", "-j", "0"],
        input=f"{marked / 'photos' / 'a.png'}\n",
    )
    assert refused.exit_code == 1, refused.stderr
    assert "contains the image listed on stdin" in error_line(refused.stderr)
    assert (marked / "photos" / "a.png").is_file()


def test_resume_in_a_folder_torchkit_did_not_write_does_not_suggest_force(tmp_path):
    """Before: the hint said "pass --force to replace it", which --force then refused."""
    from image_folders import write_image_folder
    from processes import run_torchkit_in_process

    write_image_folder(tmp_path / "data", {"a": 2, "b": 2})
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep\n")
    done = run_torchkit_in_process(
        "extract-features", "convnet", "data", "mine", "--resume", "--device", "cpu",
        "--allow-untrained", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "Error: nothing to resume in mine: it holds no extract-features run (give another "
        "OUT: this folder was not written by torchkit)"
    )
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_resume_hints_name_what_stops_force_too(tmp_path):
    """Before: a refused --resume said "pass --force to start over" (a finished OUT of other
    options) or "pass --force to replace it" (train's run folder), and --force then refused
    the user's notes.txt in OUT, or train's output. Now the hint says so first."""
    from image_folders import write_image_folder
    from processes import run_torchkit_in_process

    from torchkit.core.io.force import write_marker

    write_image_folder(tmp_path / "data", {"a": 2, "b": 2})
    base = ("extract-features", "convnet", "data", "--device", "cpu", "--allow-untrained")
    first = run_torchkit_in_process(*base, "o", "--image-size", "16", "-j", "0", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (tmp_path / "o" / "notes.txt").write_text("keep\n")
    other = run_torchkit_in_process(*base, "o", "--resume", "--image-size", "24", cwd=tmp_path)
    assert other.returncode == 2
    assert other.stderr.strip().endswith(
        "(resume with the same command line; it holds o/notes.txt that torchkit did not "
        "write, so --force is refused too: move it out first, or choose another folder)"
    )
    run = tmp_path / "run"
    run.mkdir()
    write_marker(run, "train")
    (run / "config.json").write_text("{}")
    refused = run_torchkit_in_process(*base, "run", "--resume", cwd=tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "Error: nothing to resume in run: it holds no extract-features run (it holds torchkit "
        "train's output, which extract-features --force does not replace: choose another "
        "folder)"
    )
    assert (tmp_path / "o" / "notes.txt").is_file()
    assert sorted(p.name for p in run.iterdir()) == [".torchkit", "config.json"]


def test_a_record_that_cannot_be_read_names_what_stops_force_too(tmp_path):
    """Before: a cut-short meta.json in OUT was "cannot read ... (pass --force to start over)",
    and --force then refused that very file as not torchkit's. Now the hint says so."""
    from image_folders import write_image_folder
    from processes import run_each_in_process, run_torchkit_in_process

    write_image_folder(tmp_path / "data", {"a": 2, "b": 2})
    base = ("extract-features", "convnet", "data", "o", "--device", "cpu", "--allow-untrained")
    first = run_torchkit_in_process(*base, "--image-size", "16", "-j", "0", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    meta = tmp_path / "o" / "meta.json"
    meta.write_bytes(meta.read_bytes()[:20])
    resumed, forced = run_each_in_process(
        [[*base, "--image-size", "16", option] for option in ("--resume", "--force")],
        cwd=tmp_path,
    )
    assert resumed.returncode == 1
    assert resumed.stderr.strip().startswith("Error: cannot read o/meta.json: ")
    assert resumed.stderr.strip().endswith(
        "(it holds o/meta.json that torchkit did not write, so --force is refused too: move "
        "it out first, or choose another folder)"
    )
    assert forced.returncode == 1 and "o/meta.json that torchkit did not write" in forced.stderr
    assert len(meta.read_bytes()) == 20


class _CaseNet(nn.Module):
    """Two layers whose names differ only by case."""

    def __init__(self) -> None:
        super().__init__()
        self.Conv1 = nn.Conv2d(3, 2, 1)
        self.conv1 = nn.Conv2d(3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.Conv1(x).mean((2, 3)) + self.conv1(x).mean((2, 3))


def test_layers_named_alike_but_for_case_get_two_files_where_case_is_ignored(
    runner, tmp_path, models_module, monkeypatch
):
    # Conv1.npy and conv1.npy are one file on an exFAT disk, macOS or a Samba share: there the
    # second layer's file is named as a repeated name's, conv1_2.npy.
    images = write_image_folder(tmp_path / "images", {"a": 1, "b": 1})
    models_module.case_net = _CaseNet
    args = (
        f"{MODELS_MODULE}:case_net",
        str(images),
        "-l",
        "Conv1",
        "-l",
        "conv1",
        "-j",
        "0",
        "--image-size",
        "8",
    )
    result = run(runner, *args, str(tmp_path / "plain"))  # a file system that tells case apart
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "plain").glob("*.npy")) == ["Conv1.npy", "conv1.npy"]
    monkeypatch.setattr(feature_store, "folds_case", lambda folder: True)
    result = run(runner, *args, str(tmp_path / "folded"))
    assert result.exit_code == 0, result.stderr
    meta = json.loads((tmp_path / "folded" / "meta.json").read_text())
    assert [layer["file"] for layer in meta["layers"]] == ["Conv1.npy", "conv1_2.npy"]


class _OddNames(nn.Module):
    """Layers whose names are no file names: brackets, a slash, one that becomes another's."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({"[0]": nn.ReLU(), "a/b": nn.Identity(), "a_b": nn.Identity()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return x.mean((2, 3))


def test_layer_names_become_file_names_each_its_own_named_in_meta(runner, tmp_path, models_module):
    images = write_image_folder(tmp_path / "images", {"a": 2})
    models_module.odd_names = _OddNames
    layers = ["blocks.[0]", "blocks.a/b", "blocks.a_b"]
    out = tmp_path / "out"
    args = [f"{MODELS_MODULE}:odd_names", str(images), str(out), "-j", "0", "--image-size", "8"]
    result = run(runner, *args, *(word for layer in layers for word in ("-l", layer)))
    assert result.exit_code == 0, result.stderr
    meta = json.loads((out / "meta.json").read_text())
    files = {layer["name"]: layer["file"] for layer in meta["layers"]}
    assert files == {
        "blocks.[0]": "blocks._0_.npy",
        "blocks.a/b": "blocks.a_b.npy",
        "blocks.a_b": "blocks.a_b_2.npy",
    }
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [".torchkit", "index.csv", "meta.json", *files.values()]
    )
    assert np.load(out / "blocks.a_b_2.npy").shape == (2, 3)


@pytest.mark.parametrize("array_format", ["pt", "safetensors"])
def test_an_array_cut_short_while_finishing_names_what_stops_force_too(
    runner, tmp_path, monkeypatch, array_format
):
    """Before: an interrupted run's array cut short as its rows were copied into a .safetensors
    said "(pass --force to start over)" whatever OUT held (into a .pt: NumPy's "ValueError: mmap
    length is greater than file size"), and --force then refused the user's notes.txt in OUT.
    Now both say the array is cut short, and the hint what stops --force too."""
    root = write_image_folder(tmp_path / "imgs", {"a": 2, "b": 2}, size=20)
    options = ["--image-size", "16", "-l", "penultimate", "-b", "2", "-j", "0"]

    class Stop(Exception):
        pass

    def stop_after_one_batch(done: int, total: int) -> None:
        if done:
            raise Stop

    part = tmp_path / "part"
    request = FeatureRequest(
        ModelSpec("convnet", image_size=16, allow_untrained=True), str(root), str(part),
        layers=["penultimate"], run=InferenceOptions(batch_size=2, workers=0, device="cpu"),
        file_format=array_format,
    )  # fmt: skip
    with pytest.raises(Stop):
        extract_features(request, progress=stop_after_one_batch)
    (part / "notes.txt").write_text("mine")
    set_rows = feature_store._set_rows

    def cut_short(path: Path, rows: int) -> None:  # another process truncates the array
        set_rows(path, rows)
        with open(path, "r+b") as handle:
            handle.truncate(path.stat().st_size - 8)

    monkeypatch.setattr(feature_store, "_set_rows", cut_short)
    again = ["--resume", "--array-format", array_format]
    resumed = run(runner, "convnet", str(root), str(part), *options, *again)
    assert resumed.exit_code == 1, resumed.stderr
    line = error_line(resumed.stderr)
    assert "penultimate.npy: it ends 8 bytes before its rows do (it holds " in line
    assert line.endswith(
        f"{part / 'notes.txt'} that torchkit did not write, so --force is refused too: move it "
        "out first, or choose another folder)"
    )
    assert (part / "notes.txt").read_text() == "mine"
