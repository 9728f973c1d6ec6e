"""WebDataset shards for the shard tests: written with webdataset's own ShardWriter, and served by a
real local http.server that records what it was asked, or cut off by a proxy that reaches no server
(data/test_shards_*.py)."""

from __future__ import annotations

import contextlib
import functools
import threading
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
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


class QuietFolderHandler(SimpleHTTPRequestHandler):
    """Serves its folder without a log line per request (the test's output stays its own)."""

    def log_message(self, *args) -> None:
        pass


class _Handler(QuietFolderHandler):
    """Serves the folder; records (method, path) of every request; `/broken/NAME.tar` answers 200
    with a Content-Length and closes after half the bytes; `/status/CODE/NAME.tar` answers CODE;
    `/lying/N/PATH.tar` answers the file PATH.tar whole with a Content-Length of N (GET and
    HEAD), and `/unsized/N/PATH.tar` its first N bytes with no Content-Length, then closes
    (other files under them: the file PATH, truthfully); `/gets-only/PATH` answers a GET with
    the file PATH and a HEAD with 403, as S3 does for a URL presigned for GET (`/busy-head/PATH`
    with 503, as S3 slowing requests down); `/loop/PATH`
    redirects (302) to itself, `/moved/PATH` (GET and HEAD) to `/PATH`; `/spa/PATH` the file
    PATH, or where there is none a 200 OK HTML page, as a web app does; `/gzip/PATH` the file
    PATH gzipped, with `Content-Encoding: gzip` (GET and HEAD, as S3 serves an object stored
    so), and `/gzip-cut/PATH.tar` the first
    half of that, its Content-Length saying so; `/auth/PATH` the file PATH to a request with
    the Basic credentials `me:p w`, else 401."""

    def __init__(self, *args, requests: list, **kwargs) -> None:
        self.requests = requests
        super().__init__(*args, **kwargs)

    def _record(self) -> None:
        self.requests.append((self.command, self.path))

    def _lie(self, body: bool) -> bool:
        """Answer a `/lying/` or `/unsized/` request; False for any other."""
        kind, _, rest = self.path.lstrip("/").partition("/")
        if kind not in ("lying", "unsized"):
            return False
        count, _, path = rest.partition("/")
        if not path.endswith(".tar"):  # classes.txt, manifest.json: served as they are
            self.path = "/" + path
            return False
        data = (Path(self.directory) / path).read_bytes()
        self.send_response(200)
        if kind == "lying":
            self.send_header("Content-Length", count)
        self.end_headers()
        if body:
            self.wfile.write(data if kind == "lying" else data[: int(count)])
            self.wfile.flush()
        self.close_connection = True
        return True

    def _gzipped(self, body: bool) -> bool:
        """Answer a `/gzip/` or `/gzip-cut/` request; False for any other."""
        import gzip

        kind, _, path = self.path.lstrip("/").partition("/")
        if kind not in ("gzip", "gzip-cut"):
            return False
        file = Path(self.directory) / path.split("?")[0]
        if not file.is_file():
            self.send_error(404)
            return True
        data = gzip.compress(file.read_bytes(), mtime=0)
        if kind == "gzip-cut" and file.suffix == ".tar":
            data = data[: len(data) // 2]
        self.send_response(200)
        self.send_header("Content-Encoding", "gzip")
        self.send_header("ETag", f'"{len(data)}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
        return True

    def _refused(self) -> bool:
        """Answer a `/auth/` request without its credentials (401); serve the others."""
        if not self.path.startswith("/auth/"):
            return False
        self.path = self.path.removeprefix("/auth")
        if self.headers.get("Authorization") == "Basic bWU6cCB3":  # me:p w
            return False
        self.send_error(401)
        return True

    def _moved(self) -> bool:
        """Answer a `/moved/` request with a redirect to the file; False for any other."""
        if not self.path.startswith("/moved/"):
            return False
        self.send_response(302)
        self.send_header("Location", self.path.removeprefix("/moved"))
        self.end_headers()
        return True

    def do_HEAD(self) -> None:
        self._record()
        if self._refused() or self._moved():
            return
        if self.path.startswith("/gets-only/"):
            self.send_error(403)
            return
        if self.path.startswith("/busy-head/"):
            self.send_error(503)
            return
        if not self._gzipped(body=False) and not self._lie(body=False):
            super().do_HEAD()

    def do_GET(self) -> None:
        self._record()
        if self._refused() or self._moved() or self._gzipped(body=True):
            return
        self.path = self.path.removeprefix("/gets-only").removeprefix("/busy-head")
        if self.path.startswith("/spa/"):
            self.path = self.path.removeprefix("/spa")
            if not Path(self.translate_path(self.path)).is_file():
                page = b"<!doctype html>\n<html>\n<body>\n<p>Not here</p>\n</body>\n</html>\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return
        if self.path.startswith("/loop/"):
            self.send_response(302)
            self.send_header("Location", self.path)
            self.end_headers()
            return
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
        if not self._lie(body=True):
            super().do_GET()


@contextlib.contextmanager
def serving(folder: Path, cache: Path, monkeypatch, port: int = 0):
    """`http://127.0.0.1:PORT` serving `folder` (`.requests`: what it was asked), with
    torchkit's cache in `cache`, no cache limit and no proxy in the way; `port`: that of a
    server stopped before (the same URLs), else any free one."""
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("TORCHKIT_CACHE", str(cache))
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    requests: list[tuple[str, str]] = []
    handler = functools.partial(_Handler, requests=requests, directory=str(folder))
    with running_server(handler, requests, port) as httpd:
        yield httpd


@contextlib.contextmanager
def running_server(handler, requests: list | None = None, port: int = 0):
    """A ThreadingHTTPServer of `handler` on 127.0.0.1 (`.url`, `.requests`), stopped after:
    the real HTTP source of every test that serves something."""
    httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.requests = [] if requests is None else requests
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def shard_downloads(requests: list[tuple[str, str]]) -> list[str]:
    return sorted(path for method, path in requests if method == "GET" and path.endswith(".tar"))


class _Gateway(BaseHTTPRequestHandler):
    """A proxy that reaches no server: every request answered with the status `status` (and the
    headers `extra`)."""

    def __init__(self, *args, status: int, requests: list, extra: dict, **kwargs) -> None:
        self.status = status
        self.requests = requests
        self.extra = extra
        super().__init__(*args, **kwargs)

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.requests.append((self.command, self.path))  # a proxy is asked for the whole URL
        if not self.extra:
            self.send_error(self.status)
            return
        self.send_response(self.status)
        for name, value in self.extra.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_CONNECT = do_GET  # CONNECT: an https URL's tunnel


@contextlib.contextmanager
def failing_proxy(status: int, monkeypatch, headers: dict | None = None):
    """A real local HTTP proxy (`http_proxy` and `https_proxy`, as urllib reads them) that
    answers every request (an https URL's CONNECT too) with `status` (502 Bad Gateway...), as
    one does whose way to the server is cut, with `headers` if given; `.requests`: what it was
    asked."""
    from torchkit.core.data.sources import http_shards

    requests: list[tuple[str, str]] = []
    handler = functools.partial(_Gateway, status=status, requests=requests, extra=headers or {})
    with running_server(handler, requests) as httpd:
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        for name in ("http_proxy", "https_proxy"):
            monkeypatch.setenv(name, httpd.url)
        # urllib's opener reads the proxies once, when it is built: built again with this one.
        monkeypatch.setattr(http_shards, "_OPENER", None)
        yield httpd
