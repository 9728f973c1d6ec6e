"""The two consoles: results on stdout, everything else (progress, warnings, errors) on stderr.

rich turns colour off by itself when the stream is not a terminal and when NO_COLOR is set.
"""

from __future__ import annotations

import logging

from rich.console import Console
from rich.markup import escape

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)


class _StderrHandler(logging.Handler):
    """Shows core's `logging.getLogger("torchkit")` warnings as `Warning: ...` lines."""

    def emit(self, record: logging.LogRecord) -> None:
        label = {logging.WARNING: "Warning", logging.ERROR: "Error"}.get(record.levelno, "Note")
        style = "yellow" if record.levelno >= logging.WARNING else "dim"
        stderr.print(
            f"[{style}]{label}:[/] {escape(record.getMessage())}",
            highlight=False,
            markup=True,
            soft_wrap=True,
        )


def install_log_handler(verbose: bool = False) -> None:
    logger = logging.getLogger("torchkit")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False


def note(message: str) -> None:
    """A remark for the user on stderr (never mixed into results)."""
    stderr.print(f"[dim]Note:[/] {escape(message)}", highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    stderr.print(f"[yellow]Warning:[/] {escape(message)}", highlight=False, soft_wrap=True)
