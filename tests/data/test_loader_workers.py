"""DataLoader worker processes: each command's loader workers are forked with the guard that
ends a worker whose parent is gone before it started (`core.data.dataset.OrphanedWorkerExit`)."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from process_threads import thread_count
from processes import run_torchkit_in_process

from torchkit.core.data.dataset import OrphanedWorkerExit

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forked workers only")


def _wait_for_eof(fd: int, timeout: float = 30.0) -> bytes:
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], deadline - time.monotonic())
        if not ready:
            break
        chunk = os.read(fd, 64)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
    raise AssertionError("the worker did not end")


def _worker_of_a_parent_that(dies_first: bool) -> bytes:
    """What a worker wrote before it ended: a process makes the guard (as a loader would) and
    forks a worker; with `dies_first` the process is gone before the worker starts, as when a
    run is killed the moment its workers are forked. The worker writes "started" if its start
    (`then`) ran, and ends when the test closes `go`."""
    out_read, out_write = os.pipe()
    go_read, go_write = os.pipe()
    parent = os.fork()
    if parent == 0:  # the loader's process
        os.close(out_read)
        os.close(go_write)

        def then(worker_id: int) -> None:
            os.write(out_write, b"started")

        guard = OrphanedWorkerExit(then)
        if os.fork() == 0:  # its worker
            if dies_first:
                while os.getppid() == guard.parent:
                    time.sleep(0.001)
            guard(0)
            os.read(go_read, 1)  # a live worker waits for work
            os._exit(0)
        if not dies_first:
            os.read(go_read, 1)
        os._exit(0)
    os.close(out_write)
    os.close(go_read)
    try:
        if dies_first:
            return _wait_for_eof(out_read)
        started = os.read(out_read, 64)  # the live worker's start ran
        os.close(go_write)
        go_write = -1
        return started + _wait_for_eof(out_read)
    finally:
        if go_write >= 0:
            os.close(go_write)
        os.close(out_read)
        os.waitpid(parent, 0)


def test_a_worker_whose_parent_died_before_it_started_ends_at_once():
    assert _worker_of_a_parent_that(dies_first=False) == b"started"
    # Before: the worker went on (torch then noted init as its parent and waited forever).
    assert _worker_of_a_parent_that(dies_first=True) == b""


def _worker_left_by_a_killed_parent(*, forked_by_a_thread: bool) -> bytes:
    """What a started worker wrote before it ended: a process makes the guard and forks a
    worker (from its main thread, or from a thread that then ends), which starts (`guard(0)`,
    writing "started") and waits for work; the process then ends while the worker waits.
    After that the test lets the worker go on: a worker still alive then writes "alive"."""
    import threading

    out_read, out_write = os.pipe()
    go_read, go_write = os.pipe()
    started_read, started_write = os.pipe()
    parent = os.fork()
    if parent == 0:  # the loader's process
        os.close(out_read)
        os.close(go_write)
        guard = OrphanedWorkerExit(lambda worker_id: os.write(out_write, b"started"))

        def fork_worker() -> None:
            if os.fork() == 0:  # its worker
                guard(0)
                os.write(started_write, b"s")
                os.read(go_read, 1)  # waits for work, as a loader worker between batches
                os.write(out_write, b" alive")
                os._exit(0)

        if forked_by_a_thread:
            thread = threading.Thread(target=fork_worker)
            thread.start()
            thread.join()
            while thread_count() > 1:  # the thread is gone from the kernel
                pass
        else:
            fork_worker()
        os.read(started_read, 1)
        os._exit(0)  # the loader's process ends (as when killed) while its worker waits
    for fd in (out_write, go_read, started_read, started_write):
        os.close(fd)
    try:
        os.waitpid(parent, 0)  # gone, its worker started
        with contextlib.suppress(BrokenPipeError):  # no worker left to read it
            os.write(go_write, b"g")
        # Either way the worker ends at once (killed, or told to go): the bound is for a hang.
        return _wait_for_eof(out_read)
    finally:
        os.close(go_write)
        os.close(out_read)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")
def test_a_started_worker_ends_with_its_killed_parent():
    # Before: the worker ran on until torch's watchdog looked (up to 5 s), holding the run
    # folder's lock: a rerun at once was refused as being written by the dead process.
    assert _worker_left_by_a_killed_parent(forked_by_a_thread=False) == b"started"
    # A worker forked by a thread is not ended with that thread (the watchdog ends it).
    assert _worker_left_by_a_killed_parent(forked_by_a_thread=True) == b"started alive"


def test_every_commands_loader_workers_start_with_the_guard(tmp_path, monkeypatch):
    """train, eval, predict and extract-features with -j 1: each loader that has workers is
    forked with the guard (recorded, then built without workers, to stay fast)."""
    import sklearn.metrics  # noqa: F401  (as in the suite's eval tests: eval scores here, no helper)
    import torch.utils.data

    made: list[tuple[int, object, object]] = []
    real = torch.utils.data.DataLoader

    class Recording(real):
        def __init__(self, *args, **kwargs):
            workers = kwargs.get("num_workers", 0)
            context = kwargs.get("multiprocessing_context")
            made.append((workers, kwargs.get("worker_init_fn"), context))
            for name in ("worker_init_fn", "multiprocessing_context", "prefetch_factor"):
                kwargs.pop(name, None)
            kwargs.update(num_workers=0, persistent_workers=False)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch.utils.data, "DataLoader", Recording)
    data = write_image_folder(tmp_path / "data", {"a": 4, "b": 4})
    model = tmp_path / "model.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes="ab")
    small = ["--image-size", "8", "--resize-size", "8", "-j", "1"]
    commands = {
        "train": ["train", "--data", data, "--model", "convnet", "--epochs", "1", "--val-split",
                  "0.5", "--out", tmp_path / "run", *small],
        "eval": ["eval", model, "--data", data, *small],
        "predict": ["predict", model, data, *small],
        "extract-features": ["extract-features", model, data, tmp_path / "features", *small],
    }  # fmt: skip
    for name, words in commands.items():
        made.clear()
        result = run_torchkit_in_process(*words)
        assert result.returncode == 0, (name, result.stderr)
        with_workers = [(init, context) for workers, init, context in made if workers > 0]
        assert with_workers, name
        for init, context in with_workers:
            assert isinstance(init, OrphanedWorkerExit), name
            assert init.parent == os.getpid()
            assert context.get_start_method() == "fork", name


def test_workers_hand_batches_over_after_the_temporary_folder_was_removed(tmp_path):
    """multiprocessing makes its temporary folder once a process and remembers it; removed
    since (a library caller's TMPDIR), a worker could not hand its batch over and the loader
    waited for it forever. It is now made again before the workers start."""
    from multiprocessing import process

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from torchkit.core.data.dataset import worker_options

    config = process.current_process()._config
    before = config.get("tempdir")
    gone = tmp_path / "pymp-gone"
    config["tempdir"] = str(gone)  # made by an earlier call, then removed
    try:
        data = TensorDataset(torch.arange(8.0).reshape(8, 1))
        # timeout: the hang an error (a worker started on a loaded machine takes seconds)
        loader = DataLoader(data, batch_size=4, num_workers=1, timeout=120, **worker_options(1))
        assert [batch[0].sum().item() for batch in loader] == [6.0, 22.0]
        assert config["tempdir"] != str(gone)
    finally:
        if before is None:
            config.pop("tempdir", None)
        else:
            config["tempdir"] = before
