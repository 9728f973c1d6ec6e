"""predict's rows as a Parquet file (`-o FILE.parquet`), written a row group at a time as the rows
come: memory holds one row group's rows, however many images there are.

The columns are those of JSON Lines (class names as they are, `label_index` and `class_index_K`
beside them), typed: `class_index`, `label_index`, `class_index_K` int64; `probability`,
`probability_K`, `logit_N` float64 (the 9-digit values CSV and JSON write, read back the same;
a logit that is -inf or NaN as itself, where JSON has null);
every other column a string. What a row does not know is null, as JSON's null.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import IO, Any

from torchkit.core.runtime.extras import import_extra, require_extra

NEEDED_FOR = "writing Parquet (--format parquet)"
# A row group is written once it holds this many values (rows times columns), or MOST_GROUP_ROWS
# rows: with --logits for 1,000 outputs, about 500 rows; without, tens of thousands.
GROUP_VALUES = 2**19
MOST_GROUP_ROWS = 65_536


def require_pyarrow() -> None:
    """The one-line error of a missing parquet extra, before any work (pyarrow itself is
    imported once the first row group is written, after the loader's workers are forked)."""
    require_extra("pyarrow", "parquet", NEEDED_FOR)


def column_type(column: str) -> str:
    """The Parquet type of one of predict's columns: int64, float64 or string."""
    if column in ("class_index", "label_index") or column.startswith("class_index_"):
        return "int64"
    if column.startswith(("probability", "logit_")):
        return "float64"
    return "string"


def group_rows(columns: Sequence[str]) -> int:
    """The rows of one row group for rows of `columns`."""
    return max(1, min(MOST_GROUP_ROWS, GROUP_VALUES // max(1, len(columns))))


def write_parquet_rows(
    records: Iterable[Sequence[Any]], columns: Sequence[str], handle: IO[bytes]
) -> None:
    """Write `records` (lists of values in the order of `columns`, None where a row has no
    value) to the binary file `handle` as Parquet, a row group every `group_rows(columns)`
    rows; an empty run still writes a file with the columns. A write error (a full disk) comes
    out as the OSError it is."""
    columns = list(columns)
    size = group_rows(columns)
    pending: list[Sequence[Any]] = []
    writer = None

    def flush() -> None:
        nonlocal writer
        pa = _pyarrow()
        schema = pa.schema([(column, getattr(pa, column_type(column))()) for column in columns])
        if writer is None:
            import pyarrow.parquet as pq

            writer = pq.ParquetWriter(handle, schema)
        writer.write_table(_table(pa, schema, pending), row_group_size=max(1, len(pending)))
        pending.clear()

    try:
        for record in records:
            pending.append(record)
            if len(pending) >= size:
                flush()
        if pending or writer is None:
            flush()
    except BaseException:
        if writer is not None:  # its footer, into a file that is discarded; no second error
            with contextlib.suppress(Exception):
                writer.close()
        raise
    writer.close()


def _pyarrow():
    import_extra("pyarrow.parquet", "parquet", NEEDED_FOR)
    return import_extra("pyarrow", "parquet", NEEDED_FOR)


def _table(pa, schema, rows: list[Sequence[Any]]):
    arrays = []
    for position, field in enumerate(schema):
        values = [row[position] for row in rows]
        try:
            arrays.append(pa.array(values, field.type))
        except UnicodeEncodeError:  # a file name that is not UTF-8: its "\udcXX" escapes
            arrays.append(pa.array([_escaped(value) for value in values], field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _escaped(value: str | None) -> str | None:
    """A string with lone surrogates (the bytes of a name that is not UTF-8) as the text of
    their escapes, `\\udcff`, as JSON writes them: Parquet strings are UTF-8."""
    if value is None:
        return None
    return value.encode("utf-8", "backslashreplace").decode("utf-8")
