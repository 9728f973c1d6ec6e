"""How much memory this process can have: a floor module that any command's core may ask
(benchmark's --memory-limit, summary's check that real inputs fit, export's batch) without one
of them importing the other. The one reader of /proc/meminfo and of the cgroup memory limits."""

from __future__ import annotations

import contextlib
import os

from torchkit.core.runtime.cgroups import PROC, cgroup_chains

MACHINE = "machine"  # the machine's MemAvailable set the figure
CGROUP = "cgroup"  # a cgroup's memory limit (a container's, a systemd slice's) set it
# cgroup v1's "no limit": the largest page counter, in bytes (9223372036854771712 with 4 KiB
# pages); any limit this high is none.
_V1_UNLIMITED = 2**62


class MemoryBytes(int):
    """Bytes of memory (free now, or all a process may have): an int, compared and divided as
    one, that also says which limit set it (`bound`: MACHINE or CGROUP), for a refusal to name
    it."""

    bound: str

    def __new__(cls, value: int, bound: str = MACHINE) -> MemoryBytes:
        number = super().__new__(cls, value)
        number.bound = bound
        return number


def available_memory(proc: str | None = None) -> MemoryBytes | None:
    """What can be allocated without swapping or being killed: the least of Linux's
    MemAvailable and what each memory cgroup of this process has left under its limit
    (`cgroup_memory_left`): in a container (docker --memory, a Kubernetes limit) or a systemd
    slice (MemoryMax=), the cgroup's limit is what the kernel's OOM killer enforces, however
    much the machine has free. None where neither can be told. `proc`: the /proc to read
    (`PROC`, a test's folder of fake files)."""
    proc = PROC if proc is None else proc
    machine = proc_kib(f"{proc}/meminfo", "MemAvailable:")
    if machine is None and proc == "/proc":  # not Linux: the system's own count of free pages
        with contextlib.suppress(ValueError, OSError, AttributeError):
            machine = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    left = cgroup_memory_left(proc)
    if left is not None and (machine is None or left < machine):
        return MemoryBytes(left, CGROUP)
    return None if machine is None else MemoryBytes(machine, MACHINE)


# What a refusal calls a cgroup's memory limit: a container's (Docker, Kubernetes), a systemd
# slice's (MemoryMax=) or a batch job's (Slurm) alike, in words that leave the hint's brackets
# the only ones at the line's end.
CGROUP_LIMIT = "cgroup memory limit"


def limit_words(free: int) -> str:
    """What a refusal adds after "N GB free" to say that a cgroup's limit set the figure, not
    the machine's free memory: "" where the machine's did (or `free` does not say)."""
    if getattr(free, "bound", MACHINE) == CGROUP:
        return f" under the {CGROUP_LIMIT}"
    return ""


def memory_total(proc: str | None = None) -> MemoryBytes | None:
    """All the memory this process may have: the machine's physical memory or, where less, the
    tightest memory limit of its cgroups (`cgroup_memory_limit`); None where neither can be
    told."""
    try:
        machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        machine = None
    limit = cgroup_memory_limit(PROC if proc is None else proc)
    if limit is not None and (machine is None or limit < machine):
        return MemoryBytes(limit, CGROUP)
    return None if machine is None else MemoryBytes(machine, MACHINE)


def cgroup_memory_left(proc: str = PROC) -> int | None:
    """The least memory any cgroup of this process (its own, and each above it whose limit
    binds it: `_binding_folders`) has left under its limit, cgroup v2 or v1; None where none
    has a limit or none can be read (a missing or unreadable file is passed over, never an
    error)."""
    left = [
        room
        for folder in _binding_folders(proc)
        if (room := _cgroup_folder_left(folder)) is not None
    ]
    return min(left) if left else None


def cgroup_memory_limit(proc: str = PROC) -> int | None:
    """The tightest memory limit of this process's cgroups (its own and those above it whose
    limit binds it); None where none has one or none can be read."""
    limits = [
        found[0]
        for folder in _binding_folders(proc)
        if (found := _cgroup_folder_limit(folder)) is not None
    ]
    return min(limits) if limits else None


def _binding_folders(proc: str) -> list[str]:
    """The memory cgroup folders whose limits bind this process: its own, and each above it up
    to the first that keeps its children's memory apart. cgroup v2 always charges a child to
    its parent; v1 only where the parent's `memory.use_hierarchy` is 1 (current kernels refuse
    0; older ones default to it, a parent's limit then binding only its own tasks)."""
    folders = []
    for chain in cgroup_chains("memory", proc):
        folders.append(chain[0])
        for parent in chain[1:]:
            if _read_bytes(os.path.join(parent, "memory.use_hierarchy")) == 0:
                break
            folders.append(parent)
    return folders


# Each cgroup version's files: the limit, the usage, and memory.stat's keys of what the kernel
# reclaims in the cgroup before its OOM killer: the page cache, active and inactive (a file read
# twice is all active, and reclaimed all the same), as MemAvailable counts the machine's and
# LXCFS a container's, and on v2 the reclaimable kernel slab (the dentries and inodes of a
# dataset's files listed) that v2's usage counts. Not memory.stat's `file`/`cache`: they count
# tmpfs and /dev/shm too (DataLoader workers' batches), which only swap frees, and which the
# file lists leave out. v1's `total_` keys count the cgroups below too, as its usage does; v2's
# memory.stat always does.
_V2_FILES = ("memory.max", "memory.current", ("active_file", "inactive_file", "slab_reclaimable"))
_V1_FILES = (
    "memory.limit_in_bytes",
    "memory.usage_in_bytes",
    ("total_active_file", "total_inactive_file"),
)
_CgroupFiles = tuple[str, str, tuple[str, ...]]


def _cgroup_folder_limit(folder: str) -> tuple[int, _CgroupFiles] | None:
    """One cgroup's memory limit, and the files of its version; None where it has none (v2's
    "max", v1's past 2**62) or it cannot be read. On v2, the lesser of `memory.max` and
    `memory.high`: past `memory.high` the kernel throttles the cgroup's tasks and reclaims
    hard (a job slowed to a crawl, not killed), which no job means to run under (systemd's
    MemoryHigh=, Kubernetes' memory QoS). Swap is not counted (`memory.swap.max`, v1's
    `memsw`): MemAvailable counts none either, and a job that fits only by swapping runs at the
    disk's pace."""
    for files in (_V2_FILES, _V1_FILES):
        limit = _read_bytes(os.path.join(folder, files[0]))
        if limit is not None:
            if files is _V2_FILES:
                high = _read_bytes(os.path.join(folder, "memory.high"))
                limit = limit if high is None else min(limit, high)
            return None if limit >= _V1_UNLIMITED else (limit, files)
    return None


def _cgroup_folder_left(folder: str) -> int | None:
    """What one cgroup has left: its limit less its usage, plus what of that usage the kernel
    would reclaim before killing (the page cache, and v2's reclaimable slab: `_V2_FILES`): v2
    `memory.max` (or `memory.high` where lower) - `memory.current`, v1 `memory.limit_in_bytes`
    - `memory.usage_in_bytes`, each with its `memory.stat`."""
    found = _cgroup_folder_limit(folder)
    if found is None:
        return None
    limit, (_, usage_file, reclaimable_keys) = found
    usage = _read_bytes(os.path.join(folder, usage_file))
    if usage is None:
        return None  # a limit without its usage says nothing of what is left
    reclaimable = _stat_bytes(os.path.join(folder, "memory.stat"), reclaimable_keys)
    return max(0, limit - usage + min(reclaimable, usage))


def _read_bytes(path: str) -> int | None:
    """A cgroup file's one number ("max", v2's no limit, as 2**63); None where it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read().strip()
        return 2**63 if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _stat_bytes(path: str, keys: tuple[str, ...]) -> int:
    """The sum of `keys`' values in a `memory.stat` file of `KEY N` lines (a key it lacks
    counts 0); 0 where it cannot be read."""
    total = 0
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name in keys:
                    total += max(0, int(value))
    except (OSError, ValueError):
        return 0
    return total


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
