"""A run that could read none of its images names the first as every other warning and error
about an image does (docs/conventions.md): by the path it is reached by from the working folder,
the data folder as given and then the file's place in it, a path the user can open or remove."""

from __future__ import annotations

import re

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line

from torchkit.cli import app


def commands(checkpoint: str) -> dict[str, list[str]]:
    return {
        "dataset-stats": ["dataset-stats", "photos", "-j", "0"],
        "predict": ["predict", checkpoint, "photos", "--device", "cpu", "-j", "0", "-q"],
        "eval": ["eval", checkpoint, "--data", "photos", "--device", "cpu", "-j", "0"],
        "convert shards": ["convert", "shards", "photos", "shards"],
        "extract-features": ["extract-features", checkpoint, "photos", "out", "-j", "0"],
    }


@pytest.mark.parametrize("command", list(commands("")))
def test_the_first_unreadable_image_is_named_from_the_working_folder(
    runner, tmp_path, monkeypatch, command
):
    """Before: dataset-stats and convert shards named it by its place in the data, `a/a_0.png`,
    which from the working folder is no file at all (their warnings and --strict named it
    right)."""
    monkeypatch.chdir(tmp_path)
    root = write_image_folder(tmp_path / "photos", {"a": 2, "b": 1})
    for path in root.rglob("*.png"):
        path.write_bytes(b"not a png")
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="ab")
    result = runner.invoke(app, commands("m.pt")[command])
    assert result.exit_code == 1, result.stderr
    line = error_line(result.stderr)
    assert line.startswith("Error: none of the 3 "), line
    named = re.search(r"\(the first, (.+): not an image PIL can read\)$", line)
    assert named is not None, line
    # the first read: convert shards reads in its shuffled order
    assert named[1] == "photos/a/a_0.png" or command == "convert shards", line
    assert named[1].startswith("photos/") and (tmp_path / named[1]).is_file(), line
