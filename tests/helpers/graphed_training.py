"""A small training set-up for the --cuda-graphs tests (core.train.graphed_step), shared by the
CPU checks of the recorded step (train/test_graphed_step.py) and the GPU ones
(train/test_gpu_graphs.py): a small network, its batches, a training context, its weights."""

from __future__ import annotations

import torch
from torch import nn

from torchkit.core.data.batches import Batch
from torchkit.core.train import loop
from torchkit.core.train.config import TrainConfig
from torchkit.core.train.ema import ModelEMA
from torchkit.core.train.optim import LRSchedule, build_optimizer, param_groups


class SmallNet(nn.Module):
    """Convolution, BatchNorm (running statistics and a counter) and dropout (random)."""

    def __init__(self) -> None:
        super().__init__()
        # No bias before BatchNorm: its gradient is rounding noise, which Adam turns into whole
        # steps, so a last-bit difference (CUDA's fused step reads a device lr as float32)
        # would grow into a large one.
        self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.25)
        self.head = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.norm(self.conv(x)))).flatten(1))


def batches(count: int, size: int = 8, seed: int = 0) -> list[Batch]:
    generator = torch.Generator().manual_seed(seed)
    return [
        Batch(
            torch.randn(size, 1, 6, 6, generator=generator),
            torch.randint(0, 3, (size,), generator=generator),
            torch.arange(size),
            [],
        )
        for _ in range(count)
    ]


def make_context(optimizer: str = "adamw", *, clip_grad=None, l1=0.0, ema=True):
    torch.manual_seed(0)
    model = SmallNet()
    config = TrainConfig(
        optimizer=optimizer, lr=0.05, warmup_epochs=1, epochs=3, weight_decay=0.01, momentum=0.9
    )
    groups = param_groups(model, config)
    optim = build_optimizer(groups, config)
    ctx = loop.StepContext(
        model=model,
        module=model,
        optimizer=optim,
        schedule=LRSchedule(optim, config, updates_per_epoch=6),
        criterion=nn.CrossEntropyLoss(label_smoothing=0.1),
        device=torch.device("cpu"),
        ema=ModelEMA(model, 0.9) if ema else None,
        clip_grad=clip_grad,
        l1=l1,
        l1_params=[p for g in groups if not g.name.endswith("no_decay") for p in g.params],
    )
    return ctx


def train(ctx, data, epochs: int = 2) -> list[loop.EpochProgress]:
    torch.manual_seed(1)
    progress = []
    for epoch in range(1, epochs + 1):
        state = loop.EpochProgress()
        loop.train_one_epoch(ctx, data, state, loop.UnreadableImages(False), epoch=epoch)
        progress.append(state)
    return progress


def weights(ctx) -> dict[str, torch.Tensor]:
    state = {f"model.{k}": v for k, v in ctx.model.state_dict().items()}
    if ctx.ema is not None:
        state |= {f"ema.{k}": v for k, v in ctx.ema.state_dict().items()}
    return state
