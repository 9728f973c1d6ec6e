"""torch.hub's weights cache (`$TORCH_HOME/hub/checkpoints`, else under `$XDG_CACHE_HOME` or
`~/.cache/torch`), where torchvision's weights and timm's that are not on the Hugging Face Hub
are downloaded once and then read.

torch.hub prints `Downloading: "https://..."` before it even connects: offline, a user saw a
download start, then torchkit's error. `require_downloadable` decides first, without printing:
a file already cached is read as it is; otherwise the cache must be writable and the server
must answer one quick request, else the command ends in one error line naming the file and
where to put it."""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request

from torchkit.core.io.errors import (
    CheckpointError,
    InputError,
    OfflineError,
    OutputWriteError,
    TorchkitError,
)

# How long the one probe of the download server waits for an answer before taking it for
# unreachable (a refused connection or an unknown host fail at once).
PROBE_TIMEOUT_S = 5.0

# HTTP statuses that say the server has no such file: going online would not help.
NOT_THERE_STATUSES = (404, 410)


def hub_checkpoints_dir() -> str:
    """The folder torch.hub keeps downloaded weights in."""
    import torch.hub

    return os.path.abspath(os.path.join(torch.hub.get_dir(), "checkpoints"))


def cached_weights_file(url: str) -> str:
    """Where torch.hub keeps (or will keep) the file `url` downloads: the URL's file name."""
    return os.path.join(hub_checkpoints_dir(), os.path.basename(urllib.parse.urlparse(url).path))


def require_downloadable(url: str, what: str) -> None:
    """Nothing when `url`'s file is in torch.hub's cache, or can be downloaded into it; else an
    OutputWriteError (a cache that cannot be made or written), an OfflineError (the server
    gives no answer) or an InputError (it answers that it has no such file, 404) that names
    `what` (`the DEFAULT weights of resnet18`), with nothing printed and nothing written."""
    cached = cached_weights_file(url)
    if os.path.isfile(cached):
        return
    folder = os.path.dirname(cached)
    try:
        os.makedirs(folder, exist_ok=True)  # as torch.hub makes it
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".torchkit-probe-"):
            pass  # torch.hub writes the download to a temporary file there
    except OSError as error:
        cache_error = weights_cache_error(error)
        if cache_error is None:
            raise
        raise cache_error from error
    try:
        reason = _unreachable(url)
    except urllib.error.HTTPError as error:  # no such file there
        raise http_status_error(error, url, what) from error
    if reason is not None:
        raise OfflineError(
            f"cannot download {what}: {urllib.parse.urlparse(url).netloc} cannot be reached "
            f"({reason})",
            f"connect to the internet once, or save {url} in the weights cache {folder}; "
            "or pass --weights PATH to a local file",
        )


def refuse_damaged_cached_file(url: str, what: str) -> None:
    """A CheckpointError naming `url`'s cached file when it is not the file its name promises
    (torch.hub's names carry the first hex digits of the file's SHA-256, checked only when it
    downloads): a copy cut short or put there by hand failed to load with pickle's or zip's
    words and no path. Nothing when it is whole, missing, or its name carries no hash; called
    once the load has failed, so the file is read through only then."""
    cached = cached_weights_file(url)
    named = re.search(r"-([a-f0-9]+)\.", os.path.basename(cached))  # torch.hub.HASH_REGEX
    if named is None or not os.path.isfile(cached):
        return
    digest = hashlib.sha256()
    with open(cached, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest().startswith(named.group(1)):
        return
    raise CheckpointError(
        f"the cached file of {what} is damaged: {cached} (its SHA-256 does not begin with "
        f"{named.group(1)}, as its name says)",
        f"delete it so that it is downloaded again, or save {url} there whole",
    )


def weights_cache_error(error: BaseException) -> OutputWriteError | None:
    """The weights cache that cannot be made or written, when `error` is about it (a read-only
    or missing home was "Error: FileNotFoundError: ..." or taken for being offline); None for an
    error about anything else."""
    filename = getattr(error, "filename", None)
    if not isinstance(error, OSError) or filename is None:
        return None
    cache = hub_checkpoints_dir()
    named = os.path.abspath(os.fsdecode(filename))
    if not (named == cache or cache.startswith(named + os.sep) or named.startswith(cache + os.sep)):
        return None
    return OutputWriteError(
        f"cannot write the weights cache {cache}: {error.strerror or error}",
        "set TORCH_HOME to a folder torchkit may write, or pass --weights PATH to a local file",
    )


def http_status_error(error: urllib.error.HTTPError, url: str, what: str) -> TorchkitError:
    """The error line for a server that answered the download of `url` (`what`) with an HTTP
    error status: it was reached, so "connect to the internet" would not help. A 404 (or 410)
    says the file is not there; another status (403, 503...), that the server refused it."""
    status = f"HTTP {error.code} {error.reason}".rstrip()
    error.close()  # the error page's response, not read
    cached = cached_weights_file(url)
    if error.code in NOT_THERE_STATUSES:
        return InputError(
            f"cannot download {what}: the server has no file at {url} ({status})",
            f"if you have the file, save it as {cached}; or pass --weights PATH to a local file",
        )
    return OfflineError(
        f"cannot download {what}: the server refused {url} ({status})",
        f"try again later, or save the file as {cached}; or pass --weights PATH to a local file",
    )


def _unreachable(url: str) -> str | None:
    """Why the server of `url` gives no answer (no network, unknown host, refused, timed out,
    a proxy that cannot connect), in a few words; None when it answers at all, an HTTP error
    status included (the download then says what is wrong), but for one that says there is
    no such file (404, 410): that HTTPError is raised. One HEAD request through urllib, as
    torch.hub downloads (the same proxies), without retries."""
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "torchkit"})
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S):
            return None
    except urllib.error.HTTPError as error:
        if error.code in NOT_THERE_STATUSES:
            raise
        return None
    except urllib.error.URLError as error:
        return str(error.reason)
    except (OSError, http.client.HTTPException) as error:
        return str(error) or type(error).__name__
