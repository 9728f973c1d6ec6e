"""The geometry of the eval crop in each crop mode (`Preprocess.crop_mode`), as timm's eval
transform (`timm.data.transforms_imagenet_eval`) has them:

- `center`: the shorter side resized to resize_size (the longer in proportion), centre-cropped
  (torchvision's eval recipe; what a model recording no crop mode gets);
- `squash`: both sides resized to resize_size (the aspect ratio is not kept), centre-cropped;
- `border`: the longer side resized to resize_size (the shorter in proportion), centre-cropped,
  a side shorter than the crop padded with the mean colour.

One module for the PIL transform (`core.transforms.eval_transform`), the in-memory images
(`core.in_memory`) and the device decode's window (`core.device_decode.eval_view`), so the three
resize an image to the same size and crop the same window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def resized_size(width: int, height: int, resize_size: int, crop_mode: str) -> tuple[int, int]:
    """(width, height) a width x height image is resized to before the crop."""
    if crop_mode == "squash":
        return resize_size, resize_size
    if crop_mode == "border":  # timm's ResizeKeepRatio(longest=1), its float steps
        ratio = max(height / resize_size, width / resize_size)
        # At least a pixel: a strip (3000 x 50 at 18) rounds its shorter side to 0, which
        # no resize makes (timm fails there; the image was counted unreadable).
        return max(1, round(width / ratio)), max(1, round(height / ratio))
    short, long = min(width, height), max(width, height)
    new_long = int(resize_size * long / short)  # torchvision's Resize(int)
    return (resize_size, new_long) if width <= height else (new_long, resize_size)


def crop_start(length: int, size: int) -> int:
    """Where a centre crop of `size` starts along a side of `length` pixels: a side shorter
    than the crop is first padded, (size - length) // 2 before it (torchvision's CenterCrop,
    timm's CenterCropOrPad)."""
    if size <= length:
        return int(round((length - size) / 2.0))
    return -((size - length) // 2)


def border_fill(mean: Sequence[float], channels: int) -> tuple[int, ...]:
    """The 8-bit colour `border` pads with: the mean, round(255 * mean) per channel (timm's)."""
    values = [round(255 * v) for v in mean]
    return tuple(values * channels if len(values) == 1 else values)


def crop_image(
    image: Any,
    resize_size: int,
    size: int,
    resample: Any,
    crop_mode: str,
    mean: Sequence[float] = (0.0,),
) -> Any:
    """The eval crop of a PIL image with PIL alone: resized as `crop_mode` says (`resample`: a
    PIL filter), the centre cropped to `size`, a side shorter than the crop padded (`border`:
    with the colour of `mean`, the others with zeros). For 8-bit RGB and L images these are
    torchvision's Resize + CenterCrop on PIL images (and the `border` mode's steps), to the bit:
    the same PIL calls."""
    from PIL import Image

    target = resized_size(*image.size, resize_size, crop_mode)
    if target != image.size:
        image = image.resize(target, resample)
    width, height = image.size
    top, left = crop_start(height, size), crop_start(width, size)
    if crop_mode == "border" and (top < 0 or left < 0):
        fill = border_fill(mean, len(image.getbands()))
        canvas = Image.new(image.mode, (size, size), fill[0] if len(fill) == 1 else fill)
        canvas.paste(image, (-left, -top))
        return canvas
    return image.crop((left, top, left + size, top + size))  # zeros outside the image
