"""How `torchkit train` answers SIGINT and SIGTERM: stop cleanly after the current update once
training has started, at once before and after it (see `StopOnSignal`)."""

from __future__ import annotations

import signal
import threading

from torchkit import deferred_signals
from torchkit.core.runtime.signals import handle_unless_ignored, note_stop


class StopOnSignal:
    """Ctrl-C (SIGINT) and SIGTERM during training: the first asks the run to stop after the
    current update (it saves last.pt and exits with 130, or 143 for SIGTERM); a second one
    ends it at once. Before training starts and after it ends (loading, the test evaluation)
    there is nothing to save, so a signal ends the command at once, as in every command.

    Under torchrun every rank's request is polled and all ranks stop at the same update (rank
    0 saving last.pt), whichever rank was signalled: a node without rank 0 included. Ranks other
    than 0 only note a signal, even before training (`graceful_from_start`): they end with the
    run, never alone in the middle of a collective."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, graceful_from_start: bool = False) -> None:
        self.requested = False
        self.signum: int | None = None
        self.graceful = graceful_from_start
        self._previous: dict = {}

    @property
    def terminated(self) -> bool:
        return self.signum == signal.SIGTERM

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            handle_unless_ignored(self.SIGNALS, self._handle, self._previous)
        return self

    def _handle(self, signum, frame) -> None:
        if deferred_signals.defer(signum):  # inside `import torch`: handled when it is over
            return
        if self.requested or not self.graceful:
            self.signum = signum
            self._quit()
        self.requested = True
        self.signum = signum

    def _quit(self):
        """End the command now: the clean-up (run folder, workers) runs, undisturbed by
        further signals."""
        from torchkit.core.io.errors import Terminated

        # Noted as every command's handler notes it: raised inside a finalizer, the stop is
        # dropped (and every later signal ignored), yet the command still ends with its code.
        note_stop(self.signum)
        deferred_signals.ignore_later(self._previous)
        raise Terminated() if self.terminated else KeyboardInterrupt()

    def start_training(self) -> None:
        self.graceful = True

    def end_training(self, stopped: bool) -> None:
        """A stop asked for after the last check (in the last epoch's evaluation) ends the
        command now, before the test evaluation."""
        self.graceful = False
        if self.requested and not stopped:
            self._quit()

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            if not deferred_signals.ignores(signal.getsignal(signum)):
                signal.signal(signum, previous)
