"""Writing WebDataset samples into a tar stream with the standard library's tarfile.

The archive is what webdataset's `TarWriter(stream, encoder=False, user=, group=, mode=,
mtime=)` writes, byte for byte: a streamed tarfile ("w|", tarfile's default PAX format, its
blocks and record padding), one regular member `KEY.EXT` per entry of a sample in sorted
extension order, with the given mtime, mode and user/group names and uid/gid 0. Writing it here
spares `convert shards` importing webdataset, whose package imports torch (1-2.5 s of start-up).
"""

from __future__ import annotations

import io
import tarfile
from typing import BinaryIO


class SampleTarWriter:
    """Samples (`{"__key__": KEY, EXT: bytes, ...}`) as tar members `KEY.EXT` into `stream`."""

    def __init__(self, stream: BinaryIO, *, owner: str, mode: int, mtime: int) -> None:
        self._owner = owner
        self._mode = mode
        self._mtime = mtime
        self._tar = tarfile.open(  # noqa: SIM115 (closed by `close`)
            fileobj=stream, mode="w|", format=tarfile.DEFAULT_FORMAT
        )

    @property
    def offset(self) -> int:
        """Bytes of members written so far (the archive's end blocks and padding not yet)."""
        return self._tar.offset

    def write(self, sample: dict) -> None:
        """Add the sample's members, its `__key__` aside, in sorted extension order (as
        webdataset's TarWriter does)."""
        key = sample["__key__"]
        for extension in sorted(sample):
            if extension == "__key__":
                continue
            data = sample[extension]
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"member {key}.{extension} is {type(data).__name__}, not bytes")
            info = tarfile.TarInfo(f"{key}.{extension}")
            info.size = len(data)
            info.mtime = self._mtime
            info.mode = self._mode
            info.uname = info.gname = self._owner
            self._tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        """End the archive (its two zero blocks, padded to a whole record) and flush it."""
        self._tar.close()
