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
from torchkit.core.data.eval_crop import crop_image
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources.samples import Samples


def eval_pixels(
    images: np.ndarray,
    resize: int,
    size: int,
    interpolation: str,
    mode: str | None = None,
    *,
    crop_mode: str = "center",
    mean: tuple[float, ...] = (0.0,),
) -> Any:
    """The eval recipe (`core.transforms.eval_transform`) on N,H,W[,C] uint8 images, with PIL as
    torchvision runs it on PIL images, so the pixels are the same to the bit: each image
    converted to `mode` ("RGB", "L"...; None: as it is) as `core.dataset.make_dataset` converts
    them, resized as `crop_mode` says (`core.eval_crop`; `center`: the shorter side to `resize`,
    the longer one to int(resize * long / short)), the centre cropped to `size` (`border` pads
    with the colour of `mean`, the others with zeros). N,C,H,W uint8. Done once per split, so
    PIL's cost does not matter."""
    import torch
    from PIL import Image

    resample = pil_resample(interpolation)
    out = []
    for pixels in images:
        image = Image.fromarray(pixels)
        if mode is not None and image.mode != mode:
            image = image.convert(mode)
        image = crop_image(image, resize, size, resample, crop_mode, mean)
        array = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy())
        out.append(array.unsqueeze(-1) if array.ndim == 2 else array)
    return torch.stack(out).permute(0, 3, 1, 2)


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
            crop_mode=preprocess.crop_mode,
            mean=preprocess.mean,
        )
        self.labels = list(samples.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple:
        return self.crops[index], self.labels[index], index, ""
