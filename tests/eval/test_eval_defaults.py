"""Issue #31, eval's honest defaults: on the data a checkpoint was trained on, eval scores the
split its run held out (not the training images) unless --split says otherwise, and without
--data it takes the data the checkpoint records."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from image_folders import write_image_folder
from output_checks import error_line

from torchkit.cli import app

CLASSES = {"a": 8, "b": 8, "c": 8}  # 24 images; --val-split 0.25 holds out 6


def _train(runner, data: str, out: Path) -> None:
    # The built-in convnet, not a folder's default resnet18: the data and split are under test.
    args = ["train", "--data", data, "--model", "convnet", "--epochs", "1", "--val-split", "0.25"]
    args += ["--image-size", "12", "--batch-size", "8", "--workers", "0", "--device", "cpu"]
    args += ["--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr


@pytest.fixture(scope="module")
def flat_run(tmp_path_factory) -> Path:
    """An unsplit folder and a run that trained on it (its val split held out and recorded)."""
    from typer.testing import CliRunner

    root = tmp_path_factory.mktemp("defaults")
    write_image_folder(root / "raw", CLASSES, size=12)
    _train(CliRunner(), str(root / "raw"), root / "run")
    return root


def _eval(runner, *args):
    # -j 0: no loader worker forked from the test process (the workers are not under test)
    args = ["eval", "-j", "0", *map(str, args), "--device", "cpu", "--format", "json"]
    result = runner.invoke(app, args)
    return result


def test_eval_on_the_training_data_scores_the_held_out_split(runner, flat_run):
    result = _eval(runner, flat_run / "run" / "best.pt", "--data", flat_run / "raw")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    held = [row for row in (flat_run / "run" / "split.csv").read_text().splitlines()[1:]]
    val = [row.split(",")[0] for row in held if row.endswith(",val")]
    assert report["num_images"] == len(val) == 6 and report["split"] == "val"
    assert "scoring the val split its run held out (6 images)" in result.stderr


@pytest.mark.parametrize(("split", "count"), [("all", 24), ("train", 18), ("val", 6)])
def test_an_explicit_split_is_scored_as_asked(runner, flat_run, split, count):
    args = [flat_run / "run" / "best.pt", "--data", flat_run / "raw", "--split", split]
    result = _eval(runner, *args)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["num_images"] == count
    assert "not the images it trained on" not in result.stderr


def test_other_data_than_the_runs_is_taken_whole(runner, flat_run, tmp_path):
    other = write_image_folder(tmp_path / "other", {"a": 2, "b": 2, "c": 2}, size=12, seed=3)
    result = _eval(runner, flat_run / "run" / "best.pt", "--data", other)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["num_images"] == 6
    assert "trained on" not in result.stderr


def test_without_data_eval_takes_the_recorded_data(runner, flat_run):
    result = _eval(runner, flat_run / "run" / "best.pt")
    assert result.exit_code == 0, result.stderr
    assert f"--data {flat_run / 'raw'}: the data" in result.stderr
    assert json.loads(result.stdout)["num_images"] == 6


def test_without_data_a_csv_index_is_found_in_its_root(runner, tmp_path, monkeypatch):
    root = write_image_folder(tmp_path / "imgs", CLASSES, size=12)
    rows = [
        f"{p.relative_to(root).as_posix()},{p.parent.name}" for p in sorted(root.rglob("*.png"))
    ]
    (root / "index.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        _train(runner, "imgs/index.csv", tmp_path / "run")
    finally:
        os.chdir(old)
    result = _eval(runner, tmp_path / "run" / "best.pt")
    assert result.exit_code == 0, result.stderr
    assert f"--data {root / 'index.csv'}" in result.stderr
    assert json.loads(result.stdout)["num_images"] == 6


def test_without_data_moved_data_is_one_error_line(runner, flat_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(flat_run / "run", run)
    moved = flat_run / "raw"
    shutil.move(moved, tmp_path / "elsewhere")
    try:
        result = _eval(runner, run / "best.pt")
    finally:
        shutil.move(tmp_path / "elsewhere", moved)
    assert result.exit_code == 1
    assert f"is no longer at {moved} (give --data where it is now)" in error_line(result.stderr)


def test_without_data_a_model_that_records_none_is_a_usage_error(runner, tmp_path):
    result = _eval(runner, "convnet", "--weights", tmp_path / "missing.pt")
    assert result.exit_code == 2
    assert "--data is missing" in error_line(result.stderr)
    result = _eval(runner)
    assert result.exit_code == 2
    assert "nothing to evaluate" in error_line(result.stderr)


def test_a_class_the_model_lacks_matters_only_in_the_split_scored(runner, flat_run, tmp_path):
    """Issue #31: eval of test/ complained about a class "of digits (train)". A class only the
    train split has does not stop eval of test/, and one in test/ is named with its split."""
    root = tmp_path / "root"
    write_image_folder(root / "train", {**CLASSES, "zebra": 2}, size=12)
    write_image_folder(root / "test", {"a": 2, "b": 2}, size=12, seed=5)
    model = flat_run / "run" / "best.pt"
    result = _eval(runner, model, "--data", root)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["num_images"] == 4
    result = _eval(runner, model, "--data", root, "--split", "train")
    assert result.exit_code == 1
    assert f"class(es) zebra of {root} (train) are not among" in error_line(result.stderr)


def test_the_help_of_topk_says_what_few_classes_get(_torchkit_command):
    """eval's --help said k became the number of classes where there are fewer than 5: k stays,
    its figures are null (top5 with 2 classes)."""
    options = _torchkit_command.commands["eval"].params
    help_text = next(option.help for option in options if "--topk" in option.opts)
    assert "if fewer" not in help_text and "null" in help_text, help_text


def test_the_note_of_the_recorded_data_quotes_a_folder_whose_name_has_a_space(flat_run, tmp_path):
    """The note shows the --data that eval takes: a folder with a space is one shell word."""
    import torch

    from torchkit.core.evaluate.source import recorded_data
    from torchkit.core.models.checkpoint import save_checkpoint
    from torchkit.core.models.spec import ModelSpec

    moved = Path(shutil.copytree(flat_run / "raw", tmp_path / "my raw"))
    checkpoint = torch.load(flat_run / "run" / "best.pt", weights_only=True)
    checkpoint["data"] = {**checkpoint["data"], "root": str(moved), "spec": str(moved)}
    save_checkpoint(checkpoint, tmp_path / "best.pt")
    data, note = recorded_data(ModelSpec(model=str(tmp_path / "best.pt")))
    assert data == str(moved)
    assert note == f"--data '{moved}': the data {tmp_path / 'best.pt'} was trained on"
