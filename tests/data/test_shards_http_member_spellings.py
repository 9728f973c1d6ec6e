"""A `convert shards` folder whose shard was packed again with its members spelled as tar
unpacks them elsewhere (`./sample_00000000.png`, `tar -cf shard.tar .`; `/sample_...`): read on
disk, its images are read as tar -x unpacks them; read from a URL, the streamed reader looked
the manifest's member names up as stored and failed with "holds no sample_00000000.png". Both
readers follow one rule (`_unpacked_path`)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest
from image_folders import write_image_folder
from processes import run_torchkit_in_process
from shards import serving


def _respell_members(shard, prefix: str) -> None:
    with tarfile.open(shard) as source:
        members = [(m, source.extractfile(m).read()) for m in source.getmembers() if m.isfile()]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as target:
        for member, data in members:
            member.name = prefix + member.name
            target.addfile(member, io.BytesIO(data))
    shard.write_bytes(buffer.getvalue())


@pytest.mark.parametrize("prefix", ["./", "/"])
def test_streamed_shards_read_members_by_the_path_tar_unpacks_them_to(
    tmp_path, monkeypatch, prefix
):
    images = write_image_folder(tmp_path / "images", {"a": 2, "b": 2})
    folder = tmp_path / "served" / "set"
    converted = run_torchkit_in_process("convert", "shards", images, folder, "--workers", "0")
    assert converted.returncode == 0, converted.stderr
    shard = folder / "shard-000000.tar"
    _respell_members(shard, prefix)
    manifest = json.loads((folder / "manifest.json").read_text())
    data = shard.read_bytes()
    manifest["shards"][0]["bytes"] = len(data)
    manifest["shards"][0]["sha256"] = hashlib.sha256(data).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    local = run_torchkit_in_process("dataset-stats", folder, "--workers", "0")
    assert local.returncode == 0, local.stderr
    with serving(tmp_path / "served", tmp_path / "cache", monkeypatch) as server:
        streamed = run_torchkit_in_process("dataset-stats", f"{server.url}/set", "--workers", "0")
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == local.stdout.replace(str(folder), f"{server.url}/set")
