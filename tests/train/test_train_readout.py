"""The progress bar reads the epoch's sums without waiting for the GPU (core/train/readout.py):
the copy that has landed, with its own image count; exact on a CPU and at an epoch's first
read. The GPU's events are stood in for by events the test completes."""

from __future__ import annotations

import pytest
import torch

from torchkit.core.train.readout import SumsReadout


class FakeEvent:
    """A CUDA event whose completion the test decides."""

    made: list[FakeEvent] = []

    def __init__(self) -> None:
        self.done = False
        self.recorded = False
        FakeEvent.made.append(self)

    def record(self) -> None:
        self.recorded = True

    def query(self) -> bool:
        return self.done


def sums(loss: float, hits: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(loss, dtype=torch.float64), torch.tensor(hits, dtype=torch.float64)


def test_on_a_cpu_the_sums_are_read_as_they_are():
    readout = SumsReadout(torch.device("cpu"), torch.float64)
    assert readout.read(*sums(3.5, 2), 4) == (3.5, 2.0, 4)
    assert readout.read(*sums(5.0, 3), 6) == (5.0, 3.0, 6)


def test_on_a_gpu_the_bar_shows_the_last_copy_that_landed():
    FakeEvent.made.clear()
    readout = SumsReadout(torch.device("cpu"), torch.float64, make_event=FakeEvent)
    # The epoch's first read waits, once: never a made-up figure.
    assert readout.read(*sums(1.0, 1), 2) == (1.0, 1.0, 2)
    assert FakeEvent.made == []
    # Later reads start a copy and show what had landed; with its own image count.
    assert readout.read(*sums(4.0, 3), 8) == (1.0, 1.0, 2)
    assert len(FakeEvent.made) == 1 and FakeEvent.made[0].recorded
    assert readout.read(*sums(6.0, 5), 12) == (1.0, 1.0, 2)  # still on its way
    assert len(FakeEvent.made) == 1  # one copy at a time: the buffer is not overwritten
    FakeEvent.made[0].done = True
    assert readout.read(*sums(9.0, 7), 16) == (4.0, 3.0, 8)  # the copy taken at 8 images
    assert len(FakeEvent.made) == 2  # and the next copy is on its way
    FakeEvent.made[1].done = True
    assert readout.read(*sums(10.0, 8), 20) == (9.0, 7.0, 16)
    assert SumsReadout.exact(*sums(10.0, 8), 20) == (10.0, 8.0, 20)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_real_gpu_reading_never_waits_for_queued_kernels():
    device = torch.device("cuda")
    readout = SumsReadout(device, torch.float64)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    big = torch.randn(4096, 4096, device=device)

    def queue_products():  # work the GPU takes a while over
        nonlocal big
        for _ in range(20):
            big = big @ big
            big = big / big.norm()

    # Every kernel once beforehand: CUDA loads a kernel at its first launch, and that load
    # most likely waits for the queued work (on the H200 the first copy had landed at once).
    assert readout.read(loss_sum, correct, 0) == (0.0, 0.0, 0)
    queue_products()
    loss_sum += 0.0
    readout.read(loss_sum, correct, 0)
    torch.cuda.synchronize()
    assert readout.read(loss_sum, correct, 0) == (0.0, 0.0, 0)
    queue_products()
    loss_sum += 2.0
    readout.read(loss_sum, correct, 5)  # starts the copy behind the queued products
    assert readout.read(loss_sum, correct, 5) == (0.0, 0.0, 0)  # nothing landed, no wait
    torch.cuda.synchronize()
    assert readout.read(loss_sum, correct, 5) == (2.0, 0.0, 5)
