"""Data of which only some samples have a label (shards, parquet rows, CSV rows): predict and
extract-features read it all unlabelled, so their `label` column was empty in every row, also of
the samples that have one. Each row now carries its sample's label, empty where it has none, as
`convert shards` keeps them."""

from __future__ import annotations

import csv
import json

import pytest
from checkpoints import write_convnet_checkpoint
from output_checks import error_line
from partly_labelled import KINDS, partly_labelled_source
from processes import run_torchkit_in_process

LABELS = ["cat", None, "dog", "cat", None]
NAMES = ["cat", "dog"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_row_has_its_samples_label_and_none_where_it_has_none(tmp_path, kind):
    data = partly_labelled_source(kind, tmp_path / "data", LABELS, NAMES)
    model = tmp_path / "model.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes=NAMES)

    predicted = run_torchkit_in_process("predict", model, data, "-j", "0", "--format", "json")
    assert predicted.returncode == 0, predicted.stderr
    rows = json.loads(predicted.stdout)
    assert [(row["label"], row["label_index"]) for row in rows] == [
        (None, None) if label is None else (label, NAMES.index(label)) for label in LABELS
    ]
    assert "read unlabelled" not in predicted.stderr  # no label is dropped to be warned of

    out = tmp_path / "features"
    extracted = run_torchkit_in_process(
        "extract-features", model, data, out, "-l", "logits", "-j", "0"
    )
    assert extracted.returncode == 0, extracted.stderr
    with open(out / "index.csv", newline="") as index:
        assert [row["label"] for row in csv.DictReader(index)] == [x or "" for x in LABELS]
    # An empty field, as of unlabelled images (not a quoted "").
    assert (out / "index.csv").read_text().splitlines()[2].split(",")[2] == ""


def test_resume_over_other_labels_of_the_same_images_says_labels(tmp_path):
    # The labels are part of what --resume matches (index.csv's column would be mixed): the
    # refusal named "another model, layers, options or images", none of which differed.
    data = partly_labelled_source("csv", tmp_path / "data", LABELS, NAMES)
    model = tmp_path / "model.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes=NAMES)
    out = tmp_path / "features"
    args = ("extract-features", model, data, out, "-l", "logits", "-j", "0")
    assert run_torchkit_in_process(*args).returncode == 0
    data.write_text(data.read_text().replace("1.png,", "1.png,dog"))
    resumed = run_torchkit_in_process(*args, "--resume")
    assert resumed.returncode == 2
    assert error_line(resumed.stderr).startswith(
        f"Error: {out} holds a finished extraction with another model, layers, options, images "
        "or labels ("
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_without_class_names_is_named_by_the_classes_of_the_labelled_samples(
    tmp_path, kind
):
    # The class "" of the samples without a label made predict name the outputs by index
    # (`class` 0 beside `label` cat), where eval names them by the data's classes.
    import torch
    from nets import TinyNet

    data = partly_labelled_source(kind, tmp_path / "data", LABELS, NAMES)
    weights = tmp_path / "tiny.pt"
    torch.save(TinyNet(2).state_dict(), weights)
    predicted = run_torchkit_in_process(
        "predict", "nets:TinyNet", data, "--weights", weights, "--image-size", "4", "-j", "0",
        "--format", "json",
    )  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    assert "its outputs are named by the classes of" in predicted.stderr
    rows = json.loads(predicted.stdout)
    assert {row["class"] for row in rows} <= set(NAMES)
    assert [row["class"] for row in rows] == [NAMES[row["class_index"]] for row in rows]
