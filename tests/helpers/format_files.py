"""The bytes of files other programs' formats give torchkit's outputs, as those programs write
them (for `--force`'s content proofs, `core.io.output_proofs`): a TensorBoard event file's
first record, the start of a torch.profiler trace."""

from __future__ import annotations

import struct


def tensorboard_events(wall_time: float = 1.0) -> bytes:
    """An event file as TensorBoard's writer starts every one: a TFRecord (8-byte length, its
    CRC, the data, its CRC) holding an Event with `wall_time` and `file_version`
    `brain.Event:2` (CRCs zero: the proof does not check them)."""
    event = b"\x09" + struct.pack("<d", wall_time) + b"\x1a\x0dbrain.Event:2"
    return struct.pack("<Q", len(event)) + bytes(4) + event + bytes(4)


def chrome_trace() -> bytes:
    """A trace as torch.profiler's `export_chrome_trace` (Kineto) writes one."""
    return b'{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n  "traceEvents": []\n}\n'
