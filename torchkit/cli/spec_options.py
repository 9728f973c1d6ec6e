"""Typer parameters generated from the options a config dataclass declares on its fields
(core.train.option_specs), and the command line's values turned back into field values.

A command takes the parameters as `**values` and sets `__signature__` to them (Typer reads a
command's parameters from its signature), so each option is declared once, on its field.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from torchkit.cli.completion import complete_model_name
from torchkit.cli.options import (
    DeterministicOption,
    DeviceOption,
    ForceOption,
    SeedOption,
    StatsOption,
    StrictOption,
    WorkersOption,
)
from torchkit.core.option_specs import OptionSpec

# Options that every command spells and documents the same way (cli.options), by field name.
SHARED_OPTIONS = {
    "seed": SeedOption,
    "deterministic": DeterministicOption,
    "device": DeviceOption,
    "workers": WorkersOption,
    "strict": StrictOption,
    "force": ForceOption,
    "stats": StatsOption,
}
# What shell completion offers for an option's value, by OptionSpec.completion.
COMPLETIONS = {"model": complete_model_name}


def option_parameters(
    config_class: type,
    specs: Mapping[str, OptionSpec],
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, inspect.Parameter]:
    """The keyword parameter of each option in `specs` (field name -> OptionSpec), in order,
    with the field's default, or the command's own in `defaults`."""
    hints = typing.get_type_hints(config_class)
    defaults = {f.name: f.default for f in dataclasses.fields(config_class)} | dict(defaults or {})
    return {
        name: _parameter(name, spec, hints[name], defaults[name]) for name, spec in specs.items()
    }


def _parameter(name: str, spec: OptionSpec, field_type: Any, default: Any) -> inspect.Parameter:
    if spec.shared:
        return keyword(name, SHARED_OPTIONS[name], default)
    value_type = _non_none(field_type)
    optional = value_type is not field_type
    if spec.parse is not None:  # text on the command line, None when not given
        value_type, optional, default = str, True, None
    elif spec.choices:  # an Enum is how every Typer version offers choices
        value_type = Enum(name.title().replace("_", ""), [(c, c) for c in spec.choices], type=str)
        default = None if default is None else value_type(default)
    elif spec.folder:
        value_type, default = Path, None if default is None else Path(default)
    settings: dict[str, Any] = {
        "help": spec.help,
        "show_default": spec.show_default,
        "rich_help_panel": spec.panel,
        "min": spec.minimum,
        "max": spec.maximum,
        "metavar": spec.metavar,
        "autocompletion": COMPLETIONS.get(spec.completion or ""),
        "case_sensitive": False if spec.choices else None,
        "file_okay": False if spec.folder else None,
    }
    declared = typer.Option(
        *spec.flags, **{key: value for key, value in settings.items() if value is not None}
    )
    annotation = Optional[value_type] if optional else value_type
    return keyword(name, Annotated[annotation, declared], default)


def _non_none(annotation: Any) -> Any:
    """`int` of `int | None`; any other annotation as it is."""
    arguments = typing.get_args(annotation)
    if type(None) not in arguments:
        return annotation
    return next(a for a in arguments if a is not type(None))


def keyword(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
    )


def declared_parameters(function: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The parameters written out in `function`'s signature, as keyword parameters."""
    parameters = inspect.signature(function, eval_str=True).parameters
    return {name: keyword(name, p.annotation, p.default) for name, p in parameters.items()}


def field_value(spec: OptionSpec, given: Any) -> Any:
    """The field value of an option's command-line value: text parsed (a ValueError is a bad
    value of the option, reported as click reports one), a choice as its name, a path as text."""
    if spec.parse is not None:
        try:
            return spec.parse(given, spec.name)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint=spec.name) from None
    if isinstance(given, Enum):
        return given.value
    return str(given) if isinstance(given, Path) else given
