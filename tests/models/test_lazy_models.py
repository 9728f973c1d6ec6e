"""Models with lazy layers (`nets:LazyNet`: LazyConv2d, LazyBatchNorm2d, LazyLinear), built by
the user's code: the resolver sizes them with one forward pass of the input the command feeds,
so that every command takes them ("Attempted to use an uninitialized parameter" in train, a
0-channel model refused, before), a checkpoint of one loads into a fresh one, and a size the
model cannot take is one error line."""

from __future__ import annotations

import json
import random

import numpy
import pytest
import torch
import torchinfo
from image_folders import write_image_folder
from nets import LazyNet, TrainOnlyLazyNet
from output_checks import error_line
from processes import run_torchkit_in_process
from torch import nn

from torchkit.core.io.errors import UsageError
from torchkit.core.models import resolve_model
from torchkit.core.models.lazy import materialize_lazy_layers


def lazy_net_params(classes: int) -> int:
    """LazyNet's parameters, counted by hand: conv, BatchNorm, linear (16 inputs)."""
    return (3 * 4 * 3 * 3 + 4) + (4 + 4) + (16 * classes + classes)


def sized_lazy_net(num_classes: int = 3, side: int = 8) -> nn.Module:
    """A LazyNet sized as torch sizes it: by a first forward pass (the reference)."""
    model = LazyNet(num_classes)
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, side, side))
    return model.train()


def test_the_resolver_sizes_lazy_layers_without_touching_batchnorm():
    resolved = resolve_model("nets:LazyNet", num_classes=2, image_size=8)
    model = resolved.model
    assert resolved.num_params == lazy_net_params(2) == 154
    assert resolved.num_outputs == 2 and resolved.preprocess.in_channels == 3
    assert type(model.fc) is nn.Linear and model.fc.in_features == 16
    assert type(model.conv) is nn.Conv2d and model.conv.weight.shape == (4, 3, 3, 3)
    assert model.training  # given back in the mode it was built in
    assert model.bn.num_batches_tracked.item() == 0  # the sizing pass ran in eval mode
    assert torch.equal(model.bn.running_mean, torch.zeros(4))
    assert torch.equal(model.bn.running_var, torch.ones(4))


def test_a_lazy_models_weights_load_into_a_fresh_one(tmp_path):
    torch.manual_seed(0)
    source = sized_lazy_net()
    torch.save(source.state_dict(), tmp_path / "lazy.pt")
    loaded = resolve_model("nets:LazyNet", weights=str(tmp_path / "lazy.pt"))
    assert loaded.weights_source == "state dict" and loaded.num_outputs == 3
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value), key


def test_every_command_takes_a_lazy_model(tmp_path):
    data = tmp_path / "data"
    write_image_folder(data / "train", {"a": 4, "b": 4})
    write_image_folder(data / "val", {"a": 2, "b": 2}, seed=1)
    run = tmp_path / "run"
    trained = run_torchkit_in_process(
        "train", "--data", data, "--model", "nets:LazyNet", "--image-size", "8", "--epochs", "1",
        "--batch-size", "4", "--workers", "0", "--device", "cpu", "--out", run, "-q",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    best = run / "best.pt"
    trusted = (best, "--trust-checkpoint")
    # The checkpoint's model, sized again for its 8x8 images, then loaded.
    evaluated = run_torchkit_in_process(
        "eval", *trusted, "--data", data, "--split", "val", "--device", "cpu", "--format", "json",
        "-j", "0",
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["num_images"] == 4
    predicted = run_torchkit_in_process(
        "predict", *trusted, data / "val", "--device", "cpu", "--format", "json", "-j", "0"
    )
    assert predicted.returncode == 0, predicted.stderr
    assert len(json.loads(predicted.stdout)) == 4
    features = run_torchkit_in_process(
        "extract-features", *trusted, data / "val", tmp_path / "features", "--layer", "fc",
        "--device", "cpu", "-j", "0",
    )  # fmt: skip
    assert features.returncode == 0, features.stderr
    assert (tmp_path / "features" / "fc.npy").is_file()
    exported = run_torchkit_in_process("export", *trusted, tmp_path / "lazy.pt")
    assert exported.returncode == 0, exported.stderr
    synced = run_torchkit_in_process("convert-syncbn", *trusted, tmp_path / "sync.pt")
    assert synced.returncode == 0, synced.stderr

    # summary's counts, of the name and of the checkpoint, are torchinfo's of LazyNet sized by
    # torch itself (and the hand count)
    truth = torchinfo.summary(sized_lazy_net(2), input_size=(1, 3, 8, 8), verbose=0)
    assert truth.total_params == lazy_net_params(2)
    for spec in (["nets:LazyNet", "--num-classes", "2", "-i", "3,8,8"], [*trusted]):
        summary = run_torchkit_in_process("summary", *spec, "--no-flops", "--format", "json")
        assert summary.returncode == 0, summary.stderr
        totals = json.loads(summary.stdout)["totals"]
        assert (totals["total_params"], totals["trainable_params"]) == (
            truth.total_params,
            truth.trainable_params,
        )
    benchmark = run_torchkit_in_process(
        "benchmark", "nets:LazyNet", "-i", "3,8,8", "-b", "2", "--warmup", "0", "--iters", "1",
        "--device", "cpu", "--format", "json",
    )  # fmt: skip
    assert benchmark.returncode == 0, benchmark.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["summary", "nets:LazyNet", "-i", "3,1,1"],
        ["train", "--data", "digits", "--model", "nets:LazyNet", "--image-size", "1"],
    ],
)
def test_a_size_a_lazy_model_cannot_take_is_one_error_line(args, tmp_path):
    done = run_torchkit_in_process(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert error_line(done.stderr, besides="warnings") == (
        "Error: nets:LazyNet cannot run on 1x1 images: Given input size: (4x1x1). Calculated "
        "output size: (4x0x0). Output size is too small (the smallest it takes is 2: use "
        "--image-size 2 or larger)"
    )
    assert list(tmp_path.iterdir()) == []


class WideInput(nn.Module):
    """A lazy layer behind a fixed one: 3x8x8 inputs only (192 features)."""

    def __init__(self) -> None:
        super().__init__()
        self.fixed = nn.Linear(192, 5)
        self.head = nn.LazyLinear(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fixed(x.flatten(1)))


def test_a_lazy_model_that_fails_at_another_size_names_it():
    with pytest.raises(UsageError) as caught:
        materialize_lazy_layers(WideInput(), (3, 4, 4), "mine:WideInput")
    message = caught.value.message
    assert message.startswith(
        "mine:WideInput has lazy layers that could not be sized by a 3x4x4 (CxHxW) input: "
        "RuntimeError: "
    )
    assert message.endswith("shapes cannot be multiplied (1x48 and 192x5)")
    assert caught.value.hint.startswith("give the image size and channels it takes")
    model = WideInput()
    assert materialize_lazy_layers(model, (3, 8, 8), "mine:WideInput")
    assert model.head.weight.shape == (2, 5)


def test_a_lazy_layer_only_training_reaches_is_sized_without_a_trace():
    """TrainOnlyLazyNet's auxiliary head runs in training mode only: before -> "has lazy layers
    its forward pass did not size"; now a second dry pass, in training mode, sizes it and leaves
    every BatchNorm statistic fresh and torch's random numbers as the eval pass left them (its
    dropout drew none that count)."""
    torch.manual_seed(5)
    sized_in_eval = TrainOnlyLazyNet(2)
    with torch.no_grad():
        sized_in_eval.eval()(torch.zeros(1, 3, 8, 8))
    random_state = torch.get_rng_state()
    torch.manual_seed(5)
    resolved = resolve_model("nets:TrainOnlyLazyNet", num_classes=2, image_size=8)
    assert torch.equal(torch.get_rng_state(), random_state)
    model = resolved.model
    for key, value in sized_in_eval.state_dict().items():  # the eval pass's, as torch sizes them
        if not key.startswith("aux."):
            assert torch.equal(model.state_dict()[key], value), key
    assert resolved.num_params == lazy_net_params(2) + (16 * 8 + 8) + (8 + 8) + (8 * 2 + 2)
    assert [type(layer) for layer in model.aux] == [
        nn.Linear,
        nn.BatchNorm1d,
        nn.Dropout,
        nn.Linear,
    ]
    assert model.aux[0].weight.shape == (8, 16) and model.aux[3].weight.shape == (2, 8)
    assert model.training
    for norm in (model.bn, model.aux[1]):  # the eval pass's and the training pass's
        features = norm.num_features
        assert norm.num_batches_tracked.item() == 0
        assert torch.equal(norm.running_mean, torch.zeros(features))
        assert torch.equal(norm.running_var, torch.ones(features))


class RandomDrawingLazyNet(nn.Module):
    """A lazy auxiliary head that only training reaches, behind a training forward that draws
    from Python's `random` and NumPy's global generator (a random crop of the features, as a
    user's code might draw it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(192, 2)
        self.aux = nn.LazyLinear(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.fc(x.flatten(1))
        if self.training:
            start = random.randrange(4) + int(numpy.random.randint(4))
            logits = logits + self.aux(x.flatten(1)[:, start : start + 8])
        return logits


def test_the_training_sizing_pass_leaves_pythons_and_numpys_random_numbers_as_they_were():
    """Before, only torch's generators were put back after the training-mode pass: a seeded run
    of a model whose training forward draws from `random` or NumPy drew other numbers than the
    same run without the pass (the model built some other way)."""
    random.seed(7)
    numpy.random.seed(7)
    expected = (random.random(), numpy.random.random())
    random.seed(7)
    numpy.random.seed(7)
    model = RandomDrawingLazyNet()
    assert materialize_lazy_layers(model, (3, 8, 8), "mine:RandomDrawingLazyNet")
    assert model.aux.weight.shape == (2, 8)  # the training pass ran, and drew
    assert (random.random(), numpy.random.random()) == expected


def test_each_module_gets_its_own_mode_back():
    """A BatchNorm frozen in eval mode inside a training model stays frozen (before, the whole
    model was put back in training mode)."""
    model = LazyNet()
    model.bn.eval()
    assert materialize_lazy_layers(model, (3, 8, 8), "nets:LazyNet")
    assert model.training and not model.bn.training and model.fc.training


def test_a_model_with_a_training_only_lazy_head_trains_and_its_checkpoint_loads(
    tmp_path, monkeypatch
):
    data = tmp_path / "data"
    write_image_folder(data / "train", {"a": 2, "b": 2})
    write_image_folder(data / "val", {"a": 1, "b": 1}, seed=1)
    run = tmp_path / "run"
    trained = run_torchkit_in_process(
        "train", "--data", data, "--model", "nets:TrainOnlyLazyNet", "--image-size", "8",
        "--epochs", "1", "--batch-size", "2", "--workers", "0", "--device", "cpu", "--out", run,
        "-q",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    state = torch.load(run / "best.pt", weights_only=True)["model"]
    assert state["aux.0.weight"].shape == (8, 16)
    assert state["aux.1.num_batches_tracked"].item() == 2  # the two training batches only
    # every command rebuilds it from the checkpoint this way: sized again, then loaded
    loaded = resolve_model(str(run / "best.pt"), trust_checkpoint=True).model
    for key, value in state.items():
        assert torch.equal(loaded.state_dict()[key], value), key


class TargetsInTraining(nn.Module):
    """A lazy auxiliary head behind a training forward that wants what no dry pass gives."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(192, 2)
        self.aux = nn.LazyLinear(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise ValueError("training needs the targets too")
        return self.fc(x.flatten(1))


def test_a_training_forward_that_fails_is_one_error_naming_training_mode():
    with pytest.raises(UsageError) as caught:
        materialize_lazy_layers(TargetsInTraining(), (3, 8, 8), "mine:TargetsInTraining")
    assert str(caught.value) == (
        "mine:TargetsInTraining has lazy layers that could not be sized by a 3x8x8 (CxHxW) input "
        "in training mode: ValueError: training needs the targets too (give the layers only its "
        "training forward reaches their sizes in the model's code, nn.Linear instead of "
        "nn.LazyLinear...)"
    )
