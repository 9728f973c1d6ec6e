"""The torchkit processes the tests start (processes.py) are forked from a Python that has
imported torch already (preloaded_processes.py) unless told `fresh=True`, and a process whose
environment differs in what torch reads as it is imported never comes from a server that
imported torch with other values."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import preloaded_processes
import pytest
from preloaded_processes import PreloadedProcess, PreloadedServers
from processes import run_torchkit_process, start_torchkit_process


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def test_a_plain_process_is_forked_from_a_server_as_a_fresh_one_would_look_and_logged(
    monkeypatch, tmp_path
):
    """Its parent is a server of this process; its own session, its command line, stdin as a
    pipe, and its exit code and output as Popen gives them. With FORK_LOG, the server writes
    its line once it has reaped it: this test, its CPU and wall seconds, its arguments."""
    monkeypatch.delenv("TORCHKIT_TEST_FRESH_PROCESSES", raising=False)
    fork_log = tmp_path / "forks.tsv"
    monkeypatch.setenv(preloaded_processes.FORK_LOG, str(fork_log))
    process = start_torchkit_process("video-info", "-", "--format", "json", stdin=subprocess.PIPE)
    try:
        assert isinstance(process, PreloadedProcess)
        servers = [server.process.pid for server in preloaded_processes.SERVERS.active.values()]
        assert _parent(process.pid) in servers
        assert os.getpgid(process.pid) == os.getsid(process.pid) == process.pid
        with open(f"/proc/{process.pid}/cmdline", "rb") as cmdline:
            words = cmdline.read().rstrip(b"\0").split(b"\0")
        assert [os.fsdecode(word) for word in words] == process.args
        out, err = process.communicate(input="", timeout=120)  # no path: refused
    finally:
        process.kill()
    assert process.returncode == 1 and out == ""
    assert err.startswith("Error: no video paths on stdin")
    # A name that is not UTF-8 is written escaped (it once ended the server: its forks with it);
    # a Path is an argument as Popen takes it (its request could not be sent).
    not_utf8 = os.fsdecode(b"\xff.mp4")
    named = run_torchkit_process("video-info", Path(not_utf8))
    assert named.returncode == 1 and named.stderr.startswith("Error: ")
    first, second = fork_log.read_text().splitlines()  # each written before its exit status
    test, cpu, wall, args = first.split("\t")
    assert test == os.environ["PYTEST_CURRENT_TEST"]
    # The fork's own figures, to rusage's microsecond: any process that ran used some CPU.
    assert re.fullmatch(r"\d+\.\d{6}", cpu) and re.fullmatch(r"\d+\.\d{6}", wall)
    assert float(cpu) > 0 and float(wall) > 0 and args == "video-info - --format json"
    assert second.split("\t")[3] == "video-info '\\udcff.mp4'"


# Written by a fork's sitecustomize (run just before torchkit starts, this one loaded as it runs):
# what it found imported.
PRELOADED_REPORT = """
import gc, json, os, sys

from preloaded_processes import NOT_PRELOADED, PRELOADED, TORCHKIT_PRELOADED

with open(os.environ["REPORT"], "w") as report:
    json.dump({
        "preloaded": [name for name in PRELOADED if name in sys.modules],
        "not_preloaded": [
            name for name in NOT_PRELOADED if name in sys.modules and name != "sitecustomize"
        ],
        "torchvision": "torchvision" in sys.modules,
        "torchkit": sorted(
            name for name in sys.modules
            if name.partition(".")[0] == "torchkit" and name not in TORCHKIT_PRELOADED
        ),
        "dynamo_asked": sys.modules["torchkit.torchvision_without_dynamo"].missing,
        "frozen": gc.get_freeze_count(),
    }, report)
"""


def test_a_fork_starts_with_the_preloaded_modules_and_torchkit_only_from_its_start(
    tmp_path, monkeypatch
):
    """What every command imports after torch, and torchvision imported without dynamo, are
    there at a fork's start, frozen out of the collector's sight; of torchkit only the hook that
    torchvision was imported through, nothing of what a command must import itself."""
    monkeypatch.delenv("TORCHKIT_TEST_FRESH_PROCESSES", raising=False)
    (tmp_path / "sitecustomize.py").write_text(PRELOADED_REPORT)
    helpers = os.path.dirname(preloaded_processes.__file__)
    report = tmp_path / "report.json"
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{helpers}", "REPORT": str(report)}
    process = start_torchkit_process("--version", env=env)
    out, err = process.communicate(timeout=120)
    assert isinstance(process, PreloadedProcess)
    assert process.returncode == 0 and out.strip(), err
    found = json.loads(report.read_text())
    assert found["preloaded"] == list(preloaded_processes.PRELOADED)
    assert found["torchvision"] and found["dynamo_asked"] == []
    assert found["not_preloaded"] == [] and found["torchkit"] == []
    assert found["frozen"] > 0


def test_fresh_starts_a_new_interpreter(monkeypatch):
    monkeypatch.delenv("TORCHKIT_TEST_FRESH_PROCESSES", raising=False)
    process = start_torchkit_process("--help", fresh=True)
    parent = _parent(process.pid)  # running, or a zombie until waited for
    out, _ = process.communicate(timeout=120)
    assert type(process) is subprocess.Popen and parent == os.getpid()
    assert process.returncode == 0 and "Usage" in out


class _RecordedServer:
    """A PreloadedServer's stand-in: the environment it would import torch with."""

    def __init__(self, environment: dict[str, str]) -> None:
        self.environment = environment
        self.refused: list[str] = []
        self.retired = False
        self.process = self

    def retire(self) -> None:
        self.retired = True

    def poll(self) -> None:
        return None  # still running its last forks


def test_a_differing_import_variable_gets_its_own_server_or_starts_fresh(monkeypatch):
    """The test process's own environment is served at once, whatever torchkit, rich or the
    tests' helpers read besides; an OMP_ or TORCH_ variable that differs starts fresh the first
    time and then gets a server started with it, never the other one; the least recently used
    server is retired past MAX_SERVERS."""
    monkeypatch.setattr(preloaded_processes, "PreloadedServer", _RecordedServer)
    monkeypatch.setattr(preloaded_processes, "MAX_SERVERS", 3)
    servers = PreloadedServers()
    own = preloaded_processes.child_environment(None)
    plain = servers.server_for(own)
    assert plain is not None and plain.environment == preloaded_processes.import_environment(own)
    later = {**own, "TORCHKIT_DEBUG": "1", "NO_COLOR": "1", "COLUMNS": "0", "GATE_FILE": "/g"}
    assert servers.server_for({**later, "TORCHINDUCTOR_CACHE_DIR": "/tmp/i"}) is plain
    # set by an in-process --deterministic run for the rest of its module; read by cuBLAS later
    assert servers.server_for({**own, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}) is plain

    threads = {**own, "OMP_NUM_THREADS": "3"}
    assert servers.server_for(threads) is None  # seen once: fresh
    second = servers.server_for(threads)
    assert second is not None and second is not plain
    assert second.environment["OMP_NUM_THREADS"] == "3"
    assert servers.server_for({**threads, "TORCHKIT_DEBUG": "1"}) is second

    rank = servers.server_for({**own, "RANK": "1"})  # another hash seed than rank 0's
    assert rank is not None and rank not in (plain, second)
    assert servers.server_for(own) is plain  # the most recently used again

    logging = {**own, "TORCH_CPP_LOG_LEVEL": "INFO"}
    assert servers.server_for(logging) is None
    assert servers.server_for(logging) not in (None, plain, second, rank)
    assert second.retired and not plain.retired and not rank.retired
    assert list(servers.active.values())[:2] == [rank, plain]


class _EndingServer(_RecordedServer):
    """A stand-in whose process ends when told, and which records being closed."""

    def __init__(self, environment: dict[str, str]) -> None:
        super().__init__(environment)
        self.ended = self.closed = False

    def poll(self) -> int | None:
        return 0 if self.ended else None

    def close(self) -> None:
        self.closed = True


def test_past_max_servers_the_least_recently_used_is_retired_until_its_process_ends(monkeypatch):
    """A server past MAX_SERVERS retires the one used longest ago (not the one started first):
    it is never handed out again, is kept (to be closed with the others) while its process
    runs its last forks, and is let go once that process has ended."""
    monkeypatch.setattr(preloaded_processes, "PreloadedServer", _EndingServer)
    monkeypatch.setattr(preloaded_processes, "MAX_SERVERS", 2)
    servers = PreloadedServers()
    own = preloaded_processes.child_environment(None)
    ranks = [{**own, "RANK": str(rank)} for rank in range(4)]
    first, second = servers.server_for(ranks[0]), servers.server_for(ranks[1])
    assert servers.server_for(ranks[0]) is first  # used again: `second` is now the oldest
    third = servers.server_for(ranks[2])
    assert second.retired and not first.retired and not third.retired
    assert list(servers.active.values()) == [first, third] and servers.retired == [second]

    second.ended = True  # its last fork has ended: let go at the next start
    fourth = servers.server_for(ranks[3])
    assert first.retired and servers.retired == [first]
    assert list(servers.active.values()) == [third, fourth]
    again = servers.server_for(ranks[1])  # a retired server is never handed out again
    assert again not in (first, second, third, fourth) and third.retired

    servers.close()
    assert [first.closed, second.closed, third.closed, fourth.closed, again.closed] == [
        True,
        False,  # ended and let go: nothing to close
        True,
        True,
        True,
    ]
    assert not servers.active and not servers.retired


def test_the_preload_log_names_each_servers_test_and_how_its_key_differs(monkeypatch, tmp_path):
    """With TORCHKIT_TEST_PRELOAD_LOG a line for each server started: the test, the rank and
    the variables by which its key differs from the test process's own and the first key."""
    monkeypatch.setattr(preloaded_processes, "PreloadedServer", _RecordedServer)
    log = tmp_path / "preload.log"
    monkeypatch.setenv(preloaded_processes.PRELOAD_LOG, str(log))
    servers = PreloadedServers()
    own = preloaded_processes.child_environment(None)
    servers.server_for(own)
    servers.server_for({**own, "RANK": "1"})
    monkeypatch.setenv("KINETO_LOG_LEVEL", "5")  # left behind by a test
    servers.server_for(preloaded_processes.child_environment(None))
    test = os.environ["PYTEST_CURRENT_TEST"]
    assert log.read_text().splitlines() == [
        f"server\t{test}\trank 0\t",
        f"server\t{test}\trank 1\t",
        f"server\t{test}\trank 0\tKINETO_LOG_LEVEL='5'/'5'/None",
    ]


@pytest.mark.parametrize(
    "name",
    [
        "PYTHONHASHSEED",
        "LD_PRELOAD",
        "MKL_NUM_THREADS",
        "LC_ALL",
        "TZ",
        "TMPDIR",
        "TYPER_USE_RICH",  # read as the preloaded typer is imported
        "PILLOW_BLOCK_SIZE",  # and Pillow
    ],
)
def test_what_python_and_the_libraries_read_at_start_up_keys_the_server(name):
    own = preloaded_processes.child_environment(None)
    assert preloaded_processes.import_environment({**own, name: "x"})[name] == "x"
