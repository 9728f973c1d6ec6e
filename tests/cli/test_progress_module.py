"""Progress bars are drawn by one module, `torchkit/cli/progress.py`: no other module imports
rich.progress, and its bar shows done/total on a terminal and nothing off one."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
from rich.console import Console

import torchkit
from torchkit.cli import console
from torchkit.cli.progress import progress_bar

PACKAGE = Path(torchkit.__file__).parent
PROGRESS_MODULE = PACKAGE / "cli" / "progress.py"


def _imports_rich_progress(source: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        if any(name == "rich.progress" or name.startswith("rich.progress.") for name in names):
            return True
    return False


def test_the_scan_sees_each_way_of_importing_rich_progress():
    assert _imports_rich_progress("from rich.progress import Progress")
    assert _imports_rich_progress("def f():\n    import rich.progress")
    assert _imports_rich_progress("from rich import progress")
    assert not _imports_rich_progress("from rich.text import Text")
    assert _imports_rich_progress(PROGRESS_MODULE.read_text(encoding="utf-8"))


def test_only_cli_progress_imports_rich_progress():
    importers = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if _imports_rich_progress(path.read_text(encoding="utf-8"))
    )
    assert importers == ["cli/progress.py"]


@pytest.fixture
def stderr(monkeypatch):
    """Swaps the CLI's stderr console for one writing to a string, a terminal or not."""

    def make(terminal: bool) -> Console:
        made = Console(file=io.StringIO(), force_terminal=terminal, width=100)
        monkeypatch.setattr(console, "stderr", made, raising=False)
        return made

    return make


def test_the_bar_shows_done_of_total_on_a_terminal(stderr):
    terminal = stderr(True)
    with progress_bar("reading") as update:
        update(3, 10)
        update.status("a.png")
    drawn = terminal.file.getvalue()
    assert "reading" in drawn
    assert "3/10" in drawn
    assert "reading: a.png" in drawn


def test_the_bar_counts_from_its_first_update_and_shows_the_rate(stderr):
    terminal = stderr(True)
    with progress_bar(
        "extracting", rate_unit="img/s", keep=True, count_from_first_update=True
    ) as update:
        update(4, 10)
    assert "4/10" in terminal.file.getvalue()
    assert "img/s" in terminal.file.getvalue()


@pytest.mark.parametrize("options", [{}, {"refresh_in_thread": True, "eta": False}])
def test_the_bar_is_hidden_when_stderr_is_not_a_terminal(stderr, options):
    piped = stderr(False)
    with progress_bar("reading", **options) as update:
        update(3, 10)
        update.status("a.png")
    assert piped.file.getvalue() == ""


def test_a_hidden_bar_draws_nothing_on_a_terminal(stderr):
    terminal = stderr(True)
    with progress_bar("evaluating", hidden=True) as update:
        update(3, 10)
    assert terminal.file.getvalue() == ""


def test_a_hidden_bar_never_stops_so_older_rich_prints_no_empty_line(stderr, monkeypatch):
    # rich before Textualize/rich#3905 (13.8 is allowed) stopped hidden bars too, printing an
    # empty line where stderr is not a terminal: above a command's `Error:` line.
    from rich.progress import Progress

    def old_stop(self) -> None:
        self.live.stop()
        if not self.console.is_interactive:
            self.console.print()

    monkeypatch.setattr(Progress, "stop", old_stop)
    piped = stderr(False)
    with progress_bar("reading") as update:
        update(1, 2)
    assert piped.file.getvalue() == ""
