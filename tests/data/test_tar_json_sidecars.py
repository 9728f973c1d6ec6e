"""A `.tar` of class folders whose images each have a `KEY.json` of metadata beside them (an
annotation tool's: LabelMe writes `img.json` beside `img.jpg`, holding no "label" or "cls") reads
as the image folder it unpacks to, its folders the classes. Such a `.json` made it a WebDataset
shard of unlabelled samples: dataset-stats counted one class, without a word, and train refused
it for want of labels. A `KEY.json` that holds a label still makes a shard. The files such a `.tar`
(of any folder) holds that are no images are counted by dataset-stats, as the folder's are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from parquet_files import png
from processes import run_torchkit_in_process
from tar_members import tar_of_members

from torchkit.core.data.sources import open_data

# the plain-header pass lists the tar; a pax global header leaves it to tarfile
LISTINGS = {"headers": None, "tarfile": {"comment": "made by a test"}}


def annotation(image: str) -> bytes:
    """A LabelMe file's shape: its labels are the shapes', none of the image's."""
    shapes = [{"label": "eye", "points": [[1, 1], [2, 2]], "shape_type": "rectangle"}]
    return json.dumps({"version": "5.4.1", "imagePath": image, "shapes": shapes}).encode()


def annotated(folder: Path) -> list[tuple[str, bytes]]:
    members = []
    for i, name in enumerate(["cat/a", "cat/b", "dog/c"]):
        members += [(f"{name}.png", png(i)), (f"{name}.json", annotation(f"{name}.png"))]
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.png").write_bytes(png(i))
        (folder / f"{name}.json").write_bytes(annotation(f"{name}.png"))
    return members


@pytest.mark.parametrize("pax", list(LISTINGS.values()), ids=list(LISTINGS))
def test_a_tar_of_annotated_class_folders_reads_as_the_folder(tmp_path, pax):
    folder = tmp_path / "pets"
    archive = tar_of_members(tmp_path / "pets.tar", annotated(folder), pax_headers=pax)
    unpacked, read = open_data(str(folder)), open_data(str(archive))
    assert read.classes == unpacked.classes == ["cat", "dog"]
    assert read.whole.ids == unpacked.whole.ids == ["cat/a.png", "cat/b.png", "dog/c.png"]
    assert list(read.whole.labels) == list(unpacked.whole.labels) == [0, 0, 1]
    assert [path.read_bytes() for path in read.whole.paths] == [png(0), png(1), png(2)]


def test_dataset_stats_counts_the_classes_and_the_files_that_are_no_images(tmp_path):
    """The `.json` files were counted in the folder's report, 'skipped 3 non-image file(s)',
    and in its `.tar`'s (of any folder) never: 0, without a word."""
    folder = tmp_path / "pets"
    archive = tar_of_members(tmp_path / "pets.tar", annotated(folder))
    reports = {}
    for data in (folder, archive):
        report = run_torchkit_in_process("dataset-stats", data, "--format", "json", "-j", "0")
        assert report.returncode == 0, report.stderr
        assert "Warning: skipped 3 non-image file(s), e.g. cat/a.json" in report.stderr
        reports[data] = json.loads(report.stdout)
    assert reports[archive]["num_classes"] == reports[folder]["num_classes"] == 2
    assert reports[archive]["non_image_files"] == reports[folder]["non_image_files"] == 3


def test_a_split_roots_tar_counts_the_files_of_the_split_measured(tmp_path):
    """dataset-stats measures train: the files that are no images in train/, as on disk."""
    members = [
        ("train/cat/a.png", png(0)), ("train/cat/notes.txt", b"x"), ("train/dog/b.png", png(1)),
        ("train/.hidden.txt", b"x"), ("val/cat/c.png", png(2)), ("val/cat/x.txt", b"x"),
        ("val/dog/d.png", png(3)), ("README.md", b"x"), ("train/cat/._a.png", b"x"),
    ]  # fmt: skip
    archive = tar_of_members(tmp_path / "split.tar", members)
    report = run_torchkit_in_process("dataset-stats", archive, "--format", "json", "-j", "0")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["non_image_files"] == 1
    assert "Warning: skipped 1 non-image file(s), e.g. train/cat/notes.txt" in report.stderr


def test_a_json_holding_a_label_still_makes_a_shard(tmp_path):
    members = annotated(tmp_path / "pets")
    members[1] = ("cat/a.json", json.dumps({"label": "tabby"}).encode())
    members[3] = ("cat/b.json", json.dumps({"label": "tabby"}).encode())
    members[5] = ("dog/c.json", json.dumps({"label": "pug"}).encode())
    read = open_data(str(tar_of_members(tmp_path / "pets.tar", members)))
    assert read.classes == ["pug", "tabby"]
    assert read.whole.ids == [f"pets.tar/{n}.png" for n in ("cat/a", "cat/b", "dog/c")]
