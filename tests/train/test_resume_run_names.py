"""`train --resume RUN` continues RUN in place, renaming each file it writes over the one there:
an entry of another kind under one of their names (a folder named metrics.csv, a file named
tensorboard with --tensorboard) is refused before any work, named. It trained an epoch, then
ended with `Error: IsADirectoryError: [Errno 21] Is a directory: ... -> 'run/metrics.csv'`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from image_folders import write_image_folder
from output_checks import error_line, tree_digest
from processes import run_each_in_process, run_torchkit_in_process

from torchkit.core.train.config import TrainConfig

TINY = ["--model", "convnet", "--image-size", "8", "--batch-size", "4", "--workers", "0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A one-epoch run `run` (with epoch-001.pt) on `ds`."""
    world = tmp_path_factory.mktemp("world")
    write_image_folder(world / "ds", {"a": 6, "b": 6})
    done = run_torchkit_in_process(
        "train", *TINY, "--data", "ds", "--val-split", "0.3", "--epochs", "1", "--out", "run",
        "--save-every", "1", cwd=world,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return world / "run"


def test_entries_of_another_kind_under_the_run_names_are_refused_before_any_work(trained, tmp_path):
    shutil.copytree(trained.parent / "ds", tmp_path / "ds")
    cases = {
        "metrics.csv": "folder",
        "split.csv": "folder",
        "config.json": "folder",
        "curves.png": "folder",
        "best.pt": "folder",
        "epoch-001.pt": "folder",
        "tensorboard": "file",
    }
    commands = []
    for name, kind in cases.items():
        copy = tmp_path / f"run-{name}"
        shutil.copytree(trained, copy)
        target = copy / name
        if target.is_file():
            target.unlink()
        if kind == "folder":
            target.mkdir()
            (target / "notes.txt").write_text("mine\n")
        else:
            target.write_text("mine\n")
        commands.append(["train", "--resume", copy.name, "--epochs", "2", "--tensorboard"])
    before = tree_digest(tmp_path)
    results = run_each_in_process(commands, cwd=tmp_path)
    for (name, kind), result in zip(cases.items(), results, strict=True):
        assert result.returncode == 1, (name, result.stderr)
        line = error_line(result.stderr)
        if kind == "folder":
            expected = f"run-{name}/{name} is a folder, where the run writes its {name} file"
        else:
            expected = f"run-{name}/{name} is not a folder, where the run writes its {name}/"
        assert expected in line, name
        assert f"(move it out of run-{name} or rename it, then resume again)" in line, name
        assert "epoch 2" not in result.stderr  # refused before training
    assert tree_digest(tmp_path) == before


def test_a_file_named_tensorboard_is_no_obstacle_to_a_run_without_its_log(tmp_path):
    from torchkit.core.train.run_folder import _check_run_names

    (tmp_path / "tensorboard").write_text("mine\n")
    (tmp_path / "profile").write_text("mine\n")
    _check_run_names(tmp_path, TrainConfig(tensorboard=False, profile_steps=0))
    with pytest.raises(Exception, match="profile is not a folder"):
        _check_run_names(tmp_path, TrainConfig(tensorboard=False, profile_steps=2))


def test_a_folder_named_last_pt_is_named(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "run")
    (tmp_path / "run" / "last.pt").unlink()
    (tmp_path / "run" / "last.pt").mkdir()
    result = run_torchkit_in_process("train", "--resume", "run", cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result.stderr).startswith(
        "Error: run/last.pt is a folder, not a checkpoint (to go on from best.pt's epoch"
    )
