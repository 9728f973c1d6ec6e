"""The options eval, predict, extract-features and benchmark share are declared once, as the
fields of core.run_options's InferenceOptions (how the model runs) and PreprocessOverrides
(crop, resize, mean/std/stats), and generated into each command by one decorator
(cli.run_options): same names, flags, defaults and help everywhere; each command gets them
back as the dataclasses, and a request contains its InferenceOptions as `run`."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from enum import Enum
from pathlib import Path

import pytest
from suite_paths import REPO

from torchkit.cli.benchmark import benchmark
from torchkit.cli.evaluate import eval_command
from torchkit.cli.extract_features import extract_features_command
from torchkit.cli.predict import predict_command
from torchkit.cli.run_options import DEFAULT_PREPROCESS, DEFAULT_RUN, with_inference_options
from torchkit.core.evaluate import EvalOptions
from torchkit.core.features import FeatureRequest
from torchkit.core.inference.options import (
    INFERENCE_OPTIONS,
    PREPROCESS_OPTIONS,
    InferenceOptions,
    PreprocessOverrides,
    RunOptions,
)
from torchkit.core.models import ModelSpec
from torchkit.core.predict import PredictRequest

CLI = REPO / "torchkit" / "cli"
SHARED = {**INFERENCE_OPTIONS, **PREPROCESS_OPTIONS}
ALL = tuple(SHARED)
# The shared options each command takes. Benchmark's --batch-size (a list of sizes to compare)
# and --image-size/--input-size (a sample's shape) mean something else: they are its own.
COMMANDS = {
    "eval": (eval_command, ALL),
    "predict": (predict_command, ALL),
    "extract-features": (extract_features_command, ALL),
    "benchmark": (benchmark, ("device", "amp", "amp_dtype", "channels_last")),
}
OWN_MEANING = {"benchmark": {"batch_size", "image_size"}}
# The command's own wording of an option that means the same.
OWN_HELP = {("extract-features", "batch_size"): "Images per forward pass."}


def _defaults():
    return {**dataclasses.asdict(InferenceOptions()), **dataclasses.asdict(PreprocessOverrides())}


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_them_as_declared(_torchkit_command, command):
    params = {p.name: p for p in _torchkit_command.commands[command].params}
    defaults = _defaults()
    for name in COMMANDS[command][1]:
        param, spec = params[name], SHARED[name]
        default = param.default.value if isinstance(param.default, Enum) else param.default
        assert default == defaults[name], name
        if not spec.shared:  # a shared one's flags and help: cli.options, as every command's
            assert [*param.opts, *param.secondary_opts] == list(spec.flags), name
            assert param.help == OWN_HELP.get((command, name), spec.help), name
    assert "run" not in params and "preprocess" not in params


@pytest.mark.parametrize("command", COMMANDS)
def test_no_command_declares_a_shared_option_itself(command):
    """The function a command module writes takes `run`/`preprocess`, never the options."""
    function, _ = COMMANDS[command]
    own = set(inspect.signature(inspect.unwrap(function)).parameters)
    declared_again = (own & set(ALL)) - OWN_MEANING.get(command, set())
    assert not declared_again, f"{command} declares {sorted(declared_again)} inline"


def _option_flags(path: Path) -> set[str]:
    """Every flag spelled in a `typer.Option(...)` call of a module."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Option":
            flags |= {
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            }
    return flags


def test_no_cli_module_spells_a_declared_option_again():
    """Only the shared options (--device, --workers, --stats: cli.options) are typer.Options
    of the CLI; the flags of the others live on their fields. (--batch-size and --image-size
    are also benchmark's and export's own, with another meaning.)"""
    declared_in_core = {
        flag
        for spec in SHARED.values()
        if not spec.shared
        for flag in spec.flags
        if flag not in ("--batch-size", "-b", "--image-size", "--input-size")
    }
    for module in sorted(CLI.glob("*.py")):
        again = _option_flags(module) & declared_in_core
        assert not again, f"{module.name} declares {sorted(again)} again"


@pytest.mark.parametrize("request_class", [EvalOptions, PredictRequest, FeatureRequest])
def test_the_requests_contain_them(request_class):
    fields = {f.name: f for f in dataclasses.fields(request_class)}
    assert fields["run"].type in (InferenceOptions, "InferenceOptions")
    assert not set(fields) & set(INFERENCE_OPTIONS)  # none declared again


def test_positional_fields_keep_their_order():
    run = InferenceOptions(batch_size=2, amp_dtype="bf16")
    request = FeatureRequest(ModelSpec("convnet"), "images", "out", run=run)
    assert (request.spec.model, request.images, request.out) == ("convnet", "images", "out")
    assert (request.run.batch_size, request.run.amp_dtype, request.run.workers) == (2, "bf16", None)
    assert FeatureRequest(ModelSpec("convnet"), "images", "out").run == InferenceOptions()
    assert RunOptions is InferenceOptions  # its former name


def test_the_command_gets_the_dataclasses_in_place_of_the_options(tmp_path):
    seen = {}

    @with_inference_options(defaults={"batch_size": 8})
    def command(
        first: int = 0,
        preprocess: PreprocessOverrides = DEFAULT_PREPROCESS,
        run: InferenceOptions = DEFAULT_RUN,
        last: int = 0,
    ) -> None:
        seen.update(first=first, preprocess=preprocess, run=run, last=last)

    parameters = inspect.signature(command).parameters
    assert list(parameters) == ["first", *PREPROCESS_OPTIONS, *INFERENCE_OPTIONS, "last"]
    assert parameters["batch_size"].default == 8  # a command's own default
    values = {name: p.default for name, p in parameters.items()}
    fp16 = type(values["amp_dtype"])("fp16")  # a choice is an Enum on the command line
    stats = tmp_path / "stats.json"
    stats.write_text('{"mean": [0.5], "std": [0.25]}', encoding="utf-8")
    given = {"image_size": "3,20,20", "stats": stats, "amp_dtype": fp16, "workers": 0}
    command(**{**values, "first": 1, "last": 2, **given})
    assert seen["run"] == InferenceOptions(batch_size=8, amp_dtype="fp16", workers=0)
    assert seen["preprocess"] == PreprocessOverrides(
        image_size=20, image_channels=3, mean=(0.5,), std=(0.25,), stats=str(stats)
    )  # C of C,N,N travels on, checked against the model's input channels
    assert (seen["first"], seen["last"]) == (1, 2)


def test_only_the_options_a_command_takes():
    @with_inference_options(only=("device", "amp"))
    def command(run: InferenceOptions = DEFAULT_RUN) -> InferenceOptions:
        return run

    assert list(inspect.signature(command).parameters) == ["device", "amp"]
    assert command(device="cpu", amp=True) == InferenceOptions(device="cpu", amp=True)
