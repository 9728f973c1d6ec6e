"""The one place commands draw progress on stderr: `stderr_progress` makes every rich Progress
(hidden when stderr is not a terminal), `progress_bar` feeds one from core's (done, total)
callback, and `TrainProgress` is `train`'s per-epoch display. rich is imported only when a bar
is made, so `--help` and shell completion never load it.

A bar that redraws between updates does so from a thread of its own (`_Redraws`; rich's
auto_refresh is off), and such a bar is up while DataLoader workers fork (train's, eval's,
extract-features'). A fork copies the locks of a redraw in flight as they are: a worker forked
mid-redraw found the stderr console locked forever and hung at its first line on stderr (a
warning, a `-v` note); and a process forked beside any thread may deadlock so (Python 3.12+
warns of it at each fork). So a fork first ends the bars' redraw threads, each after its redraw
in flight (`_pause_redraws`), and then holds the console's `write_lock` (`console._hold_writes`)
until it is made. A redraw, and every drawing of a bar, holds that lock too, taken before any
of rich's; a redraw never waits for it (it skips a tick instead), so a fork's wait for the
thread ends even when the thread that forks is printing. A bar's next update starts the thread
again."""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from torchkit.cli import console
from torchkit.cli.render import format_rate

if TYPE_CHECKING:
    from rich.progress import Progress, ProgressColumn

    from torchkit.core.train.stop_signal import StopOnSignal


def stderr_progress(
    *columns: ProgressColumn | str,
    transient: bool = True,
    refresh_in_thread: bool = True,
    hidden: bool = False,
) -> Progress:
    """A rich Progress on stderr, drawn only when stderr is a terminal (and not `hidden`), so
    piped or captured stderr holds no bar. `transient` bars are erased when they stop.

    `refresh_in_thread=False` redraws on each update instead of from a thread, for work that
    forks processes while the bar is up.
    """
    from rich.progress import Progress

    class Bar(Progress):
        """A Progress whose redraws between updates come from a `_Redraws` thread."""

        # rich's Live takes its lock, then the console's buffer (and `write_lock`) to draw:
        # here `write_lock` is taken first, as every other writer takes it.
        def start(self) -> None:
            with console.write_lock:
                super().start()
            if redraws is not None:
                redraws.start()

        def stop(self) -> None:
            if redraws is not None:
                redraws.stop()  # first: no redraw after the bar's last drawing
            with console.write_lock:
                super().stop()

        def refresh(self) -> None:
            with console.write_lock:
                super().refresh()

        def add_task(self, *args: Any, **kwargs: Any) -> Any:
            if redraws is not None:
                redraws.resume()
            return super().add_task(*args, **kwargs)

        def update(self, *args: Any, **kwargs: Any) -> None:
            if redraws is not None:
                redraws.resume()
            super().update(*args, **kwargs)

    progress = Bar(
        *columns,
        console=console.stderr,
        disable=hidden or console.is_quiet() or not console.stderr.is_terminal,
        transient=transient,
        auto_refresh=False,
    )
    redraws = _Redraws(progress) if refresh_in_thread and not progress.disable else None
    if redraws is not None:
        _bars.add(redraws)
    if progress.disable:
        # rich before Textualize/rich#3905 (December 2025; 13.8 is allowed) stops a hidden bar
        # too, printing an empty line where stderr is not a terminal: above the `Error:` line.
        progress.stop = _nothing_to_stop  # type: ignore[method-assign]
    return progress


def _nothing_to_stop() -> None:
    """A hidden bar's stop: it never started."""


# Redraws a second between updates: rich's own for a Progress.
REDRAWS_PER_SECOND = 10


class _Redraws:
    """A thread that redraws `bar` REDRAWS_PER_SECOND times a second from `start()` to
    `stop()`. A fork ends it (`pause`, `_pause_redraws`); the bar's next update starts it again
    (`resume`): restarted at once, it would run beside the next worker forked, as DataLoaders
    fork theirs one after the other."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.thread: threading.Thread | None = None
        self.done = threading.Event()
        self.paused = False
        self.switching = threading.Lock()  # a fork's pause and another thread's update

    def start(self) -> None:
        self.done = threading.Event()  # each thread its own: one still ending stays stopped
        self.thread = threading.Thread(
            target=self._run, args=(self.done,), name="torchkit-progress", daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        """End the thread after its redraw in flight."""
        self.paused = False
        thread, self.thread = self.thread, None
        if thread is not None:
            self.done.set()
            thread.join()  # after its redraw in flight, which waits for no lock this one holds

    def pause(self) -> None:
        with self.switching:
            if self.thread is not None:
                self.stop()
                self.paused = True

    def resume(self) -> None:
        with self.switching:
            if self.paused:
                self.paused = False
                self.start()

    def _run(self, done: threading.Event) -> None:
        while not done.wait(1 / REDRAWS_PER_SECOND):
            # Never waits for the lock, so a fork made in a print (which holds it) ends this
            # thread at once; a tick that meets a write in flight is skipped for the next.
            if not console.write_lock.acquire(blocking=False):
                continue
            try:
                if not done.is_set():
                    self.bar.refresh()
            finally:
                console.write_lock.release()


_bars: weakref.WeakSet = weakref.WeakSet()  # every `_Redraws` and `_LateRedraw` made


def _pause_redraws() -> None:
    """Before a fork: end each bar's redraw thread, after its redraw in flight, so that the
    child gets no lock a redraw held and the process forks without those threads (then
    `console._hold_writes`, registered first, so run last, holds the writes until the fork)."""
    for redraws in list(_bars):
        redraws.pause()


def _forget_redraws() -> None:
    """After the fork, in the child: it draws no bar."""
    for redraws in list(_bars):
        if isinstance(redraws, _LateRedraw):
            redraws.due = False
        else:
            redraws.paused = False


def _resume_late_redraws() -> None:
    """After the fork, in the parent: an update a fork left undrawn is drawn (`_Redraws`
    waits for the bar's next update instead: the next worker's fork would be beside it)."""
    for redraws in list(_bars):
        if isinstance(redraws, _LateRedraw):
            redraws.resume()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(
        before=_pause_redraws, after_in_parent=_resume_late_redraws, after_in_child=_forget_redraws
    )


# A bar that redraws on its updates (no thread) does so at most this often: core calls back
# once an item, and a redraw of the terminal line takes about 1-2 ms of CPU (rich lays out
# every column), which at `convert shards`' 10,000 tiny images took 18 of its 21 s of CPU.
REDRAW_EVERY_S = 0.1


class _LateRedraw:
    """One redraw of a bar REDRAW_EVERY_S after an update that was not drawn, from a short-lived
    thread: a burst of items followed by a pause (a large file, a slow shard) showed the count
    of the burst's first item until the next update. A fork (`_pause_redraws`) or the bar's end
    (`cancel`) ends the thread first, after its redraw in flight; an update left undrawn by a
    fork is drawn after it, in the parent."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.lock = threading.Lock()
        self.due = False  # an update not drawn yet
        # When the bar was last drawn, by the thread or by an update (`drawn`): each waits
        # REDRAW_EVERY_S from either's drawing, so a stream of updates is drawn 10 times a
        # second in all, not 10 times by each (twice the CPU of the redraws).
        self.drawn_at = -math.inf
        self.thread: threading.Thread | None = None
        self.done = threading.Event()

    def arm(self) -> None:
        """Draw the bar's state within REDRAW_EVERY_S (the thread, when running, draws it)."""
        if self.due and self.thread is not None:  # armed: the thread's drawing comes after
            return  # the update, so it shows it (no lock taken: this is most updates)
        with self.lock:
            self.due = True
            if self.thread is None:
                self.done = threading.Event()
                thread = threading.Thread(
                    target=self._run, args=(self.done,), name="torchkit-progress-late", daemon=True
                )
                # Kept once started: a Ctrl-C before then left `cancel` a thread to join that
                # never started (a RuntimeError in place of the KeyboardInterrupt).
                thread.start()
                self.thread = thread

    def drawn(self, now: float) -> None:
        """The bar was just drawn with its last update, at `now` (time.monotonic())."""
        with self.lock:
            self.due = False
            self.drawn_at = now

    def cancel(self) -> None:
        with self.lock:
            thread, self.thread = self.thread, None
            self.done.set()
        if thread is not None:
            thread.join()  # after its redraw in flight, which waits for no lock this one holds

    def pause(self) -> None:  # before a fork: `due` stays for `resume`
        self.cancel()

    def resume(self) -> None:  # after a fork, in the parent
        if self.due:
            self.arm()

    def _run(self, done: threading.Event) -> None:
        wait = REDRAW_EVERY_S
        while not done.wait(wait):
            wait = REDRAW_EVERY_S
            # Like `_Redraws`: never waits for the console's lock, it retries a tick later.
            if not console.write_lock.acquire(blocking=False):
                continue
            try:
                with self.lock:
                    if done.is_set():
                        return
                    if not self.due:  # drawn since: nothing left to show
                        self.thread = None
                        return
                    now = time.monotonic()
                    if now - self.drawn_at < REDRAW_EVERY_S:  # an update drew it lately
                        wait = self.drawn_at + REDRAW_EVERY_S - now
                        continue
                    self.due, self.drawn_at = False, now
                self.bar.refresh()
            finally:
                console.write_lock.release()


class ProgressUpdate:
    """Core's (done, total) callback for a progress bar; `status(text)` shows what is being
    done now beside the label (`status(None)` clears it). Without a redraw thread the bar is
    redrawn on an update at most every REDRAW_EVERY_S, and when the count reaches the total;
    an update not drawn is drawn REDRAW_EVERY_S later if none is drawn by then (`_LateRedraw`),
    so a pause after a burst of items shows the burst's last count; the bar's stop draws its
    last count."""

    def __init__(
        self, bar: Any, label: str, *, refresh: bool, count_from_first_update: bool
    ) -> None:
        self._bar, self._label, self._refresh = bar, label, refresh
        self._description = label
        self._drawn_at = -math.inf  # the first update is drawn at once
        self._late: _LateRedraw | None = None
        if refresh and not bar.disable:
            self._late = _LateRedraw(bar)
            _bars.add(self._late)
        # A task made at the first update counts speed and time from the count it is given
        # (a resumed run starts part-way); until then the bar shows nothing.
        self._task = None if count_from_first_update else bar.add_task(label, total=None)

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self._task is None:
            self._task = self._bar.add_task(self._description, total=total, completed=done)
            if self._refresh:
                self._bar.refresh()
                self._mark_drawn(now)
            return
        drawn_at = self._drawn_at if self._late is None else self._late.drawn_at
        redraw = self._refresh and (
            now - drawn_at >= REDRAW_EVERY_S or total is not None and done >= total
        )
        self._bar.update(self._task, completed=done, total=total, refresh=redraw)
        if redraw:
            self._mark_drawn(now)
        elif self._late is not None:
            self._late.arm()

    def _mark_drawn(self, now: float) -> None:
        self._drawn_at = now
        if self._late is not None:
            self._late.drawn(now)

    def close(self) -> None:
        """End the late redraw before the bar's last drawing."""
        if self._late is not None:
            self._late.cancel()

    def status(self, text: str | None) -> None:
        from rich.markup import escape

        self._description = self._label if not text else f"{self._label}: {escape(text)}"
        if self._task is not None:
            self._bar.update(self._task, description=self._description, refresh=self._refresh)


@contextmanager
def progress_bar(
    label: str,
    *,
    eta: bool = True,
    rate_unit: str | None = None,
    keep: bool = False,
    refresh_in_thread: bool = False,
    hidden: bool = False,
    count_from_first_update: bool = False,
) -> Iterator[ProgressUpdate]:
    """A bar on stderr fed by core's (done, total) callback: `label, bar, done/total`, then the
    speed in `rate_unit` per second if given, then the time left if `eta`.

    `keep` leaves the finished bar on the terminal instead of erasing it. By default it redraws
    on each update rather than from a thread, so no thread is running when a stats pass forks
    its worker processes; `refresh_in_thread` lets the bar move between updates. `hidden` keeps
    it off the terminal too (a torchrun rank other than 0). `count_from_first_update`: see
    `ProgressUpdate`.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

    columns: list[ProgressColumn] = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
    ]
    if rate_unit:
        columns.append(_rate_column(rate_unit))
    if eta:
        columns.append(TimeRemainingColumn())
    with stderr_progress(
        *columns, transient=not keep, refresh_in_thread=refresh_in_thread, hidden=hidden
    ) as bar:
        update = ProgressUpdate(
            bar,
            label,
            refresh=not refresh_in_thread,
            count_from_first_update=count_from_first_update,
        )
        try:
            yield update
        finally:
            update.close()


def _rate_column(unit: str) -> ProgressColumn:
    """`12.3 img/s` (`- img/s` before there is a speed to show)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{format_rate(speed)} {unit}" if speed else f"- {unit}", style="cyan")

    return Rate()


class TrainProgress:
    """`torchkit train`'s progress: a bar per epoch and one log line per epoch on stderr (rank 0
    only). It is the run's callbacks, and asks `stop` whether a signal wants the run to end."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.stop: StopOnSignal | None = None
        self._progress = None
        self._task = None
        self._epochs = 0
        self._shows_top5 = True  # not with 5 classes or fewer (`core.topk`), told by on_start
        self._told_stop = False

    def __enter__(self) -> TrainProgress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

            self._progress = stderr_progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
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
        from torchkit.core.topk import topk_informative

        self._shows_top5 = topk_informative(info.topk, len(info.classes))
        sizes = f"{info.train_size} train / {info.val_size} val"
        if info.test_size:
            sizes += f" / {info.test_size} test"
        from torchkit.core.io.redaction import redact_url

        data = redact_url(info.config.data)  # a URL whole: a raw space in its token hidden too
        what = "continuing" if info.resumed_from else "training"
        where = f"{info.device}" + (f" x {info.world_size}" if info.world_size > 1 else "")
        console.note(
            f"{what} {info.model} ({info.trainable:,} trainable parameters) on "
            f"{data}: {sizes} images, {len(info.classes)} classes, {where}; "
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
            f"{format_rate(info.images_per_s)} img/s"
        )
        self._progress.update(self._task, completed=info.step, stats=stats)

    def on_eval(self, split: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, stats=f"evaluating {split}")

    def on_epoch_end(self, row: dict, is_best: bool) -> None:
        if not self.enabled or console.is_quiet():
            return
        if self._progress is not None and self._task is not None:
            self._progress.remove_task(self._task)
            self._task = None
        width = len(str(self._epochs))
        line = (
            f"epoch {row['epoch']:>{width}}/{self._epochs}  "
            f"train loss {row['train_loss']:.4f}"
            + (f" (+ l1 {row['train_l1']:.4f})" if "train_l1" in row else "")
            + f" top1 {row['train_top1']:.4f}  "
            f"val loss {row['val_loss']:.4f} top1 {row['val_top1']:.4f}"
        )
        if self._shows_top5:
            line += f" top5 {row['val_top5']:.4f}"
        if "val_ema_top1" in row:  # the EMA weights' metrics pick best.pt: show both
            line += f"  ema loss {row['val_ema_loss']:.4f} top1 {row['val_ema_top1']:.4f}"
        line += (
            f"  lr {row['lr']:.2e}  {row['epoch_time_s']:.1f}s  "
            f"{format_rate(row['images_per_s'])} img/s" + ("  *best" if is_best else "")
        )
        console.stderr.print(line, highlight=False, markup=False, soft_wrap=True)

    def should_stop(self) -> bool:
        return self.stop is not None and self.stop.requested

    def stop_signal(self) -> int:
        return int(self.stop.signum or 0) if self.should_stop() else 0

    def on_train_end(self, stopped: bool) -> None:
        if self.stop is not None:
            self.stop.end_training(stopped)
