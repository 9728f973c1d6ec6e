"""A ViT checkpoint `torchkit train` wrote at one image size, given as MODEL with another
--image-size: before -> eval, predict and extract-features died on the first batch with 'Error:
AssertionError: Wrong image height! Expected 16 but got 24!', export with 'does not run on an
input of shape 1x3x24x24'. Now the resolver rebuilds the ViT for the size asked for and
resamples its position embeddings (one Note, as for `NAME --weights FILE`); a size its patches
do not divide is one Error line naming both sizes, before any work."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch
from checkpoints import save_torchkit_checkpoint
from nets import tiny_vit
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.models import resolve_model

VIT = "nets:tiny_vit"  # torchvision's VisionTransformer: 8 px patches, width 16, one layer
CPU = ("--device", "cpu", "-j", "0")
RESAMPLED = (
    "Note: vit16.pt: position embeddings resampled from 2x2 to 3x3 (the weights' patch grid to "
    "that of 24x24 images in 8 px patches)"
)
REFUSED = (
    "Error: vit16.pt holds a ViT trained on 16x16 images, and 20x20 images do not divide into "
    "its 8 px patches: its position embeddings cannot be resampled to them (use an --image-size "
    "that is a multiple of 8, such as 16 or 24)"
)


def distinct_vit(size: int = 16) -> torch.nn.Module:
    """tiny_vit for `size` px with weights whose every part shows in its outputs: torchvision
    zeroes the head (every image 50/50) and draws the position embeddings with std 0.02."""
    torch.manual_seed(0)
    model = tiny_vit(2, size)
    with torch.no_grad():
        model.heads.head.weight.normal_()
        model.encoder.pos_embedding.normal_()
    return model


@pytest.fixture
def vit_run(tmp_path, make_image_folder) -> Path:
    """tmp_path with vit16.pt (tiny_vit trained at 16 px, by its record) and 16 px images."""
    save_torchkit_checkpoint(tmp_path / "vit16.pt", VIT, distinct_vit(), 16)
    make_image_folder(tmp_path / "images", {"a": 2, "b": 2}, size=16)
    return tmp_path


COMMANDS = {
    "eval": ["eval", "vit16.pt", "--data", "images", "--out", "report", *CPU],
    "predict": ["predict", "vit16.pt", "images", "--format", "json", *CPU],
    "extract-features": ["extract-features", "vit16.pt", "images", "feats", *CPU],
    "export": ["export", "vit16.pt", "vit.ts", "--format", "json"],
    "summary": ["summary", "vit16.pt", "--device", "cpu"],
    "benchmark": ["benchmark", "vit16.pt", "--device", "cpu", "--warmup", "0", "--iters", "1"],
}
WRITES = {"eval": "report", "extract-features": "feats", "export": "vit.ts"}


def run(cwd: Path, command: str, *size: str):
    return run_torchkit_in_process(*COMMANDS[command], *size, "--trust-checkpoint", cwd=cwd)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_vit_checkpoint_runs_at_another_image_size(vit_run, command):
    """--image-size 24 for a checkpoint trained at 16: exit 0, one Note from grid to grid."""
    done = run(vit_run, command, "--image-size", "24")
    assert done.returncode == 0, done.stderr
    assert RESAMPLED in done.stderr.splitlines()
    assert done.stderr.count("resampled") == 1
    if command == "export":  # the file takes the size asked for
        assert json.loads(done.stdout)["input_shape"] == [3, 24, 24]
    if command in WRITES:
        assert (vit_run / WRITES[command]).exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_size_its_patches_do_not_divide_is_one_error_before_any_work(vit_run, command):
    """--image-size 20 (8 px patches): exit 2, one Error line naming the checkpoint's size and
    the one asked for, and sizes that work; nothing written."""
    refused = run(vit_run, command, "--image-size", "20")
    assert refused.returncode == 2, refused.stderr
    assert error_line(refused.stderr) == REFUSED
    assert refused.stdout == ""
    if command in WRITES:
        assert not (vit_run / WRITES[command]).exists()


def test_a_torchvision_vit_checkpoint_refuses_an_input_that_is_not_square(vit_run):
    """torchvision's ViT is built for one side: summary's --input-size 3,16,24 is one error
    that says so, not a rebuild failing inside torchvision ('unsupported operand type(s)
    for %')."""
    refused = run(vit_run, "summary", "--input-size", "3,16,24")
    assert refused.returncode == 2, refused.stderr
    assert error_line(refused.stderr) == (
        "Error: vit16.pt holds a ViT trained on 16x16 images, which takes square images only, "
        "not 16x24 (give an input size whose height and width are the same)"
    )


def predictions(cwd: Path, model: str, *extra: str) -> tuple[list[dict], str]:
    done = run_torchkit_in_process(
        "predict", model, "images", "--trust-checkpoint", "--format", "json", "--topk", "2",
        *extra, *CPU, cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_the_checkpoints_own_size_is_unchanged_and_another_is_as_weights_resample(vit_run):
    """At the size it records, with or without --image-size, the same numbers and no note; at
    24 the same numbers as `NAME --weights FILE --image-size 24` (the resampling fine-tuning
    uses), which differ from those at 16; the export at 24 predicts them too."""
    as_trained, said = predictions(vit_run, "vit16.pt")
    same_size, said_too = predictions(vit_run, "vit16.pt", "--image-size", "16")
    assert same_size == as_trained
    assert "resampled" not in said + said_too
    resized, said = predictions(vit_run, "vit16.pt", "--image-size", "24")
    assert RESAMPLED in said
    assert resized == predictions(vit_run, VIT, "--weights", "vit16.pt", "--image-size", "24")[0]
    assert resized != as_trained
    exported = run(vit_run, "export", "--image-size", "24")
    assert exported.returncode == 0, exported.stderr
    from_export, _ = predictions(vit_run, "vit.ts")
    for row, expected in zip(from_export, resized, strict=True):
        assert row["class_1"] == expected["class_1"], row
        assert row["probability_1"] == pytest.approx(expected["probability_1"], abs=1e-5)


def test_the_resampling_is_torchvisions(tmp_path):
    """The rebuilt model holds torchvision's own resampling of the checkpoint's position
    embeddings (`interpolate_embeddings`) and every other weight as it is; its input is 32 px."""
    from torchvision.models.vision_transformer import interpolate_embeddings

    model = distinct_vit()
    save_torchkit_checkpoint(tmp_path / "vit16.pt", VIT, model, 16)
    resolved = resolve_model(str(tmp_path / "vit16.pt"), trust_checkpoint=True, image_size=32)
    expected = interpolate_embeddings(32, 8, model.state_dict())
    loaded = resolved.model.state_dict()
    assert loaded["encoder.pos_embedding"].shape == (1, 1 + 4 * 4, 16)
    for key, value in expected.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=1e-6, msg=key)
    assert resolved.sample_shape == (3, 32, 32)
    with torch.no_grad():
        assert resolved.model.eval()(torch.rand(2, 3, 32, 32)).shape == (2, 2)


def test_a_timm_vit_checkpoint_is_resampled_as_timm_does(tmp_path):
    pytest.importorskip("timm")
    from timm.layers import resample_abs_pos_embed

    model = resolve_model("timm/test_vit", image_size=32, num_classes=2).model
    save_torchkit_checkpoint(tmp_path / "vit32.pt", "timm/test_vit", model, 32)
    resolved = resolve_model(str(tmp_path / "vit32.pt"), image_size=64)
    expected = resample_abs_pos_embed(model.pos_embed.detach(), [4, 4], num_prefix_tokens=1)
    torch.testing.assert_close(resolved.model.pos_embed.detach(), expected, rtol=0, atol=1e-6)


def test_the_ema_weights_are_resampled_with_one_note(vit_run):
    """--ema: the EMA weights are the ones resampled and used; one note says so."""
    from checkpoints import add_ema_weights

    torch.manual_seed(1)
    averaged = distinct_vit()
    with torch.no_grad():
        averaged.encoder.pos_embedding.normal_()
    add_ema_weights(vit_run / "vit16.pt", averaged)
    done = run_torchkit_in_process(
        "predict", "vit16.pt", "images", "--ema", "--image-size", "24", "--trust-checkpoint",
        *CPU, cwd=vit_run,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("resampled") == 1
    assert "Note: the EMA weights of vit16.pt: position embeddings resampled from 2x2 to 3x3" in (
        done.stderr
    )
    resolved = resolve_model(
        str(vit_run / "vit16.pt"), trust_checkpoint=True, ema=True, image_size=24
    )
    from torchvision.models.vision_transformer import interpolate_embeddings

    expected = interpolate_embeddings(24, 8, averaged.state_dict())["encoder.pos_embedding"]
    torch.testing.assert_close(resolved.model.encoder.pos_embedding.detach(), expected)


def test_a_factory_that_takes_no_image_size_is_refused_by_name(vit_run, monkeypatch):
    """A ViT factory without an `image_size` parameter builds only its own size: one Error
    (not the first batch's shape error) that says so."""
    module = types.ModuleType("fixed_vits")
    module.vit16 = lambda num_classes=2: tiny_vit(num_classes, 16)
    monkeypatch.setitem(sys.modules, "fixed_vits", module)
    save_torchkit_checkpoint(vit_run / "fixed.pt", "fixed_vits:vit16", distinct_vit(), 16)
    refused = run_torchkit_in_process(
        "predict", "fixed.pt", "images", "--image-size", "24", "--trust-checkpoint", *CPU,
        cwd=vit_run,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert error_line(refused.stderr) == (
        "Error: fixed.pt holds a ViT trained on 16x16 images, and fixed_vits:vit16 builds none "
        "for 24x24 images (it takes no image_size) (drop --image-size to run it at 16, or give "
        "fixed_vits:vit16 an image_size parameter)"
    )
