"""How an option of a config dataclass is offered on the command line, declared once on its field
(TrainConfig's, InferenceOptions's...).

A field declared with `option(default, help=..., ...)` carries an `OptionSpec` in its metadata:
the help text, the help panel, the flag spellings, the choices, the range... all plain data, so
that the CLI can generate its parameters from the table, and config files, resume checks and
error messages can name options the way the command line does, without core knowing the CLI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_METADATA_KEY = "option"


@dataclass(frozen=True)
class OptionSpec:
    """One command-line option of a config field.

    `flags` are the spellings (`("--data", "-d")`; `("--flip/--no-flip",)` for an on/off pair);
    empty means `--field-name`. `parse` turns the option's text into the field's value (given
    the text, None when the option is not given, and the option's name for error messages; a
    ValueError is a bad value of that option). `shared` options are declared by the CLI with
    the same option of the other commands, so their help lives there. `completion` names what
    shell completion offers for the value ("model": model names).
    """

    help: str = ""
    panel: str | None = None
    flags: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    show_default: bool = True
    metavar: str | None = None
    parse: Callable[[str | None, str], Any] | None = None
    folder: bool = False
    completion: str | None = None
    shared: bool = False

    @property
    def name(self) -> str:
        """The option's main spelling: `--weight-decay` of `--weight-decay/--wd`, `--flip` of
        `--flip/--no-flip`."""
        return self.flags[0].split("/")[0]


def default_flag(field_name: str) -> str:
    """The spelling of an option that names no flags: `min_lr` -> `--min-lr`."""
    return "--" + field_name.replace("_", "-")


def option(default: Any = dataclasses.MISSING, **spec: Any) -> Any:
    """A dataclass field with `default` that is a command-line option described by `spec`
    (the keyword arguments of OptionSpec)."""
    return dataclasses.field(default=default, metadata={_METADATA_KEY: OptionSpec(**spec)})


def option_specs(config_class: type) -> dict[str, OptionSpec]:
    """The options of a dataclass declared with `option`, by field name, in field order (the
    order of `--help`), each with its flags filled in."""
    specs = {}
    for field in dataclasses.fields(config_class):
        spec = field.metadata.get(_METADATA_KEY)
        if spec is None:
            continue
        if not spec.flags:
            spec = dataclasses.replace(spec, flags=(default_flag(field.name),))
        specs[field.name] = spec
    return specs


def range_text(minimum: float | None, maximum: float | None, whole: bool = True) -> str:
    """`a whole number from 1 to 1,000,000`: the values an option takes, for its error line."""
    kind = "a whole number" if whole else "a number"
    if minimum is not None and maximum is not None:
        return f"{kind} from {minimum:,} to {maximum:,}"
    if maximum is not None:
        return f"{kind} up to {maximum:,}"
    return f"{kind} from {minimum:,}"


def bounds_text(minimum: float | None, maximum: float | None) -> str:
    """` from 1 to 1,000,000`, ` >= 0`, ` <= 86,400`, or nothing: an option's range."""
    if minimum is not None and maximum is not None:
        return f" from {minimum:,} to {maximum:,}"
    if minimum is not None:
        return f" >= {minimum:,}"
    return f" <= {maximum:,}" if maximum is not None else ""


def not_finite_hint(minimum: float | None, maximum: float | None) -> str:
    """The hint of the one line every option gives a NaN or an infinity, typed or in a
    --config recipe: the numbers it takes where it has a range."""
    bounds = bounds_text(minimum, maximum)
    return f"give a number{bounds}" if bounds else "nan and inf are not option values"


def check_ranges(config: Any) -> None:
    """Refuse a value of a dataclass `config` outside its option's `minimum`..`maximum`, naming
    the option and what it takes: the command line's parser checks the values typed, and this
    those of a `--config` file or a resumed run, and of a config made in Python."""
    from torchkit.core.io.errors import UsageError, short_repr

    for name, spec in option_specs(type(config)).items():
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        below = spec.minimum is not None and value < spec.minimum
        above = spec.maximum is not None and value > spec.maximum
        if below or above:
            raise UsageError(
                f"{spec.name} {short_repr(value)} is out of range",
                f"give {range_text(spec.minimum, spec.maximum, isinstance(value, int))}",
            )
