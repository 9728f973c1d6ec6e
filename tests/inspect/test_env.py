"""`torchkit env` and `torchkit.core.env`: the report, its formats, the diagnostics and
`--require-cuda`, on this machine and with simulated GPUs, drivers and broken installs."""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from suite_paths import REPO

from torchkit.cli import app
from torchkit.cli.env import report_tables
from torchkit.core import env
from torchkit.core.env import (
    check_torchvision_ops,
    collect_env,
    require_usable_cuda,
    visible_device_entries,
)
from torchkit.core.io.errors import DeviceError

CUDA_BUILD = torch.version.cuda is not None
NO_CUDA = not torch.cuda.is_available()
GIB = 1024**3
DRIVER_MESSAGE = (
    "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
    "installed a driver from http://www.nvidia.com/Download/index.aspx"
)


@pytest.fixture
def clean_env(monkeypatch):
    """No CUDA_VISIBLE_DEVICES from the caller's shell."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


# The CUDA version simulated builds claim: the real one where torch has it, so that torchvision
# (built for it) does not look mismatched.
SIMULATED_CUDA = torch.version.cuda or "12.4"


def simulate_no_gpu(
    monkeypatch,
    init_error: str,
    *,
    cuda=SIMULATED_CUDA,
    driver=(None, None),
    driver_cuda=None,
    pci_gpus=1,
):
    """A torch build (`cuda` None: CPU only) on a machine where CUDA does not initialise;
    `driver_cuda`: the newest CUDA the driver supports (None: no libcuda); `pci_gpus`: the
    NVIDIA GPUs its PCI bus lists (by default one, whose driver is missing)."""

    def failing_init():
        raise RuntimeError(init_error)

    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", failing_init)
    monkeypatch.setattr(env, "nvidia_driver", lambda: driver)
    monkeypatch.setattr(env, "cuda_driver_version", lambda: driver_cuda)
    monkeypatch.setattr(env, "nvidia_pci_gpus", lambda: pci_gpus)


def fake_gpu(index: int, *, usable: bool = True, error: str | None = None) -> dict:
    return {
        "index": index,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{index}",
        "total_memory_bytes": 80 * GIB,
        "free_memory_bytes": int(79.5 * GIB),
        "compute_capability": "9.0",
        "multiprocessors": 132,
        "usable": usable,
        "error": error,
    }


# The report ------------------------------------------------------------------------------------


def test_report_matches_independent_sources(clean_env):
    report = collect_env()
    assert report["python"] == {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "free_threaded": sysconfig.get_config_var("Py_GIL_DISABLED") == 1,
        "executable": sys.executable,
        "environment": report["python"]["environment"],  # test_python_environment
        "torch_installer": report["python"]["torch_installer"],
    }
    assert report["platform"]["system"] == platform.system()
    assert report["cpu"]["logical_cores"] == os.cpu_count()
    assert 1 <= report["cpu"]["usable_cores"] <= os.cpu_count()
    assert report["cpu"]["model"]
    info = report["torch"]
    assert info["version"] == torch.__version__
    assert info["cuda_version"] == torch.version.cuda
    assert info["cuda_available"] == torch.cuda.is_available()
    assert info["intra_op_threads"] == torch.get_num_threads()
    assert info["inter_op_threads"] == torch.get_num_interop_threads()
    assert info["build"] == (f"CUDA {torch.version.cuda}" if CUDA_BUILD else info["build"])
    number = torch.backends.cudnn.version()
    if number:
        assert info["cudnn_version"].split(".")[0] == str(number)[0]
    dist = report["distributed"]
    assert dist["gloo"] == torch.distributed.is_gloo_available()
    assert dist["nccl"] == torch.distributed.is_nccl_available()
    if dist["nccl"]:
        assert dist["nccl_version"] == ".".join(map(str, torch.cuda.nccl.version()))
    packages = report["packages"]
    assert packages["numpy"] == np.__version__
    assert packages["torchvision"] == importlib.metadata.version("torchvision")
    assert packages["scikit_learn"] == importlib.metadata.version("scikit-learn")
    assert set(packages) >= {"pillow", "opencv", "pandas", "typer", "rich"}
    assert report["cuda"]["visible_devices"] is None
    assert len(report["gpus"]) == report["cuda"]["device_count"]
    assert report["cuda"]["usable"] == any(gpu["usable"] for gpu in report["gpus"])


def test_python_environment_and_torch_installer(tmp_path, clean_env):
    """Whether torch came from pip, uv or conda, into a venv or a conda environment (a clash of
    conda's MKL or OpenMP with the wheels'), was not in the report; collect_env lists pip's and
    conda's packages for that."""
    report = collect_env(log_diagnostics=False)
    python = report["python"]
    record = importlib.metadata.distribution("torch").read_text("INSTALLER")
    assert python["torch_installer"] == (record.strip() if record and record.strip() else None)
    expected = "venv" if sys.prefix != sys.base_prefix else "system"
    if (Path(sys.prefix) / "conda-meta").is_dir():
        expected = "conda"
    assert python["environment"] == expected
    (tmp_path / "env" / "conda-meta").mkdir(parents=True)
    assert env.python_environment(str(tmp_path / "env"), "/usr") == "conda"
    assert env.python_environment(str(tmp_path), "/usr") == "venv"
    assert env.python_environment(str(tmp_path), str(tmp_path)) == "system"
    assert env.installer("no-such-distribution-here") is None
    rows = dict(report_tables(report)[0].rows)
    installed_by = f", torch installed by {python['torch_installer']}"
    assert rows["Python environment"] == expected + (installed_by if record else "")


def test_json_format(runner, clean_env):
    result = runner.invoke(app, ["env", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["torchkit_version"] and data["torch"]["version"] == torch.__version__
    assert isinstance(data["cpu"]["logical_cores"], int)
    assert isinstance(data["torch"]["cuda_available"], bool)
    assert isinstance(data["diagnostics"], list) and isinstance(data["gpus"], list)
    assert all(re.fullmatch(r"[a-z0-9_]+", key) for key in data)  # snake_case keys


def test_table_and_csv_formats(runner, clean_env):
    table = runner.invoke(app, ["env"])
    assert table.exit_code == 0
    for label in ("Python executable", "torch build", "cuDNN", "CUDA_VISIBLE_DEVICES", "NCCL"):
        assert label in table.stdout
    assert "Packages" in table.stdout and "scikit_learn" in table.stdout
    assert sys.executable in table.stdout
    rows = list(csv.reader(io.StringIO(runner.invoke(app, ["env", "--format", "csv"]).stdout)))
    assert rows[0] == ["key", "value"]
    values = dict(rows[1:])
    assert values["torch.version"] == torch.__version__
    assert values["python.executable"] == sys.executable
    assert values["packages.numpy"] == np.__version__
    assert values["cpu.logical_cores"] == str(os.cpu_count())
    if not torch.cuda.is_available():
        assert values["gpus"] == ""  # the key is there even with no GPU


def test_csv_tells_an_empty_cuda_visible_devices_from_an_unset_one(runner, monkeypatch):
    """Before: `cuda.visible_devices,` for both, though "" hides every GPU and unset hides none;
    now an empty string is a quoted empty field, and a missing value (null) an empty one."""
    rows = {}
    for value in ("", None):
        if value is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        result = runner.invoke(app, ["env", "--format", "csv"])
        assert result.exit_code == 0, result.stderr
        rows[value] = next(
            line for line in result.stdout.splitlines() if line.startswith("cuda.visible_devices,")
        )
    assert rows == {"": 'cuda.visible_devices,""', None: "cuda.visible_devices,"}


def test_csv_tells_an_empty_list_from_a_missing_one():
    """Before: `gpus,` with no GPU, as a missing value (null) is written; now an empty list or
    object is `""`, as an empty list cell is in every CSV (export's, video-info's)."""
    from torchkit.cli.env import flat_table
    from torchkit.cli.render import render_csv

    report = {"gpus": [], "features": None, "packages": {}, "flags": ["a"]}
    assert render_csv(flat_table(report)).splitlines() == [
        "key,value",
        'gpus,""',
        "features,",
        'packages,""',
        "flags.0,a",
    ]


def test_report_says_what_collect_env_says_for_a_bug_report(runner, monkeypatch, clean_env):
    # torch's collect_env gives the OS by name, libc, a debug build, the variables that change
    # how torch runs and triton's version; the report said none of them.
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    result = runner.invoke(app, ["env", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    system = report["platform"]
    if sys.platform.startswith("linux"):
        assert system["os"] == platform.freedesktop_os_release()["PRETTY_NAME"]
        assert system["libc"] == " ".join(platform.libc_ver())
    assert report["torch"]["debug_build"] is bool(torch.version.debug)
    variables = report["environment"]
    assert variables["OMP_NUM_THREADS"] == "3" and variables["CUDA_LAUNCH_BLOCKING"] is None
    assert variables["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    try:
        assert report["packages"]["triton"] == importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        assert report["packages"]["triton"] is None
    # torch 2.4 sets CUDA_MODULE_LOADING=LAZY in the process's environment each time it tries
    # to initialise CUDA (the report above did), which a `torchkit env` process of its own
    # reads before it
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    table = runner.invoke(app, ["env"]).stdout
    assert "OMP_NUM_THREADS=3, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in table
    assert system["os"] is None or system["os"] in table


def test_other_torch_variables_set_are_reported(runner, monkeypatch, clean_env):
    """NCCL_P2P_DISABLE (a DDP hang) or CUDA_DEVICE_ORDER (GPU numbering) were left out of the
    report; secrets and CUDA_VISIBLE_DEVICES (the cuda section's) still are."""
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("TORCH_HUB_TOKEN", "hunter2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("NOT_TORCH_RELATED", "x")
    variables = collect_env(log_diagnostics=False)["environment"]
    assert list(variables)[: len(env.ENVIRONMENT_VARIABLES)] == list(env.ENVIRONMENT_VARIABLES)
    assert variables["NCCL_P2P_DISABLE"] == "1"
    assert variables["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert not {"TORCH_HUB_TOKEN", "CUDA_VISIBLE_DEVICES", "NOT_TORCH_RELATED"} & set(variables)
    table = runner.invoke(app, ["env"]).stdout
    assert "NCCL_P2P_DISABLE=1" in table and "hunter2" not in table


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "NCCL_PASSWD", "TORCHKIT_AUTH_BEARER", "TORCH_HUB_AUTHORIZATION",
     "TORCHKIT_COOKIE", "NCCL_PWD", "TORCHKIT_API_KEY", "TORCHKIT_S3_SECRET_ACCESS_KEY"],
)  # fmt: skip
def test_a_variable_whose_name_says_it_holds_a_secret_is_left_out(monkeypatch, clean_env, name):
    """NCCL_PASSWD and TORCHKIT_AUTH_BEARER were printed: only TOKEN, SECRET, PASSWORD, KEY and
    CREDENTIAL were looked for; a name now counts as a URL parameter's does."""
    monkeypatch.setenv(name, "hunter2")
    monkeypatch.setenv("TORCHKIT_KEYWORDS", "0")  # a word that only begins with key: shown
    reported = collect_env(log_diagnostics=False)["environment"]
    assert name not in reported and "hunter2" not in json.dumps(reported)
    assert reported["TORCHKIT_KEYWORDS"] == "0"


def test_variables_that_change_kernels_and_numbers_are_reported(monkeypatch, clean_env):
    """ATEN_CPU_CAPABILITY (torch's CPU kernels: `CPU capability DEFAULT` on an AVX-512 CPU),
    oneDNN's and TF32's numerics, triton's, a preloaded allocator and torchkit's own variables
    were left out: `environment (none set)`."""
    variables = {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_DEFAULT_FPMATH_MODE": "BF16",
        "DNNL_MAX_CPU_ISA": "AVX2",
        "NVIDIA_TF32_OVERRIDE": "0",
        "TRITON_INTERPRET": "1",
        "MIOPEN_FIND_MODE": "NORMAL",
        "LD_PRELOAD": "/usr/lib/libtcmalloc.so.4",
        "TORCHKIT_HTTP_TIMEOUT": "5",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": "/data/hf",
        "XDG_CACHE_HOME": "/data/cache",
    }
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_TOKEN", "hunter2")
    reported = collect_env(log_diagnostics=False)["environment"]
    assert {name: reported.get(name) for name in variables} == variables
    assert "HF_TOKEN" not in reported


def test_every_key_of_the_report_is_documented(clean_env):
    page = (REPO / "docs" / "commands" / "env.md").read_text()
    report = collect_env(log_diagnostics=False)
    keys = set(report) | {
        key for value in report.values() if isinstance(value, dict) for key in value
    }
    for packages in ("packages", "cuda_packages", "intel_packages", "conda_packages"):
        keys -= set(report[packages])  # packages, not keys
    keys -= set(report["environment"]) - set(env.ENVIRONMENT_VARIABLES)  # by their prefixes
    assert {key for key in keys if f"`{key}`" not in page} == set()


GRACE = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 0

processor\t: 1
CPU implementer\t: 0x41
CPU part\t: 0xd4f
"""


@pytest.mark.parametrize(
    ("cpuinfo", "model"),
    [
        (GRACE, "ARM Neoverse-V2"),  # GH200; was "aarch64"
        (GRACE.replace("0xd4f", "0xd0c"), "ARM Neoverse-N1"),  # Graviton2, Ampere Altra
        (GRACE.replace("0x41", "0xc0").replace("0xd4f", "0xac3"), "Ampere Ampere-1"),
        (GRACE.replace("0xd4f", "0xd99"), "ARM part 0xd99"),  # not in the table: the numbers
        ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\ncpu MHz\t\t: 2595.1\n"
         "model name\t: AMD EPYC 7B13\ncpu cores\t: 2\n", "AMD EPYC 7B13"),
        ("processor\t: 0\ncpu\t\t: POWER9 (architected), altivec supported\nclock\t: 2.3GHz\n",
         "POWER9 (architected), altivec supported"),
        ("Processor\t: ARMv7 Processor rev 4 (v7l)\nCPU implementer\t: 0x41\nCPU part\t: 0xc07\n",
         "ARMv7 Processor rev 4 (v7l)"),
        ("", None),
    ],
    ids=["grace", "graviton2", "ampere-one", "unknown-arm", "x86", "power9", "armv7", "empty"],
)  # fmt: skip
def test_cpu_model_from_cpuinfo(cpuinfo, model):
    """Arm kernels give no "model name": the report said "aarch64" where lscpu (and so
    collect_env) names the core."""
    assert env.cpuinfo_model(cpuinfo) == model


def test_cpu_cores_within_a_cgroup_cpu_quota(runner, monkeypatch, clean_env):
    """In a container limited to 1.5 CPUs on a 64-core host the report said 64 usable cores."""
    from torchkit.core.runtime import cpus

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda: 1.5)
    monkeypatch.setattr(env, "cgroup_cpu_quota", lambda: 1.5)
    monkeypatch.setattr(env, "numa_nodes", lambda: 2)
    result = runner.invoke(app, ["env", "--format", "json"])
    assert json.loads(result.stdout)["cpu"] | {"model": None} == {
        "model": None,
        "logical_cores": 64,
        "usable_cores": 2,
        "quota": 1.5,
        "numa_nodes": 2,
    }
    table = runner.invoke(app, ["env"]).stdout
    assert "64 (2 usable by this process, cgroup CPU quota 1.5), 2 NUMA node(s)" in table


# /proc/cpuinfo's names of the CPU_FEATURES on x86.
CPUINFO_FLAGS = {"avx512_f": "avx512f"}


@pytest.mark.skipif(
    not (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")),
    reason="the flags of x86 Linux's /proc/cpuinfo",
)
def test_cpu_features_agree_with_proc_cpuinfo():
    """AMX, AVX-512 BF16 and VNNI, which decide how fast bfloat16 and int8 run on the CPU, were
    not in the report (`cpu_capability` says AVX512 with or without them)."""
    flags = set()
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("flags"):
                flags = set(line.partition(":")[2].split())
                break
    features = env.cpu_features(torch)
    arm = {"neon", "bf16", "i8mm", "sve", "sve2", "sve_bf16", "sme", "sme2"}
    x86 = [name for name in env.CPU_FEATURES if name not in arm]
    if not hasattr(torch.cpu, "get_capabilities"):  # torch 2.4 knows these three alone
        x86 = ["avx2", "avx512_f", "avx512_vnni"]
    listed = {name for name in x86 if CPUINFO_FLAGS.get(name, name) in flags}
    amx = {name for name in listed if name.startswith("amx_")}  # the OS must enable it too
    assert listed - amx <= set(features) <= listed
    assert set(features) - (listed - amx) <= amx


def test_cpu_features_of_a_torch_before_get_capabilities():
    checks = {
        "_is_avx2_supported": lambda: True,
        "_is_avx512_supported": lambda: True,
        "_is_vnni_supported": lambda: False,
        "_is_avx512_bf16_supported": lambda: True,
        "_is_amx_tile_supported": lambda: True,
    }
    old_torch = SimpleNamespace(cpu=SimpleNamespace(**checks))
    assert env.cpu_features(old_torch) == ["avx2", "avx512_f", "avx512_bf16", "amx_tile"]
    assert env.cpu_features(SimpleNamespace()) is None
    # torch 2.4's names for three of them (its report said nothing of the CPU's features)
    torch_2_4 = {
        "_is_cpu_support_avx2": lambda: True,
        "_is_cpu_support_avx512": lambda: False,
        "_is_cpu_support_vnni": lambda: True,
    }
    only_three = SimpleNamespace(cpu=SimpleNamespace(**torch_2_4))
    assert env.cpu_features(only_three) == ["avx2", "avx512_vnni"]


def test_cpu_libraries_of_the_torch_build():
    """collect_env leaves MKL, oneDNN and OpenMP out; performance reports need them."""
    config = torch.__config__.show()
    info = collect_env(log_diagnostics=False)["torch"]
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    assert info["blas"] == (blas.group(1) if blas else None)
    if torch.backends.mkldnn.is_available():
        assert info["onednn_version"] and info["onednn_version"] in config
    if torch.backends.openmp.is_available():
        assert info["openmp"]
    arm_build = (
        "PyTorch built with:\n  - GCC 11.2\n  - Intel(R) MKL-DNN v3.5.3 (Git Hash abc)\n"
        "  - OpenMP 201511 (a.k.a. OpenMP 4.5)\n  - Build settings: BLAS_INFO=open, CUDA=0\n"
    )
    assert env.cpu_libraries(arm_build) == {
        "blas": "open",
        "mkl_version": None,
        "onednn_version": "3.5.3",
        "openmp": "4.5",
    }
    assert set(env.cpu_libraries("").values()) == {None}


def test_overview_rows_of_the_python_build_compiler_and_cpu_libraries(clean_env):
    """env's table names a free-threaded Python, the C++ compiler torch.compile needs on the CPU
    (or that there is none), and torch's CPU math libraries (or that the build lists none)."""
    report = collect_env(log_diagnostics=False)
    report["python"].update(version="3.13.1", implementation="CPython", free_threaded=True)
    report["platform"]["compiler"] = "g++ (Fake) 99.1"
    report["torch"].update(blas="mkl", mkl_version="2024.2", onednn_version="3.5.3", openmp="4.5")
    report["torch"]["cpu_features"] = ["avx512_f", "amx_tile", "amx_bf16"]
    rows = dict(report_tables(report)[0].rows)
    assert rows["CPU features"] == "avx512_f amx_tile amx_bf16"
    assert rows["Python"] == "3.13.1 (CPython, free-threaded)"
    assert rows["C++ compiler"] == "g++ (Fake) 99.1"
    assert rows["CPU libraries"] == "BLAS mkl, MKL 2024.2, oneDNN 3.5.3, OpenMP 4.5"
    report["python"]["free_threaded"] = False
    report["platform"]["compiler"] = None
    report["torch"].update(blas=None, mkl_version=None, onednn_version=None, openmp=None)
    report["torch"]["cpu_features"] = None
    report["torch"].update(hip_version="6.2.41133", cudnn_version=None, miopen_version="3.2.0")
    rows = dict(report_tables(report)[0].rows)
    assert rows["CPU features"] == "unknown"
    assert rows["MIOpen"] == "3.2.0" and "cuDNN" not in rows
    assert rows["Python"] == "3.13.1 (CPython)"
    assert rows["C++ compiler"] == "none (torch.compile needs one on the CPU)"
    assert rows["CPU libraries"] == "none listed"


def test_build_compiler_rocm_xpu_and_xnnpack_as_collect_env_has_them(clean_env):
    """collect_env's "Is XPU available", "Is XNNPACK available" and "ROCm SDK used to build
    PyTorch" had no counterpart, nor the compiler torch was built with (collect_env gives only
    the system's gcc and clang)."""
    assert env.build_compiler("PyTorch built with:\n  - GCC 13.3\n  - C++ Version: 202002\n") == (
        "GCC 13.3"
    )
    assert env.build_compiler("PyTorch built with:\n  - clang 17.0.6\n") == "clang 17.0.6"
    # clang defines GCC's version macros as 4.2: a macOS wheel lists "GCC 4.2" first
    macos = "PyTorch built with:\n  - GCC 4.2\n  - C++ Version: 201703\n  - clang 15.0.0\n"
    assert env.build_compiler(macos) == "clang 15.0.0"
    assert env.build_compiler("PyTorch built with:\n  - MSVC 194334809\n") == "MSVC 194334809"
    assert env.build_compiler("PyTorch built with:\n  - C++ Version: 201703\n") is None
    assert env._xpu_available(SimpleNamespace()) is False  # a torch without torch.xpu
    assert env._xpu_available(SimpleNamespace(xpu=SimpleNamespace(is_available=lambda: True)))
    report = collect_env(log_diagnostics=False)
    info = report["torch"]
    assert info["xnnpack"] is bool(torch.backends.xnnpack.enabled)
    assert info["rocm_version"] == (getattr(torch.version, "rocm", None) or None)
    info.update(build_compiler="GCC 13.3", rocm_version="6.4.1", xpu_available=True, xnnpack=True)
    info.update(hip_version="6.4.43482", cudnn_version=None, miopen_version="3.4.0")
    rows = dict(report_tables(report)[0].rows)
    assert rows["torch built with"] == "GCC 13.3" and rows["ROCm"] == "6.4.1"
    assert rows["XPU available"] is True and rows["XNNPACK"] is True
    info.update(build_compiler=None, rocm_version=None, xpu_available=False, xnnpack=None)
    rows = dict(report_tables(report)[0].rows)
    assert rows["torch built with"] == "unknown" and "ROCm" not in rows
    assert rows["XPU available"] is False and rows["XNNPACK"] == "unknown"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo")
def test_cpu_model_unknown_is_null_not_the_architecture(runner, monkeypatch, tmp_path, clean_env):
    """With /proc/cpuinfo unreadable the model read "x86_64" (uname's processor)."""
    monkeypatch.setattr(env, "CPUINFO", str(tmp_path / "missing"))
    result = runner.invoke(app, ["env", "--format", "json"])
    assert json.loads(result.stdout)["cpu"]["model"] is None
    assert env.cpu_model() == f"{platform.machine()} CPU"  # benchmark's device name
    (tmp_path / "cpuinfo").write_text(GRACE)
    monkeypatch.setattr(env, "CPUINFO", str(tmp_path / "cpuinfo"))
    assert env.cpu_name() == env.cpu_model() == "ARM Neoverse-V2"


def test_numa_nodes(tmp_path):
    for name in ("node0", "node1", "online", "possible", "has_cpu", "nodefoo"):
        (tmp_path / name).mkdir()
    assert env.numa_nodes(str(tmp_path)) == 2
    assert env.numa_nodes(str(tmp_path / "missing")) is None
    if os.path.isdir("/sys/devices/system/node/node0"):
        assert env.numa_nodes() >= 1


def fake_command(folder, name: str, body: str) -> str:
    script = folder / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.skipif(sys.platform == "win32", reason="sh scripts stand in for the compiler")
def test_cxx_compiler_is_the_one_torch_compile_would_run(monkeypatch, tmp_path):
    """collect_env reports GCC; env names the compiler TorchInductor builds CPU code with."""
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CXX", raising=False)
    fake_command(tmp_path, "g++", 'echo "g++ (Fake) 99.1"; echo "Copyright"')
    assert env.cxx_compiler() == "g++ (Fake) 99.1"
    monkeypatch.setenv("CXX", fake_command(tmp_path, "my-cxx", 'echo "clang version 20.1"'))
    assert env.cxx_compiler() == "clang version 20.1"
    monkeypatch.setenv("CXX", str(tmp_path / "missing-c++"))
    assert env.cxx_compiler() is None
    monkeypatch.setenv("CXX", fake_command(tmp_path, "failing", "echo half; exit 3"))
    assert env.cxx_compiler() is None
    monkeypatch.setenv("CXX", "'unclosed")
    assert env.cxx_compiler() is None


@pytest.mark.skipif(sys.platform == "win32", reason="sh scripts stand in for the compiler")
def test_a_hanging_compiler_does_not_hold_up_the_report(monkeypatch, tmp_path):
    """A compiler that never answers, whose child keeps the pipe open after it is killed, is
    given up on at the timeout with its whole process group."""
    import time

    marker = tmp_path / "child.pid"
    hanging = fake_command(tmp_path, "hanging", f"sleep 300 & echo $! > {marker}; wait")
    monkeypatch.setenv("CXX", hanging)
    monkeypatch.setattr(env, "COMMAND_TIMEOUT_S", 0.5)
    started = time.monotonic()
    assert env.cxx_compiler() is None
    assert time.monotonic() - started < 100  # given up at 0.5 s, not at the child's 300 s
    stat = f"/proc/{int(marker.read_text())}/stat"  # the child that held the pipe is gone too
    if os.path.exists("/proc/self/stat"):
        deadline = time.monotonic() + 30
        while os.path.exists(stat) and time.monotonic() < deadline:
            with open(stat) as handle:  # a zombie (Z) where nothing reaps it here
                if handle.read().rpartition(")")[2].split()[0] == "Z":
                    break
        else:
            assert not os.path.exists(stat)


@pytest.mark.parametrize(
    "metadata",
    [b"Metadata-Version: 2.1\nName: numpy\nVersion: 0.1\nAuthor: Andr\xe9\n", None],
    ids=["latin-1-metadata", "no-metadata"],
)
def test_a_broken_package_record_neither_ends_the_report_nor_hides_the_package(
    runner, monkeypatch, tmp_path, clean_env, metadata
):
    """A stale `.dist-info` earlier on the path (not UTF-8, or without METADATA) ended the
    report in 'Error: UnicodeDecodeError', or made an installed numpy read as not installed."""
    record = tmp_path / "numpy-0.1.dist-info"
    record.mkdir()
    if metadata is not None:
        (record / "METADATA").write_bytes(metadata)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = runner.invoke(app, ["env", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["packages"]["numpy"] == np.__version__


def _record(folder: Path, name: str, metadata: bytes | None) -> None:
    (folder / name).mkdir(parents=True)
    if metadata is not None:
        (folder / name / "METADATA").write_bytes(metadata)


def test_nvidia_packages_are_listed_as_collect_env_lists_them(runner, monkeypatch, tmp_path):
    """collect_env's `pip list` lines for the NVIDIA wheels (nvidia-cublas, nvidia-cudnn-cu13...)
    had no counterpart: a cuDNN of another CUDA major left by an upgrade did not show."""
    first, second = tmp_path / "site", tmp_path / "later"
    _record(
        first,
        "nvidia_cudnn_cu12-8.9.2.26.dist-info",
        b"Name: nvidia-cudnn-cu12\nVersion: 8.9.2.26\n",
    )
    _record(
        first,
        "nvidia_cudnn_cu13-9.26.0.51.dist-info",
        b"Name: nvidia_cudnn_cu13\nVersion: 9.26.0.51\n",
    )
    _record(first, "nvidia_cublas-13.4.1.3.dist-info", b"Name: nvidia-cublas\nVersion: 13.4.1.3\n")
    _record(first, "nvidia_nccl_cu13-1.0.dist-info", None)  # a broken record: passed over
    _record(first, "numpy-2.0.0.dist-info", b"Name: numpy\nVersion: 2.0.0\n")
    _record(second, "nvidia_cublas-12.1.dist-info", b"Name: nvidia-cublas\nVersion: 12.1\n")
    (second / "nvidia_nccl_cu13-2.30.7.dist-info").mkdir()  # METADATA-less here too
    _record(first, "nvidia_cufft-1.0.dist-info", b"Name: nvidia-cufft\n")  # and no Version
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        found = env.cuda_packages([str(first), str(tmp_path / "missing"), str(second)])
    # Python 3.12+ warned of each missing field read ('Implicit None on return values is
    # deprecated and will raise KeyErrors')
    assert [str(warning.message) for warning in warned] == []
    assert found == {
        "nvidia-cublas": "13.4.1.3",  # the first on the path, as import finds it
        "nvidia-cudnn-cu12": "8.9.2.26",
        "nvidia-cudnn-cu13": "9.26.0.51",
    }
    # This machine's, against every install record importlib.metadata finds
    expected = {}
    for distribution in importlib.metadata.distributions():
        name = re.sub(r"[-_.]+", "-", distribution.metadata["Name"] or "").lower()
        if name.startswith("nvidia-"):
            expected.setdefault(name, distribution.version)
    report = collect_env(log_diagnostics=False)
    assert report["cuda_packages"] == expected
    monkeypatch.setattr(env, "cuda_packages", lambda: {"nvidia-cublas": "13.4.1.3"})
    table = runner.invoke(app, ["env"])
    assert "NVIDIA packages" in table.stdout and "13.4.1.3" in table.stdout
    monkeypatch.setattr(env, "cuda_packages", lambda: {})
    assert "NVIDIA packages" not in runner.invoke(app, ["env"]).stdout


def test_intel_packages_are_listed_as_collect_env_lists_them(runner, monkeypatch, tmp_path):
    """collect_env's `pip list` lines for Intel's oneAPI wheels (mkl, intel-openmp, the SYCL
    runtime of torch's XPU wheels) had no counterpart."""
    site = tmp_path / "site"
    _record(site, "mkl-2025.0.1.dist-info", b"Name: mkl\nVersion: 2025.0.1\n")
    _record(site, "intel_openmp-2025.0.4.dist-info", b"Name: intel-openmp\nVersion: 2025.0.4\n")
    _record(site, "onemkl_sycl_blas-2025.0.1.dist-info", b"Name: onemkl-sycl-blas\nVersion: 1\n")
    _record(site, "intel_sycl_rt-2025.0.4.dist-info", b"Name: intel_sycl_rt\nVersion: 2025.0.4\n")
    _record(site, "mkl_include-2025.0.1.dist-info", b"Name: mkl-include\nVersion: 2025.0.1\n")
    _record(site, "intelhex-2.3.dist-info", b"Name: intelhex\nVersion: 2.3\n")
    _record(site, "tbb-2022.0.dist-info", None)  # a broken record: passed over
    assert env.intel_packages([str(site)]) == {
        "intel-openmp": "2025.0.4",
        "intel-sycl-rt": "2025.0.4",
        "mkl": "2025.0.1",
        "onemkl-sycl-blas": "1",
    }
    assert env.cuda_packages([str(site)]) == {}
    monkeypatch.setattr(env, "intel_packages", lambda: {"mkl": "2025.0.1"})
    table = runner.invoke(app, ["env"])
    assert "Intel packages" in table.stdout and "2025.0.1" in table.stdout
    data = json.loads(runner.invoke(app, ["env", "--format", "json"]).stdout)
    assert data["intel_packages"] == {"mkl": "2025.0.1"}
    monkeypatch.setattr(env, "intel_packages", lambda: {})
    assert "Intel packages" not in runner.invoke(app, ["env"]).stdout


def test_conda_packages_are_listed_as_collect_env_lists_them(runner, monkeypatch, tmp_path):
    """collect_env's `conda list` lines (pytorch's build string: CUDA or CPU; the conda BLAS
    and OpenMP that clash with the wheels') had no counterpart; read without running conda."""
    meta = tmp_path / "conda-env" / "conda-meta"
    meta.mkdir(parents=True)
    for record in (
        "pytorch-2.5.1-py3.11_cuda12.4_cudnn9.1.0_0.json",
        "libblas-3.9.0-20_linux64_mkl.json",
        "_openmp_mutex-4.5-2_gnu.json",
        "cuda-cudart-12.4.127-0.json",
        "pytorch-cuda-12.1-ha16c6d3_6.json",  # dashes in the name: version and build have none
        "libcublas-12.1.0.26-0.json",
        "python-3.11.10-hc5c86c4_3_cpython.json",  # not of torch's kind
        "history",  # conda's log: no record
        "broken.json",  # no version nor build
    ):
        (meta / record).write_text("{}")
    assert env.conda_packages(str(tmp_path / "conda-env")) == {
        "_openmp_mutex": "4.5 2_gnu",
        "cuda-cudart": "12.4.127 0",
        "libblas": "3.9.0 20_linux64_mkl",
        "libcublas": "12.1.0.26 0",
        "pytorch": "2.5.1 py3.11_cuda12.4_cudnn9.1.0_0",
        "pytorch-cuda": "12.1 ha16c6d3_6",
    }
    assert env.conda_packages(str(tmp_path)) == {}  # no conda environment
    if not (Path(sys.prefix) / "conda-meta").is_dir():
        assert collect_env(log_diagnostics=False)["conda_packages"] == {}
    monkeypatch.setattr(env, "conda_packages", lambda: {"pytorch": "2.5.1 py3.11_cpu_0"})
    table = runner.invoke(app, ["env"])
    assert "conda packages" in table.stdout and "py3.11_cpu_0" in table.stdout
    monkeypatch.setattr(env, "conda_packages", lambda: {})
    assert "conda packages" not in runner.invoke(app, ["env"]).stdout


def test_output_file_and_force(runner, tmp_path, clean_env):
    target = tmp_path / "env.txt"  # a name that picks no format: --format does
    assert runner.invoke(app, ["env", "--format", "json", "-o", str(target)]).exit_code == 0
    assert json.loads(target.read_text())["torch"]["version"] == torch.__version__
    refused = runner.invoke(app, ["env", "-o", str(target)])
    assert refused.exit_code == 1 and "--force" in refused.stderr
    assert runner.invoke(app, ["env", "-o", str(target), "--force"]).exit_code == 0
    assert "torch build" in target.read_text()


# Diagnostics and --require-cuda ----------------------------------------------------------------


@pytest.mark.skipif(not (CUDA_BUILD and NO_CUDA), reason="needs a CUDA build of torch, no GPU")
def test_this_machine_cuda_build_without_driver(runner, clean_env):
    report = runner.invoke(app, ["env", "--format", "json"])
    assert report.exit_code == 0 and json.loads(report.stdout)["cuda"]["usable"] is False
    if json.loads(report.stdout)["cuda"]["pci_gpu_count"] == 0:  # no NVIDIA GPU: no warning
        assert report.stderr == ""
    else:
        assert report.stderr.startswith(
            f"Warning: torch {torch.__version__} is a CUDA {torch.version.cuda} build"
        )
    result = runner.invoke(app, ["env", "--require-cuda", "--format", "json"])
    assert result.exit_code == 1 and result.stdout == ""  # a script's check: one line
    (line,) = result.stderr.strip().splitlines()
    assert re.fullmatch(r"Error: no usable CUDA GPU: .+ \(.+\)", line)


def test_cuda_build_without_driver_simulated(runner, monkeypatch, clean_env):
    simulate_no_gpu(monkeypatch, DRIVER_MESSAGE)
    report = collect_env()
    assert report["diagnostics"] == [
        f"torch {torch.__version__} is a CUDA {SIMULATED_CUDA} build but cannot use CUDA: "
        "Found no NVIDIA driver on your system"
    ]
    assert report["cuda"]["problem"] == "Found no NVIDIA driver on your system"
    with pytest.raises(DeviceError) as caught:
        require_usable_cuda(report)
    assert str(caught.value) == (
        "no usable CUDA GPU: Found no NVIDIA driver on your system "
        "(install or update the NVIDIA driver until nvidia-smi lists the GPU)"
    )
    result = runner.invoke(app, ["env", "--require-cuda"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == f"Error: {caught.value}\n"  # one line, no table, no warnings
    table = runner.invoke(app, ["env"])  # without --require-cuda: the report and the warning
    assert table.exit_code == 0 and "torch build" in table.stdout
    assert table.stderr.startswith("Warning: torch ")


def test_a_cuda_build_on_a_machine_without_an_nvidia_gpu_is_no_warning(runner, monkeypatch):
    """Before: the default Linux wheel of torch (a CUDA build) on a laptop or CPU server warned
    at every `env` that it 'cannot use CUDA: Found no NVIDIA driver' and told the user to
    install one, on a machine without an NVIDIA GPU. The PCI bus lists every GPU, driver or
    not: none there is no problem, and --require-cuda says why there is no GPU."""
    simulate_no_gpu(monkeypatch, DRIVER_MESSAGE, pci_gpus=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    report = collect_env()
    assert report["diagnostics"] == []
    assert report["cuda"]["problem"] == "this machine has no NVIDIA GPU (none on its PCI bus)"
    table = runner.invoke(app, ["env"])
    assert table.exit_code == 0 and table.stderr == ""
    result = runner.invoke(app, ["env", "--require-cuda"])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        "Error: no usable CUDA GPU: this machine has no NVIDIA GPU (none on its PCI bus) (run "
        "on a machine with an NVIDIA GPU)\n"
    )
    # A bus that cannot say (WSL, a Jetson, no sysfs): the driver's absence is reported as before
    simulate_no_gpu(monkeypatch, DRIVER_MESSAGE, pci_gpus=None)
    assert collect_env()["cuda"]["problem"] == "Found no NVIDIA driver on your system"


@pytest.mark.parametrize("value", ["", "-1", "NoDevFiles", "0 1", "0,abc,1"])
def test_cuda_visible_devices_on_a_machine_without_an_nvidia_gpu_is_no_warning(
    runner, monkeypatch, value
):
    """A CPU server whose shell profile sets CUDA_VISIBLE_DEVICES=-1 (or empty) was told at every
    `env` that it 'hides every GPU; unset it', on a machine with no GPU to hide. With none on
    the PCI bus it chooses nothing: the report shows the value and warns of nothing; a machine
    with a GPU is still warned (test_cuda_visible_devices_hiding_every_gpu)."""
    simulate_no_gpu(monkeypatch, DRIVER_MESSAGE, pci_gpus=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    report = collect_env()
    assert report["diagnostics"] == []
    assert report["cuda"]["visible_devices"] == value
    assert report["cuda"]["problem"] == "this machine has no NVIDIA GPU (none on its PCI bus)"
    table = runner.invoke(app, ["env"])
    assert table.exit_code == 0 and table.stderr == ""
    row = next(line for line in table.stdout.splitlines() if "CUDA_VISIBLE_DEVICES" in line)
    assert row.split("│")[2].strip() == repr(value)
    # A ROCm build: CUDA_VISIBLE_DEVICES chooses among AMD GPUs too, which the bus count omits
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert collect_env()["diagnostics"] != []


def test_a_driver_on_a_machine_without_an_nvidia_gpu_is_no_warning(monkeypatch, clean_env):
    """A cluster's login node (an image that installs the driver's libcuda on every machine):
    libcuda answers cuDriverGetVersion, NVML sees no GPU, and the PCI bus lists none. Before: a
    warning at every run, 'install or update the NVIDIA driver (nvidia-smi should list the
    GPU)'. A GPU the driver or the bus sees is still warned of."""
    simulate_no_gpu(monkeypatch, "No CUDA GPUs are available", driver_cuda="12.4", pci_gpus=0)
    report = collect_env()
    assert report["diagnostics"] == []
    assert report["cuda"]["problem"] == "this machine has no NVIDIA GPU (none on its PCI bus)"
    for driver, pci_gpus in (((None, None), 1), (("550.54.15", 1), 0), ((None, None), None)):
        simulate_no_gpu(
            monkeypatch,
            "No CUDA GPUs are available",
            driver=driver,
            driver_cuda="12.4",
            pci_gpus=pci_gpus,
        )
        report = collect_env()
        assert report["cuda"]["problem"] == "No CUDA GPUs are available"
        assert len(report["diagnostics"]) == 1


def _pci_device(folder: Path, name: str, vendor: str, device_class: str) -> None:
    (folder / name).mkdir()
    (folder / name / "vendor").write_text(vendor + "\n")
    (folder / name / "class").write_text(device_class + "\n")


def test_nvidia_gpus_on_the_pci_bus(tmp_path, monkeypatch):
    """Counted as lspci lists them: NVIDIA's vendor 0x10de with a display-controller class
    (0x0300 VGA, 0x0302 3D: an H100); NVIDIA's NVSwitch bridges (0x0680) and other vendors'
    GPUs are not NVIDIA GPUs."""
    monkeypatch.setattr(env.sys, "platform", "linux")
    monkeypatch.setattr(env, "WSL_GPU_DEVICE", str(tmp_path / "dxg"))
    monkeypatch.setattr(env, "DEVICE_TREE_COMPATIBLE", str(tmp_path / "compatible"))
    bus = tmp_path / "devices"
    bus.mkdir()
    assert env.nvidia_pci_gpus(str(bus)) is None  # no PCI device listed at all: cannot tell
    assert env.nvidia_pci_gpus(str(tmp_path / "missing")) is None
    _pci_device(bus, "0000:00:00.0", "0x8086", "0x060000")  # a host bridge
    _pci_device(bus, "0000:00:02.0", "0x1af4", "0x018000")  # virtio
    assert env.nvidia_pci_gpus(str(bus)) == 0
    _pci_device(bus, "0000:17:00.0", "0x10de", "0x030200")  # H100
    _pci_device(bus, "0000:18:00.0", "0x10DE", "0x030000")  # a VGA GeForce
    _pci_device(bus, "0000:19:00.0", "0x10de", "0x068000")  # an NVSwitch
    _pci_device(bus, "0000:1a:00.0", "0x1002", "0x038000")  # an AMD Instinct
    assert env.nvidia_pci_gpus(str(bus)) == 2
    (bus / "0000:1b:00.0").mkdir()  # a device without a vendor: the bus cannot tell
    assert env.nvidia_pci_gpus(str(bus)) is None
    (bus / "0000:1b:00.0").rmdir()
    (tmp_path / "compatible").write_bytes(b"nvidia,p3768-0000+p3767-0005\0nvidia,tegra234\0")
    assert env.nvidia_pci_gpus(str(bus)) is None  # a Jetson Orin: its GPU is on no PCI bus
    (tmp_path / "compatible").unlink()
    (tmp_path / "dxg").touch()  # WSL: its GPU comes through /dev/dxg
    assert env.nvidia_pci_gpus(str(bus)) is None
    (tmp_path / "dxg").unlink()
    assert env.nvidia_pci_gpus(str(bus)) == 2
    monkeypatch.setattr(env.sys, "platform", "darwin")
    assert env.nvidia_pci_gpus(str(bus)) is None


class FakeLibcuda:
    """libcuda as ctypes loads it: cuDriverGetVersion writes `version`, returns `status`."""

    def __init__(self, version: int, status: int = 0) -> None:
        self.version, self.status, self.calls = version, status, []

    def cuDriverGetVersion(self, pointer) -> int:  # noqa: N802 (the C function's name)
        pointer._obj.value = self.version
        self.calls.append("cuDriverGetVersion")
        return self.status


def test_the_driver_cuda_version_comes_from_libcuda_without_cuinit(monkeypatch):
    """Before: only torch's build CUDA was reported, never what the driver supports (nvidia-smi's
    "CUDA Version"). cuDriverGetVersion needs no cuInit: the only call made is that one."""
    libraries = {"libcuda.so.1": FakeLibcuda(12040), "old.so": FakeLibcuda(11080)}
    libraries |= {"failing.so": FakeLibcuda(12040, status=3), "zero.so": FakeLibcuda(0)}

    def load(name):
        if name not in libraries:
            raise OSError(f"{name}: cannot open shared object file")
        return libraries[name]

    monkeypatch.setattr(env.ctypes, "CDLL", load)
    assert env.cuda_driver_version(("libcuda.so.1",)) == "12.4"
    assert libraries["libcuda.so.1"].calls == ["cuDriverGetVersion"]
    assert env.cuda_driver_version(("missing.so", "old.so")) == "11.8"  # the next name tried
    assert env.cuda_driver_version(("missing.so",)) is None  # no driver
    assert env.cuda_driver_version(("failing.so",)) is None
    assert env.cuda_driver_version(("zero.so",)) is None
    monkeypatch.setattr(env.ctypes, "CDLL", lambda name: object())  # no such function
    assert env.cuda_driver_version(("libcuda.so.1",)) is None


def test_no_libcuda_is_no_driver_cuda_version(tmp_path):
    assert env.cuda_driver_version((str(tmp_path / "libcuda.so.1"),)) is None


def test_the_report_shows_the_driver_cuda_version_and_a_driver_too_old(
    runner, monkeypatch, clean_env
):
    message = "The NVIDIA driver on your system is too old (found version 11080)"
    simulate_no_gpu(monkeypatch, message, cuda="12.4", driver=("520.61.05", 1), driver_cuda="11.8")
    monkeypatch.setattr(env, "check_torchvision_ops", lambda torch: None)
    report = collect_env()
    assert report["cuda"]["driver_cuda_version"] == "11.8"
    too_old = "the NVIDIA driver supports CUDA 11.8 at most, torch is built for 12.4"
    assert report["cuda"]["hint"] == (
        f"{too_old}: update the NVIDIA driver, or install a torch build for CUDA 11.8 or older"
    )
    assert report["diagnostics"] == [
        f"torch {torch.__version__} is a CUDA 12.4 build but cannot use CUDA: {message} ({too_old})"
    ]
    table = runner.invoke(app, ["env"])
    assert table.exit_code == 0
    assert re.search(r"NVIDIA driver +│ 520\.61\.05 \(CUDA 11\.8, 1 GPUs\)", table.stdout)
    csv_rows = runner.invoke(app, ["env", "--format", "csv"]).stdout.splitlines()
    assert "cuda.driver_cuda_version,11.8" in csv_rows


@pytest.mark.parametrize("value", ["", "-1", "none", "NoDevFiles"])
def test_cuda_visible_devices_hiding_every_gpu(monkeypatch, runner, value):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    simulate_no_gpu(monkeypatch, "No CUDA GPUs are available", driver=("550.54.15", 2))
    report = collect_env()
    message = f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU"
    assert report["diagnostics"] == [message + "; unset it or list the GPUs to use, e.g. 0 or 0,1"]
    assert report["cuda"]["problem"] == message
    assert report["cuda"]["visible_devices"] == value
    assert report["cuda"]["driver_version"] == "550.54.15"
    result = runner.invoke(app, ["env"])
    assert result.exit_code == 0
    row = next(line for line in result.stdout.splitlines() if "CUDA_VISIBLE_DEVICES" in line)
    assert row.split("│")[2].strip() == repr(value)
    result = runner.invoke(app, ["env", "--require-cuda"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == (
        f"Error: no usable CUDA GPU: {message} (unset CUDA_VISIBLE_DEVICES or list GPU indices)\n"
    )


def simulate_one_gpu(monkeypatch) -> None:
    """A CUDA build with a driver and one GPU that runs code (torch.cuda mocked)."""
    monkeypatch.setattr(torch.version, "cuda", SIMULATED_CUDA)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(env, "nvidia_driver", lambda: ("550.54.15", 1))
    monkeypatch.setattr(env, "_probe_gpus", lambda torch: ([fake_gpu(0)], None))


@pytest.mark.parametrize(
    "args",
    [
        ["--require-cuda"],
        ["--require-cuda", "-q"],
        ["--quiet", "--require-cuda", "--format", "json"],
        ["--require-cuda", "--format", "csv"],
    ],
)
def test_require_cuda_without_a_gpu_is_one_line_for_scripts(runner, monkeypatch, clean_env, args):
    simulate_no_gpu(monkeypatch, DRIVER_MESSAGE)
    result = runner.invoke(app, ["env", *args])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "Error: no usable CUDA GPU: Found no NVIDIA driver on your system (install or update "
        "the NVIDIA driver until nvidia-smi lists the GPU)"
    ]


# `torchkit -q env` printed the whole report: the app's -q is every command's, env's too.
@pytest.mark.parametrize("args", [["env", "-q"], ["-q", "env"]], ids=["after", "before"])
def test_quiet_require_cuda_with_a_gpu_prints_nothing(runner, monkeypatch, clean_env, args):
    simulate_one_gpu(monkeypatch)
    quiet = runner.invoke(app, [*args, "--require-cuda"])
    assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", "")
    loud = runner.invoke(app, ["env", "--require-cuda"])  # without -q: the report, as before
    assert loud.exit_code == 0 and "NVIDIA H100 80GB HBM3" in loud.stdout


@pytest.mark.parametrize("args", [["env", "--quiet"], ["--quiet", "env"]], ids=["after", "before"])
def test_quiet_prints_only_problems(runner, monkeypatch, clean_env, args):
    simulate_no_gpu(monkeypatch, DRIVER_MESSAGE)
    result = runner.invoke(app, args)
    assert result.exit_code == 0 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"Warning: torch {torch.__version__} is a CUDA {SIMULATED_CUDA} build but cannot use "
        "CUDA: Found no NVIDIA driver on your system"
    ]


def test_require_cuda_still_writes_the_report_file(runner, monkeypatch, tmp_path, clean_env):
    """-o FILE is asked for explicitly: a CI log keeps the report that says why."""
    simulate_no_gpu(monkeypatch, DRIVER_MESSAGE)
    target = tmp_path / "env.json"
    args = ["env", "-q", "--require-cuda", "--format", "json", "-o", str(target)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and result.stdout == ""
    assert json.loads(target.read_text())["cuda"]["usable"] is False
    assert result.stderr.splitlines()[-1].startswith("Error: no usable CUDA GPU: ")


def test_cuda_visible_devices_past_the_last_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    simulate_no_gpu(monkeypatch, "No CUDA GPUs are available", driver=("550.54.15", 2))
    assert collect_env()["cuda"]["problem"] == "CUDA_VISIBLE_DEVICES='4,5' hides every GPU"


@pytest.mark.parametrize(
    ("value", "driver_gpus", "expected"),
    [
        ("0,1", None, ["0", "1"]),
        (" 1 , 0", None, ["1", "0"]),
        ("0,-1,1", None, ["0"]),  # CUDA stops at the first invalid entry
        ("0,1,-1,2", None, ["0", "1"]),
        ("0,abc,1", None, ["0"]),
        ("0,,1", None, ["0"]),
        ("0,1,", None, ["0", "1"]),
        ("", None, []),
        ("-1", None, []),
        ("none", None, []),
        # strtoul: the leading digits of an entry, an optional sign, leading zeros
        ("1gpu2,2ampere", None, ["1", "2"]),
        ("01,+2", None, ["1", "2"]),
        # a device listed twice: CUDA sees none at all
        ("0,0", None, []),
        ("1,0,1", None, []),
        ("GPU-8a6f,GPU-8a6f", None, []),
        # indices at or past the driver's GPU count end the list
        ("0,5,1", 2, ["0"]),
        ("2,1", 2, []),
        ("0,5,1", None, ["0", "5", "1"]),  # driver count unknown: not judged
        # UUIDs: the kind of the first entry only
        ("GPU-8a6f,GPU-1c2d", None, ["GPU-8a6f", "GPU-1c2d"]),
        ("GPU-8a6f,MIG-1c2d", None, ["GPU-8a6f"]),
        ("MIG-1c2d,GPU-8a6f", None, ["MIG-1c2d"]),
        ("GPU-8a6f,0", None, ["GPU-8a6f"]),
        ("0,GPU-8a6f,1", None, ["0"]),
    ],
)
def test_visible_device_parsing(value, driver_gpus, expected):
    """The CUDA runtime's rule, as torch.cuda._parse_visible_devices mirrors it."""
    assert visible_device_entries(value, driver_gpus) == expected


def test_visible_device_parsing_agrees_with_torch(monkeypatch):
    """Where torch's own emulation of the rule exists, the two read every list alike."""
    parse = getattr(torch.cuda, "_parse_visible_devices", None)
    if parse is None:
        pytest.skip("this torch has no _parse_visible_devices")
    monkeypatch.setattr(torch.version, "hip", None)
    values = ["0,1,-1,2", "0,abc,1", "1gpu2,2ampere", "0,0", "GPU-a,MIG-b", "GPU-a,GPU-b", ""]
    for value in values:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert visible_device_entries(value) == [str(entry) for entry in parse()], value


@pytest.mark.parametrize(
    ("value", "stop", "why", "used"),
    [
        ("0,abc,1", "abc", "not a GPU index", "0"),
        ("0,1,-1,2", "-1", "negative", "0,1"),
        ("0,5,1", "5", "past the driver's 2 GPU(s)", "0"),
        ("GPU-8a6f,0", "0", "not a GPU- UUID", "GPU-8a6f"),
    ],
)
def test_cuda_visible_devices_cut_short_is_a_warning(monkeypatch, value, stop, why, used):
    """The GPUs after the first invalid entry are silently unused by CUDA: env says so."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    monkeypatch.setattr(torch.version, "cuda", SIMULATED_CUDA)
    monkeypatch.setattr(env, "nvidia_driver", lambda: ("550.54.15", 2))
    monkeypatch.setattr(env, "_probe_gpus", lambda torch: ([fake_gpu(0)], None))
    report = collect_env()
    assert report["cuda"]["usable"] is True
    assert report["diagnostics"] == [
        f"CUDA_VISIBLE_DEVICES={value!r} ends at {stop!r} ({why}): CUDA uses only {used} and "
        "ignores the rest"
    ]


@pytest.mark.parametrize(
    ("value", "entry", "number", "used"),
    [("0 1", "0 1", 0, "0"), ("0;1", "0;1", 0, "0"), ("0,1 2", "1 2", 1, "0,1")],
)
def test_cuda_visible_devices_separated_without_commas_is_a_warning(
    monkeypatch, value, entry, number, used
):
    """CUDA_VISIBLE_DEVICES="0 1" on two GPUs: CUDA (and torch) read the index 0, ignore the rest;
    env said nothing while the job ran on one GPU."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    monkeypatch.setattr(torch.version, "cuda", SIMULATED_CUDA)
    monkeypatch.setattr(env, "nvidia_driver", lambda: ("550.54.15", 3))
    monkeypatch.setattr(env, "_probe_gpus", lambda torch: ([fake_gpu(0)], None))
    assert collect_env()["diagnostics"] == [
        f"CUDA_VISIBLE_DEVICES={value!r}: CUDA reads the entry {entry!r} as {number} and ignores "
        f"the rest of it, so it uses GPU(s) {used}; separate GPU indices with commas, e.g. 0,1"
    ]


@pytest.mark.parametrize("value", ["0,1", "0,1,", "1"])
def test_cuda_visible_devices_used_whole_is_not_a_warning(monkeypatch, value):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    monkeypatch.setattr(torch.version, "cuda", SIMULATED_CUDA)
    monkeypatch.setattr(env, "nvidia_driver", lambda: ("550.54.15", 2))
    monkeypatch.setattr(env, "_probe_gpus", lambda torch: ([fake_gpu(0)], None))
    assert collect_env()["diagnostics"] == []


@pytest.mark.parametrize("value", ["5,0", "0,0", "2,1"])
def test_cuda_visible_devices_hiding_every_gpu_by_the_runtime_rule(monkeypatch, value):
    """An invalid first index, or a repeated one, hides every GPU although a valid index is
    listed (the old check, which looked at each entry on its own, missed these)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    simulate_no_gpu(monkeypatch, "No CUDA GPUs are available", driver=("550.54.15", 2))
    report = collect_env()
    assert report["cuda"]["problem"] == f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU"


def test_cpu_only_torch_on_a_gpu_machine(monkeypatch, clean_env):
    simulate_no_gpu(monkeypatch, "unused", cuda=None, driver=("550.54.15", 1))
    report = collect_env()
    assert report["torch"]["build"] == "CPU only"
    assert report["cuda"]["problem"] == f"torch {torch.__version__} is a CPU-only build"
    assert report["cuda"]["hint"] == "install a CUDA build of torch from pytorch.org"
    assert report["diagnostics"] == [
        f"the NVIDIA driver sees 1 GPU(s) but torch {torch.__version__} is a CPU-only build; "
        "install a CUDA build of torch to use them"
    ]


def test_a_rocm_build_without_a_usable_gpu_hints_at_the_rocm_driver(monkeypatch, clean_env):
    simulate_no_gpu(monkeypatch, "No HIP GPUs are available", cuda=None)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    report = collect_env()
    assert report["cuda"]["problem"] == "No HIP GPUs are available"
    assert (
        report["cuda"]["hint"] == "install or update the ROCm driver until rocm-smi lists the GPU"
    )


def test_cpu_only_torch_on_a_cpu_machine_is_not_a_problem(monkeypatch, clean_env):
    simulate_no_gpu(monkeypatch, "unused", cuda=None)
    report = collect_env()
    assert report["diagnostics"] == []
    with pytest.raises(DeviceError, match="CPU-only build"):
        require_usable_cuda(report)


def test_gpus_that_cannot_run_code(clean_env):
    diagnostics: list[str] = []
    cuda = {"visible_devices": None, "driver_gpu_count": 2, "usable": False}
    broken = "CUDA error: no kernel image is available for execution on the device"
    gpus = [fake_gpu(0), fake_gpu(1, usable=False, error=broken)]
    env._diagnose_cuda(torch, cuda, gpus, None, diagnostics)
    assert cuda["usable"] is True and cuda["problem"] is None
    assert diagnostics == [f"GPU 1 (NVIDIA H100 80GB HBM3) cannot run CUDA code: {broken}"]
    gpus[0].update(usable=False, error=broken)
    env._diagnose_cuda(torch, cuda, gpus, None, [])
    assert cuda["usable"] is False
    assert cuda["problem"] == f"none of the 2 CUDA GPU(s) runs code: {broken}"


def test_gpu_probe_reads_properties_and_runs_a_kernel():
    props = SimpleNamespace(
        name="NVIDIA A100", uuid="GPU-1234", total_memory=40 * GIB, major=8, minor=0,
        multi_processor_count=108,
    )  # fmt: skip
    fake = SimpleNamespace(
        cuda=SimpleNamespace(
            get_device_properties=lambda i: props, mem_get_info=lambda i: (39 * GIB, 40 * GIB)
        ),
        device=lambda kind, index: "cpu",
        ones=lambda n, device: torch.ones(n),
    )
    info = env._gpu_info(fake, 0)
    assert info == {
        "index": 0,
        "name": "NVIDIA A100",
        "uuid": "GPU-1234",
        "total_memory_bytes": 40 * GIB,
        "free_memory_bytes": 39 * GIB,
        "compute_capability": "8.0",
        "multiprocessors": 108,
        "usable": True,
        "error": None,
    }

    def no_kernel(n, device):
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")

    fake.ones = no_kernel
    info = env._gpu_info(fake, 0)
    assert info["usable"] is False and info["error"].startswith("CUDA error: no kernel image")


def test_gpu_rows_and_require_cuda_success(runner, monkeypatch):
    report = collect_env()
    report["gpus"] = [fake_gpu(0)]
    report["cuda"].update(device_count=1, usable=True, problem=None, hint=None)
    require_usable_cuda(report)  # no error
    gpu_table = report_tables(report)[1]
    assert gpu_table.title == "GPUs"
    assert gpu_table.rows == [[0, "NVIDIA H100 80GB HBM3", 80.0, 79.5, "9.0", 132, True]]
    monkeypatch.setattr(env, "collect_env", lambda **options: report)
    result = runner.invoke(app, ["env", "--require-cuda"])
    assert result.exit_code == 0, result.stderr
    assert "NVIDIA H100 80GB HBM3" in result.stdout and "79.50" in result.stdout
    data = json.loads(runner.invoke(app, ["env", "--format", "json"]).stdout)
    assert data["gpus"][0]["total_memory_bytes"] == 80 * GIB


def test_torch_warnings_while_probing_become_diagnostics(monkeypatch, clean_env):
    def warn_and_fail():
        import warnings

        warnings.warn("Found GPU0 Tesla K80 of cuda capability 3.7.", UserWarning, stacklevel=1)
        warnings.warn("torch.cuda.something is deprecated", FutureWarning, stacklevel=1)
        return False

    monkeypatch.setattr(torch.cuda, "is_available", warn_and_fail)
    diagnostics = collect_env()["diagnostics"]
    assert "Found GPU0 Tesla K80 of cuda capability 3.7." in diagnostics
    assert not any("deprecated" in d for d in diagnostics)


def test_report_without_an_importable_torch(monkeypatch, runner, clean_env):
    """Which torch is installed was nowhere in the report when `import torch` failed, where a
    bug report needs it most: it is in `packages` and in the warning."""
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    report = collect_env()
    assert report["torch"] is None and report["gpus"] == []
    installed = importlib.metadata.version("torch")
    assert report["diagnostics"][0].startswith(f"torch {installed} cannot be imported: ")
    assert report["packages"]["torch"] == installed
    assert report["packages"]["numpy"] == np.__version__
    assert "Python executable" in runner.invoke(app, ["env"]).stdout
    result = runner.invoke(app, ["env", "--require-cuda"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        line for line in result.stderr.splitlines() if line.startswith("Error: ")
    ]
    assert result.stderr.startswith(f"Error: no usable CUDA GPU: torch {installed} cannot be")


def test_cudnn_version_formats():
    def fake(number, hip=None):
        return SimpleNamespace(
            backends=SimpleNamespace(cudnn=SimpleNamespace(version=lambda: number)),
            version=SimpleNamespace(hip=hip, cuda=None if hip else "12.4"),
        )

    # A ROCm build's torch.backends.cudnn is MIOpen, its version MAJOR*1000000 + MINOR*1000 +
    # PATCH: MIOpen 3.2.0 read as cuDNN "300.20.0".
    rocm = fake(3002000, hip="6.2.41133")
    assert (env._cudnn_version(rocm), env._miopen_version(rocm)) == (None, "3.2.0")
    assert env._miopen_version(fake(3004001, hip="6.4")) == "3.4.1"

    assert env._cudnn_version(fake(92600)) == "9.26.0"
    assert env._miopen_version(fake(92600)) is None  # a CUDA build
    assert env._cudnn_version(fake(90100)) == "9.1.0"
    assert env._cudnn_version(fake(8902)) == "8.9.2"
    assert env._cudnn_version(fake(None)) is None


# torchvision operators -------------------------------------------------------------------------


def test_torchvision_operators_work_here():
    assert check_torchvision_ops(torch) is None


def test_torchvision_operators_that_fail_to_load(monkeypatch, runner, clean_env):
    def broken(torch_module, spec):
        raise OSError("_C_stable.so: undefined symbol: _ZN3c1017RegisterOperators")

    monkeypatch.setattr(env, "_load_torchvision_ops", broken)
    version = importlib.metadata.version("torchvision")
    message = check_torchvision_ops(torch)
    assert message == (
        f"torchvision {version} cannot run its operators with torch {torch.__version__}: "
        "_C_stable.so: undefined symbol: _ZN3c1017RegisterOperators; "
        "install the torchvision release built for this torch"
    )
    assert message in collect_env()["diagnostics"]
    result = runner.invoke(app, ["env", "--format", "json"])
    assert result.exit_code == 0
    assert f"Warning: {message}" in result.stderr.splitlines()


def test_torchvision_operator_giving_wrong_results(monkeypatch):
    monkeypatch.setattr(env, "_load_torchvision_ops", lambda torch_module, spec: None)
    monkeypatch.setattr(
        torch.ops.torchvision, "nms", lambda boxes, scores, iou: torch.tensor([1, 0, 2])
    )
    assert "nms gave [1, 0, 2] instead of [0, 2]" in check_torchvision_ops(torch)


@pytest.mark.skipif(not CUDA_BUILD, reason="needs CUDA builds of torch and torchvision")
def test_torchvision_built_for_another_cuda(monkeypatch):
    built_for = int(torch.ops.torchvision._cuda_version())
    if built_for <= 0:
        pytest.skip("torchvision is a CPU build")
    other = "11.8" if built_for // 1000 != 11 else "12.4"
    monkeypatch.setattr(torch.version, "cuda", other)
    message = check_torchvision_ops(torch)
    assert message.startswith(f"torchvision {importlib.metadata.version('torchvision')} was built ")
    assert f"CUDA {built_for // 1000}.x but torch {torch.__version__} for CUDA {other}" in message


# A real process --------------------------------------------------------------------------------


def test_real_process_report_is_fast_path_json(tmp_path):
    """`python -m torchkit env` end to end: JSON on stdout, problems on stderr, the exit code of
    --require-cuda, and torchvision's operators checked without importing torchvision.models."""
    environment = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "torchkit", "env", "--format", "json",
         "--require-cuda"],
        capture_output=True, text=True, env=environment, timeout=300,
    )  # fmt: skip
    messages = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "torchvision.models" not in imported and "sklearn" not in imported
    assert not any("torchvision" in message for message in messages)  # operators load
    if torch.cuda.is_available():
        assert done.returncode == 0
        assert json.loads(done.stdout)["torch"]["version"] == torch.__version__
    else:
        assert done.returncode == 1 and done.stdout == ""
        assert len(messages) == 1 and messages[0].startswith("Error: no usable CUDA GPU: ")


@pytest.mark.cuda
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA GPU")
def test_require_cuda_passes_on_a_gpu_machine(runner, clean_env):
    result = runner.invoke(app, ["env", "--require-cuda", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["cuda"]["usable"] and data["gpus"][0]["usable"]
    assert data["gpus"][0]["total_memory_bytes"] == torch.cuda.get_device_properties(0).total_memory
