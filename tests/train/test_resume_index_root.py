"""`train --resume` on the run's images named from another folder: a split folder's
`train/ant/a.png` is a CSV index's `data/train/ant/a.png` where the index lies beside the
folder, not in it; truly other images are refused still (in-process CliRunner)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from checkpoints import read_checkpoint
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

from torchkit.core.models.checkpoint import save_checkpoint

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
    for spec, run in ((data, root / "on-folder"), (index, root / "on-index")):
        result = train("--data", spec, *FIRST, "--out", run)
        assert result.exit_code == 0, result.stderr
    return data, root / "on-folder", root / "on-index"


@pytest.fixture
def copied(runs, tmp_path) -> tuple[Path, Path, Path]:
    """A copy of the data (with the index beside it, in `project/`) and of both runs."""
    data, on_folder, on_index = runs
    project = Path(shutil.copytree(data.parent, tmp_path / "project"))
    return (
        project / "data",
        Path(shutil.copytree(on_folder, tmp_path / "on-folder")),
        Path(shutil.copytree(on_index, tmp_path / "on-index")),
    )


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


def test_a_checkpoint_of_digests_made_by_an_earlier_version_resumes_and_records_them_anew(
    copied,
):
    """Digests of another making (`-v1`: names counted from the data root) are not compared:
    such a run resumes as it did before, records digests of this making, and is held to them
    from then on."""
    data, run, _ = copied
    checkpoint = read_checkpoint(run / "last.pt")
    ours = checkpoint["data"]["digests"]
    earlier = hashlib.sha256(b"an earlier making").hexdigest()
    checkpoint["data"]["digests"] = {
        "train": "ids-in-order-v1:" + earlier,
        "val": "ids-as-set-v1:" + earlier,
    }
    save_checkpoint(checkpoint, run / "last.pt")
    result = train("--resume", run, "--data", data.parent / "index.csv", *MORE)
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
