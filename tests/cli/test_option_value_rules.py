"""Option values read by one rule in every command: one range of seeds, numbers in ASCII digits
only, long values shortened in the error line, and a schedule whose drops all come after the
last epoch warned of."""

from __future__ import annotations

import logging

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.runtime.seeding import SEEDS, check_seed
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.validation import validate

# Every command that takes --seed, each refusing it before reading anything (the data named
# here does not exist).
SEEDED = {
    "train": ["train", "--data", "{tmp}/none", "--out", "{tmp}/out"],
    "extract-features": ["extract-features", "convnet", "{tmp}/none", "{tmp}/out"],
    "convert shards": ["convert", "shards", "{tmp}/none", "{tmp}/out"],
    "split": ["split", "{tmp}/none", "{tmp}/out"],
    "video-info": ["video-info", "{tmp}/none.avi", "--sample-mode", "train"],
}


@pytest.mark.parametrize("command", SEEDED)
@pytest.mark.parametrize("seed", [-1, 2**32, 2**64])
def test_every_command_takes_the_same_seeds_and_refuses_others_alike(command, seed, tmp_path):
    # Before: -1 was refused by video-info alone (in click's words), split took any number,
    # train/extract-features/convert shards took -2**63 to 2**64-1 (NumPy refuses 2**32).
    words = [w.format(tmp=tmp_path) for w in SEEDED[command]]
    result = run_torchkit_in_process(*words, "--seed", str(seed))
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr) == (
        f"Error: --seed {seed} is not a seed (give a whole number from 0 to {2**32 - 1})"
    )
    assert not (tmp_path / "out").exists()


def test_the_seeds_are_those_python_numpy_and_torch_all_take():
    import random

    import numpy as np
    import torch

    for seed in SEEDS:
        assert check_seed(seed) == seed
        random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    with pytest.raises(ValueError):
        np.random.seed(SEEDS[1] + 1)


# Options of numbers, each as a command that refuses its value before any work.
NUMBERS = {
    "train --milestones": ["train", "--scheduler", "multistep", "--out", "{tmp}/o", "--milestones"],
    "train --mean": ["train", "--out", "{tmp}/o", "--mean"],
    "train --crop-scale": ["train", "--out", "{tmp}/o", "--crop-scale"],
    "eval --std": ["eval", "convnet", "--data", "digits", "--std"],
    "split --fixed": ["split", "{tmp}/none", "{tmp}/out", "--fixed"],
    "split --ratio": ["split", "{tmp}/none", "{tmp}/out", "--ratio"],
    "benchmark --batch-size": ["benchmark", "convnet", "--batch-size"],
    "benchmark --input-size": ["benchmark", "convnet", "--input-size"],
    "summary --input-size": ["summary", "convnet", "--input-size"],
}  # fmt: skip
FULL_WIDTH = {
    "--milestones": "３",
    "--crop-scale": "０.５,１",
    "--ratio": "８:１:１",
    "--input-size": "３,８,８",  # a shape summary and benchmark take in ASCII digits
}


@pytest.mark.parametrize("option", NUMBERS)
def test_numbers_in_other_digits_than_ascii_are_refused(option, tmp_path):
    # Before: float() and int() read full-width digits (`３`) in these, which an option of one
    # number (pydantic's) refuses.
    flag = option.split()[-1]
    words = [w.format(tmp=tmp_path) for w in NUMBERS[option]]
    result = run_torchkit_in_process(*words, FULL_WIDTH.get(flag, "３"))
    assert result.returncode == 2, result.stderr
    assert flag in error_line(result.stderr) or "input size" in error_line(result.stderr)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", NUMBERS)
def test_a_value_thousands_of_digits_long_is_shortened_in_the_error(option, tmp_path):
    words = [w.format(tmp=tmp_path) for w in NUMBERS[option]]
    result = run_torchkit_in_process(*words, "9" * 5000)
    assert result.returncode == 2, result.stderr
    line = error_line(result.stderr)
    assert len(line) < 400 and "..." in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("changes", "warned"),
    [
        ({"scheduler": "multistep", "milestones": (50,)}, "--milestones 50: "),
        ({"scheduler": "multistep", "milestones": (1, 2)}, "drops after epoch 2 "),
        ({"scheduler": "step", "step_size": 30}, "--step-size 30: "),
        ({"scheduler": "step", "step_size": 2}, "--step-size 2: "),
    ],
)
def test_a_schedule_whose_drops_come_after_the_last_epoch_is_warned_of(changes, warned, caplog):
    # Before: accepted silently, and the learning rate never dropped. Warned, not refused: a
    # --resume to more epochs reaches the drops.
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        validate(TrainConfig(epochs=2, **changes))
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1 and warned in messages[0] and "--epochs 2" in messages[0]


@pytest.mark.parametrize(
    "changes",
    [
        {"scheduler": "multistep", "milestones": (1,)},
        {"scheduler": "step", "step_size": 1},
        {"scheduler": "cosine"},
    ],
)
def test_a_schedule_that_drops_within_the_run_is_not_warned_of(changes, caplog):
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        validate(TrainConfig(epochs=2, **changes))
    assert caplog.records == []
