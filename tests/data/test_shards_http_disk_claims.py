"""Shards downloaded at once (four at a time) each checked their size against the same free room
of the cache's disk: three shards of 0.4 of it each all passed and together filled it (the run
failed midway with a full disk, every other program on it too). Each download in flight now
claims its size: one that does not fit beside the others' claims waits for them to end, and is
refused (one line, nothing of it written) only when it does not fit then either; a body of no
known size is bounded by the room the others leave it.

The server holds each body until the downloads have measured the disk (`_Measured`), so that they
overlap whatever the machine's speed."""

from __future__ import annotations

import functools
import io
import os
import re
import signal
import subprocess
import tarfile
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from output_checks import error_line
from processes import killed, run_torchkit_in_process, start_torchkit_process, wait_until
from safety_world import ended_as_stopped
from shards import QuietFolderHandler, running_server

from torchkit.core.io.errors import TorchkitError

WAIT_S = 30  # the most a held body waits: a wait that ends so fails the test, never hangs it


def _shard(path: Path, size: int) -> int:
    """A tar at `path` of at most `size` bytes (one member of zeros), and its size."""
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("k0.bin")
        info.size = size - 3 * tarfile.RECORDSIZE
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    return path.stat().st_size


def _room(mount: Path) -> tuple[int, int]:
    """(the bytes free on the disk at `mount`, the most a download may take: all but a
    twentieth, the margin torchkit keeps free below 1 GiB)."""
    stats = os.statvfs(mount)
    free = stats.f_bavail * stats.f_frsize
    return free, free - free // 20


class _Measured:
    """Counts the measurements of the free room of the disk at `mount` (os.statvfs of a folder
    under it), `reached(n)` until n were made."""

    def __init__(self, mount: Path, monkeypatch) -> None:
        self.mount = str(mount)
        self.count = 0
        self.changed = threading.Condition()
        measure = os.statvfs

        def counted(path):
            stats = measure(path)
            if os.fspath(path).startswith(self.mount):
                with self.changed:
                    self.count += 1
                    self.changed.notify_all()
            return stats

        monkeypatch.setattr(os, "statvfs", counted)

    def reached(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.count >= count, WAIT_S)


class _HeldBodies(QuietFolderHandler):
    """Serves its folder; a `.tar` with its Content-Length, its headers once
    `release(path, "headers")` returns, its body once `release(path, "body")` does (a hang-up
    on the way is the client's choice); `/cut/NAME.tar` likewise, but half its body, then the
    connection closes; `/endless/NAME.tar`: zeros with no Content-Length until the client hangs
    up (`endless_done` set then); a `.tar` it lacks, a 404 once its headers are released."""

    def __init__(self, *args, release, endless_done: threading.Event, **kwargs) -> None:
        self.release, self.endless_done = release, endless_done
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        if not self.path.endswith(".tar"):
            super().do_GET()
            return
        endless = self.path.startswith("/endless/")
        cut = self.path.startswith("/cut/")
        served = Path(self.translate_path(self.path.removeprefix("/cut")))
        if not endless and not served.is_file():  # a shard the server lacks: its 404
            self.release(self.path, "headers")
            self.send_error(404)
            return
        data = b"" if endless else served.read_bytes()
        self.release(self.path, "headers")
        self.send_response(200)
        if not endless:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.flush()
            self.release(self.path, "body")
            if not endless:
                self.wfile.write(data[: len(data) // 2] if cut else data)
                return
            for _ in range(1024):  # 64 MiB at most
                self.wfile.write(bytes(1 << 16))
        except OSError:  # the client hung up
            pass
        finally:
            self.close_connection = True
            if endless:
                self.endless_done.set()


def _serving(folder: Path, cache: Path, monkeypatch, release):
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("TORCHKIT_CACHE", str(cache))
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    endless_done = threading.Event()
    handler = functools.partial(
        _HeldBodies, release=release, endless_done=endless_done, directory=str(folder)
    )
    return running_server(handler), endless_done


def _left_in(cache: Path) -> set[str]:
    """The files in `cache` but the locks: the shards' and the claims' (which stay)."""
    return {
        p.name
        for p in cache.rglob("*")
        if p.is_file() and not p.name.endswith(".tar.lock") and p.name != "lock"
    }


def _cached(cache: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in cache.rglob("*.tar") if not p.name.startswith(".")}


def _small_disk(tmp_path: Path, small_tmpfs) -> tuple[Path, int, int, Path]:
    """A 1 MiB cache disk, its free bytes, the room a download may take of it (`_room`), and
    an empty folder to serve shards from."""
    cache = small_tmpfs(1024)
    free, room = _room(cache)
    served = tmp_path / "served"
    served.mkdir()
    return cache, free, room, served


def _fetched_at_once(urls: list[str]) -> dict[str, object]:
    """Each URL fetched alone in its own thread, all at once: URL -> its shard paths, or the
    exception its fetch raised (the outcome the tests check); every fetch has ended."""
    from torchkit.core.data.sources.http_shards import fetch_shards

    outcomes: dict[str, object] = {}

    def fetch(url: str) -> None:
        try:
            outcomes[url] = fetch_shards([url])
        except Exception as error:
            outcomes[url] = error

    threads = [threading.Thread(target=fetch, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes


def test_three_shards_of_four_tenths_of_the_room_never_fill_the_disk(
    tmp_path, small_tmpfs, monkeypatch
):
    """All three measured the same room before any body came: the old code let each in and
    the third ran into a full disk ("No space left on device"). Now two claim the room, the
    third waits for them and is then refused before a byte of it is written, naming its URL,
    its size and the room; the two that fit are cached whole."""
    cache, free, room, served = _small_disk(tmp_path, small_tmpfs)
    sizes = {f"s-{n:06d}.tar": _shard(served / f"s-{n:06d}.tar", room * 2 // 5) for n in range(3)}
    size = sizes["s-000000.tar"]
    assert 2 * size <= room and 3 * size > free  # two fit; the three together fill the disk
    measured = _Measured(cache, monkeypatch)
    serving, _ = _serving(
        served, cache, monkeypatch, lambda path, part: part == "headers" or measured.reached(3)
    )
    with serving as server:
        result = run_torchkit_in_process(
            "dataset-stats", f"{server.url}/s-{{000000..000002}}.tar", "--workers", "0"
        )
    assert result.returncode == 1, result.stdout
    line = error_line(result.stderr)
    refused = re.fullmatch(
        rf"Error: cannot download {re.escape(server.url)}/(s-00000\d\.tar): its Content-Length "
        rf"is {size} bytes, more than the cache's disk has room for \((\d+) bytes, keeping "
        r"(\d+) bytes free\) \(free some space, or set TORCHKIT_CACHE to a folder with more "
        r"room; nothing of it was downloaded\)",
        line,
    )
    assert refused is not None, line
    assert int(refused[2]) < size  # the room the two others left
    cached = _cached(cache)
    assert sorted(cached) == sorted(set(sizes) - {refused[1]})
    assert all(data == (served / name).read_bytes() for name, data in cached.items())


def test_a_body_of_no_size_is_bounded_by_the_room_the_others_claim(
    tmp_path, small_tmpfs, monkeypatch
):
    """A shard of half the room claims it (its body held back); a body of no size on the
    same disk (another folder URL) was read up to the whole room, and the two together filled
    the disk. It is stopped as it passes what the claim leaves, the error naming that bound
    and the claim; nothing of it is kept."""
    cache, free, room, served = _small_disk(tmp_path, small_tmpfs)
    (served / "endless").mkdir()
    size = _shard(served / "s-000000.tar", room // 2)
    measured = _Measured(cache, monkeypatch)
    done: list[threading.Event] = []

    def release(path: str, part: str) -> None:
        if part == "headers":
            return
        if path.startswith("/endless/"):
            measured.reached(1)  # the sized shard measured the room (and claimed it)
        else:
            done[0].wait(WAIT_S)  # until the body of no size is given up

    serving, endless_done = _serving(served, cache, monkeypatch, release)
    done.append(endless_done)
    with serving as server:
        endless = f"{server.url}/endless/u-000000.tar"
        result = run_torchkit_in_process(
            "dataset-stats", f"{server.url}/s-000000.tar::{endless}", "--workers", "0"
        )
    assert result.returncode == 1, result.stdout
    line = error_line(result.stderr)
    bound = re.fullmatch(
        rf"Error: cannot download {re.escape(endless)}: it sends more than (\d+) bytes with "
        r"no Content-Length, more than the cache's disk has room for \(keeping (\d+) bytes "
        rf"free, {size} more claimed by the other downloads in flight\) \(check the URL, free "
        r"some space, or set TORCHKIT_CACHE to a folder with more room; nothing of it was "
        r"kept\)",
        line,
    )
    assert bound is not None, line
    assert int(bound[1]) > 0 and int(bound[1]) + size + int(bound[2]) <= free
    # The sized shard is stopped, or done first (its body comes as that one's ends): never
    # anything but whole.
    assert _cached(cache) in ({}, {"s-000000.tar": (served / "s-000000.tar").read_bytes()})


def test_a_shard_waits_for_the_room_another_download_frees(tmp_path, small_tmpfs, monkeypatch):
    """Two downloads at once (two runs in one process) of 0.6 of the room each: the second
    does not fit beside the first's claim and waits; the first fails (its connection ends
    early) and its claim ends with it; the second is then asked for again and downloaded."""

    cache, _, room, served = _small_disk(tmp_path, small_tmpfs)
    size = _shard(served / "a-000000.tar", room * 3 // 5)
    _shard(served / "b-000000.tar", room * 3 // 5)
    assert size <= room < 2 * size
    measured = _Measured(cache, monkeypatch)
    asked: list[str] = []

    def release(path: str, part: str) -> None:
        # b's headers once a's download claimed its room; a's body once b measured it too.
        if path.startswith("/b-") and part == "headers":
            asked.append(path)
            measured.reached(1)
        elif path.startswith("/cut/") and part == "body":
            measured.reached(2)

    serving, _ = _serving(served, cache, monkeypatch, release)
    with serving as server:
        cut, whole = f"{server.url}/cut/a-000000.tar", f"{server.url}/b-000000.tar"
        outcomes = _fetched_at_once([cut, whole])
    assert str(outcomes[cut]).startswith(f"cannot download {cut}: the connection ended early")
    downloaded = Path(outcomes[whole][0])
    assert downloaded.read_bytes() == (served / "b-000000.tar").read_bytes()
    assert asked.count("/b-000000.tar") == 2  # asked again once the room was free
    assert _cached(cache) == {"b-000000.tar": downloaded.read_bytes()}


def test_a_failure_stops_a_download_waiting_for_room_at_once(tmp_path, small_tmpfs, monkeypatch):
    """a (0.6 of the room) claims it, its body held back; b (0.6) waits for a's claim to end;
    then c, which the server lacks, fails with no claim of its own. b stops at once, woken by
    the stop (no claim ended: a 1 s poll saw it before), before a's body comes; the run's
    error is c's, b was asked for once, nothing is kept."""
    from torchkit.core.data.sources import http_shards

    cache, _, room, served = _small_disk(tmp_path, small_tmpfs)
    _shard(served / "a-000000.tar", room * 3 // 5)
    _shard(served / "b-000000.tar", room * 3 // 5)
    measured = _Measured(cache, monkeypatch)
    waiting, waited = threading.Event(), threading.Event()
    wait_for_room = http_shards._CLAIMS.wait_for_room

    def observed_wait_for_room(*args) -> None:
        waiting.set()
        try:
            wait_for_room(*args)
        finally:
            waited.set()

    monkeypatch.setattr(http_shards._CLAIMS, "wait_for_room", observed_wait_for_room)
    asked: list[str] = []
    body_after_wait: list[bool] = []

    def release(path: str, part: str) -> None:
        # b's headers once a claimed its room; c's 404 once b waits; a's body once b stopped.
        if part == "headers":
            asked.append(path)
        if path.startswith("/b-") and part == "headers":
            measured.reached(1)
        elif path.startswith("/c-"):
            waiting.wait(WAIT_S)
        elif path.startswith("/a-") and part == "body":
            body_after_wait.append(waited.wait(WAIT_S))

    serving, _ = _serving(served, cache, monkeypatch, release)
    with serving as server:
        urls = [f"{server.url}/{name}-000000.tar" for name in "abc"]
        with pytest.raises(TorchkitError) as raised:
            http_shards.fetch_shards(urls)
    failure = raised.value
    assert waiting.is_set() and body_after_wait == [True]  # b stopped before a's body came
    assert failure.message.startswith(f"cannot download {urls[2]}: HTTP 404"), failure.message
    assert asked.count("/b-000000.tar") == 1  # stopped, not asked for again
    assert _left_in(cache) == set(), _left_in(cache)  # no shard, no temporary, no claim


def test_a_forked_process_waits_for_its_parents_claim_only_while_the_parent_holds_it(
    tmp_path, monkeypatch
):
    """A process forked while a download of its parent claimed room (a loader worker) inherited
    that claim in memory, which no thread of its ever ended: a shard that fit beside nothing but
    it waited for ever; a lock a download thread held at the fork stayed held. The child counts
    its parent's claim as another process's (by its file, which the parent holds): its shard
    waits until the parent ends that claim, then takes the room; no such lock is held."""
    from torchkit.core.data.sources import http_shards

    monkeypatch.setattr(http_shards, "_free_bytes", lambda folder: 100_000)  # room: 95,000
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    folder = tmp_path / "cache" / "shards" / "f"
    folder.mkdir(parents=True)
    claims, stop, size = http_shards._CLAIMS, threading.Event(), (60_000, "its Content-Length is")
    said, says = os.pipe()
    with claims.claim("http://h/a-000000.tar", folder, size) as held:
        assert held.take(stop) is None
        with claims.claim("http://h/b-000000.tar", folder, size) as beside:
            assert beside.take(stop) is not None  # in the parent, b waits for a
        holding, forked = threading.Event(), threading.Event()

        def hold_reading_lock() -> None:  # as a download thread that starts or ends a read
            with http_shards._READING_LOCK:
                holding.set()
                forked.wait(WAIT_S)

        holder = threading.Thread(target=hold_reading_lock)
        holder.start()
        holding.wait(WAIT_S)
        child = os.fork()
        if child == 0:
            code = 1
            try:
                os.close(said)
                threading.Timer(WAIT_S, stop.set).start()  # a wait that never ends: code 1
                with claims.claim("http://h/b-000000.tar", folder, size) as inherited:
                    waiting = inherited.take(stop)
                    code = 0 if waiting is not None and waiting.polled else 3
                    os.write(says, b"waits")
                    if code == 0:
                        claims.wait_for_room(inherited.url, folder, size, waiting, stop)
                        code = 0 if inherited.take(stop) is None else 5
                if code == 0 and not http_shards._READING_LOCK.acquire(timeout=WAIT_S / 6):
                    code = 4
            finally:
                os._exit(code)
        os.close(says)
        forked.set()
        holder.join(WAIT_S)
        told = os.read(said, 5)
    os.close(said)
    _, status = os.waitpid(child, 0)  # the parent's claim ended: the child takes the room
    assert told == b"waits"
    # 3: the parent's claim did not count; 5: it counted once ended; 1: waited for ever (or
    # failed); 4: its first download would have hung on the lock.
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_waiting_shard_is_judged_by_the_size_the_server_gives_when_asked_again(
    tmp_path, small_tmpfs, monkeypatch
):
    """b (0.6 of the room) waits beside a's claim; meanwhile the server's b grows past the
    whole room. Asked for again once a is cached, b is refused by its new Content-Length, not
    by the size its first answer gave; nothing of it is written."""
    from torchkit.core.data.sources.http_shards import fetch_shards

    cache, _, room, served = _small_disk(tmp_path, small_tmpfs)
    _shard(served / "a-000000.tar", room * 3 // 5)
    _shard(served / "b-000000.tar", room * 3 // 5)
    measured = _Measured(cache, monkeypatch)
    asked: list[str] = []
    grown: list[int] = []

    def release(path: str, part: str) -> None:
        # b's first answer once a claimed its room (b grows on the server after it); a's body
        # once b measured the room and waits.
        if path.startswith("/b-") and part == "headers":
            asked.append(path)
            if not grown:
                measured.reached(1)
                grown.append(_shard(served / "b-000000.tar", room * 6 // 5))
        elif path.startswith("/a-") and part == "body":
            measured.reached(2)

    serving, _ = _serving(served, cache, monkeypatch, release)
    with serving as server:
        urls = [f"{server.url}/{name}-000000.tar" for name in "ab"]
        with pytest.raises(TorchkitError) as raised:
            fetch_shards(urls)
    failure = raised.value
    assert failure.message.startswith(
        f"cannot download {urls[1]}: its Content-Length is {grown[0]} bytes, more than the "
        "cache's disk has room for"
    ), failure.message
    assert asked == ["/b-000000.tar"] * 2
    assert _cached(cache) == {"a-000000.tar": (served / "a-000000.tar").read_bytes()}


def test_a_waiting_shard_is_asked_for_again_only_once_it_fits(tmp_path, small_tmpfs, monkeypatch):
    """b (0.7 of the room) waits beside a's and c's claims (0.35 each). a fails: b still does
    not fit beside c, and was asked for again all the same (a request per ended claim: a large
    shard behind many small ones asked for again and again). Now it is asked for again once c
    failed too, and downloaded: two requests in all."""

    cache, _, room, served = _small_disk(tmp_path, small_tmpfs)
    for name, share in (("a", 35), ("b", 70), ("c", 35)):
        _shard(served / f"{name}-000000.tar", room * share // 100)
    measured = _Measured(cache, monkeypatch)
    asked: list[str] = []

    def release(path: str, part: str) -> None:
        # b once a and c claimed their room; a's cut body once b measured it and waits; c's
        # once b judged the room again after a's end.
        if part == "headers":
            asked.append(path)
        if path.startswith("/b-") and part == "headers":
            measured.reached(2)
        elif path.startswith("/cut/a-") and part == "body":
            measured.reached(3)
        elif path.startswith("/cut/c-") and part == "body":
            measured.reached(4)

    serving, _ = _serving(served, cache, monkeypatch, release)
    with serving as server:
        urls = [f"{server.url}/{path}-000000.tar" for path in ("cut/a", "b", "cut/c")]
        outcomes = _fetched_at_once(urls)
    assert all(isinstance(outcomes[url], TorchkitError) for url in (urls[0], urls[2])), outcomes
    assert asked.count("/b-000000.tar") == 2, asked
    assert _cached(cache) == {"b-000000.tar": (served / "b-000000.tar").read_bytes()}


# A real run's wait for its end after Ctrl-C: only a hang takes this long (well under a second
# alone, seconds on a loaded machine), and its client timeout (_NEVER_S) is far longer.
_HANG_S = 120
_NEVER_S = 86400  # TORCHKIT_HTTP_TIMEOUT's largest


def _stopped_when(
    process: subprocess.Popen,
    moment: Callable[[], None],
    signum: int,
    signalled: threading.Event,
    then: Callable[[], None] | None = None,
) -> str:
    """`process`'s stderr once `signum`, sent as `moment` returns (and `then` run just after),
    has ended it; killed (and the test failed) where it still runs after _HANG_S: only a hang
    waits that long. `signalled` is set however it went: the server lets go of the bodies it
    holds back."""
    try:
        moment()
        process.send_signal(signum)
        if then is not None:
            then()
        _, stderr = process.communicate(timeout=_HANG_S)
    except subprocess.TimeoutExpired:
        killed(process)
        raise
    finally:
        signalled.set()
    return stderr


def test_ctrl_c_while_a_shard_waits_for_room_ends_the_run_cleanly(
    tmp_path, small_tmpfs, monkeypatch
):
    """A real run: two shards of 0.6 of the room, one claims it (its body held back), the other
    waits for it (the run says so). Ctrl-C then ends the run at once, with 130 and its one
    line (SIGTERM takes the same way: 143): the waiting shard stopped, the holder's stalled
    read hung up on (it waited for TORCHKIT_HTTP_TIMEOUT), nothing of either left. "At once"
    is judged against a client timeout far beyond the test's wait, not by a wall-clock budget
    (15 s of it ran out on a loaded machine): a run that waits for that timeout, or for the
    server to let go of the body, never ends within the wait and fails the test."""
    cache, _, room, served = _small_disk(tmp_path, small_tmpfs)
    for name in "ab":
        _shard(served / f"{name}-000000.tar", room * 3 // 5)
    signalled = threading.Event()

    def release(path: str, part: str) -> None:
        if part == "body":  # whichever claims first holds the room until the run ended
            signalled.wait(3 * _HANG_S)  # past the test's wait for the run: let go of at its end

    serving, _ = _serving(served, cache, monkeypatch, release)
    with serving as server:
        process = start_torchkit_process(
            "-v",
            "dataset-stats",
            f"{server.url}/{{a,b}}-000000.tar",
            "--workers",
            "0",
            env={"TORCHKIT_CACHE": str(cache), "TORCHKIT_HTTP_TIMEOUT": str(_NEVER_S)},
        )
        said = []

        def waiting_for_room() -> None:
            while not any("waits for room on the cache's disk" in line for line in said):
                line = process.stderr.readline()
                assert line, "".join(said)  # the run ended before a shard waited
                said.append(line)

        stderr = _stopped_when(process, waiting_for_room, signal.SIGINT, signalled)
    ended_as_stopped(process, signal.SIGINT, process.returncode, "".join(said) + stderr)
    assert _left_in(cache) == set(), _left_in(cache)  # no shard, no temporary, no claim


def _parked_and_stopped(
    tmp_path: Path,
    monkeypatch,
    sitecustomize: str,
    env: dict[str, str],
    signum: int,
    where: str,
    then: Callable[[], None] | None = None,
) -> tuple[subprocess.Popen, str, Path]:
    """A real dataset-stats of two URL shards whose bodies the server holds back, run with
    `sitecustomize`, which parks it and then says so in TK_TEST_PARKED (`where`: the place),
    and `env`; `signum` sent once it is parked (`then` run just after). The process, its
    stderr and its cache folder."""
    served = tmp_path / "served"
    served.mkdir()
    for name in "ab":
        _shard(served / f"{name}-000000.tar", 64 * 1024)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize)
    parked, cache = tmp_path / "parked", tmp_path / "cache"
    signalled = threading.Event()

    def hold_body(path: str, part: str) -> None:
        if part == "body":  # held until the run ended: only a hang-up ends its read
            signalled.wait(3 * _HANG_S)

    serving, _ = _serving(served, cache, monkeypatch, hold_body)
    with serving as server:
        process = start_torchkit_process(
            "dataset-stats",
            f"{server.url}/{{a,b}}-000000.tar",
            "--workers",
            "0",
            env={
                "PYTHONPATH": str(site),
                "TK_TEST_PARKED": str(parked),
                "TORCHKIT_CACHE": str(cache),
                "TORCHKIT_HTTP_TIMEOUT": str(_NEVER_S),
                **env,
            },
        )

        def parked_there() -> None:
            wait_until(parked.exists, process=process, what=f"the run {where}")

        stderr = _stopped_when(process, parked_there, signum, signalled, then)
    return process, stderr, cache


# A child's sitecustomize: the run parks where TK_TEST_PARK_AT says, says so in TK_TEST_PARKED
# and stays there until the command's handler has seen a signal (60 s at most): "temporary", a
# download thread about to make its temporary file (`held_temporary`, inside
# `signals_deferred`); "start", the main thread as the first download has begun, before the
# others are; "submit", the main thread inside the pool's submit of the first download (the
# pool's locks held, its thread started).
PARKED = textwrap.dedent(
    """
    import os, threading, time
    from concurrent.futures import ThreadPoolExecutor

    from torchkit.core.io import temporaries
    from torchkit.core.runtime.signals import received_stops

    def park():
        open(os.environ["TK_TEST_PARKED"], "w").close()
        deadline = time.monotonic() + 60
        while not received_stops and time.monotonic() < deadline:
            time.sleep(0.005)

    made, submit = temporaries.held_temporary, ThreadPoolExecutor.submit

    def parked_making(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            park()
        return made(*args, **kwargs)

    def parked_submitting(self, fn, *args, **kwargs):
        future = submit(self, fn, *args, **kwargs)
        if fn.__name__ == "_fetch_one":
            park()
        return future

    adjust = ThreadPoolExecutor._adjust_thread_count

    def parked_in_submit(self):  # inside submit: its locks held, the first download begun
        adjust(self)
        if self._thread_name_prefix.startswith("torchkit-download"):
            park()

    if os.environ["TK_TEST_PARK_AT"] == "temporary":
        temporaries.held_temporary = parked_making
    elif os.environ["TK_TEST_PARK_AT"] == "submit":
        ThreadPoolExecutor._adjust_thread_count = parked_in_submit
    else:
        ThreadPoolExecutor.submit = parked_submitting
    """
)


@pytest.mark.parametrize(
    ("moment", "signum"),
    [
        ("temporary", signal.SIGINT),
        ("start", signal.SIGINT),
        ("submit", signal.SIGINT),
        ("temporary", signal.SIGTERM),
    ],
    ids=["temporary", "start", "submit", "temporary-sigterm"],
)
def test_ctrl_c_or_sigterm_as_a_download_begins_ends_the_run(tmp_path, monkeypatch, moment, signum):
    """Two moments a Ctrl-C could meet as downloads begin, made certain; the run then waited
    for the server's body for ever. "temporary" (the Ctrl-C test above met it now and then on
    a busy machine): a download thread was making its temporary file, with signals held back.
    The hold, meant for the main thread where handlers run, counted for any thread: the main
    thread's handler held the signal back, the download thread sent it again as its step
    ended, to itself, and the main thread, waiting for the downloads, never woke. "start": the
    main thread was starting the downloads; the one begun was never stopped, and the run's end
    waited for it. Now the run ends at once: 130 (SIGTERM: 143), nothing of the shards left."""
    process, stderr, cache = _parked_and_stopped(
        tmp_path, monkeypatch, PARKED, {"TK_TEST_PARK_AT": moment}, signum, f"parked ({moment})"
    )
    ended_as_stopped(process, signum, process.returncode, stderr)
    assert _left_in(cache) == set(), _left_in(cache)  # no shard, no temporary, no claim


# A child's sitecustomize: a download thread, stopped, stays in its download (`_fetch_one`)
# after it ended until TK_TEST_RELEASE exists (60 s at most), saying so in TK_TEST_JOINING: the
# main thread, stopped, waits for it in the pool's end. TK_TEST_PARKED (the process's PID) once
# a download began.
STOPPED_DOWNLOAD_HELD = textwrap.dedent(
    """
    import os, time

    from torchkit.core.data.sources import http_shards

    fetch = http_shards._fetch_one

    def held_fetch(*args):
        with open(os.environ["TK_TEST_PARKED"] + ".part", "w") as out:
            out.write(str(os.getpid()))
        os.replace(os.environ["TK_TEST_PARKED"] + ".part", os.environ["TK_TEST_PARKED"])
        try:
            return fetch(*args)
        finally:
            open(os.environ["TK_TEST_JOINING"], "a").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.environ["TK_TEST_RELEASE"]):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.005)

    http_shards._fetch_one = held_fetch
    """
)


def _signal_pending(pid: int, signum: int) -> bool:
    """Whether `signum` sent to process `pid` waits to be handled (Linux /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    pending = int(re.search(r"^ShdPnd:\s*([0-9a-f]+)", status, re.MULTILINE).group(1), 16)
    return bool(pending >> (signum - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc")
def test_a_second_ctrl_c_while_the_stopped_downloads_end_is_ignored(tmp_path, monkeypatch):
    """The first Ctrl-C stops the downloads and the run waits for their threads to end (the
    pool's join); a second one, handled there, neither hangs the run nor cuts its clean-up
    short: 130, nothing of the shards left."""
    parked, joining, release = (tmp_path / name for name in ("parked", "joining", "release"))

    def second_ctrl_c() -> None:
        pid = int(parked.read_text())
        wait_until(joining.exists, what="a stopped download still in the pool")
        os.kill(pid, signal.SIGINT)
        wait_until(lambda: not _signal_pending(pid, signal.SIGINT), what="its delivery")
        release.touch()

    process, stderr, cache = _parked_and_stopped(
        tmp_path,
        monkeypatch,
        STOPPED_DOWNLOAD_HELD,
        {"TK_TEST_JOINING": str(joining), "TK_TEST_RELEASE": str(release)},
        signal.SIGINT,
        "downloading",
        then=second_ctrl_c,
    )
    ended_as_stopped(process, signal.SIGINT, process.returncode, stderr)
    assert _left_in(cache) == set(), _left_in(cache)  # no shard, no temporary, no claim


# A child's sitecustomize: once the first download is submitted, the main thread's first
# acquisition of a future's lock parks holding it, says so in TK_TEST_PARKED and stays until
# TK_TEST_RELEASE exists (written once the signal is sent) or the command's handler has seen a
# signal (60 s at most).
PARKED_HOLDING_A_FUTURE = textwrap.dedent(
    """
    import os, threading, time
    from concurrent.futures import ThreadPoolExecutor, _base

    from torchkit.core.runtime.signals import received_stops

    armed, parked = [False], [False]

    class ParkingLock:
        def __init__(self):
            self._inner = threading.RLock()
            self._release_save = self._inner._release_save
            self._acquire_restore = self._inner._acquire_restore
            self._is_owned = self._inner._is_owned
            self.release = self._inner.release

        def acquire(self, *args, **kwargs):
            got = self._inner.acquire(*args, **kwargs)
            main = threading.current_thread() is threading.main_thread()
            if got and main and armed[0] and not parked[0]:
                parked[0] = True
                open(os.environ["TK_TEST_PARKED"], "w").close()
                deadline = time.monotonic() + 60
                while not received_stops and time.monotonic() < deadline:
                    if os.path.exists(os.environ["TK_TEST_RELEASE"]):
                        break
                    time.sleep(0.005)
            return got

        __enter__ = acquire

        def __exit__(self, *exc):
            self.release()

    made = _base.Future.__init__

    def future_init(self):
        made(self)
        self._condition = threading.Condition(ParkingLock())

    submit = ThreadPoolExecutor.submit

    def armed_submit(self, fn, *args, **kwargs):
        if fn.__name__ == "_fetch_one":
            armed[0] = True
        return submit(self, fn, *args, **kwargs)

    _base.Future.__init__ = future_init
    ThreadPoolExecutor.submit = armed_submit
    """
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_stop_while_the_main_thread_holds_a_downloads_lock_ends_the_run(
    tmp_path, monkeypatch, signum
):
    """A Ctrl-C (or SIGTERM) raised in the main thread while it holds a download's future's
    lock: waiting with `as_completed`, which takes every future's lock at once, the lock stayed
    held, the download's thread waited on it to end its future, and the pool's join on that
    thread for ever. Made certain here (the lock is held until the signal is sent); the run
    now ends at once, 130 (SIGTERM: 143), nothing of the shards left."""
    release = tmp_path / "release"  # made once the signal is sent: the parked lock let go of
    process, stderr, cache = _parked_and_stopped(
        tmp_path,
        monkeypatch,
        PARKED_HOLDING_A_FUTURE,
        {"TK_TEST_RELEASE": str(release)},
        signum,
        "parked holding a lock",
        then=release.touch,
    )
    ended_as_stopped(process, signum, process.returncode, stderr)
    assert _left_in(cache) == set(), _left_in(cache)  # no shard, no temporary, no claim


def test_a_failure_ends_a_read_its_server_stalls_at_once(tmp_path, monkeypatch):
    """a's server sends its headers, then stalls its body; c, which the server lacks, fails.
    The run waited for a's read until its timeout (TORCHKIT_HTTP_TIMEOUT, 30 s) before it
    gave c's error; now a's connection is hung up on at once, its download stopped, not failed
    (the error is c's), nothing of it kept."""
    from torchkit.core.data.sources import http_shards

    served = tmp_path / "served"
    served.mkdir()
    _shard(served / "a-000000.tar", 64 * 1024)
    stalling, ended = threading.Event(), threading.Event()
    stalled: list[bool] = []

    def release(path: str, part: str) -> None:
        if path.startswith("/a-") and part == "body":
            stalling.set()
            stalled.append(ended.wait(WAIT_S))  # until the run ended
        elif path.startswith("/c-"):
            stalling.wait(WAIT_S)

    cache = tmp_path / "cache"
    serving, _ = _serving(served, cache, monkeypatch, release)
    with serving as server:
        urls = [f"{server.url}/{name}-000000.tar" for name in "ac"]
        with pytest.raises(TorchkitError) as raised:
            http_shards.fetch_shards(urls)
        ended.set()
    assert stalled == [True]  # the run ended while a's body was still held back
    assert raised.value.message.startswith(f"cannot download {urls[1]}: HTTP 404")
    assert _left_in(cache) == set(), _left_in(cache)  # no shard, no temporary, no claim
    assert not http_shards._READING
