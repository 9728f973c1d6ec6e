"""`train --model RUN/best.pt --image-size N` of a checkpoint trained at another size: a new run
from its weights (a new optimizer, the head for the data's classes). A model built for one
size (a ViT) is rebuilt for N and its weights adapted as eval adapts them, with one Note; a
network that runs at any size needs nothing. Before, a ViT was refused ("does not run on 24x24
images; it is built for the 16 px its checkpoint records"), although eval and predict of the
same file at 24 px adapted it."""

from __future__ import annotations

import pytest
import torch
from checkpoints import read_checkpoint, save_torchkit_checkpoint
from nets import TinyNet, tiny_vit
from output_checks import error_line
from processes import run_torchkit_in_process

RESAMPLED = (
    "Note: trained16.pt: position embeddings resampled from 2x2 to 3x3 (the weights' patch "
    "grid to that of 24x24 images in 8 px patches)"
)
MODELS = {  # spec -> (the model trained at 16 px, the Note that says what was adapted)
    "nets:TinyNet": (lambda: TinyNet(2), None),
    "nets:tiny_vit": (lambda: tiny_vit(2, 16), RESAMPLED),
}


def train_from(folder, *args: object):
    """`train --model trained16.pt` on `folder`'s images, one epoch on the CPU, in-process."""
    return run_torchkit_in_process(
        "train", "--model", "trained16.pt", "--trust-checkpoint", "--data", "images",
        "--val-split", "0.5", "--epochs", "1", "--batch-size", "2", "--device", "cpu",
        "-j", "0", *args, cwd=folder,
    )  # fmt: skip


@pytest.mark.parametrize("spec", MODELS)
def test_a_checkpoint_fine_tunes_at_another_image_size(spec, tmp_path, make_image_folder):
    build, note = MODELS[spec]
    torch.manual_seed(0)
    save_torchkit_checkpoint(tmp_path / "trained16.pt", spec, build(), 16)
    make_image_folder(tmp_path / "images", {"a": 2, "b": 2}, size=24)
    trained = train_from(tmp_path, "--image-size", "24", "--out", "run")
    assert trained.returncode == 0, trained.stderr
    notes = [" ".join(line.split()) for line in trained.stderr.split("Note: ")[1:]]
    adapted = [f"Note: {text}" for text in notes if text.startswith("trained16.pt: ")]
    assert adapted == ([note] if note else [])
    saved = read_checkpoint(tmp_path / "run" / "best.pt")
    assert (saved["arch"], saved["preprocess"]["image_size"]) == (spec, 24)
    if spec == "nets:tiny_vit":  # a 3x3 grid and the class token
        assert saved["model"]["encoder.pos_embedding"].shape == (1, 10, 16)
    # the run continues at the size it trained at: --resume refuses another, as before
    resumed = run_torchkit_in_process(
        "train", "--resume", "run", "--image-size", "16", "--epochs", "2", "--trust-checkpoint",
        cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 1, resumed.stderr
    assert "the checkpoint was trained with --image-size 24, not 16" in error_line(resumed.stderr)


def test_a_size_the_checkpoints_vit_cannot_take_is_refused_before_the_run(
    tmp_path, make_image_folder
):
    save_torchkit_checkpoint(tmp_path / "trained16.pt", "nets:tiny_vit", tiny_vit(2, 16), 16)
    make_image_folder(tmp_path / "images", {"a": 2, "b": 2}, size=20)
    refused = train_from(tmp_path, "--image-size", "20", "--out", "run")
    assert refused.returncode == 2, refused.stderr
    assert error_line(refused.stderr) == (
        "Error: trained16.pt holds a ViT trained on 16x16 images, and 20x20 images do not divide "
        "into its 8 px patches: its position embeddings cannot be resampled to them (use an "
        "--image-size that is a multiple of 8, such as 16 or 24)"
    )
    assert "Note: " not in refused.stderr
    assert not (tmp_path / "run").exists()
