"""The records split keeps in OUT and beside the data (its journal, a move's record, which
readers look for in every folder above the data, split.csv) are read only where they are
regular files: a FIFO under such a name (anyone may make one in /tmp) hung the command that
opened it, waiting for a writer that never came."""

from __future__ import annotations

from pathlib import Path

from disks import fifo_never_opened
from image_folders import make_class_files as make_files
from output_checks import error_line
from processes import run_torchkit_in_process


def test_a_fifo_named_as_a_moves_record_above_the_data_is_no_record(tmp_path: Path):
    """Before: every command reading data below that folder waited for ever (split's copy,
    which copies bytes, reads it as dataset-stats or train does)."""
    data = make_files(tmp_path / "shared" / "data", {"cat": 2, "dog": 2})
    with fifo_never_opened(tmp_path / "shared" / ".torchkit-split-moving.json", seconds=2):
        result = run_torchkit_in_process("split", data, tmp_path / "out")
    assert result.returncode == 0, result.stderr


def test_a_fifo_named_as_the_journal_in_the_data_is_no_journal(tmp_path: Path):
    data = make_files(tmp_path / "data", {"cat": 2, "dog": 2})
    with fifo_never_opened(data / ".torchkit-split.json", seconds=2):
        result = run_torchkit_in_process("split", data, tmp_path / "out")
    assert result.returncode == 0, result.stderr


def test_a_fifo_named_as_the_journal_in_out_is_refused_naming_it(tmp_path: Path):
    """Before: split waited for ever on OUT/.torchkit-split.json."""
    data = make_files(tmp_path / "data", {"cat": 2, "dog": 2})
    out = tmp_path / "out"
    out.mkdir()
    with fifo_never_opened(out / ".torchkit-split.json", seconds=2):
        result = run_torchkit_in_process("split", data, out, "--mode", "move")
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        f"Error: cannot read {out / '.torchkit-split.json'}: not a regular file (a FIFO)"
    )
    assert len(list(data.rglob("*.png"))) == 4
