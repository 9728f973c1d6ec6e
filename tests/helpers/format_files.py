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


def bare_png(size: tuple[int, int] = (32, 32), value: int = 7) -> bytes:
    """A PNG as OpenCV's `imencode` writes one (no chunk but IHDR before the image data): a
    frame or CIFAR image of a torchkit from before their Software text."""
    import cv2
    import numpy as np

    ok, encoded = cv2.imencode(".png", np.full((size[1], size[0], 3), value, dtype=np.uint8))
    assert ok
    return encoded.tobytes()


def photo_png(size: tuple[int, int] = (32, 32)) -> bytes:
    """A PNG as a camera or an editor saves one: its resolution (pHYs) before the image data."""
    import io

    from PIL import Image

    made = io.BytesIO()
    Image.new("RGB", size, "white").save(made, format="PNG", dpi=(72, 72))
    return made.getvalue()


def owned_tar(owner: str = "torchkit", name: str = "sample_00000000.png") -> bytes:
    """A tar of one member owned (user and group name) by `owner`, as convert shards writes
    each member."""
    import io
    import tarfile

    made = io.BytesIO()
    with tarfile.open(fileobj=made, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size, info.uname, info.gname = 3, owner, owner
        archive.addfile(info, io.BytesIO(b"abc"))
    return made.getvalue()


def npy(values: tuple[float, ...] = (1.0, 2.0)) -> bytes:
    """A .npy file of `values`, as numpy.save writes it."""
    import io

    import numpy as np

    made = io.BytesIO()
    np.save(made, np.array(values, dtype=np.float32))
    return made.getvalue()
