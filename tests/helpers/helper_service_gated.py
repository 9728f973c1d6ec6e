"""A helper-process service for tests/cli/test_helper_process.py: its preparation (a library's
import) lasts until the file $HELPER_TEST_GATE exists, which the test creates when it wants."""

from __future__ import annotations

import os
import time


def prepare() -> None:
    gate = os.environ["HELPER_TEST_GATE"]
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.005)  # polls for the test's file: its end is the test's doing, not a timer


def answer(request: dict) -> dict:
    return {"gated": request, "gate_open": os.path.exists(os.environ["HELPER_TEST_GATE"])}
