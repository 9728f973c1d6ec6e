"""`train --threads`: the CPU threads torch computes with; one for digits by default (its tiny
steps stall on two threads beside any other busy process), the cores the loader workers leave free
for image folders (core.runtime.threads)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from image_folders import write_image_folder
from output_checks import error_line

from torchkit.cli import app
from torchkit.core.train import TrainCallbacks, TrainConfig, run_training

TINY = dict(model="nets:TinyNet", image_size=8, batch_size=4, workers=0, epochs=1)
# digits with a tiny net in large batches: its data's thread default, at a fraction of the cost
# of the convnet (two threads beside the suite's other worker stall at every operation).
DIGITS = dict(model="nets:TinyNet", image_size=8, batch_size=256, device="cpu")


class ThreadsSeen(TrainCallbacks):
    """torch's thread count at the start of each epoch."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_epoch_start(self, epoch: int, epochs: int, steps: int, done: int) -> None:
        self.seen.append(torch.get_num_threads())


@pytest.fixture
def two_threads():
    """The process on 2 threads (the suite runs on 1), put back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def split_root(tmp_path):
    """train/ and val/ of a few 8x8 PNGs."""
    root = tmp_path / "data"
    write_image_folder(root / "train", {"ant": 4, "bee": 4}, seed=1)
    write_image_folder(root / "val", {"ant": 2, "bee": 2}, seed=2)
    return root


def options(run) -> dict:
    return json.loads((run / "config.json").read_text())


@dataclass
class DigitsRun:
    """A digits run of one epoch started on 2 threads: its folder, the threads torch computed
    its epoch with, and the count the process had after it."""

    out: Path
    seen: list[int]
    threads_after: int


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> DigitsRun:
    """The one digits run the module trains (a test that changes it resumes a copy)."""
    out = tmp_path_factory.mktemp("digits") / "run"
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # as `two_threads`
    try:
        seen = ThreadsSeen()
        run_training(TrainConfig(out=str(out), epochs=1, **DIGITS), seen)
        threads_after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    return DigitsRun(out, seen.seen, threads_after)


def test_digits_train_on_one_thread_and_give_the_process_its_count_back(digits_run):
    assert digits_run.seen == [1]
    assert digits_run.threads_after == 2
    config = options(digits_run.out)
    assert config["options"]["threads"] == 1 and "threads" in config["defaults_from_data"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_run_refused_on_its_device_gives_the_process_its_count_back(tmp_path, two_threads):
    """Was left on the run's one thread: the count was put back only once the device was set up."""
    from torchkit.core.io.errors import DeviceError

    with pytest.raises(DeviceError, match="CUDA is not available"):
        run_training(
            TrainConfig(out=str(tmp_path / "run"), epochs=1, **{**DIGITS, "device": "cuda"})
        )
    assert torch.get_num_threads() == 2


def test_image_folders_take_the_cores_the_workers_leave_unless_given(
    tmp_path, split_root, two_threads, monkeypatch
):
    """Was torch's one thread per core beside the loader's workers (on 2 cores with the default
    worker: 3 busy threads, each operation waiting for the one the scheduler left out)."""
    from torchkit.core.runtime import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: 3)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the suite's
    seen = ThreadsSeen()
    run_training(TrainConfig(data=str(split_root), out=str(tmp_path / "a"), **TINY), seen)
    assert options(tmp_path / "a")["options"]["threads"] is None  # chosen again on resume
    given = TrainConfig(data=str(split_root), out=str(tmp_path / "b"), threads=1, **TINY)
    run_training(given, seen)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's: torch's count is left as it is
    run_training(TrainConfig(data=str(split_root), out=str(tmp_path / "c"), **TINY), seen)
    assert seen.seen == [3, 1, 2] and torch.get_num_threads() == 2
    assert "threads" not in options(tmp_path / "b")["defaults_from_data"]


def test_deterministic_runs_compute_on_torchs_threads_whatever_the_workers(
    tmp_path, split_root, two_threads, monkeypatch
):
    """With --deterministic the numbers may not depend on --workers: a run killed with one
    worker and resumed, or replayed with none, computed on 1 and 2 threads (other sums)."""
    from torchkit.core.runtime import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: 3)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the suite's
    seen = ThreadsSeen()
    for workers in (0, 1):
        out = tmp_path / f"w{workers}"
        tiny = {**TINY, "workers": workers}
        config = TrainConfig(data=str(split_root), out=str(out), deterministic=True, **tiny)
        run_training(config, seen)
    assert seen.seen == [2, 2]  # torch's own count (two_threads), not 3 - workers


def test_negative_threads_are_refused(runner, image_folder, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--data", str(image_folder), "--threads", "-1", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "Invalid value for '--threads'" in error_line(result.stderr)
    assert not out.exists()


def test_a_run_recorded_before_the_option_resumes_on_torchs_threads(
    tmp_path, two_threads, digits_run
):
    run = Path(shutil.copytree(digits_run.out, tmp_path / "run"))
    checkpoint = torch.load(run / "last.pt", weights_only=True)
    del checkpoint["config"]["threads"]  # as a run saved before --threads existed
    torch.save(checkpoint, run / "last.pt")

    class StoppedAtOnce(ThreadsSeen):  # the epoch's start is what is read: no need to train it
        def should_stop(self) -> bool:
            return True

    seen = StoppedAtOnce()
    resume = TrainConfig(resume=str(run), epochs=2, trust_checkpoint=True)
    assert run_training(resume, seen, overrides={"epochs", "trust_checkpoint"}).interrupted
    assert seen.seen == [2]  # as it trained: torch's default, not digits' one thread
    assert options(run)["options"]["threads"] == 0


def test_more_threads_than_cores_is_refused_naming_the_cores(runner, tmp_path, monkeypatch):
    """Was accepted without a word, then with a warning: --threads 1000 on 2 cores trained
    about 5x slower (torch's threads wait for each other at every operation). Refused now, as
    too many --workers are, before anything is written. A resumed run's or a recipe's value,
    which this command line does not give, is chosen again (the last test)."""
    monkeypatch.setattr("torchkit.core.train.validation.usable_cpus", lambda: 2, raising=False)
    out = tmp_path / "run"
    for threads in ("3", "1000"):
        result = runner.invoke(app, ["train", "--threads", threads, "--out", str(out)])
        assert result.exit_code == 2, result.stderr
        assert error_line(result.stderr) == (
            f"Error: --threads {threads} is more than the 2 cores this process may use: the "
            "extra threads would only wait for each other and slow every step down (give at "
            "most 2, or 0 for one per core)"
        )
        assert not out.exists()
    for threads in ("2", "0"):
        within = runner.invoke(app, ["train", "--threads", threads, "--print-config"])
        assert within.exit_code == 0 and "Warning" not in within.stderr, within.stderr


@pytest.mark.parametrize("threads", ["-1", "nan", "2.5"])
def test_a_threads_count_that_is_no_count_is_one_error_line(runner, threads):
    """The option's own check (its wording is the Typer version's): exit 2, one line."""
    result = runner.invoke(app, ["train", "--threads", threads, "--print-config"])
    assert result.exit_code == 2, result.stderr
    assert error_line(result.stderr).startswith("Error: Invalid value for '--threads': ")
    assert result.stdout == ""


def test_a_saved_runs_threads_and_workers_above_this_machine_are_chosen_again(
    runner, tmp_path, monkeypatch, digits_run
):
    """A run started with --threads 8 on a larger machine, resumed (or its config.json
    replayed) here without --threads, was refused for a value the user did not give ("--threads
    8 is more than the 2 cores"). Chosen again now, as without the option, with a warning naming
    whose value it was; --workers alike. Given on this command line, still refused."""
    monkeypatch.setattr("torchkit.core.train.validation.usable_cpus", lambda: 2, raising=False)
    run = Path(shutil.copytree(digits_run.out, tmp_path / "run"))
    checkpoint = torch.load(run / "last.pt", weights_only=True)
    checkpoint["config"].update(threads=8, workers=10_000)  # as recorded on a larger machine
    torch.save(checkpoint, run / "last.pt")
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"threads": 8, "workers": 10_000}))
    for args, whose in [
        (["--resume", str(run)], "the resumed run's"),
        (["--config", str(recipe)], f"{recipe}'s"),
    ]:
        result = runner.invoke(app, ["train", *args, "--print-config"])
        assert result.exit_code == 0, result.stderr
        said = " ".join(result.stderr.split())
        assert (
            f"Warning: {whose} --threads 8 is more than the 2 cores this process may use: "
            "training with what a run without --threads takes (give --threads to choose)"
        ) in said
        assert f"Warning: {whose} --workers 10000 is more than this machine can use" in said
        printed = json.loads(result.stdout)
        assert printed["threads"] in (None, 0, 1, 2) and printed["workers"] != 10_000
        given = runner.invoke(app, ["train", *args, "--threads", "8", "--print-config"])
        assert given.exit_code == 2
        assert "--threads 8 is more than the 2 cores" in error_line(given.stderr)
