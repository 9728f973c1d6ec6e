"""The progress bars commands show on stderr: fed by core's (done, total) callbacks, and
`train`'s per-epoch display (`TrainProgress`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from torchkit.cli import console

if TYPE_CHECKING:
    from torchkit.core.train.stop_signal import StopOnSignal


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


class TrainProgress:
    """`torchkit train`'s progress: a bar per epoch and one log line per epoch on stderr (rank 0
    only). It is the run's callbacks, and asks `stop` whether a signal wants the run to end."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.stop: StopOnSignal | None = None
        self._progress = None
        self._task = None
        self._epochs = 0
        self._topk = 5  # min(5, classes), told by on_start
        self._told_stop = False

    def __enter__(self) -> TrainProgress:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                console=console.stderr,
                disable=not console.stderr.is_terminal,
                transient=True,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    # TrainCallbacks ---------------------------------------------------------------------------

    def on_start(self, info) -> None:
        if self.stop is not None:
            self.stop.start_training()
        if not self.enabled:
            return
        self._epochs = info.epochs
        self._topk = info.topk
        sizes = f"{info.train_size} train / {info.val_size} val"
        if info.test_size:
            sizes += f" / {info.test_size} test"
        what = "continuing" if info.resumed_from else "training"
        where = f"{info.device}" + (f" x {info.world_size}" if info.world_size > 1 else "")
        console.note(
            f"{what} {info.model} ({info.trainable:,} trainable parameters) on "
            f"{info.config.data}: {sizes} images, {len(info.classes)} classes, {where}; "
            f"writing {info.out_dir}"
        )
        if info.resumed_from:
            console.note(f"resumed from {info.resumed_from} after epoch {info.start_epoch}")
        for note in info.notes:
            console.note(note)

    def on_epoch_start(self, epoch: int, epochs: int, steps: int, done: int) -> None:
        if self._progress is None:
            return
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(
            f"epoch {epoch}/{epochs}", total=steps, completed=done, stats=""
        )

    def on_step(self, info) -> None:
        if self.stop is not None and self.stop.requested and not self._told_stop:
            self._told_stop = True
            again = "SIGTERM" if self.stop.terminated else "Ctrl-C"
            console.stderr.print(
                f"Stopping after this step ({again} again to quit at once)",
                highlight=False,
                markup=False,
            )
        if self._progress is None or self._task is None:
            return
        stats = (
            f"loss {info.loss:.4f}  top1 {info.top1:.4f}  lr {info.lr:.2e}  "
            f"{info.images_per_s:,.0f} img/s"
        )
        self._progress.update(self._task, completed=info.step, stats=stats)

    def on_eval(self, split: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, stats=f"evaluating {split}")

    def on_epoch_end(self, row: dict, is_best: bool) -> None:
        if not self.enabled:
            return
        if self._progress is not None and self._task is not None:
            self._progress.remove_task(self._task)
            self._task = None
        width = len(str(self._epochs))
        line = (
            f"epoch {row['epoch']:>{width}}/{self._epochs}  "
            f"train loss {row['train_loss']:.4f} top1 {row['train_top1']:.4f}  "
            f"val loss {row['val_loss']:.4f} top1 {row['val_top1']:.4f} "
            f"top{self._topk} {row['val_top5']:.4f}"
        )
        if "val_ema_top1" in row:  # the EMA weights' metrics pick best.pt: show both
            line += f"  ema loss {row['val_ema_loss']:.4f} top1 {row['val_ema_top1']:.4f}"
        line += (
            f"  lr {row['lr']:.2e}  {row['epoch_time_s']:.1f}s  "
            f"{row['images_per_s']:,.0f} img/s" + ("  *best" if is_best else "")
        )
        console.stderr.print(line, highlight=False, markup=False, soft_wrap=True)

    def should_stop(self) -> bool:
        return self.stop is not None and self.stop.requested

    def stop_signal(self) -> int:
        return int(self.stop.signum or 0) if self.should_stop() else 0

    def on_train_end(self, stopped: bool) -> None:
        if self.stop is not None:
            self.stop.end_training(stopped)
