"""Fine-tuning gaps of `NAME --weights FILE`: a ViT's weights for one image size used at another
(the position embeddings resampled, as torchvision's reference scripts and timm do)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from nets import tiny_vit
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.models import resolve_model

VIT = "nets:tiny_vit"  # torchvision's VisionTransformer: 8 px patches, width 16, one layer


def vit_weights(path: Path, *, image_size: int = 32, num_classes: int = 3) -> dict:
    """A tiny ViT's state dict for `image_size` images (a 4x4 grid at 32 px), saved to `path`."""
    torch.manual_seed(0)
    state = tiny_vit(num_classes, image_size).state_dict()
    torch.save(state, path)
    return state


@pytest.mark.parametrize("side", [16, 48], ids=["down-to-2x2", "up-to-6x6"])
def test_position_embeddings_are_resampled_as_torchvision_does(tmp_path, side):
    """Before -> 'the weights in vit32.pt do not fit the model: 1 shape mismatches (first:
    encoder.pos_embedding is (1, 17, 16) in the weights, (1, 5, 16) in the model)'. The model
    is built for the size asked for and its position embeddings are torchvision's own
    resampling of the file's (`interpolate_embeddings`, the reference scripts'); every other
    weight is the file's."""
    from torchvision.models.vision_transformer import interpolate_embeddings

    path = tmp_path / "vit32.pt"
    state = vit_weights(path)
    resolved = resolve_model(VIT, weights=str(path), image_size=side)
    expected = interpolate_embeddings(side, 8, state)
    loaded = resolved.model.state_dict()
    grid = side // 8
    assert loaded["encoder.pos_embedding"].shape == (1, 1 + grid * grid, 16)
    for key, value in expected.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=1e-6, msg=key)
    with torch.no_grad():
        assert resolved.model.eval()(torch.rand(2, 3, side, side)).shape == (2, 3)


def test_a_vit_fine_tunes_and_evaluates_at_another_size(tmp_path, make_image_folder):
    """Weights for 32 px trained at --image-size 16 (1 epoch) and the run's weights evaluated
    at 24: each load resamples with one note from grid to grid; the run's checkpoint rebuilds
    its model at the size it trained at (the factory gets it)."""
    vit_weights(tmp_path / "vit32.pt")
    images = make_image_folder(tmp_path / "images", {"a": 2, "b": 2}, size=16)
    common = ("--device", "cpu", "-j", "0")
    trained = run_torchkit_in_process(
        "train", "--model", VIT, "--weights", "vit32.pt", "--data", images, "--image-size", "16",
        "--val-split", "0.5", "--epochs", "1", "--batch-size", "2", "--out", "run", *common,
        cwd=tmp_path,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert (
        "Note: vit32.pt: position embeddings resampled from 4x4 to 2x2 (the weights' patch "
        "grid to that of 16x16 images in 8 px patches)"
    ) in " ".join(trained.stderr.split())
    evaluated = run_torchkit_in_process(
        "eval", VIT, "--weights", "run/best.pt", "--data", images, "--image-size", "24",
        "--format", "json", *common, cwd=tmp_path,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    assert "position embeddings resampled from 2x2 to 3x3" in evaluated.stderr
    alone = run_torchkit_in_process(
        "eval", "run/best.pt", "--trust-checkpoint", "--data", images, "-q", *common, cwd=tmp_path
    )
    assert alone.returncode == 0, alone.stderr
    assert "resampled" not in alone.stderr  # built for the 16 px it records


def test_timm_vit_embeddings_are_resampled_as_timm_does(tmp_path):
    """timm's ViT (`pos_embed`, its prefix tokens) resampled as timm resamples on load
    (`resample_abs_pos_embed`: bicubic, antialiased); a size its 16 px patches do not divide
    is one error naming sizes that work."""
    pytest.importorskip("timm")
    from timm.layers import resample_abs_pos_embed

    path = tmp_path / "vit32.pt"
    state = resolve_model("timm/test_vit", image_size=32, num_classes=2).model.state_dict()
    torch.save(state, path)
    resolved = resolve_model("timm/test_vit", weights=str(path), image_size=64)
    expected = resample_abs_pos_embed(state["pos_embed"], [4, 4], num_prefix_tokens=1)
    torch.testing.assert_close(resolved.model.pos_embed.detach(), expected, rtol=0, atol=1e-6)
    refused = run_torchkit_in_process(
        "summary", "timm/test_vit", "--weights", path, "--input-size", "3,56,56"
    )
    assert refused.returncode != 0
    assert error_line(refused.stderr) == (
        f"Error: the weights in {path} are for another image size, and 56x56 images do not "
        "divide into 16 px patches: their position embeddings cannot be resampled (use an "
        "--image-size that is a multiple of 16, such as 48 or 64)"
    )
