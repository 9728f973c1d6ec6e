"""Progress bars are drawn by one module, `torchkit/cli/progress.py`: no other module imports
rich.progress, and its bar shows done/total on a terminal and nothing off one; a process forked
while a bar redraws from its thread, or while another thread writes on stderr, can write to
stderr."""

from __future__ import annotations

import ast
import io
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
from multiprocessing import popen_fork
from pathlib import Path

import pytest
from rich.console import Console

import torchkit
from torchkit.cli import console, progress
from torchkit.cli.progress import progress_bar, stderr_progress

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
    spellings = (
        "from rich.progress import Progress",
        "import rich.progress",
        "from rich import progress",
    )
    assert all(map(_may_import_rich_progress, spellings))  # the filter lets every way through
    assert _may_import_rich_progress(PROGRESS_MODULE.read_text(encoding="utf-8"))


def _may_import_rich_progress(source: str) -> bool:
    # An import of rich.progress spells both names in the source: only those files are parsed
    # (parsing all of torchkit's 2.6 MB of sources cost about 2.5 s of CPU).
    return "rich" in source and "progress" in source


def test_only_cli_progress_imports_rich_progress():
    sources = {path: path.read_text(encoding="utf-8") for path in PACKAGE.rglob("*.py")}
    importers = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path, source in sources.items()
        if _may_import_rich_progress(source) and _imports_rich_progress(source)
    )
    assert importers == ["cli/progress.py"]


@pytest.fixture
def stderr(monkeypatch):
    """Swaps the CLI's stderr console for one writing to a string, a terminal or not."""

    def make(terminal: bool) -> Console:
        made = console.make_console(file=io.StringIO(), force_terminal=terminal, width=100)
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


def _writes_to_stderr() -> None:
    console.stderr.print("Warning: a DataLoader worker's line")


def _waits_in(code, thread: int) -> bool:
    frame = sys._current_frames().get(thread)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame is not None


def test_a_process_forked_mid_redraw_can_write_to_stderr(stderr):
    """train's, eval's and extract-features' bars redraw from a thread while DataLoader
    workers fork: a worker forked mid-redraw inherited the redraw's locks held, and hung at its
    first line on stderr. The fork now ends the redraw thread, after its redraw, first."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    stderr(True)
    redrawing, redrawn = threading.Event(), threading.Event()

    class Slow(ProgressColumn):
        def render(self, task) -> Text:
            if threading.current_thread() is not threading.main_thread():  # the redraw thread
                redrawing.set()
                redrawn.wait(30)
            return Text("slow")

    main = threading.get_ident()

    def end_the_redraw_once_a_fork_waits_for_it() -> None:
        while not redrawn.is_set():
            if _waits_in(progress._pause_redraws.__code__, main):
                redrawn.set()
            redrawn.wait(0.01)

    with stderr_progress(Slow()) as bar:
        bar.add_task("epoch 1/1")
        assert redrawing.wait(10)
        threading.Thread(target=end_the_redraw_once_a_fork_waits_for_it, daemon=True).start()
        child = multiprocessing.get_context("fork").Process(target=_writes_to_stderr)
        child.start()
        child.join(20)
        redrawn.set()
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == 0


def _bar_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name == "torchkit-progress"]


def test_a_process_forks_without_the_bars_redraw_thread(stderr):
    """Was forked beside rich's redraw thread (a lock the thread held stayed held in the child;
    Python 3.12+ warns that the child may deadlock): a fork ends the thread first, and the
    bar's next update starts it again, not the fork (the next worker's would be beside it)."""
    from rich.progress import TextColumn

    stderr(True)
    with stderr_progress(TextColumn("{task.description}")) as bar:
        task = bar.add_task("epoch 1/1")
        assert _bar_threads() == ["torchkit-progress"]
        child = multiprocessing.get_context("fork").Process(target=_bar_threads)
        child.start()
        child.join(20)
        assert child.exitcode == 0
        assert _bar_threads() == []
        bar.update(task, description="epoch 1/1: step 1")
        assert _bar_threads() == ["torchkit-progress"]
    assert _bar_threads() == []


# The thread that forks prints on stderr (its write forks) while the bar redraws from its
# thread: a fork's wait for a redraw in flight that waits for the print's lock never ended.
_FORK_WHILE_PRINTING = """
import io, os, threading
from rich.progress import ProgressColumn
from rich.text import Text
from torchkit.cli import console, progress

redrawing = threading.Event()

class Forking(io.StringIO):
    armed = False

    def write(self, text):
        if self.armed and threading.current_thread() is threading.main_thread():
            self.armed = False
            child = os.fork()
            if child == 0:
                os._exit(0)
            assert os.waitpid(child, 0)[1] == 0
        return super().write(text)

class Seen(ProgressColumn):
    def render(self, task):
        if threading.current_thread() is not threading.main_thread():
            redrawing.set()
        return Text("seen")

terminal = Forking()
console.stderr = console.make_console(file=terminal, force_terminal=True, width=100)
with progress.stderr_progress(Seen()) as bar:
    bar.add_task("epoch 1/1")
    assert redrawing.wait(10)
    terminal.armed = True
    console.warn("forking")
print("forked")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_fork_made_while_printing_does_not_wait_forever_for_the_redraw():
    """Hung: a fork waited for the redraw in flight, which waited for the console's lock that
    the forking thread held. A redraw waits for no write: it skips its tick."""
    # A new interpreter's imports take seconds on a loaded machine: only the hang (for ever)
    # runs out this wait.
    script = [sys.executable, "-c", _FORK_WHILE_PRINTING]
    done = subprocess.run(script, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "forked\n"), done.stderr


class _StallingTerminal(io.StringIO):
    """A terminal that stops taking the lines of any thread but the main one (a stalled ssh
    link) until `resume` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled, self.resume = threading.Event(), threading.Event()

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if threading.current_thread() is not threading.main_thread():
            self.stalled.set()
            self.resume.wait(30)
        return super().write(text)


@pytest.fixture
def stalling_stderr(monkeypatch):
    """The CLI's stderr console on a `_StallingTerminal`."""
    terminal = _StallingTerminal()
    made = console.make_console(file=terminal, force_terminal=True, width=100)
    monkeypatch.setattr(console, "stderr", made, raising=False)
    yield terminal
    terminal.resume.set()


def _in_a_fork_hook(thread: int) -> bool:
    """`thread` runs a hook of os.fork's, called by multiprocessing's fork start."""
    frame = sys._current_frames().get(thread)
    return frame is not None and getattr(frame.f_back, "f_code", None) is (
        popen_fork.Popen._launch.__code__
    )


def test_a_process_forked_while_another_thread_writes_on_stderr_can_write(stalling_stderr):
    """A fork beside a thread that was writing a line (a warning from a thread of core's; a bar's
    redraw on a terminal that stalled for more than the 5 s a fork waited for it) gave the child
    the console's lock held: it hung at its first line on stderr. A fork now waits for the
    write in flight."""
    terminal, main = stalling_stderr, threading.get_ident()
    threading.Thread(target=console.warn, args=("a thread's warning",), daemon=True).start()
    assert terminal.stalled.wait(10)

    def resume_once_the_fork_waits() -> None:
        while not terminal.resume.is_set():
            if _in_a_fork_hook(main):
                terminal.resume.set()
            terminal.resume.wait(0.01)

    threading.Thread(target=resume_once_the_fork_waits, daemon=True).start()
    child = multiprocessing.get_context("fork").Process(target=_writes_to_stderr)
    child.start()
    terminal.resume.set()  # the fork went ahead (or waited, and it is set already)
    child.join(10)
    if child.is_alive():
        child.kill()
        child.join()
    assert child.exitcode == 0
    assert "a thread's warning" in terminal.getvalue()


def test_a_bar_fed_an_update_an_item_redraws_a_few_times_a_second(stderr, monkeypatch):
    """Core calls back once an item; the bar redrew the terminal on every call (1-2 ms of CPU
    each: most of `convert shards`' CPU on tiny images). 1,000 updates over one second of the
    clock now draw the first, about ten more, and the last."""
    terminal = stderr(True)
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with progress_bar("writing shards") as update:
        for done in range(1, 1001):
            update(done, 1000)
            clock[0] += 0.001
    drawn = [int(count) for count in re.findall(r"(\d+)/1000", terminal.file.getvalue())]
    assert drawn[0] == 1
    assert drawn[-1] == 1000
    assert drawn == sorted(drawn)
    assert 10 <= len(set(drawn)) <= 14


class _WatchedTerminal(io.StringIO):
    """A terminal that tells when `text` is first written to it."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.seen = text, threading.Event()

    def write(self, text: str) -> int:
        if self.text in text:
            self.seen.set()
        return super().write(text)


def _watched_stderr(monkeypatch, text: str) -> _WatchedTerminal:
    """stderr made a terminal that tells when `text` is first written to it."""
    terminal = _WatchedTerminal(text)
    made = console.make_console(file=terminal, force_terminal=True, width=100)
    monkeypatch.setattr(console, "stderr", made, raising=False)
    return terminal


def test_a_pause_after_a_burst_of_updates_shows_the_bursts_last_count(monkeypatch):
    """A bar without a redraw thread drew an update only when the next came: after a burst of
    items (each within the 0.1 s between redraws) and a pause, it showed the burst's first
    count until the next item. The last count is drawn about 0.1 s later, with no update."""
    terminal = _watched_stderr(monkeypatch, "50/100")
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with progress_bar("writing shards") as update:
        for done in range(1, 51):
            update(done, 100)
            clock[0] += 0.001
        assert "50/100" not in terminal.getvalue()  # within the interval: not drawn at once
        clock[0] += 1.0  # the pause
        assert terminal.seen.wait(30)  # drawn without another update
        drawn = [int(count) for count in re.findall(r"(\d+)/100\b", terminal.getvalue())]
        assert drawn == [1, 50]
    assert not [t for t in threading.enumerate() if t.name == "torchkit-progress-late"]


class _TickedLock:
    """The console's write lock, telling when the late redraw's thread has tried it `ticks`
    times (once a tick of its, before it would draw)."""

    def __init__(self, ticks: int) -> None:
        self.lock, self.tries, self.ticks = threading.RLock(), 0, ticks
        self.ticked = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        taken = self.lock.acquire(blocking, timeout)
        if threading.current_thread().name == "torchkit-progress-late":
            self.tries += 1
            if self.tries >= self.ticks:
                self.ticked.set()
        return taken

    def release(self) -> None:
        self.lock.release()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_the_late_redraw_waits_the_interval_from_an_updates_drawing(monkeypatch):
    """The late redraw's thread drew a tick after each undrawn update however lately an update
    had drawn the bar: a stream of updates was drawn about 17 times a second, not 10 (1M tiny
    updates: 249 drawings in 15 s against 128 in 14 s, a fifth more CPU). It now waits the
    interval from the last drawing, by either."""
    terminal = _watched_stderr(monkeypatch, "2/100")
    lock = _TickedLock(ticks=3)
    monkeypatch.setattr(console, "write_lock", lock)
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with progress_bar("writing shards") as update:
        update(1, 100)  # drawn at once
        clock[0] += 0.05
        update(2, 100)  # within the interval: left to the thread
        assert lock.ticked.wait(30)  # its ticks, with no time passed since the drawing
        assert "2/100" not in terminal.getvalue()
        clock[0] += 0.1
        assert terminal.seen.wait(30)  # the interval passed: drawn
        drawn = [int(count) for count in re.findall(r"(\d+)/100\b", terminal.getvalue())]
        assert drawn == [1, 2]


def test_a_ctrl_c_as_the_late_redraw_starts_is_a_ctrl_c(monkeypatch):
    """A Ctrl-C landing as an update started the late redraw's thread (before it ran) left the
    bar's end a thread to join that never started: a RuntimeError replaced the
    KeyboardInterrupt (a traceback, exit 1 where 130 is due)."""
    _watched_stderr(monkeypatch, "")

    class Interrupted(threading.Thread):
        def start(self) -> None:
            raise KeyboardInterrupt

    monkeypatch.setattr(progress.threading, "Thread", Interrupted)
    with pytest.raises(KeyboardInterrupt), progress_bar("writing shards") as update:
        update(1, 100)  # drawn at once
        update(2, 100)  # left to the thread, which the Ctrl-C meets
