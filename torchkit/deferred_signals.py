"""Ctrl-C and SIGTERM held back while torch, torchvision or OpenCV runs its first import.

torchkit's handlers end a command by raising (KeyboardInterrupt, `Terminated`) wherever the
signal finds the main thread. In the first seconds of a command that is often inside `import
torch`, in C++ that calls back into Python (torch._C's set-up importing numpy, the pybind11
bindings of torch.distributed). There the exception was swallowed, and the command went on with
every later signal ignored (a SIGTERM at 1.5 s: the run trained to its end and exited 0), or it
ended the process in `std::terminate` (exit 134 and a C++ dump). So while one of `PACKAGES` is
first imported in the main thread, a handler that calls `defer` only notes its signal; when the
import is over, the first noted signal is sent again (`signal.raise_signal`) and its handler
raises in torchkit's own code, which unwinds as usual.

A handler that has raised does not set SIG_IGN for the signals after it (`ignore_later`): a
second signal already on its way when SIG_IGN is set (SIGINT and SIGTERM sent together) makes
CPython print "Signal 15 ignored due to race condition", and SIG_IGN is inherited by every
program the clean-up starts. A handler that does nothing has neither effect.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import types
from collections.abc import Iterable, Iterator
from typing import Any

from torchkit.import_hooks import WrappingFinder

PACKAGES = ("torch", "torchvision", "cv2")
_depth = 0  # imports of PACKAGES running in the main thread now (torchvision imports torch)
_pending: list[int] = []


def install() -> None:
    """Hold back signals during the first import of each of `PACKAGES` from now on."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def defer(signum: int) -> bool:
    """Called first by a handler that raises: True when the signal is noted to be sent again
    after the import running now (the handler then returns at once)."""
    if _depth == 0:
        return False
    if signum not in _pending:
        _pending.append(signum)
    return True


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Signals noted by `defer` within the block are sent again when it ends. Only the main
    thread's block holds them back: handlers run (and raise) there alone, so another thread's
    block has nothing to fear from them. Counted for any thread, a block of a download thread
    (making its temporary file) held the main thread's Ctrl-C back and sent it again from that
    thread, where it woke nothing: the main thread, waiting for the downloads, waited for ever."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending:
            signum = _pending[0]
            _pending.clear()
            signal.raise_signal(signum)  # its handler runs (and raises) right here


def _ignored(signum: int, frame: Any) -> None:
    """A later signal while a stopped command cleans up: nothing to do."""


def ignore_later(signums: Iterable[int]) -> None:
    """Later `signums` do nothing (see the module doc for why not SIG_IGN)."""
    for signum in signums:
        signal.signal(signum, _ignored)


def is_ignore_later(handler: Any) -> bool:
    """Whether `handler` (from `signal.getsignal`) is the one `ignore_later` sets."""
    return handler is _ignored


def ignores(handler: Any) -> bool:
    """Whether `handler` (from `signal.getsignal`) is `ignore_later`'s, or SIG_IGN."""
    return handler is _ignored or handler is signal.SIG_IGN


class _Finder(WrappingFinder):
    """Finds `PACKAGES` as the other finders do; their first import runs with signals held
    back."""

    def wants(self, name: str) -> bool:
        # Python runs signal handlers in the main thread only: elsewhere nothing to hold back.
        return name in PACKAGES and threading.current_thread() is threading.main_thread()

    def running(self, module: types.ModuleType) -> contextlib.AbstractContextManager:
        return signals_deferred()
