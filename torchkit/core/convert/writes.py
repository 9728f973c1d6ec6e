"""Write errors of the writers `convert` uses, as one fatal `OutputWriteError` naming the output.

`outputs.is_write_error` knows OSError with an errno and torch.save's "file write failed". The
writers here report a full disk in other ways too: safetensors as a `SafetensorError` "I/O
error: No space left on device (os error 28)", torch.save's C++ stream as "unexpected pos 576
vs 534" or "basic_ios::clear: iostream error", np.save as an OSError "120000 requested and
12160 written" without an errno. A full disk must never look like a bad input, so these are
recognised here as well (the last ones by asking the file system whether it is full or
read-only).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator

from torchkit.core.errors import OutputWriteError
from torchkit.core.outputs import InputPath, check_output_file, is_write_error, write_error

_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def as_write_error(error: BaseException, target: str | os.PathLike) -> OutputWriteError | None:
    """The OutputWriteError that `error`, raised while writing `target`, means; None when it
    is not about the output side."""
    if isinstance(error, OutputWriteError):
        return error
    if is_write_error(error, target):
        return write_error(target, error)
    text = str(error)
    match = _OS_ERROR.search(text)
    if match and "I/O error" in text:
        code = int(match.group(1))
        cause = OSError(code, os.strerror(code))
        if is_write_error(cause, target):
            return write_error(target, cause)
    if isinstance(error, RuntimeError) or (isinstance(error, OSError) and error.errno is None):
        # torch.save's C++ writer ("unexpected pos 576 vs 534", "basic_ios::clear: iostream
        # error") and NumPy's tofile ("120000 requested and 12160 written") do not say why: the
        # file system does.
        cause = _file_system_state(target)
        if cause is not None:
            return write_error(target, cause)
        if isinstance(error, RuntimeError) and any(s in text for s in _TORCH_WRITE_FAILURES):
            return write_error(target, error)
    return None


_TORCH_WRITE_FAILURES = ("unexpected pos", "iostream error", "file write failed")


def _file_system_state(target: str | os.PathLike) -> OSError | None:
    """ENOSPC or EROFS when the file system that holds `target` is full or read-only."""
    folder = os.path.dirname(os.path.abspath(os.fspath(target)))
    try:
        stats = os.statvfs(folder)
    except OSError:
        return None
    if stats.f_flag & os.ST_RDONLY:
        return OSError(errno.EROFS, os.strerror(errno.EROFS))
    if stats.f_bavail * stats.f_frsize < _NEARLY_FULL or (stats.f_files and not stats.f_favail):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None


_NEARLY_FULL = 64 * 1024  # bytes free: a writer that failed here ran out of space


@contextlib.contextmanager
def writing(target: str | os.PathLike) -> Iterator[None]:
    """Turn a full disk or read-only output inside the block into one OutputWriteError."""
    try:
        yield
    except OutputWriteError:
        raise
    except Exception as error:
        found = as_write_error(error, target)
        if found is None:
            raise
        raise found from error


def named_as_final(error: OutputWriteError, temporary: str, final: str) -> OutputWriteError:
    """The write error with a hidden temporary folder's path replaced by the output's, so that
    the message names what the user asked for."""
    return OutputWriteError(error.message.replace(temporary, final), error.hint)


def check_report_output(
    output: str | os.PathLike | None,
    force: bool,
    *,
    source: str | os.PathLike,
    destination: str | os.PathLike,
) -> None:
    """Check a `-o FILE` report before any work: it is never the source (nor inside a source
    folder) nor the destination file, and an existing file needs `force`. A report inside an
    existing destination folder is fine (`convert tensor a.png . --to npy -o report.json`).
    `-` (stdout) and special files (FIFOs, /dev/stdout) are written into, so they pass."""
    if output is None or os.fspath(output) == "-":
        return
    inputs = [InputPath.of(source, "source")]
    if not os.path.isdir(destination):
        inputs.append(InputPath.of(destination, "destination"))
    check_output_file(output, force, inputs, what="report")
