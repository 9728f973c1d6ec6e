"""Text that names files which are not UTF-8 (lone surrogates, `surrogateescape`): found, and
written as JSON that stays valid UTF-8."""

from __future__ import annotations

import json
import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def holds_non_utf8(text: str) -> bool:
    """Whether `text` holds bytes that were not UTF-8 (lone surrogates)."""
    return _SURROGATE.search(text) is not None


def json_text(value: object, **dumps_kwargs) -> str:
    """`json.dumps(value, ensure_ascii=False, **dumps_kwargs)`, but a lone surrogate (a file
    name that is not UTF-8) is written as its escape, "\\udcff": the text stays valid UTF-8 JSON
    and reads back (json.loads) to the same str, which opens the same file; every other
    character is written as itself, as before."""
    text = json.dumps(value, ensure_ascii=False, **dumps_kwargs)
    return _SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
