"""`train --find-lr`: the range test finds a suggestion inside the sweep on a synthetic problem,
stops on divergence, restores the weights, and leaves only its files behind."""

from __future__ import annotations

import csv
import json
import math
from types import SimpleNamespace

import pytest
import torch
from output_checks import error_line

from torchkit.cli import app
from torchkit.core.io.errors import UsageError
from torchkit.core.train import lr_find
from torchkit.core.train.lr_find import find_lr, lr_schedule, range_test, suggest


def test_the_schedule_is_geometric_from_min_to_max():
    lrs = lr_schedule(1e-6, 1.0, 7)
    assert lrs[0] == pytest.approx(1e-6) and lrs[-1] == pytest.approx(1.0)
    assert all(b / a == pytest.approx(10.0) for a, b in zip(lrs, lrs[1:], strict=False))
    with pytest.raises(UsageError):
        lr_schedule(1.0, 0.1, 10)


def test_a_synthetic_loss_gives_a_suggestion_before_the_minimum_and_stops_on_divergence():
    """The loss falls fastest around 1e-3 (a logistic drop in log lr), bottoms out, then
    explodes above 1e-1."""

    def loss_at(lr: float) -> float:
        x = math.log10(lr)
        drop = 2.0 / (1 + math.exp(-3 * (x + 3)))  # steepest at lr = 1e-3
        return 3.0 - drop + (0 if lr < 0.1 else 50 * (x + 1) ** 2)

    result = range_test(
        lambda batch, lr: loss_at(lr), lambda: iter([None] * 1000), lr_schedule(1e-6, 10, 200)
    )
    assert result.diverged and result.lrs[-1] < 10  # stopped before the end of the sweep
    assert 1e-4 < result.suggested_lr < 1e-2  # near the steepest descent
    assert result.suggested_lr < result.lrs[result.smoothed.index(min(result.smoothed))]
    assert suggest([1e-3, 1e-2, 1e-1], [1.0, 1.0, 1.0]) is None  # a flat loss: no suggestion


def test_a_noisy_first_batch_is_not_the_suggestion():
    """The smoothed loss of the first steps averages one or two losses: a first batch 0.5 above
    the rest fell faster there than anywhere (1.2e-07 was suggested for digits' seed 1)."""

    def loss_at(lr: float) -> float:
        return 3.0 - 2.0 / (1 + math.exp(-3 * (math.log10(lr) + 3)))  # steepest at 1e-3

    losses = iter([3.5] + [loss_at(lr) for lr in lr_schedule(1e-7, 10, 100)][1:])
    result = range_test(
        lambda batch, lr: next(losses), lambda: iter([None] * 100), lr_schedule(1e-7, 10, 100)
    )
    assert 1e-4 < result.suggested_lr < 1e-2


def test_find_lr_restores_the_model_and_the_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batches = [
        SimpleNamespace(images=torch.randn(4, 3, 2, 2), labels=torch.randint(0, 3, (4,)))
        for _ in range(3)
    ]
    ctx = SimpleNamespace(
        module=model, model=model, optimizer=optimizer, criterion=torch.nn.CrossEntropyLoss(),
        device=torch.device("cpu"), autocast=lambda: torch.autocast("cpu", enabled=False),
        scaler=None, channels_last=False, normalized_pixels=None,  # float batches: not used
        frozen_norms=None,
    )  # fmt: skip
    result = find_lr(ctx, lambda: iter(batches), lr_min=1e-4, lr_max=1.0, iterations=10)
    assert len(result.lrs) == 10  # cycled through the 3 batches
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert optimizer.state_dict()["state"] == {} and optimizer.param_groups[0]["lr"] == 1e-3


def test_train_find_lr_writes_its_files_and_no_checkpoint(runner, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        # --lr-max low enough that the sweep does not diverge and stop early: all 25 steps. A
        # tiny net at 8 px: the sweep's steps are the same code for any model.
        ["train", "--data", "digits", "--find-lr", "--find-lr-iters", "25", "--lr-max", "0.01",
         "--model", "nets:TinyNet", "--image-size", "8", "--out", str(out), "-j", "0",
         "--format", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["lr_find_iterations"] == 25
    assert data["suggested_lr"] is None or 1e-7 <= data["suggested_lr"] <= 10
    with open(out / "lr_find.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["lr", "loss", "smoothed_loss"] and len(rows) == 25
    assert (out / "lr_find.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(out.glob("*.pt"))
    refused = runner.invoke(app, ["train", "--find-lr", "--lr-min", "1", "--lr-max", "0.1"])
    assert refused.exit_code == 2 and "need 0 < MIN < MAX" in refused.stderr


def test_a_sweep_longer_than_memory_runs_until_it_diverges(monkeypatch):
    """--find-lr-iters 2**40 filled the memory before the first step (the whole list of rates
    was built up front: a MemoryError, or the OOM killer); the rates are drawn as the sweep
    goes. (The list is refused here so that the test cannot fill the machine's memory.)"""

    def whole_list(*args):
        raise AssertionError("the sweep's rates were built up front")

    monkeypatch.setattr(lr_find, "lr_schedule", whole_list)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    calls = []

    def criterion(outputs, labels):  # diverges at the fourth step
        calls.append(1)
        loss = torch.nn.functional.cross_entropy(outputs, labels)
        return loss * math.inf if len(calls) == 4 else loss

    batch = SimpleNamespace(images=torch.randn(4, 3, 2, 2), labels=torch.randint(0, 3, (4,)))
    ctx = SimpleNamespace(
        module=model, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3),
        criterion=criterion, device=torch.device("cpu"),
        autocast=lambda: torch.autocast("cpu", enabled=False), scaler=None,
        channels_last=False, normalized_pixels=None, frozen_norms=None,
    )  # fmt: skip
    result = find_lr(ctx, lambda: iter([batch]), lr_min=1e-4, lr_max=1.0, iterations=2**40)
    assert result.diverged and len(result.lrs) == 3


def test_a_range_too_narrow_for_its_steps_is_a_usage_error(runner, tmp_path):
    """Every step at one rate was a ZeroDivisionError when the suggestion was computed."""
    result = runner.invoke(
        app,
        ["train", "--data", "digits", "--find-lr", "--lr-min", "1e-5", "--lr-max",
         "1.0000000000000003e-05", "--find-lr-iters", "20", "--out", str(tmp_path / "run"),
         "-j", "0"],
    )  # fmt: skip
    assert result.exit_code == 2, result.stderr
    assert "too close for 20 steps" in error_line(result.stderr)
    assert not (tmp_path / "run").exists()
    assert suggest([1e-3, 1e-3, 1e-3, 1e-2], [3.0, 2.0, 1.0, 0.5]) == 1e-2  # equal rates skipped


@pytest.mark.parametrize(
    ("options", "swept_group"),
    [(["--head-lr-mult", "10"], "backbone_decay"), (["--freeze-backbone"], "head_decay")],
)
def test_the_sweep_steps_as_training_does_at_rates_of_the_lr_option(
    runner, tmp_path, monkeypatch, options, swept_group
):
    """The rates of lr_find.csv (and the suggestion) are --lr's: with --head-lr-mult 10 the
    head's rate was swept (the backbone's a tenth of it), so the suggested --lr trained the head
    ten times faster than the test had. And a frozen backbone's BatchNorm runs on its running
    statistics, as training runs it (it ran in training mode, on each batch's statistics)."""
    from image_folders import write_image_folder

    from torchkit.core.runtime import dynamo_free

    steps, norm_modes = [], []
    step, norm_forward = dynamo_free.step, torch.nn.BatchNorm2d.forward

    def recording_step(optimizer):
        steps.append({group["group_name"]: group["lr"] for group in optimizer.param_groups})
        return step(optimizer)

    def recording_norm(self, images):
        norm_modes.append(self.training)
        return norm_forward(self, images)

    monkeypatch.setattr(dynamo_free, "step", recording_step)
    monkeypatch.setattr(torch.nn.BatchNorm2d, "forward", recording_norm)
    data = write_image_folder(tmp_path / "d", {"a": 6, "b": 6}, seed=4)
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--model", "nets:NoisyNet", "--image-size", "8",
         "--batch-size", "4", "--workers", "0", "--device", "cpu", "--find-lr",
         "--find-lr-iters", "4", "--lr-min", "1e-4", "--lr-max", "1e-2", "--lr", "0.01",
         "--out", str(out), *options],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    with open(out / "lr_find.csv", newline="") as handle:
        swept = [float(row["lr"]) for row in csv.DictReader(handle)]
    assert len(steps) == len(swept) == 4
    assert [lrs[swept_group] for lrs in steps] == pytest.approx(swept, rel=1e-5)
    if "--head-lr-mult" in options:
        head = [lrs["head_decay"] for lrs in steps]
        assert head == pytest.approx([10 * rate for rate in swept], rel=1e-5)
    else:
        assert norm_modes and not any(norm_modes)  # the frozen backbone's one BatchNorm


def test_a_skipped_step_does_not_bias_the_smoothed_loss():
    """A step without a readable image adds no loss to the average, and counted in its bias
    correction all the same it halved the first smoothed loss (a flat loss of 2.0 read 1.01,
    then rose towards 2: no suggestion could come from such a curve)."""
    losses = iter([None, 2.0, 2.0, 2.0])
    result = range_test(
        lambda batch, lr: next(losses), lambda: iter([None] * 10), lr_schedule(1e-4, 1e-1, 4)
    )
    assert result.smoothed == pytest.approx([2.0, 2.0, 2.0])


def test_lr_find_csv_holds_the_rates_tried_and_the_suggestion_whole(tmp_path):
    """lr_find.csv wrote its figures as `.6g` with its own csv.writer: the rates read back were
    not the ones stepped nor JSON's suggested_lr, and in a long sweep neighbouring rates read
    the same. The shared CSV writer writes floats as repr: each reads back exactly."""
    lrs = list(lr_find.lr_sweep(1e-7, 10.0, 40))
    losses = [2.0 - math.log10(lr) / 100 + lr for lr in lrs]
    result = lr_find.LRFindResult(lrs=lrs, losses=losses, smoothed=losses)
    result.suggested_lr = suggest(lrs, losses)
    assert result.suggested_lr is not None

    class Painted:  # the plot is not what this test reads
        def draw(self, *args, **kwargs) -> bool:
            return True

    lr_find.write_lr_find(tmp_path, result, painter=Painted())
    with open(tmp_path / "lr_find.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["lr", "loss", "smoothed_loss"]
    assert [float(row["lr"]) for row in rows] == lrs
    assert [float(row["loss"]) for row in rows] == losses
    assert [float(row["smoothed_loss"]) for row in rows] == losses
    assert result.suggested_lr in [float(row["lr"]) for row in rows]
