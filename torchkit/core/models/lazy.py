"""Models with lazy layers (`torch.nn.LazyLinear`, `LazyConv2d`, `LazyBatchNorm2d`...), whose
weights get their shapes from the first input they see: until then they hold no weights an
optimizer, DDP, an EMA copy, a summary, an export or a `load_state_dict` could use ("Attempted
to use an uninitialized parameter"). The resolver sizes them as soon as the user's code has
built the model, with one forward pass of an input of the shape the command will feed; a lazy
layer that only training reaches (an auxiliary head used when `self.training`) is sized by a
second pass in training mode, which leaves no trace (buffers, and the random number generators
of torch, Python and NumPy, restored).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from torchkit.core.io.errors import UsageError, first_line
from torchkit.core.models.image_size import image_size_refusal


def has_lazy_weights(model: Any) -> bool:
    """Whether a layer of `model` still waits for its first input to size its weights."""
    from torch.nn.modules.lazy import LazyModuleMixin

    return any(
        isinstance(module, LazyModuleMixin) and module.has_uninitialized_params()
        for module in model.modules()
    )


def materialize_lazy_layers(model: Any, sample_shape: Sequence[int], name: str) -> bool:
    """Size the lazy layers of `model` (if it has any) for one sample of `sample_shape`
    (C, H, W): one forward pass of a single image of zeros, in eval mode (BatchNorm's running
    statistics untouched, dropout off) and without gradients, on the device the model is on
    (the meta device costs nothing). Lazy layers that pass left unsized (reached in training
    mode only) get a second pass, in training mode, of two images (BatchNorm takes no batch of
    one there) that changes nothing: every buffer is put back as it was before the pass (or as
    its layer was sized, for a lazy BatchNorm), and the random number generators too: torch's
    (dropout), Python's `random` and NumPy's global one (a forward of the user's may draw from
    them), so that a seeded run draws what it would have without the pass.
    Each module is given back the mode it was in. Returns whether it had lazy layers. A forward
    that fails (an input size the model cannot take) is one UsageError naming `name` and the
    size (and the smallest side it takes, where images too small are why)."""
    if not has_lazy_weights(model):
        return False
    import torch

    parameter = next(iter(model.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    shape = tuple(int(n) for n in sample_shape)
    modes = [(module, module.training) for module in model.modules()]
    try:
        _dry_forward(model, torch.zeros((1, *shape), device=device), name, training=False)
        if has_lazy_weights(model):  # a layer only the training forward reaches
            with _no_trace(model, device):
                _dry_forward(model, torch.zeros((2, *shape), device=device), name, training=True)
    finally:
        for module, training in modes:
            module.training = training
    if has_lazy_weights(model):  # a lazy layer neither forward reached
        raise UsageError(
            f"{name} has lazy layers its forward pass did not size, in eval or training mode "
            "(they got no input)",
            "give them their sizes in the model's code, nn.Linear instead of nn.LazyLinear...",
        )
    return True


def _dry_forward(model: Any, images: Any, name: str, *, training: bool) -> None:
    """One forward pass of `images` (zeros) without gradients, `model` in training or eval
    mode; a failure is one UsageError naming the size."""
    import torch

    model.train(training)
    try:
        with torch.no_grad():
            model(images)
    except Exception as error:  # the user's forward: whatever it raises is told in one line
        refusal = image_size_refusal(model, name, (1, *images.shape[1:]), error)
        if refusal is not None:  # images too small for it: the smallest side it takes named
            raise refusal from error
        size = "x".join(map(str, images.shape[1:]))
        mode = " in training mode" if training else ""
        hint = "give the image size and channels it takes: --image-size, or --input-size"
        if training:  # its eval forward ran at this size: the training forward alone failed
            hint = (
                "give the layers only its training forward reaches their sizes in the model's "
                "code, nn.Linear instead of nn.LazyLinear..."
            )
        raise UsageError(
            f"{name} has lazy layers that could not be sized by a {size} (CxHxW) input{mode}: "
            f"{first_line(error, with_type=True)}",
            hint,
        ) from error


@contextlib.contextmanager
def _no_trace(model: Any, device: Any) -> Iterator[None]:
    """A forward pass in training mode inside leaves `model`'s buffers (BatchNorm's running
    statistics, its batch count) and the random number generators as they were: torch's
    (dropout), Python's `random` and NumPy's global one, which `--seed` seeds as well.
    A buffer still unsized before the pass (a lazy BatchNorm's) is kept as its layer sized it,
    just before that layer's own forward ran: a pre-hook registered after the lazy layer's own
    (which sizes it) takes the copy."""
    import random

    import numpy
    import torch
    from torch.nn.parameter import is_lazy

    before = {name: buffer.clone() for name, buffer in model.named_buffers() if not is_lazy(buffer)}
    sized: dict[int, Any] = {}  # id(module) -> its own buffers as its layer sized them

    def keep_sized(module: Any, _inputs: Any) -> None:
        if id(module) not in sized:
            sized[id(module)] = {
                name: buffer.clone()
                for name, buffer in module.named_buffers(recurse=False)
                if not is_lazy(buffer)
            }

    hooks = [
        module.register_forward_pre_hook(keep_sized)
        for module in model.modules()
        if any(is_lazy(buffer) for buffer in module.buffers(recurse=False))
    ]
    devices = []  # the CPU's generator is always forked; the model's GPU's too
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    python_random, numpy_random = random.getstate(), numpy.random.get_state()
    try:
        with torch.random.fork_rng(devices=devices, device_type="cuda"):
            yield
    finally:
        random.setstate(python_random)
        numpy.random.set_state(numpy_random)
        for hook in hooks:
            hook.remove()
        with torch.no_grad():
            for prefix, module in model.named_modules():
                kept = sized.get(id(module), {})
                for name, buffer in module.named_buffers(recurse=False):
                    full = f"{prefix}.{name}" if prefix else name
                    old = before.get(full, kept.get(name))
                    if old is not None and old.shape == buffer.shape:
                        buffer.copy_(old)
