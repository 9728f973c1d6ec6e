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
import importlib.abc
import signal
import sys
import threading
import types
from collections.abc import Iterable, Iterator
from typing import Any

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
    """Signals noted by `defer` within the block are sent again when it ends."""
    global _depth
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


class _Finder(importlib.abc.MetaPathFinder):
    """Finds `PACKAGES` as the other finders do, with their loader wrapped."""

    searching = False  # finders that ask the others (torchvision_without_dynamo's) ask us

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in PACKAGES or threading.current_thread() is not threading.main_thread():
            return None  # Python runs signal handlers in the main thread only
        if self.searching:
            return None
        self.searching = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader)
                    return spec
            return None
        finally:
            self.searching = False


class _Loader(importlib.abc.Loader):
    """The real loader, its module run with signals held back."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def create_module(self, spec: Any) -> Any:
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self.real  # the module keeps the real loader (resources, reloads)
        if module.__spec__ is not None:
            module.__spec__.loader = self.real
        with signals_deferred():
            self.real.exec_module(module)
