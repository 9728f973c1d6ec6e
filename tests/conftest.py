"""Fixtures shared by the test modules: a CLI runner (one command tree for the whole session),
`torchkit` run in this process or as a real `python -m torchkit` subprocess, and tiny generated
image folders; and what the output-safety tests (issue #13) share: a hash of a folder tree, the
`Error:` line, a refusal check, a FIFO reader, a full disk, a slow disk. Keep this small;
command-specific fixtures live with their tests."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torchkit.bytecode import keep_bytecode_cache

# As the CLI does: torch's bytecode cached under PYTHONDONTWRITEBYTECODE. Every Python a test
# starts (torchrun's launcher, `python -c` checks) reads and fills the same cache rather than
# compiling torch's sources again, about 2.5 s of CPU each: on a fresh clone (CI) the cache
# starts empty, and what only those processes import would otherwise be compiled every time.
# test_bytecode.py sets the variables it tests itself.
BYTECODE_CACHE = keep_bytecode_cache()
if BYTECODE_CACHE:
    os.environ.setdefault("PYTHONPYCACHEPREFIX", BYTECODE_CACHE)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the prefix keeps sources free of .pyc
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One worker per core already: torch's intra-op threads (one per core in every worker and
    # in every torchkit process a test starts) would only fight over the same cores. Set before
    # torch is imported; OMP_NUM_THREADS given by the caller wins. (Suite: 7:21 -> 5:51.)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# matplotlib imported once here (after OMP_NUM_THREADS: numpy reads it), so that the runs in
# this process draw curves.png themselves, as a run does where matplotlib is already imported,
# where a plotting helper process per run (core/train/curves_painter.py) would import it again
# each time (+40 s for the suite on 2 cores); the torchkit processes tests start use helpers.
import matplotlib.figure  # noqa: E402, F401
import pytest  # noqa: E402
from suite_paths import REPO  # noqa: E402, F401 - tests import it from here too
from typer.testing import CliRunner  # noqa: E402


@pytest.fixture
def runner() -> CliRunner:
    """`runner.invoke(app, [...])`; `result.stdout` and `result.stderr` are kept apart."""
    return CliRunner()


@pytest.fixture(scope="session")
def _torchkit_command():
    import typer.main

    from torchkit.cli import app

    return typer.main.get_command(app)


@pytest.fixture(scope="session", autouse=True)
def cli_built_once(_torchkit_command):
    """typer rebuilds the whole command tree (every command's signature) on each invoke, which
    costs more than a quick command (about 0.4 s): every `runner.invoke(app, ...)` of the
    session reuses one tree. Any other app (and a reloaded torchkit app) is built as usual."""
    import typer.testing

    from torchkit.cli import app

    build = typer.testing._get_command

    def built_once(given):
        return _torchkit_command if given is app else build(given)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(typer.testing, "_get_command", built_once)
        yield


@pytest.fixture(autouse=True)
def signal_handlers_kept():
    """A test (an in-process command included) leaves SIGINT and SIGTERM as it found them: a
    handler left behind would change how every later test in the worker is stopped (once a
    SIGINT left ignored made an in-process Ctrl-C test fail). The handlers are put back, so
    that one test's leak fails that test alone."""
    import signal

    names = ("SIGINT", "SIGTERM")
    before = {name: signal.getsignal(getattr(signal, name)) for name in names}
    yield
    after = {name: signal.getsignal(getattr(signal, name)) for name in names}
    changed = {name: after[name] for name in names if after[name] is not before[name]}
    for name in changed:
        signal.signal(getattr(signal, name), before[name])
    assert not changed, f"the test left signal handlers changed: {changed}"


# The environment a test's torchkit run never inherits: tests say what they want.
INHERITED = ("TORCHKIT_DEBUG", "FORCE_COLOR", "NO_COLOR")


def run_torchkit_process(
    *args: str, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m torchkit ARGS` in a real process (about a second without torch, three
    with it): for checks whose subject is the process (signals, torchrun, the interpreter's
    exit, imports, a hook in sitecustomize); `run_torchkit_in_process` does the rest."""
    full_env = {key: value for key, value in os.environ.items() if key not in INHERITED}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "torchkit", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or REPO,
        timeout=300,
    )


@pytest.fixture
def run_torchkit() -> Callable[..., subprocess.CompletedProcess]:
    return run_torchkit_process


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
    not an interpreter and its imports. An exception the CLI lets escape fails the test."""
    from torchkit.cli import app

    environment = dict.fromkeys(INHERITED)  # unset while it runs
    words = [str(arg) for arg in args]
    with working_directory(cwd or REPO):
        result = CliRunner().invoke(
            app, words, env=environment, catch_exceptions=False, prog_name="torchkit"
        )
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
    *args: str, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None
) -> subprocess.Popen:
    """Start `python -m torchkit ARGS` in its own session (process group = its PID, so that
    `processes_in_group` finds every worker it started); stdout and stderr are pipes."""
    full_env = {key: value for key, value in os.environ.items() if key not in INHERITED}
    full_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "torchkit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=cwd or REPO,
        start_new_session=True,
    )


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
            out, err = process.communicate()
            pytest.fail(f"the process ended (rc {process.returncode}) before {what}:\n{err}")
        if time.monotonic() > deadline:
            if process is not None:
                process.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def signal_and_wait(
    process: subprocess.Popen, signum: int, *, timeout: float = 120
) -> tuple[int, str, str]:
    """Send `signum` to the process (not its group: as `kill PID` or `timeout` would) and wait
    for it: (exit code, stdout, stderr)."""
    process.send_signal(signum)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        out, err = process.communicate()
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


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """`small_tmpfs(size_kib)` mounts a tmpfs of that size (a full disk on demand) and returns
    its path; skips cleanly where mounting is not allowed (not root, no mount namespace)."""
    mounted: list[Path] = []

    def mount(size_kib: int) -> Path:
        point = tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(point)],
            capture_output=True,
        )
        if done.returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def fill_disk(mount: Path, *, leave: int = 0) -> Path:
    """Fill the file system at `mount` with a file `filler`: every byte, or all but `leave`."""
    if leave:
        free = os.statvfs(mount)
        (mount / "filler").write_bytes(bytes(free.f_bavail * free.f_frsize - leave))
        return mount
    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as error:
        assert error.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return mount


def write_image_folder(
    root: Path, counts: dict[str, int], *, size: int = 8, mode: str = "RGB", seed: int = 0
) -> Path:
    """ROOT/<class>/<class>_<i>.png with `counts[class]` random `size`x`size` images each."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    channels = {"L": (), "RGB": (3,), "RGBA": (4,)}[mode]
    for name, count in counts.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            pixels = rng.integers(0, 256, (size, size, *channels), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{name}_{index}.png")  # mode from the shape
    return root


@pytest.fixture
def make_image_folder() -> Callable[..., Path]:
    """`make_image_folder(root, {"cat": 3, "dog": 2}, size=8, mode="RGB")`."""
    return write_image_folder


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """A tiny image folder: classes `a` (3 images) and `b` (2 images), 8x8 RGB PNGs."""
    return write_image_folder(tmp_path / "images", {"a": 3, "b": 2})


# -- the checks of the output-safety tests (issue #13) -------------------------------------------


def write_convnet_checkpoint(path: Path, *, in_channels: int, image_size: int, classes: str):
    """A torchkit checkpoint of the built-in convnet for `in_channels` x `image_size` images,
    one class per letter of `classes`; returns its model."""
    from torchkit.core.models import resolve_model
    from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint

    model = resolve_model(
        "convnet", in_channels=in_channels, image_size=image_size, num_classes=len(classes)
    ).model
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": len(classes),
            "classes": list(classes),
            "model": model.state_dict(),
            "preprocess": {"image_size": image_size, "in_channels": in_channels},
        },
        path,
    )
    return model


def tree_digest(root: Path, *, folders: bool = True) -> dict[str, str]:
    """Every entry under `root`, hidden ones too: relative path -> SHA-256 of a file's bytes,
    `-> TARGET` for a symbolic link (never followed), `dir` for a folder (left out with
    `folders=False`), the file type of anything else (a FIFO is never opened)."""
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            relative = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                found[relative] = "-> " + os.readlink(path)
            elif stat.S_ISREG(mode):
                found[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif stat.S_ISDIR(mode):
                if folders:
                    found[relative] = "dir"
            else:
                found[relative] = f"file type {stat.S_IFMT(mode):o}"
    return found


@pytest.fixture
def work(_template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the module's `_template` fixture (its inputs), the command's working
    directory."""
    target = tmp_path / "work"
    shutil.copytree(_template, target, symlinks=True)
    return target


def check_refused_untouched(args: Sequence[str], message: str, *, cwd: Path) -> None:
    """`torchkit ARGS` in `cwd` exits 1 with nothing on stdout and one `Error:` line (warnings
    aside) holding `message`, and no entry under `cwd` changed or appeared."""
    before = tree_digest(cwd)
    done = run_torchkit_in_process(*args, cwd=cwd)
    assert done.returncode == 1, done.stderr
    assert message in error_line(done.stderr, besides="warnings")
    assert done.stdout == ""
    assert tree_digest(cwd) == before  # no byte changed, nothing written, no lock or temporary


def hidden_siblings(folder: Path) -> list[str]:
    """What torchkit keeps beside `folder` while it writes it (`.NAME.*`: the lock, a set-aside
    old output, a partial new one): none of it may remain once a command has ended."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def error_line(stderr: str, *, besides: str = "anything") -> str:
    """The one `Error: ` line of `stderr`, which must be its last line, with no traceback;
    `besides` is what the lines before it may be: "anything", "warnings" or "nothing"."""
    lines = stderr.splitlines()
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: "), stderr
    assert lines[-1] == errors[0], stderr
    assert "Traceback" not in stderr, stderr
    if besides == "warnings":
        assert all(line.startswith("Warning:") for line in lines[:-1]), stderr
    elif besides == "nothing":
        assert lines == errors, stderr
    else:
        assert besides == "anything", besides
    return errors[0]


# A sitecustomize that slows the named calls (renames, copies) whose destination contains a given
# path down, like a slow disk: a signal then reliably lands in the middle of the work.
SLOW_IO = textwrap.dedent(
    """
    import os, shutil, time

    _where, _, _delay = os.environ.get("TORCHKIT_TEST_SLOW_IO", "").rpartition("|")

    def _slowed(function):
        def slow(source, destination, *args, **kwargs):
            if _where in os.fspath(destination):
                time.sleep(float(_delay))
            return function(source, destination, *args, **kwargs)
        return slow

    if _where:
        for _call in os.environ["TORCHKIT_TEST_SLOW_CALLS"].split(","):
            _module, _, _name = _call.partition(".")
            _owner = {"os": os, "shutil": shutil}[_module]
            setattr(_owner, _name, _slowed(getattr(_owner, _name)))
    """
)


def slow_io_env(
    tmp_path: Path,
    where: Path,
    *,
    calls: Sequence[str] = ("os.rename", "os.replace", "shutil.copy2"),
    delay: float = 0.1,
) -> dict[str, str]:
    """The environment of a torchkit process whose `calls` into a path containing `where` take
    `delay` seconds each (its sitecustomize is written to TMP_PATH/slow-io)."""
    folder = tmp_path / "slow-io"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(SLOW_IO)
    return {
        "PYTHONPATH": str(folder),
        "TORCHKIT_TEST_SLOW_IO": f"{where}|{delay}",
        "TORCHKIT_TEST_SLOW_CALLS": ",".join(calls),
    }


class FifoReader:
    """A FIFO at `path` read to the end by a thread, as `cat FIFO` would."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.data: bytes | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with open(self.path, "rb") as handle:
            self.data = handle.read()

    def result(self) -> bytes:
        """What was written into the FIFO; fails if it is no longer a FIFO."""
        # A command that never opened the FIFO leaves the reader waiting: let it go.
        with contextlib.suppress(OSError):
            os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
        self.thread.join(30)
        assert not self.thread.is_alive()
        assert stat.S_ISFIFO(os.lstat(self.path).st_mode)  # still a FIFO, not a regular file
        return self.data or b""


# -- the GPU ---------------------------------------------------------------------------------------
# The default run is the CPU suite, the same on every machine: with a GPU visible, `--device
# auto` would move the many tests written against CPU references (bitwise resumes, torchrun with
# Gloo, a hand-written loop's numbers) onto it. The GPU tests carry the `cuda` marker and run with
# `uv run pytest -m cuda`, which leaves the GPU visible (as TORCHKIT_TESTS_SEE_GPU=1 does for any
# run, to see what the CPU tests do on a GPU).
_GPU_HIDDEN = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    see_gpu = os.environ.get("TORCHKIT_TESTS_SEE_GPU", "") not in ("", "0")
    hidden = "cuda" not in (config.option.markexpr or "") and not see_gpu
    config.stash[_GPU_HIDDEN] = hidden
    if hidden:  # before any test module imports torch
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection left (torch, timm, dynamo, sklearn and the test modules: 0.7-1 million
    objects a worker) moved out of the garbage collector's sight: every full collection after
    it (benchmark's memory probe makes one a trial; Python's own come every few thousand
    allocations) walked all of them, 0.4 s each on the 2-core machine, 15-40 s of a suite's
    CPU. Objects the tests make are collected as before."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    # Back in sight before the interpreter's exit: objects still frozen then are never
    # finalised, and nanobind (triton's bindings, imported with torch._dynamo) lists them as
    # leaks on stderr.
    import gc

    gc.unfreeze()


# The modules with the most test time (seconds summed, 2026-11-27), longest first. pytest-xdist
# hands out whole modules (--dist loadscope) in collection order (--no-loadscope-reorder): its
# own order, by number of tests, sent the 23 s multi-node test and the 15 s digits run last,
# and one worker finished them alone while the other idled. A module missing here keeps its
# place after these; a stale entry costs nothing.
LONGEST_MODULES = (
    "test_train_ddp_faults",  # 45 s
    "test_safety_train",  # 30 s
    "test_train_ddp",  # 35 s: torchrun on one node and on two, the same weights
    "test_benchmark",
    "test_eval",
    "test_model_resolver",
    "test_export",
    "test_safety_features",
    "test_train_digits_target",  # 15 s, one test
    "test_train_cli",
    "test_train_guards",
    "test_train_resume",
    "test_curves_painter",
    "test_plot_helper",  # 20 s: real helper processes
    "test_eval_guards",
    "test_predict",
    "test_safety_eval",
)


def _module_rank(item: pytest.Item) -> int:
    name = item.path.stem
    return LONGEST_MODULES.index(name) if name in LONGEST_MODULES else len(LONGEST_MODULES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_module_rank)  # stable: each module's tests keep their order
    if not config.stash[_GPU_HIDDEN]:
        return
    skip = pytest.mark.skip(reason="GPU test: run `uv run pytest -m cuda` (the default run is CPU)")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip, append=False)


def _sixteen_bit_gray_mode() -> str:
    """The mode PIL opens a 16-bit grayscale PNG in: "I" in Pillow 10, "I;16" from Pillow 11."""
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((2, 2), np.uint16)).save(buffer, format="PNG")
    buffer.seek(0)
    with Image.open(buffer) as image:
        return image.mode


SIXTEEN_BIT_GRAY = _sixteen_bit_gray_mode()
