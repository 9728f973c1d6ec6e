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


# The most worker processes (or threads) a --workers option may ask for: past 8 per core they
# only wait for each other, and each holds memory (a forked process its own copy of what it
# touches), so a typo such as `-j 100000` would fork until the machine runs out of memory.
WORKERS_PER_CPU = 8
MIN_WORKERS_BOUND = 64


def max_workers() -> int:
    """The largest --workers this machine takes: 8 per usable CPU, 64 at least."""
    return max(MIN_WORKERS_BOUND, WORKERS_PER_CPU * usable_cpus())


def check_workers(workers: int | None, option: str = "--workers") -> None:
    """Refuse (usage error) more workers than `max_workers()`; None (the default) passes."""
    from torchkit.core.io.errors import UsageError

    bound = max_workers()
    if workers is not None and workers > bound:
        raise UsageError(
            f"{option} {workers} is more than this machine can use",
            f"at most {bound}: {WORKERS_PER_CPU} per usable CPU, {MIN_WORKERS_BOUND} at least",
        )
