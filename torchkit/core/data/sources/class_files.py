"""The class names a file of them gives in label order (class i is name i): `classes.txt` and
`classes.json` beside shards, and a `--classes` file, read alike by every command."""

from __future__ import annotations

import json

from torchkit.core.io.errors import InputError
from torchkit.core.io.ordered_lines import ordered_lines


def class_names_in_text(text: str, where: str) -> list[str]:
    """The class names a `classes.txt` (or a `--classes` file, `where`) holds, in label order:
    one a line, read without the spaces around it (a hand-written file's trailing blanks,
    Windows line ends); blank lines before the first and after the last are none, and one
    between two names is an InputError (`ordered_lines`): it would shift every later class."""
    return ordered_lines(text, where, "class names")


def class_names_in_json(text: str, where: str) -> list[str]:
    """The class names a `classes.json` (or a `--classes` .json file, `where`) gives, in label
    order: a list (class i is entry i) or {name: index} over 0, 1, ... Anything else is an
    InputError, as is an empty name (a class without one, which classes.txt cannot hold and no
    sample's "label" can name); text that is not JSON a ValueError."""
    try:
        loaded = json.loads(text)
    except RecursionError:
        raise ValueError("its JSON is nested too deeply") from None
    indices = loaded.values() if isinstance(loaded, dict) else ()
    if isinstance(loaded, dict) and all(type(index) is int for index in indices):
        names = sorted(loaded, key=loaded.__getitem__)
        if [loaded[name] for name in names] != list(range(len(names))):
            names = None
    elif isinstance(loaded, list) and all(isinstance(name, str) for name in loaded):
        names = loaded
    else:
        names = None
    if names is None:
        raise InputError(
            f"{where} is neither a list of class names nor {{name: index}}",
            'e.g. ["cat", "dog"] or {"cat": 0, "dog": 1}, in label order',
        )
    unnamed = next((index for index, name in enumerate(names) if not name.strip()), None)
    if unnamed is not None:
        raise InputError(
            f"{where} names class {unnamed} {names[unnamed]!r}, an empty name",
            "give every class its name, in label order",
        )
    return names
