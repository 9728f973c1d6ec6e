"""Exact resume: a run killed with SIGKILL (a real process) or stopped with Ctrl-C and then
resumed ends with the same weights, bit for bit, as a run that was never interrupted (CPU,
--deterministic). The tiny network has BatchNorm, dropout, mixup and an EMA, so buffers, random
numbers, augmentation and optimiser state all have to come back exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from image_folders import write_image_folder
from processes import processes_in_group, start_torchkit_process, wait_until
from resume_runs import assert_bitwise_equal, recipe, stderr_of
from suite_paths import HELPERS

from torchkit.cli import app


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume") / "data"
    write_image_folder(root / "train", {"a": 4, "b": 4, "c": 4}, seed=1)  # 3 batches of 4
    write_image_folder(root / "val", {"a": 1, "b": 1, "c": 1}, seed=2)
    return root


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory) -> dict:
    from typer.testing import CliRunner

    out = tmp_path_factory.mktemp("resume") / "straight"
    result = CliRunner().invoke(app, recipe(data, out, workers=0))
    assert result.exit_code == 0, result.stderr
    return torch.load(out / "last.pt", weights_only=True)


def test_sigkill_then_resume_is_bitwise_identical(data, uninterrupted, tmp_path, runner):
    out = tmp_path / "killed"
    env = {"PYTHONPATH": str(HELPERS), "TORCHKIT_TEST_KILL_AT": "5"}
    # Killed in the middle of epoch 2 (its second step), with a DataLoader worker running.
    killed = start_torchkit_process(*recipe(data, out, workers=1), env=env)
    returncode = killed.wait(timeout=300)
    # Only the main process is killed, as by `kill -9 PID` or the OOM killer: the processes it
    # started (its loader worker, its plot helper) end with it, and close its pipes.
    try:
        _, stderr = killed.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(killed.pid, signal.SIGKILL)
        pytest.fail("the killed run's other processes lived on, its pipes open")
    assert returncode == -signal.SIGKILL, stderr
    wait_until(lambda: not processes_in_group(killed.pid), what="its other processes to end")
    survivor = torch.load(out / "last.pt", weights_only=True)  # intact, loads safely
    assert survivor["epoch"] == 1 and survivor["epoch_progress"] is None
    assert not list(out.glob(".*.tmp*"))  # no half-written temporary left behind

    resumed = runner.invoke(app, ["train", "--resume", str(out), "--trust-checkpoint"])
    assert resumed.exit_code == 0, resumed.stderr
    assert "resumed from" in resumed.stderr
    final = torch.load(out / "last.pt", weights_only=True)
    assert_bitwise_equal(final, uninterrupted)
    assert (out / "metrics.csv").read_text().count("\n") == 4  # header + 3 epochs, no repeat


def test_ctrl_c_saves_and_resume_removes_a_kills_temporaries_and_continues_mid_epoch_exactly(
    data, uninterrupted, tmp_path, runner, monkeypatch
):
    from nets import NoisyNet

    out = tmp_path / "stopped"
    NoisyNet.forwards = 0
    monkeypatch.setenv("TORCHKIT_TEST_SIGINT_AT", "5")  # Ctrl-C during epoch 2's 2nd step
    stopped = runner.invoke(app, recipe(data, out, workers=0))
    assert stopped.exit_code == 130, stderr_of(stopped)
    assert "Interrupted: saved" in stopped.stderr and "--resume" in stopped.stderr
    saved = torch.load(out / "last.pt", weights_only=True)
    assert saved["epoch"] == 1 and saved["epoch_progress"]["batches"] == 2
    assert saved["global_step"] == 5
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored

    monkeypatch.delenv("TORCHKIT_TEST_SIGINT_AT")
    # What a SIGKILL in the middle of the writer thread's work leaves (atomic_write's and
    # atomic_path's names), beside hidden files of the user's that only look alike: the resume
    # removes the first, keeps the second, and trains as if none were there.
    stale = [".metrics.csv.k3j_x9a1.tmp", ".last.ab12cd34.tmp.pt", ".epoch-002.zzzzzzzz.tmp.pt"]
    kept = [".notes.txt.ab12cd34.tmp", ".last.pt.tmp", ".best.ab12cd3.tmp.pt"]
    for name in stale + kept:
        (out / name).write_bytes(b"half")
    resumed = runner.invoke(app, ["train", "--resume", str(out), "--trust-checkpoint"])
    assert resumed.exit_code == 0, resumed.stderr
    assert sorted(p.name for p in out.glob(".*.tmp*")) == sorted(kept)
    assert (out / "metrics.csv").read_text().count("\n") == 4
    assert_bitwise_equal(torch.load(out / "last.pt", weights_only=True), uninterrupted)


# CPU float16 autocast with a GradScaler (issue #14): the fp16 path CUDA takes on GPUs without
# native bfloat16, with accumulation over 2 batches, clipping (of the unscaled gradients) and the
# EMA, so its exact resume (the scaler's state included) is tested without a GPU.
FP16 = [
    "--amp",
    "--amp-dtype",
    "fp16",
    "--device",
    "cpu",
    "--accum-steps",
    "2",
    "--clip-grad",
    "0.5",
]


@pytest.fixture(scope="module")
def uninterrupted_fp16(data, tmp_path_factory) -> dict:
    from typer.testing import CliRunner

    out = tmp_path_factory.mktemp("resume") / "straight-fp16"
    result = CliRunner().invoke(app, [*recipe(data, out, workers=0), *FP16])
    assert result.exit_code == 0, result.stderr
    assert json.loads((out / "config.json").read_text())["amp_dtype"] == "float16"
    return torch.load(out / "last.pt", weights_only=True)


def test_cpu_fp16_with_a_grad_scaler_stops_and_resumes_exactly(
    data, uninterrupted_fp16, tmp_path, runner, monkeypatch
):
    from nets import NoisyNet

    out = tmp_path / "stopped"
    NoisyNet.forwards = 0
    monkeypatch.setenv("TORCHKIT_TEST_SIGINT_AT", "5")  # Ctrl-C during epoch 2's 2nd batch
    stopped = runner.invoke(app, [*recipe(data, out, workers=0), *FP16])
    assert stopped.exit_code == 130, stderr_of(stopped)
    saved = torch.load(out / "last.pt", weights_only=True)
    # 2 updates per epoch of 3 batches (after batches 2 and 3): stopped after update 3.
    assert saved["epoch"] == 1 and saved["epoch_progress"]["batches"] == 2
    assert saved["global_step"] == 3 and saved["scaler"]["_growth_tracker"] == 3

    monkeypatch.delenv("TORCHKIT_TEST_SIGINT_AT")
    resumed = runner.invoke(app, ["train", "--resume", str(out), "--trust-checkpoint"])
    assert resumed.exit_code == 0, resumed.stderr
    final = torch.load(out / "last.pt", weights_only=True)
    assert_bitwise_equal(final, uninterrupted_fp16)
    assert final["scaler"] == uninterrupted_fp16["scaler"]
    assert final["scaler"]["scale"] > 0 and final["global_step"] == 6


def test_resume_on_more_training_images_keeps_the_schedule_at_its_epoch(tmp_path, runner):
    """With twice the training images an epoch has twice the updates: the schedule went on from
    the checkpoint's count of updates, which the new epochs put at epoch 2 of 4, so a step
    schedule trained epoch 3 at gamma^1 (and a cosine climbed back up). It goes on from the
    resumed epoch: gamma^2, then gamma^3."""
    import csv

    first = write_image_folder(tmp_path / "first", {"a": 4, "b": 4, "c": 4}, seed=1)
    more = write_image_folder(tmp_path / "more", {"a": 8, "b": 8, "c": 8}, seed=1)
    out = tmp_path / "run"
    options = [
        "--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "4", "--workers", "0",
        "--device", "cpu", "--val-split", "0.25", "--optimizer", "sgd", "--lr", "0.1",
        "--scheduler", "step", "--step-size", "1", "--gamma", "0.5", "--warmup-epochs", "0",
    ]  # fmt: skip
    trained = runner.invoke(
        app, ["train", "--data", str(first), *options, "--epochs", "2", "--out", str(out)]
    )
    assert trained.exit_code == 0, trained.stderr
    resumed = runner.invoke(
        app,
        ["train", "--resume", str(out), "--data", str(more), "--epochs", "4",
         "--trust-checkpoint"],
    )  # fmt: skip
    assert resumed.exit_code == 0, resumed.stderr
    assert "the data has" in resumed.stderr  # the warning: not exact
    with open(out / "metrics.csv", newline="") as handle:
        lrs = [float(row["lr"]) for row in csv.DictReader(handle)]
    assert lrs == pytest.approx([0.1, 0.05, 0.025, 0.0125])


def test_an_epoch_stopped_past_the_end_of_fewer_images_resumes_the_schedule_at_the_next():
    """Stopped after 5 batches of epoch 2; the data now has 3 batches an epoch, so epoch 2 has
    none left and epoch 3 starts at update 6 (the 5 batches done counted past the epoch: 8)."""
    from torchkit.core.runtime.distributed import DistContext
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.optim import LRSchedule
    from torchkit.core.train.resume import realign_schedule, resume_point

    config = TrainConfig(lr=1.0, epochs=4, warmup_epochs=0, scheduler="cosine", batch_size=4)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([{"params": [param], "lr": 1.0, "base_lr": 1.0}])
    schedule = LRSchedule(optimizer, config, updates_per_epoch=3)
    progress = {"batches": 5, "loss_sum": 1.0, "correct": 1.0, "seen": 20, "seconds": 1.0}
    checkpoint = {"epoch": 1, "world_size": 1, "epoch_progress": progress}
    point = resume_point(checkpoint, DistContext(), config, Path("last.pt"))
    realign_schedule(schedule, point, config, train_size_changed=True)
    assert schedule.updates == 6


@pytest.mark.parametrize(("name", "pasted"), [("data", "data"), ("my data", "'my data'")])
def test_resume_from_another_folder_reads_the_runs_relative_data_where_it_trained(
    tmp_path, runner, monkeypatch, name, pasted
):
    """The config records --data as given; a run started with a relative path and resumed
    from another working directory (a requeued job) said `dataset not found: data` with the
    data grammar's hint. It reads the data where the run trained on it (the working directory
    the checkpoint records); the same relative path naming other data here is not taken for
    it, and says so in a warning that --quiet (a job script's) keeps; the --data to give is a
    shell word to paste."""
    write_image_folder(tmp_path / name, {"a": 4, "b": 4}, seed=1)
    monkeypatch.chdir(tmp_path)
    options = ["--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "4"]
    options += ["--workers", "0", "--device", "cpu", "--val-split", "0.25"]
    trained = runner.invoke(
        app, ["train", "--data", name, *options, "--epochs", "1", "--out", "run"]
    )
    assert trained.exit_code == 0, trained.stderr
    write_image_folder(tmp_path / "elsewhere" / name, {"a": 1, "b": 1}, seed=2)
    monkeypatch.chdir(tmp_path / "elsewhere")
    resume = ["train", "--resume", "../run", "--epochs", "2", "--trust-checkpoint"]
    resumed = runner.invoke(app, [*resume, "--format", "json", "-q"])
    assert resumed.exit_code == 0, resumed.stderr
    # The only line: not the image count's warning (not the 2 images here: the run's 6 and 2)
    assert resumed.stderr == (
        f"Warning: --data {name}, which {Path('../run/last.pt')} records, is read in "
        f"{tmp_path}, where the run trained, not here (give --data {pasted} to train on the "
        "data here)\n"
    )
    assert json.loads(resumed.stdout)["data"] == str(tmp_path / name)


def test_resume_from_another_folder_imports_the_runs_model_code_where_it_trained(
    tmp_path, runner, monkeypatch
):
    """A run of `--model MODULE:Callable` found in its working directory, resumed from
    another one, said `cannot import model`. The module is imported from where the run
    trained (the checkpoint records the folder), not from another file of its name here (a
    note says so); found nowhere, one error names both places."""
    import sys

    name = "resumed_elsewhere_net"  # a module no other test imports
    (tmp_path / f"{name}.py").write_text(
        "from torch import nn\n"
        "def Tiny(num_classes=2):\n"
        "    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),\n"
        "                         nn.Linear(4, num_classes))\n"
    )
    write_image_folder(tmp_path / "data", {"a": 4, "b": 4}, seed=1)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the run puts its folder there
    monkeypatch.chdir(tmp_path)
    options = ["--model", f"{name}:Tiny", "--image-size", "8", "--batch-size", "4"]
    options += ["--workers", "0", "--device", "cpu", "--val-split", "0.25"]
    trained = runner.invoke(
        app, ["train", "--data", "data", *options, "--epochs", "1", "--out", "run"]
    )
    assert trained.exit_code == 0, trained.stderr
    assert torch.load("run/last.pt", weights_only=True)["model_code_folder"] == str(tmp_path)
    sys.path.remove(str(tmp_path))  # as in a new process started elsewhere
    del sys.modules[name]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / f"{name}.py").write_text('raise ImportError("not the run\'s model")\n')
    monkeypatch.chdir(elsewhere)
    resume = ["train", "--resume", "../run", "--trust-checkpoint"]
    resumed = runner.invoke(app, [*resume, "--epochs", "2"])
    assert resumed.exit_code == 0, resumed.stderr
    data_note, code_note = resumed.stderr.splitlines(keepends=True)[:2]
    assert data_note.startswith("Note: --data data, which")  # read where it trained too
    assert code_note == (
        f"Note: {name}:Tiny, which {Path('../run/last.pt')} records, is imported from "
        f"{tmp_path / name}.py, where the run trained, not from {name}.py here\n"
    )
    assert str(tmp_path) not in sys.path  # for that import only
    del sys.modules[name]
    (tmp_path / f"{name}.py").unlink()
    (elsewhere / f"{name}.py").unlink()
    lost = runner.invoke(app, [*resume, "--epochs", "3"])
    assert lost.exit_code == 2
    assert lost.stderr == (
        f"Error: cannot import model '{name}:Tiny', which {Path('../run/last.pt')} records: "
        f"No module named '{name}', neither in {tmp_path}, where the run trained, nor here "
        f"(put {name}.py or {name}/ back in {tmp_path}, or run torchkit from the folder that "
        "holds it now)\n"
    )
    import nets  # on PYTHONPATH, found from anywhere: no folder to record

    from torchkit.core.models.usercode import imported_from

    assert nets.TinyNet and imported_from("nets:TinyNet") is None


def _recorded(workdir: Path | None, root: Path) -> dict:
    """A checkpoint's `data` record of a run whose working directory was `workdir` (None: a
    checkpoint written before it was recorded)."""
    return {"root": str(root)} | ({"workdir": str(workdir)} if workdir else {})


@pytest.mark.parametrize(
    "spec",
    ["data", "./data", "index.csv", "shards/a.tar::shards/b.tar", "shards/{a,b}.tar"],
)
def test_a_relative_data_of_every_kind_is_read_where_the_run_trained(tmp_path, monkeypatch, spec):
    from torchkit.core.data.sources.required import recorded_data_from_here

    start, here = tmp_path / "start", tmp_path / "here"
    for name in ("data/a/x.png", "index.csv", "shards/a.tar", "shards/b.tar"):
        (start / name).parent.mkdir(parents=True, exist_ok=True)
        (start / name).write_bytes(b"")
    here.mkdir()
    record = _recorded(start, start)
    monkeypatch.chdir(start)  # from where it trained: as recorded
    assert recorded_data_from_here(spec, record, Path("run/last.pt")) == spec
    monkeypatch.chdir(here)
    from_here = recorded_data_from_here(spec, record, Path("run/last.pt"))
    assert from_here == "::".join(os.path.join(start, part) for part in spec.split("::"))


@pytest.mark.parametrize("spec", ["digits", "https://host/s-{0..1}.tar", "/abs/data"])
def test_data_that_is_no_relative_path_is_read_as_recorded(tmp_path, monkeypatch, spec):
    from torchkit.core.data.sources.required import recorded_data_from_here

    monkeypatch.chdir(tmp_path)
    record = _recorded(tmp_path / "gone", tmp_path / "gone")
    assert recorded_data_from_here(spec, record, Path("last.pt")) == spec


def test_relative_data_found_nowhere_names_where_it_was_when_the_run_trained(tmp_path, monkeypatch):
    """Moved or removed: from the run's working directory too, where the hint to resume from
    there would lead nowhere. A checkpoint that records no working directory names the data's
    root, and the folder to resume from."""
    from torchkit.core.data.sources.required import recorded_data_from_here
    from torchkit.core.io.errors import InputError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as moved:
        recorded_data_from_here("d/index.csv", _recorded(tmp_path, tmp_path / "d"), "r/last.pt")
    assert moved.value.message == (
        f"dataset not found: d/index.csv, the --data that r/last.pt records, at "
        f"{tmp_path / 'd/index.csv'} when it trained"
    )
    assert moved.value.hint == "give --data again where the data is now"
    with pytest.raises(InputError) as older:
        recorded_data_from_here("d", _recorded(None, tmp_path / "x" / "d"), "r/last.pt")
    assert older.value.message.endswith(f"at {tmp_path / 'x' / 'd'} when it trained")
    assert older.value.hint == (
        "resume from the folder the run started in, or give --data again as a path from here"
    )
    (tmp_path / "s-0.tar").write_bytes(b"")  # one shard of two here: its reader says which
    record = _recorded(tmp_path, tmp_path)
    assert recorded_data_from_here("s-{0..1}.tar", record, "r/last.pt") == "s-{0..1}.tar"
