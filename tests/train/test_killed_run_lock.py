"""A SIGKILLed run's outputs are free for a rerun at once: no process it started (DataLoader
workers, the curves helper) holds its locks (its folder's, an old file's set aside, the
temporaries of its atomic writes, an HTTP shard's download lock). A forked child shares the
parent's open lock file, and so its flock, until the child closes its copy; a worker whose
parent was killed lives on until torch's next look at its parent (up to 5 s), and `train
--resume` run at once was refused as "being written by another torchkit process"."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from image_folders import write_image_folder
from processes import (
    processes_in_group,
    run_torchkit_in_process,
    start_torchkit_process,
    wait_until,
)
from safety_world import GATE_MODULE
from suite_paths import HELPERS

from torchkit.core.data.dataset import OrphanedWorkerExit
from torchkit.core.io.file_outputs import ReplacedFiles
from torchkit.core.io.files import atomic_path, atomic_write
from torchkit.core.io.folder_locks import flock_path
from torchkit.core.io.output_locks import FolderLock, OutputLockedError
from torchkit.core.split.files import moving_out_of

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX forks")


def _opened_in_child(*paths: Path) -> bool:
    """Whether a process forked now has a descriptor of any of `paths` open (Linux /proc)."""
    files = {(info.st_dev, info.st_ino) for info in map(os.stat, paths)}
    pid = os.fork()
    if pid == 0:  # the child: reports through its exit status, runs nothing else
        found = False
        for name in os.listdir("/proc/self/fd"):
            try:
                info = os.fstat(int(name))
            except OSError:  # listdir's own descriptor, closed since
                continue
            found = found or (info.st_dev, info.st_ino) in files
        os._exit(1 if found else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def test_a_forked_child_holds_none_of_the_output_locks(tmp_path):
    """The run folder's lock (`FolderLock`), an old file set aside (`ReplacedFiles`) and the
    folders split moves files out of (`moving_out_of`): each closed in a forked child."""
    old, moved = tmp_path / "old.json", tmp_path / "moved"
    old.write_text("{}")
    moved.mkdir()
    lock = FolderLock(tmp_path / "run", "run folder")
    try:
        with ReplacedFiles() as replaced, moving_out_of(moved):
            replaced.set_aside(old)
            assert not _opened_in_child(lock.path, old, moved)
            with pytest.raises(OutputLockedError):  # the parent's locks are held
                FolderLock(tmp_path / "run", "run folder")
            with pytest.raises(OutputLockedError), moving_out_of(moved):
                pass
            replaced.keep()
    finally:
        lock.release()
    FolderLock(tmp_path / "run", "run folder").release()  # released with the last descriptor


@contextlib.contextmanager
def _killed_inside(block: Callable[[], contextlib.AbstractContextManager]) -> Iterator[None]:
    """A forked writer enters `block()`, forks a child there (a loader starting its workers
    while a report streams into its file, a download beside them) and is SIGKILLed in it; the
    child lives on, as a worker does until it learns of the kill, while the caller's block
    runs: whatever lock the child holds shows."""
    release_read, release_write = os.pipe()
    writer = os.fork()
    if writer == 0:  # the writer: runs nothing of the test's
        try:
            os.close(release_write)
            with block():
                if os.fork() == 0:  # the child: lives until the test's end of the pipe closes
                    os.read(release_read, 1)
                    os._exit(0)
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    os.close(release_read)
    try:
        _, status = os.waitpid(writer, 0)
        assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL
        yield
    finally:
        os.close(release_write)


@pytest.mark.parametrize("write", [atomic_write, atomic_path])
def test_a_killed_writers_temporary_is_not_kept_locked_by_its_children(tmp_path, write):
    """The temporary an atomic write leaves when SIGKILLed is a dead writer's, removed by the
    next write of the file, even while a process the writer forked lives on (it shared the
    temporary's flock, and the next write took the temporary for a live writer's)."""
    target = tmp_path / "predictions.csv"
    with _killed_inside(lambda: write(target)):
        assert len(list(tmp_path.iterdir())) == 1  # the temporary
        with write(target) as written:
            (written.write if write is atomic_write else written.write_text)("path,class\n")
        assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_killed_downloads_shard_lock_is_not_kept_by_its_children(tmp_path):
    """A cached shard's download lock goes with the process that took it: the next run
    downloads the shard at once, not after waiting for a child of the killed run."""
    from torchkit.core.data.sources.http_shards import _locked

    lock = tmp_path / ".shard-000.tar.lock"
    with _killed_inside(lambda: _locked(lock, threading.Event(), "shard-000.tar")):
        fd = flock_path(lock, exclusive=True)  # BlockingIOError: a live process holds it
        assert fd is not None
        os.close(fd)


def test_the_workers_of_a_sigkilled_run_do_not_keep_its_folder_locked(tmp_path):
    write_image_folder(tmp_path / "ds" / "train", {"a": 4, "b": 4})
    gate = tmp_path / "gate"
    env = {
        "PYTHONPATH": str(HELPERS),
        "TORCHKIT_TEST_GATE_FILE": str(gate),
        "TORCHKIT_TEST_GATE_AT": "1",
    }
    args = ["train", "--data", "ds", "--model", "nets:GatedNet", "--image-size", "8"]
    args += ["--batch-size", "2", "--workers", "1", "--epochs", "1", "--out", "run"]
    killed = start_torchkit_process(*args, cwd=tmp_path, env=env)
    try:
        wait_until(gate.exists, process=killed, what="the first training step")
        children = [pid for pid in processes_in_group(killed.pid) if pid != killed.pid]
        assert children  # its loader worker at least
        # Stopped, the children outlive the kill for as long as the test looks: a lock one of
        # them held would show, whichever process the scheduler ran first.
        for pid in children:
            os.kill(pid, signal.SIGSTOP)
        killed.kill()
        assert killed.wait(timeout=60) == -signal.SIGKILL  # its pipes live on in the children
        FolderLock(tmp_path / "run", "run folder").release()  # what `--resume` takes first
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.communicate(timeout=60)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")
def test_a_train_loader_worker_ends_with_its_killed_parent():
    """A train worker ignores its first SIGTERM (the main process saves and stops it), and so
    ignored the one the kernel sends it when the main process dies: it lived on until torch's
    next look at its parent, up to 5 s. A worker is forked from a loader's process, which
    ends (as when killed) once the worker has started; the worker then sleeps, as between
    batches: it ends at once, closing its end of a pipe the test reads to its end."""
    from torchkit.core.train.loaders import _worker_init

    out_read, out_write = os.pipe()
    started_read, started_write = os.pipe()
    loader = os.fork()
    if loader == 0:  # the loader's process
        guard = OrphanedWorkerExit(_worker_init)
        if os.fork() == 0:  # its worker
            guard(0)
            os.write(out_write, f"{os.getpid()}".encode())
            os.write(started_write, b"s")
            time.sleep(60)  # torch's watchdog would look in 5 s
            os._exit(0)
        os.read(started_read, 1)
        os._exit(0)
    for fd in (out_write, started_read, started_write):
        os.close(fd)
    os.waitpid(loader, 0)
    written, ended = b"", False
    # Ended at once, or alive for its 60 s sleep: a loaded machine may take seconds to run it.
    deadline = time.monotonic() + 30
    try:
        while (
            not ended and select.select([out_read], [], [], max(0, deadline - time.monotonic()))[0]
        ):
            chunk = os.read(out_read, 64)
            ended = not chunk  # every writer is gone: the worker ended
            written += chunk
        assert ended, "the worker of a killed loader's process lived on"
    finally:
        os.close(out_read)
        if not ended and written:  # alive: its PID is not another process's
            os.kill(int(written), signal.SIGKILL)


def test_predict_runs_again_at_once_on_the_output_of_a_sigkilled_run(tmp_path):
    """`predict -j 2 -o FILE --force` SIGKILLed mid-run, its workers alive (stopped, so that
    they outlive the kill for as long as the test looks): run again at once on the same FILE,
    it finds no lock of theirs. The killed run held the old file's set-aside and the new
    file's temporary, which its workers were forked beside; the rerun writes FILE and leaves
    nothing else. Continued, the workers end: the kill reached them too."""
    write_image_folder(tmp_path / "ds", {"a": 3, "b": 3})
    (tmp_path / "gatemod.py").write_text(GATE_MODULE)
    out = tmp_path / "out"
    out.mkdir()
    (out / "preds.csv").write_text("earlier\n")
    gate = tmp_path / "gate"
    args = ["predict", "gatemod:Gated", "ds", "--allow-untrained", "--classes", "a,b"]
    args += ["--image-size", "8", "--batch-size", "2", "--format", "csv", "--device", "cpu"]
    args += ["-o", "out/preds.csv", "--force"]
    killed = start_torchkit_process(*args, "-j", "2", cwd=tmp_path, env={"GATE_FILE": str(gate)})
    children: list[int] = []
    try:
        wait_until(gate.exists, process=killed, what="the first batch")
        children = [pid for pid in processes_in_group(killed.pid) if pid != killed.pid]
        assert len(children) >= 2  # its two loader workers
        for pid in children:
            os.kill(pid, signal.SIGSTOP)
        killed.kill()
        assert killed.wait(timeout=60) == -signal.SIGKILL
        again = run_torchkit_in_process(*args, "-j", "0", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert os.listdir(out) == ["preds.csv"]  # no temporary, no set-aside left
        assert (out / "preds.csv").read_text().startswith("path,label,class,")
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        killed.communicate(timeout=60)
    wait_until(lambda: not processes_in_group(killed.pid), what="the workers to end")
