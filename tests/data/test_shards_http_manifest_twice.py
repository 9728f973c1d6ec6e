"""A folder URL whose manifest.json lists one shard twice (two manifests joined by hand): its
samples were streamed twice, dataset-stats counting 8 images of the 4 the shard holds, where a
list of shard URLs naming one twice is an error. It is one error line naming the shard."""

from __future__ import annotations

import json

from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process
from shards import serving


def test_a_manifest_listing_a_shard_twice_is_one_error_line(tmp_path, monkeypatch):
    images = write_image_folder(tmp_path / "images", {"a": 2, "b": 2})
    folder = tmp_path / "served" / "set"
    converted = run_torchkit_in_process("convert", "shards", images, folder, "--workers", "0")
    assert converted.returncode == 0, converted.stderr
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["shards"].append(manifest["shards"][0])
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with serving(tmp_path / "served", tmp_path / "cache", monkeypatch) as server:
        result = run_torchkit_in_process("dataset-stats", f"{server.url}/set", "--workers", "0")
    assert result.returncode == 1, result.stdout
    line = error_line(result.stderr)
    assert f"{server.url}/set/manifest.json lists the shard shard-000000.tar twice" in line, line
