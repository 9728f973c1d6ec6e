"""`train --profile-steps N` (core/train/step_profiler.py): torch.profiler over the first N
training steps of the first two epochs a run trains, written to OUT/profile/epoch-K.txt (the
operators by self time) and epoch-K.json (the trace)."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest
from image_folders import write_image_folder
from typer.testing import CliRunner

from torchkit.cli import app

# 16 images, 12 of them training images in batches of 2: 6 steps an epoch.
ARGS = ["train", "--model", "convnet", "--image-size", "8", "-b", "2", "--val-split", "0.25",
        "--device", "cpu", "--workers", "0", "--optimizer", "sgd"]  # fmt: skip


def _optimizer_steps(trace_path) -> int:
    events = json.loads(trace_path.read_text())["traceEvents"]
    return sum(1 for event in events if str(event.get("name", "")).startswith("Optimizer.step#"))


def test_the_first_n_steps_of_the_first_two_epochs_are_profiled(
    runner, tmp_path, make_image_folder, capfd
):
    data = make_image_folder(tmp_path / "data", {"a": 8, "b": 8})
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            *ARGS,
            "--epochs",
            "3",
            "--profile-steps",
            "2",
            "--data",
            str(data),
            "--out",
            str(out),
            "-v",
        ],  # fmt: skip
    )
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (out / "profile").iterdir()) == [
        "epoch-1.json", "epoch-1.txt", "epoch-2.json", "epoch-2.txt",
    ]  # fmt: skip
    for epoch in (1, 2):
        table = (out / "profile" / f"epoch-{epoch}.txt").read_text()
        assert table.startswith(
            f"torchkit train --profile-steps: epoch {epoch}, its first 2 optimiser steps"
        )
        assert "operators by self CPU time" in table and "aten::convolution" in table
        assert "Optimizer.step#SGD.step" in table
        # the profile stops after the Nth update: the trace holds exactly 2 of the 6
        assert _optimizer_steps(out / "profile" / f"epoch-{epoch}.json") == 2
    assert "config.json" in {p.name for p in out.iterdir()}
    # the profiler's set-up and writing are not counted as training (train -v's last line)
    (run,) = [line for line in result.stderr.splitlines() if "run: " in line]
    assert ", profiling " in run and "3 epochs" in run
    # Kineto's own lines (its start and stop, "no GPU") stay off the terminal
    assert "USDT" not in capfd.readouterr().err


@pytest.fixture(scope="module")
def profiled_epoch(tmp_path_factory) -> tuple[Path, Path]:
    """The data and a run of one epoch of 6 steps, all profiled (--profile-steps 50): read by
    one test, resumed (a copy) by another."""
    root = tmp_path_factory.mktemp("profiled")
    data = write_image_folder(root / "data", {"a": 8, "b": 8})
    out = root / "run"
    args = [*ARGS, "--epochs", "1", "--profile-steps", "50", "--data", str(data), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    return data, out


def test_an_epoch_shorter_than_n_steps_is_profiled_whole(profiled_epoch):
    _, out = profiled_epoch
    assert sorted(p.name for p in (out / "profile").iterdir()) == ["epoch-1.json", "epoch-1.txt"]
    table = (out / "profile" / "epoch-1.txt").read_text()
    assert "epoch 1, its first 6 optimiser steps" in table
    assert _optimizer_steps(out / "profile" / "epoch-1.json") == 6


def test_without_the_option_nothing_is_profiled_and_a_resume_does_not_inherit_it(
    runner, tmp_path, profiled_epoch
):
    _, profiled = profiled_epoch
    out = Path(shutil.copytree(profiled, tmp_path / "run"))  # profiled with --profile-steps 50
    assert [p.name for p in (out / "profile").iterdir()] != []
    # continued without the option: the saved run's --profile-steps is not taken back
    resumed = runner.invoke(app, ["train", "--resume", str(out), "--epochs", "2"])
    assert resumed.exit_code == 0, resumed.stderr
    assert not (out / "profile" / "epoch-2.txt").exists()
    # nor does a run replayed from its config.json
    replayed = runner.invoke(
        app, ["train", "--config", str(out / "config.json"), "--out", str(tmp_path / "again")]
    )
    assert replayed.exit_code == 0, replayed.stderr
    assert not (tmp_path / "again" / "profile").exists()
    # given again, it profiles this invocation's epochs
    again = runner.invoke(
        app, ["train", "--resume", str(out), "--epochs", "3", "--profile-steps", "1"]
    )
    assert again.exit_code == 0, again.stderr
    assert (out / "profile" / "epoch-3.txt").is_file()
    # (A run of its own without the option profiles nothing: test_train_cli.py's shared run.)


def test_with_find_lr_or_a_negative_count_it_is_one_usage_error(
    runner, tmp_path, make_image_folder
):
    data = make_image_folder(tmp_path / "data", {"a": 8, "b": 8})
    for extra in (["--find-lr"], []):
        result = runner.invoke(
            app,
            [
                *ARGS,
                *extra,
                "--profile-steps",
                "2" if extra else "-1",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "run"),
            ],  # fmt: skip
        )
        assert result.exit_code == 2
        errors = [line for line in result.stderr.splitlines() if "rror" in line]
        assert len(errors) == 1 and "--profile-steps" in errors[0], result.stderr
    assert not (tmp_path / "run").exists()


def test_a_run_stopped_mid_epoch_saves_first_keeps_its_profile_and_says_so(
    tmp_path, make_image_folder, caplog
):
    import logging

    from torchkit.core.train import TrainCallbacks, TrainConfig, run_training

    class StopAfterThreeUpdates(TrainCallbacks):
        polls = 0

        def should_stop(self) -> bool:  # polled after each optimiser update
            self.polls += 1
            return self.polls >= 3

    data = make_image_folder(tmp_path / "data", {"a": 8, "b": 8})
    out = tmp_path / "run"
    config = TrainConfig(
        data=str(data), model="convnet", image_size=8, batch_size=2, val_split=0.25,
        device="cpu", workers=0, epochs=2, profile_steps=50, out=str(out),
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="torchkit"):
        result = run_training(config, StopAfterThreeUpdates())
    assert result.interrupted and (out / "last.pt").is_file()
    assert "its first 3 optimiser steps" in (out / "profile" / "epoch-1.txt").read_text()
    (line,) = [message for message in caplog.messages if message.startswith("run: ")]
    assert "0 epochs and part of one (stopped) " in line and ", test " not in line, line


def test_the_profile_is_kept_when_the_epoch_ends_or_stops_and_dropped_when_it_fails():
    from torchkit.core.train.step_profiler import profiling

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def start(self) -> None:
            self.calls.append("start")

        def stop(self) -> None:
            self.calls.append("stop")

        def abandon(self) -> None:
            self.calls.append("abandon")

    for fails, last in ((False, "stop"), (True, "abandon")):  # ended or stopped; diverged
        profiler = Recorder()
        with contextlib.suppress(RuntimeError), profiling(profiler):
            assert profiler.calls == ["start"]  # started before the epoch runs
            if fails:
                raise RuntimeError("the run diverged")  # and the failure goes on up
        assert profiler.calls == ["start", last]
    with profiling(None):  # no --profile-steps: nothing to do
        pass


@pytest.mark.parametrize(
    ("inductor_cudagraphs", "asked"), [("", False), ("1", True)], ids=["default", "env-on"]
)
def test_starting_a_profile_imports_no_inductor_while_its_config_is_its_default(
    monkeypatch, inductor_cudagraphs, asked
):
    """torch.profiler's start asked `hasattr(torch, "_inductor")`, which imports inductor,
    torch._dynamo and sympy (about 3 s of CPU a --profile-steps run) to read whether inductor's
    config turns CUDA graphs on: off by default, what the profiler then reads without it. With
    TORCHINDUCTOR_CUDAGRAPHS=1 it is asked as before. (Here torch's lazy importer records the
    question and answers "no attribute", so the test process imports nothing either way.)"""
    import sys

    import torch

    from torchkit.core.train.step_profiler import StepProfiler

    lazy = torch.__dict__["__getattr__"]
    questions = []

    def recording(name):
        if name == "_inductor":
            questions.append(name)
            raise AttributeError(name)
        return lazy(name)

    # As in a process that has not loaded inductor (the suite's may have). Not delattr's
    # raising=False: its hasattr would import inductor through the lazy importer.
    monkeypatch.delitem(sys.modules, "torch._inductor", raising=False)
    if "_inductor" in torch.__dict__:
        monkeypatch.delattr(torch, "_inductor")
    monkeypatch.setattr(torch, "__getattr__", recording)
    monkeypatch.setenv("TORCHINDUCTOR_CUDAGRAPHS", inductor_cudagraphs)
    profiler = StepProfiler(Path("unused"), 1, 1, torch.device("cpu")).start()
    try:
        assert torch.__dict__["__getattr__"] is recording  # put back
        assert questions == (["_inductor"] if asked else [])
        assert profiler.profile.has_cudagraphs is False
    finally:
        profiler.abandon()
