"""Counts and articles in the words of messages: `1 frame`, `2 frames`, `an int`."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and `noun`, plural unless it is one (`plural`: for nouns not made with an s:
    `counted(1, "class", "classes")`)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def with_article(noun: str) -> str:
    """`noun` after "a", or "an" where it starts with a vowel's letter (`an int`, `a tuple`)."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
