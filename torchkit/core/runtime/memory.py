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


def beyond_half_free(needed: int) -> int | None:
    """The bytes free when `needed` bytes are more than half of them, else None (also where the
    free memory cannot be told): what a command refuses before an allocation that would end in
    torch's allocator error, or in the kernel's OOM killer (export's example batches, a
    classifier head of --num-classes outputs, convnet's first linear layer)."""
    free = available_memory()
    return free if free is not None and needed > free / 2 else None


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
