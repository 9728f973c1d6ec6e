"""Train and evaluation datasets over in-memory uint8 images (the built-in digits), in torch.

The image-file path turns every item into a PIL image and runs torchvision's transforms on it:
about 0.5 ms an image, more than the convnet's whole training step on an 8x8 digit. Here the
same recipe runs on tensors: RandomResizedCrop's parameters are drawn exactly as torchvision
draws them (same calls on torch's generator, in the same order, so a seeded item gets the crop
the PIL path would give it), the crop is resized bilinearly with half-pixel centres and rounded
to 8 bits as PIL does, then flipped and normalised. Evaluation images do not change between
epochs, so they are transformed once. Nothing here imports torchvision (2 s of start-up).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from torchkit.core.data import Preprocess, Samples

# torchvision's RandomResizedCrop default aspect-ratio range.
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)


def supports(samples: Samples, *, augment: str = "basic", random_erasing: float = 0.0) -> bool:
    """In-memory images under the policies implemented here (others take the PIL path)."""
    return samples.images is not None and augment in ("basic", "none") and random_erasing == 0


@functools.lru_cache(maxsize=8)
def _log_ratio(ratio: tuple[float, float]) -> Any:
    # In float32 as torchvision computes it, so that the same draws give the same crop.
    import torch

    return torch.log(torch.tensor(ratio))


def crop_params(
    height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float] = CROP_RATIO
) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a random crop of `scale` of the area and `ratio` aspect: the draws
    of torchvision's `RandomResizedCrop.get_params` (10 tries, then the centre crop)."""
    import torch

    area = height * width
    log_ratio = _log_ratio(ratio)
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            left = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def axis_matrix(length: int, start: int, span: int, size: int) -> Any:
    """The `size` x `length` matrix that resizes pixels start..start+span of an axis to `size`
    with PIL's bilinear filter (a triangle of radius 1, widened by the scale when shrinking,
    weights normalised over the pixels that exist). Bilinear is separable: a crop is resized
    by `rows @ image @ cols.T`."""
    import torch

    scale = span / size
    widen = max(scale, 1.0)
    support = widen  # the bilinear filter's radius is 1 input pixel, times `widen`
    matrix = torch.zeros(size, length, dtype=torch.float64)
    for i in range(size):
        center = (i + 0.5) * scale
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), span)
        weights = [max(0.0, 1.0 - abs((j - center + 0.5) / widen)) for j in range(low, high)]
        total = sum(weights)
        for j, weight in zip(range(low, high), weights, strict=True):
            matrix[i, start + j] = weight / total
    return matrix.float()


def _resize_shorter_crop(pixels: Any, resize: int, size: int) -> Any:
    """torchvision's eval recipe on N,C,H,W 0..255 floats: resize the shorter side to `resize`,
    centre-crop `size`, rounded to 8 bits like PIL."""
    import torch.nn.functional as F

    height, width = pixels.shape[-2:]
    if height <= width:
        target = (resize, int(resize * width / height))
    else:
        target = (int(resize * height / width), resize)
    if target != (height, width):
        pixels = F.interpolate(
            pixels, size=target, mode="bilinear", align_corners=False, antialias=True
        )
        pixels = pixels.round_().clamp_(0, 255)
    top, left = max(0, (target[0] - size) // 2), max(0, (target[1] - size) // 2)
    return pixels[..., top : top + size, left : left + size]


class MemoryImages:
    """A map-style dataset of (tensor, label, index, "") items, like `core.data.make_dataset`'s,
    for `samples` whose pixels are in memory (N,H,W or N,H,W,C uint8)."""

    def __init__(
        self,
        samples: Samples,
        preprocess: Preprocess,
        *,
        train: bool,
        flip: bool = False,
        crop_scale: tuple[float, float] = (0.08, 1.0),
        augment: str = "basic",
    ) -> None:
        import torch

        if not supports(samples, augment=augment):
            raise ValueError("MemoryImages takes in-memory images under basic/none augmentation")
        pixels = torch.from_numpy(samples.images)
        if pixels.ndim == 3:
            pixels = pixels.unsqueeze(-1)
        pixels = pixels.permute(0, 3, 1, 2)  # N,C,H,W
        channels = preprocess.in_channels
        if pixels.shape[1] == 1 and channels == 3:
            pixels = pixels.expand(-1, 3, -1, -1)  # what PIL's convert("RGB") does to gray
        self.pixels = pixels.float()
        self.labels = list(samples.labels)
        self.preprocess = preprocess
        self.random_crop = train and augment == "basic"
        self.flip = train and augment == "basic" and flip
        self.crop_scale = tuple(crop_scale)
        self.mean = torch.tensor(preprocess.mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(preprocess.std, dtype=torch.float32).view(-1, 1, 1)
        # Evaluation (and augment=none) transforms are deterministic: computed once, here.
        self._matrices: dict[tuple[int, int, int], Any] = {}
        self._fixed = None if self.random_crop else self._normalise(self._fixed_transform())

    def __len__(self) -> int:
        return len(self.labels)

    def _normalise(self, pixels: Any) -> Any:
        return (pixels / 255.0 - self.mean) / self.std

    def _fixed_transform(self) -> Any:
        return _resize_shorter_crop(
            self.pixels, self.preprocess.resize_size, self.preprocess.image_size
        )

    def draw(self, index: int) -> tuple[int, int, int, int, bool]:
        """The random part of item `index`'s transform, drawn from torch's generator as
        torchvision's Compose([RandomResizedCrop, RandomHorizontalFlip]) draws it."""
        import torch

        height, width = self.pixels.shape[-2:]
        top, left, h, w = crop_params(height, width, self.crop_scale)
        flipped = bool(self.flip and torch.rand(1).item() < 0.5)
        return top, left, h, w, flipped

    def _matrix(self, axis: int, start: int, span: int) -> Any:
        key = (axis, start, span)
        matrix = self._matrices.get(key)
        if matrix is None:
            length = self.pixels.shape[-2 + axis]
            matrix = self._matrices[key] = axis_matrix(
                length, start, span, self.preprocess.image_size
            )
        return matrix

    def render(self, indices: list[int], draws: list[tuple[int, int, int, int, bool]]) -> Any:
        """The batch of items `indices` under `draws`: crops resized by two matrix products."""
        import torch

        rows = torch.stack([self._matrix(0, top, h) for top, _, h, _, _ in draws])
        cols = torch.stack([self._matrix(1, left, w) for _, left, _, w, _ in draws])
        images = rows.unsqueeze(1) @ self.pixels[indices] @ cols.transpose(1, 2).unsqueeze(1)
        images = images.round_().clamp_(0, 255)
        flipped = [i for i, draw in enumerate(draws) if draw[4]]
        if flipped:
            images[flipped] = images[flipped].flip(-1)
        return self._normalise(images)

    def items(self, indices: list[int], draws: list | None = None) -> list[tuple]:
        """Dataset items for `indices`; `draws` (one per index) for the random transform."""
        if self._fixed is not None:
            batch = self._fixed[indices]
        else:
            batch = self.render(
                indices, draws if draws is not None else [self.draw(i) for i in indices]
            )
        return [(image, self.labels[i], i, "") for image, i in zip(batch, indices, strict=True)]

    def __getitem__(self, index: int):
        return self.items([index])[0]
