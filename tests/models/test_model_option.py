"""Issue #32: `--model NAME` is accepted wherever a MODEL argument is (summary and predict
exited 2), meaning the same model."""

from __future__ import annotations

import json

import pytest
from image_folders import write_image_folder
from output_checks import error_line

from torchkit.cli import app


def test_summary_takes_model_as_an_option(runner):
    positional = runner.invoke(app, ["summary", "convnet", "--format", "json"])
    option = runner.invoke(app, ["summary", "--model", "convnet", "--format", "json"])
    assert positional.exit_code == option.exit_code == 0, option.stderr
    assert json.loads(option.stdout)["totals"] == json.loads(positional.stdout)["totals"]
    sized = runner.invoke(app, ["summary", "--model", "convnet", "-i", "3", "28", "28"])
    assert sized.exit_code == 0, sized.stderr


def test_predict_takes_model_as_an_option(runner, tmp_path):
    _checkpoint(tmp_path)
    images = write_image_folder(tmp_path / "images", {"a": 2, "b": 2}, size=12)
    args = ["--format", "csv", "--device", "cpu", "-j", "0"]
    positional = runner.invoke(app, ["predict", str(tmp_path / "model.pt"), str(images), *args])
    option = runner.invoke(
        app, ["predict", "--model", str(tmp_path / "model.pt"), str(images), *args]
    )
    assert positional.exit_code == option.exit_code == 0, option.stderr
    assert option.stdout == positional.stdout and len(option.stdout.splitlines()) == 5


def test_benchmark_takes_model_as_an_option_once(runner):
    args = ["--iters", "1", "--warmup", "0", "-b", "2", "--format", "json"]
    result = runner.invoke(app, ["benchmark", "--model", "convnet", *args])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["model"] == "convnet"
    twice = runner.invoke(app, ["benchmark", "convnet", "--model", "resnet18", *args])
    assert twice.exit_code == 2
    assert "MODEL given twice" in error_line(twice.stderr)


@pytest.mark.parametrize("command", ["predict", "benchmark"])
def test_no_model_at_all_is_one_usage_error(runner, command):
    result = runner.invoke(app, [command])
    assert result.exit_code == 2
    assert "missing MODEL (give it first, or as --model MODEL)" in error_line(result.stderr)


def _checkpoint(tmp_path):
    import torch

    from torchkit.core.models.convnet import convnet_class

    model = convnet_class()(2, 3, 12)
    checkpoint = {"format_version": 1, "arch": "convnet", "num_classes": 2, "classes": ["a", "b"]}
    checkpoint.update(model=model.state_dict(), preprocess={"image_size": 12, "in_channels": 3})
    torch.save(checkpoint, tmp_path / "model.pt")
    return tmp_path / "model.pt"


def test_export_and_extract_features_take_model_as_an_option(runner, tmp_path):
    model = _checkpoint(tmp_path)
    images = write_image_folder(tmp_path / "images", {"a": 2, "b": 2}, size=12)
    exported = runner.invoke(app, ["export", "--model", str(model), str(tmp_path / "m.onnx")])
    assert exported.exit_code == 0, exported.stderr
    assert (tmp_path / "m.onnx").is_file()
    args = ["extract-features", "--model", str(model), str(images), str(tmp_path / "f")]
    features = runner.invoke(app, [*args, "--device", "cpu", "-j", "0"])
    assert features.exit_code == 0, features.stderr
    assert (tmp_path / "f" / "index.csv").is_file()
    extra = runner.invoke(app, [*args, str(tmp_path / "g")])
    assert extra.exit_code == 2
    assert "unexpected extra argument" in error_line(extra.stderr)
    missing = runner.invoke(app, ["export", "--model", str(model)])
    assert missing.exit_code == 2 and "missing OUT" in error_line(missing.stderr)


def test_a_run_folder_as_model_names_its_checkpoint_in_every_command(tmp_path):
    # `eval RUN` read as an unknown model name ('run'), `eval RUN/` as a folder with no hint.
    from processes import run_each_in_process

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "best.pt").write_bytes(b"a checkpoint")
    write_image_folder(tmp_path / "data", {"a": 1}, size=4)
    after = {
        "eval": ["--data", "data"],
        "predict": ["data"],
        "summary": [],
        "export": ["m.onnx"],
        "extract-features": ["data", "features"],
        "convert-syncbn": ["out.pt"],
        "benchmark": [],
    }
    commands = [[c, run, *rest] for c, rest in after.items() for run in ("run", "run/")]
    for command, result in zip(commands, run_each_in_process(commands, cwd=tmp_path), strict=True):
        assert result.returncode == 1, (command, result.stderr)
        line = error_line(result.stderr)
        assert line.endswith(
            "is not a file: run (a training run folder: give its checkpoint, run/best.pt)"
        ), (command, line)
    # A folder holding no checkpoint: before -> "unknown model 'data' (did you mean ...)".
    (tmp_path / "resumed").mkdir()
    (tmp_path / "resumed" / "last.pt").write_bytes(b"a checkpoint")
    folders = [["summary", "data"], ["eval", "data", "--data", "data"], ["predict", "data", "data"]]
    for command, result in zip(folders, run_each_in_process(folders, cwd=tmp_path), strict=True):
        assert result.returncode == 1, (command, result.stderr)
        assert error_line(result.stderr).endswith(
            "is not a file: data (a folder with no best.pt or last.pt in it: "
            "give a checkpoint file)"
        ), command
    resumed = run_each_in_process([["summary", "resumed"]], cwd=tmp_path)[0]
    assert error_line(resumed.stderr).endswith("give its checkpoint, resumed/last.pt)")


def test_a_run_folder_as_weights_names_its_checkpoint_as_a_run_folder_model_does(
    runner, tmp_path, monkeypatch
):
    # `--weights run` was a usage error (exit 2) with no hint: "--weights run is not a file".
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "best.pt").write_bytes(b"a checkpoint")
    (tmp_path / "notes").mkdir()
    write_image_folder(tmp_path / "data", {"a": 1}, size=4)
    for args in (["summary", "convnet"], ["predict", "resnet18", "data"]):
        for folder, hint in (
            ("run", "a training run folder: give its checkpoint, run/best.pt"),
            ("notes", "a folder with no best.pt or last.pt in it: give a checkpoint file"),
        ):
            result = runner.invoke(app, [*args, "--weights", folder])
            assert result.exit_code == 1, (args, result.stderr)
            line = error_line(result.stderr)
            assert line == f"Error: checkpoint is not a file: {folder} ({hint})", (args, line)
