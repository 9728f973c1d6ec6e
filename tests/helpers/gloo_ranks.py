"""`python -m torchkit ARGS` as the ranks of a Gloo world on this machine, started the way
torchrun starts them (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, one
torch thread) but without its agent in between.

torchkit reads only those variables, so the ranks run the code they run under torchrun; each
rank's own exit code and output are seen, a signal reaches one rank only, and a rank that
hangs fails the test instead of being killed by the agent. It also spares each launch the
agent's own start (a Python importing torch and the elastic machinery: about 6 s of a
2-core machine's time). The tests of torchrun's own part (its rendezvous, several nodes)
launch it for real: test_train_ddp.py.

Each rank is forked from a Python that has imported torch already (preloaded_processes.py,
one server a rank number: about 2.5 s of CPU a rank spared), and then runs as a fresh
`python -m torchkit` would; what a fork cannot give starts fresh, and
TORCHKIT_TEST_FRESH_PROCESSES=1 starts every rank fresh."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from processes import killed, start_torchkit_process
from suite_paths import HELPERS, REPO

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")

# torchrun's variables as no torchrun sets them, and the one line each is refused with (train,
# eval and predict alike: one reader, core.runtime.launch.launch_env).
BAD_LAUNCHES = [
    pytest.param(
        {"WORLD_SIZE": "2"},
        "Error: WORLD_SIZE is set to '2' but RANK is not set (torchrun sets both; unset "
        "WORLD_SIZE to run one process)",
        id="world-without-rank",
    ),
    pytest.param(
        {"RANK": "x"},
        "Error: RANK is set to 'x' (torchrun sets it to the process's rank; unset it to run "
        "one process)",
        id="rank-not-a-number",
    ),
    pytest.param(
        {"WORLD_SIZE": "two", "RANK": "0"},
        "Error: WORLD_SIZE is set to 'two' (torchrun sets it to the number of processes; "
        "unset it to run one process)",
        id="world-not-a-number",
    ),
    pytest.param(
        {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "-1"},
        "Error: LOCAL_RANK is set to '-1' (torchrun sets it to the process's rank on its "
        "node; unset it to run one process)",
        id="negative-local-rank",
    ),
    pytest.param(
        {"RANK": "1"},
        "Error: RANK is set to '1' but WORLD_SIZE is not set (torchrun sets RANK from 0 to "
        "WORLD_SIZE - 1; unset RANK to run one process)",
        id="rank-outside-the-world",
    ),
]


def set_launch_env(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    """torchrun's variables exactly as `values` says (the others unset)."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_ranks(
    *args: object,
    env: dict[str, str] | None = None,
    world: int = 2,
    cwd: Path = REPO,
    rank_args: dict[int, Sequence[object]] | None = None,
    stdin: int | None = None,
) -> list[subprocess.Popen]:
    """Start ranks 0..world-1 of `python -m torchkit ARGS`; `env` is added to each one's.
    `rank_args` gives some ranks other ARGS (as another node's command line may differ);
    `stdin` (a file descriptor) is every rank's, as torchrun's ranks share its stdin."""
    base = {
        "PYTHONPATH": str(HELPERS),
        "OMP_NUM_THREADS": "1",
        "NO_COLOR": "1",
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    return [
        start_torchkit_process(
            *map(str, (rank_args or {}).get(rank, args)),
            env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank), **(env or {})},
            cwd=cwd,
            stdin=stdin,
        )
        for rank in range(world)
    ]


def finish(process: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """Wait for one rank; one that has not ended after `timeout` seconds (a hang) fails the test."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = killed(process)
        pytest.fail(f"rank did not end within {timeout} s (a hang):\n{(err or '')[-3000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def run_ranks(
    *args: object,
    env: dict[str, str] | None = None,
    world: int = 2,
    timeout: float = 120,
    cwd: Path = REPO,
    rank_args: dict[int, Sequence[object]] | None = None,
    stdin: int | None = None,
) -> list[subprocess.CompletedProcess]:
    """Every rank of `python -m torchkit ARGS`, run to its end: [rank 0, rank 1, ...]."""
    started = start_ranks(*args, env=env, world=world, cwd=cwd, rank_args=rank_args, stdin=stdin)
    try:
        return [finish(process, timeout) for process in started]
    finally:
        _kill_the_rest(started)


def _kill_the_rest(started: list[subprocess.Popen]) -> None:
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def run_ranks_under_agent(
    *args: object,
    env: dict[str, str] | None = None,
    world: int = 2,
    timeout: float = 60,
    cwd: Path = REPO,
) -> list[subprocess.CompletedProcess]:
    """Every rank of `python -m torchkit ARGS` as torchrun's agent runs them: with its
    TORCHELASTIC_RUN_ID, and once a rank ends with a non-zero code the others are sent SIGTERM,
    as the agent stops a failed worker group. [rank 0, rank 1, ...]."""
    agent = {"TORCHELASTIC_RUN_ID": "test", **(env or {})}
    started = start_ranks(*args, env=agent, world=world, cwd=cwd)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            codes = [process.poll() for process in started]
            if any(codes) or None not in codes:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):  # the agent's monitor interval
                started[codes.index(None)].wait(timeout=0.1)
        for process in started:
            if process.poll() is None:
                process.terminate()
        return [finish(process, timeout) for process in started]
    finally:
        _kill_the_rest(started)


def error_lines_of(ranks: list[subprocess.CompletedProcess]) -> list[str]:
    """The `Error:` lines of every rank's stderr, rank 0's first."""
    return [
        line for done in ranks for line in done.stderr.splitlines() if line.startswith("Error:")
    ]


def stderr_of(ranks: list[subprocess.CompletedProcess]) -> str:
    return "\n".join(f"--- rank {number}\n{done.stderr}" for number, done in enumerate(ranks))


# A sitecustomize for the ranks (`watching_forks`): each fork of a rank appends a line to
# TORCHKIT_TEST_FORK_LOG.RANK, the names of the threads of the process as it forks (OpenMP's
# and Gloo's too: threading knows only Python's), every one (process_threads.py: one listing of
# /proc/self/task may end early, and a thread beside a fork would go unseen).
_FORK_WATCH = textwrap.dedent(
    """
    import os

    _log = os.environ.get("TORCHKIT_TEST_FORK_LOG")

    def _note_fork():
        names = []
        for task in thread_ids():
            try:
                with open(f"/proc/self/task/{task}/comm") as comm:
                    names.append(comm.read().strip())
            except OSError:  # the thread ended meanwhile
                pass
        with open(f"{_log}.{os.environ.get('RANK')}", "a") as log:
            log.write(" ".join(sorted(names)) + "\\n")

    if _log:
        from process_threads import thread_ids  # tests/helpers: on the ranks' PYTHONPATH

        os.register_at_fork(before=_note_fork)
    """
)


def watching_forks(folder: Path) -> dict[str, str]:
    """The environment of ranks that note the threads of their process at each fork, in
    `folder` (made; Linux: /proc): `forks_noted(folder, rank)` reads them."""
    (folder / "site").mkdir(parents=True, exist_ok=True)
    (folder / "site" / "sitecustomize.py").write_text(_FORK_WATCH)
    return {
        "PYTHONPATH": f"{folder / 'site'}{os.pathsep}{HELPERS}",
        "TORCHKIT_TEST_FORK_LOG": str(folder / "forks"),
    }


def forks_noted(folder: Path, rank: int) -> list[list[str]]:
    """The threads of rank `rank` at each of its forks (`watching_forks`), one list a fork."""
    log = folder / f"forks.{rank}"
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []
