"""Every `Error: ...`, `Warning: ...` and `Note: ...` line README.md and docs/ quote is worded as
torchkit's source words it: a message reworded in the code cannot stay quoted in its old words.

A grep-level check, nothing is run. The source's string literals (adjacent ones joined, as Python
joins them) form a corpus in which an f-string's `{...}` and a `%s` are breaks. From each word of
a quote, the longest run of whole words the corpus holds counts as the source's when it is at
least MIN_STRETCH characters long, is one literal piece between two breaks whole (`holds` of
`{subject} holds {name}`), or runs up to the quote's `...`. The docs' placeholders (`<what>`,
`PATH`, `...`) count as covered. Every word of 3 letters or more left over must be one of the
example names the docs fill messages with (3, not 4: `did not write` quoted as `can not write` is
found). A phrase added or reworded is found; one word swapped for another that some message has
alone between two breaks is not, nor is a word the quote leaves out (or the source adds) where
the words on either side still match: the check finds words the source lacks, not words the
quote lacks (only running the command can tell that)."""

from __future__ import annotations

import re

import pytest
from suite_paths import REPO

DOCS = REPO / "docs"
# Example values the docs fill quoted messages with (folder and file names of their examples).
EXAMPLE_NAMES = {"rose", "flowers", "backup"}
_LITERAL = re.compile(r"""[rRfF]{0,2}("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')""")
_ADJACENT = re.compile(
    r"""(?:(?<![\w"'])[rRfF]{0,2}(?:"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')\s*)+"""
)
_PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|\b[A-Z][A-Z_0-9]*\b")
MIN_STRETCH = 20
_TRIM = " ,.:;()'`"
_QUOTED_SPAN = re.compile(r"`((?:Error|Warning|Note): [^`]+)`")


def _source_corpus() -> str:
    """The string literals of torchkit's source, adjacent ones joined, whitespace collapsed,
    a replacement field or %-conversion as a NUL (which no quote holds)."""
    texts = []
    for path in sorted((REPO / "torchkit").rglob("*.py")):
        for run in _ADJACENT.finditer(path.read_text(encoding="utf-8")):
            joined = "".join(m.group(1)[1:-1] for m in _LITERAL.finditer(run.group(0)))
            texts.append(" ".join(re.sub(r"\{[^{}]*\}|%[sdr]", "\0", joined).split()))
            for field in re.findall(r"\{([^{}]*)\}", joined):  # `{', then '.join(shown)}`
                texts += [" ".join(m.group(1)[1:-1].split()) for m in _LITERAL.finditer(field)]
    return "\n".join(texts)


def _quoted_messages() -> list[tuple[str, str]]:
    """(document, message) for each message quoted in a code span or as a code block's line."""
    found = []
    for document in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = document.read_text(encoding="utf-8")
        quotes = _QUOTED_SPAN.findall(text)
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S):
            lines = block.splitlines()
            quotes += [line for line in lines if re.match(r"(Error|Warning|Note): ", line)]
        name = document.relative_to(REPO).as_posix()
        found += [(name, " ".join(quote.split())) for quote in quotes]
    return found


def _pieces(corpus: str) -> set[str]:
    """The corpus's pieces between replacement fields, trimmed: a short stretch of a quote is
    the source's when it is one of them whole (`holds` of `{subject} holds {name}`)."""
    return {piece.strip(_TRIM) for piece in re.split(r"[\0\n]", corpus)} - {""}


def _uncovered_words(message: str, corpus: str) -> list[str]:
    pieces = _pieces(corpus)
    body = re.sub(r"^(Error|Warning|Note): ", "", message)
    covered = [False] * len(body)
    for match in _PLACEHOLDER.finditer(body):
        covered[match.start() : match.end()] = [True] * (match.end() - match.start())
    for match in re.finditer(r"(?<!\w)\w|[^\w\s]", body):
        start, low, high = match.start(), 0, len(body) - match.start()
        while low < high:  # the longest stretch from `start` that the corpus holds
            middle = (low + high + 1) // 2
            if body[start : start + middle] in corpus:
                low = middle
            else:
                high = middle - 1
        spaces = [start + m.start() for m in re.finditer(r"\s", body[start : start + low])]
        ends = [start + low, *spaces[::-1]]
        for end in ends:  # whole words only: the longest stretch of them that counts
            if end < len(body) and body[end - 1 : end + 1].isalnum():
                continue
            stretch = body[start:end]
            if (
                len(stretch) >= MIN_STRETCH
                or body[end:].lstrip(" (").startswith("...")
                or stretch.strip(_TRIM) in pieces
            ):
                covered[start:end] = [True] * (end - start)
                break
    uncovered = []
    for word in re.finditer(r"(?<![\w./'-])[A-Za-z]{3,}(?![\w./'-])", body):
        if not all(covered[word.start() : word.end()]) and word.group(0) not in EXAMPLE_NAMES:
            uncovered.append(word.group(0))
    return uncovered


@pytest.fixture(scope="module")
def corpus() -> str:
    return _source_corpus()


def test_every_quoted_message_is_worded_as_the_source_words_it(corpus):
    messages = _quoted_messages()
    assert len(messages) >= 30, messages  # the docs are read: a changed quoting drops none
    drifted = [
        f"{document}: {message!r} (not in the source: {', '.join(words)})"
        for document, message in messages
        if (words := _uncovered_words(message, corpus))
    ]
    assert not drifted, "\n".join(drifted)


@pytest.mark.parametrize(
    "message",
    [
        "Error: cannot write REPORT: ...; the finished run is kept safely in RUN",
        "Warning: --lr is given twice (1, then 2): the last, 2, is taken",
        "Error: the model weights could not be downloaded from the internet",
        # a 3-letter word: `did` -> `can` (the quote in eval.md)
        "Error: output folder report holds report/my_plot.png that torchkit can not write, ...",
    ],
)
def test_a_reworded_quote_is_found(message, corpus):
    """The check can fail: a word added, a word changed, a message the source never had."""
    assert _uncovered_words(message, corpus)


def test_the_quotes_as_the_source_words_them_pass(corpus):
    message = "Warning: --lr is given twice (1, then 2): the last, 2, is used"
    assert not _uncovered_words(message, corpus)
