"""Fused Adam/AdamW updates by their kernels alone (core.train.fused_step): bitwise torch's
step, and torch's own step wherever it does more."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from torchkit.core.train import fused_step


def _model():
    """A channels-last convolution and a linear layer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))
    return model.to(memory_format=torch.channels_last)


def _groups(model):
    """Parameter groups as torchkit makes them: weights decayed, biases not, the head's bias at
    another lr."""
    conv, linear = model[0], model[3]
    return [
        {"params": [conv.weight, linear.weight], "weight_decay": 0.05, "lr": 0.01},
        {"params": [conv.bias], "weight_decay": 0.0, "lr": 0.01},
        {"params": [linear.bias], "weight_decay": 0.0, "lr": 0.02},
    ]


def _backward(model):
    images = torch.randn(5, 3, 6, 6, generator=torch.Generator().manual_seed(2))
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.tensor([0, 1, 2, 0, 1])
    nn.functional.cross_entropy(model(images), labels).backward()


def _update(model, optimizer, *, fast: bool, drop_bias_grad: bool = False) -> bool:
    """One update; whether the kernels alone made it."""
    optimizer.zero_grad(set_to_none=True)
    _backward(model)
    if drop_bias_grad:  # a parameter without a gradient: left out, as torch's step does
        model[0].bias.grad = None
    taken = fast and fused_step.step(optimizer)
    if not taken:
        optimizer.step()
    for group in optimizer.param_groups:  # the schedule changes the lr every update
        group["lr"] *= 0.9
    return taken


def _same(model, reference, ours, theirs) -> bool:
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        if not torch.equal(got, want):
            return False
    mine, others = ours.state_dict()["state"], theirs.state_dict()["state"]
    return mine.keys() == others.keys() and all(
        mine[k].keys() == others[k].keys()
        and all(torch.equal(mine[k][name], others[k][name]) for name in mine[k])
        for k in mine
    )


BUILDS = {
    "adamw": lambda groups: torch.optim.AdamW(groups, fused=True),
    "adam with weight decay": lambda groups: torch.optim.Adam(groups, weight_decay=0.1, fused=True),
    "amsgrad": lambda groups: torch.optim.AdamW(groups, amsgrad=True, fused=True),
    "maximize": lambda groups: torch.optim.AdamW(groups, maximize=True, fused=True),
}


@pytest.mark.parametrize("build", BUILDS.values(), ids=BUILDS.keys())
def test_the_kernels_alone_update_bitwise_as_torchs_step(build):
    model = _model()
    reference = copy.deepcopy(model)
    ours, theirs = build(_groups(model)), build(_groups(reference))
    taken = []
    for step in range(5):
        taken.append(_update(model, ours, fast=True, drop_bias_grad=step == 3))
        _update(reference, theirs, fast=False, drop_bias_grad=step == 3)
    assert taken == [False, True, True, True, True]  # the first update makes the state: torch's
    assert _same(model, reference, ours, theirs)
    assert torch.is_grad_enabled()


def test_a_state_torchs_step_saved_goes_on_bitwise_and_saves_as_torchs():
    """Resuming: a checkpoint's optimiser state (made by torch's step, before this path
    existed) goes on under the kernels alone as under torch's step, and what they leave saves
    and loads as torch's does."""
    model = _model()
    optimizer = torch.optim.AdamW(_groups(model), fused=True)
    for _ in range(2):
        _update(model, optimizer, fast=False)
    saved_model, saved_state = (
        copy.deepcopy(model.state_dict()),
        copy.deepcopy(optimizer.state_dict()),
    )
    runs = []
    for fast in (True, False):
        resumed = _model()
        resumed.load_state_dict(saved_model)
        again = torch.optim.AdamW(_groups(resumed), fused=True)
        again.load_state_dict(copy.deepcopy(saved_state))  # torch's load keeps its tensors
        assert all(_update(resumed, again, fast=fast) == fast for _ in range(3))
        runs.append((resumed, again))
    (model_a, ours), (model_b, theirs) = runs
    assert _same(model_a, model_b, ours, theirs)
    reloaded = torch.optim.AdamW(_groups(_model()), fused=True)
    reloaded.load_state_dict(ours.state_dict())  # torch's own loader takes it
    assert reloaded.state_dict()["param_groups"] == ours.state_dict()["param_groups"]


def test_torchs_step_runs_where_it_does_more():
    param = nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    not_fused = torch.optim.AdamW([param])
    sgd = torch.optim.SGD([param], lr=0.1, fused=True)
    assert not fused_step.step(not_fused) and not fused_step.step(sgd)
    optimizer = torch.optim.AdamW([param], fused=True)
    assert not fused_step.step(optimizer)  # no state yet
    optimizer.step()
    before = param.detach().clone()
    handle = optimizer.register_step_post_hook(lambda *args: None)
    assert not fused_step.step(optimizer)  # torch's step runs the hooks
    handle.remove()
    optimizer.grad_scale = torch.tensor(2.0)  # what a GradScaler's step gives a fused optimiser
    assert not fused_step.step(optimizer)
    del optimizer.grad_scale
    optimizer.param_groups[0]["lr"] = torch.tensor(0.01)
    assert not fused_step.step(optimizer)
    assert torch.equal(param, before)  # nothing changed by a declined step
    optimizer.param_groups[0]["lr"] = 0.01
    assert fused_step.step(optimizer) and not torch.equal(param, before)


def test_a_profile_names_the_step_as_torchs():
    model = _model()
    optimizer = torch.optim.AdamW(_groups(model), fused=True)
    _update(model, optimizer, fast=False)
    _backward(model)
    with torch.profiler.profile() as profile:
        assert fused_step.step(optimizer)
    names = {event.name for event in profile.events()}
    assert "Optimizer.step#AdamW.step" in names
