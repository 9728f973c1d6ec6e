"""Images stored inside a container file (a tar shard, a .tar of an image folder, a parquet file),
read through the same opener as image files on disk.

A reader of a container gives each sample a `StoredImage` as its `Samples.paths` entry: a `str`
that prints as where the image is (`train-000003.tar/n0144/img_7.jpg`), so error messages and
reports read as for files, and that carries what reads its bytes (the container and where the
image lies in it). `core.image_files.open_regular_file` hands out those bytes, so every loader
(train's decodes, eval, predict, extract-features, dataset-stats) reads stored images as files,
with the same map-style Dataset, samplers, DDP sharding and exact resume.

A `StoredImage` is cheap to copy into DataLoader workers (fork) and pickles (spawn): a
`BytesReader` keeps no open file across a fork; each process opens its own.
"""

from __future__ import annotations

import io
from typing import Any, Protocol


class BytesReader(Protocol):
    """Reads one stored image's bytes, given its locator; an OSError (a truncated shard, a
    vanished file) makes that image unreadable, counted as any unreadable image is."""

    def read(self, locator: Any) -> bytes: ...


class StoredImage(str):
    """The printable name of an image inside a container, with what reads its bytes."""

    reader: BytesReader
    locator: Any

    def __new__(cls, name: str, reader: BytesReader, locator: Any) -> StoredImage:
        stored = super().__new__(cls, name)
        stored.reader = reader
        stored.locator = locator
        return stored

    def __reduce__(self):
        return (StoredImage, (str(self), self.reader, self.locator))

    def read_bytes(self) -> bytes:
        return self.reader.read(self.locator)

    def open(self) -> io.BytesIO:
        return io.BytesIO(self.read_bytes())


def is_stored(path: object) -> bool:
    return isinstance(path, StoredImage)
