"""extract-features on a disk that fills once every row is written (its index, or the
--array-format copy of an array: a second array's worth of room at the end of a long run).
The error said "free some space, check the permissions, or choose another output", where
another output redoes every row; the rows are kept, so it now also says that --resume finishes
them, which it does once there is room."""

from __future__ import annotations

import os

import pytest
from disks import fill_disk
from output_checks import error_line
from processes import run_torchkit_in_process
from safetensors.numpy import load_file
from safety_world import write_world

# 6 images of 8 px, each a 32x6x6 map of the first convolution: 7 pages of rows.
FEATURES = ["extract-features", "run/best.pt", "ds", "--workers", "0", "-l", "features.0",
            "--pool", "none", "--array-format", "safetensors"]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return write_world(tmp_path_factory.mktemp("features-full-disk"))


def test_a_full_disk_after_the_rows_keeps_them_and_resume_finishes(world, small_tmpfs, tmp_path):
    disk = small_tmpfs(256)
    out = disk / "out"
    fill_disk(disk, leave=48 * 1024)  # room for the rows, not for their copy
    full = run_torchkit_in_process(*FEATURES, str(out), cwd=world)
    assert full.returncode == 1, full.stderr
    line = error_line(full.stderr)
    assert line.startswith(f"Error: cannot write {out / 'features.0.safetensors'}: No space")
    assert (
        f"Note: the rows done so far are kept in {out}; add --resume to continue once it can "
        "be written"
    ) in full.stderr
    assert sorted(os.listdir(out)) == [".partial", ".torchkit"]

    os.remove(disk / "filler")
    resumed = run_torchkit_in_process(*FEATURES, str(out), "--resume", cwd=world)
    assert resumed.returncode == 0, resumed.stderr
    direct = tmp_path / "direct"
    assert run_torchkit_in_process(*FEATURES, str(direct), cwd=world).returncode == 0
    for name in ("features.0.safetensors", "index.csv"):
        assert (out / name).read_bytes() == (direct / name).read_bytes(), name
    assert load_file(out / "features.0.safetensors")["features.0"].shape == (6, 32, 6, 6)
    assert not (out / ".partial").exists()


def test_a_full_disk_before_any_row_is_kept_says_nothing_of_resume(world, small_tmpfs):
    disk = small_tmpfs(256)
    out = disk / "out"
    fill_disk(disk)
    full = run_torchkit_in_process(*FEATURES, str(out), cwd=world)
    assert full.returncode == 1, full.stderr
    assert "No space left" in error_line(full.stderr) and "--resume" not in full.stderr
    assert sorted(os.listdir(disk)) == ["filler"]
