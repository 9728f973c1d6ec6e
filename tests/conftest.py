"""Fixtures shared by the test modules: a CLI runner, a real `python -m torchkit` subprocess, and
tiny generated image folders. Keep this small; command-specific fixtures live with their tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def runner() -> CliRunner:
    """`runner.invoke(app, [...])`; `result.stdout` and `result.stderr` are kept apart."""
    return CliRunner()


@pytest.fixture(scope="session")
def _torchkit_command():
    import typer.main

    from torchkit.cli import app

    return typer.main.get_command(app)


@pytest.fixture
def cli_built_once(monkeypatch, _torchkit_command):
    """typer rebuilds the whole command tree (every command's signature) on each invoke, which
    costs more than a quick command: modules of many small invocations reuse one tree
    (`pytestmark = pytest.mark.usefixtures("cli_built_once")`)."""
    import typer.testing

    monkeypatch.setattr(typer.testing, "_get_command", lambda _app: _torchkit_command)


def run_torchkit_process(
    *args: str, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m torchkit ARGS` in a real process (about a second without torch)."""
    inherited = ("TORCHKIT_DEBUG", "FORCE_COLOR", "NO_COLOR")  # tests say what they want
    full_env = {key: value for key, value in os.environ.items() if key not in inherited}
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


def start_torchkit_process(
    *args: str, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None
) -> subprocess.Popen:
    """Start `python -m torchkit ARGS` in its own session (process group = its PID, so that
    `processes_in_group` finds every worker it started); stdout and stderr are pipes."""
    inherited = ("TORCHKIT_DEBUG", "FORCE_COLOR", "NO_COLOR")
    full_env = {key: value for key, value in os.environ.items() if key not in inherited}
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
