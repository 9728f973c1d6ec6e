"""Worker processes that end with the process that forked them.

A forked worker whose parent is killed (SIGKILL, the OOM killer) is adopted by init and never
learns of it: it waits for work forever and keeps what it inherited open, the output folder's
lock and the command's stdout and stderr pipes among them, so that every later run on that
folder is refused and `torchkit ... | cat` never ends."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def exit_if_orphaned(parent: int) -> None:
    """Exit at once (status 0) if `parent`, the PID this process was forked from, is gone
    already: its parent is then init (or a subreaper), not `parent`."""
    if os.getppid() != parent:
        os._exit(0)


def end_with_parent(parent: int, signum: int = signal.SIGTERM) -> None:
    """Have the kernel send this process `signum` when its parent dies (Linux's
    PR_SET_PDEATHSIG; nothing elsewhere), then exit if `parent` died before that was set (the
    race while forking). The signal's handler decides what it does: the default ends it."""
    if sys.platform.startswith("linux"):
        import ctypes

        # Without a libc to ask, the check below still catches a parent gone already.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    exit_if_orphaned(parent)
