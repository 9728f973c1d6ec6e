"""Checkpoints of models built for one image size besides torchvision's and timm's plain ViTs
(test_vit_checkpoint_image_size.py), given as MODEL with another --image-size. Before: torchvision's
MaxViT died on the first batch ("shape '[1, 4, 4, 2, 2, 8]' is invalid"), timm's CoAtNet too,
timm's relative-position ViT with "AssertionError: Input height (64) doesn't match model (32)",
and timm's MaxViT ran with the windows of the size it was built for. Now each is rebuilt for
the size asked for; the weights that follow the size (timm's relative position bias tables) are
resampled by timm's own checkpoint filter, with one Note; a size it cannot be built for is one
Error naming the checkpoint's size."""

from __future__ import annotations

import importlib.util
import json
import warnings

import pytest
import torch
from checkpoints import add_ema_weights, save_torchkit_checkpoint
from nets import tiny_maxvit
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.io.errors import UsageError
from torchkit.core.models import resolve_model

needs_timm = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs timm")


def seeded(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every parameter drawn again (a checkpoint whose every part shows)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for value in model.parameters():
            value.normal_(0, 0.5)
    return model.eval()


def test_a_torchvision_maxvit_checkpoint_is_rebuilt_for_another_size(tmp_path):
    """Its relative position tables follow its partition size, not the image's: the model
    built for 32 px takes the 16 px checkpoint's weights as they are, and answers as
    torchvision's MaxVit built for 32 px with them."""
    trained = seeded(tiny_maxvit(2, 16))
    save_torchkit_checkpoint(tmp_path / "maxvit16.pt", "nets:tiny_maxvit", trained, 16)
    resolved = resolve_model(str(tmp_path / "maxvit16.pt"), trust_checkpoint=True, image_size=32)
    assert resolved.sample_shape == (3, 32, 32)
    loaded = resolved.model.eval().state_dict()
    for key, value in trained.state_dict().items():
        assert torch.equal(loaded[key], value), key
    reference = tiny_maxvit(2, 32).eval()
    reference.load_state_dict(trained.state_dict())
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(resolved.model(images), reference(images), rtol=0, atol=0)


def test_a_maxvit_checkpoint_predicts_at_another_size_and_a_size_it_cannot_take_is_refused(
    tmp_path, make_image_folder
):
    save_torchkit_checkpoint(tmp_path / "maxvit16.pt", "nets:tiny_maxvit", tiny_maxvit(2, 16), 16)
    make_image_folder(tmp_path / "images", {"a": 1, "b": 1}, size=16)
    command = ["predict", "maxvit16.pt", "images", "--trust-checkpoint", "--device", "cpu"]
    done = run_torchkit_in_process(
        *command, "-j", "0", "--format", "json", "--image-size", "32", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == 2
    assert (  # nothing resampled: the note says what was done
        "Note: maxvit16.pt: nets:tiny_maxvit rebuilt for 32x32 images (trained on 16x16), its "
        "weights loaded as they are (none of them follows the image size)"
    ) in " ".join(done.stderr.split())
    refused = run_torchkit_in_process(*command, "--image-size", "20", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert error_line(refused.stderr) == (
        "Error: maxvit16.pt holds a model trained on 16x16 images, and cannot be built for "
        "20x20 images: nets:tiny_maxvit could not build a model: ValueError: Input size (5, 5) "
        "of block 0 is not divisible by partition size 2. Consider changing the partition size "
        "or the input size. (drop --image-size to run it at 16, or choose another size)"
    )
    assert refused.stdout == ""


@needs_timm
def test_a_timm_maxvit_checkpoints_tables_are_resampled_as_timm_does(tmp_path, caplog):
    """Built for 128 px its windows are 4x4 where the 64 px checkpoint's are 2x2: each
    relative position bias table is timm's `resize_rel_pos_bias_table` of the checkpoint's,
    every other weight is the checkpoint's, and its windows are those timm builds for 128 px."""
    import timm
    from timm.layers import resize_rel_pos_bias_table

    trained = seeded(timm.create_model("test_maxvit", num_classes=2, img_size=64))
    save_torchkit_checkpoint(tmp_path / "maxvit64.pt", "timm/test_maxvit", trained, 64)
    resolved = resolve_model(str(tmp_path / "maxvit64.pt"), image_size=128)
    assert resolved.sample_shape == (3, 128, 128)
    notes = [r.getMessage() for r in caplog.records if "follow the image size" in r.getMessage()]
    assert notes == [
        f"{tmp_path / 'maxvit64.pt'}: 8 weights that follow the image size "
        "(relative_position_bias_table) resampled to those of 128x128 images (timm's "
        "checkpoint filter for MaxxVit)"
    ]
    model = resolved.model.eval()
    tables = 0
    for key, value in trained.state_dict().items():
        if key.endswith("relative_position_bias_table"):
            tables += 1
            assert value.shape[0] == 3 * 3
            with warnings.catch_warnings():  # timm's interpolation's own torch warnings
                warnings.simplefilter("ignore", UserWarning)
                expected = resize_rel_pos_bias_table(
                    value, new_window_size=(4, 4), new_bias_shape=(7 * 7, value.shape[1])
                )
            torch.testing.assert_close(model.state_dict()[key], expected, rtol=0, atol=0)
        else:
            assert torch.equal(model.state_dict()[key], value), key
    assert tables == 8
    assert model.stages[0].blocks[0].attn_block.attn.rel_pos.window_size == (4, 4)
    with torch.no_grad():
        assert model(torch.rand(1, 3, 128, 128)).shape == (1, 2)
    # `NAME --weights FILE` (fine-tuning at the new size) resamples them the same way
    by_name = resolve_model(
        "timm/test_maxvit", weights=str(tmp_path / "maxvit64.pt"), image_size=128
    )
    for key, value in model.state_dict().items():
        assert torch.equal(by_name.model.state_dict()[key], value), key

    # --ema: the EMA weights are the ones resampled and used, with one note
    table = "stages.0.blocks.0.attn_block.attn.rel_pos.relative_position_bias_table"
    averaged = trained.state_dict()[table] + 1
    add_ema_weights(tmp_path / "maxvit64.pt", trained)
    checkpoint = torch.load(tmp_path / "maxvit64.pt", weights_only=True)
    checkpoint["model_ema"][f"module.{table}"] = averaged
    torch.save(checkpoint, tmp_path / "maxvit64.pt")
    caplog.clear()
    with_ema = resolve_model(str(tmp_path / "maxvit64.pt"), image_size=128, ema=True).model
    assert [
        r.getMessage() for r in caplog.records if "follow the image size" in r.getMessage()
    ] == [f"the EMA weights of {notes[0]}"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = resize_rel_pos_bias_table(averaged, (4, 4), (7 * 7, averaged.shape[1]))
    torch.testing.assert_close(with_ema.state_dict()[table], expected, rtol=0, atol=0)


@needs_timm
def test_a_timm_relative_position_vit_is_rebuilt_and_refuses_partial_patches(tmp_path):
    """Its position bias comes from an MLP of the offsets: rebuilt for 64 px, it takes the
    32 px checkpoint's weights as they are; 40 px do not divide into its 16 px patches."""
    import timm

    trained = seeded(timm.create_model("test_vit_relpos", num_classes=2, img_size=32))
    path = tmp_path / "relpos32.pt"
    save_torchkit_checkpoint(path, "timm/test_vit_relpos", trained, 32)
    resolved = resolve_model(str(path), image_size=64)
    for key, value in trained.state_dict().items():
        assert torch.equal(resolved.model.state_dict()[key], value), key
    with torch.no_grad():
        assert resolved.model.eval()(torch.rand(1, 3, 64, 64)).shape == (1, 2)
    with pytest.raises(UsageError) as refused:
        resolve_model(str(path), image_size=40)
    assert str(refused.value) == (
        f"{path} holds a model trained on 32x32 images, and 40x40 images do not divide into its "
        "16 px patches (use an --image-size that is a multiple of 16, such as 32 or 48)"
    )


COATNET_AT_48 = (
    "timm/test_coatnet cannot run on 48x48 images, although it is built for them: Expected size "
    "for first two dimensions of batch2 tensor to be: [3, 4] but got: [3, 1]."
)


@needs_timm
def test_a_timm_coatnet_at_a_size_it_cannot_run_is_refused_before_any_image(
    tmp_path, make_image_folder
):
    """timm builds CoAtNet for 48 px, but its last stage's attention is sized for 2x2 feature
    maps that its pooling makes 1x1. Before: the checkpoint's tables resampled with a Note,
    then `Error: the model fails on 48x48 images: output with shape [4, 3, 1, 1] doesn't match
    the broadcast shape [4, 3, 4, 4]` at the first batch, and a train of the name ended in
    `Error: RuntimeError: ...` after the run had started. Now one line before either, naming
    sizes it runs at (each tried on the meta device: multiples of its 32 px stride)."""
    import timm

    model = timm.create_model("test_coatnet", num_classes=2, img_size=64)
    save_torchkit_checkpoint(tmp_path / "coat64.pt", "timm/test_coatnet", model, 64)
    make_image_folder(tmp_path / "images", {"a": 2, "b": 2}, size=48)
    common = ("--image-size", "48", "--device", "cpu", "-j", "0")
    predicted = run_torchkit_in_process("predict", "coat64.pt", "images", *common, cwd=tmp_path)
    assert predicted.returncode == 2, predicted.stderr
    assert predicted.stdout == ""
    assert error_line(predicted.stderr, besides="nothing") == (
        f"Error: coat64.pt holds a model trained on 64x64 images, and {COATNET_AT_48} (use an "
        "--image-size that is a multiple of 32, such as 32 or 64, or drop --image-size to run "
        "it at 64)"
    )
    trained = run_torchkit_in_process(
        "train", "--model", "timm/test_coatnet", "--data", "images", "--val-split", "0.5",
        "--epochs", "1", "--out", "run", *common, cwd=tmp_path,
    )  # fmt: skip
    assert trained.returncode == 2, trained.stderr
    assert error_line(trained.stderr) == (
        f"Error: {COATNET_AT_48} (use an --image-size that is a multiple of 32, such as 32 or 64)"
    )
    assert not (tmp_path / "run").exists()
