"""`--device auto|cpu|cuda|cuda:N|mps` parsing."""

from __future__ import annotations

import re

from torchkit.core.errors import DeviceError, UsageError

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
