"""`-q/--quiet` on every command (env's own meant it alone): stderr carries only problems
(warnings, errors), no notes and no progress; the result is unchanged."""

from __future__ import annotations

import json

import pytest
from cli_commands import COMMANDS

from torchkit.cli import app

TRAIN = ["train", "--data", "digits", "--model", "convnet", "--image-size", "8", "--epochs", "1",
         "-j", "0", "--format", "json"]  # fmt: skip


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "torchkit")
def test_every_command_takes_quiet(_torchkit_command, path):
    command = _torchkit_command  # the session's tree: building one costs about 0.15 s
    for name in path:
        command = command.commands[name]
    opts = {opt for param in command.params for opt in getattr(param, "opts", ())}
    assert {"-q", "--quiet"} <= opts


def test_quiet_train_prints_its_result_and_nothing_else(runner, tmp_path, monkeypatch):
    loud = runner.invoke(app, [*TRAIN, "--out", str(tmp_path / "loud")])
    quiet = runner.invoke(app, [*TRAIN, "--out", str(tmp_path / "quiet"), "-q"])
    assert loud.exit_code == 0 and quiet.exit_code == 0, quiet.stderr
    assert "Note: training convnet" in loud.stderr and "epoch 1/1" in loud.stderr
    assert quiet.stderr == ""
    assert json.loads(quiet.stdout).keys() == json.loads(loud.stdout).keys()
    # Before the command name too, and a later command line is not quiet any more.
    before = runner.invoke(app, ["-q", "summary", "convnet", "-i", "1,12,12"])
    after = runner.invoke(app, ["summary", "convnet", "-i", "1,12,12"])
    assert before.exit_code == 0 and "Note:" not in before.stderr and "ConvNet" in before.stdout
    assert "Note: convnet has random weights" in after.stderr


def test_quiet_keeps_warnings_and_errors(runner, tmp_path):
    warned = runner.invoke(
        app, ["train", "-q", "--class-weights", "balanced", "--balanced-sampler", "--print-config"]
    )
    assert warned.exit_code == 0 and "Warning: --class-weights balanced" in warned.stderr
    failed = runner.invoke(app, ["summary", "-q", str(tmp_path / "missing.pt")])
    assert failed.exit_code == 1 and failed.stderr.startswith("Error: ")
