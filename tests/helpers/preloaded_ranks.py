"""The ranks of a Gloo world forked from a Python that has imported torch already, instead of
each starting a fresh interpreter: `start_preloaded_process` takes `start_torchkit_process`'s
arguments and returns what a Popen gives the tests.

Every rank of the DDP tests (gloo_ranks.py) is a `python -m torchkit` process whose first
seconds of CPU go to `import torch` (about 2.5 s of a 2-core machine's time, most of a short
rank's cost). Here a server process for each rank number, started on its first rank and kept
single-threaded, imports torch and nothing of torchkit; each rank is forked from it and then
becomes `python -m torchkit ARGS` as a fresh interpreter would: its own session, stdin, stdout
and stderr, working folder and environment, no other descriptor, PYTHONPATH's folders first on
sys.path and a sitecustomize found there run, fresh seeds for `random` and NumPy, torchkit's
start-up (signal handlers, import hooks) run from its beginning, its exit code the one a fresh
process ends with. What the rank does is real: its own process and PID, Gloo's sockets, signals
sent to it, its loader workers and helper processes. Rank 0 and rank 1 come from different
servers, so their string hashes (the order of a set) differ as fresh ranks' do.

What a fork cannot give starts fresh (`processes.start_torchkit_process`): a rank whose
environment differs from its server's in anything but the launch's variables (RANK, ...),
PYTHONPATH, the tests' switches (TORCHKIT_TEST_*) and inductor's (TORCHINDUCTOR_*), which
torch may read as it is imported; stdin=PIPE; a platform without fork and pidfd_open; and
every rank with TORCHKIT_TEST_FRESH_RANKS=1 (to compare). Not covered here: torch's own import
inside a rank (the start-up tests run fresh processes: cli/test_fast_start.py, and so do
test_train_ddp.py's torchrun launches).

gloo_ranks.start_ranks starts every rank of every folder's DDP tests here (`run_ranks`,
`run_ranks_under_agent`, and `start_ranks`'s own: a signal to one rank, a rank that hangs).
The servers are kept for the session, started by the first rank that needs one (a worker that
starts no rank starts none), and ended by tests/conftest.py's `preloaded_servers_closed`."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from processes import INHERITED, start_torchkit_process
from suite_paths import REPO

# Variables that may differ between the ranks and the server: the launch's, read when the rank
# runs; PYTHONPATH, applied by the rank itself (below); pytest's name of the running test; the
# tests' own switches, read by the test models and sitecustomize modules of the rank; inductor's
# settings, read when torch._inductor is imported (never by `import torch`: the server checks),
# which inductor itself adds to the test process (TORCHINDUCTOR_CACHE_DIR, at the first
# in-process compile): the ranks of every later test in that worker started fresh.
RANK_VARIABLES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "PYTHONPATH",
        "PYTEST_CURRENT_TEST",  # pytest's, a test's name
    }
)
TEST_PREFIX = "TORCHKIT_TEST_"
INDUCTOR_PREFIX = "TORCHINDUCTOR_"

# The server: `python -c SERVER` with the socket's descriptor as its argument. It imports torch,
# checks it is still one thread with nothing of dynamo or inductor loaded, says so, and then
# forks a rank for each request ([stdin, stdout, stderr, status] descriptors and the rank's
# JSON) until the socket closes; each rank's wait status is written to its status descriptor
# when it ends.
SERVER = r"""
import json, os, select, socket, sys

channel = socket.socket(fileno=int(sys.argv[1]))
base_path = sys.path[1:]  # sys.path[0] is -c's ''
import torch  # noqa: F401  (the point of the server)

threads = len(os.listdir("/proc/self/task"))
problems = [
    name for name, bad in (
        ("threads", threads != 1),
        ("torch._dynamo", "torch._dynamo" in sys.modules),
        ("torch._inductor", "torch._inductor" in sys.modules),
        ("sitecustomize", "sitecustomize" in sys.modules),
        ("torchkit", any(name.startswith("torchkit") for name in sys.modules)),
    ) if bad
]
channel.send(json.dumps({"ready": not problems, "problems": problems}).encode())


def serve():
    running = {}  # pidfd -> (pid, status descriptor)
    while True:
        ready, _, _ = select.select([channel, *running], [], [])
        for pidfd in ready:
            if pidfd is channel:
                continue
            pid, status = running.pop(pidfd)
            _, wait_status = os.waitpid(pid, 0)
            os.write(status, f"{wait_status}\n".encode())
            os.close(status)
            os.close(pidfd)
        if channel not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(channel, 1 << 20, 4)
        if not message:  # the tests are done: no teardown of torch's modules (seconds)
            os._exit(0)
        request = json.loads(message)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            for pidfd, (_, status) in running.items():
                os.close(pidfd)
                os.close(status)
            channel.close()
            return request, fds
        for fd in fds[:3]:
            os.close(fd)
        running[os.pidfd_open(pid)] = (pid, fds[3])
        channel.send(str(pid).encode())


def become_rank(request, fds):
    stdin, stdout, stderr, status = fds
    os.close(status)
    if request["new_session"]:
        os.setsid()
    for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
        os.dup2(fd, target)
    for name in os.listdir("/proc/self/fd"):  # as Popen's close_fds: 0-2 only
        if int(name) > 2:
            try:
                os.close(int(name))
            except OSError:  # listdir's own descriptor
                pass
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    sys.path[:] = [os.getcwd(), *extra, *base_path]  # as `python -m` orders them
    import importlib

    importlib.invalidate_caches()
    if any(os.path.isfile(os.path.join(path, "sitecustomize.py")) for path in extra):
        import sitecustomize  # noqa: F401  (site imports it at a fresh start)
    # A fresh interpreter draws its own seeds: the server's would be every rank's.
    if "random" in sys.modules:
        sys.modules["random"].seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    sys.argv[:] = ["-m", *request["args"]]
    import runpy

    runpy.run_module("torchkit", run_name="__main__", alter_sys=True)


become_rank(*serve())
"""


class PreloadedServer:
    """The server process (started on the first rank, with the first rank's environment less
    its rank's variables), and the channel to it."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.channel: socket.socket | None = None
        self.environment: dict[str, str] | None = None
        self.refused: list[str] = []  # why it cannot serve (then every rank starts fresh)
        self.lock = threading.Lock()

    def _start(self, environment: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.environment = environment
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # as a rank's, not a terminal (its stderr: the test's)
            env=environment,
            cwd=REPO,
        )
        theirs.close()
        self.channel = ours
        answer = json.loads(ours.recv(1 << 16) or b'{"ready": false, "problems": ["ended"]}')
        if not answer["ready"]:
            self.refused = answer["problems"]

    def fork(self, request: dict, fds: list[int]) -> int | None:
        """The PID of a rank forked for `request`, or None where the server cannot fork it
        (it then starts fresh)."""
        with self.lock:
            environment = server_environment(request["env"])
            if self.process is None:
                self._start(environment)
            if self.refused or environment != self.environment:
                return None
            assert self.channel is not None
            socket.send_fds(self.channel, [json.dumps(request).encode()], fds)
            return int(self.channel.recv(64))

    def close(self) -> None:
        if self.process is None:
            return
        assert self.channel is not None
        self.channel.close()  # the server ends at the end of its socket
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def server_environment(environment: dict[str, str]) -> dict[str, str]:
    """`environment` less what may differ between the ranks and their server."""
    return {
        key: value
        for key, value in environment.items()
        if key not in RANK_VARIABLES and not key.startswith((TEST_PREFIX, INDUCTOR_PREFIX))
    }


# One server for each rank number: ranks forked from one server share its hash seed (the order
# of a set of strings), where a fresh rank 0 and rank 1 differ, as they do under torchrun.
_SERVERS: dict[str, PreloadedServer] = {}


@contextlib.contextmanager
def preloaded_servers() -> Iterator[dict[str, PreloadedServer]]:
    """The process's servers, one a rank number (each started on first use), closed when the
    block ends."""
    try:
        yield _SERVERS
    finally:
        for server in _SERVERS.values():
            server.close()
        _SERVERS.clear()


class PreloadedProcess:
    """A forked rank, with the part of subprocess.Popen's interface the tests use (text mode):
    `pid`, `args`, `returncode`, `poll`, `wait`, `communicate`, `send_signal`, `terminate`,
    `kill`. Its output is read by two threads as it comes, as `communicate` reads it."""

    def __init__(self, pid: int, args: list[str], stdout: int, stderr: int, status: int) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._status = status
        self._output: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._readers = [
            threading.Thread(target=self._read, args=(fd, name), daemon=True)
            for fd, name in ((stdout, "stdout"), (stderr, "stderr"))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, fd: int, name: str) -> None:
        with open(fd, encoding=None) as stream:  # the locale's, as Popen's text mode
            for chunk in iter(lambda: stream.read(65536), ""):
                self._output[name].append(chunk)

    def _wait_status(self, timeout: float | None) -> bool:
        if self.returncode is not None:
            return True
        if not select.select([self._status], [], [], timeout)[0]:
            return False
        with open(self._status, closefd=True) as status:
            text = status.read().strip()
        if not text:
            raise RuntimeError(f"the preloaded server ended before rank PID {self.pid}")
        self.returncode = os.waitstatus_to_exitcode(int(text))
        return True

    def poll(self) -> int | None:
        self._wait_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._wait_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None) -> tuple[str, str]:
        """Every line it wrote (stdout, stderr), once it has ended and its pipes are closed."""
        assert input is None, "stdin is not a pipe here"
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return "".join(self._output["stdout"]), "".join(self._output["stderr"])

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_preloaded_process(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    stdin: int | None = None,
) -> PreloadedProcess | subprocess.Popen:
    """`processes.start_torchkit_process(*args, env, cwd, stdin)`, forked from the server where
    it can be (see the module's doc)."""
    full_env = {key: value for key, value in os.environ.items() if key not in INHERITED}
    full_env.update(env or {})
    fresh = (
        os.environ.get("TORCHKIT_TEST_FRESH_RANKS") == "1"
        or stdin == subprocess.PIPE
        or not hasattr(os, "pidfd_open")
        or not hasattr(socket, "send_fds")
    )
    if fresh:
        return start_torchkit_process(*args, env=env, cwd=cwd, stdin=stdin)
    command = [sys.executable, "-m", "torchkit", *args]
    stdout, stderr, status = os.pipe(), os.pipe(), os.pipe()
    own_stdin = None
    if stdin is None:
        stdin_fd = 0
    elif stdin == subprocess.DEVNULL:
        stdin_fd = own_stdin = os.open(os.devnull, os.O_RDONLY)
    else:
        stdin_fd = stdin
    request = {
        "args": list(args),
        "env": full_env,
        "cwd": str(Path(cwd or REPO).resolve()),
        "new_session": True,  # as start_torchkit_process
    }
    try:
        server = _SERVERS.setdefault(full_env.get("RANK", "0"), PreloadedServer())
        pid = server.fork(request, [stdin_fd, stdout[1], stderr[1], status[1]])
    finally:
        for fd in (stdout[1], stderr[1], status[1], own_stdin):
            if fd is not None:
                os.close(fd)
    if pid is None:
        for fd in (stdout[0], stderr[0], status[0]):
            os.close(fd)
        return start_torchkit_process(*args, env=env, cwd=cwd, stdin=stdin)
    return PreloadedProcess(pid, command, stdout[0], stderr[0], status[0])
