"""The loss over a dataset of a model that masks classes: one rule for train's validation and
test losses and eval's loss, so the two agree on the same weights and images.

A model that rules classes out gives them a -inf logit; an image whose true class it masks has
an infinite cross-entropy though its outputs are scorable (`scoring.scorable_rows`). That image
is left out of the mean loss and counted apart (the accuracies count it as any other image); a
NaN or +inf output is not a mask: its loss stays in the sum (a divergence, a NaN mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def masked_true_class(losses: Any, scorable: Any) -> Any:
    """(N,) bool, of (N,) per-image losses and `scorable` flags (NumPy arrays or tensors
    alike): the images whose loss is +inf though their outputs are scorable, their true class
    masked by a -inf logit."""
    return scorable & (losses == math.inf)


@dataclass(frozen=True)
class DatasetLoss:
    """The mean loss of `count` images over those not `masked` (None: every one is masked)."""

    loss: float | None
    count: int
    masked: int

    def masked_warning(self, split: str = "", counted: str = "") -> str | None:
        """The one warning of masked true classes (None: none): `split` names the images
        ("validation"; none: eval's), `counted` adds where their count is reported."""
        if not self.masked:
            return None
        if self.loss is None:
            return f"{self.none_left(split)} (the accuracies count every image{counted})"
        images, loss = _words(split)
        return (
            f"the model gives the true class of {self.masked} of {self.count} {images} a -inf "
            f"logit (it masks that class): their loss is infinite, so {loss} is the mean over "
            f"the others (the accuracies count every image{counted})"
        )

    def none_left(self, split: str = "") -> str:
        """What is wrong where every image's true class is masked: no loss at all."""
        images, loss = _words(split)
        return (
            f"the model gives the true class of every one of the {self.count} {images} a -inf "
            f"logit (it masks that class): no {loss.removeprefix('the ')} can be computed"
        )


def _words(split: str) -> tuple[str, str]:
    """How a warning names the images and their loss: "validation images", "the validation
    loss"; without a split, "images" and "the loss"."""
    return (f"{split} images", f"the {split} loss") if split else ("images", "the loss")


def dataset_loss(loss_sum: float, count: float, masked: float) -> DatasetLoss:
    """The mean loss of `count` images whose losses not masked (`masked_true_class`) add up to
    `loss_sum`, over the images not masked: sums that may have been reduced over ranks."""
    count, masked = int(count), int(masked)
    left = count - masked
    return DatasetLoss(float(loss_sum) / left if left else None, count, masked)
