"""Command-line values are converted without pydantic where the conversion is plain
(`torchkit.cli.coercion`): Typer's pydantic adapters cost every command line 0.1-0.2 s of CPU to
import. Typer's own conversion is the reference: every value of every option of every command
converts to the same value of the same type, or fails with the same message; a number fails
with the house's message instead, and the forms no one means (`1_000`, `nan`, `inf`) fail
where Typer took them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_commands import COMMANDS
from typer._click import Context
from typer._coercion import build_runtime_param
from typer.main import get_command

from torchkit.cli import app
from torchkit.cli.coercion import CheapFirst

# Words a user types, well and badly formed: numbers of each shape, words that are almost
# numbers, choices in other cases, paths.
WORDS = (
    "0", "3", "-1", "007", "+5", "-0", "1.5", "-0.5", "1e-4", "1E3", ".5", "5.", "nan", "inf",
    "1e400", " 3", "1_000", "３", "0x10", "abc", "99999999999999999999", "123456789012345678",
    "2.0", "table", "TABLE", "x.json", "-", "a/b/", "cuda:0",
)  # fmt: skip


# Numbers Typer (pydantic) takes and every command refuses: grouped digits, NaN, infinity.
REFUSED_NUMBERS = {"1_000", "nan", "inf", "1e400"}


def _typed(value):
    if isinstance(value, list | tuple):
        return type(value), [_typed(item) for item in value]
    return type(value), repr(value)  # repr: nan equals nan


def _outcome(runtime, value, param, ctx):
    try:
        return "value", _typed(runtime.coerce(value, param=param, ctx=ctx))
    except Exception as error:  # noqa: BLE001 - the message is what is compared
        return type(error).__name__, str(getattr(error, "message", error))


def _params():
    root = get_command(app)
    for path in COMMANDS:
        command = root
        for name in path:
            command = command.commands[name]
        for param in command.params:
            if hasattr(param, "type_descriptor") and param.name not in ("help",):
                yield path, command, param


@pytest.mark.parametrize("path", [p for p in COMMANDS if p], ids=" ".join)
def test_every_option_converts_as_typer_converts(path):
    compared = 0
    for at, command, param in _params():
        if at != path:
            continue
        ctx = Context(command)
        descriptor = param.type_descriptor
        multi = param.multiple or param.nargs == -1
        cheap_first, typers_own = CheapFirst(descriptor), build_runtime_param(descriptor)
        for word in WORDS:
            value = [word, "1"] if multi else word
            cheap = _outcome(cheap_first, value, param, ctx)
            typers = _outcome(typers_own, value, param, ctx)
            number = descriptor.annotation in (int, float, list[int], list[float])
            if not number:
                assert cheap == typers, (param.name, value)
            elif cheap[0] == "value" or typers[0] == "value":
                refused = word in REFUSED_NUMBERS and cheap[0] != "value"
                assert refused or cheap == typers, (param.name, value)
            else:  # both refuse it: the house's words name the word and what the option takes
                assert word in cheap[1] or cheap[0] == "UsageError", (param.name, value, cheap)
                assert "Input should be" not in cheap[1], (param.name, value, cheap)
            compared += 1
    assert compared


# A fresh interpreter: whether pydantic is imported is the subject. The command line is parsed
# as a run parses it, every value converted; the command itself is not run (no torch).
SCRIPT = r"""
import sys
from typer.main import get_command
from torchkit.cli import app
group = get_command(app)
words = sys.argv[1:]
try:
    with group.make_context("torchkit", list(words)) as ctx:
        group.get_command(ctx, words[0]).make_context(words[0], list(words[1:]), parent=ctx)
except BaseException as error:  # a usage error: its line is the test's to see
    print(type(error).__name__)
print("pydantic" in sys.modules)
"""


@pytest.mark.parametrize(
    ("words", "imports_pydantic"),
    [
        (["env", "--format", "json", "-q"], False),
        (["train", "--data", "digits", "--epochs", "3", "--lr", "0.1", "-o", "r.json"], False),
        (["env", "--format", "yaml"], True),  # a bad choice: Typer's message, pydantic's path
    ],
)
def test_a_plain_command_line_converts_without_importing_pydantic(words, imports_pydantic):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *words], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip().splitlines()[-1] == str(imports_pydantic), done.stderr
