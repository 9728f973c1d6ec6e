"""Opening a parquet file reads its label column in few reads, not one per row group (2,500
reads for a file of 2,500 row groups: a seek each on a disk, a round trip on a network file
system), and reads no image bytes where the images between its chunks are large."""

from __future__ import annotations

import io
import os
from pathlib import Path

from parquet_files import write_parquet

from torchkit.core.data.sources import parquet


class CountingFile(io.RawIOBase):
    """A file whose reads (each `read`/`readinto`, as pyarrow makes them) are counted."""

    def __init__(self, path: str, reads: list[int]) -> None:
        super().__init__()
        self._file = open(path, "rb")  # noqa: SIM115 (closed with this object)
        self._reads = reads

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer) -> int:
        count = self._file.readinto(buffer)
        self._reads.append(count)
        return count

    def close(self) -> None:
        self._file.close()
        super().close()


def count_reads(monkeypatch) -> list[int]:
    """The bytes of each read of a file made from now on: pyarrow's (a file it is given by
    name is read through a `CountingFile`) and Python's `os.pread`."""
    import pyarrow.parquet as pq

    reads: list[int] = []
    real_file, real_pread = pq.ParquetFile, os.pread

    def counted_file(source, *args, **kwargs):
        if isinstance(source, (str, Path)):
            source = CountingFile(str(source), reads)
        return real_file(source, *args, **kwargs)

    def counted_pread(fd: int, size: int, offset: int) -> bytes:
        data = real_pread(fd, size, offset)
        reads.append(len(data))
        return data

    monkeypatch.setattr(pq, "ParquetFile", counted_file)
    monkeypatch.setattr(os, "pread", counted_pread)
    return reads


def test_the_labels_of_300_row_groups_are_read_in_a_few_reads(tmp_path, monkeypatch):
    labels = [row % 3 for row in range(300)]
    # Images of 9 kB: pyarrow joins the reads of chunks less than 8 KiB apart itself.
    images = [os.urandom(9000) for _ in labels]
    write_parquet(tmp_path / "d.parquet", images, labels, row_group_size=1)
    reads = count_reads(monkeypatch)
    opened = parquet._File(str(tmp_path), "d.parquet")
    assert opened.labels == labels
    # The footer, the page headers of 8 row groups (`_image_bytes_read`) and the labels' one
    # read: one read per row group is 300 and more.
    assert len(reads) <= 30, len(reads)


def test_the_labels_between_large_images_are_read_without_the_images(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    image = os.urandom(parquet.LABEL_HOLE_BYTES + 1000)  # each row group: one such image
    labels = [0, 2, 1, 2]
    path = write_parquet(tmp_path / "d.parquet", [image] * 4, labels, row_group_size=1)
    metadata = pq.read_metadata(path)
    reads = count_reads(monkeypatch)
    with parquet.LabelChunks(str(path), metadata, "label") as chunks:
        got = pq.ParquetFile(chunks, metadata=metadata).read(columns=["label"], use_threads=False)
    assert got.column(0).to_pylist() == labels
    # One read a label chunk, of its bytes alone: the images between them are not read.
    assert len(reads) == 4 and sum(reads) < 1000, reads
