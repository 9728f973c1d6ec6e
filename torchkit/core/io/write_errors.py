"""Write errors: a full disk, a read-only file system or a name too long is one fatal
`OutputWriteError` naming the output, never a skipped input (`as_write_error`; a block's
errors turned so by `claims.reporting_write_errors`).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from torchkit.core.io.errors import (
    NAME_TOO_LONG_HINT,
    OutputWriteError,
    first_line,
)
from torchkit.core.io.output_paths import is_within, shown
from torchkit.core.io.sizes import disk_room
from torchkit.core.io.temporaries import temporary_affixes

# errno values that only writing causes, and those that reading an input can cause too (these
# count as write errors only when they name the output or nothing).
WRITE_ONLY_ERRNOS = frozenset((errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG))
WRITE_ERRNOS = WRITE_ONLY_ERRNOS | {errno.EACCES, errno.EPERM, errno.EIO, errno.ENAMETOOLONG}


def is_write_error(error: BaseException, target: str | os.PathLike | None = None) -> bool:
    """An error that says the output side cannot be written (full disk, read-only, no
    permission), including torch.save's RuntimeError from its zip writer. A permission or I/O
    error that names a file other than `target` (or its temporary sibling) is an input's."""
    # NumPy's short write ("49152 requested and 28544 written") is an OSError without errno:
    # the file system below decides, as for torch.save's RuntimeError.
    if isinstance(error, OSError) and error.errno is not None:
        if error.errno in WRITE_ONLY_ERRNOS:
            return True
        if error.errno not in WRITE_ERRNOS:
            return False
        if error.filename is None or target is None:
            return True
        named = os.path.abspath(os.fspath(error.filename))
        out = os.path.abspath(os.fspath(target))
        # the output, something inside it, or its temporary sibling (`.NAME.<hex>.tmp`)
        temporary = os.path.dirname(named) == os.path.dirname(out) and _is_temporary_of(
            os.path.basename(named), os.path.basename(out)
        )
        return named == out or temporary or is_within(Path(named), Path(out))
    text = str(error).lower()
    if "(os error 28)" in text or "no space left" in text:  # safetensors' SafetensorError
        return True
    if isinstance(error, RuntimeError) or (isinstance(error, OSError) and error.errno is None):
        # torch.save's C++ stream ("file write failed", "unexpected pos 576 vs 534",
        # "basic_ios::clear: iostream error") and NumPy's tofile ("120000 requested and 12160
        # written") do not say why: ask the file system whether it is full or read-only.
        if target is not None and _file_system_full_or_read_only(target):
            return True
        return isinstance(error, RuntimeError) and any(
            sign in text
            for sign in (
                "file write failed",
                "unexpected pos",
                "inline_container",
                "iostream error",
            )
        )
    return False


def _is_temporary_of(name: str, output: str) -> bool:
    """Whether the file `name` is a temporary written for the file `output` beside it: one of
    `atomic_write`'s or `atomic_path`'s, or another (`.STEM.` anything) of a plot's arrays or
    a writability probe's."""
    stem, suffix = Path(output).stem, Path(output).suffix
    prefixes = {
        f".{stem}.",
        temporary_affixes(output)[0],  # atomic_write's
        temporary_affixes(stem, suffix)[0],  # atomic_path's, which keeps the suffix
        temporary_affixes(stem)[0],
    }
    return any(name.startswith(prefix) for prefix in prefixes)


def _file_system_full_or_read_only(target: str | os.PathLike) -> bool:
    return _file_system_problem(target) is not None


def _file_system_problem(target: str | os.PathLike) -> int | None:
    """EROFS or ENOSPC when the file system that holds `target` is read-only or (nearly) full:
    of bytes, or of inodes."""
    room = disk_room(os.path.dirname(os.path.abspath(os.fspath(target))))
    if room is None:
        return None
    if room.read_only:
        return errno.EROFS
    if room.free < _NEARLY_FULL or room.names == 0:
        return errno.ENOSPC
    return None


_NEARLY_FULL = 64 * 1024  # bytes free: a writer that failed here ran out of space


# safetensors reports a full disk as "I/O error: No space left on device (os error 28)".
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def write_error(target: str | os.PathLike, error: BaseException) -> OutputWriteError:
    return OutputWriteError(
        f"cannot write {shown(target)}: {write_failure_reason(target, error)}",
        _WRITE_HINTS.get(getattr(error, "errno", None), _WRITE_HINT),
    )


_WRITE_HINT = "free some space, check the permissions, or choose another output"


# Where the errno says which: space and permissions are no help with a name too long.
_WRITE_HINTS = {
    errno.ENAMETOOLONG: NAME_TOO_LONG_HINT,
}


SHARED_MEMORY = Path("/dev/shm")  # where worker processes' semaphores and batches live
_SHARED_MEMORY_SIGNS = ("</torch_", "shared memory", "shm")


def shared_memory_full(error: BaseException) -> OutputWriteError | None:
    """The error that `error` means where it is a full /dev/shm: the semaphores of a worker
    pool (an OSError ENOSPC naming no file) or torch's shared memory for a DataLoader worker's
    batch ("unable to write to file </torch_...>: No space left on device (28)"). A container's
    is 64 MB unless made larger; the output's disk, which a bare ENOSPC was blamed on, may
    have all the room it needs. None: not that, or /dev/shm has room."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG):
        named = error.filename
        if named is not None and not os.path.abspath(os.fspath(named)).startswith(
            f"{SHARED_MEMORY}{os.sep}"
        ):
            return None
    else:
        text = str(error)
        if not any(sign in text for sign in _SHARED_MEMORY_SIGNS) or not (
            "No space left" in text or "(28)" in text
        ):
            return None
    if _file_system_problem(SHARED_MEMORY / "x") != errno.ENOSPC:
        return None
    return OutputWriteError(
        f"no space left in {SHARED_MEMORY}, the shared memory that worker processes pass "
        "their work through",
        "free some there, use --workers 0, or give it more room: docker run --shm-size=1g",
    )


def write_failure_reason(target: str | os.PathLike, error: BaseException) -> str:
    """errno's words where there is an errno; otherwise what the file system says now (torch's
    and NumPy's writers report a short write without the reason)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).lower()
    if "(os error 28)" in text or "no space left" in text:
        return os.strerror(errno.ENOSPC)
    problem = _file_system_problem(target)
    return os.strerror(problem) if problem else first_line(error) or "the write failed"


def as_write_error(error: BaseException, target: str | os.PathLike) -> OutputWriteError | None:
    """The OutputWriteError that `error`, raised while writing `target`, means; None when it is
    not about the output side. Writers report a full disk in many ways: an OSError with an
    errno, safetensors' "I/O error: ... (os error 28)", torch.save's C++ stream ("unexpected pos
    576 vs 534"), NumPy's "120000 requested and 12160 written" (the file system says why)."""
    if isinstance(error, OutputWriteError):
        return error
    if _file_system_problem(target) is None:  # the output's disk has room: another one's?
        shared = shared_memory_full(error)
        if shared is not None:
            return shared
    if is_write_error(error, target):
        return write_error(target, error)
    text = str(error)
    match = _OS_ERROR.search(text)
    if match and "I/O error" in text:
        code = int(match.group(1))
        cause = OSError(code, os.strerror(code))
        if is_write_error(cause, target):
            return write_error(target, cause)
    return None


def named_as_final(error: OutputWriteError, temporary: str, final: str) -> OutputWriteError:
    """The write error with a hidden temporary path replaced by the output's, so that the
    message names what the user asked for."""
    return OutputWriteError(error.message.replace(temporary, final), error.hint)
