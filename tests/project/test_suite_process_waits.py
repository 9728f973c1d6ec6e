"""The suite's waits for the torchkit processes a test starts end: a process that runs past its
`timeout` is killed, and the test fails soon after, also where a process it started keeps its
stdout and stderr open (a helper process, a loader worker that outlives it). The wait for the
end of that output had no limit: the test, and the whole run behind it, hung for as long as
that process lived."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import processes
import pytest
from processes import run_torchkit_process

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX processes")


def _outliving_child(folder: Path) -> dict[str, str]:
    """An environment whose torchkit process starts, in sitecustomize, a child that keeps its
    stdout and stderr open for 600 s (its PID written to folder/child), then sleeps."""
    (folder / "sitecustomize.py").write_text(
        "import os, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        f"with open({str(folder / 'child')!r} + '.part', 'w') as out:\n"
        "    out.write(str(child.pid))\n"
        f"os.replace({str(folder / 'child')!r} + '.part', {str(folder / 'child')!r})\n"
        "time.sleep(600)\n"
    )
    return {"PYTHONPATH": str(folder)}


@pytest.mark.parametrize("fresh", [False, True], ids=["preloaded", "fresh"])
def test_a_process_past_its_timeout_fails_the_test_though_its_child_keeps_its_output(
    tmp_path, fresh, monkeypatch
):
    monkeypatch.setattr(processes, "OUTPUT_AFTER_END_S", 1.0)
    env = _outliving_child(tmp_path)
    started = time.monotonic()
    try:
        with pytest.raises(subprocess.TimeoutExpired) as timed_out:
            run_torchkit_process("--version", env=env, fresh=fresh, timeout=3)
        waited = time.monotonic() - started
    finally:
        child = tmp_path / "child"
        if child.exists():
            os.kill(int(child.read_text()), signal.SIGKILL)
    assert child.exists()  # the child was started: the wait was for its output
    assert waited < 30, waited  # before: until the child ended (600 s)
    assert timed_out.value.stderr in ("", b"", None)  # what it wrote (nothing), not an error
