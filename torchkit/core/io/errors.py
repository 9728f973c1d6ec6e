"""The exceptions core raises; the CLI turns each into one `Error: <what> (<hint>)` line."""

from __future__ import annotations

from collections.abc import Sequence


class TorchkitError(Exception):
    """A failure the user can act on. `hint` says what to do about it."""

    exit_code = 1
    # Raised alike by every rank of a torchrun world (an outcome the ranks agreed on, see
    # `on_every_rank`): rank 0 reports it, the others end with its exit code and say nothing.
    on_every_rank = False
    # Derived from what every rank of a node shares, its options and files (a bad option, a
    # missing data folder, an unreadable checkpoint): raised before the ranks connect, it is
    # reported by the node's local rank 0 alone under torchrun (launch.leave_to_local_rank_0).
    from_shared_inputs = False
    # Another rank of a torchrun world failed first and printed its own line: this rank, rank 0
    # included, ends with that rank's exit code and says nothing (train/ddp.one_line_per_failure).
    reported_by_another_rank = False

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def __reduce__(self):
        # Pickled with its hint (an exception pickles only `args`): errors raised in worker
        # processes reach the parent whole.
        return (type(self), (self.message, self.hint))


# The hint for a path the file system cannot hold (ENAMETOOLONG), wherever it is met.
NAME_TOO_LONG_HINT = "shorten it: a file system takes at most 255 bytes a name, 4,095 a path"
# The hint for a name Python's file system encoding cannot hold: one not UTF-8 (ascii under
# LC_ALL=C with PYTHONUTF8=0, Latin-1), whose names read from UTF-8 text cannot all be spelled.
FS_ENCODING_HINT = "run it under a UTF-8 locale, such as LC_ALL=C.UTF-8, or with PYTHONUTF8=1"


class UsageError(TorchkitError):
    """Options that contradict each other or cannot be parsed: exit code 2, like click."""

    exit_code = 2
    from_shared_inputs = True


class InputError(TorchkitError):
    """A missing, empty, unreadable or malformed input file or folder."""

    from_shared_inputs = True


class OutputExistsError(TorchkitError):
    """An output is already there and `--force` was not given."""


class CheckpointError(TorchkitError):
    """A checkpoint that cannot be loaded, or does not fit the model."""

    from_shared_inputs = True


class DeviceError(TorchkitError):
    """A device that was asked for but is not available."""


class OfflineError(TorchkitError):
    """Something needed a download and the network is not reachable."""


def on_every_rank(error: TorchkitError) -> TorchkitError:
    """`error`, marked as raised alike by every rank (rank 0 alone reports it): only for an
    outcome the ranks agreed on through a collective, never for one rank's own failure, which
    its own line must name."""
    error.on_every_rank = True
    return error


def short_repr(value: object) -> str:
    """`repr(value)` cut short for an error line: long strings keep their start and end, nested
    lists their first items (a YAML alias bomb nests millions of items in a few lines, whose
    whole repr would take minutes and gigabytes)."""
    import reprlib

    shown = reprlib.Repr()
    shown.maxlevel, shown.maxstring, shown.maxother = 2, 80, 80
    return shown.repr(value)


def first_and_more(names: Sequence[str], shown: int) -> str:
    """`a, b, c and 4 more`: the first `shown` names for an error line, the rest counted."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


TORCHSCRIPT_FAILURE = "The following operation failed in the TorchScript interpreter."


def first_line(error: object, *, with_type: bool = False) -> str:
    """The first non-blank line of an exception's message (or its type's name), after
    "TypeName: " with `with_type`: library errors (PyTorch's shape errors, FFmpeg's) run to many
    lines, and torchkit reports one. A TorchScript module's error says what failed on its last
    line, after two tracebacks ("builtins.RuntimeError: expected ..."): that line is the one."""
    name = type(error).__name__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return name
    if lines[0] == TORCHSCRIPT_FAILURE and len(lines) > 1:
        name, found, reason = lines[-1].removeprefix("builtins.").partition(": ")
        if found and name.replace(".", "").isidentifier():
            return f"{name}: {reason}" if with_type else reason
        return lines[-1]
    return f"{name}: {lines[0]}" if with_type else lines[0]


class OutputWriteError(TorchkitError):
    """An output that cannot be written: a full disk, a read-only file system, no permission."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, `timeout`, an OOM killer), handled exactly like Ctrl-C: every
    `except KeyboardInterrupt` clean-up runs; the command exits with 143 instead of 130."""
