"""predict's rows as a Parquet file (`-o FILE.parquet`), written a row group at a time as the rows
come: memory holds one row group's values, however many images there are.

The columns are those of JSON Lines (class names as they are, `label_index` and `class_index_K`
beside them), typed: `class_index`, `label_index`, `class_index_K` int64; `probability`,
`probability_K`, `logit_N` float64 (the 9-digit values CSV and JSON write, read back the same;
a logit that is -inf or NaN as itself, where JSON has null);
every other column a string. What a row does not know is null, as JSON's null. The schema
carries pandas' metadata, so `pandas.read_parquet` reads the int64 columns as its nullable
`Int64` whether or not a row has a null in them (without it, one error row turns them into
float64).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence
from typing import IO, Any

from torchkit.core.runtime.extras import import_extra, require_extra

NEEDED_FOR = "writing Parquet (--format parquet)"
# A row group is written once it holds MOST_GROUP_ROWS rows or GROUP_BYTES of Arrow data (with
# --logits of 1,000 outputs, about 8,000 rows): row groups of a few hundred rows would give
# the file's footer (held in memory until the end) a column chunk's entry per column for each,
# some 100 KB per group with 1,000 columns. The rows come into Arrow columns CHUNK_VALUES
# values at a time: Python's values of a whole group would take four times the room.
GROUP_BYTES = 64 * 2**20
MOST_GROUP_ROWS = 65_536
CHUNK_VALUES = 2**18


def require_pyarrow() -> None:
    """The one-line error of a missing parquet extra, before any work (pyarrow itself is
    imported once the first rows are converted, after the loader's workers are forked)."""
    require_extra("pyarrow", "parquet", NEEDED_FOR)


def column_type(column: str) -> str:
    """The Parquet type of one of predict's columns: int64, float64 or string."""
    if column in ("class_index", "label_index") or column.startswith("class_index_"):
        return "int64"
    if column.startswith(("probability", "logit_")):
        return "float64"
    return "string"


# Each column type's entry in pandas' metadata (pandas_type, numpy_type): the one pandas itself
# writes for a DataFrame of nullable Int64, float64 and string columns.
PANDAS_TYPES = {
    "int64": ("int64", "Int64"),
    "float64": ("float64", "float64"),
    "string": ("unicode", "object"),
}


def pandas_metadata(columns: Sequence[str]) -> dict[str, Any]:
    """The `pandas` entry of the schema's metadata: no index, and the int64 columns as
    pandas' nullable Int64 (`pandas.read_parquet` then reads them so with or without nulls)."""
    entries = []
    for column in columns:
        pandas_type, numpy_type = PANDAS_TYPES[column_type(column)]
        entries.append(
            {
                "name": column,
                "field_name": column,
                "pandas_type": pandas_type,
                "numpy_type": numpy_type,
                "metadata": None,
            }
        )
    return {"index_columns": [], "column_indexes": [], "columns": entries}


def chunk_rows(columns: Sequence[str]) -> int:
    """The rows converted to Arrow columns at a time, for rows of `columns`."""
    return max(1, min(MOST_GROUP_ROWS, CHUNK_VALUES // max(1, len(columns))))


def write_parquet_rows(
    records: Iterable[Sequence[Any]], columns: Sequence[str], handle: IO[bytes]
) -> None:
    """Write `records` (lists of values in the order of `columns`, None where a row has no
    value) to the binary file `handle` as Parquet, a row group every MOST_GROUP_ROWS rows or
    GROUP_BYTES of data, whichever comes first; an empty run still writes a file with the
    columns. A write error (a full disk) comes out as the OSError it is."""
    columns = list(columns)
    chunk = chunk_rows(columns)
    pending: list[Sequence[Any]] = []  # rows still Python values: fewer than `chunk`
    group: list[Any] = []  # the Arrow record batches of the row group being gathered
    group_rows = group_bytes = 0
    pa = schema = writer = None

    def convert() -> None:
        nonlocal pa, schema, group_rows, group_bytes
        if pa is None:
            pa = _pyarrow()
            metadata = {"pandas": json.dumps(pandas_metadata(columns))}
            fields = [(column, getattr(pa, column_type(column))()) for column in columns]
            schema = pa.schema(fields, metadata=metadata)
        batch = _batch(pa, schema, pending)
        pending.clear()
        group.append(batch)
        group_rows += batch.num_rows
        group_bytes += batch.get_total_buffer_size()

    def write_group() -> None:
        nonlocal writer, group_rows, group_bytes
        if writer is None:
            import pyarrow.parquet as pq

            writer = pq.ParquetWriter(handle, schema)
        table = pa.Table.from_batches(group, schema)
        group.clear()
        writer.write_table(table, row_group_size=max(1, group_rows))
        group_rows = group_bytes = 0

    try:
        for record in records:
            pending.append(record)
            if len(pending) >= min(chunk, MOST_GROUP_ROWS - group_rows):
                convert()
                if group_rows >= MOST_GROUP_ROWS or group_bytes >= GROUP_BYTES:
                    write_group()
        if pending or (writer is None and not group):  # no rows: a file with the columns
            convert()
        if group:
            write_group()
    except BaseException:
        if writer is not None:  # its footer, into a file that is discarded; no second error
            with contextlib.suppress(Exception):
                writer.close()
        raise
    writer.close()


def _pyarrow():
    import_extra("pyarrow.parquet", "parquet", NEEDED_FOR)
    return import_extra("pyarrow", "parquet", NEEDED_FOR)


def _batch(pa, schema, rows: list[Sequence[Any]]):
    """`rows` as one Arrow record batch of `schema`."""
    arrays = []
    for position, field in enumerate(schema):
        values = [row[position] for row in rows]
        try:
            arrays.append(pa.array(values, field.type))
        except UnicodeEncodeError:  # a file name that is not UTF-8: its "\udcXX" escapes
            arrays.append(pa.array([_escaped(value) for value in values], field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _escaped(value: str | None) -> str | None:
    """A string with lone surrogates (the bytes of a name that is not UTF-8) as the text of
    their escapes, `\\udcff`, as JSON writes them: Parquet strings are UTF-8."""
    if value is None:
        return None
    return value.encode("utf-8", "backslashreplace").decode("utf-8")
