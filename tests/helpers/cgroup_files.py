"""A fake /proc for the cgroup readers (`core/runtime/cgroups.py`: the CPU quota, the memory
limit): `/proc/self/cgroup`, `/proc/self/mountinfo` whose cgroup mounts lie under a test's
folder, and the cgroup files in them."""

from __future__ import annotations

V2 = [("/", "fs/cgroup", "cgroup2", "rw,nsdelegate")]
V1 = [
    ("/", "fs/cgroup/memory", "cgroup", "rw,memory"),
    ("/", "fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct"),
]


def fake_proc(tmp_path, cgroup: str, mounts: list[tuple[str, str, str, str]], files: dict) -> str:
    """A /proc/self with `cgroup` and one mountinfo line per (root, mount point under tmp_path,
    type, options); `files` maps a path under tmp_path to its text (cpu.max, proc/meminfo...).
    The /proc folder's path."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    lines = [
        f"{30 + n} 23 0:{28 + n} {root} {tmp_path / point} rw,nosuid - {kind} {kind} {options}"
        for n, (root, point, kind, options) in enumerate(mounts)
    ]
    (tmp_path / "proc/self/mountinfo").write_text("\n".join(lines) + "\n")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return str(tmp_path / "proc")
