"""Fine-tuning gaps of `NAME --weights FILE`: a ViT's weights for one image size used at another
(the position embeddings resampled, as torchvision's reference scripts and timm do), and a
training checkpoint not torchkit's that holds two sets of weights (timm's `state_dict` and
`state_dict_ema`): the load says which it used."""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import pytest
import torch
from checkpoints import write_convnet_checkpoint
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
    named = run_torchkit_in_process(
        "eval", VIT, "--weights", "run/best.pt", "--data", images, *common, cwd=tmp_path
    )
    assert named.returncode == 0, named.stderr
    assert "resampled" not in named.stderr  # the factory built for the 16 px it records
    # a checkpoint of another architecture is refused as one, not built for at its size
    write_convnet_checkpoint(tmp_path / "conv.pt", in_channels=3, image_size=28, classes="ab")
    other = run_torchkit_in_process(
        "eval", VIT, "--weights", "conv.pt", "--data", images, cwd=tmp_path
    )
    assert error_line(other.stderr).startswith(f"Error: conv.pt holds a convnet, not a {VIT}")
    # the checkpoint as --model is rebuilt for another size as eval rebuilds it (fine-tuned at
    # 24 px in train/test_train_checkpoint_at_another_size.py); one its patches do not divide
    # is refused in the same words
    refused = run_torchkit_in_process(
        "train", "--model", "run/best.pt", "--trust-checkpoint", "--data", images,
        "--image-size", "20", "--val-split", "0.5", "--out", "run2", *common, cwd=tmp_path,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert error_line(refused.stderr) == (
        "Error: run/best.pt holds a ViT trained on 16x16 images, and 20x20 images do not divide "
        "into its 8 px patches: its position embeddings cannot be resampled to them (use an "
        "--image-size that is a multiple of 8, such as 16 or 24)"
    )


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


def test_embeddings_that_fit_a_non_square_grid_load_as_they_are(tmp_path, caplog):
    """Weights of a timm ViT built for 64x144 images (a 4x9 grid: 36 patches, a square count)
    loaded into the same model: before -> taken for a 6x6 grid and 'resampled from 6x6 to
    4x9', every position embedding moved, exit 0. They fit: loaded as they are, no note."""
    pytest.importorskip("timm")
    path = tmp_path / "wide.pt"
    state = resolve_model("timm/test_vit", image_size=(64, 144), num_classes=2).model.state_dict()
    assert state["pos_embed"].shape[1] == 1 + 4 * 9
    torch.save(state, path)
    with caplog.at_level("WARNING", logger="torchkit"):
        resolved = resolve_model("timm/test_vit", weights=str(path), image_size=(64, 144))
    assert torch.equal(resolved.model.pos_embed.detach(), state["pos_embed"])
    assert "resampled" not in caplog.text


def test_a_torchvision_vit_at_a_size_its_patches_do_not_divide_names_sizes_that_work():
    """Before -> 'cannot build vit_b_16 for 56x56 images: Input shape indivisible by patch
    size!' and no way forward; now the hint names the sizes around it that its patches divide
    (the refusal comes at the build, before any weight is made)."""
    refused = run_torchkit_in_process("summary", "vit_b_16", "--input-size", "3,56,56")
    assert refused.returncode == 2
    assert error_line(refused.stderr) == (
        "Error: cannot build vit_b_16 for 56x56 images: Input shape indivisible by patch size! "
        "(use an --image-size that is a multiple of 16, such as 48 or 64)"
    )


def timm_checkpoint(path: Path) -> tuple[dict, dict]:
    """A checkpoint as timm's train.py saves one with --model-ema: `state_dict` and
    `state_dict_ema` (DDP's `module.` on the EMA's keys), its options as an argparse
    Namespace. Returns (model weights, EMA weights)."""
    from nets import TinyNet

    torch.manual_seed(0)
    model, averaged = TinyNet(3).state_dict(), TinyNet(3).state_dict()
    torch.save(
        {
            "epoch": 7,
            "arch": "tinynet",
            "state_dict": model,
            "state_dict_ema": {f"module.{key}": value for key, value in averaged.items()},
            "optimizer": {"state": {}, "param_groups": []},
            "args": argparse.Namespace(model="tinynet", model_ema=True, lr=0.1),
            "version": 2,
            "metric": 71.5,
        },
        path,
    )
    return model, averaged


class NamespaceState:
    """Pickles as an argparse.Namespace rebuilt with `state` (pickle's BUILD: a dict, or a
    (dict, attributes to set) pair), as a hostile file could write one."""

    def __init__(self, state: object) -> None:
        self.state = state

    def __reduce__(self):
        return (argparse.Namespace, (), self.state)


def test_a_namespace_lets_no_code_through(tmp_path):
    """The weights-only load rebuilds timm's `args` Namespace, and nothing more: a value that
    runs a command when unpickled is still refused by name, and an attribute that would turn
    the Namespace into another class fails the load; either way one error, nothing run."""
    from hostile_pickles import RunsShell

    from torchkit.core.io.errors import CheckpointError
    from torchkit.core.models.checkpoint import load_checkpoint

    marker = tmp_path / "ran"
    hostile = {
        "runs.pt": (argparse.Namespace(lr=0.1, hook=RunsShell(marker)), "a pickled posix.system"),
        "recast.pt": (
            NamespaceState((None, {"__class__": collections.OrderedDict})),
            # torch 2.5+ names the refused assignment; 2.4's unpickler fails on the pair
            r"cannot read checkpoint .*recast\.pt",
        ),
    }
    for name, (args, why) in hostile.items():
        torch.save({"state_dict": {"w": torch.zeros(1)}, "args": args}, tmp_path / name)
        with pytest.raises(CheckpointError, match=why):
            load_checkpoint(tmp_path / name)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("flags", "note", "used"),
    [
        (
            (),
            "ck.pth.tar holds the model's weights (state_dict) and their EMA (state_dict_ema): "
            "loaded state_dict; --ema loads state_dict_ema",
            0,
        ),
        (
            ("--ema",),
            "ck.pth.tar: loaded its EMA weights (state_dict_ema), not the model's (state_dict)",
            1,
        ),  # fmt: skip
    ],
    ids=["model", "ema"],
)
def test_a_timm_checkpoint_says_which_weights_it_loads(tmp_path, image_folder, flags, note, used):
    """timm's train.py checkpoint as --weights: before -> 'holds a pickled argparse.Namespace
    ... pass --trust-checkpoint' (its `args`), and nothing said of the EMA weights beside the
    model's. It loads without trust; a note says which weights were used and how to take the
    others, and those are the ones evaluated."""
    from nets import TinyNet

    weights = timm_checkpoint(tmp_path / "ck.pth.tar")[used]
    done = run_torchkit_in_process(
        "predict", "nets:TinyNet", "--weights", "ck.pth.tar", image_folder, *flags,
        "--format", "json", "--device", "cpu", "-j", "0", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"Note: {note}" in " ".join(done.stderr.split())
    resolved = resolve_model("nets:TinyNet", weights=str(tmp_path / "ck.pth.tar"), ema=bool(used))
    reference = TinyNet(3)
    reference.load_state_dict(weights)
    for key, value in reference.state_dict().items():
        assert torch.equal(resolved.model.state_dict()[key], value), key
    quiet = run_torchkit_in_process(
        "predict", "nets:TinyNet", "--weights", "ck.pth.tar", image_folder, *flags, "-q",
        "--device", "cpu", "-j", "0", cwd=tmp_path,
    )  # fmt: skip
    assert quiet.returncode == 0 and "Note" not in quiet.stderr


def test_train_from_a_timm_checkpoint_names_the_way_to_its_ema_weights(tmp_path, image_folder):
    """train's --ema keeps an EMA of the run, so its note points to `convert checkpoint --key`
    for the file's EMA weights; that file then fine-tunes them."""
    _, averaged = timm_checkpoint(tmp_path / "ck.pth.tar")
    common = ("--data", image_folder, "--val-split", "0.5", "--epochs", "1", "--batch-size", "2")
    common += ("--device", "cpu", "-j", "0", "--image-size", "8")
    done = run_torchkit_in_process(
        "train", "--model", "nets:TinyNet", "--weights", "ck.pth.tar", *common, "--out", "run",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    hint = (
        "loaded state_dict; to fine-tune the EMA weights, keep them alone with `torchkit "
        "convert checkpoint ck.pth.tar EMA.pt --key state_dict_ema` and pass EMA.pt as --weights"
    )
    assert hint in " ".join(done.stderr.split())
    converted = run_torchkit_in_process(
        "convert", "checkpoint", "ck.pth.tar", "EMA.pt", "--key", "state_dict_ema", cwd=tmp_path
    )
    assert converted.returncode == 0, converted.stderr
    loaded = resolve_model("nets:TinyNet", weights=str(tmp_path / "EMA.pt")).model.state_dict()
    assert all(torch.equal(loaded[key], value) for key, value in averaged.items())


def test_a_timm_checkpoint_loads_with_torch_2_4s_allowlist(tmp_path, monkeypatch):
    """torch 2.4 (the lowest torchkit takes) has add_safe_globals but no safe_globals context:
    every weights-only load failed there ('module torch.serialization has no attribute
    safe_globals'). Its allowlist is used, and left as it was found."""
    from torchkit.core.models.checkpoint import load_checkpoint

    monkeypatch.delattr(torch.serialization, "safe_globals", raising=False)  # 2.4 lacks it
    model, _ = timm_checkpoint(tmp_path / "ck.pth.tar")
    before = torch.serialization.get_safe_globals()
    loaded = load_checkpoint(tmp_path / "ck.pth.tar")
    assert loaded["args"] == argparse.Namespace(model="tinynet", model_ema=True, lr=0.1)
    assert all(torch.equal(loaded["state_dict"][key], value) for key, value in model.items())
    # torch keeps its allowlist in a set: the same entries, in any order
    assert set(torch.serialization.get_safe_globals()) == set(before)
