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
    class at all), or `classes` that are no list. A name given twice stays (torchvision's
    ImageNet names hold two "crane"s), as does a name of spaces: torchkit trains a class
    folder named " " as such a class."""
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
    return list(classes) or None
