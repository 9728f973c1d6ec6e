"""A pytest session run inside a test on a folder of generated test modules: how the suite's own
machinery (conftest's module fixtures) is checked across the modules of one worker."""

from __future__ import annotations

from pathlib import Path

import pytest


def run_inner_session(folder: Path) -> int:
    """Run the test modules in `folder` in this process, one after another (no xdist, no
    cache), with `folder` as the root and an empty pytest.ini of its own; the exit code."""
    ini = folder / "pytest.ini"
    ini.write_text("[pytest]\n")
    options = ["-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    return pytest.main([str(folder), *options, "--rootdir", str(folder), "-c", str(ini)])
