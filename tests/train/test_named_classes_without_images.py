"""`train` on data that states its classes (HF's ClassLabel names, classes.txt beside shards)
naming a class no image has: a dataset filtered to some classes keeps the names of all, shards
of part of ImageNet keep its 1,000 indices. It was refused ("class 'c' has no training images
(add images to the folder or remove it)"): there is no folder, and no class can be left out
without rewriting every label. The class is kept, an output no image is labelled with, with one
warning. A class that another split has images of is still refused, with a hint that fits data
without folders."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from output_checks import error_line
from parquet_files import png, write_parquet
from processes import run_torchkit_in_process
from tar_members import tar_of_members

TINY = ["--model", "nets:TinyNet", "--image-size", "8", "--workers", "0", "--epochs", "1"]
WARNING = (
    "Warning: class 'c' has no images in {data}: kept as an output no image is labelled with, "
    "as the data's class names (or indices) include it"
)


def _shards(folder, split: str, labels: list[int], seed: int) -> None:
    folder.mkdir(exist_ok=True)
    members = []
    for number, label in enumerate(labels):
        members += [(f"s{number}.png", png(seed + number)), (f"s{number}.cls", b"%d" % label)]
    tar_of_members(folder / f"{split}-000000.tar", members)
    (folder / "classes.txt").write_text("a\nb\nc\n")


@pytest.mark.parametrize("kind", ["parquet", "shards"])
def test_a_named_class_no_split_has_an_image_of_is_kept_with_a_warning(tmp_path, kind):
    data = tmp_path / "ds"
    train, val = [0, 1] * 4, [0, 1]
    if kind == "parquet":
        write_parquet(
            data / "data" / "train-00000-of-00001.parquet", [png(i) for i in range(8)], train
        )
        write_parquet(data / "data" / "validation-00000-of-00001.parquet", [png(50), png(51)], val)
    else:
        _shards(data, "train", train, 0)
        _shards(data, "val", val, 50)
    result = run_torchkit_in_process("train", "--data", data, *TINY, "--out", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert warnings == [WARNING.format(data=data)]
    checkpoint = torch.load(tmp_path / "run" / "best.pt", weights_only=True)
    assert checkpoint["classes"] == ["a", "b", "c"] and checkpoint["num_classes"] == 3


def test_a_class_of_a_csv_index_with_val_images_only_is_refused_with_a_hint_without_folders(
    tmp_path,
):
    data = tmp_path / "data"
    data.mkdir()
    rows = [(f"t{i}.png", "ab"[i % 2], "train") for i in range(6)]
    rows += [("v0.png", "a", "val"), ("v1.png", "c", "val")]
    for number, (name, _, _) in enumerate(rows):
        (data / name).write_bytes(png(number))
    with (data / "index.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([("path", "label", "split"), *rows])
    result = run_torchkit_in_process(
        "train", "--data", data / "index.csv", *TINY, "--out", tmp_path / "run"
    )
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        "Error: class 'c' has no training images (add training images, or remove the class's "
        "images from the other splits)"
    )
    assert not (tmp_path / "run").exists()


def test_balanced_class_weights_weigh_kept_classes_without_images_as_classes_of_average_size(
    tmp_path,
):
    """`--class-weights balanced` with kept classes of no image: scikit-learn's rule over the
    classes with training images, each kept one weighs 1 (it stopped the run with
    '--class-weights balanced: a class has no training images', naming none). The one warning
    speaks of them in the plural (it read 'kept as an output ... include it')."""
    from sklearn.utils.class_weight import compute_class_weight

    data = tmp_path / "ds"
    train, names = [0, 1, 1, 0, 1, 1, 0, 1], ("a", "b", "c", "d")
    images = [png(i) for i in range(8)]
    write_parquet(data / "data" / "train-00000-of-00001.parquet", images, train, names=names)
    write_parquet(
        data / "data" / "validation-00000-of-00001.parquet", [png(50), png(51)], [0, 1], names=names
    )
    run = tmp_path / "run"
    result = run_torchkit_in_process(
        "train", "--data", data, *TINY, "--class-weights", "balanced", "--out", run
    )
    assert result.returncode == 0, result.stderr
    expected = compute_class_weight("balanced", classes=np.array([0, 1]), y=np.array(train))
    recorded = json.loads((run / "config.json").read_text())["class_weights"]
    assert recorded == pytest.approx([*expected, 1.0, 1.0])
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert warnings == [
        f"Warning: class 'c', 'd' have no images in {data}: kept as outputs no image is labelled"
        " with, as the data's class names (or indices) include them"
    ]


def test_a_named_class_with_val_images_only_is_refused_beside_one_kept_without_any(tmp_path):
    """Parquet naming 'c', which only val has images of, and 'd', which no split has: 'd' is
    kept with the warning, 'c' refused with the hint for data without folders."""
    data = tmp_path / "ds"
    names = ("a", "b", "c", "d")
    write_parquet(
        data / "data" / "train-00000-of-00001.parquet",
        [png(i) for i in range(4)],
        [0, 1, 0, 1],
        names=names,
    )
    write_parquet(
        data / "data" / "validation-00000-of-00001.parquet",
        [png(50), png(51), png(52)],
        [0, 1, 2],
        names=names,
    )
    result = run_torchkit_in_process("train", "--data", data, *TINY, "--out", tmp_path / "run")
    assert result.returncode == 1
    assert error_line(result.stderr, besides="warnings") == (
        "Error: class 'c' has no training images (add training images, or remove the class's "
        "images from the other splits)"
    )
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert warnings == [WARNING.format(data=data).replace("'c'", "'d'")]
    assert not (tmp_path / "run").exists()
