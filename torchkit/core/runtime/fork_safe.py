"""Module-level locks that a forked child gets free.

fork() copies only the forking thread. A lock another thread of the parent held at that moment
stays held in the child for good, and the child's first `with lock:` waits forever: a DataLoader
worker forked while a thread of the command read a shard hung at its first read. A
`ForkSafeLock` is made anew in the child, unless the forking thread itself held it: that
thread lives on in the child and releases it as it would have in the parent.

Only for locks that guard what a thread does within the lock: state a block left half-changed
in the parent stays so in the child.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

_all: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


class ForkSafeLock:
    """A `threading.Lock` (`threading.RLock` with `reentrant`) made anew in a forked child
    (module doc). A context manager, as the lock is; `acquire` and `release` as its own."""

    __slots__ = ("__weakref__", "_depth", "_lock", "_owner", "_reentrant")

    def __init__(self, reentrant: bool = False) -> None:
        self._reentrant = reentrant
        self._renew()
        _all.add(self)

    def _renew(self) -> None:
        self._lock = threading.RLock() if self._reentrant else threading.Lock()
        self._owner: int | None = None  # the thread holding it (written only by that thread)
        self._depth = 0  # how many times the owner holds it (reentrant)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner = threading.get_ident()
        self._depth += 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: Any) -> None:
        self.release()

    def _in_forked_child(self) -> None:
        # The forking thread is the child's only one, with the same ident: a lock it holds is
        # released by it. Any other lock is made anew, held or not (a thread of the parent may
        # have been between taking it and noting itself its owner).
        if self._owner != threading.get_ident():
            self._renew()


def _renew_in_child() -> None:
    for lock in list(_all):
        lock._in_forked_child()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_renew_in_child)
