"""The layer table of a model: one row per module call, recorded with forward hooks during one
eval-mode, no-grad forward pass (on a meta-device copy when the model allows it), plus parameter,
mult-add, FLOP and memory totals.

Mult-adds follow torchinfo's definition (per leaf module call, from its parameters: a
convolution's weight and bias are applied at every output position of every sample, any other
layer's parameters once per sample) with one correction: a Linear layer applies its parameters
once per row of its input, i.e. `prod(output.shape[:-1])` times, not once per sample (torchinfo
1.8.0 undercounts Linear layers on 3-D inputs, such as a transformer's MLP, by the sequence
length). Parameter totals count each parameter tensor once, however many modules hold it or
call it. FLOPs come from `torch.utils.flop_counter.FlopCounterMode`, which sees every matmul and
convolution, including the attention products that per-module counting cannot see.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from torchkit.core.errors import TorchkitError, UsageError, first_line

MB = 1_000_000  # torchinfo's (and the SI) megabyte
log = logging.getLogger("torchkit")
TOTAL_KEYS = (
    "total_params",
    "trainable_params",
    "non_trainable_params",
    "total_mult_adds",
    "flops",
    "input_mb",
    "forward_backward_mb",
    "params_mb",
    "buffers_mb",
    "total_mb",
)


@dataclass
class LayerCall:
    """One call of one module during the forward pass."""

    index: int  # call order, from 0 (the model itself)
    depth: int  # nesting of the call: 0 for the model, 1 for what it calls, ...
    name: str  # qualified module name ("" for the model)
    type: str
    input_shape: Any  # a list of ints per tensor, nested as the inputs are
    output_shape: Any
    params: int  # parameters of the module and its submodules, each tensor once
    trainable_params: int  # those of `params` that require grad
    trainable: bool | None  # every parameter trains; None for a module without parameters
    mult_adds: int  # of this call; a container's is the sum over the leaf calls inside it
    call: int  # 1 for the module's first call, 2 for its second...
    leaf: bool


@dataclass
class ModelSummary:
    model: str  # the model's class name
    input_shapes: list[list[int]]
    dtype: str
    device: str
    layers: list[LayerCall]
    total_params: int
    trainable_params: int
    non_trainable_params: int
    total_mult_adds: int
    flops: int | None  # None when FLOP counting was turned off
    input_mb: float
    forward_backward_mb: float  # leaf outputs, kept for the backward pass, and their gradients
    params_mb: float
    buffers_mb: float
    total_mb: float

    def totals(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in TOTAL_KEYS}

    def layers_up_to(self, depth: int | None) -> list[LayerCall]:
        return [row for row in self.layers if depth is None or row.depth <= depth]

    def to_dict(self, depth: int | None = None) -> dict[str, Any]:
        return {
            "model": self.model,
            "input_shapes": self.input_shapes,
            "dtype": self.dtype,
            "device": self.device,
            "layers": [asdict(row) for row in self.layers_up_to(depth)],
            "totals": self.totals(),
        }


# --- shapes --------------------------------------------------------------------------------


def _tensors(obj: Any) -> Iterator[Any]:
    """Every tensor in a (nested) tuple, list or dict."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def shape_of(obj: Any) -> Any:
    """Shapes, nested as the value is: a tensor gives [N, C, H, W], a tuple or list of tensors a
    list of those, a dict a dict of them; anything else its type name."""
    import torch

    if isinstance(obj, torch.Tensor):
        return list(obj.shape)
    if isinstance(obj, (list, tuple)):
        return [shape_of(item) for item in obj]
    if isinstance(obj, dict):
        return {str(key): shape_of(value) for key, value in obj.items()}
    if obj is None:
        return None
    return type(obj).__name__


def _call_inputs(args: tuple, kwargs: dict) -> Any:
    tensor_kwargs = {k: v for k, v in kwargs.items() if any(True for _ in _tensors(v))}
    if len(args) == 1 and not tensor_kwargs:
        return args[0]
    if tensor_kwargs:
        return [*args, tensor_kwargs] if args else tensor_kwargs
    return list(args)


# --- counting ------------------------------------------------------------------------------


def leaf_mult_adds(module: Any, output: Any) -> int:
    """Mult-adds of one call of a leaf module (torchinfo's definition, Linear corrected)."""
    from torch import nn

    first = next(_tensors(output), None)
    if first is None:
        return 0
    shape = list(first.shape)
    batch = shape[0] if shape else 1
    if isinstance(module, nn.modules.conv._ConvNd):
        positions = batch * math.prod(shape[2:])
    elif isinstance(module, nn.Linear):
        positions = math.prod(shape[:-1])
    else:
        positions = batch
    total = 0
    for name, param in module.named_parameters():
        if name in ("weight", "bias"):
            total += positions * param.numel()
        elif "weight" in name or "bias" in name:
            # recurrent layers (weight_ih_l0...) work at every time step of every sample
            total += math.prod(shape[:2]) * param.numel()
    return total


def _param_counts(module: Any) -> tuple[int, int]:
    total = trainable = 0
    for param in module.parameters():
        total += param.numel()
        if param.requires_grad:
            trainable += param.numel()
    return total, trainable


def trainable_label(row: LayerCall) -> str | None:
    """yes, no or partial (some parameters frozen); None for a module without parameters."""
    if not row.params:
        return None
    if row.trainable_params == row.params:
        return "yes"
    return "no" if row.trainable_params == 0 else "partial"


def _storage_key(tensor: Any) -> int:
    """Identifies the memory a tensor lives in; views and in-place results share it. Works on
    the meta device too, where every data pointer is 0."""
    try:
        return tensor.untyped_storage()._cdata
    except (AttributeError, RuntimeError, NotImplementedError):
        return id(tensor)


def _new_output_bytes(args: tuple, output: Any) -> int:
    """Bytes of the output tensors that do not share memory with the inputs (an in-place
    ReLU or a view like Flatten allocates nothing)."""
    inputs = {_storage_key(t) for t in _tensors(args)}
    seen: set[int] = set()
    total = 0
    for tensor in _tensors(output):
        key = _storage_key(tensor)
        if key in inputs or key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


def model_device(model: Any):
    """The device of the model's first parameter or buffer (the CPU for a stateless model)."""
    import torch

    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def model_dtype(model: Any):
    import torch

    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def make_inputs(shapes: Sequence[Sequence[int]], dtype: Any, device: Any) -> list[Any]:
    """Random inputs (uniform in [0, 1), zeros for integer dtypes) from a private generator, so
    the caller's random state is left alone."""
    import torch

    generator = torch.Generator().manual_seed(0)
    inputs = []
    for shape in shapes:
        if any(int(n) <= 0 for n in shape):
            raise UsageError(f"input size {tuple(shape)} has a dimension that is not positive")
        if dtype.is_floating_point:
            tensor = torch.rand(*shape, generator=generator).to(dtype)
        else:
            tensor = torch.zeros(*shape, dtype=dtype)
        inputs.append(tensor.to(device))
    return inputs


class _Recorder:
    """Forward hooks that turn each module call into a LayerCall."""

    def __init__(self, model: Any) -> None:
        self.names: dict[int, str] = {}
        for name, module in model.named_modules():
            self.names.setdefault(id(module), name)
        self.leaves = {id(m) for m in model.modules() if next(m.children(), None) is None}
        self.rows: list[LayerCall] = []
        self.stack: list[tuple[int, LayerCall]] = []
        self.call_counts: dict[int, int] = {}
        self.param_cache: dict[int, tuple[int, int]] = {}
        self.activation_bytes = 0

    def pre_hook(self, module: Any, args: tuple, kwargs: dict) -> None:
        key = id(module)
        self.call_counts[key] = self.call_counts.get(key, 0) + 1
        row = LayerCall(
            index=len(self.rows),
            depth=len(self.stack),
            name=self.names.get(key, ""),
            type=type(module).__name__,
            input_shape=shape_of(_call_inputs(args, kwargs)),
            output_shape=None,
            params=0,
            trainable_params=0,
            trainable=None,
            mult_adds=0,
            call=self.call_counts[key],
            leaf=key in self.leaves,
        )
        self.rows.append(row)
        self.stack.append((key, row))

    def post_hook(self, module: Any, args: tuple, output: Any) -> None:
        key = id(module)
        position = next(
            (i for i in range(len(self.stack) - 1, -1, -1) if self.stack[i][0] == key), None
        )
        if position is None:
            return
        _, row = self.stack.pop(position)
        del self.stack[position:]  # calls that never returned (an exception inside them)
        row.output_shape = shape_of(output)
        # Parameters are read after the call: a lazy module has them only from now on.
        if key not in self.param_cache:
            self.param_cache[key] = _param_counts(module)
        row.params, row.trainable_params = self.param_cache[key]
        row.trainable = row.trainable_params == row.params if row.params else None
        if row.leaf:
            row.mult_adds = leaf_mult_adds(module, output)
            for _, parent in self.stack:
                parent.mult_adds += row.mult_adds
            self.activation_bytes += _new_output_bytes(args, output)


def meta_copy(model: Any) -> Any:
    """A copy of `model` whose parameters, buffers and tensor attributes live on the meta
    device: same structure, same shapes, dtypes and requires_grad flags, no memory and no
    compute. Tied parameters stay tied (one meta tensor per original tensor)."""
    import copy

    import torch

    memo: dict[int, Any] = {}
    for module in model.modules():
        for value in (
            *module._parameters.values(),
            *module._buffers.values(),
            *vars(module).values(),
        ):
            if isinstance(value, torch.Tensor) and id(value) not in memo:
                memo[id(value)] = _to_meta(value)
    return copy.deepcopy(model, memo)


def _to_meta(tensor: Any) -> Any:
    import torch
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    # A lazy module's placeholders stay placeholders: the copy materialises them on meta.
    if isinstance(tensor, UninitializedParameter):
        return UninitializedParameter(tensor.requires_grad, device="meta", dtype=tensor.dtype)
    if isinstance(tensor, UninitializedBuffer):
        return UninitializedBuffer(tensor.requires_grad, device="meta", dtype=tensor.dtype)
    meta = torch.empty_like(tensor, device="meta")
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(meta, requires_grad=tensor.requires_grad)
    return meta


def _record(model: Any, inputs: list[Any], count_flops: bool) -> tuple[_Recorder, int | None]:
    """One eval-mode, no-grad forward pass with the hooks; every module's mode is put back."""
    import torch

    recorder = _Recorder(model)
    modes = [(m, m.training) for m in model.modules()]
    handles = []
    flops = None
    # MultiheadAttention's inference fast path is one fused op FlopCounterMode cannot count.
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        for module in {id(m): m for m in model.modules()}.values():
            handles.append(module.register_forward_pre_hook(recorder.pre_hook, with_kwargs=True))
            handles.append(module.register_forward_hook(recorder.post_hook, always_call=True))
        model.eval()
        with torch.no_grad():
            if count_flops:
                from torch.utils.flop_counter import FlopCounterMode

                with FlopCounterMode(display=False) as counter:
                    model(*inputs)
                flops = int(counter.get_total_flops())
            else:
                model(*inputs)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        for handle in handles:
            handle.remove()
        for module, training in modes:
            module.training = training
    return recorder, flops


def summarize(
    model: Any,
    input_shapes: Sequence[Sequence[int]] | None = None,
    *,
    inputs: Sequence[Any] | None = None,
    dtype: Any = None,
    count_flops: bool = True,
    on_meta: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ModelSummary:
    """Summarize `model` on random inputs of `input_shapes` (full shapes, batch included) or on
    the given `inputs` (tensors).

    The forward pass runs on a meta-device copy of the model (`on_meta`): shapes, parameters
    and FLOPs come out the same, at no compute and no memory. A model that cannot run there
    (it reads tensor values: `.item()`, data-dependent shapes...) runs for real instead, on its
    own device with inputs in its dtype (or `dtype`), in eval mode under no_grad, with every
    module's train/eval flag put back afterwards. Either way the model is not moved, changed or
    kept.
    """
    import torch

    if inputs is None:
        if not input_shapes:
            raise UsageError("no input size given", "pass --input-size, e.g. 3,224,224")
        input_dtype = dtype or model_dtype(model)
        device = model_device(model)
        specs = [(tuple(int(n) for n in shape), input_dtype) for shape in input_shapes]
        for shape, _ in specs:
            if any(n <= 0 for n in shape):
                raise UsageError(f"input size {shape} has a dimension that is not positive")
    else:
        inputs = list(inputs)
        device = inputs[0].device if inputs else model_device(model)
        specs = [(tuple(t.shape), t.dtype) for t in inputs]

    recorder = flops = state = None
    if on_meta:
        if progress is not None:
            progress("forward pass on the meta device")
        try:
            copy_on_meta = meta_copy(model)
            meta_inputs = [torch.empty(shape, dtype=dt, device="meta") for shape, dt in specs]
            recorder, flops = _record(copy_on_meta, meta_inputs, count_flops)
            state = _state_sizes(copy_on_meta)  # lazy parameters exist only in the copy
        except Exception as error:  # noqa: BLE001 - any failure means: run it for real
            log.info("the meta-device pass failed (%s); running the model for real", error)
            recorder = None
        finally:
            copy_on_meta = None
    if recorder is None:
        if progress is not None:
            progress(f"forward pass on {device}")
        if inputs is None:
            inputs = make_inputs([shape for shape, _ in specs], specs[0][1], device)
        try:
            recorder, flops = _record(model, inputs, count_flops)
            state = _state_sizes(model)
        except TorchkitError:
            raise
        except Exception as error:
            shapes = ", ".join(str(shape) for shape, _ in specs)
            raise UsageError(
                f"{type(model).__name__} cannot run on an input of shape {shapes}: "
                f"{first_line(error)}",
                "check --input-size (and --dtype)",
            ) from error

    total_params, trainable_params, param_bytes, buffer_bytes = state
    input_bytes = sum(math.prod(shape) * _element_size(dt) for shape, dt in specs)
    forward_backward = 2 * recorder.activation_bytes
    return ModelSummary(
        model=type(model).__name__,
        input_shapes=[list(shape) for shape, _ in specs],
        dtype=str(specs[0][1]).removeprefix("torch.") if specs else "",
        device=str(device),
        layers=recorder.rows,
        total_params=total_params,
        trainable_params=trainable_params,
        non_trainable_params=total_params - trainable_params,
        total_mult_adds=sum(row.mult_adds for row in recorder.rows if row.leaf),
        flops=flops,
        input_mb=input_bytes / MB,
        forward_backward_mb=forward_backward / MB,
        params_mb=param_bytes / MB,
        buffers_mb=buffer_bytes / MB,
        total_mb=(input_bytes + forward_backward + param_bytes + buffer_bytes) / MB,
    )


def _state_sizes(model: Any) -> tuple[int, int, int, int]:
    """Parameters (total, trainable), parameter bytes and buffer bytes, each tensor once."""
    params = {id(p): p for p in model.parameters()}.values()
    buffers = {id(b): b for b in model.buffers()}.values()
    return (
        sum(p.numel() for p in params),
        sum(p.numel() for p in params if p.requires_grad),
        sum(p.numel() * p.element_size() for p in params),
        sum(b.numel() * b.element_size() for b in buffers),
    )


def _element_size(dtype: Any) -> int:
    import torch

    return torch.empty((), dtype=dtype, device="meta").element_size()
