"""A symbolic link out of the archive (`-> /etc/hostname`, which tar -x unpacks pointing at
the host's file) followed two rules: a folder's `.tar` left such an image out with a warning,
while a shard kept it as an unreadable image. One rule now: never followed, listed and counted
as an unreadable image whose reason says why (as a link to nothing is on disk), fatal with
--strict."""

from __future__ import annotations

import json

import pytest
from output_checks import error_line
from parquet_files import png
from processes import run_torchkit_in_process
from tar_members import tar_of_members

OUT = "a symbolic link out of the archive, never followed"


def _folder_tar(tmp_path):
    members = [
        ("cat/a.png", png(0)),
        ("cat/b.png", png(1)),
        ("dog/c.png", png(2)),
        ("dog/d.png", png(3)),
        ("dog/x.png", "->/etc/hostname"),
    ]
    # the report's path column is the path inside the folder, as the unpacked folder's
    return tar_of_members(tmp_path / "pets.tar", members), "dog/x.png", "pets.tar/dog/x.png"


def _shard(tmp_path):
    members = [
        ("a.png", png(0)), ("a.cls", b"0"),
        ("c.png", png(2)), ("c.cls", b"1"),
        ("x.png", "->/etc/hostname"), ("x.cls", b"1"),
    ]  # fmt: skip
    shown = "s-000000.tar/x.png"
    return tar_of_members(tmp_path / "s-000000.tar", members), shown, shown


@pytest.mark.parametrize("archive", [_folder_tar, _shard])
def test_a_link_out_of_the_archive_is_an_unreadable_image(tmp_path, archive):
    path, listed, shown = archive(tmp_path)
    report = run_torchkit_in_process("dataset-stats", path, "--format", "json", "-j", "0")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["unreadable"] == [{"path": listed, "error": OUT}]
    assert "links out of the archive, not read" not in report.stderr
    strict = run_torchkit_in_process("dataset-stats", path, "-j", "0", "--strict")
    assert strict.returncode == 1
    assert f"{shown}: {OUT}" in error_line(strict.stderr)
