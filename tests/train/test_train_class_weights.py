"""`train --class-weights none|balanced|FILE`: scikit-learn's balanced rule, files by order or
by name, clear errors, and the weights recorded in config.json and used by the loss."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import read_checkpoint
from image_folders import write_image_folder
from sklearn.utils.class_weight import compute_class_weight
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.train.class_weights import class_weights

CLASSES = ["ant", "bee", "cow"]


def test_balanced_is_scikit_learns_rule():
    counts = [6, 2, 12]
    labels = np.repeat(np.arange(3), counts)
    expected = compute_class_weight("balanced", classes=np.arange(3), y=labels)
    assert class_weights("balanced", CLASSES, counts) == pytest.approx(list(expected))
    assert class_weights("none", CLASSES, counts) is None


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("w.json", "[1, 2.5, 0.5]"),
        ("w.json", '{"cow": 0.5, "ant": 1, "bee": 2.5}'),
        ("w.txt", "1\n2.5\n0.5\n"),
        ("w.txt", "\n1\r\n2.5 \r\n0.5\r\n \r\n\n"),  # blank lines around them: none
        ("w.csv", "bee,2.5\nant,1\ncow,0.5\n"),
    ],
)
def test_a_file_gives_weights_by_order_or_by_name(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert class_weights(str(path), CLASSES, [1, 1, 1]) == [1.0, 2.5, 0.5]


@pytest.mark.parametrize(
    ("name", "text", "error", "message"),
    [
        ("w.json", "[1, 2]", InputError, "gives 2 weights for 3 classes"),
        ("w.json", '{"ant": 1, "bee": 1, "dog": 1}', InputError, "unknown class 'dog'"),
        ("w.txt", "1\nx\n2\n", InputError, "'x' is not a number"),
        # Grouped and other scripts' digits, refused as the command line refuses them (1_0 was 10).
        ("w.txt", "1\n1_0\n2\n", InputError, "'1_0' is not a number"),
        ("w.csv", "ant,1\nbee,\uff13\ncow,1\n", InputError, "'\uff13' is not a number"),
        ("w.json", '["1", "1_0", "2"]', InputError, "'1_0' is not a number"),
        # Weight i is class i's: a blank line between two shifted every later weight.
        ("w.txt", "1\n\n2.5\n0.5\n", InputError, r"line 2 of .*w\.txt is blank, between weights"),
        ("w.txt", "1\n-1\n2\n", UsageError, "the weight of class 'bee', -1.0, is negative"),
        # float32's largest is 3.4e38: 1e39 was taken, and the run diverged at its first step.
        ("w.txt", "1\n1e39\n2\n", UsageError, r"class 'bee', 1e\+39, is not a finite float32"),
        ("w.csv", "ant,1\nbee,1\ncow,-inf\n", UsageError, "class 'cow', -inf, is not a finite"),
        ("w.json", "[0, 0, 0]", UsageError, "not all zero"),
        # JSON's true is no weight (it was taken as 1, and false as 0, without a word).
        ("w.json", "[1, true, 2]", InputError, "true is not a number"),
        ("w.json", '{"ant": 1, "bee": false, "cow": 1}', InputError, "false is not a number"),
    ],
)
def test_bad_weight_files(tmp_path, name, text, error, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(error, match=message):
        class_weights(str(path), CLASSES, [1, 1, 1])
    with pytest.raises(UsageError, match="not none, balanced or a file"):
        class_weights(str(tmp_path / "missing.json"), CLASSES, [1, 1, 1])


def test_train_records_and_uses_the_weights(runner, tmp_path, make_image_folder, monkeypatch):
    import torch

    data = tmp_path / "data"
    make_image_folder(data / "train", {"ant": 6, "bee": 2})
    make_image_folder(data / "val", {"ant": 1, "bee": 1}, seed=1)
    seen = []
    original = torch.nn.CrossEntropyLoss.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append(kwargs.get("weight"))

    monkeypatch.setattr(torch.nn.CrossEntropyLoss, "__init__", recording)
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--model", "convnet", "--image-size", "8", "--epochs", "1",
         "-j", "0", "--class-weights", "balanced", "--out", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    assert recorded["class_weights"] == pytest.approx([8 / 12, 8 / 4])
    assert recorded["options"]["class_weights"] == "balanced"
    assert [w.tolist() for w in seen if w is not None] == [pytest.approx([8 / 12, 8 / 4])]


def test_the_balanced_sampler_draws_every_class_equally_often_and_is_seeded():
    from torchkit.core.data.sources.samples import Samples
    from torchkit.core.train.loaders import EpochSampler, balanced_sample_weights

    labels = [0] * 90 + [1] * 10
    samples = Samples(["common", "rare"], labels, paths=[f"{i}.png" for i in labels])
    weights = balanced_sample_weights(samples)
    drawn = []
    for epoch in range(20):
        sampler = EpochSampler(100, shuffle=True, seed=0, weights=weights)
        sampler.set_epoch(epoch)
        drawn += [labels[i] for _, i in sampler]
    assert len(drawn) == 2000 and 0.45 < sum(drawn) / len(drawn) < 0.55
    one = EpochSampler(100, shuffle=True, seed=0, weights=weights)
    two = EpochSampler(100, shuffle=True, seed=0, weights=weights)
    assert list(one) == list(two)  # the same order for the same seed and epoch (exact resume)
    # Two ranks share one epoch's draw between them, as the shuffled order is.
    ranks = [
        EpochSampler(100, shuffle=True, seed=0, rank=r, world=2, weights=weights) for r in (0, 1)
    ]
    whole = [i for _, i in one]
    assert sorted(i for r in ranks for _, i in r) == sorted(whole)


def test_the_balanced_sampler_draws_from_more_images_than_torch_multinomial_takes(monkeypatch):
    """torch.multinomial refuses more than 2**24 categories (a RuntimeError): a training set
    that large draws by the cumulative weights instead, as balanced and as seeded (the limit
    is brought down to 50 images here, torch's refusal with it)."""
    import torch

    from torchkit.core.data.sources.samples import Samples
    from torchkit.core.train import loaders

    multinomial = torch.multinomial

    def limited(weights, *args, **kwargs):
        if len(weights) > 50:
            raise RuntimeError("number of categories cannot exceed 2^24")
        return multinomial(weights, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", limited)
    monkeypatch.setattr(loaders, "MULTINOMIAL_MAX_CATEGORIES", 50, raising=False)
    labels = [0] * 90 + [1] * 10
    samples = Samples(["common", "rare"], labels, paths=[f"{i}.png" for i in labels])
    weights = loaders.balanced_sample_weights(samples)
    drawn = []
    for epoch in range(20):
        sampler = loaders.EpochSampler(100, shuffle=True, seed=0, weights=weights)
        sampler.set_epoch(epoch)
        drawn += [labels[i] for _, i in sampler]
    assert len(drawn) == 2000 and 0.45 < sum(drawn) / len(drawn) < 0.55
    one = loaders.EpochSampler(100, shuffle=True, seed=0, weights=weights)
    assert list(one) == list(loaders.EpochSampler(100, shuffle=True, seed=0, weights=weights))
    zero = loaders.weighted_draws(torch.tensor([0.0] * 60 + [1.0]), 200, torch.Generator())
    assert set(zero.tolist()) == {60}  # an image of weight 0 is never drawn


def test_train_balanced_sampler_is_recorded(runner, tmp_path, make_image_folder):
    data = tmp_path / "data"
    make_image_folder(data / "train", {"ant": 6, "bee": 2})
    make_image_folder(data / "val", {"ant": 1, "bee": 1}, seed=1)
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--model", "convnet", "--image-size", "8", "--epochs", "1",
         "-j", "0", "--balanced-sampler", "--out", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    options = json.loads((tmp_path / "run" / "config.json").read_text())["options"]
    assert options["balanced_sampler"] is True


def test_class_weights_with_the_balanced_sampler_warn_that_they_over_correct(runner):
    both = ["--class-weights", "balanced", "--balanced-sampler"]
    for given, warned in [(both, True), (both[:2], False), (both[2:], False)]:
        result = runner.invoke(app, ["train", "--data", "digits", *given, "--print-config"])
        assert result.exit_code == 0, result.stderr
        assert ("Warning: --class-weights balanced and --balanced-sampler" in result.stderr) is (
            warned
        ), result.stderr


def test_the_weighted_loss_is_torchs_and_0_for_a_batch_of_weight_0():
    import torch
    import torch.nn.functional as F

    from torchkit.core.train.class_weights import training_loss

    weights = [0.5, 0.0, 2.0]
    loss = training_loss(weights, 0.1, "cpu")
    outputs = torch.randn(5, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
    labels = torch.tensor([0, 1, 2, 2, 1])
    expected = F.cross_entropy(outputs, labels, weight=torch.tensor(weights), label_smoothing=0.1)
    assert torch.allclose(loss(outputs, labels), expected)
    only_weight_0 = loss(outputs, torch.tensor([1, 1, 1, 1, 1]))  # torch's: 0 / 0 = NaN
    only_weight_0.backward()
    assert only_weight_0.item() == 0 and torch.isfinite(outputs.grad).all()


def test_train_with_a_class_of_weight_0_is_not_a_divergence(runner, tmp_path, make_image_folder):
    # Batches of only "ant" images weigh 0 in all: the run stopped as diverged at its first.
    data = tmp_path / "data"
    make_image_folder(data / "train", {"ant": 6, "bee": 2})
    make_image_folder(data / "val", {"ant": 1, "bee": 1}, seed=1)
    weights = tmp_path / "weights.json"
    weights.write_text('{"ant": 0, "bee": 1}')
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--model", "convnet", "--image-size", "8", "--epochs", "1",
         "-j", "0", "-b", "2", "--class-weights", str(weights), "--out", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr


@pytest.fixture(scope="module")
def weighted_recipe_and_one_batch_run(tmp_path_factory) -> tuple[list[str], Path]:
    """The accumulation tests' class-weighted recipe (its data and weights file), and its run
    in one batch of 6 an update: the truth both cases compare with, trained once."""
    root = tmp_path_factory.mktemp("class-weighted")
    data = write_image_folder(root / "d", {"a": 6, "b": 6}, seed=4)
    weights = root / "weights.txt"
    weights.write_text("a,1\nb,4\n", encoding="utf-8")
    recipe = [
        "train", "--data", data, "--val-split", "0.5", "--model", "nets:TinyNet",
        "--image-size", "8", "--resize-size", "8", "--crop-scale", "1,1", "--no-flip",
        "--optimizer", "sgd", "--momentum", "0", "--weight-decay", "0", "--lr", "0.5",
        "--scheduler", "none", "--warmup-epochs", "0", "--epochs", "2", "--workers", "0",
        "--no-ema", "--device", "cpu", "--class-weights", weights, "--label-smoothing", "0.1",
        "--l1", "0.001",
    ]  # fmt: skip
    words = [str(word) for word in recipe]
    full = CliRunner().invoke(app, [*words, "--batch-size", "6", "--out", str(root / "full")])
    assert full.exit_code == 0, full.stderr
    return words, root / "full"


@pytest.mark.parametrize(
    ("batch_size", "accum_steps"),
    [("3", "2"), ("4", "2")],  # two batches of 3; a batch of 4 and the epoch's last of 2
    ids=["equal-batches", "short-last-batch"],
)
def test_accumulated_batches_weigh_classes_as_one_batch_of_their_images(
    runner, tmp_path, weighted_recipe_and_one_batch_run, batch_size, accum_steps
):
    """The class-weighted mean divides by the whole update's weight total, as one batch of all
    its images does (torch's weighted CrossEntropyLoss over them): it was the mean of each
    batch's weighted mean, so a batch of light classes had as much say as one of heavy ones."""

    words, full = weighted_recipe_and_one_batch_run
    parts = runner.invoke(
        app,
        [*words, "--batch-size", batch_size, "--accum-steps", accum_steps,
         "--out", str(tmp_path / "parts")],
    )  # fmt: skip
    assert parts.exit_code == 0, parts.stderr
    one_batch = read_checkpoint(full / "last.pt")["model"]
    accumulated = read_checkpoint(tmp_path / "parts" / "last.pt")["model"]
    for key, value in one_batch.items():
        assert torch.allclose(accumulated[key], value, atol=1e-6), key


def test_large_weights_train_as_the_same_weights_scaled_down(
    runner, tmp_path, weighted_recipe_and_one_batch_run
):
    """Weights of 2**124 and 2**126 (8.5e37, a float32 number) weigh as 1 and 4 do, to the bit:
    the loss's sums over a batch and an epoch overflowed float32, and the run stopped as
    diverged at its first step."""
    words, full = weighted_recipe_and_one_batch_run
    large = tmp_path / "large.txt"
    large.write_text(f"a,{2.0**124!r}\nb,{2.0**126!r}\n", encoding="utf-8")
    words = [str(large) if word.endswith("weights.txt") else word for word in words]
    result = runner.invoke(app, [*words, "--batch-size", "6", "--out", str(tmp_path / "large")])
    assert result.exit_code == 0, result.stderr
    ours, truth = read_checkpoint(tmp_path / "large" / "last.pt"), read_checkpoint(full / "last.pt")
    for key, value in truth["model"].items():
        assert torch.equal(ours["model"][key], value), key
    assert [row["train_loss"] for row in ours["history"]] == [
        row["train_loss"] for row in truth["history"]
    ]


@pytest.mark.parametrize("print_config", [False, True], ids=["run", "print-config"])
def test_the_weights_file_is_never_the_output(runner, tmp_path, print_config):
    """`train --class-weights w.txt -o w.txt --force` replaced the weights file with the
    summary after the run (--print-config with the recipe): an output may not be an input."""
    weights = tmp_path / "w.txt"
    weights.write_text("1\n" * 10)
    args = ["train", "--class-weights", weights, "--out", tmp_path / "run", "-o", weights]
    result = runner.invoke(app, [*map(str, args), "--force", "--epochs", "1"]
                           + (["--print-config"] if print_config else []))  # fmt: skip
    assert result.exit_code == 1, result.stdout
    said = f"Error: -o {weights} is the --class-weights file {weights} (choose another output)"
    assert said in result.stderr.splitlines()
    assert weights.read_text() == "1\n" * 10 and not (tmp_path / "run").exists()


def test_weights_by_name_for_tens_of_thousands_of_classes_are_read_in_linear_time(tmp_path):
    """Each name of the file was looked for by a scan of the class list: 40,000 classes took
    about 10 s (about a minute at 100,000)."""
    import time

    classes = [f"n{i:08d}" for i in range(40_000)]
    path = tmp_path / "w.csv"
    path.write_text("".join(f"{name},{len(classes) - i}\n" for i, name in enumerate(classes[::-1])))
    started = time.process_time()
    weights = class_weights(str(path), classes, [1] * len(classes))
    # CPU time, which other processes' load does not stretch (wall time: 0.3-2.3 s on 2 cores
    # under load): linear about 0.15 s; quadratic 10 s and more.
    assert time.process_time() - started < 2
    assert weights[:3] == [1.0, 2.0, 3.0]
    assert weights[-1] == 40_000.0


@pytest.mark.parametrize("class_weights", [None, [1.0, 4.0, 0.0]], ids=["none", "weighted"])
def test_the_epochs_loss_sums_are_the_weighted_mean_over_its_images_whatever_the_batches(
    class_weights,
):
    """The epoch's sums of batches of 2, 3 or 7 images divide to torch's weighted
    cross-entropy over all 7 at once (a hand computation from the logits): with
    --class-weights each batch's mean was weighed by its image count, and train_loss moved
    with the batch size."""
    import torch.nn.functional as F

    from torchkit.core.train.class_weights import training_loss
    from torchkit.core.train.step_sums import StepSums

    criterion = training_loss(class_weights, 0.1, "cpu")
    outputs = torch.randn(7, 3, generator=torch.Generator().manual_seed(3))
    labels = torch.tensor([0, 0, 0, 0, 1, 2, 1])
    weight = None if class_weights is None else torch.tensor(class_weights)
    expected = F.cross_entropy(outputs, labels, weight=weight, label_smoothing=0.1).item()
    for size in (2, 3, 7):
        sums = StepSums("cpu", torch.float64, getattr(criterion, "weight", None))
        for start in range(0, 7, size):
            part = slice(start, start + size)
            loss = criterion(outputs[part], labels[part])
            sums.add(loss, outputs[part], labels[part], start // size)
        assert float(sums.loss_sum / sums.loss_weight) == pytest.approx(expected, rel=1e-6)


def test_train_loss_with_class_weights_does_not_depend_on_the_batch_size(runner, tmp_path):
    """One epoch whose weights do not move (lr 1e-30): metrics.csv's train_loss of batches of
    2 and 4 is that of one batch of all 7 training images, torch's weighted mean over them
    (0.744, 0.677 and 0.675 before), as it is without class weights."""
    import csv

    data = write_image_folder(tmp_path / "d", {"a": 10, "b": 4}, seed=4)
    weights = tmp_path / "weights.txt"
    weights.write_text("a,1\nb,4\n", encoding="utf-8")
    recipe = [
        "train", "--data", data, "--val-split", "0.5", "--model", "nets:TinyNet",
        "--image-size", "8", "--resize-size", "8", "--crop-scale", "1,1", "--no-flip",
        "--optimizer", "sgd", "--momentum", "0", "--weight-decay", "0", "--lr", "1e-30",
        "--scheduler", "none", "--warmup-epochs", "0", "--epochs", "1", "--workers", "0",
        "--no-ema", "--device", "cpu", "--label-smoothing", "0.1",
    ]  # fmt: skip
    for weighted in (False, True):
        figures = []
        for size in ("2", "4", "7"):
            out = tmp_path / f"run-{weighted}-{size}"
            given = ["--class-weights", str(weights)] if weighted else []
            words = [*map(str, recipe), *given, "--batch-size", size, "--out", str(out)]
            result = runner.invoke(app, words)
            assert result.exit_code == 0, result.stderr
            with open(out / "metrics.csv", newline="") as metrics:
                figures.append(float(next(csv.DictReader(metrics))["train_loss"]))
        assert figures[0] == pytest.approx(figures[2], rel=1e-6), figures
        assert figures[1] == pytest.approx(figures[2], rel=1e-6), figures
