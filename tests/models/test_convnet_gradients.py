"""The convnet's channels-last training on the CPU: max-pool's backward gets a channels-last
gradient (its fast path) and the gradients are bitwise those of the plain backward."""

from __future__ import annotations

import copy

import pytest
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


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_the_convnet_scripts_and_traces_with_torch_fx_in_training_mode():
    """The hook is Python's: torch.jit.script leaves it out rather than failing to compile the
    forward ("import statements aren't supported"), and a torch.fx trace in training mode
    (torchvision's create_feature_extractor traces both modes) gets no hook rather than failing
    on its Proxy ("symbolically traced variables cannot be used as inputs to control flow")."""
    torch.manual_seed(0)
    model = convnet.convnet_class()(10, 3, 12).to(memory_format=torch.channels_last).train()
    images = torch.randn(3, 3, 12, 12).contiguous(memory_format=torch.channels_last)
    scripted = torch.jit.script(model)
    traced = torch.fx.symbolic_trace(model)
    torch.manual_seed(1)  # the same dropout masks for each
    want = model(images)
    for other in (scripted, traced):
        torch.manual_seed(1)
        assert torch.equal(other(images), want)
    model.eval()
    assert torch.equal(scripted.eval()(images), model(images))
