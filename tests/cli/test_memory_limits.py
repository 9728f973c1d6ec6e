"""The memory every command's up-front check compares with (`core/runtime/memory.py`): the least
of the machine's MemAvailable and what each memory cgroup of this process (its own and those
above it, v2 or v1) has left under its limit. Read from a fake /proc and cgroup files, and where
this machine lets a test make one, from a real cgroup whose kernel is the reference."""

from __future__ import annotations

import os

import pytest
from cgroup_files import V1, V2, fake_proc
from output_checks import error_line
from processes import run_torchkit_in_process

MiB = 2**20
GiB = 2**30
V1_UNLIMITED = "9223372036854771712\n"  # the largest page counter (4 KiB pages): no limit


def meminfo(available: int) -> dict[str, str]:
    text = f"MemTotal:       {64 * GiB // 1024} kB\nMemAvailable:   {available // 1024} kB\n"
    return {"proc/meminfo": text}


def folder_files(folder: str, files: dict[str, str | None]) -> dict[str, str]:
    """`files` ({name: text}; None: left out) as the files of the cgroup folder `folder`."""
    return {f"{folder}/{name}": text for name, text in files.items() if text is not None}


def v2_files(
    folder: str,
    limit: str,
    current: int,
    inactive_file: int = 0,
    active_file: int = 0,
    slab_reclaimable: int = 0,
    shmem: int = 0,
    high: str | None = None,
) -> dict[str, str]:
    # shmem (tmpfs, /dev/shm) counts in `file` but lies on the anon lists, not the file ones
    stat = (
        f"anon {current}\nfile {active_file + inactive_file + shmem}\nshmem {shmem}\n"
        f"inactive_anon {shmem}\nactive_file {active_file}\ninactive_file {inactive_file}\n"
        f"slab_reclaimable {slab_reclaimable}\nslab_unreclaimable 8192\n"
    )
    files = {
        "memory.max": limit,
        "memory.current": f"{current}\n",
        "memory.stat": stat,
        "memory.high": high,
    }
    return folder_files(folder, files)


def v1_files(
    folder: str,
    limit: str,
    usage: int,
    inactive_file: int = 0,
    active_file: int = 0,
    use_hierarchy: int | None = None,
) -> dict[str, str]:
    # inactive_file: this cgroup's own; total_inactive_file: with the cgroups below it
    stat = (
        f"cache 0\ninactive_file 4096\nactive_file 4096\ntotal_inactive_file {inactive_file}\n"
        f"total_active_file {active_file}\n"
    )
    files = {
        "memory.limit_in_bytes": limit,
        "memory.usage_in_bytes": f"{usage}\n",
        "memory.stat": stat,
        "memory.use_hierarchy": None if use_hierarchy is None else f"{use_hierarchy}\n",
    }
    return folder_files(folder, files)


def v1_mounts(root: str) -> list[tuple[str, str, str, str]]:
    return [(root, point, kind, options) for _, point, kind, options in V1]


@pytest.mark.parametrize(
    ("cgroup", "mounts", "files", "free", "bound"),
    [
        # docker --memory 1g on cgroup v2, in its own cgroup namespace: 900 MiB used, 100 MiB
        # of it file cache the kernel would reclaim first; the machine has 8 GiB available.
        (
            "0::/\n",
            V2,
            {**meminfo(8 * GiB), **v2_files("fs/cgroup", f"{GiB}\n", 900 * MiB, 100 * MiB)},
            GiB - 800 * MiB,
            "cgroup",
        ),
        (
            "0::/\n",
            V2,
            {**meminfo(8 * GiB), **v2_files("fs/cgroup", "max\n", GiB)},
            8 * GiB,
            "machine",
        ),
        # systemd-run -p MemoryMax=4G in a slice of MemoryMax=1G: the slice's limit binds.
        (
            "0::/user.slice/job.scope\n",
            V2,
            {
                **meminfo(8 * GiB),
                **v2_files("fs/cgroup/user.slice", f"{GiB}\n", 700 * MiB),
                **v2_files("fs/cgroup/user.slice/job.scope", f"{4 * GiB}\n", 300 * MiB),
            },
            GiB - 700 * MiB,
            "cgroup",
        ),
        # ... and the scope's where it leaves less than the slice's.
        (
            "0::/user.slice/job.scope\n",
            V2,
            {
                **meminfo(8 * GiB),
                **v2_files("fs/cgroup/user.slice", f"{4 * GiB}\n", 700 * MiB),
                **v2_files("fs/cgroup/user.slice/job.scope", f"{GiB}\n", 300 * MiB, 50 * MiB),
            },
            GiB - 250 * MiB,
            "cgroup",
        ),
        # docker on cgroup v1 without a cgroup namespace: the container's path is the mount's
        # root, /proc/self/cgroup names it too.
        (
            "5:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n",
            v1_mounts("/docker/abc"),
            {
                **meminfo(8 * GiB),
                **v1_files("fs/cgroup/memory", f"{512 * MiB}\n", 256 * MiB, 64 * MiB),
            },
            320 * MiB,
            "cgroup",
        ),
        # cgroup v1 on a host: this process's cgroup below the root, a limit on its parent.
        (
            "5:memory:/batch/job\n",
            V1,
            {
                **meminfo(8 * GiB),
                **v1_files("fs/cgroup/memory", V1_UNLIMITED, 6 * GiB),
                **v1_files("fs/cgroup/memory/batch", f"{2 * GiB}\n", GiB),
                **v1_files("fs/cgroup/memory/batch/job", V1_UNLIMITED, 512 * MiB),
            },
            GiB,
            "cgroup",
        ),
        (
            "5:memory:/\n",
            V1,
            {**meminfo(8 * GiB), **v1_files("fs/cgroup/memory", V1_UNLIMITED, 6 * GiB)},
            8 * GiB,
            "machine",
        ),
        # cgroup v1 where a parent keeps its children apart (memory.use_hierarchy 0, older
        # kernels' default): the job is not charged to it, and its limit (1 GiB, 900 MiB used
        # by its own tasks) binds only those. Before: 124 MiB counted free, the job refused.
        (
            "5:memory:/batch/job\n",
            V1,
            {
                **meminfo(8 * GiB),
                **v1_files("fs/cgroup/memory", V1_UNLIMITED, 6 * GiB, use_hierarchy=0),
                **v1_files("fs/cgroup/memory/batch", f"{GiB}\n", 900 * MiB, use_hierarchy=0),
                **v1_files("fs/cgroup/memory/batch/job", V1_UNLIMITED, 2 * GiB, use_hierarchy=0),
            },
            8 * GiB,
            "machine",
        ),
        # ... and where the parent charges it but the grandparent does not, the parent's limit
        # binds and the grandparent's does not.
        (
            "5:memory:/batch/job\n",
            V1,
            {
                **meminfo(8 * GiB),
                **v1_files("fs/cgroup/memory", f"{GiB}\n", 900 * MiB, use_hierarchy=0),
                **v1_files("fs/cgroup/memory/batch", f"{4 * GiB}\n", GiB, use_hierarchy=1),
                **v1_files("fs/cgroup/memory/batch/job", V1_UNLIMITED, GiB, use_hierarchy=1),
            },
            3 * GiB,
            "cgroup",
        ),
        # a hybrid host (systemd's default before cgroup v2 only): the v2 hierarchy holds no
        # memory controller's files, the v1 memory hierarchy the limit
        (
            "0::/user.slice/job.scope\n4:memory:/user.slice/job.scope\n",
            [*V1, ("/", "fs/cgroup/unified", "cgroup2", "rw,nsdelegate")],
            {
                **meminfo(8 * GiB),
                "fs/cgroup/unified/user.slice/job.scope/cgroup.procs": "1\n",
                "fs/cgroup/unified/user.slice/job.scope/memory.pressure": "some avg10=0.00\n",
                **v1_files("fs/cgroup/memory/user.slice/job.scope", f"{GiB}\n", 256 * MiB),
            },
            768 * MiB,
            "cgroup",
        ),
        # a limit the machine cannot give anyway: the machine's MemAvailable binds
        (
            "0::/\n",
            V2,
            {**meminfo(GiB), **v2_files("fs/cgroup", f"{16 * GiB}\n", GiB)},
            GiB,
            "machine",
        ),
        # Page cache read twice is all active, and the kernel reclaims it before its OOM
        # killer all the same (as MemAvailable counts it): measured in a v1 cgroup limited to
        # 512 MiB holding 384 MiB of a file read three times (usage 410 MiB, all of the cache
        # active), a process allocated 470 MiB and lived, 530 MiB and was killed. Before: 102
        # MiB (inactive file cache only) counted free there.
        (
            "4:memory:/job\n",
            V1,
            {
                **meminfo(8 * GiB),
                **v1_files("fs/cgroup/memory/job", f"{512 * MiB}\n", 410 * MiB, 0, 384 * MiB),
            },
            486 * MiB,
            "cgroup",
        ),
        # v2 likewise, with the reclaimable slab (dentries and inodes of files listed) v2's
        # memory.current counts: 3.5 GiB used of 4 GiB, 2.5 GiB of it active file cache, 0.5
        # GiB inactive, 0.25 GiB reclaimable slab.
        (
            "0::/\n",
            V2,
            {
                **meminfo(48 * GiB),
                **v2_files(
                    "fs/cgroup", f"{4 * GiB}\n", 3584 * MiB, 512 * MiB, 2560 * MiB, 256 * MiB
                ),
            },
            3840 * MiB,
            "cgroup",
        ),
        # ... but not the batches DataLoader workers leave in /dev/shm (1 GiB of shmem), which
        # only swap frees: memory.stat counts them in `file`, not in the file lists.
        (
            "0::/\n",
            V2,
            {
                **meminfo(48 * GiB),
                **v2_files("fs/cgroup", f"{4 * GiB}\n", 3 * GiB, 512 * MiB, 0, 0, GiB),
            },
            1536 * MiB,
            "cgroup",
        ),
        # a limit lowered below what the cgroup holds: nothing left, not a negative figure
        (
            "0::/\n",
            V2,
            {**meminfo(8 * GiB), **v2_files("fs/cgroup", f"{GiB}\n", 2 * GiB)},
            0,
            "cgroup",
        ),
        # systemd's MemoryHigh=1G under MemoryMax=4G: past memory.high the kernel throttles the
        # job and reclaims hard, so 1 GiB less the 700 MiB used is what is left. Before: 3.3
        # GiB counted free, and a job let through ran throttled.
        (
            "0::/job.scope\n",
            V2,
            {
                **meminfo(8 * GiB),
                **v2_files("fs/cgroup/job.scope", f"{4 * GiB}\n", 700 * MiB, high=f"{GiB}\n"),
            },
            GiB - 700 * MiB,
            "cgroup",
        ),
        # ... a parent's memory.high binds its children too, with no memory.max anywhere
        (
            "0::/user.slice/job.scope\n",
            V2,
            {
                **meminfo(8 * GiB),
                **v2_files("fs/cgroup/user.slice", "max\n", 300 * MiB, high=f"{GiB}\n"),
                **v2_files("fs/cgroup/user.slice/job.scope", "max\n", 200 * MiB, high="max\n"),
            },
            GiB - 300 * MiB,
            "cgroup",
        ),
        # ... and a memory.high above memory.max changes nothing
        (
            "0::/\n",
            V2,
            {
                **meminfo(8 * GiB),
                **v2_files("fs/cgroup", f"{GiB}\n", 100 * MiB, high=f"{2 * GiB}\n"),
            },
            GiB - 100 * MiB,
            "cgroup",
        ),
    ],
    ids=[
        "v2-container",
        "v2-max",
        "v2-slice-binds",
        "v2-scope-binds",
        "v1-container",
        "v1-parent-binds",
        "v1-no-limit",
        "v1-parent-keeps-children-apart",
        "v1-grandparent-keeps-children-apart",
        "hybrid",
        "machine-binds",
        "v1-active-file-cache",
        "v2-file-cache-and-slab",
        "v2-shared-memory-held",
        "over-limit",
        "v2-memory-high",
        "v2-parent-memory-high",
        "v2-memory-high-above-max",
    ],
)
def test_the_free_memory_is_the_least_the_machine_and_each_cgroup_leave(
    tmp_path, cgroup, mounts, files, free, bound
):
    from torchkit.core.runtime.memory import available_memory

    found = available_memory(fake_proc(tmp_path, cgroup, mounts, files))
    assert (found, found.bound) == (free, bound)


def test_cgroup_files_that_cannot_be_read_leave_the_machine_figure(tmp_path):
    """A limit whose usage is missing, a file that is a folder, a value that is no number:
    each cgroup passed over, never an error; without mountinfo, no cgroup at all."""
    from torchkit.core.runtime.memory import available_memory

    files = {
        **meminfo(8 * GiB),
        "fs/cgroup/a/memory.max": f"{GiB}\n",  # memory.current missing
        "fs/cgroup/a/b/memory.max": "a lot\n",
        "fs/cgroup/a/b/memory.current": f"{GiB}\n",
        "fs/cgroup/a/b/c/memory.max/x": "",  # a folder where the file should be
        "fs/cgroup/a/b/c/memory.current": f"{GiB}\n",
    }
    proc = fake_proc(tmp_path, "0::/a/b/c\n", V2, files)
    found = available_memory(proc)
    assert (found, found.bound) == (8 * GiB, "machine")
    (tmp_path / "proc/self/mountinfo").unlink()
    (tmp_path / "fs/cgroup/a/memory.current").write_text(f"{GiB - MiB}\n")
    assert available_memory(proc) == 8 * GiB


def test_a_cgroup_limit_counts_where_the_machine_figure_cannot_be_read(tmp_path):
    from torchkit.core.runtime.memory import available_memory, cgroup_memory_left

    # no memory.stat: no cache counted back
    files = {"fs/cgroup/memory.max": f"{GiB}\n", "fs/cgroup/memory.current": f"{100 * MiB}\n"}
    proc = fake_proc(tmp_path, "0::/\n", V2, files)
    found = available_memory(proc)
    assert (found, found.bound) == (GiB - 100 * MiB, "cgroup")
    (tmp_path / "fs/cgroup/memory.max").write_text("max\n")
    assert available_memory(proc) is None
    assert cgroup_memory_left(proc) is None


def test_this_machine_is_read_without_error():
    from torchkit.core.runtime.memory import available_memory

    found = available_memory()
    assert found is not None and found > 0
    assert found.bound in ("machine", "cgroup")


# A cgroup limit leaving 64 MiB on a machine with 8 GiB available: convnet's head of 128 x
# 100,000 weights (51.6 MB) is more than half of it; a batch of 100,000 28x28 images (314 MB of
# inputs) more than all of it.
def cgroup_leaving_64_mib(tmp_path, monkeypatch) -> None:
    from torchkit.core.runtime import memory

    files = {**meminfo(8 * GiB), **v2_files("fs/cgroup", f"{GiB}\n", GiB - 64 * MiB)}
    monkeypatch.setattr(memory, "PROC", fake_proc(tmp_path, "0::/\n", V2, files))


LIMIT = "under the cgroup memory limit"


def test_a_refusal_names_the_cgroup_limit_that_set_the_free_memory(tmp_path, monkeypatch):
    """Before: the checks read the machine's MemAvailable only; in a container whose limit
    left less, they let the job through to the kernel's OOM killer (exit 137, no message)."""
    cgroup_leaving_64_mib(tmp_path, monkeypatch)
    head = run_torchkit_in_process("summary", "convnet", "--num-classes", "100000")
    assert head.returncode == 2, head.stderr
    assert error_line(head.stderr) == (
        "Error: --num-classes 100000 needs 0.1 GB for a classifier of 128 x 100,000 weights, "
        f"more than half the 0.1 GB free {LIMIT} (give a smaller --num-classes)"
    )
    batch = run_torchkit_in_process(
        "benchmark", "convnet", "-i", "1,28,28", "-b", "100000", "--mode", "infer"
    )
    assert batch.returncode == 2, batch.stderr
    line = error_line(batch.stderr)
    assert line.startswith("Error: convnet in infer mode at batch 100000 needs at least"), line
    assert f"more than the 0.1 GB of memory available {LIMIT} (" in line
    out = tmp_path / "tiny.onnx"
    export = run_torchkit_in_process(
        "export", "nets:TinyNet", out, "--image-size", "16", "-b", "100000"
    )
    assert export.returncode == 2, export.stderr
    assert f"GB free {LIMIT} (" in error_line(export.stderr)
    assert not out.exists()
    # where even --batch-size 1 does not fit, the way out is the limit, not another machine
    out = tmp_path / "resnet.onnx"
    single = run_torchkit_in_process("export", "resnet18", out, "-b", "1")
    assert single.returncode == 2, single.stderr
    assert error_line(single.stderr).endswith(
        f"GB free {LIMIT} (no smaller batch: free some memory, or raise the cgroup memory limit)"
    )
    assert not out.exists()
    convnet = run_torchkit_in_process("summary", "convnet", "--image-size", "1400")
    assert convnet.returncode == 2, convnet.stderr
    assert error_line(convnet.stderr) == (
        "Error: convnet at 1400 px has 3,991,175,168 weights in its first linear layer (16.0 GB), "
        f"more than half the 0.1 GB free here {LIMIT} (convnet is made for small images: give a "
        "smaller --image-size, or a model made for large images such as resnet18)"
    )


def test_the_memory_total_is_the_tightest_cgroup_limit_below_the_machine(tmp_path):
    """What an image must fit half of (`--image-size`, `--resize`): the machine's physical
    memory, or the tightest limit along this process's cgroups where less."""
    from torchkit.core.runtime.memory import memory_total

    files = {
        **v2_files("fs/cgroup/user.slice", f"{GiB}\n", 700 * MiB),
        **v2_files("fs/cgroup/user.slice/job.scope", f"{512 * MiB}\n", 300 * MiB),
    }
    proc = fake_proc(tmp_path, "0::/user.slice/job.scope\n", V2, files)
    total = memory_total(proc)
    assert (total, total.bound) == (512 * MiB, "cgroup")
    for name in ("user.slice", "user.slice/job.scope"):
        (tmp_path / "fs/cgroup" / name / "memory.max").write_text("max\n")
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    total = memory_total(proc)
    assert (total, total.bound) == (machine, "machine")
    # a memory.high (the kernel throttles past it) is the limit too
    (tmp_path / "fs/cgroup/user.slice/memory.high").write_text(f"{256 * MiB}\n")
    total = memory_total(proc)
    assert (total, total.bound) == (256 * MiB, "cgroup")
    # a v1 parent that keeps its children apart (memory.use_hierarchy 0): its limit is not theirs
    files = {
        **v1_files("fs/cgroup/memory/batch", f"{256 * MiB}\n", 0, use_hierarchy=0),
        **v1_files("fs/cgroup/memory/batch/job", V1_UNLIMITED, 0, use_hierarchy=0),
    }
    proc = fake_proc(tmp_path / "v1", "5:memory:/batch/job\n", V1, files)
    total = memory_total(proc)
    assert (total, total.bound) == (machine, "machine")


def test_a_resize_past_half_the_cgroup_limit_is_refused(image_folder, tmp_path, monkeypatch):
    """Before: only the machine's physical memory counted; in a container limited to 128 MiB
    a --resize of 3,000 px (108 MB an image) was let through to the OOM killer."""
    from torchkit.core.runtime import memory

    files = v2_files("fs/cgroup", f"{128 * MiB}\n", 10 * MiB)
    monkeypatch.setattr(memory, "PROC", fake_proc(tmp_path, "0::/\n", V2, files))
    result = run_torchkit_in_process("dataset-stats", image_folder, "--resize", 3000, "-j", "0")
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr) == (
        "Error: --resize 3000 needs 0.1 GB for each image, more than half the 0.1 GB cgroup "
        "memory limit (give a smaller size)"
    )


# A real cgroup, where this machine lets a test make one (root, a v1 memory hierarchy or a v2
# one delegating memory): a child process moved into it reads a file twice (active page cache),
# asks available_memory, then holds 90% of that much, which the kernel grants only by
# reclaiming the cache. The kernel is the reference: too low a figure fails the first check
# (before: only the inactive cache counted back, about 110 of 256 MiB), too high the second
# (the child OOM-killed).
KERNEL_CHILD = """
import os, sys
folder, path, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(os.path.join(folder, "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))
block = os.urandom(2**20)
with open(path, "wb") as out:
    for _ in range(size // 2**20):
        out.write(block)
    out.flush()
    os.fsync(out.fileno())
for _ in range(2):
    with open(path, "rb") as again:
        while again.read(2**23):
            pass
from torchkit.core.runtime.memory import available_memory
free = available_memory()
stat = dict(line.split() for line in open(os.path.join(folder, "memory.stat")))
shmem = int(stat.get("total_shmem", stat.get("shmem", 0)))
print(int(free), free.bound, shmem, flush=True)
held = bytearray(int(free * 0.9))
for page in range(0, len(held), 4096):
    held[page] = 1
print("held", flush=True)
"""


def make_memory_cgroup(limit: int) -> str:
    """A new memory cgroup below this process's, limited to `limit` bytes; skips the test where
    none can be made here."""
    import uuid

    from torchkit.core.runtime.cgroups import cgroup_chains

    for chain in cgroup_chains("memory"):
        parent = chain[0]
        try:
            with open(os.path.join(parent, "cgroup.subtree_control"), encoding="ascii") as f:
                delegated = "memory" in f.read().split()
        except OSError:
            delegated = os.path.exists(os.path.join(parent, "memory.limit_in_bytes"))  # v1
        if not delegated or not os.access(parent, os.W_OK):
            continue
        folder = os.path.join(parent, f"torchkit-test-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(folder)
        except OSError:
            continue
        limit_file = "memory.max" if os.path.exists(f"{folder}/memory.max") else None
        try:
            with open(f"{folder}/{limit_file or 'memory.limit_in_bytes'}", "w") as f:
                f.write(str(limit))
        except OSError:
            os.rmdir(folder)
            continue
        return folder
    pytest.skip("no memory cgroup can be made here (not root, or no memory hierarchy)")


def test_the_kernel_grants_what_a_real_cgroup_is_counted_to_leave(tmp_path):
    import subprocess
    import sys

    from suite_paths import REPO

    limit, cache = 256 * MiB, 128 * MiB
    folder = make_memory_cgroup(limit)
    try:
        child = subprocess.run(
            [sys.executable, "-c", KERNEL_CHILD, folder, str(tmp_path / "read"), str(cache)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
    finally:
        os.rmdir(folder)
    lines = child.stdout.split("\n")
    assert lines[0], (child.returncode, child.stderr)
    free, bound, shmem = lines[0].split()
    if int(shmem) >= cache // 2:
        pytest.skip("tmp_path is on tmpfs: the file read is shared memory, not page cache")
    if bound == "machine":
        pytest.skip("the machine has less memory available than the cgroup's limit leaves")
    assert int(free) >= limit - cache // 2, child.stdout  # the cache read counted free
    assert child.returncode == 0 and lines[1] == "held", (child.returncode, child.stderr)
