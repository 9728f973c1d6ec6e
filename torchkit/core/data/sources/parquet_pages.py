"""How many bytes a dictionary-encoded parquet column chunk holds once read, from its page
headers (a few small reads at the chunk's start, never its values).

A column chunk's `total_uncompressed_size` (the footer's figure) counts a dictionary-encoded
value once, in the dictionary page, however many rows repeat it; pyarrow reads the column back
decoded, each row its own copy. 10,000 rows of 50 distinct 19 KB images: 1 MB in the footer, 193
MB read. pyarrow's writer (and so HF's and pandas') dictionary-encodes every column by default,
falling back to plain pages for good once the dictionary outgrows its 1 MiB page: the
dictionary-encoded pages come first, so the walk stops at the first plain page, and the rest of
the chunk counts as the footer says.
"""

from __future__ import annotations

import os
from typing import Any

# parquet.thrift: PageType, Encoding
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
_DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
# A page header's bytes read at once (page statistics can make one longer: read again, up to
# the largest); the pages walked at most (the dictionary-encoded pages of a row group are few:
# pyarrow writes one per 1 MiB of indices or per 1024 values at least).
_HEADER_BYTES = 256
_LARGEST_HEADER = 1 << 20
_MOST_PAGES = 4096
_DEEPEST = 16  # thrift structs and collections nested in a header (a page header nests 3)


def decoded_chunk_bytes(fd: int, chunk: Any) -> int:
    """The bytes column chunk `chunk` (pyarrow's ColumnChunkMetaData) of the file open as `fd`
    holds read: its `total_uncompressed_size`, or more where its dictionary-encoded pages
    repeat dictionary values (each counted at the dictionary's mean value size). The footer's
    figure wherever the headers cannot be read (encrypted, cut short, not as expected)."""
    stored = chunk.total_uncompressed_size
    if not chunk.has_dictionary_page or chunk.dictionary_page_offset is None:
        return stored
    if not hasattr(os, "pread"):  # Windows: the footer's figure
        return stored
    try:
        decoded = _dictionary_pages_decoded(fd, chunk)
    except (OSError, ValueError, IndexError, OverflowError):
        return stored
    return stored if decoded is None else max(stored, decoded)


def _dictionary_pages_decoded(fd: int, chunk: Any) -> int | None:
    """The walk `decoded_chunk_bytes` makes: the dictionary page's mean value size times the
    values of each dictionary-encoded data page, plus the rest of the chunk as stored. Each
    page lies after the one before and within the chunk, and the pages count no more values
    than the footer's: a ValueError where not (a garbled or crafted file), never a walk back,
    past the file, or an estimate of more values than the chunk has."""
    offset = chunk.dictionary_page_offset
    end = offset + chunk.total_compressed_size
    header, size = _page_header(fd, offset)
    dictionary = header.get(7)
    if header.get(1) != _DICTIONARY_PAGE or not isinstance(dictionary, dict):
        return None
    dictionary_bytes = _count(header, 2)
    if dictionary_bytes > chunk.total_uncompressed_size:
        raise ValueError("a dictionary larger than its chunk")
    distinct = _count(dictionary, 1)
    value_bytes = dictionary_bytes / distinct if distinct else 0.0
    walked = size + dictionary_bytes  # uncompressed bytes of the pages walked, headers too
    offset = _next_page(offset, size, header, end)
    # v1 pages whose header counts no nulls (pyarrow writes no page statistics with a page
    # index): the chunk's share of nulls, from the footer's statistics where it has them
    nulls_share = _chunk_nulls_share(chunk)
    values, counted = 0.0, 0
    for _ in range(_MOST_PAGES):
        if offset >= end:
            break
        header, size = _page_header(fd, offset)
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
        walked += size + _count(header, 2)
        offset = _next_page(offset, size, header, end)
    else:
        return None
    return int(values * value_bytes) + max(0, chunk.total_uncompressed_size - walked)


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


def _page_header(fd: int, offset: int) -> tuple[dict[int, Any], int]:
    """The page header at `offset` (thrift's compact protocol) and its length in bytes."""
    want = _HEADER_BYTES
    while True:
        data = os.pread(fd, want, offset)
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
        result = shift = 0
        while True:
            byte = self._byte()
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

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
