"""A PyTorch file named `.onnx` (a checkpoint saved under the wrong name) is read as what it
holds: it went to onnxruntime ('DecodeError: Error parsing message'), and summary called it an
ONNX model it cannot take."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from checkpoints import read_checkpoint, write_convnet_checkpoint
from image_folders import write_image_folder
from processes import run_torchkit_in_process

from torchkit.core.models.exported.formats import ONNX, sniff_format


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy-pickle"])
def test_a_checkpoint_named_onnx_predicts_as_it_does_named_pt(tmp_path, legacy):
    images = write_image_folder(tmp_path / "images", {"a": 2, "b": 1}, size=12)
    checkpoint = tmp_path / "model.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=12, classes="ab")
    misnamed = tmp_path / "model.onnx"
    if legacy:
        torch.save(read_checkpoint(checkpoint), misnamed, _use_new_zipfile_serialization=False)
        assert misnamed.read_bytes()[:1] == b"\x80"
    else:
        shutil.copyfile(checkpoint, misnamed)
    assert sniff_format(misnamed) is None  # not ONNX: a checkpoint
    rows = {}
    for model in (checkpoint, misnamed):
        result = run_torchkit_in_process("predict", model, images, "--format", "json")
        assert result.returncode == 0, result.stderr
        rows[model.name] = json.loads(result.stdout)
    assert rows["model.onnx"] == rows["model.pt"] and len(rows["model.pt"]) == 3
    summary = run_torchkit_in_process("summary", misnamed, "--format", "json")
    assert summary.returncode == 0, summary.stderr


def test_an_onnx_model_is_still_read_as_onnx(tmp_path):
    """The ONNX format's first byte is a field tag (0x08, ir_version): neither a zip archive's
    `PK` nor a pickle's 0x80."""
    path = tmp_path / "m.onnx"
    path.write_bytes(b"\x08\x07\x12\x07pytorch")
    assert sniff_format(path) == ONNX
