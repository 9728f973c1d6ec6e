"""Ctrl-C and SIGTERM during `import torch` (`torchkit.deferred_signals`): held back until the
import is over, then handled as at any other moment."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from processes import run_torchkit_process
from signal_placement import signalled_on_first_import

from torchkit import deferred_signals
from torchkit.import_hooks import WrappingLoader


@pytest.mark.parametrize(
    ("signals", "code", "said"),
    [("SIGTERM", 143, "Terminated."), ("SIGINT,SIGTERM", 130, "Interrupted.")],
    ids=["sigterm", "sigint-and-sigterm-at-once"],
)
def test_a_signal_during_import_torch_stops_the_command(tmp_path, signals, code, said):
    """Before: a SIGTERM there was swallowed in torch's C++ and every later signal ignored
    (the run trained to its end, exit 0); SIGINT and SIGTERM at once printed CPython's
    "Signal 15 ignored due to race condition"."""
    # in a `train` on digits, numpy's first import is inside `import torch`
    during_import = signalled_on_first_import(tmp_path, "numpy", *signals.split(","))
    done = run_torchkit_process(
        "train", "--epochs", "1", "--out", str(tmp_path / "run"),
        env=during_import,
        fresh=True,  # the subject is `import torch` itself: a fork has it done already
    )  # fmt: skip
    assert done.returncode == code, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == said
    assert "race condition" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists() and done.stdout == ""


@pytest.mark.parametrize(
    ("signame", "code", "said"), [("SIGINT", 130, "Interrupted."), ("SIGTERM", 143, "Terminated.")]
)
def test_a_signal_while_torchkit_starts_ends_it_with_one_line(tmp_path, signame, code, said):
    """Before: Ctrl-C there printed Python's KeyboardInterrupt traceback (18 lines), and
    SIGTERM ended it without a word."""
    # sent while the CLI's command modules are imported: before a command's handlers are set
    while_starting = signalled_on_first_import(tmp_path, "torchkit.cli.split", signame)
    done = run_torchkit_process("env", env=while_starting)
    assert done.returncode == code
    assert done.stderr.splitlines() == [said] and done.stdout == ""


@pytest.fixture
def handled(monkeypatch):
    """SIGUSR1 handled as torchkit's handlers do: deferred inside a held-back import."""
    seen: list[int] = []

    def handler(signum, frame):
        if deferred_signals.defer(signum):
            return
        seen.append(signum)

    previous = signal.signal(signal.SIGUSR1, handler)
    yield seen
    signal.signal(signal.SIGUSR1, previous)


def test_a_signal_inside_the_block_is_handled_once_when_it_ends(handled):
    with deferred_signals.signals_deferred():
        with deferred_signals.signals_deferred():  # torchvision importing torch
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGUSR1)
        assert handled == []
    assert handled == [signal.SIGUSR1]
    os.kill(os.getpid(), signal.SIGUSR1)  # after it: at once
    assert handled == [signal.SIGUSR1] * 2


def test_a_block_in_another_thread_holds_no_signal_back(handled):
    """A download thread making its temporary file (a block) held the main thread's signal
    back, then sent it again from that thread, where no handler runs: the main thread, waiting
    on a lock for that thread's work, never woke. Handled at once now, and once."""
    import threading

    inside, leave = threading.Event(), threading.Event()

    def block() -> None:
        with deferred_signals.signals_deferred():
            inside.set()
            leave.wait(30)

    thread = threading.Thread(target=block)
    thread.start()
    try:
        assert inside.wait(30)
        signal.raise_signal(signal.SIGUSR1)  # to the main thread, as the kernel sends Ctrl-C
        assert handled == [signal.SIGUSR1]
    finally:
        leave.set()
        thread.join(30)
    assert handled == [signal.SIGUSR1]
    assert deferred_signals._depth == 0 and deferred_signals._pending == []


def test_only_the_main_threads_first_import_of_the_packages_is_wrapped(monkeypatch):
    finder = deferred_signals._Finder()
    others = [f for f in sys.meta_path if not isinstance(f, deferred_signals._Finder)]
    monkeypatch.setattr(sys, "meta_path", [finder, *others])
    assert finder.find_spec("numpy") is None  # not one of them: the others find it
    spec = finder.find_spec("torch")
    assert isinstance(spec.loader, WrappingLoader) and spec.loader.running == finder.running
    import threading

    found = []
    thread = threading.Thread(target=lambda: found.append(finder.find_spec("torch")))
    thread.start()
    thread.join()
    assert found == [None]  # handlers run in the main thread only: nothing to hold back


def test_torchvision_is_found_through_both_finders(monkeypatch):
    """torchvision_without_dynamo's finder also asks the other finders: neither may ask the
    other back (before: a RecursionError on `import torchvision` in every command)."""
    from torchkit import torchvision_without_dynamo as light

    ours, theirs = deferred_signals._Finder(), light._Finder()
    others = [
        f for f in sys.meta_path if not isinstance(f, deferred_signals._Finder | light._Finder)
    ]
    monkeypatch.setattr(sys, "meta_path", [ours, theirs, *others])
    monkeypatch.setattr(light, "dynamo_loaded", lambda: False)  # this process compiled
    spec = ours.find_spec("torchvision")
    assert isinstance(spec.loader, WrappingLoader) and spec.loader.running == ours.running
    inner = spec.loader.real  # the stand-ins' loader, run with signals held back
    assert isinstance(inner, WrappingLoader) and inner.running == theirs.running
    assert type(inner.real).__name__ == "SourceFileLoader"


def test_ignore_later_is_a_handler_not_sig_ign():
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        deferred_signals.ignore_later([signal.SIGUSR2])
        handler = signal.getsignal(signal.SIGUSR2)
        assert handler is not signal.SIG_IGN and deferred_signals.ignores(handler)
        os.kill(os.getpid(), signal.SIGUSR2)  # does nothing
        assert deferred_signals.ignores(signal.SIG_IGN)
        assert not deferred_signals.ignores(signal.SIG_DFL)
    finally:
        signal.signal(signal.SIGUSR2, previous)
