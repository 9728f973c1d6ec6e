"""Issue #32: one model spec, one set of model options. Every command that takes a model shows
the same MODEL, --model, --weights and --trust-checkpoint help, and `ModelSpec` is resolved
(resolver, then the preprocessing options) by one function, checked here in-process."""

from __future__ import annotations

import typing

import pytest
import torch
from typer.main import get_command

from torchkit.cli import app, options
from torchkit.core.io.errors import CheckpointError, UsageError
from torchkit.core.models import ModelSpec, resolve_spec
from torchkit.core.models.convnet import convnet_class
from torchkit.core.models.inputs import iter_tensors, make_inputs
from torchkit.core.models.resolver import untrained_error

# How each command that takes a model takes a file `torchkit export` wrote (the resolver's
# `exported`), which is all its MODEL help may add to the shared text. `train` is left out: its
# --model is the architecture to fine-tune, with options of its own.
EXPORTED_BY_COMMAND = {
    "eval": "runtime",
    "predict": "runtime",
    "summary": "module",
    "benchmark": "module",
    "export": "refuse",
    "extract-features": "refuse",
    "convert-syncbn": "refuse",
}


def _declared_help(alias) -> str:
    """The help of an `Annotated[..., typer.Option(...)]` alias of cli/options.py."""
    return typing.get_args(alias)[1].help


def _params(command: str) -> dict[str, typing.Any]:
    """The command's parameters by their option name (`--weights`) or metavar (`MODEL`)."""
    found = {}
    for param in get_command(app).commands[command].params:
        names = [name for name in param.opts if name.startswith("--")]
        found[names[0] if names else param.metavar] = param
    return found


@pytest.mark.parametrize("command", sorted(EXPORTED_BY_COMMAND))
def test_every_command_shows_the_shared_model_help(command):
    params = _params(command)
    exported = EXPORTED_BY_COMMAND[command]
    if command == "convert-syncbn":  # SRC: no --model may stand for it
        assert params["SRC"].help == options.model_help(exported, or_model_option=False)
    else:
        assert params["MODEL"].help == options.model_help(exported)
    assert params["--weights"].help == _declared_help(options.WeightsOption)
    assert params["--weights"].metavar == "PATH|NAME"
    assert params["--trust-checkpoint"].help == _declared_help(options.TrustCheckpointOption)
    if command == "eval":  # also the architecture of a weights file given as MODEL
        assert params["--model"].help == _declared_help(options.EvalModelOption)
        assert "-m" in params["--model"].opts
    elif command != "convert-syncbn":
        assert params["--model"].help == _declared_help(options.ModelOption)


def test_model_help_says_which_exported_files_a_command_takes():
    assert "export" not in options.model_help("refuse")
    assert ".onnx; .ts and .pt2 with --trust-checkpoint" in options.model_help("runtime")
    assert "a TorchScript file `torchkit export` wrote" in options.model_help("module")
    for exported in ("refuse", "runtime", "module"):
        text = options.model_help(exported)
        for part in ("torchvision model name", "convnet", "package.module:Callable", "timm/NAME"):
            assert part in text
        assert text.endswith("; or --model.")


# --- ModelSpec, resolved -------------------------------------------------------------------------


def _convnet_checkpoint(path, preprocess=None):
    model = convnet_class()(2, 3, 12)
    torch.save(
        {
            "format_version": 1,
            "arch": "convnet",
            "num_classes": 2,
            "classes": ["cat", "dog"],
            "model": model.state_dict(),
            "preprocess": preprocess or {"image_size": 12, "resize_size": 14, "in_channels": 3},
        },
        path,
    )
    return str(path)


def test_the_preprocessing_options_go_on_top_of_the_models_own(tmp_path):
    checkpoint = _convnet_checkpoint(tmp_path / "model.pt")
    own = resolve_spec(ModelSpec(model=checkpoint), command="test")
    assert (own.preprocess.image_size, own.preprocess.resize_size) == (12, 14)
    assert own.classes == ["cat", "dog"]
    spec = ModelSpec(model=checkpoint, resize_size=20, mean=(0.5,), std=(0.25, 0.5, 0.75))
    changed = resolve_spec(spec, command="test")
    assert (changed.preprocess.image_size, changed.preprocess.resize_size) == (12, 20)
    assert changed.preprocess.mean == (0.5, 0.5, 0.5)
    assert changed.preprocess.std == (0.25, 0.5, 0.75)
    with pytest.raises(UsageError, match="--mean has 2 values but the images have 3 channels"):
        resolve_spec(ModelSpec(model=checkpoint, mean=(0.1, 0.2)), command="test")


def test_image_size_builds_the_model_and_sets_the_crop():
    resolved = resolve_spec(ModelSpec(model="convnet", image_size=20), command="test")
    assert resolved.sample_shape == (3, 20, 20)
    assert resolved.preprocess.image_size == 20
    assert resolved.model(torch.zeros(1, 3, 20, 20)).shape == (1, 10)


def test_sample_shape_sizes_the_model_without_changing_the_crop_option():
    spec = ModelSpec(model="convnet", sample_shape=(1, 16, 16), num_classes=4)
    resolved = resolve_spec(spec, command="summary", new_head=True)
    assert resolved.sample_shape == (1, 16, 16)
    assert resolved.model(torch.zeros(2, 1, 16, 16)).shape == (2, 4)


def test_file_with_model_name_is_name_with_weights_file(tmp_path):
    weights = tmp_path / "weights.pt"
    torch.save(convnet_class()(3, 3, 28).state_dict(), weights)
    older = resolve_spec(ModelSpec(model=str(weights), arch="convnet"), command="eval")
    named = resolve_spec(ModelSpec(model="convnet", weights=str(weights)), command="eval")
    only_option = resolve_spec(ModelSpec(arch="convnet", weights=str(weights)), command="eval")
    for resolved in (older, only_option):
        assert resolved.arch == named.arch == "convnet"
        assert resolved.model.state_dict().keys() == named.model.state_dict().keys()
        for key, value in named.model.state_dict().items():
            assert torch.equal(resolved.model.state_dict()[key], value)


def test_the_grammar_errors_are_usage_errors(tmp_path):
    checkpoint = _convnet_checkpoint(tmp_path / "model.pt")
    with pytest.raises(UsageError, match="nothing to evaluate"):
        resolve_spec(ModelSpec(), command="eval")
    with pytest.raises(UsageError, match="MODEL convnet contradicts --model resnet18"):
        resolve_spec(ModelSpec(model="convnet", arch="resnet18"), command="eval")
    both = ModelSpec(model=checkpoint, weights=checkpoint)
    # eval and predict say it in their words; the other commands leave it to the resolver.
    with pytest.raises(UsageError, match="give either a model file or --weights, not both"):
        resolve_spec(both, command="predict", exported="runtime", predicting=True)
    with pytest.raises(UsageError, match="--weights goes with a model name"):
        resolve_spec(both, command="export")


def test_predicting_refuses_random_weights_unless_allowed():
    with pytest.raises(UsageError, match="random weights") as refused:
        resolve_spec(ModelSpec(model="convnet"), command="predict", predicting=True)
    # The built-in convnet has no DEFAULT weights to load: `--weights DEFAULT` is refused.
    assert refused.value.hint == (
        "pass a checkpoint as MODEL or --weights FILE; --allow-untrained to run it anyway"
    )
    assert "--weights DEFAULT|FILE;" in untrained_error("resnet18", "torchvision").hint
    allowed = ModelSpec(model="convnet", allow_untrained=True)
    assert resolve_spec(allowed, command="predict", predicting=True).weights_source is None
    # Other commands take a model with random weights as it is (summary, export...).
    assert resolve_spec(ModelSpec(model="convnet"), command="export").weights_source is None


def test_predicting_checks_the_recorded_preprocessing_after_the_options(tmp_path):
    broken = {"image_size": 12, "resize_size": 14, "in_channels": 3, "std": [0.0, 0.0, 0.0]}
    checkpoint = _convnet_checkpoint(tmp_path / "model.pt", preprocess=broken)
    with pytest.raises(CheckpointError, match="preprocessing recorded in .*model.pt"):
        resolve_spec(ModelSpec(model=checkpoint), command="eval", predicting=True)
    fixed = ModelSpec(model=checkpoint, std=(0.5,))
    assert resolve_spec(fixed, command="eval", predicting=True).preprocess.std == (0.5,) * 3


def test_trust_checkpoint_allows_a_pickled_model(tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten()), path)
    with pytest.raises(CheckpointError, match="--trust-checkpoint"):
        resolve_spec(ModelSpec(model=str(path)), command="test")
    trusted = resolve_spec(ModelSpec(model=str(path), trust_checkpoint=True), command="test")
    assert trusted.source == "pickled model"


# --- inputs made up for a model ------------------------------------------------------------------


def test_make_inputs_is_seeded_typed_and_leaves_the_global_generator_alone():
    state = torch.random.get_rng_state()
    first = make_inputs([(2, 3, 4, 4), (2, 5)], dtypes=[torch.float16, torch.long])
    assert torch.equal(torch.random.get_rng_state(), state)
    assert [t.dtype for t in first] == [torch.float16, torch.long]
    assert first[0].min() >= 0 and first[0].max() < 1 and not first[1].any()
    again = make_inputs([(2, 3, 4, 4), (2, 5)], dtypes=[torch.float16, torch.long])
    assert torch.equal(first[0], again[0])
    (other,) = make_inputs([(2, 3, 4, 4)], seed=1, channels_last=True)
    assert other.dtype == torch.float32 and not torch.equal(other, first[0].float())
    assert other.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(UsageError, match="not positive"):
        make_inputs([(2, 0)])


def test_iter_tensors_finds_every_tensor_in_nested_outputs():
    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    found = list(iter_tensors({"x": [a, (b, "text")], "y": c, "z": None}))
    assert [t.shape[0] for t in found] == [1, 2, 3]
