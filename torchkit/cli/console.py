"""The two consoles: results on stdout, everything else (progress, warnings, errors) on stderr.

rich turns colour off by itself when the stream is not a terminal and when NO_COLOR is set.
`console.stdout` and `console.stderr` are made on first use, so that shell completion and
`--help`, which print neither, do not import rich's console.

Every write on stdout and stderr holds `write_lock`, and so does a fork (`_hold_writes`): a
process forked mid-write (a progress bar's redraw, another thread's warning) got the locks that
write held in rich and in the stream, held for ever, and hung at its first line on stderr.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from torchkit.core.io.errors import OutputWriteError

    stdout: Console
    stderr: Console


# Held by each write on stdout or stderr and by a fork. Re-entrant: a print's write holds it
# already, and a fork may be made by a thread that is printing. Taken before the locks of these
# consoles and of a progress bar's Live, so no thread waits for it holding one of those.
write_lock = threading.RLock()


def _hold_writes() -> None:
    """Before a fork: wait for the write in flight, if any (no timeout: it ends unless the
    terminal stops taking output, and then the forking thread's next line would wait too)."""
    write_lock.acquire()


if hasattr(os, "register_at_fork"):  # POSIX; in the child, the forking thread holds it
    os.register_at_fork(
        before=_hold_writes, after_in_parent=write_lock.release, after_in_child=write_lock.release
    )


def __getattr__(name: str) -> Any:
    if name not in ("stdout", "stderr"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # emoji=False: `:fire:` in a path or class name is printed as it is, not as an emoji.
    if name == "stdout":
        made = make_console(file=_Results(), soft_wrap=True, emoji=False)
    else:
        made = make_console(stderr=True, soft_wrap=True, emoji=False)
    globals()[name] = made  # made once: later look-ups find the module attribute
    return made


def make_console(**options: Any) -> Console:
    """A rich Console (`options` are its own) whose every write holds `write_lock`, and whose
    broken pipe ends the command at its error boundary: what `stdout` and `stderr` are."""
    return _console_class()(**options)


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console

    class _Console(Console):
        # Every print, log, control and Live refresh writes inside a buffer context: holding
        # the lock over it holds it over the rendering and the write, before rich's own lock.
        def _enter_buffer(self) -> None:
            write_lock.acquire()
            super()._enter_buffer()

        def _exit_buffer(self) -> None:
            try:
                super()._exit_buffer()
            finally:
                write_lock.release()

        def on_broken_pipe(self) -> None:
            # rich's own exits with 1 on the spot; the command's error boundary ends it as
            # GNU tools end (`cli.app.exit_quietly_on_broken_pipe`), after its clean-up.
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return _Console


_results: list = []  # the stream results go to while `results_only_on_stdout` runs


class _Nowhere(io.TextIOBase):
    """The stream of a process started without stdout (`>&-`, pythonw): results written to it
    are lost, so a write fails as the closed file descriptor fails it (GNU tools say "write
    error: Bad file descriptor"); nothing written, nothing lost."""

    def write(self, text: str) -> int:
        if text:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return 0


_NOWHERE = _Nowhere()


class _Results:
    """The stdout console's file: the stream `results_only_on_stdout` kept for the results,
    else whatever sys.stdout is at the time of the write (as rich's default)."""

    def _target(self) -> Any:
        target = _results[-1] if _results else sys.stdout
        return _NOWHERE if target is None else target  # no stdout at all (`>&-`, pythonw)

    def write(self, text: str) -> int:
        with write_lock, _reporting_write_errors():
            target = self._target()
            if isinstance(getattr(target, "buffer", None), io.RawIOBase):
                return _write_unbuffered(target, text)
            return target.write(text)

    def flush(self) -> None:
        with write_lock, _reporting_write_errors():
            self._target().flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding...
        return getattr(self._target(), name)


def _write_unbuffered(stream: Any, text: str) -> int:
    """`text` written whole to an unbuffered stdout (PYTHONUNBUFFERED=1, as many container
    images set, or `python -u`), whose text layer writes straight to the file descriptor and
    drops, without an error, what a short write leaves out: a disk that fills mid-write left
    a truncated result and exit 0. Here the rest is written again, and the write that cannot
    be made raises (ENOSPC, EPIPE)."""
    import select

    stream.flush()
    data = memoryview(text.encode(stream.encoding, stream.errors or "strict"))
    while data:
        written = stream.buffer.write(data)
        if written is None:  # a non-blocking stdout that is full for now
            select.select([], [stream.buffer], [])
            continue
        data = data[written:]
    return len(text)


@contextlib.contextmanager
def _reporting_write_errors() -> Iterator[None]:
    """A write of the results that fails (`> /dev/full`) ends the command with its one error
    line; a reader that left (BrokenPipeError) is the broken-pipe exit's."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as error:
        raise stdout_write_error(error) from None


def stdout_write_error(error: OSError) -> OutputWriteError:
    """The error of a failed write to stdout; what is left in stdout's buffer is dropped, so
    that it does not fail again (with Python's complaint) at exit."""
    from torchkit.core.io.errors import OutputWriteError, first_line

    drop_stdout()
    reason = error.strerror or first_line(error)
    if error.errno == errno.EBADF:
        hint = "standard output is closed: send it to a file or to /dev/null"
    else:
        hint = "free some space, or send the output elsewhere"
    return OutputWriteError(f"cannot write to standard output: {reason}", hint)


class _BestEffort(io.TextIOBase):
    """stderr for notes, warnings, progress and errors, written as they come and on a best
    effort: a write that fails (`2>/dev/full`, a reader of stderr gone) is dropped. The command's
    exit status says whether its work succeeded; a full log disk stopped a run at its first
    Note with exit 1 (the Error line lost too), or failed it at exit after all its work (Python
    flushes stderr as it ends). Written straight to the descriptor, so that a failed write
    leaves nothing in a buffer to fail again."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._fd = stream.fileno()
        self._encoding = stream.encoding or "utf-8"

    def write(self, text: str) -> int:
        import select

        data = memoryview(text.encode(self._encoding, "backslashreplace"))
        try:
            with write_lock:  # a warning's write, a print's (sent to stderr), rich's
                while data:
                    try:
                        data = data[os.write(self._fd, data) :]
                    except BlockingIOError:  # a non-blocking stderr that is full for now
                        select.select([], [self._fd], [])
        except OSError:
            pass  # dropped: a diagnostic must not stop or fail the work
        return len(text)

    def flush(self) -> None:
        """Nothing is held back."""

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return self._stream.isatty()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    @property
    def errors(self) -> str:  # type: ignore[override]
        return "backslashreplace"


def diagnostics_on_best_effort() -> None:
    """sys.stderr (and so the stderr console, logging's last resort and Python's warnings)
    made `_BestEffort`; a process started without stderr (`2>&-`) keeps None."""
    stream = sys.stderr
    if stream is None or isinstance(stream, _BestEffort):
        return
    try:
        stream.flush()
        best_effort = _BestEffort(stream)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return  # no descriptor of its own (an embedding application's stream): left as it is
    sys.stderr = best_effort


# The widest (and tallest) terminal a console is made for: COLUMNS=100000000 had rich pad
# every line of --help to that width, 18 s and 750 MB for `torchkit --help`. As wide as a
# table written to a file or a pipe may be (`render.render_plain_tables`).
MOST_TERMINAL_CELLS = 1000


def unknown_terminal_size_as_unset() -> None:
    """COLUMNS=0 or LINES=0 (set by a script or a CI runner that knows no terminal size)
    means an unknown size, as to `shutil.get_terminal_size`: rich took
    COLUMNS=0 for a console 0 columns wide and printed nothing at all, tables, help and the
    `Error:` line alike (LINES=0: a progress bar shown as `...`). Dropped before any console
    is made, rich measures the terminal (80 columns where there is none). So is a typer
    TERMINAL_WIDTH that is not a positive number: 0 left `--help` blank, a word made it a
    traceback. A size above MOST_TERMINAL_CELLS is taken as that many."""
    for name in ("COLUMNS", "LINES", "TERMINAL_WIDTH"):
        value = os.environ.get(name)
        if value is None:
            continue
        # isdigit holds for other scripts' digits, which int() and rich read too (COLUMNS=３:
        # help 3 columns wide): a size is ASCII digits, as an option's number is.
        if value.isascii() and value.isdigit() and int(value) > 0:
            if int(value) > MOST_TERMINAL_CELLS:
                os.environ[name] = str(MOST_TERMINAL_CELLS)
            continue
        if value.isdigit() or name == "TERMINAL_WIDTH":  # rich ignores a COLUMNS of words
            del os.environ[name]


def write_names_as_bytes() -> None:
    """A file name that is not UTF-8 goes to stdout as its own bytes (as `ls` writes it) under
    any locale: Python's stdout refuses such names but in the C locale. A character stdout's
    encoding lacks (a CJK class name under `PYTHONIOENCODING=latin-1`) is written as its
    backslash escape, as on stderr: the finished result is printed, not lost to an error."""
    import codecs

    codecs.register_error(_STDOUT_ERRORS, _names_as_bytes)
    with contextlib.suppress(AttributeError, ValueError, OSError):
        sys.stdout.reconfigure(errors=_STDOUT_ERRORS)


_STDOUT_ERRORS = "torchkit-names"


def _names_as_bytes(error: UnicodeError) -> tuple[bytes, int]:
    """surrogateescape for the bytes of a name that is not UTF-8, backslashreplace otherwise."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    written = bytearray()
    for character in error.object[error.start : error.end]:
        if 0xDC80 <= ord(character) <= 0xDCFF:
            written.append(ord(character) - 0xDC00)
        else:
            written += character.encode("ascii", "backslashreplace")
    return bytes(written), error.end


def drop_stdout() -> None:
    """Point stdout's file descriptor at /dev/null (its reader left, or its disk is full):
    the results' stream, which is not sys.stdout while a command runs."""
    results = _results[-1] if _results else sys.stdout
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, results.fileno())
        os.close(devnull)


@contextlib.contextmanager
def results_only_on_stdout() -> Iterator[None]:
    """While a command runs, stdout carries its result and nothing else: whatever else writes
    to sys.stdout (a `print` in a user's model's forward, a library's progress line) goes to
    stderr, and `console.stdout` writes to the real stdout."""
    _results.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _results.pop()


def _stderr() -> Console:
    return globals().get("stderr") or __getattr__("stderr")


# Control characters (C0, DEL, C1), from a file or class name, are shown escaped as Python
# writes them (`\n`, `\t`, `\x1b`) in what people read (tables, Error/Warning/Note lines): a
# line break split a name over lines that read as rows or as an Error line and its sequel, rich
# dropped a carriage return (the name shown was not the file's) and an escape sequence reached
# the terminal. So are Unicode's line and paragraph separators (U+2028, U+2029), line breaks
# to Python's str.splitlines: a table row holding one was cut in two lines.
_CONTROL_ESCAPES = {
    code: repr(chr(code))[1:-1] for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)
}


def shown_text(text: str) -> str:
    """`text` as people read it on a terminal: control characters escaped (above), a URL's
    password or token `***` (`core.io.redaction`: a terminal's lines end up in logs)."""
    from torchkit.core.io.redaction import redact_urls

    return redact_urls(text.translate(_CONTROL_ESCAPES))


def _escape(text: str) -> str:
    """A message's text for a markup line: one line (`shown_text`), its brackets not markup."""
    from rich.markup import escape

    return escape(shown_text(text))


class _StderrHandler(logging.Handler):
    """Shows core's `logging.getLogger("torchkit")` warnings as `Warning: ...` lines. A warning
    logged with `extra={"note": True}` is a remark shown by default (not only with -v) as a
    `Note: ...` line, and not with -q, as `note` is."""

    # logging lists a new handler for its clean-up at exit (`logging.shutdown`) before its
    # `__init__` makes the handler's lock: a stop raised in between (a SIGTERM as
    # `install_log_handler` makes one) left a listed handler with no `lock` at all, and the
    # exit ended in AttributeError after `Terminated.`. Such a handler has no lock to take
    # (logging takes it only where it is set); a whole one has its own.
    lock = None

    def emit(self, record: logging.LogRecord) -> None:
        is_note = record.levelno == logging.WARNING and getattr(record, "note", False)
        if is_note and _quiet:
            return
        label = {logging.WARNING: "Warning", logging.ERROR: "Error"}.get(record.levelno, "Note")
        style = "yellow" if record.levelno >= logging.WARNING else "dim"
        if is_note:
            label, style = "Note", "dim"
        _stderr().print(
            f"[{style}]{label}:[/] {_escape(record.getMessage())}",
            highlight=False,
            markup=True,
            soft_wrap=True,
        )


def install_log_handler(verbose: bool = False) -> None:
    logger = logging.getLogger("torchkit")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False


_quiet = False  # -q/--quiet: no notes and no progress on stderr, only problems


def set_quiet(quiet: bool) -> None:
    """-q/--quiet (every command's): stderr carries only warnings and errors; the result is
    unchanged. Reset at the start of each command line."""
    global _quiet
    _quiet = quiet
    if quiet:
        logging.getLogger("torchkit").setLevel(logging.WARNING)


def is_quiet() -> bool:
    return _quiet


def note(message: str) -> None:
    """A remark for the user on stderr (never mixed into results); none with --quiet."""
    if _quiet:
        return
    _stderr().print(f"[dim]Note:[/] {_escape(message)}", highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    _stderr().print(f"[yellow]Warning:[/] {_escape(message)}", highlight=False, soft_wrap=True)
