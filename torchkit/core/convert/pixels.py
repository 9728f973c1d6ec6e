"""What an array of pixels means, and converting it between the PyTorch and NumPy conventions.

Everything read is first put in one canonical form, `Pixels`: channels last, (H, W, C) or
(N, H, W, C) with C in 1..4, and a dtype that says how to read the values:

- uint8: raw 8-bit pixels, 0..255;
- uint16: raw 16-bit pixels, 0..65535 (16-bit PNG/TIFF);
- float: intensities where 1.0 is full scale (what `to_tensor` gives).

Writers then produce what each format expects. The conversions are exact where the formats allow
it: uint8 -> float32 is `v / 255` in float32 (bit-identical to torchvision's `to_tensor`) and
float -> uint8 is `round(x * 255)`, so 8-bit pixels survive any number of round trips. Floats are
clamped to [0, 1] (with a warning) before they become integers: never wrapped, as `.byte()` would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# 16 -> 8 bits: the same conversion as every image loader's (train, eval, dataset-stats).
from torchkit.core.data.image_files import uint16_to_uint8 as _uint16_to_uint8
from torchkit.core.io.errors import InputError

DTYPES = ("uint8", "float32", "float16")
MAX_CHANNELS = 4

Warn = Callable[[str], None]


@dataclass
class Pixels:
    """An image (H, W, C) or a batch (N, H, W, C), channels last; see the module docstring."""

    array: Any  # numpy.ndarray
    name: str = ""
    scale: int = 1  # the scale float values were given in (for messages only)

    @property
    def batch(self) -> bool:
        return self.array.ndim == 4

    def images(self) -> list[Pixels]:
        """The single images of a batch (or this image)."""
        if not self.batch:
            return [self]
        return [Pixels(image, self.name, self.scale) for image in self.array]


def _channels_ok(count: int) -> bool:
    return 1 <= count <= MAX_CHANNELS


def _choose_layout(shape: tuple[int, ...], default: str) -> str:
    """CHW or HWC for a 3-D (or 4-D batch) shape: the one that gives 1..4 channels, or the
    format's convention when both (or neither) do."""
    chw = _channels_ok(shape[-3])
    hwc = _channels_ok(shape[-1])
    if chw and not hwc:
        return "chw"
    if hwc and not chw:
        return "hwc"
    return default


def from_array(
    array: Any,
    *,
    name: str,
    layout: str | None = None,
    default_layout: str = "hwc",
    scale: int | None = None,
) -> Pixels:
    """Interpret a NumPy array read from a .npy/.pt/.safetensors file.

    2-D is (H, W); 3-D is one image in `layout` (guessed from the shape when None); 4-D is a
    batch. Integer arrays are raw pixels (0..255, or 0..65535 when they need 16 bits); float
    arrays are intensities in [0, 1], or in [0, 255] with `scale=255`.
    """
    import numpy as np

    shape = tuple(array.shape)
    if array.ndim not in (2, 3, 4) or 0 in shape:
        raise InputError(
            f"{name} holds an array of shape {shape}, not an image",
            "expected HxW, CxHxW or HxWxC, or a batch NxCxHxW or NxHxWxC",
        )
    if array.ndim == 2:
        array = array[..., None]
    else:
        chosen = layout or _choose_layout(shape, default_layout)
        if chosen == "chw":
            array = np.moveaxis(array, -3, -1)
        if not _channels_ok(array.shape[-1]):
            hint = (
                "a batch of grayscale images needs a channel axis: Nx1xHxW"
                if array.ndim == 3
                else "pass --layout chw or --layout hwc"
            )
            raise InputError(
                f"{name} has shape {shape}: as {chosen.upper()} that is "
                f"{array.shape[-1]} channels, not 1 to {MAX_CHANNELS}",
                hint,
            )
    array = np.ascontiguousarray(array)
    kind = array.dtype.kind
    if kind == "b":
        return Pixels(array.astype(np.uint8) * np.uint8(255), name)
    if array.dtype in (np.uint8, np.uint16):
        return Pixels(array, name)
    if kind in "iu":
        low, high = int(array.min()), int(array.max())
        if low < 0 or high > 65535:
            raise InputError(
                f"{name} holds integers from {low} to {high}, not pixel values",
                "integer images must lie in 0..255, or 0..65535 for 16 bits",
            )
        return Pixels(array.astype(np.uint8 if high <= 255 else np.uint16), name)
    if kind == "f":
        if array.dtype != np.float64:
            array = array.astype(np.float32)
        if scale == 255:
            array = array / array.dtype.type(255)
        return Pixels(array, name, scale or 1)
    raise InputError(f"{name} holds {array.dtype} values, not pixels")


def _float_to_uint8(pixels: Pixels, warn: Warn | None) -> Any:
    import numpy as np

    array = pixels.array
    # NaN has no pixel value; an infinity is outside [0, 1] and clamped as any other value
    # (as torchvision's save_image clamps it): +inf was made 0, a saturated pixel black.
    nan = np.isnan(array)
    if nan.any():
        if warn:
            warn(f"{pixels.name}: {int(nan.sum())} NaN values were set to 0")
        array = np.where(nan, 0, array)
    low, high = float(array.min()), float(array.max())
    if low < 0 or high > 1:
        outside = int(((array < 0) | (array > 1)).sum())
        if warn:
            s = pixels.scale
            warn(
                f"{pixels.name}: {outside} values outside [0, {s}] were clamped "
                f"(min {low * s:.4g}, max {high * s:.4g})"
            )
        array = np.clip(array, 0, 1)
    return np.rint(array * 255).astype(np.uint8)


def to_uint8(pixels: Pixels, warn: Warn | None = None) -> Any:
    import numpy as np

    if pixels.array.dtype == np.uint8:
        return pixels.array
    if pixels.array.dtype == np.uint16:
        return _uint16_to_uint8(pixels.array)
    return _float_to_uint8(pixels, warn)


def to_float(pixels: Pixels, dtype: str = "float32", scale: int = 1) -> Any:
    """Intensities as float32/float16 in [0, 1] (`scale=1`) or [0, 255] (`scale=255`)."""
    import numpy as np

    array = pixels.array
    if array.dtype == np.uint8:
        values = array.astype(np.float32)
        result = values if scale == 255 else values / np.float32(255)
    elif array.dtype == np.uint16:
        values = array.astype(np.float32)
        result = values / np.float32(257) if scale == 255 else values / np.float32(65535)
    else:
        result = array * 255 if scale == 255 else array
    return result.astype(np.float16 if dtype == "float16" else np.float32)


def to_array(
    pixels: Pixels,
    *,
    layout: str,
    dtype: str,
    scale: int | None = None,
    warn: Warn | None = None,
) -> Any:
    """The array a .npy/.pt/.safetensors file stores: `layout` chw|hwc, `dtype` uint8, uint16
    (16-bit sources only), float32 or float16. A single-channel HWC image is (H, W), as
    `np.asarray(PIL.Image.open(...))` gives; a single-channel CHW image is (1, H, W), as
    `to_tensor` gives."""
    import numpy as np

    if dtype == "uint8":
        array = to_uint8(pixels, warn)
    elif dtype == "uint16":
        if pixels.array.dtype != np.uint16:
            raise ValueError("uint16 output is only for 16-bit sources")
        array = pixels.array
    else:
        array = to_float(pixels, dtype, scale or 1)
    if layout == "chw":
        array = np.moveaxis(array, -1, -3)
    elif not pixels.batch and array.shape[-1] == 1:
        array = array[..., 0]
    return np.ascontiguousarray(array)


def sixteen_bit_floats(pixels: Pixels) -> Pixels:
    """Floats that are a 16-bit image's values (every one v / 65535, as a 16-bit PNG becomes in
    a .pt) as those 16-bit pixels, else `pixels` itself. Floats that are all 8-bit values
    (k / 255) stay floats, and so do any others (a model's output): both are written with
    8 bits, as `save_image` writes them; a 16-bit image's were cut to 8 bits without a word."""
    import numpy as np

    array = pixels.array
    if array.dtype.kind != "f" or array.dtype == np.float16:  # float16 holds no 16-bit values
        return pixels
    if not np.isfinite(array).all() or array.min() < 0 or array.max() > 1:
        return pixels
    step = array.dtype.type  # the sum as to_float makes it: in the array's own precision
    eight = np.rint(array * step(255))
    if np.array_equal(eight / step(255), array):
        return pixels
    sixteen = np.rint(array * step(65535))
    if not np.array_equal((sixteen / step(65535)).astype(array.dtype), array):
        return pixels
    return Pixels(sixteen.astype(np.uint16), pixels.name, pixels.scale)


def to_image(pixels: Pixels, *, sixteen_bit: bool, warn: Warn | None = None) -> Any:
    """(H, W) or (H, W, C) uint8 for an image file; uint16 kept where the format has 16 bits
    (the caller says when 16-bit values are scaled to 8 bits)."""
    import numpy as np

    if pixels.array.dtype == np.uint16 and not sixteen_bit:
        array = _uint16_to_uint8(pixels.array)
    elif pixels.array.dtype == np.uint16:
        array = pixels.array
    else:
        array = to_uint8(pixels, warn)
    return array[..., 0] if array.shape[-1] == 1 else array


def make_grid(pixels: Pixels, *, nrow: int = 8, padding: int = 2, pad_value: float = 0) -> Pixels:
    """One image tiling a batch, exactly as `torchvision.utils.make_grid` (without normalize):
    `nrow` images a row, `padding` pixels of `pad_value` around each; grayscale becomes RGB."""
    import numpy as np

    array = pixels.array if pixels.batch else pixels.array[None]
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    count, height, width, channels = array.shape
    if count == 1:
        return Pixels(np.ascontiguousarray(array[0]), pixels.name, pixels.scale)
    columns = min(nrow, count)
    rows = -(-count // columns)
    cell_h, cell_w = height + padding, width + padding
    fill = pad_value if array.dtype.kind == "f" else int(pad_value)
    grid = np.full(
        (cell_h * rows + padding, cell_w * columns + padding, channels), fill, dtype=array.dtype
    )
    for index in range(count):
        top = (index // columns) * cell_h + padding
        left = (index % columns) * cell_w + padding
        grid[top : top + height, left : left + width] = array[index]
    return Pixels(grid, pixels.name, pixels.scale)
