"""The helper-process mechanism (core/runtime/helper_process.py) with several services in one
process: each request goes to the service it names, and waits only for that service's imports."""

from __future__ import annotations

import os
import signal

from suite_paths import HELPERS

from torchkit.core.runtime.helper_process import HelperProcess


def test_a_request_waits_only_for_its_own_services_imports(tmp_path, monkeypatch):
    gate = tmp_path / "gate"
    monkeypatch.setenv("HELPER_TEST_GATE", str(gate))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])
    )
    helper = HelperProcess.spawn("helper_service_first", "helper_service_gated")
    assert helper is not None and helper.services == (
        "helper_service_first",
        "helper_service_gated",
    )
    try:
        # The gated service is still preparing (its gate is shut): the first one answers.
        assert helper.call({"n": 1}) == {"first": {"n": 1}}
        assert not gate.exists()
        gate.touch()
        assert helper.call({"n": 2}, "helper_service_gated") == {
            "gated": {"n": 2},
            "gate_open": True,
        }
        assert helper.call({"n": 3}, "helper_service_first") == {"first": {"n": 3}}
    finally:
        helper.close()
    assert helper.process is None


def test_a_request_to_a_service_it_does_not_serve_is_no_answer(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])
    )
    helper = HelperProcess.spawn("helper_service_first")
    try:
        assert helper.call({"n": 1}, "helper_service_gated") is None  # the caller does the work
        assert helper.process is None  # and the helper is given up
    finally:
        helper.close()


def test_a_helper_answers_after_the_signals_its_command_stops_on(tmp_path, monkeypatch):
    """SIGINT, SIGTERM and SIGHUP reach the helper with its command (a process group's
    signal, the terminal closed): the command stops cleanly and may still ask. Before: SIGHUP,
    which the command takes as SIGTERM, killed the helper, and the command did the work itself."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])
    )
    helper = HelperProcess.spawn("helper_service_first")
    try:
        assert helper.call({"n": 1}) == {"first": {"n": 1}}  # serving: its handlers are set
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            helper.process.send_signal(signum)
            assert helper.call({"n": int(signum)}) == {"first": {"n": int(signum)}}, signum
    finally:
        helper.close()
