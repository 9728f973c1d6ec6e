"""SIGTERM at the very end of a command, after its outputs were kept: the command did its work,
but the process was asked to stop, so it ends as every stopped command does (143 and
`Terminated.`), as timeout(1), systemd and Slurm expect, with its outputs whole. Where the stop
never comes out of the command as an exception (a handler that raised inside a finalizer, whose
exception Python reports and drops, after which every later signal is ignored) the command
exited 0; where it came as the command's handlers went back, an in-process caller was left with
SIGTERM and Ctrl-C ignored. And an output a command leaves open although it ends well (a bug)
fails the in-process run that shows it."""

from __future__ import annotations

import contextlib
import gc
import signal
import textwrap
import weakref

import numpy as np
import pytest
from image_folders import write_image_folder
from output_checks import hidden_siblings
from processes import run_torchkit_in_process, run_torchkit_process
from signal_placement import signalled_on_entry

from torchkit.core.io import open_outputs
from torchkit.core.io.outputs import OutputFolder


def _whole(out) -> None:
    """The converted folder kept in place, every image's array in it, nothing left beside it."""
    arrays = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.npy"))
    assert arrays == ["a/a_0.npy", "a/a_1.npy", "b/b_0.npy"]
    assert all(np.load(out / name).size == 8 * 8 * 3 for name in arrays)  # 8x8 RGB
    assert hidden_siblings(out) == []


def _convert(tmp_path):
    write_image_folder(tmp_path / "images", {"a": 2, "b": 1})
    return ["convert", "tensor", tmp_path / "images", tmp_path / "out", "--to", "npy", "-j", "0"]


def _stopped(result) -> None:
    assert result.returncode == 143, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "Terminated.", result.stderr
    assert "Traceback" not in result.stderr


class _Finalized:
    """An object whose weakref finalizer runs as it goes."""


def _stop_swallowed() -> None:
    """SIGTERM handled inside a finalizer (a weakref callback; a `__del__` is the same): the
    command's handler raises there, and Python reports the exception as unraisable and drops
    it, as it does for a real signal whose handler runs while a finalizer does."""
    target = _Finalized()
    weakref.finalize(target, signal.raise_signal, signal.SIGTERM)
    del target  # the finalizer runs now


def test_a_stop_swallowed_after_the_output_was_kept_still_ends_the_command(tmp_path, monkeypatch):
    """Before: exit 0, and every later signal ignored."""
    args = _convert(tmp_path)
    kept = OutputFolder.__exit__

    def exit_then_stop(folder, *exc):
        ended = kept(folder, *exc)
        _stop_swallowed()
        return ended

    monkeypatch.setattr(OutputFolder, "__exit__", exit_then_stop)
    result = run_torchkit_in_process(*args)
    _stopped(result)
    assert "Exception ignored" not in result.stderr  # Python's report of the dropped stop
    _whole(tmp_path / "out")


def test_a_stop_as_the_handlers_go_back_puts_them_back_and_ends_the_command(tmp_path, monkeypatch):
    """Before: the stop raised as the first handler went back left both handlers ignoring
    signals in the caller's process (exit 143)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signalled = signalled_on_entry(
        monkeypatch,
        signal,
        "signal",
        lambda sig, handler: sig == signal.SIGTERM and handler is before[signal.SIGTERM],
    )
    result = run_torchkit_in_process(*_convert(tmp_path))
    assert signalled, "the signal was never placed"
    monkeypatch.undo()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    _stopped(result)
    assert hidden_siblings(tmp_path / "out") == []


def _outermost_ending(manager, *exc) -> bool:
    """The `with` of the app's own command handlers (not of a group's command inside it) as a
    command that ended well leaves it."""
    from torchkit.cli.app import _raise_once

    frame = getattr(getattr(manager, "gen", None), "gi_frame", None)
    if frame is None or frame.f_code.co_name != "_terminate_like_interrupt" or exc[0] is not None:
        return False
    return frame.f_locals["previous"][signal.SIGTERM] is not _raise_once


def test_a_stop_as_the_commands_end_begins_puts_the_handlers_back(tmp_path, monkeypatch):
    """Before: the handlers went back only when the garbage collector freed the stop's
    traceback (never, with it off), the caller's SIGTERM and Ctrl-C ignored until then."""
    write_image_folder(tmp_path / "images", {"a": 2, "b": 1})
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    manager = contextlib._GeneratorContextManager
    signalled = signalled_on_entry(monkeypatch, manager, "__exit__", _outermost_ending)
    gc.disable()  # the moment a collection would have put them back is no one's to choose
    try:
        result = run_torchkit_in_process("dataset-stats", tmp_path / "images", "-j", "0")
        handlers = {sig: signal.getsignal(sig) for sig in before}
    finally:
        gc.enable()
    assert signalled, "the signal was never placed"
    assert handlers == before
    _stopped(result)


def test_a_torchrun_rank_stopped_after_another_rank_failed_keeps_its_exit_code():
    """The rank converts the stop into the failed rank's exit code on purpose (train's
    `one_line_per_failure`): the record of the stop does not turn it back into 143."""
    from torchkit.cli.app import _terminate_like_interrupt
    from torchkit.core.io.errors import DeviceError, Terminated

    stopped = DeviceError("rank 1: stopped after another rank failed")
    stopped.exit_code, stopped.reported_by_another_rank = 3, True
    with pytest.raises(DeviceError) as ended, _terminate_like_interrupt():
        try:
            signal.raise_signal(signal.SIGTERM)
        except Terminated:
            raise stopped from None
    assert ended.value is stopped


def test_an_output_left_open_by_a_command_that_ended_well_fails_the_in_process_run(
    tmp_path, monkeypatch
):
    """A bug (none known): the end of the command discards it while the command says it
    succeeded. The user sees a warning; the suite's in-process runner fails the test."""
    monkeypatch.setattr(OutputFolder, "__exit__", lambda folder, *exc: None)  # never kept
    with pytest.raises(pytest.fail.Exception, match="left outputs open: OutputFolder .*out"):
        run_torchkit_in_process(*_convert(tmp_path))
    assert open_outputs.left_open_on_success == []
    assert not (tmp_path / "out").exists() and hidden_siblings(tmp_path / "out") == []


class _Unkept:
    final = "out"

    def __init__(self) -> None:
        self.closed_with: list = []

    def close_unfinished(self, error) -> None:
        self.closed_with.append(error)


def test_an_output_left_open_by_a_block_that_ended_well_is_closed_with_a_warning(monkeypatch):
    warned: list[str] = []
    monkeypatch.setattr(open_outputs.log, "warning", warned.append)
    output = _Unkept()
    with open_outputs.closed_at_end():
        open_outputs.opened(output)
    assert output.closed_with == [None]  # what the run wrote goes, as before
    assert open_outputs.left_open_on_success == ["_Unkept out"]
    open_outputs.left_open_on_success.clear()
    assert len(warned) == 1 and "_Unkept out" in warned[0] and "bug" in warned[0]


# Run in a real torchkit process (PYTHONPATH): a SIGTERM handled inside a finalizer as the
# command's output folder has just been kept, the command's last step.
STOP_AFTER_KEEP = textwrap.dedent(
    """
    import signal, weakref
    from torchkit.core.io.outputs import OutputFolder

    kept = OutputFolder.__exit__

    class Finalized:
        pass

    def exit_then_stop(folder, *exc):
        ended = kept(folder, *exc)
        target = Finalized()
        weakref.finalize(target, signal.raise_signal, signal.SIGTERM)
        del target
        return ended

    OutputFolder.__exit__ = exit_then_stop
    """
)


def test_the_program_stopped_after_its_output_was_kept_exits_143(tmp_path):
    """Before: exit 0 after SIGTERM (a scheduler or `timeout` was told the run succeeded)."""
    (tmp_path / "sitecustomize.py").write_text(STOP_AFTER_KEEP)
    args = [str(arg) for arg in _convert(tmp_path)]
    done = run_torchkit_process(*args, env={"PYTHONPATH": str(tmp_path)})
    _stopped(done)
    assert done.stderr == "Terminated.\n"  # not Python's report of the stop it dropped
    _whole(tmp_path / "out")
