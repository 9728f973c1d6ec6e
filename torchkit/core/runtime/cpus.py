"""How many CPUs this process may use: the one count every default number of workers starts from."""

from __future__ import annotations

import functools
import math
import os


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
    no quota (or no cgroups: not Linux). Read as the JVM and Go read it: each cgroup mount of
    `/proc/self/mountinfo` joined with this process's path in `/proc/self/cgroup`."""
    try:
        with open(f"{proc}/self/cgroup", encoding="utf-8", errors="replace") as handle:
            memberships = [line.split(":", 2) for line in handle.read().splitlines()]
        with open(f"{proc}/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            mounts = [line.split() for line in handle.read().splitlines()]
    except OSError:
        return None
    quotas: list[float] = []
    for fields in mounts:
        if "-" not in fields[6:]:
            continue
        tail = fields[fields.index("-", 6) + 1 :]  # filesystem type, source, super options
        root, mount_point = fields[3], fields[4]
        if tail[:1] == ["cgroup2"]:
            paths = [m[2] for m in memberships if len(m) == 3 and m[0] == "0" and not m[1]]
        elif tail[:1] == ["cgroup"] and "cpu" in (tail[2].split(",") if len(tail) > 2 else []):
            paths = [m[2] for m in memberships if len(m) == 3 and "cpu" in m[1].split(",")]
        else:
            continue
        for path in paths:
            # A container that sees its cgroup as the mount's root: the mount point is its cgroup.
            # (A path outside the mount, "/../x" from another cgroup namespace, likewise.)
            inside = path[len(root) :] if path.startswith(root) and ".." not in path else ""
            folder = os.path.normpath(mount_point + "/" + inside.strip("/"))
            while True:
                quota = _cgroup_folder_quota(folder)
                if quota is not None:
                    quotas.append(quota)
                if folder == mount_point or len(folder) <= len(mount_point):
                    break
                folder = os.path.dirname(folder)
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
