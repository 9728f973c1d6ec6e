"""An exported model as a torch module: what eval and predict run. Imports torch, so it is
imported only where an exported file is being resolved (`loading` stays torch-free)."""

from __future__ import annotations

import torch

from torchkit.core.models.exported.loading import ExportedModel


class ExportedClassifier(torch.nn.Module):
    """Runs `exported` in its own runtime on the CPU and gives the logits on the device of its
    input, so a command that moves batches to a GPU needs no special case."""

    def __init__(self, exported: ExportedModel) -> None:
        super().__init__()
        self.exported = exported

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.exported(images.float().contiguous())
        return logits.to(images.device)
