"""A number an option does not take is one line naming the option, the value given and what
the option takes, in every command (`cli/coercion.py`), where it read as pydantic's ("Input
should be a valid integer, unable to parse string as an integer", "Input should be greater
than or equal to 1"); digits grouped with `_`, which Python reads (`1_0` as 10), are refused."""

from __future__ import annotations

import json

import pytest

from torchkit.cli import app


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["train", "--lr", "1_0"],
            "Error: Invalid value for '--lr': '1_0' is not a number (see 'torchkit train --help')",
        ),
        (
            ["train", "--epochs", "1.5"],
            "Error: Invalid value for '--epochs' / '-e': '1.5' is not a whole number from 1 to "
            "1,000,000 (see 'torchkit train --help')",
        ),
        (
            ["train", "--epochs", "0"],
            "Error: Invalid value for '--epochs' / '-e': '0' is not a whole number from 1 to "
            "1,000,000 (see 'torchkit train --help')",
        ),
        (
            ["train", "--workers", "1_0"],
            "Error: Invalid value for '--workers' / '-j': '1_0' is not a whole number >= 0 (see "
            "'torchkit train --help')",
        ),
        (
            ["export", "m.pt", "m.onnx", "--atol", "1e-3_0"],
            "Error: Invalid value for '--atol': '1e-3_0' is not a number >= 0 (see 'torchkit "
            "export --help')",
        ),
        (
            ["benchmark", "resnet18", "--seconds", "inf"],
            "Error: --seconds must be a finite number, not inf (nan and inf are not option values)",
        ),
        (
            ["train", "--min-lr", "-inf"],
            "Error: --min-lr must be a finite number, not -inf (give a number >= 0)",
        ),
    ],
)
def test_a_bad_number_names_the_option_the_value_and_what_it_takes(runner, args, line):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == line


@pytest.mark.parametrize(
    ("args", "key", "value"),
    [
        (["--lr", ".5"], "lr", 0.5),
        (["--lr", "+3"], "lr", 3.0),
        (["--lr", "1E-3"], "lr", 0.001),
        (["--epochs", "2.0"], "epochs", 2),
        (["--epochs", "007"], "epochs", 7),
    ],
)
def test_numbers_of_other_shapes_are_taken_as_before(runner, args, key, value):
    result = runner.invoke(app, ["train", *args, "--print-config"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)[key] == value


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--milestones", "1_0,20", "--print-config"],
        ["train", "--mean", "0.5,0.5,0_5", "--print-config"],
        ["train", "--input-size", "3,2_24,224", "--print-config"],
        ["split", "data", "out", "--fixed", "1_0"],
    ],
)
def test_digits_grouped_with_underscores_are_refused_in_lists_too(runner, args):
    """Each was read as Python reads it: --milestones 1_0,20 as 10,20."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stdout == "", result.stdout
    assert result.stderr.startswith("Error: ") and "_" in result.stderr
