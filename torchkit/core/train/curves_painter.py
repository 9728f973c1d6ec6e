"""curves.png drawn by a helper process that imports matplotlib while the run starts.

Importing matplotlib's figure machinery takes about a second, and a run used to pay it at its
end, before exiting: a tenth of the digits main job. The helper is started first thing (before
torch is imported), so the import runs on another core beside the run's own start-up; it then
waits on its stdin for one JSON request per plot and answers `ok`, or the error it met, on its
stdout. Whenever it cannot answer (it failed to start, died, or said anything but `ok`) the run
draws the plot itself, as before, so a plot is never lost and its errors (a full disk) are the
ones the run reports.

The helper's life is its parent's: it ignores SIGINT and SIGTERM (the run decides how to stop,
and may still want its last plot) and exits when its stdin closes, which happens when the run
closes it or dies in any way. Processes forked from the run (DataLoader workers) close their
copy of that pipe at once, so that they cannot keep the helper alive. No helper is started where
matplotlib is already imported (the plot costs no import there).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

log = logging.getLogger("torchkit")

# The longest wait for one plot: the first use of matplotlib in an environment builds its font
# cache (seconds); past this the run draws the plot itself.
ANSWER_TIMEOUT_S = 120.0
# `-c` puts the working directory first on sys.path, where a user's json.py or selectors.py
# would shadow the standard library's: the helper takes it off before importing anything.
# (Not under PYTHONSAFEPATH, which leaves it out already.)
_SERVE = """import sys
if sys.path[:1] == [""]:
    del sys.path[0]
from torchkit.core.train.curves_painter import serve
serve()
"""
_live: weakref.WeakSet[CurvesPainter] = weakref.WeakSet()


def _close_in_forked_child() -> None:
    for painter in list(_live):
        painter.forget()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_close_in_forked_child)


class CurvesPainter:
    """A running helper process (see the module's doc)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process: subprocess.Popen | None = process
        self.painted = False  # whether it has drawn anything (until then it may be killed)
        _live.add(self)

    @classmethod
    def start(cls) -> CurvesPainter | None:
        """A started helper, or None where matplotlib is already imported or it cannot start."""
        if "matplotlib.figure" in sys.modules:
            return None
        return cls.spawn()

    @classmethod
    def spawn(cls) -> CurvesPainter | None:
        """A started helper, or None where it cannot start."""
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _SERVE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=_environment(),
            )
        except OSError as error:
            log.info("no plotting helper (%s): curves.png is drawn by the run", error)
            return None
        return cls(process)

    def paint(self, path: Path, history: list[dict], best_epoch: int | None) -> bool:
        """Whether the helper wrote curves.png at `path` (False: the caller draws it)."""
        process = self.process
        if process is None:
            return False
        if process.poll() is not None:
            self.close()
            return False
        # Absolute: the helper keeps the working directory it was started in.
        request = {"path": os.path.abspath(path), "history": history, "best_epoch": best_epoch}
        try:
            line = json.dumps(request).encode() + b"\n"
        except (TypeError, ValueError):  # a value JSON cannot carry: drawn here
            return False
        try:
            process.stdin.write(line)
            process.stdin.flush()
            answer = _read_line(process.stdout, ANSWER_TIMEOUT_S)
        except (OSError, ValueError) as error:  # a broken pipe: the helper is gone
            answer = f"no answer ({error})".encode()
        if answer.strip() == b"ok":
            self.painted = True
            return True
        why = answer.decode(errors="replace").strip() or "no answer"
        log.info("the plotting helper did not draw curves.png: %s", why)
        self.close()
        return False

    def close(self) -> None:
        """End the helper (its stdin closes: it exits) and reap it."""
        process, self.process = self.process, None
        if process is None:
            return
        _live.discard(self)
        _close_pipes(process)
        if not self.painted:  # a run that ends early (a refused folder) waits for no import
            process.kill()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def forget(self) -> None:
        """In a forked child: close this process's copies of the pipes, touch nothing else.
        The descriptors are pointed at /dev/null rather than the streams closed: closing would
        flush them and take their locks, which a thread of the parent may have held."""
        process, self.process = self.process, None
        if process is None:
            return
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for stream in (process.stdin, process.stdout):
                with contextlib.suppress(OSError, ValueError):
                    os.dup2(null, stream.fileno())
        finally:
            os.close(null)
        process.returncode = 0  # not this process's child: never wait for it


def _close_pipes(process: subprocess.Popen) -> None:
    for stream in (process.stdin, process.stdout):
        with contextlib.suppress(OSError):
            stream.close()


def _environment() -> dict[str, str]:
    """This process's environment, with PYTHONPATH naming the source tree torchkit was
    imported from when it is not installed (a checkout on sys.path), so the helper finds it."""
    import site

    import torchkit

    environment = dict(os.environ)
    root = Path(torchkit.__file__).resolve().parents[1]
    installed = [*site.getsitepackages(), site.getusersitepackages()]
    if not any(Path(folder).resolve() == root for folder in installed):
        # After the user's own entries: found, without shadowing anything of theirs.
        rest = environment.get("PYTHONPATH", "")
        environment["PYTHONPATH"] = (rest + os.pathsep if rest else "") + str(root)
    return environment


def _read_line(stream: Any, timeout: float) -> bytes:
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    try:
        if not selector.select(timeout):
            return b"no answer in time"
        return stream.readline()
    finally:
        selector.close()


def serve() -> None:
    """The helper's main: import matplotlib, then draw each request until stdin closes."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from torchkit.bytecode import keep_bytecode_cache

    keep_bytecode_cache()
    from torchkit.core.train.outputs import import_plotting, write_curves_png

    import_plotting()
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            write_curves_png(Path(request["path"]), request["history"], request["best_epoch"])
            answer = "ok"
        except Exception as error:  # noqa: BLE001 - the run draws it itself and reports
            answer = f"{type(error).__name__}: {error}".replace("\n", " ")
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    # Every file is written and closed, every answer flushed: skip the interpreter's teardown
    # (about 0.1 s with matplotlib loaded), which the run waits for when it reaps the helper.
    os._exit(0)
