"""One image file reached under two names in a folder (a linked class folder, a symbolic or a
hard link to one file) or a .tar of one (its links followed to the end of their chain): read
under each name in one class of one split, as copies would be; an error naming both paths in two
classes (its label a guess) or two splits (it leaks), but for dataset-stats' leakage report,
which lists a file in two splits as a pair marked same_file."""

from __future__ import annotations

import csv
import os
import tarfile
from pathlib import Path

import pytest
from image_folders import make_class_files, write_image_folder
from processes import run_torchkit_in_process
from tar_members import tar_of_members

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
        "classes, cat and dog (an image has one label: remove one of the two hard links)"
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
    labelled tulip too; a hard-linked repeat in its own class is read under each name. The hint
    names the link's target as stored (`../rose/rose_00.png`, as `ls -l` shows it unpacked and
    the unpacked folder's error says it), where it showed it from the archive's root, wrapping
    folder and all (`flowers/rose/rose_00.png`)."""
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
        "../rose/rose_00.png)"
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


def _tar_with_links(archive: Path, files: dict[str, bytes], links: list[tuple[str, str, bytes]]):
    """`archive` holding regular members `files` (name -> bytes), then `links` in order:
    (name, the name it holds, tarfile.SYMTYPE or tarfile.LNKTYPE)."""
    marks = {tarfile.SYMTYPE: "->", tarfile.LNKTYPE: "=>"}
    linked = [(name, marks[kind] + target) for name, target, kind in links]
    return tar_of_members(archive, [*files.items(), *linked])


def test_a_tar_link_to_a_link_is_followed_to_the_file_it_ends_at(tmp_path):
    """A symbolic link member to a hard-link member (what tar stores for a second name of a
    file) or through a linked folder: it was read as a link to nothing, so one rose under a
    tulip's name too went unnoticed (and unreadable). Now the chain ends at the file: one file
    in two classes, refused; in one class, read at that file's bytes."""
    rose = b"rose" * 9
    chain = [
        ("flowers/rose/b.png", "flowers/rose/a.png", tarfile.LNKTYPE),
        ("flowers/tulip/t.png", "../rose/b.png", tarfile.SYMTYPE),
    ]
    files = {"flowers/rose/a.png": rose, "flowers/tulip/x.png": b"tulip" * 9}
    archive = _tar_with_links(tmp_path / "flowers.tar", files, chain)
    with pytest.raises(InputError) as raised:
        open_data(archive)
    assert str(raised.value) == (
        f"{archive}:rose/a.png and {archive}:tulip/t.png are one file in two classes, rose and "
        f"tulip (an image has one label: remove the link {archive}:tulip/t.png -> "
        "../rose/b.png)"
    )
    through_folder = [  # a hidden folder's link: no class of its own (rose2 would be one)
        ("flowers/.rose2", "rose", tarfile.SYMTYPE),
        ("flowers/tulip/t.png", "../.rose2/a.png", tarfile.SYMTYPE),
    ]
    archive = _tar_with_links(tmp_path / "flowers.tar", files, through_folder)
    with pytest.raises(InputError, match=r"rose/a\.png and .*tulip/t\.png are one file in two"):
        open_data(archive)
    one_class = [*chain[:1], ("flowers/rose/c.png", "b.png", tarfile.SYMTYPE)]
    samples = open_data(_tar_with_links(tmp_path / "flowers.tar", files, one_class)).whole
    assert samples.ids == ["rose/a.png", "rose/b.png", "rose/c.png", "tulip/x.png"]
    assert [path.read_bytes() for path in samples.paths[:3]] == [rose] * 3


def _leakage_csv(data: Path, pairs: Path, *extra: object) -> list[dict[str, str]]:
    """`dataset-stats DATA --leakage-csv PAIRS` (it must succeed): the rows of PAIRS."""
    result = run_torchkit_in_process("dataset-stats", data, "-j", "0", "--leakage-csv", pairs)
    assert result.returncode == 0, result.stderr
    assert "Warning: " in result.stderr and "cross splits" in result.stderr
    with pairs.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_dataset_stats_lists_a_file_linked_across_splits_as_a_same_file_pair(tmp_path):
    """dataset-stats' leakage check finds files in two splits: one file reached there under two
    names (a linked class folder, a hard link) stopped it with the readers' error, where it
    listed them before. Now each is an exact pair marked same_file (a copy is not), exit 0,
    with the leakage warning; --no-leakage, and one file in two classes of a split, refuse."""
    root = tmp_path / "split"
    write_image_folder(root / "train", {"cat": 2, "dog": 2})
    write_image_folder(root / "test", {"dog": 1}, seed=1)
    (root / "test" / "cat").symlink_to(Path("..") / "train" / "cat", target_is_directory=True)
    os.link(root / "train" / "dog" / "dog_0.png", root / "test" / "dog" / "hard.png")
    (root / "test" / "dog" / "copy.png").write_bytes(
        (root / "train" / "dog" / "dog_1.png").read_bytes()
    )
    rows = _leakage_csv(root, tmp_path / "pairs.csv")
    assert [(r["path_a"], r["path_b"], r["kind"], r["same_file"]) for r in rows] == [
        ("train/cat/cat_0.png", "test/cat/cat_0.png", "exact", "true"),
        ("train/cat/cat_1.png", "test/cat/cat_1.png", "exact", "true"),
        ("train/dog/dog_0.png", "test/dog/hard.png", "exact", "true"),
        ("train/dog/dog_1.png", "test/dog/copy.png", "exact", "false"),
    ]
    refused = run_torchkit_in_process("dataset-stats", root, "-j", "0", "--no-leakage")
    assert refused.returncode == 1
    assert "are one file in two splits, train and test (and 2 more)" in refused.stderr
    os.link(root / "train" / "cat" / "cat_0.png", root / "train" / "dog" / "cat.png")
    classes = run_torchkit_in_process("dataset-stats", root, "-j", "0")
    assert classes.returncode == 1
    assert "are one file in two classes, cat and dog" in classes.stderr


def test_dataset_stats_lists_a_tar_member_linked_across_splits_as_a_same_file_pair(tmp_path):
    root = write_image_folder(tmp_path / "images", {"cat": 2})
    archive = _tar_with_links(
        tmp_path / "split.tar",
        {
            f"{split}/cat/{i}.png": (root / "cat" / f"cat_{i}.png").read_bytes()
            for split, i in (("train", 0), ("val", 1))
        },
        [("val/cat/leak.png", "train/cat/0.png", tarfile.LNKTYPE)],
    )
    with pytest.raises(InputError, match="one file in two splits, train and val"):
        open_data(archive)
    rows = _leakage_csv(archive, tmp_path / "pairs.csv")
    assert [(r["path_a"], r["path_b"], r["same_file"]) for r in rows] == [
        ("train/cat/0.png", "val/cat/leak.png", "true")
    ]
