"""Which files are read as safetensors: by their layout, whatever their first byte."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from torchkit.core.io.errors import CheckpointError
from torchkit.core.models.checkpoint import _safetensors_layout, load_checkpoint


def safetensors_with_header_length(path, low_byte: int) -> int:
    """A safetensors file whose header length's first (little-endian) byte is `low_byte`, made
    so by the length of a metadata string; the header length."""
    tensors = {"weight": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    for pad in range(512):
        save_file(tensors, path, metadata={"pad": "x" * pad})
        length = int.from_bytes(path.read_bytes()[:8], "little")
        if length & 0xFF == low_byte:
            return length
    raise AssertionError(f"no header length ending in {low_byte:#x}")


@pytest.mark.parametrize("name", ["w.safetensors", "w.pt"])
def test_a_safetensors_file_that_starts_as_a_pickle_does_is_read_as_safetensors(tmp_path, name):
    """A header of 128 + 256k bytes makes the file's first byte 0x80, pickle's first opcode:
    such a file (one in 256) went to torch.load ('UnpicklingError: Unsupported operand')."""
    path = tmp_path / name
    length = safetensors_with_header_length(path, 0x80)
    assert path.read_bytes()[:1] == b"\x80", length
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["weight"], torch.arange(6, dtype=torch.float32).reshape(2, 3))


def test_a_length_and_a_brace_without_a_json_header_are_not_safetensors(tmp_path):
    """The layout holds only if the header parses as a JSON object: eight bytes of a small
    length and a `{` alone, in a file named `.pt`, go to torch.load, whose error it gets."""
    path = tmp_path / "w.pt"
    path.write_bytes((128).to_bytes(8, "little") + b"{" + b"\x01" * 127)
    with open(path, "rb") as handle:
        assert not _safetensors_layout(handle, path.stat().st_size)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    assert "safetensors" not in str(refused.value)
