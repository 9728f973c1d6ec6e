"""Parquet images stored once and read many times: pyarrow's writer (HF's, pandas') dictionary-
encodes a column by default, so a column of 10,000 rows holding 50 distinct images stores the 50
once, and the footer's sizes say so, where pyarrow reads every row's copy back. The row groups'
sizes that plan reading (train's shuffle, `convert shards`' windows and the room for its spill,
the warning of row groups past the reader's cache) were the footer's: 1 MB for a row group read
as 193 MB. They are the sizes read now (`parquet_pages`), checked against pyarrow's own read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from parquet_files import png
from processes import run_torchkit_in_process

from torchkit.core.convert import shards as shards_module
from torchkit.core.data.sources import open_data
from torchkit.core.data.sources import parquet as parquet_module
from torchkit.core.io import sizes


def write_rows(path, rows: int, distinct: int, group_rows: int, **options) -> str:
    """`rows` rows cycling through `distinct` 2 kB images (PNGs with bytes after their end),
    as HF's Image struct, or (`binary=True`) a plain binary column; `nulls`: every third row's
    image null. Other options: pyarrow's `write_table`'s."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    binary, nulls = options.pop("binary", False), options.pop("nulls", False)
    images = [png(i) + bytes([i]) * 2000 for i in range(distinct)]
    column = [None if nulls and row % 3 == 0 else images[row % distinct] for row in range(rows)]
    if binary:
        array = pa.array(column, pa.binary())
    else:
        kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        array = pa.array([None if b is None else {"bytes": b, "path": None} for b in column], kind)
    table = pa.table({"image": array, "label": pa.array([row % 3 for row in range(rows)])})
    pq.write_table(table, path, row_group_size=group_rows, **options)
    return str(path)


def sizes_read(path: str) -> list[int]:
    """What pyarrow's read of each row group's image column holds: the reference."""
    import pyarrow.parquet as pq

    handle = pq.ParquetFile(path)
    return [
        parquet_module.image_bytes(handle.read_row_group(g, columns=["image"]).column(0)).nbytes
        for g in range(handle.metadata.num_row_groups)
    ]


@pytest.mark.parametrize(
    "options",
    [
        {},  # pyarrow's defaults: dictionary pages, data pages v1, snappy
        {"data_page_version": "2.0", "compression": "zstd"},
        {"nulls": True},  # null images counted nothing, as read
        # ... with a page index, where pyarrow's v1 pages count no nulls in their headers: the
        # footer's share of nulls (each null was counted an image: 1.5 times the size read)
        {"nulls": True, "write_page_index": True},
        {"binary": True},
        {"use_dictionary": False},  # the footer's sizes were right: unchanged
        # the dictionary past its page's 1 MiB: pyarrow's fallback to plain pages, as HF's
        # datasets of large distinct images have in every row group
        {"dictionary_pagesize_limit": 10_000},
    ],
    ids=["dictionary", "v2-zstd", "nulls", "nulls-page-index", "binary", "plain", "fallback"],
)
def test_row_group_sizes_are_what_reading_them_holds(tmp_path, options):
    """Before: 2,000 rows of 20 distinct images counted 45 kB a row group of 4 MB read."""
    path = write_rows(tmp_path / "d.parquet", 4000, 20, 2000, **options)
    read = sizes_read(path)
    stored = open_data(path).whole
    blocks = stored.paths[0].reader.blocks([p.locator for p in stored.paths])
    counted = [size * 8 / 9 for size in blocks.sizes]  # `blocks` adds an eighth for offsets
    assert len(counted) == len(read) == 2
    for size, real in zip(counted, read, strict=True):
        assert real * 0.98 <= size <= real * 1.1, (counted, read)


def test_row_groups_of_repeated_images_past_the_cache_are_said(tmp_path, monkeypatch):
    """Before: no warning, the footer's 45 kB a row group being far below the cache."""
    path = write_rows(tmp_path / "d.parquet", 4000, 20, 2000)
    monkeypatch.setattr(parquet_module, "CACHE_BYTES", 2 << 20)  # half a row group read
    said = run_torchkit_in_process("dataset-stats", path, "-j", "0")
    assert said.returncode == 0, said.stderr
    warnings = [line for line in said.stderr.splitlines() if "row groups of up to" in line]
    assert len(warnings) == 1, said.stderr
    said_mb = int(re.search(r"row groups of up to (\d+) MB", warnings[0]).group(1))
    assert said_mb == max(sizes_read(path)) >> 20


def test_a_spill_of_repeated_images_counts_the_room_they_take(tmp_path, monkeypatch):
    """The room a spill of `convert shards` needs is its images twice (the spill and the
    shards). Before: counted from the footer's sizes, 0.3 MB where the spill wrote 8 MB, and a
    disk of 2 MB free was filled by the spill before the shards' turn."""
    path = write_rows(tmp_path / "d.parquet", 4000, 20, 500)
    monkeypatch.setattr(shards_module, "WINDOW_BYTES", 1 << 20)  # 8 windows of 8 row groups
    monkeypatch.setattr(shards_module.sizes, "free_bytes", lambda folder: 12_000_000)
    assert shards_module.sizes is sizes
    done = run_torchkit_in_process("convert", "shards", path, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "no room for a temporary copy of the images" in done.stderr, done.stderr
    needed = float(re.search(r"about ([\d.]+) MB needed", done.stderr).group(1)) * 1e6
    assert needed >= 2 * sum(sizes_read(path)) > 12_000_000


def test_page_headers_that_cannot_be_read_leave_the_footers_size(tmp_path):
    """Headers not as expected (garbled, encrypted, the file cut short): the footer's figure,
    never an error at opening."""

    import pyarrow.parquet as pq

    path = write_rows(tmp_path / "d.parquet", 400, 20, 400)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert decoded_chunk_bytes_of(path, chunk) > 10 * chunk.total_uncompressed_size
    for garbage in (b"\xff" * 64, bytes(range(256)) * 16, b"\x15\x04" * 8, b""):
        other = tmp_path / "other"
        other.write_bytes(garbage)
        assert decoded_chunk_bytes_of(str(other), chunk) == chunk.total_uncompressed_size


def test_without_pread_row_groups_count_the_footers_size(tmp_path, monkeypatch):
    """Where `os` has no pread (Windows), a dictionary-encoded row group counts the footer's
    size, as before page headers were read: never an AttributeError at opening."""
    import os

    import pyarrow.parquet as pq

    path = write_rows(tmp_path / "d.parquet", 4000, 20, 2000)
    metadata = pq.ParquetFile(path).metadata
    footer = [
        sum(group.column(i).total_uncompressed_size for i in range(group.num_columns) if
            group.column(i).path_in_schema.startswith("image."))
        for group in map(metadata.row_group, range(metadata.num_row_groups))
    ]  # fmt: skip
    monkeypatch.delattr(os, "pread")
    stored = open_data(path).whole
    assert stored.paths[0].reader.group_bytes == [footer]
    assert footer[0] * 10 < sizes_read(path)[0]  # the pages' walk would count more


def compact_i32(delta: int, value: int) -> bytes:
    """A thrift compact-protocol i32 field `delta` ids after the one before."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray([delta << 4 | 5])
    while True:
        out.append(zigzag & 0x7F | (0x80 if zigzag >> 7 else 0))
        zigzag >>= 7
        if not zigzag:
            return bytes(out)


def dictionary_header(size: int, values: int) -> bytes:
    # PageHeader{1: DICTIONARY_PAGE, 2: size, 3: 0 stored, 7: DictionaryPageHeader{1: values}}
    return (compact_i32(1, 2) + compact_i32(1, size) + compact_i32(1, 0) + b"\x4c"
            + compact_i32(1, values) + b"\x00\x00")  # fmt: skip


def data_header(stored: int, values: int) -> bytes:
    # PageHeader{1: DATA_PAGE, 2, 3: stored, 5: DataPageHeader{1: values, 2: RLE_DICTIONARY}}
    return (compact_i32(1, 0) + compact_i32(1, 100) + compact_i32(1, stored) + b"\x2c"
            + compact_i32(1, values) + compact_i32(1, 8) + b"\x00\x00")  # fmt: skip


def test_crafted_page_headers_leave_the_footers_size(tmp_path, monkeypatch):
    """Headers a garbled or crafted file holds: the footer's figure, in a few reads. Before:
    nested lists raised a RecursionError and a field of another type a TypeError (each an
    `Error:` line naming it, the file refused at opening); a page of 2**31 values counted 4 TB
    (a warning of row groups of 4,096,000 MB); a page pointing back to itself was read 4,096
    times."""
    import os

    import pyarrow.parquet as pq

    path = write_rows(tmp_path / "d.parquet", 400, 20, 400)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    start, length = chunk.dictionary_page_offset, chunk.total_compressed_size
    dictionary = dictionary_header(40_000, 20)

    def to_the_end(prefix: bytes, values: int) -> bytes:
        # `prefix`, then a data page of `values` reaching the chunk's end exactly
        last = length - len(prefix) - len(data_header(length, values))
        assert len(data_header(last, values)) == len(data_header(length, values))
        return prefix + data_header(last, values)

    looping = data_header(-len(data_header(-99, 300)), 300)
    crafted = {
        "nested lists": b"\x19" * 5000,
        "nested maps": b"\x1b" + b"\x01\xbb" * 3000,
        "a size that is a struct": to_the_end(
            compact_i32(1, 2)
            + b"\x1c\x00"
            + compact_i32(1, 0)
            + b"\x4c"
            + compact_i32(1, 20)
            + b"\x00\x00",
            300,
        ),  # fmt: skip
        "more values than the chunk": to_the_end(dictionary, 2**31 - 1),
        "a dictionary larger than the chunk": to_the_end(dictionary_header(2**31 - 1, 1), 300),
        "a page pointing back to itself": dictionary + looping,
    }
    reads: list[int] = []
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda *args: reads.append(1) or pread(*args))
    original = Path(path).read_bytes()
    for name, header in crafted.items():
        changed = bytearray(original)
        changed[start : start + len(header)] = header
        other = tmp_path / "other.parquet"
        other.write_bytes(changed)
        reads.clear()
        assert decoded_chunk_bytes_of(str(other), chunk) == chunk.total_uncompressed_size, name
        assert len(reads) <= 3, name
    # the same walk of well-formed headers counts each row's copy (the test's own headers)
    changed = bytearray(original)
    header = to_the_end(dictionary, 400)
    changed[start : start + len(header)] = header
    other.write_bytes(changed)
    assert decoded_chunk_bytes_of(str(other), chunk) >= 400 * 40_000 // 20


def decoded_chunk_bytes_of(path: str, chunk, column=None) -> int:
    import os

    from torchkit.core.data.sources.parquet_pages import decoded_chunk_bytes

    fd = os.open(path, os.O_RDONLY)
    try:
        return decoded_chunk_bytes(fd, chunk, column)
    finally:
        os.close(fd)


def pread_sizes(monkeypatch) -> list[int]:
    """The sizes of every `os.pread` from here on, in order, as the reads go."""
    import os

    reads: list[int] = []
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: reads.append(n) or pread(fd, n, at))
    return reads


def test_images_read_from_one_of_several_image_columns_are_said(tmp_path):
    """Several {bytes, path} columns none named `image` (a pair's `left` and `right`): the
    first was read without a word. It still is, with one warning naming the column read; a
    column named `image` beside others is the one read, as ever, quietly."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    left, right = [png(i) for i in range(4)], [png(10 + i) for i in range(4)]

    def column(images):
        return pa.array([{"bytes": b, "path": None} for b in images], kind)

    pair = tmp_path / "pair.parquet"
    pq.write_table(pa.table({"left": column(left), "right": column(right), "label": [0] * 4}), pair)
    said = run_torchkit_in_process("dataset-stats", pair, "-j", "0")
    assert said.returncode == 0, said.stderr
    warnings = [line for line in said.stderr.splitlines() if "image columns" in line]
    assert warnings == [
        f"Warning: {pair} has 2 image columns (left, right): its images are read from left, the "
        "first (name the column to read `image`)"
    ], said.stderr
    assert [p.read_bytes() for p in open_data(str(pair)).whole.paths] == left
    named = tmp_path / "named.parquet"
    pq.write_table(
        pa.table({"mask": column(left), "image": column(right), "label": [0] * 4}), named
    )
    quiet = run_torchkit_in_process("dataset-stats", named, "-j", "0")
    assert quiet.returncode == 0 and "image columns" not in quiet.stderr, quiet.stderr
    assert [p.read_bytes() for p in open_data(str(named)).whole.paths] == right


def test_opening_reads_the_page_headers_of_a_few_row_groups(tmp_path, monkeypatch):
    """Each row group's walk is a few reads (a seek on a cold disk, a round trip on a network
    file system): 2,500 row groups took 15,000 reads at opening. Eight row groups, spread over
    the file, are walked now, each other one counted at the ratio of the nearest: here a file
    whose first half repeats 5 images a row group and whose second half repeats none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from torchkit.core.data.sources import parquet_pages

    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    path = tmp_path / "d.parquet"
    with pq.ParquetWriter(path, pa.schema([("image", kind), ("label", pa.int64())])) as writer:
        for group in range(40):
            images = [png(group) + bytes([group, row]) * 1000 for row in range(50)]
            rows = [images[row % 5] if group < 20 else images[row] for row in range(50)]
            column = pa.array([{"bytes": b, "path": None} for b in rows], kind)
            writer.write_table(pa.table({"image": column, "label": [0] * 50}))
    walked = []
    walk = parquet_pages.decoded_chunk_bytes
    monkeypatch.setattr(
        parquet_pages, "decoded_chunk_bytes", lambda *a: walked.append(1) or walk(*a)
    )
    stored = open_data(str(path)).whole
    assert len(walked) == 8 * 2  # 8 row groups, their Image's bytes and path
    blocks = stored.paths[0].reader.blocks([p.locator for p in stored.paths])
    counted = [size * 8 / 9 for size in blocks.sizes]  # `blocks` adds an eighth for offsets
    for group, (size, real) in enumerate(zip(counted, sizes_read(str(path)), strict=True)):
        assert real * 0.98 <= size <= real * 1.1, (group, size, real)


def test_a_column_hf_types_otherwise_is_no_rival_image_column(tmp_path):
    """HF's Audio is the same {bytes, path} struct as its Image: a dataset whose metadata
    calls `picture` its Image, beside a `sound` Audio, was warned of '2 image columns
    (picture, sound)'. Quiet now; two columns the metadata calls Images are still said."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    pictures, sounds = [png(i) for i in range(4)], [b"RIFF" + bytes([i]) for i in range(4)]

    def column(values: list[bytes]):
        return pa.array([{"bytes": b, "path": None} for b in values], kind)

    def write(name: str, features: dict) -> str:
        table = pa.table({"sound": column(sounds), "picture": column(pictures), "label": [0] * 4})
        info = {"info": {"features": features}}
        table = table.replace_schema_metadata({b"huggingface": json.dumps(info).encode()})
        pq.write_table(table, tmp_path / name)
        return str(tmp_path / name)

    audio = write("audio.parquet", {"sound": {"_type": "Audio"}, "picture": {"_type": "Image"}})
    said = run_torchkit_in_process("dataset-stats", audio, "-j", "0")
    assert said.returncode == 0 and "image columns" not in said.stderr, said.stderr
    assert [p.read_bytes() for p in open_data(audio).whole.paths] == pictures
    both = write("both.parquet", {"picture": {"_type": "Image"}, "sound": {"_type": "Image"}})
    said = run_torchkit_in_process("dataset-stats", both, "-j", "0")
    assert said.returncode == 0, said.stderr
    assert f"{both} has 2 image columns (picture, sound)" in said.stderr, said.stderr


def write_odd_rows(path, big_rows: int, **options) -> str:
    """2 row groups of 400 rows: `big_rows` of one 20 kB image, the others cycling through 9
    images of 300 bytes (PNGs with bytes after their end); options: `write_rows`'."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    nulls = options.pop("nulls", False)
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = []
    for group in range(2):
        big = png(group) + bytes([group]) * 20_000
        small = [png(10 + 10 * group + i) + bytes([i]) * 300 for i in range(9)]
        rows += [big if row < big_rows else small[row % 9] for row in range(400)]
    images = [None if nulls and row % 3 == 0 else {"bytes": b, "path": None}
              for row, b in enumerate(rows)]  # fmt: skip
    table = pa.table({"image": pa.array(images, kind), "label": [row % 3 for row in range(800)]})
    pq.write_table(table, path, row_group_size=400, **options)
    return str(path)


def counted_sizes(path: str) -> list[float]:
    """The row groups' image bytes opening counts (`blocks` adds an eighth for offsets)."""
    stored = open_data(path).whole
    blocks = stored.paths[0].reader.blocks([p.locator for p in stored.paths])
    return [size * 8 / 9 for size in blocks.sizes]


@pytest.mark.parametrize("big_rows", [360, 20], ids=["one-big-image-in-most-rows", "in-few-rows"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"data_page_version": "2.0", "compression": "zstd"},
        {"compression": "none", "nulls": True},
        {"nulls": True, "write_page_index": True, "compression": "gzip"},
        # pyarrow's "lz4" writes parquet's LZ4_RAW, which its footer names "LZ4" (was read as
        # a codec not known here: the dictionary's mean size, 0.13 of the bytes read)
        {"compression": "lz4"},
    ],
    ids=["snappy", "v2-zstd", "plain-nulls", "gzip-nulls-page-index", "lz4"],
)
def test_repeated_images_of_other_sizes_count_their_own_sizes(tmp_path, options, big_rows):
    """Each row's copy counted at its own image's size, from the dictionary indices: before, at
    the dictionary's mean size, 360 rows of one 20 kB image among 40 of 9 small ones counted
    0.14 of the bytes read (a window or the cache holding 7 times what was planned), and 20
    rows of it among 380 small ones 1.8 times them."""
    path = write_odd_rows(tmp_path / "d.parquet", big_rows, **options)
    read = sizes_read(path)
    counted = counted_sizes(path)
    assert len(counted) == len(read) == 2
    for size, real in zip(counted, read, strict=True):
        assert real * 0.98 <= size <= real * 1.1, (counted, read)


@pytest.mark.parametrize("compression", ["snappy", "none"])
def test_a_dictionary_too_large_to_read_counts_a_duplicate_image_once_more(
    tmp_path, monkeypatch, compression
):
    """Distinct images and one duplicate in a dictionary past what opening reads of it (large
    photos: pyarrow's dictionary outgrows its 1 MiB only checked each 1,024 rows): each copy at
    the dictionary's mean size, as read. Counted as often as the most repeated one (twice) for
    every value, the row group counted twice the bytes read (warned of as past the cache)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from torchkit.core.data.sources import parquet_pages

    images = [png(i) + bytes([i]) * 2000 for i in range(60)]
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = [{"bytes": b, "path": None} for b in images + images[:1]]
    table = pa.table({"image": pa.array(rows, kind), "label": [i % 3 for i in range(61)]})
    path = str(tmp_path / "d.parquet")
    pq.write_table(table, path, compression=compression)
    monkeypatch.setattr(parquet_pages, "_LARGEST_DICTIONARY", 1000)
    [size], [real] = counted_sizes(path), sizes_read(path)
    assert real * 0.98 <= size <= real * 1.05, (size, real)


@pytest.mark.parametrize("readable", [True, False], ids=["read", "too-large-even-so"])
def test_a_large_dictionary_of_heavily_repeated_images_counts_no_less_than_read(
    tmp_path, monkeypatch, readable
):
    """One image in most rows of a dictionary past 8 MiB (counted at the dictionary's mean
    size, 0.14 of the bytes read): read for its values' sizes up to 64 MiB where values repeat
    heavily (as read), past that each value counted as often as the most repeated one (here
    1.25 times the bytes read, never less)."""
    from torchkit.core.data.sources import parquet_pages

    path = write_odd_rows(tmp_path / "d.parquet", 360)
    monkeypatch.setattr(parquet_pages, "_LARGEST_DICTIONARY", 1000)
    if not readable:
        monkeypatch.setattr(parquet_pages, "_LARGEST_REPEATED_DICTIONARY", 1000)
    for size, real in zip(counted_sizes(path), sizes_read(path), strict=True):
        if readable:
            assert real * 0.98 <= size <= real * 1.02, (size, real)
        else:
            assert real <= size <= real * 1.5, (size, real)


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_dictionary_indices_that_cannot_be_read_leave_the_mean_size(tmp_path, compression):
    """An index page not as expected (garbled: its bytes overwritten) counts the dictionary's
    mean size, as before indices were read: never an error at opening. A gzip or zstd page
    that does not decompress (an OSError from pyarrow, where snappy's is an ArrowInvalid)
    counted the footer's size: the dictionary once, 27 kB of the 7.3 MB read here."""
    import os

    import pyarrow.parquet as pq

    from torchkit.core.data.sources import parquet_pages
    from torchkit.core.data.sources.parquet_pages import decoded_chunk_bytes

    path = write_odd_rows(tmp_path / "d.parquet", 360, compression=compression)
    metadata = pq.ParquetFile(path).metadata
    chunk, column = metadata.row_group(0).column(0), metadata.schema.column(0)
    fd = os.open(path, os.O_RDONLY)
    try:
        mean, exact = decoded_chunk_bytes(fd, chunk), decoded_chunk_bytes(fd, chunk, column)
        end = chunk.dictionary_page_offset + chunk.total_compressed_size
        pages = parquet_pages._ChunkBytes(fd, end)
        _, header_bytes = parquet_pages._page_header(pages, chunk.data_page_offset)
    finally:
        os.close(fd)
    assert exact > 5 * mean
    # the index page's body, past its header: its definition levels' length past the page
    garbled = bytearray(Path(path).read_bytes())
    start = chunk.data_page_offset + header_bytes
    garbled[start : start + 4] = b"\xff" * 4
    Path(path).write_bytes(garbled)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert decoded_chunk_bytes(fd, chunk, column) == mean
    finally:
        os.close(fd)


@pytest.mark.parametrize("garbled", ["dictionary-values", "index-page-bytes"])
def test_a_garbled_page_header_takes_no_memory_or_reads_past_its_values(
    tmp_path, monkeypatch, garbled
):
    """A dictionary page header claiming 2**40 values was counted a value each (an 8 TiB
    array: a MemoryError out of opening), and an index page claiming the rest of its chunk
    was read whole: the footer's figure now, and the reads stay the pages' few kB (of a chunk
    of 570 kB, whose dictionary falls back to plain pages after 8 values)."""
    import pyarrow.parquet as pq

    from torchkit.core.data.sources import parquet_pages

    path = write_rows(
        tmp_path / "d.parquet", 250, 250, 250, compression="none",
        dictionary_pagesize_limit=8000, write_batch_size=8,
    )  # fmt: skip
    metadata = pq.ParquetFile(path).metadata
    chunk, column = metadata.row_group(0).column(0), metadata.schema.column(0)
    end = chunk.dictionary_page_offset + chunk.total_compressed_size
    real_header = parquet_pages._page_header

    def header(pages, offset):
        fields, size = real_header(pages, offset)
        if garbled == "dictionary-values" and offset == chunk.dictionary_page_offset:
            fields[7] = {**fields[7], 1: 1 << 40}
        if garbled == "index-page-bytes" and offset == chunk.data_page_offset:
            fields[3] = end - offset - size  # its body the rest of the chunk
        return fields, size

    monkeypatch.setattr(parquet_pages, "_page_header", header)
    reads = pread_sizes(monkeypatch)
    counted = decoded_chunk_bytes_of(path, chunk, column)
    if garbled == "dictionary-values":
        assert counted == chunk.total_uncompressed_size
    assert sum(reads) <= 2 * parquet_pages._READ_BYTES < chunk.total_compressed_size / 2, reads


def test_a_large_dictionary_page_has_its_header_read_alone(tmp_path, monkeypatch):
    """A dictionary page of large distinct images (HF's row groups): its header is read alone,
    never the chunk's read-ahead of its values (64 kB a row group: 526 kB read for 200 row
    groups where 3 kB do)."""
    import pyarrow.parquet as pq

    from torchkit.core.data.sources import parquet_pages

    path = write_rows(tmp_path / "d.parquet", 100, 100, 100, compression="none")
    metadata = pq.ParquetFile(path).metadata
    chunk, column = metadata.row_group(0).column(0), metadata.schema.column(0)
    assert chunk.data_page_offset - chunk.dictionary_page_offset > parquet_pages._READ_BYTES
    reads = pread_sizes(monkeypatch)
    counted = decoded_chunk_bytes_of(path, chunk, column)
    assert counted == chunk.total_uncompressed_size  # each image once: as stored
    # the header, then the index pages (their statistics hold an image's bytes or two)
    assert reads[0] == parquet_pages._HEADER_BYTES, reads
    assert sum(reads) < parquet_pages._READ_BYTES // 4, reads
