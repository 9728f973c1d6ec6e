"""Holding Ctrl-C and SIGTERM back for the few steps that must not be cut short, and waiting a
while for one."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

HELD_SIGNALS = ("SIGINT", "SIGTERM")

# torch's DataLoader learns of a worker that a signal ended from its SIGCHLD handler, which
# raises RuntimeError in the main thread wherever that is. SIGTERM sent to the whole process
# group (`timeout`, `kill -- -PGID`, systemd, `docker stop`) ends the workers with the command.
_LOADER_CHILD_HANDLERS = "torch.utils.data._utils.signal_handling"

# The signals whose handlers ended a command by raising, first first, since the app set its
# handlers (cli.app's `_terminate_like_interrupt` clears and reads it): the command ends with
# that signal's code (143, 130) even where the exception never came out of it (raised inside a
# finalizer or a `__del__`, Python drops it). Every such handler notes its signal here
# (`note_stop`), the app's and train's alike.
received_stops: list[int] = []


def note_stop(signum: int) -> None:
    """Record `signum` as what ends the command, unless a signal was recorded already."""
    if not received_stops:
        received_stops.append(signum)


def handle_unless_ignored(
    signums: Iterable[int], handler: Any, previous: dict[int, Any] | None = None
) -> None:
    """Set `handler` for each of `signums` but one ignored (SIG_IGN), recording in `previous`
    each handler it replaces as it goes (a signal may come between two). torchkit never sets
    SIG_IGN in a command's process: an ignored signal is one the process was started ignoring
    (nohup's SIGHUP, a shell's background job's SIGINT, a parent's choice), and it stays
    ignored."""
    for signum in signums:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            replaced = signal.signal(signum, handler)
            if previous is not None:
                previous[signum] = replaced


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done, then the first that came is raised as
    its own handler would have (also when the block fails).

    Their handlers are swapped for one that records them, rather than the signals masked: the
    kernel hands a signal to any thread that does not block it (a copy thread, a pool's
    threads) and Python then runs the handler in the main thread at once, so a mask in the main
    thread would not hold it; and a mask is inherited by processes forked in the block (pool
    workers that SIGTERM could then not stop). A process forked in the block that gets one
    dies of it as by default. Outside the main thread, which owns the handlers, nothing is
    held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()
    received: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a process forked meanwhile
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        received.append(signum)

    previous: dict[int, Any] = {}
    try:
        for name in HELD_SIGNALS:
            number = getattr(signal, name)
            previous[number] = signal.signal(number, hold)
        yield
    finally:
        _restore(previous)
        if received:
            signal.raise_signal(received[0])


def _restore(previous: dict[int, Any]) -> None:
    for number, handler in previous.items():
        signal.signal(number, signal.SIG_DFL if handler is None else handler)


class _Stopped(Exception):
    """SIGINT or SIGTERM came while `stopped_within` waited."""


def stopped_within(seconds: float) -> bool:
    """Whether SIGINT or SIGTERM comes within `seconds`, waiting that long for one: a signal that
    comes is taken (its handler does not run), one ignored (nohup) stays ignored. False at once
    outside the main thread, which owns the handlers."""
    if threading.current_thread() is not threading.main_thread():
        return False
    waiting, came = True, False

    def stop(signum: int, frame: Any) -> None:
        nonlocal came
        came = True
        if waiting:
            raise _Stopped

    previous: dict[int, Any] = {}
    try:
        handle_unless_ignored((getattr(signal, name) for name in HELD_SIGNALS), stop, previous)
        time.sleep(seconds)
    except _Stopped:
        pass
    finally:
        waiting = False  # one that comes now is only recorded
        _restore(previous)
    return came


def _worker_ended(signum: int, frame: Any) -> None:
    """SIGCHLD once the command stops: the workers the same signal ended are expected to end."""


def quiet_loader_worker_deaths() -> Callable[[int, Any], Any] | None:
    """Once a command stops on SIGINT or SIGTERM, a loader worker that the same signal ended
    (SIGTERM to the process group) is no failure: torch's SIGCHLD handler, which raised
    `RuntimeError: DataLoader worker (pid N) is killed by signal: Terminated.` in the middle of
    the clean-up (exit 1 in place of 143) or at exit (a traceback after `Terminated.`), is
    swapped for one that says nothing. Returns torch's handler, for `restore_loader_worker_deaths`
    (None where it is not installed, or outside the main thread, which owns the handlers)."""
    if not hasattr(signal, "SIGCHLD") or threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGCHLD)
    if getattr(handler, "__module__", None) != _LOADER_CHILD_HANDLERS:
        return None
    signal.signal(signal.SIGCHLD, _worker_ended)
    return handler


def restore_loader_worker_deaths(handler: Callable[[int, Any], Any]) -> None:
    """torch's SIGCHLD handler back (installed once a process): the loaders of a later command
    in the same process report their failed workers again."""
    if signal.getsignal(signal.SIGCHLD) is _worker_ended:
        signal.signal(signal.SIGCHLD, handler)
