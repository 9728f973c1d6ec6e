"""Inputs made up for a model (summary, benchmark, convert-syncbn), and the tensors in what a
model takes or returns."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from torchkit.core.io.errors import UsageError


def make_inputs(
    shapes: Sequence[Sequence[int]],
    dtype: Any = None,
    device: Any = "cpu",
    dtypes: Sequence[Any] | None = None,
    *,
    seed: int = 0,
    channels_last: bool = False,
) -> list[Any]:
    """One random tensor per shape, on `device`: uniform in [0, 1) for floating dtypes, zeros
    for integer and bool ones, drawn from a private generator seeded with `seed`, so the
    caller's random state is left alone. `dtypes`: one per shape, else `dtype` for all (float32
    when None). `channels_last` lays each tensor out channels-last."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    inputs = []
    for index, shape in enumerate(shapes):
        if any(int(n) <= 0 for n in shape):
            raise UsageError(f"input size {tuple(shape)} has a dimension that is not positive")
        kind = dtypes[index] if dtypes is not None else dtype
        kind = torch.float32 if kind is None else kind
        if kind.is_floating_point:
            tensor = torch.rand(tuple(shape), generator=generator).to(kind)
        else:
            tensor = torch.zeros(tuple(shape), dtype=kind)
        tensor = tensor.to(device)
        if channels_last:
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        inputs.append(tensor)
    return inputs


def iter_tensors(value: Any) -> Iterator[Any]:
    """Every tensor in a (nested) tuple, list or dict."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from iter_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_tensors(item)
