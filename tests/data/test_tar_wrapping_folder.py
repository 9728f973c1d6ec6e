"""A `.tar` of a folder whose only top folder is named otherwise than the archive (`tar cf
flowers-v2.tar flowers`) read as ONE class, `flowers`: dataset-stats showed one class without
a hint and train refused it. It now reads as the folder tar -x gives, `flowers/`, its class (or
split) folders one level down; a top folder of images alone stays one class, a split folder a
split."""

from __future__ import annotations

import io

import pytest
from PIL import Image
from tar_members import tar_of_members

from torchkit.core.data.sources import open_data


def _png(shade: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (shade, 0, 0)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("archive", ["flowers-v2.tar", "flowers-000001.tar", "flowers.tar"])
def test_one_top_folder_of_class_folders_is_the_data(tmp_path, archive):
    members = [
        ("flowers/", None),
        ("flowers/rose/a.png", _png(1)),
        ("flowers/rose/b.png", _png(2)),
        ("flowers/tulip/c.png", _png(3)),
    ]
    source = open_data(str(tar_of_members(tmp_path / archive, members)))
    assert source.classes == ["rose", "tulip"]
    assert source.whole.ids == ["rose/a.png", "rose/b.png", "tulip/c.png"]
    assert source.whole.labels == [0, 0, 1]


def test_one_top_folder_of_split_folders_is_a_split_root(tmp_path):
    members = [
        ("data/train/cat/a.png", _png(1)),
        ("data/train/dog/b.png", _png(2)),
        ("data/val/cat/c.png", _png(3)),
        ("data/val/dog/d.png", _png(4)),
    ]
    source = open_data(str(tar_of_members(tmp_path / "snapshot.tar", members)))
    assert sorted(source.splits) == ["train", "val"]
    assert source.classes == ["cat", "dog"]


@pytest.mark.parametrize(
    "members, classes",
    [
        # a folder of images alone, or of one subfolder of them: one class, as before
        ([("cat/a.png", _png(1)), ("cat/b.png", _png(2)), ("dog/c.png", _png(3))], None),
        ([("cat/x/a.png", _png(1)), ("cat/x/b.png", _png(2))], ["cat"]),
    ],
)
def test_other_layouts_read_as_before(tmp_path, members, classes):
    source = open_data(str(tar_of_members(tmp_path / "pets.tar", members)), allow_unlabelled=True)
    if classes is None:  # two top folders: their classes
        assert source.classes == ["cat", "dog"]
    else:
        assert source.classes == classes


def test_a_top_split_folder_stays_a_split(tmp_path):
    members = [("train/cat/a.png", _png(1)), ("train/dog/b.png", _png(2))]
    source = open_data(str(tar_of_members(tmp_path / "pets.tar", members)))
    assert list(source.splits) == ["train"]
    assert source.classes == ["cat", "dog"]
