"""`dataset_info.json` beside parquet files (HF's `save_to_disk` writes it: the class names where
the files' own metadata has none) is read only where it is a regular file: a FIFO under its
name hung every command reading the data."""

from __future__ import annotations

import json
from pathlib import Path

from disks import fifo_never_opened
from parquet_files import png, write_parquet
from processes import run_torchkit_in_process


def test_a_fifo_as_dataset_info_json_is_no_list_of_names(tmp_path: Path):
    write_parquet(tmp_path / "data" / "train.parquet", [png(0), png(1)], [0, 1], names=None)
    with fifo_never_opened(tmp_path / "data" / "dataset_info.json", seconds=2):
        result = run_torchkit_in_process(
            "dataset-stats", tmp_path / "data", "--format", "json", "-j", "0"
        )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["images"] == 2
