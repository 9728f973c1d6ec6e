"""Split folders named as other tools name them (Fruits-360's Training/ and Test/, Roboflow's
valid/, capitalised Train/Val/Test) are refused with one error saying to rename them: read as
an image folder they were classes, and a model learnt which split an image is in."""

from __future__ import annotations

import tarfile

import pytest
from image_folders import write_image_folder

from torchkit.core.data.sources import open_data
from torchkit.core.io.errors import InputError


@pytest.mark.parametrize(
    "splits",
    [
        ("Training", "Test"),  # was an image folder of the classes 'Test' and 'Training'
        ("Train", "Val", "Test"),  # was three classes
        ("training", "validation"),
        ("train", "valid", "test"),  # was "mixes split folders (train/) with other folders"
    ],
)
@pytest.mark.parametrize("allow_unlabelled", [False, True])
def test_splits_under_other_names_are_refused_naming_them(tmp_path, splits, allow_unlabelled):
    root = tmp_path / "data"
    for split in splits:
        write_image_folder(root / split, {"apple": 1, "banana": 1})
    with pytest.raises(InputError) as caught:
        open_data(root, allow_unlabelled=allow_unlabelled)
    shown = ", ".join(name + "/" for name in sorted(splits))
    assert str(caught.value).startswith(f"{root} holds {shown}: splits under other names")
    trained = next(name for name in splits if name.lower().startswith("train"))
    assert caught.value.hint.endswith(f"read one as an image folder: {root / trained}")


@pytest.mark.parametrize(
    "layout",
    [
        {"Test": 2, "Training": 2},  # images of their own: classes named so
        {"test": 2, "apple": 2},  # not all split names: the usual 'mixes' refusal
    ],
)
def test_classes_named_like_splits_are_not_taken_for_splits(tmp_path, layout):
    root = write_image_folder(tmp_path / "data", layout)
    if "apple" in layout:
        with pytest.raises(InputError, match="mixes split folders"):
            open_data(root)
        return
    assert open_data(root).classes == ["Test", "Training"]


@pytest.mark.parametrize("folder_members", [True, False])  # `tar cf`, or files only
@pytest.mark.parametrize("splits", [("Training", "Test"), ("train", "valid")])
def test_a_tar_of_splits_under_other_names_is_refused_as_the_folder_is(
    tmp_path, splits, folder_members
):
    root = tmp_path / "data"
    for split in splits:
        write_image_folder(root / split, {"apple": 1, "banana": 1})
    archive = tmp_path / "data.tar"
    with tarfile.open(archive, "w") as tar:
        for path in sorted(root.rglob("*")):
            if folder_members or path.is_file():
                tar.add(path, arcname=path.relative_to(root).as_posix(), recursive=False)
    with pytest.raises(InputError) as caught:
        open_data(archive)  # was a tar image folder of the classes the splits' names
    shown = ", ".join(name + "/" for name in sorted(splits))
    assert str(caught.value).startswith(f"{archive} holds {shown}: splits under other names")
    assert caught.value.hint == "rename them train, val and test"


def test_a_tar_of_classes_named_like_splits_reads_them_as_classes(tmp_path):
    root = write_image_folder(tmp_path / "data", {"Test": 1, "Training": 1})
    archive = tmp_path / "data.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname=".")
    assert open_data(archive).classes == ["Test", "Training"]
