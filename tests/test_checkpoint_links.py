"""An epoch's checkpoints (best.pt, epoch-NNN.pt, last.pt) serialized once: the first file
written is hard-linked to the other names (`checkpoint.save_checkpoint_as`), each name still
replaced atomically, in order."""

from __future__ import annotations

import errno
import os

import torch

from torchkit.core import files
from torchkit.core.train.checkpoints import save_epoch


def _checkpoint(epoch: int) -> dict:
    return {"epoch": epoch, "model": {"weight": torch.full((4, 4), float(epoch))}}


def _epoch(path) -> int:
    return torch.load(path, weights_only=True)["epoch"]


def test_a_best_epoch_is_written_once_under_each_of_its_names(tmp_path):
    written = save_epoch(tmp_path, _checkpoint(1), is_best=True, save_every=1, keep=0)
    assert [path.name for path in written] == ["best.pt", "epoch-001.pt", "last.pt"]
    inodes = {os.stat(path).st_ino for path in written}
    assert len(inodes) == 1 and os.stat(tmp_path / "last.pt").st_nlink == 3
    assert [_epoch(path) for path in written] == [1, 1, 1]
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "best.pt",
        "epoch-001.pt",
        "last.pt",
    ]  # fmt: skip  (no temporary left)


def test_a_later_epoch_replaces_only_its_own_names(tmp_path):
    save_epoch(tmp_path, _checkpoint(1), is_best=True, save_every=0, keep=0)
    save_epoch(tmp_path, _checkpoint(2), is_best=False, save_every=0, keep=0)
    assert (_epoch(tmp_path / "best.pt"), _epoch(tmp_path / "last.pt")) == (1, 2)
    assert os.stat(tmp_path / "best.pt").st_nlink == 1
    save_epoch(tmp_path, _checkpoint(3), is_best=True, save_every=0, keep=0)
    assert os.path.samefile(tmp_path / "best.pt", tmp_path / "last.pt")
    assert _epoch(tmp_path / "best.pt") == 3


def test_pruning_periodic_checkpoints_leaves_the_names_linked_to_them(tmp_path):
    for epoch in (1, 2, 3):
        save_epoch(tmp_path, _checkpoint(epoch), is_best=epoch == 1, save_every=1, keep=1)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "best.pt", "epoch-003.pt", "last.pt"
    ]  # fmt: skip
    assert (_epoch(tmp_path / "best.pt"), _epoch(tmp_path / "last.pt")) == (1, 3)


def test_best_pt_is_in_place_before_last_pt(tmp_path, monkeypatch):
    # last.pt names its epoch as the best only once best.pt holds it.
    replaced = []
    real = os.replace
    monkeypatch.setattr(
        os, "replace", lambda a, b: (replaced.append(os.path.basename(b)), real(a, b))
    )
    save_epoch(tmp_path, _checkpoint(1), is_best=True, save_every=1, keep=0)
    assert replaced == ["best.pt", "epoch-001.pt", "last.pt"]


def test_where_links_are_refused_the_bytes_are_copied(tmp_path, monkeypatch):
    def refuse(source, target):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(files.os, "link", refuse)
    save_epoch(tmp_path, _checkpoint(1), is_best=True, save_every=0, keep=0)
    best, last = tmp_path / "best.pt", tmp_path / "last.pt"
    assert not os.path.samefile(best, last)
    assert best.read_bytes() == last.read_bytes() and _epoch(last) == 1
