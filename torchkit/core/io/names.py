"""File names made distinct: one rule for every name a run derives from its inputs (video
frames' prefixes, feature arrays' files)."""

from __future__ import annotations

from collections.abc import Iterable


def distinct_names(names: Iterable[str], *, separator: str, fold_case: bool = False) -> list[str]:
    """`names` in order, each repeat given `{separator}2`, `{separator}3`... (the lowest number
    free, taken names like `v-2` counted). `fold_case`: the folder they go to ignores case, so
    names that differ only by case (`Clip`, `clip`) repeat too.

    Each name's search goes on from the number it last gave: the numbers below it are all taken
    (taken names are never freed), so 10,000 repeats of one name are named in linear time."""
    key = str.casefold if fold_case else str
    used: set[str] = set()
    last_number: dict[str, int] = {}
    distinct: list[str] = []
    for name in names:
        candidate, n = name, last_number.get(key(name), 1)
        while key(candidate) in used:
            n += 1
            candidate = f"{name}{separator}{n}"
        last_number[key(name)] = n
        used.add(key(candidate))
        distinct.append(candidate)
    return distinct
