"""Disks that misbehave on demand, for the tests of full disks and interrupted writes: a full file
system (`fill_disk`, on the `small_tmpfs` fixture's mount), slow renames, copies and opens in a
torchkit process (`slow_io_env`), a process stopped at one of them until it is killed
(`paused_io_env`), a FIFO as an output (`FifoReader`) and as an input a command must never open
(`fifo_never_opened`), folders this user may not list (`deny_listing`)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import textwrap
import threading
from collections.abc import Sequence
from pathlib import Path


def fill_disk(mount: Path, *, leave: int = 0) -> Path:
    """Fill the file system at `mount` with a file `filler`: every byte, or all but `leave`."""
    if leave:
        free = os.statvfs(mount)
        (mount / "filler").write_bytes(bytes(free.f_bavail * free.f_frsize - leave))
        return mount
    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as error:
        assert error.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return mount


# A sitecustomize that slows the named calls (renames, copies, opens) whose path contains a given
# string down, like a slow disk: a signal then reliably lands in the middle of the work. Or, with
# TORCHKIT_TEST_PAUSED, stops the process for good at the Nth such call (TORCHKIT_TEST_PAUSE_AT)
# and every later one, once it has made that file: a test waits for the file, not for a time, and
# kills the process exactly there.
SLOW_IO = textwrap.dedent(
    """
    import builtins, io, os, shutil, threading, time

    _where, _, _delay = os.environ.get("TORCHKIT_TEST_SLOW_IO", "").rpartition("|")
    _after = os.environ.get("TORCHKIT_TEST_SLOW_AFTER") == "1"
    _paused = os.environ.get("TORCHKIT_TEST_PAUSED")
    _pause_at = int(os.environ.get("TORCHKIT_TEST_PAUSE_AT", "1"))
    _open = os.open
    _counted = threading.Lock()
    _calls = [0]

    def _hold():
        if not _paused:
            time.sleep(float(_delay))
            return
        with _counted:  # copies run in threads
            _calls[0] += 1
            if _calls[0] < _pause_at:
                return
        os.close(_open(_paused, os.O_WRONLY | os.O_CREAT, 0o644))
        threading.Event().wait()  # until the test kills the process

    def _slowed(function, path_at):
        def slow(*args, **kwargs):
            path = args[path_at] if len(args) > path_at else None
            slowed = isinstance(path, (str, bytes, os.PathLike)) and _where in os.fsdecode(path)
            if slowed and not _after:
                _hold()
            done = function(*args, **kwargs)
            if slowed and _after:
                _hold()
            return done
        return slow

    if _where:
        for _call in os.environ["TORCHKIT_TEST_SLOW_CALLS"].split(","):
            _module, _, _name = _call.partition(".")
            _owner = {"os": os, "shutil": shutil, "io": io, "builtins": builtins}[_module]
            # An open's path is its first argument; a rename's or a copy's, its destination.
            _path_at = 0 if _name == "open" else 1
            setattr(_owner, _name, _slowed(getattr(_owner, _name), _path_at))
    """
)


def slow_io_env(
    tmp_path: Path,
    where: str | os.PathLike,
    *,
    calls: Sequence[str] = ("os.rename", "os.replace", "shutil.copy2"),
    delay: float = 0.1,
    after: bool = False,
) -> dict[str, str]:
    """The environment of a torchkit process whose `calls` (`os.replace`, `io.open`...) into a
    path containing `where` take `delay` seconds each, before the call's work or (`after`) once
    it is done (its sitecustomize is written to TMP_PATH/slow-io)."""
    folder = tmp_path / "slow-io"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(SLOW_IO)
    return {
        "PYTHONPATH": str(folder),
        "TORCHKIT_TEST_SLOW_IO": f"{os.fspath(where)}|{delay}",
        "TORCHKIT_TEST_SLOW_CALLS": ",".join(calls),
        "TORCHKIT_TEST_SLOW_AFTER": "1" if after else "0",
    }


def paused_io_env(
    tmp_path: Path,
    where: str | os.PathLike,
    *,
    calls: Sequence[str] = ("os.rename", "os.replace", "shutil.copy2"),
    after: bool = False,
    at: int = 1,
) -> tuple[dict[str, str], Path]:
    """The environment of a torchkit process that stops for good at its `at`-th of `calls` into
    a path containing `where` (before the call's work, or once it is done: `after`), and the file
    it makes as it stops; a thread that makes such a call later stops there too. Once that file
    exists the process stays there until it is killed, however slow the machine: a test waits
    for the file (`wait_until`), never for a time."""
    paused = tmp_path / "slow-io" / "paused"
    env = slow_io_env(tmp_path, where, calls=calls, after=after)
    return {**env, "TORCHKIT_TEST_PAUSED": str(paused), "TORCHKIT_TEST_PAUSE_AT": str(at)}, paused


class FifoReader:
    """A FIFO at `path` read to the end by a thread, as `cat FIFO` would."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.data: bytes | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with open(self.path, "rb") as handle:
            self.data = handle.read()

    def result(self) -> bytes:
        """What was written into the FIFO; fails if it is no longer a FIFO."""
        # A command that never opened the FIFO leaves the reader waiting: let it go.
        with contextlib.suppress(OSError):
            os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
        self.thread.join(30)
        assert not self.thread.is_alive()
        assert stat.S_ISFIFO(os.lstat(self.path).st_mode)  # still a FIFO, not a regular file
        return self.data or b""


@contextlib.contextmanager
def fifo_never_opened(path: Path, seconds: float = 30):
    """A FIFO at `path` that a command in this process must not open for reading: such an open
    waits for a writer forever, so every `seconds` a writer comes and goes (a waiting reader
    reads an empty file and the command goes on) and the block fails. Without it the command
    would hang the test; a command that never opens the FIFO costs nothing here."""
    os.mkfifo(path)
    done, blocked = threading.Event(), []

    def unblock() -> None:
        while not done.wait(seconds):  # each open that waits, let go
            with contextlib.suppress(OSError):  # ENXIO: no reader waiting
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                blocked.append(path)

    watchdog = threading.Thread(target=unblock, daemon=True)
    watchdog.start()
    try:
        yield path
    finally:
        done.set()
        watchdog.join()
    assert not blocked, f"{path} was opened for reading (it blocked for {seconds} s)"


def deny_listing(monkeypatch, *folders: str | os.PathLike) -> None:
    """`os.scandir` of each of `folders` fails as it does for a folder without read permission
    (`chmod 000`), which the suite, run as root, cannot get from chmod. Called again, the folders
    given before stay denied."""
    denied = {os.fspath(folder) for folder in folders}
    scandir = os.scandir

    def listing(path="."):
        if os.fspath(path) in denied:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", listing)
