"""Hugging Face datasets stored as parquet, read in place (map-style).

What `--data` (or IMAGES) may name here, before folders and CSV indexes are tried:

- a dataset folder in HF's layouts: `ROOT/data/{split}-00000-of-00010.parquet`,
  `ROOT/data/{split}/*.parquet`, `ROOT/{split}/*.parquet` or `ROOT/{split}-*.parquet`. Split
  names are HF's keywords: train (training), val (validation, valid, dev), test (testing, eval,
  evaluation). A folder whose files all name a split is split data, like a split root; one whose
  files name none (`ROOT/*.parquet`, `ROOT/data/*.parquet`) is unsplit data; a mix is an error.
- one `.parquet` file: unsplit data, whatever its name.

Columns: the image is HF's `Image` struct {bytes, path} (the column `image`, else `img`, else the
first column HF's metadata calls an Image, else the first struct column with a `bytes` field,
with a warning naming the column read where another could be it; a plain binary column of the
names `image` and `img` too). The label is the column `label`, else the first column
HF's metadata calls a ClassLabel; integers (or floats that are all whole numbers) are class
indices, strings class names; a `label` column of another type is an error where labels are
needed, else a warning and unlabelled data. Class names
come from HF's metadata in the parquet schema (`huggingface` key: info.features.LABEL.names), else
from `ROOT/dataset_info.json`, string labels mapped through them (the classes in their order,
so class indices are HF's; a label they lack is an error naming it); without either, integer
labels are named "0", "1", ... up to the largest (string labels: sorted naturally, as a CSV
index's labels are). No label column, or rows
without a label (null or HF's -1): unlabelled data where that is allowed (dataset-stats, predict,
extract-features), else an error naming the file and rows. An empty class name is an error, as
is a ClassLabel name that is neither text nor a number (null: it was class "None").

A sample's id (the `path` column of outputs) is `FILE/ROW`, FILE relative to ROOT (to the file's
folder for one file) and ROW the row in that file from 0: `data/train-00000-of-00002.parquet/123`.
It is unique and stable whatever the rows hold (HF's own `image.path` is often empty or repeated).

Opening reads the parquet footers and the label column only, never an image (the label
column's chunks in few reads, `LabelChunks`: where they lie less than 256 KiB apart, in one
read of what lies between, the images of small row groups read through and dropped; and where
the image column is dictionary-encoded, the page headers and dictionary indices of 8 of its row
groups: the bytes a row group holds read, each row's copy of a repeated image counted at its
size, `parquet_pages`). An image is read by
(file, row group, row) through `ParquetImages`, which keeps the image column of the last row
groups it read (LRU, `CACHE_BYTES` per process): a pass in order reads each row group once, and
so does train's shuffled order, which takes row groups in random order and shuffles the images
of as many of them as the cache holds together (`ParquetImages.blocks`, `core.train.loaders`),
and so does `convert shards`' shuffle, whose samples are read a window at a time in file order
(`core.convert.shards._read_in_windows`).
"""

from __future__ import annotations

import bisect
import io
import json
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from torchkit.core.data.sources.csv_index import class_order
from torchkit.core.data.sources.discovery import warn_unlistable
from torchkit.core.data.sources.samples import (
    Samples,
    class_index,
    find_class,
    index_class_names,
    partial_labels_are_kept,
)
from torchkit.core.data.sources.source import DataSource, _split_source, concatenate, relabelled
from torchkit.core.data.sources.splitting import SPLIT_NAMES, refuse_mixed_splits
from torchkit.core.data.stored_image import (
    Blocks,
    Stamp,
    StoredImage,
    check_unchanged,
    file_stamp,
    kept_reader,
)
from torchkit.core.io.errors import InputError, first_line
from torchkit.core.io.file_kinds import file_kind
from torchkit.core.io.non_utf8_names import name_native_code_opens
from torchkit.core.io.records import read_record_json
from torchkit.core.runtime.fork_safe import ForkSafeLock

SUFFIX = ".parquet"
# HF's split keywords (datasets.data_files.SPLIT_KEYWORDS) -> torchkit's split names.
SPLIT_KEYWORDS = {
    "train": "train",
    "training": "train",
    "validation": "val",
    "valid": "val",
    "dev": "val",
    "val": "val",
    "test": "test",
    "testing": "test",
    "eval": "test",
    "evaluation": "test",
}
# A file named for a split: the keyword, then a separator or a digit (`train-00000-of-00002`).
_SPLIT_FILE = re.compile(r"^(" + "|".join(SPLIT_KEYWORDS) + r")(?:[-._ 0-9].*)?$", re.IGNORECASE)
IMAGE_COLUMNS = ("image", "img")
LABEL_COLUMN = "label"
# The row groups of a file whose page headers `_image_bytes_read` reads at most.
SAMPLED_ROW_GROUPS = 8
# The decoded image columns a process keeps (oldest dropped first; the last one always kept).
CACHE_BYTES = 128 << 20
_NEEDED_FOR = "reading parquet files"
# The threads of a process share its readers (`convert shards` reads ahead in threads): their
# open files, pyarrow readers and caches are used under this lock. Read at once from two
# threads, one pyarrow reader (or a fresh process's state, reset by one thread while another
# read) crashed the process: "double free or corruption", segmentation faults. A forked
# child's own lock: one another thread held at the fork is never released.
_reading = ForkSafeLock()
log = logging.getLogger("torchkit")


class NullImage(OSError):
    """A row whose image is null: counted as an unreadable image, with this reason."""


class ParquetImages:
    """Reads images of parquet files by (file index, row group, row in group). Picklable; each
    process opens its own files and keeps its own cache (keyed by pid: nothing crosses a fork).
    `stamps`: each listed file's `file_stamp`, which the file read must still have
    (`check_unchanged`: a file written again holds other rows where the listing found them)."""

    def __init__(
        self,
        files: Sequence[str],
        columns: Sequence[str],
        group_bytes: Sequence[Sequence[int]] = (),
        stamps: Sequence[Stamp | None] = (),
    ) -> None:
        self.files = list(files)
        self.columns = list(columns)  # the image column of each file
        # The bytes each row group's image column holds read (`_image_bytes_read`), per file.
        self.group_bytes = [list(sizes) for sizes in group_bytes]
        self.stamps = list(stamps) or [None] * len(self.files)
        self._pid = -1
        self._opened: dict[int, Any] = {}
        self._cache: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._cached_bytes = 0
        # The `path` fields of the last row group a null image was found in (`_image_paths`).
        self._paths: tuple[tuple[int, int], Any] | None = None

    def __getstate__(self) -> dict:
        return {
            "files": self.files,
            "columns": self.columns,
            "group_bytes": self.group_bytes,
            "stamps": self.stamps,
        }

    def __setstate__(self, state: dict) -> None:
        self.__init__(
            state["files"], state["columns"], state.get("group_bytes", ()), state.get("stamps", ())
        )

    def __reduce__(self) -> tuple[Any, tuple[type, dict]]:
        # Unpickled as this process's reader of the same files: a copy of its own for each
        # chunk of images a worker is sent read a row group again for every chunk of its rows
        # (dataset-stats: 40,000 images in one row group, 232 s where row groups of 1,000 took 7).
        return (kept_reader, (ParquetImages, self.__getstate__()))

    def release(self) -> None:
        """`close`, where this process opened the files (a forked copy's are its parent's)."""
        with _reading:
            if self._pid == os.getpid():
                self.close()

    def blocks(self, locators: Sequence[tuple[int, int, int]]) -> Blocks:
        """The row group of each image (numbered in order of first appearance) and its size:
        an order that keeps to as many row groups at a time as fit in the cache together reads
        each one once (`stored.read_blocks`)."""
        number: dict[tuple[int, int], int] = {}
        ids = [number.setdefault((file, group), len(number)) for file, group, _ in locators]
        if not self.group_bytes:
            return Blocks(ids, 1)
        # An eighth to spare: the cached array also holds offsets, the footer's figure not.
        sizes = [size + size // 8 for size in (self.group_bytes[f][g] for f, g in number)]
        largest = max(sizes, default=0)
        window = CACHE_BYTES // largest if largest > 0 else 1
        return Blocks(ids, max(1, window), sizes=sizes, capacity=CACHE_BYTES)

    def close(self) -> None:
        """Close the files this process opened and drop the row groups it cached (a later
        read opens and reads again)."""
        for source, _ in self._opened.values():
            source.close()
        self.__init__(self.files, self.columns, self.group_bytes, self.stamps)

    def read(self, locator: tuple[int, int, int]) -> bytes:
        file, group, row = locator
        with _reading:
            images = self._row_group(file, group)
        value = images[row].as_py()
        if value is None:
            raise NullImage(self._null_reason(file, group, row))
        return value

    def _null_reason(self, file: int, group: int, row: int) -> str:
        """Why a row has no image bytes: an HF Image of a `path` alone (a dataset saved without
        its images embedded) says which file it names, which torchkit does not open."""
        with _reading:
            paths = self._image_paths(file, group)
        path = None if paths is None else paths[row].as_py()
        if not path:
            return "the row's image is null (no bytes)"
        return (
            f"the row's image has no bytes, only a path ({path}), which torchkit does not open: "
            "save the dataset with its images embedded"
        )

    def _image_paths(self, file: int, group: int) -> Any:
        """The `path` field of a row group's images (None where they have none), that of the
        last row group asked for kept: a dataset saved without its images embedded has a null
        image in every row, and reading its row group again for each took time growing with
        the square of its rows. Called under `_reading`."""
        if self._paths is not None and self._paths[0] == (file, group):
            return self._paths[1]
        pa = import_extra_pyarrow()
        try:
            _, handle = self._opened[file]
            images = _group_column(handle, group, self.columns[file])
            where = images.type.get_field_index("path") if pa.types.is_struct(images.type) else -1
            paths = _one_array(images.flatten()[where]) if where >= 0 else None
        except (KeyError, OSError, pa.ArrowException):
            paths = None
        self._paths = ((file, group), paths)
        return paths

    def _row_group(self, file: int, group: int) -> Any:
        """The image bytes of one row group (a pyarrow binary array, nulls where the image or
        its bytes are null), from the cache or read; called under `_reading`."""
        if self._pid != os.getpid():  # a fresh process (or a fork): nothing inherited
            self.__init__(self.files, self.columns, self.group_bytes, self.stamps)
            self._pid = os.getpid()
        key = (file, group)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        pa = import_extra_pyarrow()
        try:
            opened = self._opened.get(file)
            if opened is None:
                source = open(self.files[file], "rb")  # noqa: SIM115 (held open, as pyarrow holds it)
                opened = self._opened[file] = (source, _parquet_file(source))
            source, handle = opened
            check_unchanged(source.fileno(), self.stamps[file], self.files[file])
            images = _one_array(image_bytes(_group_column(handle, group, self.columns[file])))
        except (OSError, pa.ArrowException) as error:
            raise OSError(
                f"cannot read row group {group} of {self.files[file]}: {first_line(error)}"
            ) from None
        self._cache[key] = images
        self._cached_bytes += images.nbytes
        while self._cached_bytes > CACHE_BYTES and len(self._cache) > 1:
            _, dropped = self._cache.popitem(last=False)
            self._cached_bytes -= dropped.nbytes
        return images


def import_extra_pyarrow() -> Any:
    """pyarrow with its parquet module, or the one error naming the `parquet` extra."""
    from torchkit.core.runtime.extras import import_extra

    import_extra("pyarrow.parquet", "parquet", _NEEDED_FOR)
    return import_extra("pyarrow", "parquet", _NEEDED_FOR)


def _parquet_file(path: str | BinaryIO) -> Any:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path)


# Rows a row group past 2 GiB of images is read in at a time (`_group_column`): 16 images of
# up to 128 MiB each stay within the 2 GiB an Arrow array of `binary` holds.
_BATCH_ROWS = 16


def _group_column(handle: Any, group: int, column: str) -> Any:
    """The column `column` of one row group, a chunked array. An Arrow array of `binary` holds
    at most 2 GiB: pyarrow reads a larger row group's `binary` column in chunks (which cannot
    be joined into one array) and refuses a struct column such as HF's Image past that size
    ("Nested data conversions not implemented for chunked array outputs"), which it reads
    only in batches. Read whole, every image of such a row group (what pyarrow's and pandas'
    defaults write: up to a million rows a group) was unreadable, and each read of one read
    its gigabytes again."""
    import pyarrow as pa

    try:
        return handle.read_row_group(group, columns=[column], use_threads=False).column(0)
    except (pa.ArrowNotImplementedError, pa.ArrowCapacityError):
        batches = handle.iter_batches(
            batch_size=_BATCH_ROWS, row_groups=[group], columns=[column], use_threads=False
        )
        kind = handle.schema_arrow.field(column).type
        return pa.chunked_array([batch.column(0) for batch in batches], type=kind)


def _one_array(column: Any) -> Any:
    """A chunked array of one chunk as that array (indexed faster); others as they are."""
    import pyarrow as pa

    one = isinstance(column, pa.ChunkedArray) and column.num_chunks == 1
    return column.chunk(0) if one else column


def image_bytes(column: Any) -> Any:
    """The bytes of an image column (a struct with `bytes`, or binary; an array or a chunked
    array) as binary, null where the struct or its bytes are."""
    import pyarrow as pa

    if pa.types.is_struct(column.type):
        return column.flatten()[column.type.get_field_index("bytes")]
    return column


# ------------------------------------------------------------------------------ what spec names


def open_stored(
    spec: str, classes: Sequence[str] | None, allow_unlabelled: bool, every_image: bool = False
) -> DataSource | None:
    """The parquet data `spec` names, or None when it names none (from names only).
    (`every_image` concerns folder layouts, which parquet rows have not.)"""
    found = _parquet_files(spec)
    if found is None:
        return None
    root, relative, kind = found
    import_extra_pyarrow()
    if kind == "parquet file":
        return _read(spec, kind, root, relative, None, classes, allow_unlabelled)
    splits = [split_of(name) for name in relative]
    if all(split is None for split in splits):
        _refuse_splits_named_otherwise(spec, relative)
        return _read(spec, "parquet", root, relative, None, classes, allow_unlabelled)
    unsplit = [name for name, split in zip(relative, splits, strict=True) if split is None]
    if unsplit:
        raise InputError(
            f"{spec} mixes parquet files of splits with files of none ({', '.join(unsplit[:3])})",
            "name every file for its split, as train-*, validation-* or test-*, or none; or "
            "give one file",
        )
    return _read(spec, "split parquet", root, relative, splits, classes, allow_unlabelled)


def _parquet_files(spec: str) -> tuple[str, list[str], str] | None:
    """(root, parquet files relative to it, sorted, "parquet file" | "folder") or None."""
    path = Path(spec)
    if path.suffix.lower() == SUFFIX and path.is_file():
        return str(path.parent), [path.name], "parquet file"
    if not path.is_dir():
        return None
    unlistable: list[tuple[str, OSError]] = []
    listings: dict[Path, list[str]] = {}

    def listing(folder: Path) -> list[str]:
        if folder not in listings:
            listings[folder] = _listing(folder, unlistable)
        return listings[folder]

    places = [path, path / "data"]
    for base in (path, path / "data"):
        places += [base / name for name in listing(base) if name.lower() in SPLIT_KEYWORDS]
    named = [
        place / name
        for place in dict.fromkeys(places)
        for name in listing(place)
        if name.lower().endswith(SUFFIX) and not name.startswith(".")
    ]
    relative = sorted(os.path.relpath(file, path) for file in named if file.is_file())
    if not relative:
        return None
    # A parquet dataset, which its reader names what it cannot read of: a FIFO, socket or
    # device named like a parquet file (never opened: opening a FIFO blocks), a folder of it
    # that cannot be listed; both were passed over without a word.
    for file in named:
        if not file.is_file() and file.exists() and not file.is_dir():
            raise InputError(
                f"{file} is not a regular file ({file_kind(os.stat(file).st_mode)})",
                "a parquet dataset is .parquet files: move it out of the folder, or give one file",
            )
    warn_unlistable(unlistable, path)
    return str(path), relative, "folder"


def _listing(folder: Path, unlistable: list[tuple[str, OSError]]) -> list[str]:
    """The names in `folder`, sorted ([] where it is no folder); one that cannot be listed is
    added to `unlistable` with its error."""
    try:
        return sorted(os.listdir(folder)) if folder.is_dir() else []
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as error:
        unlistable.append((str(folder), error))
        return []


# A split's keyword as a word of a file's name, not at its start (`cifar10-train.parquet`):
# HF's datasets reads such files as that split.
_SPLIT_WORD = re.compile(
    r"(?:^|[-._ 0-9])(" + "|".join(SPLIT_KEYWORDS) + r")(?=[-._ 0-9]|$)", re.IGNORECASE
)


def _refuse_splits_named_otherwise(spec: str, relative: list[str]) -> None:
    """InputError where the files of an unsplit folder name two splits in words of their names
    (`cifar10-train.parquet` beside `cifar10-test.parquet`, which HF's datasets reads as two
    splits): read as one dataset, train trained on the test images too, holding out a tenth of
    both, and dataset-stats measured both as one, without a word."""

    def split_of(name: str) -> str | None:
        word = _SPLIT_WORD.search(Path(name).name[: -len(SUFFIX)])
        return None if word is None else SPLIT_KEYWORDS[word.group(1).lower()]

    refuse_mixed_splits(
        spec,
        relative,
        split_of,
        files="parquet files",
        named="named in the middle of their names",
        hint="name each file for its split first, as HF writes them: train-00000-of-00001.parquet, "
        "test-...; or give one file",
    )


def split_of(relative: str) -> str | None:
    """The split a parquet file's path (relative to the dataset folder) names, HF's way: its
    folder (`train/`, `data/validation/`) or its name (`test-00000-of-00001.parquet`)."""
    parts = Path(relative).parts
    if parts[0] == "data" and len(parts) > 1:
        parts = parts[1:]
    if len(parts) > 1:
        return SPLIT_KEYWORDS.get(parts[0].lower())
    match = _SPLIT_FILE.match(Path(parts[0]).stem)
    return SPLIT_KEYWORDS[match.group(1).lower()] if match else None


# ------------------------------------------------------------------------------ reading the index


class _File:
    """What opening one parquet file learnt: its rows' locators, labels and columns."""

    def __init__(self, root: str, relative: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.relative = relative
        self.path = relative if root == "." else os.path.join(root, relative)
        try:
            self.stamp = file_stamp(os.stat(self.path))
            # pyarrow takes a name as UTF-8 text: one that is not UTF-8 by its descriptor
            with name_native_code_opens(self.path) as name:
                handle = pq.ParquetFile(name)  # opens the file itself, read from here on
            schema = handle.schema_arrow
        except (OSError, pa.ArrowException) as error:
            raise InputError(
                f"cannot read {self.path}: {first_line(error)}",
                "check the file: a download cut short, or not parquet",
            ) from None
        self.column_names = list(schema.names)
        self.features = _hf_features(schema)
        candidates = _image_columns(schema, self.features)
        if not candidates:
            raise InputError(
                f"{self.path} has no image column (its columns: {', '.join(schema.names)})",
                "images are an `image` column of binary, or of HF's Image type: a {bytes, path} "
                "struct",
            )
        self.image_column = candidates[0]
        self.other_image_columns = _rival_image_columns(candidates, self.features)
        self.label_column = _label_column(schema, self.features)
        # From the column's type, not its values: a file of no rows has labels of a kind too.
        self.string_labels = self.label_column is not None and _is_string(
            _label_type(schema.field(self.label_column).type)
        )
        metadata = handle.metadata
        self.locators = [
            (group, row)
            for group in range(metadata.num_row_groups)
            for row in range(metadata.row_group(group).num_rows)
        ]
        self.group_bytes = _image_bytes_read(self.path, metadata, self.image_column)
        self.labels: list[Any] | None = None
        # Why a `label` column of another type (pandas' float64 of an int column with a
        # missing value, bools) is no labels: said, never silently read as unlabelled data.
        self.label_problem: str | None = None
        if self.label_column is not None:
            self.labels = self._read_labels(handle, self.label_column)
            if self.string_labels:
                self._refuse_empty_names()
            else:
                self._refuse_negative_indices()
        elif LABEL_COLUMN in schema.names:
            kind = _label_type(schema.field(LABEL_COLUMN).type)
            labels = self._read_labels(handle, LABEL_COLUMN) if pa.types.is_floating(kind) else []
            if labels and all(isinstance(x, float) and x.is_integer() for x in labels):
                # Whole numbers, none missing: class indices stored as floats.
                self.label_column, self.labels = LABEL_COLUMN, [int(x) for x in labels]
                self._refuse_negative_indices()
            else:
                self.label_problem = (
                    f"the label column of {self.path} is {kind}, not integers or class names"
                )
        self.names = _class_names(self.features, self.label_column, self.path)

    def _read_labels(self, handle: Any, column: str) -> list[Any]:
        """The values of `column`, its chunks read beforehand in few reads (`LabelChunks`):
        pyarrow reads a column one row group at a time (joining chunks less than 8 KiB apart):
        2,500 reads for a file of 2,500 row groups of a few images each, a seek each on a disk
        (25 s at 10 ms) or a round trip on a network file system."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            with LabelChunks(self.path, handle.metadata, column) as chunks:
                # Each chunk read as it is held (pyarrow's own pre-buffering would join near
                # chunks, with the bytes between them, which are not held).
                read = pq.ParquetFile(chunks, metadata=handle.metadata, pre_buffer=False)
                return read.read(columns=[column], use_threads=False).column(0).to_pylist()
        except (OSError, pa.ArrowException) as error:
            raise InputError(f"cannot read {self.path}: {first_line(error)}") from None

    def _refuse_empty_names(self) -> None:
        """An empty class name ("") is an error naming its rows, as in a CSV index or a shard's
        KEY.json: class "" is what torchkit calls unlabelled images, and such rows trained as
        a class of that name (null is the way to leave a row unlabelled)."""
        empty = [row for row, label in enumerate(self.labels or ()) if label == ""]
        if empty:
            raise InputError(
                f"{self.path} has {len(empty)} row(s) with an empty label "
                f"(row {_first_rows(empty)})",
                "give each row its class name, or null for a row without a label",
            )

    def _refuse_negative_indices(self) -> None:
        """A class index below -1 (HF's "no label") is an error naming its rows, as a shard's
        -2 is: such rows were read as unlabelled, silently by dataset-stats, and train's error
        called them null or -1."""
        below = [row for row, label in enumerate(self.labels or ()) if label is not None
                 and label < -1]  # fmt: skip
        if below:
            raise InputError(
                f"{self.path} has {len(below)} row(s) labelled {self.labels[below[0]]}, not a "
                f"class index (row {_first_rows(below)})",
                "labels are class indices 0, 1, ..., and -1 or null for a row without a label",
            )

    def missing_labels(self) -> list[int]:
        """Rows without a label: null, or negative (HF's -1 for "no label")."""
        if self.labels is None:
            return list(range(len(self.locators)))
        return [
            row
            for row, label in enumerate(self.labels)
            if label is None or (isinstance(label, int) and label < 0)
        ]


# Chunks of a column closer than this are read in one read, the bytes between (other columns')
# read through and dropped: a seek on a disk (~10 ms) costs as much time as reading ~1 MB.
LABEL_HOLE_BYTES = 256 << 10
# One read at most this long, unless one chunk is longer (the memory a read holds at once).
LABEL_READ_BYTES = 8 << 20


class LabelChunks(io.RawIOBase):
    """A parquet file as pyarrow reads one column of it (a file object for `pq.ParquetFile`):
    the column's chunks are read when it is made, in few reads (chunks less than
    `LABEL_HOLE_BYTES` apart in one, up to `LABEL_READ_BYTES`), and only their bytes kept;
    a read elsewhere (none expected: the footer is given as metadata) reads the file."""

    def __init__(self, path: str, metadata: Any, column: str) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        self._size = os.fstat(self._fd).st_size
        self._position = 0
        leaves = [i for i in range(metadata.num_columns)
                  if (path_ := metadata.schema.column(i).path) == column
                  or path_.startswith(column + ".")]  # fmt: skip
        ranges = sorted(
            _chunk_range(metadata.row_group(g).column(i))
            for g in range(metadata.num_row_groups)
            for i in leaves
        )
        self._starts: list[int] = []
        self._chunks: list[bytes] = []
        try:
            for start, end, members in _coalesced(ranges):
                data = self._pread(end - start, start)
                for first, last in members:
                    self._starts.append(first)
                    self._chunks.append(data[first - start : last - start])
        except BaseException:
            os.close(self._fd)
            raise

    def _pread(self, size: int, offset: int) -> bytes:
        if hasattr(os, "pread"):
            return os.pread(self._fd, size, offset)
        os.lseek(self._fd, offset, os.SEEK_SET)  # Windows: no pread
        return os.read(self._fd, size)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        self._position = base + offset
        return self._position

    def read(self, size: int = -1) -> bytes:
        start = self._position
        size = self._size - start if size is None or size < 0 else size
        at = bisect.bisect_right(self._starts, start) - 1
        if at >= 0 and start + size <= self._starts[at] + len(self._chunks[at]):
            offset = start - self._starts[at]
            data = self._chunks[at][offset : offset + size]
        else:
            data = self._pread(size, start)
        self._position += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
            self._chunks = []
        super().close()


def _chunk_range(chunk: Any) -> tuple[int, int]:
    """The bytes [start, end) of a column chunk, its dictionary page first (as pyarrow reads
    it: a dictionary offset of 0 is a writer's placeholder, not the file's first byte)."""
    start = chunk.data_page_offset
    dictionary = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
    if dictionary is not None and 0 < dictionary < start:
        start = dictionary
    return start, start + chunk.total_compressed_size


def _coalesced(
    ranges: list[tuple[int, int]],
) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Sorted byte ranges as reads: (start, end, the ranges it holds)."""
    reads: list[tuple[int, int, list[tuple[int, int]]]] = []
    for start, end in ranges:
        if reads:
            first, last, members = reads[-1]
            if start - last <= LABEL_HOLE_BYTES and max(end, last) - first <= LABEL_READ_BYTES:
                members.append((start, end))
                reads[-1] = (first, max(end, last), members)
                continue
        reads.append((start, end, [(start, end)]))
    return reads


def _image_bytes_read(path: str, metadata: Any, column: str) -> list[int]:
    """The bytes `column` (all its leaves: an Image's bytes and path) of each row group holds
    once read: the footer's uncompressed size, or more where dictionary-encoded values repeat
    (`parquet_pages`: 10,000 rows of 50 distinct images were counted as 50 images, and a
    window of `convert shards`, train's shuffle and the room for a spill were planned for that
    much). The page headers and dictionary indices of `SAMPLED_ROW_GROUPS` row groups at most
    are read, spread over the file, each other one counted at its footer's size times the
    ratio found in the nearest (each walk is a read or two: 2,500 row groups took 15,000, a
    seek each on a cold disk or a round trip on a network file system). The footer's sizes
    alone where the file cannot be opened again."""
    from torchkit.core.data.sources.parquet_pages import decoded_chunk_bytes

    groups = [metadata.row_group(group) for group in range(metadata.num_row_groups)]
    leaves = {
        i: leaf for i in range(metadata.num_columns)
        if (leaf := metadata.schema.column(i)).path == column or leaf.path.startswith(column + ".")
    }  # fmt: skip
    chunks = [[group.column(i) for i in leaves] for group in groups]
    stored = [sum(chunk.total_uncompressed_size for chunk in group) for group in chunks]
    encoded = [g for g, group in enumerate(chunks) if any(c.has_dictionary_page for c in group)]
    if not encoded:
        return stored
    sampled = encoded
    if len(encoded) > SAMPLED_ROW_GROUPS:  # the first, the last and between, evenly
        step = (len(encoded) - 1) / (SAMPLED_ROW_GROUPS - 1)
        sampled = [encoded[round(i * step)] for i in range(SAMPLED_ROW_GROUPS)]
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return stored
    try:
        read = {
            g: sum(decoded_chunk_bytes(fd, chunk, leaf)  # each leaf's schema: its levels
                   for chunk, leaf in zip(chunks[g], leaves.values(), strict=True))
            for g in sampled
        }  # fmt: skip
    finally:
        os.close(fd)
    estimated = stored.copy()
    for g in encoded:
        if g in read:
            estimated[g] = read[g]
        else:  # as the nearest sampled: a file's parts can differ (a run of repeated images)
            nearest = min(sampled, key=lambda s: abs(s - g))
            estimated[g] = round(stored[g] * read[nearest] / max(1, stored[nearest]))
    return estimated


def _hf_features(schema: Any) -> dict:
    """The `features` of HF's metadata in a parquet schema ({} without any)."""
    try:
        info = json.loads((schema.metadata or {}).get(b"huggingface", b"{}"))
        features = info.get("info", {}).get("features", {})
    except (ValueError, AttributeError):
        return {}
    return features if isinstance(features, dict) else {}


def _is_image_type(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_struct(kind):
        index = kind.get_field_index("bytes")
        return index >= 0 and _is_binary(kind.field(index).type)
    return _is_binary(kind)


def _is_binary(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _image_columns(schema: Any, features: dict) -> list[str]:
    """The columns that can hold the images, the one read first (see the module's docstring)."""

    def usable(name: str) -> bool:
        return name in schema.names and _is_image_type(schema.field(name).type)

    named = [name for name in IMAGE_COLUMNS if usable(name)]
    named += [n for n, f in features.items() if _feature_type(f) == "Image" and usable(n)]
    import pyarrow as pa

    named += [n for n in schema.names if pa.types.is_struct(schema.field(n).type) and usable(n)]
    return list(dict.fromkeys(named))


def _rival_image_columns(candidates: list[str], features: dict) -> list[str]:
    """The columns of `candidates` (`_image_columns`) besides the one read that could be the
    images, where the choice is not by name (`_warn_of_unnamed_choice`): HF's metadata calls
    another column an Image too, or nothing tells them apart; never one it types otherwise
    (an Audio is the same {bytes, path} struct)."""
    chosen, others = candidates[0], candidates[1:]
    if chosen in IMAGE_COLUMNS:
        return []
    rivals = ("Image",) if _feature_type(features.get(chosen)) is not None else (None, "Image")
    return [name for name in others if _feature_type(features.get(name)) in rivals]


def _warn_of_unnamed_choice(files: list[_File]) -> None:
    """Images read from the first of several image columns none of which is named `image` or
    `img` (a pair's `left` and `right`, a `photo` beside its `mask`): said once, naming the
    column read, where it was read without a word."""
    for file in files:
        if file.other_image_columns:
            log.warning(
                "%s has %d image columns (%s): its images are read from %s, the first (name "
                "the column to read `image`)",
                file.path,
                len(file.other_image_columns) + 1,
                ", ".join([file.image_column, *file.other_image_columns]),
                file.image_column,
            )
            return


def _feature_type(feature: Any) -> str | None:
    return feature.get("_type") if isinstance(feature, dict) else None


def _label_type(kind: Any) -> Any:
    """A label column's type, a dictionary's values for a dictionary-encoded column (pandas'
    categoricals): its values are read (to_pylist), not its codes."""
    import pyarrow as pa

    return kind.value_type if pa.types.is_dictionary(kind) else kind


def _is_string(kind: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _label_column(schema: Any, features: dict) -> str | None:
    import pyarrow as pa

    def usable(name: str) -> bool:
        kind = _label_type(schema.field(name).type) if name in schema.names else None
        return kind is not None and (pa.types.is_integer(kind) or _is_string(kind))

    if usable(LABEL_COLUMN):
        return LABEL_COLUMN
    for name, feature in features.items():
        if _feature_type(feature) == "ClassLabel" and usable(name):
            return name
    return None


def _class_names(features: dict, column: str | None, where: str) -> list[str] | None:
    """The ClassLabel names of `column` in HF's `features` (of `where`: a parquet file's
    schema, or dataset_info.json). A number is named as HF's `int2str` names it (`str`); a
    null, true/false, a list or an object is no name (it was class "None", "True", "[...]"):
    an InputError naming `where` and the class."""
    feature = features.get(column) if column else None
    names = feature.get("names") if _feature_type(feature) == "ClassLabel" else None
    if not isinstance(names, list) or not names:
        return None
    for index, name in enumerate(names):
        if not isinstance(name, (str, int, float)) or isinstance(name, bool):
            shown = json.dumps(name)  # as the metadata spells it: null, true, [...]
            shown = shown if len(shown) <= 40 else f"{shown[:37]}..."
            raise InputError(
                f"the ClassLabel names of {where} give class {index} {shown}, not a name",
                "give every class a name in the ClassLabel feature of the dataset's metadata",
            )
    return [str(name) for name in names]


def _dataset_info_names(root: str, column: str | None) -> list[str] | None:
    """Class names from `ROOT/dataset_info.json` (what HF's save_to_disk writes)."""
    path = os.path.join(root, "dataset_info.json")
    try:
        info = read_record_json(path)  # a FIFO under its name: no names, never a wait
        features = info.get("features", {}) if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return None
    return _class_names(features if isinstance(features, dict) else {}, column, path)


def _warn_of_large_row_groups(files: list[_File]) -> None:
    """An image is read with its whole row group (parquet reads no less), held while its
    neighbours are read: a row group larger than `CACHE_BYTES` (pyarrow's default writes a
    million rows in one) puts that much in memory in every process that reads images, each
    DataLoader worker included. Said once, with the remedy."""
    largest = max(((size, f) for f in files for size in f.group_bytes), default=None,
                  key=lambda item: item[0])  # fmt: skip
    if largest is None or largest[0] <= CACHE_BYTES:
        return
    size, file = largest
    log.warning(
        "%s has row groups of up to %d MB of images: each process that reads images, every "
        "loader worker included, holds a whole row group in memory (rewrite the file with "
        "smaller row groups, e.g. `pyarrow.parquet.write_table(..., row_group_size=1000)`)",
        file.path,
        size >> 20,
    )


def _read(
    spec: str,
    kind: str,
    root: str,
    relative: list[str],
    splits: list[str | None] | None,
    classes: Sequence[str] | None,
    allow_unlabelled: bool,
) -> DataSource:
    files = [_File(root, name) for name in relative]
    _warn_of_unnamed_choice(files)
    _warn_of_large_row_groups(files)
    # `convert shards`: the labels of partly labelled data kept, the rows without one class "".
    keep = allow_unlabelled and partial_labels_are_kept()
    labelled_files = (
        _partly_labelled_files(files) if keep else _labelled_files(files, splits, allow_unlabelled)
    )
    with_labels = {id(file) for file in labelled_files}
    if labelled_files:
        chosen = [i for i, file in enumerate(files) if id(file) in with_labels]
        chosen_splits = [splits[i] for i in chosen] if splits is not None else None
        names, stated = _names(spec, root, labelled_files, chosen_splits)
    else:
        names, stated = [""], False
    # Kept partial labels: the rows of the labelled files without one (else there are none).
    unlabelled_rows = {id(f): set(f.missing_labels()) for f in labelled_files} if keep else {}
    some_unlabelled = (
        keep
        and bool(labelled_files)
        and (len(labelled_files) < len(files) or any(unlabelled_rows.values()))
    )
    if some_unlabelled:
        names = [*names, ""]  # the class of the rows without a label
    reader = ParquetImages(
        [f.path for f in files],
        [f.image_column for f in files],
        [f.group_bytes for f in files],
        [f.stamp for f in files],
    )
    index_of = class_index(names)  # a label in another Unicode spelling is its class too
    # One file is named by its path (as a CSV index is), not by its folder: `dataset-stats
    # x.parquet` titled its report "Dataset ." and refused `--plot p.png` as lying inside it.
    named = spec if kind == "parquet file" else root
    parts: dict[str, list[Samples]] = {}
    for index, file in enumerate(files):
        if id(file) in with_labels:
            labels = [find_class(index_of, x) if isinstance(x, str) else x for x in file.labels]
            for row in unlabelled_rows.get(id(file), ()):
                labels[row] = len(names) - 1  # some_unlabelled: class ""
            file_names = names
        elif some_unlabelled:  # one list of names for every file
            labels, file_names = [len(names) - 1] * len(file.locators), names
        else:
            labels, file_names = [0] * len(file.locators), [""]
        # ids FILE/ROW (ROW: the row in the file); names as a file path would print.
        ids = [f"{file.relative}{os.sep}{row}" for row in range(len(file.locators))]
        paths = [
            StoredImage(f"{file.path}{os.sep}{row}", reader, (index, group, in_group))
            for row, (group, in_group) in enumerate(file.locators)
        ]
        samples = Samples(list(file_names), labels, paths=paths, source=named, ids=ids)
        parts.setdefault(splits[index] if splits else "", []).append(samples)
    joined = {split: concatenate(members) for split, members in parts.items()}
    # Class indices are the data's own label order, and so are string labels HF's metadata
    # names; other string labels are sorted (`_names`).
    given = bool(labelled_files) and stated
    if splits is not None:
        ordered = {name: joined[name] for name in SPLIT_NAMES if name in joined}
        # A split whose files hold no row (a validation file of 0 rows) is no split, as an
        # empty split folder is (`DataSource.empty_splits`): dataset-stats stopped on it with
        # an IndexError, and train with "the validation set is empty".
        empty = {name: _files_of(files, splits, name) for name, part in ordered.items()
                 if not len(part)}  # fmt: skip
        if len(empty) == len(ordered):
            raise InputError(f"no rows in {spec}", "the parquet files hold no images")
        ordered = {name: part for name, part in ordered.items() if name not in empty}
        source = _split_source(spec, kind, root, ordered, classes)
        source.classes_given = given
        source.empty_splits = empty
        return source
    samples = joined[""]
    if not len(samples):
        raise InputError(f"no rows in {spec}", "the parquet files hold no images")
    if classes is not None and labelled_files:
        samples = relabelled(samples, classes, spec)
    return DataSource(spec, kind, root, {}, samples, list(samples.classes), given)


_CAST_HINT = "a column with missing labels? cast it to int or drop those rows"


def _files_of(files: list[_File], splits: list[str | None], split: str) -> str:
    """The files of `split` as messages name them: `D/val.parquet` (and 2 more)."""
    paths = [file.path for file, name in zip(files, splits, strict=True) if name == split]
    return paths[0] + (f" (and {len(paths) - 1} more)" if len(paths) > 1 else "")


def _labelled_files(
    files: list[_File], splits: list[str | None] | None, allow_unlabelled: bool
) -> list[_File]:
    """The files read with their labels: all, or (where unlabelled images are taken) none; of
    split data, the files of each split whose rows all have a label (HF's unlabelled test
    split beside labelled train and validation splits: its images unlabelled, as shards read
    such a split, and the other splits' labels kept)."""
    if splits is None or not allow_unlabelled:
        return list(files) if _labelled(files, allow_unlabelled) else []
    chosen = []
    for split in dict.fromkeys(splits):
        members = [f for f, s in zip(files, splits, strict=True) if s == split]
        if _labelled(members, allow_unlabelled):
            chosen += members
    return chosen


def _partly_labelled_files(files: list[_File]) -> list[_File]:
    """The files whose labels are read where those of partly labelled data are kept: each
    with a label column some row has a label in (a column of another type is warned of)."""
    for file in files:
        if file.label_problem is not None:
            log.warning("%s: its images are read unlabelled (%s)", file.label_problem, _CAST_HINT)
    return [
        file
        for file in files
        if file.labels is not None and len(file.missing_labels()) < len(file.locators)
    ]


def _labelled(files: list[_File], allow_unlabelled: bool) -> bool:
    """Whether the data is read with its labels; InputError for rows without one where labels
    are needed."""
    for file in files:
        missing = file.missing_labels()
        if not missing:
            continue
        if file.label_problem is not None and allow_unlabelled:
            log.warning("%s: its images are read unlabelled (%s)", file.label_problem, _CAST_HINT)
        elif allow_unlabelled and len(missing) < len(file.locators):
            # Some rows labelled, some not: all read unlabelled, said (their class counts go).
            log.warning(
                "%s has %d row(s) without a label (null or -1; row %s) among %d labelled ones: "
                "its images are read unlabelled",
                file.path,
                len(missing),
                _first_rows(missing),
                len(file.locators) - len(missing),
            )
        if allow_unlabelled:
            return False
        if file.label_problem is not None:
            raise InputError(file.label_problem, _CAST_HINT)
        if file.label_column is None:
            raise InputError(
                f"{file.path} has no label column (its columns: {', '.join(file.column_names)})",
                "labels are a `label` column: HF's ClassLabel, class indices or class names",
            )
        raise InputError(
            f"{file.path} has {len(missing)} row(s) without a label (null or -1; row "
            f"{_first_rows(missing)})",
            "give labelled data, or predict or dataset-stats, which read unlabelled images",
        )
    return True


def _names(
    spec: str, root: str, files: list[_File], splits: list[str | None] | None
) -> tuple[list[str], bool]:
    """The class names in label order (see the module's docstring), from the rows that have
    a label, and whether the data states that order (class indices, or HF's names of string
    labels) rather than torchkit sorting the labels."""
    strings = [f for f in files if f.string_labels]
    if strings and len(strings) != len(files):
        raise InputError(f"{spec} mixes labels that are class names with class indices")
    found = {tuple(f.names) for f in files if f.names}
    if len(found) > 1:
        raise InputError(
            f"the parquet files of {spec} name different classes",
            "give the files of one dataset",
        )
    names = list(found.pop()) if found else _dataset_info_names(root, files[0].label_column)
    if strings:
        if names is not None:  # HF's ClassLabel order: class indices equal HF's
            if "" in names:
                _refuse_empty_class_name(spec, files, names.index(""))
            _refuse_unnamed_labels(files, names)
            return names, True
        labels = [label for f in files for label in f.labels if label is not None]
        order = None
        if splits is not None:
            order = [
                s for f, s in zip(files, splits, strict=True) for x in f.labels if x is not None
            ]
        return class_order(labels, order, spec), False
    largest = max((label for f in files for label in f.labels if label is not None), default=-1)
    if names is None:
        where = next((f.path for f in files if largest in f.labels), spec)
        hint = "name the classes: HF's ClassLabel, or ROOT/dataset_info.json"
        return index_class_names(largest, where, hint), True
    # A name given twice exactly (ImageNet's two "crane"s, in metadata HF's ClassLabel would
    # refuse but other writers do not) is two classes: the labels are their indices.
    if "" in names:
        _refuse_empty_class_name(spec, files, names.index(""))
    if largest >= len(names):
        where = next(f.path for f in files if largest in f.labels)
        raise InputError(
            f"{where} has label {largest}, but its data names {len(names)} classes",
            "labels are class indices 0..N-1 of HF's ClassLabel names",
        )
    return names, True


def _refuse_unnamed_labels(files: list[_File], names: list[str]) -> None:
    """A string label that none of HF's ClassLabel names is (`c` where they name a and b) is
    an error naming it, its rows and the names, as a class index past them is: it was read as
    a class of its own, and the classes ordered by the labels rather than by the metadata."""
    index_of = class_index(names)  # a label in another Unicode spelling is its class too
    for file in files:
        unnamed = [row for row, label in enumerate(file.labels or ())
                   if isinstance(label, str) and find_class(index_of, label) is None]  # fmt: skip
        if unnamed:
            label = file.labels[unnamed[0]]
            rows = [row for row in unnamed if file.labels[row] == label]
            shown = ", ".join(names[:10]) + (
                f" (and {len(names) - 10} more)" if len(names) > 10 else ""
            )
            raise InputError(
                f"{file.path} has {len(rows)} row(s) labelled {label!r}, a class its metadata "
                f"does not name (row {_first_rows(rows)}; it names {len(names)}: {shown})",
                "labels are HF's ClassLabel names: give each row one of them, or add the class "
                "to the ClassLabel feature",
            )


def _refuse_empty_class_name(spec: str, files: list[_File], empty: int) -> None:
    """An empty class name among HF's ClassLabel names (class `empty`) is an error naming the
    rows of that class, as an empty string label is: class "" is what torchkit calls unlabelled
    images, so its rows trained as a class of no name and printed with no label."""
    for file in files:
        rows = [row for row, label in enumerate(file.labels or ()) if label == empty]
        if rows:
            raise InputError(
                f"{file.path} has {len(rows)} row(s) of class {empty}, whose ClassLabel name is "
                f"empty (row {_first_rows(rows)})",
                "give every class a name in the ClassLabel feature of the dataset's metadata",
            )
    raise InputError(
        f"the ClassLabel names of {spec} name class {empty} with an empty name",
        "give every class a name in the ClassLabel feature of the dataset's metadata",
    )


def _first_rows(rows: list[int]) -> str:
    """`3, 8, 9, 12, 40, ...`: the first rows an error names."""
    return ", ".join(map(str, rows[:5])) + (", ..." if len(rows) > 5 else "")
