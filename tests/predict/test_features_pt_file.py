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
    # but the serialization id torch's writer draws for each file. The rows come last (torch
    # writes `version` after them): see the zip64 test below.
    with zipfile.ZipFile(ours) as mine, zipfile.ZipFile(reference) as theirs:
        names = [info.filename for info in mine.infolist()]
        order = [name for name in theirs.namelist() if name != "archive/.data/serialization_id"]
        order.remove("archive/data/0")
        assert names == [*order, "archive/data/0"]
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


def test_rows_past_the_zip64_limit_load_on_every_torch(tmp_path, monkeypatch):
    """Rows past zipfile's zip64 limit (2 GiB; lowered here to 100 kB, past the small records)
    get zip64 sizes, and a record after them a zip64 offset (0xFFFFFFFF in its 32-bit field),
    which torch 2.4's reader takes for its offset where the file is under 4 GiB: a 2.25 GB
    `.pt` (1.1M rows of 512 float32) failed to load there, "PytorchStreamReader failed reading
    zip archive: invalid header or archive is corrupted". The rows now come last."""
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 100_000)
    array = np.arange(26_000, dtype=np.float32).reshape(-1, 10)  # 104 kB of rows
    ours = written(tmp_path, array)
    raw = ours.read_bytes()
    length = len(raw)
    assert b"PK\x06\x06" in raw  # a zip64 end record: the path under test
    # As torch 2.4's reader (miniz) checks each record whose sizes fit 32 bits: its 32-bit
    # offset field, plus its local header and its bytes, lies within the file.
    with zipfile.ZipFile(ours) as archive:
        entry = archive.start_dir
        for _ in archive.infolist():
            assert raw[entry : entry + 4] == b"PK\x01\x02"
            size, _, name, extra, comment = struct.unpack_from("<LLHHH", raw, entry + 20)
            (offset,) = struct.unpack_from("<L", raw, entry + 42)
            name_text = raw[entry + 46 : entry + 46 + name].decode()
            if size != 0xFFFFFFFF:
                assert offset + 30 + size <= length, name_text
            entry += 46 + name + extra + comment
    for options in ({}, {"mmap": True}):
        assert np.array_equal(torch.load(ours, weights_only=True, **options).numpy(), array)
    assert all(offset % 64 == 0 for offset in data_offsets(ours).values()), data_offsets(ours)


class KeyedOtherwise:
    """A writer to `_save` that names its storage's record `data/1`, as a torch whose pickle
    keys storages otherwise would (the pickle would name `1`)."""

    def __init__(self, writer) -> None:
        self.writer = writer

    def write_record(self, name, value, size) -> None:
        self.writer.write_record("data/1" if name == "data/0" else name, value, size)


OTHER_SAVES = {  # what a torch whose private `_save` differs does with torchkit's recorder
    "other arguments": TypeError("other arguments"),
    "a check of its writer": RuntimeError("expected a PyTorchFileWriter"),
    "another storage key": KeyedOtherwise,
}


@pytest.mark.parametrize("case", list(OTHER_SAVES))
def test_a_torch_whose_save_records_otherwise_gets_torch_save_file(tmp_path, monkeypatch, case):
    """A torch whose private `_save` takes other arguments, refuses torchkit's recorder (a
    RuntimeError ended the run: 'Error: RuntimeError: ...', exit 1, its rows kept) or records
    otherwise: the file is torch.save's own."""
    save, saved = torch.serialization._save, []

    def other_save(obj, zip_file, *arguments):
        if isinstance(zip_file, torch._C.PyTorchFileWriter):  # torch.save's own writer
            saved.append(obj.shape)
            return save(obj, zip_file, *arguments)
        other = OTHER_SAVES[case]
        if isinstance(other, Exception):
            raise other
        return save(obj, other(zip_file), *arguments)

    monkeypatch.setattr(torch.serialization, "_save", other_save)
    array = ARRAYS["rows"]
    loaded = torch.load(written(tmp_path, array), weights_only=True)
    assert np.array_equal(loaded.numpy(), array)
    assert saved == [torch.Size(array.shape)]


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
