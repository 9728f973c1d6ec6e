"""The suite's xdist controller removes the temporary folders of old runs while the tests run
(tests/conftest.py, `_remove_old_runs_meanwhile`), not after the last test as pytest does."""

from __future__ import annotations

import types

import conftest
import pytest
from _pytest.tmpdir import TempPathFactory


def _controller_config(monkeypatch, tmp_path, *, basetemp=None, count=3, policy="all"):
    monkeypatch.setenv("PYTEST_DEBUG_TEMPROOT", str(tmp_path))
    factory = TempPathFactory(basetemp, count, policy, trace=lambda *a: None, _ispytest=True)
    return types.SimpleNamespace(_tmp_path_factory=factory, stash=pytest.Stash())


def test_the_runs_before_the_kept_ones_go_as_the_session_starts(monkeypatch, tmp_path):
    runs = tmp_path / "pytest-of-tester"
    monkeypatch.setattr("_pytest.tmpdir.get_user", lambda: "tester")
    for number in range(4):
        (runs / f"pytest-{number}" / "popen-gw0").mkdir(parents=True)
        (runs / f"pytest-{number}" / "popen-gw0" / "model.pt").write_bytes(b"x" * 1000)
    (runs / "pytest-1" / ".lock").touch()  # a run still going (or killed within 3 days)
    config = _controller_config(monkeypatch, tmp_path)

    conftest._remove_old_runs_meanwhile(config)
    conftest.pytest_unconfigure(config)  # waits for the removal

    # This session's folder is pytest-4: it keeps 2 runs before it (3 in all) and the locked one.
    assert sorted(path.name for path in runs.iterdir() if not path.is_symlink()) == [
        "pytest-1", "pytest-2", "pytest-3", "pytest-4",
    ]  # fmt: skip
    assert (runs / "pytest-4" / ".lock").is_file()  # this session's, removed at its end
    assert config._tmp_path_factory.getbasetemp() == runs / "pytest-4"


@pytest.mark.parametrize(
    ("given", "count", "policy"), [(True, 3, "all"), (False, 0, "all"), (False, 3, "none")]
)
def test_nothing_is_removed_early_where_the_folder_is_given_or_none_is_kept(
    monkeypatch, tmp_path, given, count, policy
):
    monkeypatch.setattr("_pytest.tmpdir.get_user", lambda: "tester")
    old = tmp_path / "pytest-of-tester" / "pytest-0"
    old.mkdir(parents=True)
    basetemp = tmp_path / "given" if given else None
    config = _controller_config(
        monkeypatch, tmp_path, basetemp=basetemp, count=count, policy=policy
    )
    conftest._remove_old_runs_meanwhile(config)
    conftest.pytest_unconfigure(config)
    assert old.is_dir()
