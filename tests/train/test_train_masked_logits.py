"""`train` with a model that masks classes with -inf logits: a validation image whose true class
is masked has an infinite loss, left out of the validation loss (counted in metrics.csv's
`val_masked`, warned of once) instead of stopping the run as diverged; a training loss a mask
makes infinite (a masked true class, or any -inf logit under label smoothing) is one error line
saying so, not "the run diverged"."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

RECIPE = [
    "--image-size", "8", "--resize-size", "8", "--crop-scale", "1,1", "--no-flip",
    "--batch-size", "4", "--workers", "0", "--device", "cpu", "--no-ema",
]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """12 8x8 PNGs in a, b, c; the masking nets mask c, their last class."""
    return write_image_folder(tmp_path_factory.mktemp("masked") / "d", dict.fromkeys("abc", 4))


def test_validation_images_of_a_masked_class_are_left_out_of_the_loss(data, tmp_path):
    """The validation loss was +inf, and the run stopped as diverged after its first epoch."""
    out = tmp_path / "run"
    done = run_torchkit_in_process(
        "train", "--data", data, "--val-split", "0.5", "--model", "nets:EvalMaskedNet",
        "--epochs", "1", *RECIPE, "--out", out, "--format", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["history"]

    # The hand-written loop: best.pt's weights over the validation images, in eval mode.
    from nets import EvalMaskedNet
    from PIL import Image
    from torchvision import transforms as T

    from torchkit.core.data.sources import open_data, training_splits

    net = EvalMaskedNet(3).eval()
    net.load_state_dict(torch.load(out / "best.pt", weights_only=True)["model"])
    val = training_splits(open_data(str(data)), val_split=0.5, seed=0)[0]["val"]
    to_tensor = T.Compose([T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    x = torch.stack([to_tensor(Image.open(p).convert("RGB")) for p in val.paths])
    y = torch.tensor(val.labels)
    with torch.no_grad():
        logits = net(x)
    losses = torch.nn.functional.cross_entropy(logits, y, reduction="none")
    masked = int((y == 2).sum())
    assert 0 < masked < len(y) and int(torch.isinf(losses).sum()) == masked
    assert row["val_loss"] == pytest.approx(losses[y != 2].mean().item(), rel=1e-6)
    assert row["val_masked"] == masked
    assert row["val_top1"] == pytest.approx((logits.argmax(1) == y).float().mean().item())
    warnings = [line for line in done.stderr.splitlines() if line.startswith("Warning:")]
    assert warnings == [
        f"Warning: the model gives the true class of {masked} of {len(y)} validation images a "
        "-inf logit (it masks that class): their loss is infinite, so the validation loss is "
        "the mean over the others (the accuracies count every image; metrics.csv's val_masked "
        "counts them each epoch)"
    ]
    header, values = (out / "metrics.csv").read_text().splitlines()
    assert header.endswith(",val_masked") and values.endswith(f",{masked}")


@pytest.mark.parametrize(
    ("smoothing", "code", "message"),
    [
        ("0", 1, "the training loss is infinite (epoch 1, step 1 of 2): the model gives a "
         "training image's true class a -inf logit (it masks that class)"),
        ("0.1", 2, "--label-smoothing 0.1 needs finite logits: the model gives a class a -inf "
         "logit (it masks the class), so the smoothed training loss is infinite (epoch 1, step "
         "1 of 2) (train with --label-smoothing 0"),
    ],
    ids=["true-class-masked", "label-smoothing"],
)  # fmt: skip
def test_a_training_loss_a_mask_makes_infinite_is_said_so_not_diverged(
    data, tmp_path, smoothing, code, message
):
    done = run_torchkit_in_process(
        "train", "--data", data, "--val-split", "0.5", "--model", "nets:MaskedNet", "--epochs",
        "1", *RECIPE, "--label-smoothing", smoothing, "--out", tmp_path / "run",
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    line = error_line(done.stderr)
    assert message in line and "diverged" not in line, line


def test_the_learning_rate_range_test_of_a_masking_model_says_why_its_loss_is_infinite(
    data, tmp_path
):
    """--find-lr stopped at once, "Stopped on a diverging loss: yes", with no step taken."""
    done = run_torchkit_in_process(
        "train", "--data", data, "--val-split", "0.5", "--model", "nets:MaskedNet", "--epochs",
        "1", *RECIPE, "--find-lr", "--label-smoothing", "0", "--out", tmp_path / "run",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr)
    assert "the training loss is infinite (the learning-rate range test): the model " in line, line


def test_a_nan_validation_loss_is_still_a_divergence(data, tmp_path, monkeypatch):
    """Only a -inf true-class logit in an otherwise scorable row is left out: a NaN logit
    (weights gone bad) still stops the run."""
    import nets

    monkeypatch.setattr(nets.EvalMaskedNet, "forward", _nan_in_eval)
    done = run_torchkit_in_process(
        "train", "--data", data, "--val-split", "0.5", "--model", "nets:EvalMaskedNet",
        "--epochs", "1", *RECIPE, "--out", tmp_path / "run",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "the validation loss is not finite" in error_line(done.stderr)


def _nan_in_eval(self, x: torch.Tensor) -> torch.Tensor:
    from nets import TinyNet

    logits = TinyNet.forward(self, x)
    if self.training:
        return logits
    return torch.cat([logits[:, :-1], torch.full_like(logits[:, -1:], math.nan)], dim=1)
