"""A .tar of an image folder holding a member with a `..` part (`dog/../cat/e.png`), which
GNU tar -x does not unpack (it exits 2): `convert shards` warned, wrote the other images and
exited 0, so `convert shards in.tar out && rm in.tar` lost the image. It exits 1 once the rest
is written, naming the member (report and manifest.json: `members_not_unpacked`), and
`--strict` stops before writing anything."""

from __future__ import annotations

import json
import subprocess

import pytest
from output_checks import error_line
from parquet_files import png
from processes import run_torchkit_in_process
from tar_members import has_gnu_tar, tar_of_members

MEMBERS = [
    ("cat/a.png", png(0)),
    ("cat/b.png", png(1)),
    ("dog/c.png", png(2)),
    ("dog/d.png", png(3)),
    ("dog/../cat/e.png", png(4)),
]


def test_a_member_tar_does_not_unpack_fails_the_run_once_the_rest_is_written(tmp_path):
    archive = tar_of_members(tmp_path / "in.tar", MEMBERS)
    if has_gnu_tar():  # the reference: GNU tar leaves it out and exits 2
        (tmp_path / "x").mkdir()
        unpacked = subprocess.run(["tar", "-xf", archive, "-C", tmp_path / "x"], check=False)
        assert unpacked.returncode == 2
        assert not (tmp_path / "x" / "cat" / "e.png").exists()
    out = tmp_path / "out"
    result = run_torchkit_in_process(
        "convert", "shards", archive, out, "--workers", "0", "--format", "json"
    )
    assert result.returncode == 1, result.stdout
    line = error_line(result.stderr)
    assert f"1 member of {archive} with '..' in the path" in line, line
    assert "dog/../cat/e.png" in line, line
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["samples"] == 4
    assert manifest["members_not_unpacked"] == ["dog/../cat/e.png"]
    assert json.loads(result.stdout)["members_not_unpacked"] == ["dog/../cat/e.png"]


@pytest.mark.parametrize("extra", [[], ["--strict"]])
def test_strict_stops_before_writing_and_a_plain_tar_still_exits_0(tmp_path, extra):
    members = MEMBERS if extra else MEMBERS[:4]
    archive = tar_of_members(tmp_path / "in.tar", members)
    out = tmp_path / "out"
    result = run_torchkit_in_process("convert", "shards", archive, out, "--workers", "0", *extra)
    if extra:
        assert result.returncode == 1, result.stdout
        assert "dog/../cat/e.png has '..' in its path" in error_line(result.stderr)
        assert not out.exists()
    else:
        assert result.returncode == 0, result.stderr
