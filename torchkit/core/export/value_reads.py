"""Which Python values a traced model takes from its input's values: what torch's tracer
(torch.jit.trace, torch.onnx.export) keeps as constants, so that an exported file is right only
for inputs that go the example's way there (`if x.mean() > 0:`), however its verification went."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any


def library_code(filename: str, packages: tuple[str, ...] = ("torch", "torchvision")) -> bool:
    """A file of torch or torchvision: their tracer warnings are shape checks (torch._assert,
    MultiheadAttention's mask checks) that hold for every input of the exported shape."""
    folders = []
    for name in packages:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            folders.append(os.path.dirname(os.path.abspath(module.__file__)) + os.sep)
    return os.path.abspath(filename).startswith(tuple(folders))


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
        # text of the values (f"{x.sum():.0f}", str(x), print(x)) and `if 2.0 in x:`
        torch.Tensor.__format__,
        torch.Tensor.__repr__,
        torch.Tensor.__contains__,
    }
    # Python values of a tensor's shape: the number of tensors `for row in t:`, t.unbind(),
    # t.split(n) or t.chunk(n) gives is fixed in the file, wrong where the shape comes from
    # the input's values (split into listed sizes gives as many tensors as sizes)
    shape_reads = {torch.Tensor.__iter__, torch.Tensor.unbind, torch.unbind}
    counted_pieces = {
        torch.Tensor.split,
        torch.split,
        torch.Tensor.chunk,
        torch.chunk,
        torch.Tensor.unsafe_split,
        torch.unsafe_split,
        torch.Tensor.unsafe_chunk,
        torch.unsafe_chunk,
    }

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
            shape_read = func in shape_reads or (
                func in counted_pieces and not _listed_sizes(args, kwargs)
            )
            watched = func in reads or shape_read
            if watched and args and state is not None and traced[1] is not None:
                try:
                    dependent = any(
                        depends_on_input(each, traced[1], shape_read)
                        for each in args[:2]  # torch.equal(x, y) reads both
                        if isinstance(each, torch.Tensor)
                    )
                except RuntimeError:  # a tensor the tracer cannot place: nothing to say
                    dependent = False
                place = _caller_place() if dependent else None
                if place is not None and place not in places:  # a line run again, in a loop
                    places.append(place)
            if state is not None and (watched or func is torch.Tensor.__len__):
                with _warnings_at(_caller_frame(func)):  # the reads the tracer warns of
                    return func(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))

    try:
        with InputValueReads():
            yield places
    finally:
        traced[:] = [None, None]  # keeps no tracing state alive
        known.clear()


def _caller_frame(func: Any) -> Any:
    """The frame that called `func` (seen from the torch-function mode's handler): the next
    one out for a C function (`bool(x)`), past torch's dispatch (overrides.py) and `func`'s
    own frame for one written in Python (`len(x)`)."""
    dispatch = os.path.join("torch", "overrides.py")
    own = getattr(func, "__code__", None)
    frame = sys._getframe(2)
    while frame.f_back is not None and (
        frame.f_code.co_filename.endswith(dispatch) or frame.f_code is own
    ):
        frame = frame.f_back
    return frame


@contextlib.contextmanager
def _warnings_at(caller: Any) -> Iterator[None]:
    """A read made in the torch-function mode warns (the tracer's "Converting a tensor to a
    Python boolean") at the mode's line, which is no library's: torch._assert's shape check in
    torchvision's ViT and timm's patch embeddings became a tracer warning for the user. Such
    warnings are given again at `caller`'s line, where they would be without the mode."""
    here = os.path.abspath(__file__)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            warnings_made = list(caught)
    for item in warnings_made:
        if os.path.abspath(item.filename) == here:
            filename, lineno = caller.f_code.co_filename, caller.f_lineno
        else:
            filename, lineno = item.filename, item.lineno
        warnings.warn_explicit(item.message, item.category, filename, lineno)


def _listed_sizes(args: tuple, kwargs: dict | None) -> bool:
    """Whether a split is into listed sizes (t.split([2, 3])): as many pieces as sizes."""
    sizes = args[1] if len(args) > 1 else (kwargs or {}).get("split_size_or_sections")
    if sizes is None:
        sizes = (kwargs or {}).get("split_size")
    return isinstance(sizes, (list, tuple))


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
    """file.py:LINE of the model's line that made the read: the innermost frame outside torch,
    below the exporter's (this package: what calls the tracer is not the model). A model whose
    forward is torch's own code has no such line: the read is named where torch makes it."""
    exporter = os.path.dirname(os.path.abspath(__file__)) + os.sep
    in_torch = None  # the innermost frame in torch's code
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if os.path.abspath(filename).startswith(exporter):
            if in_torch is not None:  # the exporter's call: the model's frames are all below
                break
        elif library_code(filename, ("torch",)):
            in_torch = in_torch or f"{filename}:{frame.f_lineno}"
        else:
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return in_torch or "?"
