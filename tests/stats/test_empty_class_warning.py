"""dataset-stats' warning of a class without images was "1 class folder(s) hold no images: c"
for every kind of data: a class of parquet (HF's ClassLabel names it) or a CSV index is no
folder, and the val split of a split root that lacks the class has no folder of it either. It
names the split measured instead."""

from __future__ import annotations

from image_folders import write_image_folder
from parquet_files import png, write_parquet
from processes import run_torchkit_in_process


def warnings_of(*args: object) -> list[str]:
    result = run_torchkit_in_process("dataset-stats", *args, "-j", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("Warning:")]


def test_a_class_the_classlabel_names_but_no_row_has_is_no_folder(tmp_path):
    data = write_parquet(tmp_path / "d.parquet", [png(i) for i in range(4)], [0, 1, 0, 1])
    assert warnings_of(data) == ["Warning: 1 class(es) have no images: c"]


def test_a_class_the_val_split_lacks_is_named_with_the_split(tmp_path):
    root = tmp_path / "data"
    write_image_folder(root / "train", {"a": 2, "b": 2, "c": 2})
    write_image_folder(root / "val", {"a": 1, "b": 1}, seed=7)
    expected = ["Warning: 1 class(es) have no images in the val split: c"]
    assert warnings_of(root, "--split", "val", "--no-leakage") == expected
    assert warnings_of(root, "--split", "all", "--no-leakage") == []
