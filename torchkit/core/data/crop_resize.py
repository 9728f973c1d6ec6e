"""The device path's crop and resize (`core.device_decode`): each decoded JPEG's crop box
resized to `size` x `size` with PIL's filters, as PIL's `crop(box).resize(size)` computes it up
to rounding, then flipped if drawn so, as uint8.

Two ways to the same pixels:
- one image at a time (`resize_crop`): `torch.nn.functional.interpolate` with antialiasing,
  torchvision's port of PIL's filters. On a CPU that is the cheapest;
- the whole batch at once (`resize_crops(..., batched=True)`, the default on CUDA). The
  resize of each crop is two matrix products, `rows @ crop @ columns.T`, where `rows` and
  `columns` hold the filter's weights as PIL computes them (centre, support, normalised
  taps). For a batch, every crop is gathered into one padded buffer (`gathered_crops`: the
  images end to end, then one `index_select` of each crop row's pixels), and the weights of
  all crops are computed at once; then
  batched products resize everything, and the flips cost nothing, because a mirrored crop's
  column weights are the same rows reversed. Chunks of the batch (largest crops first) bound
  the memory it takes (368 MiB at the peak for 256 whole 500x500 photos, measured on a CPU).
  On a GPU the host is what keeps up with the steps: the per-image path issues about five
  operators per image (slice, convert, resize, stack, round), the batched one a few dozen per
  chunk, whatever its size.

Both give float32 values within float rounding of each other (products summed in another order),
so the 8-bit crops agree to at most 1 level on a CPU and 2 on the H200 (the first pass's
rounding to 8 bits carries a tie rounded the other way into the second), almost everywhere
exactly (tests/data/test_crop_resize.py).
That holds for float32 products; torchkit never enables TF32 for them
(`torch.backends.cuda.matmul.allow_tf32`, global to the process), with which about 2% of
pixels would be 1 level off.
"""

from __future__ import annotations

import logging
from typing import Any

from torchkit.core.io.errors import first_line

log = logging.getLogger("torchkit")

# (torch mode, antialias) of F.interpolate for each --interpolation: the antialiased filters
# are torchvision's port of PIL's (bilinear and bicubic, a = -0.5); nearest takes PIL's own
# pixel (`pil_nearest_sources`).
INTERPOLATE_MODES = {
    "bilinear": ("bilinear", True),
    "bicubic": ("bicubic", True),
    "nearest": ("nearest-exact", False),
}
# PIL's filter supports (in input pixels at scale 1).
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}
# Float elements of one chunk's padded buffer (3 channels): 48M, 192 MB. A batch of 256 crops
# of 500 x 375 photos fits in two or three chunks; a bigger one would only hold more memory.
CHUNK_ELEMENTS = 48 * 2**20
# Devices on which the batched products failed once (resize_crops' automatic choice).
_PER_IMAGE: set[str] = set()


def resize_crop(
    image: Any,
    box: tuple[int, int, int, int],
    size: int,
    interpolation: str,
    view: tuple[int, int, int, int] | None = None,
) -> Any:
    """The crop `box` (top, left, height, width) of a (C, H, W) image resized to `size` x
    `size`, as float32 on the image's device: PIL's crop then resize (the width first, rounded
    to 8 bits as PIL stores it; the height's pass is left unrounded). With a
    `view` (resized height, resized width, top, left) the crop is resized to the view's
    height and width and the `size` x `size` window at its top and left is kept: PIL's resize
    then centre crop (the evaluation transform), where the box is the whole image."""
    import torch
    import torch.nn.functional as F

    top, left, height, width = box
    crop = image[:, top : top + height, left : left + width].unsqueeze(0).to(torch.float32)
    resized_height, resized_width, view_top, view_left = view or (size, size, 0, 0)
    shape = (resized_height, resized_width)
    mode, antialias = INTERPOLATE_MODES[interpolation]
    if mode == "nearest-exact":  # PIL's pixels, which differ from nearest-exact at ties
        rows = pil_nearest_sources(height, resized_height, view_top, size)
        columns = pil_nearest_sources(width, resized_width, view_left, size)
        crop = crop[0].index_select(1, host_tensor(rows, torch.long, crop.device))
        return crop.index_select(2, host_tensor(columns, torch.long, crop.device))
    # PIL stores its first pass in 8 bits, clipping bicubic's overshoot there: unrounded,
    # bicubic lands up to 27 levels from PIL on high-contrast images. The width goes first, as
    # in Pillow up to 12; Pillow 13 takes the height first for some shapes (python-pillow/
    # Pillow#9549), where such pixels stay that far off.
    across = F.interpolate(
        crop, size=(height, resized_width), mode=mode, align_corners=False, antialias=antialias
    )
    across = across.round_().clamp_(0, 255)
    resized = F.interpolate(across, size=shape, mode=mode, align_corners=False, antialias=antialias)
    return resized[0, :, view_top : view_top + size, view_left : view_left + size]


def resize_crops(
    images: list,
    boxes: list[tuple[int, int, int, int]],
    flips: list[bool],
    size: int,
    interpolation: str,
    *,
    views: list | None = None,
    batched: bool | None = None,
) -> Any:
    """The uint8 (N, C, size, size) crops of `images` ((C, H, W) uint8 tensors on one device):
    each `box` (top, left, height, width) resized, rounded to 8 bits as PIL's resize rounds its
    output, and mirrored where `flips` says. `views`: one (resized height, resized width, top,
    left) or None per image (`resize_crop`). `batched`: the batch at once (module doc); None:
    on CUDA only, where launches cost more than the products' arithmetic."""

    if not images:
        raise ValueError("resize_crops needs at least one image")
    views = [view or (size, size, 0, 0) for view in (views or [None] * len(images))]
    device = images[0].device
    if batched is not None:
        resize = _resize_batched if batched else _resize_each
        return resize(images, boxes, flips, size, interpolation, views)
    if not batched_by_default(device):
        return _resize_each(images, boxes, flips, size, interpolation, views)
    try:
        return _resize_batched(images, boxes, flips, size, interpolation, views)
    except RuntimeError as error:
        if _device_failure(error):
            raise  # the run's own error: out of memory, or a CUDA error that stays
        # A device the batched products fail on still trains, image by image, and says so
        # once: the two ways give the same pixels.
        _PER_IMAGE.add(str(device))
        log.warning(
            "resizing the batch at once failed on %s (%s): resizing image by image",
            device,
            first_line(error),
        )
    return _resize_each(images, boxes, flips, size, interpolation, views)


def _device_failure(error: BaseException) -> bool:
    """Whether `error` is the device's, not the batched products': out of memory (cuBLAS says
    so in its own words), or a CUDA error, which stays on the device and fails whatever runs
    next (an earlier kernel's may surface here first)."""
    import torch

    from torchkit.core.runtime.device import is_out_of_memory

    if is_out_of_memory(error) or isinstance(error, getattr(torch, "AcceleratorError", ())):
        return True
    text = str(error)
    return "CUDA error" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text


def batched_by_default(device: Any) -> bool:
    """Whether `resize_crops` resizes the batch at once when not told: on CUDA, unless the
    batched products already failed on that device."""
    return device.type == "cuda" and str(device) not in _PER_IMAGE


def _resize_each(
    images: list,
    boxes: list[tuple[int, int, int, int]],
    flips: list[bool],
    size: int,
    interpolation: str,
    views: list,
) -> Any:
    """`resize_crops` image by image: F.interpolate on each crop. A kernel per image costs the
    host more than the device, so the rounding and the flips are one pass each over the batch."""
    import torch

    triples = zip(images, boxes, views, strict=True)
    stacked = torch.stack(
        [resize_crop(image, box, size, interpolation, view) for image, box, view in triples]
    )
    out = stacked.round_().clamp_(0, 255).to(torch.uint8)
    if any(flips):  # a mask from page-locked memory: indexing by a list would wait for the GPU
        mirrored = host_tensor(flips, torch.bool, out.device).view(-1, 1, 1, 1)
        out = torch.where(mirrored, out.flip(-1), out)
    return out


def _resize_batched(
    images: list,
    boxes: list[tuple[int, int, int, int]],
    flips: list[bool],
    size: int,
    interpolation: str,
    views: list,
) -> Any:
    """`resize_crops` for the whole batch at once (module doc), a chunk at a time."""
    import torch

    device = images[0].device
    channels = images[0].shape[0]
    chunks = _chunks(boxes, channels)
    if len(chunks) == 1:
        return _resize_chunk(images, boxes, flips, size, interpolation, views)
    out = torch.empty((len(images), channels, size, size), dtype=torch.uint8, device=device)
    for chunk in chunks:
        out[host_tensor(chunk, torch.long, device)] = _resize_chunk(
            [images[at] for at in chunk],
            [boxes[at] for at in chunk],
            [flips[at] for at in chunk],
            size,
            interpolation,
            [views[at] for at in chunk],
        )
    return out


def host_tensor(values: list, dtype: Any, device: Any) -> Any:
    """`values` as a tensor on `device`, copied from page-locked memory without waiting: a plain
    copy from pageable memory would wait for every kernel queued on the stream (on a GPU, the
    training step's, which the decode is meant to run beside)."""
    import torch

    tensor = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def _chunks(boxes: list[tuple[int, int, int, int]], channels: int) -> list[list[int]]:
    """The batch's positions in groups whose padded buffers hold at most CHUNK_ELEMENTS floats:
    the whole batch in its order when it fits, else largest crops first, so that crops of like
    sizes share a buffer and little of it is padding."""
    tallest = max(box[2] for box in boxes)
    widest = max(box[3] for box in boxes)
    if len(boxes) * channels * tallest * widest <= CHUNK_ELEMENTS:
        return [list(range(len(boxes)))]
    order = sorted(range(len(boxes)), key=lambda at: boxes[at][2] * boxes[at][3], reverse=True)
    chunks: list[list[int]] = []
    current: list[int] = []
    tallest = widest = 0
    for at in order:
        _, _, height, width = boxes[at]
        grown = (len(current) + 1) * channels * max(tallest, height) * max(widest, width)
        if current and grown > CHUNK_ELEMENTS:
            chunks.append(current)
            current, tallest, widest = [], 0, 0
        current.append(at)
        tallest, widest = max(tallest, height), max(widest, width)
    chunks.append(current)
    return chunks


def _resize_chunk(
    images: list,
    boxes: list[tuple[int, int, int, int]],
    flips: list[bool],
    size: int,
    interpolation: str,
    views: list,
) -> Any:
    """`rows @ crop @ columns.T` for each crop of the chunk, the weights sized to the chunk's
    tallest and widest crop."""
    import torch

    device = images[0].device
    heights = [box[2] for box in boxes]
    widths = [box[3] for box in boxes]
    tallest, widest = max(heights), max(widths)
    count, channels = len(images), images[0].shape[0]
    rows = filter_weights(
        heights,
        size,
        tallest,
        interpolation,
        device,
        resized=[view[0] for view in views],
        offsets=[view[2] for view in views],
    )
    mirrored = host_tensor(flips, torch.bool, device) if any(flips) else None
    columns = filter_weights(
        widths,
        size,
        widest,
        interpolation,
        device,
        mirrored=mirrored,
        resized=[view[1] for view in views],
        offsets=[view[3] for view in views],
    )
    crops = gathered_crops(images, boxes, tallest, widest).to(torch.float32)
    # The columns of every channel's rows in one product, (N, C*H, W) @ (N, W, S); then the
    # rows, a product per channel: weights broadcast over the channels would be copied.
    across = torch.bmm(crops.view(count, channels * tallest, widest), columns.mT)
    del crops
    across.round_().clamp_(0, 255)  # the width's pass in 8 bits, as PIL stores it (above)
    across = across.view(count, channels, tallest, size)
    resized = torch.stack([torch.bmm(rows, across[:, c]) for c in range(channels)], dim=1)
    return resized.round_().clamp_(0, 255).to(torch.uint8)


def gathered_crops(
    images: list, boxes: list[tuple[int, int, int, int]], tallest: int, widest: int
) -> Any:
    """(N, C, tallest, widest) uint8: crop n of `images` (C, H, W tensors of one dtype, their
    sizes free) in the top left of slot n, in a few operators whatever N (module doc). Past a
    crop's own height its last row is repeated, and past its width each row goes on with the
    pixels after it in memory: values the filter weights meet with 0 (exactly 0 products).

    The images go end to end into one flat buffer; every `widest`-pixel window of it is a row
    of `unfold`'s view (no copy), and one `index_select` takes each crop row's window. Copying
    crop by crop cost the host about 60 us a crop on the H200 (eight operators each), 15 ms a
    batch of 256: almost half of the decode thread's time for resnet18."""
    import torch

    device = images[0].device
    channels = images[0].shape[0]
    # The windows of the last rows run past the buffer's end: `widest` pixels of padding.
    pieces = [image.reshape(-1) for image in images]
    pieces.append(torch.zeros(widest, dtype=images[0].dtype, device=device))
    flat = torch.cat(pieces)
    windows = flat.unfold(0, widest, 1)
    firsts, row_strides, planes, heights = [], [], [], []
    offset = 0
    for image, (top, left, height, _) in zip(images, boxes, strict=True):
        _, image_height, image_width = image.shape
        firsts.append(offset + top * image_width + left)
        row_strides.append(image_width)
        planes.append(image_height * image_width)
        heights.append(height)
        offset += channels * image_height * image_width
    first, row_stride, plane, height = (
        column.view(-1, 1, 1)
        for column in host_tensor([firsts, row_strides, planes, heights], torch.long, device)
    )
    rows = torch.minimum(torch.arange(tallest, device=device).view(1, 1, -1), height - 1)
    channel = torch.arange(channels, device=device).view(1, -1, 1)
    starts = first + channel * plane + rows * row_stride  # (N, C, tallest): each row's start
    return windows.index_select(0, starts.view(-1)).view(len(images), channels, tallest, widest)


def pil_nearest_sources(length: int, resized: int, offset: int, size: int) -> list[int]:
    """The input pixel of output pixels offset..offset+size of a line of `length` pixels resized
    to `resized` by PIL's nearest filter, which steps through the input by the scale, adding it
    in double precision (ImagingScaleAffine): at the ties a closed form rounds otherwise (torch's
    nearest-exact picks another pixel for 1 column in 97 of a 500-pixel line resized to 97)."""
    import numpy as np

    scale = length / resized
    steps = np.full(offset + size, scale)
    steps[0] = scale * 0.5
    positions = np.cumsum(steps)  # sequential: the same additions, in the same order, as PIL
    return np.minimum(positions.astype(np.int64), length - 1)[offset:].tolist()


def filter_weights(
    lengths: list[int],
    size: int,
    extent: int,
    mode: str,
    device: Any,
    *,
    mirrored: Any = None,
    resized: list[int] | None = None,
    offsets: list[int] | None = None,
) -> Any:
    """(N, size, extent) float32: row i of matrix n holds the weights by which output pixel i of
    a line of `lengths[n]` input pixels, resized to `size`, sums those pixels (0 from
    `lengths[n]` on), as PIL's resample computes them (and torch's antialiased interpolate):
    the filter centred on input coordinate (i + 0.5) * scale, stretched by the scale when
    shrinking, its taps from trunc(centre - support + 0.5) up to trunc(centre + support + 0.5),
    normalised to sum 1. `nearest`: PIL's nearest pixel (`pil_nearest_sources`).
    `mirrored`: a (N,) bool tensor; the rows of those matrices in reverse order (a flip).
    `resized` and `offsets` (one each per line): the line is resized to `resized[n]` pixels
    and output pixels `offsets[n]` to `offsets[n] + size` are kept (a centre crop after the
    resize); by default `size` and 0."""
    import math

    import torch

    count = len(lengths)

    def per_line(values: list[int] | None, default: int, dtype: Any) -> Any:
        """(N, 1, 1) values, or the default as a number (no copy to the device for it)."""
        if values is None or all(value == default for value in values):
            return default
        return host_tensor(values, dtype, device).view(-1, 1, 1)

    if mode == "nearest":
        out_lengths = resized or [size] * count
        first_outputs = offsets or [0] * count
        sources = [
            pil_nearest_sources(length, out_length, first, size)
            for length, out_length, first in zip(lengths, out_lengths, first_outputs, strict=True)
        ]
        source = host_tensor(sources, torch.long, device)
        if mirrored is not None:
            source = torch.where(mirrored.view(-1, 1), source.flip(1), source)
        weights = torch.zeros((count, size, extent), dtype=torch.float32, device=device)
        return weights.scatter_(2, source.unsqueeze(-1), 1.0)
    # Only each output pixel's taps are computed, (N, size, taps), then placed in the matrix.
    out_lengths = resized or [size] * count
    widest_scale = max(length / out for length, out in zip(lengths, out_lengths, strict=True))
    taps = 2 * math.ceil(_SUPPORT[mode] * max(1.0, widest_scale)) + 1
    length = host_tensor(lengths, torch.float64, device).view(-1, 1, 1)
    scale = length / per_line(resized, size, torch.float64)
    stretch = scale.clamp(min=1.0)  # the filter widens only when shrinking
    support = _SUPPORT[mode] * stretch
    outputs = torch.arange(size, dtype=torch.float64, device=device).view(1, -1, 1)
    centre = scale * (outputs + per_line(offsets, 0, torch.float64) + 0.5)
    first = torch.trunc(centre - support + 0.5).clamp(min=0)
    end = torch.minimum(torch.trunc(centre + support + 0.5), length)
    inputs = first + torch.arange(taps, dtype=torch.float64, device=device)
    inside = inputs < end
    weights = torch.where(inside, _filter(mode, (inputs - centre + 0.5) * (1.0 / stretch)), 0.0)
    total = weights.sum(-1, keepdim=True)
    weights = torch.where(total != 0, weights / total, weights)
    # Taps past the line go to one spare column, cut off after: each kept index is unique.
    index = torch.where(inside, inputs, extent).to(torch.long)
    if mirrored is not None:  # flipped while small: (N, size, taps), not (N, size, extent)
        flip = mirrored.view(-1, 1, 1)
        weights = torch.where(flip, weights.flip(1), weights)
        index = torch.where(flip, index.flip(1), index)
    dense = torch.zeros((count, size, extent + 1), dtype=torch.float32, device=device)
    return dense.scatter_(2, index, weights.to(torch.float32))[:, :, :extent]


def _filter(mode: str, x: Any) -> Any:
    """PIL's filter at distance x (in input pixels, stretched): the triangle for bilinear, Keys'
    cubic with a = -0.5 for bicubic."""
    import torch

    x = x.abs()
    if mode == "bilinear":
        return (1.0 - x).clamp(min=0.0)
    a = -0.5
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return torch.where(x < 1.0, near, torch.where(x < 2.0, far, 0.0))
