"""A lock another thread holds at a fork stays held in the child for good (only the forking
thread is copied, never the holder that would release it): a DataLoader worker forked while a
thread of the command read a shard (`convert shards` reads ahead in threads) hung at its first
read of a shard. Each module lock a forked worker takes is a fresh one in the child."""

from __future__ import annotations

import os
import select
import signal
import threading

import pytest

from torchkit.core.data.sources import shards


def forked_while_held(lock_of, call) -> bytes:
    """Fork while another thread holds the module lock `lock_of()`; the child runs `call()` and
    writes what it returns. That output, or b"" where the child was still waiting 20 s later."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock_of():
            held.set()
            done.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    held.wait(60)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            os.close(read_end)
            os.write(write_end, call())
        finally:
            os._exit(0)
    os.close(write_end)
    done.set()
    holder.join()
    try:
        ready, _, _ = select.select([read_end], [], [], 20)
        return os.read(read_end, 1024) if ready else b""
    finally:
        os.close(read_end)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_worker_forked_while_a_thread_reads_a_shard_reads_shards(tmp_path):
    shard = tmp_path / "a.tar"
    shard.write_bytes(b"0123456789")
    read = forked_while_held(
        lambda: shards._descriptors_lock,
        lambda: shards._pread(str(shard), 2, 4, lambda fd: None),
    )
    assert read == b"2345"  # before: b"" (the child waited on the lock for good)
