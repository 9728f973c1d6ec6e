"""The ranks of a Gloo world as `gloo_ranks.run_ranks` starts them, but forked from one Python
that has imported torch, instead of one fresh interpreter each: a rank's torch start-up (2-3 s
of a 2-core machine) is paid once per world, not once per rank.

Each rank is still a process of its own, in its own session, with torchrun's variables, its own
stdout, stderr and exit code; it runs `python -m torchkit ARGS` (runpy, as `-m` runs it: the
program is torchkit's `__main__`), from torchkit's first import on. What differs from a fresh
interpreter: torch was imported before torchkit started, with the world's environment
(OMP_NUM_THREADS=1 and the rest, RANK and LOCAL_RANK aside, which torch does not read at
import). So a test whose subject is what happens before or during `import torch` in a rank
(signals while starting, the import itself, what the interpreter loads) uses `run_ranks`, as do
tests that signal or watch one rank while it runs (`start_ranks`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from gloo_ranks import free_port
from processes import INHERITED
from suite_paths import HELPERS, REPO

RANK_OWN = ("RANK", "LOCAL_RANK")  # the variables that differ between ranks

# argv[1]: {"ranks": [the environment of each rank], "args": ARGS, "folder": where each rank's
# stdout, stderr go, "agent": whether a failed rank stops the others (torchrun's agent)}.
_LAUNCHER = textwrap.dedent(
    """
    import json, os, runpy, signal, sys, traceback

    spec = json.loads(sys.argv[1])
    import torch  # noqa: F401 (once for every rank: what forking spares each)


    def run_rank(rank):
        os.setsid()  # a session of its own, as start_torchkit_process starts a rank
        for descriptor, name in ((1, "stdout"), (2, "stderr")):
            opened = os.open(f"{spec['folder']}/{rank}.{name}", os.O_WRONLY | os.O_CREAT)
            os.dup2(opened, descriptor)
            os.close(opened)
        os.environ.update(spec["ranks"][rank])
        sys.argv = ["torchkit", *spec["args"]]
        code = 0
        try:
            runpy.run_module("torchkit", run_name="__main__", alter_sys=True)
        except SystemExit as ended:  # what the interpreter makes of it at exit
            code = ended.code if isinstance(ended.code, int) else 0 if ended.code is None else 1
            if not isinstance(ended.code, (int, type(None))):
                print(ended.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


    live = {}
    for rank in range(len(spec["ranks"])):
        pid = os.fork()
        if pid == 0:
            run_rank(rank)
        live[pid] = rank
    with open(f"{spec['folder']}/pids", "w") as pids:
        pids.write(" ".join(map(str, live)))
    codes = [None] * len(live)
    stopping = False
    while live:
        pid, status = os.waitpid(-1, 0)
        if pid not in live:
            continue
        rank = live.pop(pid)
        codes[rank] = os.waitstatus_to_exitcode(status)
        if spec["agent"] and codes[rank] != 0 and not stopping:
            stopping = True  # the agent stops the worker group once one has failed
            for other in live:
                os.kill(other, signal.SIGTERM)
    print(json.dumps(codes), flush=True)
    os._exit(0)  # without the teardown of torch's modules (0.5-0.7 s), as the ranks end
    """
)


def run_forked_ranks(
    *args: object,
    env: dict[str, str] | None = None,
    world: int = 2,
    timeout: float = 120,
    cwd: Path = REPO,
    stdin: int | None = None,
    agent: bool = False,
) -> list[subprocess.CompletedProcess]:
    """Every rank of `python -m torchkit ARGS` (forked: module doc), run to its end, with what
    `run_ranks` gives: [rank 0, rank 1, ...]. `agent`: as `run_ranks_under_agent`, with its
    TORCHELASTIC_RUN_ID, and once a rank ends with a non-zero code the others are sent SIGTERM.
    A world that has not ended after `timeout` seconds (a hang) fails the test."""
    extra = {"TORCHELASTIC_RUN_ID": "test", **(env or {})} if agent else dict(env or {})
    world_env = {
        "PYTHONPATH": str(HELPERS),
        "OMP_NUM_THREADS": "1",
        "NO_COLOR": "1",
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    ranks = [{"RANK": str(rank), "LOCAL_RANK": str(rank), **extra} for rank in range(world)]
    launcher_env = {key: value for key, value in os.environ.items() if key not in INHERITED}
    for name in RANK_OWN:  # set in each rank
        launcher_env.pop(name, None)
    launcher_env.update(world_env)
    launcher_env.update({key: value for key, value in extra.items() if key not in RANK_OWN})
    words = [str(arg) for arg in args]
    with tempfile.TemporaryDirectory(prefix="forked-ranks-") as folder:
        spec = {"ranks": ranks, "args": words, "folder": folder, "agent": agent}
        try:
            launched = subprocess.run(
                [sys.executable, "-c", _LAUNCHER, json.dumps(spec)],
                stdin=stdin,
                capture_output=True,
                text=True,
                env=launcher_env,
                cwd=cwd,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            _kill_ranks(Path(folder))
            pytest.fail(f"the ranks did not end within {timeout} s (a hang):\n{_tails(folder)}")
        assert launched.returncode == 0, launched.stderr
        codes = json.loads(launched.stdout.splitlines()[-1])
        command = [sys.executable, "-m", "torchkit", *words]
        return [
            subprocess.CompletedProcess(
                command,
                code,
                (Path(folder) / f"{rank}.stdout").read_text(),
                (Path(folder) / f"{rank}.stderr").read_text(),
            )
            for rank, code in enumerate(codes)
        ]


def _kill_ranks(folder: Path) -> None:
    """Kill every rank and what it started (each leads its own process group)."""
    pids = folder / "pids"
    for pid in pids.read_text().split() if pids.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid), signal.SIGKILL)


def _tails(folder: str) -> str:
    return "\n".join(
        f"--- {path.name}\n{path.read_text()[-3000:]}"
        for path in sorted(Path(folder).glob("*.std*"))
    )
