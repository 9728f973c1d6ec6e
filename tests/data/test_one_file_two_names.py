"""One image file reached under two names in a folder (a linked class folder, a symbolic or a
hard link to one file): read under each name in one class of one split, as copies would be; an
error naming both paths in two classes (its label a guess) or two splits (it leaks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from image_folders import make_class_files
from processes import run_torchkit_in_process

from torchkit.core.data.sources import open_data
from torchkit.core.data.sources.discovery import discover_image_folder, list_folders
from torchkit.core.io.errors import InputError


def test_a_class_folder_linked_to_another_is_an_error_naming_the_link(tmp_path):
    """Before: flowers/rose2 -> rose read rose's 3 images again as class rose2 (6 images, each
    under two labels)."""
    root = make_class_files(tmp_path / "flowers", {"rose": 3, "tulip": 2})
    (root / "rose2").symlink_to("rose", target_is_directory=True)
    with pytest.raises(InputError) as raised:
        open_data(root)
    assert raised.value.message == (
        f"{root / 'rose' / 'rose_00.png'} and {root / 'rose2' / 'rose_00.png'} are one file in "
        "two classes, rose and rose2 (and 2 more)"
    )
    assert raised.value.hint == f"an image has one label: remove the link {root / 'rose2'} -> rose"


def test_a_file_linked_or_hard_linked_into_another_class_is_an_error(tmp_path):
    root = make_class_files(tmp_path / "data", {"cat": 2, "dog": 2})
    os.link(root / "cat" / "cat_01.png", root / "dog" / "x.png")
    with pytest.raises(InputError) as raised:
        discover_image_folder(root)
    assert str(raised.value) == (
        f"{root / 'cat' / 'cat_01.png'} and {root / 'dog' / 'x.png'} are one file in two "
        "classes, cat and dog (an image has one label: remove one of the two names (hard links))"
    )
    os.unlink(root / "dog" / "x.png")
    (root / "dog" / "deep").mkdir()
    (root / "dog" / "deep" / "x.png").symlink_to(Path("..") / ".." / "cat" / "cat_00.png")
    with pytest.raises(InputError, match=r"cat_00\.png and .*x\.png are one file in two classes"):
        discover_image_folder(root)


def test_one_file_in_two_splits_of_a_split_root_is_an_error(tmp_path):
    """train/cat/a.png hard-linked (or a class folder linked) into test/: it leaks."""
    root = tmp_path / "split"
    make_class_files(root / "train", {"cat": 2, "dog": 1})
    make_class_files(root / "test", {"dog": 1})
    os.link(root / "train" / "cat" / "cat_00.png", root / "test" / "dog" / "copy.png")
    with pytest.raises(InputError, match="one file in two classes, cat and dog"):
        open_data(root)
    os.unlink(root / "test" / "dog" / "copy.png")
    (root / "test" / "cat").symlink_to(Path("..") / "train" / "cat", target_is_directory=True)
    with pytest.raises(InputError) as raised:
        open_data(root)
    assert raised.value.message == (
        f"{root / 'train' / 'cat' / 'cat_00.png'} and {root / 'test' / 'cat' / 'cat_00.png'} are "
        "one file in two splits, train and test (and 1 more)"
    )
    assert raised.value.hint == (
        f"remove the link {root / 'test' / 'cat'} -> {Path('..') / 'train' / 'cat'}: an image "
        "in two splits leaks from one into the other"
    )


def test_a_tar_of_such_a_folder_is_refused_alike(tmp_path):
    """A link member is read at its target's data: tulip/t.png -> rose/rose_00.png was a rose
    labelled tulip too; a hard-linked repeat in its own class is read under each name."""
    import tarfile

    root = make_class_files(tmp_path / "flowers", {"rose": 2, "tulip": 1})
    os.link(root / "rose" / "rose_01.png", root / "rose" / "again.png")
    (root / "tulip" / "t.png").symlink_to(Path("..") / "rose" / "rose_00.png")
    archive = tmp_path / "flowers.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname="flowers")
    with pytest.raises(InputError) as raised:
        open_data(archive)
    assert str(raised.value) == (
        f"{archive}:rose/rose_00.png and {archive}:tulip/t.png are one file in two classes, rose "
        f"and tulip (an image has one label: remove the link {archive}:tulip/t.png -> "
        "flowers/rose/rose_00.png)"
    )
    os.unlink(root / "tulip" / "t.png")
    split = tmp_path / "split.tar"
    with tarfile.open(split, "w") as tar:
        tar.add(root, arcname="train")
        tar.add(root / "rose" / "rose_01.png", arcname="val/rose/rose_01.png")
    leaks = r"one file in two splits, train and val \(remove the link .*val/rose/rose_01\.png -> "
    with pytest.raises(InputError, match=leaks):
        open_data(split)
    os.unlink(archive)
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname="flowers")
    assert open_data(archive).whole.class_counts() == [3, 1]


def test_one_file_under_two_names_in_one_class_is_read_under_each(tmp_path):
    """As copies of it would be, as torchvision's ImageFolder reads it: the way split
    --oversample --mode symlink writes its repeats, which train then reads."""
    from torchkit.core.split import split_dataset

    root = make_class_files(tmp_path / "data", {"cat": 2, "dog": 6})
    (root / "cat" / "again.png").symlink_to("cat_00.png")
    os.link(root / "cat" / "cat_01.png", root / "cat" / "twin.png")
    samples = open_data(root).whole
    assert samples.class_counts() == [4, 6] and "cat/again.png" in samples.ids
    out = tmp_path / "out"
    split_dataset(root, out, mode="symlink", ratio="1:1", oversample=True)
    train = open_data(out).splits["train"]
    repeats = [i for i in train.ids if "-repeat" in i]
    assert repeats and train.class_counts()[0] == train.class_counts()[1]


def test_inode_numbers_alone_never_make_two_files_one(tmp_path):
    """Numbers repeat across disks (and some FUSE disks make them up): two files that share
    one are one file only where stat says so."""
    from torchkit.core.data.sources.discovery import refuse_one_file_in_two_places as refuse

    root = make_class_files(tmp_path / "data", {"cat": 1, "dog": 1})
    cat, dog = str(root / "cat" / "cat_00.png"), str(root / "dog" / "dog_00.png")
    refuse([((None, "cat"), ([cat], [7])), ((None, "dog"), ([dog], [7]))], root)
    listing = list_folders([root / "cat", root / "dog"])
    assert listing.numbered[0] == ([cat], [os.stat(cat).st_ino])


def test_dataset_stats_says_so_in_one_error_line(tmp_path):
    root = make_class_files(tmp_path / "flowers", {"rose": 1, "tulip": 1})
    (root / "rose2").symlink_to("rose", target_is_directory=True)
    result = run_torchkit_in_process("dataset-stats", root, "-j", "0")
    assert result.returncode == 1
    assert result.stderr == (
        f"Error: {root / 'rose' / 'rose_00.png'} and {root / 'rose2' / 'rose_00.png'} are one "
        f"file in two classes, rose and rose2 (an image has one label: remove the link "
        f"{root / 'rose2'} -> rose)\n"
    )
