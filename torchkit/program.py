"""torchkit as this process's program: whether it is (`runs_as_the_program`), and how it ends on
Ctrl-C or SIGTERM while it starts, before a command's own handlers are set
(`end_on_signals_while_starting`).

Importing the CLI (typer, rich, every command's module) takes a few tenths of a second. A Ctrl-C
then used to end in Python's KeyboardInterrupt traceback (18 lines), and a SIGTERM in silence;
nothing needs cleaning up yet, so both now end at once with the line and exit status a command
gives them. Light on purpose: it runs before anything else is imported.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from typing import Any

# The line and exit status of a command stopped by each signal (the CLI's `invoke` prints the
# same); 128 + the signal's number, as a shell reports a process killed by it.
_ENDINGS = {signal.SIGINT: (b"Interrupted.\n", 130), signal.SIGTERM: (b"Terminated.\n", 143)}


def runs_as_the_program() -> bool:
    """Whether `main` is this process's program (the `torchkit` script, `python -m torchkit`,
    `torchrun -m torchkit`), not a call from someone's Python, which may catch SystemExit and
    carry on: only the program may end the process."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name == "torchkit.__main__":
        return True
    return os.path.splitext(os.path.basename(sys.argv[0]))[0] == "torchkit"


def _end_while_starting(signum: int, frame: Any) -> None:
    line, code = _ENDINGS[signum]
    with contextlib.suppress(OSError):
        os.write(2, line)
    os._exit(code)


def _hang_up_as_terminate(signum: int, frame: Any) -> None:
    """SIGHUP: SIGTERM, to whatever handles SIGTERM now (a command's clean stop, or the end of a
    starting torchkit; a forked worker's default death)."""
    signal.raise_signal(signal.SIGTERM)


def end_on_signals_while_starting() -> None:
    """When torchkit is the program: SIGINT and SIGTERM end it at once with the line a stopped
    command prints, until the command's handlers replace these; SIGHUP (the terminal closed, an
    ssh connection lost) is SIGTERM from now on, so a command hung up stops as cleanly (train saves
    last.pt, a set-aside output is put back, no lock file is left). A signal the process was
    started ignoring (a background job's SIGINT, nohup's SIGHUP) stays ignored."""
    if not runs_as_the_program():
        return
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    for signum, default in defaults.items():
        if signal.getsignal(signum) is default:
            signal.signal(signum, _end_while_starting)
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
        signal.signal(signal.SIGHUP, _hang_up_as_terminate)


def ends_while_starting(handler: Any) -> bool:
    """Whether `handler` (from `signal.getsignal`) is the one set while starting."""
    return handler is _end_while_starting


# The standard descriptors (0-2) this process was started without (`2>&-`), found closed and
# opened on /dev/null by `open_closed_standard_descriptors`.
_closed_at_start: frozenset[int] = frozenset()
# The descriptors above 2 it was started with (`3>log.txt`), found there too; None: unknown
# (torchkit called from someone's Python, or no descriptor listing).
_inherited_at_start: frozenset[int] | None = None


def open_closed_standard_descriptors() -> None:
    """When torchkit is the program: each of descriptors 0-2 it was started without (`2>&-`,
    `>&-`, `<&-`) is opened on /dev/null, as daemons and coreutils do. Left closed, the next
    file opened took its number: the lock file of a run folder became descriptor 2, and every
    write a library or a crashing worker makes to stderr at the C level landed in it. Python
    has already set sys.stdout/sys.stderr/sys.stdin to None for them, so they stay "closed" to
    torchkit; `closed_at_start` says which they were."""
    global _closed_at_start, _inherited_at_start
    if not runs_as_the_program():
        return
    _inherited_at_start = _descriptors_above_2()
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError as error:
            if error.errno == errno.EBADF:
                closed.append(fd)
    for fd in closed:  # lowest first: each open takes the lowest free number, this one
        opened = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
        if opened != fd:
            os.dup2(opened, fd)
            os.close(opened)
        os.set_inheritable(fd, True)  # child processes get it too, as a shell would give it
    _closed_at_start = frozenset(closed)


def _descriptors_above_2() -> frozenset[int] | None:
    """The open descriptors above 2 (None: no listing of them on this system)."""
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(listing)
        except OSError:
            continue
        found = set()
        for fd in (int(name) for name in names if name.isdigit() and int(name) > 2):
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                os.fstat(fd)
                found.add(fd)
        return frozenset(found)
    return None


def closed_at_start(fd: int) -> bool:
    """Whether descriptor `fd` was closed when the program started: one of 0-2 (now
    /dev/null), or one above 2 it was not given (`-o /dev/fd/3` without `3>FILE`), which a
    file torchkit opened itself (a run folder's lock) may hold by now."""
    if fd in _closed_at_start:
        return True
    return fd > 2 and _inherited_at_start is not None and fd not in _inherited_at_start
