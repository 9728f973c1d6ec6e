"""Paths and values in the commands that hints show (`--weights 'my runs/net.pt'`), written as
shell words a user can paste: a plain one as itself, another in quotes."""

from __future__ import annotations

import os
import shlex

# Control characters (C0, DEL, C1) and lone surrogates (bytes of a name that is not UTF-8): a
# word holding one is written in ANSI-C quotes (`$'a\nb'`), which bash, zsh and ksh read back to
# the same name, and which keeps a hint on the one line of its Error or Note.
_CONTROL = {*range(0x20), *range(0x7F, 0xA0)}


def shell_word(value: str | os.PathLike) -> str:
    """`value` as one shell word: `net.pt` as it is, `'my runs/net.pt'` quoted (shlex.quote),
    `$'a\\nb'` where it holds a control character or a byte that is not UTF-8."""
    text = os.fspath(value)
    if not any(ord(char) in _CONTROL or 0xDC80 <= ord(char) <= 0xDCFF for char in text):
        return shlex.quote(text)
    return "$'" + "".join(_ansi_c(char) for char in text) + "'"


def shell_line(words: list[str | os.PathLike]) -> str:
    """`words` as a command line, each a `shell_word`; a path (a `Path`, not a str) that
    starts with `-` as `./-data`, which a command reads as that path, never as an option."""
    return " ".join(shell_word(_as_path(word)) for word in words)


def _as_path(word: str | os.PathLike) -> str | os.PathLike:
    if isinstance(word, str) or not os.fspath(word).startswith("-"):
        return word
    return os.path.join(os.curdir, os.fspath(word))


def _ansi_c(char: str) -> str:
    code = ord(char)
    if char in "\\'":
        return "\\" + char
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the byte itself
        return f"\\x{code - 0xDC00:02x}"
    if code in _CONTROL:
        named = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char)
        return named or (f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}")
    return char
