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
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from torchkit.core.io.errors import TorchkitError, first_line
from torchkit.core.io.outputs import reporting_write_errors
from torchkit.core.io.quiet import output_discarded
from torchkit.core.models.exported import metadata as meta
from torchkit.core.models.exported.formats import EXPORTED_PROGRAM, ONNX, TORCHSCRIPT

log = logging.getLogger("torchkit")

ONNX_MAX_BYTES = 2 * 1024**3  # protobuf's limit: larger models need ONNX's external data files


class ExportError(TorchkitError):
    """The exporter could not turn the model into the format."""


@contextlib.contextmanager
def exporter_output_hidden() -> Iterator[list[str]]:
    """Around an exporter: Python warnings and what it prints (torch's ONNX exporter dumps whole
    graphs from C++ when it fails, torch.export logs pages) are kept out of the user's terminal
    and of the command's results. Yields a list that receives the tracer's warnings (a traced
    branch or shape that became a constant), which are worth a line."""
    tracer: list[str] = []
    with output_discarded(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield tracer
        finally:
            for item in caught:
                if item.category.__name__ == "TracerWarning" and not _library_code(item.filename):
                    tracer.append(_first_sentence(first_line(item.message)))


def _library_code(filename: str, packages: tuple[str, ...] = ("torch", "torchvision")) -> bool:
    """A file of torch or torchvision: their tracer warnings are shape checks (torch._assert,
    MultiheadAttention's mask checks) that hold for every input of the exported shape."""
    folders = []
    for name in packages:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            folders.append(os.path.dirname(os.path.abspath(module.__file__)) + os.sep)
    return os.path.abspath(filename).startswith(tuple(folders))


def _first_sentence(line: str) -> str:
    """Exporters' messages run to several sentences on one line; the first says what."""
    for end in (". ", "! "):
        head, found, _ = line.partition(end)
        if found and head:
            return head + end.strip() if end == "! " else head
    return line


# Graph nodes whose output depends on a tensor's shape, type or device, never on its values:
# a Python value read through them (an assert on x.shape[1], int(x.size(0))) is the same for
# every input of the exported shape, and the verification's batch sizes check the batch.
_SHAPE_ONLY_NODES = frozenset(
    {
        "aten::size",
        "aten::sym_size",
        "aten::dim",
        "aten::numel",
        "aten::len",
        "prim::shape",
        "prim::device",
        "prim::dtype",
        "prim::layout",
        # new tensors shaped like the input (torch.ones_like(x), x.new_ones(n)): no values
        "aten::zeros_like",
        "aten::ones_like",
        "aten::empty_like",
        "aten::rand_like",
        "aten::randn_like",
        "aten::new_zeros",
        "aten::new_ones",
        "aten::new_empty",
    }
)
# Nodes whose output's shape depends on their inputs' values: a shape read through them
# (torch.nonzero(x > 0).shape[0] as a loop count) is a read of those values.
_VALUE_SHAPED_NODES = frozenset(
    {
        "aten::nonzero",
        "aten::nonzero_numpy",
        "aten::argwhere",
        "aten::masked_select",
        "aten::_unique",
        "aten::_unique2",
        "aten::unique_dim",
        "aten::unique_consecutive",
        "aten::unique_dim_consecutive",
        "aten::repeat_interleave",
        "aten::bincount",
        "aten::arange",
        "aten::range",
    }
)


@contextlib.contextmanager
def input_values_read(example: Any) -> Iterator[list[str]]:
    """Around torch's tracer (torch.jit.trace, torch.onnx.export): yields a list that receives
    the places ("file.py:LINE") where the model turns a tensor computed from the values of
    `example` into a Python value (`if x.mean() > 0:`, `int(x.argmax())`, `.item()`). The trace
    keeps what the example gave there as a constant, so the file is wrong for inputs that would
    have gone the other way, and random verification inputs may all go the example's way: such
    an export cannot be called verified. Values read from shapes only, and from the weights,
    are the same for every input and are not listed."""
    import torch
    from torch.overrides import TorchFunctionMode

    places: list[str] = []
    reads = {
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__index__,
        torch.Tensor.__float__,
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.__complex__,
        torch.Tensor.numpy,
        torch.Tensor.__array__,  # np.asarray(x)
        # Python booleans of two tensors' values (`if torch.equal(x, y):`)
        torch.equal,
        torch.Tensor.equal,
        torch.allclose,
        torch.Tensor.allclose,
        torch.is_nonzero,
        torch.Tensor.is_nonzero,
    }
    # Python values of a tensor's shape: the number of tensors `for row in t:` or t.unbind()
    # gives is fixed in the file, wrong where the shape comes from the input's values
    shape_reads = {torch.Tensor.__iter__, torch.Tensor.unbind, torch.unbind}

    traced: list[Any] = [None, None]  # the tracing state, the example's value as it began
    # (value, whether only its shape matters) -> whether it depends on the example's values,
    # in this trace (value numbers are unique within one graph): a ViT reads many shapes of
    # one long graph, a loop with a check in each step reads the same chain again and again
    known: dict[tuple[int, bool], bool] = {}

    def depends_on_input(tensor: Any, source: int, shape_only: bool = False) -> bool:
        # depth first, with the path from the read: when the example is reached, everything
        # on the path depends on it; a value whose inputs are all searched does not
        path: list[tuple[tuple[int, bool], Iterator[tuple[Any, bool]]]] = []

        def enter(value: Any, shape_only: bool) -> bool | None:
            key = (value.unique(), shape_only)
            if key == (source, False):
                return True
            if key in known:
                return known[key]
            path.append((key, iter(_inputs_searched(value.node(), shape_only))))
            return None

        found = enter(torch._C._get_value_trace(tensor), shape_only)
        while path and not found:
            key, inputs = path[-1]
            following = next(inputs, None)
            if following is None:
                known[key] = False
                path.pop()
            else:
                found = enter(*following)
        for key, _ in path:  # found: the path leads to the example
            known[key] = True
        return bool(found)

    class InputValueReads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            state = torch._C._get_tracing_state()
            if state is not None and state is not traced[0]:
                # a trace begins: the example's value before the model can write into it
                # in place (x.mul_(...) gives the example a new value in the graph)
                known.clear()
                try:
                    traced[:] = [state, torch._C._get_value_trace(example).unique()]
                except RuntimeError:  # not an input of this trace
                    traced[:] = [state, None]
            watched = func in reads or func in shape_reads
            if watched and args and state is not None and traced[1] is not None:
                try:
                    dependent = any(
                        depends_on_input(each, traced[1], func in shape_reads)
                        for each in args[:2]  # torch.equal(x, y) reads both
                        if isinstance(each, torch.Tensor)
                    )
                except RuntimeError:  # a tensor the tracer cannot place: nothing to say
                    dependent = False
                place = _caller_place() if dependent else None
                if place is not None and place not in places:  # a line run again, in a loop
                    places.append(place)
            return func(*args, **(kwargs or {}))

    try:
        with InputValueReads():
            yield places
    finally:
        traced[:] = [None, None]  # keeps no tracing state alive
        known.clear()


def _inputs_searched(node: Any, shape_only: bool) -> list[tuple[Any, bool]]:
    """The inputs of `node` that the value it makes (or only that value's shape, with
    `shape_only`) depends on, each with whether only its shape matters: a shape read follows
    shapes back, and values again only through a node whose output's shape its inputs'
    values make."""
    kind = node.kind()
    inputs = list(node.inputs())
    if kind in _SHAPE_ONLY_NODES:
        return [(each, True) for each in inputs]
    if shape_only and kind == "aten::index":  # x[mask]: as many rows as True
        return [(inputs[0], True)] + [(each, False) for each in _boolean_indices(node)]
    if shape_only and (
        kind in _VALUE_SHAPED_NODES or (kind == "aten::where" and len(inputs) == 1)
    ):  # torch.where(mask) is torch.nonzero(mask, as_tuple=True)
        return [(each, False) for each in inputs]
    return [(each, shape_only) for each in inputs]


def _boolean_indices(node: Any) -> list[Any]:
    """The boolean masks among an aten::index node's indices (a list of optional tensors)."""
    indices = list(node.inputs())[1]
    found = []
    for each in indices.node().inputs() if indices.node().kind() == "prim::ListConstruct" else []:
        scalar_type = getattr(each.type(), "scalarType", lambda: None)()
        if scalar_type in ("Bool", "Byte"):
            found.append(each)
    return found


def _caller_place() -> str:
    """file.py:LINE of the innermost frame outside torch and this module: the model's line."""
    here = os.path.abspath(__file__)
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if os.path.abspath(filename) != here and not _library_code(filename, ("torch",)):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


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
            "try another --opset, or export to .pt2 (torch.export) or .ts (TorchScript)",
        )
    if "Constraints violated" in text or ("specialized" in text and "batch" in text):
        return ExportError(
            f"cannot export {arch} with a dynamic batch size: the model fixes it ({line})",
            "pass --static-batch (with --batch-size N)",
        )
    if "GuardOnDataDependent" in name or "data-dependent" in text or "data dependent" in text:
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
            "export to .pt2 (torch.export) or .ts (TorchScript)",
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

    with exporter_output_hidden() as tracer:
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
