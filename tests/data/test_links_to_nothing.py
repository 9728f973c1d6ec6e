"""Symbolic links in a folder that point nowhere: an image link to nothing (`cat/x.png ->
nowhere`) is an unreadable image in every command (listed, as torchvision's ImageFolder lists it,
then skipped with a warning and counted, fatal with --strict), as a CSV index's or a `.tar`'s
link to nothing is; any other link to nothing (a class folder linked to a disk not mounted) is
named in one warning, where every command but split passed over both without a word."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

DEAD = "point nowhere and are not read"


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = write_image_folder(tmp_path / "data", {"cat": 2, "dog": 2})
    (root / "cat" / "x.png").symlink_to("nowhere.png")
    (root / "rose").symlink_to(tmp_path / "unmounted" / "rose", target_is_directory=True)
    return root


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "two.pt"
    write_convnet_checkpoint(path, in_channels=3, image_size=8, classes=["cat", "dog"])
    return path


def dead_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if DEAD in line]


def test_eval_counts_the_image_link_and_names_the_class_link(data, checkpoint, tmp_path):
    scored = run_torchkit_in_process(
        "eval", checkpoint, "--data", data, "--format", "json", "--workers", "0"
    )
    assert scored.returncode == 0, scored.stderr
    assert json.loads(scored.stdout)["num_images"] == 4
    unreadable = [line for line in scored.stderr.splitlines() if "unreadable" in line]
    assert len(unreadable) == 1 and "skipped 1 unreadable image(s)" in unreadable[0]
    assert "x.png: not a regular file (a symbolic link to nothing)" in unreadable[0]
    rose = tmp_path / "unmounted" / "rose"
    assert dead_warnings(scored.stderr) == [
        f"Warning: 1 symbolic link(s) in {data} {DEAD}: rose -> {rose} (a folder linked to a "
        "disk not mounted leaves its images out, a class folder its class: mount it, or remove "
        "the link)"
    ]
    strict = run_torchkit_in_process(
        "eval", checkpoint, "--data", data, "--workers", "0", "--strict"
    )
    assert strict.returncode == 1 and "x.png" in error_line(strict.stderr)


def test_predict_gives_the_image_link_its_row_and_names_the_class_link(data, checkpoint):
    predicted = run_torchkit_in_process(
        "predict", checkpoint, data, "--format", "csv", "--workers", "0"
    )
    assert predicted.returncode == 0, predicted.stderr
    rows = {row["path"]: row for row in csv.DictReader(predicted.stdout.splitlines())}
    assert len(rows) == 5
    assert rows["cat/x.png"]["error"] == "not a regular file (a symbolic link to nothing)"
    assert rows["cat/x.png"]["class"] == "" and rows["cat/cat_0.png"]["error"] == ""
    assert len(dead_warnings(predicted.stderr)) == 1 and "rose -> " in predicted.stderr


def test_dataset_stats_counts_the_image_link_once(data):
    """dataset-stats added such links to what the reader listed: now the reader lists them."""
    report = json.loads(run_torchkit_in_process("dataset-stats", data, "--format", "json").stdout)
    assert (report["images"], report["unreadable_count"]) == (4, 1)
    assert [row["path"] for row in report["unreadable"]] == ["cat/x.png"]


def test_split_leaves_the_image_link_out_with_its_warning(data, tmp_path):
    out = tmp_path / "out"
    split = run_torchkit_in_process("split", data, out)
    assert split.returncode == 0, split.stderr
    assert "1 image link(s) point nowhere and are left out: cat/x.png" in split.stderr
    assert not (out / "train" / "cat" / "x.png").is_symlink()
    with (out / "split.csv").open(newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 4


def test_a_split_folder_and_a_folder_in_a_class_linked_to_nothing_are_named(tmp_path, caplog):
    from torchkit.core.data.sources import open_data

    root = tmp_path / "root"
    write_image_folder(root / "train", {"cat": 2, "dog": 2})
    write_image_folder(root / "test", {"cat": 1, "dog": 1})
    (root / "val").symlink_to(tmp_path / "gone", target_is_directory=True)
    (root / "train" / "cat" / "more").symlink_to(tmp_path / "gone", target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        data = open_data(root)
    assert sorted(data.splits) == ["test", "train"]
    warnings = sorted(r.getMessage() for r in caplog.records if DEAD in r.getMessage())
    assert len(warnings) == 2
    assert warnings[0].startswith(f"1 symbolic link(s) in {root} {DEAD}: val -> ")
    assert warnings[1].startswith(f"1 symbolic link(s) in {root / 'train'} {DEAD}: cat/more -> ")


def test_a_tar_of_the_folder_names_its_class_link_to_nothing_too(data, tmp_path, caplog):
    """The unpacked folder names `rose -> .missing`; its `.tar` passed over it unsaid."""
    import tarfile

    from torchkit.core.data.sources import open_data

    (data / "rose").unlink()
    (data / "rose").symlink_to(".missing")
    archive = tmp_path / "data.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(data, arcname="data")
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        read = open_data(archive)
    assert "cat/x.png" in read.whole.ids and read.classes == ["cat", "dog"]
    warnings = [r.getMessage() for r in caplog.records if "nothing the archive" in r.getMessage()]
    assert warnings == [
        f"{archive}: 1 link where a class folder could be leads to nothing the archive holds, "
        "not read: rose -> .missing (its images are left out, a class folder's class)"
    ]


def test_a_tar_of_the_folder_gives_its_image_link_the_folders_reason(data, tmp_path):
    """The reason read from the `.tar` was the archive's absolute path and words of its own
    ('/tmp/.../data.tar: a link to a member the archive does not hold'), where the folder
    `tar -xf` unpacks says, as every reason does, what the file is, never its path."""
    import tarfile

    (data / "rose").unlink()
    archive = tmp_path / "data.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(data, arcname="data")
    reasons = {}
    for read in (data, archive):
        report = run_torchkit_in_process("dataset-stats", read, "--format", "json", "-j", "0")
        assert report.returncode == 0, report.stderr
        reasons[read] = json.loads(report.stdout)["unreadable"]
    assert (
        reasons[archive]
        == reasons[data]
        == [{"path": "cat/x.png", "error": "not a regular file (a symbolic link to nothing)"}]
    )
