"""A lock another thread holds at a fork stays held in the child for good (only the forking
thread is copied, never the holder that would release it): a DataLoader worker forked while a
thread of the command read a shard (`convert shards` reads ahead in threads) hung at its first
read of a shard. Each module lock a forked child takes is a fresh one in the child
(`core.runtime.fork_safe.ForkSafeLock`), and one the forking thread held is still its own."""

from __future__ import annotations

import os
import select
import signal
import threading

import pytest
import torch
from parquet_files import write_parquet

from torchkit import torchvision_without_dynamo
from torchkit.core.data.sources import parquet, shards
from torchkit.core.models import random_init
from torchkit.core.runtime import plain_shapes
from torchkit.core.runtime.fork_safe import ForkSafeLock

no_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")


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
    try:
        return forked(call)
    finally:
        done.set()
        holder.join()


def forked(call) -> bytes:
    """What `call()` returns in a child forked now, or b"" where it was still waiting 20 s
    later."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            os.close(read_end)
            os.write(write_end, call())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 20)
        return os.read(read_end, 1024) if ready else b""
    finally:
        os.close(read_end)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@no_fork
def test_a_worker_forked_while_a_thread_reads_a_shard_reads_shards(tmp_path):
    shard = tmp_path / "a.tar"
    shard.write_bytes(b"0123456789")
    read = forked_while_held(
        lambda: shards._descriptors_lock,
        lambda: shards._pread(str(shard), 2, 4, lambda fd: None),
    )
    assert read == b"2345"  # before: b"" (the child waited on the lock for good)


@no_fork
def test_a_worker_forked_while_a_thread_reads_parquet_reads_parquet(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", [b"image bytes"], [0])
    read = forked_while_held(
        lambda: parquet._reading,
        lambda: parquet.ParquetImages([str(path)], ["image"]).read((0, 0, 0)),
    )
    assert read == b"image bytes"


def _built_without_random_init() -> bytes:
    layer = random_init.built_for_loading(lambda: torch.nn.Linear(2, 2))
    return b"built" if isinstance(layer, torch.nn.Linear) else b""


def _ran_without_dynamo() -> bytes:
    with torchvision_without_dynamo.without_dynamo():
        pass
    return b"ran"


def _ran_with_plain_shapes() -> bytes:
    with plain_shapes.plain_shapes():
        pass
    return b"ran"


@no_fork
@pytest.mark.parametrize(
    ("lock_of", "call", "said"),
    [
        # A model built in a child of a process whose other thread was building one.
        (lambda: random_init._install_lock, _built_without_random_init, b"built"),
        # A DataLoader worker's first import of a torchvision module (the stand-ins for
        # torch._dynamo) while a thread of the command imported one at the fork.
        (lambda: torchvision_without_dynamo._STAND_INS.lock, _ran_without_dynamo, b"ran"),
        # summary's stand-ins for sympy, the same class.
        (lambda: plain_shapes._STAND_INS.lock, _ran_with_plain_shapes, b"ran"),
    ],
    ids=["random-init", "torchvision-stand-ins", "sympy-stand-ins"],
)
def test_a_child_forked_while_a_thread_holds_a_module_lock_takes_it(lock_of, call, said):
    assert forked_while_held(lock_of, call) == said  # before: b"" (waited for good)


@no_fork
@pytest.mark.parametrize("reentrant", [False, True], ids=["lock", "rlock"])
def test_a_lock_the_forking_thread_holds_is_its_own_in_the_child(reentrant):
    """The forking thread lives on in the child: it releases what it held there, and the lock
    is then free (a fresh lock in its place would be released unheld: RuntimeError)."""
    lock = ForkSafeLock(reentrant=reentrant)

    def in_child() -> bytes:
        lock.release()  # taken before the fork
        if reentrant:
            lock.release()
        return b"free" if lock.acquire(blocking=False) else b"held"

    with lock:
        if reentrant:
            lock.acquire()
        said = forked(in_child)
        if reentrant:
            lock.release()
    assert said == b"free"
    assert lock.acquire(blocking=False)  # and free in the parent
    lock.release()
