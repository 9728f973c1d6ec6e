"""A train stopped by a signal whose summary cannot be written (stdout on a full disk, or on the
terminal whose closing sent the SIGHUP: EIO) ends with the signal's code, as every stopped
command does, and its one `Error:` line says the run is kept."""

from __future__ import annotations

import os

import pytest
from image_folders import write_image_folder
from processes import run_torchkit_process
from suite_paths import HELPERS


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_stopped_run_whose_summary_cannot_be_written_ends_with_the_stops_code(tmp_path):
    """Before: exit 1, the write error's, though Ctrl-C stopped the run (a stopped eval or
    predict whose output fails ends with 130)."""
    data = write_image_folder(tmp_path / "data", {"a": 8, "b": 8})
    out = tmp_path / "run"
    with open("/dev/full", "w") as full:
        done = run_torchkit_process(
            "train", "--data", str(data), "--model", "nets:NoisyNet", "--image-size", "8",
            "--epochs", "2", "--batch-size", "4", "-j", "0", "--device", "cpu",
            "--out", str(out),
            env={"PYTHONPATH": str(HELPERS), "TORCHKIT_TEST_SIGINT_AT": "3"},  # epoch 1's 3rd
            stdout=full.fileno(),
        )  # fmt: skip
    assert done.returncode == 130, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: cannot write to standard output: No space left")
    assert f"the run is kept in {out} (last.pt saved" in lines[-1]
    assert "Traceback" not in done.stderr and (out / "last.pt").is_file()
