"""Command-line values converted without pydantic where the conversion is plain.

Typer converts every option's value through a pydantic TypeAdapter: a run's first value imports
pydantic, about 0.1-0.2 s of CPU on every command line (`python -X importtime`: pydantic and
typer's adapters module), for `--format json` or `--epochs 3`. Here a value of the common plain
kinds (a str, a number in ASCII digits within its bounds, a Path, one of a choice's values, a
list of these) is converted as Typer's adapters convert it, by the same helpers where Typer has
them; any other value goes to Typer's own conversion.

A number is the exception, in what it takes and in what a bad one reads: one line naming the
option, the value and what it takes (`Invalid value for '--lr': '1_0' is not a number`), where
pydantic said "Input should be a valid number, unable to parse string as a number" or "Input
should be greater than or equal to 1"; and digits grouped with `_` (`1_0`, which Python and
pydantic read as 10), other scripts' digits, NaN and infinity are refused in every option.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, get_args, get_origin

from torchkit.core.io.option_lists import is_plain_number_text
from torchkit.core.option_specs import bounds_text, not_finite_hint

# The number words converted here (what a user types: 3, -1, 0.5, 1e-4); anything else (a sign
# `+`, leading zeros, `1_000`, `nan`, spaces, other scripts' digits) is left to Typer.
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,17})?(?:[eE][+-]?[0-9]{1,2})?")


class _NotPlain(Exception):
    """A value left to Typer's own conversion."""


class _BadNumber(Exception):
    """A word that is not a number the option takes: the message says what it takes."""


class _NotFinite(Exception):
    """NaN or an infinity given as a number."""

    def __init__(self, word: str) -> None:
        super().__init__(word)
        self.word = word


class CheapFirst:
    """A Typer runtime parameter (its `coerce`) that converts plain values itself and hands
    any other to the runtime parameter Typer builds, built only then."""

    def __init__(self, descriptor: Any) -> None:
        self.descriptor = descriptor
        self._typers: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multi = param.multiple or param.nargs == -1
        if value is None:  # not given: as Typer's RuntimeParam.coerce has it
            return () if multi else None
        try:
            if not (multi and isinstance(value, str)):
                try:
                    return plain_value(value, self.descriptor.annotation, self.descriptor, ctx)
                except _NotPlain:
                    pass
            try:
                return self.typers().coerce(value, param=param, ctx=ctx)
            except Exception as error:
                # A number Typer refused (pydantic's words): said as the numbers above are.
                if not _number_annotation(self.descriptor.annotation):
                    raise
                _check_numbers(value, self.descriptor)
                raise error from None
        except _BadNumber as bad:
            import typer

            raise typer.BadParameter(str(bad), ctx=ctx, param=param) from None
        except _NotFinite as bad:
            raise _not_finite(param, self.descriptor, bad.word) from None

    def typers(self) -> Any:
        if self._typers is None:
            from typer._coercion import build_runtime_param

            self._typers = build_runtime_param(self.descriptor)
        return self._typers


def plain_value(value: Any, annotation: Any, descriptor: Any, ctx: Any) -> Any:
    """`value` converted to `annotation` as Typer's adapters convert it, or _NotPlain."""
    from typer._param_types import (
        choice_coercion_annotation,
        coerce_cli_choice,
        coerce_cli_path,
        routes_to_path,
    )
    from typer._typing import is_number_type

    info = descriptor.parameter_info
    if info.parser is not None or descriptor.file_annotation is not None:
        raise _NotPlain
    if get_origin(annotation) is list:
        (item_type,) = get_args(annotation)
        items = value if isinstance(value, list | tuple) else [value]
        return [plain_value(item, item_type, descriptor, ctx) for item in items]
    if get_origin(annotation) is not None:
        raise _NotPlain  # a tuple, an Annotated union...
    choice = choice_coercion_annotation(annotation, info)
    if choice is not None:
        try:
            return coerce_cli_choice(value, choices=choice[0], case_sensitive=choice[1], ctx=ctx)
        except ValueError:
            raise _NotPlain from None
    if is_number_type(annotation) and annotation in (int, float):
        return _number(value, annotation, info)
    if annotation is str:
        if isinstance(value, str):
            return value
        raise _NotPlain
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise _NotPlain
    if routes_to_path(annotation, info):
        path_type = info.path_type
        if path_type is None and isinstance(annotation, type) and issubclass(annotation, Path):
            path_type = annotation
        if not isinstance(path_type, type) or not issubclass(path_type, Path):
            raise _NotPlain
        if isinstance(value, str) and value and "\0" not in value:
            value = path_type(value)  # what pydantic's Path validation makes of a str
        if not isinstance(value, path_type):
            raise _NotPlain
        try:  # Typer's own checks (exists, file or folder...) and their BadParameter
            return coerce_cli_path(value, info, path_type=path_type, ctx=ctx)
        except ValueError:
            raise _NotPlain from None
    raise _NotPlain


def _number(value: Any, annotation: type, info: Any) -> Any:
    if isinstance(value, str):
        pattern = _INTEGER if annotation is int else _DECIMAL
        if not pattern.fullmatch(value):
            _refuse_unmeant(value, annotation, info)
            raise _NotPlain  # a number of another shape (+5, .5, 007, 2.0): Typer's to convert
        number = annotation(value)
    elif type(value) is annotation or (annotation is float and type(value) is int):
        number = annotation(value)
    else:
        raise _NotPlain
    if annotation is float and not math.isfinite(number):
        raise _NotFinite(str(value))
    if info.clamp:
        raise _NotPlain
    if (info.min is not None and number < info.min) or (info.max is not None and number > info.max):
        raise _BadNumber(_not_taken(value, annotation, info))
    return number


def _number_annotation(annotation: Any) -> type | None:
    """int or float, for an option of one number or a list of them; else None."""
    if get_origin(annotation) is list:
        (annotation,) = get_args(annotation)
    return annotation if annotation in (int, float) else None


def _check_numbers(value: Any, descriptor: Any) -> None:
    """_BadNumber or _NotFinite for the first word of `value` that is no number the option
    takes; nothing where every one is (the refusal is then another's)."""
    annotation = _number_annotation(descriptor.annotation)
    for word in value if isinstance(value, list | tuple) else [value]:
        if isinstance(word, str):
            _check_number(word, annotation, descriptor.parameter_info)


def _refuse_unmeant(word: str, annotation: type, info: Any) -> None:
    """Refuse the forms of a number no one means on a command line, which Python and pydantic
    read: digits grouped with `_` (`1_0` as 10), other scripts' digits, NaN and the infinities
    (_NotFinite)."""
    if not is_plain_number_text(word):
        raise _BadNumber(_not_taken(word, annotation, info))
    if annotation is float:
        try:
            number = float(word)
        except (ValueError, OverflowError):
            return
        if not math.isfinite(number):
            raise _NotFinite(word)


def _check_number(word: str, annotation: type, info: Any) -> None:
    """Refuse `word` where it is no number of `annotation` in the option's bounds, as Python
    reads numbers (called where Typer refused a value: its reason said as the house says it),
    and the forms of `_refuse_unmeant`."""
    _refuse_unmeant(word, annotation, info)
    try:
        number = float(word) if annotation is float else int(word)
    except (ValueError, OverflowError):
        raise _BadNumber(_not_taken(word, annotation, info)) from None
    if annotation is float and not math.isfinite(number):
        raise _NotFinite(word)
    if (info.min is not None and number < info.min) or (info.max is not None and number > info.max):
        raise _BadNumber(_not_taken(word, annotation, info))


def _not_taken(value: Any, annotation: type, info: Any) -> str:
    """`'1_0' is not a number`, `'0' is not a whole number from 1 to 1,000,000`."""
    from torchkit.core.io.errors import short_repr

    kind = "a whole number" if annotation is int else "a number"
    return f"{short_repr(str(value))} is not {kind}{_bounds(info)}"


def _bounds(info: Any) -> str:
    """` from 1 to 1,000,000`, ` >= 0`, ` <= 86,400`, or nothing: the option's range."""
    return bounds_text(info.min, info.max)


def _not_finite(param: Any, descriptor: Any, word: str) -> Exception:
    """The line every command gives a NaN or an infinity (train's check_finite's)."""
    from torchkit.core.io.errors import UsageError

    flag = max(param.opts, key=len) if param.opts else param.name
    info = descriptor.parameter_info
    hint = not_finite_hint(info.min, info.max)
    return UsageError(f"{flag} must be a finite number, not {word}", hint)
