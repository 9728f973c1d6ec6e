"""Folders in the data that cannot be listed (permission denied; `deny_listing`, as the suite
runs as root): each reader warns of them once, and the commands whose job is to write every
file out exit 1 once the rest is written (as `cp -r`), so `cmd src dst && rm -r src` never
deletes what was not done."""

from __future__ import annotations

from pathlib import Path

import pytest
from disks import deny_listing
from image_folders import write_image_folder
from output_checks import error_line

from torchkit.cli import app


@pytest.mark.parametrize("command", ["split", "dataset-stats"])
def test_class_folders_that_cannot_be_listed_are_warned_of_once(
    tmp_path: Path, monkeypatch, runner, command: str
):
    """Every class folder unlisted: the warning came twice before 'no images' (the folder was
    read as class folders, then again for its error)."""
    data = write_image_folder(tmp_path / "data", {"a": 1, "b": 1})
    deny_listing(monkeypatch, data / "a", data / "b")
    args = [command, str(data)] + ([str(tmp_path / "out")] if command == "split" else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert result.stderr.count("cannot be listed") == 1, result.stderr
    assert error_line(result.stderr).startswith(f"Error: no images in {data}")
