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


def test_convert_shards_writes_the_rest_and_fails_naming_the_folder(tmp_path: Path, monkeypatch):
    """A folder of the source that cannot be listed: the rest is written, the folder named in
    the report and manifest.json, and the run exits 1 (it warned and exited 0, so `convert
    shards data out && rm -r data` deleted its images); --strict stops before writing any."""
    import json

    data = write_image_folder(tmp_path / "data", {"a": 2, "b": 1})
    write_image_folder(data / "b", {"sub": 2})  # data/b/sub/: two images of class b
    deny_listing(monkeypatch, data / "b" / "sub")
    out = tmp_path / "out"
    result = runner_invoke(["convert", "shards", str(data), str(out), "--format", "json"])
    assert result.exit_code == 1, result.stderr
    assert error_line(result.stderr) == (
        f"Error: 1 folder in {data} could not be listed: their images are in no shard in {out} "
        f"(listed in {out / 'manifest.json'}) (make them readable and convert again with "
        "--force; --strict stops before writing any)"
    )
    assert result.stderr.count("cannot be listed") == 1
    report = json.loads(result.stdout)
    assert (report["samples"], report["unlisted_folders"]) == (3, ["b/sub"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["unlisted_folders"] == ["b/sub"]
    strict = tmp_path / "strict"
    stopped = runner_invoke(["convert", "shards", str(data), str(strict), "--strict"])
    assert stopped.exit_code == 1
    assert error_line(stopped.stderr).startswith(f"Error: cannot list folder {data / 'b' / 'sub'}")
    assert not strict.exists()


def runner_invoke(args: list[str]):
    from typer.testing import CliRunner

    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("mode", ["copy", "move"])
def test_split_places_the_rest_and_fails_naming_the_folder(tmp_path: Path, monkeypatch, mode):
    """A folder of ROOT that cannot be listed: the rest is split, the folder named in the JSON
    report, and the run exits 1 (it warned and exited 0, so `split data out && rm -r data`
    deleted its images); --strict stops before placing any file."""
    import json

    data = write_image_folder(tmp_path / "data", {"a": 10, "b": 10})
    write_image_folder(data / "b", {"sub": 2})  # data/b/sub/: two images of class b
    deny_listing(monkeypatch, data / "b" / "sub")
    strict = tmp_path / "strict"
    stopped = runner_invoke(["split", str(data), str(strict), "--mode", mode, "--strict"])
    assert stopped.exit_code == 1
    assert error_line(stopped.stderr).startswith(f"Error: cannot list folder {data / 'b' / 'sub'}")
    assert not strict.exists()
    out = tmp_path / "out"
    result = runner_invoke(["split", str(data), str(out), "--mode", mode, "--format", "json"])
    assert result.exit_code == 1, result.stderr
    assert error_line(result.stderr) == (
        f"Error: 1 folder in {data} could not be listed: their files are in no split in {out} "
        "(make them readable and split again; --strict stops before placing any file)"
    )
    assert result.stderr.count("cannot be listed") == 1
    report = json.loads(result.stdout)
    assert (report["files"], report["unlisted_folders"]) == (20, ["b/sub"])
    assert len(list(out.rglob("*.png"))) == 20
    assert len(list((data / "b" / "sub").iterdir())) == 2  # never touched, even by a move
