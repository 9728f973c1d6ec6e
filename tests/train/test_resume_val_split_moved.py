"""`train --resume` of a run that held its validation images out itself (`--val-split`) of a CSV
index of absolute paths: the index moved with its images and rewritten for their new place takes
back the same validation images (their paths below the folder they all lie in are the run's);
an index of other images, or of the run's images in another layout, is still refused (in-process
CliRunner: no process boundary is under test)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from checkpoints import read_checkpoint
from image_folders import write_image_folder
from processes import run_torchkit_in_process
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.data.sources import open_labelled, recorded_splits
from torchkit.core.io.errors import InputError

TINY = ["--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "4", "--workers", "0"]
FIRST = [*TINY, "--epochs", "1", "--device", "cpu", "--val-split", "0.25"]
# The run's model is code (nets:TinyNet), which a checkpoint names: trusted on resume.
MORE = ["--epochs", "2", "--trust-checkpoint"]
COUNTS = {"ant": 4, "bee": 4, "cat": 4}


def train(*args) -> object:
    return CliRunner().invoke(app, ["train", *map(str, args)])


def write_index(path: Path, rows: list[tuple[str, ...]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label", "split"][: len(rows[0])])
        writer.writerows(rows)
    return path


def absolute_rows(images: Path, *, split: bool) -> list[tuple[str, ...]]:
    """A row per image of the class folders under `images`, its path absolute (with `train`
    in a split column where `split`: the run holds its validation images out of train)."""
    return [
        (str(image), image.parent.name, *(["train"] if split else []))
        for name in COUNTS
        for image in sorted((images / name).iterdir())
    ]


def respelled(rows: list[tuple[str, ...]], old: Path, new: Path) -> list[tuple[str, ...]]:
    return [(path.replace(str(old), str(new), 1), *rest) for path, *rest in rows]


def warnings_and_errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith(("Warning", "Error"))]


def error_line(result) -> str:
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(params=[False, True], ids=["unsplit", "train-only"])
def first_run(request, tmp_path) -> tuple[Path, list[tuple[str, ...]], Path]:
    """(the images' folder, its index's rows, the run's folder): one epoch on an index of
    absolute paths, 3 of its 12 images held out for validation."""
    images = write_image_folder(tmp_path / "data" / "images", COUNTS, seed=1)
    rows = absolute_rows(images, split=request.param)
    index = write_index(tmp_path / "data" / "index.csv", rows)
    run = tmp_path / "run"
    result = train("--data", index, *FIRST, "--out", run)
    assert result.exit_code == 0, result.stderr
    held = read_checkpoint(run / "last.pt")["data"]["held_out"]["val"]
    assert len(held) == 3 and all(path.startswith(str(images) + "/") for path in held)
    return images, rows, run


def test_the_index_moved_with_its_images_takes_back_the_same_validation_images(first_run, tmp_path):
    images, rows, run = first_run
    held = read_checkpoint(run / "last.pt")["data"]["held_out"]["val"]
    moved = Path(shutil.move(tmp_path / "data", tmp_path / "disk2" / "mounted" / "data"))
    index = write_index(moved / "index.csv", respelled(rows, images, moved / "images"))
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []
    assert (
        f"Note: the training run's val images lay in {images}: its val split is matched by "
        f"their paths below it in {moved / 'images'}\n"
    ) in result.stderr
    assert read_checkpoint(run / "last.pt")["epoch"] == 2
    # the same images, named where they are now (recorded so: a later resume matches as is)
    now = read_checkpoint(run / "last.pt")["data"]["held_out"]["val"]
    assert sorted(now) == sorted(p.replace(str(images), str(moved / "images"), 1) for p in held)
    # eval of the checkpoint on the moved index scores those same images
    scored = run_torchkit_in_process(
        "eval", run / "last.pt", "--data", index, "--split", "val", "--device", "cpu",
        "--workers", "0", "--trust-checkpoint",
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    assert "the val split the training run made: 3 images" in scored.stderr


def test_the_images_in_another_layout_are_refused(first_run, tmp_path):
    """The run's files, but two of their three class folders one level deeper: no folder holds
    them as the run's did, so they are not shown to be the run's images."""
    images, rows, run = first_run
    deeper = tmp_path / "disk2" / "images"
    shutil.copytree(images / "ant", deeper / "ant")
    for name in ("bee", "cat"):
        shutil.copytree(images / name, deeper / "more" / name)
    index = write_index(
        tmp_path / "disk2" / "index.csv",
        [
            (
                path.replace(str(images), str(deeper if label == "ant" else deeper / "more")),
                label,
                *rest,
            )
            for path, label, *rest in rows
        ],
    )
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 1
    assert "the training run held out for val are not in" in error_line(result)


def test_other_images_are_still_refused(first_run, tmp_path):
    """Other data, the same class folders and as many images, named otherwise: refused, the run
    validated on images this data does not have."""
    images, rows, run = first_run
    other = write_image_folder(tmp_path / "other" / "images", {name: 4 for name in COUNTS}, seed=7)
    for name in COUNTS:
        for image in sorted((other / name).iterdir()):
            image.rename(image.with_name(f"new-{image.name}"))
    index = write_index(
        tmp_path / "other" / "index.csv", absolute_rows(other, split=len(rows[0]) == 3)
    )
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 1
    line = error_line(result)
    assert "3 of the 3 images the training run held out for val are not in" in line


def held_out_of(index: Path, held: list[str]) -> list[str] | str:
    """The val images `recorded_splits` takes of `index` for a run that held out `held` of all
    its images, or its error's message."""
    recorded = {"held_out": {"val": held}, "held_out_of": "all", "root": "/old", "spec": "x"}
    try:
        rebuilt = recorded_splits(open_labelled(index)[0], recorded)
    except InputError as error:
        return str(error)
    assert rebuilt is not None
    return sorted(rebuilt[0]["val"].ids)


def named_alike(root: Path, folders: list[str]) -> list[str]:
    """One image named 0.png in each of `folders` under `root`, their absolute paths."""
    paths = []
    for folder in folders:
        image = write_image_folder(root / folder, {"x": 1}) / "x" / "x_0.png"
        paths.append(str(image.rename(root / folder / "0.png")))
    return paths


def test_one_held_out_image_is_found_in_the_folder_named_as_its_own(tmp_path):
    """A single held-out image lies below its class folder: of the folders that hold a file of
    its name, the one named as that class folder is the one it moved to."""
    paths = named_alike(tmp_path / "new", ["ant", "bee", "cat"])
    index = write_index(tmp_path / "index.csv", [(path, path.split("/")[-2]) for path in paths])
    assert held_out_of(index, ["/old/data/bee/0.png"]) == [paths[1]]
    # two held out: they lay in /old/data, its files' paths below it are found below tmp/new
    found = held_out_of(index, ["/old/data/ant/0.png", "/old/data/cat/0.png"])
    assert found == [paths[0], paths[2]]


def test_two_folders_that_could_hold_them_alike_are_refused(tmp_path):
    """The index lists the layout twice, under copies named alike as the run's folder: which
    copy holds the run's images is unknown, so neither is taken."""
    paths = named_alike(tmp_path, ["one/data/ant", "one/data/bee", "two/data/ant", "two/data/bee"])
    index = write_index(
        tmp_path / "index.csv", [(path, "ant" if "/ant/" in path else "bee") for path in paths]
    )
    found = held_out_of(index, ["/old/data/ant/0.png", "/old/data/bee/0.png"])
    assert found == (
        f"2 of the 2 images the training run held out for val are not in {index} (e.g. "
        "/old/data/ant/0.png) (give the data the run trained on: /old)"
    )
    # the run's own folder among them is taken as it is
    assert held_out_of(index, paths[2:]) == paths[2:]
