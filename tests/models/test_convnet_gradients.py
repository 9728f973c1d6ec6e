"""The convnet's channels-last training on the CPU: max-pool's backward gets a channels-last
gradient (its fast path) and the gradients are bitwise those of the plain backward."""

from __future__ import annotations

import copy

import torch

from torchkit.core.models import convnet


def _gradients_and_pool_layouts(model, images):
    """The parameters' gradients of one backward, and whether max-pool's incoming gradient
    was channels-last."""
    layouts = []
    pool = model.features[4]
    handle = pool.register_full_backward_pre_hook(
        lambda module, grad: layouts.append(
            grad[0].is_contiguous(memory_format=torch.channels_last)
        )
    )
    torch.manual_seed(1)  # the same dropout masks for both
    model(images).square().sum().backward()
    handle.remove()
    return [p.grad for p in model.parameters()], layouts


def test_max_pools_backward_gets_a_channels_last_gradient_and_the_same_values(monkeypatch):
    torch.manual_seed(0)
    model = convnet.convnet_class()(10, 3, 12).to(memory_format=torch.channels_last).train()
    plain = copy.deepcopy(model)
    images = torch.randn(6, 3, 12, 12).contiguous(memory_format=torch.channels_last)
    grads, layouts = _gradients_and_pool_layouts(model, images)
    monkeypatch.setattr(convnet, "_gradient_as_channels_last", lambda features: None)
    plain_grads, plain_layouts = _gradients_and_pool_layouts(plain, images)
    assert layouts == [True]
    assert plain_layouts == [False]  # what flatten's backward gives without the hook
    for got, want in zip(grads, plain_grads, strict=True):
        assert torch.equal(got, want)


def test_evaluation_and_nchw_models_get_no_hook(monkeypatch):
    calls = []
    original = convnet._gradient_as_channels_last
    monkeypatch.setattr(convnet, "_gradient_as_channels_last", lambda f: calls.append(original(f)))
    model = convnet.convnet_class()(10, 3, 12)
    images = torch.randn(2, 3, 12, 12)
    model.eval()(images).sum().backward()
    assert calls == []  # eval mode: no hook at all
    _, layouts = _gradients_and_pool_layouts(model.train(), images)
    assert calls == [None] and layouts == [False]  # an NCHW model's gradient stays NCHW
