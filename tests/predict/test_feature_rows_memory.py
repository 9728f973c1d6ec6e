"""extract-features' memory while it writes rows: each layer's rows went into a memory map of
its `.npy`, and every page written stayed resident in the process, so its resident set grew by
the whole N x D array (535 bytes an image for a 128-wide layer; 8 GB for a million rows of
2,048 float32 features), which a job's memory limit counts. Rows are now written to the file
at their place: the process's file-backed memory stays flat while they come."""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path

import numpy as np
import pytest

from torchkit.core.features import FeatureRequest, extract_features
from torchkit.core.features import extract as feature_extract
from torchkit.core.features import store as feature_store
from torchkit.core.inference.options import InferenceOptions
from torchkit.core.models import ModelSpec

STATUS = Path("/proc/self/status")


def file_backed_bytes() -> int:
    """This process's resident pages of mapped files (`RssFile`)."""
    for line in STATUS.read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


@pytest.mark.skipif(not STATUS.exists(), reason="reads /proc/self/status (Linux)")
def test_rows_written_do_not_stay_in_the_process_memory(tmp_path, monkeypatch):
    out = tmp_path / "out"
    # 1,797 digits at 20 px, the flattened 64x8x8 maps: 16 KB a row, 29 MB in all.
    request = FeatureRequest(
        ModelSpec("convnet", image_size=20, allow_untrained=True), "digits", str(out),
        layers=["classifier.0"], run=InferenceOptions(batch_size=128, workers=0, device="cpu"),
    )  # fmt: skip
    seen = []  # per commit: (rows on record, RssFile)
    commit = feature_store.FeatureStore.commit

    def measured_commit(store) -> None:
        commit(store)
        seen.append((store.progress.rows, file_backed_bytes()))

    monkeypatch.setattr(feature_extract, "COMMIT_INTERVAL_S", 0.0)  # a commit every batch
    monkeypatch.setattr(feature_store.FeatureStore, "commit", measured_commit)
    result = extract_features(request)

    features = np.load(out / "classifier.0.npy", mmap_mode="r")
    assert features.shape == (1797, 4096) and result.num_rows == 1797
    assert np.isfinite(features[-1]).all() and features[-1].any()  # the last rows are there
    row_bytes = features.dtype.itemsize * features.shape[1]
    (rows_then, resident_then), (rows_last, resident_last) = seen[1], seen[-1]
    written = (rows_last - rows_then) * row_bytes
    assert written > 20 * 2**20, seen
    # Before: the resident set grew by what was written (about 26 MB); now by a few pages.
    assert resident_last - resident_then < written / 8, (written, seen)


@pytest.mark.skipif(not STATUS.exists(), reason="reads /proc/self/status (Linux)")
def test_the_safetensors_file_is_written_without_keeping_the_array_in_memory(tmp_path, monkeypatch):
    """`--array-format safetensors` copies the finished array into its file at the end: read
    through a memory map, every page of it stayed resident until the copy ended."""
    rows = np.arange(24 * 2**18, dtype=np.float32).reshape(-1, 1024)  # 24 MB
    source, target = tmp_path / "layer.npy", tmp_path / "layer.safetensors"
    np.save(source, rows)
    resident = []  # after each chunk is written
    atomic_write = feature_store.atomic_write

    @contextlib.contextmanager
    def measured(path, mode):
        with atomic_write(path, mode) as handle:
            write = handle.write

            def measured_write(data) -> int:
                resident.append(file_backed_bytes())
                return write(data)

            handle.write = measured_write
            yield handle

    monkeypatch.setattr(feature_store, "_CHUNK_BYTES", 2**20)
    monkeypatch.setattr(feature_store, "atomic_write", measured)
    feature_store._write_safetensors(source, target, "layer")

    from safetensors.numpy import load_file

    assert np.array_equal(load_file(target)["layer"], rows)
    assert not source.exists()
    assert len(resident) > 20, resident  # the length, the header, then 24 chunks
    # Before: it grew by every chunk read (24 MB); now by a few pages.
    assert resident[-1] - resident[2] < 4 * 2**20, resident


def status_bytes(field: str) -> int:
    for line in STATUS.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


@pytest.mark.skipif(not STATUS.exists(), reason="reads /proc/self/status (Linux)")
def test_the_safetensors_copy_holds_one_chunk_at_a_time(tmp_path, monkeypatch):
    """The copy read each chunk into a new bytes object while the last one was still held: its
    peak resident set grew by two chunks (16 MB with 8 MB chunks; 128 MB at the default 64),
    the `.pt` copy's by one. Both now read into one buffer."""
    rows = np.arange(12 * 2**20, dtype=np.float32).reshape(-1, 1024)  # 48 MB
    source, target = tmp_path / "layer.npy", tmp_path / "layer.safetensors"
    np.save(source, rows)
    del rows
    chunk = 8 * 2**20
    monkeypatch.setattr(feature_store, "_CHUNK_BYTES", chunk)
    # Memory that earlier code freed and the allocator kept is given back to the system first:
    # reused, it was not counted as growth (after this module's other tests the new code grew
    # by nothing here and the old code's two chunks by 8 MB, under the limit).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)  # glibc
    try:
        Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from now on
    except OSError:
        pytest.skip("cannot reset the peak resident set here (/proc/self/clear_refs)")
    before = status_bytes("VmRSS")
    feature_store._write_safetensors(source, target, "layer")
    grown = status_bytes("VmHWM") - before

    from safetensors.numpy import load_file

    loaded = load_file(target)["layer"]
    assert loaded.shape == (12 * 1024, 1024) and loaded[-1, -1] == 12 * 2**20 - 1
    assert grown < 1.5 * chunk, grown  # before: 16 MB and more


def test_big_endian_rows_are_written_little_endian_to_safetensors(tmp_path, monkeypatch):
    """safetensors stores little-endian values: rows of another byte order (a big-endian
    machine's) are swapped as they are copied, a chunk of whole values at a time."""
    rows = np.arange(3000, dtype=">f4").reshape(-1, 10)
    source, target = tmp_path / "layer.npy", tmp_path / "layer.safetensors"
    np.save(source, rows)
    monkeypatch.setattr(feature_store, "_CHUNK_BYTES", 1001)  # 250 values a chunk
    feature_store._write_safetensors(source, target, "layer")

    from safetensors.numpy import load_file

    loaded = load_file(target)["layer"]
    assert loaded.dtype == np.dtype("<f4") and np.array_equal(loaded, rows)
