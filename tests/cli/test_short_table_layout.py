"""A short plain table (a result table of eval, predict, train, summary) has its middle rows
laid out without rich (rich's layout of the whole table cost a tiny run 5-60 ms of CPU): the
text must be rich's layout of the whole table, character for character, for every kind of
cell, title, note and encoding."""

from __future__ import annotations

import pytest

import torchkit.cli.render as render
from torchkit.cli.render import Table, render_plain_tables

CELLS = [
    "cat",
    "dog/a b.png",
    "",
    None,
    1.5,
    3,
    True,
    0.000123,
    "[red]x[/]",
    "a\\b",
    "  padded  ",
    "x" * 40,
    12345678901234,
    float("nan"),
    "crane (#134)",
]

TABLES = [
    Table(["a", "b"], [["x", 1], ["yy", 22]]),
    Table(["class", "top1", "n"], [[CELLS[(i + j) % 15] for j in range(3)] for i in range(15)]),
    Table(
        ["metric", "value"],
        [["top1", 0.99], ["top5", 1.0], ["loss", 0.031]],
        title="a title much wider than the table under it, on one line",
        align_right={"value"},
    ),
    Table(
        ["file", "label", "p"],
        [[f"img{k}.png", CELLS[k % 15], k / 7] for k in range(9)],
        title="Predictions",
        note="9 of 90 rows shown: --top 0 shows all",
    ),
    Table(["only"], [[k] for k in range(6)], note="a note under a one-column table"),
    Table(["x", "y"], [["a", 1], ["b", 2], ["c", 3]], note="n", align_right={"x", "y"}),
]


def _whole_tables_by_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    """No row counts as plain: rich lays every short table out whole, as before the short path."""
    monkeypatch.setattr(render, "_all_plain", lambda rows: False)


@pytest.mark.parametrize("encoding", [None, "ascii"])
def test_a_short_plain_table_is_riches_whole_layout_to_the_character(monkeypatch, encoding):
    short_path = render_plain_tables(TABLES, encoding=encoding)
    _whole_tables_by_rich(monkeypatch)
    assert short_path == render_plain_tables(TABLES, encoding=encoding)


def test_a_short_table_is_laid_out_by_rich_only_for_its_first_and_noted_last_row(monkeypatch):
    laid_out: list[int] = []
    rich_table = render.rich_table
    monkeypatch.setattr(
        render,
        "rich_table",
        lambda table, **kw: laid_out.append(len(table.rows)) or rich_table(table, **kw),
    )
    render_plain_tables([TABLES[1], TABLES[3]])
    assert laid_out == [1, 1, 1]  # the first row of each, the last row under which the note goes


def test_a_short_table_with_a_cell_rich_must_lay_out_is_laid_out_whole(monkeypatch):
    table = Table(["class", "n"], [["cat", 1], ["猫", 2], ["two\nlines", 3], ["dog", 4]])
    short_path = render_plain_tables([table])
    _whole_tables_by_rich(monkeypatch)
    assert short_path == render_plain_tables([table])
