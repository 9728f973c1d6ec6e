"""The default test run is the CPU suite on every machine (conftest hides any GPU); the GPU tests
carry the `cuda` marker and run with `pytest -m cuda`."""

from __future__ import annotations

import os
import subprocess
import sys

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
