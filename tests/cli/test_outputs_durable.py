"""Outputs made durable: the files of an atomic output folder are synced once, as a whole, before
the folder is swapped into place (not one fsync a file); a non-atomic folder is synced before the
command reports success; a failed sync is a failed run that leaves nothing behind."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from processes import run_torchkit_in_process

import torchkit.core.io.outputs as outputs
from torchkit.core.io.durability import fsync_directory, sync_file_system
from torchkit.core.io.files import atomic_write_bytes, atomic_write_text
from torchkit.core.io.outputs import OutputFolder


class SyncRecorder:
    """Records each sync of a file system: (the folder named, whether `final` existed yet)."""

    def __init__(self) -> None:
        self.final = Path("/nonexistent")
        self.calls: list[tuple[Path, bool]] = []

    def __call__(self, folder) -> None:
        self.calls.append((Path(folder), self.final.exists()))
        sync_file_system(folder)


@pytest.fixture
def syncs(monkeypatch) -> SyncRecorder:
    recorder = SyncRecorder()
    monkeypatch.setattr(outputs, "sync_file_system", recorder)
    return recorder


@pytest.fixture
def fsyncs(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counting(fd):
        if stat.S_ISREG(os.fstat(fd).st_mode):  # files; a folder's fsync is the swap's
            calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


def test_atomic_folder_is_synced_once_before_the_swap_not_file_by_file(tmp_path, syncs, fsyncs):
    out = tmp_path / "out"
    syncs.final = out
    with OutputFolder(out, command="test", atomic=True) as folder:
        hidden = folder.begin()
        for index in range(20):
            atomic_write_bytes(hidden / f"{index}.bin", bytes([index]) * 100)
        assert fsyncs == []  # synced with the folder, not one by one
        assert not out.exists()
    assert syncs.calls == [(hidden, False)]  # the hidden folder, before the output was in place
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".bin") == sorted(
        f"{i}.bin" for i in range(20)
    )
    assert all((out / f"{i}.bin").read_bytes() == bytes([i]) * 100 for i in range(20))
    assert not hidden.exists()
    atomic_write_text(tmp_path / "report.txt", "a file of its own\n")  # still fsynced as before
    assert len(fsyncs) == 1


def test_file_written_into_a_kept_atomic_folder_is_fsynced(tmp_path, syncs, fsyncs):
    with OutputFolder(tmp_path / "out", command="test", atomic=True) as folder:
        folder.begin()
        folder.keep()
        atomic_write_text(folder.path / "late.txt", "after the swap\n")
    assert len(fsyncs) == 1  # no sync of the folder follows it


def test_non_atomic_folder_is_synced_before_success(tmp_path, syncs):
    out = tmp_path / "out"
    with OutputFolder(out, command="test") as folder:
        folder.begin()
        folder.keep()
        (out / "copied.bin").write_bytes(b"x" * 10)  # written after keep, no fsync of its own
        count = len(syncs.calls)
    assert count == 1 and len(syncs.calls) == 2  # at keep, and again before the command ends
    assert all(folder == out for folder, _ in syncs.calls)


def _failing_sync(folder):
    raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(folder))


def test_failed_sync_of_an_atomic_folder_leaves_nothing(tmp_path, monkeypatch, make_image_folder):
    source = make_image_folder(tmp_path / "images", {"a": 3, "b": 3})
    monkeypatch.setattr(outputs, "sync_file_system", _failing_sync)
    result = run_torchkit_in_process(
        "convert", "tensor", source, tmp_path / "arrays", "--to", "npy"
    )
    assert result.returncode == 1
    assert "Error: cannot write" in result.stderr and "Traceback" not in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["images"]  # no output, no hidden folder, no lock


def test_convert_tensor_folder_complete_after_one_sync(tmp_path, syncs, make_image_folder):
    source = make_image_folder(tmp_path / "images", {"a": 3, "b": 3})
    out = tmp_path / "arrays"
    syncs.final = out
    result = run_torchkit_in_process("convert", "tensor", source, out, "--to", "npy", "-j", "1")
    assert result.returncode == 0, result.stderr
    assert len(syncs.calls) == 1 and syncs.calls[0][1] is False  # before the swap
    arrays = sorted(out.rglob("*.npy"))
    assert len(arrays) == 6
    assert all(np.load(path).dtype == np.uint8 for path in arrays)


def test_durability_helpers_on_a_real_folder(tmp_path):
    (tmp_path / "f").write_bytes(b"1")
    sync_file_system(tmp_path)
    fsync_directory(tmp_path)
    fsync_directory(tmp_path / "missing")  # nothing to sync: no error


@pytest.mark.parametrize("writer", ["atomic_write_text", "atomic_path"])
def test_a_single_file_is_fsynced_before_its_rename_and_its_folder_after(
    tmp_path, monkeypatch, writer
):
    """`-o FILE`, convert checkpoint, plots, traces: the new file's data is on disk before its
    name replaces the old file's, and the rename is on disk before the command says done."""
    from torchkit.core.io.files import atomic_path

    target = tmp_path / "model.pt"
    target.write_bytes(b"old")
    calls: list[tuple[str, str, bytes]] = []  # (file or folder, its name, the target's bytes)
    real = os.fsync

    def recording(fd):
        kind = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        calls.append(
            (kind, os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), target.read_bytes())
        )
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    if writer == "atomic_path":
        with atomic_path(target) as temporary:
            temporary.write_bytes(b"new")
    else:
        atomic_write_text(target, "new")
    assert [(kind, name.startswith(".model."), before) for kind, name, before in calls] == [
        ("file", True, b"old"),  # the temporary, while the old file is still in place
        ("folder", False, b"new"),  # the folder, once renamed
    ]
    assert calls[1][1] == tmp_path.name
