"""How many CPUs this process may use: the one count every default number of workers starts from."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The cores this process may run on: what taskset and container cpusets allow (Linux),
    else every logical core."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1
