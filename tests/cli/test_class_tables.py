"""Tables of one row per class (split, dataset-stats): the table format shows at most
MOST_CLASS_ROWS classes, the largest and the smallest, and says how many it leaves out and how to
see them (--all-classes shows them all); CSV and JSON, on stdout or in an -o file, keep every
class; small tables are as they were."""

from __future__ import annotations

import csv
import io
import json

from image_folders import make_class_files, write_image_folder
from rich.console import Console

from torchkit.cli import app
from torchkit.cli.render import (
    MOST_CLASS_ROWS,
    ClassRows,
    Table,
    print_on_terminal,
    render_plain_tables,
    shown_rows,
)

HALF = MOST_CLASS_ROWS // 2
HOW_TO_SEE_ALL = "--all-classes shows them all; --format csv or json, or -o FILE.csv, list them"


def _shown_classes(text: str, prefix: str) -> list[str]:
    """The class names of the table rows of `text` (a plain or terminal table)."""
    names = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip("│|").split("│")]
        if cells and cells[0].startswith(prefix):
            names.append(cells[0])
    return names


def _largest_and_smallest(sizes: dict[str, int]) -> list[str]:
    """Largest first, equal sizes in name order: the first and last HALF."""
    ordered = sorted(sizes, key=lambda name: (-sizes[name], name))
    return ordered[:HALF] + ordered[-HALF:]


def test_split_of_many_classes_shows_the_largest_and_smallest_and_lists_every_class_in_csv_json(
    runner, tmp_path
):
    """A split of 5,000 classes spent seconds laying out a row per class (minutes for
    ImageNet-21k): the table shows MOST_CLASS_ROWS of them and the total; its title says which,
    its last line how many are left out and how to see them. CSV, JSON and -o keep all."""
    sizes = {f"c{i:03d}": 1 + (i % 3 == 0) + (i % 7 == 0) for i in range(120)}
    root = make_class_files(tmp_path / "data", sizes)
    args = ["split", str(root), "--mode", "manifest"]

    table = runner.invoke(app, [*args, str(tmp_path / "o1")])
    assert table.exit_code == 0, table.stderr
    assert _shown_classes(table.stdout, "c") == _largest_and_smallest(sizes)
    assert _shown_classes(table.stdout, "total") == ["total"]
    assert len(table.stdout.splitlines()) < MOST_CLASS_ROWS + 12  # not a line per class
    words = " ".join(table.stdout.split())  # the title and the note wrap to the table's width
    assert words.startswith(f"Classes: {HALF} largest, {HALF} smallest of 120 ")
    assert words.endswith(f"70 classes not shown: {HOW_TO_SEE_ALL}")

    report = tmp_path / "report.csv"
    to_file = runner.invoke(app, [*args, str(tmp_path / "o2"), "-o", str(report)])
    assert to_file.exit_code == 0, to_file.stderr
    rows = list(csv.reader(io.StringIO(report.read_text())))
    assert [row[0] for row in rows[1:]] == [*sizes, "total"]
    as_json = runner.invoke(app, [*args, str(tmp_path / "o3"), "--format", "json"])
    assert [c["name"] for c in json.loads(as_json.stdout)["classes"]] == list(sizes)
    every = runner.invoke(app, [*args, str(tmp_path / "o4"), "--all-classes"])
    assert _shown_classes(every.stdout, "c") == list(sizes)
    assert "not shown" not in every.stdout


def test_dataset_stats_of_many_classes_shows_the_largest_and_smallest_classes(runner, tmp_path):
    sizes = {f"k{i:02d}": 1 + (i % 5 == 0) for i in range(60)}
    root = write_image_folder(tmp_path / "data", sizes, size=2)
    shown = runner.invoke(app, ["dataset-stats", str(root), "-j", "0"])
    assert shown.exit_code == 0, shown.stderr
    assert _shown_classes(shown.stdout, "k") == _largest_and_smallest(sizes)
    words = " ".join(shown.stdout.split())
    assert f"Images per class: {HALF} largest, {HALF} smallest of 60" in words
    assert words.endswith(f"10 classes not shown: {HOW_TO_SEE_ALL}")
    every = runner.invoke(app, ["dataset-stats", str(root), "-j", "0", "--format", "json"])
    assert len(json.loads(every.stdout)["classes"]) == 60
    as_csv = runner.invoke(app, ["dataset-stats", str(root), "-j", "0", "--format", "csv"])
    assert sum(line.startswith("class,") for line in as_csv.stdout.splitlines()) == 60


def _class_table(count: int, *, totals: bool = True) -> Table:
    rows: list[list] = [[f"class {i}", i % 4, 1] for i in range(count)]
    if totals:
        rows.append(["total", sum(row[1] for row in rows), count])
    return Table(
        ["class", "images", "folders"],
        rows,
        align_right={"images", "folders"},
        per_class=ClassRows("images", totals=int(totals)),
    )


def test_a_class_table_up_to_the_bound_is_shown_as_before():
    """MOST_CLASS_ROWS classes: every row, no title or note added, the same text as the same
    table without the per-class rule, on a pipe and on a terminal."""
    table = _class_table(MOST_CLASS_ROWS)
    assert shown_rows(table) is table
    plain = Table(table.columns, table.rows, align_right=table.align_right)
    assert render_plain_tables([table]) == render_plain_tables([plain])
    screens = []
    for each in (table, plain):
        screen = Console(file=io.StringIO(), force_terminal=True, color_system=None, width=80)
        print_on_terminal([each], screen)
        screens.append(screen.file.getvalue())
    assert screens[0] == screens[1]
    assert len(_shown_classes(screens[0], "class ")) == MOST_CLASS_ROWS


def test_the_bound_holds_on_a_terminal_too_and_for_a_table_without_totals():
    """One rule for every way a table is shown: on a terminal, and a table whose every row is a
    class."""
    screen = Console(file=io.StringIO(), force_terminal=True, color_system=None, width=80)
    print_on_terminal([_class_table(400)], screen)
    assert len(_shown_classes(screen.file.getvalue(), "class ")) == MOST_CLASS_ROWS
    cut = shown_rows(_class_table(400, totals=False))
    sizes = {f"class {i}": i % 4 for i in range(400)}
    assert [row[0] for row in cut.rows] == sorted(sizes, key=lambda n: -sizes[n])[:HALF] + sorted(
        sizes, key=lambda n: -sizes[n]
    )[-HALF:]
    assert cut.title.startswith("Classes:") and cut.note.startswith("350 classes not shown")


def test_all_classes_beside_csv_or_json_is_a_usage_error(runner, tmp_path):
    """They list every class already: --all-classes would do nothing there (eval's rule)."""
    root = make_class_files(tmp_path / "data", {"a": 1})
    for command in (["split", str(root), str(tmp_path / "out")], ["dataset-stats", str(root)]):
        refused = runner.invoke(app, [*command, "--all-classes", "--format", "json"])
        assert refused.exit_code == 2
        assert refused.stderr.strip() == (
            "Error: --all-classes shapes the table, and --format json lists every class already "
            "(drop --all-classes)"
        )
        assert not (tmp_path / "out").exists()
