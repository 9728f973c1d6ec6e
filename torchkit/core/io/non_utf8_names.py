"""Text that names files which are not UTF-8 (lone surrogates, `surrogateescape`): found,
written as JSON that stays valid UTF-8, and given to native code that takes UTF-8 names only."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator

_SURROGATE = re.compile("[\ud800-\udfff]")


def holds_non_utf8(text: str) -> bool:
    """Whether `text` holds bytes that were not UTF-8 (lone surrogates)."""
    return _SURROGATE.search(text) is not None


def json_text(value: object, **dumps_kwargs) -> str:
    """`json.dumps(value, ensure_ascii=False, **dumps_kwargs)`, but a lone surrogate (a file
    name that is not UTF-8) is written as its escape, "\\udcff": the text stays valid UTF-8 JSON
    and reads back (json.loads) to the same str, which opens the same file; every other
    character is written as itself, as before."""
    text = json.dumps(value, ensure_ascii=False, **dumps_kwargs)
    return _SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


@contextlib.contextmanager
def name_native_code_opens(path: str | os.PathLike) -> Iterator[str]:
    """A name of the file or folder at `path` for a library whose native code takes a path as
    UTF-8 text (onnxruntime, torch.jit.load, torch.export.load, safetensors, pyarrow,
    TensorBoard's writer): the path itself, or, for a name that is not UTF-8, the file opened
    here and named by its descriptor, `/proc/self/fd/N` (open until the block ends): such a
    name was refused with the binding's TypeError, "Path ... is not valid UTF-8" or a
    UnicodeEncodeError, and `export` could write no file under it. Where only the folders above
    are not UTF-8, the folder is the one opened, `/proc/self/fd/N/model.onnx`: the library finds
    what lies beside the file (an ONNX model's external data, which it looked for in
    `/proc/self/fd/`). Without `/proc` (no Linux, whose names alone may be any bytes), the path
    itself."""
    name = os.fspath(path)
    if not holds_non_utf8(name) or not os.path.isdir("/proc/self/fd"):
        yield name
        return
    folder, base = os.path.split(name)
    if base not in ("", ".", "..") and not holds_non_utf8(base):
        # O_PATH: a folder this user may enter but not list (`chmod 711`) is opened too
        flags = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0)
        descriptor = os.open(folder, flags | getattr(os, "O_CLOEXEC", 0))
        try:
            yield f"/proc/self/fd/{descriptor}/{base}"
        finally:
            os.close(descriptor)
        return
    # Non-blocking: a FIFO is opened at once, and the library's own open of it does as it
    # would under a UTF-8 name
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(name, flags)
    try:
        yield f"/proc/self/fd/{descriptor}"
    finally:
        os.close(descriptor)
