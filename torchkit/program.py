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


def end_on_signals_while_starting() -> None:
    """When torchkit is the program: SIGINT and SIGTERM end it at once with the line a stopped
    command prints, until the command's handlers replace these. A signal the process was
    started ignoring (a background job's SIGINT, nohup) stays ignored."""
    if not runs_as_the_program():
        return
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    for signum, default in defaults.items():
        if signal.getsignal(signum) is default:
            signal.signal(signum, _end_while_starting)


def ends_while_starting(handler: Any) -> bool:
    """Whether `handler` (from `signal.getsignal`) is the one set while starting."""
    return handler is _end_while_starting
