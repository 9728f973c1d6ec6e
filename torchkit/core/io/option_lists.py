"""The one reading of a list given on the command line (`--classes a,b,c`, `--mean 0.5,0.5,0.5`,
`--milestones 30,60`, `--ratio 8:1:1`, `--input-size 3,224,224`...).

An empty item (`a,,b`, `0.5,`, `,`) or an empty value is a usage error naming the option and the
value: it is a typo or a variable left unset, never an item the user meant to leave out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from typing import Any

from torchkit.core.io.errors import UsageError


@cache
def _separator(separators: str) -> re.Pattern[str]:
    return re.compile("[" + re.escape(separators) + "]")


def list_items(
    text: str, option: str, *, separators: str = ",", spaces: bool = False, hint: str | None = None
) -> list[str]:
    """The items of `option`'s value `text`, each without the white space around it: split at
    each character of `separators`, and with `spaces` also at runs of white space (`0.5 0.4`).
    An empty value or an empty item is a UsageError (exit 2) with `hint`."""
    if not text.strip():
        raise UsageError(f"invalid {option} {text!r}: an empty value", hint)
    items: list[str] = []
    for part in _separator(separators).split(text.strip()):
        words = part.split() if spaces else [part.strip()]
        if not words or not words[0]:
            raise UsageError(f"invalid {option} {text!r}: an empty item", hint)
        items.extend(words)
    return items


def number_items(
    text: str,
    option: str,
    kind: Callable[[str], Any],
    *,
    separators: str = ",",
    spaces: bool = False,
    hint: str | None = None,
) -> list[Any]:
    """The items of `option`'s value `text` (list_items) read by `kind` (int, float...), in ASCII
    digits only: int() and float() also read other scripts' digits (`３`, `٣`) and digits
    grouped with `_` (`1_0` as 10), which an option of one number refuses, so that a value means
    the same in every option and every script. A ValueError for an item that is not such a
    number."""
    items = list_items(text, option, separators=separators, spaces=spaces, hint=hint)
    if not all(map(is_plain_number_text, items)):
        raise ValueError(f"{option} takes numbers in ASCII digits, without _")
    return [kind(item) for item in items]


def is_plain_number_text(text: str) -> bool:
    """Whether `text` is written as a number is meant (ASCII, no `_`): the one test of every
    number torchkit reads from text (options, recipes' words, weight files), since int() and
    float() also read other scripts' digits (`３`) and grouped digits (`1_0` as 10)."""
    return text.isascii() and "_" not in text
