"""The helper process that fetches streamed shards ahead of a command's readers: the service
`http_shards.StreamedShards.fetch_ahead` sends its requests to (`core.runtime.helper_process`,
never answered). See `http_shards`' docstring.

Each request names one shard to fetch (its folder URL and cache folder, name, size, the
manifest's record of it, the cache limit) and, under a cache limit, `keep`: the shards the
command's readers may still use; a request without a shard only updates `keep`. A thread
fetches the shards in the order asked through `http_shards._fetch_one` (a reader that needs
one being fetched waits on its lock for this download), each after the latest requests are
read, so that room is made with the newest `keep`. A shard the limit cannot hold beside `keep`
waits for the next request; a request of an older epoch that was not fetched is dropped when
a newer epoch's arrives. Errors are ignored: the reader that needs the shard fetches it and
reports why. When stdin closes, `finish` gives up the download in flight (its temporary file
deleted) before the helper exits.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

# The longest wait for the download in flight to give up once stdin closed (the command
# kills the helper a little later).
_FINISH_WAIT_S = 4.0

_arrived: list[dict[str, Any]] = []  # requests read, not yet taken by the fetching thread
_changed = threading.Condition()
_stop = threading.Event()
_thread: threading.Thread | None = None


def prepare() -> None:
    """Start the fetching thread (its imports: the HTTP client's)."""
    global _thread
    _thread = threading.Thread(target=_fetch_in_order, name="fetch-ahead", daemon=True)
    _thread.start()


def answer(request: dict[str, Any]) -> None:
    with _changed:
        _arrived.append(request)
        _changed.notify()


def finish() -> None:
    _stop.set()
    with _changed:
        _changed.notify()
    if _thread is not None:
        _thread.join(_FINISH_WAIT_S)


def _fetch_in_order() -> None:
    from torchkit.core.data.sources import http_shards

    pending: list[dict[str, Any]] = []  # the shards asked for and not fetched, in order
    keep: list[str] = []
    epoch = None
    refused = False  # the first pending shard does not fit: wait for the next request
    while True:
        with _changed:
            while not (_arrived or (pending and not refused) or _stop.is_set()):
                _changed.wait()
            if _stop.is_set():
                return
            arrived = _arrived[:]
            _arrived.clear()
        for request in arrived:
            refused = False
            if request.get("epoch") != epoch:
                epoch = request.get("epoch")
                pending.clear()
            keep = request.get("keep", keep)
            if "name" in request:
                pending.append(request)
        if pending and not refused:
            try:
                fetched = _fetch(http_shards, pending[0], keep)
            except http_shards._Stopped:
                return
            except Exception:  # noqa: BLE001 - the reader that needs it fetches it and reports
                fetched = True
            if fetched:
                pending.pop(0)
            else:
                refused = True


def _fetch(http_shards: Any, request: dict[str, Any], keep: list[str]) -> bool:
    """Whether the shard of `request` is in the cache now (False: the limit cannot hold it
    beside `keep`)."""
    path, name, limit = Path(request["path"]), request["name"], request.get("limit")
    expected = request.get("expected")
    folder = http_shards._Folder(
        request["url"], request["query"], path, {name: expected} if expected else {}
    )
    room = http_shards._locked(path / ".limit.lock", _stop) if limit else None
    with room or contextlib.nullcontext():
        return http_shards._fetch_within_limit(
            folder, name, request["size"], limit, keep, _stop, only_within=True
        )
