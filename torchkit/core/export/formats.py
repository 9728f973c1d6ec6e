"""The export formats: names, file extensions, which options each takes, and the verification
tolerances of each dtype. Nothing here imports torch."""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from torchkit.core.errors import UsageError

ONNX = "onnx"
TORCHSCRIPT = "torchscript"
EXPORTED_PROGRAM = "exported-program"
FORMATS = (ONNX, TORCHSCRIPT, EXPORTED_PROGRAM)

# The extension that names each format; the first one is the format's usual name.
EXTENSIONS: dict[str, tuple[str, ...]] = {
    ONNX: (".onnx",),
    TORCHSCRIPT: (".ts", ".pt"),
    EXPORTED_PROGRAM: (".pt2",),
}
RUNTIMES = {
    ONNX: "onnxruntime",
    TORCHSCRIPT: "torch.jit.load",
    EXPORTED_PROGRAM: "torch.export.load",
}
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


def all_extensions() -> list[str]:
    return [ext for exts in EXTENSIONS.values() for ext in exts]


def format_of_extension(path: str | os.PathLike) -> str | None:
    suffix = Path(path).suffix.lower()
    for name, extensions in EXTENSIONS.items():
        if suffix in extensions:
            return name
    return None


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
            "end OUT with .onnx, .ts (or .pt) for TorchScript, .pt2 for torch.export; or pass "
            "--to onnx|torchscript|exported-program",
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
        if value is not None and not value >= 0:  # NaN fails too
            raise UsageError(f"{option} must be a number >= 0, not {value}")
    return Tolerance(
        atol=default.atol if atol is None else float(atol),
        rtol=default.rtol if rtol is None else float(rtol),
    )


def sniff_format(path: str | os.PathLike) -> str | None:
    """The format of an exported file, from its extension (.onnx) or its zip archive's entries
    (TorchScript holds `code/`, torch.export's `archive_format`); None for anything else (a
    checkpoint, a state dict, a file that is not there)."""
    source = Path(path)
    if not source.is_file():
        return None
    if source.suffix.lower() == ".onnx":
        return ONNX
    try:
        with zipfile.ZipFile(source) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return None
    entries = {name.split("/", 1)[1] for name in names if "/" in name}
    if "archive_format" in entries:
        return EXPORTED_PROGRAM
    if "constants.pkl" in entries or any(name.startswith("code/") for name in entries):
        return TORCHSCRIPT
    return None
