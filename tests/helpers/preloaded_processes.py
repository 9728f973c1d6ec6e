"""The torchkit processes a test starts, forked from a Python that has imported torch already
instead of each starting a fresh interpreter: `start_preloaded_process` takes
`processes.start_torchkit_process`'s arguments and returns what a Popen gives the tests
(`processes.start_torchkit_process` and `run_torchkit_process` come here unless told `fresh`).

A `python -m torchkit` process spends its first seconds of CPU on `import torch` (about 2.5 s of a
2-core machine's time, most of a short command's cost). Here a server process, started on the first
process that needs it and kept single-threaded, imports torch, then what every command imports
after it (`PRELOADED`: typer, pydantic for typer's parameters, rich's console, tables and progress,
Pillow; about 0.3 s of each fork's CPU) and torchvision as torchkit imports it (through
torchkit.torchvision_without_dynamo's and torchvision_without_onnx's hooks, which stay in place:
`TORCHKIT_PRELOADED`; 0.5 s of each train, eval or predict), and nothing else of torchkit nor of
`NOT_PRELOADED` (dynamo, inductor, torch.onnx, cv2, timm, huggingface_hub, click and typer's
rich_utils read variables of their own or load heavy parts as they are imported; torchkit asks
sys.modules for matplotlib and sklearn to choose a helper process): it checks, and that no warning
came and dynamo was not asked for. Its objects are then frozen out of the garbage collector's sight
(`gc.freeze`): a fork's collections would walk them, copying their pages. Each process is forked
from it and then becomes `python -m torchkit ARGS` as a fresh interpreter would: its own session
(made before its PID is handed out, as Popen's), the test's ignored signals ignored, stdin, stdout
and stderr, working folder and environment, no other descriptor, its command line in /proc (`python
-m torchkit ARGS`, then NULs to the length of the server's: torchkit's folder locks read it to tell
a torchkit holder), PYTHONPATH's folders first on sys.path and a sitecustomize found there run,
fresh seeds for `random` and NumPy, torchkit's start-up (signal handlers, import hooks) run from
its beginning, its exit code the one a fresh process ends with. What it does is real: its own
process and PID, its process group, signals sent to it, its loader workers and helper processes,
its sockets and locks. Its parent is the server, not the test (which learns its end from the
server).

Which variables may differ between a fork and its server (reasons): only what is read while torch
is imported must match, since a fork sees the server's import. So the server is keyed by
`import_environment`: TORCH_/TORCHDYNAMO_/TORCHELASTIC_/PYTORCH_/CAFFE2_/ATEN_/KINETO_ (torch's
Python and C++ read them as they load: log levels, allocators, dispatch),
OMP_/KMP_/GOMP_/MKL_/OPENBLAS_/BLIS_/DNNL_/ONEDNN_ (the math libraries size their thread pools when
loaded), CUDA_/NVIDIA_/CUBLAS/CUDNN_/NCCL_/HIP_/ROCM_/HSA_/TRITON_/XLA_ (devices), NPY_/NUMPY_
(NumPy, imported by torch), LD_/MALLOC_/GLIBC_ (the loader and allocator), PYTHON* but PYTHONPATH
(the interpreter's own set-up: hash seed, I/O encoding, warnings, bytecode), LANG/LANGUAGE/LC_*
(the standard streams' encoding is chosen at start-up), TZ (`time` reads it when imported),
TMPDIR/TEMP/TMP (tempfile caches its folder), HOME/XDG_* and PATH (caches and libraries found from
them; torchvision reads TORCH_HOME and XDG_CACHE_HOME), TYPER_USE_RICH and PILLOW_* (typer and
Pillow read them as they are imported). Everything else may differ: it is read after the fork, by
torchkit (TORCHKIT_*), rich and typer (NO_COLOR, FORCE_COLOR, COLUMNS, TERM...), the tests' helper
modules and sitecustomize (TORCHKIT_TEST_*, GATE_FILE...), the launch (RANK, MASTER_PORT..., read
when torchkit starts) or the libraries torchkit imports later (cv2, huggingface_hub), and
CUBLAS_WORKSPACE_CONFIG (cuBLAS reads it as a device's first handle is made);
TORCHINDUCTOR_* is read when torch._inductor is imported, which the server checks `import torch`
does not do (inductor adds TORCHINDUCTOR_CACHE_DIR to the test process at its first in-process
compile: every later process would have missed its server). A server runs with its key's variables
only, so nothing else can leak into its import.

Servers are keyed by that environment and the rank number (RANK, 0 without it: forks of one
server share its string hash seed, where a fresh rank 0 and rank 1 differ as under torchrun).
The key of the test process's own environment gets a server at once; any other on its second
request (the first starts fresh: an environment made for one test, with its own HOME or PATH,
would cost a server as much as a fresh start and push out a useful one). At most `MAX_SERVERS`
are kept (each costs about 3 s of CPU and 0.55 GB); the least recently used one is retired: it
forks nothing more and ends with its last process.

What a fork cannot give starts fresh (`processes._start_fresh`): a server that refused (a
thread: `import torch` starts one unless OMP_NUM_THREADS=1, which conftest.py sets under xdist,
so a plain `-n 0` run starts every process fresh; a module loaded that must not be), a command
line longer than the server's, a platform without fork, pidfd_open and SCM_RIGHTS, and every
process with TORCHKIT_TEST_FRESH_PROCESSES=1 (to compare). Tests whose subject is the fresh
interpreter's start-up (what is imported and when, a signal during `import torch`, the bytecode
cache, a sitecustomize that must act before torch is imported, start-up times) say `fresh=True`.

The servers are kept for the session (a worker that starts no process starts none) and ended
by tests/conftest.py's `preloaded_servers_closed`."""

from __future__ import annotations

import collections
import contextlib
import inspect
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from process_threads import thread_count
from processes import CLOSED, Stream, _start_fresh, child_environment
from suite_paths import REPO

# The variables read while torch is imported (see the module's doc): a fork's must equal its
# server's. PYTHONPATH is applied by the fork itself.
IMPORT_PREFIXES = (
    "TORCH_",
    "TORCHDYNAMO_",
    "TORCHELASTIC_",
    "PYTORCH_",
    "CAFFE2_",
    "ATEN_",
    "KINETO_",
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "OPENBLAS_",
    "BLIS_",
    "DNNL_",
    "ONEDNN_",
    "CUDA_",
    "NVIDIA_",
    "CUBLAS",
    "CUDNN_",
    "NCCL_",
    "HIP_",
    "ROCM_",
    "HSA_",
    "TRITON_",
    "XLA_",
    "NPY_",
    "NUMPY_",
    "LD_",
    "MALLOC_",
    "GLIBC_",
    "PYTHON",
    "LC_",
    "XDG_",
    "PILLOW_",
)
IMPORT_NAMES = frozenset(
    {"LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "HOME", "PATH", "TYPER_USE_RICH"}
)
# Read after the fork although their prefix is above: PYTHONPATH (applied by the fork), the
# launch's TORCHELASTIC_RUN_ID (read when torchkit starts), CUBLAS_WORKSPACE_CONFIG (read by
# cuBLAS as a device's first handle is made, never in a server; an in-process `--deterministic`
# run sets it for the rest of its module, whose processes each needed a server of their own:
# 3-5 s of CPU).
NOT_AT_IMPORT = frozenset({"PYTHONPATH", "TORCHELASTIC_RUN_ID", "CUBLAS_WORKSPACE_CONFIG"})

# The modules every torchkit command imports after torch (typer's and click's, pydantic's for
# typer's parameters, rich's for its output), and Pillow, imported by the server: a fork has them.
PRELOADED = (
    "typer",
    "typer._adapters",
    "typer._coercion",
    "typer._completion_classes",
    "rich.console",
    "rich.live",
    "rich.progress",
    "rich.table",
    "PIL.Image",
    "PIL.BmpImagePlugin",
    "PIL.GifImagePlugin",
    "PIL.JpegImagePlugin",
    "PIL.PngImagePlugin",
    "PIL.PpmImagePlugin",
)
# torchkit's modules that torchvision's import brings (its hook), and no other: they do nothing
# as they are imported, and torchkit.cli's start-up runs in each fork from its beginning.
TORCHKIT_PRELOADED = (
    "torchkit",
    "torchkit.core",
    "torchkit.core.runtime",
    "torchkit.core.runtime.fork_safe",
    "torchkit.import_hooks",
    "torchkit.stand_ins",
    "torchkit.torchvision_without_dynamo",
    "torchkit.torchvision_without_onnx",
)
NOT_PRELOADED = (
    "torch._dynamo",
    "torch._inductor",
    "torch.onnx",
    "sitecustomize",
    "typer.rich_utils",
    "click",
    "cv2",
    "huggingface_hub",
    "timm",
    "matplotlib",
    "sklearn",
)

MAX_SERVERS = 4  # rank 0 and 1 of the DDP tests, plain processes, one more environment

# With FORK_LOG=FILE in the test process, each server appends a line per fork as it reaps it:
# the test (PYTEST_CURRENT_TEST of the process that asked for it, with its phase), the fork's
# CPU s (user + sys, its waited-for children included), its wall s from fork to end, its
# arguments (tab-separated). Its CPU is otherwise booked on the server, reaped with the session:
# a worker's last test. To measure; see /work/notes/s73/forks.md.
FORK_LOG = "TORCHKIT_TEST_FORK_LOG"
# With PRELOAD_LOG=FILE in the test process, a line for each server started and the counts at
# the session's end (`preloaded_servers`).
PRELOAD_LOG = "TORCHKIT_TEST_PRELOAD_LOG"

# The server: `python -c SERVER FD PADDING` with the socket's descriptor as its argument (the
# padding makes room for a fork's command line). It imports torch, checks it is still one thread
# with nothing loaded that a fork must import itself, says so, and then forks a process for
# each request ([stdin, stdout, stderr, status] descriptors and the request's JSON) until the
# socket closes (or, retired, until its last process ends); each process's wait status is
# written to its status descriptor when it ends. Descriptors after the four: the request's
# pass_fds, in order.
SERVER = r"""
import ctypes, json, os, select, socket, sys

channel = socket.socket(fileno=int(sys.argv[1]))
base_path = sys.path[1:]  # sys.path[0] is -c's ''
import torch  # noqa: F401  (the point of the server)
import importlib, warnings

# What every command imports after torch, as the module's doc says. A warning one of them gave
# would be printed here and never by the forks: none may come (the server refuses).
with warnings.catch_warnings(record=True) as warned:
    for name in PRELOADED:
        importlib.import_module(name)
    # torchvision as torchkit imports it (torchvision_without_dynamo: its modules run with
    # stand-ins for dynamo; torchvision_without_onnx: torchvision.ops without torch.onnx), with
    # those hooks in place in the forks as torchkit.cli would put them.
    from torchkit import torchvision_without_dynamo, torchvision_without_onnx

    torchvision_without_dynamo.install()
    torchvision_without_onnx.install()
    import torchvision  # noqa: F401
# Out of the collector's sight: a fork's collections would walk (and write to, copying their
# pages) the server's objects, none of which can become garbage there.
import gc

gc.collect()
gc.freeze()


def argument_area():
    with open("/proc/self/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49)


# process_threads.thread_count's source: the kernel's count (a listing of /proc/self/task may end
# early, and a thread would go unseen).
THREAD_COUNT
start, end = argument_area()
problems = [
    *(["threads"] if thread_count() != 1 else []),
    *(f"warned: {warning.message}" for warning in warned),
    *(name for name in NOT_PRELOADED if name in sys.modules),
    *(name for name in sys.modules if name.partition(".")[0] == "torchkit"
      and name not in TORCHKIT_PRELOADED),
    *(["dynamo asked"] if torchvision_without_dynamo.missing else []),
]
ready = {"ready": not problems, "problems": problems, "room": end - start}
channel.send(json.dumps(ready).encode())


def log_fork(request, rusage, wall):
    # One line per fork: its own CPU is booked on this server, which the test process only
    # reaps at the session's end (its last test's figures), so the server tells whom it was for.
    import shlex

    test = request["env"].get("PYTEST_CURRENT_TEST", "-").replace("\t", " ")
    cpu = rusage.ru_utime + rusage.ru_stime
    # To the microsecond, rusage's own unit: a short fork's few hundred microseconds of CPU
    # rounded to milliseconds read 0.000, as if it had run nothing.
    line = f"{test}\t{cpu:.6f}\t{wall:.6f}\t{shlex.join(request['args'])}\n"
    descriptor = os.open(request["fork_log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # One write: lines of several servers stay whole. A name not UTF-8 (surrogates) as
        # escapes.
        os.write(descriptor, line.encode(errors="backslashreplace"))
    finally:
        os.close(descriptor)


def serve():
    import time

    running = {}  # pidfd -> (pid, status descriptor, request, start time)
    retired = False
    while True:
        if retired and not running:
            os._exit(0)
        ready, _, _ = select.select([channel, *running], [], [])
        for pidfd in ready:
            if pidfd is channel:
                continue
            pid, status, request, started_at = running.pop(pidfd)
            # wait4: its rusage, its own waited-for children (loader workers, helpers) included.
            _, wait_status, rusage = os.wait4(pid, 0)
            if request.get("fork_log"):
                try:
                    log_fork(request, rusage, time.monotonic() - started_at)
                except (OSError, ValueError):  # a line lost, never the server and its forks
                    pass
            os.write(status, f"{wait_status}\n".encode())
            os.close(status)
            os.close(pidfd)
        if channel not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(channel, 1 << 20, 4 + MAX_PASS_FDS)
        if not message:  # the tests are done: no teardown of torch's modules (seconds)
            os._exit(0)
        request = json.loads(message)
        if request.get("retire"):
            retired = True
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        started, has_started = os.pipe()
        started_at = time.monotonic()
        pid = os.fork()
        if pid == 0:
            if request["new_session"]:
                os.setsid()
            # Its command line in /proc, as a fresh `python -m torchkit ARGS` has it once Popen
            # returns: written before the server is told it has started.
            words = b"".join(os.fsencode(word) + b"\0" for word in request["command"])
            ctypes.memmove(start, words.ljust(end - start, b"\0"), end - start)
            os.close(has_started)
            os.close(started)
            for pidfd, (_, status, _, _) in running.items():
                os.close(pidfd)
                os.close(status)
            channel.close()
            return request, fds
        os.close(has_started)
        os.read(started, 1)  # its end of the pipe closed: its own session and command line
        os.close(started)
        for fd in (*fds[:3], *fds[4:]):
            os.close(fd)
        running[os.pidfd_open(pid)] = (pid, fds[3], request, started_at)
        channel.send(str(pid).encode())


def become_torchkit(request, fds):
    import fcntl

    stdin, stdout, stderr, status, *passed = fds
    os.close(status)
    # Out of the way of the numbers they take (a received one may hold another's number).
    passed = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in passed]
    targets = [(0, stdin), (1, stdout), (2, stderr), *zip(request["pass_fds"], passed)]
    for target, fd in targets:
        os.dup2(fd, target)
    kept = {0, 1, 2, *request["pass_fds"]}
    for name in os.listdir("/proc/self/fd"):  # as Popen's close_fds and pass_fds
        if int(name) not in kept:
            try:
                os.close(int(name))
            except OSError:  # listdir's own descriptor
                pass
    # A descriptor closed at start (`>&-`): closed, and its sys stream None, as a fresh
    # interpreter's start-up makes it (CPython's create_stdio) where the server's had one.
    for target in request["closed"]:
        os.close(target)
        name = ("stdin", "stdout", "stderr")[target]
        setattr(sys, name, None)
        setattr(sys, f"__{name}__", None)
    os.chdir(request["cwd"])
    # The test's ignored signals, as a fresh process inherits them (a background job's SIGINT,
    # nohup's SIGHUP), the others as Python sets them; the server's were the test's at its start.
    import signal

    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM"):
        default = signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL
        ignored = name in request["ignored"]
        signal.signal(getattr(signal, name), signal.SIG_IGN if ignored else default)
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    sys.path[:] = [os.getcwd(), *extra, *base_path]  # as `python -m` orders them
    import importlib

    importlib.invalidate_caches()
    if any(os.path.isfile(os.path.join(path, "sitecustomize.py")) for path in extra):
        import sitecustomize  # noqa: F401  (site imports it at a fresh start)
    # A fresh interpreter draws its own seeds: the server's would be every fork's.
    if "random" in sys.modules:
        sys.modules["random"].seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    sys.argv[:] = ["-m", *request["args"]]
    import runpy

    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


become_torchkit(*serve())
"""
# Room in the server's own command line for a fork's (`python -m torchkit ARGS`).
COMMAND_ROOM = 32 * 1024
# The most descriptors a fork is given besides its standard ones (its pass_fds).
MAX_PASS_FDS = 8


def import_environment(environment: dict[str, str]) -> dict[str, str]:
    """The part of `environment` read while torch is imported: a fork's must equal its
    server's (see the module's doc)."""
    return {
        key: value
        for key, value in environment.items()
        if (key in IMPORT_NAMES or key.startswith(IMPORT_PREFIXES)) and key not in NOT_AT_IMPORT
    }


class PreloadedServer:
    """A server process with `environment` (its key's variables), and the channel to it."""

    def __init__(self, environment: dict[str, str]) -> None:
        self.environment = environment
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server = (
            SERVER.replace("MAX_PASS_FDS", str(MAX_PASS_FDS))
            .replace("TORCHKIT_PRELOADED", repr(TORCHKIT_PRELOADED))
            .replace("NOT_PRELOADED", repr(NOT_PRELOADED))
            .replace("PRELOADED", repr(PRELOADED))
            .replace("THREAD_COUNT", inspect.getsource(thread_count))
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", server, str(theirs.fileno()), " " * COMMAND_ROOM],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # as a fork's, not a terminal (its stderr: the test's)
            env=environment,
            cwd=REPO,
        )
        theirs.close()
        self.channel = ours
        answer = json.loads(ours.recv(1 << 16) or b'{"ready": false, "problems": ["ended"]}')
        self.refused: list[str] = answer["problems"]  # why it cannot serve: all start fresh
        self.room: int = answer.get("room", 0)

    def fork(self, request: dict, fds: list[int]) -> int:
        """The PID of a process forked for `request`, in its own session already."""
        socket.send_fds(self.channel, [json.dumps(request).encode()], fds)
        return int(self.channel.recv(64))

    def retire(self) -> None:
        """No more forks: it ends with its last process."""
        with contextlib.suppress(OSError):
            self.channel.send(json.dumps({"retire": True}).encode())

    def close(self) -> None:
        self.channel.close()  # the server ends at the end of its socket
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class PreloadedServers:
    """The servers of this process by key (rank number, import environment), the most recently
    used last; the retired ones until they end; the keys seen once."""

    def __init__(self) -> None:
        self.active: collections.OrderedDict[tuple, PreloadedServer] = collections.OrderedDict()
        self.retired: list[PreloadedServer] = []
        self.seen: set[tuple] = set()
        self.lock = threading.Lock()
        self.started = 0  # servers started, forks made, processes started fresh
        self.forked = 0
        self.fresh = 0
        self.first_key: dict[str, str] | None = None  # the import variables of the first one

    def server_for(self, environment: dict[str, str]) -> PreloadedServer | None:
        """The server for a process with `environment` (started if worth it), or None: it
        starts fresh. Called with the lock held."""
        imported = import_environment(environment)
        key = (environment.get("RANK", "0"), tuple(sorted(imported.items())))
        if key in self.active:
            self.active.move_to_end(key)
            server = self.active[key]
            return None if server.refused else server
        own = import_environment(child_environment(None))
        if imported != own and key not in self.seen:
            self.seen.add(key)
            return None
        while len(self.active) >= MAX_SERVERS:
            _, oldest = self.active.popitem(last=False)
            oldest.retire()
            self.retired.append(oldest)
        self.retired = [server for server in self.retired if server.process.poll() is None]
        server = self.active[key] = PreloadedServer(imported)
        self.started += 1
        if log := os.environ.get(PRELOAD_LOG):
            self._log_start(log, key, own)
        return None if server.refused else server

    def _log_start(self, log: str, key: tuple, own: dict[str, str]) -> None:
        """A line for a server started (PRELOAD_LOG): for which test, which rank, and the
        variables by which its key differs from the test process's own environment now and
        from the first server's key (`NAME=its/own/first's`): a variable a test left behind
        shows here as one that every later server has."""
        imported = dict(key[1])
        self.first_key = first = self.first_key or imported
        differs = sorted(
            f"{name}={imported.get(name)!r}/{own.get(name)!r}/{first.get(name)!r}"
            for name in {*imported, *own, *first}
            if not imported.get(name) == own.get(name) == first.get(name)
        )
        test = os.environ.get("PYTEST_CURRENT_TEST", "-")
        with open(log, "a") as lines:
            lines.write(f"server\t{test}\trank {key[0]}\t{' '.join(differs)}\n")

    def close(self) -> None:
        for server in [*self.active.values(), *self.retired]:
            server.close()
        self.active.clear()
        self.retired.clear()
        self.seen.clear()


SERVERS = PreloadedServers()


@contextlib.contextmanager
def preloaded_servers() -> Iterator[PreloadedServers]:
    """This process's servers (each started on first use), closed when the block ends. With
    TORCHKIT_TEST_PRELOAD_LOG=FILE, a line for each server started (`_log_start`) and one of how
    many servers, forks and fresh processes it started are added to FILE (to measure)."""
    try:
        yield SERVERS
    finally:
        SERVERS.close()
        if log := os.environ.get(PRELOAD_LOG):
            with open(log, "a") as counts:
                counts.write(
                    f"servers {SERVERS.started} forked {SERVERS.forked} fresh {SERVERS.fresh}\n"
                )


class PreloadedProcess:
    """A forked torchkit process, with the part of subprocess.Popen's interface the tests use
    (text mode): `pid`, `args`, `returncode`, `stdin` (with stdin=PIPE), `stdout`, `stderr`,
    `poll`, `wait`, `communicate`, `send_signal`, `terminate`, `kill`, and `with`. Its wait
    status comes from the server, which is its parent."""

    def __init__(
        self,
        pid: int,
        args: list[str],
        stdin: int | None,
        stdout: int | None,
        stderr: int | None,
        status: int,
        text: bool = True,
    ) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        # As Popen's text mode opens its ends of the pipes (kept open: the caller's to close).
        self.stdin = (
            None if stdin is None else io.TextIOWrapper(open(stdin, "wb", -1), write_through=True)  # noqa: SIM115
        )
        # None where the test gave the descriptor (or closed it), as Popen's.
        self.stdout = None if stdout is None else self._reader(stdout, text)
        self.stderr = None if stderr is None else self._reader(stderr, text)
        self._empty = "" if text else b""  # what a read at the end gives
        self._status = status
        self._output: dict[str, list] = {"stdout": [], "stderr": []}
        self._threads: list[threading.Thread] | None = None
        self._readers: dict[int, threading.Thread] = {}  # id(stream): the thread reading it

    def _wait_status(self, timeout: float | None) -> bool:
        if self.returncode is not None:
            return True
        if not select.select([self._status], [], [], timeout)[0]:
            return False
        with open(self._status, closefd=True) as status:
            text = status.read().strip()
        if not text:
            raise RuntimeError(f"the preloaded server ended before its process PID {self.pid}")
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

    @staticmethod
    def _reader(fd: int, text: bool) -> io.TextIOWrapper | io.BufferedReader:
        binary = open(fd, "rb", -1)  # noqa: SIM115  (the caller's to close, as Popen's)
        return io.TextIOWrapper(binary) if text else binary

    def _read(self, stream: io.TextIOWrapper | io.BufferedReader, name: str) -> None:
        with stream:
            for chunk in iter(lambda: stream.read(65536), self._empty):
                self._output[name].append(chunk)

    def _write(self, text: str | None) -> None:
        assert self.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError):  # it stopped reading; closed
            if text:
                self.stdin.write(text)
            self.stdin.close()

    def communicate(self, input: str | None = None, timeout: float | None = None):
        """(stdout, stderr): what is left of them once it has ended, as Popen's (None for one
        not a pipe); `input` is written to its stdin (with stdin=PIPE), which is then closed."""
        if self._threads is None:
            self._readers = {
                id(stream): threading.Thread(target=self._read, args=(stream, name), daemon=True)
                for stream, name in ((self.stdout, "stdout"), (self.stderr, "stderr"))
                if stream is not None and not stream.closed
            }
            self._threads = list(self._readers.values())
            if self.stdin is not None and not self.stdin.closed:
                self._threads.append(
                    threading.Thread(target=self._write, args=(input,), daemon=True)
                )
            for thread in self._threads:
                thread.start()
        elif input:
            raise ValueError("Cannot send input after starting communication")
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                out, err = self._output_so_far()
                raise subprocess.TimeoutExpired(self.args, timeout, output=out, stderr=err)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._output_so_far()

    def _output_so_far(self) -> tuple:
        return tuple(
            None if stream is None else self._empty.join(self._output[name])
            for stream, name in ((self.stdout, "stdout"), (self.stderr, "stderr"))
        )

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # ended, not yet reported
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> PreloadedProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # A stream a thread still reads (a process it started keeps it open: `communicate`
        # gave up) is left to that thread: a close waits for the read in flight, for ever.
        for stream in (self.stdout, self.stderr):
            reader = self._readers.get(id(stream))
            if stream is not None and not (reader is not None and reader.is_alive()):
                stream.close()
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ValueError):
                self.stdin.close()
        self.wait()


# The signals a fork leaves ignored where this process ignores them (else as Python sets them).
INHERITED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")


def _ignored(name: str) -> bool:
    return signal.getsignal(getattr(signal, name)) == signal.SIG_IGN


def _fork_possible() -> bool:
    return (
        os.environ.get("TORCHKIT_TEST_FRESH_PROCESSES") != "1"
        and hasattr(os, "fork")
        and hasattr(os, "pidfd_open")
        and hasattr(socket, "send_fds")
    )


def start_preloaded_process(
    *args: str | bytes | os.PathLike,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    stdin: int | None = None,
    stdout: Stream = None,
    stderr: Stream = None,
    pass_fds: Sequence[int] = (),
    text: bool = True,
    module: str = "torchkit",
) -> PreloadedProcess | subprocess.Popen:
    """`processes.start_torchkit_process(*args, env, cwd, stdin, stdout, stderr, pass_fds, text)`,
    forked from a server where it can be (see the module's doc). `module`: `python -m MODULE
    ARGS` instead (torchrun's agent, `torch.distributed.run`, which then starts its ranks as
    fresh interpreters)."""
    # Path-like and bytes arguments as Popen takes them (a request travels as JSON: strings).
    args = tuple(os.fsdecode(arg) for arg in args)
    full_env = child_environment(env)
    command = [sys.executable, "-m", module, *args]

    def fresh() -> subprocess.Popen:
        SERVERS.fresh += 1
        return _start_fresh(
            *args,
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            pass_fds=pass_fds,
            text=text,
            module=module,
        )

    if not _fork_possible() or len(pass_fds) > MAX_PASS_FDS:
        return fresh()
    ours: list[int | None] = [None, None]  # our ends of its stdout and stderr pipes
    theirs: list[int] = []  # descriptors opened here for it, closed once it has them
    given: list[int] = []
    for index, stream in enumerate((stdout, stderr)):
        if stream is None:
            ours[index], their_end = os.pipe()
            theirs.append(their_end)
            given.append(their_end)
        elif stream == CLOSED:  # a stand-in the fork closes
            given.append(os.open(os.devnull, os.O_WRONLY))
            theirs.append(given[-1])
        else:
            given.append(stream)
    status = os.pipe()
    theirs.append(status[1])
    ours_stdin = None
    if stdin is None:
        stdin_fd = 0
    elif stdin == subprocess.DEVNULL:
        stdin_fd = os.open(os.devnull, os.O_RDONLY)
        theirs.append(stdin_fd)
    elif stdin == subprocess.PIPE:
        stdin_fd, ours_stdin = os.pipe()
        theirs.append(stdin_fd)
    else:
        stdin_fd = stdin if isinstance(stdin, int) else stdin.fileno()
    request = {
        "module": module,
        "args": list(args),
        "command": command,
        "env": full_env,
        "cwd": str(Path(cwd or REPO).resolve()),
        "new_session": True,  # as start_torchkit_process
        "ignored": [name for name in INHERITED_SIGNALS if _ignored(name)],
        "closed": [fd for fd, stream in ((1, stdout), (2, stderr)) if stream == CLOSED],
        "pass_fds": list(pass_fds),
        # The server's line for it (FORK_LOG), read from this process, not the fork's env.
        "fork_log": os.environ.get(FORK_LOG),
    }
    pid = None
    try:
        with SERVERS.lock:
            server = SERVERS.server_for(full_env)
            fits = server is not None and len(b"\0".join(map(os.fsencode, command))) < server.room
            if server is not None and fits:
                try:
                    fds = [stdin_fd, *given, status[1], *pass_fds]
                    pid = server.fork(request, fds)
                    SERVERS.forked += 1
                except (OSError, ValueError):  # the server ended (killed): fresh from now on
                    server.refused = ["ended"]
    finally:
        for fd in theirs:
            os.close(fd)
        if pid is None:
            for fd in (*ours, status[0], ours_stdin):
                if fd is not None:
                    os.close(fd)
    if pid is None:
        return fresh()
    return PreloadedProcess(pid, command, ours_stdin, ours[0], ours[1], status[0], text)
