"""The threads of a process as the tests list and count them (process_threads.py): every one,
where a single listing of /proc/self/task ends early when the thread it stands on ends."""

from __future__ import annotations

import os
import threading

import pytest
from preloaded_processes import PreloadedServer, import_environment
from process_threads import thread_ids
from processes import child_environment

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task"), reason="the threads in Linux's /proc"
)


@pytest.fixture
def waiting_thread():
    """A thread that waits until the test ends."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join()


def test_the_threads_listed_are_all_of_them_where_a_listing_ends_early(monkeypatch, waiting_thread):
    """A thread that a listing of /proc/self/task left out, as a listing does where the thread
    it stands on ends meanwhile, is found by reading it again: taken for one that was not there
    before a command, it made the command's forks look as if they ran beside it."""
    left_out = str(waiting_thread.native_id)
    listdir = os.listdir
    listings = []

    def ended_early_once(path):
        listed = listdir(path)
        listings.append(path)
        return [tid for tid in listed if tid != left_out] if len(listings) == 1 else listed

    monkeypatch.setattr(os, "listdir", ended_early_once)
    found = thread_ids()
    monkeypatch.undo()
    assert left_out in found and str(threading.get_native_id()) in found
    assert len(listings) >= 2  # read again


def test_a_thread_listed_that_ended_since_is_not_among_them(monkeypatch):
    """The threads are those of one moment: one listed that ended before it came is not one
    (a fork's watch took it for a thread beside the fork)."""
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    gone = str(ended.native_id)
    while os.path.exists(f"/proc/self/task/{gone}"):  # until the kernel let it go
        pass
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: [*listdir(path), gone])
    found = thread_ids()
    monkeypatch.undo()
    assert gone not in found and str(threading.get_native_id()) in found


def test_a_preloaded_server_with_a_thread_refuses_to_fork():
    """A server whose `import torch` started OpenMP's pool (OMP_NUM_THREADS=2) says so and
    forks nothing: its processes start fresh. It counts its threads with `thread_count` (one
    that counted fewer would let a fork run beside a thread; more: test_suite_processes.py's
    forks would start fresh)."""
    environment = {**import_environment(child_environment(None)), "OMP_NUM_THREADS": "2"}
    server = PreloadedServer(environment)
    try:
        assert "threads" in server.refused  # (torch 2.4 also imports a module it refuses)
    finally:
        server.close()
