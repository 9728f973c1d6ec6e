"""A shard served with no Content-Length (a close-delimited body) that runs on past the size
manifest.json gives it was downloaded to its end, into the cache's disk, and judged only then:
one that never ends filled the disk. It is stopped as it passes that size."""

from __future__ import annotations

import functools
import io
import json
import tarfile
import threading
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

from output_checks import error_line
from parquet_files import png
from processes import run_torchkit_in_process
from shards import running_server

CHUNK = 1 << 16
ENDLESS = 64 << 20  # the zeros sent after the shard, if the client reads on


class _EndlessShards(SimpleHTTPRequestHandler):
    """Serves its folder; a `.tar` whole, with no Content-Length, and then ENDLESS bytes of
    zeros (`sent`: how many of them went out), `finished` set once it stops."""

    def __init__(self, *args, sent: list[int], finished: threading.Event, **kwargs) -> None:
        self.sent, self.finished = sent, finished
        super().__init__(*args, **kwargs)

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if not self.path.endswith(".tar"):
            super().do_GET()
            return
        data = Path(self.translate_path(self.path)).read_bytes()
        self.send_response(200)  # HTTP/1.0, no Content-Length: the body ends with the connection
        self.end_headers()
        try:
            self.wfile.write(data)
            for _ in range(ENDLESS // CHUNK):
                self.wfile.write(bytes(CHUNK))
                self.sent[0] += CHUNK
        except OSError:  # the client hung up
            pass
        finally:
            self.close_connection = True
            self.finished.set()


def test_a_body_that_runs_past_the_manifests_size_is_stopped_there(tmp_path, monkeypatch):
    served = tmp_path / "served"
    served.mkdir()
    shard = served / "s-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for member, data in (("k0.png", png(0)), ("k0.cls", b"0")):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    size = shard.stat().st_size
    (served / "manifest.json").write_text(
        json.dumps({"shards": [{"name": shard.name, "bytes": size}]})
    )
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("TORCHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHKIT_CACHE_LIMIT", raising=False)
    sent, finished = [0], threading.Event()
    handler = functools.partial(_EndlessShards, sent=sent, finished=finished, directory=str(served))
    with running_server(handler) as server:
        url = f"{server.url}/{shard.name}"
        result = run_torchkit_in_process("dataset-stats", url, "--workers", "0")
        assert finished.wait(10)
    assert result.returncode == 1, result.stdout
    assert error_line(result.stderr) == (
        f"Error: {url} is not the shard manifest.json describes (the server sends more than "
        f"{size} bytes) (the shards on the server changed: serve them with their new "
        "manifest.json)"
    )
    # Stopped at the size, not at the body's end: what went out is what the sockets buffer.
    assert sent[0] < ENDLESS // 4
    cached = [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert not [name for name in cached if name.startswith(shard.name)], cached
