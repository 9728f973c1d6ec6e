"""`--help` in an 80-column terminal shows every option's help whole, word-wrapped: rich cut
names and long words with `…` (`--no-determinis…`, `(torch.set_num_t…`), and on an ASCII
stdout each `…` was written `\\u2026`, 5 cells past the terminal's edge."""

from __future__ import annotations

import functools
import re

import pytest
from cli_commands import COMMANDS
from rich.text import Text
from typer.main import get_command
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.cli.app import TorchkitArgument

WIDTH = 80


def _command(path: tuple[str, ...]):
    command = get_command(app)
    for name in path:
        command = command.commands[name]
    return command


@functools.cache  # the tests only read it; a help page costs about 0.1 s of CPU to render
def _help(path: tuple[str, ...], charset: str = "utf-8") -> str:
    result = CliRunner(charset=charset).invoke(
        app, [*path, "--help"], env={"COLUMNS": str(WIDTH), "NO_COLOR": "1"}
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def _shown_words(param) -> list[str]:
    """The words of a parameter's help as the help shows them: markup read (`\\[default`
    is `[default`), single line breaks joined."""
    return Text.from_markup(param.help or "").plain.split()


def _row_start(lines: list[str], param) -> int:
    if isinstance(param, TorchkitArgument):
        first = param.display_name_raw
    else:
        first = next((o for o in param.opts if o.startswith("--")), param.opts[0])
    pattern = re.compile(r"[│|]\s*\*?\s*" + re.escape(first) + r"(,|\s|\.\.\.)")
    return next(i for i, line in enumerate(lines) if pattern.match(line))


@pytest.mark.parametrize("path", [p for p in COMMANDS if p], ids=" ".join)
def test_every_option_help_is_shown_whole_and_word_wrapped_at_80_columns(path):
    text = _help(path)
    lines = text.splitlines()
    assert "…" not in text
    assert max(map(len, lines)) <= WIDTH
    command = _command(path)
    params = [p for p in command.params if not getattr(p, "hidden", False) and p.help]
    assert params
    for param in params:
        start = _row_start(lines, param)
        shown = " ".join(lines[start:]).replace("│", " ").split()
        missing = _not_shown_in_order(_shown_words(param), shown)
        assert not missing, (param.name, missing)


# No word fits a narrower help column than this at 80 columns: a longer one (a CSV header
# `path_a,split_a,...` has no space to wrap at) is folded onto the next lines, never cut.
LONGEST_WRAPPED_WORD = 28


def _not_shown_in_order(words: list[str], tokens: list[str]) -> list[str]:
    """The words not found, in order, among `tokens`: each a token of its own (cut or folded,
    it is none), or a word longer than any column holds as the folded pieces of consecutive
    lines. The other columns' words between them are passed over."""
    missing, at = [], 0
    for word in words:
        found = None
        for i in range(at, len(tokens)):
            if tokens[i] == word:
                found = i + 1
            elif len(word) > LONGEST_WRAPPED_WORD and word.startswith(tokens[i]):
                joined, j = tokens[i], i + 1
                while len(joined) < len(word) and j < len(tokens):
                    joined, j = joined + tokens[j], j + 1
                found = j if joined == word else None
            if found is not None:
                break
        if found is None:
            missing.append(word)
        else:
            at = found
    return missing


@pytest.mark.parametrize("path", [("train",), ("split",), ("eval",)], ids=" ".join)
def test_help_on_an_ascii_stdout_stays_within_80_columns(path):
    text = _help(path, charset="ascii")
    assert "\\u2026" not in text and "…" not in text
    assert max(map(len, text.splitlines())) <= WIDTH


@pytest.mark.parametrize("path", [p for p in COMMANDS if p], ids=" ".join)
def test_the_description_is_wrapped_to_the_terminal_not_to_the_docstring(path):
    """split's description kept its docstring's 95-column lines, each then broken in two at 80
    columns: a full line, then a stub (` --fixed N,M`, ` it.`) before the next."""
    lines = _help(path).splitlines()
    usage = next(i for i, line in enumerate(lines) if "Usage:" in line)
    end = next(
        (i for i, line in enumerate(lines) if line.strip() == "Examples:" or line.startswith("╭")),
        len(lines),
    )
    prose = [line.rstrip() for line in lines[usage + 1 : end]]
    for line, after in zip(prose, prose[1:], strict=False):
        if line and after:  # a line inside a paragraph is filled: the next word did not fit
            assert len(line) + 1 + len(after.split()[0]) > WIDTH - 2, (line, after)
