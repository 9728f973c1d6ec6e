"""On/off environment switches (TORCHKIT_DEBUG, TORCHKIT_BYTECODE_CACHE): one reading of them."""

from __future__ import annotations

import os

OFF_WORDS = ("0", "false", "no", "off")


def switched_on(name: str, default: bool) -> bool:
    """Whether the variable `name` is on: unset or blank is `default`; 0, false, no and off,
    in any case, are off; anything else is on."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value not in OFF_WORDS
