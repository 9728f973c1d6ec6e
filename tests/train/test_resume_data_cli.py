"""`train --resume` on data that is not the run's, the same number of images: a re-split folder,
an index pointing at other files, files relabelled (in-process CliRunner: no process boundary is
under test)."""

from __future__ import annotations

import contextlib
import csv
import shutil
from pathlib import Path

import pytest
from checkpoints import read_checkpoint
from image_folders import write_image_folder
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.io.errors import CheckpointError
from torchkit.core.models.checkpoint import save_checkpoint

TINY = ["--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "4", "--workers", "0"]
FIRST = [*TINY, "--epochs", "1", "--device", "cpu"]
# The run's model is code (nets:TinyNet), which a checkpoint names: trusted on resume.
MORE = ["--epochs", "2", "--trust-checkpoint"]
COUNTS = {"ant": 4, "bee": 4, "cat": 4}


def train(*args) -> object:
    return CliRunner().invoke(app, ["train", *map(str, args)])


def write_split_root(root: Path) -> Path:
    write_image_folder(root / "train", COUNTS, seed=1)
    write_image_folder(root / "val", {name: 2 for name in COUNTS}, seed=2)
    return root


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[Path, Path]:
    """(its data, its run folder): one epoch on a split root, which each test copies."""
    root = tmp_path_factory.mktemp("first")
    data = write_split_root(root / "data")
    result = train("--data", data, *FIRST, "--out", root / "run")
    assert result.exit_code == 0, result.stderr
    return data, root / "run"


@pytest.fixture
def copies(first_run, tmp_path) -> tuple[Path, Path]:
    """A copy of the first run's data and of its folder, for a test to change."""
    data, run = first_run
    return Path(shutil.copytree(data, tmp_path / "data")), Path(
        shutil.copytree(run, tmp_path / "run")
    )


def error_line(result) -> str:
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def warnings_and_errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith(("Warning", "Error"))]


def folder_state(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Each file under `folder`: its bytes and modification time."""
    return {
        str(path.relative_to(folder)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def swap(data: Path, one: str, other: str) -> None:
    """The files `one` and `other` (relative to `data`) moved to each other's folder (as
    `moved-NAME` where that folder holds a file of its name)."""
    first, second = data / one, data / other
    for file, folder in ((first, second.parent), (second, first.parent)):
        target = folder / file.name
        file.rename(folder / f"moved-{file.name}" if target.exists() else target)


def test_the_checkpoint_records_a_digest_of_each_splits_samples(first_run):
    digests = read_checkpoint(first_run[1] / "last.pt")["data"]["digests"]
    assert set(digests) == {"train", "val"}
    assert digests["train"].startswith("ids-in-order-v4:")
    assert digests["val"].startswith("ids-as-set-v4:")


def test_data_split_again_is_refused_and_the_run_left_untouched(copies):
    """Another seed's split of the same images: a validation image now trains and a training
    image validates, as many of each as before. The run's metrics so far and its best.pt were
    measured on its own validation images."""
    data, run = copies
    swap(data, "val/ant/ant_0.png", "train/ant/ant_3.png")
    before = folder_state(run)
    result = train("--resume", run, "--data", data, *MORE)
    assert result.exit_code == 1
    line = error_line(result)
    assert line.startswith(
        "Error: the data's 6 validation images are not those the run was validated on"
    )
    assert f"which {run / 'split.csv'} lists," in line
    assert f"start a new run from its weights with --weights {run / 'last.pt'})" in line
    assert folder_state(run) == before  # nothing written, nothing touched: last.pt the same
    assert warnings_and_errors(result) == [line]  # said once, as the refusal


def test_the_refusal_quotes_the_weights_of_a_run_folder_whose_name_has_a_space(first_run, tmp_path):
    """`--weights my run/last.pt` would be two words: the hint's is one a user can paste."""
    data, run = first_run
    data = Path(shutil.copytree(data, tmp_path / "data"))
    run = Path(shutil.copytree(run, tmp_path / "my run"))
    swap(data, "val/ant/ant_0.png", "train/ant/ant_3.png")
    result = train("--resume", run, "--data", data, *MORE)
    assert result.exit_code == 1
    line = error_line(result)
    assert line.endswith(f"start a new run from its weights with --weights '{run / 'last.pt'}')")


def test_training_images_moved_between_classes_are_one_warning_and_the_run_goes_on(copies):
    data, run = copies
    swap(data, "train/ant/ant_3.png", "train/bee/bee_0.png")  # relabelled, as many as before
    result = train("--resume", run, "--data", data, *MORE)
    assert result.exit_code == 0, result.stderr
    warning = "the data's 12 training images are not those the run started with"
    assert result.stderr.count(warning) == 1
    assert f"which {run / 'split.csv'} lists, to continue it exactly" in result.stderr
    assert read_checkpoint(run / "last.pt")["epoch"] == 2
    # The run records the images it went on with: resumed on them again, it says nothing.
    again = train("--resume", run, "--data", data, "--epochs", "3", "--trust-checkpoint")
    assert again.exit_code == 0, again.stderr
    assert warnings_and_errors(again) == []


def test_a_run_whose_data_moved_elsewhere_resumes_without_a_word(copies, tmp_path):
    """Another machine, another mount point: the same files under another root."""
    data, run = copies
    moved = Path(shutil.move(data, tmp_path / "mnt" / "elsewhere"))
    result = train("--resume", run, "--data", moved, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []


def test_a_checkpoint_written_before_digests_resumes_as_before(copies):
    data, run = copies
    checkpoint = read_checkpoint(run / "last.pt")
    del checkpoint["data"]["digests"]
    save_checkpoint(checkpoint, run / "last.pt")
    swap(data, "val/ant/ant_0.png", "train/ant/ant_3.png")
    result = train("--resume", run, "--data", data, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []
    assert "digests" in read_checkpoint(run / "last.pt")["data"]  # recorded from now on


def test_another_number_of_validation_images_is_one_warning(copies):
    data, run = copies
    write_image_folder(data / "val", {"ant": 3}, seed=5)  # ant_0..2 again, and ant_2 new
    result = train("--resume", run, "--data", data, *MORE)
    assert result.exit_code == 0, result.stderr
    warning = "the checkpoint was validated on 6 images, the data has 7: the run continues"
    assert result.stderr.count(warning) == 1
    assert "Error" not in result.stderr


def write_index(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label", "split"])
        writer.writerows(rows)
    return path


def index_rows(data: Path, classes: list[str]) -> list[tuple[str, str, str]]:
    """A row per image of `data`'s split folders, in `classes`' order."""
    return [
        (image.relative_to(data).as_posix(), name, split)
        for split in ("train", "val")
        for name in classes
        for image in sorted((data / split / name).iterdir())
    ]


def run_on_an_index(tmp_path: Path) -> tuple[Path, list[tuple[str, str, str]], Path, Path]:
    """A first run on a CSV index of split folders: the data, the index's rows, the index, the
    run folder."""
    data = write_split_root(tmp_path / "data")
    rows = index_rows(data, list(COUNTS))
    index = write_index(data / "index.csv", rows)
    run = tmp_path / "run"
    assert train("--data", index, *FIRST, "--out", run).exit_code == 0
    return data, rows, index, run


def test_an_index_that_labels_a_validation_image_otherwise_is_refused(tmp_path):
    data, rows, index, run = run_on_an_index(tmp_path)
    at = next(i for i, row in enumerate(rows) if row[2] == "val" and row[1] == "ant")
    rows[at] = (rows[at][0], "bee", "val")
    write_index(index, rows)
    result = train("--resume", run, *MORE)  # the run's own --data
    assert result.exit_code == 1
    assert "6 validation images are not those the run was validated on" in error_line(result)


def test_an_index_pointing_at_other_training_files_is_one_warning(tmp_path):
    data, rows, index, run = run_on_an_index(tmp_path)
    shutil.copy(data / "train/ant/ant_0.png", data / "train/ant/other.png")
    rows[0] = ("train/ant/other.png", "ant", "train")
    write_index(index, rows)
    result = train("--resume", run, *MORE)
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("the data's 12 training images are not those the run") == 1


def test_a_folder_whose_classes_sort_otherwise_is_the_same_samples(tmp_path):
    """A folder sorts numbered classes as text (`1, 10, 2`), a CSV index of the same images as
    numbers (`1, 2, 10`): the index is labelled in the run's order before its samples are
    compared, so its images are the run's, in the run's order."""
    data = tmp_path / "data"
    counts = {"1": 4, "2": 4, "10": 4}
    write_image_folder(data / "train", counts, seed=1)
    write_image_folder(data / "val", {name: 2 for name in counts}, seed=2)
    index = write_index(data / "index.csv", index_rows(data, ["1", "10", "2"]))
    run = tmp_path / "run"
    assert train("--data", data, *FIRST, "--out", run).exit_code == 0
    assert read_checkpoint(run / "last.pt")["classes"] == ["1", "10", "2"]
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []


def test_an_index_of_absolute_paths_moved_with_its_images_is_the_same_samples(tmp_path):
    """The data moved to another disk and its index's absolute paths rewritten for it: the
    validation images are the run's (they were refused as other files)."""
    data = write_split_root(tmp_path / "data")
    rows = [
        (str(data / path), label, split)
        for path, label, split in index_rows(data, ["ant", "bee", "cat"])
    ]
    write_index(data / "index.csv", rows)
    run = tmp_path / "run"
    assert train("--data", data / "index.csv", *FIRST, "--out", run).exit_code == 0
    moved = Path(shutil.move(data, tmp_path / "disk2" / "data"))
    index = write_index(
        moved / "index.csv",
        [(path.replace(str(data), str(moved)), label, split) for path, label, split in rows],
    )
    result = train("--resume", run, "--data", index, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []


def seeds_and_data(rank: int, **options):
    """`setup._seeds_and_data` of a run of `options` as rank `rank` of 2 would run it."""
    import torch

    from torchkit.core.runtime.distributed import DistContext
    from torchkit.core.train import setup
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.state import Amp

    plan = setup.plan_run(TrainConfig(**options), None)
    ctx = DistContext(rank=rank, world_size=2, device=torch.device("cpu"))
    return setup._seeds_and_data(ctx, plan, Amp(contextlib.nullcontext, None, "float32"))


def test_a_new_run_digests_its_data_on_rank_0_alone_a_resumed_one_on_every_rank(copies):
    """Rank 0 writes the checkpoints that record the digests: the other ranks of a new run do
    not hash a million names each for nothing; every rank of a resumed run compares them, so
    that all of them stop alike."""
    data, run = copies
    new = {"data": str(data), "model": "nets:TinyNet", "image_size": 8}
    assert "digests" in seeds_and_data(0, **new).data.record
    assert "digests" not in seeds_and_data(1, **new).data.record
    swap(data, "val/ant/ant_0.png", "train/ant/ant_3.png")
    resumed = {"data": str(data), "resume": str(run), "epochs": 2, "trust_checkpoint": True}
    for rank in (0, 1):
        with pytest.raises(CheckpointError, match="validation images are not those"):
            seeds_and_data(rank, **resumed)


def test_a_run_that_held_out_its_validation_images_resumes_and_its_test_split_is_not_compared(
    tmp_path,
):
    """train/ and test/ without val/: --val-split holds validation images out of train by the
    seed, and the resumed run takes back the same ones, in the same order. Other test images
    (as many) say nothing: no metric so far was measured on them."""
    data = tmp_path / "data"
    write_image_folder(data / "train", {name: 5 for name in COUNTS}, seed=1)
    write_image_folder(data / "test", {name: 2 for name in COUNTS}, seed=2)
    run = tmp_path / "run"
    first = train("--data", data, *FIRST, "--val-split", "0.4", "--out", run)
    assert first.exit_code == 0, first.stderr
    digests = read_checkpoint(run / "last.pt")["data"]["digests"]
    assert set(digests) == {"train", "val", "test"}
    swap(data, "test/ant/ant_0.png", "test/bee/bee_1.png")
    result = train("--resume", run, *MORE)
    assert result.exit_code == 0, result.stderr
    assert warnings_and_errors(result) == []
    resumed = read_checkpoint(run / "last.pt")["data"]["digests"]
    assert resumed["train"] == digests["train"] and resumed["val"] == digests["val"]
    assert resumed["test"] != digests["test"]
