"""The progress bar commands show on stderr, fed by core's (done, total) callbacks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torchkit.cli import console


@contextmanager
def progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
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
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console.stderr,
        disable=not console.stderr.is_terminal,
        transient=True,
        auto_refresh=False,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, refresh=True)

        yield update
