"""The options of how eval, predict and extract-features run their model are RunOptions's
fields, declared once (core.run_options) and given to each command by one decorator
(cli.run_options): same names, flags and defaults everywhere, and each command gets them back
as one RunOptions."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from torchkit.cli.options import InferenceAmpDtype
from torchkit.cli.run_options import DEFAULT_RUN, RUN_FIELDS, run_parameters, with_run_options
from torchkit.core.evaluate import EvalOptions
from torchkit.core.features import FeatureRequest
from torchkit.core.predict import PredictRequest
from torchkit.core.run_options import RunOptions

COMMANDS = ("eval", "predict", "extract-features")
FLAGS = {
    "batch_size": ["--batch-size", "-b"],
    "workers": ["--workers", "-j"],
    "device": ["--device"],
    "amp": ["--amp"],
    "amp_dtype": ["--amp-dtype"],
    "channels_last": ["--channels-last"],
    "decode": ["--decode"],
}


def test_a_parameter_for_each_field_in_its_order():
    assert [p.name for p in run_parameters()] == list(RUN_FIELDS) == list(FLAGS)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_them_with_the_dataclass_defaults(_torchkit_command, command):
    params = {p.name: p for p in _torchkit_command.commands[command].params}
    defaults = RunOptions()
    for name in RUN_FIELDS:
        param = params[name]
        assert [*param.opts, *param.secondary_opts] == FLAGS[name], name
        default = getattr(param.default, "value", param.default)  # --amp-dtype: an Enum
        assert default == getattr(defaults, name), name
        assert param.help, name
    assert "run" not in params


@pytest.mark.parametrize("request_class", [EvalOptions, PredictRequest, FeatureRequest])
def test_the_requests_inherit_them(request_class):
    names = [f.name for f in dataclasses.fields(request_class)]
    assert names[: len(RUN_FIELDS)] == list(RUN_FIELDS)
    assert len(names) == len(set(names))  # none declared again


def test_positional_fields_keep_their_order():
    request = FeatureRequest("convnet", "images", "out", batch_size=2, amp_dtype="bf16")
    assert (request.model, request.images, request.out) == ("convnet", "images", "out")
    assert (request.batch_size, request.amp_dtype, request.workers) == (2, "bf16", None)


def test_the_command_gets_one_run_options_in_place_of_the_six():
    seen = {}

    @with_run_options()
    def command(first: int = 0, run: RunOptions = DEFAULT_RUN, last: int = 0) -> None:
        seen.update(first=first, run=run, last=last)

    names = list(inspect.signature(command).parameters)
    assert names == ["first", *RUN_FIELDS, "last"]
    values = {p.name: p.default for p in run_parameters()}
    command(first=1, last=2, **{**values, "batch_size": 8, "amp_dtype": InferenceAmpDtype.fp16})
    assert seen == {"first": 1, "last": 2, "run": RunOptions(batch_size=8, amp_dtype="fp16")}
