"""The class names a torchkit checkpoint or exported file records (its `classes`, output i
named by entry i): one reader for every command that takes them (predict and eval name
outputs by them, train resumes by them, export stores them again, convert checkpoint copies
them), so that an entry no torchkit writes is refused alike, when the file is loaded."""

from __future__ import annotations

from typing import Any

from torchkit.core.io.errors import TorchkitError, short_repr

_NOT_TORCHKIT = "the file is damaged or was not written by torchkit"


def stored_class_names(classes: Any, where: str, error: type[TorchkitError]) -> list[str] | None:
    """`classes` as a file records them, in output order; None where it records none (null,
    or an empty list: a model exported without class names). What no torchkit writes is an
    `error` naming the file (`where`: "checkpoint runs/best.pt") and the class index: an
    entry that is no text (null was read as a class "None"), an empty name (printed as no
    class at all), or `classes` that are no list. So are what no output can show: a name of
    spaces (or invisible characters) alone, and two names in two Unicode spellings of one
    (`_refuse_spelling_twins`); no torchkit data reader gives such names. Two names
    that differ only by the spaces around them stay (class folders ` cat` and `cat ` train
    such classes on purpose, and CSV and JSON outputs keep the spaces apart), as does a name
    given twice exactly (torchvision's ImageNet names hold two "crane"s: their outputs are
    told apart by index)."""
    if classes is None:
        return None
    if not isinstance(classes, (list, tuple)):
        raise error(
            f"{where} has classes {short_repr(classes)}, which no torchkit writes",
            f"{_NOT_TORCHKIT}: they are a list of class names",
        )
    for index, name in enumerate(classes):
        if not isinstance(name, str) or not name:
            raise error(
                f"{where} has class {index} named {short_repr(name)}, which no torchkit writes",
                f"{_NOT_TORCHKIT}: every class is named by a non-empty text",
            )
    from torchkit.core.data.sources.samples import is_blank_name

    blank = next((index for index, name in enumerate(classes) if is_blank_name(name)), None)
    if blank is not None:
        raise error(
            f"{where} has class {blank} named {short_repr(classes[blank])}, which no output "
            "can show",
            "every class is named by visible text: a name of spaces or invisible characters "
            "alone prints as no name (an older torchkit trained a class folder ' ' so: rename "
            "the folder and train again)",
        )
    _refuse_spelling_twins(classes, where, error)
    return list(classes) or None


def _refuse_spelling_twins(
    classes: list[str] | tuple[str, ...], where: str, error: type[TorchkitError]
) -> None:
    """An `error` naming the two indices of names that are one name in two Unicode spellings
    (`café` composed and decomposed): two outputs that print alike, and a class of that name
    (matched in NFC, `find_class`) scored against the first alone. No torchkit data reader
    gives such names (class folders, CSV labels and shard labels refuse them)."""
    from torchkit.core.data.sources.samples import spelling_twin_pair

    pair = spelling_twin_pair(classes)
    if pair is not None:
        first, second = pair
        raise error(
            f"{where} has classes {first} {_shown(classes[first])} and {second} "
            f"{_shown(classes[second])}, one name in two Unicode spellings (composed and "
            "decomposed accents)",
            f"{_NOT_TORCHKIT}: two outputs would print alike, and a class of that name would "
            "be scored against the first alone",
        )


def _shown(name: str) -> str:
    """`name` quoted for an error line, its accents escaped: two Unicode spellings of `café`
    print alike, `'caf\\xe9'` and `'cafe\\u0301'` do not."""
    return short_repr(name).encode("ascii", "backslashreplace").decode("ascii")
