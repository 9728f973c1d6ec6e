"""WebDataset shards named by http(s) URL: fetched into a local cache, then read there as shards
on disk (`datasource.shards`), so samplers, DDP, exact resume, workers and the `path` column
(`SHARD/KEY.EXT`) are those of local shards.

What `--data` (or IMAGES) may name: a brace pattern of URLs
(`https://host/data/train-{000000..000099}.tar`), one shard's URL, URLs joined by `::`
(webdataset's list), or the URL of a folder `convert shards` wrote (its `manifest.json` lists
the shards: HTTP has no folder listing; its shards split by name as in a local folder).
`http://` as well as `https://`; a URL that lost a slash to a path argument (`https:/host/x`)
is read as the URL it was.

The cache: `$TORCHKIT_CACHE`, else `$XDG_CACHE_HOME/torchkit`, else `~/.cache/torchkit`. The
shards of the folder URL U (without its `USER:PASSWORD@`) lie in
`shards/<first 16 hex digits of sha256(U)>/NAME.tar`, beside the server's `manifest.json`,
`classes.txt` or `classes.json` (fetched again each run: small).
A cached shard is used again when it matches manifest.json's record of it (bytes and sha256)
or, without one, the size and ETag (else Last-Modified) a HEAD request gives; else it is
downloaded again.

A `convert shards` folder URL whose manifest.json lists each shard's samples (`extensions`,
`labels`) is streamed: the data is listed from the manifest alone, and each shard is fetched
when a process first reads from it (`StreamedShards`); `$TORCHKIT_CACHE_LIMIT` bounds what its
shards take in the cache (the least recently used deleted first), and train's order reads a
window of as many shards as that holds at a time. Other URL shards are all fetched first.

Downloads run DOWNLOAD_THREADS at a time, each streamed to a hidden temporary file beside the
shard and renamed into place once complete and checked (length, manifest sha256; without a
sha256, a whole tar up to its end-of-archive marker: a server whose Content-Length is too small
cuts the body short with no HTTP error): a failed or killed download leaves nothing under the
shard's name. A body of no known size (no Content-Length, no manifest.json size) is read up to
$TORCHKIT_CACHE_LIMIT or the room the cache's disk has (`_disk_room`), never on until the
disk is full; one of a known size larger than that is refused before a byte of it is written.
Downloads at once share that room (`_Claims`), also those of other processes on the cache
(torchrun's ranks, loader workers, two runs: each claim is a file in CACHE/.download-claims that
its process holds flocked): each claims its size, and one that does not fit beside the others'
claims waits for them to end (refused only if it does not fit then either). A claim file deleted
while its download runs (`rm -rf CACHE/.download-claims`) is made again as its next chunk is
written.
A lock file per shard makes processes that share the cache (torchrun's ranks, two runs at once)
download each shard once: the others wait for it, then use it; a shard the cache holds current
is read without it, the server reachable or not (a cache shared read-only has none to take),
and the cache limit deletes a shard's lock file with it (a warning after LOCK_WAIT_WARNING_S
seconds says so: a process stopped with Ctrl-Z holds the lock until it resumes or ends). Every
socket operation times out after TIMEOUT_S seconds (`$TORCHKIT_HTTP_TIMEOUT` overrides it). Any
failure is one error naming the URL and why.

A server that cannot be reached at all (no HTTP answer: a refused connection, an unknown host,
no answer in time, a proxy's or gateway's HTTP 502, 503 or 504 in its place, or a proxy's
refusal: its 407, its answer to an https URL's CONNECT, an answer it says it made itself:
`_answered_by`) when its side files are fetched
leaves the cache as it is: its manifest.json, classes and shards are used unchecked, with one
warning, and the server is asked nothing more that run but the shards the cache lacks (whose
download fails as any other). A server that answers is obeyed as always (a
404 deletes, a changed shard is downloaded again, a 500 is an error).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from torchkit.core.data.stored_image import StoredReadError, kept_reader
from torchkit.core.io.claims import reporting_write_errors
from torchkit.core.io.errors import (
    InputError,
    OfflineError,
    OutputWriteError,
    TorchkitError,
    UsageError,
)
from torchkit.core.io.folder_locks import close_lock, open_unshared
from torchkit.core.io.option_lists import is_plain_number_text
from torchkit.core.io.output_paths import remove_tree
from torchkit.core.io.records import read_record_json
from torchkit.core.io.redaction import has_redacted_secret, list_parts, redact_url
from torchkit.core.io.sizes import free_bytes as _free_bytes
from torchkit.core.io.write_errors import as_write_error

if TYPE_CHECKING:
    from torchkit.core.data.stored_image import Blocks

log = logging.getLogger("torchkit")

TIMEOUT_S = 30.0  # seconds any socket operation may take (connect, each read)
MAX_TIMEOUT_S = 86400.0  # a day: the socket module overflows on much longer timeouts
DOWNLOAD_THREADS = 4
LOCK_WAIT_WARNING_S = 5.0  # a wait for another process's download this long says so
# What flock raises where the cache's file system has none (Lustre mounted without its flock
# option: ENOSYS; NFS with no lock daemon: ENOLCK): no lock there, as on a platform without it.
_NO_FLOCK = frozenset(
    getattr(errno, name)
    for name in ("ENOSYS", "ENOLCK", "EOPNOTSUPP", "ENOTSUP", "EINVAL")
    if hasattr(errno, name)
)
SIDE_FILES = ("manifest.json", "classes.txt", "classes.json")
CACHE_LIMIT_VARIABLE = "TORCHKIT_CACHE_LIMIT"
_HELD_OPEN = 128  # shards a process keeps open at most
_CHUNK = 1 << 20
# The most a side file (manifest.json, classes.txt) may hold, decoded: read into memory whole,
# an endless body or a small gzip of gigabytes of zeros took all of it. A manifest.json lists
# its samples at about 12 bytes each: this is some 80 million samples.
_SIDE_FILE_BYTES = 1 << 30
_URL = re.compile(r"^(https?):/+(?=[^/])", re.IGNORECASE)
# Statuses that mean a side file is not there (S3 answers 403 for a missing key).
_ABSENT = (401, 403, 404, 410)
_GONE = (404, 410)  # ...of which those that say so whoever asks
# Statuses that say no server answered: what a proxy or gateway (a load balancer) sends in its
# place when it cannot reach it (502 Bad Gateway, 504 Gateway Timeout; squid answers 503 for a
# host it cannot connect to or resolve, a load balancer with no server behind it 503), or a
# server sends that is down for maintenance (503). None of them says anything of the files;
# nor does a proxy's 407 (it wants a login), never a server's.
_NO_ANSWER = (502, 503, 504)
_HINT = (
    "name shards by URL as https://HOST/DIR/NAME-{000000..000009}.tar, URLs joined by ::, or "
    "the URL of a folder with the manifest.json `torchkit convert shards` writes"
)


def is_url(spec: str) -> bool:
    """Whether `spec` (or a part of a `::` list) is an http(s) URL."""
    return any(_URL.match(part) for part in list_parts(spec))


def cache_folder() -> Path:
    """torchkit's cache: $TORCHKIT_CACHE, else $XDG_CACHE_HOME/torchkit, else ~/.cache/torchkit."""
    chosen = os.environ.get("TORCHKIT_CACHE")
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "torchkit"


def shard_cache_folder(folder_url: str) -> Path:
    """Where the shards of `folder_url` (`https://host/dir`, no query) are cached: named after
    the URL without its `USER:PASSWORD@` (no hash of a password on disk; the server checks
    each use of a cached shard with the credentials given then)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(folder_url.rstrip("/"))
    public = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    digest = hashlib.sha256(public.encode("utf-8")).hexdigest()[:16]
    return cache_folder() / "shards" / digest


def timeout_s() -> float:
    """TIMEOUT_S, or $TORCHKIT_HTTP_TIMEOUT."""
    text = os.environ.get("TORCHKIT_HTTP_TIMEOUT", "").strip()
    if not text:
        return TIMEOUT_S
    try:
        # As an option's number: float reads `1_0` as 10, `３` as 3
        value = float(text) if is_plain_number_text(text) else 0.0
    except ValueError:
        value = 0.0
    if not 0 < value <= MAX_TIMEOUT_S:  # nan and inf too
        raise UsageError(
            f"TORCHKIT_HTTP_TIMEOUT={text} is not a number of seconds up to {MAX_TIMEOUT_S:g}",
            "e.g. 30 or 2.5",
        )
    return value


# --- which specs are ours -------------------------------------------------------------------


def open_stored(
    spec: str, classes: Sequence[str] | None, allow_unlabelled: bool, every_image: bool = False
) -> Any:
    """The shards the URLs in `spec` name (module docstring), fetched into the cache and read
    there; None if `spec` names no URL. (`every_image` concerns folder layouts: none here.)"""
    if not is_url(spec):
        return None
    parts = [_URL.sub(lambda m: m.group(1).lower() + "://", part, 1) for part in list_parts(spec)]
    typed = "::".join(parts)
    shown = redact_url(typed)  # the data's name in every record and message
    if not all(_URL.match(part) for part in parts):
        local = next(part for part in parts if not _URL.match(part))
        raise InputError(f"{shown} joins URLs and a path on disk ({local})", _HINT)
    if has_redacted_secret(typed):  # a recorded URL (config.json, a checkpoint): never `***`
        raise UsageError(
            f"{shown} is a recorded URL whose password or token was not saved",
            "give the URL with its secret again: --data URL",
        )
    _check_ports(parts, shown)
    from torchkit.core.data.sources.shards import (
        _is_tar_name,
        _open_shards,
        compressed_tar_error,
        expand_braces,
        is_compressed_tar_name,
    )

    urls = [url for part in list_parts(typed) for url in expand_braces(part)]
    names = [_location(url).name for url in urls]
    compressed = [
        url for url, name in zip(urls, names, strict=True) if is_compressed_tar_name(name)
    ]
    if compressed:  # as on disk: a shard is read by offset, never decompressed on the way
        raise compressed_tar_error(_shown(compressed[0]), len(compressed) - 1)
    by_split = False
    opened: dict[str, _Folder] = {}
    if len(urls) == 1 and not _is_tar_name(names[0]):  # `https://host/dir/`: a folder of shards
        folder = _open_folder(_folder_url(urls[0]), _location(urls[0]).query, listed=True)
        urls, by_split = _folder_shards(urls[0], folder), True
        opened[_location(urls[0]).folder] = folder
        streamed = _streamed_source(shown, folder, classes, allow_unlabelled)
        if streamed is not None:
            return streamed
        log.info(
            "%s/manifest.json lists no samples per shard (written before torchkit streamed "
            "shards): every shard is downloaded first",
            _shown(folder.url),
        )
    for url in urls:
        if not _is_tar_name(_location(url).name):
            # No reader but this one takes a URL: a `::` list of folder URLs ends here.
            raise InputError(
                f"{_shown(url)} names no .tar shard: a :: list joins shard URLs, a folder URL "
                "is read alone",
                _HINT,
            )
    local = fetch_shards(urls, opened)
    return _open_shards(shown, local, classes, allow_unlabelled, by_split=by_split)


def _check_ports(urls: Sequence[str], shown: str) -> None:
    """UsageError for a URL whose `HOST:PORT` has no number after the `:`: a password's raw `/`,
    `?` or `#` ends the host part, and urllib took the password for the port (its error quoted
    that part of the password)."""
    from urllib.parse import urlsplit

    for url in urls:
        try:
            _ = urlsplit(url).port  # ValueError: not a number
        except ValueError:
            raise UsageError(
                f"{shown} cannot be read: a raw /, ? or # in its password ends its host there "
                "(or its port is not a number)",
                "write a password's /, ? and # as %2F, %3F and %23",
            ) from None


@dataclass(frozen=True)
class _Location:
    folder: str  # scheme://host/dir, no query: what the cache folder is named after
    name: str  # the file's name (unquoted)
    query: str  # "?..." or ""


def _location(url: str) -> _Location:
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    folder, _, name = parts.path.rpartition("/")
    name = unquote(name)
    query = f"?{parts.query}" if parts.query else ""
    return _Location(f"{parts.scheme}://{parts.netloc}{folder}", name, query)


def _shown(url: str) -> str:
    """`url` for messages: no query or fragment (they may hold a token), a password `***`."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return redact_url(f"{parts.scheme}://{parts.netloc}{parts.path}")


def _folder_url(url: str) -> str:
    """The folder URL `url` (`https://host/dir/?query`) names: no query, fragment or last `/`."""
    return url.split("?", 1)[0].split("#", 1)[0].rstrip("/")


def _folder_shards(url: str, opened: _Folder) -> list[str]:
    """The shard URLs the manifest.json of the folder URL `url` lists, in its order (`opened`:
    its cache folder, the server's manifest.json fetched into it)."""
    from urllib.parse import quote

    folder, query = opened.url, opened.query
    if opened.unusable is not None:
        raise opened.unusable
    if opened.document is None:
        if opened.unreachable is not None:  # never fetched: the server's silence is the error
            raise opened.unreachable
        raise InputError(
            f"{_shown(url)} names no .tar shard, and no manifest.json lies there",
            "HTTP lists no folder: " + _HINT,
        )
    entries = opened.manifest
    if not entries:
        raise InputError(f"{_shown(folder)}/manifest.json lists no shard", _HINT)
    return [f"{folder}/{quote(name)}{query}" for name in entries]


def _read_manifest(
    data: bytes | None, where: str
) -> tuple[Any, dict[str, dict[str, Any]], InputError | None]:
    """manifest.json's bytes (None: there is none) parsed, once a run: (the document, its
    shards as `_manifest_entries` gives them, None); (None, {}, why) for one torchkit cannot
    read (not JSON, no list of shards: another tool's)."""
    if data is None:
        return None, {}, None
    try:
        document = json.loads(data)
        return document, _manifest_entries(document, where), None
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's stack
        why = InputError(f"{where} is not JSON", "serve the manifest.json convert shards wrote")
    except InputError as error:
        why = error
    return None, {}, why


def _manifest_entries(manifest: Any, where: str) -> dict[str, dict[str, Any]]:
    """manifest.json's shards: name -> {"bytes": int, "sha256": str} (either may be absent)."""
    shards = manifest.get("shards") if isinstance(manifest, dict) else None
    if not isinstance(shards, list):
        raise InputError(f"{where} lists no shards", "serve the manifest.json convert shards wrote")
    entries: dict[str, dict[str, Any]] = {}
    for entry in shards:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _safe_name(name):
            raise InputError(f"{where} names a shard {name!r} that is not a file name")
        if name in entries:
            # Streamed, its samples were read twice (dataset-stats counted 8 images of 4);
            # downloaded, once: as a list of shard URLs naming one twice, an error.
            raise InputError(
                f"{where} lists the shard {name} twice",
                "its samples would be read, trained and counted twice: list each shard once",
            )
        size, digest = entry.get("bytes"), entry.get("sha256")
        entries[name] = {
            "bytes": size if isinstance(size, int) and not isinstance(size, bool) else None,
            "sha256": digest.lower() if isinstance(digest, str) else None,
        }
    return entries


def _safe_name(name: str) -> bool:
    # No NUL either: no file may be named with one (a URL's %00, a manifest's \u0000).
    return bool(name) and not any(c in name for c in "/\\\0") and not name.startswith(".")


# --- the cache --------------------------------------------------------------------------------


@dataclass
class _Folder:
    url: str
    query: str
    path: Path  # its cache folder
    manifest: dict[str, dict[str, Any]]  # from its manifest.json; {} without one
    # The error of a server that gave no HTTP answer for the side files: the cache is then used
    # unchecked (no HEAD), as it is. None: the server answered.
    unreachable: _Unreachable | None = None
    # manifest.json as parsed (None: there is none, or `unusable` says why torchkit cannot
    # read it): what a folder URL's shards and samples are listed from. Not for StreamedShards
    # to carry into every process: it may list millions of samples.
    document: Any = None
    unusable: InputError | None = None


def fetch_shards(urls: Sequence[str], opened: dict[str, _Folder] | None = None) -> list[str]:
    """The local paths of the shards `urls` name, each downloaded into the cache unless a
    current copy is there (module docstring). One TorchkitError for the first that fails.
    `opened`: folder URL -> its cache folder, side files fetched already."""
    folders: dict[str, _Folder] = dict(opened or {})
    jobs: dict[Path, tuple[str, _Folder, str]] = {}
    local = []
    for url in urls:
        where = _location(url)
        if not _safe_name(where.name):
            raise InputError(f"{_shown(url)} names no shard file", _HINT)
        folder = folders.get(where.folder)
        if folder is None:
            folder = folders[where.folder] = _open_folder(where.folder, where.query)
        target = folder.path / where.name
        jobs.setdefault(target, (url, folder, where.name))
        local.append(str(target))
    log.info(
        "reading %d shards through the cache %s",
        len(jobs),
        ", ".join(str(f.path) for f in folders.values()),
    )
    _run_all(list(jobs.values()))
    return local


# A cache without room: a write into it that fails (its disk full), or a body larger than the
# room it has (`_too_large`). No output option of the command moves the cache: its settings do.
_CACHE_ROOM_HINT = "free some space, or set TORCHKIT_CACHE to a folder with more room"
# ...and a write into a cache torchkit may not write (a read-only disk, a shared cache).
_CACHE_READ_ONLY_HINT = (
    "the cache lacks it or holds an old copy: set TORCHKIT_CACHE to a folder torchkit may "
    "write, or fetch the data into this cache where it may be written"
)


def _unwritable_cache(what: str, error: OSError) -> OutputWriteError:
    """The error of a cache that cannot take `what` (`URL into FOLDER`: a shard to download)."""
    room = error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    return OutputWriteError(
        f"cannot download {what}: {error.strerror or error}",
        _CACHE_ROOM_HINT if room else _CACHE_READ_ONLY_HINT,
    )


@contextlib.contextmanager
def _writing_the_cache() -> Iterator[None]:
    """A write error inside (the cache's disk full, read-only) with the cache's own hint."""
    try:
        yield
    except OutputWriteError as error:
        raise OutputWriteError(error.message, _CACHE_ROOM_HINT) from None


def _open_folder(url: str, query: str, listed: bool = False) -> _Folder:
    """The cache folder of the folder URL `url`, with the server's side files in it (and none
    the server no longer has); `listed`: its shards are those its manifest.json lists."""
    path = shard_cache_folder(url)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(
            f"cannot make the shard cache folder {path}: {error.strerror or error}",
            "set TORCHKIT_CACHE to a folder torchkit may write",
        ) from None
    from torchkit.core.io.files import atomic_write_bytes

    document, manifest, unusable = None, {}, None
    for name in SIDE_FILES:
        if name == "classes.json" and (path / "classes.txt").exists():
            continue  # classes.txt comes first, as beside local shards
        # A folder URL's shards are those its manifest.json lists: a refusal of it (a wrong
        # password's 401, an expired token's 403) is that error, not a manifest.json that is
        # not there, which such a run said.
        absent = _GONE if listed and name == "manifest.json" else _ABSENT
        try:
            data = _get_small(f"{url}/{name}{query}", absent)
        except _Unreachable as error:
            return _unchecked_folder(url, query, path, error, listed)
        if name == "manifest.json":
            document, manifest, unusable = _read_manifest(data, f"{_shown(url)}/{name}")
            if unusable is not None:  # another tool's manifest.json: no checksums then
                log.info("%s", unusable)
        if data is None:  # a read-only cache that holds it: one error naming it
            gone = path / name
            with (
                _writing_the_cache(),
                reporting_write_errors(gone),
                contextlib.suppress(FileNotFoundError),
            ):
                remove_tree(gone, ignore_errors=False)
        elif not _holds(path / name, data):  # unchanged, it is not written: a full disk reads
            with _writing_the_cache():
                atomic_write_bytes(path / name, data)
    return _Folder(url, query, path, manifest, document=document, unusable=unusable)


def _holds(path: Path, data: bytes) -> bool:
    """Whether the file at `path` holds `data` (read only where the sizes agree)."""
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def _unchecked_folder(
    url: str, query: str, path: Path, error: _Unreachable, listed: bool
) -> _Folder:
    """The cache folder of `url` as it is, for a server that gave no HTTP answer: `error`
    where it holds no manifest.json and (unless `listed`: shards are those it lists) no shard
    (nothing usable was cached: the error it is, with no warning that the cache is used)."""
    cached_manifest = path / "manifest.json"
    if not cached_manifest.is_file():
        if listed:
            raise error
        with os.scandir(path) as entries:
            if not any(_is_cached_shard(entry.name) for entry in entries):
                raise error
    data, unreadable = None, None
    try:
        data = cached_manifest.read_bytes()
    except FileNotFoundError:
        pass
    except OSError as error:
        reason = error.strerror or error
        unreadable = InputError(f"cannot read {cached_manifest}: {reason}")
    # Another tool's manifest.json: no checksums then.
    document, manifest, unusable = _read_manifest(data, f"{_shown(url)}/manifest.json")
    log.warning(
        "cannot reach %s: %s; using the shards cached in %s unchecked (they may be out of date)",
        error.shown,
        error.why,
        path,
    )
    return _Folder(
        url, query, path, manifest, error, document=document, unusable=unreadable or unusable
    )


def _run_all(jobs: list[tuple[str, _Folder, str]]) -> None:
    """Each shard checked against the cache and downloaded where needed, DOWNLOAD_THREADS at a
    time; on the first failure the others stop (their temporary files deleted) and the failure
    of the first shard in `jobs` order that failed is raised.

    The main thread waits on a queue each download's end is put into (by the download's
    thread, as the future's done-callback, with its outcome read there), not on
    `as_completed`: that takes every future's lock at once, and a Ctrl-C raised in the main
    thread between those acquisitions left some of them held for ever, so a download thread
    ending its future waited on the lock, and the pool's join on that thread (a hang). The
    few steps where the main thread still takes a future's lock (a callback added, the
    downloads cancelled) hold Ctrl-C and SIGTERM back until the lock is let go."""
    from concurrent.futures import Future, ThreadPoolExecutor
    from queue import SimpleQueue

    from torchkit.core.runtime.signals import signals_held

    if not jobs:
        return
    stop = threading.Event()
    errors: dict[int, BaseException] = {}
    # (a download's future, its error or None): one for each future, cancelled ones too.
    ended: SimpleQueue[tuple[Future[None], BaseException | None]] = SimpleQueue()

    def put_ended(future: Future[None]) -> None:
        ended.put((future, None if future.cancelled() else future.exception()))

    with ThreadPoolExecutor(
        max_workers=min(DOWNLOAD_THREADS, len(jobs)), thread_name_prefix="torchkit-download"
    ) as pool:
        futures: dict[Future[None], int] = {}

        def stop_all() -> None:
            with signals_held():
                _stop_downloads(stop)
                for other in futures:
                    other.cancel()

        try:
            # Submitted inside: a Ctrl-C between two submits stops the downloads begun, which
            # the pool's end waited for (one waiting for room or a stalled server: for ever).
            for i, job in enumerate(jobs):
                future = pool.submit(_fetch_one, *job, stop)
                futures[future] = i
                with signals_held():
                    future.add_done_callback(put_ended)
            for _ in range(len(futures)):
                future, error = ended.get()  # a Ctrl-C raises here, holding no lock
                if error is not None and not isinstance(error, _Stopped):
                    errors[futures[future]] = error
                    stop_all()
        except BaseException:  # Ctrl-C: the downloads in flight stop and clean up
            stop_all()
            raise
    if errors:
        raise errors[min(errors)]


class _Stopped(Exception):
    """A download given up because another one failed."""


def _stop_downloads(stop: threading.Event) -> None:
    """Set `stop`, wake the downloads waiting for room on the cache's disk (`_Claims` waits
    for nothing but a claim's end or this) and end the reads of those in flight (`_reading`):
    they stop at once, not when a claim ends or a stalled server's TORCHKIT_HTTP_TIMEOUT."""
    with _READING_LOCK:
        stop.set()
        responses = list(_READING.get(stop, ()))
    _CLAIMS.wake()
    for response in responses:
        _hang_up(response)


# The responses downloads read under each `stop` (`_run_all`'s): a read a server stalls blocks
# its thread (Ctrl-C reaches the main thread alone) until the socket's timeout, and the run
# waited for it after Ctrl-C or another download's failure.
_READING: dict[threading.Event, set[Any]] = {}
_READING_LOCK = threading.Lock()


@contextlib.contextmanager
def _reading(response: Any, stop: threading.Event) -> Iterator[None]:
    """`response` read under `stop`: hung up on by `_stop_downloads`, its error then
    `_Stopped` (the download was stopped, not failed)."""
    with _READING_LOCK:
        if stop.is_set():
            raise _Stopped
        _READING.setdefault(stop, set()).add(response)
    try:
        yield
    except TorchkitError:
        if stop.is_set():
            raise _Stopped from None
        raise
    finally:
        with _READING_LOCK:
            reading = _READING[stop]
            reading.discard(response)
            if not reading:
                del _READING[stop]


def _hang_up(response: Any) -> None:
    """End a read of `response` blocked in another thread: its socket shut down (the plain
    socket's shutdown, under TLS too: the TLS state is the reading thread's), so the read ends
    at once with the body short."""
    import socket

    raw = getattr(getattr(getattr(response, "_response", response), "fp", None), "raw", None)
    connection = getattr(raw, "_sock", None)
    if isinstance(connection, socket.socket):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(connection, socket.SHUT_RDWR)


def _fetch_one(url: str, folder: _Folder, name: str, stop: threading.Event) -> None:
    target = folder.path / name
    expected = folder.manifest.get(name)
    # A shard the cache holds current (renamed into place whole) is read without its lock
    # file, the server reachable or not: a cache shared read-only has none to take. The lock
    # is for a download.
    seen = _version(target)
    if seen is not None and _is_current(url, target, expected, folder):
        return
    with _locked(_lock_path(target), stop, f"{_shown(url)} into {folder.path}"):
        # Another process may have fetched it meanwhile: checked again only if it changed.
        now = _version(target)
        if now is not None and now != seen and _is_current(url, target, expected, folder):
            return
        if stop.is_set():
            raise _Stopped
        # A temporary file of it that a killed download left is removed by atomic_write, from
        # one listing of the folder a process (not one a shard: a glob each was quadratic).
        _download(url, target, expected, stop)


def _folder_id(folder: Path) -> tuple[int, int] | None:
    """Which folder is at `folder` (device, inode); None: none."""
    try:
        info = os.stat(folder)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _cache_deleted(what: str) -> TorchkitError:
    """The error of a download (`what`: `URL into FOLDER`) whose cache folder, or file being
    written, was deleted as it ran (`rm -rf` of the cache). Not downloaded again into a folder
    made anew: the side files read beside the shards (classes.txt) went with the old one."""
    return TorchkitError(
        f"cannot download {what}: the cache was deleted while torchkit used it (another "
        "program deleted the folder or the file being written)",
        "run again; nothing of it was kept",
    )


def _version(target: Path) -> tuple[int, int, int] | None:
    """What tells one cached copy of the shard `target` from another (None: no file there)."""
    try:
        info = target.stat()
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_size)


@contextlib.contextmanager
def _locked(path: Path, stop: threading.Event, what: str) -> Iterator[None]:
    """An exclusive lock on `path` (created), shared with other processes; none where the
    platform or the cache's file system has no flock (`_NO_FLOCK`: the atomic rename keeps the
    cache whole there too; it was an error, every download refused). A wait longer
    than LOCK_WAIT_WARNING_S says once that another process holds it (`what` it downloads): one
    stopped with Ctrl-Z holds it until resumed or ended, and the wait was silent for ever."""
    try:
        import fcntl  # noqa: F401  (whether the platform has flock at all)
    except ImportError:
        yield
        return
    said_after: float | None = time.monotonic() + LOCK_WAIT_WARNING_S
    while True:
        try:
            # Not kept by the processes this one forks (loader workers started while a
            # download runs on a thread): one that outlived a SIGKILL of this process would hold
            # the lock, and the next run would wait for a download nobody makes.
            fd = open_unshared(path, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:  # its folder deleted since this run made it
            raise _cache_deleted(what) from None
        except OSError as error:  # a cache that cannot be written (read-only, full)
            if as_write_error(error, path) is None:
                raise
            raise _unwritable_cache(what, error) from None
        try:  # another process that downloads this shard holds it: wait for it
            locked = _flock_polled(
                fd,
                stop,
                said_after,
                f"waiting for another torchkit process downloading {what} (it holds {path}; "
                f"{_HELD_TILL}",
            )
        except BaseException:
            close_lock(fd)
            raise
        if not locked:  # none there, as on a platform without flock
            close_lock(fd)
            yield
            return
        if _is_at(fd, path):
            break
        close_lock(fd)  # deleted while we waited (`_delete_lock`): lock the one there now
    try:
        yield
    finally:
        close_lock(fd)  # releases the lock


# How a warning of a long wait for a lock ends: why the wait may have no end.
_HELD_TILL = "one stopped with Ctrl-Z holds it until resumed with fg, or ended)"


def _flock_polled(fd: int, stop: threading.Event, warn_at: float | None, warning: str) -> bool:
    """Take the exclusive flock of `fd`, polled (a blocking flock cannot be given up when the
    run stops): True once held, False on a file system without flock (`_NO_FLOCK`); any other
    OSError is raised. A stop ends the wait (`_Stopped`); once the clock passes `warn_at`,
    `warning` is logged, once. The polls start at 2.5 ms and double up to 0.1 s."""
    import fcntl

    step = _CLAIMS_LOCK_STEP_S / 4
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:  # another process holds it
            if stop.is_set():
                raise _Stopped from None
            if warn_at is not None and time.monotonic() >= warn_at:
                warn_at = None
                log.warning("%s", warning)
            time.sleep(step)
            step = min(step * 2, _CLAIMS_LOCK_LONGEST_STEP_S)
        except OSError as error:
            if error.errno not in _NO_FLOCK:
                raise
            return False


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the file at `path` (not deleted or replaced)."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def _delete_lock(path: Path) -> None:
    """Delete the lock file `path` unless a process holds it: locked first, then deleted while
    locked, so that a process that opened it meanwhile gets it after, finds it gone (`_is_at`)
    and locks a new one (`_locked`). Without flock, lock files are kept."""
    try:
        import fcntl  # noqa: F401  (whether the platform has flock at all)
    except ImportError:
        return
    try:
        fd = open_unshared(path, os.O_RDWR)
    except OSError:  # gone already, or a cache it may not change
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _is_at(fd, path):
            os.unlink(path)
    except OSError:  # held (BlockingIOError): its holder is using it
        pass
    finally:
        close_lock(fd)


def _lock_path(target: Path) -> Path:
    """The lock file of the cached shard `target`."""
    return target.with_name(f".{target.name}.lock")


def _locked_name(entry: str) -> str:
    """The shard name whose lock file the cache folder's entry `entry` is; "" for another."""
    if entry.startswith(".") and entry.endswith(".lock"):
        return entry[1 : -len(".lock")]
    return ""


def _is_cached_shard(name: str) -> bool:
    """Whether the cache folder's entry `name` is a shard (not a hidden temporary or record)."""
    return name.endswith(".tar") and not name.startswith(".")


def _record_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.json")  # hidden: a folder of shards skips it


def _is_current(url: str, target: Path, expected: dict[str, Any] | None, folder: _Folder) -> bool:
    """Whether the cached `target` is the shard `url` names now (as far as the cache knows,
    where the server of `folder` cannot be reached)."""
    try:
        record = read_record_json(_record_path(target))  # a FIFO there: no record, no wait
    except (OSError, ValueError):
        record = {}
    if not isinstance(record, dict):
        record = {}
    size = target.stat().st_size
    if expected and expected["bytes"] is not None:
        if size != expected["bytes"]:
            return False
        if expected["sha256"] is None or record.get("sha256") == expected["sha256"]:
            return True
        digest = _file_sha256(target)  # a copy from before the record: hashed once
        if digest != expected["sha256"]:
            return False
        with contextlib.suppress(OutputWriteError):  # a read-only cache: hashed each run
            _write_record(target, url, size, digest, _validators(record))
        return True
    if folder.unreachable is not None:  # no HEAD: the size the download recorded, if any
        return record.get("bytes") in (None, size)
    length, validators = _head(url)
    if length is None:  # a HEAD refused, or a body the server encodes: the validators alone
        return _same_version(record, validators) is True
    return length == size and _same_version(record, validators) is not False


def _validators(headers: Any) -> dict[str, str | None]:
    """What says which version of a file a response (its headers) or a record (a dict) is."""
    return {"etag": headers.get("ETag"), "last_modified": headers.get("Last-Modified")}


def _same_version(record: dict[str, Any], now: dict[str, str | None]) -> bool | None:
    """Whether the server's validators name the version the cache recorded: the ETag where
    both have one, else the Last-Modified (a server with no ETags, as Python's http.server);
    None where neither tells. A shard replaced on the server often keeps its size (tar pads to
    10 KiB: a relabelled shard), so the size alone would keep the old one."""
    for key in ("etag", "last_modified"):
        if now[key] is not None and record.get(key) is not None:
            return now[key] == record[key]
    return None


def _file_sha256(path: Path) -> str:
    from torchkit.core.data.hashing import file_digest

    return file_digest(path).hex()


def _write_record(
    target: Path, url: str, size: int, digest: str, validators: dict[str, str | None]
) -> None:
    from torchkit.core.io.files import atomic_write_json

    record = {"url": _shown(url), "bytes": size, "sha256": digest, **validators}
    with _writing_the_cache():
        atomic_write_json(_record_path(target), record, indent=None)


def _download(
    url: str, target: Path, expected: dict[str, Any] | None, stop: threading.Event
) -> None:
    """`url` streamed into `target` through a temporary file, renamed once complete and
    checked; nothing under `target`'s name on any failure. A body that fits the cache's disk
    but not beside what the downloads in flight (of any process) claim of it (`_CLAIMS`) waits
    until enough of them ended for it to fit, and is asked for again (its size checked anew):
    its response is closed meanwhile (a server drops a connection left idle, and the body
    would end early)."""
    while True:
        waits = _download_once(url, target, expected, stop)
        if waits is None:
            return
        log.info("%s waits for room on the cache's disk (other downloads claim it)", _shown(url))
        _CLAIMS.wait_for_room(url, target.parent, *waits, stop)


def _download_once(
    url: str, target: Path, expected: dict[str, Any] | None, stop: threading.Event
) -> tuple[tuple[int, str], _Wait] | None:
    """`_download`'s one request: None once `target` is downloaded, or, where the body does
    not fit beside the downloads in flight, its size and what to wait on
    (`_Claims.wait_for_room`'s)."""
    from torchkit.core.io.files import atomic_write

    started = time.perf_counter()
    digest = hashlib.sha256()
    done = 0
    with _opened(url, "GET") as response:
        length = _content_length(response)
        want = expected["bytes"] if expected else None
        if want is not None and length is not None and length != want:
            raise _changed(url, f"the server has {length} bytes, manifest.json says {want}")
        checked = expected is not None and expected["sha256"] is not None
        # A body whose size the cache has no room for is refused before a byte of it is
        # written, not once it filled the disk. One of no size at all (no manifest.json size,
        # no Content-Length: close-delimited, chunked or encoded) is read up to that room: it
        # runs to its end, which an endless one never reaches.
        size = (want, "manifest.json gives it") if want is not None else None
        if size is None and length is not None:
            size = (length, "its Content-Length is")
        # The claim is owned (entered) before it is taken: taken first, a Ctrl-C before its
        # `with` (streamed shards download on the main thread) kept it for the process's life.
        # It ends after the temporary file is deleted: its room is never counted free while
        # the file still takes it.
        with _CLAIMS.claim(url, target.parent, size) as claim:
            waiting = claim.take(stop)
            if waiting is not None:
                assert size is not None  # a body of no size never waits
                return size, waiting
            what = f"{_shown(url)} into {target.parent}"
            begun = _folder_id(target.parent)
            if begun is None:  # deleted since its lock was taken: never made again here
                raise _cache_deleted(what)

            def whole_tar(temporary: Path) -> None:
                try:
                    _check_whole_tar(url, temporary)
                except InputError:  # "cannot read URL: No such file": the temporary deleted
                    if not os.path.lexists(temporary):
                        raise _cache_deleted(what) from None
                    raise

            try:
                with (
                    _reading(response, stop),
                    _writing_the_cache(),
                    atomic_write(target, "wb", check=None if checked else whole_tar) as handle,
                ):
                    while True:
                        if stop.is_set():
                            raise _Stopped
                        chunk = _read(response, url)
                        if not chunk:
                            break
                        if want is not None and done + len(chunk) > want:
                            # A body of no Content-Length that runs on (a close-delimited or
                            # chunked one): stopped here, not once it filled the disk, judged
                            # by the end.
                            raise _changed(url, f"the server sends more than {want} bytes")
                        claim.admit(len(chunk))
                        handle.write(chunk)
                        claim.wrote(len(chunk))
                        # Its folder deleted (`rm -rf` of the cache, its claim with it):
                        # written on, the temporary took room no claim shows, to be lost at
                        # the rename. (A stat of the folder: st_nlink is not kept alike by
                        # every file system. The temporary alone deleted, its claim still
                        # counts its room: found at the end, below. An fstat of it here would
                        # make NFS write out each MiB before the next is read.)
                        if _folder_id(target.parent) != begun:
                            raise _cache_deleted(what)
                        digest.update(chunk)
                        done += len(chunk)
                    if length is not None and done < length:
                        raise _short(url, done, length)
                    if want is not None and done != want:
                        raise _changed(url, f"{done} bytes downloaded, manifest.json says {want}")
                    if expected and expected["sha256"] and digest.hexdigest() != expected["sha256"]:
                        raise _changed(url, "its sha256 is not the one manifest.json records")
            except (OSError, TorchkitError) as error:
                # The cache deleted as the temporary was checked or renamed: the check's
                # "cannot read", the rename's FileNotFoundError, meant that. In the folder
                # still there, nothing else in this block raises FileNotFoundError: the
                # temporary was deleted before the rename.
                if _folder_id(target.parent) != begun or isinstance(error, FileNotFoundError):
                    raise _cache_deleted(what) from None
                raise
        validators = _validators(response.headers)
    _write_record(target, url, done, digest.hexdigest(), validators)
    seconds = time.perf_counter() - started
    log.info("downloaded %s (%.1f MB in %.1f s)", _shown(url), done / 1e6, seconds)
    return None


# The room a download leaves on the cache's disk: a twentieth of what is free, at most this
# (other programs, and the shard's record, still have somewhere to write).
_KEPT_FREE = 1 << 30
_NO_ROOM_HINT = f"{_CACHE_ROOM_HINT}; nothing of it was downloaded"  # a body of a known size


def _disk_room(folder: Path, written: int = 0) -> tuple[int, int] | None:
    """(the bytes the disk of the cache `folder` may still take, the bytes kept free): what
    it has free, plus `written` (bytes downloads in flight wrote into it, counted as free),
    less a twentieth of that, at most `_KEPT_FREE`; None where unknown (no statvfs: Windows)."""
    free = _free_bytes(folder)
    return None if free is None else _room_of(free + written)


def _room_of(free: int) -> tuple[int, int]:
    kept = min(free // 20, _KEPT_FREE)
    return free - kept, kept


def _too_large(
    url: str,
    size: tuple[int, str] | None,
    room: tuple[int, int] | None,
    limit: int | None,
    claimed: int = 0,
) -> InputError | None:
    """The error of a body of `size` (its bytes and what gives them; None: of no known size,
    stopped as it passes its bound) larger than the cache may take: $TORCHKIT_CACHE_LIMIT
    where it is the smaller bound, else the disk's `room` (`_disk_room`) less what the other
    downloads in flight `claimed` of it; None where it fits."""
    shown = _shown(url)
    disk = None if room is None else max(room[0] - claimed, 0)
    if limit is not None and (disk is None or limit <= disk):
        if size is not None and size[0] <= limit:
            return None
        setting = f"{CACHE_LIMIT_VARIABLE}={os.environ[CACHE_LIMIT_VARIABLE].strip()}"
        if size is None:
            return InputError(
                f"cannot download {shown}: it sends more than {limit} bytes with no "
                f"Content-Length, more than {setting} lets the cache hold",
                f"check the URL, or raise {CACHE_LIMIT_VARIABLE}; nothing of it was kept",
            )
        return InputError(
            f"cannot download {shown}: {size[1]} {size[0]} bytes, more than {setting} "
            f"({limit} bytes) lets the cache hold",
            f"raise {CACHE_LIMIT_VARIABLE}; nothing of it was downloaded",
        )
    if room is None or disk is None or (size is not None and size[0] <= disk):
        return None
    kept = f"keeping {room[1]} bytes free"
    if claimed:
        kept += f", {claimed} more claimed by the other downloads in flight"
    if size is None:
        return InputError(
            f"cannot download {shown}: it sends more than {disk} bytes with no "
            f"Content-Length, more than the cache's disk has room for ({kept})",
            f"check the URL, {_CACHE_ROOM_HINT}; nothing of it was kept",
        )
    return InputError(
        f"cannot download {shown}: {size[1]} {size[0]} bytes, more than the cache's disk has "
        f"room for ({disk} bytes, {kept})",
        _NO_ROOM_HINT,
    )


def _device(folder: Path) -> int:
    """The disk (device number) of the cache `folder`: downloads onto one share its room."""
    try:
        return os.stat(folder).st_dev
    except OSError:
        return -1


def _claims_folder(shard_folder: Path) -> Path:
    """Where downloads into the cache of `shard_folder` (CACHE/shards/<hash>,
    `shard_cache_folder`) show their claims to other processes: CACHE/.download-claims, a
    file per claim beside the `lock` that guards them all."""
    return shard_folder.parent.parent / ".download-claims"


# How often a download waiting for room that another process claims looks again: nothing tells
# a process that another's claim ended (its file deleted, or its process killed, which only lets
# go of the file's flock), and a thread blocked on that flock could not be woken by a stop. A
# look reads a few small files.
_CLAIM_POLL_S = 0.25


@dataclass(frozen=True)
class _Foreign:
    """Another process's claim on the cache's disk, as its file says."""

    size: int | None
    written: int

    @property
    def outstanding(self) -> int:
        return 0 if self.size is None else max(self.size - self.written, 0)


@dataclass(frozen=True)
class _Wait:
    """Why a body does not fit yet (`_Claims.take`): the count of this process's claims ended
    so far, and whether other processes' claims count too (looked at again every
    `_CLAIM_POLL_S`: their ends wake nothing here)."""

    ended: int
    polled: bool


@dataclass(eq=False)
class _Claim:
    """The room one download in flight claims on the cache's disk: its whole `size` (its bytes
    and what gives them) less what it `written` already (the disk's free room counts that),
    none for a body of no known size, which `admit` bounds as it comes instead. Entered as a
    context before it is taken (`take`): a stop at any moment after ends it."""

    claims: _Claims
    url: str
    folder: Path
    device: int
    size: tuple[int, str] | None
    written: int = 0
    # Its file in `_claims_folder(folder)` while taken (named before it is made: a stop between
    # the two still deletes it), the descriptor that holds the file's flock, and the record in
    # it but the bytes written, and its length (rewritten in place at that length under the
    # claims' lock: never read half written, never grown).
    file: Path | None = None
    fd: int | None = None
    record_head: bytes = b""
    record_bytes: int = 0
    # The stop of the download that took it (`take`): what ends a wait of `admit`'s.
    stop: threading.Event | None = None

    @property
    def outstanding(self) -> int:
        """The bytes it will still write: room it holds that the disk still shows free."""
        return 0 if self.size is None else max(self.size[0] - self.written, 0)

    def take(self, stop: threading.Event) -> _Wait | None:
        """`_Claims.take`."""
        return self.claims.take(self, stop)

    def admit(self, count: int) -> None:
        """Raise the error of a body of no known size whose next `count` bytes pass the room
        left beside the other downloads' claims ($TORCHKIT_CACHE_LIMIT, the disk's room)."""
        if self.size is None:
            self.claims.admit(self, count)

    def wrote(self, count: int) -> None:
        """`count` more bytes written: its file says so to other processes."""
        self.written += count
        _write_claim(self)

    def __enter__(self) -> _Claim:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.claims.release(self)


class _Claims:
    """The room on the cache's disk that the downloads in flight claim (their shards' sizes), so
    that several at once (`DOWNLOAD_THREADS`, streamed shards of two folders, torchrun's ranks,
    loader workers, two runs on one cache) never together take more than the disk has room for:
    each checked the same free room, and four shards of 0.4 of it each all began and filled the
    disk. A body that fits the disk but not beside the claims waits until enough of them ended
    for it to fit (the room a failed or stopped download frees, the margin a shorter free room
    keeps); one that cannot fit even with nothing else in flight is refused at once.

    This process's claims are held here; each is also a file in the cache's claims folder
    (`_claims_folder`), flocked by its process for as long as it holds it, so that other
    processes on the cache count it too. A flock, not a pid, tells a live claim: the kernel lets
    go of it when its process dies, however it dies (kill -9, the OOM killer); a pid may be
    reused, and a process in another container (pid namespace) that shares the cache sees other
    pids. A claim file no process holds is a dead process's, and is deleted whatever it holds;
    one held that cannot be read is an error naming it (the room it holds is unknown). The
    pid, host and URL in a claim file only say whose it is. Claims on one disk in two caches
    are seen by their own process alone."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """No claim held, none ended: a forked process's start (a loader worker). The claims
        it inherits are its parent's downloads, whose threads it lacks: never ended there, a
        download that waited for one waited for ever, and a lock one of them held at the fork
        stayed held. Its parent's claim files it counts as another process's, as long as the
        parent holds them."""
        self._changed = threading.Condition()
        self._held: list[_Claim] = []
        self._ended = 0  # claims ended so far: what a download waiting for room waits on

    def claim(self, url: str, folder: Path, size: tuple[int, str] | None) -> _Claim:
        """A claim, not taken yet, for a download of `url` into the cache `folder` of a body of
        `size` (None: of no known size): enter it, then `take` it inside."""
        return _Claim(self, url, folder, _device(folder), size)

    def take(self, claim: _Claim, stop: threading.Event) -> _Wait | None:
        """Take `claim` (None), or, where its body fits the disk but not beside the claims on
        it (this process's and others'), what to `wait_for_room` on; the error of a body
        larger than the cache may take (`_too_large`). Others' claims are read and this one
        made under the claims' lock, in one step: two processes never both take the room
        only one of them has."""
        limit = cache_limit()
        if stop.is_set():  # another download failed: no claim, no error of its own
            raise _Stopped
        # The claims' lock first, then this process's claims: a download waiting for the lock
        # holds nothing a stop (`wake`) or another download's end (`release`) needs.
        while True:
            try:
                with _claims_lock(claim.url, claim.folder, stop) as shared, self._changed:
                    foreign = _claims_of_others(claim, self._files()) if shared else []
                    size = claim.size
                    if size is not None and not self._fits(claim, size, limit, foreign):
                        return _Wait(self._ended, bool(foreign))  # the others will end
                    claim.stop = stop
                    if shared:
                        _make_claim_file(claim)
                    self._held.append(claim)
            except _ClaimsLockLost:  # taken beside another process's step: undone, and redone
                self.release(claim)
                continue
            return None

    def _files(self) -> set[str]:
        """The names of this process's claim files (not another process's claims)."""
        return {c.file.name for c in self._held if c.file is not None}

    def _fits(
        self, claim: _Claim, size: tuple[int, str], limit: int | None, foreign: list[_Foreign]
    ) -> bool:
        """Whether a body of `size` fits the disk of `claim`'s cache beside the claims on it
        (`foreign`: other processes'); the error of one that would not fit with nothing else
        in flight (what the others wrote so far freed too: their end may make room for it,
        else nothing will)."""
        others = [c for c in self._held if c.device == claim.device and c is not claim]
        free = _free_bytes(claim.folder)
        written = sum(c.written for c in others) + sum(f.written for f in foreign)
        alone = None if free is None else _room_of(free + written)
        error = _too_large(claim.url, size, alone, limit)
        if error is not None:
            raise error
        room = None if free is None else _room_of(free)
        claimed = sum(c.outstanding for c in others) + sum(f.outstanding for f in foreign)
        return _too_large(claim.url, size, room, limit, claimed) is None

    def admit(self, claim: _Claim, count: int) -> None:
        """`_Claim.admit`: the disk's room measured again each time, its own writes added back
        (what the others wrote meanwhile, or another program, is gone from it)."""
        limit = cache_limit()
        while True:
            with self._changed:
                claimed = sum(
                    c.outstanding for c in self._held if c.device == claim.device and c is not claim
                )
            try:
                with _claims_lock(
                    claim.url, claim.folder, claim.stop or threading.Event()
                ) as shared:
                    if shared:
                        # Named under the lock: a claim file of this process's made again
                        # (`_write_claim`) is not counted as another's.
                        with self._changed:
                            mine = self._files()
                        claimed += sum(f.outstanding for f in _claims_of_others(claim, mine))
            except _ClaimsLockLost:  # read beside another process's step: read again
                continue
            break
        room = _disk_room(claim.folder, claim.written)
        if _too_large(claim.url, (claim.written + count, ""), room, limit, claimed) is not None:
            raise _too_large(claim.url, None, room, limit, claimed)  # naming its bound

    def release(self, claim: _Claim) -> None:
        """End `claim` (its download done, failed or stopped; taken or not) and wake the
        downloads waiting."""
        with self._changed:
            _delete_claim_file(claim)
            if claim in self._held:
                self._held.remove(claim)
                self._ended += 1
                self._changed.notify_all()

    def wake(self) -> None:
        """Wake the downloads waiting for room: a stop was set."""
        with self._changed:
            self._changed.notify_all()

    def wait_for_room(
        self, url: str, folder: Path, size: tuple[int, str], waiting: _Wait, stop: threading.Event
    ) -> None:
        """Until a body of `size` that `take` let wait (`waiting`) fits beside the claims left,
        judged each time one of this process's ends and, while other processes' claims count,
        every `_CLAIM_POLL_S` (not asked for again after each: a large shard behind many small
        ones was), or would not fit even alone (asked for again: its size may have changed, and
        is the error's); `_Stopped` once `stop` is set (by `_stop_downloads`, which wakes it)."""
        limit = cache_limit()
        probe = self.claim(url, folder, size)
        ended, polled = waiting.ended, waiting.polled
        while True:
            with self._changed:  # let go of while the claims are looked at (`take`'s order)
                looked = False
                while not stop.is_set() and self._ended == ended and not looked:
                    looked = not self._changed.wait(_CLAIM_POLL_S if polled else None)
                if stop.is_set():
                    raise _Stopped
                ended = self._ended
            try:
                with _claims_lock(url, folder, stop) as shared, self._changed:
                    foreign = _claims_of_others(probe, self._files()) if shared else []
                    if self._fits(probe, size, limit, foreign):
                        return
            except (InputError, _ClaimsLockLost):  # no room even alone now, unreadable
                return  # claims, or read beside another process's step: the request made
                # again (its `take`) decides
            polled = bool(foreign)


_CLAIMS = _Claims()


def _claims_error(claim: _Claim, path: Path, error: OSError) -> TorchkitError:
    """The error of a claims folder or lock file at `path` that cannot be made or opened."""
    if as_write_error(error, path) is not None:  # a full or read-only cache
        return _unwritable_cache(f"{_shown(claim.url)} into {claim.folder}", error)
    return InputError(
        f"cannot use {path}, where downloads into the cache claim room on its disk: "
        f"{error.strerror or error}",
        "it must be a folder torchkit may write: remove what is there, or set TORCHKIT_CACHE "
        "to another folder",
    )


# This process's downloads take the claims' lock one at a time (`_claims_lock`): the lock
# file's flock is then waited for only while another process holds it. Made anew in a forked
# process (a thread of its parent may have held it at the fork).
_CLAIMS_LOCK_TAKEN = threading.Lock()
# How often a download waiting for the claims' lock looks again whether it was stopped (this
# process's other downloads hold it a few file reads), and whether another process let go of
# the lock file's flock: soon at first (it holds it a few file reads), then every 0.1 s at most
# (a process stopped with Ctrl-Z holds it until resumed).
_CLAIMS_LOCK_STEP_S = 0.01
_CLAIMS_LOCK_LONGEST_STEP_S = 0.1


class _ClaimsLockLost(Exception):
    """The claims' lock file was deleted while this process held it (a cleaner, `rm -rf` of
    the cache): another process may have made and locked a new one meanwhile, and read and
    made claims at the same time as this one. Raised as `_claims_lock` is left, or inside where
    the claims folder is found gone or a claim file made is found taken for dead: the step
    taken under it is undone and taken again."""


@contextlib.contextmanager
def _claims_lock(url: str, folder: Path, stop: threading.Event) -> Iterator[bool]:
    """The lock of the claims of the cache of `folder` (`_claims_folder`: made where missing),
    held inside; False: no flock on this platform (Windows) or the cache's file system
    (`_NO_FLOCK`), claims are this process's alone. `_Stopped` once `stop` is set while it
    waits (a thread blocked on a flock another process held could not be stopped: a Ctrl-C
    hung, as did the stop, whose `wake` waited on that thread); a wait longer than
    LOCK_WAIT_WARNING_S says who holds it."""
    taken, held = _CLAIMS_LOCK_TAKEN, False
    try:
        while not (held := taken.acquire(timeout=_CLAIMS_LOCK_STEP_S)):
            if stop.is_set():
                raise _Stopped
        with _claims_flock(url, folder, stop) as shared:
            yield shared
    finally:
        if held:
            taken.release()


@contextlib.contextmanager
def _claims_flock(url: str, folder: Path, stop: threading.Event) -> Iterator[bool]:
    """`_claims_lock`'s flock of the lock file, taken by one thread of this process at a time."""
    try:
        import fcntl  # noqa: F401  (whether the platform has flock at all)
    except ImportError:
        yield False
        return
    claims = _claims_folder(folder)
    probe = _Claim(_CLAIMS, url, folder, -1, None)  # names the download in an error
    path = claims / "lock"
    warn_at = time.monotonic() + LOCK_WAIT_WARNING_S
    while True:
        try:
            claims.mkdir(exist_ok=True)
        except FileNotFoundError:
            # The cache deleted whole (`rm -rf CACHE`) as a download ran, or before it began:
            # its download ends so. Not made again to hold just this lock file: an empty
            # cache folder of a lock file was left behind the error (a body of no size asks
            # here before each chunk).
            raise _cache_deleted(f"{_shown(url)} into {folder}") from None
        except OSError as error:
            # Made by another process, then deleted again (`rm -rf` of the cache) before
            # pathlib saw a folder there (and maybe made again since): made again. What
            # stays there but a folder (a file) is the error.
            raced = (
                isinstance(error, FileExistsError)
                and error.filename is not None
                and os.fspath(error.filename) == os.fspath(claims)  # not a parent's
            )
            if raced and (os.path.isdir(claims) or not os.path.lexists(claims)):
                continue
            raise _claims_error(probe, claims, error) from None
        try:
            fd = open_unshared(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:
            # The folder deleted since it was made (`rm -rf` of the cache; maybe made again
            # since by another process): made again. Not a link at `lock` to where nothing
            # is: that would be tried for ever.
            if isinstance(error, FileNotFoundError) and not os.path.islink(path):
                continue
            raise _claims_error(probe, path, error) from None
        try:  # False: a file system without flock, so none of the claims' files
            shared = _flock_polled(
                fd,
                stop,
                warn_at,
                f"waiting for another torchkit process that holds {path}, the lock of the "
                f"claims of room on the cache's disk ({_HELD_TILL}",
            )
        except BaseException as error:
            close_lock(fd)
            if isinstance(error, OSError):
                raise _claims_error(probe, path, error) from None
            raise
        # A lock file deleted while this one waited for it (a cleaner, `rm -rf` of the
        # cache): another process may hold the file there now, and both would read and make
        # claims at once, together claiming more room than the disk has. Lock that one.
        if not shared or _is_at(fd, path):
            break
        close_lock(fd)
    try:
        yield shared
        # Deleted while held: a process that came meanwhile made and locked a new one, and
        # read and made claims beside this one's. What this one read and made is not trusted.
        if shared and not _is_at(fd, path):
            raise _ClaimsLockLost
    finally:
        close_lock(fd)


def _claims_of_others(claim: _Claim, mine: set[str]) -> list[_Foreign]:
    """The claims live processes hold in the claims folder of `claim`'s cache, but this one's
    (`mine`), under `_claims_lock`. A claim file whose flock no process holds is a dead
    process's (or one just ended): deleted."""
    import fcntl

    claims = _claims_folder(claim.folder)
    try:
        names = os.listdir(claims)
    except FileNotFoundError:  # deleted, its lock file with it, while this one held it
        raise _ClaimsLockLost from None
    except OSError as error:
        raise _claims_error(claim, claims, error) from None
    found = []
    for name in names:
        if not name.endswith(".claim") or name in mine:
            continue
        path = claims / name
        try:
            fd = open_unshared(path, os.O_RDONLY)
        except FileNotFoundError:  # ended meanwhile: its process deletes it without the lock
            continue
        except OSError as error:
            raise _unreadable_claim(path, error.strerror or str(error)) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # its process holds it: a claim in flight
                held = _read_claim(fd, path)
                if held is not None:
                    found.append(held)
                continue
            with contextlib.suppress(OSError):
                os.unlink(path)
        finally:
            close_lock(fd)
    return found


def _unreadable_claim(path: Path, why: str) -> InputError:
    return InputError(
        f"cannot read {path}, the claim of room on the cache's disk of a torchkit process "
        f"downloading into it: {why}",
        "wait for the other torchkit runs on this cache to end, or set TORCHKIT_CACHE to "
        "another folder",
    )


def _read_claim(fd: int, path: Path) -> _Foreign | None:
    """The claim the file `path` (open as `fd`, held by its process) records: its size (None:
    a body of no known size) and the bytes written so far. None where it is empty: being made
    (made, flocked, then written, in one step under the claims' lock) by a process whose lock
    file was deleted while it held it, at the same moment as this one reads under another:
    one of the two finds its lock gone as it lets go of it, and takes its step again
    (`_ClaimsLockLost`), the other's claim then counted."""
    try:
        data = os.pread(fd, 1 << 16, 0)
        if not data:
            return None
        record = json.loads(data)
        size, written = record["size"], record["written"]
        if not (size is None or _is_index(size)) or not _is_index(written):
            raise ValueError
    except OSError as error:
        raise _unreadable_claim(path, error.strerror or str(error)) from None
    except (ValueError, KeyError, TypeError):
        raise _unreadable_claim(path, "it holds no claim torchkit wrote") from None
    return _Foreign(size, written)


def _claim_record(claim: _Claim) -> bytes:
    """What `claim`'s file holds: its size and the bytes written so far, which other processes
    read; its process, host and URL, which say whose it is. All but the bytes written is made
    once (rewritten after each chunk, the whole record made anew took most of the time)."""
    if not claim.record_head:
        import socket

        whose = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "url": _shown(claim.url)[:1000],
            "size": None if claim.size is None else claim.size[0],
        }
        claim.record_head = json.dumps(whose)[:-1].encode("utf-8") + b', "written": '
        claim.record_bytes = len(claim.record_head) + 24  # `written`'s 20 digits at most
    return (claim.record_head + b"%d}" % claim.written).ljust(claim.record_bytes)


def _make_claim_file(claim: _Claim) -> None:
    """`claim`'s file, flocked by this process (`open_unshared`: by no process it forks) and
    written, under `_claims_lock`: its name set first, so that a stop after still deletes it."""
    import fcntl

    claims = _claims_folder(claim.folder)
    claim.file = claims / f"{os.getpid()}-{os.urandom(8).hex()}.claim"
    try:
        try:
            claim.fd = open_unshared(claim.file, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileNotFoundError:  # the folder deleted, its lock file with it, while held
            raise _ClaimsLockLost from None
        try:
            fcntl.flock(claim.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: no process holds it
            taken_for_dead = not _is_at(claim.fd, claim.file)
        except BlockingIOError:
            taken_for_dead = True
        if taken_for_dead:
            # Another process read the claims as this one made it, before its flock (one of
            # the two under a claims' lock file deleted while held): it held the file's flock
            # to see whether its process lives, or, finding it free, deleted it (the claim
            # counted by no process). Made again, as a lock found lost (`take`'s step).
            raise _ClaimsLockLost
        os.pwrite(claim.fd, _claim_record(claim), 0)
    except OSError as error:
        _delete_claim_file(claim)
        raise _claims_error(claim, claims, error) from None


def _write_claim(claim: _Claim) -> None:
    """Rewrite `claim`'s file with the bytes it wrote, under the claims' lock (never read half
    written). Left as it was where it cannot be, or where the lock is held (the next chunk's
    rewrite says it; a download waited for the lock after each chunk, for ever where another
    process was stopped with it held): others then count more room claimed.

    A claim file deleted while its download runs (`rm -rf CACHE/.download-claims`, a user
    cleaning up: the claims folder, its lock file with it) is made again here, and the folder
    and lock file with it where they went too: the room it still claims was counted by no
    process, and a newcomer took it. Between the deletion and the download's next chunk (a
    MiB: a server that stalls holds it up to the timeout) a newcomer still sees no claim. A
    cache deleted whole is not made again (its download ends with "the cache was deleted")."""
    if claim.fd is None or claim.file is None:
        return
    import fcntl

    taken = _CLAIMS_LOCK_TAKEN
    if not taken.acquire(blocking=False):
        return
    try:
        with contextlib.suppress(OSError):  # BlockingIOError: another process holds it
            path = claim.file.with_name("lock")
            lost = not _is_at(claim.fd, claim.file)
            if lost:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(path.parent)  # not its parents: the cache deleted is not made
            lock = open_unshared(path, os.O_RDWR | (os.O_CREAT if lost else 0), 0o666)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # The lock file there, not one deleted as it was opened: under the new one,
                # another process may read this claim's file as it is rewritten.
                if not _is_at(lock, path):
                    return
                if lost:
                    _remake_claim_file(claim)
                else:
                    os.pwrite(claim.fd, _claim_record(claim), 0)
            finally:
                close_lock(lock)
    finally:
        taken.release()


def _remake_claim_file(claim: _Claim) -> None:
    """`claim`'s file made anew (`_make_claim_file`) under the claims' lock, its old one
    deleted meanwhile by another program; where that fails, the old one is kept (its flock
    held) and the next chunk's `_write_claim` tries again."""
    old_file, old_fd = claim.file, claim.fd
    claim.file = claim.fd = None
    try:
        _make_claim_file(claim)
    except (_ClaimsLockLost, TorchkitError):
        _delete_claim_file(claim)
        claim.file, claim.fd = old_file, old_fd
        return
    if old_fd is not None:
        close_lock(old_fd)


def _delete_claim_file(claim: _Claim) -> None:
    """Delete `claim`'s file, then let go of its flock: other processes count it no more."""
    if claim.file is not None:
        with contextlib.suppress(OSError):
            os.unlink(claim.file)
        claim.file = None
    if claim.fd is not None:
        fd, claim.fd = claim.fd, None
        close_lock(fd)


def _forget_downloads_in_flight() -> None:
    """A forked process's start (a loader worker): its parent's downloads in flight, whose
    threads it lacks, neither claim room (`_Claims.forget`) nor are read (`_READING`) there,
    and a lock one of those threads held at the fork is not held for ever."""
    global _READING_LOCK, _CLAIMS_LOCK_TAKEN
    _CLAIMS.forget()
    _READING.clear()
    _READING_LOCK = threading.Lock()
    _CLAIMS_LOCK_TAKEN = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows (no fork there)
    os.register_at_fork(after_in_child=_forget_downloads_in_flight)


def _check_whole_tar(url: str, temporary: Path) -> None:
    """A download manifest.json's sha256 does not check is a whole tar, or it is not kept: a
    server whose Content-Length is smaller than the shard (or that sends none and closes early)
    ends the body early with no error from HTTP."""
    from torchkit.core.data.sources.shards import DamagedTar, list_tar

    try:
        list_tar(str(temporary), whole=True)
    except InputError as error:
        named = f"{temporary} is "
        if not error.message.startswith(named):  # cannot read it back: the error it is
            message = error.message.replace(str(temporary), _shown(url))
            raise InputError(message, error.hint) from None
        what = "what arrived is " + error.message[len(named) :]
        if isinstance(error, DamagedTar):
            raise InputError(
                f"cannot download {_shown(url)}: {what}",
                "the server sent less than the whole shard, e.g. its Content-Length is too "
                "small; nothing of it was kept",
            ) from None
        raise InputError(f"cannot use {_shown(url)}: {what}", error.hint) from None


def _content_length(response: Any) -> int | None:
    """The Content-Length of the body as stored: None where the server encoded it (the length
    of the encoded body) or sends none."""
    if _encoding(response) is not None:
        return None
    text = (response.headers.get("Content-Length") or "").strip()
    return int(text) if text.isdigit() else None


def _read(response: Any, url: str) -> bytes:
    import http.client

    try:
        return response.read(_CHUNK)
    except http.client.IncompleteRead as error:
        expected = (error.expected or 0) + len(error.partial)
        raise _short(url, None, expected or None) from None
    except (OSError, http.client.HTTPException) as error:
        raise _network_error(url, error) from None


def _short(url: str, done: int | None, length: int | None) -> InputError:
    got = f" after {done} of {length} bytes" if done is not None and length else ""
    return InputError(
        f"cannot download {_shown(url)}: the connection ended early{got}",
        "try again: no part of it was kept",
    )


def _changed(url: str, why: str) -> InputError:
    return InputError(
        f"{_shown(url)} is not the shard manifest.json describes ({why})",
        "the shards on the server changed: serve them with their new manifest.json",
    )


# --- streaming the shards of a `convert shards` folder ----------------------------------------


def cache_limit() -> int | None:
    """The bytes the shards of one folder URL may take in the cache ($TORCHKIT_CACHE_LIMIT:
    `20GB`, `500MiB`...); None (unset or empty): no limit."""
    text = os.environ.get(CACHE_LIMIT_VARIABLE, "").strip()
    if not text:
        return None
    from torchkit.core.io.sizes import parse_size

    return parse_size(text, CACHE_LIMIT_VARIABLE)


@dataclass(frozen=True)
class _ShardSamples:
    """What manifest.json says of one shard's samples: their keys and image extensions, in
    member order, and their class indices (None: unlabelled)."""

    name: str
    bytes: int
    keys: list[str]
    extensions: list[str]
    labels: list[int | None]


def _manifest_samples(manifest: Any) -> list[_ShardSamples] | None:
    """The samples of each shard the parsed manifest.json lists, from its records alone
    (`convert shards` keeps them: positions `start` to `end` but the unreadable ones, keyed
    `{split}_{position:08d}` (`sample_...` for `shard-` shards), with `extensions` and
    `labels`); None where it lacks them, or they do not add up."""
    try:
        found = []
        for entry in manifest["shards"]:
            split, extensions, labels = entry["split"], entry["extensions"], entry["labels"]
            size, start, end = entry["bytes"], entry["start"], entry["end"]
            skipped = {skip["position"] for skip in entry.get("unreadable", [])}
            prefix = "sample" if split == "shard" else split
            keys = [f"{prefix}_{p:08d}" for p in range(start, end) if p not in skipped]
            if (
                not all(isinstance(n, int) and not isinstance(n, bool) for n in (size, start, end))
                or not re.fullmatch(rf"{re.escape(split)}-\d+\.tar", str(entry["name"]))
                or not len(keys) == len(extensions) == len(labels) == entry["samples"]
                or not all(isinstance(e, str) and _EXTENSION.fullmatch(e) for e in extensions)
                or not all(label is None or _is_index(label) for label in labels)
            ):
                return None
            found.append(_ShardSamples(entry["name"], size, keys, extensions, labels))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return found or None


_EXTENSION = re.compile(r"[a-z0-9]+")


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _streamed_source(
    spec: str, folder: _Folder, classes: Sequence[str] | None, allow_unlabelled: bool
) -> Any:
    """The data of a `convert shards` folder URL, listed from its manifest.json alone and
    read through `StreamedShards` (no shard downloaded yet); None when the manifest lacks
    the samples of its shards."""
    from torchkit.core.data.sources.shards import ShardSample, shards_source, split_by_name
    from torchkit.core.data.stored_image import StoredImage

    shards = _manifest_samples(folder.document)
    if shards is None:
        return None
    limit = cache_limit()
    largest = max(shard.bytes for shard in shards)
    if limit is not None and largest > limit:
        raise UsageError(
            f"{CACHE_LIMIT_VARIABLE}={os.environ[CACHE_LIMIT_VARIABLE].strip()} holds no "
            f"shard of {_shown(folder.url)}: the largest has {largest} bytes",
            f"allow at least {largest} bytes, better a few shards' worth",
        )
    names = [shard.name for shard in shards]
    carried = replace(folder, document=None)  # pickled into each loader worker
    reader = StreamedShards(carried, names, [shard.bytes for shard in shards], limit)
    found, paths = [], []
    for number, shard in enumerate(shards):
        for key, extension, label in zip(shard.keys, shard.extensions, shard.labels, strict=True):
            member = f"{key}.{extension}"
            found.append(ShardSample(shard.name, key, member, (number, member), None, label))
            paths.append(StoredImage(f"{shard.name}/{member}", reader, (number, member)))
    log.info(
        "streaming %d shards from %s through the cache %s (%s)",
        len(names),
        _shown(folder.url),
        folder.path,
        f"at most {limit} bytes" if limit is not None else "no size limit",
    )
    by_split = split_by_name(spec, names)
    return shards_source(
        spec, str(folder.path), found, paths, classes, allow_unlabelled, by_split=by_split
    )


def _stored_names(listing: Any) -> dict[str, str] | None:
    """Each path a shard's member unpacks to -> the name it is stored under, by the rule the
    shards on disk are read by (`_unpacked_path`), so a shard packed again as
    `/sample_00000000.png` (or `./`, `dog//x.png`) reads as on disk, and a member of a `..`
    part is none; None where every name is stored as it unpacks (read by its own name)."""
    from torchkit.core.data.sources.shards import _unpacked_path

    paths: dict[str, str] = {}
    respelled = False
    for name in listing.in_tar_order():
        path = _unpacked_path(name)
        respelled = respelled or path != name
        if path is not None:
            paths[path] = name  # stored again later: what tar -x leaves
    return paths if respelled else None


def _mark_used(target: Path) -> None:
    """Record a shard's last use, for the least recently used first, in its access time: its
    modification time says which version of it a reader listed (`check_unchanged`), also a
    run that reads the folder's shards through a pattern."""
    with contextlib.suppress(OSError):
        os.utime(target, ns=(time.time_ns(), target.stat().st_mtime_ns))


class ShardFetchError(StoredReadError):
    """A shard that cannot be fetched when an image of it is read (one error line, from a
    DataLoader worker too)."""


class StreamedShards:
    """Reads the members of the shards of one folder URL by (shard number, member name).

    A process fetches a shard into the cache the first time it reads from it (`_fetch_one`:
    the lock, checks and atomic download of every cached shard) and keeps it open for the next
    reads: as many shards as fit in the cache limit together, at most `_HELD_OPEN` (the oldest
    closed first), the shards of one window of train's order (`blocks`). With a cache limit, the
    least recently used shards of the folder are deleted to make room before a download, under
    a lock on the folder (so at most one download in flight adds to the limit), never one this
    process has open; one deleted under another process is read on through its open file, or
    fetched again. Picklable: each process keeps its own open files (keyed by pid)."""

    def __init__(
        self, folder: _Folder, names: Sequence[str], sizes: Sequence[int], limit: int | None
    ) -> None:
        self.folder = folder
        self.names = list(names)
        self.sizes = list(sizes)
        self.limit = limit
        self._pid = -1

    def __getstate__(self) -> dict:
        return {
            "folder": self.folder,
            "names": self.names,
            "sizes": self.sizes,
            "limit": self.limit,
        }

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["folder"], state["names"], state["sizes"], state["limit"])

    def __reduce__(self) -> tuple[Any, tuple[type, dict]]:
        # Unpickled as this process's reader of the same shards: a copy of its own for each
        # chunk of images a worker is sent listed its shard again (and kept it open: a
        # descriptor leaked a chunk), dataset-stats -j 2 of a folder URL of 40,000 images
        # in one shard 349 s, where the shard read locally took 7.
        return (kept_reader, (StreamedShards, self.__getstate__()))

    def release(self) -> None:
        """Close the shards this process holds open (a forked copy's are its parent's)."""
        if self._pid != os.getpid():
            return
        with self._lock:
            while self._held:
                fd, _ = self._held.popitem(last=False)[1]
                os.close(fd)

    def blocks(self, locators: Sequence[tuple[int, str]]) -> Blocks:
        """Each image's shard (numbered in order of first appearance) and its size: train's
        order takes as many shards at a time as fit in the cache limit together (all without
        a limit; `stored_image.read_blocks`), so that an epoch fetches each shard about once
        per process. Counted by the largest, one large shard among small ones made every
        window a single small shard."""
        from torchkit.core.data.stored_image import Blocks

        number: dict[int, int] = {}
        ids = [number.setdefault(shard, len(number)) for shard, _ in locators]
        if self.limit is None:
            return Blocks(ids, max(1, len(self.names)))
        window = max(1, self.limit // max(self.sizes))
        sizes = [self.sizes[shard] for shard in number]
        return Blocks(ids, window, sizes=sizes, capacity=self.limit)

    def _holds_beside(self, shard: int) -> bool:
        """Whether `shard` fits in the cache limit beside the shards this process holds open
        (the shards of a window of `blocks` do together)."""
        if self.limit is None:
            return True
        held = sum(self.sizes[number] for number in self._held)
        return held + self.sizes[shard] <= self.limit

    def read(self, locator: tuple[int, str]) -> bytes:
        from torchkit.core.data.sources.shards import NotRegularMember, _pread_all

        shard, member = locator
        fd, listing = self._open_shard(shard)
        try:
            if shard not in self._spellings:
                self._spellings[shard] = _stored_names(listing)
            paths = self._spellings[shard]
            where = listing.locator(member if paths is None else paths.get(member, ""))
            if where is None:
                raise OSError(f"{self.names[shard]} holds no {member} (manifest.json lists it)")
            if isinstance(where, NotRegularMember):
                raise where.error()
            if isinstance(where, str):  # a link out of the shard (`LEADS_OUT`)
                raise OSError(where)
            offset, size = where
            data = _pread_all(fd, offset, size)
        finally:
            os.close(fd)
        if len(data) < size:
            raise OSError(f"{self.names[shard]} is truncated at {member}")
        return data

    def _open_shard(self, shard: int) -> tuple[int, Any]:
        """A descriptor of the shard (the caller's to close) and its listing."""
        if self._pid != os.getpid():  # a new process (or a fork): no descriptor inherited
            for fd, _ in getattr(self, "_held", {}).values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._held: OrderedDict[int, tuple[int, Any]] = OrderedDict()
            self._listings: dict[int, Any] = {}
            self._spellings: dict[int, dict[str, str] | None] = {}  # `_stored_names`
        with self._lock:
            held = self._held.get(shard)
            if held is None:
                while self._held and (
                    len(self._held) >= _HELD_OPEN or not self._holds_beside(shard)
                ):
                    fd, _ = self._held.popitem(last=False)[1]
                    os.close(fd)
                held = self._held[shard] = self._fetched(shard)
            self._held.move_to_end(shard)
            return os.dup(held[0]), held[1]

    def _fetched(self, shard: int) -> tuple[int, Any]:
        """The shard fetched into the cache (unless there), opened and listed."""
        from torchkit.core.data.sources.shards import list_tar

        name = self.names[shard]
        target = self.folder.path / name
        url = f"{self.folder.url}/{quote(name)}{self.folder.query}"
        opened = self._open_if_cached(shard, url)
        if opened is not None:
            return opened
        stop = threading.Event()
        room = None
        if self.limit:  # the lock under which a download makes room in the cache
            what = f"a shard into {self.folder.path}"
            room = _locked(self.folder.path / ".limit.lock", stop, what)
        with room or contextlib.nullcontext():
            if self.limit is not None:
                self._make_room(shard)
            try:
                _fetch_one(url, self.folder, name, stop)
            except TorchkitError as error:  # no room on the cache's disk: the limit may leave it
                hint = error.hint
                if hint in (_CACHE_ROOM_HINT, _NO_ROOM_HINT):
                    hint = hint.replace(
                        _CACHE_ROOM_HINT,
                        f"{_CACHE_ROOM_HINT}, or {CACHE_LIMIT_VARIABLE} below the room it has",
                    )
                raise ShardFetchError(error.message, hint) from None
            _mark_used(target)
            fd = os.open(target, os.O_RDONLY)
            try:
                listing = self._listings.get(shard) or list_tar(str(target))
            except BaseException:
                os.close(fd)
                raise
        self._listings[shard] = listing
        return fd, listing

    def _open_if_cached(self, shard: int, url: str) -> tuple[int, Any] | None:
        """`_fetched`'s (descriptor, listing) if the cache holds the shard whole and current,
        else None, taking no lock: a shard is renamed into place complete, and one deleted
        after it is opened is read on through the descriptor. So a shard another process
        fetched opens while a download holds the cache limit's lock, instead of waiting."""
        from torchkit.core.data.sources.shards import list_tar

        name = self.names[shard]
        target = self.folder.path / name
        expected = self.folder.manifest.get(name)
        if not expected or expected["bytes"] is None:
            return None  # checked against the server (a HEAD): under the locks
        try:
            if not _is_current(url, target, expected, self.folder):
                return None
            fd = os.open(target, os.O_RDONLY)
        except OSError:  # not there, or deleted meanwhile: fetch it
            return None
        _mark_used(target)
        try:
            listing = self._listings.get(shard) or list_tar(str(target))
        except InputError:
            os.close(fd)
            if target.exists():
                raise  # a damaged shard: the error it is
            return None  # deleted before it was listed: fetch it
        except BaseException:
            os.close(fd)
            raise
        self._listings[shard] = listing
        return fd, listing

    def _make_room(self, shard: int) -> None:
        """Delete the least recently used shards of the folder (but those this process has
        open) until the shard fits within the limit beside the others, with their lock files
        and those of shards no longer cached (a lock file per shard ever fetched piled up)."""
        assert self.limit is not None
        name = self.names[shard]
        mine = {self.names[number] for number in self._held} | {name}
        cached = []
        locks = []
        for entry in os.scandir(self.folder.path):
            if _is_cached_shard(entry.name):
                with contextlib.suppress(FileNotFoundError):
                    info = entry.stat()
                    cached.append((info.st_atime, entry.name, info.st_size))
            elif _is_cached_shard(_locked_name(entry.name)):
                locks.append(_locked_name(entry.name))
        present = {entry_name: size for _, entry_name, size in cached}
        total = sum(present.values()) - present.get(name, 0) + self.sizes[shard]
        for _, other, size in sorted(cached):
            if total <= self.limit:
                break
            if other in mine:
                continue
            with contextlib.suppress(FileNotFoundError):
                remove_tree(self.folder.path / other, ignore_errors=False)
            with contextlib.suppress(FileNotFoundError):
                remove_tree(_record_path(self.folder.path / other), ignore_errors=False)
            total -= size
            log.info("%s: deleted %s from the cache to make room", CACHE_LIMIT_VARIABLE, other)
        for locked in locks:
            if locked != name and not (self.folder.path / locked).exists():
                _delete_lock(_lock_path(self.folder.path / locked))


# --- HTTP -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _opened(url: str, method: str) -> Iterator[Any]:
    """The response to `method` on `url` (200 only), with every socket operation timed."""
    import http.client
    import urllib.error
    import urllib.request

    from torchkit import __version__

    request = urllib.request.Request(
        _request_url(url),
        method=method,
        headers={"User-Agent": f"torchkit/{__version__}", "Accept-Encoding": "identity"},
    )
    credentials = _credentials(url)
    if credentials is not None:  # not sent on to where the server redirects, as curl does
        request.add_unredirected_header("Authorization", credentials)
    try:
        response = _url_opener().open(request, timeout=timeout_s())
    except urllib.error.HTTPError as error:
        error.close()
        raise _status_error(url, error.code, str(error.reason or ""), error.headers) from None
    except urllib.error.URLError as error:
        raise _network_error(url, error.reason, _redirected_to(request)) from None
    except (OSError, http.client.HTTPException, ValueError) as error:
        raise _network_error(url, error, _redirected_to(request)) from None
    with response:
        if response.status != 200:
            raise _HttpStatus(url, response.status, str(response.reason or ""))
        encoding = _encoding(response)
        if encoding is None:
            yield response
        elif encoding in _DECODED:
            yield _Decoded(response, encoding)
        else:
            raise InputError(
                f"cannot download {_shown(url)}: the server sent it encoded as {encoding}, "
                "which torchkit does not decode",
                "serve the file as stored without a Content-Encoding, or gzip-encoded",
            )


_OPENER: Any = None


def _url_opener() -> Any:
    """urllib's default opener (proxies from the environment...), but a redirected HEAD stays a
    HEAD: urllib follows it with a GET, which started sending the whole shard for each cache
    check where a server redirects (Hugging Face's `resolve/` URLs send every request to its
    CDN)."""
    global _OPENER
    if _OPENER is None:
        import urllib.request

        class KeepHead(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, req, fp, code, msg, headers, newurl):
                new = super().redirect_request(req, fp, code, msg, headers, newurl)
                if new is not None and req.get_method() == "HEAD":
                    new.method = "HEAD"
                return new

        _OPENER = urllib.request.build_opener(KeepHead)
    return _OPENER


# Content-Encodings a body is decoded from: what a server sends although asked for none (an S3
# object uploaded gzipped with that metadata), as a browser, curl --compressed or requests read.
_DECODED = ("gzip", "x-gzip", "deflate")


def _encoding(response: Any) -> str | None:
    """The response's Content-Encoding, lowercase; None for none (or identity)."""
    encoding = (response.headers.get("Content-Encoding") or "").strip().lower()
    return None if encoding in ("", "identity") else encoding


class _Decoded:
    """A response whose body `_DECODED` encodes, read decoded, at most `size` bytes a read (a
    small body may decode to gigabytes); a body that ends before its encoding does is a
    connection that ended early, and one that does not decode an error naming its encoding."""

    def __init__(self, response: Any, encoding: str) -> None:
        import zlib

        self.headers = response.headers
        self._response = response
        self._encoding = encoding
        self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)  # a gzip or zlib header

    def read(self, size: int) -> bytes:
        import http.client
        import zlib

        inflate = self._inflate
        while True:
            if inflate.unconsumed_tail:
                raw = inflate.unconsumed_tail
            elif inflate.eof:
                return b""
            else:
                raw = self._response.read(size)
                if not raw:
                    raise http.client.IncompleteRead(b"")
            try:
                data = inflate.decompress(raw, size)
            except zlib.error:
                raise OSError(f"its {self._encoding} encoding is damaged") from None
            if data:
                return data


def _request_url(url: str) -> str:
    """`url` as a request may carry it: a space or a non-ASCII letter in its path, query or
    fragment percent-encoded, as a browser does (http.client refuses them, its error showing
    the query); `%XX` already there kept; the host as typed, without `USER:PASSWORD@`
    (`_credentials`: http.client took it for part of the host, "cannot be found")."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    safe = "/%:@!$&'()*+,;=~[]"
    return urlunsplit(
        parts._replace(
            netloc=parts.netloc.rpartition("@")[2],
            path=quote(parts.path, safe=safe),
            query=quote(parts.query, safe=safe + "?"),
            fragment=quote(parts.fragment, safe=safe + "?"),
        )
    )


def _credentials(url: str) -> str | None:
    """The Basic Authorization header the `USER:PASSWORD@` of `url` gives (percent-encoded
    letters decoded, as curl and browsers read them), or None without one."""
    import base64
    from urllib.parse import unquote, urlsplit

    userinfo, at, _ = urlsplit(url).netloc.rpartition("@")
    if not at:
        return None
    user, _, password = userinfo.partition(":")
    pair = f"{unquote(user)}:{unquote(password)}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


class _HttpStatus(InputError):
    """A response other than 200 OK (`proxy`: the `_proxy_for` it came through, if any)."""

    def __init__(
        self, url: str, code: int, reason: str, proxy: tuple[str, str] | None = None
    ) -> None:
        if code == 403 and proxy is not None:  # a proxy's own 403 can look like the server's
            hint = (
                f"the server, or the proxy {proxy[0]} that {proxy[1]} names, refuses it: "
                "check the URL, that you may read it, and the proxy's rules"
            )
        elif code in (401, 403):
            hint = "the server refuses it: check the URL and that you may read it"
        elif code == 404 or code == 410:
            hint = "check the URL: {000000..000009} names every shard from the first to the last"
        elif code >= 500:
            hint = "the server failed: try again later"
        elif 300 <= code < 400:
            hint = "the server's redirects lead nowhere, in a loop or too many: check the URL"
        else:
            hint = "torchkit reads a shard from a 200 OK response"
        super().__init__(f"cannot download {_shown(url)}: {_status_text(code, reason)}", hint)
        self.code = code

    def __reduce__(self):
        return (InputError, (self.message, self.hint))


class _Unreachable(OfflineError):
    """No answer from the server for `url` (`shown`, as messages show it): `why` says what
    happened instead (no connection, no answer in time, a proxy's `_NO_ANSWER` `status`)."""

    def __init__(self, shown: str, why: str, hint: str, status: int | None = None) -> None:
        super().__init__(f"cannot download {shown}: {why}", hint)
        self.shown = shown
        self.why = why
        self.status = status

    def __reduce__(self):
        return (type(self), (self.shown, self.why, self.hint, self.status))


def _status_text(code: int, reason: str) -> str:
    """`HTTP 404 Not Found`: one line (urllib's redirect loop reason has three)."""
    return f"HTTP {code} {' '.join(reason.split())}".rstrip()


def _status_error(
    url: str, code: int, reason: str, headers: Any = None, tunnel: bool = False
) -> TorchkitError:
    """The error of an answer `code` other than 200 (`headers`: the response's): `_NO_ANSWER`'s,
    a proxy's 407, any answer to an https URL's tunnel (`tunnel`: the proxy's CONNECT) and one
    the proxy says it made itself (`_answered_by`) say no server answered."""
    proxy = _proxy_for(url)
    by = _answered_by(headers) if proxy is not None and not tunnel else None
    if by == "proxy":
        hint = (
            f"the proxy {proxy[0]} refuses to ask the server: check {proxy[1]}, no_proxy and "
            "the proxy's rules"
        )
        if code not in (407, *_NO_ANSWER):
            return _Unreachable(_shown(url), _status_text(code, reason), hint, code)
    if code == 407:  # urllib logs in with the USER:PASSWORD@ of the proxy's URL
        hint = "the proxy wants a login: put USER:PASSWORD@ before its host in https_proxy"
        hint = hint if tunnel else hint.replace("https_proxy", "http_proxy")
    elif code in _NO_ANSWER:
        hint = (
            "no server answered it: the server is down, or a proxy or gateway on the way "
            "cannot reach it; try again later"
        )
    elif tunnel:
        hint = "the proxy refuses to connect to the server: check https_proxy and no_proxy"
    else:  # the server's answer, or one a proxy's 403 cannot be told from
        return _HttpStatus(url, code, reason, None if by == "server" else proxy)
    return _Unreachable(_shown(url), _status_text(code, reason), hint, code)


def _answered_by(headers: Any) -> str | None:
    """Who made a response that came through a proxy, as far as it says: "proxy" where the
    proxy says it made it itself (an RFC 9209 `Proxy-Status` naming an `error`, sent with the
    errors a proxy generates, or squid's `X-Squid-Error`), "server" where the proxy says it
    passed on the server's (a `Proxy-Status` with `received-status` and no error), else None.
    A `Via` says neither: a proxy adds it to every answer it passes on, so without these a
    proxy's 403 cannot be told from the server's."""
    if headers is None:
        return None
    status = headers.get("Proxy-Status") or ""
    if headers.get("X-Squid-Error") or re.search(r";\s*error\s*=", status, re.IGNORECASE):
        return "proxy"
    if re.search(r";\s*received-status\s*=", status, re.IGNORECASE):
        return "server"
    return None


# How http.client raises a proxy's answer other than 200 to the CONNECT of an https URL.
_TUNNEL_REFUSED = re.compile(r"Tunnel connection failed: (\d{3})\b ?(.*)")


def _redirected_to(request: Any) -> str | None:
    """The URL a request's redirects led to last, None where it was not redirected (urllib
    keeps the URLs a chain of redirects visits, in order, in a dict the requests share)."""
    visited = getattr(request, "redirect_dict", None)
    return next(reversed(visited), None) if visited else None


def _network_error(url: str, reason: object, target: str | None = None) -> TorchkitError:
    """The error of a request for `url` that got no answer (`reason`); `target`: where the
    server redirected it, which gave none (the host named is the one that failed, never the
    server that answered with the redirect)."""
    error = _no_answer_error(target or url, reason)
    if target is None or not isinstance(error, _Unreachable):
        return error
    why = f"it redirects to {_shown(target)}, and {error.why}"
    return _Unreachable(_shown(url), why, error.hint, error.status)


def _no_answer_error(url: str, reason: object) -> TorchkitError:
    import socket
    import ssl
    from urllib.parse import urlsplit

    tunnel = _TUNNEL_REFUSED.match(str(reason)) if isinstance(reason, OSError) else None
    if tunnel is not None:  # the proxy's answer, as for an http URL
        return _status_error(url, int(tunnel[1]), tunnel[2], tunnel=True)
    shown = _shown(url)
    host = urlsplit(url).netloc.rpartition("@")[2]
    if isinstance(reason, TimeoutError):  # socket.timeout too
        return _Unreachable(
            shown,
            f"no answer within {timeout_s():g} s",
            "the server is unreachable or slow: try again, or allow more time with "
            "TORCHKIT_HTTP_TIMEOUT=SECONDS",
        )
    proxy = _proxy_for(url)
    if proxy is not None and isinstance(reason, socket.gaierror | ConnectionRefusedError):
        # The connection was the proxy's (also an https tunnel's): not the server's to fix.
        proxy_host, variable = proxy
        if isinstance(reason, ConnectionRefusedError):
            why = f"the proxy {proxy_host} refused the connection"
        else:
            why = f"the proxy host {proxy_host} cannot be found ({reason.strerror or reason})"
        return _Unreachable(shown, why, f"check the proxy {variable} names, and that it runs")
    if isinstance(reason, socket.gaierror):
        return _Unreachable(
            shown,
            f"the host {host} cannot be found ({reason.strerror or reason})",
            "check the URL and the network connection",
        )
    if isinstance(reason, ConnectionRefusedError):
        return _Unreachable(
            shown, f"{host} refused the connection", "check the URL and that the server runs"
        )
    if isinstance(reason, ssl.SSLError):
        return _Unreachable(
            shown,
            str(getattr(reason, "reason", None) or reason),
            "the server's certificate or TLS failed: check the URL",
        )
    text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
    return _Unreachable(shown, text, "check the URL and the network connection")


def _proxy_for(url: str) -> tuple[str, str] | None:
    """(HOST:PORT, the variable that names it) of the proxy a request for `url` goes through
    (`http_proxy`, `https_proxy`... as urllib's opener read them, less `no_proxy`'s hosts), or
    None: the proxy's own `USER:PASSWORD@` never shown."""
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    for handler in _url_opener().handlers:
        if isinstance(handler, urllib.request.ProxyHandler):
            proxy = handler.proxies.get(parts.scheme)
            host = parts.netloc.rpartition("@")[2]
            if not proxy or urllib.request.proxy_bypass(host):
                return None
            address = urlsplit(proxy if "://" in proxy else f"http://{proxy}").netloc
            return address.rpartition("@")[2], f"{parts.scheme}_proxy"
    return None


def _head(url: str) -> tuple[int | None, dict[str, str | None]]:
    """(Content-Length, `_validators`) a HEAD request gives, None where the server says none;
    (None, no validators) where it answers a HEAD with no 200: the shard is then downloaded
    again, and the GET says what is wrong, if anything (a presigned URL,
    `?X-Amz-Signature=...`, is signed for GET alone: S3 refuses its HEAD with 403; S3 slowing
    requests down answers 503)."""
    try:
        with _opened(url, "HEAD") as response:
            return _content_length(response), _validators(response.headers)
    except _HttpStatus:
        return None, _validators({})
    except _Unreachable as error:
        if error.status is None:  # no answer at all: the GET would get none either
            raise
        return None, _validators({})


def _get_small(url: str, absent: tuple[int, ...] = _ABSENT) -> bytes | None:
    """A small side file's bytes; None where the server has none (a status of `absent`: 401,
    403, 404, 410), or answers with an HTML page (a web app's "not found" sent as 200 OK: read
    as classes.txt, its lines named the classes)."""
    try:
        with _opened(url, "GET") as response:
            if response.headers.get_content_type() == "text/html":
                log.info("%s is an HTML page: read as absent", _shown(url))
                return None
            chunks, done = [], 0
            while chunk := _read(response, url):
                chunks.append(chunk)
                done += len(chunk)
                if done > _SIDE_FILE_BYTES:
                    raise InputError(
                        f"cannot download {_shown(url)}: it holds more than "
                        f"{_SIDE_FILE_BYTES >> 20} MiB, more than any side file of shards",
                        "check the URL: the server sends something else than the file",
                    )
            data = b"".join(chunks)
            length = _content_length(response)
            if length is not None and len(data) < length:
                raise _short(url, len(data), length)
            return data
    except _HttpStatus as error:
        if error.code in absent:
            return None
        raise
