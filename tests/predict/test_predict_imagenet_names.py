"""`torchkit predict` of a model with 1,000 outputs and no class names (an ImageNet model's state
dict as --weights): its outputs named as ImageNet-1k's classes, by torchvision's names, with a
note; never where names are known, for other counts, or for random weights."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from processes import run_torchkit_in_process

from torchkit.core.inference.class_names import imagenet_class_names, output_names_from_data

IMAGENET = list(torchvision.models._meta._IMAGENET_CATEGORIES)
ASSUMED = (
    "its 1000 outputs are assumed to be ImageNet-1k's classes, named as torchvision names them "
    "(otherwise pass --classes with the names of its outputs, in order)"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """resnet18's state dicts, with 1,000 outputs and with 10; photos/ of two unlabelled
    images."""
    root = tmp_path_factory.mktemp("imagenet_names")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18().state_dict(), root / "imagenet.pth")
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), root / "ten.pth")
    rng = np.random.default_rng(0)
    (root / "photos").mkdir()
    for name in ("a.png", "b.png"):
        pixels = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "photos" / name)
    return root


def predict(world, *args: object):
    done = run_torchkit_in_process(
        "predict", "resnet18", world / "photos", "--image-size", 32, "-k", 3, "--format", "json",
        "-j", "0", "--device", "cpu", *args,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_a_state_dict_of_1000_outputs_is_named_as_imagenet(world):
    rows, stderr = predict(world, "--weights", world / "imagenet.pth")
    assert len(IMAGENET) == 1000 and IMAGENET[0] == "tench"
    for row in rows:
        assert row["class"] == IMAGENET[row["class_index"]]
        for rank in (1, 2, 3):
            assert row[f"class_{rank}"] == IMAGENET[row[f"class_index_{rank}"]]
    notes = [line for line in stderr.splitlines() if "class names" in line]
    assert notes == [f"Note: the model records no class names: {ASSUMED}"]


def test_csv_names_them_too(world):
    done = run_torchkit_in_process(
        "predict", "resnet18", "--weights", world / "imagenet.pth", world / "photos",
        "--image-size", 32, "--format", "csv", "-j", "0", "--device", "cpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "path,label,class,class_index,probability,error"
    for line in lines[1:]:
        fields = line.split(",")
        assert fields[2] == IMAGENET[int(fields[3])]


def test_names_given_or_recorded_come_first(world, tmp_path):
    names = [f"thing {index}" for index in range(1000)]
    listed = tmp_path / "names.txt"
    listed.write_text("".join(f"{name}\n" for name in names))
    rows, stderr = predict(world, "--weights", world / "imagenet.pth", "--classes", listed)
    assert all(row["class"] == names[row["class_index"]] for row in rows)
    assert "ImageNet" not in stderr


def test_other_output_counts_keep_their_indices(world):
    rows, stderr = predict(world, "--weights", world / "ten.pth")
    assert all(row["class"] == str(row["class_index"]) for row in rows)
    assert "`class` is the index of its output" in stderr and "ImageNet" not in stderr


def test_random_weights_keep_their_indices(world):
    """A name without --weights (--allow-untrained) was trained on nothing: no names assumed."""
    rows, stderr = predict(world, "--allow-untrained")
    assert all(row["class"] == str(row["class_index"]) for row in rows)
    assert "ImageNet" not in stderr


def test_without_torchvisions_names_the_indices_quietly(world, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision.models._meta", None)  # an import that fails
    assert imagenet_class_names() is None
    rows, stderr = predict(world, "--weights", world / "imagenet.pth")
    assert all(row["class"] == str(row["class_index"]) for row in rows)
    assert "`class` is the index of its output" in stderr and "ImageNet" not in stderr
    assert "Warning" not in stderr


def test_labelled_data_of_as_many_classes_names_them_first():
    data = [f"n{index:08d}" for index in range(1000)]  # ImageNet's folders, sorted
    names, note = output_names_from_data(data, 1000, "val", imagenet=True)
    assert names == data and "named by the classes of val" in note
    names, note = output_names_from_data(["cat", "dog"], 1000, "photos", imagenet=True)
    assert names == IMAGENET
    assert note == (
        "the model records no class names; the 2 classes of photos are not its 1000 outputs, "
        "which are assumed to be ImageNet-1k's classes, named as torchvision names them "
        "(otherwise pass --classes with the names of its outputs, in order)"
    )
    # as many classes as outputs, in an order sorting does not settle (1, 10, 100... as text):
    # they are the outputs' classes, which is which unknown; ImageNet's would contradict them
    numbered = [str(number) for number in range(1, 1001)]
    names, note = output_names_from_data(numbered, 1000, "val", imagenet=True)
    assert names == [str(index) for index in range(1000)]
    assert "is a guess" in note and "ImageNet" not in note
    names, _ = output_names_from_data([], 999, "photos", imagenet=True)
    assert names == [str(index) for index in range(999)]
    names, _ = output_names_from_data([], 1000, "photos")  # random weights: never assumed
    assert names == [str(index) for index in range(1000)]
