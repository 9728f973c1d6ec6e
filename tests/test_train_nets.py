"""Tiny networks for the `torchkit train` tests, named on the command line as
`test_train_nets:TinyNet` (tests/ is on sys.path under pytest; subprocesses get PYTHONPATH).

Some carry fault injection driven by environment variables, so a real `torchkit train` process
can be killed or interrupted at an exact training step without any hook in torchkit itself:
TORCHKIT_TEST_KILL_AT=N sends SIGKILL, TORCHKIT_TEST_SIGINT_AT=N sends SIGINT (Ctrl-C) to the
process on the N-th training forward pass (1-based). GatedNet stops at a gate instead, for a test
to signal the process from outside at an exact step (see `GatedNet`)."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn


class TinyNet(nn.Module):
    """conv -> relu -> pool -> linear: no dropout and no BatchNorm, so a run is a pure function
    of the data order (what the reference-loop and DDP comparisons need)."""

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))


class NoisyNet(nn.Module):
    """BatchNorm (buffers) and dropout (random numbers): what exact resume must restore. Its
    training forward passes are counted for fault injection (see the module docstring)."""

    forwards = 0

    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2)
        )
        self.dropout = nn.Dropout(0.3)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            NoisyNet.forwards += 1
            _inject_fault(NoisyNet.forwards)
        return self.fc(self.dropout(self.features(x).flatten(1)))


def _inject_fault(count: int) -> None:
    if os.environ.get("TORCHKIT_TEST_KILL_AT") == str(count):
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("TORCHKIT_TEST_SIGINT_AT") == str(count):
        os.kill(os.getpid(), signal.SIGINT)


class GatedNet(TinyNet):
    """With TORCHKIT_TEST_GATE_FILE=PATH and TORCHKIT_TEST_GATE_AT=N, its N-th training forward
    pass (1-based) creates PATH and waits until the test removes it: the test waits for the
    file, signals the process (or reads its state), then opens the gate."""

    forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            GatedNet.forwards += 1
            _wait_at_gate(GatedNet.forwards)
        return super().forward(x)


class GatedBuildNet(TinyNet):
    """TinyNet whose construction waits at the gate (TORCHKIT_TEST_GATE_FILE, with
    TORCHKIT_TEST_GATE_AT=build): a test signals the process while the model is being built,
    after the loaders' workers started reading epoch 1."""

    def __init__(self, num_classes: int = 3) -> None:
        _wait_at_gate("build")
        super().__init__(num_classes)


def _wait_at_gate(count: int | str) -> None:
    gate = os.environ.get("TORCHKIT_TEST_GATE_FILE")
    if not gate or os.environ.get("TORCHKIT_TEST_GATE_AT") != str(count):
        return
    open(gate, "w").close()
    deadline = time.monotonic() + 120
    while os.path.exists(gate):
        if time.monotonic() > deadline:
            raise RuntimeError("the test never opened the gate")
        time.sleep(0.01)


class AutocastProbe(TinyNet):
    """Records the dtype its linear layer computes in during training (bf16 under --amp)."""

    seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.training:
            AutocastProbe.seen.append(out.dtype)
        return out


class OutOfMemoryNet(TinyNet):
    """Raises CUDA's out-of-memory error on the second epoch's first training step."""

    forwards = 0
    after = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            OutOfMemoryNet.forwards += 1
            if OutOfMemoryNet.forwards > OutOfMemoryNet.after:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(x)


def test_nets_build_and_run():
    x = torch.zeros(2, 3, 8, 8)
    for net in (TinyNet(5), NoisyNet(5), AutocastProbe(5), GatedNet(5)):
        assert net.eval()(x).shape == (2, 5)
