"""A torchkit process that has loaded torch ends without the interpreter's teardown
(`cli.app.exit_without_teardown`: 0.5-0.7 s saved per command), after everything an exit does
that can matter: its exit code, threading's exit hooks (an idle thread pool), non-daemon
threads, atexit handlers, flushed output."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from output_checks import error_line
from processes import CLOSED, run_torchkit_process

# A caller's atexit handler, and a non-daemon thread started as the command ends, around
# torchkit's own main as `python -m torchkit` runs it: a sitecustomize, which the process imports
# before it runs torchkit (a fork of a Python that has imported torch: the exit is the subject,
# not the start).
AROUND_MAIN = """
import atexit, sys, threading
import torchkit.cli as cli
atexit.register(lambda: print("handler ran", flush=False))
class Sentinel:  # its __del__ runs when Python tears the module down
    def __del__(self):
        sys.__stderr__.write("torn down\\n")
sentinel = Sentinel()
from concurrent.futures import ThreadPoolExecutor
idle = ThreadPoolExecutor(2)  # never shut down: its idle workers are non-daemon threads
idle.submit(print, "task ran").result()
def work():
    for _ in range(3 * 10**6):  # still running when the command has ended (a Python loop:
        pass  # the main thread runs on between its bytecodes)
    sys.stderr.write("thread done\\n")
def end(done, original=cli.exit_without_teardown):
    threading.Thread(target=work).start()
    original(done)
cli.exit_without_teardown = end
"""


def test_a_command_that_loaded_torch_keeps_its_output_code_threads_and_handlers(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(AROUND_MAIN)
    done = run_torchkit_process(
        "summary", "convnet", "--input-size", "3,12,12", "--format", "json",
        env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # stdout (a pipe, block-buffered) came whole, the handler's line after the JSON
    body, _, last = done.stdout.removeprefix("task ran\n").rstrip("\n").rpartition("\n")
    assert last == "handler ran" and done.stdout.startswith("task ran\n")
    assert json.loads(body)["model"] == "ConvNet"
    assert "thread done" in done.stderr  # the non-daemon thread was waited for
    assert "torn down" not in done.stderr  # and the modules were not torn down


def test_a_message_as_the_exit_code_is_printed_and_exits_1():
    program = (
        "from torchkit.cli.app import exit_without_teardown; "
        "exit_without_teardown(SystemExit('goodbye'))"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr == "goodbye\n"


def test_main_called_from_someones_python_raises_system_exit_as_before(monkeypatch, capsys):
    # In this process (torch loaded): were `main` to end the process, the test would die here.
    import pytest

    from torchkit.cli import main

    argv = ["my_tool.py", "summary", "convnet", "--input-size", "3,12,12", "--format", "json"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code in (0, None)
    assert json.loads(capsys.readouterr().out)["model"] == "ConvNet"


def test_without_stdout_or_stderr_at_all_the_code_stands():
    # pythonw, or `torchkit ... >&- 2>&-`: Python has no stream objects to flush
    program = (
        "import sys; sys.stdout = sys.stderr = None\n"
        "from torchkit.cli.app import exit_without_teardown\n"
        "exit_without_teardown(SystemExit(3))"
    )
    assert subprocess.run([sys.executable, "-c", program]).returncode == 3


def test_a_command_with_no_stdout_at_all_fails_when_it_writes_its_result(monkeypatch):
    # `torchkit summary ... >&-`: Python's sys.stdout is None. The result cannot be written:
    # an error, as GNU tools report "write error: Bad file descriptor", not a success exit
    # with the result lost. What writes nothing (an empty write, a flush) passes.
    import pytest
    from typer.testing import CliRunner

    from torchkit.cli import app, console
    from torchkit.core.io.errors import OutputWriteError

    monkeypatch.setattr(sys, "stdout", None)
    with console.results_only_on_stdout():  # as a command starts, with sys.stdout None
        console.stdout.file.write("")
        console.stdout.file.flush()
        assert console.stdout.file.isatty() is False
        with pytest.raises(OutputWriteError, match="standard output: Bad file descriptor"):
            console.stdout.file.write("result\n")
    monkeypatch.undo()
    done = CliRunner().invoke(app, ["summary", "convnet", "-i", "1,12,12", "--format", "json"])
    assert done.exit_code == 0 and json.loads(done.stdout)["model"] == "ConvNet"


def test_a_result_into_a_closed_stdout_is_one_error_line_and_exit_1():
    # The process boundary is the subject: a shell's `>&-` starts it with file descriptor 1
    # closed. Before, it exited 0 with its result written nowhere.
    done = _run_with_stdout_closed(["summary", "convnet", "-i", "1,12,12", "-q"])
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr, besides="nothing")
    assert line.startswith("Error: cannot write to standard output: Bad file descriptor")


@pytest.mark.parametrize("words", [["--help"], ["--version"], ["split", "--help"]])
def test_help_and_version_into_a_closed_stdout_are_the_same_error(words):
    # Before, click and rich wrote them nowhere (sys.stdout is None) and the exit was 0.
    done = _run_with_stdout_closed(words)
    assert done.returncode == 1, done.stderr
    assert error_line(done.stderr, besides="nothing") == (
        "Error: cannot write to standard output: Bad file descriptor (standard output is "
        "closed: send it to a file or to /dev/null)"
    )


def _run_with_stdout_closed(words: list[str]) -> subprocess.CompletedProcess:
    """`python -m torchkit WORDS` started as a shell's `>&-` starts it: descriptor 1 closed
    (and sys.stdout None, as a fresh interpreter's start-up makes it, in a fork too)."""
    return run_torchkit_process(*words, stdout=CLOSED)
