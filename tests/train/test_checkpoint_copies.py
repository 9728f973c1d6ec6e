"""An epoch's checkpoints (best.pt, epoch-NNN.pt, last.pt) serialized once: the first file
written is copied to the other names in the kernel (`checkpoint.save_checkpoint_as`,
`files.copy_bytes`), each name still replaced atomically, in order, and each a file of its own."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from torchkit.core.io import files
from torchkit.core.io.errors import OutputWriteError
from torchkit.core.train.checkpoints import save_epoch


def _checkpoint(epoch: int) -> dict:
    return {"epoch": epoch, "model": {"weight": torch.full((64, 64), float(epoch))}}


def _epoch(path) -> int:
    return torch.load(path, weights_only=True)["epoch"]


def test_a_best_epoch_is_serialized_once_and_copied_to_its_other_names(tmp_path, monkeypatch):
    saved = []
    real = files.torch_save
    monkeypatch.setattr(
        files, "torch_save", lambda obj, path: (saved.append(path), real(obj, path))
    )
    monkeypatch.setattr("torchkit.core.models.checkpoint.torch_save", files.torch_save)
    written = save_epoch(tmp_path, _checkpoint(1), is_best=True, save_every=1, keep=0)
    assert [path.name for path in written] == ["best.pt", "epoch-001.pt", "last.pt"]
    assert len(saved) == 1
    assert len({(tmp_path / name).read_bytes() for name in ("best.pt", "epoch-001.pt")}) == 1
    assert (tmp_path / "last.pt").read_bytes() == (tmp_path / "best.pt").read_bytes()
    assert len({os.stat(path).st_ino for path in written}) == 3  # files of their own
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "best.pt",
        "epoch-001.pt",
        "last.pt",
    ]  # fmt: skip  (no temporary left)


def test_rewriting_best_pt_in_place_leaves_last_pt_as_it_was(tmp_path):
    # A user who strips best.pt down with torch.save(..., "best.pt") keeps the run resumable.
    save_epoch(tmp_path, _checkpoint(1), is_best=True, save_every=0, keep=0)
    torch.save({"model": {}}, tmp_path / "best.pt")
    assert _epoch(tmp_path / "last.pt") == 1


def test_a_later_epoch_replaces_only_its_own_names(tmp_path):
    save_epoch(tmp_path, _checkpoint(1), is_best=True, save_every=0, keep=0)
    save_epoch(tmp_path, _checkpoint(2), is_best=False, save_every=0, keep=0)
    assert (_epoch(tmp_path / "best.pt"), _epoch(tmp_path / "last.pt")) == (1, 2)
    save_epoch(tmp_path, _checkpoint(3), is_best=True, save_every=1, keep=1)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "best.pt", "epoch-003.pt", "last.pt"
    ]  # fmt: skip
    assert [_epoch(tmp_path / n) for n in ("best.pt", "epoch-003.pt", "last.pt")] == [3, 3, 3]


def test_best_pt_is_in_place_before_last_pt(tmp_path, monkeypatch):
    # last.pt names its epoch as the best only once best.pt holds it.
    replaced = []
    real = os.replace
    monkeypatch.setattr(
        os, "replace", lambda a, b: (replaced.append(os.path.basename(b)), real(a, b))
    )
    save_epoch(tmp_path, _checkpoint(1), is_best=True, save_every=1, keep=0)
    assert replaced == ["best.pt", "epoch-001.pt", "last.pt"]


@pytest.mark.parametrize("refusal", [errno.EXDEV, errno.EOPNOTSUPP, None])
def test_where_the_kernel_will_not_copy_python_does(tmp_path, monkeypatch, refusal):
    def refuse(*args):
        raise OSError(refusal, os.strerror(refusal))

    if refusal is None:  # not Linux: no os.copy_file_range at all
        monkeypatch.delattr(files.os, "copy_file_range", raising=False)
    else:
        monkeypatch.setattr(files.os, "copy_file_range", refuse)
    save_epoch(tmp_path, _checkpoint(1), is_best=True, save_every=0, keep=0)
    best, last = tmp_path / "best.pt", tmp_path / "last.pt"
    assert best.read_bytes() == last.read_bytes() and _epoch(last) == 1


def test_a_full_disk_while_copying_is_a_write_error_and_keeps_the_old_last_pt(
    tmp_path, monkeypatch
):
    save_epoch(tmp_path, _checkpoint(1), is_best=True, save_every=0, keep=0)

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "copy_file_range", full)
    with pytest.raises(OutputWriteError, match="last.pt"):
        save_epoch(tmp_path, _checkpoint(2), is_best=True, save_every=0, keep=0)
    assert (_epoch(tmp_path / "best.pt"), _epoch(tmp_path / "last.pt")) == (2, 1)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["best.pt", "last.pt"]
