"""Two classes of one name (ImageNet's two `crane`s; labels are indices) show as `crane (#0)` and
`crane (#2)` in every table, CSV file and plot, by one rule (`shown_class_names`): eval's
confusion matrix, confusion_pairs.csv and predictions.csv, dataset-stats' classes, train's
split.csv, extract-features' index.csv and predict's rows showed the bare name, so the two
classes could not be told apart. JSON keeps the name, with the index beside it."""

from __future__ import annotations

import csv
import io
import json
import tarfile
from pathlib import Path

import pytest
from checkpoints import write_constant_convnet_checkpoint
from parquet_files import png
from processes import run_torchkit_in_process

from torchkit.core.data.sources.samples import Samples, shown_class_names

NAMES = ["crane", "b", "crane", "c"]  # classes 0 and 2 share a name
SHOWN = ["crane (#0)", "b", "crane (#2)", "c"]
LABELS = [0, 0, 2, 1]  # one image a sample, in this order


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """FOLDER/s-000000.tar of 8x8 PNGs labelled by KEY.cls, beside classes.txt naming NAMES."""
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "classes.txt").write_text("".join(f"{name}\n" for name in NAMES))
    with tarfile.open(folder / "s-000000.tar", "w") as tar:
        for seed, label in enumerate(LABELS):
            for member, data in ((f"k{seed}.png", png(seed)), (f"k{seed}.cls", b"%d" % label)):
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return folder


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A convnet of NAMES' outputs that takes every image for output 2, the second crane."""
    path = tmp_path / "model.pt"
    write_constant_convnet_checkpoint(path, image_size=8, classes=NAMES, logits=[0, 0, 5, 1])
    return path


def csv_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_a_name_two_classes_share_is_shown_with_its_index_and_others_as_they_are():
    assert shown_class_names(NAMES) == SHOWN
    assert shown_class_names(["a", "b"]) == ["a", "b"]
    # One name in two Unicode spellings prints alike: told apart as well.
    assert shown_class_names(["caf\u00e9", "cafe\u0301"]) == ["caf\u00e9 (#0)", "cafe\u0301 (#1)"]


def test_eval_files_name_the_two_classes_apart(tmp_path, shards, model, monkeypatch):
    from torchkit.core.evaluate import reports

    out = tmp_path / "out"
    found = run_torchkit_in_process("eval", model, "--data", shards, "-j", "0", "--out", out)
    assert found.returncode == 0, found.stderr
    matrix = csv_rows((out / "confusion_matrix.csv").read_text())
    assert matrix[0] == ["true \\ predicted", *SHOWN]
    assert [row[0] for row in matrix[1:]] == SHOWN
    assert matrix[1][1:] == ["0", "0", "2", "0"] and matrix[3][1:] == ["0", "0", "1", "0"]
    predictions = list(csv.DictReader(io.StringIO((out / "predictions.csv").read_text())))
    assert [row["label"] for row in predictions] == ["crane (#0)", "crane (#0)", "crane (#2)", "b"]
    assert {row["class"] for row in predictions} == {"crane (#2)"}
    assert {row["class_2"] for row in predictions} == {"c"}
    per_class = csv_rows((out / "per_class.csv").read_text())
    assert [row[0] for row in per_class[1:]] == SHOWN
    # JSON: the name as it is, and the index beside it.
    metrics = json.loads((out / "metrics.json").read_text())
    assert [(row["label"], row["index"]) for row in metrics["per_class"]] == [
        (name, index) for index, name in enumerate(NAMES)
    ]
    # Above the dense matrix's limit the non-zero cells are listed: by the same names.
    monkeypatch.setattr(reports, "DENSE_CONFUSION_MAX_CLASSES", 2)
    pairs_out = tmp_path / "pairs"
    found = run_torchkit_in_process("eval", model, "--data", shards, "-j", "0", "--out", pairs_out)
    assert found.returncode == 0, found.stderr
    assert csv_rows((pairs_out / "confusion_pairs.csv").read_text()) == [
        ["true", "predicted", "count"],
        ["crane (#0)", "crane (#2)", "2"],
        ["b", "crane (#2)", "1"],
        ["crane (#2)", "crane (#2)", "1"],
    ]


def test_dataset_stats_counts_the_two_classes_apart_in_every_format(shards):
    table = run_torchkit_in_process("dataset-stats", shards, "-j", "0")
    assert table.returncode == 0, table.stderr
    assert "crane (#0)" in table.stdout and "crane (#2)" in table.stdout
    found = run_torchkit_in_process("dataset-stats", shards, "-j", "0", "--format", "json")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["classes"] == [
        {"name": "crane", "index": 0, "images": 2},
        {"name": "b", "index": 1, "images": 1},
        {"name": "crane", "index": 2, "images": 1},
        {"name": "c", "index": 3, "images": 0},
    ]
    found = run_torchkit_in_process("dataset-stats", shards, "-j", "0", "--format", "csv")
    assert found.returncode == 0, found.stderr
    rows = [row for row in csv_rows(found.stdout) if row[0] == "class"]
    assert rows == [["class", name, count] for name, count in zip(SHOWN, "2110", strict=True)]


def test_dataset_stats_warns_of_an_empty_class_whose_name_another_class_has(caplog):
    from torchkit.core.stats.run import warn_empty_classes

    # The second crane holds no image: counted by name, the first crane's images hid it.
    samples = Samples(classes=NAMES, labels=[0, 1, 3])
    assert warn_empty_classes(samples) == ["crane (#2)"]


def test_train_split_csv_labels_the_two_classes_apart(tmp_path):
    from torchkit.core.data.sources import write_split_csv

    train = Samples(classes=NAMES, labels=[0, 2], ids=["a.png", "b.png"])
    val = Samples(classes=NAMES, labels=[1], ids=["c.png"])
    path = write_split_csv(tmp_path / "split.csv", {"train": train, "val": val})
    assert csv_rows(path.read_text()) == [
        ["path", "label", "split"],
        ["a.png", "crane (#0)", "train"],
        ["b.png", "crane (#2)", "train"],
        ["c.png", "b", "val"],
    ]


def test_extract_features_index_labels_the_two_classes_apart(tmp_path, shards, model):
    out = tmp_path / "features"
    found = run_torchkit_in_process("extract-features", model, shards, out, "-j", "0")
    assert found.returncode == 0, found.stderr
    index = list(csv.DictReader(io.StringIO((out / "index.csv").read_text())))
    assert [row["label"] for row in index] == ["crane (#0)", "crane (#0)", "crane (#2)", "b"]


def test_predict_rows_name_the_two_classes_apart(shards, model):
    found = run_torchkit_in_process(
        "predict", model, shards, "-j", "0", "--topk", "2", "--format", "csv"
    )
    assert found.returncode == 0, found.stderr
    rows = list(csv.DictReader(io.StringIO(found.stdout)))
    assert [row["label"] for row in rows] == ["crane (#0)", "crane (#0)", "crane (#2)", "b"]
    assert {(row["class"], row["class_index"], row["class_2"]) for row in rows} == {
        ("crane (#2)", "2", "c")
    }
    # JSON: the names as they are, the index beside the predicted class.
    found = run_torchkit_in_process("predict", model, shards, "-j", "0", "--format", "json")
    assert found.returncode == 0, found.stderr
    rows = json.loads(found.stdout)
    assert [row["label"] for row in rows] == ["crane", "crane", "crane", "b"]
    assert {(row["class"], row["class_index"]) for row in rows} == {("crane", 2)}


def test_train_names_which_of_two_classes_of_one_name_has_no_images(tmp_path, shards):
    """ "class 'crane' has no images" said neither which crane nor, by name, that the other
    one has some. A class classes.txt names that no image has is kept (its index is the
    data's), with a warning naming it."""
    (shards / "classes.txt").write_text("crane\nb\nc\ncrane\n")  # class 3, a crane, is empty
    found = run_torchkit_in_process(
        "train", "--data", shards, "--model", "nets:TinyNet", "--image-size", "8",
        "--workers", "0", "--epochs", "1", "--val-split", "0.5", "--out", tmp_path / "run",
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert f"Warning: class 'crane (#3)' has no images in {shards}: kept" in found.stderr


def test_train_names_which_of_two_classes_of_one_name_was_never_read():
    from torchkit.core.train.loaders import classes_never_read

    train = Samples(classes=NAMES, labels=[0, 2, 1], paths=["a.png", "b.png", "c.png"])
    assert classes_never_read(train, ["b.png: cannot identify image file"]) == {
        "crane (#2)": "b.png"
    }
