"""core.padded_batches: a short last inference batch padded to the first one's size where cuDNN
autotunes (CUDA with cudnn.benchmark), so validation and test add no new input shape; the
padding's outputs are dropped and the real images' are unchanged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchkit.core.data import padded_batches
from torchkit.core.data.batches import Batch
from torchkit.core.data.padded_batches import BatchPadder, pads_short_batches
from torchkit.core.train import loop


class ShapeSpy(nn.Module):
    """Convolution, BatchNorm (eval: running statistics) and a head; records each input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.norm = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 5)
        self.seen: list[tuple[int, bool]] = []
        self.norm.running_mean.uniform_(-1, 1)
        self.norm.running_var.uniform_(0.5, 2)

    def forward(self, x):
        self.seen.append((x.shape[0], x.is_contiguous(memory_format=torch.channels_last)))
        return self.head(self.norm(self.conv(x)).mean(dim=(2, 3)))


def test_only_cuda_with_cudnn_autotuning_pads(monkeypatch):
    model = ShapeSpy()
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    assert pads_short_batches(torch.device("cuda"), model) and pads_short_batches("cuda:0", model)
    assert not pads_short_batches(torch.device("cpu"), model)
    # BatchNorm without running statistics uses the batch's own in eval mode: padding would
    # change the real images' outputs.
    model.norm = nn.BatchNorm2d(4, track_running_stats=False)
    assert not pads_short_batches(torch.device("cuda"), model)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    assert not pads_short_batches(torch.device("cuda"), ShapeSpy())


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_short_batch_is_padded_and_its_outputs_are_the_images_own(channels_last):
    model = ShapeSpy().eval()
    layout = torch.channels_last if channels_last else torch.contiguous_format
    images = [torch.randn(n, 3, 6, 6).contiguous(memory_format=layout) for n in (8, 8, 3)]
    padder = BatchPadder(True)
    with torch.no_grad():
        outputs = [padder.forward(model, batch) for batch in images]
        alone = model(images[2])
    assert [n for n, _ in model.seen] == [8, 8, 8, 3]
    assert all(kept == channels_last for _, kept in model.seen)  # the padding keeps the layout
    assert outputs[2].shape == (3, 5) and padder.padded == 1
    torch.testing.assert_close(outputs[2], alone, rtol=1e-5, atol=1e-6)


def test_without_padding_the_batches_are_the_models_as_they_come():
    model = ShapeSpy().eval()
    padder = BatchPadder(False)
    for n in (8, 3):
        padder.forward(model, torch.randn(n, 3, 6, 6))
    assert [n for n, _ in model.seen] == [8, 3] and padder.padded == 0


def _validation(seed: int) -> tuple[list[Batch], dict]:
    """Batches of 8, 8 and 3 random images and labels; `loop.evaluate`'s other arguments."""
    generator = torch.Generator().manual_seed(seed)
    batches = [
        Batch(torch.randn(n, 3, 6, 6, generator=generator), torch.randint(0, 5, (n,),
              generator=generator), torch.arange(n), [])
        for n in (8, 8, 3)
    ]  # fmt: skip
    return batches, {"topk": 3, "unreadable": loop.UnreadableImages(False)}


def test_validation_pads_where_cudnn_autotunes_and_counts_the_real_images(monkeypatch):
    """`loop.evaluate` (validation and test): the model sees one batch shape, and the loss,
    top-1, top-k and image count are those of the unpadded pass."""
    batches, kwargs = _validation(seed=1)
    plain_model = ShapeSpy()
    plain = loop.evaluate(plain_model, batches, torch.device("cpu"), **kwargs)
    monkeypatch.setattr(padded_batches, "pads_short_batches", lambda device, model: True)
    padded_model = ShapeSpy()
    padded = loop.evaluate(padded_model, batches, torch.device("cpu"), **kwargs)
    assert [n for n, _ in plain_model.seen] == [8, 8, 3]
    assert [n for n, _ in padded_model.seen] == [8, 8, 8]
    assert padded.count == plain.count == 19
    assert (padded.top1, padded.topk) == (plain.top1, plain.topk)
    assert padded.loss_sum == pytest.approx(plain.loss_sum, rel=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_with_autotuning_validation_keeps_one_shape(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    batches, kwargs = _validation(seed=2)
    on_cpu = loop.evaluate(ShapeSpy(), batches, torch.device("cpu"), **kwargs)
    model = ShapeSpy().cuda()
    on_gpu = loop.evaluate(model, batches, torch.device("cuda"), **kwargs)
    assert [n for n, _ in model.seen] == [8, 8, 8] and on_gpu.count == 19
    assert on_gpu.loss_sum == pytest.approx(on_cpu.loss_sum, rel=1e-2)  # TF32 convolutions
