"""Mixup and CutMix: each batch is blended with itself in reverse order.

Mixup (Zhang et al. 2018) blends whole images with a weight lam ~ Beta(alpha, alpha); CutMix
(Yun et al. 2019) pastes a box covering a (1 - lam) share of the other image, and lam is then
corrected to the box's exact area. The loss is lam * CE(out, y) + (1 - lam) * CE(out, y_rev).
With both alphas set, each batch uses one of the two with equal probability (timm's switch).
Random numbers come from torch's global generator, which the training loop seeds per epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Mixed:
    images: Any
    labels_a: Any
    labels_b: Any
    lam: float
    kind: str  # "mixup" or "cutmix"


def _beta(alpha: float) -> float:
    import torch

    return float(torch.distributions.Beta(alpha, alpha).sample())


def mixup(images, labels, lam: float) -> Mixed:
    mixed = images * lam + images.flip(0) * (1.0 - lam)
    return Mixed(mixed, labels, labels.flip(0), lam, "mixup")


def cutmix_box(height: int, width: int, lam: float) -> tuple[int, int, int, int]:
    """A box (top, bottom, left, right) covering about (1 - lam) of the image, centred at a
    uniformly random point and clipped to the image."""
    import torch

    ratio = (1.0 - lam) ** 0.5
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy = int(torch.randint(height, ()).item())
    cx = int(torch.randint(width, ()).item())
    top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, height)
    left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, width)
    return top, bottom, left, right


def cutmix(images, labels, lam: float) -> Mixed:
    height, width = images.shape[-2:]
    top, bottom, left, right = cutmix_box(height, width, lam)
    mixed = images.clone()
    mixed[..., top:bottom, left:right] = images.flip(0)[..., top:bottom, left:right]
    area = (bottom - top) * (right - left)
    return Mixed(mixed, labels, labels.flip(0), 1.0 - area / float(height * width), "cutmix")


def mix_batch(images, labels, mixup_alpha: float, cutmix_alpha: float) -> Mixed | None:
    """Mix a batch, or None when neither is enabled (or the batch has one image)."""
    import torch

    if images.shape[0] < 2 or (mixup_alpha <= 0 and cutmix_alpha <= 0):
        return None
    use_cutmix = cutmix_alpha > 0 and (mixup_alpha <= 0 or bool(torch.rand(()) < 0.5))
    if use_cutmix:
        return cutmix(images, labels, _beta(cutmix_alpha))
    return mixup(images, labels, _beta(mixup_alpha))
