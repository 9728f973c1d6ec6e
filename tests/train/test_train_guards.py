"""`torchkit train` cannot lie (issue #14): every float option is a finite number in range; a
diverged run stops with an error (on every rank) and keeps its last good checkpoints; an epoch or
a validation pass with no readable image is an error, not a loss of 0; a CSV row without a label
is refused; --resume applies the options it can apply for real and refuses the others naming both
values, and a run resumed into another folder carries its best.pt; --amp chooses float16 (with a
GradScaler) on GPUs without native bfloat16; batches are pinned when the loader pins; metric sums
fit devices without float64 (MPS).

The network is named on the command line as `nets:NanNet` (tests/helpers/nets.py, on
PYTHONPATH): with TORCHKIT_TEST_NAN_AT=N its N-th training forward pass (1-based) returns NaN, on
every rank or only on rank TORCHKIT_TEST_NAN_RANK; with TORCHKIT_TEST_INF_GRAD_AT=N the loss of
its N-th pass is finite but its gradient infinite."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import warnings
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from checkpoints import read_checkpoint
from gloo_ranks import error_lines_of, run_ranks, stderr_of
from image_folders import write_image_folder
from nets import NanNet
from output_checks import error_line, tree_digest
from processes import run_each_in_process, run_torchkit_in_process
from suite_paths import HELPERS
from torch import nn

from torchkit.cli import app
from torchkit.core.io.errors import CheckpointError, InputError, UsageError
from torchkit.core.io.shell_words import shell_word
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.resume_merge import merge_for_resume
from torchkit.core.train.resume_rules import FIXED_ON_RESUME
from torchkit.core.train.validation import option_name, resolve_defaults, validate

ENV = {"PYTHONPATH": str(HELPERS), "OMP_NUM_THREADS": "1"}
TINY = ["--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "4"]
FAST = [*TINY, "--workers", "0", "--device", "cpu"]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """`data` (train 3 classes x 4, val and test x 1 of 8x8 PNGs: 3 batches of 4 per epoch),
    `bad-train` (every training image corrupt), `bad-val` (every validation image corrupt) and
    `index.csv` (a row without a label)."""
    root = tmp_path_factory.mktemp("honest")
    data = root / "data"
    write_image_folder(data / "train", {"a": 4, "b": 4, "c": 4}, seed=1)
    write_image_folder(data / "val", {"a": 1, "b": 1, "c": 1}, seed=2)
    write_image_folder(data / "test", {"a": 1, "b": 1, "c": 1}, seed=3)
    for name, corrupt in (("bad-train", "train"), ("bad-val", "val")):
        shutil.copytree(data, root / name)
        for image in (root / name / corrupt).rglob("*.png"):
            image.write_bytes(b"not a PNG")
    rows = [f"data/train/{c}/{c}_{i}.png,{c}" for c in "abc" for i in range(4)]
    rows[5] = "data/train/b/b_1.png,"  # line 7 of the file (the header is line 1)
    (root / "index.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    return root


@pytest.fixture(scope="module")
def trained(world: Path, tmp_path_factory) -> Path:
    """A finished 2-epoch AdamW run on `data` with a constant learning rate (in-process)."""
    from typer.testing import CliRunner

    from torchkit.cli import app

    out = tmp_path_factory.mktemp("honest-run") / "run"
    result = CliRunner().invoke(
        app,
        ["train", "--data", str(world / "data"), *FAST, "--epochs", "2",
         "--scheduler", "none", "--warmup-epochs", "0", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return out


def all_finite(checkpoint: dict) -> bool:
    tensors = [*checkpoint["model"].values(), *checkpoint.get("model_ema", {}).values()]
    return all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())


# -- 1. every float option is a finite number, in range ------------------------------------------


def _float_fields() -> list[str]:
    return [f.name for f in fields(TrainConfig) if "float" in str(f.type)]


@pytest.mark.parametrize("name", _float_fields())
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_every_float_option_of_the_config_must_be_finite(name, bad):
    field = next(f for f in fields(TrainConfig) if f.name == name)
    value = (0.5, bad) if "tuple" in str(field.type) else bad
    with pytest.raises(UsageError, match=f"^{option_name(name)} must be a finite number"):
        validate(TrainConfig(**{name: value}))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"momentum": 1.0}, "--momentum must be in [0, 1)"),
        ({"momentum": -0.1}, "--momentum must be in [0, 1)"),
        ({"gamma": 0.0}, "--gamma is a decay factor"),
        ({"gamma": 1.5}, "--gamma is a decay factor"),
        ({"lr": 0.01, "min_lr": 0.1}, "--min-lr 0.1 is larger than --lr 0.01"),
        ({"lr": -0.1}, "--lr must be positive"),
        ({"label_smoothing": -0.1}, "--label-smoothing must be in [0, 1)"),
        ({"ema_decay": 1.0}, "--ema-decay must be between 0 and 1"),
        ({"weight_decay": -1.0}, "--weight-decay must not be negative"),
        ({"warmup_epochs": -1.0}, "--warmup-epochs must not be negative"),
        # Before: an internal OverflowError (1e308 x the updates of an epoch), or a schedule
        # that never reached --lr.
        ({"epochs": 3, "warmup_epochs": 1e308}, "--warmup-epochs 1e+308 is longer than the run"),
        ({"epochs": 3, "warmup_epochs": 3.5}, "--warmup-epochs 3.5 is longer than the run"),
        # Before: "--warmup-epochs 5.0" for --warmup-epochs 5 (a float option, held as 5.0).
        ({"epochs": 2, "warmup_epochs": 5.0}, "--warmup-epochs 5 is longer than the run"),
        ({"lr_min": 2.0, "lr_max": 1.0, "find_lr": True}, "--lr-min 2 and --lr-max 1: need"),
        # Before: torch's ValueError about a Dirichlet, or a lam of 0.5 where ~0 or ~1 was due.
        ({"mixup_alpha": 1e-300}, "--mixup-alpha 1e-300 is too small"),
        ({"cutmix_alpha": 0.001}, "--cutmix-alpha 0.001 is too small"),
        # Before: taken, and torch's float32 Beta(inf, inf) drew lam 1.2e-38 (not 0.5).
        ({"mixup_alpha": 1e39}, "--mixup-alpha 1e+39 is too large"),
        ({"cutmix_alpha": 1e300}, "--cutmix-alpha 1e+300 is too large"),
        ({"val_split": 1.0}, "--val-split must be between 0 and 1"),
        ({"std": (0.2, 0.0, 0.2)}, "--std values must be positive"),
        # Before: both drops fired before epoch 1, a silent 100x smaller learning rate.
        (
            {"scheduler": "multistep", "milestones": (-1, 0)},
            "--milestones are the epochs after which the learning rate drops, from 1: not -1,0",
        ),
        # Before: torch.manual_seed's "Overflow when unpacking long long", an internal error
        # (a --config file can give what the --seed option's range refuses).
        ({"seed": 2**64}, "--seed 18446744073709551616 is not a seed"),
        ({"seed": -1}, "--seed -1 is not a seed"),  # the seeds every command takes, 0 to 2**32-1
        # Before: a --config file's -1 profiled and wrote profile/ (the option refuses it).
        ({"profile_steps": -1}, "--profile-steps must not be negative"),
        # Before: an internal OverflowError under torchrun, or a wait wrapped to a negative one
        # that failed at once as "did not all join within 8.64e+13 s".
        ({"dist_timeout": 1e308}, "--dist-timeout 1e+308 is longer than torch can wait"),
        # Before: taken, and cuDNN's C int wrapped it to -2147483648 (2**40 to 0, "all").
        ({"cudnn_benchmark_limit": 2**31}, "--cudnn-benchmark-limit 2147483648 is more than"),
    ],
)
def test_out_of_range_values_are_refused(changes, message):
    with pytest.raises(UsageError) as refused:
        validate(TrainConfig(**changes))
    assert message in refused.value.message


@pytest.mark.parametrize(
    ("option", "message"),
    [
        # were "Error: ValueError: Stop argument for islice()..." and "...Overflow when
        # unpacking long" (exit 1), after the data was loaded
        ("--batch-size", "is more than a batch can hold"),
        ("--threads", "is more than torch takes"),
    ],
)
def test_counts_beyond_what_torch_takes_are_usage_errors(runner, tmp_path, option, message):
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", option, str(2**70), "--epochs", "1", "--out", str(out)])
    assert result.exit_code == 2, result.stderr
    assert message in error_line(result.stderr)
    assert not out.exists()


def test_more_workers_than_the_machine_can_use_is_a_usage_error(runner, tmp_path, monkeypatch):
    """Was accepted: the loaders forked -j processes until the memory ran out."""
    import multiprocessing.process

    def start(process):
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "-j", "100000", "--epochs", "1", "--out", str(out)])
    assert result.exit_code == 2, result.stderr
    assert error_line(result.stderr).startswith(
        "Error: --workers 100000 is more than this machine can use (at most "
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("options", "crop"),
    [([], "--image-size"), (["--train-crop-size", "6"], "--train-crop-size")],
)
def test_running_out_of_gpu_memory_names_the_option_that_sizes_the_training_crop(
    runner, tmp_path, monkeypatch, options, crop
):
    # With --train-crop-size the training batches are that size: a smaller --image-size only
    # shrinks validation's.
    import torchkit.core.train.runner as train_runner

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(train_runner, "_train", out_of_memory)
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "--epochs", "1", *options, "--out", str(out)])
    assert result.exit_code == 1, result.stderr
    line = error_line(result.stderr)
    assert line.startswith("Error: the GPU ran out of memory with --batch-size")
    assert line.endswith(
        f"(use a smaller --batch-size, --amp, or a smaller {crop}; --accum-steps keeps the "
        "effective batch with a smaller --batch-size)"
    )


def test_non_finite_options_are_usage_errors_naming_the_option(tmp_path):
    cases = [
        ("--lr", "nan"), ("--weight-decay", "nan"), ("--momentum", "nan"),
        ("--clip-grad", "nan"), ("--min-lr", "inf"), ("--backbone-lr", "nan"),
        ("--head-lr-mult", "nan"), ("--l1", "nan"), ("--label-smoothing", "nan"),
        ("--mixup-alpha", "inf"), ("--ema-decay", "nan"), ("--warmup-epochs", "inf"),
        ("--gamma", "nan"), ("--val-split", "nan"),
    ]  # fmt: skip
    # (--epochs 1: the code before the check trained them, for 1 epoch rather than 20.)
    results = run_each_in_process(
        [["train", option, value, "--epochs", "1", "--out", tmp_path / f"r{i}"]
         for i, (option, value) in enumerate(cases)]
    )  # fmt: skip
    for (option, value), result in zip(cases, results, strict=True):
        assert result.returncode == 2, (option, result.stderr[-2000:])
        line = error_line(result.stderr)
        assert f"{option} must be a finite number, not {value}" in line, option
    assert list(tmp_path.iterdir()) == []


# -- 2. a non-finite loss stops the run; the last good checkpoints stay ---------------------------


def test_a_diverging_run_stops_naming_epoch_and_step_and_keeps_the_last_good_epoch(
    world, trained, tmp_path, monkeypatch
):
    data = str(world / "data")
    nan_run, fresh = tmp_path / "nan", tmp_path / "fresh"
    resumed = tmp_path / "resumed"
    shutil.copytree(trained, resumed)
    before = tree_digest(resumed)
    commands = [
        # NaN in epoch 2: epoch 1's checkpoints are kept as they were.
        ["train", "--data", data, *FAST, "--model", "nets:NanNet", "--epochs", "3",
         "--out", nan_run],
        # The example: a run that diverges in its first epoch keeps nothing.
        ["train", "--data", data, *FAST, "--lr", "1e30", "--epochs", "2", "--out", fresh],
        # --lr applies for real on resume: 1e30 makes epoch 3 diverge.
        ["train", "--resume", resumed, "--lr", "1e30", "--epochs", "4", "--trust-checkpoint"],
    ]  # fmt: skip
    results = []
    for args, nan_at in zip(commands, ["5", None, None], strict=True):  # epoch 2, batch 2
        NanNet.forwards = 0
        if nan_at:
            monkeypatch.setenv("TORCHKIT_TEST_NAN_AT", nan_at)
        else:
            monkeypatch.delenv("TORCHKIT_TEST_NAN_AT", raising=False)
        done = run_torchkit_in_process(*args)
        results.append((done.stdout, done.stderr, done.returncode))

    (_, err, code) = results[0]
    assert code == 1, err[-3000:]
    assert "the training loss is not finite (NaN or infinite) at epoch 2, step 2 of 3" in (
        error_line(err)
    )
    for name in ("last.pt", "best.pt"):  # epoch 1's, the last good one
        kept = read_checkpoint(nan_run / name)
        assert kept["epoch"] == 1 and all_finite(kept)
    assert (nan_run / "metrics.csv").read_text().count("\n") == 2  # header + epoch 1

    (_, err, code) = results[1]
    assert code == 1, err[-3000:]
    assert "at epoch 1, step" in error_line(err) and "lower --lr" in error_line(err)
    assert not fresh.exists()  # nothing good to keep

    (_, err, code) = results[2]
    assert code == 1, err[-3000:]
    assert "not finite (NaN or infinite) at epoch 3, step" in error_line(err)
    # Not a byte changed: last.pt and best.pt of epoch 2, and config.json describes them.
    assert tree_digest(resumed) == before


def test_weights_made_infinite_by_the_last_update_of_an_epoch_are_not_saved(
    world, tmp_path, runner, monkeypatch
):
    """The loss of the epoch's last batch is finite, its gradient is not: the update makes the
    weights NaN, and no later loss would show it before the checkpoint."""
    from torchkit.cli import app

    NanNet.forwards = 0
    monkeypatch.setenv("TORCHKIT_TEST_INF_GRAD_AT", "3")  # epoch 1, batch 3 of 3
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", str(world / "data"), *FAST, "--model", "nets:NanNet",
         "--epochs", "1", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert (
        len(lines) == 1
        and "the weights are not finite (NaN or infinite) at epoch 1, step 3" in (lines[0])
    ), result.stderr
    assert not out.exists()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_under_ddp_a_nan_on_one_rank_stops_every_rank_with_the_same_error(world, tmp_path):
    out = tmp_path / "ddp"
    ranks = run_ranks(
        "train", "--data", world / "data", *FAST, "--model", "nets:NanNet",
        "--batch-size", "2", "--epochs", "1", "--out", out,
        env={**ENV, "TORCHKIT_TEST_NAN_AT": "1", "TORCHKIT_TEST_NAN_RANK": "1"}, timeout=180,
    )  # fmt: skip
    assert all(done.returncode == 1 for done in ranks), stderr_of(ranks)[-3000:]
    # Rank 1's first batch (of its 3) went NaN; rank 0's loss was finite there: it names it,
    # for every rank.
    expected = "the training loss is not finite (NaN or infinite) at epoch 1, step 1 of 3"
    errors = error_lines_of(ranks)
    assert len(errors) == 1 and expected in error_line(ranks[0].stderr), stderr_of(ranks)[-3000:]
    assert not out.exists()


def test_a_model_too_deep_for_the_image_size_is_refused_before_the_run_starts(
    world, runner, tmp_path
):
    """Was "Error: RuntimeError: Given input size: (128x1x1). Calculated output size:
    (128x0x0). Output size is too small" (exit 1) at the first batch."""
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", str(world / "data"), "--model", "squeezenet1_1", "--image-size", "8",
         "--workers", "0", "--device", "cpu", "--epochs", "1", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 2, result.stderr
    assert error_line(result.stderr) == (
        "Error: squeezenet1_1 cannot train on 8x8 images: Given input size: (128x1x1). "
        "Calculated output size: (128x0x0). Output size is too small "
        "(the smallest it takes is 17: use --image-size 17 or larger)"
    )
    assert not out.exists()


def test_a_batch_of_one_image_that_batchnorm_sees_as_one_value_is_one_usage_error(
    world, runner, tmp_path
):
    """resnet18's last BatchNorm sees a 1x1 map of a 16 px image: a batch of one there was
    "Error: ValueError: Expected more than 1 value per channel when training" (exit 1)."""
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", str(world / "data"), "--model", "resnet18", "--image-size", "16",
         "--batch-size", "1", "--workers", "0", "--device", "cpu", "--epochs", "1",
         "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 2, result.stderr
    assert error_line(result.stderr) == (
        "Error: resnet18 cannot train on batches of one 16x16 image: BatchNorm in training mode "
        "needs more than one value per channel, and the model's feature map is 1x1 there "
        "(give --batch-size 2 or more, or a larger --image-size)"
    )
    assert not out.exists()


# -- 3. no readable image is an error, not a loss of 0 --------------------------------------------


def test_no_readable_training_or_validation_image_and_an_unlabelled_csv_row_are_errors(
    world, tmp_path
):
    results = run_each_in_process(
        [
            ["train", "--data", world / "bad-train", *FAST, "--epochs", "2",
             "--best-metric", "loss", "--out", tmp_path / "t"],
            ["train", "--data", world / "bad-val", *FAST, "--epochs", "2",
             "--best-metric", "loss", "--out", tmp_path / "v"],
            ["train", "--data", world / "index.csv", "--val-split", "0.25", *FAST,
             "--epochs", "1", "--out", tmp_path / "c"],
        ],
        cwd=world,
    )  # fmt: skip
    train, val, index = results
    assert train.returncode == 1, train.stderr[-3000:]
    assert "none of the 12 training images could be read in epoch 1" in error_line(train.stderr)
    assert val.returncode == 1, val.stderr[-3000:]
    assert "none of the 3 validation images could be read" in error_line(val.stderr)
    assert index.returncode == 1, index.stderr[-3000:]
    assert "index.csv has 1 row(s) with an empty label (line 7)" in error_line(index.stderr)
    assert list(tmp_path.iterdir()) == []  # no run kept a loss of 0 as its best


def test_read_csv_index_refuses_empty_labels_with_their_lines(tmp_path):
    from torchkit.core.data.sources import csv_samples

    index = tmp_path / "index.csv"
    index.write_text('path,label\na.png,cat\nb.png, \n"c\nd.png",dog\ne.png,\nf.png\n')
    with pytest.raises(InputError, match=r"3 row\(s\) with an empty label \(line 3, 6, 7\)"):
        csv_samples(index)


# -- 5. resume: options apply for real or are refused ---------------------------------------------


def test_resume_refuses_options_that_cannot_change_naming_both_values(trained):
    before = tree_digest(trained)
    cases = [
        (["--optimizer", "sgd"], "trained with --optimizer adamw, not sgd"),
        (["--batch-size", "2"], "trained with --batch-size 4, not 2"),
        (["--seed", "3"], "trained with --seed 0, not 3"),
        (["--freeze-backbone"], "trained with --freeze-backbone off, not on"),
    ]
    results = run_each_in_process([["train", "--resume", trained, *args] for args, _ in cases])
    for (args, expected), result in zip(cases, results, strict=True):
        assert result.returncode == 1, (args, result.stderr[-2000:])
        line = error_line(result.stderr)
        assert expected in line and "cannot change on resume" in line, line
        # The new run's hint names the run's weights, so it works as written.
        assert f"--weights {shell_word(Path(trained) / 'best.pt')} --out NEW" in line, line
    assert tree_digest(trained) == before


def test_merge_for_resume_applies_or_refuses_every_option():
    saved = resolve_defaults(TrainConfig(lr=0.5, epochs=3), is_digits=True).to_dict()
    given = TrainConfig(  # (the mean as saved: not a change)
        resume="run", epochs=9, lr=0.1, weight_decay=0.01, label_smoothing=0.2,
        mean=(0.485, 0.456, 0.406),
    )  # fmt: skip
    merged = merge_for_resume(saved, given, overrides=None)
    assert (merged.epochs, merged.lr, merged.weight_decay, merged.label_smoothing) == (
        9, 0.1, 0.01, 0.2,
    )  # fmt: skip
    for name in FIXED_ON_RESUME:
        value = getattr(TrainConfig.from_dict(saved), name)
        other = {bool: (not value), int: 7, float: 0.3, str: "resnet18", tuple: (0.1, 0.2, 0.3)}
        new = other.get(type(value), 0.3) if value is not None else 0.3
        with pytest.raises(CheckpointError, match=f"with {option_name(name)} .*, not "):
            merge_for_resume(saved, TrainConfig(resume="run", **{name: new}), overrides=[name])
    with pytest.raises(UsageError, match="--weights cannot be used with --resume"):
        merge_for_resume(saved, TrainConfig(resume="run", weights="DEFAULT"), overrides=None)


def test_resume_accepts_the_default_val_split_given_again():
    # A run not given --val-split held out the default 0.1: giving that share again is no change.
    saved = resolve_defaults(TrainConfig(), is_digits=False).to_dict()
    given = TrainConfig(resume="run", val_split=0.1)
    assert merge_for_resume(saved, given, overrides=["val_split"]).val_split in (None, 0.1)
    with pytest.raises(CheckpointError, match=r"with --val-split 0\.1 \(the default\), not 0\.2"):
        merge_for_resume(saved, TrainConfig(resume="run", val_split=0.2), overrides=["val_split"])


@pytest.mark.parametrize(("saved_lr", "given_lr"), [(0.0, 0.01), (None, 0.0), (0.01, 0.0)])
def test_resume_refuses_backbone_lr_to_or_from_zero_before_any_work(saved_lr, given_lr):
    # At 0 the backbone is frozen and has no parameter group. Before: refused only once the
    # data was read and the model built, as an optimizer state that "does not fit".
    saved = resolve_defaults(TrainConfig(backbone_lr=saved_lr), is_digits=False).to_dict()
    with pytest.raises(CheckpointError, match=r"--backbone-lr cannot change to or from 0"):
        merge_for_resume(saved, TrainConfig(resume="run", backbone_lr=given_lr), ["backbone_lr"])
    # Another rate on the same side of 0 applies from the resumed step on.
    same_side = 0.0 if saved_lr == 0 else 0.02
    given = TrainConfig(resume="run", backbone_lr=same_side)
    assert merge_for_resume(saved, given, ["backbone_lr"]).backbone_lr == same_side


def test_resume_takes_head_lr_mult_in_place_of_the_runs_backbone_lr_and_back():
    # Both set the head/backbone ratio. Before: the run's one and the one given again were
    # refused together ("--backbone-lr and --head-lr-mult both set ... (give one)").
    def resumed_with(saved: dict, **given):
        return merge_for_resume(saved, TrainConfig(resume="run", **given), list(given))

    with_backbone_lr = resolve_defaults(TrainConfig(backbone_lr=0.001), is_digits=False).to_dict()
    merged = resumed_with(with_backbone_lr, head_lr_mult=10.0)
    assert (merged.backbone_lr, merged.head_lr_mult) == (None, 10.0)
    with_mult = resolve_defaults(TrainConfig(head_lr_mult=10.0), is_digits=False).to_dict()
    merged = resumed_with(with_mult, backbone_lr=0.01)
    assert (merged.backbone_lr, merged.head_lr_mult) == (0.01, None)
    frozen = resolve_defaults(TrainConfig(backbone_lr=0.0), is_digits=False).to_dict()
    with pytest.raises(CheckpointError, match=r"--backbone-lr 0, not --head-lr-mult 10") as e:
        resumed_with(frozen, head_lr_mult=10.0)
    assert "drop --head-lr-mult to continue the run" in e.value.hint


def test_resume_trains_with_the_new_lr_and_weight_decay_that_config_json_records(
    trained, tmp_path, runner
):
    from torchkit.cli import app

    out = tmp_path / "run"
    shutil.copytree(trained, out)
    result = runner.invoke(
        app,
        ["train", "--resume", str(out), "--epochs", "3", "--lr", "0.5", "--wd", "0.001"]
        + ["--trust-checkpoint"],  # TinyNet is code the checkpoint names
    )
    assert result.exit_code == 0, result.stderr
    with (out / "metrics.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [float(row["lr"]) for row in rows] == [0.003, 0.003, 0.5]  # constant schedule
    groups = read_checkpoint(out / "last.pt")["optimizer"]["param_groups"]
    assert {g["base_lr"] for g in groups} == {g["lr"] for g in groups} == {0.5}
    assert {g["group_name"]: g["weight_decay"] for g in groups} == {
        "backbone_decay": 0.001, "backbone_no_decay": 0.0,
        "head_decay": 0.001, "head_no_decay": 0.0,
    }  # fmt: skip
    options = json.loads((out / "config.json").read_text())["options"]
    assert (options["lr"], options["weight_decay"]) == (0.5, 0.001)


def test_a_run_trained_with_amp_resumes_in_full_precision_with_no_amp(world, tmp_path, runner):
    """--amp may change on resume, but a flag without a negation only turned it on: an fp16
    run (a GradScaler) could not go on in float32 (`No such option: --no-amp`)."""
    from torchkit.cli import app

    out = tmp_path / "run"
    first = runner.invoke(
        app,
        ["train", "--data", str(world / "data"), *FAST, "--epochs", "1", "--amp",
         "--amp-dtype", "fp16", "--out", str(out)],
    )  # fmt: skip
    assert first.exit_code == 0, first.stderr
    assert read_checkpoint(out / "last.pt")["scaler"] is not None
    resumed = runner.invoke(
        app, ["train", "--resume", str(out), "--trust-checkpoint", "--epochs", "2", "--no-amp"]
    )
    assert resumed.exit_code == 0, resumed.stderr
    # The run's own --amp-dtype, not given again, is no option of this invocation to warn of.
    assert "has no effect" not in resumed.stderr
    config = json.loads((out / "config.json").read_text())
    assert (config["options"]["amp"], config["amp_dtype"]) == (False, "float32")
    last = read_checkpoint(out / "last.pt")
    assert last["epoch"] == 2 and last["scaler"] is None
    # Given again for nothing, it is warned of (the run has nothing left to train).
    again = runner.invoke(
        app, ["train", "--resume", str(out), "--trust-checkpoint", "--amp-dtype", "bf16"]
    )
    assert again.exit_code == 0, again.stderr
    assert "--amp-dtype bf16 has no effect: only --amp uses it" in again.stderr


def test_resume_turns_off_the_runs_nesterov_compile_and_tensorboard(trained, tmp_path, runner):
    """Options given again apply on resume, but these flags had no negation: a run trained with
    --nesterov could not go on with --momentum 0 ('--nesterov needs ... a positive
    --momentum', and 'No such option: --no-nesterov'), nor leave --compile or --tensorboard."""
    from torchkit.cli import app

    checkpoint = read_checkpoint(trained / "last.pt")
    checkpoint["config"].update(optimizer="sgd", nesterov=True, compile=True, tensorboard=True)
    torch.save(checkpoint, tmp_path / "last.pt")
    turned_off = ["--momentum", "0", "--no-nesterov", "--no-compile", "--no-tensorboard"]
    printed = runner.invoke(
        app, ["train", "--resume", str(tmp_path / "last.pt"), *turned_off, "--print-config"]
    )
    assert printed.exit_code == 0, printed.stderr
    options = json.loads(printed.stdout)
    assert (options["momentum"], options["nesterov"]) == (0.0, False)
    assert (options["compile"], options["tensorboard"]) == (False, False)


def test_deterministic_and_strict_turn_off_a_resumed_runs_and_a_recipes(trained, tmp_path, runner):
    """--deterministic and --strict had no negation: a run (or a --config recipe) that set them
    could not go on without them ('No such option: --no-deterministic'). The flags given on the
    command line override both; not given, the run's and the recipe's own stay."""
    from torchkit.cli import app

    checkpoint = read_checkpoint(trained / "last.pt")
    checkpoint["config"].update(deterministic=True, strict=True)
    torch.save(checkpoint, tmp_path / "last.pt")
    resumed = ["train", "--resume", str(tmp_path / "last.pt"), "--print-config"]
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"deterministic": True, "strict": True}))
    replayed = ["train", "--config", str(recipe), "--print-config"]
    for command in (resumed, replayed):
        kept = runner.invoke(app, command)
        assert kept.exit_code == 0, kept.stderr
        options = json.loads(kept.stdout)
        assert (options["deterministic"], options["strict"]) == (True, True)
        turned_off = runner.invoke(app, [*command, "--no-deterministic", "--no-strict"])
        assert turned_off.exit_code == 0, turned_off.stderr
        options = json.loads(turned_off.stdout)
        assert (options["deterministic"], options["strict"]) == (False, False)


def test_load_optimizer_state_keeps_the_new_hyperparameters_and_the_old_moments():
    from torchkit.core.train.optim import load_optimizer_state

    param = nn.Parameter(torch.ones(2))
    old = torch.optim.SGD([{"params": [param], "lr": 0.1, "base_lr": 0.1}], momentum=0.9)
    param.grad = torch.ones(2)
    old.step()
    new = torch.optim.SGD(
        [{"params": [param], "lr": 0.5, "base_lr": 0.5, "weight_decay": 0.2}], momentum=0.5
    )
    load_optimizer_state(new, old.state_dict())
    group = new.param_groups[0]
    assert (group["base_lr"], group["weight_decay"], group["momentum"]) == (0.5, 0.2, 0.5)
    assert torch.equal(new.state[param]["momentum_buffer"], torch.ones(2))


@pytest.mark.parametrize(
    ("name", "damaged", "message"),
    [
        ("exp_avg", torch.zeros(3), "its exp_avg of parameter 1 is of shape (3,), the parameter "
         "of shape (2, 2)"),
        ("step", torch.zeros(4), "its step of parameter 1 is of shape (4,)"),
    ],
)  # fmt: skip
def test_saved_moments_not_of_their_parameters_shape_are_refused_before_loading(
    name, damaged, message
):
    """A damaged checkpoint's optimizer state whose moments are not of their parameter's shape:
    torch's load_state_dict took them, and the first step of the resumed run crashed the
    process (segmentation fault: `train --resume` ended with no message). A ValueError, which
    the resume reports as an optimizer state that does not fit."""
    from torchkit.core.train.optim import load_optimizer_state

    params = [nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2, 2))]
    old = torch.optim.AdamW([{"params": params, "lr": 0.1, "base_lr": 0.1}])
    for param in params:
        param.grad = torch.ones_like(param)
    old.step()
    state = old.state_dict()
    state["state"][1][name] = damaged
    new = torch.optim.AdamW([{"params": params, "lr": 0.1, "base_lr": 0.1}])
    with pytest.raises(ValueError, match=re.escape(message)):
        load_optimizer_state(new, state)
    assert new.state == {}


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.RMSprop])
def test_momentum_turned_off_on_resume_leaves_no_buffer_for_a_later_resume(optimizer):
    """A run resumed with --momentum 0 kept the buffers of the epochs before (torch's step no
    longer reads nor updates them): resumed later with a momentum again, its first update went
    on from that old direction, up to 10 gradients' worth at 0.9. It starts afresh."""
    from torchkit.core.runtime import dynamo_free
    from torchkit.core.train.optim import load_optimizer_state

    param = nn.Parameter(torch.ones(2))

    def build(momentum: float) -> torch.optim.Optimizer:
        return optimizer([{"params": [param], "lr": 0.1, "base_lr": 0.1}], momentum=momentum)

    trained = build(0.9)
    for _ in range(3):
        param.grad = torch.ones(2)
        dynamo_free.step(trained)
    paused = build(0.0)
    load_optimizer_state(paused, trained.state_dict())
    assert "momentum_buffer" not in paused.state[param]
    resumed = build(0.9)
    load_optimizer_state(resumed, paused.state_dict())
    param.grad = torch.full((2,), -1.0)
    dynamo_free.step(resumed)
    buffer = resumed.state[param]["momentum_buffer"]
    assert (buffer < 0).all()  # this gradient's direction, not the old buffer's


def test_rmsprop_resumed_with_momentum_turned_on_starts_its_momentum_at_zero():
    """An RMSprop run trained with --momentum 0, resumed with --momentum 0.9: its state holds
    no momentum buffer, which torch's step reads for every parameter with a state (the resume
    ended in `Error: KeyError: 'momentum_buffer'`); the buffer starts at zero, as at a first
    step, and the moving average of squares goes on."""
    from torchkit.core.runtime import dynamo_free
    from torchkit.core.train.optim import load_optimizer_state

    param = nn.Parameter(torch.ones(2))

    def rmsprop(momentum: float) -> torch.optim.RMSprop:
        group = {"params": [param], "lr": 0.1, "base_lr": 0.1}
        return torch.optim.RMSprop([group], momentum=momentum, alpha=0.9)  # as build_optimizer

    old = rmsprop(0.0)
    param.grad = torch.ones(2)
    dynamo_free.step(old)  # torch.optim's own step imports torch._dynamo (seconds of CPU)
    new = rmsprop(0.9)
    load_optimizer_state(new, old.state_dict())
    square_avg, before = new.state[param]["square_avg"].clone(), param.detach().clone()
    param.grad = torch.full((2,), 2.0)
    dynamo_free.step(new)
    update = 2.0 / ((0.9 * square_avg + 0.1 * 4.0).sqrt() + 1e-8)  # buffer: 0.9 x 0 + update
    assert torch.allclose(new.state[param]["momentum_buffer"], update)
    assert torch.allclose(param.detach(), before - 0.1 * update)


# -- 6. a run resumed into another folder carries its best.pt -------------------------------------


def test_resume_into_another_folder_carries_best_pt(trained, tmp_path, runner):
    from torchkit.cli import app

    out = tmp_path / "r2"
    result = runner.invoke(
        app,
        ["train", "--resume", str(trained), "--out", str(out), "--format", "json"]
        + ["--trust-checkpoint"],  # TinyNet is code the checkpoint names
    )
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["best_epoch"] == read_checkpoint(trained / "best.pt")["epoch"]
    assert summary["test_weights"] == "best.pt" and summary["test_top1"] is not None
    assert (out / "best.pt").read_bytes() == (trained / "best.pt").read_bytes()
    assert read_checkpoint(out / "best.pt")["epoch"] == summary["best_epoch"]


def test_a_branch_with_nothing_to_train_is_a_run_that_resumes(trained, tmp_path, runner):
    """The new folder held best.pt and config.json but no last.pt nor metrics.csv: `--resume
    NEW` said 'no last.pt in NEW', and `--resume RUN --out NEW` that the folder exists."""
    from torchkit.cli import app

    out, trust = tmp_path / "r2", "--trust-checkpoint"  # TinyNet is code the checkpoint names
    branch = runner.invoke(app, ["train", "--resume", str(trained), "--out", str(out), trust])
    assert branch.exit_code == 0 and "nothing to train" in branch.stderr
    assert read_checkpoint(out / "last.pt")["epoch"] == 2
    assert (out / "metrics.csv").read_text() == (trained / "metrics.csv").read_text()
    more = runner.invoke(app, ["train", "--resume", str(out), "--epochs", "3", trust])
    assert more.exit_code == 0, more.stderr
    assert read_checkpoint(out / "last.pt")["epoch"] == 3


@pytest.mark.parametrize("best_epoch", [2, 1])
def test_resume_in_place_without_best_pt_gets_it_back_or_starts_the_best_over(
    trained, tmp_path, runner, best_epoch
):
    # best.pt deleted between runs: the summary named it and the test evaluation failed (exit
    # 1, after the training). last.pt of the best epoch gives it back; else the best starts over.
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    (run / "best.pt").unlink()
    last = read_checkpoint(run / "last.pt")
    torch.save({**last, "best_epoch": best_epoch}, run / "last.pt")
    result = runner.invoke(
        app, ["train", "--resume", str(run), "--format", "json", "--trust-checkpoint"]
    )
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    if best_epoch == last["epoch"]:
        assert (run / "best.pt").read_bytes() == (run / "last.pt").read_bytes()
        assert summary["best_epoch"] == 2 and summary["test_top1"] is not None
    else:
        assert "the weights of the best epoch so far (1) are not beside" in result.stderr
        assert summary["best_epoch"] is None and not (run / "best.pt").exists()


def test_resume_in_place_replaces_a_best_pt_written_ahead_of_last_pt(trained, tmp_path, runner):
    # A kill (or a full disk) between an epoch's best.pt and its last.pt left best.pt one epoch
    # ahead, on a branch the resumed run does not follow: it was kept as "the run's own", so
    # best.pt held epoch 3's lost weights while the summary named epoch 2 and tested best.pt.
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    last = read_checkpoint(run / "last.pt")
    history = [dict(row) for row in last["history"]]
    history[1] |= {"val_loss": 0.0, "val_top1": 1.0}  # epoch 2 stays the best, whatever comes
    last |= {"history": history, "best_epoch": 2, "best_metric": 1.0}
    torch.save(last, run / "last.pt")
    lost = {key: torch.zeros_like(value) for key, value in last["model"].items()}
    ahead = {**last, "epoch": 3, "best_epoch": 3, "model": lost}
    torch.save({**ahead, "history": [*history, {**history[1], "epoch": 3}]}, run / "best.pt")
    result = runner.invoke(
        app, ["train", "--resume", str(run), "--epochs", "3", "--format", "json"]
        + ["--trust-checkpoint"],  # TinyNet is code the checkpoint names
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["best_epoch"] == 2
    best = read_checkpoint(run / "best.pt")
    assert best["epoch"] == 2
    assert all(torch.equal(best["model"][key], value) for key, value in last["model"].items())


def test_the_best_checkpoint_of_a_resumed_one_is_found_only_in_the_same_run(tmp_path):
    from torchkit.core.train.checkpoints import best_checkpoint_for

    history = [{"epoch": e, "val_loss": 1.0 / e} for e in (1, 2, 3)]

    def checkpoint(epoch: int, best: int, rows=history) -> dict:
        return {"epoch": epoch, "best_epoch": best, "arch": "a", "classes": ["x", "y"],
                "history": rows[:epoch], "epoch_progress": None}  # fmt: skip

    torch.save(checkpoint(3, 3), tmp_path / "best.pt")  # the run went on to a better epoch 3
    torch.save(checkpoint(1, 1), tmp_path / "epoch-001.pt")
    torch.save(checkpoint(2, 1), tmp_path / "epoch-002.pt")
    rewound = read_checkpoint(tmp_path / "epoch-002.pt")
    assert best_checkpoint_for(tmp_path / "epoch-002.pt", rewound) == tmp_path / "epoch-001.pt"
    assert best_checkpoint_for(tmp_path / "epoch-001.pt", checkpoint(1, 1)) == (
        tmp_path / "epoch-001.pt"
    )  # saved at the end of its best epoch: it is its own best
    (tmp_path / "epoch-001.pt").unlink()
    assert best_checkpoint_for(tmp_path / "epoch-002.pt", rewound) is None  # best.pt is epoch 3
    other_run = [{**row, "val_loss": 9.0} for row in history]
    torch.save(checkpoint(1, 1, other_run), tmp_path / "epoch-001.pt")
    assert best_checkpoint_for(tmp_path / "epoch-002.pt", rewound) is None


def test_whether_a_checkpoint_holds_the_best_epoch_is_read_without_building_its_tensors(
    tmp_path, monkeypatch
):
    """--resume read best.pt whole (torch.load, every tensor header unpickled) to learn which
    epoch it holds: now its pickle record alone, with the tensors left opaque, and the same
    answer; torch.load (weights_only) only where that reader cannot answer exactly."""
    import os
    import pickle
    import zipfile

    from torchkit.core.train import checkpoint_record
    from torchkit.core.train.checkpoints import holds_best_epoch

    model = nn.Linear(3, 2)
    # an SGD state's shape (building an optimiser here would import torch._dynamo: seconds)
    optimizer_state = {
        "state": {0: {"momentum_buffer": torch.ones(2, 3)}},
        "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": [0, 1]}],
    }
    history = [{"epoch": 1, "val_loss": 0.5}, {"epoch": 2, "val_loss": 0.25}]
    saved = {"epoch": 2, "best_epoch": 2, "arch": "a", "classes": ["x", "y"], "history": history,
             "epoch_progress": None, "model": model.state_dict(),
             "optimizer": optimizer_state, "param": nn.Parameter(torch.ones(2))}  # fmt: skip
    torch.save(saved, tmp_path / "best.pt")
    resumed = {**saved, "epoch": 3, "history": [*history, {"epoch": 3, "val_loss": 0.3}]}
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: (loads.append(a), real_load(*a, **k))[1])
    assert holds_best_epoch(tmp_path / "best.pt", resumed)
    assert not holds_best_epoch(tmp_path / "best.pt", {**resumed, "best_epoch": 1})
    assert not holds_best_epoch(tmp_path / "best.pt", {**resumed, "classes": ["x"]})
    assert loads == []  # no tensor built
    # A value the reader cannot give exactly (a tensor in the history): torch.load answers.
    torch.save({**saved, "history": [{"epoch": 1, "val_loss": torch.tensor(0.5)}]},
               tmp_path / "tensor-history.pt")  # fmt: skip
    assert checkpoint_record.plain_values(tmp_path / "tensor-history.pt", ("history",)) is None
    assert not holds_best_epoch(tmp_path / "tensor-history.pt", resumed)
    assert len(loads) == 1

    # A pickle naming anything but torch.save's tensor globals is neither run nor answered.
    class Runs:
        def __reduce__(self):
            return (os.makedirs, (str(tmp_path / "ran"),))

    with zipfile.ZipFile(tmp_path / "evil.pt", "w") as archive:
        archive.writestr("evil/data.pkl", pickle.dumps({"epoch": 2, "model": Runs()}))
    assert checkpoint_record.plain_values(tmp_path / "evil.pt", ("epoch",)) is None
    assert not holds_best_epoch(tmp_path / "evil.pt", resumed)  # weights_only refuses it too
    assert not (tmp_path / "ran").exists()


# -- 7. --amp: float16 with a GradScaler where bfloat16 is not native; fp16 on CPUs ---------------


def _train_amp_dtype(device_type: str, amp_dtype: str) -> str:
    """The autocast dtype train's --amp takes on a device of `device_type` (no such device
    needed: nothing runs on it)."""
    from torchkit.core.train.setup import build_amp

    with warnings.catch_warnings():  # (a CUDA GradScaler without CUDA warns and disables)
        warnings.simplefilter("ignore")
        amp = build_amp(torch.device(device_type), TrainConfig(amp=True, amp_dtype=amp_dtype))
    return amp.dtype


def test_amp_auto_takes_bf16_only_on_gpus_that_compute_it_natively(monkeypatch):
    from torchkit.core.train.setup import build_amp

    asked = []

    def t4_bf16_supported(including_emulation: bool = True) -> bool:
        asked.append(including_emulation)
        return including_emulation  # a T4 or V100: bf16 only by emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", t4_bf16_supported)
    assert _train_amp_dtype("cuda", "auto") == "float16" and asked == [False]
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert _train_amp_dtype("cuda", "auto") == "bfloat16"  # Ampere and later
    assert _train_amp_dtype("cpu", "auto") == _train_amp_dtype("cuda", "bf16") == "bfloat16"
    assert _train_amp_dtype("cpu", "fp16") == "float16"

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", t4_bf16_supported)
    for device, amp_dtype, expected in (
        ("cuda", "auto", "float16"), ("cpu", "auto", "bfloat16"), ("cpu", "fp16", "float16"),
    ):  # fmt: skip
        with warnings.catch_warnings():  # (a CUDA GradScaler without CUDA warns and disables)
            warnings.simplefilter("ignore")
            _, scaler, name = build_amp(
                torch.device(device), TrainConfig(amp=True, amp_dtype=amp_dtype)
            )
        assert name == expected
        if expected == "float16":
            assert isinstance(scaler, torch.amp.GradScaler) and scaler._device == device
        else:
            assert scaler is None


@pytest.mark.parametrize(
    ("device_type", "native_cuda_bf16", "expected"),
    [
        ("cpu", None, {"auto": "bfloat16", "bf16": "bfloat16", "fp16": "float16"}),
        ("cuda", True, {"auto": "bfloat16", "bf16": "bfloat16", "fp16": "float16"}),
        ("cuda", False, {"auto": "float16", "bf16": "bfloat16", "fp16": "float16"}),
        # MPS: torch's autocast default there is float16 (bfloat16 only from macOS 14 on)
        ("mps", None, {"auto": "float16", "bf16": "bfloat16", "fp16": "float16"}),
    ],
)
def test_train_takes_the_autocast_dtype_eval_predict_and_features_take(
    monkeypatch, device_type, native_cuda_bf16, expected
):
    # One rule for every command: train once chose bf16 for auto on MPS (the others fp16) and
    # refused --amp-dtype fp16 there (the others took it).
    from torchkit.core.runtime.device import amp_dtype_name, resolve_amp_dtype

    if native_cuda_bf16 is not None:
        monkeypatch.setattr(
            torch.cuda, "is_bf16_supported", lambda including_emulation=True: native_cuda_bf16
        )
    for choice, dtype in expected.items():
        shared = resolve_amp_dtype(choice, torch.device(device_type))
        assert str(shared) == f"torch.{dtype}"
        assert _train_amp_dtype(device_type, choice) == dtype, (device_type, choice)
        assert amp_dtype_name(shared) == {"bfloat16": "bf16", "float16": "fp16"}[dtype]


def test_bf16_on_a_gpu_that_emulates_it_warns_in_train_as_in_the_other_commands(
    monkeypatch, caplog
):
    # A T4 or V100 computes bfloat16 by emulation, slower than float32: eval, predict,
    # extract-features and benchmark warn before the run, and so does train.
    from torchkit.core.runtime import device as device_module
    from torchkit.core.runtime.device import resolve_amp_dtype

    emulated = "this GPU has no native bfloat16: --amp-dtype bf16 is emulated and slow"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert _train_amp_dtype("cuda", "bf16") == "bfloat16"
    assert resolve_amp_dtype("bf16", torch.device("cuda")) == torch.bfloat16
    assert [r.getMessage().startswith(emulated) for r in caplog.records] == [True, True]
    caplog.clear()
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    # The CPU's own warning depends on the machine's instruction set (AVX512-BF16 or AMX): this
    # test is about the GPU's, so the CPU is taken as native.
    monkeypatch.setattr(device_module, "cpu_amp_is_native", lambda dtype_name: True)
    assert _train_amp_dtype("cuda", "bf16") == "bfloat16" and _train_amp_dtype("cpu", "bf16")
    assert caplog.records == []


def test_clipping_under_a_grad_scaler_sees_the_unscaled_gradients(monkeypatch):
    from torchkit.core.train import loop

    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(model(torch.ones(2, 3)).sum()).backward()
    true_norm = float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm()) / 1024
    seen = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm):
        params = list(params)
        seen.append(float(torch.cat([p.grad.flatten() for p in params]).norm()))
        return real_clip(params, max_norm)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    schedule = SimpleNamespace(step=lambda: None, current_lr=lambda: 0.0)
    ctx = loop.StepContext(model, model, optimizer, schedule, None, "cpu", scaler=scaler,
                           clip_grad=0.5)  # fmt: skip
    loop._optimizer_step(ctx)
    assert seen == [pytest.approx(true_norm)] and true_norm > 0.5


# -- 8. pinned batches; 9. sums on MPS -----------------------------------------------------------


def test_the_loader_pins_batches_when_asked(monkeypatch):
    """Pinning needs a GPU here, so Tensor.pin_memory is replaced by a stand-in that records
    what it returns, and the DataLoader is told an accelerator exists: what comes out of the
    real loader is what pin_memory() returned, for images, labels and indices."""
    import numpy as np

    from torchkit.core.data.batches import Batch
    from torchkit.core.data.preprocessing import Preprocess
    from torchkit.core.data.sources.samples import Samples
    from torchkit.core.train.loaders import build_loaders

    pinned: list[torch.Tensor] = []

    def pin_memory(self, *args, **kwargs):
        copy = self.clone()
        pinned.append(copy)
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    if hasattr(torch, "accelerator"):  # torch 2.6+: the DataLoader asks torch.accelerator
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: None)
    else:  # torch 2.4 and 2.5 ask torch.cuda
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    samples = Samples(["a", "b"], [0, 1, 0, 1], images=np.zeros((4, 8, 8), np.uint8))
    config = resolve_defaults(TrainConfig(batch_size=2, workers=0), is_digits=True)
    loaders = build_loaders(
        {"train": samples, "val": samples}, Preprocess(8, 8), config, pin_memory=True
    )
    batch = next(iter(loaders.train))
    assert isinstance(batch, Batch) and batch.images.shape == (2, 3, 8, 8)
    for tensor in (batch.images, batch.labels, batch.indices):
        assert any(tensor is p for p in pinned)
    empty = Batch(None, None, None, ["x: unreadable"]).pin_memory()
    assert empty.images is None and empty.errors == ["x: unreadable"]


def test_metric_sums_are_float32_on_mps_and_evaluate_works_with_them(monkeypatch):
    from torchkit.core.data.batches import Batch
    from torchkit.core.train import loop

    assert loop.accumulator_dtype(torch.device("mps")) == torch.float32  # MPS has no float64
    assert loop.accumulator_dtype(torch.device("cpu")) == torch.float64
    assert loop.accumulator_dtype(torch.device("cuda", 0)) == torch.float64

    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    batches = [Batch(torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1]), None, [])] * 3
    unreadable = loop.UnreadableImages(strict=False)
    reference = loop.evaluate(model, batches, "cpu", topk=2, unreadable=unreadable)
    monkeypatch.setattr(loop, "accumulator_dtype", lambda device: torch.float32)
    as_on_mps = loop.evaluate(model, batches, "cpu", topk=2, unreadable=unreadable)
    assert as_on_mps.count == reference.count == 15
    assert as_on_mps.loss_sum == pytest.approx(reference.loss_sum, rel=1e-6)
    assert (as_on_mps.top1, as_on_mps.topk) == (reference.top1, reference.topk)


@pytest.mark.parametrize(
    ("args", "warning"),
    [
        (["--patience", "3"], "--patience 3 has no effect: only --scheduler plateau uses it"),
        (["--milestones", "2,4"], "--milestones 2 4 has no effect: only --scheduler multistep"),
        (["--step-size", "2"], "--step-size 2 has no effect: only --scheduler step uses it"),
        (["--gamma", "0.5"], "--gamma 0.5 has no effect: only --scheduler step, multistep,"),
        (["--scheduler", "step", "--min-lr", "1e-4"], "--min-lr 0.0001 has no effect"),
        (["--no-ema", "--ema-decay", "0.9"], "--ema-decay 0.9 has no effect: only --ema"),
        (["--randaugment-magnitude", "5"], "--randaugment-magnitude 5 has no effect"),
        (["--augmix-severity", "5"], "--augmix-severity 5 has no effect: only --augment augmix"),
        (["--keep", "2"], "--keep 2 has no effect: only --save-every uses it"),
        (["--momentum", "0.5"], "--momentum 0.5 has no effect: only --optimizer sgd or rmsprop"),
        (["--amp-dtype", "bf16"], "--amp-dtype bf16 has no effect: only --amp uses it"),
        (["--weight-decay", "0", "--decay-all"], "--decay-all on has no effect"),
        (["--lr-max", "3"], "--lr-max 3 has no effect: only --find-lr uses it"),
        (["--find-lr-iters", "5"], "--find-lr-iters 5 has no effect: only --find-lr"),
        # torchvision's reference script names the cosine floor --lr-min: the warning says ours.
        (
            ["--lr-min", "1e-5"],
            "--lr-min 1e-05 has no effect: only --find-lr uses it; the cosine "
            "schedule's final lr is --min-lr",
        ),
        (
            ["--scheduler", "step", "--lr-min", "1e-5"],
            "--lr-min 1e-05 has no effect: only --find-lr uses it; --min-lr is the final lr "
            "of --scheduler cosine",
        ),
        (["--augment", "none", "--crop-scale", "0.5,1"], "--crop-scale 0.5 1 has no effect"),
        (["--augment", "none", "--no-flip"], "--flip off has no effect: only a random crop"),
        (["--augment", "none", "--train-crop-size", "8"], "--train-crop-size 8 has no effect"),
        # Each batch is mixed with itself reversed: a batch of one image is never mixed.
        (["--batch-size", "1", "--mixup-alpha", "0.2"], "--mixup-alpha 0.2 has no effect: only"),
        (["--batch-size", "1", "--cutmix-alpha", "1"], "--cutmix-alpha 1 has no effect: only"),
    ],
)
def test_an_option_the_other_options_leave_unused_is_a_warning(runner, args, warning):
    # Each was accepted and quietly did nothing (a --patience for the cosine schedule).
    result = runner.invoke(app, ["train", "--print-config", *args])
    assert result.exit_code == 0, result.stderr
    assert f"Warning: {warning}" in result.stderr


def test_options_a_schedule_uses_or_left_at_their_defaults_are_not_warned_about(runner):
    given = ["--scheduler", "plateau", "--patience", "3", "--gamma", "0.5", "--step-size", "30"]
    result = runner.invoke(app, ["train", "--print-config", *given, "--ema-decay", "0.999"])
    assert result.exit_code == 0, result.stderr
    assert "Warning" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--keep", "2", "--save-every", "1"],
        ["--optimizer", "sgd", "--momentum", "0.5", "--decay-all"],
        ["--amp", "--amp-dtype", "bf16"],
        ["--data", "digits", "--augment", "none"],  # flip and crop scale the data chose
        ["--batch-size", "2", "--mixup-alpha", "0.2", "--cutmix-alpha", "1"],
    ],
)
def test_options_the_others_use_are_not_warned_about(runner, args):
    result = runner.invoke(app, ["train", "--print-config", *args])
    assert result.exit_code == 0, result.stderr
    assert "Warning" not in result.stderr


@pytest.mark.parametrize(("warmup", "warned"), [("0.4", True), ("0.7", False)])
def test_a_warmup_shorter_than_two_updates_is_a_warning(runner, world, tmp_path, warmup, warned):
    # 3 updates an epoch: 0.4 epochs round to 1 update, whose ramp starts at the full lr.
    result = runner.invoke(
        app,
        ["train", "--data", str(world / "data"), *FAST, "--epochs", "1",
         "--warmup-epochs", warmup, "--out", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    warning = "Warning: --warmup-epochs 0.4 is 1.2 optimizer update(s): too short to ramp"
    assert (warning in result.stderr) == warned


@pytest.mark.parametrize(("accum", "warned"), [("4", True), ("3", False)])
def test_accum_steps_past_an_epochs_batches_are_a_warning(runner, world, tmp_path, accum, warned):
    # 3 batches an epoch: --accum-steps 4 makes one update of the 3 (as timm and Lightning do);
    # before, without a word, a run of one update an epoch was taken for one of 4 batches each.
    result = runner.invoke(
        app,
        ["train", "--data", str(world / "data"), *FAST, "--epochs", "1",
         "--accum-steps", accum, "--out", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    warning = (
        "Warning: --accum-steps 4 is more than the 3 batches of an epoch: each epoch makes one "
        "optimizer update, of its 3 batches\n"
    )
    assert (warning in result.stderr) == warned, result.stderr
