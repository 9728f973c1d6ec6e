"""`torchkit export`: a model -> ONNX, TorchScript or torch.export, verified in the format's own
runtime, with its classes and preprocessing stored in the file. Small modules, one job each:
`formats` (options, tolerances), `writing` (the exporters), `verification` (exported vs
PyTorch) and `run` (`export_model`: the order of things). Reading an exported file (format names
and `sniff_format`, the metadata stored with the model, `load_exported`: the runtimes) is
`core.exported`'s, below `core.models`, which takes exported files as models."""

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
from torchkit.core.export.run import ExportRequest, ExportResult, check_outputs, export_model
from torchkit.core.export.verification import VerificationError
from torchkit.core.export.writing import ExportError
from torchkit.core.models.exported.loading import ExportedModel, RuntimeFailure, load_exported

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
