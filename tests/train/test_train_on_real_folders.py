"""`train` on the image folders users have: a class folder that holds no image (one error
saying so, never advice about --val-split), empty files left by interrupted downloads, a class
whose files are all unreadable."""

from __future__ import annotations

import os
import tarfile

import pytest
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

TINY = ["--model", "nets:TinyNet", "--image-size", "8", "--workers", "0", "--epochs", "1"]


@pytest.mark.parametrize("packed", [False, True], ids=["folder", "tar"])
def test_a_class_folder_of_files_that_are_not_images_is_named_as_such(tmp_path, packed):
    """Was: "class 'phone', 'spare' have no training images (a class of one image cannot be both
    trained and validated on: add images, or give validation images of their own ...)". A
    `.tar` of the folder named no file its class folders hold."""
    root = write_image_folder(tmp_path / "data", {"cat": 3, "dog": 3})
    (root / "phone").mkdir()
    for number in range(4):
        (root / "phone" / f"IMG_{number}.HEIC").write_bytes(b"\0\0\0\x18ftypheic")
    (root / "spare").mkdir()  # empty
    data = root
    if packed:
        data = tmp_path / "data.tar"
        with tarfile.open(data, "w") as tar:
            tar.add(root, arcname="data")
    result = run_torchkit_in_process("train", "--data", data, *TINY, "--out", tmp_path / "run")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert line.startswith(
        "Error: class 'phone', 'spare' have no images: their folders hold 4 file(s) not read "
        "as images (phone/IMG_0.HEIC, phone/IMG_1.HEIC, phone/IMG_2.HEIC ...) (add images "
        "ending in "
    ), line
    assert "val-split" not in line and "one image" not in line
    assert not (tmp_path / "run").exists()


def test_an_empty_class_folder_beside_a_class_of_one_image(tmp_path):
    """The class with no image is the one to fix first; the one-image class trains."""
    root = write_image_folder(tmp_path / "data", {"cat": 3, "dog": 1})
    (root / "empty").mkdir()
    result = run_torchkit_in_process("train", "--data", root, *TINY, "--out", tmp_path / "run")
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        "Error: class 'empty' has no images (add images ending in .bmp, .gif, .jfif, .jpeg, "
        ".jpg, .pgm, .png, .ppm, .tif, .tiff, .webp; or remove the class)"
    )


def test_empty_files_in_two_splits_are_not_copies_inflating_val(tmp_path):
    """Was: "Warning: 2 images have a byte-identical copy in another of the run's splits
    (train/val; 1 group(s)): val and test figures are inflated", for two 0-byte files that
    are no images and are skipped as unreadable."""
    from torchkit.core.data.sources.samples import Samples
    from torchkit.core.train.loaders import cross_split_copies

    root = write_image_folder(tmp_path / "data", {"cat": 2})
    (root / "cat" / "partial_1.jpg").write_bytes(b"")
    (root / "cat" / "partial_2.jpg").write_bytes(b"")
    (root / "cat" / "copy.png").write_bytes((root / "cat" / "cat_0.png").read_bytes())

    def samples(*names: str) -> Samples:
        return Samples(["cat"], [0] * len(names), paths=[str(root / "cat" / n) for n in names])

    train = samples("cat_0.png", "cat_1.png", "partial_1.jpg")
    val = samples("copy.png", "partial_2.jpg")
    assert cross_split_copies({"train": train, "val": val}) == (2, 1)  # the PNG and its copy


def test_a_class_with_test_images_only_is_told_to_get_training_images(tmp_path):
    """A split root whose val/ is empty holds val out of train/: its class c, in test/ only,
    was 'has no training images (a class of one image cannot be both trained and validated
    on ...)', then '(add images to the folder or remove it)', and removing the empty train/c
    was refused again: test/c keeps the class. Removing its folders from every split trains."""
    import shutil

    root = tmp_path / "data"
    write_image_folder(root / "train", {"a": 3, "b": 3})
    write_image_folder(root / "test", {"a": 1, "b": 1, "c": 2})
    (root / "train" / "c").mkdir()
    (root / "val").mkdir()
    expected = (
        "Error: class 'c' has no training images (add images to its folder in the train split, "
        "or remove its folders from every split)"
    )
    for removed in ((), ("train",)):
        for split in removed:
            (root / split / "c").rmdir()
        result = run_torchkit_in_process("train", "--data", root, *TINY, "--out", tmp_path / "run")
        assert result.returncode == 1
        assert error_line(result.stderr) == expected
    shutil.rmtree(root / "test" / "c")
    result = run_torchkit_in_process("train", "--data", root, *TINY, "--out", tmp_path / "run")
    assert result.returncode == 0, result.stderr


def test_a_class_whose_images_are_all_unreadable_is_named_once(tmp_path):
    """Was only 'skipped unreadable image' per file: the model had an output for 'broken' that
    it never trained on. 'partly' has training images that read: no warning of it."""
    root = write_image_folder(tmp_path / "data", {"cat": 4, "partly": 3})
    for folder, count in (("broken", 4), ("partly", 1)):
        (root / folder).mkdir(exist_ok=True)
        for number in range(count):
            (root / folder / f"x{number}.jpg").write_bytes(b"not a jpeg")
    args = ["--data", root, *TINY, "--epochs", "2", "--val-split", "0.25"]
    result = run_torchkit_in_process("train", *args, "--out", tmp_path / "run")
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "no readable training" in line]
    assert len(warned) == 1, result.stderr  # once, not per epoch
    assert warned[0].startswith(
        "Warning: class 'broken' has no readable training image (all skipped as unreadable; "
        f"the first: {root / 'broken'}{os.sep}x"
    ), warned
    assert warned[0].endswith("fix or remove the files, or remove the class")
