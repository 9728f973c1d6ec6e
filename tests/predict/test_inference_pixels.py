"""eval, predict, extract-features and training's validation take 8-bit crops from their loader
and normalise whole batches where the model runs (issue #30): a quarter of float32's bytes to
share between processes, pin and copy to the GPU. The values are the float transform's, bit for
bit (data/test_decode.py); here each command is shown to take that path."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.data.batches import collate_skipping_unreadable
from torchkit.core.data.dataset import make_dataset
from torchkit.core.data.decode import NormalizedPixels
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.transforms import eval_transform
from torchkit.core.models import build_model
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint
from torchkit.core.train.loaders import eval_dataset
from torchkit.core.train.loop import UnreadableImages, evaluate

SIZE = 8
CLASSES = ["a", "b"]
COUNTS = {"a": 3, "b": 2}


@pytest.fixture
def world(tmp_path, make_image_folder):
    torch.manual_seed(0)
    preprocess = Preprocess(image_size=SIZE, resize_size=SIZE)
    model = build_model("convnet", len(CLASSES), image_size=SIZE)
    checkpoint = tmp_path / "model.pt"
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": len(CLASSES),
            "classes": CLASSES,
            "model": model.state_dict(),
            "preprocess": preprocess.to_dict(),
        },
        checkpoint,
    )
    data = make_image_folder(tmp_path / "images", COUNTS, size=12)
    return {"checkpoint": checkpoint, "data": data, "tmp": tmp_path}


@pytest.fixture
def normalised(monkeypatch) -> list[tuple[torch.dtype, int]]:
    """(dtype, count) of every batch NormalizedPixels turns into the model's input."""
    calls: list[tuple[torch.dtype, int]] = []
    original = NormalizedPixels.__call__

    def spy(self, pixels, memory_format=None):
        calls.append((pixels.dtype, len(pixels)))
        return original(self, pixels, memory_format)

    monkeypatch.setattr(NormalizedPixels, "__call__", spy)
    return calls


@pytest.mark.parametrize("command", ["eval", "predict", "extract-features"])
def test_inference_commands_normalise_8_bit_batches_on_the_device(world, normalised, command):
    args = [command, str(world["checkpoint"]), str(world["data"]), "--device", "cpu", "-j", "0"]
    if command == "eval":
        args = ["eval", str(world["checkpoint"]), "--data", str(world["data"]), *args[3:]]
        args += ["--out", str(world["tmp"] / "reports"), "--format", "json"]
    elif command == "predict":
        args += ["--format", "json"]
    else:
        args += ["--out", str(world["tmp"] / "features")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert normalised and {dtype for dtype, _ in normalised} == {torch.uint8}
    assert sum(count for _, count in normalised) == sum(COUNTS.values())
    if command == "eval":
        assert json.loads(result.stdout)["num_images"] == sum(COUNTS.values())


def test_training_validates_on_8_bit_batches(world):
    # The run's validation and test loaders over image files give 8-bit crops, which
    # train.loop.evaluate normalises on the device as the training steps do.
    samples = Samples(
        CLASSES, [0, 0, 1], paths=[str(p) for p in sorted(world["data"].rglob("*.png"))[:3]]
    )
    preprocess = Preprocess(image_size=SIZE, resize_size=SIZE)
    dataset = eval_dataset(samples, preprocess)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=2, collate_fn=collate_skipping_unreadable
    )
    assert {batch.images.dtype for batch in loader} == {torch.uint8}
    model = build_model("convnet", len(CLASSES), image_size=SIZE).eval()
    normalized = NormalizedPixels(preprocess.mean, preprocess.std)
    ours = evaluate(
        model,
        loader,
        torch.device("cpu"),
        topk=1,
        unreadable=UnreadableImages(False),
        normalized_pixels=normalized,
    )
    floats = make_dataset(samples, eval_transform(preprocess))
    images = torch.stack([floats[i][0] for i in range(3)])
    with torch.inference_mode():
        outputs = model(images)
    labels = torch.tensor(samples.labels)
    assert ours.loss_sum == pytest.approx(
        F.cross_entropy(outputs, labels, reduction="sum").item(), rel=1e-6
    )
    assert ours.top1 == (outputs.argmax(1) == labels).sum().item() and ours.count == 3
