"""Loading an exported model with its format's own runtime: onnxruntime for ONNX,
`torch.jit.load` for TorchScript, `torch.export.load` for torch.export. `load_exported` gives an
`ExportedModel`: a callable from an N,C,H,W float batch to float32 logits, with the classes and
preprocessing stored beside the weights (what `predict` needs to take an exported file)."""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.io.errors import InputError, TorchkitError, UsageError, first_line
from torchkit.core.io.non_utf8_names import name_native_code_opens
from torchkit.core.models.exported import metadata as meta
from torchkit.core.models.exported.formats import (
    EXPORTED_PROGRAM,
    FORMATS,
    ONNX,
    RUNTIMES,
    TORCHSCRIPT,
    in_older_torch_layout,
    sniff_format,
)


class RuntimeFailure(TorchkitError):
    """The exported model does not load or does not run in its runtime."""


@dataclass
class ExportedModel:
    """An exported classifier, loaded. Call it on an N,C,H,W batch (torch tensor or NumPy array,
    any float dtype): it returns float32 logits of the same kind (a CPU tensor for a tensor).

    A model exported with a fixed batch size takes any N all the same: the batch is run in
    slices of that size, the last one padded with zeros."""

    path: str
    format: str
    metadata: dict[str, Any] = field(default_factory=dict)
    _run: Callable[[Any], Any] | None = field(default=None, repr=False)
    _numpy_runtime: bool = field(default=False, repr=False)

    @property
    def classes(self) -> list[str] | None:
        return meta.classes_of(self.metadata, self.path)

    @property
    def preprocess(self) -> Preprocess | None:
        return meta.preprocess_of(self.metadata)

    @property
    def data(self) -> dict[str, Any] | None:
        """The training data record of the checkpoint it was exported from."""
        return meta.data_of(self.metadata)

    @property
    def arch(self) -> str | None:
        arch = self.metadata.get("arch")
        return str(arch) if arch is not None else None

    @property
    def input_shape(self) -> tuple[int, ...] | None:
        """One sample's shape (C, H, W), when the file says."""
        shape = self.metadata.get("input_shape")
        return tuple(int(n) for n in shape) if isinstance(shape, list) else None

    @property
    def batch_size(self) -> int | None:
        """The batch size the model was exported with; None for a dynamic batch."""
        value = self.metadata.get("batch_size")
        return int(value) if isinstance(value, int) else None

    @property
    def dtype(self) -> str:
        return str(self.metadata.get("dtype") or "float32")

    @property
    def num_outputs(self) -> int | None:
        """Logits per image, when the file says (torchkit's metadata, an ONNX output shape)."""
        value = self.metadata.get("num_outputs")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def refuse_other_size(self, size: tuple[int, int] | None, channels: int | None = None) -> None:
        """A size asked for (--image-size, summary's --input-size) that is not the one the file
        records: the runtime would fail on the first batch (ONNX and torch.export fix H and W,
        a traced TorchScript graph its layer sizes), so refuse it before any work."""
        shape = self.input_shape
        if shape is None or len(shape) != 3 or (size is None and channels is None):
            return
        asked = (channels or shape[0], *(size or shape[1:]))
        if asked != shape:
            recorded, given = ("x".join(map(str, s)) for s in (shape, asked))
            raise UsageError(
                f"{Path(self.path).name} takes {recorded} inputs (C, H, W, as exported), not "
                f"{given}",
                "leave the size out, the file sets it; or export the model again at "
                + given.split("x", 1)[1],
            )

    @property
    def module(self) -> Any:
        """The torch module a TorchScript or torch.export file holds (None for ONNX)."""
        return None if self._numpy_runtime else self._run

    def __call__(self, batch: Any) -> Any:
        import numpy as np
        import torch

        as_numpy = not isinstance(batch, torch.Tensor)
        data = torch.from_numpy(np.asarray(batch)) if as_numpy else batch.detach().cpu()
        if data.ndim != 4:
            raise UsageError(f"an exported image model takes N,C,H,W, not {tuple(data.shape)}")
        fixed = self.batch_size
        if fixed is None or data.shape[0] == fixed:
            logits = self.run_batch(data)
        else:
            logits = self._in_slices(data, fixed)
        return logits.numpy() if as_numpy else logits

    def _in_slices(self, data: Any, fixed: int) -> Any:
        import torch

        parts = []
        for start in range(0, data.shape[0], fixed):
            chunk = data[start : start + fixed]
            count = chunk.shape[0]
            if count < fixed:
                padding = chunk.new_zeros((fixed - count, *chunk.shape[1:]))
                chunk = torch.cat([chunk, padding])
            parts.append(self.run_batch(chunk)[:count])
        if not parts:
            return self.run_batch(data.new_zeros((fixed, *data.shape[1:])))[:0]
        return torch.cat(parts)

    def run_batch(self, data: Any) -> Any:
        """One call of the runtime on exactly this batch (a CPU tensor): float32 logits."""
        import torch

        dtype = torch.float16 if self.dtype == "float16" else torch.float32
        data = data.to(dtype).contiguous()
        assert self._run is not None
        try:
            if self._numpy_runtime:
                output = torch.from_numpy(self._run(data.numpy()))
            else:
                with torch.no_grad():
                    output = self._run(data)
        except TorchkitError:
            raise  # the runtime did not load (`_OnnxSession`): said so already
        except Exception as error:
            shape = "x".join(map(str, data.shape))
            raise RuntimeFailure(
                f"{RUNNERS.get(self.format, self.format)} fails on an input of shape {shape}: "
                f"{first_line(error, with_type=True)}",
                self._shape_hint(),
            ) from error
        if not isinstance(output, torch.Tensor):
            raise RuntimeFailure(
                f"{self.path} returned a {type(output).__name__}, not a tensor of logits"
            )
        return output.float()

    def _shape_hint(self) -> str | None:
        shape = self.input_shape
        if shape is None:
            return None
        batch = "N" if self.batch_size is None else str(self.batch_size)
        return f"the model takes {self.dtype} inputs of shape {'x'.join([batch, *map(str, shape)])}"


RUNNERS = {ONNX: "onnxruntime", TORCHSCRIPT: "TorchScript", EXPORTED_PROGRAM: "torch.export"}


def load_exported(path: str | os.PathLike, fmt: str | None = None) -> ExportedModel:
    """Load an exported model (`fmt`: onnx, torchscript or exported-program; by default from
    the file) on the CPU."""
    source = Path(path)
    if not source.is_file():
        raise InputError(f"exported model not found: {source}", "check the path")
    fmt = fmt or sniff_format(source)
    if fmt not in FORMATS:
        raise InputError(
            f"{source} is not an exported model (ONNX, TorchScript or torch.export)",
            "export one with `torchkit export MODEL OUT`",
        )
    try:
        if fmt == ONNX:
            return _load_onnx(source)
        if fmt == TORCHSCRIPT:
            return _load_torchscript(source)
        return _load_exported_program(source)
    except TorchkitError:
        raise
    except Exception as error:
        raise _cannot_load(fmt, source, error) from error


def _cannot_load(fmt: str, source: Path, error: Exception) -> RuntimeFailure:
    return RuntimeFailure(
        f"{RUNTIMES[fmt]} cannot load {source}: {first_line(error, with_type=True)}",
        "is it a complete file written by this version of the exporter?",
    )


def _load_onnx(source: Path) -> ExportedModel:
    """The file read with onnx (its metadata, its output's width); onnxruntime, whose import
    starts a thread and whose session starts its pool, waits for the first batch
    (`_OnnxSession`): eval and predict read the model before their loader's workers fork, and
    a process forked beside a thread may deadlock in the child on a lock that thread held."""
    from torchkit.core.runtime.extras import import_extra, require_extra

    needed_for = f"running the ONNX model {source}"
    require_extra("onnxruntime", "export", needed_for)
    onnx = import_extra("onnx", "export", needed_for)
    if source.stat().st_size == 0:  # onnx.load reads 0 bytes as an empty model
        raise InputError(
            f"{source} is empty (0 bytes), not an ONNX model",
            "give the .onnx file `torchkit export` or torch.onnx.export wrote",
        )
    model = onnx.load(os.fspath(source), load_external_data=False)  # ORT reads the weights
    _refuse_graphless(model, source)
    metadata = meta.from_onnx_props({prop.key: prop.value for prop in model.metadata_props})
    meta.check_metadata(metadata, os.fspath(source))
    dims = model.graph.output[0].type.tensor_type.shape.dim if model.graph.output else []
    if dims and dims[-1].HasField("dim_value") and "num_outputs" not in metadata:
        metadata["num_outputs"] = int(dims[-1].dim_value)
    weights = {tensor.name for tensor in model.graph.initializer}
    inputs = [item for item in model.graph.input if item.name not in weights]
    if inputs:
        tensor = inputs[0].type.tensor_type
        shape = [dim.dim_value if dim.HasField("dim_value") else None for dim in tensor.shape.dim]
        half = tensor.elem_type == onnx.TensorProto.FLOAT16
        _record_graph_input(metadata, shape, "float16" if half else "float32")
    return ExportedModel(
        os.fspath(source), ONNX, metadata, _OnnxSession(source), _numpy_runtime=True
    )


def _refuse_graphless(model: Any, source: Path) -> None:
    """Refuse an ONNX file with no graph to run (no inputs or no outputs): onnx reads any
    protobuf that parses, and onnxruntime would say so only at the first batch, after the
    command has begun its output."""
    weights = {tensor.name for tensor in model.graph.initializer}
    missing = []
    if not any(item.name not in weights for item in model.graph.input):
        missing.append("inputs")
    if not model.graph.output:
        missing.append("outputs")
    if model.HasField("graph") and not missing:
        return
    what = (
        "no graph" if not model.HasField("graph") else f"a graph with no {' and no '.join(missing)}"
    )
    raise InputError(
        f"{source} is not a complete ONNX model: it holds {what}",
        "give the .onnx file `torchkit export` or torch.onnx.export wrote",
    )


def _record_graph_input(metadata: dict[str, Any], shape: Sequence[int | None], dtype: str) -> None:
    """What a file's graph says of its input, where its torchkit record does not (a file torch
    exported without torchkit): one sample's C, H, W and a fixed batch size when the graph fixes
    them, and the dtype, so that its images are sized and batched as the graph takes them."""
    if "input_shape" in metadata or len(shape) != 4:
        return
    if all(isinstance(n, int) and n > 0 for n in shape[1:]):
        metadata["input_shape"] = [int(n) for n in shape[1:]]
    if isinstance(shape[0], int) and shape[0] > 0:
        metadata["batch_size"] = int(shape[0])
    metadata.setdefault("dtype", dtype)


class _OnnxSession:
    """An onnxruntime session on the CPU, made at the first call: an N,C,H,W array to the first
    output's array."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.session: Any = None
        self.names: tuple[str, str] = ("", "")  # the first input's, the first output's

    def __call__(self, array: Any) -> Any:
        if self.session is None:
            self.session = self._start()
            self.names = (self.session.get_inputs()[0].name, self.session.get_outputs()[0].name)
        input_name, output_name = self.names
        return self.session.run([output_name], {input_name: array})[0]

    def _start(self) -> Any:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        # fatal only: no optimizer notes, and no red log line of a failed run beside the error
        # its exception becomes (the one Error line the user sees)
        options.log_severity_level = 4
        try:
            with name_native_code_opens(self.source) as name:
                return onnxruntime.InferenceSession(
                    name, sess_options=options, providers=["CPUExecutionProvider"]
                )
        except Exception as error:
            raise _cannot_load(ONNX, self.source, error) from error


def jit_load(source: str | os.PathLike, **kwargs: Any) -> Any:
    """`torch.jit.load(source, map_location="cpu", **kwargs)` without its "torch.jit.load is
    deprecated" warning (a FutureWarning, a DeprecationWarning up to torch 2.11): the user
    asked for this file, and the commands that read it say what it is."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        with name_native_code_opens(source) as name:
            return torch.jit.load(name, map_location="cpu", **kwargs)


def torchscript_module(source: str | os.PathLike) -> tuple[Any, dict[str, Any]]:
    """(the module of a TorchScript file, its torchkit record: `torchkit.json`); a record this
    torchkit cannot read as meant (a newer torchkit's) is refused (`check_metadata`)."""
    extra = {meta.EXTRA_FILE: ""}
    module = jit_load(source, _extra_files=extra)
    metadata = meta.from_extra_file(extra[meta.EXTRA_FILE])
    meta.check_metadata(metadata, os.fspath(source))
    return module, metadata


def _load_torchscript(source: Path) -> ExportedModel:
    module, metadata = torchscript_module(source)
    module.eval()
    return ExportedModel(os.fspath(source), TORCHSCRIPT, metadata, module)


def _load_exported_program(source: Path) -> ExportedModel:
    import torch

    extra = {meta.EXTRA_FILE: ""}
    # torch.export.load logs each failed attempt's traceback as a warning before it raises
    export_log = logging.getLogger("torch.export")
    level = export_log.level
    export_log.setLevel(logging.ERROR)
    try:
        with name_native_code_opens(source) as name:
            program = torch.export.load(name, extra_files=extra)
    except Exception as error:
        # torch that writes its folder layout (torch.export.pt2_archive) reads no earlier one
        folder_layout = importlib.util.find_spec("torch.export.pt2_archive") is not None
        if not (folder_layout and in_older_torch_layout(source)):
            raise
        raise RuntimeFailure(
            f"torch.export.load cannot load {source}, saved by an older torch (its entries at "
            f"the archive's top) that torch {torch.__version__} cannot read: "
            f"{first_line(error)}",
            "export the model again with this torch: torchkit export CHECKPOINT OUT.pt2",
        ) from error
    finally:
        export_log.setLevel(level)
    metadata = meta.from_extra_file(extra[meta.EXTRA_FILE])
    meta.check_metadata(metadata, os.fspath(source))
    example = _program_input(program)
    if example is not None:
        shape = [n if isinstance(n, int) else None for n in example.shape]
        half = example.dtype == torch.float16
        _record_graph_input(metadata, shape, "float16" if half else "float32")
    return ExportedModel(os.fspath(source), EXPORTED_PROGRAM, metadata, program.module())


def _program_input(program: Any) -> Any:
    """The fake tensor of a torch.export program's first input (its dims ints where fixed,
    symbols where dynamic); None when the program does not say."""
    try:
        first = program.graph_signature.user_inputs[0]
        for node in program.graph.nodes:
            if node.op == "placeholder" and node.name == first:
                return node.meta.get("val")
    except (AttributeError, IndexError, TypeError):
        pass
    return None
