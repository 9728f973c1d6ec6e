"""The folders the tests name, defined once: the repository, tests/, and tests/helpers/, the one
folder a torchkit process a test starts gets on PYTHONPATH, so that it imports what the test
names on its command line (`--model nets:TinyNet`, the helper services)."""

from __future__ import annotations

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
REPO = TESTS.parent
