"""`torchkit predict` of a model that records no class names over several IMAGES, or partly
labelled data beside other IMAGES: the outputs are named as one input of all their images would
name them. The labelled inputs' classes together, where they are as many as the outputs (two
folders of 500 ImageNet classes each, a labelled folder beside an image file), name them in
sorted order or in the one order the inputs state, where ImageNet-1k's names were assumed beside
a `label` column that contradicted them (and a model of as many outputs as their classes got
indices); fewer classes than 1,000 outputs leave ImageNet's names assumed, with the note one
labelled folder gets."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import torch
import torchvision
from nets import TinyNet
from partly_labelled import partly_labelled_source, png
from processes import run_torchkit_in_process

IMAGENET = list(torchvision.models._meta._IMAGENET_CATEGORIES)
SYNSETS = [f"n{index:08d}" for index in range(1000)]  # folders as ImageNet's, sorted


def image_folder(root: Path, classes: list[str]) -> Path:
    """An image folder of one 4x4 image in each of `classes`."""
    for name in classes:
        (root / name).mkdir(parents=True)
        (root / name / "a.png").write_bytes(png(1))
    return root


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """TinyNet's state dicts of 1,000 outputs and of 3; ImageNet's 1,000 classes as two
    folders of 500 (half1/, half2/), as a CSV index of which one row has no label
    (partly.csv) and as one folder with an image beside its class folders (whole/, which
    predict reads whole, unlabelled); photo.png, unlabelled."""
    root = tmp_path_factory.mktemp("names_inputs")
    torch.manual_seed(0)
    torch.save(TinyNet(1000).state_dict(), root / "thousand.pt")
    torch.save(TinyNet(3).state_dict(), root / "three.pt")
    image_folder(root / "half1", SYNSETS[:500])
    image_folder(root / "half2", SYNSETS[500:])
    (root / "photo.png").write_bytes(png(2))
    image_folder(root / "whole", SYNSETS)
    (root / "whole" / "cover.png").write_bytes(png(3))
    lines = ["path,label", "photo.png,"] + [f"half1/{n}/a.png,{n}" for n in SYNSETS[:500]]
    lines += [f"half2/{name}/a.png,{name}" for name in SYNSETS[500:]]
    (root / "partly.csv").write_text("\n".join(lines) + "\n")
    return root


def predict(weights: Path, *images: object) -> tuple[list[dict], str]:
    done = run_torchkit_in_process(
        "predict", "nets:TinyNet", "--weights", weights, *images, "--image-size", 4,
        "--format", "json", "-j", "0", "--device", "cpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if "class names" in line]
    assert len(notes) == 1, done.stderr
    return json.loads(done.stdout), notes[0]


@pytest.mark.parametrize(
    "inputs",
    [
        ("half1", "half2"),  # two folders whose classes together are the outputs
        ("partly.csv", "photo.png"),  # partly labelled data of 1,000 classes and an image file
    ],
)
def test_the_classes_of_several_inputs_that_are_the_outputs_name_them(world, inputs):
    rows, note = predict(world / "thousand.pt", *(world / item for item in inputs))
    assert rows and all(row["class"] == SYNSETS[row["class_index"]] for row in rows)
    assert note == (
        "Note: the model records no class names: its outputs are named by the classes of IMAGES "
        "in sorted order, as eval names them (--classes names them otherwise)"
    )
    labelled = [row for row in rows if row["label"] is not None]
    assert len(labelled) == 1000 and {row["label"] for row in labelled} == set(SYNSETS)


def test_an_image_file_beside_labelled_inputs_changes_no_name(world):
    alone, alone_note = predict(world / "thousand.pt", world / "half1", world / "half2")
    rows, note = predict(
        world / "thousand.pt", world / "half1", world / "half2", world / "photo.png"
    )
    assert [row["class"] for row in rows[:-1]] == [row["class"] for row in alone]
    assert rows[-1]["label"] is None and rows[-1]["class"] == SYNSETS[rows[-1]["class_index"]]
    assert note == alone_note


def test_fewer_classes_than_outputs_assume_imagenet_with_the_note_of_one_folder(tmp_path, world):
    cats = image_folder(tmp_path / "cats", ["cat", "dog"])
    birds = image_folder(tmp_path / "birds", ["bird", "cat"])
    rows, note = predict(world / "thousand.pt", cats, birds, world / "photo.png")
    assert all(row["class"] == IMAGENET[row["class_index"]] for row in rows)
    assert [row["label"] for row in rows] == ["cat", "dog", "bird", "cat", None]
    assert note == (
        "Note: the model records no class names; the 3 classes of IMAGES are not its 1000 "
        "outputs, which are assumed to be ImageNet-1k's classes, named as torchvision names "
        "them (otherwise pass --classes with the names of its outputs, in order)"
    )
    _, one = predict(world / "thousand.pt", cats)  # the reference: one labelled folder
    assert one == note.replace("3 classes of IMAGES", f"2 classes of {cats}")


def test_several_inputs_of_as_many_classes_as_outputs_name_them_in_sorted_order(tmp_path, world):
    # as one folder of bird/, cat/ and dog/ would (they were the outputs' indices)
    cats = image_folder(tmp_path / "cats", ["cat", "dog"])
    birds = image_folder(tmp_path / "birds", ["bird", "cat"])
    rows, note = predict(world / "three.pt", cats, birds)
    assert [row["label"] for row in rows] == ["cat", "dog", "bird", "cat"]
    assert all(row["class"] == ["bird", "cat", "dog"][row["class_index"]] for row in rows)
    assert "named by the classes of IMAGES in sorted order" in note


def test_numbered_classes_of_several_inputs_are_a_guess(tmp_path, world):
    # 1, 10, 2 as folders sort them; 1, 2, 10 as numbers: which output is which is unknown
    ones = image_folder(tmp_path / "ones", ["1", "2"])
    tens = image_folder(tmp_path / "tens", ["10"])
    rows, note = predict(world / "three.pt", ones, tens)
    assert all(row["class"] == str(row["class_index"]) for row in rows)
    assert note == (
        "Note: the model records no class names: `class` is the index of its output; which of "
        "its outputs is which class of IMAGES is a guess: sorted as text they are 1, 10, 2, as "
        "numbers 1, 2, 10 (pass --classes with the names of its outputs, in order)"
    )


def test_inputs_that_state_their_class_order_name_the_outputs_so_unless_they_differ(tmp_path):
    # shards with classes.txt state their label order (dog before cat): sorting does not apply
    weights = tmp_path / "two.pt"
    torch.save(TinyNet(2).state_dict(), weights)
    first = partly_labelled_source("shards", tmp_path / "first", ["dog", "cat"], ["dog", "cat"])
    second = partly_labelled_source("shards", tmp_path / "second", ["cat"], ["dog", "cat"])
    rows, note = predict(weights, first, second)
    assert [row["label"] for row in rows] == ["dog", "cat", "cat"]
    assert all(row["class"] == ["dog", "cat"][row["class_index"]] for row in rows)
    assert note == (
        "Note: the model records no class names: its outputs are named by the classes of IMAGES "
        "in the label order they state, as eval names them (--classes names them otherwise)"
    )

    other = partly_labelled_source("shards", tmp_path / "other", ["cat"], ["cat", "dog"])
    rows, note = predict(weights, first, other)
    assert [row["label"] for row in rows] == ["dog", "cat", "cat"]
    assert all(row["class"] == str(row["class_index"]) for row in rows)
    assert note == (
        "Note: the model records no class names: `class` is the index of its output; the "
        "inputs of IMAGES give their classes in different orders (pass --classes with the "
        "names of its outputs, in order)"
    )


def test_an_order_stated_of_some_of_the_classes_of_several_inputs_leaves_it_unknown(tmp_path):
    # dog before cat, stated; where bird, another input's class, goes is not: not sorted either
    weights = tmp_path / "three.pt"
    torch.save(TinyNet(3).state_dict(), weights)
    first = partly_labelled_source("shards", tmp_path / "first", ["dog", "cat"], ["dog", "cat"])
    birds = image_folder(tmp_path / "birds", ["bird"])
    rows, note = predict(weights, first, birds)
    assert [row["label"] for row in rows] == ["dog", "cat", "bird"]
    assert all(row["class"] == str(row["class_index"]) for row in rows)
    assert note == (
        "Note: the model records no class names: `class` is the index of its output; no input "
        "of IMAGES states an order of all their classes (pass --classes with the names of its "
        "outputs, in order)"
    )


def test_label_index_of_several_inputs_counts_in_its_own_input(world):
    # the outputs are named by both folders' classes; each label indexes its own folder's
    rows, _ = predict(world / "thousand.pt", world / "half1", world / "half2")
    assert [row["label"] for row in rows] == SYNSETS
    assert [row["label_index"] for row in rows] == [*range(500), *range(500)]


def test_a_folder_with_images_beside_its_class_folders_names_them_as_eval_does(world):
    # read whole, unlabelled (every image, no `label`), where eval reads its class folders
    rows, note = predict(world / "thousand.pt", world / "whole")
    assert len(rows) == 1001 and all(row["label"] is None for row in rows)
    assert all(row["class"] == SYNSETS[row["class_index"]] for row in rows)
    assert note == (
        f"Note: the model records no class names: its outputs are named by the classes of "
        f"{world / 'whole'} in sorted order, as eval names them (--classes names them otherwise)"
    )
    rows, note = predict(world / "thousand.pt", world / "whole", world / "photo.png")
    assert all(row["class"] == SYNSETS[row["class_index"]] for row in rows)
    assert "named by the classes of IMAGES in sorted order" in note


@pytest.mark.parametrize("packed", [False, True], ids=["folder", "tar"])
def test_fewer_class_folders_beside_images_are_those_of_one_labelled_folder(
    tmp_path, world, packed
):
    folder = image_folder(tmp_path / "pets", ["cat", "dog"])
    (folder / "cover.png").write_bytes(png(3))
    if packed:
        with tarfile.open(tmp_path / "pets.tar", "w") as tar:
            tar.add(folder, arcname="pets")
        folder = tmp_path / "pets.tar"
    weights = tmp_path / "two.pt"
    torch.save(TinyNet(2).state_dict(), weights)
    rows, note = predict(weights, folder)
    assert [row["label"] for row in rows] == [None] * 3
    assert all(row["class"] == ["cat", "dog"][row["class_index"]] for row in rows)
    assert "named by the classes of" in note
    rows, note = predict(world / "thousand.pt", folder)
    assert all(row["class"] == IMAGENET[row["class_index"]] for row in rows)
    assert f"; the 2 classes of {folder} are not its 1000 outputs, which are assumed" in note


@pytest.mark.parametrize("packed", [False, True], ids=["folder", "tar"])
@pytest.mark.parametrize("split", [None, "val"])
def test_a_split_root_with_images_beside_the_class_folders_of_one_split_names_them(
    tmp_path, world, packed, split
):
    # train/ read whole (cover.png beside its class folders), val/ labelled: the classes of
    # every split, as eval reads the split root, whichever split is predicted
    root = tmp_path / "shop"
    image_folder(root / "train", ["bird", "cat", "dog"])
    (root / "train" / "cover.png").write_bytes(png(3))
    image_folder(root / "val", ["cat", "dog"])
    if packed:
        with tarfile.open(tmp_path / "shop.tar", "w") as tar:
            tar.add(root, arcname="shop")
        root = tmp_path / "shop.tar"
    rows, note = predict(world / "three.pt", root, *(["--split", split] if split else []))
    assert [row["label"] for row in rows][-2:] == ["cat", "dog"]
    assert len(rows) == (2 if split else 6)
    assert all(row["class"] == ["bird", "cat", "dog"][row["class_index"]] for row in rows)
    assert note == (
        f"Note: the model records no class names: its outputs are named by the classes of "
        f"{root} in sorted order, as eval names them (--classes names them otherwise)"
    )


def test_data_of_no_image_beside_class_folders_is_listed_once(tmp_path, world, monkeypatch):
    # a split root of flat split folders (split's OUT/train/x.png), an unlabelled test split
    # beside labelled ones, a flat folder: eval reads no class folder predict did not
    from torchkit.core.predict import inputs

    def listed_again(item: str) -> list[str]:
        raise AssertionError(f"{item} listed again")

    monkeypatch.setattr(inputs, "class_folder_names", listed_again)
    flat = tmp_path / "flat"
    for split in ("train", "val"):
        (flat / split).mkdir(parents=True)
        (flat / split / f"{split}.png").write_bytes(png(1))
    mixed = tmp_path / "mixed"
    image_folder(mixed / "train", ["cat", "dog"])
    (mixed / "test").mkdir()
    (mixed / "test" / "x.png").write_bytes(png(2))
    for data in (flat, mixed, flat / "train"):
        predict(world / "three.pt", data)


def test_a_folder_read_again_for_its_class_folders_warns_once(tmp_path, world):
    # its second reading, by the class-folder rule, repeats none of the first one's warnings
    folder = image_folder(tmp_path / "pets", ["bird", "cat", "dog"])
    (folder / "cover.png").write_bytes(png(3))
    (folder / "cat" / "loop").symlink_to("..")
    done = run_torchkit_in_process(
        "predict", "nets:TinyNet", "--weights", world / "three.pt", folder, "--image-size", 4,
        "-j", "0", "--device", "cpu", "--format", "csv",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "named by the classes of" in done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("Warning")]
    assert len(warnings) == 1 and "not entered" in warnings[0], done.stderr
