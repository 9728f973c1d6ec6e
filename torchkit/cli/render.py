"""One implementation of `--format table|csv|json` and `-o/--output FILE` for every command."""

from __future__ import annotations

import contextlib
import io
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from torchkit.cli import console

if TYPE_CHECKING:
    from rich.table import Table as RichTable

    from torchkit.core.io.file_outputs import ReplacedFiles


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


class StreamedOutputFormat(str, Enum):
    """The formats of a command that writes a row at a time (predict, video-info): the common
    three and JSON Lines, whose lines a stopped run leaves whole."""

    table = "table"
    csv = "csv"
    json = "json"
    jsonl = "jsonl"


Format = TypeVar("Format", bound=Enum)

# The rule, said once for every command's --format and -o help.
FORMAT_RULE = "[default: json for -o FILE.json, csv for -o FILE.csv, else table]"


def report_file(output: Path | str | None) -> Path | str | None:
    """The file `-o` names, or None for stdout: no -o, or `-o -` (as most Unix tools read it;
    `-o ./-`, a file called `-`, reaches here as an absolute path: app.py keeps it apart)."""
    return None if output is None or str(output) == "-" else output


def named_format(output: Path | str | None, formats: type[Format]) -> Format | None:
    """The format `-o`'s extension names (`x.json`: json, `x.CSV`: csv; predict's `x.jsonl`:
    jsonl), or None: stdout (no -o, `-o -`) and any other name (`.txt`, `/dev/stdout`)."""
    if report_file(output) is None:
        return None
    extension = Path(output).suffix.lower().removeprefix(".")
    if extension == "table":  # a name, not a format: a table has no extension of its own
        return None
    return next((f for f in formats if f.value == extension), None)


def resolve_format(
    given: Format | None, output: Path | str | None, formats: type[Format] = OutputFormat
) -> Format:
    """The printed result's format: `--format` as given, else the one -o's name says, else
    table. A `--format` that contradicts the name (`-o x.json --format csv`) is a usage error,
    raised before any work."""
    from torchkit.core.io.errors import UsageError

    named = named_format(output, formats)
    if given is None:
        return named if named is not None else formats("table")
    if named is not None and named != given:
        raise UsageError(
            f"--format {given.value}, but -o {output} names a {named.value.upper()} file",
            "drop --format: the extension picks the format; or give -o another name",
        )
    return given


def fixed_format(
    given: OutputFormat | None, output: Path | str | None, fixed: OutputFormat, mode: str
) -> OutputFormat:
    """`fixed`, for a mode that writes one format only (benchmark --append: CSV; train
    --print-config: JSON): a --format, or an -o name, that says another is a usage error. Any
    other name (`bench.log`) takes that format."""
    from torchkit.core.io.errors import UsageError

    resolved = resolve_format(given, output)
    chosen = given is not None or named_format(output, OutputFormat) is not None
    if chosen and resolved != fixed:
        raise UsageError(
            f"{mode} writes {fixed.value.upper()}, not {resolved.value}",
            "drop --format" if given is not None else f"give -o a .{fixed.value} name",
        )
    return fixed


# The most classes the table format shows of a table with a row per class (`ClassRows`:
# split, dataset-stats; eval picks its own, as many): laying out a row per class took seconds
# for 5,000 classes (7.5 s of CPU on a terminal too narrow for plain lines), more for
# ImageNet-21k's 21,841, for a table nobody reads whole. CSV and JSON list every class.
MOST_CLASS_ROWS = 50
# What the note under a cut-down class table says of the classes it leaves out.
SEE_EVERY_CLASS = "--all-classes shows them all; --format csv or json, or -o FILE.csv, list them"


@dataclass(frozen=True)
class ClassRows:
    """Marks a table as one row per class, followed by `totals` rows (a total) that are not
    classes. Above MOST_CLASS_ROWS classes the table format shows the largest half and the
    smallest half of them by `size_column` (largest first; ties in the table's order), the
    totals, and a note saying how many classes it leaves out and how to see them; CSV keeps
    every row."""

    size_column: str
    totals: int = 0


@dataclass
class Table:
    """Rows for the table and CSV formats. `columns` are the header labels; `note`, a line the
    table format prints under the table (its last line on a terminal, where a title has
    scrolled away: how to see rows it leaves out); `per_class`, that its rows are classes,
    which the table format cuts down to MOST_CLASS_ROWS (`shown_rows`)."""

    columns: list[str]
    rows: list[Sequence[Any]]
    title: str | None = None
    align_right: set[str] = field(default_factory=set)
    note: str | None = None
    per_class: ClassRows | None = None


def check_all_classes(all_classes: bool, fmt: Enum) -> None:
    """`--all-classes` (every class in the table) beside `--format csv` or `json`, which list
    every class already, would do nothing: a usage error, before any work."""
    if all_classes and fmt != OutputFormat.table:
        from torchkit.core.io.errors import UsageError

        raise UsageError(
            f"--all-classes shapes the table, and --format {fmt.value} lists every class already",
            "drop --all-classes",
        )


def shown_rows(table: Table) -> Table:
    """`table` as the table format shows it: a table of more than MOST_CLASS_ROWS classes cut
    down to the largest and smallest of them, with a note; any other table as it is."""
    rule = table.per_class
    if rule is None:
        return table
    cut = len(table.rows) - rule.totals
    classes, totals = table.rows[:cut], table.rows[cut:]
    if len(classes) <= MOST_CLASS_ROWS:
        return table
    column = table.columns.index(rule.size_column)

    def larger_first(row: Sequence[Any]) -> float:
        size = row[column]
        return -size if isinstance(size, (int, float)) and not math.isnan(size) else math.inf

    ordered = sorted(classes, key=larger_first)  # stable: equal sizes keep the table's order
    largest = MOST_CLASS_ROWS // 2
    smallest = MOST_CLASS_ROWS - largest
    # The title says which classes are shown, the note (the last line) how to see the rest:
    # both wrap to the table's width, so each is kept short.
    shown = f"{largest} largest, {smallest} smallest of {len(classes):,}"
    hidden = len(classes) - MOST_CLASS_ROWS
    note = f"{hidden:,} classes not shown: {SEE_EVERY_CLASS}"
    return Table(
        table.columns,
        [*ordered[:largest], *ordered[-smallest:], *totals],
        title=f"{table.title or 'Classes'}: {shown}",
        align_right=table.align_right,
        note=note if table.note is None else f"{table.note}; {note}",
    )


# What a table shows for a character torchkit writes itself where the stream's encoding lacks
# it (`PYTHONIOENCODING=ascii`, a Latin-1 locale): summary's shapes, 1x3x224x224.
_STAND_INS = {"\u00d7": "x", "\u2026": "...", "\u2014": "-", "\u2013": "-", "\u2192": "->"}


def encodable_text(text: str, encoding: str | None) -> str:
    """`text` as a stream of `encoding` shows it, for a table laid out before it is written: a
    character the encoding lacks as its `_STAND_INS` or else its backslash escape (`\\xe9`,
    `\\u4e2d`), as the stream's error handler writes it. Left to the stream, that escape came
    after rich had measured the cell, and every row holding one stuck out of its column. The
    byte of a name that is not UTF-8 (a lone surrogate) stays: stdout writes it as that byte."""
    if encoding is None or text.isascii():
        return text
    try:
        text.encode(encoding)
        return text
    except LookupError:
        return text
    except UnicodeEncodeError:
        pass
    shown = []
    for character in text:
        if 0xDC80 <= ord(character) <= 0xDCFF:
            shown.append(character)
            continue
        try:
            character.encode(encoding)
            shown.append(character)
        except UnicodeEncodeError:
            shown.append(
                _STAND_INS.get(character) or character.encode("ascii", "backslashreplace").decode()
            )
    return "".join(shown)


def encodable_table(table: Table, encoding: str | None) -> Table:
    """`table` (as `shown_rows` gave it) with every text as a stream of `encoding` shows it
    (`encodable_text`): its title, note, header and cells (numbers stay numbers, for their
    alignment)."""
    if encoding is None:
        return table
    import codecs

    with contextlib.suppress(LookupError):
        if codecs.lookup(encoding).name == "utf-8":
            return table

    def fit(value: Any) -> Any:
        if isinstance(value, str):
            return encodable_text(value, encoding)
        if isinstance(value, (list, tuple)):
            return encodable_text(_cell_text(value), encoding)
        return value

    columns = [encodable_text(column, encoding) for column in table.columns]
    return Table(
        columns,
        [[fit(value) for value in row] for row in table.rows],
        title=None if table.title is None else encodable_text(str(table.title), encoding),
        align_right={
            fitted
            for column, fitted in zip(table.columns, columns, strict=True)
            if column in table.align_right
        },
        note=None if table.note is None else encodable_text(table.note, encoding),
    )


_PREFIXES = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))  # largest first


def readable_number(value: float, unit: str = "") -> str:
    """`value` and its `unit` with an SI prefix from a thousand up, two decimals: "4.36 G",
    "4.36 Gmult-adds"; below a thousand as it is: "512", "512 FLOPs". A value that rounds to
    1000.00 of a prefix takes the next one: 999,999 is "1.00 M", not "1000.00 k"."""
    for place, (prefix, scale) in enumerate(_PREFIXES):
        if abs(value) >= scale:
            if place and round(abs(value) / scale, 2) >= 1000:
                prefix, scale = _PREFIXES[place - 1]
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:g} {unit}".rstrip()


def small_number(value: float) -> str:
    """A small nonzero `value` in decimals with 3 significant digits, as tables show what 4
    decimals would show as 0.0000: 6.2e-6 is "0.00000620", 0.009999 is "0.0100"."""
    rounded = float(f"{value:.3g}")  # the digits shown: 0.009999 is 0.0100, not 0.01000
    return f"{value:.{max(0, 2 - math.floor(math.log10(abs(rounded))))}f}"


def binary_size(size: int) -> str:
    """Bytes as tables show them: below 1024 as they are ("512 B"), else in the largest binary
    unit they reach, one decimal ("3.4 MiB"). A size that rounds to 1024.0 of a unit takes the
    next: 1,048,575 bytes is 1.0 MiB, not 1024.0 KiB."""
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        if round(value, 1) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.1f} {unit}"


def format_rate(per_second: float | None) -> str:
    """A rate (images/s) as people read it, in every table and message: a whole number with
    thousands separators from 100 up ("3,739"), three significant digits below ("12.3",
    "0.512"); blank when unknown (None, NaN). CSV and JSON keep the plain number."""
    if per_second is None or not math.isfinite(per_second):
        return ""
    if abs(per_second) >= 99.95 or per_second == 0:
        return f"{per_second:,.0f}"
    return f"{per_second:#.3g}".rstrip(".")


def format_cell(value: Any) -> str:
    """A value as a table's cell shows it: control characters escaped (`console.shown_text`);
    CSV and JSON keep a name as it is."""
    return console.shown_text(_cell_text(value))


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if 0 < abs(value) < 0.00005:  # 4 decimals show a loss of 6e-6 as 0.0000: 3 digits
            if abs(float(f"{value:.3g}")) < 1e-6:  # 1e-300 in a few characters, not 300 zeros
                return f"{value:.3g}"
            return small_number(value)
        return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell_text(v) for v in value)
    return str(value)


def to_json_value(value: Any) -> Any:
    """Plain JSON: NaN and infinities become null, tuples lists, paths strings."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy / torch scalars and arrays
        return to_json_value(value.tolist())
    return value


def render_json(data: Any, encoding: str | None = None, indent: int | None = 2) -> str:
    """JSON text (`indent` None: on one line, a JSON Lines record); for a stream whose
    `encoding` cannot write every character (an emoji under cp1252, an accent under ASCII),
    with those characters as JSON escapes: the escapes of stdout's encoder (`\\xe9`,
    `\\U0001f431`) are not JSON, and a script's parser refused it."""
    from torchkit.core.io.non_utf8_names import json_text

    text = json_text(to_json_value(data), indent=indent) + "\n"
    if encoding is not None:
        try:
            text.encode(encoding)
        except UnicodeEncodeError:
            import json

            return json.dumps(to_json_value(data), indent=indent, ensure_ascii=True) + "\n"
        except LookupError:
            pass
    return text


def render_json_lines(items: Iterable[Any], encoding: str | None = None) -> str:
    """JSON Lines: each item as one line of JSON. Unlike an array, what a stopped run wrote
    is whole records, each of which a reader can take."""
    return "".join(render_json(item, encoding, indent=None) for item in items)


class JsonArrayWriter:
    """A JSON array written to `handle` an item at a time, as the items come, without holding
    the list: `[`, then each item on a line of its own, ended as it is written (the comma that
    parts it from the item before at its start), then `]`. A reader of the lines gets each item
    whole as soon as it is added: a comma at the line's end waited for the next item, so a
    stream's reader got each row one item late. Under an `encoding` that cannot write an item's
    characters, that item (not the whole array) gets `render_json`'s JSON escapes. `close` ends
    the array (`streamed_rows`: also after an error part-way)."""

    def __init__(self, handle: Any, encoding: str | None = None) -> None:
        self.handle = handle
        self.encoding = encoding
        self.items = 0
        handle.write("[\n")

    def add(self, item: Any) -> None:
        text = render_json(item, self.encoding, indent=None)
        self.handle.write("," + text if self.items else text)
        self.items += 1

    def close(self) -> None:
        self.handle.write("]\n")


def render_json_rows(items: Iterable[Any], encoding: str | None = None) -> str:
    """A JSON array of rows as `JsonArrayWriter` streams it (`[`, an item a line, `]`): the
    shape of every JSON list a command of `StreamedOutputFormat` writes, also where its rows
    come all at once (`video-info --extract-frames`, which writes them after its frames)."""
    import io

    text = io.StringIO()
    array = JsonArrayWriter(text, encoding)
    for item in items:
        array.add(item)
    array.close()
    return text.getvalue()


def streamed_rows(write: Callable[[], None], end: Callable[[], None]) -> None:
    """`write()` the rows of a streamed output (CSV, a JSON list, JSON Lines), then `end()` it
    (a JSON list's `]`), also where the run fails part-way with an error it reports (`--strict`,
    a bad list on stdin): what was written is the rows so far, whole (a JSON list closed), as
    CSV's and JSON Lines' are, and the exit status and the `Error:` line say the run failed.
    A run stopped (Ctrl-C, SIGTERM) or an output that cannot be written is left as it is."""
    from torchkit.core.io.errors import TorchkitError

    try:
        write()
    except TorchkitError:
        with contextlib.suppress(OSError):  # the output failed: the run's error is the one said
            end()
        raise
    end()


def render_csv(table: Table) -> str:
    from torchkit.core.io.csv_rows import csv_text

    return csv_text([table.columns, *table.rows])  # None an empty field, "" a quoted one


def rich_table(
    table: Table, *, min_widths: Sequence[int] | None = None, show_header: bool = True
) -> RichTable:
    """`table` for rich; `min_widths`: the least width of each column's text."""
    from rich.table import Table as RichTable
    from rich.text import Text

    # Text, not str: a class name, a path or a title from the user's data is shown as it is,
    # never read as rich markup (`[red]cat`, a `[/]` that failed the command) or an emoji code.
    title = None if table.title is None else Text(console.shown_text(str(table.title)))
    note = None if table.note is None else Text(console.shown_text(table.note))
    rendered = RichTable(
        title=title,
        title_justify="left",
        caption=note,
        caption_justify="left",
        header_style="bold",
        show_header=show_header,
    )
    for index, column in enumerate(table.columns):
        # fold, not ellipsis: a long path must wrap inside its cell, never lose characters.
        rendered.add_column(
            column,
            justify="right" if column in table.align_right else "left",
            overflow="fold",
            min_width=None if min_widths is None else min_widths[index],
        )
    for row in table.rows:
        rendered.add_row(*(Text(format_cell(v)) for v in row))
    return rendered


# The least width (in cells) a column keeps when a table is narrowed to fit: rich folds text
# into columns as narrow as it must, but squeezes them to nothing, or under a wide (CJK)
# character, when they cannot all fit, and then drops their text.
MIN_COLUMN_WIDTH = 2


def _least_width(widths: Sequence[int]) -> int:
    """The narrowest table whose columns keep min(their text, MIN_COLUMN_WIDTH) cells each:
    the text, its padding (2) and the borders (one per column, plus one)."""
    return sum(min(width, MIN_COLUMN_WIDTH) + 3 for width in widths) + 1


def print_on_terminal(tables: list[Table], out: Any = None) -> None:
    """Tables on the terminal (`out`, the stdout console by default), folded to its width. A
    table with more columns than the terminal can show is printed wider (the terminal wraps its
    lines) rather than lose text."""
    out = out or console.stdout
    encoding = getattr(out.file, "encoding", None)
    for table in map(shown_rows, tables):
        table = encodable_table(table, encoding)
        if len(table.rows) > PLAIN_BATCH_ROWS:
            widths = _text_widths(out, table)
            if sum(w + 3 for w in widths) + 1 <= out.width:
                # A long table that fits: its lines as a pipe gets them, a batch of rows at a
                # time (rich held the whole layout, a few KB a row, and took minutes for
                # 200,000 duplicate files); only its title and header lose their style.
                out.file.write(render_plain_tables([table], out.width, encoding=encoding))
                out.file.flush()
                continue
        rendered = rich_table(table)
        # Measuring every cell is needed only when even MIN_COLUMN_WIDTH columns may not fit.
        if _least_width([MIN_COLUMN_WIDTH] * len(table.columns)) > out.width:
            least = _least_width(_text_widths(out, table))
            if least > out.width:
                rendered.width = least
        out.print(rendered, crop=False)


# Rows laid out at a time in plain text: rich holds a table's whole layout in memory (a few KB
# a row), and dataset-stats can list a file per image.
PLAIN_BATCH_ROWS = 1000


class _Buffer(io.StringIO):
    """A StringIO that tells rich the encoding of the stream its text goes to: where that is
    not UTF (ASCII, Latin-1), rich draws a table's lines in ASCII."""

    def __init__(self, encoding: str | None) -> None:
        super().__init__()
        self._encoding = encoding or "utf-8"

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding


def render_plain_tables(
    tables: list[Table], width: int = 1000, *, encoding: str | None = None
) -> str:
    """Tables as uncoloured text, each only as wide as its content (up to `width`), for a
    stream of `encoding` (UTF-8 if None): under `PYTHONIOENCODING=ascii` or a Latin-1 locale
    their box-drawing lines reached stdout as escapes (`\\u250f\\u2501...`)."""
    from rich.console import Console

    buffer = _Buffer(encoding)
    lines: list[str] = []
    for table in map(shown_rows, tables):
        table = encodable_table(table, encoding)
        # As wide as MIN_COLUMN_WIDTH columns need, were the table to have hundreds of them.
        least = _least_width([MIN_COLUMN_WIDTH] * len(table.columns))
        plain = Console(
            file=buffer, width=max(width, least), no_color=True, color_system=None, emoji=False
        )
        lines += _plain_lines(plain, buffer, table)
    return "\n".join(lines) + "\n"


def _plain_lines(plain: Any, buffer: io.StringIO, table: Table) -> list[str]:
    """The lines of `table` printed on the `plain` console (which writes into `buffer`). A long
    table goes in batches of rows, every batch with the columns the whole table would get, so
    the lines are the same as the whole table's."""

    def printed(rendered: RichTable) -> list[str]:
        buffer.seek(0)
        buffer.truncate()
        plain.print(rendered)
        # Line feeds only: a cell's text may hold characters str.splitlines breaks at.
        return [line.rstrip() for line in buffer.getvalue().removesuffix("\n").split("\n")]

    rows = table.rows
    short = len(rows) <= PLAIN_BATCH_ROWS
    # A short table whose rows rich must lay out (summary's tree of layers) is measured once.
    if len(rows) < 2 or short and not _all_plain(_middle_rows(table)):
        return printed(rich_table(table))
    widths = _text_widths(plain, table)
    # A table wider than the console has its columns narrowed and wrapped as a whole.
    if sum(w + 2 for w in widths) + len(widths) + 1 > plain.width:
        return printed(rich_table(table))
    if short:
        return _short_table_lines(printed, table, widths) or printed(rich_table(table))
    lines: list[str] = []
    edges: tuple[str, str, str, str] | None = None
    for start in range(0, len(rows), PLAIN_BATCH_ROWS):
        first, last = start == 0, start + PLAIN_BATCH_ROWS >= len(rows)
        batch_rows = rows[start : start + PLAIN_BATCH_ROWS]
        # The last batch carries the note: rich lays it out, under the bottom edge.
        laid_out_here = edges is not None and not (last and table.note)
        fast = _simple_lines(batch_rows, widths, table, edges) if laid_out_here else None
        if fast is not None:
            lines += fast + ([edges[3]] if last else [])
            continue
        part = Table(
            table.columns,
            batch_rows,
            title=table.title if first else None,
            align_right=table.align_right,
            note=table.note if last else None,
        )
        # The batches after the first: no title, no header, no top edge; all but the last:
        # no bottom edge (nor note).
        batch = printed(rich_table(part, min_widths=widths, show_header=first))
        if first:
            edges = _row_edges(batch, widths)
        lines += batch[0 if first else 1 : None if last else -1]
    return lines


def _short_table_lines(
    printed: Callable[[RichTable], list[str]], table: Table, widths: list[int]
) -> list[str] | None:
    """The lines of a table of up to PLAIN_BATCH_ROWS rows (two or more) that fits its page:
    rich lays out its title, header and first row (and its last row with the note under it),
    the rows between are laid out as `_simple_lines`, to the same text: rich's layout of the
    whole table cost a result table of a tiny run (eval, predict, summary) 20-60 ms of CPU.
    None where a row is not that simple: rich then lays out the whole table."""
    rows, note = table.rows, table.note
    head = printed(
        rich_table(
            Table(table.columns, rows[:1], title=table.title, align_right=table.align_right),
            min_widths=widths,
        )
    )
    edges = _row_edges(head, widths)
    simple = None if edges is None else _simple_lines(_middle_rows(table), widths, table, edges)
    if simple is None:
        return None
    if not note:
        return head[:-1] + simple + [edges[3]]
    last = Table(table.columns, rows[-1:], align_right=table.align_right, note=note)
    return head[:-1] + simple + printed(rich_table(last, min_widths=widths, show_header=False))[1:]


def _middle_rows(table: Table) -> list[list]:
    """The rows `_short_table_lines` lays out without rich: all but the first, and the last
    where a note goes under it."""
    return table.rows[1:-1] if table.note else table.rows[1:]


def _all_plain(rows: list[list]) -> bool:
    """Whether every cell of `rows` is printable ASCII (what `_simple_lines` lays out)."""
    for row in rows:
        for value in row:
            text = format_cell(value)
            if not (text.isascii() and text.isprintable()):
                return False
    return True


def _row_edges(batch: list[str], widths: list[int]) -> tuple[str, str, str, str] | None:
    """(left edge, column separator, right edge, bottom edge line) of a batch rich printed,
    read from its last row line; None where that line is not laid out as plain cells are."""
    row, bottom = batch[-2], batch[-1]
    if len(row) != sum(w + 3 for w in widths) + 1 or len(bottom) != len(row):
        return None
    return row[0], row[widths[0] + 3], row[-1], bottom


def _simple_lines(
    rows: list[list], widths: list[int], table: Table, edges: tuple[str, str, str, str]
) -> list[str] | None:
    """The lines rich prints for `rows` (between the first batch's edges), laid out here where
    every cell is printable ASCII on one line that fits its column (so rich would neither wrap
    nor measure it otherwise): rich's layout costs about 0.7 ms a row, 200,000 rows of
    duplicates minutes. None for any other batch: rich lays it out."""
    left, separator, right, _ = edges
    right_aligned = [column in table.align_right for column in table.columns]
    joint = f" {separator} "
    lines = []
    for row in rows:
        cells = []
        for value, width, to_right in zip(row, widths, right_aligned, strict=True):
            text = format_cell(value)
            if len(text) > width or not (text.isascii() and text.isprintable()):
                return None
            cells.append(text.rjust(width) if to_right else text.ljust(width))
        lines.append(f"{left} {joint.join(cells)} {right}")
    return lines


def _text_widths(console: Any, table: Table) -> list[int]:
    """The width rich measures for each column's widest text (header included)."""
    from rich.measure import Measurement
    from rich.text import Text

    options = console.options
    widths = [Measurement.get(console, options, column).maximum for column in table.columns]
    for row in table.rows:
        for index, value in enumerate(row):
            text = format_cell(value)
            if text.isascii() and text.isprintable():
                width = len(text)  # what rich measures of it, without its cost a cell
            else:
                width = Measurement.get(console, options, Text(text)).maximum
            if width > widths[index]:
                widths[index] = width
    return widths


def emit(
    *,
    tables: list[Table],
    data: Any,
    fmt: OutputFormat | Enum = OutputFormat.table,
    output: Path | None = None,
    force: bool = False,
    csv_table: int = 0,
    written: Iterable[str | os.PathLike | None] = (),
    replaced: ReplacedFiles | None = None,
) -> None:
    """Write the result: tables (one or more), CSV of `tables[csv_table]`, `data` as JSON, or
    the list `data` as JSON Lines (`fmt` jsonl, of a command whose --format adds it); to
    stdout, or atomically to `output` (which needs --force to replace an existing file).
    Where a file the command `written` is stdout itself (`export m.pt /dev/stdout | ...`, a
    link to it, the FIFO or file stdout goes to), the result goes to stderr, not into the file.
    `replaced`: the command's other outputs, whose old files go back with the old `output` if
    the command fails after this (`ReplacedFiles`); "wrote FILE" is said when they are kept."""
    from torchkit.core.io.file_outputs import check_output_file
    from torchkit.core.io.files import atomic_write_text
    from torchkit.core.io.force import note_report
    from torchkit.core.io.special_files import shares_stdout

    output = report_file(output)
    if output is not None:
        if replaced is not None:
            replaced.set_aside(output)  # before the check, which records the old file's state
        check_output_file(output, force)
    screen = console.stdout
    if output is None and any(shares_stdout(path) for path in written if path):
        screen = console.stderr
    if fmt == OutputFormat.json:
        stdout_encoding = getattr(screen.file, "encoding", None)
        encoding = None if output is not None else stdout_encoding
        if isinstance(fmt, StreamedOutputFormat) and isinstance(data, list):
            text = render_json_rows(data, encoding)  # as its streamed rows are, an item a line
        else:
            text = render_json(data, encoding)
    elif getattr(fmt, "value", fmt) == "jsonl":  # the commands that add it: `data` is a list
        stdout_encoding = getattr(screen.file, "encoding", None)
        text = render_json_lines(data, None if output is not None else stdout_encoding)
    elif fmt == OutputFormat.csv:
        text = render_csv(tables[csv_table])
    elif output is None and screen.is_terminal:
        print_on_terminal(tables, screen)
        return
    else:
        # A file or a pipe: plain text, as wide as the table needs (not the 80 columns rich
        # assumes without a terminal), so rows stay on one line for grep and friends.
        stdout_encoding = getattr(screen.file, "encoding", None)
        text = render_plain_tables(tables, encoding=None if output is not None else stdout_encoding)
    if output is None:
        # Plain write, not rich: machine-readable output must not be wrapped or styled.
        screen.file.write(text)
        screen.file.flush()
    else:
        atomic_write_text(output, text)
        note_report(output)  # the next --force of the command whose folder holds it replaces it
        if replaced is None:
            console.note(f"wrote {output}")
        else:  # said once every output is in place: a later failure puts the old file back
            replaced.wrote(output)
            replaced.when_kept(lambda: console.note(f"wrote {output}"))


class ReportAtSwap:
    """The result of a command whose main output replaces an earlier one only at its very end
    (eval's --out, split's OUT, video-info's --extract-frames). An -o file is written just
    before that swap (`before_keep`, handed to the core function), its old file set aside
    (`ReplacedFiles`): a report the disk has no room for leaves the earlier output and report
    as they were, and a swap that fails after it puts the old report back. Stdout, and a run
    that swaps nothing, get the result after (`after`). `render(result)` gives emit's tables
    and data; `swapped_in`: the folder the run puts in place, an -o file inside which is
    written after the swap too (before it, it went into the old folder the swap deletes, or
    took the new folder's place); `to_file` False writes any -o file after; `written` is
    emit's. The command's own file outputs may join `replaced`.
    """

    def __init__(
        self,
        render: Callable[[Any], tuple[list[Table], Any]],
        *,
        fmt: OutputFormat,
        output: Path | None,
        force: bool,
        to_file: bool | None = None,
        swapped_in: str | os.PathLike | None = None,
        written: Iterable[str | os.PathLike | None] = (),
    ) -> None:
        from torchkit.core.io.file_outputs import ReplacedFiles
        from torchkit.core.io.folder_contents import path_inside

        self._render, self._fmt, self._output, self._force = render, fmt, output, force
        self._others = list(written)
        self.replaced = ReplacedFiles()
        self._written = False
        report = report_file(output)
        if to_file is None:
            to_file = report is not None and not (
                swapped_in is not None and path_inside(report, swapped_in) is not None
            )
        at_swap = to_file
        self.before_keep = self._write if at_swap else None

    def __enter__(self) -> ReportAtSwap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.replaced.__exit__(*exc)

    def _write(self, result: Any) -> None:
        tables, data = self._render(result)
        emit(tables=tables, data=data, fmt=self._fmt, output=self._output, force=self._force,
             written=self._others, replaced=self.replaced)  # fmt: skip
        self._written = True

    def after(self, result: Any) -> None:
        """Write the result where `before_keep` has not."""
        if not self._written:
            self._write(result)
