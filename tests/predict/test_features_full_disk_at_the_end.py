"""extract-features on a disk that fills once every row is written (its index, or the
--array-format copy of an array: a second array's worth of room at the end of a long run).
The error said "free some space, check the permissions, or choose another output", where
another output redoes every row; the rows are kept, so it now also says that --resume finishes
them, which it does once there is room."""

from __future__ import annotations

import os

import pytest
import torch
from disks import fill_disk
from image_folders import write_image_folder
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


@pytest.mark.parametrize("array_format", ["safetensors", "pt"])
def test_a_full_disk_after_the_rows_keeps_them_and_resume_finishes(
    world, small_tmpfs, tmp_path, array_format
):
    disk = small_tmpfs(256)
    out = disk / "out"
    arguments = [*FEATURES[:-1], array_format]
    name = f"features.0.{array_format}"
    fill_disk(disk, leave=48 * 1024)  # room for the rows, not for their copy
    full = run_torchkit_in_process(*arguments, str(out), cwd=world)
    assert full.returncode == 1, full.stderr
    line = error_line(full.stderr)
    assert line.startswith(f"Error: cannot write {out / name}: No space")
    assert (
        f"Note: the rows done so far are kept in {out}; add --resume to continue once it can "
        "be written"
    ) in full.stderr
    assert sorted(os.listdir(out)) == [".partial", ".torchkit"]

    os.remove(disk / "filler")
    resumed = run_torchkit_in_process(*arguments, str(out), "--resume", cwd=world)
    assert resumed.returncode == 0, resumed.stderr
    direct = tmp_path / "direct"
    assert run_torchkit_in_process(*arguments, str(direct), cwd=world).returncode == 0
    for written in (name, "index.csv"):
        assert (out / written).read_bytes() == (direct / written).read_bytes(), written
    if array_format == "pt":
        assert torch.load(out / name, weights_only=True).shape == (6, 32, 6, 6)
    else:
        assert load_file(out / name)["features.0"].shape == (6, 32, 6, 6)
    assert not (out / ".partial").exists()


def test_a_full_disk_before_any_row_is_kept_says_nothing_of_resume(world, small_tmpfs):
    disk = small_tmpfs(256)
    out = disk / "out"
    fill_disk(disk)
    full = run_torchkit_in_process(*FEATURES, str(out), cwd=world)
    assert full.returncode == 1, full.stderr
    assert "No space left" in error_line(full.stderr) and "--resume" not in full.stderr
    assert sorted(os.listdir(disk)) == ["filler"]


def _interrupted_run(world, out) -> bytes:
    """OUT left by a run of another layer that --strict stopped at its last image (its first
    rows kept, for --resume); the bytes of its progress record."""
    images = write_image_folder(out.parent / "imgs", {"a": 3, "b": 2}, size=8)
    (images / "b" / "b_1.png").write_bytes(b"broken")
    stopped = run_torchkit_in_process(
        "extract-features", "run/best.pt", str(images), str(out), "--workers", "0", "-b", "2",
        "-l", "features.3", "--strict", cwd=world,
    )  # fmt: skip
    assert stopped.returncode == 1 and "b_1.png" in error_line(stopped.stderr), stopped.stderr
    return (out / ".partial" / "progress.json").read_bytes()


def test_a_force_run_on_a_full_disk_says_nothing_of_the_old_rows_it_put_back(world, small_tmpfs):
    """--force over an interrupted OUT, on a disk too full for its first rows: the old OUT is
    put back, its rows another command line's. The note said they were this run's and that
    --resume continues them: --resume with this command line refused them (exit 2)."""
    disk = small_tmpfs(256)
    out = disk / "out"
    record = _interrupted_run(world, out)
    fill_disk(disk)
    forced = run_torchkit_in_process(*FEATURES, str(out), "--force", cwd=world)
    assert forced.returncode == 1, forced.stderr
    assert "No space left" in error_line(forced.stderr) and "--resume" not in forced.stderr
    assert (out / ".partial" / "progress.json").read_bytes() == record  # the old OUT, as it was


def test_a_force_run_whose_rows_are_kept_says_resume_finishes_them(world, small_tmpfs):
    """--force over an interrupted OUT, on a disk with room for the rows and not for their
    safetensors copy: the rows are this run's, and --resume finishes them."""
    disk = small_tmpfs(256)
    out = disk / "out"
    _interrupted_run(world, out)
    fill_disk(disk, leave=52 * 1024)
    forced = run_torchkit_in_process(*FEATURES, str(out), "--force", cwd=world)
    assert forced.returncode == 1, forced.stderr
    line = error_line(forced.stderr)  # the rows written, not their copy
    assert line.startswith(f"Error: cannot write {out / 'features.0.safetensors'}: No space"), line
    assert f"the rows done so far are kept in {out}; add --resume" in forced.stderr
    os.remove(disk / "filler")
    resumed = run_torchkit_in_process(*FEATURES, str(out), "--resume", cwd=world)
    assert resumed.returncode == 0, resumed.stderr
    assert load_file(out / "features.0.safetensors")["features.0"].shape == (6, 32, 6, 6)
