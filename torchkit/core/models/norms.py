"""What a model's normalisation layers ask of the batches it trains on."""

from __future__ import annotations

from typing import Any


def has_batch_norm(model: Any) -> bool:
    """Whether `model` holds a BatchNorm layer (SyncBatchNorm too): in training mode it takes
    its statistics from the batch, so a batch of one image is an error in torch."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return any(isinstance(module, _BatchNorm) for module in model.modules())
