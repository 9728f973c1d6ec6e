"""Command-line values converted without pydantic where the conversion is plain.

Typer converts every option's value through a pydantic TypeAdapter: a run's first value imports
pydantic, about 0.1-0.2 s of CPU on every command line (`python -X importtime`: pydantic and
typer's adapters module), for `--format json` or `--epochs 3`. Here a value of the common plain
kinds (a str, a number in ASCII digits within its bounds, a Path, one of a choice's values, a
list of these) is converted as Typer's adapters convert it, by the same helpers where Typer has
them; any other value, a malformed one included, goes to Typer's own conversion, so every
error message stays Typer's word for word.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, get_args, get_origin

# The number words converted here (what a user types: 3, -1, 0.5, 1e-4); anything else (a sign
# `+`, leading zeros, `1_000`, `nan`, spaces, other scripts' digits) is left to Typer.
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,17})?(?:[eE][+-]?[0-9]{1,2})?")


class _NotPlain(Exception):
    """A value left to Typer's own conversion."""


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
        if not (multi and isinstance(value, str)):
            try:
                return plain_value(value, self.descriptor.annotation, self.descriptor, ctx)
            except _NotPlain:
                pass
        return self.typers().coerce(value, param=param, ctx=ctx)

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
            raise _NotPlain
        number = annotation(value)
    elif type(value) is annotation or (annotation is float and type(value) is int):
        number = annotation(value)
    else:
        raise _NotPlain
    if annotation is float and not math.isfinite(number):
        raise _NotPlain
    if info.clamp:
        raise _NotPlain
    if (info.min is not None and number < info.min) or (info.max is not None and number > info.max):
        raise _NotPlain
    return number
