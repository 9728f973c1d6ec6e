"""A helper-process service for tests/cli/test_helper_process.py: answers at once."""

from __future__ import annotations


def prepare() -> None:
    """Nothing to import."""


def answer(request: dict) -> dict:
    return {"first": request}
