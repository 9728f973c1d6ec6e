"""Every `torchkit ...` command line in README.md parses: the command exists and every option and
value it gives is one the command takes (issue #31: README examples must not drift from the
CLI). The lines are parsed as the shell and click would, without running anything."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
SHELL_ENDS = {"|", "||", "&&", ";", ">", ">>", "2>", "<", "&"}
# Eager options whose callbacks act while the line is parsed (install into the shell's rc
# file, print and exit): their lines are checked for the option's existence only.
EAGER = ("--install-completion", "--show-completion", "--version", "-V", "--help", "-h")


def _readme_commands() -> list[str]:
    """The torchkit command lines of README's bash blocks (after `uv run` or a `&&`)."""
    text = README.read_text(encoding="utf-8")
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in re.split(r"&&|\|\||;", line):
                part = part.strip().removeprefix("uv run ").strip()
                if part.startswith("torchkit "):
                    lines.append(part)
    return lines


COMMANDS = _readme_commands()


def _words(line: str) -> list[str]:
    words = []
    for word in shlex.split(line)[1:]:
        if word in SHELL_ENDS or word.startswith((">", "2>")):
            break
        words.append(word)
    return words


def test_the_readme_has_examples_of_every_command(_torchkit_command):
    names = set(_torchkit_command.commands)
    used = {_words(line)[0] for line in COMMANDS if _words(line)}
    assert names <= used, sorted(names - used)


@pytest.mark.parametrize(
    "line",
    ["torchkit train --data digits --no-such-option", "torchkit convert nothing a b", "torchkit x"],
)
def test_a_drifted_line_fails(line, _torchkit_command):
    """The check can fail: an unknown option, sub-command or command."""
    with pytest.raises(Exception) as caught:  # click's usage errors, or the assertion
        test_a_readme_command_line_parses(line, _torchkit_command)
    assert "NoSuchOption" in type(caught.value).__name__ or isinstance(caught.value, AssertionError)


@pytest.mark.parametrize("line", COMMANDS)
def test_a_readme_command_line_parses(line, _torchkit_command):
    words = _words(line)
    command = _torchkit_command
    eager = [word for word in words if word in EAGER]
    if eager:  # parsing would run them: they must be options of the app, nothing more
        names = {name for param in command.params for name in param.opts}
        assert set(eager) <= names | {"--help", "-h"}, line
        return
    parent = None
    while hasattr(command, "commands"):  # a group: its options, then a sub-command
        position = next((i for i, word in enumerate(words) if not word.startswith("-")), None)
        assert position is not None, f"no command in: {line}"
        known = {name for param in command.params for name in param.opts}
        assert set(words[:position]) <= known, line
        parent = command.context_class(command, info_name=command.name, parent=parent)
        found = command.get_command(parent, words[position])
        assert found is not None, f"no command {words[position]!r} in: {line}"
        command, words = found, words[position + 1 :]
    command.make_context(command.name or "", list(words), parent=parent)  # raises when wrong
