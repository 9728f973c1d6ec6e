"""Shards on a web server that redirects them elsewhere (a CDN, a presigned store) where nothing
answers: the error named the server that did answer, with the redirect, as the host that
"refused the connection", so a user checked the wrong server; now it names where the redirect
led (its secrets hidden, as every URL a message shows) and the host that failed there."""

from __future__ import annotations

import contextlib
import socket
from http.server import BaseHTTPRequestHandler

from output_checks import error_line
from processes import run_torchkit_in_process
from shards import running_server


def closed_port() -> int:
    """A port of 127.0.0.1 nobody listens on (taken from the system, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def redirecting_to(target: str):
    """A real local http.server answering every GET and HEAD with a 302 to `target` + path."""

    class Redirect(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

    with running_server(Redirect) as server:
        yield server.url


def test_a_redirect_to_where_nobody_answers_names_that_host_not_the_server(tmp_path, monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("TORCHKIT_CACHE", str(tmp_path / "cache"))
    away = f"127.0.0.1:{closed_port()}"
    with redirecting_to(f"http://{away}/store") as server:
        url = f"{server}/d/shard-{{000000..000001}}.tar?token=SECRET"
        result = run_torchkit_in_process("dataset-stats", url, "--workers", "0")
    assert result.returncode != 0
    line = error_line(result.stderr)
    served = server.removeprefix("http://")
    assert line.startswith(f"Error: cannot download {server}/d/")
    assert f"it redirects to http://{away}/store/d/" in line
    assert f"{away} refused the connection" in line
    assert f"{served} refused" not in line
    assert "SECRET" not in result.stderr
