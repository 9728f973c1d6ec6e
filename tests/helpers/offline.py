"""No network, for sure: every download through a proxy at a local port nothing listens on
(refused at once, as with no network, whether or not this machine has one), and empty homes
and caches (torch.hub's, Hugging Face's) for a torchkit process a test starts."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")


@contextlib.contextmanager
def unreachable_proxy() -> Iterator[str]:
    """`http://127.0.0.1:PORT` of a port held bound but not listening while the block runs (so
    that no other program takes it): every connection to it is refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


def offline_env(proxy: str, home: Path) -> dict[str, str]:
    """The environment of a process with no way out (urllib's and huggingface_hub's proxies:
    `proxy`, no host exempted) and every cache empty, under `home`."""
    env = dict.fromkeys(PROXY_VARIABLES, proxy)
    env.update(no_proxy="", NO_PROXY="", HF_HUB_OFFLINE="0")
    env.update(HOME=str(home), TORCH_HOME=str(home / "torch"), HF_HOME=str(home / "hf"))
    env.update(XDG_CACHE_HOME=str(home / "cache"))
    return env
