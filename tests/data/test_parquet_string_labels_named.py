"""String labels of a parquet file whose HF metadata names the classes (a ClassLabel's
`names`, in the schema or ROOT/dataset_info.json) map through those names: the classes are in
the metadata's order, so class indices equal HF's, and a label the names lack is an error
naming it, its rows and the names, in every command (as a class index past them is)."""

from __future__ import annotations

import json
from pathlib import Path

from checkpoints import write_convnet_checkpoint
from output_checks import error_line
from parquet_files import hf_features, png
from processes import run_json, run_torchkit_in_process


def write_named(path: Path, labels: list[str | None], names: list[str] | None) -> Path:
    """A parquet file of string labels, its schema metadata naming `names` (None: no names)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    metadata = {b"huggingface": json.dumps({"info": {"features": hf_features(names)}}).encode()}
    schema = pa.schema([("image", image), ("label", pa.string())], metadata=metadata)
    rows = [{"bytes": png(i), "path": None} for i in range(len(labels))]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"image": rows, "label": labels}, schema=schema), path)
    return path


def class_counts(data: Path) -> list[tuple[str, int]]:
    report = run_json("dataset-stats", data, "-j", "0", "--format", "json")
    return [(c["name"], c["images"]) for c in report["classes"]]


def test_string_labels_take_the_metadata_order_and_its_classes_without_rows(tmp_path):
    # Sorted, the classes were a, b (c unseen and gone): class 0 was a, where HF's is b.
    data = write_named(tmp_path / "d.parquet", ["a", "b", "b", "a", "a"], ["b", "a", "c"])
    assert class_counts(data) == [("b", 2), ("a", 3), ("c", 0)]


def test_without_metadata_string_labels_are_sorted_naturally(tmp_path):
    data = write_named(tmp_path / "d.parquet", ["10", "2", "2"], None)
    assert class_counts(data) == [("2", 2), ("10", 1)]


def test_dataset_info_names_order_string_labels_too(tmp_path):
    write_named(tmp_path / "data" / "train-00000-of-00001.parquet", ["a", "b", "b"], None)
    info = {"features": hf_features(["b", "a"])}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    assert class_counts(tmp_path) == [("b", 2), ("a", 1)]


def test_a_label_the_metadata_does_not_name_is_one_error_line_in_every_command(tmp_path):
    # "c" silently became a third class of a dataset HF says has two.
    data = write_named(tmp_path / "d.parquet", ["a", "c", "b", "c"], ["a", "b"])
    model = tmp_path / "m.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes="ab")
    expected = (
        f"Error: {data} has 2 row(s) labelled 'c', a class its metadata does not name "
        "(row 1, 3; it names 2: a, b)"
    )
    for args in (
        ("dataset-stats", data, "-j", "0"),
        ("train", "--data", data, "--epochs", "1", "--out", tmp_path / "run"),
        ("eval", model, "--data", data, "-j", "0"),
    ):
        result = run_torchkit_in_process(*args)
        assert result.returncode == 1, (args[0], result.stderr)
        assert error_line(result.stderr).startswith(expected), args[0]
    assert not (tmp_path / "run").exists()
