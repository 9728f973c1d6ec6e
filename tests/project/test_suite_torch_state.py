"""The suite's own keeping of torch's process-wide settings (tests/conftest.py's
`torch_state_kept`, torch_state.py): what a module's in-process runs set (`--deterministic`,
`--threads`, the benchmark's cudnn autotuner) ends with the module."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import torch_state
from inner_pytest import run_inner_session


def test_every_setting_a_block_changed_is_put_back():
    before = torch_state.torch_settings()
    with torch_state.torch_state_kept():
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.set_num_threads(torch.get_num_threads() + 1)
        torch.set_anomaly_enabled(True, False)
        torch.set_default_dtype(torch.float64)
        torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
        torch.backends.cudnn.deterministic = not torch.backends.cudnn.deterministic
        changed = torch_state.torch_settings()
    assert changed is not None and before is not None
    assert {name for name in before if changed[name] != before[name]} == set(before) - {
        "cudnn_enabled"
    }
    assert torch_state.torch_settings() == before


def test_a_modules_deterministic_run_does_not_reach_the_next_module(tmp_path: Path):
    """An in-process `train --deterministic` run (a module fixture's) turned deterministic
    algorithms on for every later module of the worker."""
    assert not torch.are_deterministic_algorithms_enabled()
    (tmp_path / "test_inner_torch_state_a.py").write_text(
        textwrap.dedent(
            """
            import pytest
            import torch
            from conftest import torch_state_kept  # noqa: F401


            @pytest.fixture(scope="module")
            def deterministic_run():
                torch.use_deterministic_algorithms(True, warn_only=True)
                torch.backends.cudnn.deterministic = True


            def test_the_module_sees_it(deterministic_run):
                assert torch.are_deterministic_algorithms_enabled()
            """
        )
    )
    (tmp_path / "test_inner_torch_state_b.py").write_text(
        "import torch\n\n\ndef test_the_next_module_does_not():\n"
        "    assert not torch.are_deterministic_algorithms_enabled()\n"
        "    assert not torch.backends.cudnn.deterministic\n"
    )
    code = run_inner_session(tmp_path)
    assert code == pytest.ExitCode.OK
    assert not torch.are_deterministic_algorithms_enabled()
