"""Reading Hugging Face datasets stored as parquet in place (issue #48): parquet files in HF's
layout, with HF's schema metadata, give the same statistics, metrics and features as the image
folder they were written from; HF's splits are split data; class names come from the metadata;
bad files, null and undecodable images, and a missing pyarrow are one error line or a counted
skip."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from checkpoints import write_convnet_checkpoint
from output_checks import error_line, torchkit_log_to_caplog
from parquet_files import counted_row_group_reads, png, write_parquet
from processes import dataset_stats, run_json, run_torchkit_in_process
from stats_plots import write_stats_plot_undrawn
from suite_paths import REPO

from torchkit.core.data.sources.parquet import split_of
from torchkit.core.io.errors import InputError

CLASSES = "abc"


def write_split(root: Path, folder: Path, split: str, hf_split: str, per_class: int, seed: int):
    """`per_class` PNGs of each class as FOLDER/<split>/<class>/<i>.png and as HF parquet
    ROOT/data/<hf_split>-0000N-of-00002.parquet, classes interleaved, rows in the same order."""
    images, labels = [], []
    for i in range(per_class * len(CLASSES)):
        label, data = i % len(CLASSES), png(seed * 1000 + i)
        (folder / split / CLASSES[label]).mkdir(parents=True, exist_ok=True)
        (folder / split / CLASSES[label] / f"{i:03d}.png").write_bytes(data)
        images.append(data)
        labels.append(label)
    half = len(images) // 2
    for shard, rows in enumerate((slice(0, half), slice(half, None))):
        write_parquet(
            root / "data" / f"{hf_split}-{shard:05d}-of-00002.parquet", images[rows], labels[rows]
        )


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """hf/ (HF's layout: train 3x6, validation 3x2, test 3x2, two files each, 4 rows a row
    group), split/ (the same images as a split root) and a convnet checkpoint for a, b, c."""
    root = tmp_path_factory.mktemp("parquet")
    for split, hf_split, per_class, seed in (
        ("train", "train", 6, 1),
        ("val", "validation", 2, 2),
        ("test", "test", 2, 3),
    ):
        write_split(root / "hf", root / "split", split, hf_split, per_class, seed)
    write_convnet_checkpoint(root / "model.pt", in_channels=3, image_size=8, classes=CLASSES)
    return root


def stats(data: Path, *extra: object) -> dict:
    """`dataset-stats DATA` as JSON, read in this process: the tests that read with worker
    processes say so (a fork of the test process each, 0.1 s of CPU)."""
    return dataset_stats(data, "-j", "0", *extra)


def metrics(world: Path, data: Path, *extra: object) -> dict:
    found = run_json("eval", world / "model.pt", "--data", data, "--device", "cpu", *extra)
    return {
        k: v
        for k, v in found.items()
        if k not in ("data", "root", "seconds") and "per_s" not in k and "second" not in k
    }


def assert_same_scores(ours: object, theirs: object) -> None:
    """Equal, floats within float32's precision: parquet rows interleave the classes, the
    folder lists them class by class, so the batches (and a mean loss's last bits) differ."""
    if isinstance(ours, float) and isinstance(theirs, float):
        assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-9)
    elif isinstance(ours, dict) and isinstance(theirs, dict):
        assert ours.keys() == theirs.keys()
        for key in ours:
            assert_same_scores(ours[key], theirs[key])
    elif isinstance(ours, list) and isinstance(theirs, list):
        assert len(ours) == len(theirs)
        for mine, other in zip(ours, theirs, strict=True):
            assert_same_scores(mine, other)
    else:
        assert ours == theirs


def test_hf_file_and_folder_names_give_hf_splits():
    assert split_of("data/train-00000-of-00010.parquet") == "train"
    assert split_of("data/validation-00001-of-00002.parquet") == "val"
    assert split_of("test-00000.parquet") == "test"
    assert split_of("valid/0000.parquet") == "val"
    assert split_of("data/test/0000.parquet") == "test"
    assert split_of("data/shard-00000.parquet") is None
    assert split_of("trainer.parquet") is None


def test_dataset_stats_of_parquet_is_that_of_the_image_folder(world):
    for split in ("train", "val"):
        assert stats(world / "hf", "--split", split) == stats(world / "split", "--split", split)
    # and through worker processes, each reading its rows of the parquet files
    every = dataset_stats(world / "hf", "--split", "all", "-j", "2")
    assert every == stats(world / "split", "--split", "all")  # the folder's, read here
    assert every["images"] == 30
    assert stats(world / "hf")["images"] == 18


def test_eval_of_parquet_scores_as_the_folder_and_val_reads_validation_only(world):
    # parquet through the loader's workers; the folder, the reference, in this process
    assert_same_scores(metrics(world, world / "hf"), metrics(world, world / "split", "-j", "0"))
    val = metrics(world, world / "hf", "--split", "val", "-j", "0")
    assert_same_scores(val, metrics(world, world / "split", "--split", "val", "-j", "0"))
    assert val["split"] == "val" and val["num_images"] == 6


def test_class_names_come_from_the_hf_metadata_else_are_the_indices(world, tmp_path):
    images = [png(i) for i in range(4)]
    named = write_parquet(tmp_path / "named.parquet", images, [0, 1, 2, 2], names=["x", "y", "z"])
    assert [c["name"] for c in stats(named)["classes"]] == ["x", "y", "z"]
    plain = write_parquet(tmp_path / "plain.parquet", images, [0, 2, 2, 2], names=None)
    counts = {c["name"]: c["images"] for c in stats(plain)["classes"]}
    assert counts == {"0": 1, "1": 0, "2": 3}


def write_labelled_by_name(path: Path, labels: object) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    images = pa.array([png(i) for i in range(len(labels))], pa.binary())
    pq.write_table(pa.table({"image": images, "label": labels}), path)
    return path


def test_a_split_file_of_no_rows_is_not_taken_for_labels_of_another_kind(tmp_path):
    # Class names as labels, and a test split of no rows: "mixes class names with indices".
    import pyarrow as pa

    write_labelled_by_name(tmp_path / "data" / "train-0.parquet", ["a", "b", "b"])
    write_labelled_by_name(tmp_path / "data" / "test-0.parquet", pa.array([], pa.string()))
    counts = {c["name"]: c["images"] for c in stats(tmp_path)["classes"]}
    assert counts == {"a": 1, "b": 2}


def test_a_split_of_no_rows_is_no_split_as_an_empty_split_folder_is(tmp_path):
    """A validation file of 0 rows: `dataset-stats --split val` stopped on an IndexError, and
    train on "the validation set is empty". Now it is no split, with a warning naming the
    file, as an empty val/ folder is: asking for it is an error, train holds val out of train."""
    data = tmp_path / "data"
    write_parquet(data / "train-00000-of-00001.parquet", [png(i) for i in range(6)], [0, 1] * 3)
    write_parquet(data / "validation-00000-of-00001.parquet", [], [])
    asked = run_torchkit_in_process("dataset-stats", tmp_path, "--split", "val", "-j", "0")
    assert asked.returncode == 1
    assert error_line(asked.stderr) == (
        f"Error: no images in {data / 'validation-00000-of-00001.parquet'}: the val split of "
        f"{tmp_path} is empty (it has: train; --split NAME picks another)"
    )
    from torchkit.core.data.sources import open_data
    from torchkit.core.data.sources.select import training_splits

    source = open_data(str(tmp_path))
    parts, _ = training_splits(source, val_split=None, seed=0)
    assert (len(parts["train"]), len(parts["val"])) == (5, 1)
    write_parquet(data / "train-00000-of-00001.parquet", [], [])
    none = run_torchkit_in_process("dataset-stats", tmp_path, "-j", "0")
    assert none.returncode == 1
    assert error_line(none.stderr).startswith(f"Error: no rows in {tmp_path} ")


def test_dictionary_encoded_labels_are_read_as_their_class_names(tmp_path):
    # pandas writes a categorical column dictionary-encoded: it was read as no label at all.
    import pyarrow as pa

    labels = pa.array(["cat", "dog", "dog"]).dictionary_encode()
    data = write_labelled_by_name(tmp_path / "pets.parquet", labels)
    counts = {c["name"]: c["images"] for c in stats(data)["classes"]}
    assert counts == {"cat": 1, "dog": 2}


def test_an_empty_class_name_is_one_error_line_naming_its_rows(tmp_path):
    # "" trained as a class of that name: the name torchkit gives unlabelled images.
    data = write_labelled_by_name(tmp_path / "d.parquet", ["a", "", "b", ""])
    for command in ("dataset-stats", "train"):
        result = run_torchkit_in_process(command, *(["--data"] if command == "train" else []), data)
        assert result.returncode == 1
        assert error_line(result.stderr).startswith(
            f"Error: {data} has 2 row(s) with an empty label (row 1, 3)"
        )


def test_a_float_or_bool_label_column_is_refused_by_eval_and_a_warning_for_stats(world, tmp_path):
    # pandas writes an int column with a missing value as float64: it was read as no labels
    # ("has no label column (its columns: image, label)"), silently so by dataset-stats.
    for name, labels in (("float", [0.0, None, 1.0]), ("bool", [True, False, True])):
        data = write_labelled_by_name(tmp_path / name / "d.parquet", labels)
        refused = run_torchkit_in_process("eval", world / "model.pt", "--data", data, "-j", "0")
        assert refused.returncode == 1
        assert "the label column of" in error_line(refused.stderr)
        assert "not integers or class names (a column with missing labels?" in refused.stderr
        counted = run_torchkit_in_process("dataset-stats", data, "-j", "0")
        assert counted.returncode == 0, counted.stderr
        assert "not integers or class names: its images are read unlabelled" in counted.stderr


def test_whole_number_float_labels_are_class_indices(tmp_path):
    data = write_labelled_by_name(tmp_path / "d.parquet", [0.0, 2.0, 2.0])
    counts = {c["name"]: c["images"] for c in stats(data)["classes"]}
    assert counts == {"0": 1, "1": 0, "2": 2}


def test_one_parquet_file_is_named_by_its_path_not_its_folder(world, tmp_path, monkeypatch):
    """`dataset-stats x.parquet` titled its report "Dataset ." (JSON `"source": "."`), refused
    `--plot p.png` beside it as lying "inside the data folder .", and `eval -v` said
    "evaluating 2 images of .": the data is the file."""
    plotted = write_stats_plot_undrawn(monkeypatch)  # where the plot goes, not its drawing
    write_parquet(tmp_path / "x.parquet", [png(0), png(1)], [0, 1])
    table = run_torchkit_in_process(
        "dataset-stats", "x.parquet", "--plot", "p.png", "-j", "0", cwd=tmp_path
    )
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].strip() == "Dataset x.parquet"
    assert (tmp_path / "p.png").is_file() and [plot["images"] for plot in plotted] == [2]
    found = run_torchkit_in_process(
        "dataset-stats", "x.parquet", "--format", "json", "-j", "0", cwd=tmp_path
    )
    assert json.loads(found.stdout)["source"] == "x.parquet"
    scored = run_torchkit_in_process(
        "eval", world / "model.pt", "--data", "x.parquet", "-v", "-j", "0", "--device", "cpu",
        cwd=tmp_path,
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    assert "evaluating 2 images of x.parquet with convnet" in scored.stderr


def test_extract_features_gives_one_row_per_sample_in_file_order(world, tmp_path):
    # parquet through the loader's workers; the folder, the reference, in this process
    for data, out, *workers in ((world / "split", "folder", "-j", "0"), (world / "hf", "parquet")):
        result = run_torchkit_in_process(
            "extract-features", world / "model.pt", data, "--out", tmp_path / out,
            "--split", "train", "--device", "cpu", *workers,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    with open(tmp_path / "parquet" / "index.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["path"] for r in rows] == [
        f"data/train-0000{shard}-of-00002.parquet/{row}" for shard in (0, 1) for row in range(9)
    ]
    assert [r["label"] for r in rows] == [CLASSES[i % 3] for i in range(18)]
    # The folder lists class by class; parquet rows interleave the classes: compare by image.
    folder = np.load(tmp_path / "folder" / "penultimate.npy")
    order = [(i % 3) * 6 + i // 3 for i in range(18)]
    np.testing.assert_allclose(np.load(tmp_path / "parquet" / "penultimate.npy"), folder[order])


def test_train_runs_an_epoch_on_one_parquet_file_and_eval_finds_it_again(world, tmp_path):
    data = world / "hf" / "data" / "train-00000-of-00002.parquet"
    result = run_torchkit_in_process(
        "train", "--data", data, "--model", "convnet", "--image-size", "8", "--epochs", "1",
        "--batch-size", "4", "--workers", "0", "--device", "cpu", "--val-split", "0.34",
        "--out", tmp_path / "run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    split = (tmp_path / "run" / "split.csv").read_text().splitlines()
    assert split[1].startswith("train-00000-of-00002.parquet/") and len(split) == 1 + 9
    held_out = sum(line.endswith(",val") for line in split)
    # Without --data, eval reads the file the run trained on, not the folder around it.
    scored = run_json(
        "eval", tmp_path / "run" / "best.pt", "--split", "val", "--device", "cpu", "-j", "0"
    )
    assert scored["num_images"] == held_out == 3


def test_undecodable_and_null_images_are_counted_unreadable(tmp_path):
    images = [png(0), b"not an image", None, png(1)]
    data = write_parquet(tmp_path / "rows.parquet", images, [0, 1, 2, 0], row_group_size=2)
    found = run_json("dataset-stats", data, "-j", "0")
    assert found["images"] == 2
    reasons = {row["path"]: row["error"] for row in found["unreadable"]}
    assert set(reasons) == {"rows.parquet/1", "rows.parquet/2"}
    assert "null" in reasons["rows.parquet/2"]


def test_each_image_prints_as_its_file_and_row_and_reads_its_own_bytes(tmp_path):
    from torchkit.core.data.sources import open_data

    images = [png(i) for i in range(5)]
    write_parquet(tmp_path / "data" / "x.parquet", images, [0, 1, 2, 0, 1], row_group_size=2)
    samples = open_data(tmp_path).whole
    assert samples.ids == [f"data/x.parquet/{row}" for row in range(5)]
    assert [str(p) for p in samples.paths] == [str(tmp_path / i) for i in samples.ids]
    assert [p.read_bytes() for p in samples.paths] == images


def write_corrupt(path: Path) -> Path:
    path.write_bytes(b"PAR1 but nothing a parquet reader can use")
    return path


def write_imageless(path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "b"], "label": [0, 1]}), path)
    return path


def write_huge_class_index(path: Path) -> Path:
    # No class names: classes "0".."N" up to the largest index, which took all memory to name.
    return write_parquet(path, [png(0), png(1)], [0, 2**63 - 1], names=None)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            write_imageless,
            "has no image column (its columns: text, label) (images are an `image` column of "
            "binary, or of HF's Image type: a {bytes, path} struct)",
        ),
        (write_corrupt, "cannot read bad.parquet"),
        (write_huge_class_index, "bad.parquet has class index 9,223,372,036,854,775,807"),
    ],
)
def test_a_bad_parquet_file_is_one_error_line(tmp_path, make, message):
    make(tmp_path / "bad.parquet")
    result = run_torchkit_in_process("dataset-stats", "bad.parquet", cwd=tmp_path)
    assert result.returncode == 1
    assert message in error_line(result.stderr)


def test_unlabelled_rows_are_read_unlabelled_by_predict_and_refused_by_eval(world, tmp_path):
    data = write_parquet(tmp_path / "test.parquet", [png(0), png(1), png(2)], [0, -1, -1])
    predicted = run_torchkit_in_process(
        "predict", world / "model.pt", tmp_path, "--format", "csv", "--device", "cpu", "-j", "0"
    )
    assert predicted.returncode == 0, predicted.stderr
    assert predicted.stdout.splitlines()[1].startswith("test.parquet/0,")
    refused = run_torchkit_in_process("eval", world / "model.pt", "--data", data)
    assert refused.returncode == 1
    assert "has 2 row(s) without a label (null or -1; row 1, 2)" in error_line(refused.stderr)


@pytest.mark.parametrize("label", [-5, -5.0])
def test_a_class_index_below_minus_one_is_one_error_line_naming_its_row(tmp_path, label):
    """-5 is no class index and not HF's -1: dataset-stats read the whole file unlabelled without
    a word, and eval called the row null or -1 (a shard's KEY.cls -5 is refused so)."""
    data = write_labelled_by_name(tmp_path / "d.parquet", [0, 1, label] if label == -5 else
                                  [0.0, 1.0, label])  # fmt: skip
    result = run_torchkit_in_process("dataset-stats", data, "-j", "0")
    assert result.returncode == 1
    message = (
        f"{data} has 1 row(s) labelled -5, not a class index (row 2) (labels are class indices "
        "0, 1, ..., and -1 or null for a row without a label)"
    )
    assert error_line(result.stderr) == f"Error: {message}"
    from torchkit.core.data.sources import open_data

    with pytest.raises(InputError) as refused:  # train's and eval's reader
        open_data(str(data))
    assert str(refused.value) == message


def test_a_file_of_some_rows_without_a_label_is_read_with_the_labels_it_has(
    tmp_path, caplog, monkeypatch
):
    """Five labelled rows and one null: dataset-stats counted all six as unlabelled images, its
    class counts gone without a word, then with a warning. It counts each class, the row
    without a label in a row of its own."""
    from torchkit.core.data.sources import open_data

    data = write_parquet(tmp_path / "d.parquet", [png(i) for i in range(6)], [0, 1, 2, 0, 1, None])
    plotted = write_stats_plot_undrawn(monkeypatch)
    result = run_torchkit_in_process(
        "dataset-stats", data, "-j", "0", "--format", "json", "--plot", tmp_path / "p.png"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [(row["name"], row["images"]) for row in report["classes"]] == [
        ("a", 2),
        ("b", 2),
        ("c", 1),
        ("", 1),
    ]
    assert report["num_classes"] == 3
    # The plot's 'class (N)' as the report counts them: it said 'class (4)'.
    assert [(plot["names"], plot["classes"]) for plot in plotted] == [
        (["a", "b", "c", "(unlabelled)"], 3)
    ]
    # Read unlabelled, where it is (beside train's and eval's refusal), it is said.
    torchkit_log_to_caplog(caplog, monkeypatch)
    with caplog.at_level("WARNING", logger="torchkit"):
        assert open_data(str(data), allow_unlabelled=True).classes == [""]
    assert (
        f"{data} has 1 row(s) without a label (null or -1; row 5) among 5 labelled ones: its "
        "images are read unlabelled"
    ) in caplog.messages


def test_an_unlabelled_test_split_leaves_the_other_splits_labelled(world, tmp_path):
    # HF's unlabelled test split (label -1) made every split unlabelled: predict printed no
    # label for train, dataset-stats counted no class, and convert shards dropped every label.
    from torchkit.core.data.sources import open_data

    data = tmp_path / "hf"
    write_parquet(data / "data" / "train-00000-of-00001.parquet", [png(0), png(1)], [2, 0])
    write_parquet(data / "data" / "test-00000-of-00001.parquet", [png(2)], [-1])
    source = open_data(data, allow_unlabelled=True)
    train, test = source.splits["train"], source.splits["test"]
    assert [train.classes[label] for label in train.labels] == ["c", "a"]
    assert [test.classes[label] for label in test.labels] == [""]
    predicted = run_torchkit_in_process(
        "predict", world / "model.pt", data, "--format", "csv", "--device", "cpu", "-j", "0"
    )
    assert predicted.returncode == 0, predicted.stderr
    rows = {row["path"]: row["label"] for row in csv.DictReader(predicted.stdout.splitlines())}
    assert rows == {
        "data/train-00000-of-00001.parquet/0": "c",
        "data/train-00000-of-00001.parquet/1": "a",
        "data/test-00000-of-00001.parquet/0": "",
    }
    refused = run_torchkit_in_process("eval", world / "model.pt", "--data", data)
    assert refused.returncode == 1  # the test split eval reads has no labels
    assert "has 1 image(s) without a label (data/test-00000-of-00001.parquet/0)" in error_line(
        refused.stderr
    )
    # eval --split train was refused with that same error: it scores the labelled split.
    scored = run_json("eval", world / "model.pt", "--data", data, "--split", "train", "-j", "0")
    assert (scored["split"], scored["num_images"]) == ("train", 2)


def test_train_trains_on_labelled_splits_beside_an_unlabelled_test_split(tmp_path):
    # HF's unlabelled test split (label -1) refused the whole run: "test-... has 4 row(s)
    # without a label". Train and val train as they are; best.pt is not tested.
    data, ab = tmp_path / "hf" / "data", ("a", "b")
    write_parquet(data / "train-00000-of-00001.parquet", [png(i) for i in range(6)],
                  [i % 2 for i in range(6)], names=ab)  # fmt: skip
    write_parquet(data / "validation-00000-of-00001.parquet", [png(6), png(7)], [0, 1], names=ab)
    write_parquet(data / "test-00000-of-00001.parquet", [png(8), png(9)], [-1, -1], names=ab)
    data = data.parent
    result = run_torchkit_in_process(
        "train", "--data", data, "--model", "convnet", "--image-size", "8", "--epochs", "1",
        "--batch-size", "4", "--workers", "0", "--device", "cpu", "--format", "json",
        "--out", tmp_path / "run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "the test split of" in result.stderr and "has no labels: best.pt is not tested" in (
        result.stderr
    )
    import json

    summary = json.loads(result.stdout)
    assert summary["test_top1"] is None
    split = list(csv.DictReader((tmp_path / "run" / "split.csv").read_text().splitlines()))
    assert [row["split"] for row in split] == ["train"] * 6 + ["val"] * 2
    assert {row["label"] for row in split} == {"a", "b"}
    import torch

    best = torch.load(tmp_path / "run" / "best.pt", weights_only=True)
    assert best["classes"] == ["a", "b"] and best["num_classes"] == 2
    # eval's default test split names the labelled one to score instead.
    refused = run_torchkit_in_process("eval", tmp_path / "run" / "best.pt", "--data", data)
    assert refused.returncode == 1
    line = error_line(refused.stderr)
    assert "the test split of" in line and "has 2 image(s) without a label" in line
    assert "--split val scores a labelled split" in line
    # Unlabelled validation images are still refused.
    write_parquet(data / "data" / "validation-00000-of-00001.parquet", [png(6)], [-1], names=ab)
    refused = run_torchkit_in_process(
        "train", "--data", data, "--model", "convnet", "--out", tmp_path / "run2"
    )
    assert refused.returncode == 1
    assert "the val split of" in error_line(refused.stderr)
    assert "has 1 image(s) without a label" in error_line(refused.stderr)


def test_files_of_splits_mixed_with_files_of_none_are_refused(tmp_path):
    write_parquet(tmp_path / "data" / "train-00000-of-00001.parquet", [png(0)], [0])
    write_parquet(tmp_path / "data" / "extra-00000-of-00001.parquet", [png(1)], [0])
    result = run_torchkit_in_process("dataset-stats", tmp_path)
    assert result.returncode == 1
    assert error_line(result.stderr).endswith(
        "mixes parquet files of splits with files of none (data/extra-00000-of-00001.parquet) "
        "(name every file for its split, as train-*, validation-* or test-*, or none; or give one "
        "file)"
    )


def test_missing_pyarrow_is_one_error_naming_the_extra(world, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    result = run_torchkit_in_process("dataset-stats", world / "hf")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert "reading parquet files needs the pyarrow package" in line
    assert "--extra parquet" in line


def test_digits_and_image_folders_never_import_pyarrow(world):
    script = (
        "import sys\n"
        "from torchkit.core.data.sources import open_data\n"
        f"open_data('digits'); open_data({str(world / 'split')!r})\n"
        "assert 'pyarrow' not in sys.modules, 'pyarrow imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_split_refuses_parquet_data_it_cannot_copy(world, tmp_path):
    data = world / "hf" / "data" / "train-00000-of-00002.parquet"
    result = run_torchkit_in_process("split", data, tmp_path / "out")
    assert result.returncode == 1
    assert "holds its images in container files" in error_line(result.stderr)
    assert not (tmp_path / "out").exists()


def test_row_groups_larger_than_the_readers_cache_are_said_once(tmp_path, monkeypatch):
    # An image is read with its whole row group: pyarrow's default (a million rows in one)
    # put a whole file's images in every loader worker without a word.
    import torchkit.core.data.sources.parquet as parquet

    images = [png(i) for i in range(8)]
    one_group = write_parquet(tmp_path / "big.parquet", images, [0] * 8, row_group_size=8)
    small_groups = write_parquet(tmp_path / "small.parquet", images, [0] * 8, row_group_size=2)
    group_bytes = parquet._File(str(tmp_path), "big.parquet").group_bytes[0]
    monkeypatch.setattr(parquet, "CACHE_BYTES", group_bytes - 1)
    said = run_torchkit_in_process("dataset-stats", one_group, "-j", "0")
    assert said.returncode == 0, said.stderr
    warnings = [line for line in said.stderr.splitlines() if "row groups of up to" in line]
    assert len(warnings) == 1
    assert warnings[0].endswith(
        "each process that reads images, every loader worker included, holds a whole row group "
        "in memory (rewrite the file with smaller row groups, e.g. "
        "`pyarrow.parquet.write_table(..., row_group_size=1000)`)"
    )
    quiet = run_torchkit_in_process("dataset-stats", small_groups, "-j", "0")
    assert quiet.returncode == 0 and "row groups of up to" not in quiet.stderr


def test_an_arrow_error_joining_a_row_groups_chunks_is_the_read_error(tmp_path, monkeypatch):
    """A row group's chunks joined into one array (ArrowCapacityError past 2 GiB of `binary`)
    failed outside the read's error handling: an Arrow exception, not the one read error."""
    import pyarrow as pa

    import torchkit.core.data.sources.parquet as parquet

    path = write_parquet(tmp_path / "one.parquet", [png(0)], [0])

    def overflow(column):
        raise pa.ArrowCapacityError("offset overflow while concatenating arrays")

    monkeypatch.setattr(parquet, "image_bytes", overflow)
    with pytest.raises(OSError, match=r"cannot read row group 0 of .*: offset overflow"):
        parquet.ParquetImages([str(path)], ["image"]).read((0, 0, 0))


def test_a_file_written_again_while_a_run_reads_it_is_one_error_not_other_rows(tmp_path):
    """pyarrow writes a file in place: the listed row groups then held the new file's rows
    (other images under the listed labels, without a word) or none (an IndexError)."""
    from torchkit.core.data.sources import open_data
    from torchkit.core.data.stored_image import StoredReadError

    path = write_parquet(tmp_path / "data.parquet", [png(i) for i in range(6)], [0, 1, 2] * 2)
    samples = open_data(str(path)).whole
    write_parquet(path, [png(10 + i) for i in range(6)], [2, 1, 0] * 2)
    with pytest.raises(StoredReadError, match="data.parquet was written again after it was"):
        samples.paths[0].read_bytes()


def test_threads_sharing_a_reader_take_turns_in_pyarrow(tmp_path, monkeypatch):
    """`convert shards` reads ahead in threads, which shared one reader's pyarrow file: two in
    it at once crashed the process now and then (double free or corruption, segfaults)."""
    import threading

    import torchkit.core.data.sources.parquet as parquet

    images = [png(i) for i in range(2)]
    path = write_parquet(tmp_path / "x.parquet", images, [0, 1], row_group_size=1)
    reader = parquet.ParquetImages([str(path)], ["image"])
    first_in, second_in = threading.Event(), threading.Event()
    overlapped = []
    real_image_bytes = parquet.image_bytes

    def image_bytes(column):  # called while a thread reads a row group
        if not first_in.is_set():
            first_in.set()
            # Bounded: where the threads take turns, the second one never comes in meanwhile.
            overlapped.append(second_in.wait(timeout=0.3))
        else:
            second_in.set()
        return real_image_bytes(column)

    monkeypatch.setattr(parquet, "image_bytes", image_bytes)
    read = {}
    second = threading.Thread(
        target=lambda: first_in.wait() and read.update(b=reader.read((0, 1, 0)))
    )
    second.start()
    read["a"] = reader.read((0, 0, 0))
    second.join()
    assert overlapped == [False]
    assert [read["a"], read["b"]] == images


def test_an_empty_classlabel_name_is_one_error_line_naming_the_rows_of_that_class(tmp_path):
    """HF's ClassLabel names ["a", "", "c"]: the rows of class 1 trained as a class of no name
    and printed with no label (class "" is what torchkit calls unlabelled images), exit 0."""
    data = tmp_path / "d.parquet"
    write_parquet(data, [png(i) for i in range(4)], [0, 1, 2, 1], names=["a", "", "c"])
    for command in ("dataset-stats", "train"):
        result = run_torchkit_in_process(command, *(["--data"] if command == "train" else []), data)
        assert result.returncode == 1
        assert error_line(result.stderr).startswith(
            f"Error: {data} has 2 row(s) of class 1, whose ClassLabel name is empty (row 1, 3)"
        )
    write_parquet(data, [png(0)], [0], names=["a", "", "c"])
    assert "name class 1 with an empty name" in error_line(
        run_torchkit_in_process("dataset-stats", data).stderr
    )


def test_an_image_of_a_path_alone_is_unreadable_naming_that_path(tmp_path):
    """HF's Image {bytes: null, path: "x.png"} (a dataset saved without its images embedded)
    was "the row's image is null (no bytes)", which hid the file it names."""
    data = write_parquet(
        tmp_path / "d.parquet", [png(0), None], [0, 1], image_paths=[None, "imgs/x.png"]
    )
    result = run_torchkit_in_process("dataset-stats", data, "--strict", "-j", "0")
    assert result.returncode == 1
    assert "the row's image has no bytes, only a path (imgs/x.png), which torchkit does not " in (
        error_line(result.stderr)
    )


def test_rows_of_paths_alone_read_their_row_group_once_for_their_paths(tmp_path, monkeypatch):
    """A dataset saved without its images embedded has a null image in every row: each row's
    message read its row group again, so dataset-stats of 20,000 such rows took 50 s (2.6 s
    before the path was named), growing with the square of the rows."""

    import torchkit.core.data.sources.parquet as parquet

    count = 40
    paths = [None] + [f"imgs/{i}.png" for i in range(1, count)]
    data = write_parquet(
        tmp_path / "d.parquet", [png(0)] + [None] * (count - 1), None, row_group_size=count,
        image_paths=paths,
    )  # fmt: skip
    reads = counted_row_group_reads(monkeypatch)
    reader = parquet.ParquetImages([str(data)], ["image"])
    assert reader.read((0, 0, 0)) == png(0)
    for row in range(1, count):
        with pytest.raises(parquet.NullImage, match=rf"only a path \(imgs/{row}\.png\)"):
            reader.read((0, 0, row))
    assert len(reads) == 2  # the images, then their paths
