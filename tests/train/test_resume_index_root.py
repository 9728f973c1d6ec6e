"""`train --resume` on the run's images named from another folder: a split folder's
`train/ant/a.png` is a CSV index's `data/train/ant/a.png` where the index lies beside the
folder, not in it; truly other images are refused still (in-process CliRunner)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from checkpoints import read_checkpoint
from image_folders import write_image_folder
from resume_runs import copied_project, runs_on_folder_and_index
from test_resume_data_cli import (
    COUNTS,
    FIRST,
    MORE,
    error_line,
    index_rows,
    train,
    warnings_and_errors,
    write_index,
    write_split_root,
)

from torchkit.core.data.sources import open_data
from torchkit.core.models.checkpoint import save_checkpoint
from torchkit.core.train import resume_data

Row = tuple[str, str, str]


def beside(data: Path, rows: list[Row]) -> list[Row]:
    """`rows` (paths relative to `data`) as an index in `data`'s parent folder writes them."""
    return [(f"{data.name}/{path}", label, split) for path, label, split in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the data, a run started on its folder, a run started on an index beside it): one epoch
    each, which each test copies."""
    root = tmp_path_factory.mktemp("runs")
    data = write_split_root(root / "project" / "data")
    index = write_index(root / "project" / "index.csv", beside(data, index_rows(data, [*COUNTS])))
    return data, *runs_on_folder_and_index(root, data, index, train, FIRST)


@pytest.fixture
def copied(runs, tmp_path) -> tuple[Path, Path, Path]:
    """A copy of the data (with the index beside it, in `project/`) and of both runs."""
    return copied_project(*runs, tmp_path)


def test_a_run_on_a_folder_resumes_silently_on_an_index_beside_it(copied):
    """The index's `data/val/ant/ant_0.png` is the folder's `val/ant/ant_0.png`: both splits'
    names count from the folder all of their images lie in (they were refused as other
    validation images)."""
    data, run, _ = copied
    digests = read_checkpoint(run / "last.pt")["data"]["digests"]
    result = train("--resume", run, "--data", data.parent / "index.csv", *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []
    assert read_checkpoint(run / "last.pt")["data"]["digests"] == digests


def test_a_run_on_an_index_beside_the_folder_resumes_silently_on_the_folder(copied):
    data, _, run = copied
    result = train("--resume", run, "--data", data, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []


def test_an_index_moved_into_the_folder_and_rewritten_for_it_is_the_same_samples(copied):
    """The other way of writing one index: moved from beside the folder into it, its paths
    relative to it now (`val/ant/ant_0.png`)."""
    data, _, run = copied
    inside = write_index(data / "index.csv", index_rows(data, [*COUNTS]))
    result = train("--resume", run, "--data", inside, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []


def test_an_index_beside_the_folder_that_validates_on_a_training_image_is_refused(copied):
    """As many images, and the same folder below `data/` they count from: a training image
    validates and a validation image trains (the data split again), through the index."""
    data, run, _ = copied
    rows = index_rows(data, [*COUNTS])
    val = rows.index(("val/ant/ant_0.png", "ant", "val"))
    trained = rows.index(("train/ant/ant_3.png", "ant", "train"))
    rows[val], rows[trained] = (rows[trained][0], "ant", "val"), (rows[val][0], "ant", "train")
    index = write_index(data.parent / "index.csv", beside(data, rows))
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 1
    assert error_line(result).startswith(
        "Error: the data's 6 validation images are not those the run was validated on"
    )


def test_an_index_beside_the_folder_that_labels_a_validation_image_otherwise_is_refused(
    copied,
):
    data, run, _ = copied
    rows = index_rows(data, [*COUNTS])
    at = rows.index(("val/bee/bee_0.png", "bee", "val"))
    rows[at] = ("val/bee/bee_0.png", "cat", "val")
    index = write_index(data.parent / "index.csv", beside(data, rows))
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 1
    assert "6 validation images are not those the run was validated on" in error_line(result)


def test_an_index_beside_the_folder_that_validates_on_its_test_images_named_alike_is_refused(
    copied,
):
    """Images numbered per split: `data/test/ant/ant_0.png` beside `data/val/ant/ant_0.png`.
    An index whose val rows point at the test folder's (its val column written for test/)
    names as many images, labelled alike, alike below the folder each split's lie in; they
    are other files, refused (they resumed without a word, validating on the test images)."""
    data, run, _ = copied
    write_image_folder(data / "test", {name: 2 for name in COUNTS}, seed=3)  # as val/ names
    rows = [
        (f"test/{path.removeprefix('val/')}" if split == "val" else path, label, split)
        for path, label, split in index_rows(data, [*COUNTS])
    ]
    assert ("test/ant/ant_0.png", "ant", "val") in rows
    index = write_index(data.parent / "index.csv", beside(data, rows))
    before = read_checkpoint(run / "last.pt")
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 1
    assert error_line(result).startswith(
        "Error: the data's 6 validation images are not those the run was validated on"
    )
    assert read_checkpoint(run / "last.pt")["epoch"] == before["epoch"]
    # the folder's own val/ still resumes, beside its test/ (recorded, never compared)
    result = train("--resume", run, "--data", data, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []


def test_other_training_images_through_an_index_beside_the_folder_are_one_warning(copied):
    data, run, _ = copied
    rows = index_rows(data, [*COUNTS])
    shutil.copy(data / "train/ant/ant_0.png", data / "train/ant/other.png")
    rows[0] = ("train/ant/other.png", "ant", "train")
    index = write_index(data.parent / "index.csv", beside(data, rows))
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 0, result.stderr
    (warning,) = warnings_and_errors(result)  # the one, no refusal of the validation images
    assert "the data's 12 training images are not those the run started with" in warning


def earlier_digests(run: Path, data: Path, version: int = 1) -> dict:
    """`run`'s last.pt with the digests `version` made of its data's splits (`data`, the
    folder it started on), in place of its own; its own."""
    checkpoint = read_checkpoint(run / "last.pt")
    ours = checkpoint["data"]["digests"]
    splits = open_data(str(data)).splits
    checkpoint["data"]["digests"] = {
        "train": resume_data._earlier_digest(f"ids-in-order-v{version}:", splits["train"]),
        "val": resume_data._earlier_digest(f"ids-as-set-v{version}:", splits["val"]),
    }
    assert checkpoint["data"]["digests"] != ours  # (a split folder's `val/`: v2 cut it off)
    save_checkpoint(checkpoint, run / "last.pt")
    return ours


def test_a_checkpoint_of_digests_made_by_an_earlier_version_resumes_and_records_them_anew(
    copied,
):
    """Digests of another making (`-v1`: names counted from the data root) are compared with
    the data digested as they were made: the run's own data resumes silently and records
    digests of this making, which hold it from then on."""
    data, run, _ = copied
    ours = earlier_digests(run, data)
    result = train("--resume", run, "--data", data, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []
    assert read_checkpoint(run / "last.pt")["data"]["digests"] == ours
    rows = index_rows(data, [*COUNTS])
    at = rows.index(("val/bee/bee_0.png", "bee", "val"))
    rows[at] = ("val/bee/bee_0.png", "cat", "val")
    index = write_index(data.parent / "index.csv", beside(data, rows))
    again = train("--resume", run, "--data", index, "--epochs", "3", "--trust-checkpoint")
    assert again.exit_code == 1
    assert "6 validation images are not those the run was validated on" in error_line(again)


def test_a_checkpoint_of_earlier_digests_is_refused_other_validation_images(copied):
    """Resumed uncompared, a checkpoint of v1's digests recorded the other images' digests of
    this making, and went on validating on them: compared as v1 made them, they are refused,
    as v1 refused them (and so is an index beside the folder, which v1 told apart; one inside
    it, which v1 named alike, resumes)."""
    data, run, _ = copied
    earlier_digests(run, data)
    rows = index_rows(data, [*COUNTS])
    at = rows.index(("val/bee/bee_0.png", "bee", "val"))
    rows[at] = ("val/bee/bee_0.png", "cat", "val")
    for written in (rows, index_rows(data, [*COUNTS])):
        index = write_index(data.parent / "index.csv", beside(data, written))
        result = train("--resume", run, "--data", index, *MORE)
        assert result.exit_code == 1
        assert "6 validation images are not those the run was validated on" in error_line(result)
    inside = write_index(data / "index.csv", index_rows(data, [*COUNTS]))  # named as v1 did
    result = train("--resume", run, "--data", inside, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []


def test_a_checkpoint_of_v2s_digests_is_compared_as_v2_made_them(copied):
    """v2 cut a split root's `val/` off its names (this version keeps it): a checkpoint of
    v2's digests is compared with the data digested as v2 made them, so the run's own data,
    through its folder or an index beside it, resumes without a word and records this
    version's digests; other validation images are refused still."""
    data, run, _ = copied
    ours = earlier_digests(run, data, version=2)
    rows = index_rows(data, [*COUNTS])
    index = write_index(data.parent / "index.csv", beside(data, rows))
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []
    recorded = read_checkpoint(run / "last.pt")["data"]["digests"]
    assert recorded == ours and recorded["val"].startswith("ids-as-set-v4:")
    earlier_digests(run, data, version=2)
    at = rows.index(("val/bee/bee_0.png", "bee", "val"))
    rows[at] = ("val/bee/bee_0.png", "cat", "val")
    write_index(data.parent / "index.csv", beside(data, rows))
    again = train("--resume", run, "--data", index, "--epochs", "3", "--trust-checkpoint")
    assert again.exit_code == 1
    assert "6 validation images are not those the run was validated on" in error_line(again)


def test_an_image_folder_named_for_another_split_resumes_through_an_index_beside_it(tmp_path):
    """A folder of class folders named `test/`, whose validation images the run held out:
    through an index beside it (`test/ant/ant_0.png`) they are the folder's `ant/ant_0.png`
    still; only a folder named for the split its names are of is kept."""
    images = write_image_folder(tmp_path / "test", COUNTS, seed=1)
    run = tmp_path / "run"
    result = train("--data", images, *FIRST, "--val-split", "0.25", "--out", run)
    assert result.exit_code == 0, result.stderr
    rows = [
        f"test/{image.relative_to(images).as_posix()}" for image in sorted(images.rglob("*.png"))
    ]
    index = tmp_path / "index.csv"
    index.write_text("path,label\n" + "".join(f"{row},{row.split('/')[1]}\n" for row in rows))
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []


@pytest.mark.parametrize("name", ["val", "dev", "VAL", "train"])
def test_an_image_folder_named_for_a_split_it_had_resumes_through_an_index_beside_it(
    tmp_path, name
):
    """A folder of class folders named `val/` (or `dev/`, `VAL/`; `train/`) whose validation
    images the run held out (--val-split): through an index beside it (`val/ant/ant_0.png`)
    they are the folder's `ant/ant_0.png` still, as its training images are. They were refused
    as other validation images (`train/`'s training images warned of): the folder named for the
    split was kept of the index's names only, though the data's layout made no split."""
    images = write_image_folder(tmp_path / name, COUNTS, seed=1)
    run = tmp_path / "run"
    result = train("--data", images, *FIRST, "--val-split", "0.25", "--out", run)
    assert result.exit_code == 0, result.stderr
    rows = [
        f"{name}/{image.relative_to(images).as_posix()}" for image in sorted(images.rglob("*.png"))
    ]
    index = tmp_path / "index.csv"
    index.write_text("path,label\n" + "".join(f"{row},{row.split('/')[1]}\n" for row in rows))
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []


def test_a_validation_split_of_one_class_through_an_index_at_its_test_images_is_refused(
    tmp_path,
):
    """val/ holds one class (`val/ant/`, all of its names lie in): the folder named for the
    split is kept before the class folder, as where val/ has more classes, so an index beside
    the root whose val rows point at the test folder's images of the same names is refused
    (it resumed without a word), while the index of the folder's own val/ resumes."""
    data = tmp_path / "project" / "data"
    write_image_folder(data / "train", COUNTS, seed=1)
    write_image_folder(data / "val", {"ant": 2}, seed=2)
    write_image_folder(data / "test", {"ant": 2}, seed=3)  # as val/'s names
    run = tmp_path / "run"
    result = train("--data", data, *FIRST, "--out", run)
    assert result.exit_code == 0, result.stderr
    rows = [
        (image.relative_to(data).as_posix(), image.parent.name, split)
        for split in ("train", "val")
        for image in sorted((data / split).rglob("*.png"))
    ]
    own = write_index(tmp_path / "project" / "own.csv", beside(data, rows))
    result = train("--resume", run, "--data", own, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []
    swapped = [
        (f"test/{path.removeprefix('val/')}" if split == "val" else path, label, split)
        for path, label, split in rows
    ]
    assert ("test/ant/ant_0.png", "ant", "val") in swapped
    index = write_index(tmp_path / "project" / "index.csv", beside(data, swapped))
    result = train("--resume", run, "--data", index, "--epochs", "3", "--trust-checkpoint")
    assert result.exit_code == 1
    assert error_line(result).startswith(
        "Error: the data's 2 validation images are not those the run was validated on"
    )
