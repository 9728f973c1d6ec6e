"""The outputs a command has open, which the end of the command closes whatever ends it.

Ctrl-C and SIGTERM end a command by raising wherever Python next runs a signal's handler: at
the start of any call, or as a C function returns. An output cleans up after itself inside its
own try blocks, but between them nothing does: a signal raised as `OutputFolder.__exit__` or
`finish()` was entered, or in a caller's step between making the folder and its `with`, left
the hidden `.NAME.XXXX.partial` folder and the lock behind. So every output is registered here
from before it makes anything on disk until it is done with (`opened`, `closed`), and the
CLI runs each command inside `closed_at_end`, which closes every output the command left open,
newest first (`close_unfinished`: nothing of the run left, an earlier output put back, the
lock released). A step that makes something on disk and learns its name only as it returns (a
`mkstemp` temporary, a lock file's descriptor) runs with signals deferred
(`deferred_signals.signals_deferred`) and registers before the signal is raised.

Nothing here imports more than the standard library: the CLI wraps every command in it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Iterator
from typing import Protocol

log = logging.getLogger("torchkit")


class OpenOutput(Protocol):
    def close_unfinished(self, error: BaseException | None) -> None:
        """Close an output its command left open: what the run wrote goes (unless it was
        kept), an earlier output goes back, locks are released."""


# token -> (the thread that opened it, the output), in the order they were opened
_open: dict[int, tuple[int, OpenOutput]] = {}
_tokens = itertools.count(1)

# The outputs (described) that a command left open although it ended well, newest first: a
# programming error (every output is kept or abandoned by its own code on the way out), which
# discards what the run wrote while the command reports success. The test suite's in-process
# runner fails the test that leaves one (tests/helpers/processes.py); a user sees a warning.
left_open_on_success: list[str] = []


def opened(output: OpenOutput) -> int:
    """Register `output` as open; the token returned closes the registration (`closed`)."""
    token = next(_tokens)
    _open[token] = (threading.get_ident(), output)
    return token


def closed(token: int | None) -> None:
    """The output `token` registered is done with: nothing of it is left to close."""
    if token is not None:
        _open.pop(token, None)


@contextlib.contextmanager
def closed_at_end() -> Iterator[None]:
    """Close every output opened in the block and still open when it ends, newest first: the
    outputs a stopped (or failed) command could not close itself. Outputs opened before the
    block are not the block's, nor those of other threads (a background writer's file): a
    signal is raised in this thread only, and theirs finish or fail in their own clean-up."""
    first = next(_tokens)  # every token the block hands out is above this one
    thread = threading.get_ident()
    error: BaseException | None = None
    try:
        yield
    except BaseException as stopped:
        error = stopped
        raise
    finally:
        # A copy of the keys: other threads open and close theirs meanwhile.
        for token in sorted([t for t in list(_open) if t > first], reverse=True):
            entry = _open.get(token)
            if entry is None or entry[0] != thread:  # closed meanwhile, or another thread's
                continue
            _open.pop(token, None)
            output = entry[1]
            if _ended_well(error):
                left_open_on_success.append(_described(output))
                log.warning(
                    f"an output was left unfinished by a command that ended well, and is "
                    f"discarded: {_described(output)} (a bug in torchkit: please report it)"
                )
            try:
                output.close_unfinished(error)
            except Exception as failure:  # the command's own ending is the one reported
                log.warning(f"could not clean up after the command: {failure}")


def _ended_well(error: BaseException | None) -> bool:
    """Whether a command's block ended as a success: it returned, or exited with code 0 (the
    CLI's `typer.Exit()`, which carries `exit_code`; a SystemExit, `code`)."""
    if error is None:
        return True
    if isinstance(error, SystemExit):
        return error.code in (0, None)
    return getattr(error, "exit_code", None) == 0


def _described(output: OpenOutput) -> str:
    """The output's kind, and its name where it has one (`OutputFolder out`)."""
    name = getattr(output, "final", None) or getattr(output, "path", None)
    return f"{type(output).__name__} {name}" if name is not None else type(output).__name__
