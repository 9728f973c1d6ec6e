"""This process's cgroups (Linux): the folders whose limits bind it, found as the JVM and Go
find them: each cgroup mount of `/proc/self/mountinfo` joined with this process's path in
`/proc/self/cgroup`. The CPU quota (`cpus.py`) and the memory limit (`memory.py`) are read from
these folders; a parent's limit binds its children too, so each hierarchy gives the chain from
this process's cgroup up to the mount's root."""

from __future__ import annotations

import os

from torchkit.core.io.mounts import below, read_mounts, within

PROC = "/proc"


def cgroup_chains(controller: str, proc: str = PROC) -> list[list[str]]:
    """For each cgroup hierarchy that can hold `controller`'s files ("cpu", "memory"): the
    folder of this process's cgroup, then each folder above it up to the mount point. cgroup
    v2's one hierarchy always counts (a folder where the controller is not enabled has none of
    its files); a cgroup v1 mount counts where `controller` is one of its options. [] where
    this cannot be read (no /proc: not Linux)."""
    try:
        with open(f"{proc}/self/cgroup", encoding="utf-8", errors="replace") as handle:
            memberships = [line.split(":", 2) for line in handle.read().splitlines()]
    except OSError:
        return []
    chains = []
    for mount in read_mounts(f"{proc}/self/mountinfo"):
        if mount.kind == "cgroup2":
            paths = [m[2] for m in memberships if len(m) == 3 and m[0] == "0" and not m[1]]
        elif mount.kind == "cgroup" and controller in mount.options.split(","):
            paths = [m[2] for m in memberships if len(m) == 3 and controller in m[1].split(",")]
        else:
            continue
        for path in paths:
            chains.append(_chain(path, mount.root, mount.point))
    return chains


def _chain(path: str, root: str, mount_point: str) -> list[str]:
    """The folders from the cgroup `path` (as /proc/self/cgroup names it) up to `mount_point`,
    where the cgroup folder `root` is mounted."""
    # A container that sees its cgroup as the mount's root: the mount point is its cgroup. (A
    # path outside the mount, "/../x" from another cgroup namespace, likewise.)
    inside = below(path, root) if within(path, root) and ".." not in path.split("/") else ""
    mount_point = os.path.normpath(mount_point)
    folder = os.path.normpath(mount_point + "/" + inside.strip("/"))
    chain = [folder]
    while len(folder) > len(mount_point) and folder != mount_point:
        folder = os.path.dirname(folder)
        chain.append(folder)
    return chain
