"""Training without importing torch._dynamo, with exactly the steps torch's decorated ones take
(that whole digits runs with AdamW and SGD never import it: test_torchvision_without_dynamo)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from torchkit.core.train import dynamo_free


@pytest.mark.parametrize(
    "build",
    [
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.05, fused=True),
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.05),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
        lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.9),
    ],
)
def test_the_undecorated_step_equals_torchs_step_bitwise(monkeypatch, build):
    monkeypatch.setattr(dynamo_free, "dynamo_loaded", lambda: False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    reference = copy.deepcopy(model)
    ours, theirs = build(model.parameters()), build(reference.parameters())
    assert dynamo_free._undecorated_step(ours) is not None
    inputs, labels = torch.randn(10, 6), torch.randint(0, 3, (10,))
    for _ in range(4):
        for net, optimizer, step in ((model, ours, dynamo_free.step), (reference, theirs, _step)):
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(inputs), labels).backward()
            step(optimizer)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(got, want)
    assert torch.is_grad_enabled()  # grad mode restored after the step
    assert ours.state_dict()["state"][0].keys() == theirs.state_dict()["state"][0].keys()


def _step(optimizer):
    optimizer.step()


def test_hooks_and_a_loaded_dynamo_take_torchs_own_step(monkeypatch):
    monkeypatch.setattr(dynamo_free, "dynamo_loaded", lambda: False)
    param = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    calls = []
    handle = optimizer.register_step_post_hook(lambda *args: calls.append(1))
    assert dynamo_free._undecorated_step(optimizer) is None
    param.grad = torch.ones(2)
    dynamo_free.step(optimizer)
    assert calls == [1]  # the hook ran: torch's step was taken
    handle.remove()
    assert dynamo_free._undecorated_step(optimizer) is not None
    monkeypatch.setattr(dynamo_free, "dynamo_loaded", lambda: True)
    assert dynamo_free._undecorated_step(optimizer) is None
