"""Every command and subcommand of the app, walked from its command tree: what the tests that
check all commands alike (help, JSON output, -q) run over."""

from __future__ import annotations

from typer.main import get_command

from torchkit.cli import app


def command_paths() -> list[tuple[str, ...]]:
    """Every command and subcommand of the app, the root as ()."""
    found = []

    def walk(command, path: tuple[str, ...]) -> None:
        found.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not sub.hidden:
                walk(sub, (*path, name))

    walk(get_command(app), ())
    return found


COMMANDS = command_paths()
