"""`torchkit env` against `python -m torch.utils.collect_env`, which it replaces: every field
both report agrees, field by field, on this machine (`get_env_info()` called once, in-process,
beside `torchkit env --format json`); and what collect_env reports that env does not is only
what docs/commands/env.md's "Against collect_env" says it leaves out."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shutil
import sys

import pytest
import torch
import torch.utils.collect_env as collect_env
from typer.testing import CliRunner

from torchkit.cli import app
from torchkit.core import env

# Set for both reports: collect_env reads these three as its "caching allocator config".
ALLOCATOR_CONF = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


@pytest.fixture(scope="module")
def reports() -> tuple[dict, object]:
    """(`torchkit env --format json`'s report, collect_env's SystemEnv), with the same
    environment. collect_env takes about 0.15 s in-process (its subprocesses: lscpu, gcc,
    nvcc, nvidia-smi, pip and conda where they exist), so it runs once for the module."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
            patch.delenv(name, raising=False)
        for name, value in ALLOCATOR_CONF.items():
            patch.setenv(name, value)
        result = CliRunner().invoke(app, ["env", "--format", "json"])
        assert result.exit_code == 0, result.stderr
        # collect_env sets PIP_DISABLE_PIP_VERSION_CHECK for the rest of the process: the
        # module's environment is put back when it ends (conftest's module_environment_kept).
        info = collect_env.get_env_info()
    return json.loads(result.stdout), info


def na(value: str | None) -> str | None:
    """collect_env's "N/A" (and None) as env's null."""
    return None if value in (None, "N/A") else value


def test_torch_build_fields(reports):
    report, info = reports
    build = report["torch"]
    assert build["version"] == info.torch_version
    assert str(build["debug_build"]) == info.is_debug_build
    # collect_env says "N/A" for CUDA on a ROCm build, as env says null
    assert build["cuda_version"] == na(info.cuda_compiled_version)
    assert build["hip_version"] == na(info.hip_compiled_version)
    assert build["rocm_version"] == na(info.rocm_compiled_version)
    if na(info.miopen_runtime_version):  # torch's config line "MIOpen 3.2.0"
        assert build["miopen_version"] == info.miopen_runtime_version
    else:
        assert build["miopen_version"] is None
    assert str(build["cuda_available"]) == info.is_cuda_available
    # collect_env adds the Intel GPUs' driver and models on further lines where there is one
    assert str(build["xpu_available"]) == info.is_xpu_available.splitlines()[0]
    assert str(build["xnnpack"]) == info.is_xnnpack_available


def test_python_and_platform_fields(reports):
    report, info = reports
    python, system = report["python"], report["platform"]
    # "3.11.7 (main, May  9 2026, 07:35:25) [GCC 12.2.0] (64-bit runtime)"
    assert info.python_version.startswith(python["version"] + " ")
    assert info.python_version.endswith(f"({sys.maxsize.bit_length() + 1}-bit runtime)")
    assert system["description"] == info.python_platform
    if sys.platform.startswith("linux"):
        # "glibc-2.36" and "glibc 2.36": platform.libc_ver() both
        assert system["libc"] == info.libc_version.replace("-", " ", 1)
        # collect_env: lsb_release's description, else PRETTY_NAME, with the machine after it
        if info.os and not info.os.startswith("linux ("):
            assert info.os == f"{system['os']} ({system['machine']})"
    elif sys.platform == "darwin" and info.os:
        assert info.os == f"{system['os']} ({platform.machine()})"


def test_compilers(reports):
    """collect_env's gcc is the system's C compiler; env's is the C++ compiler torch.compile
    runs ($CXX, else g++): the same GCC release where both come from one distribution."""
    report, info = reports
    compiler = report["platform"]["compiler"]
    if info.gcc_version and compiler and compiler.startswith("g++ ") and not os.environ.get("CXX"):
        assert compiler.split()[-1] == info.gcc_version.split()[-1]  # "12.2.0"
    # what collect_env leaves out: the compiler torch itself was built with
    assert report["torch"]["build_compiler"] == env.build_compiler(torch.__config__.show())


def test_caching_allocator_config(reports):
    report, info = reports
    variables = report["environment"]
    assert info.caching_allocator_config == ALLOCATOR_CONF
    names = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    assert {name: variables[name] for name in names if variables[name]} == ALLOCATOR_CONF


def test_cuda_module_loading(reports):
    """collect_env reads CUDA_MODULE_LOADING after initialising CUDA, which sets it to LAZY
    where it was unset: it reports torch's default as the user's setting. env reports what the
    user set (null when unset)."""
    report, info = reports
    loading = report["environment"]["CUDA_MODULE_LOADING"]
    if na(info.cuda_module_loading) is None:
        assert not report["torch"]["cuda_available"]
    else:
        assert loading in (None, info.cuda_module_loading)


def test_driver_and_gpus(reports):
    """nvidia-smi's driver and GPU list against NVML's and torch's."""
    report, info = reports
    cuda = report["cuda"]
    if info.nvidia_driver_version is not None:
        assert cuda["driver_version"] == info.nvidia_driver_version
    if info.nvidia_gpu_models and not torch.version.hip and sys.platform != "darwin":
        # "GPU 0: NVIDIA H200" per GPU the driver sees (nvidia-smi ignores CUDA_VISIBLE_DEVICES)
        listed = re.findall(r"^GPU \d+: (.+)$", info.nvidia_gpu_models, re.MULTILINE)
        assert len(listed) == cuda["driver_gpu_count"]
        assert {gpu["name"] for gpu in report["gpus"]} <= set(listed)
    if not report["torch"]["cuda_available"]:
        assert report["gpus"] == []


def test_cudnn(reports):
    """collect_env lists the libcudnn files `ldconfig -p` finds (none on this machine: torch's
    wheel brings its own in nvidia-cudnn-cu13); env gives the version torch loads."""
    report, info = reports
    version = report["torch"]["cudnn_version"]
    number = torch.backends.cudnn.version() if torch.version.cuda else None
    assert (version is None) == (not number)
    if version:
        wheels = {
            name: value
            for name, value in report["cuda_packages"].items()
            if name.startswith("nvidia-cudnn")
        }
        # the wheel torch loads (its CUDA major), where cuDNN came as one
        major = torch.version.cuda.split(".")[0]
        loaded = wheels.get(f"nvidia-cudnn-cu{major}")
        if loaded:
            assert loaded.startswith(version + ".")
    if info.cudnn_version and "\n" not in info.cudnn_version:
        assert os.path.basename(info.cudnn_version).startswith("libcudnn")


def test_cpu_fields_against_lscpu(reports):
    report, info = reports
    if not sys.platform.startswith("linux") or not info.cpu_info.startswith("Architecture"):
        pytest.skip("collect_env runs lscpu on Linux only")
    fields = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in info.cpu_info.splitlines())
    )
    cpu = report["cpu"]
    if "Model name" in fields and platform.machine() in ("x86_64", "AMD64"):
        assert cpu["model"] == fields["Model name"]
    # os.cpu_count() counts the CPUs online, lscpu's "CPU(s)" those present too
    online = fields.get("On-line CPU(s) list")
    if online:
        ranges = [[int(n) for n in part.split("-")] for part in online.split(",")]
        assert cpu["logical_cores"] == sum(r[-1] - r[0] + 1 for r in ranges)
    else:
        assert cpu["logical_cores"] == int(fields["CPU(s)"])
    if "NUMA node(s)" in fields and cpu["numa_nodes"] is not None:
        assert cpu["numa_nodes"] == int(fields["NUMA node(s)"])
    # torch's features (what picks its kernels) are among the flags lscpu lists, by the
    # kernel's names: avx512_f is avx512f, Arm's neon asimd
    flags = set(fields.get("Flags", "").split())
    kernel_names = {"avx512_f": "avx512f", "neon": "asimd", "sve_bf16": "svebf16"}
    if flags:
        features = report["torch"]["cpu_features"] or []
        assert {kernel_names.get(name, name) for name in features} <= flags


def pip_list() -> str | None:
    """collect_env's `pip list` lines, its patterns applied; where pip is not installed (uv's
    environments have none: collect_env says "[pip3] Could not collect"), the same lines from
    `uv pip list`, given to collect_env's own filter."""
    without_pip = importlib.util.find_spec("pip") is None

    def run(command):
        if without_pip and shutil.which("uv") and command[1:3] == ["-mpip", "list"]:
            command = ["uv", "pip", "list", "--format=freeze", "--python", sys.executable]
        return collect_env.run(command)

    return collect_env.get_pip_packages(run)[1]


def test_pip_packages_have_the_same_versions(reports):
    """Each package collect_env's `pip list` lines name that env reports has the same version
    there; every NVIDIA and Intel library among them, and torch, numpy, triton, optree and
    onnx, env reports."""
    report, _ = reports
    lines = pip_list()
    if lines is None:
        pytest.skip("neither pip nor uv can list this environment's packages")
    listed = {}
    for line in lines.splitlines():
        name, _, version = line.partition("==")
        if version:
            listed[re.sub(r"[-_.]+", "-", name).lower()] = version
    by_distribution = {
        distribution: report["packages"][key]
        for key, distributions in env.PACKAGES
        for distribution in distributions
    }
    reported = {**by_distribution, **report["cuda_packages"], **report["intel_packages"]}
    compared = {name: version for name, version in listed.items() if name in reported}
    assert {name: reported[name] for name in compared} == compared
    must = {"torch", "numpy", "triton", "optree", "onnx"}
    missing = {
        name
        for name in listed
        if name in must or name.startswith("nvidia-") or name in env.INTEL_PACKAGES
    } - set(compared)
    assert missing == set()
    assert "torch" in compared and "numpy" in compared


def test_conda_packages(reports):
    """collect_env's `conda list` lines against env's conda-meta records, in a conda
    environment. (`conda list` lists the active environment's, CONDA_PREFIX's, which need not
    be the one Python runs in: a venv made from conda's Python; env reads sys.prefix's.)"""
    report, info = reports
    prefix = os.environ.get("CONDA_PREFIX")
    in_conda = report["python"]["environment"] == "conda"
    if not (info.conda_packages and in_conda and prefix and os.path.samefile(prefix, sys.prefix)):
        assert in_conda or report["conda_packages"] == {}
        pytest.skip("Python does not run in the active conda environment")
    for line in info.conda_packages.splitlines():
        name, version, build, *channel = line.split()
        if channel == ["pypi"]:  # pip's, in `packages`
            continue
        if any(part in name.lower() for part in env.CONDA_NAME_PARTS):
            assert report["conda_packages"][name] == f"{version} {build}"
