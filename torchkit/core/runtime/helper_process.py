"""A helper process that imports a heavy library beside a command's own start-up, then answers
its requests: work the command would otherwise do at its end, after paying that import.

matplotlib (train's curves.png) and scikit-learn (eval's metrics) each take a second or more to
import, and a command used to pay it at its end. A helper is started first thing, so the import
runs on another core while the command imports torch and loads its model and data; the command
then sends one JSON request per line on the helper's stdin and reads one JSON answer per line on
its stdout. Whenever the helper cannot answer (it failed to start, died, timed out, or answered
with an error) `call` returns None and the command does the work itself, as before: a result is
never lost, and the errors a user sees are the command's own.

A helper's life is its parent's: it ignores SIGINT, SIGTERM and SIGHUP (the command decides how
to stop, and may still want its answer) and exits when its stdin closes, which happens when the
command closes it or dies in any way. Processes forked from the command (DataLoader workers)
close their copy of the pipe at once, so that they cannot keep the helper alive.

A service is a module with `prepare()` (the heavy imports) and `answer(request) -> result`
(plain JSON values in and out); the helper runs `serve(module names)`. One helper may serve
several services (eval's metrics and its plots): one process, not one per library, on a
machine whose other cores are few; each request names its service.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

log = logging.getLogger("torchkit")

# The longest wait for one answer: the first use of matplotlib in an environment builds its font
# cache (seconds); past this the command does the work itself.
ANSWER_TIMEOUT_S = 120.0
# `-c` puts the working directory first on sys.path, where a user's json.py or selectors.py
# would shadow the standard library's: the helper takes it off before importing anything.
# (Not under PYTHONSAFEPATH, which leaves it out already.)
_SERVE = """import sys
if sys.path[:1] == [""]:
    del sys.path[0]
from torchkit.core.runtime.helper_process import serve
serve(*{services!r})
"""
_live: weakref.WeakSet[HelperProcess] = weakref.WeakSet()


def _close_in_forked_child() -> None:
    for helper in list(_live):
        helper.forget()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_close_in_forked_child)


class HelperProcess:
    """A running helper process serving one service (see the module's doc)."""

    def __init__(self, process: subprocess.Popen, *services: str) -> None:
        self.process: subprocess.Popen | None = process
        self.services = services
        self.service = services[0]  # the one a request goes to unless it names another
        self.answered = False  # whether it has answered anything (until then it may be killed)
        _live.add(self)

    @classmethod
    def spawn(cls, service: str, *more: str) -> HelperProcess | None:
        """A started helper for the module `service` (and the modules `more`, prepared after
        it), or None where it cannot start."""
        services = (service, *more)
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _SERVE.format(services=services)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=_environment(),
            )
        except OSError as error:
            log.info("no helper process for %s (%s): the command does its work", service, error)
            return None
        return cls(process, *services)

    def call(self, request: dict[str, Any], service: str | None = None) -> Any:
        """The answer of `service` (the first one by default) to `request`, or None when the
        helper gives none (the caller does the work itself). A helper that fails once is
        closed: no second try."""
        process = self.process
        if process is None:
            return None
        if process.poll() is not None:
            self.close()
            return None
        try:
            envelope = {"service": service or self.service, "request": request}
            line = json.dumps(envelope).encode() + b"\n"
        except (TypeError, ValueError):  # a value JSON cannot carry: done by the caller
            return None
        try:
            process.stdin.write(line)
            process.stdin.flush()
            raw = _read_line(process.stdout, ANSWER_TIMEOUT_S)
        except (OSError, ValueError) as error:  # a broken pipe: the helper is gone
            raw = f"no answer ({error})".encode()
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = {"error": raw.decode(errors="replace").strip() or "no answer"}
        if isinstance(answer, dict) and "result" in answer:
            self.answered = True
            return answer["result"]
        why = answer.get("error") if isinstance(answer, dict) else answer
        log.info("the %s helper gave no answer: %s", self.service, why)
        self.close()
        return None

    def close(self) -> None:
        """End the helper (its stdin closes: it exits) and reap it."""
        process, self.process = self.process, None
        if process is None:
            return
        _live.discard(self)
        _close_pipes(process)
        if not self.answered:  # a command that ends early waits for no import
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


def serve(*services: str) -> None:
    """The helper's main: import the services' libraries, in order, then answer each request
    (`{"service": NAME, "request": ...}`) until stdin closes."""
    import importlib
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if hasattr(signal, "SIGHUP"):  # the command takes it as SIGTERM (the terminal closed)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from torchkit.bytecode import keep_bytecode_cache

    keep_bytecode_cache()
    modules = {service: importlib.import_module(service) for service in services}
    # Prepared in order on a thread, so that a request waits only for its own service's
    # imports (eval's scores are not held up by matplotlib, which its plots need later). A
    # failed import is left to `answer`, whose error the command then sees.
    prepared = {service: threading.Event() for service in services}

    def prepare_all() -> None:
        for service in services:
            try:
                modules[service].prepare()
            except Exception:  # noqa: BLE001, S110 - answer() imports again and says why
                pass
            finally:
                prepared[service].set()

    threading.Thread(target=prepare_all, name="prepare", daemon=True).start()
    for line in sys.stdin.buffer:
        try:
            envelope = json.loads(line)
            service = envelope["service"]
            prepared[service].wait()
            answer = {"result": modules[service].answer(envelope["request"])}
        except Exception as error:  # noqa: BLE001 - the command does it itself and reports
            answer = {"error": f"{type(error).__name__}: {error}".replace("\n", " ")}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    # Every file is written and closed, every answer flushed: skip the interpreter's teardown
    # (about 0.1 s with matplotlib loaded), which the command waits for when it reaps the helper.
    os._exit(0)
