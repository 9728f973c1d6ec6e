"""Class names read from metadata, not from a file of names (test_shards_read and
test_eval_class_names hold those): a ClassLabel name that is no name (null, true, a list) was
made one by str() (class "None"), a class no data can name, printed as if the dataset named it."""

from __future__ import annotations

import json

import pytest
from output_checks import error_line
from parquet_files import hf_features, png, write_parquet
from processes import run_torchkit_in_process

HINT = "(give every class a name in the ClassLabel feature of the dataset's metadata)"


@pytest.mark.parametrize(("name", "shown"), [(None, "null"), (True, "true"), (["a"], '["a"]')])
def test_a_classlabel_name_that_is_no_name_is_one_error_line_naming_the_file_and_class(
    tmp_path, name, shown
):
    data = write_parquet(tmp_path / "d.parquet", [png(0), png(1)], [0, 1], names=["a", name])
    result = run_torchkit_in_process("dataset-stats", data, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: the ClassLabel names of {data} give class 1 {shown}, not a name {HINT}"
    )


def test_dataset_info_json_names_are_held_to_the_same_rule_and_numbers_stay_names(tmp_path):
    """HF's save_to_disk writes the names to ROOT/dataset_info.json, read where the parquet
    schema names none; a number is a name as HF's int2str makes it (str)."""
    root = tmp_path / "ds"
    write_parquet(root / "train.parquet", [png(0), png(1)], [0, 1], names=None)
    info = root / "dataset_info.json"
    features = hf_features(["a", None])
    info.write_text(json.dumps({"features": features}), encoding="utf-8")
    result = run_torchkit_in_process("dataset-stats", root, "-j", "0")
    assert result.returncode == 1
    assert error_line(result.stderr, besides="nothing") == (
        f"Error: the ClassLabel names of {info} give class 1 null, not a name {HINT}"
    )
    info.write_text(json.dumps({"features": hf_features(["a", 7])}), encoding="utf-8")
    result = run_torchkit_in_process("dataset-stats", root, "-j", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert [row["name"] for row in json.loads(result.stdout)["classes"]] == ["a", "7"]
