"""Stand-in modules in sys.modules while blocks of code run, out again when the last one ends.

torchvision's imports and summary's passes ask heavy modules (torch._dynamo, sympy) for a few
names they answer without them; `without_dynamo` and `plain_shapes` place light stand-ins for
the blocks that ask. What both need: stand-ins placed when the outermost block starts and
removed when it ends, however the blocks nest and whichever threads run them, nothing placed
once the real module is loaded, and a stand-in that answers any name it lacks from the real
module (imported then) and notes that name.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any

from torchkit.core.runtime.fork_safe import ForkSafeLock


class StandInModule(types.ModuleType):
    """A stand-in: the names it was given, and any other name from the real module (`real`
    imports it), noted in `missing`."""

    def __init__(
        self, name: str, real: Callable[[str], types.ModuleType], missing: list[str]
    ) -> None:
        super().__init__(name)
        self.__dict__["_real_module"], self.__dict__["_missing"] = real, missing

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # probes of a module's file, path...: as a module without
            raise AttributeError(attr)
        self._missing.append(f"{self.__name__}.{attr}")
        return getattr(self._real_module(self.__name__), attr)


class StandInsWhileRunning:
    """`running()`: a block run with the stand-ins in place (`place`), taken out (`remove`) when
    the outermost running block ends; nothing is placed while `real_loaded()`."""

    def __init__(
        self,
        place: Callable[[], None],
        remove: Callable[[], None],
        real_loaded: Callable[[], bool],
    ) -> None:
        self._place, self._remove, self._real_loaded = place, remove, real_loaded
        self._depth = 0  # blocks running under the stand-ins now (threads, nesting)
        # Guards the count and sys.modules' entries, never an import (a thread holding it
        # while importing could wait on another thread's import). A forked child's own: its
        # first import of a torchvision module (a DataLoader worker's) would wait for good on
        # one another thread held at the fork.
        self.lock = ForkSafeLock(reentrant=True)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self.lock:
            if self._depth == 0 and self._real_loaded():
                placed = False
            else:
                placed = True
                if self._depth == 0:
                    self._place()
                self._depth += 1
        if not placed:
            yield
            return
        try:
            yield
        finally:
            with self.lock:
                self._depth -= 1
                if self._depth == 0:
                    self._remove()

    def remove_now(self) -> None:
        """The stand-ins out before the real module is imported (the blocks running keep
        counting: the last one's end removes nothing more)."""
        with self.lock:
            self._remove()
