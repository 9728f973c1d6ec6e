"""Shell completions asked of `python -m torchkit` as a shell asks them (the protocol's variables
in the environment, the module run as `-m` runs it), several in one fresh interpreter: what
completion imports is the subject, so no process that has imported torchkit, torch or rich
will do, but each start costs a Python and torchkit's imports (about 0.45 s of CPU).

One process for all answers: what one completion loads stays loaded for the next, so an import
shows in the answer that made it and in every later one. Give the answers whose imports are
checked before any that may import more (zsh's help text renders with rich)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

# Runs in a fresh interpreter: a case (JSON) a line on stdin, run as `python -m torchkit` with no
# arguments in its working folder (CWD, where given) with its variables set, then what it printed
# (JSON: its lines) a line on stdout, until stdin ends. Given an argument, it also writes that
# line on stderr after each answer (under -X importtime, whose lines go to stderr too: the
# imports each answer made).
_ANSWER_LINES = r"""
import contextlib, io, json, os, runpy, sys

answered = sys.argv.pop(1) if len(sys.argv) > 1 else None  # then argv is `-m torchkit`'s
for line in sys.stdin:
    case = json.loads(line)
    os.chdir(case.pop("--cwd--", os.getcwd()))
    os.environ.update(case)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        runpy.run_module("torchkit", run_name="__main__", alter_sys=True)
    for name in case:
        del os.environ[name]
    sys.stdout.write(json.dumps(out.getvalue().splitlines()) + "\n")
    sys.stdout.flush()
    if answered is not None:
        sys.stderr.write(answered + "\n")
        sys.stderr.flush()
"""
ANSWERED = "-- answered --"
# A case's working folder, where it is not this process's (a key, not a variable).
CWD = "--cwd--"


def completions_in_one_process(
    cases: Sequence[dict[str, str]],
) -> list[tuple[list[str], set[str]]]:
    """For each case (the completion variables of one TAB press, and its working folder under
    CWD where given), in order in one fresh interpreter: the lines torchkit printed, and the
    modules imported (as -X importtime names them, failed attempts too) from the interpreter's
    start until it had answered."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", _ANSWER_LINES, ANSWERED],
        input="".join(json.dumps(case) + "\n" for case in cases),
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    imported: set[str] = set()
    so_far = []
    for line in done.stderr.splitlines():
        if line == ANSWERED:
            so_far.append(set(imported))
        elif line.startswith("import time:") and "|" in line:
            imported.add(line.rsplit("|", 1)[1].strip())
    assert len(so_far) == len(answers) == len(cases), done.stderr
    return list(zip(answers, so_far, strict=True))


class CompletionAnswerer:
    """One fresh interpreter answering TAB presses as `completions_in_one_process` does, for as
    long as it is open (several tests' presses: one start, not one a test). What it imports is
    not checked: each answer comes after the earlier ones'."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ANSWER_LINES],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ},
        )

    def ask(self, cases: Sequence[dict[str, str]]) -> list[list[str]]:
        """The lines torchkit printed for each case (its variables, its folder under CWD)."""
        answers = []
        for case in cases:
            self.process.stdin.write(json.dumps(case) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
            assert line, f"the answering interpreter ended (exit {self.process.wait()})"
            answers.append(json.loads(line))
        return answers

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.process.stdout.close()
