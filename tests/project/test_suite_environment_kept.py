"""The suite's own environment keeping (tests/conftest.py's `environment_kept` and
`module_environment_kept`, kept_environment.py): what a test or a module's fixtures set is put
back, and nothing else is set again."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import kept_environment
import pytest
from inner_pytest import run_inner_session


def test_what_a_test_added_changed_or_removed_is_put_back(monkeypatch):
    monkeypatch.setenv("TORCHKIT_TEST_KEPT_CHANGED", "before")
    monkeypatch.setenv("TORCHKIT_TEST_KEPT_REMOVED", "before")
    monkeypatch.delenv("TORCHKIT_TEST_KEPT_ADDED", raising=False)
    with kept_environment.environment_kept():
        os.environ["TORCHKIT_TEST_KEPT_CHANGED"] = "after"
        del os.environ["TORCHKIT_TEST_KEPT_REMOVED"]
        os.environ["TORCHKIT_TEST_KEPT_ADDED"] = "after"
    assert os.environ["TORCHKIT_TEST_KEPT_CHANGED"] == "before"
    assert os.environ["TORCHKIT_TEST_KEPT_REMOVED"] == "before"
    assert "TORCHKIT_TEST_KEPT_ADDED" not in os.environ


def test_only_what_changed_is_set_again_and_pytests_phase_is_no_change(monkeypatch):
    """pytest names each phase in PYTEST_CURRENT_TEST, so every test's environment differed at
    its teardown: every variable was cleared and set again (0.3-0.5 ms a test)."""
    monkeypatch.setenv("TORCHKIT_TEST_KEPT_CHANGED", "before")
    calls: list[tuple[str, ...]] = []
    kept = kept_environment.environment_kept()
    kept.__enter__()
    os.environ["PYTEST_CURRENT_TEST"] = "tests/x.py::test_x (teardown)"
    os.environ["TORCHKIT_TEST_KEPT_CHANGED"] = "after"
    # os.environ sets and unsets through these module functions (looked up at each call).
    monkeypatch.setattr(os, "putenv", lambda key, value: calls.append(("put", key, value)))
    monkeypatch.setattr(os, "unsetenv", lambda key: calls.append(("unset", key)))
    kept.__exit__(None, None, None)
    assert calls == [("put", b"TORCHKIT_TEST_KEPT_CHANGED", b"before")]
    assert os.environ["PYTEST_CURRENT_TEST"] == "tests/x.py::test_x (teardown)"


def test_a_module_fixtures_variable_does_not_reach_the_next_module(tmp_path: Path, monkeypatch):
    """An in-process `train --deterministic` run in a module fixture sets
    CUBLAS_WORKSPACE_CONFIG before any test's own environment_kept begins: it must end with
    the module (every later torchkit process needed new preloaded servers)."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    (tmp_path / "test_inner_a.py").write_text(
        textwrap.dedent(
            """
            import os

            import pytest
            from conftest import environment_kept, module_environment_kept  # noqa: F401


            @pytest.fixture(scope="module")
            def deterministic_run():
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


            def test_the_module_sees_it(deterministic_run):
                assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
            """
        )
    )
    (tmp_path / "test_inner_b.py").write_text(
        "import os\n\n\ndef test_the_next_module_does_not():\n"
        "    assert 'CUBLAS_WORKSPACE_CONFIG' not in os.environ\n"
    )
    code = run_inner_session(tmp_path)
    assert code == pytest.ExitCode.OK
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
