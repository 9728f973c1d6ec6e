"""`torch.compile` as torchkit's commands call it, without torch's stray CPU-only warning."""

from __future__ import annotations

import logging
from typing import Any

# Inductor imports torch.utils.cpp_extension, whose import logs this warning on every machine
# with a CUDA toolkit (nvcc on PATH, CUDA_HOME) but no usable GPU: on a CPU run it says nothing
# the user can act on. Only this message of that logger is dropped.
NO_CUDA_RUNTIME = "No CUDA runtime is found"
CPP_EXTENSION_LOGGER = "torch.utils.cpp_extension"


class _DropNoCudaRuntime(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NO_CUDA_RUNTIME)


def compile_module(module: Any, **options: Any) -> Any:
    """`torch.compile(module, **options)`, with torch's "No CUDA runtime is found" warning,
    logged when the compiler first runs, silenced (a filter on its logger, added once)."""
    import torch

    logger = logging.getLogger(CPP_EXTENSION_LOGGER)
    if not any(isinstance(each, _DropNoCudaRuntime) for each in logger.filters):
        logger.addFilter(_DropNoCudaRuntime())
    if torch.are_deterministic_algorithms_enabled():
        # What torch.use_deterministic_algorithms sets for inductor, which
        # seeding.use_deterministic_algorithms leaves alone while inductor is not loaded.
        import torch._inductor.config as inductor_config

        inductor_config.deterministic = True
    return torch.compile(module, **options)
