"""The threads of this process as Linux's /proc has them: every one, OpenMP's and Gloo's too
(`threading` knows only Python's).

One listing of /proc/self/task is not a snapshot: Linux walks the threads from the oldest on,
and where the thread it stands on ends meanwhile, the listing ends there, short of every live
thread after it (measured: 1 or 2 listings in 1,000 with threads ending beside them). A thread
that ended as a test listed the threads (a queue's feeder, a pipe's reader, pytest's
faulthandler timer of the test before) hid those started after it: taken for absent before a
command, they were said to be the command's; absent at a fork, a thread beside it went unseen.
`thread_ids` reads the listing again until it holds every thread; `thread_count` is the kernel's
own count, exact at once.

Standard library only (os): a sitecustomize of a torchkit process imports it (gloo_ranks.py),
and the preloaded servers run `thread_count`'s source (preloaded_processes.py)."""

from __future__ import annotations

import os


def thread_count() -> int:
    """The process's threads as the kernel counts them (/proc/self/status's Threads:), exact
    where a listing of /proc/self/task may end early."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line in /proc/self/status")


def thread_ids() -> set[str]:
    """The ids of the threads of the process alive as the kernel counted them, every one and
    no other: a listing of /proc/self/task read again until it holds them all."""
    while True:
        listed = os.listdir("/proc/self/task")
        counted = thread_count()
        # Those listed and still there after the count was read were there as it was read
        # (a thread does not come back): where they are as many as it counts, they are the
        # threads of that moment, none left out. Fewer: a thread ended or started as the
        # listing was read (or one listed ended since).
        alive = {tid for tid in listed if os.path.exists(f"/proc/self/task/{tid}")}
        if len(alive) >= counted:
            return alive
