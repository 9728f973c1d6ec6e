"""The Options and Arguments panels of `--help`, laid out to be read whole at any width.

Typer's own panel spreads an option over six columns (long names, short names, negative long
names, negative short names, type, help) and lets rich cut whatever does not fit with `…`: at
80 columns a flag's negative name lost its end (`no-determinis…`) and a help text's
longer words (`(torch.set_num_threads,`) lost their ends, and on an ASCII stdout each `…`
became the six characters `\\u2026`, past the terminal's edge. Here an option has three cells:
its names (wrapped between names, never inside one), its value's type and its help, word-wrapped
with its `[default: ...]`; a word longer than its column is folded, never cut.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

# Room a terminal must leave the help column (in cells) before the names are given less than
# the longest name: below it the names column folds a name rather than squeeze the help.
_HELP_MIN_WIDTH = 24
# The share of the terminal the names and the type columns grow to (one word wider than that
# widens its column to that word), and the least they are given: the help has the rest.
_NAMES_SHARE, _NAMES_WIDTH = 0.3, 20
_TYPE_SHARE, _TYPE_WIDTH = 0.2, 14


def _column_width(cells: list[Text], widest: int) -> int:
    """As wide as the widest cell, but no wider than `widest` unless one word needs more."""
    longest_word = max((len(word) for cell in cells for word in cell.plain.split()), default=0)
    longest_cell = max((len(cell.plain) for cell in cells), default=0)
    return min(longest_cell, max(widest, longest_word))


def options_panel(
    *, name: str, params: list[Any], ctx: Any, markup_mode: str, console: Any
) -> None:
    """Print `params` (options or arguments) in a panel titled `name`: what Typer's
    `rich_utils._print_options_panel` does, in the layout above."""
    from rich.panel import Panel
    from typer import rich_utils

    if not params:
        return
    rows = [_row(param, ctx, markup_mode, rich_utils) for param in params]
    required = any(param.required for param in params)
    table = Table(
        highlight=True,
        show_header=False,
        expand=True,
        box=None,
        pad_edge=False,
        padding=(0, 1),
    )
    if required:
        table.add_column(no_wrap=True, overflow="fold")
    width = console.width or 80
    names_width = _column_width(
        [names for names, _, _ in rows], max(_NAMES_WIDTH, int(width * _NAMES_SHARE))
    )
    type_width = _column_width(
        [kind for _, kind, _ in rows], max(_TYPE_WIDTH, int(width * _TYPE_SHARE))
    )
    # The help keeps room enough to read where the terminal is narrow: the names give way
    # first, then the type, neither below a width a name or a type still reads in.
    inside = width - 4 - (2 if required else 0) - 2  # the panel's edges, the cells' spaces
    names_width = min(names_width, max(12, inside - type_width - _HELP_MIN_WIDTH))
    type_width = min(type_width, max(8, inside - names_width - _HELP_MIN_WIDTH))
    table.add_column(overflow="fold", width=names_width)
    table.add_column(overflow="fold", width=type_width or None)
    table.add_column(overflow="fold", ratio=1)
    for param, (names, kind, help_text) in zip(params, rows, strict=True):
        mark = Text(rich_utils.REQUIRED_SHORT_STRING, style=rich_utils.STYLE_REQUIRED_SHORT)
        cells = [names, kind, help_text]
        table.add_row(*([mark if param.required else ""] if required else []), *cells)
    console.print(
        Panel(
            table,
            border_style=rich_utils.STYLE_OPTIONS_PANEL_BORDER,
            title=name,
            title_align=rich_utils.ALIGN_OPTIONS_PANEL,
        )
    )


def _row(param: Any, ctx: Any, markup_mode: str, rich_utils: Any) -> tuple[Text, Text, Text]:
    from typer.core import TyperArgument

    if isinstance(param, TyperArgument):
        shown = param.display_name_raw
        if param.metavar is None and param.nargs != 1:
            shown += "..."
        names = [shown]
    else:
        longs = [opt for opt in param.opts if opt.startswith("--")]
        shorts = [opt for opt in param.opts if not opt.startswith("--")]
        negatives = [opt for opt in param.secondary_opts if opt.startswith("--")]
        negative_shorts = [opt for opt in param.secondary_opts if not opt.startswith("--")]
        names = [*longs, *shorts, *negatives, *negative_shorts]
    # Each name but the last ends in a comma: the cell wraps between names, never inside one.
    name_text = rich_utils.highlighter(Text(", ".join(names)))
    kind = Text(style=rich_utils.STYLE_TYPES, overflow="fold")
    shown_type = param.display_type_rich(ctx=ctx)
    if shown_type is not None:
        kind.append(shown_type)
    number_range = param._get_number_range_help_str()
    if number_range:
        kind.append(rich_utils.RANGE_STRING.format(number_range))
    return name_text, rich_utils.types_highlighter(kind), _help_cell(param, ctx, markup_mode)


def _help_cell(param: Any, ctx: Any, markup_mode: str) -> Text:
    """The help text, then `[default: ...]` and `[required]`, as one paragraph that wraps at
    spaces (Typer set them side by side as rich Columns, which at a narrow width stacked them
    or cut them)."""
    from typer import rich_utils

    parts = rich_utils._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
    cell = Text(overflow="fold")
    for part in parts.renderables:
        if not isinstance(part, Text):  # Markdown (markup_mode="markdown"): its plain text
            part = Text(str(getattr(part, "markup", part)))
        if cell.plain:
            cell.append(" ")
        cell.append_text(part)
    return cell
