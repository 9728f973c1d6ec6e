"""`--weights DEFAULT` whose server answers but has no such file (HTTP 404): the error said
"connect to the internet once", as if offline, where the machine was online and the file was
not there. It now names the URL and the status; other statuses say the server refused. A real
local HTTP server answers (torch.hub's downloads and the Hugging Face Hub's client alike)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
import torchvision
from output_checks import error_line
from processes import run_torchkit_in_process
from shards import running_server

from torchkit.core.io.errors import InputError, OfflineError
from torchkit.core.models import hub_cache, resolve_model


class _Answers(BaseHTTPRequestHandler):
    """Every request answered with the status `server.status` and no body."""

    def do_GET(self) -> None:
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def answering(status: int, monkeypatch) -> Iterator[str]:
    """`http://127.0.0.1:PORT`, a server answering every request with `status`, reached
    directly (no proxy in the way) while the block runs."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")
    with running_server(_Answers) as server:
        server.status = status  # read by the handler, asked only once the block runs
        yield server.url


@pytest.fixture
def resnet18_weights_at(monkeypatch, tmp_path):
    """Point torchvision's resnet18 DEFAULT weights at `URL` (an empty torch.hub cache)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    weights = torchvision.models.ResNet18_Weights.DEFAULT.value

    def point(url: str) -> str:
        monkeypatch.setattr(weights, "url", url)
        return url

    return point


def test_a_weights_file_the_server_has_not_is_named_not_taken_for_offline(
    monkeypatch, tmp_path, resnet18_weights_at
):
    cache = tmp_path / "torch" / "hub" / "checkpoints"
    with answering(404, monkeypatch) as server:
        url = resnet18_weights_at(f"{server}/models/resnet18-f37072fd.pth")
        refused = run_torchkit_in_process("summary", "resnet18", "--weights", "DEFAULT")
    assert refused.returncode == 1, refused.stderr
    assert error_line(refused.stderr, besides="nothing") == (
        f"Error: cannot download the DEFAULT weights of resnet18: the server has no file at "
        f"{url} (HTTP 404 Not Found) (if you have the file, save it as "
        f"{cache / 'resnet18-f37072fd.pth'}; or pass --weights PATH to a local file)"
    )
    assert not any(cache.iterdir())  # nothing half-written


@pytest.mark.parametrize(
    ("status", "error", "words"),
    [
        (404, InputError, "the server has no file at {url} (HTTP 404 Not Found)"),
        (503, OfflineError, "the server refused {url} (HTTP 503 Service Unavailable)"),
    ],
)
def test_a_status_the_download_itself_meets_is_said_as_such(
    monkeypatch, resnet18_weights_at, status, error, words
):
    """The probe said the server answers (a HEAD it serves, say); torch.hub's download then
    met the status: `connect to the internet once` was the hint."""
    monkeypatch.setattr(hub_cache, "_unreachable", lambda url: None)
    with answering(status, monkeypatch) as server:
        url = resnet18_weights_at(f"{server}/models/resnet18-f37072fd.pth")
        with pytest.raises(error) as caught:
            resolve_model("resnet18", weights="DEFAULT")
    assert caught.value.message == (
        "cannot download the DEFAULT weights of resnet18: " + words.format(url=url)
    )
    assert "internet" not in str(caught.value) and "--weights PATH" in caught.value.hint


def test_timm_weights_the_hub_has_not_are_named_not_taken_for_offline(monkeypatch, tmp_path):
    """A Hub that answers 404 (no such repository or file): "they are not in the cache and the
    Hub cannot be reached (connect to the internet once ...)"."""
    from huggingface_hub import constants

    with answering(404, monkeypatch) as endpoint:
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        with pytest.raises(InputError) as caught:
            resolve_model("timm/test_resnet", weights="DEFAULT")
    message = caught.value.message
    assert message.startswith(
        f"cannot download the pretrained weights of timm/test_resnet: the Hub has no file at "
        f"{endpoint}/timm/test_resnet."
    )
    assert message.endswith("(HTTP 404)") and "internet" not in str(caught.value)


def test_the_offline_hint_names_the_weights_cache_torch_uses(monkeypatch, tmp_path):
    """XDG_CACHE_HOME (no TORCH_HOME) moves torch.hub's cache: the hint names that folder."""
    monkeypatch.delenv("TORCH_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(hub_cache, "_unreachable", lambda url: "[Errno 111] Connection refused")
    with pytest.raises(OfflineError) as caught:
        resolve_model("resnet18", weights="DEFAULT")
    cache = tmp_path / "xdg" / "torch" / "hub" / "checkpoints"
    url = torchvision.models.ResNet18_Weights.DEFAULT.url
    assert caught.value.hint == (
        f"connect to the internet once, or save {url} in the weights cache {cache}; or pass "
        "--weights PATH to a local file"
    )
