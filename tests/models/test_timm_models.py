"""timm models through the one model resolver (issue #19): `timm/NAME` builds offline with a head
for the classes and timm's preprocessing, an existing path named like one is still a file, bad
names and a missing timm are one error line, `--weights DEFAULT` reads the Hugging Face cache
and fails clearly offline, and a checkpoint trained from `timm/NAME` is taken alone by every
command. The truths are timm's own models and configs, built here independently."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from image_folders import write_image_folder
from offline import offline_env, unreachable_proxy
from output_checks import error_line
from PIL import Image
from processes import run_torchkit_in_process, run_torchkit_process
from safetensors.torch import save_file
from timm_hub import cache_weights, offline_hub
from torch import nn

from torchkit.cli import app
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.transforms import eval_transform
from torchkit.core.io.errors import OfflineError, TorchkitError, UsageError
from torchkit.core.models import (
    build_model,
    find_head,
    is_model_file,
    is_timm_spec,
    model_from_checkpoint,
    model_inputs,
    replace_head,
    resolve_model,
)
from torchkit.core.models.checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint
from torchkit.core.models.convnet import convnet_class

pytestmark = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")
# Imported when a test of this module first runs (`_timm`), not when the module is collected:
# timm imports torch._dynamo, seconds of CPU in a pytest worker that runs none of these tests.
timm: Any = None


@pytest.fixture(autouse=True, scope="module")
def _timm() -> None:
    global timm
    timm = importlib.import_module("timm")


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def seeded(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


# -- resolve_model("timm/NAME") ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["test_vit", "test_resnet", "test_efficientnet"])
def test_a_timm_name_builds_offline_with_the_classes_head_and_timms_preprocessing(name):
    resolved = resolve_model(f"timm/{name}", num_classes=3)
    truth = timm.create_model(name, num_classes=3)
    config = truth.pretrained_cfg
    side = config["input_size"][1]

    assert (resolved.arch, resolved.source, resolved.weights_source) == (
        f"timm/{name}",
        "timm",
        None,
    )
    assert resolved.num_outputs == 3 and n_params(resolved.model) == n_params(truth)
    assert resolved.sample_shape == tuple(config["input_size"])
    with torch.no_grad():
        assert resolved.model.eval()(seeded(2, *resolved.sample_shape)).shape == (2, 3)
    assert resolved.preprocess_source == "timm"
    assert resolved.preprocess == Preprocess(
        image_size=side,
        resize_size=math.floor(side / config["crop_pct"]),
        mean=tuple(config["mean"]),
        std=tuple(config["std"]),
        in_channels=3,
        interpolation=config["interpolation"],
    )


def test_image_size_and_channels_size_the_model_and_its_preprocessing():
    vit = resolve_model("timm/test_vit", num_classes=2, image_size=32)
    # A ViT's position embeddings are built for the size: (32 / patch 16)^2 + the class token.
    assert (
        vit.model.pos_embed.shape[1]
        == timm.create_model("test_vit", img_size=32).pos_embed.shape[1]
    )
    assert vit.model.pos_embed.shape[1] != timm.create_model("test_vit").pos_embed.shape[1]
    assert vit.sample_shape == (3, 32, 32)
    assert (vit.preprocess.image_size, vit.preprocess.resize_size) == (32, math.floor(32 / 0.95))
    with torch.no_grad():
        assert vit.model.eval()(seeded(1, 3, 32, 32)).shape == (1, 2)

    # A convolutional network takes no img_size: any size, and a 1-channel stem for grayscale.
    resnet = resolve_model("timm/test_resnet", num_classes=2, image_size=(32, 48), in_channels=1)
    assert resnet.sample_shape == (1, 32, 48)
    assert resnet.preprocess.in_channels == 1 and len(resnet.preprocess.mean) == 1
    with torch.no_grad():
        assert resnet.model.eval()(seeded(1, 1, 32, 48)).shape == (1, 2)


def test_a_tag_picks_its_pretrained_config():
    resolved = resolve_model("timm/resnet18.tv_in1k", num_classes=2, image_size=32)
    config = timm.create_model("resnet18.tv_in1k").pretrained_cfg
    assert resolved.arch == "timm/resnet18.tv_in1k"
    assert resolved.preprocess.interpolation == config["interpolation"] == "bilinear"
    assert resolved.preprocess.resize_size == math.floor(32 / config["crop_pct"])


# Tags whose eval transform squashes (both sides resized) or pads a border, and one that crops.
CROP_MODE_TAGS = [
    "convnextv2_nano.fcmae_ft_in22k_in1k_384",
    "deepseek_vit_412m.deepseek_v4_flash_vision_exp",
    "resnet18.tv_in1k",
]


@pytest.mark.parametrize("tag", CROP_MODE_TAGS)
def test_non_square_images_get_the_pixels_of_timms_own_eval_transform(tag):
    """The tag's pretrained_cfg (no weights, no model built; at 48 px, its crop_pct, crop_mode,
    mean and interpolation kept) through timm's resolve_data_config + create_transform, and
    through torchkit's preprocessing of it; a border cfg cropping part of the resized image is
    made by hand."""
    from types import SimpleNamespace

    from timm.data import create_transform, resolve_data_config
    from timm.models import get_pretrained_cfg

    from torchkit.core.models.timm_models import timm_preprocess

    config = {**get_pretrained_cfg(tag).to_dict(), "input_size": (3, 48, 48)}
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, s, dtype=np.uint8)) for s in SHAPES]
    by_hand = {**config, "input_size": (3, 40, 40), "crop_pct": 0.8, "mean": (0.2, 0.5, 0.9)}
    for cfg in (config, by_hand) if config["crop_mode"] == "border" else (config,):
        model = SimpleNamespace(pretrained_cfg=cfg)
        preprocess = timm_preprocess(model)
        assert preprocess.crop_mode == (cfg.get("crop_mode") or "center")
        ours, theirs = (
            eval_transform(preprocess),
            create_transform(**resolve_data_config({}, model=model)),
        )
        for image in images:
            assert torch.allclose(ours(image), theirs(image), atol=1e-6, rtol=0)


SHAPES = [(37, 61, 3), (90, 29, 3)]


def test_train_takes_the_crop_mode_of_the_timm_tag_it_fine_tunes(runner, tmp_path):
    # An image folder: on digits a model from random weights keeps the digits' defaults.
    data = write_image_folder(tmp_path / "data", {"a": 1, "b": 1}, size=8)
    arch, tag = CROP_MODE_TAGS[0].split(".")
    for args, expected in [
        ([f"timm/{arch}.{tag}"], "squash"),
        ([f"timm/{arch}", "--weights", tag], "squash"),
        ([f"timm/{arch}"], "center"),  # timm's default tag
        ([f"timm/{arch}.{tag}", "--crop-mode", "center"], "center"),
    ]:
        result = runner.invoke(
            app, ["train", "--data", str(data), "--model", *args, "--print-config"]
        )
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["crop_mode"] == expected, args


def test_fine_tuning_a_timm_tag_takes_the_preprocessing_its_weights_were_trained_on(
    hub_cache, runner, tmp_path
):
    """test_vit.r160_in1k's weights were trained on mean/std 0.5, bicubic, 160 px crops of
    images resized to 160 / 0.95: train fed them ImageNet-normalised, bilinear images at the
    data's default size (eval of the same tag fed the tag's). The tag's values are now the
    defaults, chosen from the weights (a replay with another model chooses again); an option
    given stays the user's."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg("test_vit.r160_in1k")
    assert (cfg.mean, cfg.std, cfg.interpolation) == ((0.5,) * 3, (0.5,) * 3, "bicubic")
    expected = {"image_size": 160, "resize_size": math.floor(160 / cfg.crop_pct)}
    expected |= {"mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bicubic"}
    expected |= {"crop_mode": "center"}
    truth = timm.create_model("test_vit.r160_in1k")
    cache_weights(hub_cache, cfg.hf_hub_id, truth)
    data = write_image_folder(tmp_path / "data", {"a": 2, "b": 2}, size=12)
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--model", "timm/test_vit.r160_in1k", "--weights"]
        + ["DEFAULT", "--epochs", "1", "--batch-size", "2", "--val-split", "0.5", "-j", "0"]
        + ["--device", "cpu", "--seed", "0", "--out", str(out)],
    )
    assert result.exit_code == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert {name: config["options"][name] for name in expected} == expected
    assert set(expected) <= set(config["defaults_from_data"])
    recorded = load_checkpoint(out / "best.pt")["preprocess"]
    assert {name: recorded[name] for name in expected} == expected

    def print_config(*args: str) -> dict:
        given = runner.invoke(app, ["train", "--data", str(data), *args, "--print-config"])
        assert given.exit_code == 0, given.stderr
        return json.loads(given.stdout)

    by_tag_name = print_config("--model", "timm/test_vit", "--weights", "r160_in1k")
    assert {name: by_tag_name[name] for name in expected} == expected
    tuned = ["--model", "timm/test_vit.r160_in1k", "--weights", "DEFAULT"]
    given = print_config(*tuned, "--mean", "0.4", "--interpolation", "bilinear")
    assert (given["mean"], given["std"]) == ([0.4] * 3, [0.5] * 3)
    assert given["interpolation"] == "bilinear"
    assert {"mean", "interpolation"}.isdisjoint(given["defaults_from_data"])
    sized = print_config(*tuned, "--image-size", "80")  # the tag's crop ratio kept
    assert (sized["image_size"], sized["resize_size"]) == (80, round(80 / cfg.crop_pct))
    # Random weights: the tag's too, as timm's train.py takes them (test below).
    random = print_config("--model", "timm/test_vit.r160_in1k")
    assert {name: random[name] for name in expected} == expected
    refused = runner.invoke(
        app, ["train", "--data", str(data), "--model", "timm/test_vit", "--augment", "augmix"]
    )
    assert refused.exit_code == 2
    assert error_line(refused.stderr).startswith(
        "Error: --augment augmix cannot use bicubic, the interpolation of the model's "
        "pretrained config (torchvision's AugMix"
    )
    # A crop_pct above 1 (the crop padded, as timm's eval pads it) was refused as a --resize-size
    # smaller than --image-size, options never given.
    padded = print_config("--model", "timm/volo_d4_448.sail_in1k", "--weights", "DEFAULT")
    crop_pct = get_pretrained_cfg("volo_d4_448.sail_in1k").crop_pct
    assert crop_pct > 1 and padded["image_size"] == 448
    assert padded["resize_size"] == math.floor(448 / crop_pct)
    # AugMix cannot resample bicubic: the weights' interpolation, not an option never given.
    refused = runner.invoke(app, ["train", "--data", str(data), *tuned, "--augment", "augmix"])
    assert refused.exit_code == 2
    assert error_line(refused.stderr) == (
        "Error: --augment augmix cannot use bicubic, the weights' interpolation (torchvision's "
        "AugMix resamples with bilinear or nearest) (give --interpolation bilinear, or another "
        "--augment)"
    )


@pytest.mark.parametrize(
    "tag", ["test_resnet.r160_in1k", "test_efficientnet.r160_in1k", CROP_MODE_TAGS[0]]
)
def test_a_timm_model_from_random_weights_takes_its_pretrained_config_as_timms_train_does(
    runner, tmp_path, tag
):
    """timm's train.py takes the data config of the model's pretrained_cfg whether or not it
    loads the weights (`resolve_data_config(model=...)`): train from random weights took only
    the tag's crop mode, and the data's size, resize, mean, std and interpolation."""
    from timm.data import resolve_data_config

    with torch.device("meta"):  # the config alone: no weights, no memory
        model = timm.create_model(tag, pretrained=False)
    truth = resolve_data_config({}, model=model)
    side = truth["input_size"][1]
    expected = {"image_size": side, "resize_size": math.floor(side / truth["crop_pct"])}
    expected |= {"mean": list(truth["mean"]), "std": list(truth["std"])}
    expected |= {"interpolation": truth["interpolation"], "crop_mode": truth["crop_mode"]}
    data = write_image_folder(tmp_path / "data", {"a": 1, "b": 1}, size=8)

    def print_config(*args: str) -> dict:
        given = runner.invoke(
            app, ["train", "--data", str(data), "--model", f"timm/{tag}", *args, "--print-config"]
        )
        assert given.exit_code == 0, given.stderr
        return json.loads(given.stdout)

    config = print_config()
    assert {name: config[name] for name in expected} == expected
    assert set(expected) <= set(config["defaults_from_data"])  # a replay chooses again
    mine = print_config("--image-size", "64", "--mean", "0.3", "--interpolation", "nearest")
    assert (mine["image_size"], mine["resize_size"]) == (64, math.floor(64 / truth["crop_pct"]))
    assert (mine["mean"], mine["std"]) == ([0.3] * 3, list(truth["std"]))
    assert mine["interpolation"] == "nearest"


def test_a_timm_model_from_random_weights_on_digits_takes_the_digits_defaults(runner):
    """digits' 8 px images at the tag's 224 px would cost hundreds of times as much and match no
    weights: from random weights its own defaults win; a tag's weights still bring their own."""
    digits = {"image_size": 12, "resize_size": 12, "interpolation": "bilinear"}

    def print_config(*args: str) -> dict:
        given = runner.invoke(app, ["train", "--data", "digits", *args, "--print-config"])
        assert given.exit_code == 0, given.stderr
        return json.loads(given.stdout)

    for model in ("timm/test_resnet.r160_in1k", "convnet"):
        config = print_config("--model", model)
        assert {name: config[name] for name in digits} == digits, model


def test_an_existing_path_named_like_a_timm_model_is_still_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_timm_spec("timm/test_vit") and not is_model_file("timm/test_vit")
    assert model_inputs("timm/test_vit") == []

    torch.manual_seed(0)
    convnet = convnet_class()(10, 3, 28).eval()
    (tmp_path / "timm").mkdir()
    for name in ("x.pt", "test_vit"):  # with a model file's suffix, and without one
        save_checkpoint(
            {
                "format_version": FORMAT_VERSION,
                "arch": "convnet",
                "num_classes": 10,
                "model": convnet.state_dict(),
                "preprocess": {"image_size": 28, "in_channels": 3},
            },
            tmp_path / "timm" / name,
        )
        spec = f"timm/{name}"
        assert not is_timm_spec(spec) and is_model_file(spec)
        resolved = resolve_model(spec)
        assert (resolved.source, resolved.arch) == ("torchkit checkpoint", "convnet")
        with torch.no_grad():
            x = seeded(2, 3, 28, 28)
            torch.testing.assert_close(resolved.model.eval()(x), convnet(x), rtol=0, atol=0)
    # A missing file keeps its meaning: a path, not a timm name.
    assert not is_timm_spec("timm/missing.pt")
    with pytest.raises(TorchkitError, match="not found: timm/missing.pt"):
        resolve_model("timm/missing.pt")


@pytest.mark.parametrize(
    ("spec", "message", "hint"),
    [
        ("timm/test_vitt", "unknown timm model 'test_vitt'", "did you mean timm/test_vit"),
        ("timm/resnet18.bogus", "timm has no tag 'bogus' for resnet18", "a1_in1k"),
        ("timm/", "timm/ needs a model name", "timm/resnet18"),
        ("resnet10t", "unknown model 'resnet10t'", "timm has it: timm/resnet10t"),
    ],
)
def test_unknown_names_are_usage_errors_with_suggestions(spec, message, hint):
    with pytest.raises(UsageError) as caught:
        resolve_model(spec)
    assert caught.value.message.startswith(message) and hint in (caught.value.hint or "")


def test_a_timm_name_like_none_of_timms_says_where_its_names_are():
    from torchkit.core.models.timm_models import suggest_timm

    assert suggest_timm("zzqx", ["resnet18", "vit_tiny"]) == (
        "`timm.list_models()` gives the names timm knows"
    )


def test_timms_names_are_listed_once_and_a_name_registered_later_is_found(monkeypatch):
    """timm.list_models() sorts and filters all its names (about 10 ms), and a command checks
    its spec several times: listed once, then looked up; a name missing from the last listing
    is looked for in a new one."""
    import timm

    from torchkit.core.models import timm_models

    listings = []
    real = timm.list_models
    monkeypatch.setattr(timm, "list_models", lambda *a, **k: listings.append(a) or real(*a, **k))
    monkeypatch.setattr(timm_models, "_listed_names", frozenset(), raising=False)
    for _ in range(3):
        assert timm_models.require_timm_name("timm/resnet18") == "resnet18"
    assert len(listings) == 1
    # a listing without test_vit, as if it was registered after
    monkeypatch.setattr(timm_models, "_listed_names", frozenset({"resnet18"}), raising=False)
    assert timm_models.require_timm_name("timm/test_vit") == "test_vit"
    assert len(listings) == 2


def test_without_timm_a_timm_spec_says_how_to_install_the_extra(monkeypatch, runner):
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` fails as if not installed
    with pytest.raises(TorchkitError) as caught:
        resolve_model("timm/test_vit", num_classes=2)
    assert caught.value.exit_code == 1
    assert "uv sync --extra timm" in str(caught.value) and "[timm]'" in str(caught.value)

    result = runner.invoke(app, ["summary", "timm/test_vit", "--format", "json"])
    assert result.exit_code == 1 and result.stdout == ""
    line = error_line(result.stderr, besides="nothing")
    assert "a timm/ model needs the timm package" in line and "--extra timm" in line
    # Other models do not need timm, and an unknown name does not look for it.
    assert resolve_model("convnet", num_classes=2).source == "built-in"
    with pytest.raises(UsageError, match="unknown model 'resnet10t'"):
        resolve_model("resnet10t")


def test_timm_heads_are_found_and_replaced_through_timms_classifier_api(tmp_path):
    convnext = timm.create_model("test_convnext", num_classes=4)
    assert find_head(convnext)[0] == "head.fc"
    replace_head(convnext, 7)
    assert convnext.num_classes == 7 and convnext.get_classifier().out_features == 7

    # DeiT's distilled model has two heads: sizing it from 2-class weights replaces both.
    truth = timm.create_model("deit_tiny_distilled_patch16_224", num_classes=2, img_size=32)
    torch.save(truth.state_dict(), tmp_path / "deit_2class.pt")
    resolved = resolve_model(
        "timm/deit_tiny_distilled_patch16_224",
        weights=str(tmp_path / "deit_2class.pt"),
        image_size=32,
    )
    assert resolved.weights_source == "state dict" and resolved.sample_shape == (3, 32, 32)
    assert resolved.model.head.out_features == resolved.model.head_dist.out_features == 2
    x = seeded(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(resolved.model.eval()(x), truth.eval()(x), rtol=0, atol=0)


def test_weights_path_loads_a_state_dict_into_a_timm_model(tmp_path):
    truth = timm.create_model("test_resnet", num_classes=2).eval()
    save_file(truth.state_dict(), str(tmp_path / "resnet.safetensors"))
    resolved = resolve_model("timm/test_resnet", weights=str(tmp_path / "resnet.safetensors"))
    assert resolved.num_outputs == 2 and resolved.weights_source == "state dict"
    x = seeded(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(resolved.model.eval()(x), truth(x), rtol=0, atol=0)
    # build_model (what rebuilds a checkpoint's arch) loads a file too, then sizes the head.
    built = build_model("timm/test_resnet", 2, weights=str(tmp_path / "resnet.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(built.eval()(x), truth(x), rtol=0, atol=0)
    assert (
        build_model(
            "timm/test_resnet", 5, weights=str(tmp_path / "resnet.safetensors")
        ).fc.out_features
        == 5
    )
    with pytest.raises(TorchkitError, match="weights file not found"):
        build_model("timm/test_resnet", 2, weights=str(tmp_path / "missing.pt"))
    with pytest.raises(UsageError, match="5 classes asked for .* state dict has 2 outputs"):
        resolve_model(
            "timm/test_resnet", weights=str(tmp_path / "resnet.safetensors"), num_classes=5
        )


def test_a_checkpoint_arch_is_rebuilt_for_its_image_size():
    trained = resolve_model("timm/test_vit", num_classes=2, image_size=32).model.eval()
    checkpoint = {
        "format_version": FORMAT_VERSION,
        "arch": "timm/test_vit",
        "num_classes": 2,
        "model": trained.state_dict(),
        "preprocess": {"image_size": 32, "in_channels": 3},
    }
    rebuilt = model_from_checkpoint(checkpoint).eval()
    x = seeded(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), trained(x), rtol=0, atol=0)
    assert build_model("timm/test_vit", 5, image_size=32).get_classifier().out_features == 5


# -- timm's pretrained weights: the Hugging Face cache, and offline ------------------------------


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache, offline."""
    return offline_hub(tmp_path / "hf", monkeypatch)


def test_default_weights_offline_are_one_clear_error(hub_cache, runner):
    with pytest.raises(OfflineError) as caught:
        resolve_model("timm/test_resnet", weights="DEFAULT")
    assert caught.value.message.startswith("cannot download the pretrained weights of timm/")
    assert "--weights PATH" in caught.value.hint
    result = runner.invoke(app, ["summary", "timm/test_resnet", "--weights", "DEFAULT"])
    assert result.exit_code == 1 and result.stdout == ""
    assert "cannot download" in error_line(result.stderr, besides="warnings")


# The Hugging Face settings that move its cache, and where each setting puts it (under the
# test's folder): HF_HUB_CACHE before HF_HOME before XDG_CACHE_HOME before HOME.
HUB_CACHE_SETTINGS = {
    "HF_HUB_CACHE": ({"HF_HUB_CACHE": "hubs", "HF_HOME": "hf", "XDG_CACHE_HOME": "xdg"}, "hubs"),
    "HF_HOME": ({"HF_HOME": "hf", "XDG_CACHE_HOME": "xdg"}, "hf/hub"),
    "XDG_CACHE_HOME": ({"XDG_CACHE_HOME": "xdg"}, "xdg/huggingface/hub"),
    "HOME": ({}, "home/.cache/huggingface/hub"),
}


@pytest.fixture
def hub_settings(tmp_path, monkeypatch):
    """Set the Hugging Face environment of one HUB_CACHE_SETTINGS case (offline) as a user's
    shell would, and have huggingface_hub read it as at its import (its constants module
    reloaded, and reloaded again from the test's own environment afterwards); returns the
    cache folder that setting names."""
    from huggingface_hub import constants

    def settle(case: str) -> Path:
        variables, expected = HUB_CACHE_SETTINGS[case]
        for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        for name, folder in variables.items():
            monkeypatch.setenv(name, str(tmp_path / folder))
        importlib.reload(constants)
        return tmp_path / expected

    yield settle
    monkeypatch.undo()
    importlib.reload(constants)


@pytest.mark.parametrize("case", list(HUB_CACHE_SETTINGS))
def test_the_offline_hint_names_the_hub_cache_in_use(hub_settings, case):
    """The hint named "~/.cache/huggingface" whatever HF_HOME said; the test of the fix set
    HF_HOME and huggingface_hub's cache constant to the same folder, so that a hint built from
    HF_HOME alone (HF_HUB_CACHE, XDG_CACHE_HOME ignored) passed it too. Each setting here names
    a folder no other rule gives."""
    cache = hub_settings(case)
    with pytest.raises(OfflineError) as caught:
        resolve_model("timm/test_resnet", weights="DEFAULT")
    assert caught.value.hint == (
        f"connect to the internet once so they are cached in {cache}, or pass --weights PATH "
        "to a local file"
    )


@pytest.fixture
def unreachable_hub(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache, online mode, and a Hub at a local port nothing listens on
    (refused at once, as with no network): the cache folder."""
    import socket

    from huggingface_hub import constants

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed when the block ends
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    return home / "hub"


def test_an_unreachable_hub_fails_at_once_or_reads_the_cache(unreachable_hub):
    """The Hub's client retried a refused connection with back-off: 49 s before the error."""
    import time

    from huggingface_hub import constants

    started = time.monotonic()
    with pytest.raises(OfflineError, match="not in the cache and the Hub cannot be reached"):
        resolve_model("timm/test_resnet", weights="DEFAULT")
    assert time.monotonic() - started < 10
    assert constants.HF_HUB_OFFLINE is False  # offline for that download only
    truth = timm.create_model("test_resnet").eval()
    cache_weights(unreachable_hub, truth.pretrained_cfg["hf_hub_id"], truth)
    started = time.monotonic()
    resolved = resolve_model("timm/test_resnet", weights="DEFAULT")
    assert time.monotonic() - started < 10 and resolved.weights_source == "timm weights"


GCVIT_URL = (  # weights timm downloads through torch.hub, not from the Hugging Face Hub
    "https://github.com/rwightman/pytorch-image-models/releases/download/"
    "v0.1-weights-morevit/gcvit_xxtiny_224_nvidia-d1d86009.pth"
)


def test_default_weights_offline_in_a_real_process(tmp_path):
    """One error line and nothing before it, and the hint names the Hub's cache HF_HOME sets:
    a real process, as huggingface_hub reads HF_HOME when it is imported."""
    with unreachable_proxy() as proxy:
        # offline_env's proxies and Hugging Face settings, without its HOME, TORCH_HOME and
        # XDG_CACHE_HOME (caches these weights never touch: they come from the Hub): those are
        # read while torch is imported, and a process with other values starts a fresh
        # interpreter (~4 s of CPU) instead of a fork of the preloaded torch, which has not
        # imported huggingface_hub either.
        env = offline_env(proxy, tmp_path / "home")
        for name in ("HOME", "TORCH_HOME", "XDG_CACHE_HOME"):
            del env[name]
        result = run_torchkit_process(
            "summary",
            "timm/test_resnet",
            "--weights",
            "DEFAULT",
            "--format",
            "json",
            env=env,
            cwd=tmp_path,
        )
    assert result.returncode == 1 and result.stdout == ""
    line = error_line(result.stderr, besides="nothing")
    assert line.startswith(
        "Error: cannot download the pretrained weights of timm/test_resnet: they are not in "
        "the cache and the Hub cannot be reached ("
    )
    assert line.endswith(  # HF_HOME's cache, not ~/.cache/huggingface
        f"(connect to the internet once so they are cached in {tmp_path / 'home/hf/hub'}, "
        "or pass --weights PATH to a local file)"
    )


def test_default_weights_torch_hub_downloads_offline_are_one_error_line(tmp_path, monkeypatch):
    """gcvit's weights (torch.hub's cache) printed torch.hub's `Downloading: "https://..."`
    before the error. In this process: torch.hub reads TORCH_HOME when it downloads, and
    urllib's shared opener is made again from the proxies set here."""
    import urllib.request

    monkeypatch.chdir(tmp_path)
    with unreachable_proxy() as proxy:
        for name, value in offline_env(proxy, tmp_path / "home").items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(urllib.request, "_opener", None)
        result = run_torchkit_in_process(
            "summary", "timm/gcvit_xxtiny", "--weights", "DEFAULT", "--format", "json"
        )
    assert result.returncode == 1 and result.stdout == ""
    line = error_line(result.stderr, besides="nothing")
    cache = tmp_path / "home" / "torch" / "hub" / "checkpoints"
    assert line == (
        "Error: cannot download the pretrained weights of timm/gcvit_xxtiny: github.com "
        "cannot be reached ([Errno 111] Connection refused) (connect to the internet once, "
        f"or save {GCVIT_URL} in the weights cache {cache}; or pass --weights PATH to a "
        "local file)"
    )
    assert timm.get_pretrained_cfg("gcvit_xxtiny").url == GCVIT_URL


def test_default_weights_come_from_the_cache_with_imagenet_classes(hub_cache, runner):
    torch.manual_seed(3)
    truth = timm.create_model("test_resnet").eval()
    cache_weights(hub_cache, truth.pretrained_cfg["hf_hub_id"], truth)
    x = seeded(2, 3, 160, 160)

    for weights in ("DEFAULT", truth.pretrained_cfg["tag"]):  # timm's default tag, by name
        resolved = resolve_model("timm/test_resnet", weights=weights)
        assert resolved.weights_source == "timm weights" and resolved.num_outputs == 1000
        assert resolved.classes[:2] == ["tench", "goldfish"] and len(resolved.classes) == 1000
        with torch.no_grad():
            torch.testing.assert_close(resolved.model.eval()(x), truth(x), rtol=0, atol=0)

    # Fine-tuning replaces the head when asked to; otherwise 3 classes contradict the weights.
    with pytest.raises(UsageError, match="3 classes asked for .* timm weights has 1000 outputs"):
        resolve_model("timm/test_resnet", weights="DEFAULT", num_classes=3)
    tuned = resolve_model("timm/test_resnet", weights="DEFAULT", num_classes=3, new_head=True)
    assert tuned.num_outputs == 3 and tuned.classes is None
    rebuilt = build_model("timm/test_resnet", 3, weights="DEFAULT", image_size=160)
    for model in (tuned.model, rebuilt):  # the backbone is the weights', the head is new
        state = model.state_dict()
        assert state["fc.weight"].shape == (3, truth.fc.in_features)
        for key, value in truth.state_dict().items():
            if not key.startswith("fc."):
                torch.testing.assert_close(state[key], value, rtol=0, atol=0)

    # The first download's messages never reach stdout: the JSON parses.
    result = runner.invoke(
        app,
        ["summary", "timm/test_resnet", "--weights", "DEFAULT", "--no-flops", "--format", "json"],
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["totals"]["total_params"] == n_params(truth)


@pytest.mark.parametrize(
    ("spec", "weights", "message"),
    [
        ("timm/resnet18", "nope", "unknown weights 'nope' for timm/resnet18"),
        ("timm/resnet18.a1_in1k", "tv_in1k", "--weights tv_in1k contradicts the tag"),
    ],
)
def test_bad_pretrained_weights_are_usage_errors(hub_cache, spec, weights, message):
    with pytest.raises(UsageError, match=message):
        resolve_model(spec, weights=weights)


def test_a_model_timm_has_no_weights_for_is_a_usage_error(hub_cache):
    # Which models lack weights changes with timm's version (the GPU machine's timm has no
    # test_coatnet): one of them, as timm's own list of pretrained models tells.
    import timm

    with_weights = {name.partition(".")[0] for name in timm.list_models(pretrained=True)}
    name = next(n for n in timm.list_models("test_*") + timm.list_models() if n not in with_weights)
    with pytest.raises(UsageError, match=f"timm has no pretrained weights for timm/{name}"):
        resolve_model(f"timm/{name}", weights="DEFAULT")


# -- train --model timm/NAME, then every command takes best.pt alone -----------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A timm ViT trained one epoch at 32 px (its position embeddings depend on the size), and
    the truth: timm's own model of that size with the checkpoint's weights."""
    from typer.testing import CliRunner

    root = tmp_path_factory.mktemp("timm_train")
    for split, count in (("train", 3), ("val", 2)):
        write_image_folder(
            root / "data" / split, {"a": count, "b": count}, size=32, seed=len(split)
        )
    out = root / "run"
    result = CliRunner().invoke(
        app,
        ["train", "--data", str(root / "data"), "--model", "timm/test_vit", "--epochs", "1"]
        + ["--batch-size", "3", "--image-size", "32", "--resize-size", "32", "-j", "0"]
        + ["--device", "cpu", "--seed", "0", "--out", str(out)],
    )
    assert result.exit_code == 0, result.stderr
    checkpoint = load_checkpoint(out / "best.pt")
    truth = timm.create_model("test_vit", num_classes=2, img_size=32)
    truth.load_state_dict(checkpoint["model"])
    truth.eval()
    paths = sorted((root / "data" / "val").rglob("*.png"))
    transform = eval_transform(Preprocess.from_dict(checkpoint["preprocess"]))
    x = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    with torch.no_grad():
        logits = truth(x)
    return {
        "root": root,
        "best": str(out / "best.pt"),
        "checkpoint": checkpoint,
        "truth": truth,
        "paths": paths,
        "labels": torch.tensor([("a", "b").index(p.parent.name) for p in paths]),
        "logits": logits,
    }


def test_train_records_the_timm_arch_and_its_image_size(trained):
    checkpoint = trained["checkpoint"]
    assert checkpoint["arch"] == "timm/test_vit" and checkpoint["classes"] == ["a", "b"]
    assert checkpoint["preprocess"]["image_size"] == 32


@pytest.mark.parametrize("form", ["checkpoint", "name+weights"])
def test_eval_scores_the_timm_checkpoint(trained, runner, form):
    model = (
        [trained["best"]]
        if form == "checkpoint"
        else ["timm/test_vit", "--weights", trained["best"]]
    )
    result = runner.invoke(
        app,
        ["eval", *model, "--data", str(trained["root"] / "data"), "--split", "val"]
        + ["-j", "0", "--device", "cpu", "--format", "json"],
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    loss = float(nn.functional.cross_entropy(trained["logits"], trained["labels"]))
    assert data["loss"] == pytest.approx(loss, abs=1e-5)
    assert data["preprocess"]["image_size"] == 32


def test_predict_gives_the_truths_probabilities(trained, runner):
    result = runner.invoke(
        app,
        ["predict", trained["best"], str(trained["root"] / "data" / "val")]
        + ["-j", "0", "--device", "cpu", "--format", "json"],
    )
    assert result.exit_code == 0, result.stderr
    rows = sorted(json.loads(result.stdout), key=lambda row: row["path"])
    probabilities = trained["logits"].softmax(1)
    assert [row["class"] for row in rows] == [("a", "b")[i] for i in probabilities.argmax(1)]
    np.testing.assert_allclose(
        [row["probability"] for row in rows], probabilities.max(1).values.numpy(), atol=1e-5
    )


def test_summary_and_benchmark_count_the_truths_parameters(trained, runner):
    summary = runner.invoke(app, ["summary", trained["best"], "--no-flops", "--format", "json"])
    assert summary.exit_code == 0, summary.stderr
    assert json.loads(summary.stdout)["totals"]["total_params"] == n_params(trained["truth"])
    bench = runner.invoke(
        app,
        ["benchmark", trained["best"], "-b", "1", "--warmup", "0", "--iters", "1"]
        + ["--device", "cpu", "--format", "json"],
    )
    assert bench.exit_code == 0, bench.stderr
    data = json.loads(bench.stdout)
    assert data["params"] == n_params(trained["truth"]) and data["input_size"] == [3, 32, 32]


def test_export_writes_a_verified_onnx_of_the_truth(trained, runner, tmp_path):
    import onnxruntime

    out = tmp_path / "model.onnx"
    result = runner.invoke(app, ["export", trained["best"], str(out), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["verified"] is True and data["arch"] == "timm/test_vit"
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = seeded(2, 3, 32, 32)
    (output,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(output, trained["truth"](x).numpy(), atol=1e-4)


def test_extract_features_gives_the_truths_logits(trained, runner, tmp_path):
    out = tmp_path / "features"
    result = runner.invoke(
        app,
        ["extract-features", trained["best"], str(trained["root"] / "data" / "val"), str(out)]
        + ["-l", "logits", "-j", "0", "--device", "cpu"],
    )
    assert result.exit_code == 0, result.stderr
    np.testing.assert_allclose(np.load(out / "logits.npy"), trained["logits"].numpy(), atol=1e-5)


@pytest.mark.parametrize("spec", ["best.pt", "timm/test_resnet"])
def test_convert_syncbn_takes_timm_models(trained, runner, spec):
    spec = trained["best"] if spec == "best.pt" else spec
    truth = trained["truth"] if spec == trained["best"] else timm.create_model("test_resnet")
    result = runner.invoke(app, ["convert-syncbn", spec, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    batchnorms = [m for m in truth.modules() if isinstance(m, nn.BatchNorm2d)]
    assert json.loads(result.stdout)["count"] == len(batchnorms)
    assert spec != "timm/test_resnet" or len(batchnorms) > 0


def test_sync_batchnorm_keeps_timms_norm_act_layers_as_timms_converter_does():
    # timm's BatchNormAct2d normalises, then runs its own `drop` and `act` layers: a plain
    # SyncBatchNorm in its place dropped the activation (and a PReLU's weight) from the model.
    from timm.layers import norm_act

    from torchkit.core.convert.syncbn import convert_batchnorm

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), norm_act.BatchNormAct2d(4, act_layer=nn.PReLU, inplace=False)
    )
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].act.weight.fill_(0.1)
    model.eval()
    x = seeded(2, 3, 6, 6)
    timms = norm_act.convert_sync_batchnorm(copy.deepcopy(model))

    synced, rows = convert_batchnorm(copy.deepcopy(model))
    assert type(synced[1]) is norm_act.SyncBatchNormAct and rows[0]["to_type"] == "SyncBatchNormAct"
    assert list(synced.state_dict()) == list(timms.state_dict()) == list(model.state_dict())
    reverted, _ = convert_batchnorm(timms, to="bn")
    assert type(reverted[1]) is norm_act.BatchNormAct2d
    with torch.no_grad():
        assert torch.equal(synced(x), model(x))
        assert torch.equal(reverted(x), model(x))


def test_ema_takes_the_state_dict_ema_of_a_timm_checkpoint(tmp_path):
    """timm's train.py saves `state_dict` and `state_dict_ema` side by side: before -> `--ema`
    said '--ema needs a torchkit checkpoint; ... is not one'. It takes `state_dict_ema` now
    and says so; without --ema the model's own weights are used, as before."""
    import timm

    torch.manual_seed(0)
    own = timm.create_model("test_resnet", num_classes=3).eval()
    averaged = timm.create_model("test_resnet", num_classes=3).eval()
    ema = {f"module.{key}": value for key, value in averaged.state_dict().items()}
    path = tmp_path / "model_best.pth.tar"
    torch.save({"epoch": 3, "arch": "test_resnet", "state_dict": own.state_dict(),
                "state_dict_ema": ema, "version": 2}, path)  # fmt: skip
    batch = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        for flag, truth, source in ((True, averaged, "state dict (state_dict_ema)"),
                                    (False, own, "state dict")):  # fmt: skip
            resolved = resolve_model("timm/test_resnet", weights=str(path), ema=flag)
            assert resolved.weights_source == source
            assert torch.equal(resolved.model.eval()(batch), truth(batch)), flag
    torch.save({"state_dict": own.state_dict()}, tmp_path / "plain.pth")
    with pytest.raises(UsageError, match="needs EMA weights; .* has none"):
        resolve_model("timm/test_resnet", weights=str(tmp_path / "plain.pth"), ema=True)


@pytest.mark.parametrize("command", ["summary", "predict"])
def test_a_timm_hub_repository_name_says_it_is_not_supported(command, tmp_path):
    """Before: "'timm/hf-hub' is a path, not a module name", read as package.module:Callable."""
    args = [command, "timm/hf-hub:timm/resnet18.a1_in1k"]
    done = run_torchkit_in_process(*args, *([str(tmp_path)] if command == "predict" else []))
    assert done.returncode == 2 and done.stdout == ""
    assert error_line(done.stderr) == (
        "Error: invalid model 'timm/hf-hub:timm/resnet18.a1_in1k': timm models named by their "
        "Hugging Face Hub repository (hf-hub:) are not supported (name the model as timm/NAME, "
        "with --weights DEFAULT or a pretrained tag for timm's weights, or --weights FILE for "
        "the repository's weights file)"
    )
