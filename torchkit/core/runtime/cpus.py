"""How many CPUs this process may use: the one count every default number of workers starts from."""

from __future__ import annotations

import functools
import math
import os

from torchkit.core.runtime.cgroups import cgroup_chains


def usable_cpus() -> int:
    """The cores this process may use: those taskset and container cpusets let it run on
    (Linux), else every logical core; at most its cgroup CPU quota, rounded up (`docker --cpus
    8` or a Kubernetes CPU limit of 8 on a 96-core host: 8, not 96 threads sharing 8 CPUs)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


@functools.cache
def cgroup_cpu_quota(proc: str = "/proc") -> float | None:
    """The CPUs the cgroup CPU quota allows this process (1.5 for `docker --cpus 1.5`), the
    tightest along its cgroup and the cgroup's ancestors, cgroup v2 or v1; None where there is
    no quota (or no cgroups: not Linux), found by `cgroup_chains`."""
    quotas = [
        quota
        for chain in cgroup_chains("cpu", proc)
        for folder in chain
        if (quota := _cgroup_folder_quota(folder)) is not None
    ]
    return min(quotas) if quotas else None


def _cgroup_folder_quota(folder: str) -> float | None:
    """One cgroup's CPU quota in CPUs: v2 `cpu.max` ("150000 100000"; "max ..." is none), v1
    `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1 is none)."""
    try:
        with open(os.path.join(folder, "cpu.max"), encoding="ascii") as handle:
            quota, _, period = handle.read().strip().partition(" ")
    except (OSError, ValueError):
        try:
            with open(os.path.join(folder, "cpu.cfs_quota_us"), encoding="ascii") as handle:
                quota = handle.read().strip()
            with open(os.path.join(folder, "cpu.cfs_period_us"), encoding="ascii") as handle:
                period = handle.read().strip()
        except (OSError, ValueError):
            return None
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:  # "max"
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


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
