"""Under torchrun, an error every rank of a node raises alike before the ranks connect (a bad
option, a missing data folder: the same command line and files) is printed once, by local rank 0;
every rank still ends with its exit code. A rank that fails alone still prints its own."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import error_lines_of, run_ranks_under_agent, stderr_of
from processes import run_torchkit_in_process

from torchkit.core.runtime import launch

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed missing"
)

TINY = ("--model", "nets:TinyNet", "--device", "cpu", "--workers", "0")


def test_a_bad_option_is_printed_by_one_rank(tmp_path):
    """Was printed by each rank (8 ranks: 8 lines)."""
    ranks = run_ranks_under_agent("train", "--data", tmp_path, *TINY, "--epochs", "x")
    assert error_lines_of(ranks) == [
        "Error: Invalid value for '--epochs' / '-e': 'x' is not a whole number from 1 to "
        "1,000,000 (see 'torchkit train --help')"
    ], stderr_of(ranks)
    assert ranks[0].returncode == 2 and all(done.returncode for done in ranks), stderr_of(ranks)


def test_a_missing_data_folder_is_printed_by_one_rank(tmp_path):
    missing, out = tmp_path / "missing", tmp_path / "run"
    ranks = run_ranks_under_agent("train", "--data", missing, *TINY, "--epochs", "1", "--out", out)
    [line] = error_lines_of(ranks)
    assert line.startswith(f"Error: dataset not found: {missing} ("), stderr_of(ranks)
    assert ranks[0].returncode == 1 and all(done.returncode for done in ranks), stderr_of(ranks)
    assert not out.exists()


def test_a_rank_the_agent_does_not_stop_prints_its_error(monkeypatch):
    """Rank 1 alone failed (local rank 0 carried on, so the agent stopped no one): its error is
    its own, and it prints it after the wait."""
    world = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    for name, value in {**world, "TORCHELASTIC_RUN_ID": "test"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launch, "LOCAL_RANK_0_WAIT_S", 0.01)
    done = run_torchkit_in_process("train", "--data", "digits", "--epochs", "x")
    assert done.returncode == 2
    assert done.stderr.startswith("Error: Invalid value for '--epochs' / '-e'"), done.stderr
