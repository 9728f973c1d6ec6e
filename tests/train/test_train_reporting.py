"""What `train` reports and computes for the options that change it: a backbone at
--backbone-lr 0, the top-k figures of few classes, the --l1 penalty."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import torch
from checkpoints import read_checkpoint
from image_folders import write_image_folder
from nets import GradProbeNet

from torchkit.cli import app

PROBE = ["--model", "nets:GradProbeNet", "--image-size", "16", "--batch-size", "4"]
FAST = [*PROBE, "--workers", "0", "--device", "cpu"]


@pytest.fixture
def split_root(tmp_path: Path) -> Path:
    """train/ (3 classes x 4), val/ (x 2) of 8x8 PNGs."""
    root = tmp_path / "data"
    write_image_folder(root / "train", {"ant": 4, "bee": 4, "cat": 4}, seed=1)
    write_image_folder(root / "val", {"ant": 2, "bee": 2, "cat": 2}, seed=2)
    return root


def metrics_rows(out: Path) -> list[dict]:
    with (out / "metrics.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_backbone_at_lr_0_gets_no_gradients_and_its_norms_follow_the_data(
    runner, split_root, tmp_path
):
    """--backbone-lr 0 left the backbone out of the optimizer but trainable: every step
    computed its gradients, which nothing cleared. Now it is frozen as with --freeze-backbone,
    but its BatchNorm statistics go on following the data (train mode, as in timm or torch);
    EMA, the checkpoints and --resume work as before, and the lr column is the head's."""
    out = tmp_path / "run"
    args = [*FAST, "--backbone-lr", "0", "--lr", "0.01", "--scheduler", "none", "--ema"]
    GradProbeNet.seen.clear()
    result = runner.invoke(
        app,
        [
            "train",
            "--data",
            str(split_root),
            *args,
            "--epochs",
            "2",
            "--save-every",
            "1",
            "--out",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stderr
    assert GradProbeNet.seen and set(GradProbeNet.seen) == {(False, False)}
    first, last = read_checkpoint(out / "epoch-001.pt"), read_checkpoint(out / "last.pt")
    for key in ("conv.weight", "bn.weight", "bn.bias"):
        assert torch.equal(first["model"][key], last["model"][key])  # not trained
    assert not torch.equal(first["model"]["bn.running_mean"], last["model"]["bn.running_mean"])
    assert not torch.equal(first["model"]["head.2.weight"], last["model"]["head.2.weight"])
    assert "model_ema" in last
    groups = last["optimizer"]["param_groups"]
    assert [g["group_name"] for g in groups] == ["head_decay", "head_no_decay"]
    assert [float(row["lr"]) for row in metrics_rows(out)] == [0.01, 0.01]

    GradProbeNet.seen.clear()
    resumed = runner.invoke(
        app, ["train", "--resume", str(out), "--epochs", "3", "--trust-checkpoint", "-j", "0"]
    )
    assert resumed.exit_code == 0, resumed.stderr
    assert set(GradProbeNet.seen) == {(False, False)} and len(metrics_rows(out)) == 3
    assert torch.equal(
        read_checkpoint(out / "last.pt")["model"]["conv.weight"], last["model"]["conv.weight"]
    )


def test_train_loss_is_the_criterion_and_the_l1_penalty_has_its_own_column(runner, tmp_path):
    """train_loss included the --l1 penalty, so it could not be set beside val_loss. Now it is
    the criterion's loss (as in timm's and torchvision's scripts) and the penalty trained on
    is metrics.csv's train_l1, after the columns there were. With the training images as the
    validation set, an lr too small to move the weights and a model without BatchNorm,
    train_loss is val_loss."""

    root = tmp_path / "data"
    for split in ("train", "val"):
        write_image_folder(root / split, {"ant": 4, "bee": 4, "cat": 4}, seed=1)
    out = tmp_path / "run"
    options = ["--augment", "none", "--no-flip", "--label-smoothing", "0", "--lr", "1e-9"]
    tiny = ["--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "4", "-j", "0"]
    args = ["train", "--data", str(root), *tiny, *options, "--l1", "0.5", "--epochs", "1"]
    result = runner.invoke(app, [*args, "--out", str(out), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    [row] = metrics_rows(out)
    assert float(row["train_loss"]) == pytest.approx(float(row["val_loss"]), rel=1e-4)
    assert list(row)[-1] == "train_l1" and list(row)[:-1] == [
        "epoch", "train_loss", "train_top1", "val_loss", "val_top1", "val_top5", "lr",
        "epoch_time_s", "images_per_s",
    ]  # fmt: skip
    weights = read_checkpoint(out / "last.pt")["model"]
    penalty = 0.5 * sum(float(weights[k].abs().sum()) for k in ("conv.weight", "fc.weight"))
    assert float(row["train_l1"]) == pytest.approx(penalty, rel=1e-4)
    summary = json.loads(result.stdout)
    assert summary["last_train_loss"] == pytest.approx(float(row["train_loss"]), rel=1e-5)
    assert summary["history"][0]["train_l1"] == pytest.approx(penalty, rel=1e-4)


def test_the_run_info_and_the_result_name_one_k_for_the_top_k_figures(split_root, tmp_path):
    """With 3 classes the RunInfo told callbacks a k of 3 (min(5, classes)) while the result,
    the JSON and eval say 5 with a null figure (`core.topk`: the k is fixed, its figure left out
    where it says nothing): every report of a run now names the same k."""
    from torchkit.core.topk import DEFAULT_TOPK
    from torchkit.core.train import TrainCallbacks, TrainConfig, run_training

    class InfoSeen(TrainCallbacks):
        def on_start(self, info) -> None:
            self.info = info

    seen = InfoSeen()
    config = TrainConfig(
        data=str(split_root), model="nets:TinyNet", image_size=8, batch_size=4, workers=0,
        epochs=1, device="cpu", out=str(tmp_path / "run"),
    )  # fmt: skip
    result = run_training(config, seen)
    assert seen.info.topk == result.topk == result.to_dict()["topk"] == DEFAULT_TOPK
    assert len(seen.info.classes) == 3 and result.to_dict()["best_val_top5"] is None


def test_metrics_csv_keeps_every_figure_whole_and_leaves_unknown_ones_empty(tmp_path):
    """metrics.csv went through its own csv.writer with floats as `.6g`: a throughput of
    1234567.5 images/s read 1.23457e+06 and every loss and rate lost its last digits, so the
    file disagreed with the checkpoint's history and `--format json`. It is written by the
    shared CSV writer now, as every other CSV: a float as repr (it reads back exactly), a
    figure not known (no val_loss, a top-5 of 3 classes) an empty field, NaN as `nan`."""
    from torchkit.core.train.outputs import write_metrics_csv

    history = [
        {"epoch": 1, "train_loss": 0.6931471805599453, "train_top1": 0.123456789,
         "val_loss": None, "val_top1": 0.5, "val_top5": 1.0, "lr": 0.0009938441702975689,
         "epoch_time_s": 12.345678901, "images_per_s": 1234567.5},
        {"epoch": 2, "train_loss": math.nan, "train_top1": 0.25, "val_loss": math.inf,
         "val_top1": 0.75, "val_top5": 1.0, "lr": 1e-05, "epoch_time_s": 0.5,
         "images_per_s": 98765.4321},
    ]  # fmt: skip
    write_metrics_csv(tmp_path / "metrics.csv", history, num_classes=3)
    text = (tmp_path / "metrics.csv").read_text()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == list(history[0])  # the columns and their order as before
    for row, epoch in zip(rows, history, strict=True):
        for name, value in epoch.items():
            if name == "val_top5" or value is None:  # 3 classes: top-5 says nothing
                assert row[name] == ""
            elif isinstance(value, float) and math.isnan(value):
                assert row[name] == "nan"
            else:
                assert float(row[name]) == value, name
    assert text.splitlines()[1].startswith("1,0.6931471805599453,0.123456789,,0.5,,")
    assert "1234567.5" in text and "e+06" not in text
