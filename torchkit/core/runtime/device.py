"""`--device auto|cpu|cuda|cuda:N|mps` parsing, the device a process uses (one process or
torchrun), and the autocast dtype of `--amp-dtype`."""

from __future__ import annotations

import logging
import re
from typing import Any

from torchkit.core.io.errors import DeviceError, UsageError

log = logging.getLogger("torchkit")

_DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda)(?::(\d+))?$")


def resolve_device(spec: str = "auto"):
    """Turn a device option into a `torch.device`, with a clear error when it is unavailable."""
    import torch

    match = _DEVICE_PATTERN.match(spec.strip().lower())
    if not match:
        raise UsageError(f"unknown device {spec!r}", "use auto, cpu, cuda, cuda:N or mps")
    kind, index = match.group(1), match.group(2)
    if kind == "auto":
        if index is not None:
            raise UsageError(f"unknown device {spec!r}", "use auto, cpu, cuda, cuda:N or mps")
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind in ("cpu", "mps") and index is not None and int(index) != 0:
        # torch has one CPU device and one MPS device: another index would be dropped silently.
        raise UsageError(
            f"--device {spec.strip()}: there is one {kind.upper()} device, {kind}:0",
            f"use --device {kind}",
        )
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise DeviceError("MPS is not available on this machine", "use --device cpu")
        return torch.device("mps")
    if not torch.cuda.is_available():
        raise DeviceError(
            f"{spec} was asked for but CUDA is not available",
            "run `torchkit env` to see why, or use --device cpu",
        )
    count = torch.cuda.device_count()
    position = int(index) if index is not None else 0
    if position >= count:
        raise DeviceError(
            f"{spec} was asked for but only {count} CUDA device(s) are visible",
            f"use cuda:0 to cuda:{count - 1}",
        )
    return torch.device("cuda", position)


AMP_DTYPES = ("auto", "bf16", "fp16")
_AMP_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16"}


def select_device(spec: str = "auto", *, local_rank: int | None = None, world_size: int = 1):
    """The device this process computes on, made the current one.

    In one process (`local_rank` None) this is `resolve_device(spec)`, and a CUDA device also
    becomes the current device (`torch.cuda.set_device`): with `--device cuda:1` cuDNN and cuBLAS
    handles, NCCL, `torch.cuda.current_device()` and tensors made with `device="cuda"` then all
    use GPU 1, not GPU 0. Under torchrun (`local_rank` given) each process uses the GPU of its
    LOCAL_RANK: `auto` and `cuda` mean that, and an explicit `cuda:N` is refused, since it would
    put every rank on the same GPU (the job's GPUs are chosen with CUDA_VISIBLE_DEVICES).
    """
    import torch

    match = _DEVICE_PATTERN.match(spec.strip().lower())
    if local_rank is not None and match and match.group(1) == "cuda" and match.group(2):
        raise UsageError(
            f"--device {spec.strip()} names one GPU, but under torchrun each of the "
            f"{world_size} processes uses the GPU of its LOCAL_RANK",
            "use --device cuda or auto, and CUDA_VISIBLE_DEVICES to choose the GPUs",
        )
    device = resolve_device(spec)
    if local_rank is not None and device.type == "cuda":
        count = torch.cuda.device_count()
        # Every rank of the node checks the node's process count, not only its own rank: a
        # rank with a GPU would otherwise wait in the first collective for the one that failed,
        # until torchrun kills it.
        from torchkit.core.runtime.launch import launch_env

        local_world = max(launch_env().local_world_size, local_rank + 1)
        if local_world > count:
            raise DeviceError(
                f"torchrun started {local_world} processes on this node, one per GPU, but only "
                f"{count} CUDA device(s) are visible",
                "use --nproc_per_node no larger than the number of GPUs",
            )
        device = torch.device("cuda", local_rank)
    if device.type == "cuda":
        if device.index is None:  # auto: the current device
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def use_in_this_thread(device: Any) -> None:
    """Make CUDA `device` the current one of the calling thread (a new thread starts on GPU 0,
    whatever the main thread chose); nothing for other devices or an unnumbered one."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


def to_channels_last(module: Any) -> Any:
    """`module` (in place) with its 4-D weights and buffers in the channels-last layout, as
    `module.to(memory_format=torch.channels_last)` puts them, except that weights of other
    ranks stay as they are: torch's call fails on a model that also holds 5-D ones (a Conv3d
    inside an image model) with "required rank 4 tensor to use channels_last format"."""
    import torch

    def convert(tensor):
        if tensor.dim() != 4:
            return tensor
        return tensor.contiguous(memory_format=torch.channels_last)

    return module._apply(convert)  # what Module.to applies, to parameters and buffers alike


def check_amp_dtype(amp: bool, amp_dtype: str) -> None:
    """--amp-dtype is one of auto, bf16, fp16, and a choice other than auto comes with --amp
    (without it the choice would silently do nothing)."""
    if amp_dtype not in AMP_DTYPES:
        raise UsageError(f"unknown --amp-dtype {amp_dtype!r}", "use " + ", ".join(AMP_DTYPES))
    if amp_dtype != "auto" and not amp:
        raise UsageError(f"--amp-dtype {amp_dtype} does nothing without --amp", "add --amp")


def resolve_amp_dtype(choice: str, device):
    """The autocast dtype of `--amp-dtype auto|bf16|fp16` on `device` (a torch.dtype): the one
    rule of every command (train, eval, predict, extract-features, benchmark).

    auto is bfloat16 where the device computes it natively: CPUs, and CUDA GPUs that support
    it without emulation (compute capability 8.0 and up); float16 elsewhere: older GPUs, where
    bfloat16 is only emulated and slow, and MPS, whose autocast has float16 as its default
    (`torch.get_autocast_dtype("mps")`) and takes bfloat16 only from macOS 14 on. bf16 and
    fp16 are taken as asked on every device (torch has a CPU float16 autocast). Asks the
    current CUDA device: call `select_device` first.
    """
    import torch

    name = str(choice).strip().lower()
    if name not in AMP_DTYPES:
        raise UsageError(f"unknown --amp-dtype {choice!r}", "use " + ", ".join(AMP_DTYPES))
    if name == "fp16":
        chosen = torch.float16
    elif name == "bf16":
        warn_if_cuda_bf16_is_emulated(device.type)
        chosen = torch.bfloat16
    elif device.type == "cpu" or (device.type == "cuda" and cuda_bf16_native()):
        chosen = torch.bfloat16
    else:
        chosen = torch.float16
    warn_if_cpu_amp_is_emulated(device.type, amp_dtype_name(chosen))
    return chosen


# The x86 CPU features that compute each autocast dtype natively (torch.cpu's probes).
_CPU_AMP_FEATURES = {
    "bf16": (("_is_avx512_bf16_supported", "AVX512-BF16"), ("_is_amx_tile_supported", "AMX")),
    "fp16": (("_is_amx_fp16_supported", "AMX-FP16"),),
}


def cpu_amp_is_native(dtype_name: str) -> bool | None:
    """Whether this CPU computes the autocast dtype (bf16 or fp16) natively; None when that
    cannot be told (not an x86 CPU, or a torch without the probes): no warning then."""
    import platform

    import torch

    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return None
    probes = [getattr(torch.cpu, probe, None) for probe, _ in _CPU_AMP_FEATURES[dtype_name]]
    if any(probe is None for probe in probes):
        return None
    return any(probe() for probe in probes)


def warn_if_cpu_amp_is_emulated(device_type: str, dtype_name: str) -> None:
    """--amp on a CPU that emulates its dtype runs several times slower than float32 (686 vs
    2,968 images/s measured): say so, once, before the run."""
    if device_type != "cpu" or cpu_amp_is_native(dtype_name) is not False:
        return
    features = " or ".join(name for _, name in _CPU_AMP_FEATURES[dtype_name])
    log.warning(
        "this CPU has no %s, so --amp computes %s by emulation: several times slower than "
        "float32 here; drop --amp on this CPU",
        features,
        {short: full for full, short in _AMP_DTYPE_NAMES.items()}[dtype_name],
    )


def amp_dtype_name(dtype) -> str:
    """How metrics.json and meta.json record an autocast dtype: bf16 or fp16."""
    name = str(dtype).rsplit(".", 1)[-1]
    return _AMP_DTYPE_NAMES.get(name, name)


def warn_if_cuda_bf16_is_emulated(device_type: str) -> None:
    """--amp-dtype bf16 on a GPU that only emulates bfloat16 (a T4, a V100) runs slower than
    float32: say so before the run."""
    if device_type == "cuda" and not cuda_bf16_native():
        log.warning(
            "this GPU has no native bfloat16: --amp-dtype bf16 is emulated and slow; "
            "--amp-dtype fp16 (or auto) is faster here"
        )


def cuda_bf16_native() -> bool:
    """Whether the current CUDA device computes bfloat16 natively (not emulated: a T4 or V100
    answers `torch.cuda.is_bf16_supported()` with True, through emulation)."""
    import torch

    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # a torch without the argument
        major, _minor = torch.cuda.get_device_capability()
        return major >= 8


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's "can't allocate memory"."""
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, (RuntimeError, MemoryError)) and (
        "can't allocate memory" in text or "out of memory" in text or isinstance(error, MemoryError)
    )
