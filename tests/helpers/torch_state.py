"""torch's process-wide settings as a test module found them, put back when it ends
(tests/conftest.py's `torch_state_kept`): an in-process `--deterministic` run turns on
deterministic algorithms and cudnn's deterministic mode for the rest of its process, `--threads`
and the benchmark's cudnn autotuner change other globals; left behind, they would change what
every later module of the worker computes (and which kernels it may use)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


def torch_settings() -> dict[str, Any] | None:
    """The settings torchkit (or a test) may change, or None where torch is not imported yet
    (nothing to read, and importing it only to read them would cost a second). Not the TF32
    ones: torchkit sets none, and reading the float32 matmul precision raises once both of
    torch's TF32 APIs were used."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "backends"):
        return None
    cudnn = torch.backends.cudnn
    return {
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "threads": torch.get_num_threads(),
        "anomaly": torch.is_anomaly_enabled(),
        "anomaly_check_nan": torch.is_anomaly_check_nan_enabled(),
        "default_dtype": torch.get_default_dtype(),
        "cudnn_enabled": cudnn.enabled,
        "cudnn_benchmark": cudnn.benchmark,
        "cudnn_deterministic": cudnn.deterministic,
    }


def set_torch_settings(settings: dict[str, Any]) -> None:
    """Sets each of `settings` (as `torch_settings` reads them) that differs now."""
    import torch

    now = torch_settings() or {}
    changed = {name for name, value in settings.items() if now.get(name) != value}
    if not changed:
        return
    if changed & {"deterministic", "deterministic_warn_only"}:
        torch.use_deterministic_algorithms(
            settings["deterministic"], warn_only=settings["deterministic_warn_only"]
        )
    if "threads" in changed:
        torch.set_num_threads(settings["threads"])
    if changed & {"anomaly", "anomaly_check_nan"}:
        torch.set_anomaly_enabled(settings["anomaly"], settings["anomaly_check_nan"])
    if "default_dtype" in changed:
        torch.set_default_dtype(settings["default_dtype"])
    cudnn = torch.backends.cudnn
    cudnn.enabled = settings["cudnn_enabled"]
    cudnn.benchmark = settings["cudnn_benchmark"]
    cudnn.deterministic = settings["cudnn_deterministic"]


@contextlib.contextmanager
def torch_state_kept() -> Iterator[None]:
    """torch's settings as the block found them, once it ends; where torch was not imported
    yet, the defaults of a fresh import (read when torch is first imported inside the block,
    which is what the later modules would otherwise have found)."""
    before = torch_settings()
    yield
    if before is None and "torch" in sys.modules:
        before = _fresh_defaults()
    if before is not None and "torch" in sys.modules:
        set_torch_settings(before)


def _fresh_defaults() -> dict[str, Any]:
    import torch

    defaults = torch_settings() or {}
    defaults.update(
        deterministic=False,
        deterministic_warn_only=False,
        anomaly=False,
        anomaly_check_nan=True,
        default_dtype=torch.float32,
        cudnn_enabled=True,
        cudnn_benchmark=False,
        cudnn_deterministic=False,
    )
    return defaults
