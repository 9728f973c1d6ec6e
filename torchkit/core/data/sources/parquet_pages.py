"""How many bytes a dictionary-encoded parquet column chunk holds once read, from its page
headers and its dictionary indices (a few small reads from the chunk, never its plain values).

A column chunk's `total_uncompressed_size` (the footer's figure) counts a dictionary-encoded
value once, in the dictionary page, however many rows repeat it; pyarrow reads the column back
decoded, each row its own copy. 10,000 rows of 50 distinct 19 KB images: 1 MB in the footer, 193
MB read. pyarrow's writer (and so HF's and pandas') dictionary-encodes every column by default,
falling back to plain pages for good once the dictionary outgrows its 1 MiB page: the
dictionary-encoded pages come first, so the walk stops at the first plain page, and the rest of
the chunk counts as the footer says.

Each dictionary-encoded page holds the dictionary index of each of its values (a few bits a
value, run-length encoded): how often each dictionary value is read. Where every value is read
equally often (each once: HF's distinct images), the chunk holds that many copies of the
dictionary; else the dictionary page is read for its values' sizes (up to `_LARGEST_DICTIONARY`
of it, `_LARGEST_REPEATED_DICTIONARY` where values repeat heavily). Counted at the dictionary's
mean value size instead, row groups of 900 rows of one 50 kB image and 100 rows of 9 small (1
kB) ones counted 0.14 of the bytes read, and of 10 rows of it and 990 small ones 3.5 times. A
larger dictionary (large distinct images: pyarrow checks its 1 MiB limit only after each 1,024
rows) counts each row at its mean value size where a few values repeat (duplicates among
distinct photos: as read), and each value as often as the most repeated one where they repeat
heavily (never less than read): that bound for every such dictionary counted one duplicate
among 1,000 distinct photos twice the bytes read (a row group warned of as past the reader's
cache, windows planned at half).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# parquet.thrift: PageType, Encoding
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
_DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
_RLE = 3  # the encoding of a v1 page's levels that is read (BIT_PACKED, long deprecated, is not)
# A page header's bytes read at once (page statistics can make one longer: read again, up to
# the largest); the pages walked at most (the dictionary-encoded pages of a row group are few:
# pyarrow writes one per 1 MiB of indices or per 1024 values at least).
_HEADER_BYTES = 256
_LARGEST_HEADER = 1 << 20
_MOST_PAGES = 4096
_DEEPEST = 16  # thrift structs and collections nested in a header (a page header nests 3)
# The bytes of a chunk read at once: a small dictionary, the index pages after it and their
# headers are one read.
_READ_BYTES = 64 << 10
# The largest dictionary page read for its values' sizes (pyarrow's are about 1 MiB: its
# dictionary_pagesize_limit; a larger one is a row group of large distinct images).
_LARGEST_DICTIONARY = 8 << 20
# ... where its values repeat heavily (as many copies past each value's first as it has
# values: one image of unusual size in most rows, which the mean size counts far off).
_LARGEST_REPEATED_DICTIONARY = 64 << 20
# parquet's codecs (as pyarrow's footer names them) as pyarrow's `decompress` names them.
# pyarrow names parquet's LZ4_RAW "LZ4" (what its writer's "lz4" writes), and the deprecated
# Hadoop-framed LZ4 "UNKNOWN": not read here.
_CODECS = {
    "SNAPPY": "snappy",
    "GZIP": "gzip",
    "BROTLI": "brotli",
    "ZSTD": "zstd",
    "LZ4": "lz4_raw",
}


def decoded_chunk_bytes(fd: int, chunk: Any, column: Any = None) -> int:
    """The bytes column chunk `chunk` (pyarrow's ColumnChunkMetaData) of the file open as `fd`
    holds read: its `total_uncompressed_size`, or more where its dictionary-encoded pages
    repeat dictionary values (each counted at its own size where the pages' indices can be
    read: `column`, pyarrow's ColumnSchema of the chunk, gives the levels that precede them;
    else at the dictionary's mean value size). The footer's figure wherever the headers cannot
    be read (encrypted, cut short, not as expected)."""
    stored = chunk.total_uncompressed_size
    if not chunk.has_dictionary_page or chunk.dictionary_page_offset is None:
        return stored
    if not hasattr(os, "pread"):  # Windows: the footer's figure
        return stored
    try:
        decoded = _dictionary_pages_decoded(fd, chunk, column)
    except _unreadable_errors():
        return stored
    return stored if decoded is None else max(stored, decoded)


def _unreadable_errors() -> tuple[type[Exception], ...]:
    """What reading a part of a chunk not as expected raises, each caught where that part's
    fallback is chosen (pyarrow's gzip, zstd, brotli and LZ4 raise OSError for bytes that do
    not decompress, snappy an ArrowInvalid)."""
    import pyarrow as pa

    return (OSError, ValueError, IndexError, ArithmeticError, pa.ArrowException)


def _dictionary_pages_decoded(fd: int, chunk: Any, column: Any) -> int | None:
    """The walk `decoded_chunk_bytes` makes: the dictionary page (`_Dictionary`), then each
    dictionary-encoded data page, its values counted and its indices (`_Indices`) read; their
    bytes read as `_values_bytes` sizes them, plus the rest of the chunk as stored. Each page
    lies after the one before and within the chunk, and the pages count no more values than
    the footer's: a ValueError where not (a garbled or crafted file), never a walk back, past
    the file, or an estimate of more values than the chunk has."""
    offset = chunk.dictionary_page_offset
    end = offset + chunk.total_compressed_size
    pages = _ChunkBytes(fd, end)
    # A dictionary page of large images (HF's row groups of distinct ones): its header alone
    if (chunk.data_page_offset or 0) - offset > _READ_BYTES:
        pages.ahead = _HEADER_BYTES
    header, size = _page_header(pages, offset)
    pages.ahead = _READ_BYTES
    dictionary = _Dictionary.of(chunk, header, offset + size)
    if dictionary is None:
        return None
    walked = size + dictionary.size  # uncompressed bytes of the pages walked, headers too
    offset = _next_page(offset, size, header, end)
    # v1 pages whose header counts no nulls (pyarrow writes no page statistics with a page
    # index): the chunk's share of nulls, from the footer's statistics where it has them
    nulls_share = _chunk_nulls_share(chunk)
    indices = _Indices.of(chunk, column, dictionary.distinct)
    values, counted = 0.0, 0
    for _ in range(_MOST_PAGES):
        if offset >= end:
            break
        header, size = _page_header(pages, offset)
        kind = header.get(1)
        page = header.get(5) if kind == _DATA_PAGE else header.get(8)
        if kind not in (_DATA_PAGE, _DATA_PAGE_V2) or not isinstance(page, dict):
            return None
        encoding = page.get(2) if kind == _DATA_PAGE else page.get(4)
        if encoding not in _DICTIONARY_ENCODINGS:
            break  # the fallback to plain pages: the rest counts as stored
        count = _count(page, 1)
        counted += count
        if counted > chunk.num_values:
            raise ValueError("pages of more values than the chunk")
        nulls = _nulls(kind, page)
        values += count * (1 - nulls_share) if nulls is None else max(0, count - nulls)
        if indices is not None:
            indices.add(pages, offset + size, kind, header, page)
        walked += size + _count(header, 2)
        offset = _next_page(offset, size, header, end)
    else:
        return None
    read = _values_bytes(dictionary, values, indices, pages)
    return read + max(0, chunk.total_uncompressed_size - walked)


def _values_bytes(
    dictionary: _Dictionary, values: float, indices: _Indices | None, pages: _ChunkBytes
) -> int:
    """The bytes the dictionary-encoded pages' `values` (their non-null values) hold read, each
    a dictionary value and its 4-byte offset: the estimate and its fallbacks, in one place.
    Without the indices' counts (not read), each value at the dictionary's mean size. Every
    value read equally often: that many copies of the dictionary. Else each value at its own
    size, read from the dictionary page up to `_LARGEST_DICTIONARY` of it, or up to
    `_LARGEST_REPEATED_DICTIONARY` where values repeat heavily (as many copies past each
    value's first as it has values). A dictionary past that or not read: each value at the
    mean size where they repeat a little (duplicates among distinct photos: as read), and each
    as often as the most repeated one where they repeat heavily (never less than read)."""
    import numpy as np

    counts = None if indices is None else indices.counts
    if counts is None:
        return int(values * dictionary.mean)
    distinct, size = dictionary.distinct, dictionary.size
    if not distinct or not counts.any():
        return 0
    if counts.min() == counts.max():  # every value as often: that many dictionaries
        return int(counts[0]) * size
    total = int(counts.sum())
    heavily = total >= 2 * distinct
    largest = _LARGEST_REPEATED_DICTIONARY if heavily else _LARGEST_DICTIONARY
    sizes = dictionary.value_sizes(pages, indices.codec, largest)
    if sizes is not None:
        return int(np.dot(counts, sizes + 4))
    return int(counts.max()) * size if heavily else round(total * size / distinct)


@dataclass(frozen=True)
class _Dictionary:
    """A chunk's dictionary page: `distinct` PLAIN-encoded values, `size` bytes read, `stored`
    bytes in the file from `at` (past the page's header)."""

    at: int
    stored: int
    size: int
    distinct: int

    @classmethod
    def of(cls, chunk: Any, header: dict[int, Any], at: int) -> _Dictionary | None:
        """The dictionary page whose `header` ends at `at`; None where it is no dictionary
        page, a ValueError where it claims more than `chunk` holds."""
        dictionary = header.get(7)
        if header.get(1) != _DICTIONARY_PAGE or not isinstance(dictionary, dict):
            return None
        size = _count(header, 2)
        if size > chunk.total_uncompressed_size:
            raise ValueError("a dictionary larger than its chunk")
        distinct = _count(dictionary, 1)
        # A dictionary holds values of the chunk's (a PLAIN byte array its 4-byte length at
        # least): more is a garbled header, whose count a value each took 8 TiB for 2**40
        # values.
        if distinct > chunk.num_values or (
            chunk.physical_type == "BYTE_ARRAY" and 4 * distinct > size
        ):
            raise ValueError("more dictionary values than its chunk or page holds")
        return cls(at, _count(header, 3), size, distinct)

    @property
    def mean(self) -> float:
        """The mean bytes of a value read, its 4-byte length included."""
        return self.size / self.distinct if self.distinct else 0.0

    def value_sizes(self, pages: _ChunkBytes, codec: str | None, largest: int) -> Any:
        """The length of each value, read from the page (compressed with `codec`); None where
        it is past `largest` bytes, stored or read, or not read as expected."""
        if self.stored > largest or self.size > largest:
            return None
        try:
            data = _decompressed(pages.get(self.at, self.stored), self.size, codec)
            return _plain_sizes(data, self.distinct)
        except _unreadable_errors():
            return None


class _Indices:
    """How often each dictionary value is read in a chunk's dictionary-encoded pages, from the
    pages' indices (after each page's repetition and definition levels, which give its nulls).
    `counts` None once a page could not be read so (a codec pyarrow here lacks, levels in the
    deprecated BIT_PACKED encoding, a page not as expected): then the mean value size is the
    estimate, as without `_Indices`."""

    def __init__(self, codec: str | None, definition: int, repetition: int, distinct: int) -> None:
        import numpy as np

        self.codec = codec
        self.definition, self.repetition = definition, repetition
        self.counts: Any = np.zeros(distinct, dtype=np.int64)

    @classmethod
    def of(cls, chunk: Any, column: Any, distinct: int) -> _Indices | None:
        """The counts to keep for `chunk` (its `column`'s schema); None where its values are
        not byte arrays (of one size each: the mean is theirs), or its codec is not read here."""
        import pyarrow as pa

        if column is None or chunk.physical_type != "BYTE_ARRAY":
            return None
        codec = None
        if chunk.compression != "UNCOMPRESSED":
            codec = _CODECS.get(chunk.compression)
            if codec is None or not pa.Codec.is_available(codec):
                return None
        definition, repetition = column.max_definition_level, column.max_repetition_level
        return cls(codec, definition, repetition, distinct)

    def add(self, pages: _ChunkBytes, at: int, kind: int, header: dict, page: dict) -> None:
        """Count the indices of the data page whose `header` ends at `at`."""
        if self.counts is None:
            return
        try:
            self._add(pages, at, kind, header, page)
        except _unreadable_errors():
            self.counts = None

    def _add(self, pages: _ChunkBytes, at: int, kind: int, header: dict, page: dict) -> None:
        stored, size, count = _count(header, 3), _count(header, 2), _count(page, 1)
        # A page's levels and indices take a few bytes a value at most: a larger size is a
        # garbled header, whose decompression would take that much memory (its read, up to
        # the rest of the chunk).
        if max(size, stored) > 16 * count + 1024:
            raise ValueError("a page of indices larger than its values")
        body = pages.get(at, stored)
        if kind == _DATA_PAGE:
            if page.get(3, _RLE) != _RLE or page.get(4, _RLE) != _RLE:
                raise ValueError("levels not RLE")
            data = _decompressed(body, size, self.codec)
            position = 0
            if self.repetition > 0:
                position += 4 + int.from_bytes(data[0:4], "little")
            values = count
            if self.definition > 0:
                length = int.from_bytes(data[position : position + 4], "little")
                levels = data[position + 4 : position + 4 + length]
                if len(levels) < length:
                    raise IndexError("levels past the page")
                width = self.definition.bit_length()
                values = int(_hybrid_counts(levels, width, count, self.definition + 1)[-1])
                position += 4 + length
            data = data[position:]
        else:
            definition_bytes, repetition_bytes = _count(page, 5), _count(page, 6)
            levels = definition_bytes + repetition_bytes
            if levels > min(stored, size):
                raise ValueError("levels past the page")
            values = count - _count(page, 2)
            data = body[levels:]
            if page.get(7, True) is not False:
                data = _decompressed(data, size - levels, self.codec)
        if values <= 0:
            return
        width = data[0]
        self.counts += _hybrid_counts(data[1:], width, values, len(self.counts))


def _decompressed(data: bytes, size: int, codec: str | None) -> bytes:
    """`data` decompressed with pyarrow's `codec` into its `size` bytes (as is for None)."""
    if codec is None:
        return data
    import pyarrow as pa

    return pa.decompress(data, decompressed_size=size, codec=codec, asbytes=True)


def _plain_sizes(data: bytes, distinct: int) -> Any:
    """The lengths of the `distinct` byte arrays a PLAIN-encoded dictionary page holds (each
    a 4-byte length, then its bytes)."""
    import numpy as np

    sizes = np.zeros(distinct, dtype=np.int64)
    position = 0
    for value in range(distinct):
        length = int.from_bytes(data[position : position + 4], "little")
        position += 4 + length
        if position > len(data):
            raise IndexError("a dictionary value past its page")
        sizes[value] = length
    return sizes


def _hybrid_counts(data: bytes, width: int, count: int, distinct: int) -> Any:
    """How often each of the values 0..`distinct`-1 occurs among the first `count` values of
    parquet's RLE/bit-packed hybrid encoding of `width`-bit values in `data` (a ValueError for
    a value past them). The bit-packed runs (whole bytes each) are unpacked together."""
    import numpy as np

    if width > 32:
        raise ValueError(f"{width}-bit values")
    counts = np.zeros(distinct, dtype=np.int64)
    packed: list[bytes] = []
    unpacked = 0  # the values of `packed` to count
    byte_width = (width + 7) // 8
    position = 0
    while count > 0:
        header, position = _varint_at(data, position)
        if header & 1:  # bit-packed: groups of 8 values, `width` bytes a group
            size = (header >> 1) * width
            run = data[position : position + size]
            position += size
            taken = min(count, 8 * (header >> 1), 8 * len(run) // width if width else count)
            packed.append(run)
            unpacked += taken
        else:  # a run of one value
            taken = min(count, header >> 1)
            value = int.from_bytes(data[position : position + byte_width], "little")
            position += byte_width
            if position > len(data) or value >= distinct:
                raise ValueError("a run past the page or the dictionary")
            counts[value] += taken
        if taken <= 0:
            raise ValueError("values past the page")
        count -= taken
    if unpacked and width == 0:
        counts[0] += unpacked
    elif unpacked:
        # Only a page's last run is cut short (`taken`), so the values counted come first.
        bits = np.unpackbits(np.frombuffer(b"".join(packed), dtype=np.uint8), bitorder="little")
        weights = 1 << np.arange(width, dtype=np.int64)
        values = bits[: unpacked * width].reshape(unpacked, width) @ weights
        if int(values.max()) >= distinct:
            raise ValueError("an index past the dictionary")
        counts += np.bincount(values, minlength=distinct)
    return counts


def _varint_at(data: bytes, position: int) -> tuple[int, int]:
    """The unsigned varint at `position` in `data` (parquet's and thrift's ULEB128), and the
    position after it: an IndexError where `data` ends first."""
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


class _ChunkBytes:
    """A column chunk's bytes (up to `end` in the file open as `fd`), read `ahead` bytes at a
    time at least: its small pages and their headers in one read."""

    def __init__(self, fd: int, end: int) -> None:
        self.fd, self.end = fd, end
        self.ahead = _READ_BYTES
        self._at, self._data = 0, b""

    def get(self, offset: int, size: int) -> bytes:
        """`size` bytes at `offset`, fewer only where the chunk ends first."""
        size = max(0, min(size, self.end - offset))
        start = offset - self._at
        if start < 0 or start + size > len(self._data):
            self._data = os.pread(self.fd, max(size, min(self.ahead, self.end - offset)), offset)
            self._at, start = offset, 0
        return self._data[start : start + size]


def _count(fields: dict[int, Any], key: int) -> int:
    """Field `key` of a header's struct, a count or a size: 0 where absent; a ValueError where
    it is no integer or a negative one."""
    value = fields.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"field {key}: {value!r}")
    return value


def _next_page(offset: int, size: int, header: dict[int, Any], end: int) -> int:
    """Where the page after the one at `offset` (its header `size` bytes long) starts: after
    it, and no further than the chunk's `end`, else a ValueError."""
    following = offset + size + _count(header, 3)
    if following > end:
        raise ValueError("a page past its chunk")
    return following


def _chunk_nulls_share(chunk: Any) -> float:
    """The share of the chunk's values that are null, from its footer statistics; 0 where they
    do not say."""
    statistics = chunk.statistics if chunk.is_stats_set else None
    if statistics is None or not statistics.has_null_count or chunk.num_values <= 0:
        return 0.0
    return min(1.0, max(0, statistics.null_count) / chunk.num_values)


def _nulls(kind: int, page: dict[int, Any]) -> int | None:
    """The null values a data page counts among its values, where its header says (v2 always,
    v1 in its statistics); None where it does not."""
    if kind == _DATA_PAGE_V2:
        return _count(page, 2)
    statistics = page.get(5)
    if not isinstance(statistics, dict) or 3 not in statistics:
        return None
    return _count(statistics, 3)


def _page_header(pages: _ChunkBytes, offset: int) -> tuple[dict[int, Any], int]:
    """The page header at `offset` (thrift's compact protocol) and its length in bytes."""
    want = _HEADER_BYTES
    while True:
        data = pages.get(offset, want)
        reader = _CompactReader(data)
        try:
            return reader.struct(), reader.pos
        except IndexError:
            if len(data) < want or want >= _LARGEST_HEADER:
                raise
            want *= 8


class _CompactReader:
    """The few parts of thrift's compact protocol a page header needs: a struct's integer
    fields and nested structs, everything else passed over. IndexError where `data` ends
    first, ValueError where it is not thrift."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _byte(self) -> int:
        value = self.data[self.pos]
        self.pos += 1
        return value

    def _skip(self, count: int) -> None:
        if count < 0 or self.pos + count > len(self.data):
            raise IndexError("past the end")
        self.pos += count

    def _varint(self) -> int:
        value, self.pos = _varint_at(self.data, self.pos)
        return value

    def _zigzag(self) -> int:
        value = self._varint()
        return (value >> 1) ^ -(value & 1)

    def struct(self, depth: int = 0) -> dict[int, Any]:
        self._nest(depth)
        fields: dict[int, Any] = {}
        last = 0
        while True:
            head = self._byte()
            if head == 0:
                return fields
            kind, delta = head & 0x0F, head >> 4
            last = last + delta if delta else self._zigzag()
            fields[last] = self._value(kind, depth, in_field=True)

    @staticmethod
    def _nest(depth: int) -> None:
        # structs, lists, sets and maps alike: a header nests a few levels, a crafted one
        # thousands (a RecursionError)
        if depth > _DEEPEST:
            raise ValueError("nested too deep")

    def _value(self, kind: int, depth: int, in_field: bool = False) -> Any:
        if kind in (1, 2):  # a bool: in a field's header, else a byte of its own
            return kind == 1 if in_field else self._byte() == 1
        if kind == 3:
            return self._byte()
        if kind in (4, 5, 6):
            return self._zigzag()
        if kind == 7:
            self._skip(8)
            return None
        if kind == 8:
            self._skip(self._varint())
            return None
        if kind in (9, 10):  # list, set
            self._nest(depth)
            head = self._byte()
            count = head >> 4 if head >> 4 != 15 else self._varint()
            for _ in range(count):
                self._value(head & 0x0F, depth + 1)
            return None
        if kind == 11:  # map
            self._nest(depth)
            count = self._varint()
            if count:
                types = self._byte()
                for _ in range(count):
                    self._value(types >> 4, depth + 1)
                    self._value(types & 0x0F, depth + 1)
            return None
        if kind == 12:
            return self.struct(depth + 1)
        raise ValueError(f"thrift type {kind}")
