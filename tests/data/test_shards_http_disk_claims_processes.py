"""Downloads of URL shards in separate processes (torchrun's ranks, loader workers, two runs on
one cache) each checked the cache disk's room alone: claims were a process's own, so shards that
fit one at a time started together and one ended in "No space left on device". Each claim is now
also a file in CACHE/.download-claims, flocked by its process while it holds it: the others count
it, wait for it to end, and ignore (and delete) one whose process died.

No test sleeps: a process that waits for another's claim looks again every quarter second by
itself, and each test waits on what a process says or does (a pipe, a request)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
from output_checks import error_line
from processes import child_environment, killed, run_torchkit_in_process
from shards import QuietFolderHandler, running_server

WAIT_S = 30  # the most anything waits: a wait that ends so fails the test, never hangs it
CHUNK = 1 << 20  # what torchkit reads (and writes) of a body at a time


def _shard(path: Path, size: int) -> int:
    """A tar at `path` of at most `size` bytes (one member of `fill` bytes), and its size."""
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("k0.bin")
        info.size = size - 3 * tarfile.RECORDSIZE
        tar.addfile(info, io.BytesIO(os.urandom(info.size)))
    return path.stat().st_size


def _free(mount: Path) -> int:
    stats = os.statvfs(mount)
    return stats.f_bavail * stats.f_frsize


class _Paired(QuietFolderHandler):
    """Serves its folder; a `.tar`'s body in two parts: its first MiB, then the rest once two
    requests for shards got their first MiB (or hung up before), so that two downloads that
    both go ahead both hold part of their shard on the disk at once."""

    def __init__(self, *args, pair: threading.Condition, asked: list, **kwargs) -> None:
        self.pair, self.asked = pair, asked
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        if not self.path.endswith(".tar"):
            super().do_GET()
            return
        data = Path(self.translate_path(self.path)).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        sent = True
        try:
            self.wfile.write(data[:CHUNK])
            self.wfile.flush()
        except OSError:  # the client hung up: it waits for room, and asks again
            sent = False
        with self.pair:
            self.asked.append(self.path)
            self.pair.notify_all()
            self.pair.wait_for(lambda: len(self.asked) >= 2, WAIT_S)
        if sent:
            with contextlib.suppress(OSError):
                self.wfile.write(data[CHUNK:])
        self.close_connection = True


def _claim_files(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / ".download-claims").glob("*.claim"))


def _disk_of_100_000_bytes(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """(a shard folder of a cache in `tmp_path`, that cache's claims folder, not made), on a
    disk of 100,000 free bytes and no TORCHKIT_CACHE_LIMIT."""
    from torchkit.core.data.sources import http_shards

    monkeypatch.setattr(http_shards, "_free_bytes", lambda folder: 100_000)
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    folder = tmp_path / "cache" / "shards" / "f"
    folder.mkdir(parents=True)
    return folder, tmp_path / "cache" / ".download-claims"


def test_two_processes_whose_shards_fit_one_at_a_time_both_finish(
    tmp_path, small_tmpfs, monkeypatch
):
    """Two processes on one cache each download a new version of a cached shard: each fits
    beside the old copies, the two at once do not. They both went ahead (the other process's
    download was not counted), and one ended in "No space left on device". Now the second
    waits for the first's claim to end (its new copy renamed over the old one), asks again and
    finishes too (or, where the first ended before the second took the room, goes ahead at
    once); no claim file is left."""
    from torchkit.core.data.sources.http_shards import fetch_shards, shard_cache_folder

    cache = small_tmpfs(5 * 1024)
    served = tmp_path / "served"
    served.mkdir()
    size = _shard(served / "a-000000.tar", 3 * CHUNK // 2)
    _shard(served / "b-000000.tar", 3 * CHUNK // 2)
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("TORCHKIT_CACHE", str(cache))
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    pair, asked = threading.Condition(), []
    handler = functools.partial(_Paired, pair=pair, asked=asked, directory=str(served))
    with running_server(handler) as server:
        # The old copies, recorded as another version than the server's (Last-Modified).
        folder = shard_cache_folder(server.url)
        folder.mkdir(parents=True)
        for name in ("a-000000.tar", "b-000000.tar"):
            (folder / name).write_bytes(bytes(size))
            old = {"bytes": size, "sha256": None, "etag": None}
            old["last_modified"] = "Thu, 01 Jan 1970 00:00:00 GMT"
            (folder / f".{name}.json").write_text(json.dumps(old))
        free = _free(cache)
        assert size <= free - free // 20 and size + CHUNK > free  # one at a time only
        other = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys\n"
                "from torchkit.core.data.sources.http_shards import fetch_shards\n"
                "from torchkit.core.io.errors import TorchkitError\n"
                "try:\n"
                "    fetch_shards([sys.argv[1]])\n"
                "except TorchkitError as error:\n"
                "    sys.exit(f'Error: {error}')\n",
                f"{server.url}/a-000000.tar",
            ],
            env=child_environment({"TORCHKIT_CACHE": str(cache)}),
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            mine = fetch_shards([f"{server.url}/b-000000.tar"])
            _, said = other.communicate(timeout=WAIT_S)
        finally:
            if other.poll() is None:
                killed(other)
    assert other.returncode == 0, said
    assert mine == [str(folder / "b-000000.tar")]
    for name in ("a-000000.tar", "b-000000.tar"):
        assert (folder / name).read_bytes() == (served / name).read_bytes()
    assert _claim_files(cache) == []


def _held_in_a_child(folder: Path, size: tuple[int, str]) -> tuple[int, int]:
    """A forked process that takes a claim of `size` on the cache of `folder` and holds it
    until killed; (its pid, a pipe end that says it holds it). Forked: no interpreter start."""
    from torchkit.core.data.sources import http_shards

    said, says = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(said)
            with http_shards._CLAIMS.claim("http://h/a-000000.tar", folder, size) as claim:
                taken = claim.take(threading.Event()) is None
                claim.wrote(10_000)  # what it holds now: the rest
                os.write(says, b"held" if taken else b"none")
                threading.Event().wait()  # until killed
        finally:
            os._exit(1)
    os.close(says)
    return child, said


def test_a_live_claim_of_another_process_waits_and_a_dead_one_does_not(tmp_path, monkeypatch):
    """Another process claims 0.6 of the room and wrote 0.1 of it: a shard of 0.6 waits for
    it, and a body of no size is bounded by the 0.5 it still claims (the old code took the
    room as if that process were not there). That process is then killed (kill -9: no clean-up
    of its own): its claim no longer counts, the waiting shard takes the room, and the dead
    claim's file is deleted."""
    from torchkit.core.data.sources import http_shards
    from torchkit.core.io.errors import InputError

    monkeypatch.setattr(http_shards, "_free_bytes", lambda folder: 100_000)  # room: 95,000
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    folder = tmp_path / "cache" / "shards" / "f"
    folder.mkdir(parents=True)
    size, stop = (60_000, "its Content-Length is"), threading.Event()
    child, said = _held_in_a_child(folder, size)
    try:
        assert os.read(said, 4) == b"held"
        held_by_child = _claim_files(tmp_path / "cache")
        assert len(held_by_child) == 1
        with http_shards._CLAIMS.claim("http://h/u-000000.tar", folder, None) as unsized:
            assert unsized.take(stop) is None
            unsized.admit(45_000)  # 95,000 less the 50,000 the child has still to write
            with pytest.raises(InputError, match="more claimed by the other downloads"):
                unsized.admit(45_001)
        with http_shards._CLAIMS.claim("http://h/b-000000.tar", folder, size) as claim:
            waiting = claim.take(stop)
            assert waiting is not None and waiting.polled  # beside the child's claim
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            child = 0
            timer = threading.Timer(WAIT_S, http_shards._stop_downloads, (stop,))
            timer.start()  # a wait that never ends fails the test (_Stopped), never hangs it
            try:
                http_shards._CLAIMS.wait_for_room(claim.url, folder, size, waiting, stop)
            finally:
                timer.cancel()
            assert claim.take(stop) is None
            assert _claim_files(tmp_path / "cache") == [claim.file.name]
        assert _claim_files(tmp_path / "cache") == []
    finally:
        os.close(said)
        if child:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)


def test_a_claim_file_of_no_process_is_deleted_whatever_it_holds(tmp_path, monkeypatch):
    """A claim file whose flock no process holds (its process died as it wrote it, or a
    damaged disk left it so) is deleted, not read: the claims are rebuilt from the live ones."""
    from torchkit.core.data.sources import http_shards

    folder, claims = _disk_of_100_000_bytes(tmp_path, monkeypatch)
    claims.mkdir()
    (claims / "1-dead.claim").write_bytes(b'{"size": 90000, "wri')
    (claims / "2-dead.claim").write_bytes(b"\xff\x00 not json")
    with http_shards._CLAIMS.claim(
        "http://h/a-000000.tar", folder, (60_000, "its Content-Length is")
    ) as claim:
        assert claim.take(threading.Event()) is None
        assert _claim_files(tmp_path / "cache") == [claim.file.name]


def test_a_live_claim_file_torchkit_cannot_read_is_one_error_line(tmp_path, monkeypatch):
    """A claim file a live process holds but that holds no claim torchkit wrote: the room it
    holds is unknown, so the download is refused with one line naming the file (not ignored:
    the disk could fill)."""
    import fcntl

    served = tmp_path / "served"
    served.mkdir()
    _shard(served / "a-000000.tar", 40 * 1024)
    cache = tmp_path / "cache"
    claims = cache / ".download-claims"
    claims.mkdir(parents=True)
    foreign = claims / "7-other.claim"
    foreign.write_text("size: 10 GB\n")
    monkeypatch.setenv("TORCHKIT_CACHE", str(cache))
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    fd = os.open(foreign, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as the live process that holds it
        handler = functools.partial(QuietFolderHandler, directory=str(served))
        with running_server(handler) as server:
            result = run_torchkit_in_process(
                "dataset-stats", f"{server.url}/a-000000.tar", "--workers", "0"
            )
    finally:
        os.close(fd)
    assert result.returncode == 1, result.stdout
    assert error_line(result.stderr) == (
        f"Error: cannot read {foreign}, the claim of room on the cache's disk of a torchkit "
        "process downloading into it: it holds no claim torchkit wrote (wait for the other "
        "torchkit runs on this cache to end, or set TORCHKIT_CACHE to another folder)"
    )
    assert not list(cache.rglob("a-000000.tar"))


def test_a_claims_folder_that_is_not_a_folder_is_one_error_line(tmp_path, monkeypatch):
    from torchkit.core.data.sources import http_shards
    from torchkit.core.io.errors import InputError

    folder = tmp_path / "cache" / "shards" / "f"
    folder.mkdir(parents=True)
    (tmp_path / "cache" / ".download-claims").write_text("not a folder")
    with (
        http_shards._CLAIMS.claim("http://h/a-000000.tar", folder, (10, "")) as claim,
        pytest.raises(InputError) as raised,
    ):
        claim.take(threading.Event())
    assert raised.value.message.startswith(
        f"cannot use {tmp_path / 'cache' / '.download-claims'}, where downloads into the "
        "cache claim room on its disk: "
    )
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("after", ["claim", "take"])
def test_a_stop_right_after_a_claim_is_taken_ends_it(tmp_path, monkeypatch, after):
    """Streamed shards download on the main thread, where Ctrl-C lands: one that came just
    after the claim was taken, before the block that ends it was entered, kept the claim (its
    room, and now its file) for the process's life. The claim is now owned before it is
    taken: no claim, no claim file is left."""
    from torchkit.core.data.sources import http_shards

    served = tmp_path / "served"
    served.mkdir()
    _shard(served / "a-000000.tar", 40 * 1024)
    cache = tmp_path / "cache"
    target = cache / "shards" / "f" / "a-000000.tar"
    target.parent.mkdir(parents=True)
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    owner = http_shards._CLAIMS if after == "claim" else http_shards._Claims
    taken = getattr(owner, after)

    def interrupted(*args, **kwargs):
        taken(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(owner, after, interrupted)
    handler = functools.partial(QuietFolderHandler, directory=str(served))
    with running_server(handler) as server, pytest.raises(KeyboardInterrupt):
        http_shards._download(f"{server.url}/a-000000.tar", target, None, threading.Event())
    assert http_shards._CLAIMS._held == []
    assert _claim_files(cache) == []
    assert not target.exists()


def test_a_claim_file_holds_no_secret_of_its_url(tmp_path):
    """A claim file says whose it is (pid, host, URL) to whoever reads the cache: its URL
    without the password and the query (a presigned URL's signature), as every message."""
    from torchkit.core.data.sources import http_shards

    folder = tmp_path / "cache" / "shards" / "f"
    folder.mkdir(parents=True)
    url = "https://me:pass%2Fword@h/a-000000.tar?X-Amz-Signature=sekrit"
    with http_shards._CLAIMS.claim(url, folder, (10, "")) as claim:
        assert claim.take(threading.Event()) is None
        record = json.loads(claim.file.read_bytes())
    assert record["url"] == "https://me:***@h/a-000000.tar"
    assert record["pid"] == os.getpid() and record["size"] == 10 and record["written"] == 0


STOP_S = 5  # the most a stop may take here (it ends at once; the old code hung for ever)


def _holding_the_claims_lock(cache: Path, monkeypatch) -> tuple[int, threading.Event]:
    """The claims' lock file flocked as another process stopped with Ctrl-Z holds it (a
    descriptor of this test's: a flock is an open file's), and an event set once torchkit
    asks for that lock."""
    import fcntl

    path = cache / ".download-claims" / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    asked, flock = threading.Event(), fcntl.flock

    def observed(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_EX and os.path.samestat(os.fstat(fd), os.stat(path)):
            asked.set()
        flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", observed)
    return holder, asked


@pytest.mark.parametrize("waits_in", ["take", "wait_for_room"])
def test_a_stop_ends_a_wait_for_the_claims_lock_another_process_holds(
    tmp_path, monkeypatch, waits_in
):
    """Another process holds the claims' lock (stopped with Ctrl-Z as it read the claims or
    wrote its progress). A download taking a claim, or looking again for room, blocked on the
    lock's flock, holding this process's claims: the stop (Ctrl-C, another download's
    failure) waited on it for ever, and the run with it, in silence. The wait now says who
    holds the lock (after LOCK_WAIT_WARNING_S, 0 here), and a stop ends it at once: no claim,
    no claim file."""
    import logging

    from torchkit.core.data.sources import http_shards

    monkeypatch.setattr(http_shards, "_free_bytes", lambda folder: 100_000)
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    cache = tmp_path / "cache"
    folder = cache / "shards" / "f"
    folder.mkdir(parents=True)
    claims, stop, size = http_shards._CLAIMS, threading.Event(), (10_000, "its Content-Length is")
    holder, asked = _holding_the_claims_lock(cache, monkeypatch)
    monkeypatch.setattr(http_shards, "LOCK_WAIT_WARNING_S", 0)
    warnings: list[str] = []
    said = threading.Event()

    class Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())
            said.set()

    heard, logger = Heard(logging.WARNING), logging.getLogger("torchkit")
    level = logger.level  # a torchrun rank's run before (in this process) set ERROR
    logger.setLevel(logging.WARNING)
    logger.addHandler(heard)
    outcome: list[object] = []

    def download() -> None:
        try:
            with claims.claim("http://h/a-000000.tar", folder, size) as claim:
                if waits_in == "take":
                    outcome.append(claim.take(stop))
                else:  # looked at again after its first poll
                    waiting = http_shards._Wait(claims._ended, polled=True)
                    outcome.append(claims.wait_for_room(claim.url, folder, size, waiting, stop))
        except http_shards._Stopped:
            outcome.append("stopped")

    waiter = threading.Thread(target=download, daemon=True)
    stopper = threading.Thread(target=http_shards._stop_downloads, args=(stop,), daemon=True)
    try:
        waiter.start()
        assert asked.wait(WAIT_S)
        said.wait(STOP_S)
        stopper.start()
        stopper.join(STOP_S)
        waiter.join(STOP_S)
        hung = stopper.is_alive() or waiter.is_alive()
    finally:
        os.close(holder)  # lets the old code's hung threads go
        waiter.join(WAIT_S)
        logger.removeHandler(heard)
        logger.setLevel(level)
    assert not hung and outcome == ["stopped"], outcome
    lock = cache / ".download-claims" / "lock"
    assert warnings == [
        f"waiting for another torchkit process that holds {lock}, the lock of the claims of "
        "room on the cache's disk (one stopped with Ctrl-Z holds it until resumed with fg, or "
        "ended)"
    ]
    assert claims._held == [] and _claim_files(cache) == []


def test_a_claim_writes_its_progress_without_waiting_for_the_claims_lock(tmp_path, monkeypatch):
    """A download rewrote its claim file after each MiB under the claims' lock, waiting for it:
    another process stopped with the lock held stopped this download too, for ever (a Ctrl-C
    could not end that wait). The progress is now left for the next chunk's rewrite while the
    lock is held elsewhere, and written once it is free."""
    from torchkit.core.data.sources import http_shards

    monkeypatch.setattr(http_shards, "_free_bytes", lambda folder: 100_000)
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    cache = tmp_path / "cache"
    folder = cache / "shards" / "f"
    folder.mkdir(parents=True)
    with http_shards._CLAIMS.claim("http://h/a-000000.tar", folder, (10_000, "")) as claim:
        assert claim.take(threading.Event()) is None
        holder, _ = _holding_the_claims_lock(cache, monkeypatch)
        writer = threading.Thread(target=claim.wrote, args=(100,), daemon=True)
        try:
            writer.start()
            writer.join(STOP_S)
            hung = writer.is_alive()
        finally:
            os.close(holder)
            writer.join(WAIT_S)
        assert not hung
        claim.wrote(1)  # the lock free: both chunks' progress written
        assert json.loads(claim.file.read_bytes())["written"] == 101
    assert _claim_files(cache) == []


def test_a_cache_on_a_file_system_without_flock_downloads_as_without_locks(tmp_path, monkeypatch):
    """A cache on a file system whose flock fails (Lustre mounted without its flock option:
    ENOSYS; NFS with no lock daemon: ENOLCK): every download ended in "Error: OSError: [Errno
    38] Function not implemented" (the shard's lock file), then in an error naming the claims'
    lock. It downloads as where the platform has no flock (the rename into place keeps the
    cache whole; claims are the process's own): the shard is cached whole, no claim file."""
    import errno
    import fcntl

    from torchkit.core.data.sources.http_shards import fetch_shards

    served = tmp_path / "served"
    served.mkdir()
    _shard(served / "a-000000.tar", 40 * 1024)
    cache = tmp_path / "cache"
    monkeypatch.setenv("TORCHKIT_CACHE", str(cache))
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)

    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    handler = functools.partial(QuietFolderHandler, directory=str(served))
    with running_server(handler) as server:
        cached = fetch_shards([f"{server.url}/a-000000.tar"])
    assert Path(cached[0]).read_bytes() == (served / "a-000000.tar").read_bytes()
    assert _claim_files(cache) == []


def test_a_claims_lock_file_deleted_while_waited_for_is_not_held_beside_its_successor(
    tmp_path, monkeypatch
):
    """The claims' lock file deleted while this process waited for it (a cleaner, `rm -rf` of
    the cache), and another process made and locked a new one: this process took the old
    file's flock once free and read and made claims beside the other, both holding "the"
    lock (together they could claim more room than the disk has). It now locks the file
    that is there, after the other process."""
    import fcntl

    from torchkit.core.data.sources import http_shards

    folder = tmp_path / "cache" / "shards" / "f"
    folder.mkdir(parents=True)
    path = tmp_path / "cache" / ".download-claims" / "lock"
    polled, successor, released = http_shards._flock_polled, [], []

    def replaced_while_waiting(fd: int, *args: object) -> bool:
        if not successor:  # the file deleted; another process makes a new one and locks it
            path.unlink()
            successor.append(os.open(path, os.O_RDWR | os.O_CREAT))
            fcntl.flock(successor[0], fcntl.LOCK_EX)
        elif not released:  # that process is done with it
            os.close(successor[0])
            released.append(True)
        return polled(fd, *args)

    monkeypatch.setattr(http_shards, "_flock_polled", replaced_while_waiting)
    try:
        with http_shards._claims_lock("http://h/a-000000.tar", folder, threading.Event()) as shared:
            assert shared and released, "held while another process held the file there"
            probe = os.open(path, os.O_RDWR)
            try:
                with pytest.raises(BlockingIOError):  # the file there is this process's lock
                    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(probe)
    finally:
        if successor and not released:
            os.close(successor[0])


def test_a_claims_lock_file_deleted_while_held_is_not_trusted(tmp_path, monkeypatch):
    """The claims' lock file deleted while this process HELD it, as it read the claims (a
    cleaner, `rm -rf` of the cache): another process made and locked a new one, found no claim
    and claimed 0.6 of the room; this one, having read none either, claimed 0.6 too, the two
    together more than the disk has. It now sees that the file it holds is no longer the lock,
    undoes its claim, and takes it again under the other's lock: it waits for that claim."""
    from torchkit.core.data.sources import http_shards

    monkeypatch.setattr(http_shards, "_free_bytes", lambda folder: 100_000)  # room: 95,000
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    cache = tmp_path / "cache"
    folder = cache / "shards" / "f"
    folder.mkdir(parents=True)
    size, read, newcomer = (60_000, "its Content-Length is"), http_shards._claims_of_others, []

    def lock_replaced_as_read(claim, mine):
        found = read(claim, mine)
        if not newcomer:  # once (not in the child, which forks with this list filled)
            newcomer.append(None)
            (cache / ".download-claims" / "lock").unlink()
            newcomer[0] = _held_in_a_child(folder, size)  # makes and locks a new lock file
            assert os.read(newcomer[0][1], 4) == b"held"
        return found

    monkeypatch.setattr(http_shards, "_claims_of_others", lock_replaced_as_read)
    try:
        with http_shards._CLAIMS.claim("http://h/b-000000.tar", folder, size) as claim:
            waiting = claim.take(threading.Event())
            assert waiting is not None and waiting.polled, "both claimed 0.6 of the room"
            assert len(_claim_files(cache)) == 1  # the other process's alone
        assert http_shards._CLAIMS._held == []
    finally:
        if newcomer and newcomer[0] is not None:
            child, said = newcomer[0]
            os.close(said)
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)


def test_an_empty_claim_file_being_made_beside_a_lock_deleted_while_held_is_skipped(
    tmp_path, monkeypatch
):
    """A process whose claims' lock file was deleted while it held it makes its claim file
    (made, flocked, then written) at the same moment as a newcomer under the new lock reads
    the claims: the newcomer found it empty and ended in "it holds no claim torchkit wrote",
    the whole run failed (four processes taking claims while the lock file was deleted every
    0.5 ms: three of them failed so within 4 s). An empty one is skipped now: its maker finds
    its lock gone as it lets go of it, and takes its claim again beside this one."""
    import fcntl

    from torchkit.core.data.sources import http_shards

    folder, claims = _disk_of_100_000_bytes(tmp_path, monkeypatch)
    claims.mkdir()
    being_made = claims / "7-made.claim"
    fd = os.open(being_made, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as its maker holds it, before writing it
        size = (60_000, "its Content-Length is")
        with http_shards._CLAIMS.claim("http://h/a-000000.tar", folder, size) as claim:
            assert claim.take(threading.Event()) is None
            assert _claim_files(tmp_path / "cache") == sorted([claim.file.name, being_made.name])
    finally:
        os.close(fd)


@pytest.mark.parametrize("reader", ["looks at it", "deletes it"])
def test_a_claim_file_a_reader_under_another_lock_takes_for_dead_is_made_again(
    tmp_path, monkeypatch, reader
):
    """A process under a claims' lock file deleted while held (or a newcomer under the new one,
    beside such a process) reads the claims just as this one makes its file, before its flock:
    it takes the file's flock to see whether its process lives (this one's flock then failed:
    "cannot use CACHE/.download-claims ...: Resource temporarily unavailable", the run ended),
    and, finding it free, deletes it (this one's claim then counted by no process: its room
    taken twice). The claim is made again now, and shows."""
    import fcntl

    from torchkit.core.data.sources import http_shards

    monkeypatch.setattr(http_shards, "_free_bytes", lambda folder: 100_000)
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    folder = tmp_path / "cache" / "shards" / "f"
    folder.mkdir(parents=True)
    opened, made = http_shards.open_unshared, []

    def read_as_made(path, flags, *mode):
        fd = opened(path, flags, *mode)
        if str(path).endswith(".claim") and flags & os.O_CREAT and not made:
            made.append(path)
            other = os.open(path, os.O_RDONLY)  # as the reader in another process
            fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # free: taken for a dead claim
            if reader == "deletes it":
                os.unlink(path)
                os.close(other)
            else:  # held as this one takes its flock
                made.append(other)
        return fd

    monkeypatch.setattr(http_shards, "open_unshared", read_as_made)
    size = (60_000, "its Content-Length is")
    try:
        with http_shards._CLAIMS.claim("http://h/a-000000.tar", folder, size) as claim:
            assert claim.take(threading.Event()) is None
            assert claim.file != made[0]
            assert _claim_files(tmp_path / "cache") == [claim.file.name]
    finally:
        if len(made) == 2:
            os.close(made[1])
    assert _claim_files(tmp_path / "cache") == []


@pytest.mark.parametrize("deleted", ["as its lock file is opened", "as claims are read", "as made"])
def test_a_claims_folder_deleted_as_a_claim_is_taken_is_made_again(tmp_path, monkeypatch, deleted):
    """The claims folder deleted (`rm -rf` of the cache) just as a download takes its claim:
    between making the folder and opening its lock file, or while holding the lock, as it
    listed the claims or made its own file. That was "cannot use CACHE/.download-claims...:
    No such file or directory (it must be a folder torchkit may write: remove what is there,
    ...)", nothing wrong with the folder. The claim is taken in the folder made again now (a
    download whose shard folder went with it then says the cache was deleted)."""
    import shutil

    from torchkit.core.data.sources import http_shards

    folder, claims = _disk_of_100_000_bytes(tmp_path, monkeypatch)
    opened, read, deletions = http_shards.open_unshared, http_shards._claims_of_others, []

    def delete_once(when: str) -> None:
        if when == deleted and not deletions:
            deletions.append(when)
            shutil.rmtree(claims)

    def opening(path, flags, *mode):
        delete_once("as its lock file is opened" if path.name == "lock" else "as made")
        return opened(path, flags, *mode)

    def reading(claim, mine):
        delete_once("as claims are read")
        return read(claim, mine)

    monkeypatch.setattr(http_shards, "open_unshared", opening)
    monkeypatch.setattr(http_shards, "_claims_of_others", reading)
    size = (60_000, "its Content-Length is")
    with http_shards._CLAIMS.claim("http://h/a-000000.tar", folder, size) as claim:
        assert claim.take(threading.Event()) is None
        assert deletions == [deleted]
        assert _claim_files(tmp_path / "cache") == [claim.file.name]
    assert _claim_files(tmp_path / "cache") == []


def test_a_claims_lock_file_that_links_to_nowhere_is_one_error(tmp_path):
    """The claims' lock file a link to a folder that is not there: an error naming it, not
    taken for a claims folder deleted as it was made (which is made again, and would be for
    ever)."""
    from torchkit.core.data.sources import http_shards
    from torchkit.core.io.errors import InputError

    folder = tmp_path / "cache" / "shards" / "f"
    folder.mkdir(parents=True)
    claims = tmp_path / "cache" / ".download-claims"
    claims.mkdir()
    (claims / "lock").symlink_to(tmp_path / "nowhere" / "lock")
    size = (60_000, "its Content-Length is")
    claim = http_shards._CLAIMS.claim("http://h/a-000000.tar", folder, size)
    with claim, pytest.raises(InputError, match=r"cannot use .*lock, .*No such file"):
        claim.take(threading.Event())


def test_a_claims_folder_made_and_deleted_as_it_is_made_is_made_again(tmp_path, monkeypatch):
    """Another process made the claims folder just before this one, and it was deleted again
    (`rm -rf` of the cache) before pathlib looked whether a folder stood there: "cannot use
    CACHE/.download-claims ...: File exists (it must be a folder torchkit may write: remove
    what is there, ...)", nothing there (four processes taking claims while the folder was
    deleted every 0.5 ms: most of them ended so). It is made again now; a file there is still
    that error (test_a_claims_folder_that_is_not_a_folder_is_one_error_line)."""
    from torchkit.core.data.sources import http_shards

    folder, claims = _disk_of_100_000_bytes(tmp_path, monkeypatch)
    make, raced = os.mkdir, []

    def made_and_deleted(path, *args, **kwargs):
        if os.fspath(path) == str(claims) and not raced:
            raced.append(path)
            make(path)  # by another process, first
            os.rmdir(path)  # and deleted before this one's look
            raise FileExistsError(17, "File exists", os.fspath(path))
        return make(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", made_and_deleted)
    size = (60_000, "its Content-Length is")
    with http_shards._CLAIMS.claim("http://h/a-000000.tar", folder, size) as claim:
        assert claim.take(threading.Event()) is None
        assert raced
        assert _claim_files(tmp_path / "cache") == [claim.file.name]


def test_a_claims_folder_deleted_while_another_process_downloads_is_made_again(
    tmp_path, monkeypatch
):
    """Another process downloads a shard of 0.6 of the room when the claims folder is deleted
    (`rm -rf CACHE/.download-claims`, a user cleaning up): its claim went with it, and a
    newcomer's shard of 0.6 took the room that was promised (both together more than the disk
    has). The download makes its claim file again as it writes its next chunk: the newcomer
    waits for it."""
    import shutil

    from torchkit.core.data.sources import http_shards

    folder, claims = _disk_of_100_000_bytes(tmp_path, monkeypatch)
    size = (60_000, "its Content-Length is")
    asked, ask = os.pipe()
    said, says = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(said)
            os.close(ask)
            with http_shards._CLAIMS.claim("http://h/a-000000.tar", folder, size) as claim:
                taken = claim.take(threading.Event()) is None
                os.write(says, b"held" if taken else b"none")
                while os.read(asked, 1) == b"w":  # a chunk written, then told so
                    claim.wrote(1_000)
                    os.write(says, b"wrote")
        finally:
            os._exit(1)
    os.close(says)
    os.close(asked)
    try:
        assert os.read(said, 4) == b"held"
        (before,) = _claim_files(tmp_path / "cache")
        shutil.rmtree(claims)
        os.write(ask, b"w")
        assert os.read(said, 5) == b"wrote"
        (after,) = _claim_files(tmp_path / "cache")
        assert after != before and after.startswith(f"{child}-")
        assert json.loads((claims / after).read_bytes())["written"] == 1_000
        with http_shards._CLAIMS.claim("http://h/b-000000.tar", folder, size) as claim:
            waiting = claim.take(threading.Event())
            assert waiting is not None and waiting.polled, "the promised room taken twice"
    finally:
        os.close(ask)
        os.close(said)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_a_claim_written_after_its_cache_was_deleted_makes_no_cache_again(tmp_path, monkeypatch):
    """A claim file is made again where the claims folder went, but not where the cache went
    whole (`rm -rf CACHE`): the download ends with "the cache was deleted", and no cache folder
    is left made anew."""
    import shutil

    from torchkit.core.data.sources import http_shards

    folder, _ = _disk_of_100_000_bytes(tmp_path, monkeypatch)
    with http_shards._CLAIMS.claim("http://h/a-000000.tar", folder, (60_000, "")) as claim:
        assert claim.take(threading.Event()) is None
        shutil.rmtree(tmp_path / "cache")
        claim.wrote(1_000)
    assert not (tmp_path / "cache").exists()
    assert http_shards._CLAIMS._held == []
