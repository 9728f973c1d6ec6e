"""`torchkit predict -o FILE.parquet`: JSON Lines' rows as typed Parquet columns, written a row
group at a time to a temporary file renamed into place; refused for stdout and without pyarrow."""

from __future__ import annotations

import io
import json
import os
import sys

import numpy as np
import pytest
import torch
from checkpoints import write_convnet_checkpoint
from disks import fill_disk
from output_checks import error_line
from PIL import Image
from processes import run_torchkit_in_process

from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.predict import parquet_rows

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

CLASSES = ["cat", "dog", "fox"]
PREPROCESS = Preprocess(image_size=12, resize_size=12, mean=(0.5,) * 3, std=(0.25,) * 3)
COLUMNS = [
    "path", "label", "label_index", "class", "class_index", "probability",
    "class_1", "class_index_1", "probability_1", "class_2", "class_index_2", "probability_2",
    "logit_0", "logit_1", "logit_2", "error",
]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """A 3-class convnet checkpoint; photos/ (cat/ and dog/, one unreadable dog) and loose.png,
    an image outside any class folder."""
    root = tmp_path_factory.mktemp("predict_parquet")
    torch.manual_seed(0)
    ckpt = root / "model.pt"
    write_convnet_checkpoint(
        ckpt, in_channels=3, image_size=12, classes=CLASSES, preprocess=PREPROCESS.to_dict()
    )
    rng = np.random.default_rng(0)
    photos = root / "photos"
    for name in ("cat/a.png", "cat/b.png", "dog/c.png", "dog/d.png", "dog/e.png"):
        (photos / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (14, 14, 3), dtype=np.uint8)).save(photos / name)
    (photos / "dog" / "broken.png").write_bytes(b"not an image")
    loose = root / "loose.png"
    Image.fromarray(rng.integers(0, 256, (14, 14, 3), dtype=np.uint8)).save(loose)
    return {"root": root, "ckpt": ckpt, "photos": photos, "loose": loose}


def predict(world, *args: object):
    return run_torchkit_in_process(
        "predict", world["ckpt"], world["photos"], world["loose"], "-k", "2", "--logits",
        "-j", "0", "--device", "cpu", *args,
    )  # fmt: skip


def jsonl_rows(world) -> list[dict]:
    done = predict(world, "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_rows_are_those_of_json_lines_in_typed_columns(world, tmp_path):
    out = tmp_path / "preds.parquet"
    done = predict(world, "-o", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and f"wrote {out}" in done.stderr
    table = pq.read_table(out)
    assert table.column_names == COLUMNS
    types = {field.name: str(field.type) for field in table.schema}
    assert types == {
        column: "int64"
        if column in ("label_index", "class_index", "class_index_1", "class_index_2")
        else "double"
        if column.startswith(("probability", "logit_"))
        else "string"
        for column in COLUMNS
    }
    rows = table.to_pylist()
    assert rows == jsonl_rows(world)
    # two IMAGES: each path as given (absolute here)
    by_path = {os.path.relpath(row["path"], world["root"]): row for row in rows}
    assert list(by_path) == [
        "photos/cat/a.png", "photos/cat/b.png", "photos/dog/broken.png", "photos/dog/c.png",
        "photos/dog/d.png", "photos/dog/e.png", "loose.png",
    ]  # fmt: skip
    good = by_path["photos/cat/a.png"]
    assert good["label"] == "cat" and good["label_index"] == 0 and good["error"] is None
    assert good["class"] == CLASSES[good["class_index"]] == good["class_1"]
    assert isinstance(good["class_index"], int) and isinstance(good["probability"], float)
    assert good["probability"] == good["probability_1"] >= good["probability_2"]
    # an image outside the class folders: no true label, null as in JSON
    assert by_path["loose.png"]["label"] is None and by_path["loose.png"]["label_index"] is None
    broken = by_path["photos/dog/broken.png"]
    assert broken["error"] == "not an image PIL can read"
    assert broken["label"] == "dog" and broken["label_index"] == 1
    known = ("path", "label", "label_index", "error")
    assert all(broken[column] is None for column in COLUMNS if column not in known)
    assert "1 unreadable" in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["preds.parquet"]  # no temporary left beside it


def test_format_parquet_writes_any_name(world, tmp_path):
    out = tmp_path / "preds.out"
    done = predict(world, "-o", out, "--format", "parquet")
    assert done.returncode == 0, done.stderr
    assert pq.read_table(out).to_pylist() == jsonl_rows(world)
    upper = tmp_path / "PREDS.PARQUET"  # the extension in any case picks the format
    assert predict(world, "-o", upper).returncode == 0
    assert pq.read_table(upper).num_rows == 7


def test_rows_are_written_a_row_group_at_a_time(world, tmp_path, monkeypatch):
    """Row groups of at most MOST_GROUP_ROWS rows, so memory holds one group's rows; here 2 a
    group: 7 rows in 4 groups, the same rows."""
    monkeypatch.setattr(parquet_rows, "MOST_GROUP_ROWS", 2)
    out = tmp_path / "preds.parquet"
    assert predict(world, "-o", out).returncode == 0
    metadata = pq.ParquetFile(out).metadata
    assert metadata.num_row_groups == 4
    assert [metadata.row_group(i).num_rows for i in range(4)] == [2, 2, 2, 1]
    assert pq.read_table(out).to_pylist() == jsonl_rows(world)


def test_a_row_group_is_written_before_the_rows_end(monkeypatch):
    """The writer takes the rows as they come: the first group is in the file while the rows
    after it are still to come; at most one group's rows are held."""
    size = 1000
    monkeypatch.setattr(parquet_rows, "MOST_GROUP_ROWS", size)
    handle = io.BytesIO()
    columns = ["path", "class_index", "probability", "error"]
    written_at = []

    def records():
        for index in range(2 * size + 1):
            written_at.append(handle.tell())
            yield [f"{index}.png", index, 0.5, None]

    parquet_rows.write_parquet_rows(records(), columns, handle)
    assert written_at[size - 1] == 0 and written_at[size] > 0  # the first group, then row size
    assert written_at[2 * size] > written_at[size]
    table = pq.read_table(io.BytesIO(handle.getvalue()))
    assert table.num_rows == 2 * size + 1 and pq.ParquetFile(handle).metadata.num_row_groups == 3


def test_no_rows_still_write_the_columns_and_names_that_are_not_utf8_are_escaped():
    handle = io.BytesIO()
    parquet_rows.write_parquet_rows(iter([]), ["path", "class_index", "probability"], handle)
    table = pq.read_table(io.BytesIO(handle.getvalue()))
    assert table.num_rows == 0 and table.column_names == ["path", "class_index", "probability"]
    assert str(table.schema.field("class_index").type) == "int64"

    handle = io.BytesIO()
    columns = ["path", "logit_0", "logit_1"]  # a masked class's -inf, a non-finite output's NaN
    parquet_rows.write_parquet_rows(iter([["a.png", float("-inf"), float("nan")]]), columns, handle)
    row = pq.read_table(io.BytesIO(handle.getvalue())).to_pylist()[0]
    assert row["logit_0"] == float("-inf") and row["logit_1"] != row["logit_1"]  # not null

    handle = io.BytesIO()
    rows = [["caf\udce9.png", 1, None], ["b.png", None, 0.25]]  # a Latin-1 name's byte
    parquet_rows.write_parquet_rows(iter(rows), ["path", "class_index", "probability"], handle)
    assert pq.read_table(io.BytesIO(handle.getvalue())).to_pylist() == [
        {"path": "caf\\udce9.png", "class_index": 1, "probability": None},
        {"path": "b.png", "class_index": None, "probability": 0.25},
    ]  # as JSON writes the name: "caf\udce9.png"


@pytest.mark.parametrize("output", [None, "-"])
def test_parquet_to_stdout_is_refused(world, output):
    extra = [] if output is None else ["-o", output]
    done = predict(world, "--format", "parquet", *extra)
    assert done.returncode == 2 and done.stdout == ""
    assert error_line(done.stderr, besides="nothing") == (
        "Error: --format parquet writes a binary file, not rows for stdout (give -o "
        "FILE.parquet, or --format csv or jsonl for stdout)"
    )


def test_a_format_the_name_contradicts_is_refused(world, tmp_path):
    done = predict(world, "-o", tmp_path / "preds.csv", "--format", "parquet")
    assert done.returncode == 2
    assert "--format parquet, but -o" in error_line(done.stderr)
    assert not (tmp_path / "preds.csv").exists()


def test_without_pyarrow_one_error_naming_the_extra_before_any_work(world, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    out = tmp_path / "preds.parquet"
    done = predict(world, "-o", out)
    assert done.returncode == 1
    line = error_line(done.stderr, besides="nothing")
    assert line.startswith(
        "Error: writing Parquet (--format parquet) needs the pyarrow package, which is not "
        "installed (install torchkit's parquet extra: `uv sync --extra parquet`"
    ), line
    assert os.listdir(tmp_path) == []


def test_an_existing_file_needs_force_and_force_replaces_it(world, tmp_path):
    out = tmp_path / "preds.parquet"
    out.write_bytes(b"old")
    refused = predict(world, "-o", out)
    assert refused.returncode == 1 and "exists" in error_line(refused.stderr)
    assert out.read_bytes() == b"old"
    assert predict(world, "-o", out, "--force").returncode == 0
    assert pq.read_table(out).num_rows == 7


def test_a_run_that_reads_no_image_writes_no_file(world, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "x.png").write_bytes(b"not an image")
    out = tmp_path / "preds.parquet"
    done = run_torchkit_in_process(
        "predict", world["ckpt"], broken, "-o", out, "-j", "0", "--device", "cpu"
    )
    assert done.returncode == 1
    assert "none of the 1 images" in error_line(done.stderr)
    assert sorted(os.listdir(tmp_path)) == ["broken"]


def test_a_full_disk_is_an_error_and_leaves_the_earlier_file(world, small_tmpfs):
    disk = small_tmpfs(64)
    out = disk / "preds.parquet"
    out.write_bytes(b"earlier")
    fill_disk(disk)
    done = predict(world, "-o", out, "--force")
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr)
    assert line.startswith(f"Error: cannot write {out}: No space left on device"), line
    assert out.read_bytes() == b"earlier"
    assert sorted(os.listdir(disk)) == ["filler", "preds.parquet"]


def test_tta_rows_are_those_of_json_lines(world, tmp_path):
    out = tmp_path / "preds.parquet"
    done = predict(world, "-o", out, "--tta", "flip")
    assert done.returncode == 0, done.stderr
    flipped = predict(world, "--format", "jsonl", "--tta", "flip")
    assert pq.read_table(out).to_pylist() == [json.loads(x) for x in flipped.stdout.splitlines()]
    assert pq.read_table(out).to_pylist() != jsonl_rows(world)  # the mirror counted


def test_many_columns_make_row_groups_of_many_rows(monkeypatch):
    """With --logits of 1,000 outputs a row group holds thousands of rows (GROUP_BYTES of
    values), not a few hundred: the footer, held in memory until the file ends, has an entry
    for each column of each group. Groups of GROUP_BYTES: one more once a group reaches it."""
    columns = ["path", *(f"logit_{i}" for i in range(1000))]
    row = ["a.png", *[0.5] * 1000]
    handle = io.BytesIO()
    parquet_rows.write_parquet_rows((row for _ in range(2000)), columns, handle)
    assert pq.ParquetFile(handle).metadata.num_row_groups == 1

    monkeypatch.setattr(parquet_rows, "GROUP_BYTES", 2**20)  # each chunk of rows passes it
    handle = io.BytesIO()
    parquet_rows.write_parquet_rows((row for _ in range(2000)), columns, handle)
    metadata = pq.ParquetFile(handle).metadata
    chunk = parquet_rows.chunk_rows(columns)
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert 1 < chunk < 2000 and sizes == [chunk] * (2000 // chunk) + [2000 % chunk]


def test_a_first_row_group_of_error_rows_alone_keeps_every_column_typed(monkeypatch):
    """Null in every column but path and error (unreadable images first): the columns keep
    their types, and the groups after it, with values, are written under them."""
    monkeypatch.setattr(parquet_rows, "MOST_GROUP_ROWS", 2)
    columns = ["path", "label", "class", "class_index", "probability", "logit_0", "error"]
    error = [None] * 5 + ["not an image PIL can read"]
    rows = [["a.png", *error], ["b.png", *error], ["c.png", "cat", "cat", 0, 0.75, 1.5, None]]
    handle = io.BytesIO()
    parquet_rows.write_parquet_rows(iter(rows), columns, handle)
    table = pq.read_table(io.BytesIO(handle.getvalue()))
    assert pq.ParquetFile(handle).metadata.num_row_groups == 2
    assert [str(field.type) for field in table.schema] == [
        "string", "string", "string", "int64", "double", "double", "string",
    ]  # fmt: skip
    assert table.to_pylist()[2] == dict(zip(columns, rows[2], strict=True))


def test_pandas_reads_the_index_columns_as_integers_with_or_without_a_null(world, tmp_path):
    """pandas reads an int64 column with a null as float64 unless the file says otherwise:
    one unreadable image would turn class_index into 3.0. The file says Int64 (nullable)."""
    pd = pytest.importorskip("pandas")
    out = tmp_path / "preds.parquet"
    assert predict(world, "-o", out).returncode == 0  # an unreadable image and an unlabelled one
    frame = pd.read_parquet(out)
    assert list(frame.columns) == COLUMNS and isinstance(frame.index, pd.RangeIndex)
    for column in ("class_index", "label_index", "class_index_1", "class_index_2"):
        assert frame[column].dtype == "Int64", column
    assert frame["probability"].dtype == "float64" and frame["logit_0"].dtype == "float64"
    assert pd.api.types.is_string_dtype(frame["path"]) and frame["class"].isna().sum() == 1
    broken = frame.index[frame["error"].notna()][0]
    assert frame["class_index"].isna().tolist() == [i == broken for i in range(len(frame))]
    assert frame["class_index"].dropna().tolist() == [
        row["class_index"] for row in jsonl_rows(world) if row["class_index"] is not None
    ]
    clean = tmp_path / "clean.parquet"  # no null in any of them: the same dtypes
    done = run_torchkit_in_process(
        "predict", world["ckpt"], world["photos"] / "cat", "-o", clean, "-j", "0",
        "--device", "cpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert pd.read_parquet(clean)["class_index"].dtype == "Int64"


def test_a_run_stopped_mid_way_leaves_no_file_and_the_earlier_one_as_it_was(
    world, tmp_path, monkeypatch
):
    """Ctrl-C (SIGTERM ends a run the same way) after a row group is in the temporary file:
    no file under the final name, no temporary beside it, an earlier file kept."""
    from torchkit.core.predict import PredictRun

    monkeypatch.setattr(parquet_rows, "MOST_GROUP_ROWS", 2)
    written = []
    records = PredictRun.records

    def stopped(self, progress=None):
        for position, record in enumerate(records(self, progress)):
            if position == 5:  # two groups written
                written.append(os.listdir(tmp_path))
                raise KeyboardInterrupt
            yield record

    monkeypatch.setattr(PredictRun, "records", stopped)
    out = tmp_path / "preds.parquet"
    out.write_bytes(b"earlier")
    done = predict(world, "-o", out, "--force")
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    assert len(written[0]) == 2  # the temporary beside the earlier file, then gone
    assert os.listdir(tmp_path) == ["preds.parquet"] and out.read_bytes() == b"earlier"
