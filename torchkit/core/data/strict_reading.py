"""Whether the command reading the data was given `--strict`, for what the readers meet while
listing it rather than while reading an image (a folder that cannot be listed): a warning, or
with `--strict` an error, as an unreadable image is. Set for the length of one command; unset
(as for the Python API), such a folder is a warning. Imports nothing heavy: the CLI sets it
while it parses the options."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

# How the command is told to read without --strict when it is given (train's "pass
# --no-strict": a recipe or a resumed run may be what set it); None when it is not.
_STRICT: ContextVar[str | None] = ContextVar("strict_reading", default=None)


def strict_reading() -> bool:
    """Whether `--strict` was given to the command reading the data."""
    return _STRICT.get() is not None


def strict_turn_off() -> str:
    """How the command reading strictly is told not to: its error's hint."""
    return _STRICT.get() or "leave out --strict"


def set_strict_reading(strict: bool) -> Token[str | None]:
    """Set it (to be undone with `reset_strict_reading` when the command ends)."""
    return _STRICT.set("leave out --strict" if strict else None)


def reset_strict_reading(token: Token[str | None]) -> None:
    _STRICT.reset(token)


@contextmanager
def reading_strictly(
    strict: bool = True, *, turn_off: str = "leave out --strict"
) -> Iterator[None]:
    """Within it, `strict_reading()` is `strict` (for a command whose --strict comes from
    elsewhere than the CLI's option, such as a config file); `turn_off` as for
    `strict_unreadable_error`."""
    token = _STRICT.set(turn_off if strict else None)
    try:
        yield
    finally:
        _STRICT.reset(token)
