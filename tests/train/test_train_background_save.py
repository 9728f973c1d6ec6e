"""`torchkit train` writes an epoch's files (best.pt, epoch-NNN.pt, last.pt, metrics.csv) on a
writer thread while the next epoch trains (`core.train.checkpoint_writer`): the files hold the
epoch's state as it was when the epoch ended, bit for bit what a synchronous save writes, and a
write that fails is the run's `cannot write` error (exit 1, no summary), with the last good
files kept. Synchronised with events, never with sleeps."""

from __future__ import annotations

import copy
import errno
import threading
from pathlib import Path

import pytest
import torch
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.models import checkpoint as checkpoint_module
from torchkit.core.train import epochs, run_folder

# 2 classes x 6 images of 8x8: 8 train / 4 val, 2 steps an epoch.
TINY = ["--model", "convnet", "--image-size", "8", "--batch-size", "4", "--workers", "0"]
GIVE_UP_S = 20.0  # how long a blocked write waits for the next epoch (only the old code waits)


@pytest.fixture
def ds(tmp_path: Path) -> Path:
    write_image_folder(tmp_path / "ds", {"a": 6, "b": 6})
    return tmp_path / "ds"


def _train(tmp_path: Path, data: Path | str, *extra: object):
    args = ["train", "--data", data, "--val-split", "0.3", "--out", "run", "--seed", "3"]
    return run_torchkit_in_process(*args, *extra, cwd=tmp_path)


def _tensors(obj: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a checkpoint's nested dicts and lists, by its path."""
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    found: dict[str, torch.Tensor] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            found |= _tensors(value, f"{prefix}/{key}")
    elif isinstance(obj, list | tuple):
        for index, value in enumerate(obj):
            found |= _tensors(value, f"{prefix}/{index}")
    return found


def _assert_same_tensors(saved: dict, expected: dict) -> None:
    saved_tensors, expected_tensors = _tensors(saved), _tensors(expected)
    assert saved_tensors.keys() == expected_tensors.keys()
    different = [
        name
        for name, tensor in expected_tensors.items()
        if not torch.equal(saved_tensors[name], tensor)
    ]
    assert different == []


def test_the_next_epoch_trains_while_the_last_one_is_written_and_the_files_are_its_own(
    tmp_path, ds, monkeypatch
):
    """Epoch 1's write waits until epoch 2 has taken an optimiser step, which changes the live
    weights and optimiser state: the run still finishes (before, the write held up the run
    itself, and so epoch 2), and epoch-001.pt holds epoch 1's state as it was at its end."""
    stepped_in_epoch_2 = threading.Event()
    overlapped: list[bool] = []
    at_submit: dict[int, dict] = {}

    real_train_one_epoch = epochs.train_one_epoch

    def training(*args, should_stop, epoch, **kwargs):
        def stepped() -> bool:  # called after each optimiser update
            if epoch == 2:
                stepped_in_epoch_2.set()
            return should_stop()

        return real_train_one_epoch(*args, should_stop=stepped, epoch=epoch, **kwargs)

    real_save_epoch = run_folder.save_epoch

    def slow_save_epoch(folder, checkpoint, **kwargs):
        if checkpoint["epoch"] == 1:
            overlapped.append(stepped_in_epoch_2.wait(GIVE_UP_S))
        return real_save_epoch(folder, checkpoint, **kwargs)

    real_submit = run_folder.RunFolder.save_epoch

    def submitted(self, checkpoint, *args, **kwargs):
        at_submit[checkpoint["epoch"]] = copy.deepcopy(checkpoint)  # the state right now
        return real_submit(self, checkpoint, *args, **kwargs)

    monkeypatch.setattr(epochs, "train_one_epoch", training)
    monkeypatch.setattr(run_folder, "save_epoch", slow_save_epoch)
    monkeypatch.setattr(run_folder.RunFolder, "save_epoch", submitted)
    done = _train(tmp_path, ds, *TINY, "--epochs", "3", "--save-every", "1")
    assert done.returncode == 0, done.stderr
    assert overlapped == [True]
    run = tmp_path / "run"
    for epoch in (1, 2, 3):
        saved = torch.load(run / f"epoch-{epoch:03d}.pt", weights_only=True)
        assert saved["epoch"] == epoch
        _assert_same_tensors(saved, at_submit[epoch])
    assert torch.load(run / "last.pt", weights_only=True)["epoch"] == 3
    assert len((run / "metrics.csv").read_text().splitlines()) == 4


def _rng_states_changed(before: dict, after: dict) -> list[str]:
    """The generators (python, numpy, torch) whose `capture_rng_state` state differs."""
    numpy_same = all(
        torch.equal(value, after["numpy"][key])
        if isinstance(value, torch.Tensor)
        else value == after["numpy"][key]
        for key, value in before["numpy"].items()
    )
    same = {
        "python": before["python"] == after["python"],
        "numpy": numpy_same,
        "torch": torch.equal(before["torch"], after["torch"]),
    }
    return [name for name, unchanged in same.items() if not unchanged]


def test_the_background_write_draws_no_random_number_of_the_training(tmp_path, ds, monkeypatch):
    """Epoch 1's files are written while epoch 2 trains, whose augmentation draws from the
    global random generators (Python, NumPy, torch) seeded at its start: a draw in the write
    would change epoch 2 against a run resumed from epoch 1's last.pt, which trains epoch 2
    with no write beside it. Here the write runs only once epoch 2 has begun, and epoch 2
    waits for it: the random states are still those it began with."""
    from torchkit.core.runtime.seeding import capture_rng_state
    from torchkit.core.train import checkpoint_writer

    monkeypatch.setattr(checkpoint_writer, "BACKGROUND", True)
    epoch_2_began = threading.Event()
    folders: list[run_folder.RunFolder] = []
    states: dict[str, dict] = {}
    real_train_one_epoch, real_save_epoch = epochs.train_one_epoch, run_folder.save_epoch
    real_submit = run_folder.RunFolder.save_epoch

    def training(*args, epoch, **kwargs):
        if epoch == 2:
            states["began"] = capture_rng_state()
            epoch_2_began.set()
            folders[0].wait_saved()  # epoch 1's write, begun only now
            states["written"] = capture_rng_state()
        return real_train_one_epoch(*args, epoch=epoch, **kwargs)

    def save_epoch_once_epoch_2_began(folder, checkpoint, **kwargs):
        if checkpoint["epoch"] == 1:
            assert epoch_2_began.wait(GIVE_UP_S)
        return real_save_epoch(folder, checkpoint, **kwargs)

    def submitted(self, *args, **kwargs):
        folders.append(self)
        return real_submit(self, *args, **kwargs)

    monkeypatch.setattr(epochs, "train_one_epoch", training)
    monkeypatch.setattr(run_folder, "save_epoch", save_epoch_once_epoch_2_began)
    monkeypatch.setattr(run_folder.RunFolder, "save_epoch", submitted)
    done = _train(tmp_path, ds, *TINY, "--epochs", "2")
    assert done.returncode == 0, done.stderr
    assert states.keys() == {"began", "written"}
    assert _rng_states_changed(states["began"], states["written"]) == []


# The digits run's defaults (core.train.defaults.DIGITS_DEFAULTS: the EMA's weights and the
# loss pick best.pt, channels-last, one thread) on the 12-image folder.
DIGITS_OPTIONS = [
    "--model", "convnet", "--image-size", "12", "--batch-size", "4", "--workers", "0",
    "--channels-last", "--no-flip", "--crop-scale", "0.85,1", "--best-metric", "loss", "--ema",
    "--threads", "1",
]  # fmt: skip


def test_the_checkpoints_written_in_the_background_are_those_of_a_synchronous_save(
    tmp_path, ds, monkeypatch
):
    """A 3-epoch run with the digits defaults: last.pt and best.pt hold the same tensors
    (weights, EMA, optimiser state, random state) as when written in the run's own thread, and
    the same losses."""
    from torchkit.core.train import checkpoint_writer

    runs = {}
    for background in (True, False):
        monkeypatch.setattr(checkpoint_writer, "BACKGROUND", background)
        folder = tmp_path / str(background)
        folder.mkdir()
        done = _train(folder, ds, *DIGITS_OPTIONS, "--epochs", "3")
        assert done.returncode == 0, done.stderr
        runs[background] = folder / "run"
    for name in ("last.pt", "best.pt"):
        background, synchronous = (
            torch.load(runs[side] / name, weights_only=True) for side in (True, False)
        )
        assert background["epoch"] == synchronous["epoch"]
        _assert_same_tensors(background, synchronous)

    def losses(run: Path) -> list[list[str]]:
        rows = [line.split(",") for line in (run / "metrics.csv").read_text().splitlines()]
        return [row[:7] for row in rows]  # not the epochs' times

    assert losses(runs[True]) == losses(runs[False])


@pytest.mark.parametrize("epochs_run", [2, 3], ids=["at-the-end", "at-the-next-save"])
def test_a_failed_background_write_is_the_runs_error_and_keeps_the_last_good_files(
    tmp_path, ds, monkeypatch, epochs_run
):
    """Epoch 2's checkpoint meets a full disk on the writer thread: the run fails with the
    `cannot write` error that a synchronous save gives (raised at the next epoch's save, or
    at the run's end), exit 1, no summary, and epoch 1's files are still there."""
    real_torch_save = checkpoint_module.torch_save

    def full_disk_at_epoch_2(obj, path):
        if obj["epoch"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_torch_save(obj, path)

    monkeypatch.setattr(checkpoint_module, "torch_save", full_disk_at_epoch_2)
    done = _train(tmp_path, ds, *TINY, "--epochs", epochs_run)
    run = tmp_path / "run"
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr).startswith("Error: cannot write run/")
    assert done.stdout == ""  # no summary table
    for name in ("last.pt", "best.pt"):
        assert torch.load(run / name, weights_only=True)["epoch"] == 1
    assert len((run / "metrics.csv").read_text().splitlines()) == 2  # header and epoch 1
    assert not [path.name for path in run.iterdir() if path.name.endswith(".tmp.pt")]


def test_the_last_curves_png_is_drawn_while_best_pt_is_tested(tmp_path, monkeypatch):
    """The run's last curves.png is drawn on the writer thread, beside the test evaluation of
    best.pt (here the drawing waits until the test has begun), and is there when the run
    ends."""
    from torchkit.core.train import runner

    testing = threading.Event()
    overlapped: list[bool] = []
    real_test, real_draw = runner.evaluate_best_on_test, run_folder.write_curves_png

    def test_best(*args, **kwargs):
        testing.set()
        return real_test(*args, **kwargs)

    def draw(*args, **kwargs):
        overlapped.append(testing.wait(GIVE_UP_S))
        return real_draw(*args, **kwargs)

    monkeypatch.setattr(runner, "evaluate_best_on_test", test_best)
    monkeypatch.setattr(run_folder, "write_curves_png", draw)
    # No plot helper: the drawing is the patched function's, in this process.
    monkeypatch.setattr(run_folder.RunFolder, "start_painter", lambda self: None)
    # A root with its own test/ split (of 2 images: what is under test is the overlap, not
    # the data; digits' 179 through its convnet cost a second of CPU).
    for split, count in (("train", 4), ("val", 2), ("test", 1)):
        write_image_folder(tmp_path / "split" / split, {"a": count, "b": count}, seed=len(split))
    tiny = ["--model", "nets:TinyNet", "--image-size", "8", "--batch-size", "4", "-j", "0"]
    done = _train(tmp_path, tmp_path / "split", *tiny, "--epochs", "1")
    assert done.returncode == 0, done.stderr
    assert overlapped == [True]
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0
    assert "Test top-1" in done.stdout


def test_the_writer_raises_a_failed_writes_error_in_the_waiting_thread_once():
    from torchkit.core.train.checkpoint_writer import CheckpointWriter

    writer = CheckpointWriter()
    written: list[str] = []
    writer.submit(lambda: written.append(threading.current_thread().name))

    def full_disk() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    writer.submit(full_disk)  # waits for the first write, which went well
    assert written == ["torchkit-checkpoint-writer"]
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    writer.wait()  # raised once
    writer.submit(full_disk)
    writer.drain()  # a failing run keeps its own error
    writer.wait()
