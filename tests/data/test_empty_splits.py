"""A split root with a split folder that holds no image: that split is read as absent (a
warning), and asking for it is an error naming it, in every command that reads --data."""

from __future__ import annotations

import json
import logging
import tarfile
from pathlib import Path

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.data.sources import open_data, select_split, training_splits
from torchkit.core.io.errors import InputError


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """train/{a,b} of 4 images each, val/ without anything, test/a/ without images."""
    root = tmp_path / "sr"
    write_image_folder(root / "train", {"a": 4, "b": 4})
    (root / "val").mkdir()
    (root / "test" / "a").mkdir(parents=True)
    return root


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_empty_split_folders_are_no_splits(root):
    source = open_data(root)
    assert list(source.splits) == ["train"] and len(source.splits["train"]) == 8
    assert source.empty_splits == {"val": str(root / "val"), "test": str(root / "test")}
    assert source.classes == ["a", "b"]


def test_a_tar_of_the_split_root_reads_its_empty_split_folders_alike(root, tmp_path):
    archive = tmp_path / "sr.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname="sr")
    source = open_data(archive)
    assert list(source.splits) == ["train"] and len(source.splits["train"]) == 8
    assert source.empty_splits == {"val": f"{archive}:val", "test": f"{archive}:test"}


def test_a_split_root_without_any_image_is_refused(tmp_path):
    (tmp_path / "sr" / "train" / "a").mkdir(parents=True)
    (tmp_path / "sr" / "test").mkdir()
    with pytest.raises(InputError, match=r"no images in .*sr: its split folders \(train/, test/\)"):
        open_data(tmp_path / "sr")


def test_an_unused_empty_split_is_a_warning_an_asked_one_an_error(root, caplog):
    source = open_data(root)
    samples, _ = select_split(source, "train", default="test")
    assert len(samples) == 8
    assert warnings_of(caplog) == [
        f"{root / 'val'} holds no images: {root} is read without a val split",
        f"{root / 'test'} holds no images: {root} is read without a test split",
    ]
    samples, _ = select_split(source, "all", default="all")
    assert set(samples.splits) == {"train"}
    for asked, default in [("test", "train"), (None, "test")]:  # asked, or the default
        with pytest.raises(InputError) as caught:
            select_split(source, asked, default=default)
        assert caught.value.message == (
            f"no images in {root / 'test'}: the test split of {root} is empty"
        )
        assert caught.value.hint == "it has: train; --split NAME picks another"


def test_train_holds_val_out_of_train_when_val_is_empty(root, caplog):
    splits, notes = training_splits(open_data(root), val_split=None, seed=0)
    assert set(splits) == {"train", "val"}  # no test: its folder is empty
    assert len(splits["train"]) + len(splits["val"]) == 8
    assert "has no val split (train): holding out 0.1 of its train split" in notes[0]
    assert len(warnings_of(caplog)) == 2


def test_train_refuses_an_empty_or_missing_train_split(tmp_path):
    empty_train = tmp_path / "empty"
    (empty_train / "train" / "a").mkdir(parents=True)
    write_image_folder(empty_train / "val", {"a": 2})
    with pytest.raises(InputError, match=r"no images in .*train: the train split of .* is empty"):
        training_splits(open_data(empty_train), val_split=None, seed=0)
    # val/ and test/ without train/ was a KeyError: 'train' in the run's set-up
    no_train = tmp_path / "none"
    write_image_folder(no_train / "val", {"a": 2})
    write_image_folder(no_train / "test", {"a": 2})
    with pytest.raises(InputError, match="has no training split") as caught:
        training_splits(open_data(no_train), val_split=None, seed=0)
    assert caught.value.hint == "add train/, or rows with split train"


def test_commands_read_the_other_splits_and_refuse_the_empty_one(root, tmp_path):
    stats = run_torchkit_in_process("dataset-stats", root, "--format", "json", "--workers", "0")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["images"] == 8
    assert f"Warning: {root / 'test'} holds no images" in stats.stderr
    refused = run_torchkit_in_process("dataset-stats", root, "--split", "test", "--workers", "0")
    assert refused.returncode == 1
    assert error_line(refused.stderr).startswith(f"Error: no images in {root / 'test'}: ")

    checkpoint = tmp_path / "two.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    predicted = run_torchkit_in_process(
        "predict", checkpoint, root, "--split", "train", "--format", "csv", "--workers", "0"
    )
    assert predicted.returncode == 0, predicted.stderr
    assert len(predicted.stdout.splitlines()) == 1 + 8
    for command in (["eval", checkpoint, "--data"], ["predict", checkpoint]):
        asked = run_torchkit_in_process(*command, root, "--split", "test")
        assert asked.returncode == 1 and "the test split of" in error_line(asked.stderr)
    # split takes no split data as input, empty splits or not
    again = run_torchkit_in_process("split", root, "--out", tmp_path / "out")
    assert again.returncode == 1 and "is split already" in error_line(again.stderr)
    shards = tmp_path / "shards"
    converted = run_torchkit_in_process("convert", "shards", root, shards)
    assert converted.returncode == 0, converted.stderr
    assert f"Warning: {root / 'test'} holds no images" in converted.stderr
    assert sorted(p.name for p in shards.glob("*.tar")) == ["train-000000.tar"]
