"""The hints of convert's refusals, each one flat line with no brackets of its own: what shapes
and pixel values an array may hold, what a sparse tensor, a mixed set of checkpoints, a
SyncBatchNorm of unknown dimensionality and a batch written as one image need instead."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.convert.averaging import average_checkpoints
from torchkit.core.convert.checkpoint import _check_writable
from torchkit.core.convert.pixels import from_array
from torchkit.core.convert.syncbn import _neighbour_dims
from torchkit.core.io.errors import CheckpointError, InputError, UsageError


@pytest.mark.parametrize(
    ("array", "hint"),
    [
        (np.zeros(5), "expected HxW, CxHxW or HxWxC, or a batch NxCxHxW or NxHxWxC"),
        (
            np.array([[0, 70_000]], np.int32),
            "integer images must lie in 0..255, or 0..65535 for 16 bits",
        ),
        (
            np.zeros((5, 8, 8), np.uint8),
            "a batch of grayscale images needs a channel axis: Nx1xHxW",
        ),
    ],
)
def test_an_array_that_is_no_image_says_what_an_image_is(array, hint):
    with pytest.raises(InputError) as caught:
        from_array(array, name="x.npy")
    assert caught.value.hint == hint


def test_a_sparse_tensor_in_a_checkpoint_is_to_be_made_dense():
    with pytest.raises(CheckpointError) as caught:
        _check_writable("w", torch.rand(2).to_sparse())
    assert caught.value.hint == "save it with `.dequantize()` or `.to_dense()` first"


def test_checkpoints_of_two_models_are_not_averaged(tmp_path):
    torch.save({"a": torch.zeros(2)}, tmp_path / "a.pt")
    torch.save({"b": torch.zeros(2)}, tmp_path / "b.pt")
    with pytest.raises(CheckpointError) as caught:
        average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])
    assert caught.value.hint == "average checkpoints of one training run, or of one architecture"


def test_a_sync_batchnorm_with_no_neighbour_of_known_dimensionality_asks_for_an_input_size():
    model = torch.nn.Sequential(torch.nn.SyncBatchNorm(3))
    with pytest.raises(UsageError) as caught:
        _neighbour_dims(model, [("0", model[0])])
    assert (
        caught.value.hint
        == "give an example input size with --input-size so a forward pass shows it"
    )


def test_a_batch_written_to_one_image_names_a_folder_or_grid(tmp_path):
    np.save(tmp_path / "batch.npy", np.zeros((2, 3, 4, 4), np.uint8))
    result = run_torchkit_in_process(
        "convert", "tensor", tmp_path / "batch.npy", tmp_path / "x.png"
    )
    assert result.returncode == 2
    assert error_line(result.stderr).endswith(
        "(for one file per image give a folder as DST, with --to; or pass --grid)"
    )
    assert not (tmp_path / "x.png").exists()
