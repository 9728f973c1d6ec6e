"""Seeding torch's CPU generator alone, for tests that reseed it hundreds of times.

`torch.manual_seed` also queues a seed for CUDA, XPU and MTIA while they are not initialised,
and each queued call keeps `traceback.format_stack()` of its caller: at pytest's stack depth
that is about 1 ms of CPU a call, against a few microseconds for the CPU generator alone. What
the CPU draws (torch.rand, torchvision's RandomResizedCrop, torchkit's loaders, which reseed
`torch.default_generator` per image) is the same either way."""

from __future__ import annotations

import torch


def seed_cpu(seed: int) -> None:
    """`torch.manual_seed(seed)` for the CPU generator only."""
    torch.default_generator.manual_seed(seed)
