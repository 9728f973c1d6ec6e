"""`torchkit predict` of a folder, split root or .tar of either with images beside class
folders, which it reads whole: the classes eval reads it by (which name the outputs of a model
that records none) come from the one listing that read its images, not from a second one."""

from __future__ import annotations

import tarfile
import unicodedata
from pathlib import Path

import pytest
import torch
from nets import TinyNet
from partly_labelled import png
from processes import run_torchkit_in_process

from torchkit.core.data.sources import discovery, shards
from torchkit.core.predict import inputs
from torchkit.core.predict.inputs import class_folder_names, classes_naming_outputs, collect_images


def classes(root: Path, names: list[str], image: int = 1) -> None:
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "a.png").write_bytes(png(image))


def pets(root: Path) -> None:  # cover.png beside cat/, dog/ and an empty class folder
    classes(root, ["cat", "dog"])
    (root / "empty").mkdir()
    (root / "cover.png").write_bytes(png(3))


def hidden_only(root: Path) -> None:  # images beside an empty folder and in a hidden one
    (root / "none").mkdir(parents=True)
    (root / ".thumbs").mkdir()
    (root / ".thumbs" / "t.png").write_bytes(png(1))
    (root / "cover.png").write_bytes(png(3))


def one_file_in_two_classes(root: Path) -> None:  # eval refuses it
    classes(root, ["cat", "dog"])
    (root / "dog" / "b.png").hardlink_to(root / "cat" / "a.png")
    (root / "cover.png").write_bytes(png(3))


def spelled_alike(root: Path) -> None:  # é composed and decomposed: eval refuses it
    classes(root, [unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")])
    (root / "cover.png").write_bytes(png(3))


def split_root(root: Path) -> None:  # train/ read whole, val/ labelled
    classes(root / "train", ["bird", "cat", "dog"])
    (root / "train" / "cover.png").write_bytes(png(3))
    classes(root / "val", ["cat", "dog"])


def split_with_a_test_split(root: Path) -> None:  # and an unlabelled test/ (class "")
    split_root(root)
    classes(root / "val", ["eel"])
    (root / "test").mkdir()
    (root / "test" / "x.png").write_bytes(png(2))


def split_of_flat_folders(root: Path) -> None:  # train/ read whole: no class folder images
    hidden_only(root / "train")
    (root / "val").mkdir()
    (root / "val" / "x.png").write_bytes(png(2))


def split_one_file_in_two_classes(root: Path) -> None:  # in train/: eval refuses it
    one_file_in_two_classes(root / "train")
    classes(root / "val", ["cat"])


LAYOUTS = {
    "pets": (pets, ["cat", "dog", "empty"]),
    "hidden_only": (hidden_only, [""]),
    "one_file_in_two_classes": (one_file_in_two_classes, [""]),
    "spelled_alike": (spelled_alike, [""]),
    "split_root": (split_root, ["bird", "cat", "dog"]),
    "split_with_a_test_split": (split_with_a_test_split, ["bird", "cat", "dog", "eel", ""]),
    "split_of_flat_folders": (split_of_flat_folders, [""]),
    "split_one_file_in_two_classes": (split_one_file_in_two_classes, [""]),
}


def made(tmp_path: Path, layout: str, packed: bool) -> str:
    root = tmp_path / layout
    LAYOUTS[layout][0](root)
    if not packed:
        return str(root)
    with tarfile.open(tmp_path / f"{layout}.tar", "w") as tar:
        tar.add(root, arcname=layout)
    return str(tmp_path / f"{layout}.tar")


@pytest.mark.parametrize("packed", [False, True], ids=["folder", "tar"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_first_read_knows_the_classes_eval_reads(tmp_path, layout, packed):
    # what the first read records is what a second read, by the class-folder rule, finds
    item = made(tmp_path, layout, packed)
    image_set = collect_images([item])
    assert image_set.read_whole == {0: item}
    assert image_set.labelled_classes == {0: LAYOUTS[layout][1]}
    assert class_folder_names(item) == LAYOUTS[layout][1]


def test_a_folder_of_linked_folders_is_listed_once_as_eval_lists_it(tmp_path):
    # a link below the class folders is fenced alike by a listing of the class folders: the
    # first read knows the classes (it was listed again: test_predict_linked_class_folders)
    folder = Path(made(tmp_path, "pets", False))
    (folder / "cat" / "loop").symlink_to("..")
    image_set = collect_images([str(folder)])
    assert image_set.read_whole == {0: str(folder)}
    assert image_set.labelled_classes == {0: ["cat", "dog", "empty"]}
    assert class_folder_names(str(folder)) == ["cat", "dog", "empty"]
    assert classes_naming_outputs(image_set, "IMAGES")[0] == ["cat", "dog", "empty"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("lists_once") / "three.pt"
    torch.save(TinyNet(3).state_dict(), path)
    return path


@pytest.mark.parametrize("packed", [False, True], ids=["folder", "tar"])
@pytest.mark.parametrize("layout", ["pets", "split_root"])
def test_predict_lists_the_data_once(tmp_path, weights, monkeypatch, layout, packed):
    item = made(tmp_path, layout, packed)
    listed: list[object] = []

    def counted(function):
        def listing(*args, **kwargs):
            listed.append(args[0])
            return function(*args, **kwargs)

        return listing

    monkeypatch.setattr(discovery, "list_folders", counted(discovery.list_folders))
    monkeypatch.setattr(shards, "list_tar", counted(shards.list_tar))

    def listed_again(item: str) -> list[str]:
        raise AssertionError(f"{item} listed again")

    monkeypatch.setattr(inputs, "class_folder_names", listed_again)
    done = run_torchkit_in_process(
        "predict", "nets:TinyNet", "--weights", weights, item, "--image-size", 4,
        "-j", "0", "--device", "cpu", "--format", "csv",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"named by the classes of {item} in sorted order, as eval names them" in done.stderr
    if packed:
        assert listed == [item]  # the archive's index read once
    elif layout == "pets":
        assert listed == [[Path(item)]]  # read whole: the folder listed once
    else:  # train/ read whole, and val/ by its class folders: each listed once
        val = Path(item) / "val"
        assert listed == [[Path(item) / "train"], [val / "cat", val / "dog"]]
