"""A single-valued option given again with another value takes the last (click's rule, which
`$BASE --epochs 6` scripts rely on to override BASE's), and says so in a warning: it did so
silently. Options that take many values, flags and a recipe's values overridden on the command
line are no repeat."""

from __future__ import annotations

import json

import pytest

from torchkit.cli import app


def test_a_repeated_option_takes_the_last_value_and_says_so(runner):
    result = runner.invoke(app, ["train", "--lr", "1", "--lr", "2", "--print-config"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["lr"] == 2.0
    assert result.stderr == "Warning: --lr is given twice (1, then 2): the last, 2, is used\n"


def test_each_spelling_of_an_option_counts(runner):
    args = ["train", "-e", "3", "--epochs", "4", "--image-size", "8", "--input-size", "3,8,8"]
    result = runner.invoke(app, [*args, "--epochs", "5", "--print-config"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["epochs"] == 5
    assert result.stderr.splitlines() == [
        "Warning: -e/--epochs is given 3 times (3, then 4, then 5): the last, 5, is used",
        "Warning: --image-size/--input-size is given twice (8, then 3,8,8): the last, 3,8,8, "
        "is used",
    ]


def test_values_that_are_not_text_are_shown_too(runner, tmp_path):
    """In-process callers pass a Path as it is: that was a TypeError, not a value."""
    first, last = tmp_path / "a", tmp_path / "b"
    result = runner.invoke(app, ["train", "--out", first, "--out", last, "--print-config"])
    assert result.exit_code == 0, result.stderr
    assert f"is given twice ({first}, then {last}): the last, {last}, is used" in result.stderr


def test_every_command_warns_alike(runner, tmp_path):
    out = tmp_path / "env.csv"
    result = runner.invoke(app, ["env", "--format", "json", "-o", str(out), "--format", "csv"])
    assert result.exit_code == 0, result.stderr
    assert out.read_text().startswith("key,value\n")
    assert "Warning: --format is given twice (json, then csv): the last, csv, is used" in (
        result.stderr
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--lr", "1", "--lr", "1"],  # the same value again: nothing to choose between
        ["--flip", "--no-flip", "--amp", "--amp"],  # flags: the last one says
    ],
)
def test_no_warning_where_nothing_is_lost(runner, args):
    result = runner.invoke(app, ["train", *args, "--print-config"])
    assert result.exit_code == 0 and result.stderr == ""


def test_a_recipe_value_overridden_on_the_command_line_is_no_repeat(runner, tmp_path):
    recipe = tmp_path / "r.json"
    recipe.write_text('{"lr": 0.5}')
    result = runner.invoke(app, ["train", "--config", str(recipe), "--lr", "2", "--print-config"])
    assert result.exit_code == 0 and result.stderr == ""
    assert json.loads(result.stdout)["lr"] == 2.0
