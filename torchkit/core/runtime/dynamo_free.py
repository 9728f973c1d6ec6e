"""Optimiser steps without importing torch._dynamo: about 2.4 s of the digits run's start.

torch.optim imports torch._dynamo (and with it inductor, sympy and FSDP) the first time an
optimiser is built or stepped, only to mark its methods as never compiled (`torch._disable_dynamo`
imports dynamo on a function's first call and caches the disabled version on the function as
`__dynamo_disable`) and to put graph breaks around `step`. In a process that never compiles
both are no-ops. So, unless --compile is on or dynamo is already loaded, `mark_not_compiled()`
gives those methods themselves as their cached "disabled" version, and `step()` runs the
optimiser's undecorated step under no_grad and the profiler label torch's gives it, which is all
the decorator does outside compilation.
Should torch rename these internals, the marks are inert attributes and `step()` falls back to
`optimizer.step()`: a slower start, the same training.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

# The Optimizer methods decorated with torch._disable_dynamo.
MARKED_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def dynamo_loaded() -> bool:
    from torchkit import torchvision_without_dynamo

    return torchvision_without_dynamo.dynamo_loaded()


def mark_not_compiled() -> None:
    """Before building an optimiser in a process that will not compile (see module doc)."""
    from torch.optim import Optimizer

    if dynamo_loaded():
        return
    for name in MARKED_METHODS:
        original = getattr(getattr(Optimizer, name, None), "__wrapped__", None)
        if original is not None and not hasattr(original, "__dynamo_disable"):
            setattr(original, "__dynamo_disable", original)


def step(optimizer: Any) -> None:
    """`optimizer.step()`, without importing torch._dynamo where that is safe."""
    with undecorated_steps(optimizer):
        optimizer.step()


@contextlib.contextmanager
def undecorated_steps(optimizer: Any) -> Iterator[None]:
    """While the block runs, `optimizer.step()` is the class's undecorated step, where that is
    safe (`_undecorated_step`): for `step` and for a GradScaler, whose `step` calls
    `optimizer.step()` itself (an --amp run in float16 imported torch._dynamo at its first
    update)."""
    undecorated = _undecorated_step(optimizer)
    if undecorated is None:
        yield
        return
    import torch

    # The label torch's decorated step records: a profile (--profile-steps) names the step so.
    label = f"Optimizer.step#{type(optimizer).__name__}.step"

    def plain_step(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad(), torch.autograd.profiler.record_function(label):
            return undecorated(optimizer, *args, **kwargs)

    optimizer.step = plain_step  # an attribute of this optimiser, over its class's method
    try:
        yield
    finally:
        del optimizer.step


def _undecorated_step(optimizer: Any):
    """The optimiser class's own step function, or None where the decorated one must run:
    dynamo already loaded, step hooks registered (the decorator runs them), a differentiable
    optimiser, or a step that is not decorated as expected."""
    if dynamo_loaded() or optimizer.defaults.get("differentiable", False):
        return None
    if has_step_hooks(optimizer):
        return None
    return _unwrapped_step(type(optimizer))


def has_step_hooks(optimizer: Any) -> bool:
    """Whether a step pre- or post-hook is registered (the decorated step runs them), on this
    optimiser or on every one; True too where torch keeps them elsewhere than here."""
    from torch.optim import optimizer as optimizer_module

    hooks = (
        getattr(optimizer_module, "_global_optimizer_pre_hooks", None),
        getattr(optimizer_module, "_global_optimizer_post_hooks", None),
        getattr(optimizer, "_optimizer_step_pre_hooks", None),
        getattr(optimizer, "_optimizer_step_post_hooks", None),
    )
    return any(hook is None or len(hook) for hook in hooks)


@functools.lru_cache(maxsize=16)
def _unwrapped_step(optimizer_class: type):
    decorated = optimizer_class.step
    undecorated = inspect.unwrap(decorated)
    if undecorated is decorated or undecorated.__name__ != "step":
        return None
    return undecorated
