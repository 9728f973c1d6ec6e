"""Fused Adam and AdamW updates by their kernels alone, once the optimiser's state exists.

torch's `Adam.step` checks every parameter, looks up its state, regroups the tensors by device
and dtype and builds the kernels' arguments anew on every call: about 0.2 ms of Python an
update for the digits convnet's four parameter groups, whose whole step takes 4-5 ms on one
thread. `step` calls the same two kernels torch's fused path calls (`_foreach_add_` of the step
counts, then `_fused_adam_` or `_fused_adamw_`) on the same tensors in the same order, group by
group, so the weights and moments come out bitwise as torch's step makes them. Where torch's
step does more (the first update makes the state, a GradScaler passes its scale, hooks, tensor
learning rates, CUDA graphs' capturable steps, parameters of several devices or dtypes in a
group), it declines and the caller takes torch's step.
"""

from __future__ import annotations

from typing import Any


def step(optimizer: Any) -> bool:
    """One update of a fused Adam or AdamW `optimizer`, as torch's `step()` makes it; False,
    having changed nothing, where torch's own step must run (see the module doc)."""
    import torch

    from torchkit.core.runtime.dynamo_free import has_step_hooks

    kind = type(optimizer)
    if kind is not torch.optim.Adam and kind is not torch.optim.AdamW:
        return False
    if has_step_hooks(optimizer) or getattr(optimizer, "grad_scale", None) is not None:
        return False
    if getattr(optimizer, "found_inf", None) is not None:
        return False
    updates = []
    for group in optimizer.param_groups:
        update = _group_update(optimizer, group, kind is torch.optim.AdamW)
        if update is None:
            return False
        updates.append(update)
    label = f"Optimizer.step#{kind.__name__}.step"  # as torch's step is named in a profile
    with torch.no_grad():
        if torch.autograd._profiler_enabled():
            with torch.autograd.profiler.record_function(label):
                _run(updates)
        else:
            _run(updates)
    return True


def _group_update(optimizer: Any, group: dict, adamw: bool) -> tuple | None:
    """The kernel, its tensor lists and options for `group`'s update (an empty tuple: nothing
    to update), or None where torch's step must run."""
    import torch

    if not group.get("fused") or group.get("capturable") or group.get("differentiable"):
        return None
    lr, (beta1, beta2) = group["lr"], group["betas"]
    if any(torch.is_tensor(value) for value in (lr, beta1, beta2)):
        return None
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = [], [], [], [], [], []
    amsgrad = group["amsgrad"]
    for param in group["params"]:
        grad = param.grad
        if grad is None:  # torch's step leaves it out too
            continue
        state = optimizer.state.get(param)
        if not state or grad.is_sparse:  # torch makes the state (or refuses)
            return None
        if params and (param.device != params[0].device or param.dtype != params[0].dtype):
            return None  # torch makes one call per device and dtype
        params.append(param)
        grads.append(grad)
        exp_avgs.append(state["exp_avg"])
        exp_avg_sqs.append(state["exp_avg_sq"])
        if amsgrad:
            max_exp_avg_sqs.append(state["max_exp_avg_sq"])
        steps.append(state["step"])
    if not params:
        return ()
    decoupled = group.get("decoupled_weight_decay", adamw)  # a key of Adam's since torch 2.6
    kernel = torch._fused_adamw_ if decoupled else torch._fused_adam_
    options = {
        "amsgrad": amsgrad,
        "lr": lr,
        "beta1": beta1,
        "beta2": beta2,
        "weight_decay": group["weight_decay"],
        "eps": group["eps"],
        "maximize": group["maximize"],
        "grad_scale": None,
        "found_inf": None,
    }
    return kernel, (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps), options


def _run(updates: list[tuple]) -> None:
    import torch

    for update in updates:
        if update:
            kernel, tensors, options = update
            torch._foreach_add_(tensors[-1], 1)
            kernel(*tensors, **options)
