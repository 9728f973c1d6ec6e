"""Python's bytecode cache for torchkit's environment, kept even under PYTHONDONTWRITEBYTECODE.

Without cached bytecode every torchkit process compiles torch's Python sources again (seconds
on every start). Where PYTHONDONTWRITEBYTECODE is set (containers, CI images) nothing is ever
cached, and uv's `compile-bytecode` setting, the usual remedy, recompiles the whole environment
on every `uv run` instead (astral-sh/uv#12202: 12,000 files, about 2 s each time). So when the
variable is set and torchkit runs from a virtual environment it may write to, bytecode is cached
in one folder inside that environment (Python's PYTHONPYCACHEPREFIX mechanism): no source tree,
the user's model code included, gets a __pycache__ folder. A PYTHONPYCACHEPREFIX of the user's
own is kept; TORCHKIT_BYTECODE_CACHE=0 turns this off. Where the installer already compiled the
environment (pip does; `uv pip install --compile-bytecode` too), Python reads that bytecode even
under PYTHONDONTWRITEBYTECODE, and a prefix would make it ignore it and compile a second copy:
then nothing is changed.

Every bytecode file this process writes (the cache's, or one beside its source) is written whole
or not at all (`write_whole_bytecode`): Pythons without the fix of CPython issue 126606 (3.10 and
3.11 among them) renamed into place a .pyc that a full disk (or a file size limit) had cut
short, and every later start that imported that module failed on it ("EOFError: marshal data
too short"), room made or not.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys

from torchkit.switches import switched_on

CACHE_FOLDER = ".torchkit-pycache"
SWITCH = "TORCHKIT_BYTECODE_CACHE"


def keep_bytecode_cache() -> str | None:
    """Cache bytecode under <venv>/.torchkit-pycache where PYTHONDONTWRITEBYTECODE would stop
    all caching; call before the heavy imports. Returns the folder, or None if left alone."""
    write_whole_bytecode()
    if not sys.dont_write_bytecode or sys.pycache_prefix is not None:
        return None
    if not switched_on(SWITCH, default=True):
        return None
    if sys.prefix == sys.base_prefix or not os.access(sys.prefix, os.W_OK):
        return None  # not a virtual environment of ours to write in
    if installer_compiled("torch"):
        return None
    folder = os.path.join(sys.prefix, CACHE_FOLDER)
    sys.pycache_prefix = folder
    sys.dont_write_bytecode = False
    return folder


def installer_compiled(package: str) -> bool:
    """Whether `package` (found without importing it) has bytecode beside its sources for this
    Python, as installers that compile write it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    return os.path.exists(importlib.util.cache_from_source(spec.origin))


def write_whole_bytecode() -> None:
    """Have importlib write each .pyc through `_write_whole` (see the module doc): CPython's own
    `_write_atomic` of the affected versions writes once and renames whatever that wrote."""
    import importlib._bootstrap_external as external

    if callable(getattr(external, "_write_atomic", None)):
        external._write_atomic = _write_whole


def _write_whole(path: str, data: bytes, mode: int = 0o666) -> None:
    """`data` written to a temporary beside `path` to its last byte, then renamed to `path`; a
    write that fails (a full disk) removes the temporary and raises OSError, which importlib
    takes as "no bytecode cached" (as CPython's fixed `_write_atomic` does)."""
    temporary = f"{path}.{id(path)}"
    fd = os.open(temporary, os.O_EXCL | os.O_CREAT | os.O_WRONLY, mode & 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
