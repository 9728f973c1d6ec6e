"""The suite's set-up (bytecode cache, one torch thread a worker, the GPU hidden, the modules'
order) and the fixtures every folder uses: a CLI runner (one command tree for the whole session),
`run_torchkit`, tiny image folders, a small tmpfs, the output-safety tests' `work` copy. The code
behind them lives in tests/helpers/ by job (processes.py, image_folders.py, disks.py,
output_checks.py, checkpoints.py), imported from there by the tests too. Keep this small;
command-specific fixtures live with their tests."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from torchkit.bytecode import keep_bytecode_cache

# As the CLI does: torch's bytecode cached under PYTHONDONTWRITEBYTECODE. Every Python a test
# starts (torchrun's launcher, `python -c` checks) reads and fills the same cache rather than
# compiling torch's sources again, about 2.5 s of CPU each: on a fresh clone (CI) the cache
# starts empty, and what only those processes import would otherwise be compiled every time.
# cli/test_bytecode.py sets the variables it tests itself.
BYTECODE_CACHE = keep_bytecode_cache()
if BYTECODE_CACHE:
    os.environ.setdefault("PYTHONPYCACHEPREFIX", BYTECODE_CACHE)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the prefix keeps sources free of .pyc


def _interruptible() -> None:
    # A shell starts a background job (`uv run pytest ... &`) with SIGINT ignored, and Python
    # then keeps it ignored: the tests that Ctrl-C a command (in process, or a torchkit process
    # that inherits the disposition) would see nothing happen. Ctrl-C as in a terminal.
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_interruptible()
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One worker per core already: torch's intra-op threads (one per core in every worker and
    # in every torchkit process a test starts) would only fight over the same cores. Set before
    # torch is imported; OMP_NUM_THREADS given by the caller wins. (Suite: 7:21 -> 5:51.)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import kept_environment  # noqa: E402
import pytest  # noqa: E402
import torch_state  # noqa: E402

# The helpers behind the fixtures live in tests/helpers/ by job. The names test modules imported
# from here before they moved are imported here too, so that `from conftest import NAME` keeps
# working; new code imports them from their helper module.
from checkpoints import write_convnet_checkpoint  # noqa: E402, F401
from disks import FifoReader, fill_disk, slow_io_env  # noqa: E402, F401
from image_folders import SIXTEEN_BIT_GRAY, write_image_folder  # noqa: E402, F401
from output_checks import (  # noqa: E402, F401
    check_refused_untouched,
    error_line,
    hidden_siblings,
    tree_digest,
)
from preloaded_processes import preloaded_servers  # noqa: E402
from processes import (  # noqa: E402, F401
    dataset_stats,
    processes_in_group,
    run_each_in_process,
    run_json,
    run_torchkit_in_process,
    run_torchkit_process,
    signal_and_wait,
    start_torchkit_process,
    wait_until,
)
from suite_paths import REPO  # noqa: E402, F401
from typer.testing import CliRunner  # noqa: E402

# An xdist worker whose session has ended is done: the controller has every report, and what
# an interpreter's teardown then does (every module's objects freed, the garbage collector
# walking the million objects torch, timm and the tests made, once they are unfrozen at exit)
# was 4-9 s of CPU a worker, each run. It ends once the atexit handlers registered after this
# one (temporary folders, multiprocessing's children, torch's) have run, its output flushed,
# with the status its interpreter would have had (0: the worker's script returns normally).
# A worker whose session did not end (an internal error) is torn down as usual.
_WORKER_SESSION_ENDED = []


def _end_worker_without_teardown() -> None:
    if not _WORKER_SESSION_ENDED:
        return
    import logging

    logging.shutdown()  # registered before this handler (pytest imports logging): not run
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


if os.environ.get("PYTEST_XDIST_WORKER"):
    atexit.register(_end_worker_without_teardown)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    # A worker's own config (a pytest a test starts inherits PYTEST_XDIST_WORKER, and its exit
    # status is its result).
    if hasattr(session.config, "workerinput"):
        _WORKER_SESSION_ENDED.append(True)


def _sendable(text: str) -> str:
    """TEXT with each lone surrogate (a file name's non-UTF-8 byte, as surrogateescape holds it)
    written as its escape: execnet sends a worker's reports as UTF-8 and stops the whole run with
    an INTERNALERROR on one it cannot encode."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    # A test of such names passes with their warnings in its captured log, or fails with them in
    # its message: either is reported, not the end of the session.
    outcome = yield
    report = outcome.get_result()
    report.sections = [(name, _sendable(text)) for name, text in report.sections]
    if report.longrepr is not None:
        text = str(report.longrepr)
        if _sendable(text) != text:
            report.longrepr = _sendable(text)


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


@pytest.fixture(scope="session", autouse=True)
def preloaded_servers_closed():
    """The servers that the torchkit processes the tests start are forked from (processes.py,
    preloaded_processes.py), ended with the session; each starts with the first process that
    needs it, so a worker that starts no process starts none."""
    with preloaded_servers():
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


@pytest.fixture(autouse=True)
def environment_kept():
    """The environment as the test found it. An in-process command may set variables for the
    rest of its process, as torchkit does (`--deterministic` sets CUBLAS_WORKSPACE_CONFIG):
    left behind, they would reach every later test of the worker, and the ones torch reads at
    import would give each later torchkit process a preloaded server of its own. Only what
    changed is set again (kept_environment.py)."""
    with kept_environment.environment_kept():
        yield


@pytest.fixture(scope="module", autouse=True)
def module_environment_kept():
    """The environment as the module found it, once its module-scoped fixtures end: what they
    set (an in-process `train --deterministic` run in a module fixture sets
    CUBLAS_WORKSPACE_CONFIG; `--profile`, KINETO_LOG_LEVEL) is set before any test's own
    `environment_kept` starts. Left behind, it reached every later module of the worker, and
    since torch's libraries read such variables, each later torchkit process needed new
    preloaded servers (about 3.5 s of CPU each) instead of the worker's first ones."""
    with kept_environment.environment_kept():
        yield


@pytest.fixture(scope="module", autouse=True)
def torch_state_kept():
    """torch's process-wide settings as the module found them, once it ends (torch_state.py):
    an in-process `--deterministic` run left deterministic algorithms on for every later module
    of the worker. Per module (reading and comparing them: about 12 us); a test that changes
    them changes them for its own module's later tests only."""
    with torch_state.torch_state_kept():
        yield


@pytest.fixture(scope="module", autouse=True)
def curves_laid_out(request: pytest.FixtureRequest):
    """train runs in the test process lay curves.png out but do not rasterise it
    (run_curves.py): matplotlib's Agg took 0.15-0.2 s of CPU of a tiny run's 0.5 s, and most
    tests read everything but the picture. A module marked `drawn_curves` (the painter's,
    train_core's, the digits run's) draws it as torchkit does; processes a test starts always
    draw it. Module-scoped, so that a module's own module-scoped runs have it too."""
    if request.node.get_closest_marker("drawn_curves"):
        yield
        return
    from run_curves import lay_out_curves_only

    with pytest.MonkeyPatch.context() as patch:
        lay_out_curves_only(patch)
        yield


@pytest.fixture
def run_torchkit() -> Callable[..., subprocess.CompletedProcess]:
    return run_torchkit_process


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """`small_tmpfs(size_kib)` mounts a tmpfs of that size (a full disk on demand) and returns
    its path; `small_tmpfs(size_kib, inodes=N)` one that holds at most N files and folders.
    Skips cleanly where mounting is not allowed (not root, no mount namespace)."""
    with _mounts(tmp_path, "tmpfs", "cannot mount a tmpfs here (needs root)") as mount:

        def small(size_kib: int, inodes: int | None = None) -> Path:
            limits = f"size={size_kib}k" + (f",nr_inodes={inodes}" if inodes else "")
            return mount("-t", "tmpfs", "-o", limits, "tmpfs")

        yield small


@pytest.fixture
def bind_view(tmp_path: Path):
    """`bind_view(folder)`: a second path to `folder` (a bind mount, as another case of its
    name is on a case-insensitive disk); skips where mounting is not allowed."""
    with _mounts(tmp_path, "view", "cannot bind-mount here (needs root)") as mount:
        yield lambda folder: mount("--bind", str(folder))


@contextlib.contextmanager
def _mounts(tmp_path: Path, stem: str, refused: str) -> Iterator[Callable[..., Path]]:
    """`mount(*args)` mounts onto a new folder TMP_PATH/STEM<n> (`mount ARGS FOLDER`), or skips
    the test with `refused`; every mount is undone afterwards."""
    mounted: list[Path] = []

    def mount(*args: str) -> Path:
        point = tmp_path / f"{stem}{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", *args, str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(refused)
        mounted.append(point)
        return point

    try:
        yield mount
    finally:
        for point in mounted:
            subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.fixture
def make_image_folder() -> Callable[..., Path]:
    """`make_image_folder(root, {"cat": 3, "dog": 2}, size=8, mode="RGB")`."""
    return write_image_folder


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """A tiny image folder: classes `a` (3 images) and `b` (2 images), 8x8 RGB PNGs."""
    return write_image_folder(tmp_path / "images", {"a": 3, "b": 2})


# -- the checks of the output-safety tests (issue #13) -------------------------------------------


@pytest.fixture
def work(_template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the module's `_template` fixture (its inputs), the command's working
    directory."""
    target = tmp_path / "work"
    shutil.copytree(_template, target, symlinks=True)
    return target


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


def pytest_sessionstart(session: pytest.Session) -> None:
    """matplotlib and scikit-learn's metrics imported once in each process that runs tests,
    before its test modules; not in pytest-xdist's controller, which runs none (its CPU for a
    run: 6.8 -> 1.7 s).

    matplotlib, so that the runs in this process draw curves.png themselves, as a run does
    where matplotlib is already imported, where a plotting helper process per run
    (core/train/curves_painter.py) would import it again each time (+40 s for the suite on 2
    cores); the torchkit processes tests start use helpers. (After OMP_NUM_THREADS: numpy
    reads it.)

    scikit-learn's metrics the same way: an eval run in this process scores its predictions
    itself, as eval does where sklearn is imported already, where it would otherwise start a
    scorer helper process (core.evaluate.metrics.start_scorer) that imports sklearn again,
    about 1.2 s of CPU per in-process eval, and only in the workers whose earlier modules had
    not imported sklearn. eval/test_eval_scorer.py takes it out of sys.modules to test the
    helper; the torchkit processes tests start use it.

    In the controller, the old runs' temporary folders start to be removed
    (`_remove_old_runs_meanwhile`).

    The garbage collector is off from here until collection ends (`pytest_collection_finish`
    collects once and turns it on again): the imports here and collection's (torch, timm,
    dynamo, the test modules) make objects by the million and almost no garbage, and each of
    the full collections they set off walked all of them (10 a worker, about 2.7 of its 3.6 s
    of collection spent in the collector)."""
    if session.config.pluginmanager.has_plugin("dsession"):  # xdist's controller
        _remove_old_runs_meanwhile(session.config)
        return
    import gc

    gc.disable()
    import matplotlib.figure  # noqa: F401
    import sklearn.metrics  # noqa: F401


_OLD_RUNS_REMOVED = pytest.StashKey["threading.Thread"]()


def _remove_old_runs_meanwhile(config: pytest.Config) -> None:
    """The temporary folders of the runs before the last ones that pytest keeps
    (/tmp/pytest-of-USER/pytest-N) removed in a thread of xdist's controller while the workers
    run the tests, rather than as the session ends (pytest's own cleanup, after the last test):
    a suite's folder of three runs ago, some 6,000 files and 600 MB, took 20 s of mostly waiting
    on the disk, added to every run's wall time. pytest's cleanup at the end then skips them
    (each is locked while it is removed) or finds them gone; `pytest_unconfigure` waits for the
    thread. Not where the folder is given (--basetemp) or none is kept (the current run's
    folder would be a candidate too)."""
    import threading

    from _pytest.pathlib import cleanup_numbered_dir
    from _pytest.tmpdir import LOCK_TIMEOUT

    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None or factory._given_basetemp is not None:
        return
    if factory._retention_policy == "none" or factory._retention_count < 1:
        return
    basetemp = factory.getbasetemp()  # made now, as xdist makes it to hand out the workers' own
    lock_dead_before = basetemp.stat().st_mtime - LOCK_TIMEOUT  # as pytest's own cleanup
    removal = threading.Thread(
        target=cleanup_numbered_dir,
        args=(basetemp.parent, "pytest-", factory._retention_count, lock_dead_before),
        name="old pytest runs removed",
        daemon=True,
    )
    removal.start()
    config.stash[_OLD_RUNS_REMOVED] = removal


def pytest_unconfigure(config: pytest.Config) -> None:
    removal = config.stash.get(_OLD_RUNS_REMOVED, None)
    if removal is not None:
        removal.join()  # a folder left half removed would stay locked for three days


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection left (torch, timm, dynamo, sklearn and the test modules: 0.7-1 million
    objects a worker) moved out of the garbage collector's sight: every full collection after
    it (benchmark's memory probe makes one a trial; Python's own come every few thousand
    allocations) walked all of them, 0.4 s each on the 2-core machine, 15-40 s of a suite's
    CPU. Objects the tests make are collected as before.

    Frozen without a collection first: the one that sorted out collection's garbage (some
    66,000 of 480,000 objects: import-time cycles) walked them all, about 1 s of CPU a worker,
    to free a few megabytes that the worker can keep until it ends."""
    import atexit
    import gc

    gc.freeze()
    gc.enable()  # off since pytest_sessionstart
    # Back in sight at the interpreter's exit: objects still frozen then are never finalised,
    # and nanobind (triton's bindings, imported with torch._dynamo) lists them as leaks on
    # stderr. Not at pytest_unconfigure: pytest's check for unraisable exceptions then makes
    # two full collections of its own, which would walk them all (0.4-1 s each a worker).
    atexit.unregister(gc.unfreeze)  # once, however many sessions this process runs
    atexit.register(gc.unfreeze)


# The modules with the most test time (seconds summed), longest first. pytest-xdist
# hands out whole modules (--dist loadscope) in collection order (--no-loadscope-reorder): its
# own order, by number of tests, sent the 23 s multi-node test and the 15 s digits run last,
# and one worker finished them alone while the other idled. A module missing here keeps its
# place after these; a stale entry costs nothing. Re-derived from a full run's per-test walls
# summed by module; the order matters for the longest modules only: the short ones handed out
# last even out the workers' ends (a greedy simulation of that run's walls ends them within 5 s
# in this order and in the earlier one alike).
LONGEST_MODULES = (  # seconds of test wall each: the 2-core run of 2026-12-01 (7:10), whose
    # workers ended 4.5 s apart (406.6 and 402.1 s of tests) in this list's earlier order
    "test_torchvision_without_dynamo",  # 37
    "test_export",  # 25
    "test_train_ddp_faults",  # 24
    "test_train_ddp",  # 23
    "test_model_resolver",  # 23
    "test_train_digits_target",  # 23
    "test_train_cli",  # 23
    "test_eval",  # 22
    "test_shards_read",  # 16
    "test_benchmark",  # 15
    "test_plot_helper",  # 14
    "test_outputs",  # 13
    "test_epoch_starts",  # 12
    "test_extract_features",  # 12
    "test_shards_http",  # 12
    "test_deferred_signals",  # 12
    "test_train_guards",  # 11
    "test_suite_gpu_policy",  # 11
    "test_timm_models",  # 10
    "test_video_info",  # 10
    "test_summary",  # 10
    "test_safety_train",  # 10
    "test_safety_convert",  # 9
    "test_train_resume",  # 9
    "test_env",  # 9
    "test_curves_painter",  # 8
    "test_convert_shards",  # 8
    "test_completions",  # 8
    "test_user_notices",  # 8
    "test_bytecode",  # 8
    "test_safety_split",  # 7
    "test_safety_reports",  # 7
    "test_broken_pipe",  # 7
    "test_standard_streams",  # 7
    "test_parquet_read",  # 7
    "test_shards_stream",  # 7
    "test_rendering_errors_checkpoints",  # 6
    "test_hygiene",  # 6
    "test_train_profile",  # 6
    "test_device_decode",  # 6
    "test_decode_ahead",  # 6
    "test_eval_scorer",  # 6
    "test_non_utf8_names",  # 6
    "test_train_config_file",  # 6
    "test_split",  # 6
    "test_distributed_shared",  # 6
    "test_predict",  # 6
    "test_train_threads",  # 5
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
