"""The argument that is OUT because --data gives the data (`split raw --data raw2`,
`extract-features convnet raw --data raw2`): most likely meant as the data, so every command
that takes both words a refusal of it alike: why it is OUT, --data's value, and what to write."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


def argument_rule(data: Any, *, name: str = "OUT", data_name: str = "ROOT") -> str:
    """`the argument is OUT when --data raw2 gives ROOT`: why the positional is `name`."""
    from torchkit.core.io.shell_words import shell_word

    return f"the argument is {name} when --data {shell_word(data)} gives {data_name}"


def argument_out(positional: Path | None, data: str | None, out_option: Path | None) -> Path | None:
    """OUT where it is the argument beside --data with no --out (the case whose refusal names
    --data), else None: OUT given as --out, or with the data as an argument, was meant as OUT."""
    if data is None or out_option is not None or positional is None:
        return None
    return Path(positional)


def data_and_out(
    first: str | None,
    second: Path | None,
    data: str | None,
    out_option: Path | None,
    *,
    data_name: str,
) -> tuple[str, Path, Path | None]:
    """(the data, OUT, OUT where it is the argument beside --data and no --out: argument_out)
    of a command taking `DATA OUT` (split's ROOT, convert shards' SRC): the data as the first
    positional or --data; with --data, the first positional is OUT (`split --data raw/ out/`),
    held to --out as OUT is (the same path, or a usage error)."""
    from torchkit.cli.options import data_and_rest, product_path
    from torchkit.core.io.errors import UsageError

    words = [word for word in (first, second) if word is not None]
    source, rest = data_and_rest(data, words, name=data_name, after=1)
    if source is None:
        raise UsageError(f"missing {data_name}", f"give it, or as --data {data_name}")
    positional = rest[0] if rest else None
    out = Path(product_path(positional, out_option, data=data, data_name=data_name))
    return str(source), out, argument_out(positional, data, out_option)


@contextlib.contextmanager
def argument_as_out(
    argument: Path | None,
    data: str | None,
    *,
    data_name: str,
    doing: str,
    command: Sequence[str],
) -> Iterator[None]:
    """Around the work that may refuse OUT: where OUT is `argument` (argument_out), a refusal
    of it (an existing folder, one inside an input) adds to its hint the rule, how to write the
    argument as the data (`torchkit COMMAND... ARGUMENT OUT`, without --data) and the refusal's
    own hint for writing --data's value into it. `doing`: the command's verb with what it takes
    (`split`, `extract features of`); `command`: the words before the data's place."""
    from torchkit.core.io.errors import OutputExistsError
    from torchkit.core.io.overlap import OutputOverlapError
    from torchkit.core.io.shell_words import shell_line, shell_word

    try:
        yield
    except (OutputExistsError, OutputOverlapError) as error:
        if argument is None or data is None:
            raise
        word = shell_word(argument)
        written = shell_line(["torchkit", *command])
        rule = (
            f"{argument_rule(data, data_name=data_name)}: to {doing} {word}, write "
            f"`{written} {word} OUT` without --data"
        )
        hint = (
            f"{rule}; to {doing} {shell_word(data)} into {word}: {error.hint}"
            if error.hint
            else rule
        )
        raise type(error)(error.message, hint) from error
