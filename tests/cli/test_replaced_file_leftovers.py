"""The old file an `-o`/OUT `--force` run sets aside (`ReplacedFiles`: `.NAME.<hex>.replaced`,
flocked while the run lives) when that run is SIGKILLed: the next run replacing the same file
removes it, never a live run's, and never changes the file at the name. Real processes: the
kernel dropping a killed process's flock is what is under test."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchkit.core.io.file_outputs import ReplacedFiles
from torchkit.core.io.output_locks import OutputLockedError


def _run_setting_aside(target: Path) -> subprocess.Popen:
    """A run that sets `target` aside and prints `ready`; on a line on its stdin it puts a new
    file in its place and prints `replaced`; then it waits until it is killed."""
    script = (
        "import os, sys, pathlib; from torchkit.core.io.file_outputs import ReplacedFiles\n"
        f"target = pathlib.Path({str(target)!r})\n"
        "replaced = ReplacedFiles(); replaced.set_aside(target); print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "pathlib.Path(f'{target}.new').write_bytes(b'new'); os.replace(f'{target}.new', target)\n"
        "print('replaced', flush=True); sys.stdin.read()\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert run.stdout.readline().strip() == "ready"
    return run


def _kill(run: subprocess.Popen) -> None:
    run.kill()  # SIGKILL: no put_back ran, the kernel drops the flocks it held
    run.wait()


def _asides(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.endswith(".replaced")]


def test_a_killed_runs_set_aside_goes_at_the_next_replacement_and_a_live_runs_stays(
    tmp_path, caplog
):
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old")
    run = _run_setting_aside(target)
    # The old file still at its name, set aside by a live run: a second run is refused.
    with pytest.raises(OutputLockedError, match="being replaced by another torchkit process"):
        ReplacedFiles().set_aside(target)
    run.stdin.write("\n")
    run.stdin.flush()
    assert run.stdout.readline().strip() == "replaced"
    (aside,) = _asides(tmp_path)
    # Its new file at the name, the old one set aside: still refused (a failure of the live run
    # would put the old file back over the second run's), and its set-aside is left alone.
    with pytest.raises(OutputLockedError, match=f"{target} is being replaced by another"):
        ReplacedFiles().set_aside(target)
    assert _asides(tmp_path) == [aside] and aside.read_bytes() == b"old"
    _kill(run)
    with caplog.at_level(logging.WARNING, logger="torchkit"), ReplacedFiles() as third:
        third.set_aside(target)
    assert os.listdir(tmp_path) == ["model.onnx"] and target.read_bytes() == b"new"
    assert f"removed {aside}: the earlier {target}, set aside by a torchkit run" in caplog.text


def test_a_run_killed_before_it_replaced_the_file_leaves_it_as_it_was(tmp_path, caplog):
    target = tmp_path / "report.json"
    target.write_bytes(b"old")
    _kill(_run_setting_aside(target))
    assert len(_asides(tmp_path)) == 1  # a second name of the old file
    with caplog.at_level(logging.WARNING, logger="torchkit"), ReplacedFiles() as replaced:
        replaced.set_aside(target)
    assert os.listdir(tmp_path) == ["report.json"] and target.read_bytes() == b"old"
    assert caplog.text == ""  # nothing lost, nothing to say


def test_one_file_under_two_output_names_is_set_aside_under_both(tmp_path):
    """`dataset-stats -o a.json --leakage-csv b.csv` where b.csv is a hard link of a.json: the
    second name was refused as "being replaced by another torchkit process" (flock refuses a
    second descriptor of the same process); both names get their old file back on failure."""
    first, second = tmp_path / "a.json", tmp_path / "b.csv"
    first.write_bytes(b"old")
    os.link(first, second)
    with pytest.raises(KeyboardInterrupt), ReplacedFiles() as replaced:
        for target in (first, second):
            replaced.set_aside(target)
            target.with_name("new").write_bytes(b"new")
            os.replace(target.with_name("new"), target)
            replaced.wrote(target)
        raise KeyboardInterrupt
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.csv"]
    assert os.path.samefile(first, second) and first.read_bytes() == b"old"
