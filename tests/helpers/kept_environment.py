"""The environment a test (or a test module) found, put back when it ends: tests/conftest.py's
`environment_kept` (each test) and `module_environment_kept` (each module's fixtures)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

# pytest's own variable: it names the test's phase ("... (setup)", then "... (teardown)"), so it
# always differs between a fixture's set-up and its teardown without any test having changed it.
CURRENT_TEST = os.environ.encodekey("PYTEST_CURRENT_TEST")


@contextlib.contextmanager
def environment_kept() -> Iterator[None]:
    """os.environ as it was when the block began, once it ends: a variable added is removed,
    one changed or removed is set again; nothing else is touched (PYTEST_CURRENT_TEST is
    pytest's and left as it is).

    Copied and compared as os.environ keeps it (`_data`, its encoded variables): a plain dict
    copy and comparison decode every variable twice. Only what changed is set again: clearing
    and setting every variable (putenv each) was 0.3-0.5 ms of every test, and every test
    looked changed through PYTEST_CURRENT_TEST."""
    before = os.environ._data.copy()
    yield
    after = os.environ._data
    if CURRENT_TEST in after:
        before[CURRENT_TEST] = after[CURRENT_TEST]
    else:
        before.pop(CURRENT_TEST, None)
    if after == before:
        return
    for key in after.keys() - before.keys():
        del os.environ[os.fsdecode(key)]
    for key, value in before.items():
        if after.get(key) != value:
            os.environ[os.fsdecode(key)] = os.fsdecode(value)
