"""The class names a file of them gives in label order (class i is name i): `classes.txt` and
`classes.json` beside shards, and a `--classes` file, read alike by every command."""

from __future__ import annotations

import json
from collections.abc import Callable

from torchkit.core.data.sources.samples import is_blank_name, spelling_twin_pair
from torchkit.core.io.errors import InputError, TorchkitError
from torchkit.core.io.ordered_lines import ordered_lines

_NAME_EVERY_CLASS = "give every class its name, in label order"


def class_names_in_text(text: str, where: str) -> list[str]:
    """The class names a `classes.txt` (or a `--classes` file, `where`) holds, in label order:
    one a line, read without the spaces around it (a hand-written file's trailing blanks,
    Windows line ends); blank lines before the first and after the last are none, and one
    between two names is an InputError (`ordered_lines`): it would shift every later class.
    So is a line of invisible characters alone (a zero-width space), and two lines that
    differ only in Unicode spelling (`refuse_unshowable_names`, naming the lines)."""
    names = ordered_lines(text, where, "class names")
    # ordered_lines keeps the lines from the first that is not blank on, each one a name.
    first = next((n for n, line in enumerate(text.splitlines(), 1) if line.strip()), 1)
    refuse_unshowable_names(
        names, lambda index: f"line {first + index} of {where} names class {ascii(names[index])}"
    )
    return names


def class_names_in_json(text: str, where: str) -> list[str]:
    """The class names a `classes.json` (or a `--classes` .json file, `where`) gives, in label
    order: a list (class i is entry i) or {name: index} over 0, 1, ... Anything else is an
    InputError, as is an empty name (a class without one, which classes.txt cannot hold and no
    sample's "label" can name), or one of spaces or invisible characters alone, and two that
    are one name in two Unicode spellings (`refuse_unshowable_names`); text that is not JSON a
    ValueError."""
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
    refuse_unshowable_names(
        names, lambda index: f"{where} names class {index} {ascii(names[index])}"
    )
    return names


def refuse_unshowable_names(
    names: list[str], named: Callable[[int], str], error: type[TorchkitError] = InputError
) -> None:
    """An `error` naming where (`named(i)`: "line 3 of F names class 'x'") a name no report
    can show is: empty, or of spaces or invisible characters alone; or the second of two names
    that are one in two Unicode spellings (`café` composed and decomposed), two classes that
    print alike and that torchkit matches as one. A name given exactly twice is the callers'
    to judge (`--classes` takes it, as a checkpoint does: ImageNet's two "crane"s); names
    that differ by the spaces around them (a JSON list's ` cat`, `cat `) are
    two, as class folders so named are."""
    unnamed = next((index for index, name in enumerate(names) if is_blank_name(name)), None)
    if unnamed is not None:
        what = "an empty name" if not names[unnamed].strip() else "a name no report can show"
        raise error(f"{named(unnamed)}, {what}", _NAME_EVERY_CLASS)
    pair = spelling_twin_pair(names)
    if pair is not None:
        raise error(
            f"{named(pair[1])}, and {named(pair[0])}: one name in two Unicode spellings "
            "(composed and decomposed accents)",
            "give each class one name that tells it apart: torchkit reads them as one class",
        )
