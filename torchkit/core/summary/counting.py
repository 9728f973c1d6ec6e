"""The layer table of a model: one row per module call, recorded with forward hooks during one
eval-mode, no-grad forward pass (on a meta-device copy when the model allows it), plus parameter,
mult-add, FLOP and memory totals.

Mult-adds follow torchinfo's definition (per leaf module call, from its parameters: a convolution's
weight and bias are applied at every output position of every sample, any other layer's parameters
once per sample), corrected where it is wrong: a Linear layer applies its parameters once per row
of its input, i.e. `prod(output.shape[:-1])` times, not once per sample (torchinfo 1.8.0
undercounts Linear layers on 3-D inputs, such as a transformer's MLP, by the sequence length), a
transposed convolution's weight works at every input position, not output position (torchinfo
overcounts by stride**d), and an unbatched convolution's positions are counted without taking its
channels for a batch; and only what runs counts: a parameter that no operation of the call reads (a
forward that returns its input, a bias it skips) adds no mult-adds, as it adds no FLOPs (a dispatch
mode records what the operations read). A matrix product on a parameter outside every leaf call (a
functional `F.linear`: `nn.MultiheadAttention`'s input and output projections, torchvision Swin's
qkv and proj), which per-leaf counting never sees, counts its mult-adds, and a parameter bias once
per row, as a Linear layer's (a convolution with a parameter weight: at every position, as a
convolution layer's); so does one inside a leaf call of any module but a Linear,
convolution or recurrent layer (`x @ self.w` in a user's module, a recurrent cell), whose
parameters torchinfo counts once per sample when named weight or bias (an LSTMCell's once per
sample and hidden unit) and otherwise not at all. Parameter totals count each parameter tensor
once, however many modules hold it or call it. FLOPs come from
`torch.utils.flop_counter.FlopCounterMode`, which sees every matmul and convolution, including the
attention products that per-module counting cannot see.

A pruned layer (`torch.nn.utils.prune`) holds `weight_orig` and a `weight_mask` buffer and computes
`weight = weight_orig * weight_mask` before each call; its mult-adds are those of the dense
operation the forward runs (pruned zeros included), counted as for `weight`.

Without a forward pass (`summarize_tree`: no input size, or a TorchScript module, on which hooks
cannot run) the rows come from the module tree: parameters only, mult-adds unknown (None).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from torchkit.core.input_size import check_numel
from torchkit.core.io.errors import TorchkitError, UsageError, first_line
from torchkit.core.io.sizes import gigabytes_text
from torchkit.core.models.image_size import (
    ImageSizeError,
    image_size_refusal,
    meta_copy,
    one_value_per_channel,
)
from torchkit.core.models.inputs import iter_tensors, make_inputs
from torchkit.core.runtime.memory import limit_words
from torchkit.core.runtime.plain_shapes import plain_shapes
from torchkit.core.summary.attention import AttentionCounter, AttentionMatrices
from torchkit.core.summary.flop_counter_import import import_flop_counter
from torchkit.torchvision_without_dynamo import without_dynamo

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
    "attention_mb",
    "largest_attention_mb",
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
    mult_adds: int | None  # of this call (a container's: the sum over the leaf calls inside
    # it); None in a summary without a hooked forward pass
    call: int  # 1 for the module's first call, 2 for its second...
    leaf: bool


class MetaPassFailed(Exception):
    """The meta-device pass could not run the model, and `summarize` was told not to run it for
    real (a model built on the meta device has no values to run with)."""


@dataclass(frozen=True)
class InputSpec:
    """One input of the forward pass: its full shape (batch included), its dtype (None: the
    default, `--dtype` or the model's), and its keyword (None: passed positionally)."""

    shape: tuple[int, ...]
    dtype: Any = None
    name: str | None = None


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
    total_mult_adds: int | None  # None without a hooked forward pass (see summarize_tree)
    flops: int | None  # None when FLOP counting was turned off or no forward ran
    input_mb: float | None
    forward_backward_mb: float | None  # outputs of calls with no module call inside (leaves),
    # kept for backward, and their gradients
    params_mb: float
    buffers_mb: float
    total_mb: float | None
    # name (None when positional), shape and dtype of each input, in the order given
    inputs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was not measured, and why
    # The most one leaf call holds at once besides the model's inputs: its inputs and the new
    # outputs it makes, each storage once. With the inputs, a lower bound of an inference
    # pass's peak (benchmark's check of a CPU batch); None without a hooked forward pass.
    largest_call_mb: float | None = None
    # The attention matrices the pass made (queries x keys for each head and sample), which no
    # layer's output shows: export's and benchmark's memory checks count them (attention.py).
    attention: AttentionMatrices = field(default_factory=AttentionMatrices)

    @property
    def attention_mb(self) -> float | None:
        """Every attention matrix of the pass (what a pass that keeps them all holds: training
        through attention written by hand); None without a hooked forward pass."""
        return None if self.largest_call_mb is None else self.attention.total() / MB

    @property
    def largest_attention_mb(self) -> float | None:
        """The largest one (what a pass that frees each before the next holds at once)."""
        return None if self.largest_call_mb is None else self.attention.largest() / MB

    def totals(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in TOTAL_KEYS}

    def layers_up_to(self, depth: int | None) -> list[LayerCall]:
        return [row for row in self.layers if depth is None or row.depth <= depth]

    def to_dict(self, depth: int | None = None) -> dict[str, Any]:
        return {
            "model": self.model,
            "input_shapes": self.input_shapes,
            "inputs": self.inputs,
            "dtype": self.dtype,
            "device": self.device,
            "layers": [asdict(row) for row in self.layers_up_to(depth)],
            "totals": self.totals(),
            "notes": self.notes,
        }


# --- shapes --------------------------------------------------------------------------------


def shape_of(obj: Any) -> Any:
    """Shapes, nested as the value is: a tensor gives [N, C, H, W], a tuple or list of tensors a
    list of those ("empty tuple", "empty list": not a 0-d tensor's []), a dict a dict of them;
    anything else its type name."""
    import torch

    if isinstance(obj, torch.Tensor):
        return list(obj.shape)
    if isinstance(obj, (list, tuple)):
        return [shape_of(item) for item in obj] if obj else f"empty {type(obj).__name__}"
    if isinstance(obj, dict):
        return {str(key): shape_of(value) for key, value in obj.items()}
    if obj is None:
        return None
    return type(obj).__name__


def _call_inputs(args: tuple, kwargs: dict) -> Any:
    tensor_kwargs = {k: v for k, v in kwargs.items() if any(True for _ in iter_tensors(v))}
    if len(args) == 1 and not tensor_kwargs:
        return args[0]
    if tensor_kwargs:
        return [*args, tensor_kwargs] if args else tensor_kwargs
    return list(args) if args else None  # called without inputs: nothing to show


# --- counting ------------------------------------------------------------------------------


def leaf_mult_adds(
    module: Any,
    output: Any,
    used: set[int] | None = None,
    inputs: Any = None,
    *,
    counted: set[int] = frozenset(),
    computed: dict[str, Any] | None = None,
) -> int:
    """Mult-adds of one call of a leaf module (torchinfo's definition, Linear and transposed
    and unbatched convolutions corrected).

    `used`: the storages (`_storage_key`) of the tensors an operation read during the call, as
    the summary's forward pass records them; a parameter no operation read (a forward that
    returns its input, a bias it skips) adds nothing. None: every parameter counts. `inputs`:
    the call's arguments, whose first tensor a transposed convolution's weight is applied at
    every position of (None: at every output position, torchinfo's overcount by stride**d).
    `counted`: the storages of parameters whose matrix products were counted during the call
    (a leaf without a position rule, `_has_position_rule`), which add nothing more here.
    `computed`: the tensors the module's parametrizations gave during the call, by name."""
    from torch import nn

    first = next(iter_tensors(output), None)
    if first is None:
        return 0
    shape = list(first.shape)
    batch = shape[0] if shape else 1
    weight_positions = None
    if isinstance(module, nn.modules.conv._ConvNd):
        # every position of every sample: all but the channel dimension (which an unbatched
        # input's output has first; torchinfo took it for the batch)
        channel = -len(module.kernel_size) - 1
        positions = math.prod(shape) // max(1, shape[channel])
        source = next(iter_tensors(inputs), None) if module.transposed else None
        if source is not None and source.ndim == len(shape):
            # each input position scatters the whole kernel: the weight works there, the bias
            # at every output position
            weight_positions = math.prod(source.shape) // max(1, source.shape[channel])
    elif isinstance(module, nn.Linear):
        positions = math.prod(shape[:-1])
    else:
        positions = batch
    total = 0
    for name, applied in _applied_tensors(module, computed):
        if used is not None and _storage_key(applied) not in used:
            continue  # no operation of this call read it: nothing ran with it
        if _storage_key(applied) in counted:
            continue  # its matrix products were counted as they ran
        if name == "weight" and weight_positions is not None:
            total += weight_positions * applied.numel()
        elif name in ("weight", "bias"):
            total += positions * applied.numel()
        elif "weight" in name or "bias" in name:
            # recurrent layers (weight_ih_l0...) work at every time step of every sample: all
            # but the features of an RNN's output, batched (L, N, H) or not (L, H)
            steps = shape[:-1] if isinstance(module, nn.RNNBase) else shape[:2]
            total += math.prod(steps) * applied.numel()
    return total


# The parameters a forward pre-hook computes a layer's tensor from: `torch.nn.utils.prune`'s
# weight_orig (times its mask), `weight_norm`'s weight_g and weight_v, `spectral_norm`'s
# weight_orig.
_HOOK_SOURCES = ("_orig", "_g", "_v")


def _applied_tensors(module: Any, computed: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
    """(name, tensor) of what a leaf's operations apply: its parameters, except where a tensor
    is computed from them before each call, whose computed tensor counts under its own name
    (`weight`), as the dense layer's would: one a forward pre-hook sets (pruning, the older
    `torch.nn.utils.weight_norm` and `spectral_norm`), or one a parametrization makes
    (`torch.nn.utils.parametrizations.weight_norm`...; `computed`: the tensors its
    `parametrizations` gave during the call, by name). Their sources add nothing more."""
    import torch

    derived: dict[str, Any] = {}
    for hook in module._forward_pre_hooks.values():
        name = getattr(hook, "name", None) or getattr(hook, "_tensor_name", None)
        if isinstance(name, str) and isinstance(vars(module).get(name), torch.Tensor):
            derived[name] = vars(module)[name]
    sources = {name + suffix for name in derived for suffix in _HOOK_SOURCES}
    applied = [
        (name, param)
        for name, param in module.named_parameters()
        if name not in sources and not name.startswith("parametrizations.")
    ]
    return applied + list(derived.items()) + list((computed or {}).items())


def is_leaf(module: Any) -> bool:
    """A module that calls no other module of its own: no children, or only the
    `parametrizations` that compute its parametrized tensors (a `weight_norm` layer's)."""
    from torch.nn.utils.parametrize import is_parametrized

    children = [name for name, _ in module.named_children()]
    return not children or (children == ["parametrizations"] and is_parametrized(module))


def _parametrization_owners(model: Any) -> dict[int, tuple[int, str]]:
    """id of each ParametrizationList -> (id of the module it belongs to, the tensor's name)."""
    from torch.nn.utils.parametrize import is_parametrized

    owners = {}
    for module in model.modules():
        if is_parametrized(module):
            for name, parametrization in module.parametrizations.items():
                owners[id(parametrization)] = (id(module), name)
    return owners


def _has_position_rule(module: Any) -> bool:
    """Linear, convolutions and recurrent layers: `leaf_mult_adds` knows where their weights
    work. Any other leaf's matrix products on its parameters (`x @ self.w` in a user's module)
    are counted as they run, as products outside every leaf are: torchinfo's once-per-sample
    rule, which also leaves out a parameter not named weight or bias, would miss the rows."""
    from torch import nn

    return isinstance(module, (nn.Linear, nn.modules.conv._ConvNd, nn.RNNBase))


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
    inputs = {_storage_key(t) for t in iter_tensors(args)}
    seen: set[int] = set()
    total = 0
    for tensor in iter_tensors(output):
        key = _storage_key(tensor)
        if key in inputs or key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


def _tensor_bytes(obj: Any, *, skip: set[int]) -> int:
    """Bytes of the tensors in `obj`, each storage once, leaving out the storages in `skip`."""
    sizes: dict[int, int] = {}
    for tensor in iter_tensors(obj):
        key = _storage_key(tensor)
        if key not in skip:
            sizes[key] = max(sizes.get(key, 0), tensor.numel() * tensor.element_size())
    return sum(sizes.values())


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


class _Recorder:
    """Forward hooks that turn each module call into a LayerCall."""

    def __init__(self, model: Any) -> None:
        self.names: dict[int, str] = {}
        for name, module in model.named_modules():
            self.names.setdefault(id(module), name)
        self.leaves = {id(m) for m in model.modules() if is_leaf(m)}
        # A parametrized tensor (weight_norm's weight) is computed by a call of its
        # ParametrizationList inside the layer's call: what it gave, by the layer's id.
        self.parametrization_owners = _parametrization_owners(model)
        self.computed: dict[int, dict[str, Any]] = {}
        self.rows: list[LayerCall] = []
        self.stack: list[tuple[int, LayerCall]] = []
        self.call_counts: dict[int, int] = {}
        self.param_cache: dict[int, tuple[int, int]] = {}
        self.activation_bytes = 0
        # The storages of the model's inputs, parameters and buffers: not a call's own memory
        self.model_input_keys: set[int] = set()
        self.largest_call_bytes = 0
        # Row index of each leaf call in progress -> the storages its operations read so far
        # (filled by _UsedTensors while `tracking`; without it every parameter counts).
        self.tracking = False
        self.leaf_reads: dict[int, set[int]] = {}
        # Every leaf call's mult-adds and every functional matrix product's on a parameter
        # (`functional_matmul`), summed; the parameters' storages, found at the first product.
        self.total_mult_adds = 0
        self.model = model
        self.param_keys: set[int] | None = None
        self.last_product: int | None = None  # the output storage of the last counted product
        # Row index of each leaf call in progress whose own matrix products on its parameters
        # are counted as products (a leaf torchinfo's rule has no positions for: `x @ self.w`
        # in a user's module) -> the storages of the parameters counted so.
        self.product_leaves: dict[int, set[int]] = {}
        self.attention = AttentionCounter(_storage_key, model)

    def functional_matmul(self, args: tuple) -> bool:
        """Count a matrix product (mm, addmm, bmm, baddbmm) that reads a parameter outside
        every leaf call (a functional `F.linear`: MultiheadAttention's projections, Swin's qkv):
        its mult-adds, and an addmm's parameter bias once per output, go to every call in
        progress. Whether it was counted."""
        if self.param_keys is None:
            self.param_keys = {_storage_key(p) for p in self.model.parameters()}
        *bias, a, b = args[:3] if len(args) >= 3 else args[:2]
        keys = {_storage_key(a), _storage_key(b)} & self.param_keys
        if not keys:
            return False
        count = math.prod(a.shape) * b.shape[-1]
        if bias and _storage_key(bias[0]) in self.param_keys:
            count += math.prod(a.shape[:-1]) * b.shape[-1]
            keys.add(_storage_key(bias[0]))
        self._add_functional(count, keys)
        return True

    def functional_conv(self, args: tuple, output: Any) -> None:
        """Count a convolution (`F.conv2d(x, self.kernel)`) whose weight is a parameter, where
        a matrix product on it would count: the weight at every output position (at every input
        position for a transposed one, as a layer's), a parameter bias once per output."""
        if self.param_keys is None:
            self.param_keys = {_storage_key(p) for p in self.model.parameters()}
        source, weight, bias = args[:3]
        if _storage_key(weight) not in self.param_keys:
            return
        per_position = weight.numel() // max(1, weight.shape[0])
        transposed = len(args) > 6 and bool(args[6])
        count = (source.numel() if transposed else output.numel()) * per_position
        keys = {_storage_key(weight)}
        if bias is not None and _storage_key(bias) in self.param_keys:
            count += output.numel()
            keys.add(_storage_key(bias))
        self._add_functional(count, keys)

    def functional_bias(self, args: tuple) -> None:
        """A parameter added to the last counted product (the bias of an `F.linear` on 3-D
        inputs, which runs as a product, then an add): once per output, as addmm's."""
        tensors = [arg for arg in args[:2] if hasattr(arg, "shape")]
        keys = [_storage_key(t) for t in tensors]
        if len(keys) == 2 and self.last_product in keys and self.param_keys:
            other = keys[1] if keys[0] == self.last_product else keys[0]
            if other in self.param_keys:
                self._add_functional(tensors[keys.index(self.last_product)].numel(), {other})
        self.last_product = None

    def counts_products(self) -> bool:
        """Whether a matrix product on a parameter counts now: outside every leaf call, or in
        a leaf call that counts its own products."""
        if not self.stack:
            return False
        return not self.leaf_reads or self.stack[-1][1].index in self.product_leaves

    def _add_functional(self, count: int, keys: set[int]) -> None:
        self.total_mult_adds += count
        for _, row in self.stack:
            row.mult_adds += count
        if self.stack and self.stack[-1][1].index in self.product_leaves:
            self.product_leaves[self.stack[-1][1].index] |= keys

    def pre_hook(self, module: Any, args: tuple, kwargs: dict) -> None:
        self.attention.module_called(module, args, kwargs)
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
        if row.leaf:
            self.computed.pop(key, None)
            self.leaf_reads[row.index] = set()
            if not _has_position_rule(module):
                self.product_leaves[row.index] = set()

    def post_hook(self, module: Any, args: tuple, output: Any) -> None:
        key = id(module)
        position = next(
            (i for i in range(len(self.stack) - 1, -1, -1) if self.stack[i][0] == key), None
        )
        if position is None:
            return
        _, row = self.stack.pop(position)
        for _, unfinished in self.stack[position:]:
            self.leaf_reads.pop(unfinished.index, None)
        del self.stack[position:]  # calls that never returned (an exception inside them)
        row.output_shape = shape_of(output)
        owner = self.parametrization_owners.get(key)
        if owner is not None:
            self.computed.setdefault(owner[0], {})[owner[1]] = output
        # Parameters are read after the call: a lazy module has them only from now on.
        if key not in self.param_cache:
            self.param_cache[key] = _param_counts(module)
        row.params, row.trainable_params = self.param_cache[key]
        row.trainable = row.trainable_params == row.params if row.params else None
        if row.leaf:
            reads = self.leaf_reads.pop(row.index, None)
            products = self.product_leaves.pop(row.index, set())
            count = leaf_mult_adds(
                module,
                output,
                reads if self.tracking else None,
                args,
                counted=products,
                computed=self.computed.pop(key, None),
            )
            row.mult_adds += count  # after the products counted during the call
            self.total_mult_adds += count
            for _, parent in self.stack:
                parent.mult_adds += count
        if row.leaf or row.index == len(self.rows) - 1:
            # a call inside which no other module ran (a leaf, or MultiheadAttention, whose
            # out_proj is never called): its outputs are what the forward pass keeps
            made = _new_output_bytes(args, output)
            self.activation_bytes += made
            held = _tensor_bytes(args, skip=self.model_input_keys) + made
            self.largest_call_bytes = max(self.largest_call_bytes, held)


def _add_storages(obj: Any, found: set[int]) -> None:
    """The storages of the tensors in `obj` (nested in tuples, lists and dicts) into `found`."""
    import torch

    if isinstance(obj, torch.Tensor):
        found.add(_storage_key(obj))
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _add_storages(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _add_storages(item, found)


def _used_tensors(recorder: _Recorder) -> Any:
    """A dispatch mode that records, for each leaf call in progress, the storages of the
    tensors the operations it runs read: an operation that runs reaches the dispatcher, and
    reading a shape or a dtype does not. A parameter is counted only if it is one of them."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    matmuls = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
    convolutions = {aten.convolution.default, aten._convolution.default}

    class UsedTensors(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            _check_meta_indices(func, args)
            # A view (alias, detach, t) reads nothing: FlopCounterMode's module tracker aliases
            # each call's outputs, which made a forward that returns a parameter as it is
            # count that parameter's mult-adds (and a Linear's `t` is read by its addmm).
            functional = recorder.counts_products()
            product = functional and func in matmuls and recorder.functional_matmul(args)
            if functional and func is aten.add.Tensor:
                recorder.functional_bias(args)
            if recorder.leaf_reads and not getattr(func, "is_view", False):
                found: set[int] = set()
                _add_storages(args, found)
                _add_storages(kwargs, found)
                for reads in recorder.leaf_reads.values():
                    reads |= found
            result = func(*args, **(kwargs or {}))
            if product:
                recorder.last_product = _storage_key(result)
            elif functional and func in convolutions:
                recorder.functional_conv(args, result)
            recorder.attention.dispatched(func, args, result)
            return result

    return UsedTensors()


# Operations whose meta kernels accept float indices that their real kernels refuse (torch
# 2.11's embedding, every version's index_select): (position of the indices, the real error).
_INDEX_ARGUMENTS = {
    "aten::embedding": (
        1,
        "Expected tensor for argument #1 'indices' to have one of the following scalar types: "
        "Long, Int; but got {dtype} instead",
    ),
    "aten::index_select": (2, "index_select(): Expected dtype int32 or int64 for index"),
}


def _check_meta_indices(func: Any, args: tuple) -> None:
    """Raise the real kernel's error where a meta kernel would let non-integer indices pass,
    so that the meta-device pass refuses what a real forward pass refuses."""
    import torch

    checked = _INDEX_ARGUMENTS.get(func._schema.name)
    if checked is None or len(args) <= checked[0]:
        return
    indices = args[checked[0]]
    if (
        isinstance(indices, torch.Tensor)
        and indices.device.type == "meta"
        and indices.dtype not in (torch.int64, torch.int32)
    ):
        raise RuntimeError(checked[1].format(dtype=indices.dtype))


class _GlobalOnly:
    """Stands in for FlopCounterMode's module tracker, which attributes FLOPs to the modules
    running (we read only the total, its "Global" entry) and fails on a view of a parameter
    passed to a module under no_grad (it requires grad and has no grad_fn: timm's CaiT passes
    its expanded class token so)."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _GlobalOnly:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _flop_counter() -> Any:
    """A FlopCounterMode that counts the total only, without tracking modules."""
    counter = import_flop_counter().FlopCounterMode(display=False)
    if "Global" in getattr(getattr(counter, "mod_tracker", None), "parents", ()):
        counter.mod_tracker = _GlobalOnly()
    return counter


def _record(
    model: Any,
    inputs: list[Any],
    count_flops: bool,
    kwargs: dict[str, Any] | None = None,
    train_mode: bool = False,
) -> tuple[_Recorder, int | None]:
    """One no-grad forward pass with the hooks, in eval mode (training mode with
    `train_mode`); every module's mode is put back."""
    import torch
    from torch.nn.parameter import is_lazy  # an unsized lazy parameter has no storage yet

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
        model.train(train_mode)
        state = [t for t in (*model.parameters(), *model.buffers()) if not is_lazy(t)]
        _add_storages([inputs, kwargs, state], recorder.model_input_keys)
        recorder.tracking = True
        # The dispatch modes' first calls would import torch._dynamo (2 s), and the meta
        # kernels and references they run sympy (2-5 s): neither is needed.
        attention_calls = recorder.attention.calls()
        with (
            torch.no_grad(),
            without_dynamo(),
            plain_shapes(),
            attention_calls,
            _used_tensors(recorder),
        ):
            if count_flops:
                with _flop_counter() as counter:
                    model(*inputs, **(kwargs or {}))
                flops = int(counter.get_total_flops())
            else:
                model(*inputs, **(kwargs or {}))
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        for handle in handles:
            handle.remove()
        for module, training in modes:
            module.training = training
    return recorder, flops


def _normalise_specs(input_shapes: Sequence[Any] | None, default_dtype: Any) -> list[InputSpec]:
    """InputSpecs from full shapes (tuples of ints) or InputSpecs, each with a dtype."""
    if not input_shapes:
        raise UsageError("no input size given", "pass --input-size, e.g. 3,224,224")
    specs = []
    for item in input_shapes:
        spec = item if isinstance(item, InputSpec) else InputSpec(tuple(item))
        shape = tuple(int(n) for n in spec.shape)
        if any(n <= 0 for n in shape):
            raise UsageError(f"input size {shape} has a dimension that is not positive")
        check_numel(shape, shape)
        specs.append(InputSpec(shape, spec.dtype or default_dtype, spec.name))
    names = [spec.name for spec in specs if spec.name is not None]
    if len(set(names)) != len(names):
        raise UsageError("an input name is given twice", "name each keyword input once")
    return specs


def _free_memory(device: Any) -> int | None:
    """Bytes that can be allocated on `device` now: free GPU memory on CUDA, on the CPU
    `available_memory`'s (MemAvailable, or a cgroup's limit where that leaves less); None where
    it cannot be told."""
    import torch

    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        if device.type == "cpu":
            from torchkit.core.runtime.memory import available_memory

            return available_memory()
    except (RuntimeError, OSError, ValueError):
        return None
    return None


def check_inputs_fit(specs: Sequence[InputSpec], device: Any) -> None:
    """Refuse, before allocating them, inputs that the device's free memory cannot hold (a
    real forward pass would fail there, or push the machine into swap)."""
    needed = sum(math.prod(s.shape) * _element_size(s.dtype) for s in specs)
    free = _free_memory(device)
    if free is not None and needed > free:
        raise UsageError(
            f"an input of shape {_shapes_text(specs)} takes {gigabytes_text(needed)}, more than "
            f"the {gigabytes_text(free)} free on {device}{limit_words(free)}",
            "give a smaller --input-size or --batch-size",
        )


def _split(values: Sequence[Any], specs: Sequence[InputSpec]) -> tuple[list[Any], dict[str, Any]]:
    """Positional arguments (in order) and keyword arguments for the forward call."""
    args = [value for value, spec in zip(values, specs, strict=True) if spec.name is None]
    kwargs = {spec.name: value for value, spec in zip(values, specs, strict=True) if spec.name}
    return args, kwargs


def _input_descriptions(specs: Sequence[InputSpec]) -> list[dict[str, Any]]:
    return [{"name": s.name, "shape": list(s.shape), "dtype": _dtype_name(s.dtype)} for s in specs]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def is_script_module(model: Any) -> bool:
    import torch

    return isinstance(model, torch.jit.ScriptModule)


def summarize(
    model: Any,
    input_shapes: Sequence[Any] | None = None,
    *,
    inputs: Sequence[Any] | None = None,
    dtype: Any = None,
    count_flops: bool = True,
    on_meta: bool = True,
    train_mode: bool = False,
    progress: Callable[[str], None] | None = None,
    run_for_real: bool = True,
) -> ModelSummary:
    """Summarize `model` on random inputs of `input_shapes` (full shapes, batch included, or
    InputSpecs with a dtype and a keyword each) or on the given `inputs` (tensors, positional).

    The forward pass runs on a meta-device copy of the model (`on_meta`): shapes, parameters
    and FLOPs come out the same, at no compute and no memory. A model that cannot run there
    (it reads tensor values: `.item()`, data-dependent shapes...) runs for real instead, on its
    own device with inputs in its dtype (or `dtype`), under no_grad, with every module's
    train/eval flag put back afterwards. It runs in eval mode, or in training mode with
    `train_mode` (then a real run's buffers, such as BatchNorm's running statistics, and the
    random state are put back too). Either way the model is not moved, changed or kept.

    A TorchScript module cannot take hooks: its rows come from the module tree (see
    `summarize_tree`), with the model's output shape and FLOPs from one forward pass.
    """
    import torch

    if inputs is None:
        input_dtype = dtype or model_dtype(model)
        device = model_device(model)
        specs = _normalise_specs(input_shapes, input_dtype)
    else:
        inputs = list(inputs)
        device = inputs[0].device if inputs else model_device(model)
        specs = [InputSpec(tuple(t.shape), t.dtype) for t in inputs]
        input_dtype = specs[0].dtype if specs else model_dtype(model)
    if is_script_module(model):
        return _summarize_script(model, specs, inputs, device, input_dtype, count_flops, train_mode)

    recorder = flops = state = None
    if on_meta:
        if progress is not None:
            progress("forward pass on the meta device")
        try:
            copy_on_meta = meta_copy(model)
            meta_args, meta_kwargs = _split(
                [torch.empty(s.shape, dtype=s.dtype, device="meta") for s in specs], specs
            )
            recorder, flops = _record(copy_on_meta, meta_args, count_flops, meta_kwargs, train_mode)
            state = _state_sizes(copy_on_meta)  # lazy parameters exist only in the copy
        except Exception as error:  # noqa: BLE001 - any failure means: run it for real
            if not run_for_real:
                raise MetaPassFailed(first_line(error)) from error
            log.info("the meta-device pass failed (%s); running the model for real", error)
            recorder = None
        finally:
            copy_on_meta = None
    if recorder is None:
        if progress is not None:
            progress(f"forward pass on {device}")
        if inputs is None:
            check_inputs_fit(specs, device)
            inputs = make_inputs([s.shape for s in specs], None, device, [s.dtype for s in specs])
        args, kwargs = _split(inputs, specs)
        try:
            with _state_kept(model, device, enabled=train_mode):
                recorder, flops = _record(model, args, count_flops, kwargs, train_mode)
            state = _state_sizes(model)
        except TorchkitError:
            raise
        except Exception as error:
            refusal = _image_size_refusal(model, specs, error, train_mode)
            if refusal is not None:
                raise refusal from error
            raise _run_failure(type(model).__name__, specs, error) from error

    total_params, trainable_params, param_bytes, buffer_bytes = state
    input_bytes = sum(math.prod(s.shape) * _element_size(s.dtype) for s in specs)
    forward_backward = 2 * recorder.activation_bytes
    return ModelSummary(
        model=type(model).__name__,
        input_shapes=[list(s.shape) for s in specs],
        dtype=_dtype_name(input_dtype),
        device=str(device),
        layers=recorder.rows,
        total_params=total_params,
        trainable_params=trainable_params,
        non_trainable_params=total_params - trainable_params,
        total_mult_adds=recorder.total_mult_adds,
        flops=flops,
        input_mb=input_bytes / MB,
        forward_backward_mb=forward_backward / MB,
        params_mb=param_bytes / MB,
        buffers_mb=buffer_bytes / MB,
        total_mb=(input_bytes + forward_backward + param_bytes + buffer_bytes) / MB,
        inputs=_input_descriptions(specs),
        largest_call_mb=recorder.largest_call_bytes / MB,
        attention=recorder.attention.found(),
    )


def _image_size_refusal(
    model: Any, specs: Sequence[InputSpec], error: Exception, train_mode: bool = False
) -> ImageSizeError | None:
    """For one batch of square images too small for the model: the refusal naming the smallest
    size it takes (`image_size_refusal`, as every command that runs a model says it)."""
    if len(specs) != 1 or specs[0].name is not None:
        return None
    dtype = specs[0].dtype
    if dtype is not None and not dtype.is_floating_point:
        return None
    return image_size_refusal(
        model, type(model).__name__, specs[0].shape, error, dtype=dtype, training=train_mode
    )


def _run_failure(name: str, specs: Sequence[InputSpec], error: Exception) -> UsageError:
    """The refusal of a forward pass that failed: what failed, and what to change."""
    return UsageError(
        f"{name} cannot run on an input of shape {_shapes_text(specs)}: {first_line(error)}",
        _run_failure_hint(error, specs),
    )


# How torch words an input of a dtype a layer does not take: "Input type (long int) and bias
# type (float) should be the same", "\"slow_conv2d_cpu\" not implemented for 'Bool'", "expected
# scalar type Float but found Long", "mat1 and mat2 must have the same dtype".
_DTYPE_MISMATCH = re.compile(r"type|not implemented for '|dtype", re.IGNORECASE)
# "Given groups=1, weight of size [64, 3, 7, 7], expected input[1, 1, 64, 48] to have 3
# channels, but got 1 channels instead": a grayscale input to a model of RGB images (torch 2.4
# to 2.15 word it so, for Conv1d, Conv2d and Conv3d alike).
_CHANNELS = re.compile(r"expected input(\[[\d, ]+\]) to have (\d+) channels, but got")
# The dimensions of one sample of a convolution's input, as torch's documentation names them.
_SAMPLE_DIMENSIONS = {3: "C,L", 4: "C,H,W", 5: "C,D,H,W"}
# How torch words floating-point indices: "Expected tensor for argument #1 'indices' to have one
# of the following scalar types: Long, Int; but got torch.FloatTensor instead (while checking
# arguments for embedding)", "index_select(): Expected dtype int32 or int64 for index".
_FLOAT_INDICES = re.compile(r"'indices' to have|dtype int32(?:/| or )int64 for index")


# The hint of a forward pass that failed for no reason told apart.
INPUT_HINT = "check --input-size and --dtype"


def _run_failure_hint(error: Exception, specs: Sequence[InputSpec] = ()) -> str:
    """What to change when the forward pass fails: the inputs; for integer inputs a layer
    refuses, the dtype (`--dtype int64` made a convolution read "Input type (long int) and
    bias type (float) should be the same (check --input-size (and --dtype))"); or, for
    BatchNorm in training mode on one value per channel (a batch of one 1x1 image, one row),
    the batch."""
    if one_value_per_channel(error):
        return (
            "BatchNorm in training mode needs more than one value per channel: give "
            "--batch-size 2 or more, or leave out --train-mode"
        )
    channels = _CHANNELS.search(str(error))
    if channels and len(specs) == 1 and channels.group(1) == str(list(specs[0].shape)):
        # the model's own input (not a layer deeper in, fed the wrong channels by the model);
        # a Conv1d's (N, C, L) or a Conv3d's (N, C, D, H, W) keeps its other dimensions
        shape, wanted = specs[0].shape, channels.group(2)
        sample = ",".join([wanted, *map(str, shape[2:])])
        what = "images" if len(shape) == 4 else "inputs"
        named = _SAMPLE_DIMENSIONS.get(len(shape), "its shape")
        return f"the model takes {wanted}-channel {what}: give {named} as {sample}"
    integer = [s for s in specs if s.dtype is not None and not s.dtype.is_floating_point]
    if len(integer) < len(specs) and _FLOAT_INDICES.search(str(error)):
        return (
            "the model takes indices, as an Embedding does, not floating-point numbers: give "
            "that input an integer dtype, -i SHAPE:long, or --dtype int64"
        )
    if integer and _DTYPE_MISMATCH.search(str(error)):
        return (
            f"its layers take floating-point inputs, not {_dtype_name(integer[0].dtype)}: give "
            "--dtype float32, float16, bfloat16 or float64; an integer --dtype is for inputs "
            "that are indices, such as an Embedding's"
        )
    return INPUT_HINT


def _shapes_text(specs: Sequence[InputSpec]) -> str:
    return ", ".join(f"{s.name}={s.shape}" if s.name else str(s.shape) for s in specs)


class _state_kept:  # noqa: N801 - used as a context manager
    """Puts back the model's buffers and the random state after a training-mode forward
    (BatchNorm updates its running statistics, Dropout draws random numbers)."""

    def __init__(self, model: Any, device: Any, *, enabled: bool) -> None:
        self.model, self.device, self.enabled = model, device, enabled

    def __enter__(self) -> None:
        if not self.enabled:
            return
        import torch

        self.buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        devices = [self.device] if getattr(self.device, "type", "cpu") == "cuda" else []
        self.rng = torch.random.fork_rng(devices=devices)
        self.rng.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if not self.enabled:
            return
        import torch

        self.rng.__exit__(*exc)
        with torch.no_grad():
            for buffer, saved in self.buffers:
                buffer.copy_(saved)


def _module_type(module: Any) -> str:
    """The class name; a TorchScript module's original one (Linear, not RecursiveScriptModule)."""
    return getattr(module, "original_name", None) or type(module).__name__


def _tree_rows(model: Any) -> list[LayerCall]:
    """One row per module of the tree (each module once, under its first name), depth-first."""
    rows = []
    for name, module in model.named_modules():
        params, trainable = _param_counts(module)
        rows.append(
            LayerCall(
                index=len(rows),
                depth=name.count(".") + 1 if name else 0,
                name=name,
                type=_module_type(module),
                input_shape=None,
                output_shape=None,
                params=params,
                trainable_params=trainable,
                trainable=trainable == params if params else None,
                mult_adds=None,
                call=1,
                leaf=is_leaf(module),
            )
        )
    return rows


def summarize_tree(model: Any, *, notes: Sequence[str] = ()) -> ModelSummary:
    """Parameters only, from the module tree: no input, no forward pass, no hooks. Mult-adds,
    FLOPs and activation memory are None (not measured)."""
    total_params, trainable_params, param_bytes, buffer_bytes = _state_sizes(model)
    return ModelSummary(
        model=_module_type(model),
        input_shapes=[],
        dtype=_dtype_name(model_dtype(model)),
        device=str(model_device(model)),
        layers=_tree_rows(model),
        total_params=total_params,
        trainable_params=trainable_params,
        non_trainable_params=total_params - trainable_params,
        total_mult_adds=None,
        flops=None,
        input_mb=None,
        forward_backward_mb=None,
        params_mb=param_bytes / MB,
        buffers_mb=buffer_bytes / MB,
        total_mb=None,
        notes=list(notes),
    )


SCRIPT_NOTE = (
    "TorchScript module: layers and parameters come from the module tree; mult-adds and layer "
    "shapes are unavailable (a ScriptModule takes no hooks)"
)


def _summarize_script(
    model: Any,
    specs: list[InputSpec],
    inputs: list[Any] | None,
    device: Any,
    input_dtype: Any,
    count_flops: bool,
    train_mode: bool,
) -> ModelSummary:
    """A TorchScript module: rows from the tree, and one real forward pass (no hooks) for the
    model's output shape, FLOPs and input size."""
    import torch

    if inputs is None:
        check_inputs_fit(specs, device)
        inputs = make_inputs([s.shape for s in specs], None, device, [s.dtype for s in specs])
    args, kwargs = _split(inputs, specs)
    modes = [(m, m.training) for m in model.modules()]
    try:
        with (
            _state_kept(model, device, enabled=train_mode),
            torch.no_grad(),
            without_dynamo(),
            plain_shapes(),
        ):
            model.train(train_mode)
            output, flops = _run_script(model, args, kwargs, count_flops)
    except TorchkitError:
        raise
    except Exception as error:
        raise _run_failure(_module_type(model), specs, error) from error
    finally:
        for module, training in modes:
            module.training = training
    result = summarize_tree(model, notes=[SCRIPT_NOTE])
    result.layers[0].input_shape = shape_of(_call_inputs(tuple(args), kwargs))
    result.layers[0].output_shape = shape_of(output)
    result.input_shapes = [list(s.shape) for s in specs]
    result.inputs = _input_descriptions(specs)
    result.dtype = _dtype_name(input_dtype)
    result.flops = flops
    result.input_mb = sum(math.prod(s.shape) * _element_size(s.dtype) for s in specs) / MB
    return result


def _run_script(model: Any, args: list[Any], kwargs: dict[str, Any], count_flops: bool):
    """The TorchScript module's output and FLOPs (None when not counted). An error raised
    under FlopCounterMode reaches TorchScript's caller without its reason ("RuntimeError: "
    and nothing else): a forward that fails there runs again without the counter, which
    raises the error whole (or succeeds, without a FLOP count)."""
    if count_flops:
        try:
            with _flop_counter() as counter:
                output = model(*args, **kwargs)
            return output, int(counter.get_total_flops())
        except Exception as error:  # noqa: BLE001 - the plain run below raises it whole
            log.info("the FLOP count failed (%s); running without it", first_line(error))
    return model(*args, **kwargs), None


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
