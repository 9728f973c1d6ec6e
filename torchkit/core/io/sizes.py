"""Sizes in bytes as people write them: `1GB`, `500MB`, `256MiB`, `256M`, `1.5GB`, `1e9`.

The one rule of every size (`convert shards --shard-size`, `benchmark --memory-limit`,
$TORCHKIT_CACHE_LIMIT): SI units in powers of 1000 (KB, MB, GB, TB), IEC ones (KiB, MiB, GiB,
TiB, also Ki, Mi, Gi, Ti, and K, M, G, T as coreutils reads them) in powers of 1024, any case;
a bare number (`4096`, `1.5e9`) is bytes.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from fractions import Fraction

from torchkit.core.io.errors import UsageError, short_repr

# The rule above as every size option's help (--shard-size, --memory-limit) words it
SIZE_RULE = "1GB, 500MB (powers of 1000), 256MiB or 256M (powers of 1024), or bytes (4096, 1e9)"
HINT = "e.g. 1GB, 500MB, 256MiB or 256M, or a number of bytes"
LARGEST = 2**63 - 1  # bytes: what no run needs more of, and what C, JSON readers and floats hold
_UNITS = {"": 1, "b": 1}
for _power, _letter in enumerate("kmgt", start=1):
    _UNITS[_letter] = _UNITS[f"{_letter}i"] = _UNITS[f"{_letter}ib"] = 1024**_power
    _UNITS[f"{_letter}b"] = 1000**_power
# ASCII digits only: `int` and `Fraction` read other scripts' digits too
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d{1,4}))?\s*([A-Za-z]*)\s*", re.ASCII)


def parse_size(text: str, what: str) -> int:
    """Bytes of a size (module docstring); a UsageError naming `what` (the option or variable
    it came from, e.g. `--shard-size`) when it is none, less than a byte, or more than
    LARGEST."""
    match = _SIZE.fullmatch(text)
    unit = match.group(3).lower() if match else None
    try:  # Python reads at most 4,300 digits
        number = Fraction(match.group(1)) if match and unit in _UNITS else None
    except ValueError:
        number = None
    if number is None:
        raise UsageError(f"{what} {short_repr(text)} is not a size", HINT)
    size = int(number * Fraction(10) ** int(match.group(2) or 0) * _UNITS[unit])
    if size < 1:
        raise UsageError(f"{what} {text!r} is less than a byte", "e.g. 1GB or 500MB")
    if size > LARGEST:
        raise UsageError(f"{what} {short_repr(text)} is more than 8 EiB (2^63-1 bytes)", HINT)
    return size


def format_megabytes(megabytes: float) -> str:
    """Megabytes (10^6 bytes) as tables and messages show them: one decimal from 10 MB up
    ("1,234.5"), three significant digits below ("7.30", "0.300", "0.00410"), where one decimal
    (or none) would show a limit of 300KB, or a CPU peak of a few pages, as 0."""
    rounded = float(f"{megabytes:.3g}")  # 9.996 is 10.0, not 10.00
    if rounded == 0 or not math.isfinite(rounded) or abs(rounded) >= 10:
        return f"{megabytes:,.1f}"
    decimals = 2 - math.floor(math.log10(abs(rounded)))
    return f"{megabytes:.{decimals}f}"


# From a zettabyte up, a figure of gigabytes is written in powers of ten ("1.2e+32 GB"): its
# digits past float's 16 were noise ("120,000,000,000,000,013,645,154,049,064,960.0 GB"); below
# it every digit shown is exact ("8,191,934.5 GB").
_SCIENTIFIC_GB = 1e12


def gigabytes_text(count: float, digits: int = 1) -> str:
    """`count` bytes as every refusal writes them: "120.0 GB", "156,734.7 GB" (`digits` after
    the point), "1.2e+32 GB" from a zettabyte up, also for a count too large for a float (the
    memory a --resize-size of hundreds of digits asks for)."""
    try:
        value = count / 1e9
    except OverflowError:  # an int beyond float's range: Decimal holds any
        from decimal import Decimal

        return f"{Decimal(int(count)).scaleb(-9):.1e} GB"
    if abs(value) >= _SCIENTIFIC_GB:
        return f"{value:.1e} GB"
    return f"{value:,.{digits}f} GB"


@dataclass(frozen=True)
class DiskRoom:
    """What a disk has free for this user: `free` bytes, in blocks of `block` bytes (a file
    takes whole blocks), and `names` more files or folders (inodes); None where the file
    system sets no such bound (btrfs, a network disk that reports none). `read_only`: mounted
    read-only, so nothing fits whatever is free."""

    free: int
    block: int
    names: int | None = None
    read_only: bool = False


def disk_room(folder: str | os.PathLike) -> DiskRoom | None:
    """The room on the disk of `folder` (the one reading of it every check of free space
    makes); None where unknown (no statvfs: Windows; a folder that cannot be reached)."""
    try:
        stats = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    names = stats.f_favail if stats.f_files else None
    read_only = bool(stats.f_flag & os.ST_RDONLY)
    return DiskRoom(stats.f_bavail * stats.f_frsize, max(stats.f_frsize, 1), names, read_only)


def free_bytes(folder: str | os.PathLike) -> int | None:
    """The bytes the disk of `folder` has free for this user; None where unknown (no statvfs:
    Windows)."""
    room = disk_room(folder)
    return None if room is None else room.free
