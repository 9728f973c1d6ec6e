"""Lists read from a text file one item a line, where an item's line is its meaning: class i is
line i of `classes.txt` beside shards or of a `--classes` file, and a `--class-weights` file of
bare weights gives class i the i-th. A blank line between two items would shift every later
one silently (a mislabelled model or report), so it is an error naming the file and the line.
"""

from __future__ import annotations

from torchkit.core.io.errors import InputError


def ordered_lines(text: str, where: str, what: str) -> list[str]:
    """The items of `text`, one a line, each without the spaces around it (a hand-written
    file's trailing blanks, Windows line ends). Blank (or white-space) lines before the first
    item and after the last are no items; one between two items is an InputError that names
    `where` (the file) and its line number. `what`: the items, plural ("class names")."""
    lines = [line.strip() for line in text.splitlines()]
    start = next((number for number, line in enumerate(lines) if line), len(lines))
    end = len(lines)
    while end > start and not lines[end - 1]:
        end -= 1
    items = lines[start:end]
    if "" in items:
        blank = start + items.index("") + 1
        raise InputError(
            f"line {blank} of {where} is blank, between {what}",
            f"{what} are read one a line, in order: a blank line would shift every later one; "
            "remove it, or fill it in",
        )
    return items
