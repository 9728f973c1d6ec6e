"""One benchmark step of a model, as a closure the timing loop calls.

- infer: `model.eval()`, `torch.inference_mode()`, autocast under --amp, the forward pass.
- train: `model.train()`, forward under autocast, cross-entropy on random labels, backward,
  and an SGD step (momentum 0.9, so the optimizer keeps state as real training does); float16
  gets a GradScaler, as `torchkit train` uses one. The optimiser is built and stepped as
  `train` does it (`core.runtime.dynamo_free`): the same update, without importing torch._dynamo
  (about 2-3 s of CPU a run) where nothing is compiled.

The inputs and labels are made once, on the device, before any timing: a step measures the
model, not the data pipeline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchkit.core.models.inputs import iter_tensors

MODES = ("infer", "train")
SGD_LR = 1e-4
SGD_MOMENTUM = 0.9


@dataclass
class StepSettings:
    device: Any  # torch.device
    amp_dtype: Any = None  # a torch dtype under --amp, else None
    channels_last: bool = False
    compile: bool = False  # the model is torch.compile'd (dynamo is loaded anyway)


def _autocast(settings: StepSettings):
    import torch

    if settings.amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(settings.device.type, dtype=settings.amp_dtype)


def make_infer_step(model: Any, images: Any, settings: StepSettings) -> Callable[[], Any]:
    import torch

    model.eval()

    def step() -> Any:
        with torch.inference_mode(), _autocast(settings):
            return model(images)

    return step


@dataclass
class TrainStep:
    """The train step and what it keeps alive (to be dropped after the run)."""

    step: Callable[[], Any]
    optimizer: Any

    def release(self, model: Any) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer = None
        for param in model.parameters():
            param.grad = None


def make_train_step(model: Any, images: Any, settings: StepSettings) -> TrainStep:
    import torch

    from torchkit.core.runtime import dynamo_free

    model.train()
    if not settings.compile:
        dynamo_free.mark_not_compiled()
    optimizer = torch.optim.SGD(trainable_parameters(model), lr=SGD_LR, momentum=SGD_MOMENTUM)
    float16 = settings.amp_dtype == torch.float16
    scaler = torch.amp.GradScaler(settings.device.type) if float16 else None
    generator = torch.Generator().manual_seed(1)
    labels: dict[int, Any] = {}  # random labels per output width, made on the first step

    def labels_for(width: int) -> Any:
        if width not in labels:
            drawn = torch.randint(0, width, (images.shape[0],), generator=generator)
            labels[width] = drawn.to(settings.device)
        return labels[width]

    def step() -> Any:
        optimizer.zero_grad(set_to_none=True)
        with _autocast(settings):
            output = model(images)
        loss = training_loss(output, images.shape[0], labels_for)
        if scaler is not None:
            scaler.scale(loss).backward()
            with dynamo_free.undecorated_steps(optimizer):
                scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            dynamo_free.step(optimizer)
        return loss

    return TrainStep(step, optimizer)


def trainable_parameters(model: Any) -> list[Any]:
    """The parameters the train step's optimizer steps; a UsageError where there are none."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        from torchkit.core.io.errors import UsageError

        raise UsageError("the model has no trainable parameters", "benchmark it with --mode infer")
    return params


def training_loss(output: Any, batch: int, labels_for: Callable[[int], Any]) -> Any:
    """Cross-entropy on random labels for every (batch, classes) tensor of the output (a
    classifier's logits; Inception's auxiliary logits too, as its training adds them); the
    mean of any other floating-point output, so that models without a classifier train too."""
    import torch
    import torch.nn.functional as F

    terms = []
    for tensor in iter_tensors(output):
        if not tensor.is_floating_point():
            continue
        if tensor.ndim == 2 and tensor.shape[0] == batch and tensor.shape[1] > 1:
            terms.append(F.cross_entropy(tensor.float(), labels_for(int(tensor.shape[1]))))
        else:
            terms.append(tensor.float().mean())
    if not terms:
        from torchkit.core.io.errors import UsageError

        raise UsageError(
            "the model's output has no floating-point tensor to train on",
            "benchmark it with --mode infer",
        )
    return torch.stack(terms).sum() if len(terms) > 1 else terms[0]
