"""A torchkit checkpoint of a format newer than this torchkit knows (its keys may mean other
things) loaded silently: it is one error line. One whose `classes` name a class twice (as
torchvision's ImageNet names do) still loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from tests.helpers.checkpoints import read_checkpoint, write_convnet_checkpoint
from torchkit.cli import app
from torchkit.core.io.errors import CheckpointError
from torchkit.core.models.checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint


def _checkpoint(tmp_path: Path, name: str, **changes) -> Path:
    path = tmp_path / name
    write_convnet_checkpoint(path, in_channels=3, image_size=8, classes="ab")
    save_checkpoint({**read_checkpoint(path), **changes}, path)
    return path


def _images(root: Path) -> Path:
    for index, name in enumerate("ab"):
        (root / name).mkdir(parents=True)
        Image.new("RGB", (8, 8), (index * 100, 0, 0)).save(root / name / f"{index}.png")
    return root


def test_a_checkpoint_naming_a_class_twice_still_predicts(runner, tmp_path):
    # torchvision's ImageNet names hold two `crane`s: such a checkpoint is no damaged file.
    model = _checkpoint(tmp_path, "dup.pt", classes=["a", "a"])
    images = _images(tmp_path / "imgs")
    result = runner.invoke(app, ["predict", str(model), str(images), "-j", "0", "--format", "csv"])
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 3  # the header and the two images


def test_a_checkpoint_of_a_newer_format_asks_for_a_newer_torchkit(runner, tmp_path):
    model = _checkpoint(tmp_path, "new.pt", format_version=999, torchkit_version="9.0.0")
    images = _images(tmp_path / "imgs")
    result = runner.invoke(app, ["predict", str(model), str(images), "-j", "0"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"Error: checkpoint {model} was written by torchkit 9.0.0 (checkpoint format 999); "
        f"this torchkit ("
    )
    assert lines[0].endswith(f"reads formats up to {FORMAT_VERSION} (upgrade torchkit to read it)")
    summary = runner.invoke(app, ["summary", str(model)])
    assert summary.exit_code == 1 and "upgrade torchkit" in summary.stderr


def test_format_versions_that_load_and_those_that_do_not(tmp_path):
    current = _checkpoint(tmp_path, "current.pt", format_version=FORMAT_VERSION)
    assert load_checkpoint(current)["classes"] == ["a", "b"]
    with pytest.raises(CheckpointError, match=r"was written by a newer torchkit \(checkpoint"):
        load_checkpoint(_checkpoint(tmp_path, "next.pt", format_version=FORMAT_VERSION + 1))
    with pytest.raises(CheckpointError, match="format_version '2', which no torchkit writes"):
        load_checkpoint(_checkpoint(tmp_path, "text.pt", format_version="2"))
