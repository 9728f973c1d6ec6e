"""Output discarded for a block: what libraries print on the way (torch's C++ warnings, graph
dumps) where torchkit reports the outcome itself."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def output_discarded() -> Iterator[None]:
    """stdout and stderr discarded for the block: sys.stdout/sys.stderr (torch's loggers look
    them up when they write) and file descriptors 1 and 2 (C++ writes there directly; torch's
    ONNX exporter prints its graph dumps on 1)."""
    sink_text = io.StringIO()
    with (
        contextlib.redirect_stdout(sink_text),
        contextlib.redirect_stderr(sink_text),
        tempfile.TemporaryFile() as sink,
        contextlib.ExitStack() as restore,
    ):
        for fd, stream in ((1, sys.__stdout__), (2, sys.__stderr__)):
            try:
                if stream is not None:
                    stream.flush()
                saved = os.dup(fd)
            except (OSError, ValueError):  # no such descriptor (an embedding application)
                continue
            restore.callback(os.close, saved)
            restore.callback(os.dup2, saved, fd)
            restore.callback(_flush, stream)
            os.dup2(sink.fileno(), fd)
        yield


def _flush(stream: Any) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        stream.flush()
