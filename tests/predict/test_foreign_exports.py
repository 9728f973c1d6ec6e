"""eval and predict of an ONNX file torch wrote without torchkit (no torchkit record): its
images are sized and batched as its graph takes them, and a warning says which preprocessing is
assumed. (torch.export files are read the same way; exporting one takes ~5 s, too slow here.)"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
import torchvision.transforms.functional as F
from PIL import Image
from torch import nn

from torchkit.cli import app

SIZE = 20  # the graph's H and W: the default 224 would fail on the first batch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).relu().mean((2, 3)))


def images(root: Path) -> Path:
    """Images of several sizes, none SIZE x SIZE: resizing and cropping matter."""
    rng = np.random.default_rng(0)
    for index, name in enumerate(["a", "b", "c"] * 3):
        (root / name).mkdir(parents=True, exist_ok=True)
        height, width = 17 + 5 * index, 31 - 2 * index
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / name / f"{index}.png")
    return root


def by_hand(session: onnxruntime.InferenceSession, path: Path) -> np.ndarray:
    """The reference: resize to SIZE / 0.875, centre-crop SIZE, ImageNet statistics."""
    image = Image.open(path).convert("RGB")
    tensor = F.to_tensor(F.center_crop(F.resize(image, round(SIZE / 0.875)), SIZE))
    tensor = F.normalize(tensor, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    logits = session.run(None, {session.get_inputs()[0].name: tensor[None].numpy()})[0][0]
    return torch.softmax(torch.from_numpy(logits), 0).numpy()


def test_onnx_file_of_a_fixed_batch_of_1_predicts_as_onnxruntime_does(runner, tmp_path):
    """Was: 'onnxruntime fails on an input of shape 9x3x224x224' (the graph's 20x20 and its
    batch of 1 ignored)."""
    model = tmp_path / "plain.onnx"
    torch.onnx.export(Net().eval(), (torch.randn(1, 3, SIZE, SIZE),), str(model), dynamo=False)
    root = images(tmp_path / "imgs")
    args = ["predict", str(model), str(root), "-b", "4", "-j", "0", "--format", "csv"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    warning = "plain.onnx records no preprocessing (torchkit export did not write it)"
    assert warning in result.stderr
    assert f"resized to 23, center crop {SIZE}x{SIZE}, mean 0.485 0.456 0.406" in result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 9
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for row in rows:
        expected = by_hand(session, root / row["path"])
        assert int(row["class_index"]) == int(expected.argmax())
        assert float(row["probability"]) == pytest.approx(float(expected.max()), abs=1e-6)
