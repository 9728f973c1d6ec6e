"""The options eval, predict, extract-features and benchmark share (core.run_options), declared
once: `@with_inference_options()` generates them from their declarations, as train's options
are generated (cli.spec_options), in place of the command's `run: InferenceOptions` parameter
(and of its `preprocess: PreprocessOverrides` one), so they keep their place in --help, and
hands the command the dataclasses of their values."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

from torchkit.cli.spec_options import declared_parameters, field_value, option_parameters
from torchkit.core.data.preprocessing import mean_std_options
from torchkit.core.inference.options import (
    INFERENCE_OPTIONS,
    PREPROCESS_OPTIONS,
    InferenceOptions,
    PreprocessOverrides,
)
from torchkit.core.input_size import image_shape_channels
from torchkit.core.option_specs import OptionSpec

# The placeholder defaults of a decorated command's `run` and `preprocess`.
DEFAULT_RUN = InferenceOptions()
DEFAULT_PREPROCESS = PreprocessOverrides()
# A command's placeholder parameter -> the dataclass whose options stand in its place.
GROUPS: dict[str, tuple[type, dict[str, OptionSpec]]] = {
    "run": (InferenceOptions, INFERENCE_OPTIONS),
    "preprocess": (PreprocessOverrides, PREPROCESS_OPTIONS),
}


def with_inference_options(
    *,
    only: Collection[str] | None = None,
    help_of: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command that takes `run: InferenceOptions` and/or `preprocess:
    PreprocessOverrides`: its command-line parameters are their options, in the placeholder's
    place; the command gets the dataclasses. By field name: `only` the options this command
    takes (the others keep the dataclass default), `help_of` and `defaults` the command's own
    help and default of an option."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        declared = declared_parameters(command)
        taken = {
            placeholder: {
                name: dataclasses.replace(spec, help=(help_of or {}).get(name, spec.help))
                for name, spec in specs.items()
                if only is None or name in only
            }
            for placeholder, (_, specs) in GROUPS.items()
            if placeholder in declared
        }
        if not taken:
            raise TypeError(f"{command.__name__} takes no `run` or `preprocess` parameter")
        parameters: list[inspect.Parameter] = []
        for name, parameter in declared.items():
            if name in taken:
                parameters += option_parameters(GROUPS[name][0], taken[name], defaults).values()
            else:
                parameters.append(parameter)

        @functools.wraps(command)
        def with_options(**values: Any) -> Any:
            groups = {}
            if "run" in taken:
                groups["run"] = inference_options_of(values, taken["run"])
            if "preprocess" in taken:
                groups["preprocess"] = preprocess_overrides_of(values, taken["preprocess"])
            return command(**values, **groups)

        signature = inspect.Signature(parameters, return_annotation=None)
        with_options.__signature__ = signature  # type: ignore[attr-defined]
        return with_options

    return decorate


def inference_options_of(
    values: dict[str, Any], specs: Mapping[str, OptionSpec] = INFERENCE_OPTIONS
) -> InferenceOptions:
    """The InferenceOptions of the options' command-line values, taken out of `values`."""
    return InferenceOptions(
        **{name: field_value(spec, values.pop(name)) for name, spec in specs.items()}
    )


def preprocess_overrides_of(
    values: dict[str, Any], specs: Mapping[str, OptionSpec] = PREPROCESS_OPTIONS
) -> PreprocessOverrides:
    """The PreprocessOverrides of the options' command-line values, taken out of `values`:
    --stats read for the mean and std it stands for."""
    mean, std, stats = (values.pop(name, None) for name in ("mean", "std", "stats"))
    image_size = values.get("image_size")  # the text: C,N,N's C is checked against the model
    given = {
        name: field_value(spec, values.pop(name))
        for name, spec in specs.items()
        if name not in ("mean", "std", "stats")
    }
    mean, std = mean_std_options(mean, std, stats)
    return PreprocessOverrides(
        **given,
        image_channels=image_shape_channels(image_size),  # parsed without error above
        mean=mean,
        std=std,
        stats=None if stats is None else str(stats),
    )
