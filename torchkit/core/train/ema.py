"""Exponential moving average of the weights (`--ema`), evaluated alongside the model.

ema = d * ema + (1 - d) * weights after every optimiser update, for every floating-point entry
of the state dict (BatchNorm running statistics included; integer counters are copied). The
decay warms up as min(decay, (1 + n) / (10 + n)) over the first updates n, so a short run's
average is not dominated by the random initialisation.
"""

from __future__ import annotations

import copy
from typing import Any


class ModelEMA:
    """The average of `model`'s weights; `update()` after each optimiser step."""

    def __init__(self, model: Any, decay: float = 0.999) -> None:
        self.module = copy.deepcopy(model).eval()
        for param in self.module.parameters():
            param.requires_grad_(False)
        self.decay = decay
        self.updates = 0
        # State-dict tensors share storage with the live parameters and buffers, so the pairs
        # stay valid as the model trains (and after load_state_dict, which copies in place).
        averages = self.module.state_dict()
        sources = model.state_dict()
        pairs = [(averages[name], sources[name]) for name in averages]
        self._float = [(a, s) for a, s in pairs if a.dtype.is_floating_point]
        self._other = [(a, s) for a, s in pairs if not a.dtype.is_floating_point]

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    def update(self) -> None:
        import torch

        d = self.current_decay()
        with torch.no_grad():
            if self._float:
                averages = [a for a, _ in self._float]
                torch._foreach_mul_(averages, d)
                torch._foreach_add_(averages, [s for _, s in self._float], alpha=1 - d)
            self._copy_counters()
        self.updates += 1

    def update_with(self, decay: Any, rest: Any) -> None:
        """The same update with the decay and 1 - decay given as device scalars, which a CUDA
        graph reads at each replay (--cuda-graphs): nothing here depends on the host. The
        caller fills them from `current_decay()` and counts the update (`updates`)."""
        import torch

        with torch.no_grad():
            if self._float:
                averages = [a for a, _ in self._float]
                torch._foreach_mul_(averages, decay)
                torch._foreach_add_(averages, torch._foreach_mul([s for _, s in self._float], rest))
            self._copy_counters()

    def _copy_counters(self) -> None:
        """Integer entries (BatchNorm's batch counters) are copied, not averaged."""
        for average, source in self._other:
            average.copy_(source)

    def state_dict(self) -> dict:
        return self.module.state_dict()

    def load_state_dict(self, state: dict, updates: int) -> None:
        from torchkit.core.models.checkpoint import load_weights_into

        load_weights_into(self.module, state, source="the checkpoint's EMA weights")
        self.updates = int(updates)
