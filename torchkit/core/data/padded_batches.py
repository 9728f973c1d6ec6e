"""Inference batches padded to one shape on CUDA while cuDNN autotunes.

With torch.backends.cudnn.benchmark on, cuDNN times its algorithms for every new input shape,
each convolution, forward and backward (NVIDIA/cudnn-frontend#1066: about 1.5 s per new
execution plan on a cold cuDNN 9.10+). Training drops its last partial batch for that reason;
an inference pass cannot drop images, and its last batch is usually short: a new shape at the
first validation, and another at the test. Padding that batch with zeros to the size of the
first (the largest) keeps one shape. The model is in eval mode, where an image's outputs depend
on that image alone, and the padding's outputs are dropped; a model whose BatchNorm keeps no
running statistics normalises with the batch's own in eval mode too, so its batches are never
padded. Elsewhere (CPUs, no autotuning) batches are left as they are, so CPU figures do not
change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def pads_short_batches(device: Any, model: Any) -> bool:
    """Whether inference of `model` on `device` pads short batches: CUDA with cuDNN's
    autotuning on, and no BatchNorm that uses the batch's statistics in eval mode."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    if torch.device(device).type != "cuda" or not torch.backends.cudnn.benchmark:
        return False
    return not any(
        isinstance(module, _BatchNorm) and not module.track_running_stats
        for module in model.modules()
    )


class BatchPadder:
    """`forward(model, images)`: `model(images)`, a batch shorter than the largest so far (the
    first) padded to its size when `enabled`, the padding's outputs dropped. `padded` counts
    such batches."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.size = 0
        self.padded = 0

    def forward(self, model: Callable[[Any], Any], images: Any) -> Any:
        count = images.shape[0]
        if not self.enabled or count >= self.size:
            self.size = max(self.size, count)
            return model(images)
        import torch

        channels_last = images.ndim == 4 and images.is_contiguous(memory_format=torch.channels_last)
        layout = torch.channels_last if channels_last else torch.contiguous_format
        padded = images.new_zeros((self.size, *images.shape[1:])).contiguous(memory_format=layout)
        padded[:count] = images
        self.padded += 1
        return model(padded)[:count]
