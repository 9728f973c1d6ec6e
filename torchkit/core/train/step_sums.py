"""The epoch's running training sums, kept on the device.

The loss sum (the criterion's: what the validation loss measures) and the weight it is a sum
of (the images, or with --class-weights their classes' weights: the epoch's train_loss is the
weighted mean over its images, whatever the batch size), the --l1 penalty's sum, the
correct predictions, the number of the first batch whose loss was not finite (-1: none) and
whether that batch's logits were finite but for -inf ones (a model that masks classes: the mask,
not a divergence, made its loss infinite) are only read every so often (the progress bar, the
finite check), so adding to them never waits for the device. They are changed in place, never
rebound: a CUDA graph that adds to them (`--cuda-graphs`, core.train.graphed_step) and the host
that reads them share the same tensors.
"""

from __future__ import annotations

import math
from typing import Any


def masks_classes(outputs: Any) -> Any:
    """A device bool: the (N, C) logits hold a -inf (a masked class) and no NaN or +inf (amax
    is NaN with one), so a mask, not a divergence, makes their loss infinite, if it is."""
    return (outputs.amax() < math.inf) & (outputs.amin() == -math.inf)


class StepSums:
    """`add()` after each batch's forward; `reset()` at the start of an epoch."""

    def __init__(
        self, device: Any, dtype: Any, class_weight: Any = None, *, recorded: bool = False
    ) -> None:
        """`class_weight`: the criterion's per-class weights on the device (None: none).
        `recorded`: the sums are added to inside a CUDA graph, which reads nothing from the
        host (core.train.graphed_step)."""
        import torch

        self.dtype = dtype
        self.class_weight = class_weight
        self.loss_sum = torch.zeros((), dtype=dtype, device=device)
        self.loss_weight = torch.zeros((), dtype=dtype, device=device)
        self.l1_sum = torch.zeros((), dtype=dtype, device=device)
        self.correct = torch.zeros((), dtype=dtype, device=device)
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.bad_masked = torch.zeros((), dtype=torch.bool, device=device)
        # On the CPU a scalar is read without waiting for anything: the finite check branches
        # on it, 2 operations a batch instead of 11 (0.1 ms of the digits job's 5 ms step).
        self._reads_free = torch.device(device).type == "cpu" and not recorded

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.loss_weight.zero_()
        self.l1_sum.zero_()
        self.correct.zero_()
        self.first_bad.fill_(-1)
        self.bad_masked.fill_(False)

    def add(
        self,
        loss: Any,
        outputs: Any,
        labels: Any,
        batch_no: Any,
        mixed: Any = None,
        l1: Any = None,
    ) -> None:
        """Count one batch: `loss` its criterion's mean loss, `batch_no` its number in the epoch
        (an int, or a device scalar in a graph), `mixed` the mixup/cutmix labels and weight if
        any, `l1` the --l1 penalty added to the loss it trained on (None: none)."""
        import torch

        with torch.no_grad():
            count = labels.shape[0]
            predicted = outputs.argmax(dim=1)
            if mixed is None:
                hits = (predicted == labels).sum()
            else:
                hits = (
                    mixed.lam * (predicted == mixed.labels_a).sum()
                    + (1 - mixed.lam) * (predicted == mixed.labels_b).sum()
                )
            detached = loss.detach()
            trained = detached if l1 is None else detached + l1.detach()
            if self._reads_free:
                if not bool(torch.isfinite(trained)) and int(self.first_bad) < 0:
                    self.bad_masked.fill_(masks_classes(outputs))
                    self.first_bad.fill_(batch_no)
            else:
                keep = torch.isfinite(trained) | (self.first_bad >= 0)
                masked = masks_classes(outputs)
                self.bad_masked.copy_(torch.where(keep, self.bad_masked, masked))
                self.first_bad.copy_(torch.where(keep, self.first_bad, batch_no))
            # The batch's mean loss times its weight: the sum of its images' weighted losses,
            # which the epoch's sum divided by its weight makes the mean over the epoch's
            # images. With --class-weights a batch's mean was weighed by its image count: the
            # epoch's figure then moved with the batch size. (Mixed labels are the batch's
            # own, permuted: the same weight.)
            if self.class_weight is None:
                weight = count
            else:
                weight = self.class_weight[labels].sum().to(self.dtype)
            if self.class_weight is None and self.dtype == torch.float64:
                # One operation: the loss widened to float64 times a whole count is exact, so
                # the sum rounds once, as the product added would.
                self.loss_sum.add_(detached, alpha=count)
            else:
                self.loss_sum += detached.to(self.dtype) * weight
            self.loss_weight += weight
            if l1 is not None:
                self.l1_sum += l1.detach().to(self.dtype) * count
            self.correct.add_(hits)  # a count: exact in the sums' float type
