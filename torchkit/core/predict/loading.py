"""Resolving a model whose every weight comes from a file, without first drawing random ones.

Building resnet18 spends ~0.1 s of CPU filling 11M parameters with Kaiming noise that the
checkpoint then overwrites: a tenth of a 500-image `predict`. While a model is built from a
model file, the `torch.nn.init` functions leave tensors as allocated (as transformers'
`no_init_weights` does) and note which ones they left. The strict load that follows writes every
parameter and persistent buffer; when every tensor left uninitialised is one of those, the model
is bit for bit the one a normal build gives. Otherwise (an initialised non-persistent buffer, a
tensor kept outside the state dict) it is built again the normal way, as is a model built by
user code (`package.module:Callable`), which may compute anything from its random weights.

The skip holds only in the thread that asked for it: `torch.nn.init` is shared by the whole
process, and another thread building a model at the same moment must get its random weights.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

# The initialisers nn.Module constructors call (through `torch.nn.init.NAME`, looked up at call
# time, so a wrapper installed on the module is the one they run).
INIT_FUNCTIONS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "eye_",
    "dirac_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
    "sparse_",
)

_skipping = threading.local()  # .skipped: data_ptr() of the tensors left, inside the context
_install_lock = threading.Lock()
_users = 0
_originals: dict[str, Callable] = {}


def _skippable(original: Callable) -> Callable:
    def init(tensor, *args, **kwargs):
        skipped = getattr(_skipping, "skipped", None)
        if skipped is None:
            return original(tensor, *args, **kwargs)
        if tensor.numel():
            skipped.append(tensor.data_ptr())
        return tensor

    init.__wrapped__ = original  # type: ignore[attr-defined]
    return init


@contextlib.contextmanager
def skipped_weight_init() -> Iterator[list[int]]:
    """Inside, `torch.nn.init` leaves tensors uninitialised in this thread and lists their
    `data_ptr()` in the list it gives (only use it where every tensor is loaded afterwards);
    outside, and in other threads, nothing changes."""
    import torch.nn.init as init

    global _users
    with _install_lock:
        if _users == 0:
            for name in INIT_FUNCTIONS:
                if hasattr(init, name):
                    _originals[name] = getattr(init, name)
                    setattr(init, name, _skippable(_originals[name]))
        _users += 1
    outer = getattr(_skipping, "skipped", None)
    skipped: list[int] = []
    _skipping.skipped = skipped
    try:
        yield skipped
    finally:
        _skipping.skipped = outer
        if outer is not None:
            outer += skipped
        with _install_lock:
            _users -= 1
            if _users == 0:
                for name, original in _originals.items():
                    setattr(init, name, original)
                _originals.clear()


def all_loaded(model: Any, skipped: list[int]) -> bool:
    """Whether every tensor left uninitialised is one a strict `load_state_dict` writes (a
    parameter or persistent buffer of `model`, by its memory)."""
    loaded = {tensor.data_ptr() for tensor in model.state_dict(keep_vars=True).values()}
    return all(pointer in loaded for pointer in skipped)


def resolve_loaded_model(resolve: Callable[[], Any], *, from_file: bool) -> Any:
    """`resolve()` (a ResolvedModel), built without random init when `from_file` (MODEL is a
    model file read with weights_only, so every weight comes from it). Falls back to a normal
    build when the result is not a torchkit checkpoint's model, comes from user code, or had a
    tensor left uninitialised that the strict load does not write."""
    from torchkit.core.models.builders import is_callable_spec

    if not from_file:
        return resolve()
    with skipped_weight_init() as skipped:
        resolved = resolve()
    if (
        resolved.weights_source != "torchkit checkpoint"
        or is_callable_spec(str(resolved.arch))
        or not all_loaded(resolved.model, skipped)
    ):
        return resolve()
    return resolved
