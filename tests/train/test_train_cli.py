"""`torchkit train` through the CLI (in-process CliRunner): outputs, options, bad input."""

from __future__ import annotations

import csv
import json
import logging
import shutil
import urllib.error
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from checkpoints import read_checkpoint
from gloo_ranks import BAD_LAUNCHES, set_launch_env
from image_folders import write_image_folder
from typer.testing import CliRunner, Result

from torchkit.cli import app

TINY = ["--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "4"]
FAST = [*TINY, "--workers", "0", "--epochs", "2"]
# digits with its data's defaults (EMA picking best.pt by val loss) but a tiny net in large
# batches: what the EMA's reporting needs, at a fraction of the cost of its convnet.
DIGITS_TINY = ["--model", "nets:TinyNet", "--image-size", "8", "-b", "256", "--epochs", "1"]


@pytest.fixture
def split_root(tmp_path: Path) -> Path:
    """train/ (3 classes x 4), val/ (x 2) and test/ (x 2) of 8x8 PNGs."""
    root = tmp_path / "data"
    write_image_folder(root / "train", {"ant": 4, "bee": 4, "cat": 4}, seed=1)
    write_image_folder(root / "val", {"ant": 2, "bee": 2, "cat": 2}, seed=2)
    write_image_folder(root / "test", {"ant": 2, "bee": 2, "cat": 2}, seed=3)
    return root


@dataclass
class FastRun:
    """A module's `split_root` (read only) and one FAST run of it (2 epochs, --val-split 0.3,
    which the root's own val/ overrides): its result, and its folder, which tests that change
    a run copy (`copied`)."""

    data: Path
    out: Path
    result: Result

    def copied(self, to: Path) -> Path:
        return Path(shutil.copytree(self.out, to))


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory) -> FastRun:
    """The run that the tests of its outputs, of fine-tuning from it and of resuming it (a
    copy) share: one training instead of one a test."""
    root = tmp_path_factory.mktemp("fast-run")
    data = root / "data"
    write_image_folder(data / "train", {"ant": 4, "bee": 4, "cat": 4}, seed=1)
    write_image_folder(data / "val", {"ant": 2, "bee": 2, "cat": 2}, seed=2)
    write_image_folder(data / "test", {"ant": 2, "bee": 2, "cat": 2}, seed=3)
    out = root / "run"
    result = CliRunner().invoke(
        app, ["train", "--data", str(data), *FAST, "--out", str(out), "--val-split", "0.3"]
    )
    assert result.exit_code == 0, result.stderr
    return FastRun(data, out, result)


def train(runner, *args: str):
    return runner.invoke(app, ["train", *args])


def metrics_rows(out: Path) -> list[dict]:
    with (out / "metrics.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_split_root_trains_and_summary_table_names_the_weights(fast_run):
    out, result = fast_run.out, fast_run.result
    assert "--val-split is ignored" in result.stderr  # the root has its own val/
    assert "Test top-1 (best.pt)" in result.stdout and "(by val top1)" in result.stdout
    assert "EMA weights" not in result.stdout
    assert "(12 train / 6 val / 6 test)" in result.stdout
    assert "epoch 2/2" in result.stderr  # one log line per epoch on stderr
    assert not (out / "profile").exists()  # no --profile-steps: nothing profiled
    checkpoint = read_checkpoint(out / "last.pt")
    assert checkpoint["classes"] == ["ant", "bee", "cat"] and checkpoint["epoch"] == 2
    assert checkpoint["preprocess"]["image_size"] == 8
    assert checkpoint["preprocess"]["resize_size"] == 9  # 8 / 0.875 for image folders
    assert len(metrics_rows(out)) == 2
    options = json.loads((out / "config.json").read_text())["options"]
    assert options["flip"] is True and options["crop_scale"] == [0.08, 1.0]


def test_val_split_and_csv_index(runner, tmp_path):
    folder = write_image_folder(tmp_path / "flat", {"x": 10, "y": 10})
    out = tmp_path / "run"
    result = train(
        runner,
        "--data",
        str(folder),
        "--val-split",
        "0.2",
        *FAST,
        "--out",
        str(out),
        "--epochs",
        "1",
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads((out / "config.json").read_text())["data_sizes"] == {
        "train": 16,
        "val": 4,
        "test": 0,
    }
    # Without --val-split, 0.1 is held out, with a note, and recorded in split.csv.
    default = train(
        runner, "--data", str(folder), *FAST, "--epochs", "1", "--out", str(tmp_path / "r2")
    )
    assert default.exit_code == 0, default.stderr
    assert "holding out 0.1 of its images for validation (2 images" in default.stderr
    assert json.loads((tmp_path / "r2" / "config.json").read_text())["data_sizes"] == {
        "train": 18,
        "val": 2,
        "test": 0,
    }
    with (tmp_path / "r2" / "split.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["split"] for row in rows].count("val") == 2 and len(rows) == 20
    index = tmp_path / "index.csv"
    rows = [f"flat/{c}/{c}_{i}.png,{c}" for c in "xy" for i in range(10)]
    index.write_text("path,label\n" + "\n".join(rows) + "\n")
    from_csv = train(
        runner,
        "--data",
        str(index),
        "--val-split",
        "0.5",
        *FAST,
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "csv"),
        "--format",
        "json",
    )
    assert from_csv.exit_code == 0, from_csv.stderr
    assert json.loads(from_csv.stdout)["history"][0]["epoch"] == 1


def test_matches_a_hand_written_loop(runner, tmp_path):
    """Full-batch SGD with L1, label smoothing and clipping: torchkit's weights equal those of
    the classic loop; and two accumulated half batches equal the full batch."""
    data = write_image_folder(tmp_path / "d", {"a": 6, "b": 6}, seed=4)
    recipe = [
        "--data",
        str(data),
        "--val-split",
        "0.5",
        "--model",
        "nets:TinyNet",
        "--image-size",
        "8",
        "--resize-size",
        "8",
        "--crop-scale",
        "1,1",
        "--no-flip",
        "--optimizer",
        "sgd",
        "--momentum",
        "0",
        "--weight-decay",
        "0",
        "--lr",
        "0.5",
        "--scheduler",
        "none",
        "--warmup-epochs",
        "0",
        "--epochs",
        "3",
        "--workers",
        "0",
        "--l1",
        "0.01",
        "--label-smoothing",
        "0.1",
        "--clip-grad",
        "0.05",
        "--device",
        "cpu",  # the classic loop below runs on the CPU
    ]
    full = train(runner, *recipe, "--batch-size", "6", "--out", str(tmp_path / "full"))
    halves = train(
        runner,
        *recipe,
        "--batch-size",
        "3",
        "--accum-steps",
        "2",
        "--out",
        str(tmp_path / "halves"),
    )
    assert full.exit_code == 0 and halves.exit_code == 0, full.stderr + halves.stderr
    ours = read_checkpoint(tmp_path / "full" / "last.pt")["model"]

    from nets import TinyNet
    from torchvision import transforms as T

    from torchkit.core.data.sources import open_data, training_splits

    torch.manual_seed(0)  # the seed torchkit builds the model with (--seed 0)
    net = TinyNet(2)
    splits, _ = training_splits(open_data(str(data)), val_split=0.5, seed=0)
    train_set = splits["train"]
    to_tensor = T.Compose([T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    from PIL import Image

    x = torch.stack([to_tensor(Image.open(p).convert("RGB")) for p in train_set.paths])
    y = torch.tensor(train_set.labels)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    for _ in range(3):
        loss = criterion(net(x), y) + 0.01 * (
            net.conv.weight.abs().sum() + net.fc.weight.abs().sum()
        )
        net.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.05)
        # Plain SGD (no momentum, no weight decay) by hand: torch.optim's step imports
        # torch._dynamo (seconds of CPU), which torchkit's own steps avoid (dynamo_free).
        with torch.no_grad():
            for parameter in net.parameters():
                parameter -= 0.5 * parameter.grad
    for key, value in net.state_dict().items():
        assert torch.allclose(ours[key], value, atol=1e-6), key
    accumulated = read_checkpoint(tmp_path / "halves" / "last.pt")["model"]
    for key, value in ours.items():
        assert torch.allclose(accumulated[key], value, atol=1e-6), key


# The accumulation tests' recipe: 6 training images, every update's gradient exact.
ACCUMULATION_RECIPE = [
    "--val-split", "0.5", "--model", "nets:TinyNet",
    "--image-size", "8", "--resize-size", "8", "--crop-scale", "1,1", "--no-flip",
    "--optimizer", "sgd", "--momentum", "0", "--weight-decay", "0", "--lr", "0.5",
    "--scheduler", "none", "--warmup-epochs", "0", "--epochs", "2", "--workers", "0",
    "--no-ema", "--device", "cpu",
]  # fmt: skip


@pytest.fixture(scope="module")
def one_batch_run(tmp_path_factory) -> tuple[Path, Path]:
    """The accumulation tests' data and the run of their recipe in one batch of 6 an update
    (the truth both cases compare with, trained once)."""
    root = tmp_path_factory.mktemp("one-batch")
    data = write_image_folder(root / "d", {"a": 6, "b": 6}, seed=4)
    full = CliRunner().invoke(
        app,
        ["train", "--data", str(data), *ACCUMULATION_RECIPE, "--batch-size", "6",
         "--out", str(root / "full")],
    )  # fmt: skip
    assert full.exit_code == 0, full.stderr
    return data, root / "full"


@pytest.mark.parametrize(
    ("batch_size", "accum_steps"),
    [
        # The last update of an epoch accumulates fewer than --accum-steps batches: its
        # gradient is their mean, as a full batch's is (it was their sum / --accum-steps, so
        # --accum-steps 4 over 2 batches halved every update, and a large value trained nothing).
        ("3", "4"),
        # Batches of 4 and 2 in one update train as one batch of 6: each batch weighs by its
        # images (the mean of the two batches' means overweighted the 2).
        ("4", "2"),
    ],
    ids=["epoch-shorter-than-accum-steps", "short-last-batch-in-an-update"],
)
def test_accumulated_batches_train_as_one_batch_of_their_images(
    runner, tmp_path, one_batch_run, batch_size, accum_steps
):
    data, full = one_batch_run
    parts = train(
        runner, "--data", str(data), *ACCUMULATION_RECIPE, "--batch-size", batch_size,
        "--accum-steps", accum_steps, "--out", str(tmp_path / "parts"), "--format", "json",
    )  # fmt: skip
    assert parts.exit_code == 0, parts.stderr
    # global_batch_size is one forward-backward pass over the ranks; images_per_update what an
    # optimizer step learns from (--accum-steps passes): in config.json and the JSON report.
    config = json.loads((tmp_path / "parts" / "config.json").read_text())
    per_update = int(batch_size) * int(accum_steps)
    assert (config["global_batch_size"], config["images_per_update"]) == (
        int(batch_size),
        per_update,
    )
    assert json.loads(parts.stdout)["images_per_update"] == per_update
    ours = read_checkpoint(full / "last.pt")["model"]
    accumulated = read_checkpoint(tmp_path / "parts" / "last.pt")["model"]
    for key, value in ours.items():
        assert torch.allclose(accumulated[key], value, atol=1e-6), key


def test_fine_tuning_freeze_backbone_and_head_lr(runner, fast_run, tmp_path):
    split_root, first = fast_run.data, fast_run.out  # both only read
    start = read_checkpoint(first / "best.pt")["model"]
    frozen = tmp_path / "frozen"
    result = train(
        runner,
        "--data",
        str(split_root),
        *FAST,
        "--weights",
        str(first / "best.pt"),
        "--freeze-backbone",
        "--head-lr-mult",
        "10",
        "--out",
        str(frozen),
    )
    assert result.exit_code == 0, result.stderr
    after = read_checkpoint(frozen / "last.pt")
    for key in ("conv.weight", "conv.bias"):
        assert torch.equal(after["model"][key], start[key])  # frozen
    assert not torch.equal(after["model"]["fc.weight"], start["fc.weight"])  # trained
    groups = after["optimizer"]["param_groups"]
    assert [g["group_name"] for g in groups] == ["head_decay", "head_no_decay"]
    assert groups[0]["base_lr"] == pytest.approx(10 * 3e-3)
    assert groups[1]["weight_decay"] == 0.0

    split = tmp_path / "split_lr"
    result = train(
        runner, "--data", str(split_root), *FAST, "--backbone-lr", "0.001", "--out", str(split)
    )
    assert result.exit_code == 0, result.stderr
    base = {
        g["group_name"]: g["base_lr"]
        for g in read_checkpoint(split / "last.pt")["optimizer"]["param_groups"]
    }
    assert base == {
        "backbone_decay": 0.001,
        "backbone_no_decay": 0.001,
        "head_decay": 3e-3,
        "head_no_decay": 3e-3,
    }


def test_regularisers_amp_channels_last_ema_and_periodic_checkpoints(runner, split_root, tmp_path):
    from nets import AutocastProbe

    AutocastProbe.seen.clear()
    out = tmp_path / "run"
    result = train(
        runner,
        "--data",
        str(split_root),
        *FAST,
        "--epochs",
        "3",
        "--model",
        "nets:AutocastProbe",
        "--device",
        "cpu",  # --amp's dtype is the device's: bfloat16 on the CPU
        "--amp",
        "--channels-last",
        "--ema",
        "--mixup-alpha",
        "0.2",
        "--cutmix-alpha",
        "1.0",
        "--save-every",
        "1",
        "--keep",
        "2",
        "--optimizer",
        "sgd",
        "--nesterov",
        "--scheduler",
        "step",
        "--step-size",
        "1",
        "--out",
        str(out),
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.stderr
    assert AutocastProbe.seen and set(AutocastProbe.seen) == {torch.bfloat16}
    assert sorted(p.name for p in out.glob("epoch-*.pt")) == ["epoch-002.pt", "epoch-003.pt"]
    last = read_checkpoint(out / "last.pt")
    assert set(last["model_ema"]) == set(last["model"])
    assert not torch.equal(last["model_ema"]["fc.weight"], last["model"]["fc.weight"])
    assert "val_ema_top1" in metrics_rows(out)[0]
    summary = json.loads(result.stdout)
    assert [round(r["lr"], 8) for r in summary["history"]] == [3e-3, 3e-4, 3e-5]
    assert summary["test_ema_top1"] is not None


@pytest.fixture(scope="module")
def early_stop_runs(fast_run, tmp_path_factory) -> dict[int, tuple[Path, Result]]:
    """--early-stop 2 runs of 6 and of 3 epochs whose val metrics repeat from epoch 1, by
    their --epochs: what test_early_stop reads and the resume tests resume (a copy)."""
    root = tmp_path_factory.mktemp("early-stop")
    runs = {}
    for epochs in (6, 3):
        out = root / f"epochs-{epochs}"
        result = CliRunner().invoke(
            app,
            ["train", "--data", str(fast_run.data), *FAST, "--epochs", str(epochs),
             "--lr", "1e-30",  # updates vanish in float32: the val metrics repeat exactly
             "--early-stop", "2",
             "--device", "cpu",  # exactly: the CPU's kernels
             "--out", str(out), "--format", "json"],
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        runs[epochs] = out, result
    return runs


@pytest.mark.parametrize("epochs", [6, 3], ids=["stops-early", "patience-out-at-the-last-epoch"])
def test_early_stop(early_stop_runs, epochs):
    """The val metrics repeat from epoch 1, so the patience of 2 runs out at epoch 3: of 6 asked
    for, a stop; of 3, every epoch asked for was trained (no stop reported)."""
    _, result = early_stop_runs[epochs]
    summary = json.loads(result.stdout)
    assert (summary["epochs"], summary["best_epoch"]) == (3, 1)
    assert summary["stopped_early"] is (epochs > 3)


def test_resuming_a_run_that_stopped_early_trains_nothing_unless_early_stop_is_raised(
    runner, early_stop_runs, tmp_path
):
    """As a run that trained all its epochs: its stop rule is already met, so --resume says so
    and trains nothing (it used to train one more epoch and stop again); a larger --early-stop
    continues it."""
    out = Path(shutil.copytree(early_stop_runs[6][0], tmp_path / "r"))  # stopped after 3 of 6
    trusted = "--trust-checkpoint"  # the run's model is code (nets:TinyNet)
    again = train(runner, "--resume", str(out), trusted, "--format", "json")
    assert again.exit_code == 0, again.stderr
    assert "stopped early after 3 epochs, 2 without a better val" in again.stderr
    assert "nothing to train" in again.stderr
    summary = json.loads(again.stdout)
    assert (summary["epochs"], summary["stopped_early"]) == (3, True)
    assert [int(r["epoch"]) for r in metrics_rows(out)] == [1, 2, 3]
    assert read_checkpoint(out / "last.pt")["epoch"] == 3
    raised = train(runner, "--resume", str(out), trusted, "--early-stop", "3")
    assert raised.exit_code == 0, raised.stderr
    assert "nothing to train" not in raised.stderr
    assert [int(r["epoch"]) for r in metrics_rows(out)] == [1, 2, 3, 4]


def test_resuming_a_run_whose_patience_ran_out_at_its_last_epoch_says_it_did_not_stop_early(
    runner, early_stop_runs, tmp_path
):
    """Its patience of 2 ran out at epoch 3 of its 3: a larger --epochs trains nothing more,
    and the warning and summary say its rule is met, not that the run stopped early."""
    out = Path(shutil.copytree(early_stop_runs[3][0], tmp_path / "r"))
    trusted = "--trust-checkpoint"  # the run's model is code (nets:TinyNet)
    again = train(runner, "--resume", str(out), trusted, "--epochs", "6", "--format", "json")
    assert again.exit_code == 0, again.stderr
    assert "the run's --early-stop rule is met after 3 epochs, 2 without" in again.stderr
    assert "stopped early" not in again.stderr
    summary = json.loads(again.stdout)
    assert (summary["epochs"], summary["stopped_early"]) == (3, False)
    assert [int(r["epoch"]) for r in metrics_rows(out)] == [1, 2, 3]


def test_with_ema_best_pt_is_picked_by_the_ema_weights(runner, split_root, tmp_path):
    out = tmp_path / "r"
    args = ["--data", str(split_root), *FAST, "--epochs", "4", "--lr", "0.05", "--ema"]
    args += ["--ema-decay", "0.5", "--best-metric", "loss", "--out", str(out), "--format", "json"]
    result = train(runner, *args)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    lowest = min(summary["history"], key=lambda row: row["val_ema_loss"])
    assert summary["best_by_ema"] is True and summary["best_epoch"] == lowest["epoch"]
    assert summary["best_val_top1"] == lowest["val_ema_top1"]
    assert read_checkpoint(out / "best.pt")["epoch"] == lowest["epoch"]
    # Each epoch's line shows the EMA metrics that mark it *best.
    line = next(x for x in result.stderr.splitlines() if x.startswith(f"epoch {lowest['epoch']}/"))
    assert f"ema loss {lowest['val_ema_loss']:.4f} top1 {lowest['val_ema_top1']:.4f}" in line
    assert line.endswith("*best")  # the lowest EMA loss of all beat every epoch before it


def test_summary_table_says_the_ema_weights_picked_best_pt(runner, tmp_path):
    table = tmp_path / "table.txt"  # -o renders it wide, so no label is cut short
    result = train(runner, *DIGITS_TINY, "--out", str(tmp_path / "r"), "-o", str(table))
    assert result.exit_code == 0, result.stderr
    text = table.read_text()
    for label in (
        "1 (by val loss, EMA weights)",
        "Best val top-1 (EMA weights)",
        "Test top-1 (best.pt)",
        "Test top-1, EMA weights (best.pt)",
    ):
        assert label in text


def test_a_best_epoch_from_before_ema_was_turned_on_is_not_called_the_emas(
    runner, split_root, tmp_path
):
    """A run resumed with --ema ranks its earlier epochs by the model's metrics: where one of
    them stays best, the summary reports the model's figures as such (it called them the EMA
    weights', and said the EMA weights picked an epoch that had none)."""
    out = tmp_path / "r"
    args = ["--data", str(split_root), *TINY, "-j", "0", "--epochs", "1", "--best-metric", "loss"]
    assert train(runner, *args, "--out", str(out)).exit_code == 0
    # A learning rate of 1 wrecks the weights (and their average): epoch 2 is not the best.
    resumed = train(
        runner, "--resume", str(out), "--trust-checkpoint", "--ema", "--epochs", "2",
        "--lr", "1", "--format", "json",
    )  # fmt: skip
    assert resumed.exit_code == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    best = summary["history"][summary["best_epoch"] - 1]
    assert summary["best_epoch"] == 1 and "val_ema_loss" not in best
    assert summary["best_by_ema"] is False
    assert summary["best_val_top1"] == best["val_top1"]


def test_no_ema_turns_the_digits_default_off(runner, tmp_path):
    out = tmp_path / "r"
    result = train(runner, *DIGITS_TINY, "--no-ema", "--out", str(out), "--format", "json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["best_by_ema"] is False and summary["test_ema_top1"] is None
    assert "val_ema_loss" not in metrics_rows(out)[0]
    assert "model_ema" not in read_checkpoint(out / "last.pt")


def test_best_metric_loss_picks_the_lowest_validation_loss(runner, split_root, tmp_path):
    out = tmp_path / "r"
    args = ["--data", str(split_root), *FAST, "--epochs", "4", "--lr", "0.05"]
    result = train(runner, *args, "--best-metric", "loss", "--out", str(out), "--format", "json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    lowest = min(summary["history"], key=lambda row: row["val_loss"])
    assert summary["best_metric"] == "loss" and summary["best_epoch"] == lowest["epoch"]
    assert read_checkpoint(out / "best.pt")["epoch"] == lowest["epoch"]
    assert read_checkpoint(out / "best.pt")["best_metric"] == pytest.approx(lowest["val_loss"])


def test_resume_continues_and_can_extend_the_run(runner, fast_run, tmp_path):
    out = fast_run.copied(tmp_path / "run")
    trusted = "--trust-checkpoint"  # the run's model is code (nets:TinyNet)
    more = train(runner, "--resume", str(out), "--epochs", "4", "--format", "json", trusted)
    assert more.exit_code == 0, more.stderr
    summary = json.loads(more.stdout)
    assert summary["epochs"] == 4 and summary["resumed_from"] == str(out / "last.pt")
    assert [int(r["epoch"]) for r in metrics_rows(out)] == [1, 2, 3, 4]
    assert read_checkpoint(out / "last.pt")["epoch"] == 4
    done = train(runner, "--resume", str(out), trusted)
    assert done.exit_code == 0, done.stderr
    assert "already trained 4 epochs, all that --epochs 4 asks for: nothing to train" in (
        done.stderr
    )


def test_a_resume_with_nothing_to_train_leaves_config_json_as_the_run_trained(
    runner, fast_run, tmp_path
):
    """config.json took the options given again (--lr 0.5, --epochs 1) although no checkpoint
    was trained with them, and a replay of it (--config) ran another recipe."""
    out = fast_run.copied(tmp_path / "run")
    recorded = (out / "config.json").read_bytes()
    trusted = "--trust-checkpoint"  # the run's model is code (nets:TinyNet)
    again = train(runner, "--resume", str(out), "--lr", "0.5", "--epochs", "1", trusted)
    assert again.exit_code == 0 and "nothing to train" in again.stderr
    assert (out / "config.json").read_bytes() == recorded


def test_a_resume_with_fewer_epochs_than_trained_says_so_plainly(runner, fast_run, tmp_path):
    """--epochs 1 on a run of 2 epochs read `trained 2 of 1 epochs`; it names the checkpoint,
    what it trained, and the --epochs that would continue it."""
    out = fast_run.copied(tmp_path / "run")
    again = train(runner, "--resume", str(out), "--epochs", "1", "--trust-checkpoint")
    assert again.exit_code == 0, again.stderr
    assert (
        f"{out / 'last.pt'} already trained 2 epochs, more than --epochs 1: nothing to train "
        "(pass --epochs 3 or more to continue it)"
    ) in again.stderr
    assert "of 1 epochs" not in again.stderr


def test_a_resume_inside_an_epoch_beyond_a_smaller_epochs_says_there_is_nothing_to_train(
    runner, split_root, tmp_path, monkeypatch
):
    """A checkpoint saved inside epoch 2 resumed with --epochs 1 trained nothing, silently
    (exit 0, a summary of 1 epoch), where a checkpoint saved at an epoch's end says why."""
    from nets import NoisyNet

    out = tmp_path / "run"
    noisy = ["--model", "nets:NoisyNet", "--image-size", "8", "--batch-size", "4", "-j", "0"]
    NoisyNet.forwards = 0
    monkeypatch.setenv("TORCHKIT_TEST_SIGINT_AT", "5")  # Ctrl-C in epoch 2's 2nd step
    args = ["--data", str(split_root), *noisy, "--epochs", "3", "--out", str(out)]
    assert train(runner, *args).exit_code == 130
    monkeypatch.delenv("TORCHKIT_TEST_SIGINT_AT")
    assert read_checkpoint(out / "last.pt")["epoch_progress"]["batches"] == 2
    again = train(runner, "--resume", str(out), "--epochs", "1", "--trust-checkpoint")
    assert again.exit_code == 0, again.stderr
    assert (
        "already trained 1 epoch and part of epoch 2, more than --epochs 1: nothing to train "
        "(pass --epochs 2 or more to continue it)"
    ) in again.stderr


def test_resume_runs_on_the_saved_device_unless_another_is_given(
    runner, split_root, tmp_path, monkeypatch
):
    """--device is an option like the others: a resumed run keeps the saved one (it used to
    take the command line's default, `auto`, which on a GPU machine moved a CPU run onto the
    GPU halfway). --dist-timeout stays this invocation's own (IGNORED_ON_RESUME)."""
    from torchkit.core.runtime import distributed

    out = tmp_path / "run"
    first = [*FAST, "--epochs", "1", "--device", "cpu", "--dist-timeout", "77"]
    assert train(runner, "--data", str(split_root), *first, "--out", str(out)).exit_code == 0
    asked = []
    place, join = distributed.place, distributed.join

    def place_spy(device_spec):
        asked.append(device_spec)
        return place(device_spec)

    def join_spy(ctx, timeout_s=None, **kwargs):
        asked.append(timeout_s)
        return join(ctx, timeout_s, **kwargs)

    monkeypatch.setattr(distributed, "place", place_spy)
    monkeypatch.setattr(distributed, "join", join_spy)
    trusted = "--trust-checkpoint"
    assert train(runner, "--resume", str(out), "--epochs", "2", trusted).exit_code == 0
    again = train(runner, "--resume", str(out), "--epochs", "3", "--device", "auto", trusted)
    assert again.exit_code == 0, again.stderr
    assert asked == ["cpu", 1800.0, "auto", 1800.0]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_compile_wraps_the_model_without_torchs_no_cuda_runtime_warning(
    runner, split_root, tmp_path, monkeypatch
):
    """A CPU run with --compile printed torch's "No CUDA runtime is found, using CUDA_HOME=..."
    (logged by torch.utils.cpp_extension when the compiler first imports it, on a machine with
    a CUDA toolkit and no GPU): that one message is dropped, the logger's others are not."""
    compiled = []

    def fake_compile(model, *args, **kwargs):
        compiled.append(model)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    result = train(
        runner,
        "--data",
        str(split_root),
        *FAST,
        "--epochs",
        "1",
        "--compile",
        "--out",
        str(tmp_path / "r"),
    )
    assert result.exit_code == 0, result.stderr
    assert len(compiled) == 1
    records = _Records()
    logger = logging.getLogger("torch.utils.cpp_extension")
    logger.addHandler(records)
    try:
        logger.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local")
        logger.warning("another warning")
    finally:
        logger.removeHandler(records)
    assert records.messages == ["another warning"]


# -- bad input: one `Error:` line, non-zero exit, nothing lost -----------------------------------


def test_existing_out_needs_resume_or_force(runner, fast_run, split_root, tmp_path):
    out = fast_run.copied(tmp_path / "run")  # a finished run of another copy of the data
    before = (out / "last.pt").read_bytes()
    again = train(runner, "--data", str(split_root), *FAST, "--out", str(out))
    assert again.exit_code == 1
    assert "already exists" in error_line(again) and "--resume" in error_line(again)
    assert (out / "last.pt").read_bytes() == before
    # --force whose run fails before its first checkpoint puts the old run back untouched.
    (split_root / "train" / "ant" / "broken.png").write_bytes(b"")
    failed = train(
        runner, "--data", str(split_root), *FAST, "--out", str(out), "--force", "--strict"
    )
    assert failed.exit_code == 1 and "broken.png" in error_line(failed)
    assert (out / "last.pt").read_bytes() == before
    assert not list(tmp_path.glob(".run*"))  # nothing left beside it
    # --force replaces only what torchkit wrote: a file of the user's in the run is refused.
    (out / "notes.txt").write_text("mine")
    forced = [*FAST, "--epochs", "1", "--out", str(out), "--force"]
    refused = train(runner, "--data", str(split_root), *forced)
    assert refused.exit_code == 1 and "notes.txt that torchkit did not write" in error_line(refused)
    assert (out / "last.pt").read_bytes() == before and (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    forced = train(runner, "--data", str(split_root), *forced)
    assert forced.exit_code == 0, forced.stderr
    assert read_checkpoint(out / "last.pt")["epoch"] == 1
    assert not list(tmp_path.glob(".run*"))


@pytest.mark.parametrize(
    "layout, message",
    [
        ({"a": 3, "b": 0}, "class 'b' has no training images"),
        ({"a": 3}, "only one class"),
    ],
)
def test_unusable_class_layouts(runner, tmp_path, layout, message):
    root = tmp_path / "data"
    write_image_folder(root / "train", layout)
    write_image_folder(root / "val", {name: 1 for name in layout})
    for name in layout:
        (root / "train" / name).mkdir(parents=True, exist_ok=True)
    result = train(runner, "--data", str(root), *FAST, "--out", str(tmp_path / "run"))
    assert result.exit_code == 1
    assert message in error_line(result)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("layout", "val_split", "message"),
    [
        # was "class 'a', 'b' has no training images"
        ({"a": 3, "b": 3, "c": 2}, "0.9", "class 'b', 'c' have no training images (hold out a "
         "smaller --val-split, or add images)"),
        # was "use a larger --val-split or add images", which then emptied training instead
        ({"a": 1, "b": 1}, "0.5", "the validation set is empty (a class of one image cannot be "
         "both trained and validated on: add images, or give validation images of their own, "
         "as ROOT/train/ and ROOT/val/ folders or a CSV index with a split column)"),
        ({"a": 1, "b": 1}, "0.9", "class 'a', 'b' have no training images (a class of one "
         "image cannot be both"),
        ({"a": 2, "b": 2}, "0.1", "(use a larger --val-split or add images)"),
    ],
)  # fmt: skip
def test_a_held_out_split_that_leaves_nothing_says_what_works(
    runner, tmp_path, layout, val_split, message
):
    root = write_image_folder(tmp_path / "data", layout)
    args = ["--data", str(root), "--val-split", val_split, *FAST, "--out", str(tmp_path / "run")]
    result = train(runner, *args)
    assert result.exit_code == 1
    assert message in error_line(result)
    assert not (tmp_path / "run").exists()


def test_corrupt_training_and_test_images_are_skipped_with_a_warning_each_or_fatal_with_strict(
    runner, split_root, tmp_path
):
    """Each unreadable image is warned of once (not once an epoch) and counted in
    skipped_images, the test split's too: the test evaluation of best.pt runs after the epochs,
    and its unreadable image was warned of but left out of skipped_images."""
    (split_root / "train" / "ant" / "broken.png").write_bytes(b"\x89PNG not really")
    (split_root / "test" / "cat" / "unreadable.png").write_bytes(b"\x89PNG not really")
    result = train(
        runner, "--data", str(split_root), *FAST, "--out", str(tmp_path / "a"), "--format", "json"
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["skipped_images"] == 2
    assert result.stderr.count("Warning: skipped unreadable image") == 2  # once each, 2 epochs
    assert "unreadable.png" in result.stderr
    strict = train(
        runner, "--data", str(split_root), *FAST, "--strict", "--out", str(tmp_path / "b")
    )
    assert strict.exit_code == 1
    assert "broken.png" in error_line(strict)


def test_unreadable_images_past_the_first_few_are_counted_without_a_warning_each(
    runner, split_root, tmp_path, monkeypatch
):
    """A warning line per unreadable file buried the epoch lines of a dataset with many broken
    files (200 lines for 200 empty files): the first few are named, then one line says that
    the rest are only counted; the count in the summary stays whole."""
    from torchkit.core.train import loop

    monkeypatch.setattr(loop, "UNREADABLE_WARNINGS", 2)
    for index in range(3):
        (split_root / "train" / "ant" / f"broken{index}.png").write_bytes(b"\x89PNG not really")
    (split_root / "test" / "cat" / "unreadable.png").write_bytes(b"")
    result = train(
        runner, "--data", str(split_root), *FAST, "--out", str(tmp_path / "a"), "--format", "json"
    )
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["skipped_images"] == 4
    assert result.stderr.count("Warning: skipped unreadable image") == 2
    assert result.stderr.count("Warning: more than 2 unreadable images: the others are") == 1


def test_unknown_model_suggests_names(runner, split_root, tmp_path):
    result = train(  # -j 0: workers started before the model is known are test_epoch_starts'
        runner, "--data", str(split_root), "--model", "resnet81", "-j", "0", "--out",
        str(tmp_path / "r"),
    )  # fmt: skip
    assert result.exit_code == 2
    assert "did you mean resnet18" in error_line(result)


def test_pretrained_weights_offline_is_a_clear_error(runner, split_root, tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    result = train(
        runner,
        "--data",
        str(split_root),
        "--model",
        "resnet18",
        "--weights",
        "DEFAULT",
        "--image-size",
        "8",
        "-j",
        "0",
        "--out",
        str(tmp_path / "r"),
    )
    assert result.exit_code == 1
    line = error_line(result)
    assert "cannot download" in line and "--weights PATH" in line


def test_resume_with_another_model_or_class_count_is_refused(runner, fast_run, tmp_path):
    out = fast_run.copied(tmp_path / "run")
    other_model = train(runner, "--resume", str(out), "--model", "convnet")
    assert other_model.exit_code == 1
    assert "nets:TinyNet, not convnet" in error_line(other_model)
    two_classes = tmp_path / "two"
    write_image_folder(two_classes / "train", {"ant": 2, "bee": 2})
    write_image_folder(two_classes / "val", {"ant": 1, "bee": 1})
    other_data = train(runner, "--resume", str(out), "--data", str(two_classes))
    assert other_data.exit_code == 1
    assert "trained on 3 classes" in error_line(other_data)
    assert read_checkpoint(out / "last.pt")["epoch"] == 2  # untouched


def test_resume_on_a_csv_index_of_the_runs_numbered_class_folders_goes_on_as_on_the_folders(
    runner, tmp_path
):
    """A folder sorts numbered classes as text (`1, 10, 2`), a CSV index of the same images as
    numbers (`1, 2, 10`): resuming the folder's run on its index was refused as "trained on 3
    classes (1, 10, 2), the data has 3 (1, 2, 10)", though the same form of other class names
    resumes. The index is now labelled in the run's order and goes on as the folders do."""
    data = tmp_path / "data"
    counts = {"1": 4, "2": 4, "10": 4}
    write_image_folder(data / "train", counts, seed=1)
    write_image_folder(data / "val", {name: 2 for name in counts}, seed=2)
    with (data / "index.csv").open("w", newline="") as handle:
        rows = csv.writer(handle)
        rows.writerow(["path", "label", "split"])
        for split in ("train", "val"):
            for name in ("1", "10", "2"):  # as the folders list them
                for image in sorted((data / split / name).iterdir()):
                    rows.writerow([image.relative_to(data).as_posix(), name, split])
    first = tmp_path / "first"
    args = [*FAST, "--epochs", "1", "--device", "cpu", "--deterministic"]
    assert train(runner, "--data", str(data), *args, "--out", str(first)).exit_code == 0
    assert read_checkpoint(first / "last.pt")["classes"] == ["1", "10", "2"]
    shutil.copytree(first, tmp_path / "second")
    more = ["--epochs", "2", "--trust-checkpoint"]
    on_folders = train(runner, "--resume", str(first), *more)
    assert on_folders.exit_code == 0, on_folders.stderr
    on_index = train(
        runner, "--resume", str(tmp_path / "second"), "--data", str(data / "index.csv"), *more
    )
    assert on_index.exit_code == 0, on_index.stderr
    folders, index = (
        read_checkpoint(first / "last.pt"),
        read_checkpoint(tmp_path / "second" / "last.pt"),
    )
    assert index["classes"] == ["1", "10", "2"]
    for key, value in folders["model"].items():
        assert torch.equal(index["model"][key], value), key


def test_resume_on_data_with_another_number_of_training_images_says_it_is_not_exact(
    runner, fast_run, tmp_path
):
    """Went on without a word: the schedule counts updates per epoch, so with 6 training
    images of 12 cosine's end came halfway and the rest of the run trained at a learning rate
    of 0 (its val loss the same every epoch)."""
    out = fast_run.copied(tmp_path / "run")  # 2 epochs on 12 training images
    fewer = tmp_path / "fewer"
    write_image_folder(fewer / "train", {"ant": 2, "bee": 2, "cat": 2}, seed=1)
    write_image_folder(fewer / "val", {"ant": 2, "bee": 2, "cat": 2}, seed=2)
    trusted = "--trust-checkpoint"  # the run's model is code (nets:TinyNet)
    resumed = train(runner, "--resume", str(out), "--data", str(fewer), "--epochs", "4", trusted)
    assert resumed.exit_code == 0, resumed.stderr
    assert "trained on 12 training images, the data has 6: the run continues" in resumed.stderr
    same = train(runner, "--resume", str(out), "--epochs", "5", trusted)  # its 6 images now
    assert same.exit_code == 0 and "training images" not in same.stderr


def test_out_of_memory_keeps_the_last_checkpoint(runner, split_root, tmp_path):
    from nets import OutOfMemoryNet

    OutOfMemoryNet.forwards, OutOfMemoryNet.after = 0, 3  # 3 batches = epoch 1
    out = tmp_path / "run"
    result = train(
        runner,
        "--data",
        str(split_root),
        *FAST,
        "--model",
        "nets:OutOfMemoryNet",
        "--out",
        str(out),
    )
    assert result.exit_code == 1
    assert "out of memory" in error_line(result) and "--batch-size" in error_line(result)
    assert read_checkpoint(out / "last.pt")["epoch"] == 1


def test_sync_bn_is_refused_without_cuda_before_anything_is_written(runner, split_root, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the refusal is for machines without CUDA")
    result = train(
        runner, "--data", str(split_root), *FAST, "--sync-bn", "--out", str(tmp_path / "r")
    )
    assert result.exit_code == 2
    assert "--sync-bn needs CUDA" in error_line(result)
    assert not (tmp_path / "r").exists()


def test_resuming_a_sync_bn_run_without_cuda_gives_a_hint_a_resume_can_follow(
    runner, split_root, tmp_path
):
    """A resume cannot drop --sync-bn (the run records it): the hint said "drop --sync-bn".
    It now says how to continue here: revert a copy of the checkpoint and resume that."""
    if torch.cuda.is_available():
        pytest.skip("the refusal is for machines without CUDA")
    tiny = ["--image-size", "8", "--batch-size", "4", "--workers", "0", "--epochs", "2"]
    data = ["--data", str(split_root), "--model", "convnet", *tiny, "--device", "cpu"]
    assert train(runner, *data, "--out", str(tmp_path / "run")).exit_code == 0
    # Marked as a --sync-bn run on GPUs saves it (the recorded option is what a resume reads;
    # convert-syncbn marks no model without BatchNorm, such as convnet).
    from torchkit.core.convert.syncbn import mark_checkpoint
    from torchkit.core.models.checkpoint import save_checkpoint

    synced = tmp_path / "my sync" / "last.pt"  # the hint's command quotes it: one shell word
    synced.parent.mkdir()
    marked = mark_checkpoint(read_checkpoint(tmp_path / "run" / "last.pt"), sync=True)
    save_checkpoint(marked, synced)
    result = train(runner, "--resume", str(synced), "--device", "cpu")
    assert result.exit_code == 2
    assert error_line(result) == (
        f"Error: {synced} was trained with --sync-bn, which needs CUDA GPUs: SyncBatchNorm "
        "cannot train on CPU tensors (resume it on a GPU, or on several under torchrun; or "
        "continue on this device from a copy without it: torchkit convert-syncbn --revert "
        f"'{synced}' NEW/last.pt, then torchkit train --resume NEW/last.pt)"
    )
    assert sorted(p.name for p in synced.parent.iterdir()) == ["last.pt"]
    new = tmp_path / "new" / "last.pt"
    reverted = runner.invoke(app, ["convert-syncbn", "--revert", str(synced), str(new)])
    assert reverted.exit_code == 0, reverted.stderr
    result = train(runner, "--resume", str(new), "--epochs", "3", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    assert [row["epoch"] for row in metrics_rows(new.parent)] == ["1", "2", "3"]


@pytest.mark.parametrize(("env", "line"), BAD_LAUNCHES)
def test_torchrun_variables_no_torchrun_sets_are_one_usage_error(
    runner, tmp_path, monkeypatch, env, line
):
    """They were a KeyError or ValueError line (an internal error, exit 1)."""
    set_launch_env(monkeypatch, env)
    result = train(runner, *FAST, "--out", str(tmp_path / "r"))
    assert result.exit_code == 2, result.stderr
    assert error_line(result) == line
    assert not (tmp_path / "r").exists()


def test_tensorboard_without_the_package_is_a_clear_error(
    runner, split_root, tmp_path, monkeypatch
):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else real(name, *a),
    )
    result = train(
        runner, "--data", str(split_root), *FAST, "--tensorboard", "--out", str(tmp_path / "r")
    )
    assert result.exit_code == 1
    assert "needs the tensorboard package" in error_line(result)


def test_tensorboard_logs_each_epoch(runner, split_root, tmp_path, monkeypatch):
    from torchkit.core.train import outputs
    from torchkit.core.train import runner as train_runner

    logged = []

    class FakeWriter:
        def __init__(self, log_dir, purge_step=None, filename_suffix=""):
            logged.append(("dir", log_dir))

        def add_scalar(self, tag, value, step):
            logged.append((tag, step))

        def flush(self):
            pass

        def close(self):
            logged.append(("closed", None))

    monkeypatch.setattr(train_runner, "check_tensorboard", lambda: None)
    monkeypatch.setattr(outputs, "summary_writer_class", lambda: FakeWriter)
    out = tmp_path / "r"
    result = train(runner, "--data", str(split_root), *FAST, "--tensorboard", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert logged[0] == ("dir", str(out / "tensorboard"))
    assert ("val/val_top1", 2) in logged and ("train/train_loss", 1) in logged
    assert logged[-1] == ("closed", None)


def test_bad_option_values_are_usage_errors(runner, tmp_path):
    result = train(runner, "--mean", "0.5,abc", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "--mean" in error_line(result)
    both = train(
        runner, "--backbone-lr", "0.1", "--head-lr-mult", "2", "--out", str(tmp_path / "r")
    )
    assert both.exit_code == 2 and "give one" in error_line(both)
    out = str(tmp_path / "r")
    for command in (["train", "--out", out], ["extract-features", "convnet", "data", out]):
        huge = runner.invoke(app, [*command, "--seed", str(2**64)])
        assert huge.exit_code == 2 and "--seed " in error_line(huge), huge.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_fp16_amp_uses_a_grad_scaler_and_sync_bn_warns_for_one_process(
    runner, split_root, tmp_path
):
    out = tmp_path / "run"
    result = train(
        runner,
        "--data",
        str(split_root),
        *FAST,
        "--device",
        "cuda",
        "--amp",
        "--amp-dtype",
        "fp16",
        "--channels-last",
        "--sync-bn",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.stderr
    assert "--sync-bn has no effect in a single process" in result.stderr
    checkpoint = read_checkpoint(out / "last.pt")
    assert checkpoint["scaler"] and "scale" in checkpoint["scaler"]
    assert json.loads((out / "config.json").read_text())["amp_dtype"] == "float16"


def test_top5_keeps_its_name_for_two_classes_and_is_null_there(runner, tmp_path, make_image_folder):
    """One rule for top-k, as eval's: always `*_top5` (a script need not know the class count),
    null/empty where 5 >= the classes (top-5 of 2 classes is 1 by definition), no table row."""
    data = make_image_folder(tmp_path / "data", {"a": 6, "b": 6})
    args = ["train", "--data", str(data), "--model", "convnet", "--image-size", "8",
            "--epochs", "1", "-j", "0"]  # fmt: skip
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "run"), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["topk"] == 5 and summary["num_classes"] == 2
    assert summary["best_val_top5"] is None and summary["history"][0]["val_top5"] is None
    assert "best_val_top2" not in summary and "val_top2" not in summary["history"][0]
    assert " top2 " not in result.stderr and " top5 " not in result.stderr
    rows = metrics_rows(tmp_path / "run")
    assert rows[0]["val_top5"] == "" and "val_top2" not in rows[0]
    table = runner.invoke(app, [*args, "--out", str(tmp_path / "run2")])
    assert "Best val top-1" in table.stdout
    assert "top-2" not in table.stdout and "top-5" not in table.stdout


def test_csv_summary_is_the_json_plain_values(runner, tmp_path, make_image_folder):
    """`--format csv`: the JSON's snake_case keys and plain numbers in one row, never the
    table's display strings (`"3,392"`, `3.9 s`, `2 (by val loss)`)."""
    data = make_image_folder(tmp_path / "data", {"a": 6, "b": 6, "c": 6, "d": 6, "e": 6, "f": 6})
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--model", "convnet", "--image-size", "8", "--epochs", "1",
         "-j", "0", "--out", str(tmp_path / "run"), "--format", "csv"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    [row] = list(csv.DictReader(result.stdout.splitlines()))
    assert int(row["best_epoch"]) == 1 and row["best_metric"] == "top1"
    assert row["best_by_ema"] == "False" and row["model"] == "convnet"
    for key in ("best_val_top1", "best_val_top5", "images_per_s", "total_seconds"):
        assert float(row[key]) >= 0, key
    assert int(row["train_size"]) + int(row["val_size"]) == 36
    assert "history" not in row and "config" not in row


def test_fine_tuning_a_torchkit_checkpoint_takes_its_input_size_and_interpolation(
    runner, split_root, tmp_path
):
    """Fine-tuning a torchkit checkpoint trained at 12 px (the digits convnet) on an image folder
    trained at the folder default 224 px: its flattening head did not fit ("mat1 and mat2 shapes
    cannot be multiplied"), and any other model silently trained at another size and with
    bilinear resizes. The checkpoint's image size, resize size and interpolation are now the
    defaults; each option given stays the user's."""
    from checkpoints import write_convnet_checkpoint

    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.validation import resolve_defaults

    checkpoint = tmp_path / "small.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=12, classes="abc")
    saved = read_checkpoint(checkpoint)
    saved["preprocess"].update(resize_size=14, interpolation="bicubic")
    torch.save(saved, checkpoint)

    def chosen(**options):
        config = resolve_defaults(TrainConfig(data="images", **options), is_digits=False)
        return config.image_size, config.resize_size, config.interpolation

    assert chosen(model=str(checkpoint)) == (12, 14, "bicubic")
    assert chosen(model="convnet", weights=str(checkpoint), image_size=16) == (16, 19, "bicubic")
    assert chosen(model=str(checkpoint), interpolation="nearest") == (12, 14, "nearest")
    assert chosen(model="convnet") == (224, 256, "bilinear")
    out = tmp_path / "tuned"
    args = ["--data", str(split_root), "--model", str(checkpoint), "-j", "0", "--epochs", "1"]
    result = train(runner, *args, "--batch-size", "4", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    preprocess = read_checkpoint(out / "best.pt")["preprocess"]
    assert (preprocess["image_size"], preprocess["interpolation"]) == (12, "bicubic")


def test_fine_tuning_a_one_channel_checkpoint_is_one_error_line(runner, split_root, tmp_path):
    """`--model GRAY.pt` (a checkpoint of 1-channel input) fed train's RGB batches to its first
    convolution: an internal "expected input ... to have 1 channels" after the run had started."""
    from checkpoints import write_convnet_checkpoint

    checkpoint = tmp_path / "gray.pt"
    write_convnet_checkpoint(checkpoint, in_channels=1, image_size=8, classes="abc")
    out = tmp_path / "tuned"
    args = ["--data", str(split_root), "--model", str(checkpoint), "-j", "0", "--out", str(out)]
    result = train(runner, *args)
    assert result.exit_code == 1
    assert "takes 1-channel images, and train feeds it 3-channel (RGB)" in error_line(result)
    assert not out.exists()


def test_fine_tuning_a_fixed_size_checkpoint_at_another_image_size_is_refused_before_the_run(
    runner, split_root, tmp_path
):
    """`--model RUN/best.pt --image-size N` of a checkpoint whose model is built for the size it
    records (the convnet's classifier; a ViT's position embeddings) started the run, then died
    at its first batch with torch's "mat1 and mat2 shapes cannot be multiplied" (exit 1). Now
    one usage error before the run, naming both sizes."""
    from checkpoints import write_convnet_checkpoint

    checkpoint = tmp_path / "small.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=12, classes="abc")
    out = tmp_path / "tuned"
    args = ["--data", str(split_root), "--model", str(checkpoint), "-j", "0", "--out", str(out)]
    result = train(runner, *args, "--image-size", "16")
    assert result.exit_code == 2, result.stderr
    assert error_line(result) == (
        f"Error: --image-size 16: {checkpoint} (convnet) does not run on 16x16 images; it is "
        "built for the 12 px its checkpoint records (drop --image-size to fine-tune at 12, or "
        "train a new --model convnet at 16)"
    )
    assert not out.exists()


def test_fine_tuning_weights_of_the_same_classes_in_another_order_keeps_each_output_its_class(
    runner, split_root, tmp_path
):
    """Weights whose classes are the data's in another order (a folder sorts numbered classes
    as text, `1, 10, 2`, a CSV index of it as numbers) kept their head as it was: every output
    was renamed to the class at its place in the data, a trained head silently scrambled. Its
    rows now follow the data's order, with a warning."""
    from checkpoints import write_convnet_checkpoint

    checkpoint = tmp_path / "shuffled.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="bca")
    saved = read_checkpoint(checkpoint)
    saved["classes"] = ["bee", "cat", "ant"]  # split_root's classes, outputs 0, 1, 2
    torch.save(saved, checkpoint)
    out = tmp_path / "tuned"
    result = train(
        runner, "--data", str(split_root), "--model", str(checkpoint), "-j", "0", "--epochs",
        "1", "--optimizer", "sgd", "--momentum", "0", "--weight-decay", "0", "--lr", "1e-12",
        "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "names the data's classes in another order (bee, cat, ant)" in result.stderr
    tuned = read_checkpoint(out / "last.pt")
    assert tuned["classes"] == ["ant", "bee", "cat"]
    for key in ("classifier.4.weight", "classifier.4.bias"):
        torch.testing.assert_close(tuned["model"][key], saved["model"][key][[2, 0, 1]])


def test_fine_tuning_a_torchkit_checkpoint_normalises_as_it_was_trained(
    runner, split_root, tmp_path
):
    """`--weights RUN/best.pt` (or `--model RUN/best.pt`) normalised with train's ImageNet
    default instead of the mean/std the checkpoint records, which its weights were trained on;
    a --mean or --std given stays the user's."""
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.validation import resolve_defaults

    first = tmp_path / "first"
    made = train(
        runner, "--data", str(split_root), *FAST, "--epochs", "1", "--mean", "0.3", "--std",
        "0.2", "--out", str(first),
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    checkpoint = str(first / "best.pt")
    tuned = tmp_path / "tuned"
    result = train(
        runner, "--data", str(split_root), *FAST, "--epochs", "1", "--weights", checkpoint,
        "--out", str(tuned),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    preprocess = read_checkpoint(tuned / "best.pt")["preprocess"]
    assert (preprocess["mean"], preprocess["std"]) == ([0.3] * 3, [0.2] * 3)

    def mean_std(**options):
        config = resolve_defaults(TrainConfig(data="images", **options), is_digits=False)
        return config.mean, config.std

    assert mean_std(model=checkpoint) == ((0.3,) * 3, (0.2,) * 3)
    assert mean_std(model="nets:TinyNet", weights=checkpoint, std=(0.5,)) == (
        (0.3,) * 3,
        (0.5,) * 3,
    )
