"""A run resumed into another folder from a run that is still training: the checkpoint it carries
over as its best.pt is the epoch it read, never a later one the other run saved meanwhile."""

from __future__ import annotations

import torch

from torchkit.core.runtime.distributed import DistContext
from torchkit.core.train.run_folder import RunFolder

HISTORY = [{"epoch": e, "val_loss": 1.0 / e} for e in (1, 2, 3)]


def checkpoint(epoch: int) -> dict:
    """A checkpoint saved at the end of `epoch`, each epoch the best so far."""
    return {"epoch": epoch, "best_epoch": epoch, "arch": "a", "classes": ["x", "y"],
            "history": HISTORY[:epoch], "epoch_progress": None}  # fmt: skip


def carried(tmp_path, read: dict) -> tuple[bool, dict | None]:
    """RUN2's carry of the best epoch of `read` (RUN/last.pt as the resume read it): whether
    the best epoch was found, and what RUN2/best.pt holds."""
    folder = RunFolder()
    folder.path = tmp_path / "run2"
    folder.path.mkdir()
    found = folder.carry_best(DistContext(), tmp_path / "run" / "last.pt", read)
    best = folder.path / "best.pt"
    return found, torch.load(best, weights_only=True) if best.exists() else None


def test_the_best_carried_over_is_the_epoch_read_not_one_the_running_run_saved_since(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    read = checkpoint(2)  # last.pt when the resume read it: epoch 2, the best so far
    for name in ("last.pt", "best.pt"):  # the other run went on: epoch 3 is its best now
        torch.save(checkpoint(3), run / name)
    found, best = carried(tmp_path, read)
    assert not found and best is None  # the best starts over (a warning says so)


def test_the_best_epoch_read_is_carried_over_when_it_is_still_there(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    torch.save(checkpoint(2), run / "last.pt")
    torch.save(checkpoint(3), run / "best.pt")  # not of the run's epoch 2: last.pt is
    found, best = carried(tmp_path, checkpoint(2))
    assert found and best["epoch"] == 2
