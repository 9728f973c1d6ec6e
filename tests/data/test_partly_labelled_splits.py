"""Split data of which one split has images without a label (a CSV index's empty labels, HF's
unlabelled test split): the class "" those images are read as is no class of the labelled splits
eval scores, and train's refusal of a training row without a label names its line."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from nets import TinyNet
from output_checks import error_line
from parquet_files import png, write_parquet
from PIL import Image
from processes import run_torchkit_in_process


def _split_index(folder: Path, empty_label_line: int) -> Path:
    """A split index of 12 images, cat and dog in turn (train 6, val 3, test 3), whose row on
    `empty_label_line` has an empty label (in `folder`/data)."""
    folder = folder / "data"
    folder.mkdir()
    rows = ["path,label,split"]
    for number in range(12):
        Image.new("RGB", (4, 4), (number * 20, 0, 0)).save(folder / f"{number}.png")
        split = "train" if number < 6 else "val" if number < 9 else "test"
        label = "" if number + 2 == empty_label_line else ("cat", "dog")[number % 2]
        rows.append(f"{number}.png,{label},{split}")
    index = folder / "index.csv"
    index.write_text("\n".join(rows) + "\n")
    return index


def test_eval_of_a_labelled_split_beside_a_split_without_labels_scores_the_named_classes(
    tmp_path,
):
    # A model that records no class names, scored on val: the test split's class "" was a
    # third class ('sorted as text they are , cat, dog': refused; shards: 'the model has 2
    # outputs but the data has 3 classes (cat, dog, )').
    index = _split_index(tmp_path, empty_label_line=13)  # a test row
    weights = tmp_path / "tiny.pt"
    torch.save(TinyNet(2).state_dict(), weights)
    scored = run_torchkit_in_process(
        "eval", "--model", "nets:TinyNet", "--weights", weights, "--data", index,
        "--split", "val", "--image-size", "4", "-j", "0", "--format", "json",
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    report = json.loads(scored.stdout)
    assert report["classes"] == ["cat", "dog"] and report["num_classes"] == 2
    assert report["num_images"] == 3
    assert [row["label"] for row in report["per_class"]] == ["cat", "dog"]


def test_train_refuses_a_training_row_without_a_label_naming_its_line(tmp_path):
    # The train split was read unlabelled whole: 'the train split of I has 6 image(s) without
    # a label', one row having none, and no line named (as train.md says it is).
    index = _split_index(tmp_path, empty_label_line=5)
    refused = run_torchkit_in_process(
        "train", "--model", "nets:TinyNet", "--data", index, "--out", tmp_path / "run"
    )
    assert refused.returncode == 1
    line = error_line(refused.stderr)
    assert line.startswith(
        f"Error: the train split of {index} has 1 row(s) without a label (line 5)"
    )
    assert "6 image(s)" not in line
    assert not (tmp_path / "run").exists()


def test_convert_shards_says_what_train_does_with_a_partly_labelled_split(tmp_path):
    # It said train and eval refuse the shards of any split partly labelled, while train reads
    # such a test split unlabelled beside the others and trains on them.
    from torchkit.core.data.sources import open_labelled

    index = _split_index(tmp_path, empty_label_line=13)  # a test row
    out = tmp_path / "shards"
    done = run_torchkit_in_process("convert", "shards", index, out, "-j", "0")
    assert done.returncode == 0, done.stderr
    assert (
        "Warning: 1 of the 3 images of split test have no label: written without one, the "
        "others with theirs (train and eval read such a test split unlabelled: best.pt is not "
        "tested on it)"
    ) in done.stderr.splitlines()
    source, refusal = open_labelled(out)  # what train reads: a test split without labels
    assert refusal is not None and source.classes == ["cat", "dog", ""]
    assert [source.splits[name].has_unlabelled for name in source.splits] == [False, False, True]
    index.write_text(index.read_text().replace("7.png,dog,val", "7.png,,val"))
    done = run_torchkit_in_process("convert", "shards", index, tmp_path / "again", "-j", "0")
    assert done.returncode == 0, done.stderr
    assert (
        "Warning: 1 of the 3 images of split val have no label: written without one, the "
        "others with theirs (train and eval refuse such shards)"
    ) in done.stderr.splitlines()


def test_classes_of_one_name_beside_an_unlabelled_test_split_are_read(tmp_path):
    # HF's ImageNet-1k names two classes "crane" and its test split has no labels: the class
    # "" of that split, added to the others', made them be matched by name, and train,
    # dataset-stats and eval refused the data ('class crane of D (train) is the name of 2 of
    # the model's outputs').
    from torchkit.core.data.sources import open_labelled
    from torchkit.core.evaluate import load_eval_samples

    names = ["crane", "crane", "dog"]
    for split, labels in (("train", [0, 1, 2, 1]), ("validation", [2, 1, 0]), ("test", [-1, -1])):
        images = [png(number) for number in range(len(labels))]
        write_parquet(tmp_path / "data" / f"{split}-00000-of-00001.parquet", images, labels,
                      names=names)  # fmt: skip
    source, refusal = open_labelled(tmp_path)
    assert refusal is not None and source.classes == [*names, ""]
    assert {name: part.labels for name, part in source.splits.items()} == {
        "train": [0, 1, 2, 1],
        "val": [2, 1, 0],
        "test": [3, 3],
    }
    scored = load_eval_samples(str(tmp_path), split="val", classes=names)
    assert scored.samples.classes == names and scored.samples.labels == [2, 1, 0]


def test_dataset_stats_counts_no_class_for_images_without_a_label(tmp_path):
    # The row of the test split's images without a label was counted as a class: 'classes 3'
    # (num_classes 3) for data of cat and dog.
    index = _split_index(tmp_path, empty_label_line=13)  # a test row
    stats = run_torchkit_in_process(
        "dataset-stats", index, "--split", "all", "--no-leakage", "-j", "0", "--format", "json"
    )
    assert stats.returncode == 0, stats.stderr
    report = json.loads(stats.stdout)
    assert [(row["name"], row["images"]) for row in report["classes"]] == [
        ("cat", 6),
        ("dog", 5),
        ("", 1),
    ]
    assert report["num_classes"] == 2
    flat = run_torchkit_in_process(
        "dataset-stats", index.parent, "--no-leakage", "-j", "0", "--format", "json"
    )
    assert flat.returncode == 0, flat.stderr
    assert json.loads(flat.stdout)["num_classes"] == 1  # unlabelled images alone: as before


def test_train_counts_and_names_the_images_without_a_label_of_a_shards_split(tmp_path):
    # A val split of shards of which one sample has no label is read all unlabelled: train's
    # error counted its 3 images, naming none (data.md: it names the first samples).
    import io
    import tarfile

    png_bytes = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(png_bytes, format="PNG")
    data = tmp_path / "shards"
    data.mkdir()
    for split, labels in (("train", ["0", "1", "0", "1"]), ("val", ["0", None, "1"])):
        with tarfile.open(data / f"{split}-000000.tar", "w") as tar:
            for number, label in enumerate(labels):
                members = [("png", png_bytes.getvalue())]
                members += [] if label is None else [("cls", label.encode())]
                for extension, content in members:
                    info = tarfile.TarInfo(f"{split}_{number}.{extension}")
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
    (data / "classes.txt").write_text("cat\ndog\n")
    refused = run_torchkit_in_process(
        "train", "--model", "nets:TinyNet", "--data", data, "--out", tmp_path / "run"
    )
    assert refused.returncode == 1
    assert error_line(refused.stderr).startswith(
        f"Error: the val split of {data} has 1 image(s) without a label "
        "(val-000000.tar/val_1.png) ("
    )


def test_the_refusal_of_a_split_without_labels_names_that_splits_rows(tmp_path):
    # eval --split val named the first file of some rows without a label, the test split's
    # (`Error: D/data/test-00000-of-00001.parquet has 1 row(s) without a label`), where the
    # validation file's rows were those refused; of a CSV index, the lines of every split.
    for split, labels in (("train", [0, 1]), ("validation", [0, None, 1]), ("test", [0, -1])):
        images = [png(number) for number in range(len(labels))]
        write_parquet(tmp_path / "hf" / "data" / f"{split}-00000-of-00001.parquet", images,
                      labels, names=["cat", "dog"])  # fmt: skip
    index = _split_index(tmp_path, empty_label_line=10)  # a val row
    index.write_text(index.read_text().replace("11.png,dog,test", "11.png,,test"))
    weights = tmp_path / "tiny.pt"
    torch.save(TinyNet(2).state_dict(), weights)
    for data, named in (
        (tmp_path / "hf", "1 image(s) without a label (data/validation-00000-of-00001.parquet/1)"),
        (index, "1 row(s) without a label (line 10)"),
    ):
        for command in (
            ["eval", "--model", "nets:TinyNet", "--weights", weights, "--split", "val"],
            ["train", "--model", "nets:TinyNet", "--out", tmp_path / "run"],
        ):
            refused = run_torchkit_in_process(*command, "--data", data, "-j", "0")
            assert refused.returncode == 1
            assert error_line(refused.stderr).startswith(
                f"Error: the val split of {data} has {named} ("
            ), command
            # Not first "Warning: ... its images are read unlabelled" of val's and test's
            # files: no image is read.
            assert "are read unlabelled" not in refused.stderr, command


def test_eval_of_the_held_out_val_split_warns_of_a_train_row_without_a_label(tmp_path, caplog):
    # Without a test split, eval of a run's data scores the val split the run held out; a
    # train row without a label (the index edited since) was read unlabelled without its
    # warning, which eval --split val gave: the warnings were kept back whenever any split
    # had such images, as if every split were scored.
    import logging

    from torchkit.core.evaluate import load_eval_samples

    index = _split_index(tmp_path, empty_label_line=5)  # a train row
    index.write_text(index.read_text().replace(",test\n", ",val\n"))  # train and val only
    recorded = {"kind": "csv index", "root": str(index.parent)}
    for split in (None, "val"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="torchkit"):
            scored = load_eval_samples(str(index), split=split, recorded=recorded)
        assert scored.split == "val" and len(scored.samples) == 6
        warned = [r.getMessage() for r in caplog.records if "read unlabelled" in r.getMessage()]
        assert warned == [
            f"{index} has 1 row(s) without a label (line 5) among 11 labelled ones: the images "
            "of its train split are read unlabelled"
        ], split


def test_eval_refusal_of_the_held_out_val_split_names_that_split(tmp_path):
    # Without a test split, eval of a run's data scores the val split the run held out; a val
    # row without a label was refused as 'the test split of I has no labels: I has 1 row(s)
    # with an empty label (line 9)', a split the data does not have.
    import pytest

    from torchkit.core.evaluate import load_eval_samples
    from torchkit.core.io.errors import InputError

    index = _split_index(tmp_path, empty_label_line=9)  # a val row
    index.write_text(index.read_text().replace(",test\n", ",val\n"))  # train and val only
    recorded = {"kind": "csv index", "root": str(index.parent)}
    with pytest.raises(InputError) as refused:
        load_eval_samples(str(index), recorded=recorded)
    assert str(refused.value) == (
        f"the val split of {index} has 1 row(s) without a label (line 9) (--split train scores "
        "a labelled split; predict reads unlabelled images)"
    )
