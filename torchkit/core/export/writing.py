"""Turning a model into each format's file: the exporter's step (whose failures become one
`ExportError` naming the operator or reason) and the save step (whose failures are write
errors naming the output).

ONNX goes through torch's TorchScript-based exporter (`torch.onnx.export(..., dynamo=False)`):
it writes exactly the opset asked for, needs no onnxscript, and is three times faster than the
torch.export-based one on a ResNet; the result is checked in onnxruntime anyway. TorchScript is
`torch.jit.trace`, wrapped in a scripted shape check; torch.export is `torch.export.export`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from torchkit.core.export.value_reads import input_values_read, library_code
from torchkit.core.io.claims import reporting_write_errors
from torchkit.core.io.errors import TorchkitError, first_line
from torchkit.core.io.quiet import output_discarded
from torchkit.core.models.exported import metadata as meta
from torchkit.core.models.exported.formats import EXPORTED_PROGRAM, ONNX, TORCHSCRIPT

log = logging.getLogger("torchkit")

ONNX_MAX_BYTES = 2 * 1024**3  # protobuf's limit: larger models need ONNX's external data files


class ExportError(TorchkitError):
    """The exporter could not turn the model into the format."""


# Held around each exporter: what it changes for the whole process while it runs (file
# descriptors 1 and 2, the warnings filters, TorchScript's compilation unit) would be restored
# out of order by exports in two threads at once, and each export's types named after the
# other's; exports in one process run one at a time.
_EXPORTING = threading.RLock()


@contextlib.contextmanager
def exporter_output_hidden() -> Iterator[list[str]]:
    """Around an exporter: Python warnings and what it prints (torch's ONNX exporter dumps whole
    graphs from C++ when it fails, torch.export logs pages) are kept out of the user's terminal
    and of the command's results. Yields a list that receives the tracer's warnings (a traced
    branch or shape that became a constant), which are worth a line."""
    tracer: list[str] = []
    with _EXPORTING, output_discarded(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield tracer
        finally:
            for item in caught:
                if item.category.__name__ == "TracerWarning" and not library_code(item.filename):
                    tracer.append(_first_sentence(first_line(item.message)))


def _first_sentence(line: str) -> str:
    """Exporters' messages run to several sentences on one line; the first says what."""
    for end in (". ", "! "):
        head, found, _ = line.partition(end)
        if found and head:
            return head + end.strip() if end == "! " else head
    return line


def report_tracer_warnings(tracer: list[str], fmt: str) -> None:
    if tracer:
        more = f" (and {len(tracer) - 1} more)" if len(tracer) > 1 else ""
        log.warning(
            f"tracing for {fmt} warned: {tracer[0]}{more}; the exported graph keeps what the "
            "example input did there"
        )


def export_failure(error: BaseException, *, arch: str, fmt: str) -> ExportError:
    """The exporter's exception as one line naming the operator or the reason."""
    name = type(error).__name__
    text = str(error)
    line = _first_sentence(first_line(error))
    if name == "UnsupportedOperatorError" or ("is not supported" in line and "operator" in line):
        return ExportError(
            f"cannot export {arch} to ONNX: {line}",
            "try another --opset, or export to .pt2 for torch.export or .ts for TorchScript",
        )
    if "Constraints violated" in text or ("specialized" in text and "batch" in text):
        return ExportError(
            f"cannot export {arch} with a dynamic batch size: the model fixes it ({line})",
            "pass --static-batch, with --batch-size N",
        )
    # torch 2.4's torch.export says "Dynamic control flow is not supported" (a UserError)
    data_dependent = ("data-dependent", "data dependent", "Dynamic control flow is not supported")
    if "GuardOnDataDependent" in name or any(words in text for words in data_dependent):
        return ExportError(
            f"cannot export {arch} to {fmt}: the model branches on tensor values "
            f"(data-dependent control flow: {line})",
            "torch.export needs torch.cond for that; .onnx and .ts trace the branch this input "
            "takes",
        )
    return ExportError(
        f"cannot export {arch} to {fmt}: {first_line(error, with_type=True)}",
        "set TORCHKIT_DEBUG=1 for the exporter's traceback",
    )


def parameter_bytes(model: Any) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def write_onnx(
    model: Any,
    example: Any,
    path: os.PathLike,
    *,
    target: os.PathLike,
    dynamic: bool,
    opset: int,
    metadata: dict[str, Any],
) -> list[str]:
    """Export to ONNX in memory, add the metadata props, save at `path` (errors name
    `target`). Returns where the model read a value of its input (`input_values_read`)."""
    import torch

    from torchkit.core.runtime.extras import import_extra

    onnx = import_extra("onnx", "export", "exporting to ONNX")
    if parameter_bytes(model) >= ONNX_MAX_BYTES:
        raise ExportError(
            f"{metadata['arch']} holds more than 2 GB of weights, more than one ONNX file can",
            "export to .pt2 for torch.export or .ts for TorchScript",
        )
    buffer = io.BytesIO()
    axes = {meta.INPUT_NAME: {0: "batch"}, meta.OUTPUT_NAME: {0: "batch"}} if dynamic else None
    with exporter_output_hidden() as tracer, input_values_read(example) as reads:
        try:
            # With autograd on: under no_grad, eval-mode nn.MultiheadAttention (ViT...) takes
            # its fast path, aten::_native_multi_head_attention, which ONNX has no symbolic for.
            with torch.enable_grad():
                torch.onnx.export(
                    model,
                    (example,),
                    buffer,
                    dynamo=False,
                    opset_version=opset,
                    input_names=[meta.INPUT_NAME],
                    output_names=[meta.OUTPUT_NAME],
                    dynamic_axes=axes,
                    do_constant_folding=True,
                )
        except Exception as error:
            raise export_failure(error, arch=metadata["arch"], fmt=ONNX) from error
    report_tracer_warnings(tracer, ONNX)
    proto = onnx.load_model_from_string(buffer.getvalue())
    for key, value in meta.to_onnx_props(metadata).items():
        prop = proto.metadata_props.add()
        prop.key, prop.value = key, value
    _write_bytes(path, memoryview(proto.SerializeToString()), target)
    return reads


def _shape_checked(traced: Any, shape: tuple[int, ...], batch_size: int | None) -> Any:
    """A scripted module around the traced one that refuses inputs of another shape (a trace
    runs on any shape and would quietly give wrong answers; ONNX and torch.export check too)."""
    import torch

    class ShapeChecked(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module, sample: list[int], batch: int) -> None:
            super().__init__()
            self.inner = inner
            self.sample = sample
            self.batch = batch  # 0: any batch size

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            shape = list(x.shape)
            if len(shape) != len(self.sample) + 1 or shape[1:] != self.sample:
                raise RuntimeError(f"expected input of shape [N, {self.sample}], got {shape}")
            if self.batch > 0 and shape[0] != self.batch:
                raise RuntimeError(f"expected a batch of {self.batch}, got {shape[0]}")
            return self.inner(x)

    return torch.jit.script(ShapeChecked(traced, list(shape), batch_size or 0))


def write_torchscript(
    model: Any,
    example: Any,
    path: os.PathLike,
    *,
    target: os.PathLike,
    dynamic: bool,
    metadata: dict[str, Any],
) -> list[str]:
    """Trace, wrap in the shape check, save at `path`; returns where the model read a value of
    its input (`input_values_read`)."""
    import torch

    with exporter_output_hidden() as tracer, _own_compilation_unit():
        try:
            with torch.enable_grad(), input_values_read(example) as reads:
                # with autograd on, as for ONNX: the graph keeps portable attention ops
                traced = torch.jit.trace(model, example, check_trace=False)
            module = _shape_checked(
                traced, tuple(example.shape[1:]), None if dynamic else example.shape[0]
            )
        except Exception as error:
            raise export_failure(error, arch=metadata["arch"], fmt=TORCHSCRIPT) from error
    report_tracer_warnings(tracer, TORCHSCRIPT)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "torch.jit.save is deprecated"
        torch.jit.save(module, buffer, _extra_files={meta.EXTRA_FILE: meta.to_extra_file(metadata)})
    _write_bytes(path, buffer.getbuffer(), target)
    return reads


@contextlib.contextmanager
def _own_compilation_unit() -> Iterator[None]:
    """TorchScript's types made in a compilation unit of their own: torch puts every traced or
    scripted module's type in one per process, where a second type of the same name (the same
    model exported again) is renamed `___torch_mangle_N`, N counting every type the process
    made, and the file's code, names and bytes differed from the first export's. torch looks
    the unit up at `torch.jit._state._python_cu` each time it makes a type; where a torch
    keeps it elsewhere, the types go where torch puts them."""
    from torch.jit import _state

    with _EXPORTING:
        shared = getattr(_state, "_python_cu", None)
        if shared is None:
            yield
            return
        import torch

        _state._python_cu = torch._C.CompilationUnit()
        try:
            yield
        finally:
            _state._python_cu = shared


def write_exported_program(
    model: Any,
    example: Any,
    path: os.PathLike,
    *,
    target: os.PathLike,
    dynamic: bool,
    metadata: dict[str, Any],
) -> None:
    import torch

    shapes = ({0: torch.export.Dim("batch", min=1)},) if dynamic else None
    with exporter_output_hidden():
        try:
            program = torch.export.export(model, (example,), dynamic_shapes=shapes)
        except Exception as error:
            raise export_failure(error, arch=metadata["arch"], fmt=EXPORTED_PROGRAM) from error
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={meta.EXTRA_FILE: meta.to_extra_file(metadata)})
    _write_bytes(path, buffer.getbuffer(), target)


def _write_bytes(path: os.PathLike, data: memoryview, target: os.PathLike) -> None:
    """torch's savers are given a buffer, written here: torch.jit.save straight to a file on a
    full disk aborts the whole process from C++."""
    with reporting_write_errors(target), open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
