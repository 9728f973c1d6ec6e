"""Worker processes started as new interpreters (`map_chunks(start_fresh=True)`, video-info's
pool): what other threads of the command hold is not copied into them, and they end with the
command however it ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading

from processes import processes_in_group, wait_until

from torchkit.core.runtime.pool import map_chunks

_held = threading.Lock()


def _takes_the_lock(_chunk: int) -> bool:
    taken = _held.acquire(timeout=3)
    if taken:
        _held.release()
    return taken


def test_a_lock_another_thread_holds_is_not_held_in_freshly_started_workers():
    """A fork copies a lock that another thread holds as held (OpenCV's and FFmpeg's threads in a
    process that read videos before): the worker that takes it waits forever. Workers started
    fresh take it at once."""
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with _held:
            holding.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(5)
    try:
        taken: list[bool] = []
        map_chunks(_takes_the_lock, [1, 2], workers=2, on_result=taken.append, start_fresh=True)
    finally:
        done.set()
        holder.join()
    assert taken == [True, True]


def test_freshly_started_workers_end_when_the_command_is_killed():
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path[:0] = {sys.path!r}
        from torchkit.core.runtime.pool import map_chunks
        map_chunks(time.sleep, [60] * 4, workers=2, on_result=print, start_fresh=True)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        # The command and its two workers.
        wait_until(
            lambda: len(processes_in_group(process.pid)) >= 3,
            process=process,
            timeout=60,
            what="the workers to start",
        )
        process.send_signal(signal.SIGKILL)
        process.wait(5)
        wait_until(
            lambda: not processes_in_group(process.pid), timeout=10, what="the workers to end"
        )
    finally:
        for pid in processes_in_group(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
