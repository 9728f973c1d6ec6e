"""extract-features' `--array-format pt` file: torch.save read every row through a memory map
of the finished array, whose pages all stayed in the process until it ended (2 GB at a million
rows of 512 floats). The file is now written as torch.save writes it, its records (the pickle
from torch's own `_save`) each stored at a 64-byte boundary and the rows copied a chunk at a
time: torch.load reads it back (weights_only=True, mmap=True) as the tensor torch.save's file
holds, with the same records."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from torchkit.core.features import store as feature_store

STATUS = Path("/proc/self/status")


def torch_saved(array: np.ndarray) -> bytes:
    """torch.save's file of `array` (to a file object: its records under `archive/`, as
    torchkit's own saves are)."""
    buffer = io.BytesIO()
    torch.save(torch.from_numpy(array), buffer)
    return buffer.getvalue()


def written(tmp_path: Path, array: np.ndarray) -> Path:
    source, target = tmp_path / "layer.npy", tmp_path / "layer.pt"
    np.save(source, array)
    feature_store._write_pt(source, target)
    assert not source.exists()  # the scratch array, once the file is in place
    return target


def data_offsets(path: Path) -> dict[str, int]:
    """Where each record's bytes start (after its local header and its extra field)."""
    raw = path.read_bytes()
    offsets = {}
    for info in zipfile.ZipFile(path).infolist():
        name_length, extra_length = struct.unpack_from("<HH", raw, info.header_offset + 26)
        offsets[info.filename] = info.header_offset + 30 + name_length + extra_length
    return offsets


ARRAYS = {
    "rows": np.random.default_rng(0).standard_normal((300, 10)).astype(np.float32),
    "float16 maps": np.random.default_rng(1).standard_normal((6, 32, 6, 6)).astype(np.float16),
    "one row": np.array([[1.5, -2.0, np.inf]], dtype=np.float32),
    "no rows": np.zeros((0, 5), dtype=np.float32),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_the_pt_file_loads_as_torch_saves_file_does(tmp_path, name):
    array = ARRAYS[name]
    ours = written(tmp_path, array)
    reference = tmp_path / "reference.pt"
    reference.write_bytes(torch_saved(array))
    for options in ({}, {"mmap": True}):
        loaded = torch.load(ours, weights_only=True, **options)
        expected = torch.load(reference, weights_only=True, **options)
        assert (loaded.dtype, loaded.shape, loaded.stride()) == (
            expected.dtype,
            expected.shape,
            expected.stride(),
        )
        assert loaded.numpy().tobytes() == expected.numpy().tobytes() == array.tobytes()
    # The same records with the same bytes: the pickle, torch's format records, the rows; all
    # but the serialization id torch's writer draws for each file.
    with zipfile.ZipFile(ours) as mine, zipfile.ZipFile(reference) as theirs:
        names = [info.filename for info in mine.infolist()]
        assert names + ["archive/.data/serialization_id"] == theirs.namelist()
        for record in names:
            assert mine.read(record) == theirs.read(record), record
        assert all(info.compress_type == zipfile.ZIP_STORED for info in mine.infolist())
    # Each record's bytes at a multiple of 64, as torch aligns them (mmap=True maps them).
    assert all(offset % 64 == 0 for offset in data_offsets(ours).values()), data_offsets(ours)


@pytest.mark.skipif(
    not hasattr(torch.serialization, "_get_storage_alignment"), reason="torch 2.4 aligns to 64"
)
def test_records_are_aligned_as_torch_is_set_to_align_them(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.serialization, "_get_storage_alignment", lambda: 4096)
    array = ARRAYS["rows"]
    ours = written(tmp_path, array)
    assert zipfile.ZipFile(ours).read("archive/.storage_alignment") == b"4096"
    assert all(offset % 4096 == 0 for offset in data_offsets(ours).values())
    assert np.array_equal(torch.load(ours, weights_only=True, mmap=True).numpy(), array)


def test_a_torch_whose_save_records_otherwise_gets_torch_save_file(tmp_path, monkeypatch):
    """A torch whose private `_save` takes other arguments: the file is torch.save's own."""

    save = torch.serialization._save

    def other_save(obj, zip_file, *arguments):
        if not isinstance(zip_file, torch._C.PyTorchFileWriter):  # torch.save's own writer
            raise TypeError("other arguments")
        return save(obj, zip_file, *arguments)

    monkeypatch.setattr(torch.serialization, "_save", other_save)
    array = ARRAYS["rows"]
    loaded = torch.load(written(tmp_path, array), weights_only=True)
    assert np.array_equal(loaded.numpy(), array)


@pytest.mark.skipif(not STATUS.exists(), reason="reads /proc/self/status (Linux)")
def test_the_pt_file_is_written_without_holding_the_array(tmp_path, monkeypatch):
    """The peak resident set while the file is written: torch.save read all 24 MB through the
    memory map; now a chunk (1 MB here) or two at a time."""
    array = np.arange(24 * 2**18, dtype=np.float32).reshape(-1, 1024)  # 24 MB
    source, target = tmp_path / "layer.npy", tmp_path / "layer.pt"
    np.save(source, array)
    del array
    monkeypatch.setattr(feature_store, "_CHUNK_BYTES", 2**20)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from now on
    except OSError:
        pytest.skip("cannot reset the peak resident set here (/proc/self/clear_refs)")
    before = _status_bytes("VmRSS")
    feature_store._write_pt(source, target)
    grown = _status_bytes("VmHWM") - before
    loaded = torch.load(target, weights_only=True, mmap=True)
    assert loaded.shape == (6144, 1024) and float(loaded[-1, -1]) == 24 * 2**18 - 1
    assert grown < 8 * 2**20, grown  # before: 24 MB and more


def _status_bytes(field: str) -> int:
    for line in STATUS.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")
