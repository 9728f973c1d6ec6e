"""Whether the command reading the data was given `--strict`, for what the readers meet while
listing it rather than while reading an image (a folder that cannot be listed): a warning, or
with `--strict` an error, as an unreadable image is. Set for the length of one command; unset
(as for the Python API), such a folder is a warning. Imports nothing heavy: the CLI sets it
while it parses the options."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

_STRICT: ContextVar[bool] = ContextVar("strict_reading", default=False)


def strict_reading() -> bool:
    """Whether `--strict` was given to the command reading the data."""
    return _STRICT.get()


def set_strict_reading(strict: bool) -> Token[bool]:
    """Set it (to be undone with `reset_strict_reading` when the command ends)."""
    return _STRICT.set(strict)


def reset_strict_reading(token: Token[bool]) -> None:
    _STRICT.reset(token)


@contextmanager
def reading_strictly(strict: bool = True) -> Iterator[None]:
    """Within it, `strict_reading()` is `strict` (for a command whose --strict comes from
    elsewhere than the CLI's option, such as a config file)."""
    token = _STRICT.set(strict)
    try:
        yield
    finally:
        _STRICT.reset(token)
