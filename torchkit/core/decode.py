"""Training images decoded fast: a JPEG is decoded at 1/2, 1/4 or 1/8 of its size when the
random crop that training takes of it still has enough pixels at that size.

RandomResizedCrop keeps 8% to 100% of an image and resizes it to `image_size`: a 500x375 photo
trained on at 64 pixels gives up most of its pixels in that resize. libjpeg can decode a JPEG at
1/2, 1/4 or 1/8 of its size directly in the DCT (PIL's `Image.draft`), which skips most of the
inverse DCT and colour conversion, and leaves the resize a fraction of the pixels to filter.

The rule (`reduction_for`): the crop's parameters are drawn first, from the size in the file's
header, by the very `RandomResizedCrop.get_params` call the exact path makes (same draws from
torch's generator, so a seeded image gets the same crop box, and everything after the crop the
same random numbers); then the JPEG is decoded at the largest reduction 1/k, k in 1, 2, 4, 8,
that leaves the crop at least `image_size` pixels on its shorter side, and the crop box (scaled
by 1/k, sub-pixel exact) is resized to `image_size` from the reduced image. So the final resize
still shrinks (or keeps) the crop, as it does on the full image, and never enlarges it more than
the exact path does: the model sees the same content at the same scale, filtered by libjpeg's
scaled DCT instead of by PIL's bilinear filter alone (see `benchmarks/bench_decode.py` for the
difference in pixels and in accuracy).

Everything else is exactly the exact path's: images that are not JPEGs, crops too small to
reduce, in-memory images, 16-bit scaling, mode conversion (CMYK, grayscale), no EXIF rotation,
and the same errors for unreadable files. Only the crop step changes, so every policy
(trivialaugment, randaugment, autoaugment, random erasing) runs after it as before.
"""

from __future__ import annotations

import os
from typing import Any

from torchkit.core.errors import UsageError

# `exact`: every image fully decoded (the eval path's pixels); `fast`: JPEGs reduced as above.
DECODE_MODES = ("fast", "exact")
REDUCTIONS = (1, 2, 4, 8)  # what libjpeg's scaled DCT offers through PIL's draft
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)  # RandomResizedCrop's default aspect-ratio range
JPEG_SUFFIXES = (".jpg", ".jpeg", ".jfif")


def check_decode(decode: str) -> str:
    if decode not in DECODE_MODES:
        raise UsageError(f"unknown --decode {decode!r}", "use " + ", ".join(DECODE_MODES))
    return decode


def reduction_for(crop_width: int, crop_height: int, image_size: int) -> int:
    """The largest k of 1, 2, 4, 8 that leaves a crop of `crop_width` x `crop_height` pixels
    at least `image_size` pixels on its shorter side once decoded at 1/k: e.g. a 1500x1500 crop
    at 64 pixels -> 8, a 200x150 one -> 2, anything under 128 pixels -> 1."""
    shorter = min(crop_width, crop_height)
    reduction = 1
    while reduction < REDUCTIONS[-1] and shorter >= 2 * reduction * image_size:
        reduction *= 2
    return reduction


class ReducedDecodeCrop:
    """torchvision's RandomResizedCrop(image_size, scale, interpolation) whose `from_file`
    decodes a JPEG at a reduced size where the crop allows it (module doc). Called on a PIL
    image it is RandomResizedCrop itself."""

    def __init__(
        self,
        image_size: int,
        *,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = CROP_RATIO,
        interpolation: str = "bilinear",
    ) -> None:
        from torchvision import transforms as T

        self.image_size = int(image_size)
        self.exact = T.RandomResizedCrop(
            self.image_size,
            scale=tuple(scale),
            ratio=tuple(ratio),
            interpolation=T.InterpolationMode(interpolation),
            antialias=True,
        )

    def __call__(self, image: Any) -> Any:
        return self.exact(image)

    def decode(self, path: str | os.PathLike, mode: str) -> tuple[Any, tuple, int]:
        """(image, crop box in its pixels, reduction k): the file at `path` in `mode`, decoded
        at 1/k, and the crop drawn for it as (left, top, right, bottom), scaled by 1/k."""
        from torchkit.core.image_files import opened_image, to_8bit

        # A JPEG is read whole in one call: PIL reads its header in dozens of small reads.
        in_memory = os.fspath(path).lower().endswith(JPEG_SUFFIXES)
        with opened_image(path, in_memory=in_memory) as image:
            # Drawn from the header's size, before any pixel is decoded: the exact path's draws.
            top, left, height, width = self.exact.get_params(
                image, self.exact.scale, self.exact.ratio
            )
            reduction = 1
            if image.format == "JPEG":
                wanted = reduction_for(width, height, self.image_size)
                if wanted > 1:
                    full_width = image.width
                    drafted = image.draft(None, (full_width // wanted, image.height // wanted))
                    if drafted is not None:  # (mode, box of the full image in reduced pixels)
                        reduction = round(full_width / drafted[1][2])
            if image.mode == mode:
                image.load()  # the pixels outlive the file; no copy needed
            else:
                image = to_8bit(image).convert(mode)  # a loaded copy
        box = (left, top, left + width, top + height)
        return image, tuple(v / reduction for v in box) if reduction > 1 else box, reduction

    def from_file(self, path: str | os.PathLike, mode: str) -> Any:
        """The crop of the image file at `path`, `image_size` square, in `mode` (PIL)."""
        import torchvision.transforms.functional as F

        image, box, reduction = self.decode(path, mode)
        if reduction == 1:  # the exact path's crop and resize, pixel for pixel
            left, top, right, bottom = box
            return F.resized_crop(
                image,
                top,
                left,
                bottom - top,
                right - left,
                [self.image_size, self.image_size],
                self.exact.interpolation,
                antialias=True,
            )
        # PIL crops and resizes in one pass, with a fractional box: the crop scaled by 1/k.
        resample = F.pil_modes_mapping[self.exact.interpolation]
        return image.resize((self.image_size, self.image_size), resample, box=box)


class NormalizedTensor:
    """ToTensor then Normalize(mean, std) for 8-bit RGB or L images, bit for bit (the same
    float32 operations in the same order), without re-building the mean and std tensors and
    re-checking the input for every image."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        from torchvision import transforms as T

        self.mean, self.std = tuple(mean), tuple(std)
        self.fallback = T.Compose([T.ToTensor(), T.Normalize(self.mean, self.std)])
        self._tensors: Any = None

    def __call__(self, image: Any) -> Any:
        import numpy as np
        import torch

        if image.mode not in ("RGB", "L"):
            return self.fallback(image)
        if self._tensors is None:  # built in the worker that uses them
            self._tensors = tuple(
                torch.tensor(values, dtype=torch.float32).view(-1, 1, 1)
                for values in (self.mean, self.std)
            )
        mean, std = self._tensors
        pixels = torch.from_numpy(np.array(image))  # a writable copy
        pixels = pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1)
        tensor = pixels.to(torch.float32, memory_format=torch.contiguous_format).div_(255)
        return tensor.sub_(mean).div_(std)


class FileTrainTransform:
    """The train transform as `crop` then `rest`: called on a PIL image it is the exact path;
    `make_dataset` calls `from_file` on image files, which decodes through `crop.from_file`."""

    def __init__(self, crop: ReducedDecodeCrop, rest: Any) -> None:
        self.crop, self.rest = crop, rest

    def __call__(self, image: Any) -> Any:
        return self.rest(self.crop(image))

    def from_file(self, path: str | os.PathLike, mode: str) -> Any:
        return self.rest(self.crop.from_file(path, mode))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(crop={self.crop.exact!r}, rest={self.rest!r})"
