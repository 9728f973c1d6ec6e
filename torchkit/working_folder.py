"""A working folder that no longer exists (`cd run; rm -r ../run`, a CI workspace wiped under a
job): one `Error:` line instead of a failure deep inside.

MKL, which torch loads, ends the process when it cannot read the working folder ("Intel oneMKL
FATAL ERROR: Cannot load libtorch_cpu.so", exit 2, a usage error's status), and a relative path
cannot be made absolute (a bare `FileNotFoundError`). torch's first import is refused while the
working folder is gone; a command that needs neither torch nor the folder (`dataset-stats` or
`video-info` of absolute paths) still runs.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchkit.core.io.errors import InputError, TorchkitError


def is_gone() -> bool:
    """Whether the working folder was deleted (or moved away, where the system says so)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def gone_error() -> InputError:
    from torchkit.core.io.errors import InputError

    return InputError(
        "the working folder no longer exists (it was deleted while the shell was in it)",
        "cd to a folder that exists and run the command again",
    )


def explain(error: TorchkitError) -> None:
    """`error`, raised while the working folder is gone, hinting so: a relative path names
    nothing there, and 'path not found: clip.mp4 (check the path)' sent the user to a path that
    is right. Its message stays: it may be about an absolute path."""
    if is_gone() and error.message != gone_error().message:
        error.hint = "the working folder no longer exists: cd to a folder that exists and run again"


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing; refuses torch's first import while the working folder is gone."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch" and is_gone():
            raise gone_error()


def install() -> None:
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
