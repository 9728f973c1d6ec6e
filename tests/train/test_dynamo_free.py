"""Training without importing torch._dynamo, with exactly the steps torch's decorated ones take
(that whole digits runs with AdamW and SGD never import it: test_torchvision_without_dynamo)."""

from __future__ import annotations

import copy
import os
import sys
import types

import pytest
import torch
from torch import nn

from torchkit.core.runtime import dynamo_free


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


def _inductor_stand_in(monkeypatch: pytest.MonkeyPatch, loaded: bool) -> types.ModuleType:
    """torch._inductor.config as a stand-in whose `deterministic` a test reads: in sys.modules
    (`loaded`: as once inductor has been imported) or absent from it (as in a process that has
    not), importable either way without the real, heavy inductor."""
    config = types.ModuleType("torch._inductor.config")
    config.deterministic = False
    package = types.ModuleType("torch._inductor")
    package.config = config
    monkeypatch.setitem(sys.modules, "torch._inductor", package)
    monkeypatch.setattr(torch, "_inductor", package, raising=False)  # a real one if loaded
    if loaded:
        monkeypatch.setitem(sys.modules, "torch._inductor.config", config)
    else:
        monkeypatch.delitem(sys.modules, "torch._inductor.config", raising=False)
    return config


@pytest.mark.parametrize("inductor_loaded", [False, True], ids=["not-loaded", "loaded"])
def test_deterministic_mode_imports_no_inductor_and_a_compiled_model_still_gets_it(
    monkeypatch, inductor_loaded
):
    """--deterministic called torch.use_deterministic_algorithms, which imports torch._inductor
    (and torch._dynamo and sympy: about 3 s of CPU a run) to set inductor's own flag: now torch's
    flag alone is set until inductor is loaded, and a model torchkit compiles sets inductor's."""
    from torchkit.core.runtime import compiled, seeding

    config = _inductor_stand_in(monkeypatch, inductor_loaded)
    torch_calls = []
    real = torch.use_deterministic_algorithms
    monkeypatch.setattr(
        torch,
        "use_deterministic_algorithms",
        lambda *args, **kwargs: (torch_calls.append(args), real(*args, **kwargs)),
    )
    # What seed_everything sets beside the flag, put back with the test: the environment
    # (its CUBLAS_ variable keys the preloaded servers' forks) and cuDNN's flags.
    monkeypatch.setenv(
        "CUBLAS_WORKSPACE_CONFIG", os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    )
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", torch.backends.cudnn.deterministic)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        seeding.seed_everything(0, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        # torch's function (which imports inductor) only once inductor is loaded anyway
        assert torch_calls == ([(True,)] if inductor_loaded else [])
        assert config.deterministic is inductor_loaded
        # Compiling imports inductor (here its stand-in's config).
        monkeypatch.setitem(sys.modules, "torch._inductor.config", config)
        monkeypatch.setattr(torch, "compile", lambda module, **options: module)
        model = nn.Linear(2, 2)
        assert compiled.compile_module(model) is model
        assert config.deterministic is True  # what torch's function would have set
    finally:
        seeding.use_deterministic_algorithms(before)
    assert torch.are_deterministic_algorithms_enabled() is before


@pytest.mark.parametrize(
    "build",
    [
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.05, fused=True),  # scales itself
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    ],
    ids=["fused-adamw", "sgd"],
)
def test_a_grad_scalers_step_takes_the_undecorated_step_bitwise(monkeypatch, build):
    """--amp in float16 steps through a GradScaler, which calls `optimizer.step()` itself: that
    decorated step imported torch._dynamo at the first update (about 3 s of CPU a run)."""
    monkeypatch.setattr(dynamo_free, "dynamo_loaded", lambda: False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    reference = copy.deepcopy(model)
    ours, theirs = build(model.parameters()), build(reference.parameters())
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**8) for _ in range(2)]
    taken = []
    real_step = dynamo_free._undecorated_step

    def spied(optimizer):
        found = real_step(optimizer)
        taken.append(found is not None)
        return found

    monkeypatch.setattr(dynamo_free, "_undecorated_step", spied)
    inputs, labels = torch.randn(10, 6), torch.randint(0, 3, (10,))
    for _ in range(3):
        for net, optimizer, scaler, ours_side in (
            (model, ours, scalers[0], True),
            (reference, theirs, scalers[1], False),
        ):
            optimizer.zero_grad()
            scaler.scale(nn.functional.cross_entropy(net(inputs), labels)).backward()
            if ours_side:
                with dynamo_free.undecorated_steps(optimizer):
                    scaler.step(optimizer)
                assert "step" not in vars(optimizer)  # the class's step again
            else:
                scaler.step(optimizer)
            scaler.update()
    assert taken == [True] * 3
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(got, want)
    assert scalers[0].state_dict() == scalers[1].state_dict()
    assert torch.is_grad_enabled()
