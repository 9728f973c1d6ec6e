"""WebDataset shards for the shard tests: written with webdataset's own ShardWriter, and served by a
real local http.server that records what it was asked (data/test_shards_*.py)."""

from __future__ import annotations

import contextlib
import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def write_shards(pattern: str, folder: Path, *, maxcount: int) -> None:
    """webdataset's ShardWriter over `folder` (ROOT/<class>/<image>): KEY.png, KEY.cls, KEY.json."""
    import webdataset as wds

    with wds.ShardWriter(pattern, maxcount=maxcount, verbose=0) as sink:
        for label, name in enumerate(sorted(p.name for p in folder.iterdir())):
            for image in sorted((folder / name).iterdir()):
                sink.write(
                    {
                        "__key__": f"{name}_{image.stem}",
                        "png": image.read_bytes(),
                        "cls": label,
                        "json": {"label": name, "path": f"{name}/{image.name}"},
                    }
                )


class _Handler(SimpleHTTPRequestHandler):
    """Serves the folder; records (method, path) of every request; `/broken/NAME.tar` answers 200
    with a Content-Length and closes after half the bytes; `/status/CODE/NAME.tar` answers CODE."""

    def __init__(self, *args, requests: list, **kwargs) -> None:
        self.requests = requests
        super().__init__(*args, **kwargs)

    def log_message(self, *args) -> None:
        pass

    def _record(self) -> None:
        self.requests.append((self.command, self.path))

    def do_HEAD(self) -> None:
        self._record()
        super().do_HEAD()

    def do_GET(self) -> None:
        self._record()
        if self.path.startswith("/status/") and self.path.endswith(".tar"):
            self.send_error(int(self.path.split("/")[2]))
            return
        if self.path.startswith("/broken/") and self.path.endswith(".tar"):
            self.send_response(200)
            self.send_header("Content-Length", "20480")
            self.end_headers()
            self.wfile.write(bytes(10240))
            self.wfile.flush()
            self.close_connection = True
            return
        super().do_GET()


@contextlib.contextmanager
def serving(folder: Path, cache: Path, monkeypatch):
    """`http://127.0.0.1:PORT` serving `folder` (`.requests`: what it was asked), with
    torchkit's cache in `cache`, no cache limit and no proxy in the way."""
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("TORCHKIT_CACHE", str(cache))
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    requests: list[tuple[str, str]] = []
    handler = functools.partial(_Handler, requests=requests, directory=str(folder))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.requests = requests
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def shard_downloads(requests: list[tuple[str, str]]) -> list[str]:
    return sorted(path for method, path in requests if method == "GET" and path.endswith(".tar"))
