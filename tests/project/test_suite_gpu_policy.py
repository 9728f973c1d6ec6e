"""The default test run is the CPU suite on every machine (conftest hides any GPU); the GPU tests
carry the `cuda` marker and run with `pytest -m cuda`."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest


def test_the_default_run_hides_the_gpu_from_this_process_and_the_ones_it_starts(request):
    if "cuda" in (request.config.option.markexpr or "") or os.environ.get(
        "TORCHKIT_TESTS_SEE_GPU", ""
    ) not in ("", "0"):
        pytest.skip("this run was asked to see the GPU")
    import torch

    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert torch.cuda.device_count() == 0
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "''"


def test_every_test_that_needs_a_gpu_carries_the_cuda_marker(request):
    """A test skipped for want of CUDA must be one `pytest -m cuda` selects."""
    session = request.session
    unmarked = [
        item.nodeid
        for item in session.items
        for mark in item.iter_markers("skipif")
        if "CUDA GPU" in str(mark.kwargs.get("reason", "")) and not item.get_closest_marker("cuda")
    ]
    assert unmarked == []


def test_the_gpu_machines_wheels_bring_their_own_dependencies():
    """gpu_session.sh installs fetch_gpu_wheels.sh's wheels with --no-deps on a machine without
    network: a wheel whose dependency is missing there fails at import (pytest-xdist without
    execnet stops every pytest run). Only pytest, torch's and torchvision's are the machine's."""
    import re

    from suite_paths import REPO

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on

    script = (REPO / "benchmarks" / "fetch_gpu_wheels.sh").read_text()
    names = set(
        re.search(r"for name in (.*?); do", script, re.S).group(1).replace("\\", " ").split()
    )
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    packages = {package["name"]: package for package in lock["package"]}
    missing = {
        (name, dependency["name"])
        for name in names
        for dependency in packages[name].get("dependencies", [])
        if "win32" not in dependency.get("marker", "")
        and dependency["name"] not in names | {"pytest", "torch", "torchvision"}
    }
    assert missing == set()


# What both GPU scripts ask before running anything: `"$PY" -m torchkit env --require-cuda ...`.
REQUIRE_CUDA = ("env", "--require-cuda", "--format", "json")


@pytest.fixture(scope="module")
def python_without_gpu(tmp_path_factory) -> Path:
    """A PY for the GPU scripts: this Python for every command but `-m torchkit env
    --require-cuda --format json`, which answers with what that command answered in a real
    torchkit process without a GPU (its exit code, stdout and stderr, recorded once): each
    script's own fresh interpreter spent seconds of CPU importing torch only to say it."""
    from processes import run_torchkit_process

    done = run_torchkit_process(*REQUIRE_CUDA, env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 1 and "Error: no usable CUDA GPU" in done.stderr, done.stderr
    folder = tmp_path_factory.mktemp("python_without_gpu")
    (folder / "stdout").write_text(done.stdout)
    (folder / "stderr").write_text(done.stderr)
    asked = " ".join(("-m", "torchkit", *REQUIRE_CUDA))
    python = folder / "python"
    python.write_text(
        "#!/bin/bash\n"
        f'if [ "$*" = "{asked}" ]; then\n'
        f"  cat {shlex.quote(str(folder / 'stdout'))}\n"
        f"  cat {shlex.quote(str(folder / 'stderr'))} >&2\n"
        f"  exit {done.returncode}\n"
        "fi\n"
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("script", ["gpu_tests.sh", "gpu_check.sh"])
def test_the_gpu_scripts_stop_where_no_gpu_is_usable(tmp_path, script, python_without_gpu):
    """Without a usable GPU the GPU tests all skip and the check's steps all fail (n/a rows):
    either would end in 0, read as a pass. Both stop with 2 and say why (torchkit's own
    reason), running nothing."""
    from suite_paths import REPO

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PY": str(python_without_gpu)}
    env.update(ONLY="none", OUT=str(tmp_path / "out"))
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / script), "tests/project/test_layering.py"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"no usable CUDA GPU for {python_without_gpu}" in done.stderr
    assert "Error: no usable CUDA GPU" in done.stderr  # torchkit's line, passed on
    assert not (tmp_path / "out" / "cuda.log").exists()
