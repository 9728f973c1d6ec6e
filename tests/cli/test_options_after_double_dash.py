"""Every word after `--` is an argument: an option written there is an extra argument, and the
error says that options go before `--`, where it said only "Got unexpected extra argument(s)"."""

from __future__ import annotations

import pytest

from torchkit.cli import app


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["split", "--", "-d", "-o", "--mode", "move"], "--mode"),
        (["split", "data", "out", "--", "--mode=move"], "--mode=move"),
        (["env", "--", "--format", "json"], "--format"),
    ],
)
def test_an_option_after_double_dash_is_said_to_go_before_it(runner, tmp_path, args, named):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stdout == ""
    command = args[0]
    assert result.stderr.strip().endswith(
        f": {named} comes after --, which makes every word after it an argument; options go "
        f"before -- (see 'torchkit {command} --help')"
    ), result.stderr


def test_extra_words_after_double_dash_that_are_no_options_read_as_before(runner):
    result = runner.invoke(app, ["split", "data", "out", "--", "x", "y"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "Error: Got unexpected extra argument(s) (x y) (see 'torchkit split --help')"
    )
