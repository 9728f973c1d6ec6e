"""SIGTERM as the app's callback makes the stderr log handler (`console.install_log_handler`),
inside logging's `Handler.__init__` after it has listed the handler for its clean-up at exit
and before it has made the handler's lock: the command ended with 143, but stderr ended in
Python's report of an AttributeError (`'_StderrHandler' object has no attribute 'lock'`),
raised by `logging.shutdown` at exit, instead of the `Terminated.` line. A real process: the
subject is the interpreter's exit."""

from __future__ import annotations

import textwrap

from processes import run_torchkit_process

# sitecustomize for the process: SIGTERM raised as a stderr log handler's lock is about to be
# made, only while a command's own handlers are set (the app's callback runs under them).
STOP_BEFORE_THE_LOCK = textwrap.dedent(
    """
    import logging, signal, sys

    make_lock = logging.Handler.createLock

    def stop_then_make_lock(handler):
        app = sys.modules["torchkit.cli.app"]
        console = sys.modules["torchkit.cli.console"]
        if (
            isinstance(handler, console._StderrHandler)
            and signal.getsignal(signal.SIGTERM) is app._raise_once
        ):
            print("stop raised", file=sys.stderr)
            signal.raise_signal(signal.SIGTERM)
        return make_lock(handler)

    logging.Handler.createLock = stop_then_make_lock
    """
)


def test_a_stop_as_the_log_handler_is_made_ends_with_terminated(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(STOP_BEFORE_THE_LOCK)
    done = run_torchkit_process("env", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 143, done.stderr
    assert done.stderr == "stop raised\nTerminated.\n"  # the stop came where it was placed
    assert done.stdout == ""  # the command itself never ran
