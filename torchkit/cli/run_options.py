"""The options of how an inference command runs its model (core.run_options.RunOptions),
declared once: `@with_run_options()` adds them to a command's signature (Typer reads a
command's parameters from it) and hands the command one `run: RunOptions` instead."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from torchkit.cli.options import (
    ChannelsLastOption,
    DeviceOption,
    InferenceAmpDtype,
    InferenceAmpDtypeOption,
    InferenceAmpOption,
    InferenceDecode,
    InferenceDecodeOption,
    WorkersOption,
)
from torchkit.cli.spec_options import declared_parameters, keyword
from torchkit.core.run_options import RunOptions

# The defaults, and the placeholder default of a decorated command's `run` (replaced by its fields).
DEFAULT_RUN = RunOptions()
RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunOptions))


def run_parameters(batch_help: str = "Images per batch.") -> list[inspect.Parameter]:
    """The Typer parameters of RunOptions's fields, in its order, with its defaults."""
    options = {
        "batch_size": Annotated[int, typer.Option("--batch-size", "-b", min=1, help=batch_help)],
        "workers": WorkersOption,
        "device": DeviceOption,
        "amp": InferenceAmpOption,
        "amp_dtype": InferenceAmpDtypeOption,
        "channels_last": ChannelsLastOption,
        "decode": InferenceDecodeOption,
    }
    defaults = {name: getattr(DEFAULT_RUN, name) for name in RUN_FIELDS}
    defaults["amp_dtype"] = InferenceAmpDtype(DEFAULT_RUN.amp_dtype)  # choices are an Enum
    defaults["decode"] = InferenceDecode(DEFAULT_RUN.decode)
    return [keyword(name, options[name], defaults[name]) for name in RUN_FIELDS]


def run_options_of(values: dict[str, Any]) -> RunOptions:
    """The RunOptions of the run parameters' values, taken out of `values`."""
    given = {name: values.pop(name) for name in RUN_FIELDS}
    given["amp_dtype"] = InferenceAmpDtype(given["amp_dtype"]).value  # the Enum's name, as text
    given["decode"] = InferenceDecode(given["decode"]).value
    return RunOptions(**given)


def with_run_options(
    batch_help: str = "Images per batch.",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command that takes `run: RunOptions`: its command-line parameters are the
    options in `run`'s place (so they keep their place in --help), its `run` their values.
    `batch_help`: --batch-size's help, in the command's words."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        declared = declared_parameters(command)
        if "run" not in declared:
            raise TypeError(f"{command.__name__} takes no `run: RunOptions` parameter")
        parameters: list[inspect.Parameter] = []
        for name, parameter in declared.items():
            parameters += run_parameters(batch_help) if name == "run" else [parameter]

        @functools.wraps(command)
        def with_run(**values: Any) -> Any:
            run = run_options_of(values)
            return command(**values, run=run)

        signature = inspect.Signature(parameters, return_annotation=None)
        with_run.__signature__ = signature  # type: ignore[attr-defined]
        return with_run

    return decorate
