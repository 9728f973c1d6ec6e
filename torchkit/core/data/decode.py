"""Training images decoded fast: a JPEG is decoded at 1/2, 1/4 or 1/8 of its size when the
random crop that training takes of it still has enough pixels at that size.

RandomResizedCrop keeps 8% to 100% of an image and resizes it to `image_size`: a 500x375 photo
trained on at 64 pixels gives up most of its pixels in that resize. libjpeg can decode a JPEG at
1/2, 1/4 or 1/8 of its size directly in the DCT (PIL's `Image.draft`), which skips most of the
inverse DCT and colour conversion, and leaves the resize a fraction of the pixels to filter.

The rule (`reduction_for`): the crop's parameters are drawn first, from the size in the file's
header, with the draws of the exact path's `RandomResizedCrop.get_params` (`CropDraws`: the same
random numbers from torch's generator, so a seeded image gets the same crop box, and everything
after the crop the same random numbers); then the JPEG is decoded at the largest reduction 1/k,
k in 1, 2, 4, 8, that leaves the crop at least `image_size` pixels on its shorter side, and the
crop box (scaled by 1/k, sub-pixel exact) is resized to `image_size` from the reduced image. So
the final resize still shrinks (or keeps) the crop, as it does on the full image, and never
enlarges it more than the exact path does: the model sees the same content at the same scale,
filtered by libjpeg's scaled DCT instead of by PIL's bilinear filter alone (see
`benchmarks/bench_decode.py` for the difference in pixels and in accuracy).

Everything else is exactly the exact path's (`core.image_files`): images that are not JPEGs,
crops too small to reduce, in-memory images, 16-bit scaling, mode conversion (CMYK, grayscale),
the pixels as stored (no EXIF rotation), and the same errors for unreadable files. Only the crop
step changes, so every policy (trivialaugment, randaugment, autoaugment, random erasing) runs
after it as before.

The training loader takes the crops as 8-bit pixels (`FileTrainTransform.pixels_from_file`) and
the loop normalises whole batches (`NormalizedPixels`), bit for bit what ToTensor + Normalize
give each image.
"""

from __future__ import annotations

import math
import os
from typing import Any

from torchkit.core.io.errors import UsageError

# `exact`: every image fully decoded (the eval path's pixels); `fast`: JPEGs reduced as above;
# `device`: JPEGs decoded, cropped and resized on the training device (core.device_decode).
DECODE_MODES = ("device", "fast", "exact")
# What `train --decode` takes: `auto` is `device` when training on CUDA from JPEG files, else
# `fast` (core.device_decode.resolve_decode, chosen when the run starts).
DECODE_CHOICES = ("auto", *DECODE_MODES)
# What eval, predict and extract-features take (`--decode`): PIL in the loader workers, or JPEGs
# decoded, resized and cropped where the model runs (core.device_decode.DeviceEvalTransform).
INFERENCE_DECODES = ("exact", "device")
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


def pil_resample(interpolation: str) -> Any:
    """PIL's resampling filter for an --interpolation name."""
    from PIL import Image

    return Image.Resampling[interpolation.upper()]  # bilinear, bicubic, nearest


class CropDraws:
    """RandomResizedCrop.get_params(image, scale, ratio) from an image's width and height: the
    same random numbers drawn from torch's generator in the same order, the same box, in a
    quarter of the time (no tensors built per draw, the log of the ratio range taken once)."""

    def __init__(self, scale: tuple[float, float], ratio: tuple[float, float]) -> None:
        import torch

        self.scale, self.ratio = (float(scale[0]), float(scale[1])), tuple(ratio)
        # get_params takes the float32 log of the range and draws between its two values.
        log_ratio = torch.log(torch.tensor(self.ratio))
        self.log_ratio = (float(log_ratio[0]), float(log_ratio[1]))
        self._float, self._int = torch.empty(1), torch.empty(1, dtype=torch.int64)

    def draw(self, width: int, height: int) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop, as get_params returns it."""
        area = height * width
        for _ in range(10):
            target_area = area * self._float.uniform_(*self.scale).item()
            aspect_ratio = self._float.uniform_(*self.log_ratio).exp_().item()
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                top = self._int.random_(0, height - h + 1).item()
                left = self._int.random_(0, width - w + 1).item()
                return int(top), int(left), h, w
        # No draw fitted: the centre crop at the nearest allowed aspect ratio, as get_params.
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            w, h = int(round(height * max(self.ratio))), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w


class HorizontalFlip:
    """RandomHorizontalFlip(p) on PIL images: the same draw (torch.rand(1) < p), without a
    Module's call overhead."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, image: Any) -> Any:
        import torch
        from PIL import Image

        if torch.rand(1) < self.p:
            return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return image

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p})"


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
        self.draws = CropDraws(self.exact.scale, self.exact.ratio)
        self.resample = pil_resample(interpolation)

    def __call__(self, image: Any) -> Any:
        return self.exact(image)

    def decode(self, path: str | os.PathLike, mode: str) -> tuple[Any, tuple, int]:
        """(image, crop box in its pixels, reduction k): the file at `path` in `mode`, decoded
        at 1/k, and the crop drawn for it as (left, top, right, bottom), scaled by 1/k."""
        from torchkit.core.data.image_files import opened_image, pixels_in_mode, size_as_read

        # A JPEG is read whole in one call: PIL reads its header in dozens of small reads.
        in_memory = os.fspath(path).lower().endswith(JPEG_SUFFIXES)
        with opened_image(path, in_memory=in_memory) as image:
            # Drawn from the header's size, before any pixel is decoded: the exact path's draws
            # (a TIFF's turned, as it is read: Pillow 10 gave the stored size, and the crop
            # of a TIFF turned by 5..8 fell outside its pixels).
            top, left, height, width = self.draws.draw(*size_as_read(image))
            reduction = 1
            if image.format == "JPEG":
                wanted = reduction_for(width, height, self.image_size)
                if wanted > 1:
                    full_width = image.width
                    drafted = image.draft(None, (full_width // wanted, image.height // wanted))
                    if drafted is not None:  # (mode, box of the full image in reduced pixels)
                        reduction = round(full_width / drafted[1][2])
            # Decoded whole, even below the crop: a JPEG stopped early ends in the error a
            # corrupt one gives, and a file refused in one epoch must be refused in every one.
            # As stored, as every loader reads it: the crop was drawn from the stored size.
            image = pixels_in_mode(image, mode, exif=False)
        box = (left, top, left + width, top + height)
        return image, tuple(v / reduction for v in box) if reduction > 1 else box, reduction

    def from_file(self, path: str | os.PathLike, mode: str) -> Any:
        """The crop of the image file at `path`, `image_size` square, in `mode` (PIL)."""
        image, box, reduction = self.decode(path, mode)
        size = (self.image_size, self.image_size)
        if reduction == 1:
            # The exact path's crop then resize (torchvision's resized_crop on a PIL image),
            # pixel for pixel: the filter stops at the crop's edges.
            return image.crop(box).resize(size, self.resample)
        # PIL crops and resizes in one pass, with a fractional box: the crop scaled by 1/k.
        return image.resize(size, self.resample, box=box)


class PixelTensor:
    """PILToTensor for 8-bit RGB or L images: a uint8 (C, H, W) tensor, a view of the pixels in
    PIL's (H, W, C) order (so a stacked batch is channels-last in memory). Other modes go
    through torchvision's PILToTensor."""

    def __call__(self, image: Any) -> Any:
        import torch

        if image.mode not in ("RGB", "L"):
            from torchvision.transforms.functional import pil_to_tensor

            return pil_to_tensor(image)
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        channels = len(image.mode)
        return pixels.view(image.height, image.width, channels).permute(2, 0, 1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NormalizedPixels:
    """uint8 pixels (C, H, W) or a batch of them (N, C, H, W) as ToTensor then Normalize(mean,
    std) would give them, bit for bit: the same float32 operations in the same order (/255,
    -mean, /std), one pass per operation over a whole batch. The mean and std tensors are
    built once per device."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.mean, self.std = tuple(mean), tuple(std)
        self._tensors: dict[Any, tuple[Any, Any]] = {}

    def __call__(self, pixels: Any, memory_format: Any = None) -> Any:
        import torch

        tensors = self._tensors.get(pixels.device)
        if tensors is None:  # built in the process (and on the device) that uses them
            tensors = self._tensors[pixels.device] = tuple(
                torch.tensor(values, dtype=torch.float32, device=pixels.device).view(-1, 1, 1)
                for values in ((255.0,), self.mean, self.std)
            )
        # 255 as a tensor on the device: divided by a CPU scalar, CUDA multiplies by its
        # reciprocal, which is 1 ulp off ToTensor's division for 126 of the 256 levels.
        levels, mean, std = tensors
        memory_format = memory_format or torch.contiguous_format
        images = pixels.to(torch.float32, memory_format=memory_format).div_(levels)
        return images.sub_(mean).div_(std)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mean={self.mean}, std={self.std})"


def model_input(
    images: Any, device: Any, normalized: NormalizedPixels | None, memory_format: Any = None
) -> Any:
    """A loader's image batch on `device` as the model takes it, in `memory_format`: 8-bit
    pixels are copied as they are (a quarter of float32's bytes to pass between processes, pin
    and copy) and normalised there by `normalized`; float batches are copied as they are."""
    import torch

    memory_format = memory_format or torch.contiguous_format
    if images.dtype == torch.uint8:
        if normalized is None:
            raise TypeError("a batch of 8-bit pixels, and no normalisation to apply to it")
        return normalized(images.to(device, non_blocking=True), memory_format)
    return images.to(device, non_blocking=True, memory_format=memory_format)


class NormalizedTensor:
    """ToTensor then Normalize(mean, std) for 8-bit RGB or L images, bit for bit: PixelTensor
    then NormalizedPixels. Other modes go through torchvision's ToTensor and Normalize."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        from torchvision import transforms as T

        self.pixels, self.normalized = PixelTensor(), NormalizedPixels(mean, std)
        self.fallback = T.Compose([T.ToTensor(), T.Normalize(tuple(mean), tuple(std))])

    def __call__(self, image: Any) -> Any:
        if image.mode not in ("RGB", "L"):
            return self.fallback(image)
        return self.normalized(self.pixels(image))


class FileTrainTransform:
    """The train transform as `crop`, `steps` on the PIL crop (flip, policy), `to_tensor`
    (ToTensor + Normalize) and `after` (random erasing): called on a PIL image it is the exact
    path; `make_dataset` calls `from_file` on image files, which decodes through
    `crop.from_file`, or `pixels_from_file` where the loader normalises whole batches."""

    def __init__(
        self, crop: ReducedDecodeCrop, steps: list, to_tensor: NormalizedTensor, after: list
    ) -> None:
        self.crop, self.steps, self.to_tensor, self.after = crop, steps, to_tensor, after
        # What turns `pixels_from_file`'s pixels into `from_file`'s tensor, bit for bit.
        self.normalized = to_tensor.normalized

    def _stepped(self, image: Any) -> Any:
        for step in self.steps:
            image = step(image)
        return image

    def _tensor(self, image: Any) -> Any:
        tensor = self.to_tensor(self._stepped(image))
        for step in self.after:
            tensor = step(tensor)
        return tensor

    def __call__(self, image: Any) -> Any:
        return self._tensor(self.crop(image))

    def from_file(self, path: str | os.PathLike, mode: str) -> Any:
        return self._tensor(self.crop.from_file(path, mode))

    def pixels_from_file(self, path: str | os.PathLike, mode: str) -> Any:
        """The uint8 (C, H, W) pixels of `from_file` before normalisation, where nothing comes
        after it (random erasing works on normalised tensors: then `from_file`'s tensor)."""
        if self.after:
            return self.from_file(path, mode)
        return self.to_tensor.pixels(self._stepped(self.crop.from_file(path, mode)))

    def __repr__(self) -> str:
        steps = [*self.steps, self.to_tensor, *self.after]
        return f"{type(self).__name__}(crop={self.crop.exact!r}, steps={steps!r})"
