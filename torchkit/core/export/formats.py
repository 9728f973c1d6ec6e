"""The export formats: names, file extensions, which options each takes, and the verification
tolerances of each dtype. Nothing here imports torch. The names, extensions, runtimes and
`sniff_format` live in `core.exported.formats` (which reading an exported file needs, below
`core.models`), and are named here too."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from torchkit.core.io.errors import UsageError
from torchkit.core.models.exported.formats import (
    EXPORTED_PROGRAM,
    EXTENSIONS,
    FORMATS,
    ONNX,
    RUNTIMES,
    TORCHSCRIPT,
    all_extensions,
    format_of_extension,
    sniff_format,
)

__all__ = [
    "DEFAULT_OPSET",
    "DEFAULT_TOLERANCES",
    "DTYPES",
    "EXPORTED_PROGRAM",
    "EXTENSIONS",
    "FALLBACK_OPSET_RANGE",
    "FORMATS",
    "METADATA_PLACES",
    "ONNX",
    "RUNTIMES",
    "TORCHSCRIPT",
    "Tolerance",
    "all_extensions",
    "check_dtype",
    "check_opset",
    "choose_format",
    "format_of_extension",
    "opset_range",
    "sniff_format",
    "tolerance_for",
]

# Where the classes and preprocessing travel with the model.
METADATA_PLACES = {
    ONNX: "ONNX metadata_props (torchkit.*)",
    TORCHSCRIPT: "extra file torchkit.json",
    EXPORTED_PROGRAM: "extra file torchkit.json",
}

DTYPES = ("float32", "float16")
# The opset the ONNX file gets without --opset: 17 runs on every onnxruntime since 1.13 and on
# TensorRT 8.6, and has LayerNormalization (transformers export as one node).
DEFAULT_OPSET = 17
# The opsets of torch's TorchScript-based ONNX exporter (torch.onnx._constants), in case this
# torch does not say.
FALLBACK_OPSET_RANGE = (7, 20)


@dataclass(frozen=True)
class Tolerance:
    """Outputs pass when max |exported - PyTorch| <= atol + rtol * max |PyTorch|: the relative
    part scales with the logits (a model with logits near 100 differs by more in float16)."""

    atol: float
    rtol: float

    def bound(self, reference_scale: float) -> float:
        return self.atol + self.rtol * reference_scale


# float32: runtimes differ from PyTorch by float rounding only (1e-6 relative is typical);
# float16: 3 significant digits, rounding accumulates layer after layer (0.1% is typical).
DEFAULT_TOLERANCES = {
    "float32": Tolerance(atol=1e-4, rtol=1e-3),
    "float16": Tolerance(atol=1e-2, rtol=2e-2),
}


def choose_format(out: str | os.PathLike, to: str | None) -> str:
    """The format OUT's extension names, or `to` (which must agree with a known extension)."""
    by_name = format_of_extension(out)
    if to is not None:
        to = to.strip().lower()
        if to not in FORMATS:
            raise UsageError(f"unknown format {to!r} for --to", "use " + ", ".join(FORMATS))
        if by_name is not None and by_name != to:
            raise UsageError(
                f"--to {to} contradicts the extension of {Path(out).name} ({by_name})",
                f"end OUT with {' or '.join(EXTENSIONS[to])}, or drop --to",
            )
        return to
    if by_name is None:
        raise UsageError(
            f"cannot tell the export format from {Path(out).name!r}",
            "end OUT with .onnx, with .ts or .pt for TorchScript, or with .pt2 for torch.export; "
            "or pass --to onnx|torchscript|exported-program",
        )
    return by_name


def opset_range() -> tuple[int, int]:
    """The opsets this torch's TorchScript-based ONNX exporter writes."""
    try:
        from torch.onnx import _constants

        return (
            int(_constants.ONNX_MIN_OPSET),
            int(_constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET),
        )
    except (ImportError, AttributeError):
        return FALLBACK_OPSET_RANGE


def check_opset(fmt: str, opset: int | None) -> int | None:
    """The opset to write: --opset (in range) for ONNX, the default without; None otherwise."""
    if fmt != ONNX:
        if opset is not None:
            raise UsageError(f"--opset goes with ONNX, not {fmt}", "drop --opset, or export .onnx")
        return None
    if opset is None:
        return DEFAULT_OPSET
    low, high = opset_range()
    if not low <= opset <= high:
        raise UsageError(
            f"--opset {opset} is not one torch's ONNX exporter writes",
            f"give an opset from {low} to {high}",
        )
    return opset


def check_dtype(dtype: str) -> str:
    name = dtype.strip().lower()
    if name not in DTYPES:
        raise UsageError(f"--dtype must be float32 or float16, not {dtype!r}")
    return name


def tolerance_for(dtype: str, atol: float | None, rtol: float | None) -> Tolerance:
    default = DEFAULT_TOLERANCES[dtype]
    for value, option in ((atol, "--atol"), (rtol, "--rtol")):
        # NaN fails too; inf would pass any output, a verification that checks nothing
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise UsageError(
                f"{option} must be a finite number >= 0, not {value}",
                "--no-verify skips the verification",
            )
    return Tolerance(
        atol=default.atol if atol is None else float(atol),
        rtol=default.rtol if rtol is None else float(rtol),
    )
