"""Torchkit checkpoints that loaded silently wrong: one whose `classes` name a class twice (two
outputs under one name: predictions and per-class metrics ambiguous), and one of a format newer
than this torchkit knows (its keys may mean other things). Each is one error line."""

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


@pytest.mark.parametrize("command", ["predict", "eval"])
def test_a_checkpoint_naming_a_class_twice_is_one_error_line(runner, tmp_path, command):
    model = _checkpoint(tmp_path, "dup.pt", classes=["a", "a"])
    images = _images(tmp_path / "imgs")
    if command == "predict":
        args = ["predict", str(model), str(images), "-j", "0", "--format", "csv"]
    else:
        args = ["eval", str(model), "--data", str(images), "-j", "0"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.strip() == (
        f"Error: checkpoint {model} names 1 of its classes more than once ('a'): its outputs "
        "cannot be told apart (the file is damaged or was not written by torchkit)"
    )


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
