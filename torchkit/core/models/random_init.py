"""Building a model whose every weight comes from a file (a checkpoint, `--weights FILE`: a strict
load follows), without first drawing random ones: most of a large model's build time (vgg16 ~1.2
of ~1.5 s on one thread, convnext_base ~0.7 of ~1.2 s).

While such a model is built, torch's random initialisers (`torch.nn.init`'s, and the Tensor
methods `uniform_` and `normal_` that builders draw with) and timm's truncated normal (behind
its `trunc_normal_`, `trunc_normal_tf_`, `lecun_normal_`: a uniform draw, then `erfinv_` and
three more passes, most of a timm ViT's or ConvNeXt's build) leave tensors as allocated, as
transformers' `no_init_weights` does, and note which ones they left. timm's is skipped when timm
is imported before the build (`timm_models.built_timm_model`).
The deterministic ones (zeros, ones, constants, eye, dirac, `fill_`, `zero_`) still run. The
strict load writes every parameter and persistent buffer; when every tensor left uninitialised
is one of those, the model is bit for bit the one a normal build gives. Otherwise (a random
non-persistent buffer, a tensor kept outside the state dict) it is built again the normal way.
A tensor left that the build threw away (timm's EfficientNet builder makes a squeeze-excite
layer to probe its arguments) is fine unless the model holds tensors the load does not write,
where its values could have gone.
Models built by user code (`package.module:Callable`), which may compute anything from their
random weights, are always built the normal way (the callers' choice).

The skip holds only in the thread that asked for it: torch is shared by the whole process, and
another thread building a model at the same moment must get its random weights.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from torchkit.core.runtime.fork_safe import ForkSafeLock

# torch.nn.init's random initialisers (torchvision calls them as `nn.init.NAME`, torch's layers
# as `init.NAME`: looked up on the module at each call, so a wrapper installed there is run) ...
RANDOM_INIT_FUNCTIONS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "xavier_uniform_",
    "xavier_normal_",
    "orthogonal_",
    "sparse_",
)
# ... and the Tensor methods builders draw with directly (ViT's position embedding,
# `torch.empty(...).normal_(std=0.02)`; timm's trunc_normal_).
RANDOM_TENSOR_METHODS = ("uniform_", "normal_")
# ... and the one function behind timm's truncated normals, looked up as a global at each call
# (its callers import `trunc_normal_` & co. by name: patching those would miss most copies).
TIMM_WEIGHT_INIT = ("timm.layers.weight_init", "_trunc_normal_")

_skipping = threading.local()  # .skipped: (data_ptr(), weakref) of the tensors left, inside
# A forked child's own: a child of a process whose other thread was building a model would
# wait for it for good at its own first build.
_install_lock = ForkSafeLock()
_users = 0
_originals: list[tuple[Any, str, Any]] = []  # (owner, name, what the owner itself held)

Model = TypeVar("Model")


def _skippable(original: Callable) -> Callable:
    def init(tensor, *args, **kwargs):
        skipped = getattr(_skipping, "skipped", None)
        if skipped is None:
            return original(tensor, *args, **kwargs)
        if tensor.numel():
            # A view's base is what the model would keep: while it lives, so may the values.
            base = tensor if tensor._base is None else tensor._base
            skipped.append((tensor.data_ptr(), weakref.ref(base)))
        return tensor

    init.__wrapped__ = original  # type: ignore[attr-defined]
    return init


def _install() -> None:
    import torch

    targets = [(torch.nn.init, name) for name in RANDOM_INIT_FUNCTIONS]
    targets += [(torch.Tensor, name) for name in RANDOM_TENSOR_METHODS]
    module, name = TIMM_WEIGHT_INIT
    timm_init = sys.modules.get(module)  # never imported here: only if a build already did
    if hasattr(timm_init, name):
        targets.append((timm_init, name))
    for owner, name in targets:
        # Tensor's methods live on its C base: nothing of the owner's own to put back.
        _originals.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, _skippable(getattr(owner, name)))


def _uninstall() -> None:
    for owner, name, original in _originals:
        if original is None:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    _originals.clear()


@contextlib.contextmanager
def skipped_weight_init() -> Iterator[list[tuple[int, weakref.ref]]]:
    """Inside, torch's random initialisers leave tensors uninitialised in this thread and list
    them in the list it gives, as (`data_ptr()`, a weak reference to the tensor or the base it
    views) (only where every tensor is loaded afterwards); outside, and in other threads,
    nothing changes."""
    global _users
    with _install_lock:
        if _users == 0:
            _install()
        _users += 1
    outer = getattr(_skipping, "skipped", None)
    skipped: list[tuple[int, weakref.ref]] = []
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
                _uninstall()


def all_loaded(model: Any, skipped: list[tuple[int, weakref.ref]]) -> bool:
    """Whether every tensor left uninitialised is one a strict `load_state_dict` writes (a
    parameter or persistent buffer of `model`, by its memory), or one gone with the build's
    temporaries while `model` holds no tensor the load does not write."""
    state = model.state_dict(keep_vars=True).values()
    loaded = {tensor.data_ptr() for tensor in state}
    if all(pointer in loaded for pointer, tensor in skipped if tensor() is not None):
        return all(tensor() is not None for _, tensor in skipped) or _holds_only(model, state)
    return False


def _holds_only(model: Any, state: Any) -> bool:
    """Whether every tensor `model`'s modules hold (parameters, buffers, tensor attributes) is
    one of the state dict's."""
    import torch

    listed = {id(tensor) for tensor in state}
    for module in model.modules():
        held = [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]
        if any(isinstance(t, torch.Tensor) and id(t) not in listed for t in held):
            return False
    return True


def built_for_loading(build: Callable[[], Model], loaded: bool = True) -> Model:
    """`build()` for a model whose every weight a strict load writes right after (`loaded`):
    without random init when that leaves nothing the load does not write, else built again
    the normal way. With `loaded` false, simply `build()`."""
    if not loaded:
        return build()
    with skipped_weight_init() as skipped:
        model = build()
    if all_loaded(model, skipped):
        return model
    return build()
