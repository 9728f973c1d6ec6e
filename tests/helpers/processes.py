"""torchkit run by a test: through the app in this process (`run_torchkit_in_process`, the
default: milliseconds), or as a real `python -m torchkit` process where the process is the
subject (signals, exit codes, locks, full disks, pipes); waiting for and signalling such
processes. A real process is forked from a Python that has imported torch already
(preloaded_processes.py: about 2.5 s of CPU spared each) unless told `fresh=True`, for tests
whose subject is a fresh interpreter's start-up (imports, `import torch` itself, start-up
times), or unless TORCHKIT_TEST_FRESH_PROCESSES=1."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from suite_paths import REPO
from typer.testing import CliRunner

# The environment a test's torchkit run never inherits: tests say what they want.
INHERITED = ("TORCHKIT_DEBUG", "FORCE_COLOR", "NO_COLOR")

# A standard descriptor closed at the process's start, as a shell's `>&-` or `2>&-` starts it
# (not subprocess.PIPE, -1, nor any descriptor).
CLOSED = "closed"

# What a start_torchkit_process's stdout or stderr may be: None (a pipe, the default), a
# descriptor of this process (a file, /dev/full, a pipe's write end), or CLOSED.
Stream = int | str | None


def child_environment(env: dict[str, str] | None) -> dict[str, str]:
    """The environment of a torchkit process a test starts: this process's, less INHERITED,
    with `env` added."""
    full_env = {key: value for key, value in os.environ.items() if key not in INHERITED}
    full_env.update(env or {})
    return full_env


def run_torchkit_process(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    fresh: bool = False,
    stdout: Stream = None,
    stderr: Stream = None,
    pass_fds: Sequence[int] = (),
    text: bool = True,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Run `python -m torchkit ARGS` in a real process (a fork of a preloaded torch, or with
    `fresh` a new interpreter: about a second without torch, three with it), as subprocess.run
    with `text` (else bytes), a `timeout` (s), and stdout and stderr captured unless given (a
    descriptor, or CLOSED at its start: then None in the result), `pass_fds` kept open under
    their numbers: for checks whose subject is the process (signals, the interpreter's exit,
    a full disk, closed or full standard descriptors, a hook in sitecustomize, imports:
    `fresh`); `run_torchkit_in_process` does the rest."""
    process = start_torchkit_process(
        *args,
        env=env,
        cwd=cwd,
        fresh=fresh,
        stdout=stdout,
        stderr=stderr,
        pass_fds=pass_fds,
        text=text,
        new_session=False,
    )
    with process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as error:
            error.output, error.stderr = killed(process)
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


# How long the output of a process that has ended (or been killed) is read for: a process it
# started that outlives it (a helper, a loader worker forked by a thread, one in a session of
# its own) keeps its stdout and stderr open for as long as it lives, and an unbounded read of
# them to their end hung the test, and the run behind it, that long.
OUTPUT_AFTER_END_S = 10.0


def killed(process: Any) -> tuple[Any, Any]:
    """Kill `process` (a Popen or a PreloadedProcess), with its process group where it leads
    one (its workers and helpers), reap it and return what is left of its (stdout, stderr):
    read for OUTPUT_AFTER_END_S at most, then given up on (what came by then)."""
    if process.poll() is None:
        with contextlib.suppress(OSError):
            if os.getpgid(process.pid) == process.pid:  # never this process's own group
                os.killpg(process.pid, 9)
        process.kill()
    return output_after_end(process)


def output_after_end(process: Any) -> tuple[Any, Any]:
    """What is left of the (stdout, stderr) of `process`, ended or killed, and reaped: read
    for OUTPUT_AFTER_END_S at most, then given up on (what came by then, closed unread)."""
    try:
        return process.communicate(timeout=OUTPUT_AFTER_END_S)
    except subprocess.TimeoutExpired as error:
        out, err = error.output, error.stderr
        if isinstance(process, subprocess.Popen):  # no thread reads its pipes: closed here
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
            if process.text_mode:
                out, err = (None if b is None else b.decode(errors="replace") for b in (out, err))
        process.wait()  # it has ended or was killed: reaped at once
        return out, err


@contextlib.contextmanager
def working_directory(path: str | os.PathLike):
    """`contextlib.chdir` (Python 3.11) for the suite on Python 3.10 too."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def run_torchkit_in_process(
    *args: object, cwd: str | os.PathLike | None = None
) -> subprocess.CompletedProcess:
    """`torchkit ARGS` through the app in this process, in `cwd`, with the result of
    `run_torchkit_process` (exit code, stdout, stderr apart): a refusal costs milliseconds,
    not an interpreter and its imports. An exception the CLI lets escape fails the test, and so
    does an output that a command ending well left open (`open_outputs.left_open_on_success`)."""
    from torchkit.cli import app
    from torchkit.core.io import open_outputs

    environment = dict.fromkeys(INHERITED)  # unset while it runs
    words = [str(arg) for arg in args]
    open_outputs.left_open_on_success.clear()
    with working_directory(cwd or REPO):
        result = CliRunner().invoke(
            app, words, env=environment, catch_exceptions=False, prog_name="torchkit"
        )
    if open_outputs.left_open_on_success:  # discarded at the end, with only a warning to see
        left = ", ".join(open_outputs.left_open_on_success)
        open_outputs.left_open_on_success.clear()
        pytest.fail(f"torchkit {' '.join(words)} ended well but left outputs open: {left}")
    return subprocess.CompletedProcess(words, result.exit_code, result.stdout, result.stderr)


def run_json(*args: object) -> Any:
    """`torchkit ARGS --format json` in this process: its parsed stdout (it must succeed)."""
    import json

    result = run_torchkit_in_process(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def dataset_stats(data: object, *extra: object) -> dict:
    """`dataset-stats DATA` as JSON without its `source` (which names the data as given)."""
    found = run_json("dataset-stats", data, *extra)
    found.pop("source")
    return found


def run_each_in_process(
    commands: Sequence[Sequence[object]],
    *,
    cwd: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
) -> list[subprocess.CompletedProcess]:
    """`run_torchkit_in_process` for each command in turn; `cwd` is the working directory of
    all, or a list, one each."""
    cwds = list(cwd) if isinstance(cwd, list | tuple) else [cwd] * len(commands)
    return [
        run_torchkit_in_process(*args, cwd=where)
        for args, where in zip(commands, cwds, strict=True)
    ]


def start_torchkit_process(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    stdin: int | None = None,
    fresh: bool = False,
    stdout: Stream = None,
    stderr: Stream = None,
    pass_fds: Sequence[int] = (),
    text: bool = True,
    new_session: bool = True,
) -> subprocess.Popen:
    """Start `python -m torchkit ARGS` in its own session (process group = its PID, so that
    `processes_in_group` finds every worker it started; without a controlling terminal);
    stdout and stderr are pipes unless given (a descriptor, or CLOSED at its start), stdin a
    pipe with `stdin=subprocess.PIPE` (bytes, not text, where not `text`); `pass_fds` are
    kept open under their numbers. Forked
    from a preloaded torch (a PreloadedProcess, with Popen's interface) unless `fresh`: then a
    new interpreter, a Popen. (`new_session=False` is run_torchkit_process's: a fork is always
    in its own session, a fresh process then in the test's, as subprocess.run starts it.)"""
    if not fresh:
        from preloaded_processes import start_preloaded_process

        return start_preloaded_process(
            *args,
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            pass_fds=pass_fds,
            text=text,
        )
    return _start_fresh(
        *args,
        env=env,
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        pass_fds=pass_fds,
        text=text,
        new_session=new_session,
    )


def _start_fresh(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    stdin: int | None = None,
    stdout: Stream = None,
    stderr: Stream = None,
    pass_fds: Sequence[int] = (),
    text: bool = True,
    new_session: bool = True,
    module: str = "torchkit",
) -> subprocess.Popen:
    closed = [fd for fd, stream in ((1, stdout), (2, stderr)) if stream == CLOSED]

    def close_at_start() -> None:  # after Popen's own set-up, before the interpreter starts
        for fd in closed:
            os.close(fd)

    def given(stream: Stream) -> int | None:
        return subprocess.PIPE if stream is None else None if stream == CLOSED else stream

    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdin=stdin,
        stdout=given(stdout),
        stderr=given(stderr),
        text=text,
        env=child_environment(env),
        cwd=cwd or REPO,
        start_new_session=new_session,
        pass_fds=tuple(pass_fds),
        preexec_fn=close_at_start if closed else None,
    )


class PipeLines:
    """The lines of a process's pipe as they come, read by a thread: `next()` waits for the
    next one (a test of output that streams: the first rows before the input has ended)."""

    def __init__(self, stream) -> None:
        import queue
        import threading

        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def next(self, timeout: float = 60) -> str | None:
        """The next line (None at the end of the pipe); fails after `timeout` s without one."""
        import queue

        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no line in {timeout} s")

    def rest(self) -> list[str]:
        """The lines left, once the process has ended."""
        lines = []
        while (line := self.next()) is not None:
            lines.append(line)
        return lines


def wait_until(
    condition: Callable[[], object],
    *,
    process: subprocess.Popen | None = None,
    timeout: float = 120,
    what: str = "the condition",
) -> None:
    """Poll `condition` until it is true; fail if `process` ends first or time runs out."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            out, err = output_after_end(process)
            pytest.fail(f"the process ended (rc {process.returncode}) before {what}:\n{err}")
        if time.monotonic() > deadline:
            if process is not None:
                process.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def signal_and_wait(
    process: subprocess.Popen, signum: int, *, timeout: float = 120, group: bool = False
) -> tuple[int, str, str]:
    """Send `signum` to the process (not its group: as `kill PID` would), or with `group` to
    its whole process group (its workers too: as Ctrl-C in a terminal, `timeout`, systemd or
    `kill -- -PGID` do), and wait for it: (exit code, stdout, stderr)."""
    if group:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = killed(process)
        pytest.fail(f"the process did not end within {timeout} s of signal {signum}:\n{err}")
    return process.returncode, out, err


def processes_in_group(pgid: int) -> list[int]:
    """PIDs still alive in process group `pgid` (Linux /proc), zombies excluded."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry))
    return alive
