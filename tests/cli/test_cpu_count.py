"""Every default number of workers starts from the cores this process may use (taskset,
container cpusets), counted by one function, not from the machine's cores."""

from __future__ import annotations

import os

import pytest
from cgroup_files import V1, V2, fake_proc


@pytest.fixture
def three_of_64_cores(monkeypatch):
    from torchkit.core.runtime import cpus

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda: None)  # whatever limits this host


@pytest.mark.parametrize(
    ("cgroup", "mounts", "files", "quota"),
    [
        # cgroup v2 in its own namespace (docker --cpus 1.5): the mount's root is the container's.
        ("0::/\n", V2, {"fs/cgroup/cpu.max": "150000 100000\n"}, 1.5),
        ("0::/\n", V2, {"fs/cgroup/cpu.max": "max 100000\n"}, None),
        # A Kubernetes pod: the tightest quota along the path wins (the pod's 4, not the job's 6).
        (
            "0::/kubepods/pod1/job\n",
            V2,
            {
                "fs/cgroup/kubepods/pod1/cpu.max": "400000 100000\n",
                "fs/cgroup/kubepods/pod1/job/cpu.max": "600000 100000\n",
            },
            4.0,
        ),
        # cgroup v1, the cpu controller mounted with cpuacct, the container's path as the root.
        (
            "5:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n",
            [("/docker/abc", point, kind, options) for _, point, kind, options in V1],
            {
                "fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
                "fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
                "fs/cgroup/memory/cpu.cfs_quota_us": "100000\n",  # not the cpu controller
            },
            2.0,
        ),
        (
            "3:cpu,cpuacct:/\n",
            V1,
            {
                "fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                "fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            },
            None,
        ),
        ("0::/\n", V2, {}, None),  # no cpu controller
    ],
    ids=["v2-container", "v2-max", "v2-nested", "v1-container", "v1-none", "v2-no-controller"],
)
def test_cgroup_cpu_quota_is_read_as_containers_set_it(tmp_path, cgroup, mounts, files, quota):
    from torchkit.core.runtime.cpus import cgroup_cpu_quota

    assert cgroup_cpu_quota(fake_proc(tmp_path, cgroup, mounts, files)) == quota


def test_usable_cpus_stay_within_the_cgroup_cpu_quota(monkeypatch):
    """On a 64-core host a container limited to 1.5 CPUs used 64 threads and 8 loader workers
    (every core its cpuset allows): now 2 cores, as nproc-aware runtimes (JVM, Go) count."""
    from torchkit.core.data.dataset import default_workers
    from torchkit.core.runtime import cpus

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda: 1.5)
    assert cpus.usable_cpus() == 2
    assert default_workers() == 1
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda: 0.2)
    assert cpus.usable_cpus() == 1
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda: 100.0)
    assert cpus.usable_cpus() == 64


def test_usable_cpus_counts_the_allowed_cores(three_of_64_cores):
    from torchkit.core.runtime.cpus import usable_cpus

    assert usable_cpus() == 3


def test_loader_workers_leave_one_allowed_core_to_the_main_process(three_of_64_cores):
    from torchkit.core.data.dataset import default_workers

    assert default_workers() == 2  # not 8 of the machine's 64


def test_conversion_and_stats_workers_use_the_allowed_cores(three_of_64_cores):
    from torchkit.core.runtime.pool import default_workers
    from torchkit.core.stats import default_stats_workers

    assert default_workers() == 3
    assert default_stats_workers() == 3


def test_video_threads_are_twice_the_allowed_cores(three_of_64_cores):
    from torchkit.core.video import default_video_workers

    assert default_video_workers() == 6  # not 16 for the machine's 64


def test_workers_are_bounded_by_8_per_allowed_core_and_64_at_least(three_of_64_cores, monkeypatch):
    from torchkit.core.io.errors import UsageError
    from torchkit.core.runtime import cpus

    cpus.check_workers(64)  # 3 cores: 24 per core, raised to the floor of 64
    with pytest.raises(UsageError) as refused:
        cpus.check_workers(65, "-j")
    assert str(refused.value) == (
        "-j 65 is more than this machine can use (at most 64: 8 per usable CPU, 64 at least)"
    )
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    cpus.check_workers(128)
    with pytest.raises(UsageError, match="at most 128"):
        cpus.check_workers(129)


@pytest.mark.parametrize(
    "command", ["dataset-stats", "convert tensor", "convert cifar", "convert shards"]
)
def test_the_pools_commands_refuse_more_workers_before_any_work(tmp_path, command):
    """dataset-stats and convert start their worker pools with -j too (was accepted)."""
    from image_folders import write_image_folder
    from output_checks import error_line
    from processes import run_torchkit_in_process

    data = write_image_folder(tmp_path / "data", {"a": 1})
    out = tmp_path / "out"
    args = {
        "dataset-stats": [data, "-o", out],
        "convert tensor": [data, out, "--to", "npy"],
        "convert cifar": [data, out],
        "convert shards": [data, out],
    }[command]
    result = run_torchkit_in_process(*command.split(), *args, "-j", "100000")
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr).startswith(
        "Error: --workers 100000 is more than this machine can use (at most "
    )
    assert not out.exists()
