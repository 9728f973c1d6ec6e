"""curves.png drawn by a helper process that imports matplotlib beside the run's start
(core/train/curves_painter.py): the same file as the run draws itself, the run's own drawing
whenever the helper cannot answer, and a helper that never outlives its run."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from image_folders import write_image_folder
from processes import processes_in_group, start_torchkit_process, wait_until

from torchkit.core.train.curves_painter import CurvesPainter
from torchkit.core.train.outputs import write_curves_png
from torchkit.core.train.run_folder import RunFolder

pytestmark = pytest.mark.drawn_curves  # reads curves.png's picture (tests/conftest.py)

HISTORY = [
    {
        "epoch": epoch,
        "train_loss": 2.0 / epoch,
        "train_top1": 0.5 + epoch / 20,
        "val_loss": 1.5 / epoch if epoch != 2 else float("nan"),  # a gap, as a NaN plots
        "val_top1": 0.6 + epoch / 25,
        "lr": 0.1 / epoch,
    }
    for epoch in range(1, 6)
]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    status = Path(f"/proc/{pid}/stat")
    return not status.exists() or status.read_text().split(") ", 1)[1][:1] != "Z"


@pytest.fixture
def painter():
    started = CurvesPainter.spawn()
    assert started is not None
    yield started
    started.close()


def test_one_helper_draws_the_runs_file_in_a_shadowing_folder_through_signals_a_fork_and_a_failure(
    tmp_path, monkeypatch
):
    """One helper, many plots (each helper is a Python importing matplotlib: one for all of
    these): started in a user's folder that holds a json.py, selectors.py and signal.py (which
    `python -c` would import first), it draws the run's own file at a path relative to that
    folder; Ctrl-C and SIGTERM do not stop it (the run decides how to stop, and still draws its
    last plot); a run folder it cannot write into (a file) leaves the run to report the error
    of its own drawing; a forked process (DataLoader workers are forked from the run) does not
    keep it alive: their copy of its stdin is closed at once, or the helper would wait for them
    after the run closed it."""
    monkeypatch.chdir(tmp_path)
    for name in ("json", "selectors", "signal"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('shadowed')\n")
    painter = CurvesPainter.spawn()
    assert painter is not None
    try:
        assert painter.paint(Path("helper.png"), HISTORY, 3)  # relative: lands in tmp_path
        write_curves_png(tmp_path / "run.png", HISTORY, 3)
        assert (tmp_path / "helper.png").read_bytes() == (tmp_path / "run.png").read_bytes()
        painter.process.send_signal(signal.SIGINT)
        painter.process.send_signal(signal.SIGTERM)
        assert painter.paint(tmp_path / "again.png", HISTORY[:2], None)
        assert (tmp_path / "again.png").stat().st_size > 1000
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    except BaseException:
        painter.close()
        raise
    child = os.fork()
    if child == 0:  # pragma: no cover - the forked child
        time.sleep(20)
        os._exit(0)
    try:
        process = painter.process
        # A run folder that is a file: the helper cannot write into it, and the run reports it
        # as it always did, with the error of its own drawing; the failed helper is closed.
        blocked = tmp_path / "not-a-folder"
        blocked.write_text("")
        with pytest.raises(OSError) as own:
            write_curves_png(blocked / "curves.png", HISTORY, 2)
        folder = RunFolder()
        folder.path, folder.painter = blocked, painter
        with pytest.raises(type(own.value)):
            folder.write_curves(HISTORY, 2)
        assert blocked.read_text() == "" and painter.process is None
        # It ended because its stdin closed, not killed (a used helper ends, not killed; one
        # whose stdin the fork kept open would have been killed after close's wait).
        assert process.returncode == 0
    finally:
        painter.close()
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_a_dead_helper_leaves_the_plot_to_the_run(painter, tmp_path):
    folder = RunFolder()
    folder.path, folder.painter = tmp_path, painter
    painter.process.kill()
    painter.process.wait()
    folder.write_curves(HISTORY, 2)
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert painter.process is None  # given up: no second try on a dead helper


def test_a_helper_unless_matplotlib_is_already_imported(monkeypatch):
    monkeypatch.setenv("TORCHKIT_CURVES_HELPER", "0")  # the experiment's old switch: gone
    monkeypatch.delitem(sys.modules, "matplotlib.figure")  # imported by conftest
    started = CurvesPainter.start()
    assert started is not None
    started.close()
    monkeypatch.setitem(sys.modules, "matplotlib.figure", object())
    assert CurvesPainter.start() is None


def test_an_unused_helper_is_not_waited_for(painter, monkeypatch):
    # A run refused early (an existing run folder) ends at once, not after matplotlib's import:
    # the helper that has drawn nothing is killed before it is waited for (an order of calls,
    # not a time, which a busy machine stretches).
    process = painter.process
    calls: list[str] = []

    def recorded(name: str):
        method = getattr(process, name)

        def call(*args, **kwargs):
            calls.append(name)
            return method(*args, **kwargs)

        return call

    for name in ("kill", "wait"):
        monkeypatch.setattr(process, name, recorded(name))
    painter.close()
    assert calls[:2] == ["kill", "wait"] and process.returncode is not None


def test_the_helper_ends_when_its_run_is_killed(tmp_path):
    script = textwrap.dedent(
        """
        import sys, time
        from torchkit.core.train.curves_painter import CurvesPainter
        painter = CurvesPainter.spawn()
        print(painter.process.pid, flush=True)
        time.sleep(60)
        """
    )
    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        helper = int(run.stdout.readline())
        assert _alive(helper)
        run.kill()  # SIGKILL: no cleanup of any kind in the run
        run.wait()
        wait_until(lambda: not _alive(helper), what="the helper to exit")  # a hang only
    finally:
        run.kill()
        run.wait()


def test_a_real_run_has_its_plot_drawn_by_the_helper_and_leaves_no_process(tmp_path):
    # 12 images of 8x8: the helper's part is the same for any run, and digits' 1,797 images
    # cost a second and a half of the process's CPU.
    write_image_folder(tmp_path / "data", {"a": 6, "b": 6})
    out = tmp_path / "run"
    run = start_torchkit_process(
        "train", "--data", "data", "--val-split", "0.3", "--model", "convnet", "--image-size",
        "8", "--batch-size", "4", "--workers", "0", "--epochs", "1", "--out", str(out), "-v",
        cwd=tmp_path,
    )  # fmt: skip

    def helper_running() -> bool:
        for pid in processes_in_group(run.pid):
            with contextlib.suppress(OSError):
                if b"torchkit.core.plotting" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
        return False

    wait_until(helper_running, process=run, timeout=120, what="the plotting helper")
    _, stderr = run.communicate(timeout=240)
    assert run.returncode == 0, stderr
    assert (out / "curves.png").stat().st_size > 1000
    assert "plotting helper" not in stderr  # it answered: the run did not draw it itself
    assert processes_in_group(run.pid) == []
    # train -v's last line counts from the process's start where torchkit is the program
    assert re.search(
        r"run: [\d.]+ s since the process started: [\d.]+ s before the run began", stderr
    )
