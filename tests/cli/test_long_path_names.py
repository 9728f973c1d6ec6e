"""A path with a name longer than a file system holds (ENAMETOOLONG), given as any command's
input, model or output: one error line naming the path, wherever it is first looked at, never
Python's `OSError: [Errno 36] ...` with a hint to look at a traceback."""

from __future__ import annotations

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process

LONG = "n" * 300  # past the 255 bytes a name of every common file system holds

# Each place a path goes, in the command that reads or writes it (relative to the test's folder).
LONG_PATHS = {
    "env -o": ["env", "-o", LONG],
    "summary MODEL": ["summary", LONG],
    "train --data": ["train", "--data", LONG, "--out", "run"],
    "train --model": ["train", "--data", "images", "--model", LONG, "--out", "run"],
    "eval --weights": ["eval", "convnet", "--weights", LONG, "--data", "images"],
    "dataset-stats ROOT": ["dataset-stats", LONG],
    "split OUT": ["split", "images", f"{LONG}/out"],
    "convert tensor SRC": ["convert", "tensor", LONG, "out.npy"],
}


@pytest.mark.parametrize("args", LONG_PATHS.values(), ids=LONG_PATHS)
def test_a_name_too_long_is_one_error_line_naming_it(args, image_folder, tmp_path):
    before = sorted(tmp_path.rglob("*"))
    result = run_torchkit_in_process(*args, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert f"file name too long: {LONG}" in line, line
    assert "OSError" not in line and "Errno" not in line and "TORCHKIT_DEBUG" not in line, line
    assert sorted(tmp_path.rglob("*")) == before
