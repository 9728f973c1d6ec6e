"""Symbolic links to folders inside the folders an image-folder reader lists: entered, as
torchvision's ImageFolder enters them, but never twice and never in a loop."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from processes import run_torchkit_in_process

from torchkit.core.data.sources import open_data
from torchkit.core.data.sources.discovery import list_folders


def linked_tree(tmp_path: Path, make_image_folder) -> tuple[Path, Path]:
    """ROOT/{cat,dog}, with a folder elsewhere linked inside cat (a subfolder in it) and an
    image file elsewhere linked inside dog."""
    root = make_image_folder(tmp_path / "data", {"cat": 2, "dog": 2})
    elsewhere = make_image_folder(tmp_path / "elsewhere", {"more": 2, "one": 1})
    make_image_folder(elsewhere / "more", {"deeper": 1})
    (root / "cat" / "more").symlink_to(elsewhere / "more", target_is_directory=True)
    (root / "dog" / "photo.png").symlink_to(elsewhere / "one" / "one_0.png")
    return root, elsewhere


def test_linked_folders_are_read_as_image_folder_reads_them(tmp_path, make_image_folder, caplog):
    """A folder linked inside a class folder was left out: train saw 5 images of the 8 that
    ImageFolder gives for the same ROOT."""
    from torchvision.datasets import ImageFolder

    root, elsewhere = linked_tree(tmp_path, make_image_folder)
    reference = ImageFolder(str(root))
    expected = [(os.path.relpath(path, root), label) for path, label in reference.samples]
    samples = open_data(root).whole
    assert sorted(zip(samples.ids, samples.labels, strict=True)) == sorted(expected)
    assert len(samples) == 8 and os.path.join("cat", "more", "deeper", "deeper_0.png") in (
        samples.ids
    )
    # Links that would read a file twice or forever are not entered, and named in one warning;
    # an image link to nothing is listed, as ImageFolder lists it (an unreadable image, skipped
    # and counted when read).
    (root / "cat" / "loop").symlink_to(root, target_is_directory=True)
    (root / "cat" / "up").symlink_to(tmp_path, target_is_directory=True)
    (root / "dog" / "cats").symlink_to(Path("..") / "cat", target_is_directory=True)
    (root / "dog" / "again").symlink_to(elsewhere / "more" / "deeper", target_is_directory=True)
    (root / "dog" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (elsewhere / "more" / "back").symlink_to(root / "dog", target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        again = open_data(root).whole
    gone = (os.path.join("dog", "gone.png"), expected[-1][1])
    assert sorted(zip(again.ids, again.labels, strict=True)) == sorted([*expected, gone])
    (warning,) = [r.getMessage() for r in caplog.records if "not entered" in r.getMessage()]
    assert warning.startswith(f"5 linked folder(s) in {root} not entered: ")
    assert f": {os.path.join('cat', 'loop')}, {os.path.join('cat', 'more', 'back')}, " in warning


def test_a_linked_folder_is_read_once_at_the_first_path_by_name(tmp_path, make_image_folder):
    """Two links to one folder: its files are read once, at the link first by name, whatever
    order the system lists the folder in."""
    root = make_image_folder(tmp_path / "data", {"x": 1})
    elsewhere = make_image_folder(tmp_path / "elsewhere", {"shared": 2})
    for name in ("b", "a", "c"):
        (root / name).symlink_to(elsewhere / "shared", target_is_directory=True)
    listing = list_folders([root])
    assert listing.images[0] == [
        str(root / "a" / "shared_0.png"),
        str(root / "a" / "shared_1.png"),
        str(root / "x" / "x_0.png"),
    ]
    assert listing.unentered == [str(root / "b"), str(root / "c")]


def test_a_split_part_does_not_read_another_through_a_link(tmp_path, make_image_folder):
    """ROOT/train/cat/x -> ROOT/val/cat would put val's images in train too."""
    root = tmp_path / "split"
    make_image_folder(root / "train", {"cat": 2})
    make_image_folder(root / "val", {"cat": 1})
    (root / "train" / "cat" / "x").symlink_to(root / "val" / "cat", target_is_directory=True)
    data = open_data(root)
    assert [len(data.splits[name]) for name in ("train", "val")] == [2, 1]


def test_dataset_stats_counts_the_images_of_linked_folders(tmp_path, make_image_folder):
    """Its images, and its image links to nothing as unreadable files, as the reader lists
    them; a loop named once."""
    root, _ = linked_tree(tmp_path, make_image_folder)
    (root / "cat" / "loop").symlink_to(root, target_is_directory=True)
    (root / "cat" / "more" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    result = run_torchkit_in_process("dataset-stats", str(root), "--format", "json", "-j", "0")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["images"], report["files"]) == (8, 9)
    assert [row["path"] for row in report["unreadable"]] == [
        os.path.join("cat", "more", "gone.png")
    ]
    assert f"1 linked folder(s) in {root} not entered" in result.stderr


def test_an_output_in_a_folder_read_through_a_link_is_refused(tmp_path, make_image_folder):
    """Before: `split ROOT /elsewhere/more/out` (ROOT/cat/more -> /elsewhere/more, or a class
    folder linked there) wrote its copies into the data, exit 0, and the next read of ROOT took
    them for images of cat."""
    root, elsewhere = linked_tree(tmp_path, make_image_folder)
    (root / "bird").symlink_to(elsewhere / "one", target_is_directory=True)
    for folder, link in (
        (elsewhere / "more", root / "cat" / "more"),
        (elsewhere / "one", root / "bird"),
    ):
        out = folder / "out"
        result = run_torchkit_in_process("split", str(root), str(out), "--mode", "copy")
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith(
            f"Error: output folder {out} lies inside the linked data folder {link} "
        )
        assert not out.exists()
