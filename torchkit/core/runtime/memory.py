"""How much memory this machine has free: a floor module that any command's core may ask
(benchmark's --memory-limit, summary's check that real inputs fit) without one of them
importing the other."""

from __future__ import annotations

import contextlib
import os


def available_memory() -> int | None:
    """Linux's MemAvailable (what can be allocated without swapping), else None."""
    value = proc_kib("/proc/meminfo", "MemAvailable:")
    if value is not None:
        return value
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def proc_kib(path: str, key: str) -> int | None:
    """The value in bytes of a `KEY: N kB` line of a /proc file (`/proc/meminfo`,
    `/proc/self/status`), else None."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
