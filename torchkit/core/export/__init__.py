"""`torchkit export`: a model -> ONNX, TorchScript or torch.export, verified in the format's own
runtime, with its classes and preprocessing stored in the file. Small modules, one job each:
`formats` (names, extensions, options, tolerances), `metadata` (what the file says about the
model), `writing` (the exporters), `loading` (`load_exported`: the runtimes), `verification`
(exported vs PyTorch) and `run` (`export_model`: the order of things)."""

from torchkit.core.export.formats import (
    DEFAULT_OPSET,
    DEFAULT_TOLERANCES,
    EXPORTED_PROGRAM,
    FORMATS,
    ONNX,
    TORCHSCRIPT,
    Tolerance,
    choose_format,
    sniff_format,
)
from torchkit.core.export.loading import ExportedModel, RuntimeFailure, load_exported
from torchkit.core.export.run import ExportRequest, ExportResult, check_outputs, export_model
from torchkit.core.export.verification import VerificationError
from torchkit.core.export.writing import ExportError

__all__ = [
    "DEFAULT_OPSET",
    "DEFAULT_TOLERANCES",
    "EXPORTED_PROGRAM",
    "FORMATS",
    "ONNX",
    "TORCHSCRIPT",
    "ExportError",
    "ExportRequest",
    "ExportResult",
    "ExportedModel",
    "RuntimeFailure",
    "Tolerance",
    "VerificationError",
    "check_outputs",
    "choose_format",
    "export_model",
    "load_exported",
    "sniff_format",
]
