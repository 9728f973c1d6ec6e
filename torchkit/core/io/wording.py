"""Counts in the words of messages: `1 frame`, `2 frames`."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and `noun`, plural unless it is one (`plural`: for nouns not made with an s:
    `counted(1, "class", "classes")`)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
