"""Checking an exported file against the PyTorch model it came from: loaded with its own
runtime, run on seeded random batches, compared output by output."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchkit.core.export.formats import Tolerance
from torchkit.core.io.errors import TorchkitError
from torchkit.core.models.exported.loading import (
    RUNNERS,
    ExportedModel,
    RuntimeFailure,
    load_exported,
)

SEED = 0


class VerificationError(TorchkitError):
    """The exported model does not load, does not run, or gives other outputs than PyTorch."""


class OutputMismatch(VerificationError):
    """The exported model runs, and its outputs differ from PyTorch's beyond the tolerance."""


@dataclass
class Verification:
    batch_sizes: list[int]
    # over every output of every batch: an infinity both give (a -inf logit masking a class)
    # differs by 0, one on one side only or a NaN by inf
    max_abs_diff: float
    reference_scale: float  # max |PyTorch output| over its finite outputs
    tolerance: float  # atol + rtol * reference_scale
    # The most one output differs between two of the random inputs, in PyTorch: a constant
    # (an export that ignored its input) is within the tolerance of every reference when this
    # is at most twice the tolerance, so such a check cannot tell (zero-initialised heads,
    # random weights whose outputs are ~1e-14).
    output_spread: float = math.inf

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    @property
    def conclusive(self) -> bool:
        return self.output_spread > 2 * self.tolerance


def verification_batches(
    sample_shape: Sequence[int], batch_sizes: Sequence[int], seed: int = SEED
) -> list[Any]:
    """Seeded standard-normal batches (what normalised images look like), one per size."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [torch.randn((n, *sample_shape), generator=generator) for n in batch_sizes]


def reference_outputs(model: Any, batches: Sequence[Any]) -> list[Any]:
    """The PyTorch model's outputs (eval mode, no autograd), as it returns them."""
    import torch

    model.eval()
    with torch.no_grad():
        return [model(batch) for batch in batches]


def verify(
    path: str | os.PathLike,
    fmt: str,
    batches: Sequence[Any],
    references: Sequence[Any],
    tolerance: Tolerance,
) -> Verification:
    """Load `path` with its runtime, run each batch, compare with `references`; raise
    `VerificationError` when it fails to load or run, or differs beyond the tolerance."""
    runtime = RUNNERS[fmt]
    try:
        exported = load_exported(path, fmt)
    except RuntimeFailure as error:
        raise VerificationError(error.message, error.hint) from error
    worst = 0.0
    scale = 0.0
    for batch, reference in zip(batches, references, strict=True):
        output = _run(exported, batch, runtime)
        if tuple(output.shape) != tuple(reference.shape):
            raise VerificationError(
                f"{runtime} gives outputs of shape {tuple(output.shape)} for a batch of "
                f"{batch.shape[0]}, PyTorch {tuple(reference.shape)}",
                "pass --static-batch if the model fixes its batch size",
            )
        diff = _max_abs_diff(output, reference)
        worst = max(worst, diff if math.isfinite(diff) else math.inf)
        scale = max(scale, _finite_scale(reference))
    sizes = [int(batch.shape[0]) for batch in batches]
    result = Verification(
        batch_sizes=list(dict.fromkeys(sizes)),  # a fixed batch is run twice, said once
        max_abs_diff=worst,
        reference_scale=scale,
        tolerance=tolerance.bound(scale),
        output_spread=output_spread(references),
    )
    if not result.passed:
        raise OutputMismatch(
            f"the exported model's outputs in {runtime} differ from PyTorch's by up to "
            f"{_number(worst)}, beyond the tolerance {_number(result.tolerance)} "
            f"(atol {tolerance.atol:g} + rtol {tolerance.rtol:g} x max |output| "
            f"{_number(scale)})",
            "raise --atol/--rtol if that much is expected; nothing was written",
        )
    return result


def matching_batches(
    path: str | os.PathLike,
    fmt: str,
    batches: Sequence[Any],
    references: Sequence[Any],
    tolerance: Tolerance,
) -> list[bool] | None:
    """After an output mismatch, which batches the file gets right (within the tolerance of
    the verification, whose scale is that of every reference): None where the file does not
    load or run on one of them."""
    try:
        exported = load_exported(path, fmt)
        outputs = [_run(exported, batch, RUNNERS[fmt]) for batch in batches]
    except (RuntimeFailure, VerificationError):
        return None
    bound = tolerance.bound(max(_finite_scale(reference) for reference in references))
    return [
        tuple(output.shape) == tuple(reference.shape) and _max_abs_diff(output, reference) <= bound
        for output, reference in zip(outputs, references, strict=True)
    ]


def require_repeatable(model: Any, batch: Any, reference: Any, tolerance: Tolerance, arch: str):
    """After an output mismatch: refuse a model that gives other outputs for the same input on
    another run (random operations in eval mode, as `F.dropout(x, p)` whose `training` defaults
    to True, or a forward that changes the model's state): no export can match it, and a wider
    --atol/--rtol would only hide that. `reference` is its float32 output for `batch`."""
    import torch

    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    with torch.no_grad():
        runs = [model(batch.to(dtype)).float() for _ in range(2)]
    if dtype == torch.float32:
        runs.append(reference)
    scale = max(_finite_scale(run) for run in runs)
    diff = max(_max_abs_diff(runs[0], run) for run in runs[1:])
    if math.isfinite(diff) and diff <= tolerance.bound(scale):
        return
    raise VerificationError(
        f"{arch} itself gives other outputs for the same input in PyTorch from one run to the "
        f"next (by up to {_number(diff)}): random operations in eval mode, or a forward that "
        "changes the model's state; no export can match it",
        "make its forward pass deterministic in eval mode, e.g. "
        "`F.dropout(x, p, training=self.training)`; --no-verify writes the file unchecked",
    )


def require_comparable(references: Sequence[Any], arch: str) -> None:
    """Refuse a model whose own outputs hold NaN (weights with NaN or inf in them): NaN equals
    nothing, so every export of it would "differ by inf", and no --atol/--rtol could pass it."""
    import torch

    rows = torch.cat([reference.reshape(reference.shape[0], -1) for reference in references])
    nan_rows = int(torch.isnan(rows).any(dim=1).sum())
    if nan_rows:
        raise VerificationError(
            f"{arch} itself gives NaN outputs in PyTorch (for {nan_rows} of the {len(rows)} "
            "random inputs of the verification): there is nothing to check the export against",
            "check whether the weights come from a diverged training run or hold NaN or inf; "
            "--no-verify writes the file unchecked",
        )


def output_spread(references: Sequence[Any]) -> float:
    """max over output elements of (max - min) across every sample of every batch: 0 when the
    outputs do not depend on the input, or when there is one sample only."""
    import torch

    rows = torch.cat([reference.reshape(reference.shape[0], -1) for reference in references])
    if rows.shape[0] < 2 or rows.shape[1] == 0:
        return 0.0
    highest, lowest = rows.amax(0), rows.amin(0)
    # an output that is the same infinity for every input (a masked class) does not move
    spread = torch.where(highest == lowest, 0.0, highest - lowest).max().item()
    return spread if math.isfinite(spread) else math.inf


def _max_abs_diff(output: Any, reference: Any) -> float:
    """max |output - reference|, where equal infinities differ by 0 (inf - inf is NaN)."""
    import torch

    if not output.numel():
        return 0.0
    return torch.where(output == reference, 0.0, (output - reference).abs()).max().item()


def _finite_scale(reference: Any) -> float:
    """max |reference| over its finite outputs (0 when none is): an infinite one would make the
    relative tolerance infinite, and any export pass."""
    import torch

    finite = reference[torch.isfinite(reference)]
    return finite.abs().max().item() if finite.numel() else 0.0


def _run(exported: ExportedModel, batch: Any, runtime: str) -> Any:
    try:
        return exported.run_batch(batch)
    except RuntimeFailure as error:
        text = error.message
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
            hint = (
                f"{runtime} on the CPU lacks a kernel this model needs, often one for float16: "
                "export float32, or pass --no-verify to keep the file for a runtime that has it"
            )
        else:
            hint = "pass --static-batch if the model fixes its batch size"
        raise VerificationError(f"verification failed: {text}", hint) from error


def _number(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}"
