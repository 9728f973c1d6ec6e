"""Every command that runs a model refuses an image size the model cannot run at (a network too
deep for small images) with the same line, naming the smallest size it takes
(`core/models/image_size.py`), where eval, predict, extract-features, export and convert-syncbn
once printed torch's shape error (some with exit 1, one as "RuntimeError: ...")."""

from __future__ import annotations

import pytest
import torch
from nets import DeepNet
from output_checks import error_line
from processes import run_torchkit_in_process
from torch import nn

from torchkit.core.models.image_size import smallest_side

SMALLEST = "(the smallest it takes is 16: use --image-size 16 or larger)"
MODEL = ["--model", "nets:DeepNet"]
UNTRAINED = [*MODEL, "--allow-untrained", "--device", "cpu", "--workers", "0"]
COMMANDS = {
    "train": ["train", "--data", "{data}", *MODEL, "--device", "cpu", "--workers", "0",
              "--epochs", "1", "--val-split", "0.5", "--out", "{out}"],
    "eval": ["eval", "--data", "{data}", *UNTRAINED],
    "predict": ["predict", "{data}", *UNTRAINED],
    "extract-features": ["extract-features", "{data}", "{out}", *UNTRAINED],
    "export": ["export", "nets:DeepNet", "{out}.pt2"],
    "summary": ["summary", "nets:DeepNet"],
    "benchmark": ["benchmark", "nets:DeepNet", "--device", "cpu"],
    # Reverting a pickled SyncBatchNorm model runs it to learn each layer's input dimensions.
    "convert-syncbn": ["convert-syncbn", "{data}/../sync.pt", "{out}.pt", "--revert",
                       "--trust-checkpoint"],
}  # fmt: skip


def test_the_smallest_side_is_found_on_the_meta_device():
    model = DeepNet().eval()
    with torch.no_grad():
        model(torch.zeros(1, 3, 16, 16))
        with pytest.raises(RuntimeError, match="Output size is too small"):
            model(torch.zeros(1, 3, 15, 15))
    assert smallest_side(model, 3, 8) == 16
    assert smallest_side(model, 3, 16) is None  # it runs there: not an image-size failure
    assert smallest_side(model, 1, 8) is None  # it runs at no size: another reason


@pytest.mark.parametrize("command", COMMANDS)
def test_a_model_too_deep_for_the_image_size_is_one_line_naming_the_smallest(
    command, make_image_folder, tmp_path
):
    data = make_image_folder(tmp_path / "data", {"a": 2, "b": 2, "c": 2})
    out = tmp_path / "out"
    if command == "convert-syncbn":
        torch.save(nn.SyncBatchNorm.convert_sync_batchnorm(DeepNet()), tmp_path / "sync.pt")
    words = [word.format(data=data, out=out) for word in COMMANDS[command]]
    result = run_torchkit_in_process(*words, "--image-size", "8")
    assert result.returncode == 2, result.stderr
    line = error_line(result.stderr)
    doing = "train on" if command == "train" else "run on"
    assert f"cannot {doing} 8x8 images: " in line and "Output size is too small" in line
    assert line.endswith(SMALLEST)
    assert not [path for path in tmp_path.iterdir() if path.name.startswith("out")]


@pytest.mark.parametrize("command", ["summary", "benchmark", "convert-syncbn"])
def test_an_input_size_given_with_i_is_hinted_as_i(command, make_image_folder, tmp_path):
    """summary, benchmark and convert-syncbn take -i C,H,W beside --image-size: the hint to
    use --image-size 16, added to `-i 3,8,8`, was refused as a second input size."""
    data = make_image_folder(tmp_path / "data", {"a": 2})
    out = tmp_path / "out"
    if command == "convert-syncbn":
        torch.save(nn.SyncBatchNorm.convert_sync_batchnorm(DeepNet()), tmp_path / "sync.pt")
    words = [word.format(data=data, out=out) for word in COMMANDS[command]]
    if command == "benchmark":
        words += ["--iters", "1", "--warmup", "0"]
    result = run_torchkit_in_process(*words, "-i", "3,8,8")
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr).endswith(
        "(the smallest it takes is 16: use -i 3,16,16 or larger)"
    )
    followed = run_torchkit_in_process(*words, "-i", "3,16,16")
    assert followed.returncode == 0, followed.stderr


def test_an_input_size_without_a_batch_dim_is_hinted_with_its_batch():
    """summary --no-batch-dim takes -i B,C,H,W: the hint `-i 3,16,16` was refused there as an
    input without its batch."""
    words = [*COMMANDS["summary"], "--no-batch-dim"]
    result = run_torchkit_in_process(*words, "-i", "2,3,8,8")
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr).endswith(
        "(the smallest it takes is 16: use -i 2,3,16,16 or larger)"
    )
    followed = run_torchkit_in_process(*words, "-i", "2,3,16,16")
    assert followed.returncode == 0, followed.stderr
