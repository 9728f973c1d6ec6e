"""Sizes in bytes as people write them: `1GB`, `500MB`, `256MiB`, `256M`, `1.5GB`, `100000`.

SI units in powers of 1000 (KB, MB, GB, TB), IEC ones (KiB, MiB, GiB, TiB, and K, M, G, T as
coreutils reads them) in powers of 1024; a bare number is bytes.
"""

from __future__ import annotations

import re
from fractions import Fraction

from torchkit.core.io.errors import UsageError, short_repr

_UNITS = {"": 1, "b": 1}
for _power, _letter in enumerate("kmgt", start=1):
    _UNITS[_letter] = _UNITS[f"{_letter}ib"] = 1024**_power
    _UNITS[f"{_letter}b"] = 1000**_power
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")


def parse_size(text: str, what: str) -> int:
    """Bytes of a size (module docstring); a UsageError naming `what` (the option or variable
    it came from, e.g. `--shard-size`) when it is none, or less than a byte."""
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else None
    try:  # Python reads at most 4,300 digits
        number = Fraction(match.group(1)) if match and unit in _UNITS else None
    except ValueError:
        number = None
    if number is None:
        raise UsageError(
            f"{what} {short_repr(text)} is not a size",
            "e.g. 1GB, 500MB, 256MiB (or 256M), or a number of bytes",
        )
    size = int(number * _UNITS[unit])
    if size < 1:
        raise UsageError(f"{what} {text!r} is less than a byte", "e.g. 1GB or 500MB")
    return size
