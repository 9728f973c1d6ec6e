"""Evaluation images held in memory (the built-in digits), made ready without torchvision.

The eval recipe on images already in memory is run once per split with PIL, as torchvision
runs it on PIL images, so the 8-bit crops are the same to the bit as
`make_dataset(samples, eval_transform(preprocess, pixels=True))` gives, and importing
torchvision (0.3-0.5 s of a command's start on two cores) is left out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchkit.core.data.decode import pil_resample
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources.samples import Samples


def eval_pixels(
    images: np.ndarray, resize: int, size: int, interpolation: str, mode: str | None = None
) -> Any:
    """torchvision's eval recipe (`core.transforms.eval_transform`) on N,H,W[,C] uint8 images, with
    PIL as torchvision runs it on PIL images, so the pixels are the same to the bit: each image
    converted to `mode` ("RGB", "L"...; None: as it is) as `core.dataset.make_dataset` converts
    them, the shorter side resized to `resize` (the longer one to int(resize * long / short)),
    the centre cropped to `size`. N,C,H,W uint8. Done once per split, so PIL's cost does not
    matter."""
    import torch
    from PIL import Image

    resample = pil_resample(interpolation)
    out = []
    for pixels in images:
        image = Image.fromarray(pixels)
        if mode is not None and image.mode != mode:
            image = image.convert(mode)
        width, height = image.size
        short, long = min(width, height), max(width, height)
        target = (resize, int(resize * long / short))
        target_wh = target if width <= height else target[::-1]
        if target_wh != (width, height):
            image = image.resize(target_wh, resample)
        width, height = image.size
        top, left = _crop_start(height, size), _crop_start(width, size)
        image = image.crop((left, top, left + size, top + size))  # zeros outside the image
        array = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy())
        out.append(array.unsqueeze(-1) if array.ndim == 2 else array)
    return torch.stack(out).permute(0, 3, 1, 2)


def _crop_start(length: int, size: int) -> int:
    """Where torchvision's CenterCrop(size) starts along a side of `length` pixels: a side
    shorter than the crop is first padded with zeros, (size - length) // 2 before it (a model
    may record a resize smaller than its crop)."""
    if size <= length:
        return int(round((length - size) / 2.0))
    return -((size - length) // 2)


class InMemoryEvalImages:
    """A map-style dataset of (uint8 C,H,W crop, label, index, "") items, as `make_dataset`
    with the pixel eval transform gives them, for `samples` whose pixels are in memory."""

    def __init__(self, samples: Samples, preprocess: Preprocess, mode: str) -> None:
        self.crops = eval_pixels(
            samples.images,
            preprocess.resize_size,
            preprocess.image_size,
            preprocess.interpolation,
            mode,
        )
        self.labels = list(samples.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple:
        return self.crops[index], self.labels[index], index, ""
