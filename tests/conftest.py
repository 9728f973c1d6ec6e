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
