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
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torchkit.core.io.errors import InputError


class BytesReader(Protocol):
    """Reads one stored image's bytes, given its locator; an OSError (a truncated shard, a
    vanished file) makes that image unreadable, counted as any unreadable image is; a
    StoredReadError stops the run."""

    def read(self, locator: Any) -> bytes: ...


class StoredReadError(InputError):
    """A container that cannot be read as it was listed when an image of it is read (a file
    written again since, a shard a server no longer serves): the run stops with one error line,
    from a DataLoader worker too, where torch raises it again in the main process as
    `type(error)(text)`, `text` the worker's traceback (ending with this error's line)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        if hint is None and message.startswith("Caught ") and "\nOriginal Traceback" in message:
            message = message.rstrip().rsplit("\n", 1)[-1].split(": ", 1)[-1]
        super().__init__(message, hint)


Stamp = tuple[int, int]


def file_stamp(info: os.stat_result) -> Stamp:
    """What tells one version of a file from another: (size, mtime). Not the inode: FUSE mounts
    without stable inode numbers (sshfs without `use_ino`, some cloud mounts) give one file
    another inode on each open; a file renamed over it has the mtime of its own writing."""
    return (info.st_size, info.st_mtime_ns)


def check_unchanged(fd: int, stamp: Stamp | None, path: str) -> None:
    """StoredReadError when the file open as `fd` is no longer the version listed (`stamp`,
    None: unchecked). A container written again after it was listed (webdataset's TarWriter and
    pyarrow write a file in place, `convert shards --force` renames a new one over it) holds
    other images where the listing found them, which were read under the listed labels."""
    if stamp is not None and file_stamp(os.fstat(fd)) != stamp:
        raise StoredReadError(
            f"{path} was written again after it was listed: its images are no longer where "
            "the listing found them",
            "run again once it is written; never rewrite data a command reads",
        )


class StoredImage(str):
    """The printable name of an image inside a container, with what reads its bytes."""

    reader: BytesReader
    locator: Any

    def __new__(cls, name: str, reader: BytesReader, locator: Any) -> StoredImage:
        stored = super().__new__(cls, name)
        # A str subclass can have no __slots__ and gets no key-sharing dict: attributes set one
        # by one grow a 304-byte dict; one made whole is 184 (a million parquet rows: 600 MB
        # of samples before, 450 MB now).
        stored.__dict__ = {"reader": reader, "locator": locator}
        return stored

    def __reduce__(self):
        return (StoredImage, (str(self), self.reader, self.locator))

    def read_bytes(self) -> bytes:
        return self.reader.read(self.locator)

    def open(self) -> io.BytesIO:
        return io.BytesIO(self.read_bytes())


# The reader the last unpickled reader became in this process, by the kind of reader: (its
# state pickled, the reader). See `kept_reader`.
_KEPT_READERS: dict[type, tuple[bytes, Any]] = {}


def kept_reader(kind: type, state: dict) -> Any:
    """The reader of `kind` (a `BytesReader` whose `__reduce__` calls this with its
    `__getstate__`) of `state` that this process keeps: the same one for every copy of it
    unpickled here. A worker gets a copy of the reader with each chunk of images it is sent
    (dataset-stats' tasks); a copy of its own, its cache empty and its files not open, read a
    parquet row group or listed a shard again for every chunk of 64 of its images. One of each
    kind is kept: the reader of other data replaces it, `release`d (its files closed, its
    cache dropped), as each task's copy was let go before."""
    import pickle

    key = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    kept = _KEPT_READERS.get(kind)
    if kept is not None and kept[0] == key:
        return kept[1]
    reader = kind.__new__(kind)
    reader.__setstate__(state)
    _KEPT_READERS[kind] = (key, reader)
    if kept is not None:
        kept[1].release()
    return reader


def is_stored(path: object) -> bool:
    return isinstance(path, StoredImage)


def recorded_source(path: object) -> str:
    """For the message about an unreadable image: " (KEY.json records its path: SOURCE)" where
    `path` is a shard's image whose sample's `KEY.json` records the file it was made from (as
    `convert shards` writes it: the shard's member name alone names no file the user has);
    "" for any other image. Read then, from the shard (`TarReader.recorded_path`)."""
    recorded = getattr(path.reader, "recorded_path", None) if is_stored(path) else None
    source = recorded(path.locator) if recorded is not None else None
    if not source:
        return ""
    key = posixpath.basename(str(path)).split(".", 1)[0]
    return f" ({key}.json records its path: {source})"


@dataclass(frozen=True)
class Blocks:
    """How a set of images is read in blocks: `ids[i]` is the block of image i (0, 1, ... in
    order of first appearance); `window` is how many blocks the reader keeps at once. With
    `sizes` (block j's bytes as the reader keeps it) and `capacity` (the bytes it keeps), a
    window is instead as many blocks as fit in `capacity` together: counted by the largest,
    one large block among small ones made every window a single small block."""

    ids: list[int]
    window: int
    sizes: list[int] | None = None
    capacity: int | None = None


def read_blocks(paths: Sequence[str] | None) -> Blocks | None:
    """The blocks `paths` are read in, where reading one image reads its whole block (a
    parquet row group, a streamed shard: see `parquet.ParquetImages.blocks`,
    `http_shards.StreamedShards.blocks`), else None (image files, tar
    members: each read alone). An order that keeps each block's images together, a window
    of blocks at a time, reads every block once instead of once per image."""
    if not paths or not is_stored(paths[0]):
        return None
    reader = paths[0].reader
    blocks_of = getattr(reader, "blocks", None)
    if blocks_of is None or any(not is_stored(p) or p.reader is not reader for p in paths):
        return None
    return blocks_of([p.locator for p in paths])
