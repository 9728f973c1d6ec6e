"""`torchkit env`: what this machine offers PyTorch, as a plain dict, and what is wrong with it.

Everything is read in-process (no pip or conda subprocess): package versions come from
`importlib.metadata`, the NVIDIA driver from NVML through ctypes, and torchvision's operators are
checked by loading its extension library, which is much faster than importing torchvision (whose
`models` package pulls in torch._dynamo).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.machinery
import importlib.util
import logging
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import sysconfig
import warnings
from typing import Any

from torchkit import __version__
from torchkit.core.io.errors import DeviceError, first_line
from torchkit.core.io.redaction import is_secret_name
from torchkit.core.runtime.cpus import cgroup_cpu_quota, usable_cpus
from torchkit.core.runtime.extras import installed_version

logger = logging.getLogger("torchkit")

# Report key -> distributions that provide it (the first one installed wins).
PACKAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # torch's record says which torch is installed also where `import torch` fails.
    ("torch", ("torch",)),
    ("torchvision", ("torchvision",)),
    ("numpy", ("numpy",)),
    ("pillow", ("pillow", "pillow-simd")),
    (
        "opencv",
        (
            "opencv-python-headless",
            "opencv-python",
            "opencv-contrib-python-headless",
            "opencv-contrib-python",
        ),
    ),
    ("pandas", ("pandas",)),
    ("scikit_learn", ("scikit-learn",)),
    ("typer", ("typer",)),
    ("rich", ("rich",)),
    ("safetensors", ("safetensors",)),
    ("matplotlib", ("matplotlib",)),
    ("tensorboard", ("tensorboard",)),
    ("onnx", ("onnx",)),  # export --format onnx
    (
        "onnxruntime",  # export's check and predict of .onnx models
        ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml"),
    ),
    ("timm", ("timm",)),  # timm/ model names
    # torch.utils._pytree's faster C++ trees, which torch.compile and torch.export use when
    # installed (collect_env lists it among torch's own)
    ("optree", ("optree",)),
    ("triton", ("triton", "pytorch-triton", "pytorch-triton-rocm", "triton-windows")),  # --compile
)

# Environment variables that change how torch runs (threads, CUDA, the caching allocator): a bug
# report needs them as much as the versions. CUDA_VISIBLE_DEVICES is in the `cuda` section.
ENVIRONMENT_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_MODULE_LOADING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "CUBLAS_WORKSPACE_CONFIG",
    "NCCL_DEBUG",
)
# Any other variable set with one of these prefixes is reported too (NCCL_P2P_DISABLE or
# NCCL_SOCKET_IFNAME for a DDP hang, CUDA_DEVICE_ORDER for GPU numbering, TORCH_LOGS,
# TORCHINDUCTOR_*, HIP_VISIBLE_DEVICES; ATEN_CPU_CAPABILITY, which lowers the CPU kernels torch
# picks, ONEDNN_DEFAULT_FPMATH_MODE, NVIDIA_TF32_OVERRIDE and TRITON_* numbers and speed,
# LD_PRELOAD an allocator or OpenMP runtime loaded ahead of torch's, TORCHKIT_* torchkit's own,
# HF_HUB_OFFLINE and HF_HOME timm's weights, XDG_CACHE_HOME where the caches go), but never one
# whose name says it holds a secret (HF_TOKEN, NCCL_PASSWD: `is_secret_name`, as URLs' are).
ENVIRONMENT_PREFIXES = (
    "OMP_", "KMP_", "GOMP_", "MKL_", "CUDA_", "CUBLAS", "CUDNN_", "NCCL_", "TORCH_",
    "TORCHINDUCTOR_", "PYTORCH_", "HIP_", "ROCR_", "HSA_", "MIOPEN_", "ATEN_", "ONEDNN_", "DNNL_",
    "TRITON_", "NVIDIA_TF32_OVERRIDE", "LD_PRELOAD", "TORCHKIT_", "HF_HUB_", "HF_HOME",
    "XDG_CACHE_HOME",
)  # fmt: skip

# torchvision's C++ operator library has been called `_C` and, in newer releases, `_C_stable`.
_TORCHVISION_LIBRARIES = ("_C_stable", "_C")


def collect_env(*, log_diagnostics: bool = True) -> dict[str, Any]:
    """The environment report. Problems found are in `diagnostics`, and logged as warnings
    unless `log_diagnostics` is False (the caller reports them)."""
    diagnostics: list[str] = []
    report: dict[str, Any] = {
        "torchkit_version": __version__,
        "python": python_info(),
        "platform": platform_info(),
        "cpu": cpu_info(),
        "environment": torch_environment(),
    }
    report.update(_torch_sections(diagnostics))
    report["packages"] = package_versions()
    report["cuda_packages"] = cuda_packages()
    report["intel_packages"] = intel_packages()
    report["conda_packages"] = conda_packages()
    report["diagnostics"] = diagnostics
    if log_diagnostics:
        for message in diagnostics:
            logger.warning(message)
    return report


def torch_environment() -> dict[str, str | None]:
    """ENVIRONMENT_VARIABLES (None when not set), then the other variables set that start with
    one of ENVIRONMENT_PREFIXES, by name."""
    report: dict[str, str | None] = {name: os.environ.get(name) for name in ENVIRONMENT_VARIABLES}
    for name in sorted(os.environ):
        if (
            name.startswith(ENVIRONMENT_PREFIXES)
            and name not in report
            and name != "CUDA_VISIBLE_DEVICES"  # the `cuda` section's
            and not is_secret_name(name)
        ):
            report[name] = os.environ[name]
    return report


def require_usable_cuda(report: dict[str, Any]) -> None:
    """Raise DeviceError unless the report found at least one CUDA GPU that runs code."""
    cuda = report["cuda"]
    if cuda["usable"]:
        return
    problem = cuda["problem"] or "no CUDA GPU found"
    raise DeviceError(f"no usable CUDA GPU: {problem}", cuda.get("hint") or "see `torchkit env`")


def python_info() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        # A free-threaded (no-GIL) build takes its own torch wheels (cp313t).
        "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        "executable": sys.executable,
        "environment": python_environment(),
        "torch_installer": installer("torch"),
    }


def python_environment(prefix: str | None = None, base_prefix: str | None = None) -> str:
    """What Python runs in: "conda" (a conda environment, whose MKL and OpenMP may clash with
    those of torch's pip wheels), "venv" (uv's, virtualenv's, `python -m venv`'s) or "system"."""
    prefix = sys.prefix if prefix is None else prefix
    base_prefix = sys.base_prefix if base_prefix is None else base_prefix
    if os.path.isdir(os.path.join(prefix, "conda-meta")):
        return "conda"
    return "venv" if os.path.realpath(prefix) != os.path.realpath(base_prefix) else "system"


def installer(distribution: str) -> str | None:
    """The tool that installed `distribution` (its record's INSTALLER: pip, uv, conda...);
    None when it is not installed or its record does not say."""
    import importlib.metadata

    try:
        text = importlib.metadata.distribution(distribution).read_text("INSTALLER")
    except Exception:  # not installed, or a broken record
        return None
    words = (text or "").split()
    return words[0] if words else None


def platform_info() -> dict[str, Any]:
    libc, libc_version = platform.libc_ver()
    return {
        "system": platform.system(),
        "os": os_name(),
        "release": platform.release(),
        "machine": platform.machine(),
        "libc": f"{libc} {libc_version}" if libc else None,
        "description": platform.platform(),
        "compiler": cxx_compiler(),
    }


# Seconds a command asked for a version may take: a hung or fake one never holds up the report.
COMMAND_TIMEOUT_S = 5.0


def cxx_compiler() -> str | None:
    """The first line of `--version` of the C++ compiler torch.compile builds CPU code with
    (TorchInductor's choice: $CXX, else g++, clang++ on macOS); None where it does not run,
    where `torch.compile` on the CPU fails. (Not looked for on Windows, whose cl has no
    --version.)"""
    if sys.platform == "win32":
        return None
    command = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    try:
        arguments = shlex.split(command)
    except ValueError:
        return None
    lines = command_output([*arguments, "--version"]).splitlines() if arguments else []
    return lines[0].strip() if lines and lines[0].strip() else None


def command_output(arguments: list[str]) -> str:
    """What `arguments` print on stdout when they exit with 0 within COMMAND_TIMEOUT_S, else "".
    The command runs in a session of its own, ended whole at the timeout: a child it started
    that keeps the pipe open cannot make the report wait for it."""
    try:
        process = subprocess.Popen(
            arguments,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except (OSError, ValueError):
        return ""
    try:
        output, _ = process.communicate(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        if hasattr(os, "killpg"):
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
        process.kill()
        if process.stdout is not None:
            process.stdout.close()
        process.wait()
        return ""
    return output.decode(errors="replace") if process.returncode == 0 else ""


def os_name() -> str | None:
    """The operating system as people name it ("Ubuntu 22.04.4 LTS", "macOS 14.5", "Windows 11
    (10.0.22631)"): a Linux kernel's version does not say which distribution runs on it."""
    if sys.platform.startswith("linux"):
        try:
            release = platform.freedesktop_os_release()
        except OSError:
            return None
        return release.get("PRETTY_NAME") or release.get("NAME")
    if sys.platform == "darwin":
        version = platform.mac_ver()[0]
        return f"macOS {version}" if version else "macOS"
    if sys.platform == "win32":
        return f"Windows {platform.release()} ({platform.version()})"
    return None


def cpu_info() -> dict[str, Any]:
    return {
        "model": cpu_name(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cpus(),
        "quota": cgroup_cpu_quota(),
        "numa_nodes": numa_nodes(),
    }


def numa_nodes(nodes: str = "/sys/devices/system/node") -> int | None:
    """How many NUMA nodes Linux lists (a two-socket server: 2); None where it lists none."""
    try:
        count = sum(1 for name in os.listdir(nodes) if re.fullmatch(r"node[0-9]+", name))
    except OSError:
        return None
    return count or None


CPUINFO = "/proc/cpuinfo"


def cpu_model() -> str:
    """The CPU's name, else its architecture ("x86_64 CPU"): for a label that must say
    something (benchmark's device name)."""
    return cpu_name() or f"{platform.machine() or 'unknown'} CPU"


def cpu_name() -> str | None:
    """The CPU's name; None where the system does not say (`/proc/cpuinfo` unreadable): never
    the machine's architecture in the name's place."""
    if sys.platform.startswith("linux"):
        try:
            with open(CPUINFO, encoding="utf-8", errors="replace") as handle:
                model = cpuinfo_model(handle.read())
            if model:
                return model
        except OSError:
            pass
    elif sys.platform == "darwin":
        brand = command_output(["sysctl", "-n", "machdep.cpu.brand_string"]).strip()
        if brand:
            return brand
    elif sys.platform == "win32":
        return platform.processor() or None  # "Intel64 Family 6 Model 85 Stepping 7, ..."
    return None


# Arm CPUs name themselves only by numbers in /proc/cpuinfo (implementer, part); the names of
# those PyTorch runs on (Graviton, Grace, Ampere, Kunpeng, A64FX, Jetson, Raspberry Pi), as
# lscpu names them. Others read as "<implementer> part 0x...".
ARM_IMPLEMENTERS = {
    "0x41": "ARM", "0x42": "Broadcom", "0x43": "Cavium", "0x46": "Fujitsu", "0x48": "HiSilicon",
    "0x4e": "NVIDIA", "0x50": "APM", "0x51": "Qualcomm", "0x53": "Samsung", "0x61": "Apple",
    "0x6d": "Microsoft", "0xc0": "Ampere",
}  # fmt: skip
ARM_PARTS = {
    ("0x41", "0xd03"): "Cortex-A53", ("0x41", "0xd05"): "Cortex-A55",
    ("0x41", "0xd07"): "Cortex-A57", ("0x41", "0xd08"): "Cortex-A72",
    ("0x41", "0xd09"): "Cortex-A73", ("0x41", "0xd0a"): "Cortex-A75",
    ("0x41", "0xd0b"): "Cortex-A76", ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd0d"): "Cortex-A77", ("0x41", "0xd40"): "Neoverse-V1",
    ("0x41", "0xd41"): "Cortex-A78", ("0x41", "0xd42"): "Cortex-A78AE",
    ("0x41", "0xd44"): "Cortex-X1", ("0x41", "0xd46"): "Cortex-A510",
    ("0x41", "0xd47"): "Cortex-A710", ("0x41", "0xd48"): "Cortex-X2",
    ("0x41", "0xd49"): "Neoverse-N2", ("0x41", "0xd4a"): "Neoverse-E1",
    ("0x41", "0xd4f"): "Neoverse-V2", ("0x41", "0xd80"): "Cortex-A520",
    ("0x41", "0xd81"): "Cortex-A720", ("0x41", "0xd82"): "Cortex-X4",
    ("0x41", "0xd84"): "Neoverse-V3", ("0x41", "0xd8e"): "Neoverse-N3",
    ("0x46", "0x001"): "A64FX", ("0x48", "0xd01"): "Kunpeng-920",
    ("0x4e", "0x004"): "Carmel", ("0xc0", "0xac3"): "Ampere-1", ("0xc0", "0xac4"): "Ampere-1a",
}  # fmt: skip


def cpuinfo_model(text: str) -> str | None:
    """The CPU's name in the text of /proc/cpuinfo: x86's "model name", POWER's "cpu", an Arm
    core's name from its implementer and part numbers (what lscpu shows), older Arm kernels'
    "Processor" or "Hardware"; None when it names none."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields.setdefault(key.strip(), value.strip())
    for key in ("model name", "cpu model", "cpu"):  # x86 (and LoongArch, MIPS), POWER
        if fields.get(key):
            return fields[key]
    implementer = fields.get("CPU implementer", "").lower()
    part = fields.get("CPU part", "").lower()
    vendor = ARM_IMPLEMENTERS.get(implementer, f"implementer {implementer}")
    if (implementer, part) in ARM_PARTS:
        return f"{vendor} {ARM_PARTS[implementer, part]}"
    named = fields.get("Processor") or fields.get("Hardware")
    if named or not (implementer and part):
        return named or None
    return f"{vendor} part {part}"  # the numbers lscpu or the vendor's tables can name


def package_versions() -> dict[str, str | None]:
    """Installed versions (None: not installed), from metadata, without importing anything."""
    return {key: installed_version(*distributions) for key, distributions in PACKAGES}


def cuda_packages(path: list[str] | None = None) -> dict[str, str]:
    """The NVIDIA libraries installed as Python packages (nvidia-cublas, nvidia-cudnn-cu13,
    nvidia-nccl-cu13...: those torch's CUDA wheels load), name -> version, by name, as
    collect_env lists them from `pip list`: a cuDNN or cuBLAS of another CUDA major left by an
    upgrade shows here. Read from the install records (`nvidia_*.dist-info`) in the folders of
    `path` (sys.path by default), the first of each name; a broken record is passed over. Only
    those records are read: reading every package's takes a third of a second."""
    return _library_packages(path, r"nvidia[-_.]", lambda name: name.startswith("nvidia-"))


# The Intel oneAPI runtime libraries installed as Python packages, as collect_env names them:
# torch's XPU wheels load the SYCL and compiler runtimes, its Windows wheels MKL and
# intel-openmp; an MKL or OpenMP of another release ahead of torch's breaks it at import.
INTEL_PACKAGES = frozenset(
    {
        "dpcpp-cpp-rt", "intel-cmplr-lib-rt", "intel-cmplr-lib-ur", "intel-cmplr-lic-rt",
        "intel-opencl-rt", "intel-sycl-rt", "mkl", "intel-openmp", "tbb", "impi-rt",
        "impi-devel", "oneccl", "oneccl-devel", "intel-pti", "umf", "tcmlib",
    }
)  # fmt: skip


def intel_packages(path: list[str] | None = None) -> dict[str, str]:
    """The Intel oneAPI libraries installed as Python packages (mkl, intel-openmp, tbb,
    intel-sycl-rt, onemkl-sycl-blas...), name -> version, by name, read as cuda_packages reads
    the NVIDIA ones: only their own install records."""
    return _library_packages(
        path,
        r"(?:mkl|onemkl|intel|dpcpp|tbb|impi|oneccl|umf|tcmlib)[-_.]",
        lambda name: name in INTEL_PACKAGES or name.startswith("onemkl-sycl-"),
    )


# The conda packages of torch's kind, by parts of their names as collect_env picks them from
# `conda list`: torch itself, the CUDA toolkit and its libraries, the BLAS and OpenMP that conda
# links numpy and torch against (a conda-forge libblas of MKL or OpenBLAS, llvm-openmp), MAGMA.
CONDA_NAME_PARTS = (
    "torch", "numpy", "triton", "optree", "cuda", "cudnn", "nccl", "cublas", "cufft",
    "curand", "cusolver", "cusparse", "nvjitlink", "nvtx", "magma", "mkl", "blas", "lapack",
    "openmp", "tbb", "intel", "dpcpp",
)  # fmt: skip


def conda_packages(prefix: str | None = None) -> dict[str, str]:
    """The conda packages of torch's kind installed in the conda environment at `prefix`
    (sys.prefix by default), name -> "version build" ("2.5.1 py3.11_cuda12.4_cudnn9.1.0_0":
    the build says CUDA or CPU, MKL or OpenBLAS), by name; {} outside a conda environment. Read
    from the names of the environment's records (conda-meta/NAME-VERSION-BUILD.json), without
    running conda: collect_env runs `conda list` for them. A conda package that installs a
    Python package is in `packages` too, as its install record says."""
    folder = os.path.join(sys.prefix if prefix is None else prefix, "conda-meta")
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    found: dict[str, str] = {}
    for record in names:
        parts = record.removesuffix(".json").rsplit("-", 2) if record.endswith(".json") else []
        if len(parts) == 3 and any(part in parts[0].lower() for part in CONDA_NAME_PARTS):
            found[parts[0]] = f"{parts[1]} {parts[2]}"
    return dict(sorted(found.items()))


def _library_packages(path: list[str] | None, record_start: str, wanted) -> dict[str, str]:
    """name -> version of the install records (`*.dist-info`, `*.egg-info`) whose folder name
    starts with `record_start` (a regular expression) and whose normalised name `wanted`
    accepts, in the folders of `path` (sys.path by default), the first of each name."""
    import importlib.metadata
    import pathlib

    pattern = re.compile(record_start + r".*\.(?:dist|egg)-info$", re.IGNORECASE)
    found: dict[str, str] = {}
    for folder in sys.path if path is None else path:
        try:
            names = sorted(os.listdir(folder or "."))
        except (OSError, TypeError, ValueError):
            continue
        for record in names:
            if not pattern.match(record):
                continue
            distribution = importlib.metadata.PathDistribution(pathlib.Path(folder or ".", record))
            try:
                # .get: a missing field by [] is deprecated (Python 3.12), a KeyError to come
                metadata = distribution.metadata
                name = re.sub(r"[-_.]+", "-", metadata.get("Name") or "").lower()
                version = metadata.get("Version")
            except Exception:  # a record without METADATA, not UTF-8, unreadable
                continue
            if wanted(name) and version and name not in found:
                found[name] = str(version)
    return dict(sorted(found.items()))


def nvidia_driver() -> tuple[str | None, int | None]:
    """(driver version, GPUs the driver sees) from NVML, which ignores CUDA_VISIBLE_DEVICES;
    (None, None) when there is no NVIDIA driver."""
    names = {"win32": ("nvml.dll",), "linux": ("libnvidia-ml.so.1", "libnvidia-ml.so")}
    for name in names.get("linux" if sys.platform.startswith("linux") else sys.platform, ()):
        try:
            nvml = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            if nvml.nvmlInit_v2() != 0:
                return None, None
        except AttributeError:
            return None, None
        try:
            buffer = ctypes.create_string_buffer(96)
            version = None
            if nvml.nvmlSystemGetDriverVersion(buffer, ctypes.c_uint(96)) == 0:
                version = buffer.value.decode(errors="replace")
            count = ctypes.c_uint(0)
            gpus = count.value if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else None
            return version, gpus
        finally:
            nvml.nvmlShutdown()
    return None, None


# The CUDA driver library (libcuda), which torch loads to run CUDA code.
CUDA_DRIVER_LIBRARIES = {"win32": ("nvcuda.dll",), "linux": ("libcuda.so.1", "libcuda.so")}


def cuda_driver_version(names: tuple[str, ...] | None = None) -> str | None:
    """The newest CUDA version the installed driver supports ("12.4": nvidia-smi's "CUDA
    Version"), from cuDriverGetVersion, which needs no cuInit: no context is made and no GPU
    touched, so it costs a library load. None where there is no driver (no libcuda). `names`:
    the libraries to try (CUDA_DRIVER_LIBRARIES for this system by default)."""
    if names is None:
        system = "linux" if sys.platform.startswith("linux") else sys.platform
        names = CUDA_DRIVER_LIBRARIES.get(system, ())
    for name in names:
        try:
            library = ctypes.CDLL(name)
            version = ctypes.c_int(0)
            if library.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value <= 0:
                return None
        except (OSError, AttributeError):  # not there; a library without the function
            continue
        return f"{version.value // 1000}.{version.value % 1000 // 10}"  # 12040 -> 12.4
    return None


# Where Linux lists the PCI devices: an NVIDIA GPU is there (vendor 0x10de, a display
# controller: class 0x03....) whether or not its driver is installed.
PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_PCI_VENDOR = "0x10de"
# A GPU on no PCI bus: WSL's (through this device) and a Jetson's (this board says "tegra").
WSL_GPU_DEVICE = "/dev/dxg"
DEVICE_TREE_COMPATIBLE = "/proc/device-tree/compatible"


def nvidia_pci_gpus(devices: str | None = None) -> int | None:
    """How many NVIDIA GPUs the PCI bus lists, driver or not: 0 on a machine without one, where
    a CUDA build of torch finding no driver is no problem (the default Linux wheel on a laptop
    or a CPU server). None where the bus cannot tell: not Linux, no readable list, WSL (its GPU
    comes through /dev/dxg, not the PCI bus) or a Jetson (an integrated GPU, on no PCI bus)."""
    if not sys.platform.startswith("linux") or os.path.exists(WSL_GPU_DEVICE):
        return None
    with contextlib.suppress(OSError), open(DEVICE_TREE_COMPATIBLE, "rb") as handle:
        if b"nvidia,tegra" in handle.read():
            return None
    devices = PCI_DEVICES if devices is None else devices
    try:
        names = os.listdir(devices)
    except OSError:
        return None
    count = 0
    for name in names:
        try:
            with open(os.path.join(devices, name, "vendor"), encoding="ascii") as handle:
                vendor = handle.read().strip().lower()
            with open(os.path.join(devices, name, "class"), encoding="ascii") as handle:
                device_class = handle.read().strip().lower()
        except (OSError, ValueError):
            return None  # a device the bus does not describe: it cannot say there is none
        count += vendor == NVIDIA_PCI_VENDOR and device_class.startswith("0x03")
    return count if names else None


def visible_device_entries(value: str, driver_gpus: int | None = None) -> list[str]:
    """The devices CUDA_VISIBLE_DEVICES lets through, in order, read as the CUDA runtime reads
    it (PyTorch's `torch.cuda._parse_visible_devices` mirrors the same rule).

    A comma-separated list that ends at the first invalid entry: "0,1,-1,2" and "0,1,abc,2"
    give 0 and 1, and "", "-1" and "none" nothing. An index entry is read like strtoul: leading
    blanks skipped, then the leading digits ("1gpu" is 1); one that does not start with a digit
    (after an optional sign) or is negative is invalid, and so is an index at or past the
    driver's GPU count (`driver_gpus`, when known: "0,5,1" on two GPUs gives 0). A list that
    starts with a GPU- or MIG- UUID takes UUIDs of that kind only, so an index or the other kind
    of UUID ends it. A device listed twice makes the whole list select nothing. Indices come
    back as plain numbers ("01" as "1"), UUIDs as written.
    """
    items = value.split(",")
    first = items[0].strip()
    prefix = next((p for p in ("GPU-", "MIG-") if first.startswith(p)), None)
    entries: list[str] = []
    for item in items:
        if prefix is not None:
            entry = item.strip()
            if not entry.startswith(prefix):
                break
        else:
            number = _leading_number(item)
            if number is None or number < 0 or (driver_gpus and number >= driver_gpus):
                break
            entry = str(number)
        if entry in entries:
            return []  # a repeated device: CUDA then sees none at all
        entries.append(entry)
    return entries


def _leading_number(text: str) -> int | None:
    """The integer strtoul would read at the start of `text` (None where it reads nothing)."""
    match = re.match(r"\s*([+-]?[0-9]+)", text)
    return int(match.group(1)) if match else None


def _torch_sections(diagnostics: list[str]) -> dict[str, Any]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    driver_version, driver_gpus = nvidia_driver()
    cuda: dict[str, Any] = {
        "visible_devices": visible,
        "driver_version": driver_version,
        "driver_cuda_version": cuda_driver_version(),
        "driver_gpu_count": driver_gpus,
        "pci_gpu_count": nvidia_pci_gpus(),
        "device_count": 0,
        "usable": False,
        "problem": None,
        "hint": None,
    }
    try:
        import torch
    except Exception as error:  # a broken install must still give a report
        installed = installed_version("torch")
        which = f"torch {installed}" if installed else "torch"
        message = f"{which} cannot be imported: {first_line(error)}"
        diagnostics.append(message)
        cuda.update(problem=message, hint="reinstall torch")
        return {"torch": None, "distributed": None, "cuda": cuda, "gpus": []}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch_section = _torch_build(torch)
        gpus, init_error = _probe_gpus(torch)
        distributed = _distributed(torch)
    cuda["device_count"] = len(gpus)
    _diagnose_cuda(torch, cuda, gpus, init_error, diagnostics)
    # What torch itself warned about while probing (an unsupported GPU, say) matters too.
    for warning in caught:
        if issubclass(warning.category, (DeprecationWarning, FutureWarning)):
            continue  # about torch's API, not about this machine
        message = first_line(warning.message)
        if message and message not in diagnostics:
            diagnostics.append(message)
    torchvision_problem = check_torchvision_ops(torch)
    if torchvision_problem:
        diagnostics.append(torchvision_problem)
    return {"torch": torch_section, "distributed": distributed, "cuda": cuda, "gpus": gpus}


def _torch_build(torch) -> dict[str, Any]:
    cuda_version = torch.version.cuda
    hip_version = getattr(torch.version, "hip", None)
    if cuda_version:
        build = f"CUDA {cuda_version}"
    elif hip_version:
        build = f"ROCm {hip_version}"
    else:
        build = "CPU only"
    try:
        arch_list = list(torch.cuda.get_arch_list()) if (cuda_version or hip_version) else []
    except Exception:
        arch_list = []
    mps = getattr(torch.backends, "mps", None)
    try:
        cpu_capability = torch.backends.cpu.get_cpu_capability()
    except Exception:
        cpu_capability = None
    config = _config_text(torch)
    return {
        "version": torch.__version__,
        "build": build,
        "debug_build": bool(getattr(torch.version, "debug", False)),
        "build_compiler": build_compiler(config),
        "cuda_version": cuda_version,
        "hip_version": hip_version,
        "rocm_version": getattr(torch.version, "rocm", None) or None,
        "cudnn_version": _cudnn_version(torch),
        "miopen_version": _miopen_version(torch),
        "cuda_arch_list": arch_list,
        "cuda_available": bool(torch.cuda.is_available()),
        "mps_available": bool(mps is not None and mps.is_available()),
        "xpu_available": _xpu_available(torch),
        "cpu_capability": cpu_capability,
        "cpu_features": cpu_features(torch),
        **cpu_libraries(config),
        "xnnpack": _xnnpack(torch),
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
    }


# The instruction-set extensions that decide which CPU kernels torch and oneDNN run (AMX or
# AVX-512 BF16 for bfloat16 autocast, VNNI for int8, SVE on Arm): `cpu_capability` names only
# the widest vector ISA (AVX512 on a CPU with or without AMX).
CPU_FEATURES = (
    "avx2", "avx512_f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
    "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    "neon", "bf16", "i8mm", "sve", "sve2", "sve_bf16", "sme", "sme2",
)  # fmt: skip
# Torch releases before torch.cpu.get_capabilities() answer for a few of them one by one,
# under names of their release: torch 2.4 has the _is_cpu_support_* three alone.
_CPU_FEATURE_CHECKS = {
    "avx2": ("_is_avx2_supported", "_is_cpu_support_avx2"),
    "avx512_f": ("_is_avx512_supported", "_is_cpu_support_avx512"),
    "avx512_vnni": ("_is_vnni_supported", "_is_cpu_support_vnni"),
    "avx512_bf16": ("_is_avx512_bf16_supported",),
    "amx_tile": ("_is_amx_tile_supported",),
    "amx_fp16": ("_is_amx_fp16_supported",),
}


def cpu_features(torch) -> list[str] | None:
    """The CPU_FEATURES this CPU has, as torch detects them (cpuinfo, which also knows whether
    the OS enabled AMX); None where torch cannot say."""
    cpu = getattr(torch, "cpu", None)
    try:
        capabilities = dict(cpu.get_capabilities())
    except Exception:
        capabilities = {}
        for name, checks in _CPU_FEATURE_CHECKS.items():
            check = next((getattr(cpu, c) for c in checks if hasattr(cpu, c)), None)
            if check is None:
                continue
            with contextlib.suppress(Exception):
                capabilities[name] = bool(check())
    if not capabilities:
        return None
    return [name for name in CPU_FEATURES if capabilities.get(name) is True]


def _xpu_available(torch) -> bool:
    """Whether an Intel GPU (XPU) runs torch code; False on a torch without XPU support."""
    try:
        return bool(torch.xpu.is_available())
    except Exception:
        return False


def _xnnpack(torch) -> bool | None:
    """Whether torch was built with XNNPACK (the CPU kernels of mobile-optimised models and of
    some quantised ones); None where this torch cannot say."""
    try:
        import torch.backends.xnnpack

        return bool(torch.backends.xnnpack.enabled)
    except Exception:
        return None


def build_compiler(config: str) -> str | None:
    """The compiler torch was built with ("GCC 13.3", "clang 17.0.6", "MSVC 194334809"), as
    `torch.__config__.show()`'s list names it; None where it names none. clang also calls
    itself GCC 4.2 there (it defines GCC's version macros, as macOS wheels show: "GCC 4.2",
    then "clang 15.0.0"), so its own line wins. A C++ extension built by another compiler (or
    one whose C++ library is older) can fail to load."""
    found = dict(re.findall(r"^\s*-\s*(GCC|clang|MSVC)\s+([0-9][0-9.]*)\s*$", config, re.MULTILINE))
    for name in ("clang", "GCC", "MSVC"):
        if name in found:
            return f"{name} {found[name]}"
    return None


def _config_text(torch) -> str:
    try:
        return str(torch.__config__.show())
    except Exception:
        return ""


def cpu_libraries(config: str) -> dict[str, str | None]:
    """The CPU math libraries torch was built with, from `torch.__config__.show()`: `blas`
    (mkl, openblas, accelerate...), `mkl_version`, `onednn_version`, `openmp` (the version the
    OpenMP runtime supports); None where the build says nothing of one."""

    def found(pattern: str) -> str | None:
        match = re.search(pattern, config)
        return match.group(1) if match else None

    openmp = re.search(r"OpenMP (\d+)(?: \(a\.k\.a\. OpenMP ([0-9.]+)\))?", config)
    return {
        "blas": found(r"BLAS_INFO=([^,\s]+)"),
        "mkl_version": found(r"Math Kernel Library Version ([0-9][0-9.]*)"),
        "onednn_version": found(r"(?:MKL-DNN|oneDNN) v([0-9][0-9.]*)"),
        "openmp": (openmp.group(2) or openmp.group(1)) if openmp else None,
    }


def _cudnn_version(torch) -> str | None:
    """cuDNN's version; None on a ROCm build, where `torch.backends.cudnn` is MIOpen."""
    if getattr(torch.version, "hip", None):
        return None
    number = _dnn_library_number(torch)
    if not number:
        return None
    # cuDNN 9 encodes 9.26.0 as 92600; cuDNN 8 encoded 8.9.2 as 8902.
    if number >= 90000:
        major, minor, patch = number // 10000, number % 10000 // 100, number % 100
    else:
        major, minor, patch = number // 1000, number % 1000 // 100, number % 100
    return f"{major}.{minor}.{patch}"


def _miopen_version(torch) -> str | None:
    """MIOpen's version on a ROCm build (what `torch.backends.cudnn` runs there); else None."""
    if not getattr(torch.version, "hip", None):
        return None
    number = _dnn_library_number(torch)
    if not number:
        return None
    # torch encodes MIOpen 3.2.0 as 3002000 (major * 1000000 + minor * 1000 + patch).
    return f"{number // 1000000}.{number % 1000000 // 1000}.{number % 1000}"


def _dnn_library_number(torch) -> int | None:
    try:
        return torch.backends.cudnn.version()
    except Exception:
        return None


def _distributed(torch) -> dict[str, Any]:
    section: dict[str, Any] = {
        "available": False,
        "gloo": False,
        "nccl": False,
        "mpi": False,
        "nccl_version": None,
    }
    try:
        import torch.distributed as dist
    except Exception:
        return section
    if not dist.is_available():
        return section
    section["available"] = True
    for name in ("gloo", "nccl", "mpi"):
        try:
            section[name] = bool(getattr(dist, f"is_{name}_available")())
        except Exception:
            section[name] = False
    if section["nccl"]:
        try:
            section["nccl_version"] = ".".join(str(part) for part in torch.cuda.nccl.version())
        except Exception:
            section["nccl_version"] = None
    return section


def _probe_gpus(torch) -> tuple[list[dict[str, Any]], str | None]:
    """Each visible GPU, tried with a tiny computation; or why CUDA could not be initialised."""
    if not torch.cuda.is_available():
        if not (torch.version.cuda or getattr(torch.version, "hip", None)):
            return [], None
        try:
            torch.cuda.init()
        except Exception as error:
            # "Found no NVIDIA driver on your system. Please check that ...": keep the finding.
            return [], first_line(error).split(". ")[0].rstrip(".")
        return [], "no CUDA device found"
    return [_gpu_info(torch, index) for index in range(torch.cuda.device_count())], None


def _gpu_info(torch, index: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "index": index,
        "name": None,
        "uuid": None,
        "total_memory_bytes": None,
        "free_memory_bytes": None,
        "compute_capability": None,
        "multiprocessors": None,
        "usable": False,
        "error": None,
    }
    try:
        props = torch.cuda.get_device_properties(index)
        info.update(
            name=props.name,
            uuid=str(props.uuid) if getattr(props, "uuid", None) is not None else None,
            total_memory_bytes=int(props.total_memory),
            compute_capability=f"{props.major}.{props.minor}",
            multiprocessors=int(props.multi_processor_count),
        )
        free, _total = torch.cuda.mem_get_info(index)
        info["free_memory_bytes"] = int(free)
        # A kernel launch proves the build has code for this GPU and the device accepts work.
        probe = torch.ones(8, device=torch.device("cuda", index))
        if float((probe + probe).sum().item()) != 16.0:
            raise RuntimeError("a test computation gave a wrong result")
        info["usable"] = True
    except Exception as error:
        info["error"] = first_line(error)
    return info


def _diagnose_cuda(
    torch,
    cuda: dict[str, Any],
    gpus: list[dict[str, Any]],
    init_error: str | None,
    diagnostics: list[str],
) -> None:
    """Fill cuda.usable / problem / hint and add the warnings a user needs to see."""
    cuda.update(usable=False, problem=None, hint=None)
    driver_gpus = cuda["driver_gpu_count"]
    # No NVIDIA GPU at all: torch sees none, the driver sees none, the PCI bus lists none.
    no_nvidia_gpu = not gpus and not driver_gpus and cuda["pci_gpu_count"] == 0
    # CUDA_VISIBLE_DEVICES chooses among NVIDIA GPUs (a ROCm build's AMD GPUs too): on a
    # machine without one, a value a CPU server's shell profile sets (`-1`, empty) hides
    # nothing, and is not judged (the report still shows it).
    no_gpu_to_choose = no_nvidia_gpu and not getattr(torch.version, "hip", None)
    visible = None if no_gpu_to_choose else cuda["visible_devices"]
    hides_all = visible is not None and not gpus and _hides_every_gpu(visible, driver_gpus)
    if visible is not None:
        for finding in (_misread(visible, driver_gpus), _cut_short(visible, driver_gpus)):
            if finding:
                diagnostics.append(finding)
    if hides_all:
        diagnostics.append(
            f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU; "
            "unset it or list the GPUs to use, e.g. 0 or 0,1"
        )
        cuda.update(
            problem=f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU",
            hint="unset CUDA_VISIBLE_DEVICES or list GPU indices",
        )
    if torch.version.cuda:
        build = f"CUDA {torch.version.cuda}"
    elif getattr(torch.version, "hip", None):
        build = f"ROCm {torch.version.hip}"
    else:
        cuda.update(
            problem=f"torch {torch.__version__} is a CPU-only build",
            hint="install a CUDA build of torch from pytorch.org",
        )
        if driver_gpus:
            diagnostics.append(
                f"the NVIDIA driver sees {driver_gpus} GPU(s) but torch {torch.__version__} is a "
                "CPU-only build; install a CUDA build of torch to use them"
            )
        return
    if not gpus:
        reason = init_error or "no CUDA device found"
        if torch.version.cuda and no_nvidia_gpu:
            # No NVIDIA GPU at all: CUDA cannot run, and no driver would change that (the
            # default Linux wheel of torch on a machine without one; a cluster's login node
            # whose image installs the driver's libcuda on machines without a GPU too): not a
            # warning.
            cuda.update(
                problem="this machine has no NVIDIA GPU (none on its PCI bus)",
                hint="run on a machine with an NVIDIA GPU",
            )
            return
        # Hiding every GPU explains "no CUDA GPUs are available", but not a missing driver.
        if not hides_all or "driver" in reason.lower():
            too_old = _driver_too_old(torch.version.cuda, cuda["driver_cuda_version"])
            diagnostics.append(
                f"torch {torch.__version__} is a {build} build but cannot use CUDA: {reason}"
                + (f" ({too_old})" if too_old else "")
            )
            cuda.update(
                problem=reason,
                hint=f"{too_old}: update the NVIDIA driver, or install a torch build for CUDA "
                f"{cuda['driver_cuda_version']} or older"
                if too_old
                else "install or update the NVIDIA driver until nvidia-smi lists the GPU"
                if torch.version.cuda
                else "install or update the ROCm driver until rocm-smi lists the GPU",
            )
        return
    broken = [gpu for gpu in gpus if not gpu["usable"]]
    for gpu in broken:
        diagnostics.append(
            f"GPU {gpu['index']} ({gpu['name']}) cannot run CUDA code: {gpu['error']}"
        )
    if len(broken) == len(gpus):
        cuda.update(
            problem=f"none of the {len(gpus)} CUDA GPU(s) runs code: {broken[0]['error']}",
            hint="check nvidia-smi and that this torch build supports the GPU",
        )
        return
    cuda.update(usable=True, problem=None, hint=None)


def _driver_too_old(build_cuda: str | None, driver_cuda: str | None) -> str | None:
    """What to say where torch's CUDA is newer than the newest the driver supports (a CUDA
    12.4 build on a driver of CUDA 11.8); None where it is not, or either is not known."""

    def numbers(version: str | None) -> tuple[int, ...] | None:
        match = re.match(r"(\d+)\.(\d+)", version or "")
        return (int(match.group(1)), int(match.group(2))) if match else None

    build, driver = numbers(build_cuda), numbers(driver_cuda)
    if build is None or driver is None or build <= driver:
        return None
    return f"the NVIDIA driver supports CUDA {driver_cuda} at most, torch is built for {build_cuda}"


def _cut_short(visible: str, driver_gpus: int | None) -> str | None:
    """Why CUDA reads only the start of CUDA_VISIBLE_DEVICES, when it drops a later entry
    ("0,abc,1": 'abc' is not a GPU index); None when every entry is used (a trailing comma
    drops nothing) or none is (hiding every GPU has its own message)."""
    entries = visible_device_entries(visible, driver_gpus)
    items = visible.split(",")
    dropped = items[len(entries) :]
    if not entries or not any(item.strip() for item in dropped):
        return None
    stop = dropped[0].strip()
    number = _leading_number(stop)
    if entries[0].startswith(("GPU-", "MIG-")):
        why = f"not a {entries[0][:4]} UUID"
    elif number is None:
        why = "not a GPU index"
    elif number < 0:
        why = "negative"
    else:
        why = f"past the driver's {driver_gpus} GPU(s)"
    return (
        f"CUDA_VISIBLE_DEVICES={visible!r} ends at {stop!r} ({why}): CUDA uses only "
        f"{','.join(entries)} and ignores the rest"
    )


def _misread(visible: str, driver_gpus: int | None) -> str | None:
    """Why CUDA reads fewer GPUs than CUDA_VISIBLE_DEVICES seems to list, when an index it uses
    carries more text ("0 1", "0;1": CUDA reads the leading 0 and ignores the rest)."""
    entries = visible_device_entries(visible, driver_gpus)
    if not entries or entries[0].startswith(("GPU-", "MIG-")):
        return None
    for item in visible.split(",")[: len(entries)]:
        if not re.fullmatch(r"\s*\+?[0-9]+\s*", item):
            return (
                f"CUDA_VISIBLE_DEVICES={visible!r}: CUDA reads the entry {item.strip()!r} as "
                f"{_leading_number(item)} and ignores the rest of it, so it uses GPU(s) "
                f"{','.join(entries)}; separate GPU indices with commas, e.g. 0,1"
            )
    return None


def _hides_every_gpu(visible: str, driver_gpus: int | None) -> bool:
    # Indices past the driver's GPU count end the list too (CUDA_VISIBLE_DEVICES=4 on 2 GPUs).
    return not visible_device_entries(visible, driver_gpus)


def check_torchvision_ops(torch) -> str | None:
    """None when torchvision's C++ operators load and compute correctly with this torch, else a
    one-line description of the problem. (None also when torchvision is not installed.)"""
    try:
        spec = importlib.util.find_spec("torchvision")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    tv_version = installed_version("torchvision") or "?"
    prefix = f"torchvision {tv_version} cannot run its operators with torch {torch.__version__}"
    advice = "install the torchvision release built for this torch"
    try:
        _load_torchvision_ops(torch, spec)
        boxes = torch.tensor(
            [[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]]
        )
        keep = torch.ops.torchvision.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)
        if keep.tolist() != [0, 2]:
            return f"{prefix}: nms gave {keep.tolist()} instead of [0, 2]; {advice}"
        built_for = int(torch.ops.torchvision._cuda_version())
    except Exception as error:
        return f"{prefix}: {first_line(error)}; {advice}"
    if built_for > 0 and torch.version.cuda:
        # torchvision encodes CUDA 12.4 as 12040.
        tv_major, torch_major = built_for // 1000, int(torch.version.cuda.split(".")[0])
        if tv_major != torch_major:
            return (
                f"torchvision {tv_version} was built for CUDA {tv_major}.x but torch "
                f"{torch.__version__} for CUDA {torch.version.cuda}; {advice}"
            )
    return None


def _load_torchvision_ops(torch, spec) -> None:
    """Register torchvision's operators the way torchvision.extension does, without running
    torchvision/__init__.py; fall back to the real import where the library is not found."""
    if hasattr(torch.ops.torchvision, "nms"):
        return
    locations = list(spec.submodule_search_locations or [])
    if os.name != "nt" and locations:
        finder = importlib.machinery.FileFinder(
            locations[0],
            (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
        )
        for name in _TORCHVISION_LIBRARIES:
            library = finder.find_spec(name)
            if library is not None and library.origin:
                torch.ops.load_library(library.origin)
                return
    import torchvision  # noqa: F401  (registers the operators, or raises why it cannot)

    if not torchvision.extension._has_ops():
        raise RuntimeError("torchvision's C++ extension did not load")
