"""Train and evaluation datasets over in-memory uint8 images (the built-in digits), in torch.

The image-file path turns every item into a PIL image and runs torchvision's transforms on it:
about 0.5 ms an image, more than the convnet's whole training step on an 8x8 digit. Here the
same recipe runs on tensors, a batch at a time: RandomResizedCrop's boxes are drawn as
torchvision draws them (area, log-uniform aspect, 10 tries, centre-crop fallback) but from a
counter-based generator keyed by each image's seed, vectorised over the batch (torch's
generator, called a dozen times per image, cost as much as the convnet's step); the crop is
resized bilinearly with half-pixel centres and rounded to 8 bits as PIL does, then flipped and
normalised. Evaluation images do not change between epochs, so they are transformed once.
Nothing here imports torchvision (2 s of start-up).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from torchkit.core.data.batches import Batch
from torchkit.core.data.decode import CROP_RATIO
from torchkit.core.data.in_memory import eval_pixels
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources.samples import Samples
from torchkit.core.runtime.seeding import SPLITMIX_INCREMENT, splitmix_output


def supports(
    samples: Samples,
    *,
    augment: str = "basic",
    random_erasing: float = 0.0,
    interpolation: str = "bilinear",
) -> bool:
    """In-memory images under the training policies implemented here (others take the PIL
    path): crops resized bilinearly, no policy beyond crop and flip."""
    return (
        samples.images is not None
        and augment in ("basic", "none")
        and random_erasing == 0
        and interpolation == "bilinear"
    )


# A training epoch of at most this many bytes of transformed images is transformed at once
# (the transform's peak is about twice that: the flipped images are copied once).
WHOLE_EPOCH_BYTES = 64 * 2**20

# Uniforms drawn per image: (area, aspect, top, left) for each of 10 crop tries, then the flip.
CROP_TRIES = 10
_DRAWS = 4 * CROP_TRIES + 1


def uniforms(seeds: Any, count: int) -> np.ndarray:
    """(len(seeds), count) floats in [0, 1): draw k of seed s is splitmix64(s + k * golden),
    a counter-based generator, so a whole batch is drawn in a few array operations and each
    image's draws depend on its seed alone."""
    with np.errstate(over="ignore"):  # uint64 arithmetic is meant to wrap
        keys = np.asarray(seeds, dtype=np.uint64)[:, None] + (
            np.arange(1, count + 1, dtype=np.uint64) * np.uint64(SPLITMIX_INCREMENT)
        )
    z = splitmix_output(keys)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def crop_boxes(
    draws: np.ndarray,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float] = CROP_RATIO,
) -> np.ndarray:
    """(N, 4) int (top, left, h, w) boxes by RandomResizedCrop's recipe from `draws` (N, 40
    uniforms): an area in `scale` of the image and a log-uniform aspect in `ratio`, the first
    of 10 tries that fits, then the centre crop clamped to `ratio` if none does."""
    tries = draws[:, : 4 * CROP_TRIES].reshape(len(draws), CROP_TRIES, 4)
    area = height * width * (scale[0] + (scale[1] - scale[0]) * tries[..., 0])
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_low + (log_high - log_low) * tries[..., 1])
    w = np.round(np.sqrt(area * aspect)).astype(np.int64)
    h = np.round(np.sqrt(area / aspect)).astype(np.int64)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.argmax(axis=1)
    rows = np.arange(len(draws))
    h, w, chosen = h[rows, first], w[rows, first], tries[rows, first]
    top = np.floor(chosen[:, 2] * (height - h + 1)).astype(np.int64)
    left = np.floor(chosen[:, 3] * (width - w + 1)).astype(np.int64)
    boxes = np.stack([top, left, h, w], axis=1)
    boxes[~fits.any(axis=1)] = _centre_box(height, width, ratio)
    return boxes


def _centre_box(height: int, width: int, ratio: tuple[float, float]) -> tuple[int, ...]:
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


class MemoryImages:
    """A map-style dataset of (tensor, label, index, "") items, like `core.dataset.make_dataset`'s,
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

        interpolation = preprocess.interpolation if train else "bilinear"  # eval: any (PIL)
        if not supports(samples, augment=augment, interpolation=interpolation):
            raise ValueError(
                "MemoryImages takes in-memory images, basic/none augmentation, and bilinear "
                "resizing for training"
            )
        self.images = samples.images
        pixels = torch.from_numpy(samples.images)
        if pixels.ndim == 3:
            pixels = pixels.unsqueeze(-1)
        pixels = pixels.permute(0, 3, 1, 2)  # N,C,H,W
        channels = preprocess.in_channels
        if pixels.shape[1] == 1 and channels == 3:
            pixels = pixels.expand(-1, 3, -1, -1)  # what PIL's convert("RGB") does to gray
        self.pixels = pixels.float()
        self.labels = list(samples.labels)
        self._label_tensor = None  # the labels as one tensor, made at the first `batch_of`
        self.preprocess = preprocess
        self.random_crop = train and augment == "basic"
        self.flip = train and augment == "basic" and flip
        self.crop_scale = tuple(crop_scale)
        self.mean = torch.tensor(preprocess.mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(preprocess.std, dtype=torch.float32).view(-1, 1, 1)
        # Evaluation (and augment=none) transforms are deterministic: computed once, here.
        self._matrices: dict[int, Any] = {}  # resize matrices by axis (`_matrix_table`)
        self._fixed = None if self.random_crop else self._normalise(self._fixed_transform())

    def __len__(self) -> int:
        return len(self.labels)

    def _normalise(self, pixels: Any) -> Any:
        return (pixels / 255.0 - self.mean) / self.std

    def _fixed_transform(self) -> Any:
        preprocess = self.preprocess
        # Gray images stay gray (expanded below) unless a border is padded in the mean colour.
        border = preprocess.crop_mode == "border" and preprocess.in_channels == 3
        pixels = eval_pixels(
            self.images,
            preprocess.resize_size,
            preprocess.image_size,
            preprocess.interpolation,
            "RGB" if border else None,
            crop_mode=preprocess.crop_mode,
            mean=preprocess.mean,
        ).float()
        return pixels.expand(-1, self.pixels.shape[1], -1, -1)  # gray to RGB, as PIL does

    def draw(self, seeds: list[int]) -> list[tuple[int, int, int, int, bool]]:
        """The random part of the transform of the images with these seeds (one each):
        (top, left, h, w, flipped), RandomResizedCrop then RandomHorizontalFlip."""
        boxes, flips = self.draw_arrays(seeds)
        return [(*box, bool(flipped)) for box, flipped in zip(boxes.tolist(), flips, strict=True)]

    def draw_arrays(self, seeds: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """`draw` as arrays: (N, 4) boxes (top, left, h, w) and (N,) flips."""
        height, width = self.pixels.shape[-2:]
        draws = uniforms(seeds, _DRAWS)
        boxes = crop_boxes(draws, height, width, self.crop_scale)
        return boxes, (draws[:, -1] < 0.5) & self.flip

    def _matrix_table(self, axis: int) -> Any:
        """table[start, span]: the resize matrix of pixels start..start+span of the axis (every
        box a crop can have), so a batch's matrices are one indexing operation."""
        table = self._matrices.get(axis)
        if table is None:
            import torch

            length, size = self.pixels.shape[-2 + axis], self.preprocess.image_size
            table = torch.zeros(length, length + 1, size, length)
            for start in range(length):
                for span in range(1, length - start + 1):
                    table[start, span] = axis_matrix(length, start, span, size)
            self._matrices[axis] = table
        return table

    def render(self, indices: list[int] | slice, draws: tuple[np.ndarray, np.ndarray]) -> Any:
        """The batch of items `indices` under `draws` (`draw_arrays`' boxes and flips): crops
        resized by two matrix products."""
        import torch

        boxes, flips = draws
        boxes = torch.from_numpy(boxes)
        rows = self._matrix_table(0)[boxes[:, 0], boxes[:, 2]]
        cols = self._matrix_table(1)[boxes[:, 1], boxes[:, 3]]
        images = rows.unsqueeze(1) @ self.pixels[indices] @ cols.transpose(1, 2).unsqueeze(1)
        images = images.round_().clamp_(0, 255)
        if flips.any():
            flipped = torch.from_numpy(np.flatnonzero(flips))
            images[flipped] = images[flipped].flip(-1)
        # In place (the same operations as `_normalise`): a whole epoch's images are not copied
        # three more times.
        return images.div_(255.0).sub_(self.mean).div_(self.std)

    @property
    def renders_whole_epochs(self) -> bool:
        """Whether a training epoch's images are small enough to be transformed all at once
        (`render_all`), at the epoch's first batch: one set of array operations an epoch, not
        one a batch (the digits job: about 1 ms of host time a step, as much as its GPU step)."""
        size = self.preprocess.image_size
        return self._fixed is None and len(self) * self.pixels.shape[1] * size * size * 4 <= (
            WHOLE_EPOCH_BYTES
        )

    def render_all(self, draws: tuple[np.ndarray, np.ndarray]) -> Any:
        """Every item under `draws` (one per item, in order): `render` of them all. In the
        main process only (`SeededDataset`): each loader worker would transform all of them."""
        return self.render(slice(None), draws)

    def items(self, indices: list[int], draws: list | None = None) -> list[tuple]:
        """Dataset items for `indices`; `draws` (one per index) for the random transform."""
        if self._fixed is not None:
            return self.items_of(self._fixed[indices], indices)
        if draws is None:  # not under SeededDataset: seeds from torch's generator
            import torch

            draws = self.draw_arrays(torch.randint(0, 2**62, (len(indices),)).tolist())
        return self.items_of(self.render(indices, draws), indices)

    def items_of(self, batch: Any, indices: list[int]) -> list[tuple]:
        """Items (image, label, index, "") of the images `batch` of items `indices`."""
        return [(image, self.labels[i], i, "") for image, i in zip(batch, indices, strict=True)]

    def batch_of(self, images: Any, indices: list[int]) -> Batch:
        """The collated batch of items `indices` of `images` (every item's image, in order):
        what `collate_skipping_unreadable` makes of their `items_of`, the same tensors, taken
        in one indexing operation each."""
        import torch

        if self._label_tensor is None:
            self._label_tensor = torch.tensor(self.labels, dtype=torch.long)
        rows = torch.tensor(indices, dtype=torch.long)
        return Batch(images[rows], self._label_tensor[rows], rows, [])

    def __getitem__(self, index: int):
        return self.items([index])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple]:
        """A batch in one call (the DataLoader uses this when it exists)."""
        return self.items(indices)
