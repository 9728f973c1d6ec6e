"""An epoch's files (checkpoints, metrics.csv) written on a thread of their own while the next
epoch trains.

Serialising and writing an epoch's checkpoints took the run's main thread 0.56 s of the digits
job's 15 s, and 2.2-2.8 s of three resnet50 epochs on a GPU (300 MB with the AdamW state): as
long as validation. The training steps spend their time in torch ops that release the GIL, so a
writer thread overlaps the write with the next epoch. One write is in flight at most: the next
one (or a stop's synchronous last.pt, or the run's end) first waits for it, and its error (a
full disk: `cannot write ...`) is raised there, in the main thread, as if the write had been
synchronous. The checkpoint handed over must be a snapshot (`TrainState.checkpoint(...,
snapshot=True)`): the training goes on changing the live tensors.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

# Whether writes go to the thread; a benchmark sets it False to time synchronous saving in
# the same process. (Not an environment switch: there is no reason for a user to turn it off.)
BACKGROUND = True


class CheckpointWriter:
    """Runs one write at a time on a thread of its own (started for it, so that no thread
    outlives a run however it ends): `submit` waits for the write in flight, `wait` for the
    last one; both raise a failed write's error in the caller's thread."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._done = threading.Event()  # the write in flight is over (set with none in flight)
        self._done.set()
        self._error: BaseException | None = None

    @property
    def in_background(self) -> bool:
        """Whether a submitted write runs on the thread (so it needs a snapshot)."""
        return BACKGROUND

    def submit(self, write: Callable[[], None]) -> None:
        """Run `write` on the writer thread, once the previous write is done (its error is
        raised here instead)."""
        self.wait()
        if not self.in_background:
            write()
            return
        self._done.clear()
        # Not a daemon: an interpreter that exits during a write lets it finish.
        thread = threading.Thread(
            target=self._run, args=(write,), name="torchkit-checkpoint-writer"
        )
        try:
            thread.start()
        except BaseException:  # no thread ("can't start new thread"): nothing in flight
            self._done.set()
            raise
        self._thread = thread

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as error:  # raised again in the main thread by `wait`
            self._error = error
        finally:
            self._done.set()

    def wait(self) -> None:
        """Block until the write in flight is done; raise its error, if it failed. A signal
        that interrupts the wait (a second Ctrl-C) leaves the write to a later `wait`."""
        self._done.wait()
        if self._thread is not None:
            self._thread.join()  # it has only to return now
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def drain(self) -> None:
        """`wait`, for a run that is already failing: the first error is the one reported."""
        with contextlib.suppress(Exception):
            self.wait()
