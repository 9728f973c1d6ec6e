"""The progress bar commands show on stderr, fed by core's (done, total) callbacks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torchkit.cli import console


class ProgressUpdate:
    """Core's (done, total) callback for a progress bar; `status(text)` shows what is being
    done now beside the label (`status(None)` clears it)."""

    def __init__(self, bar: Any, task: Any, label: str) -> None:
        self._bar, self._task, self._label = bar, task, label

    def __call__(self, done: int, total: int) -> None:
        self._bar.update(self._task, completed=done, total=total, refresh=True)

    def status(self, text: str | None) -> None:
        from rich.markup import escape

        description = self._label if not text else f"{self._label}: {escape(text)}"
        self._bar.update(self._task, description=description, refresh=True)


@contextmanager
def progress_bar(label: str) -> Iterator[ProgressUpdate]:
    """A progress bar on stderr (only on a terminal) fed by core's (done, total) callback.

    It refreshes on each update instead of from a thread, so no thread is running when the
    stats pass forks its worker processes.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console.stderr,
        disable=not console.stderr.is_terminal,
        transient=True,
        auto_refresh=False,
    ) as bar:
        task = bar.add_task(label, total=None)
        yield ProgressUpdate(bar, task, label)
