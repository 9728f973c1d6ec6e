"""A checkpoint whose place in its run is damaged is one error naming the field, before the
resume builds anything (core/train/checkpoints.load_for_resume)."""

from __future__ import annotations

import pytest
import torch
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.io.errors import CheckpointError
from torchkit.core.train.checkpoints import load_for_resume

HINT = (
    "the file is damaged or not torchkit's; resume an earlier checkpoint of the run instead, an "
    "epoch-NNN.pt, with --out NEW"
)


def _checkpoint(**changes) -> dict:
    """The fields --resume reads of a run's place, as a run one epoch in saves them."""
    checkpoint = {
        "format_version": 1, "arch": "convnet", "num_classes": 2, "classes": ["a", "b"],
        "model": {"w": torch.zeros(2)}, "optimizer": {}, "config": {}, "epoch": 1,
        "global_step": 4, "best_epoch": 1, "best_metric": 0.5, "history": [{"epoch": 1}],
        "scheduler": {"updates": 4}, "epoch_progress": None,
    }  # fmt: skip
    checkpoint.update(changes)
    return checkpoint


def test_a_sound_place_in_the_run_is_read(tmp_path):
    path = tmp_path / "last.pt"
    torch.save(_checkpoint(epoch_progress={"batches": 2, "seen": 8}), path)
    assert load_for_resume(str(path))[1]["epoch"] == 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # Before: 'Error: StopIteration', 'Error: ValueError: invalid literal for int() ...'.
        ({"epoch": -5}, "its epoch -5 is not a whole number of epochs done"),
        ({"epoch": "two"}, "its epoch 'two' is not a whole number of epochs done"),
        # Before: resumed without a word.
        ({"global_step": float("nan")}, "its global_step nan is not a whole number, 0 or more"),
        ({"ema_updates": -3}, "its ema_updates -3 is not a whole number, 0 or more"),
        # Before: 'Error: ValueError: dictionary update sequence element #0 has length 1 ...'.
        ({"history": "x"}, "its history 'x' is not a list of rows of metrics.csv"),
        # Before: "Error: TypeError: 'int' object is not iterable".
        ({"model_ema": [1]}, "its model_ema [1] is not a state dict of EMA weights"),
        ({"rng_state": "x"}, "its rng_state 'x' is not a random state"),
        # Before: "Error: KeyError: 'updates'".
        ({"scheduler": {"x": 1}}, "its scheduler {'x': 1} is not a schedule with its count of"),
        # Before: "Error: TypeError: EpochProgress.__init__() got an unexpected keyword ...".
        (
            {"epoch_progress": {"step": 10**12}},
            "its epoch_progress {'step': 1000000000000} is not the place of an epoch in progress",
        ),
    ],
    ids=[
        "epoch-negative",
        "epoch-text",
        "step-nan",
        "ema-negative",
        "history",
        "ema",
        "rng",
        "schedule",
        "progress",
    ],  # fmt: skip
)
def test_a_damaged_place_in_the_run_is_one_error_naming_the_field(tmp_path, changes, message):
    path = tmp_path / "last.pt"
    torch.save(_checkpoint(**changes), path)
    with pytest.raises(CheckpointError) as refused:
        load_for_resume(str(path))
    assert refused.value.message.startswith(f"{path} cannot continue a run: {message}")
    assert refused.value.hint == HINT


def test_the_resume_says_it_on_one_line(tmp_path):
    path = tmp_path / "last.pt"
    torch.save(_checkpoint(epoch=-5), path)
    result = run_torchkit_in_process("train", "--resume", path)
    assert result.returncode == 1
    assert error_line(result.stderr) == (
        f"Error: {path} cannot continue a run: its epoch -5 is not a whole number of epochs "
        f"done ({HINT})"
    )
