"""A CSV index of which only some rows have a label follows the rule of partly labelled shards and
parquet files: the commands that need no labels (dataset-stats, predict, extract-features) read
it with the labels it has, where every command refused it; train and eval still refuse it. Its
image folders are inputs no output may land in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from output_checks import torchkit_log_to_caplog
from PIL import Image
from processes import run_torchkit_in_process

from torchkit.core.data.sources import csv_samples
from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.io.errors import InputError


def _partly_labelled_index(folder: Path) -> Path:
    images = folder / "images"
    images.mkdir(parents=True)
    for index in range(4):
        Image.new("RGB", (4, 4), (index * 50, 0, 0)).save(images / f"{index}.png")
    index = folder / "index.csv"
    index.write_text(
        "path,label\nimages/0.png,cat\nimages/1.png,\nimages/2.png,dog\nimages/3.png,\n"
    )
    return index


def test_a_partly_labelled_index_is_read_where_no_labels_are_needed(tmp_path):
    # dataset-stats read it all unlabelled (one row of 4 images, with a warning): the class
    # counts of the labelled rows were lost. They are counted, the rows without a label in a
    # row of their own, as predict and extract-features keep each label.
    index = _partly_labelled_index(tmp_path)
    done = run_torchkit_in_process("dataset-stats", index, "-j", "0", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["classes"] == [
        {"name": "cat", "index": 0, "images": 1},
        {"name": "dog", "index": 1, "images": 1},
        {"name": "", "index": 2, "images": 2},
    ]
    assert report["num_classes"] == 2
    with pytest.raises(InputError) as refused:  # train's and eval's reader
        csv_samples(index)
    assert str(refused.value) == (
        f"{index} has 2 row(s) with an empty label (line 3, 5) (every row needs a path and a "
        "label; predict, extract-features and dataset-stats read images without one unlabelled)"
    )


def test_train_and_eval_refuse_it_without_a_warning_that_its_images_are_read(tmp_path):
    # Their refusal followed "Warning: I has 2 row(s) without a label ...: its images are read
    # unlabelled", of a second read that finds no split to read so.
    index = _partly_labelled_index(tmp_path)
    refused = run_torchkit_in_process(
        "train", "--model", "nets:TinyNet", "--data", index, "--out", tmp_path / "run"
    )
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"Error: {index} has 2 row(s) with an empty label (line 3, 5) (every row needs a path "
        "and a label; predict, extract-features and dataset-stats read images without one "
        "unlabelled)"
    ]


def test_the_image_folders_of_a_partly_labelled_index_are_inputs(tmp_path):
    # The overlap checks read the index as the commands that take unlabelled images do: one of
    # some empty labels gave no folders, so an output could be written among its images.
    index = _partly_labelled_index(tmp_path)
    assert [item.path for item in data_inputs(index)] == [index, tmp_path / "images"]


def test_of_a_split_index_only_the_split_holding_rows_without_a_label_is_unlabelled(
    tmp_path, caplog, monkeypatch
):
    # As of split parquet files and shards: an unlabelled test split leaves train and val
    # labelled, which train trains on (without testing best.pt); train or val is refused.
    from torchkit.core.data.sources import open_labelled

    for index in range(5):
        Image.new("RGB", (4, 4), (index * 50, 0, 0)).save(tmp_path / f"{index}.png")
    index = tmp_path / "index.csv"
    index.write_text(
        "path,label,split\n0.png,cat,train\n1.png,dog,train\n2.png,cat,val\n3.png,,test\n"
        "4.png,dog,test\n"
    )
    torchkit_log_to_caplog(caplog, monkeypatch)
    with caplog.at_level("WARNING", logger="torchkit"):
        source, refusal = open_labelled(index)
    assert (
        f"{index} has 1 row(s) without a label (line 5) among 4 labelled ones: the images of "
        "its test split are read unlabelled"
    ) in caplog.messages
    assert refusal is not None and "1 row(s) with an empty label (line 5)" in str(refusal)
    assert source.classes == ["cat", "dog", ""]
    assert {name: (part.labels, part.has_unlabelled) for name, part in source.splits.items()} == {
        "train": ([0, 1], False),
        "val": ([0], False),
        "test": ([2, 2], True),
    }


def _stats_of_rows(folder: Path, rows: str) -> tuple[Path, list[tuple[str, int]], list[str]]:
    """(the index, dataset-stats' (class, images), its stderr lines) of an index of `rows`
    (after the header) naming `{i}.png`, each made in `folder`."""
    index = folder / "index.csv"
    index.write_text("path,label\n" + rows)
    for number in range(rows.count("\n")):  # no channel of one value: no warning of it
        colour = (number * 50, number * 20, 255 - number * 30)
        Image.new("RGB", (4, 4), colour).save(folder / f"{number}.png")
    done = run_torchkit_in_process("dataset-stats", index, "-j", "0", "--format", "json")
    assert done.returncode == 0, done.stderr
    classes = [(c["name"], c["images"]) for c in json.loads(done.stdout)["classes"]]
    return index, classes, done.stderr.splitlines()


def test_a_row_without_a_label_beside_a_row_of_its_file_with_one_is_no_second_label(tmp_path):
    # Every command refused it: "gives '0.png' two labels: 'cat' in line 2 and '' in line 4".
    rows = "0.png,\n1.png,dog\n2.png,cat\n0.png,cat\n"
    index, classes, said = _stats_of_rows(tmp_path, rows)
    assert classes == [("cat", 2), ("dog", 1)]
    assert said == [
        f"Warning: {index} lists 1 row(s) without a label beside a row of the same image with "
        "one (lines 2 and 5): an empty label is no second label: each image is read with that "
        "label"
    ]
    samples = csv_samples(index)  # train's and eval's reader: every image has its label
    assert (samples.ids, samples.labels) == (["0.png", "1.png", "2.png"], [0, 1, 0])
    # Two labels are still two labels, named by the rows that give them.
    index.write_text("path,label\n0.png,\n1.png,dog\n0.png,cat\n0.png,dog\n")
    with pytest.raises(InputError) as refused:
        csv_samples(index, allow_unlabelled=True)
    assert str(refused.value) == (
        f"{index} gives '0.png' two labels: 'cat' in line 4 and 'dog' in line 5 (an image has "
        "one label: fix or remove one of the rows)"
    )


def test_rows_without_a_label_around_the_labelled_row_of_their_image_are_named_by_it(tmp_path):
    # Blank, cat, blank: the warning counted "2 image(s)" of one image and named "lines 2 and
    # 6" for the second blank row, two rows without a label, not the cat row of line 4.
    index, classes, said = _stats_of_rows(tmp_path, "0.png,\n1.png,dog\n0.png,cat\n0.png,\n")
    assert classes == [("cat", 1), ("dog", 1)]
    assert said == [
        f"Warning: {index} lists 2 row(s) without a label beside a row of the same image with "
        "one (lines 2 and 4, lines 4 and 5): an empty label is no second label: each image is "
        "read with that label"
    ]
