"""The device path's two ways to crop and resize (core.crop_resize): the batched products give
the per-image F.interpolate's pixels, their weights are PIL's, and the batch stays in order
through chunks and flips."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode

from torchkit.core.data import crop_resize
from torchkit.core.data.crop_resize import filter_weights, resize_crops

MODES = ["bilinear", "bicubic", "nearest"]
PIL_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def _batch(count: int, seed: int, smallest: int = 5, largest: int = 90):
    """Random uint8 images of random sizes, a random crop box and flip for each."""
    rng = np.random.default_rng(seed)
    images, boxes, flips = [], [], []
    for _ in range(count):
        height, width = rng.integers(smallest, largest + 1, size=2)
        images.append(torch.from_numpy(rng.integers(0, 256, (3, height, width), dtype=np.uint8)))
        crop_height, crop_width = rng.integers(1, height + 1), rng.integers(1, width + 1)
        top = rng.integers(0, height - crop_height + 1)
        left = rng.integers(0, width - crop_width + 1)
        boxes.append((int(top), int(left), int(crop_height), int(crop_width)))
        flips.append(bool(rng.random() < 0.5))
    return images, boxes, flips


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", [7, 32])  # shrinking and enlarging most crops
def test_the_batched_products_give_the_per_image_pixels(mode, size):
    images, boxes, flips = _batch(24, seed=size)
    per_image = resize_crops(images, boxes, flips, size, mode, batched=False)
    batched = resize_crops(images, boxes, flips, size, mode, batched=True)
    assert batched.dtype == torch.uint8 and batched.shape == (24, 3, size, size)
    levels = (per_image.int() - batched.int()).abs()
    # Float sums in another order: a value at .5 may round the other way, nothing more.
    assert levels.max() <= 1 and (levels > 0).float().mean() < 1e-2
    if mode == "nearest":
        assert levels.max() == 0  # the same pixel picked, no arithmetic


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_the_weights_are_pils_own(mode):
    # PIL resizes a float ("F") image without rounding: resizing the identity matrix row by
    # row gives, in column j of each output row, the weight of input pixel j.
    for length, size in [(37, 9), (375, 64), (9, 37), (64, 64), (1, 5)]:
        identity = Image.fromarray(np.eye(length, dtype=np.float32), mode="F")
        resized = np.asarray(identity.resize((size, length), PIL_FILTERS[mode]))  # (L, S)
        ours = filter_weights([length], size, length + 3, mode, "cpu")[0]  # padded extent
        np.testing.assert_allclose(ours[:, :length].numpy(), resized.T, atol=2e-6)
        assert torch.all(ours[:, length:] == 0)


def test_nearest_picks_torchs_nearest_exact_pixel():
    for length, size in [(37, 9), (9, 37), (224, 224), (500, 224)]:
        line = torch.arange(length, dtype=torch.float32).view(1, 1, 1, -1)
        expected = torch.nn.functional.interpolate(line, size=(1, size), mode="nearest-exact")
        weights = filter_weights([length], size, length, "nearest", "cpu")[0]
        assert torch.equal(weights @ line.flatten(), expected.flatten())


def test_a_flip_is_the_mirrored_crop_and_chunks_keep_the_order(monkeypatch):
    images, boxes, _ = _batch(10, seed=3)
    plain = resize_crops(images, boxes, [False] * 10, 16, "bilinear", batched=True)
    flips = [at % 3 == 0 for at in range(10)]
    # Several chunks, largest crops first: the order must come back.
    largest = max(height * width for _, _, height, width in boxes)
    monkeypatch.setattr(crop_resize, "CHUNK_ELEMENTS", 3 * largest * 2)
    assert len(crop_resize._chunks(boxes, 3)) >= 3
    mirrored = resize_crops(images, boxes, flips, 16, "bilinear", batched=True)
    for at in range(10):
        expected = plain[at].flip(-1) if flips[at] else plain[at]
        assert torch.equal(mirrored[at], expected), at


class _CountKernels(TorchDispatchMode):
    """Counts the operators that compute something (views compute nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", MODES)
def test_the_batched_way_costs_the_same_operators_whatever_the_batch_size(mode):
    # What a GPU's host pays per batch: a fixed number of operators (the crops are gathered in
    # one, `gathered_crops`); image by image, several per image.
    def operators(count: int, batched: bool) -> int:
        images, boxes, flips = _batch(count, seed=count, largest=20)
        flips[0] = True
        with _CountKernels() as counter:
            resize_crops(images, boxes, flips, 8, mode, batched=batched)
        return counter.count

    per_image = operators(40, False) - operators(20, False)
    assert operators(40, True) == operators(20, True)
    assert per_image >= 40


def _zero_padded_crops(images, boxes, tallest, widest):
    """What gathered_crops replaced: each crop copied into a zeroed slot."""
    crops = torch.zeros((len(images), images[0].shape[0], tallest, widest), dtype=images[0].dtype)
    for at, (image, (top, left, height, width)) in enumerate(zip(images, boxes, strict=True)):
        crops[at, :, :height, :width].copy_(image[:, top : top + height, left : left + width])
    return crops


def test_gathered_crops_hold_each_crop_in_the_top_left_of_its_slot():
    generator = torch.Generator().manual_seed(7)
    shapes = [(30, 41), (17, 9), (44, 44), (12, 60)]  # sizes free
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator)
              for h, w in shapes]  # fmt: skip
    # whole images, a corner crop, and the last image's bottom-right pixels (the windows of
    # the buffer's last rows run past its end)
    boxes = [(0, 0, 30, 41), (16, 8, 1, 1), (3, 5, 20, 31), (5, 50, 7, 10)]
    tallest, widest = max(b[2] for b in boxes), max(b[3] for b in boxes)
    crops = crop_resize.gathered_crops(images, boxes, tallest, widest)
    assert crops.shape == (4, 3, tallest, widest) and crops.dtype == torch.uint8
    for at, (image, (top, left, height, width)) in enumerate(zip(images, boxes, strict=True)):
        expected = image[:, top : top + height, left : left + width]
        assert torch.equal(crops[at, :, :height, :width], expected), at


@pytest.mark.parametrize("mode", MODES)
def test_the_gathered_crops_resize_bit_for_bit_as_zero_padded_ones(mode, monkeypatch):
    # Past each crop the weights are exactly 0, so what the slot holds there changes nothing.
    images, boxes, flips = _batch(12, seed=11, largest=40)
    flips[1] = flips[4] = True
    views = [None] * 12
    views[2] = (20, 26, 2, 5)  # evaluation's resize then centre crop
    gathered = resize_crops(images, boxes, flips, 16, mode, views=views, batched=True)
    monkeypatch.setattr(crop_resize, "gathered_crops", _zero_padded_crops)
    padded = resize_crops(images, boxes, flips, 16, mode, views=views, batched=True)
    assert torch.equal(gathered, padded)


def test_a_device_the_batched_way_fails_on_resizes_image_by_image_and_says_so_once(
    monkeypatch, caplog
):
    calls = []

    def failing(*args):
        calls.append(1)
        raise RuntimeError("no kernel image is available for execution on the device\nmore")

    monkeypatch.setattr(crop_resize, "_PER_IMAGE", set())
    monkeypatch.setattr(crop_resize, "_resize_batched", failing)
    monkeypatch.setattr(
        crop_resize, "batched_by_default", lambda device: not crop_resize._PER_IMAGE
    )
    images, boxes, flips = _batch(6, seed=5)
    expected = resize_crops(images, boxes, flips, 16, "bicubic", batched=False)
    with caplog.at_level("WARNING", logger="torchkit"):
        for _ in range(3):
            assert torch.equal(resize_crops(images, boxes, flips, 16, "bicubic"), expected)
    assert len(calls) == 1  # tried once
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "resizing the batch at once failed on cpu (no kernel image is available for execution "
        "on the device): resizing image by image"
    ]


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
    ],
    ids=["out-of-memory", "cublas-alloc", "sticky-cuda-error"],
)
def test_the_devices_own_errors_in_the_batched_way_are_the_runs_errors(monkeypatch, error):
    # Not a reason to resize image by image: they would fail that way too, or later.
    def out_of_memory(*args):
        raise error

    monkeypatch.setattr(crop_resize, "_PER_IMAGE", set())
    monkeypatch.setattr(crop_resize, "_resize_batched", out_of_memory)
    monkeypatch.setattr(crop_resize, "batched_by_default", lambda device: True)
    images, boxes, flips = _batch(2, seed=6)
    with pytest.raises(type(error)):
        resize_crops(images, boxes, flips, 16, "bilinear")
    assert not crop_resize._PER_IMAGE


def test_the_cpu_resizes_image_by_image_unless_told():
    assert not crop_resize.batched_by_default(torch.device("cpu"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", MODES)
def test_on_the_gpu_the_batched_way_gives_the_per_image_pixels(mode):
    # Real sizes (photos of 375x500 in both orientations, crops to 224) on the GPU, where the
    # batched way is the default, against the per-image way on the same GPU and on the CPU.
    images, boxes, flips = _batch(64, seed=7, smallest=300, largest=500)
    gpu = [image.cuda() for image in images]
    assert crop_resize.batched_by_default(gpu[0].device)
    batched = resize_crops(gpu, boxes, flips, 224, mode)
    per_image = resize_crops(gpu, boxes, flips, 224, mode, batched=False)
    cpu = resize_crops(images, boxes, flips, 224, mode)
    # On the H200 (2026-11-27) a few pixels were 2 levels off (bilinear and bicubic): the
    # first pass rounds to 8 bits, so a tie rounded the other way there moves every output
    # pixel its taps reach.
    for other in (per_image, cpu):
        levels = (batched.cpu().int() - other.cpu().int()).abs()
        assert levels.max() <= 2 and (levels > 0).float().mean() < 1e-2
    assert batched.device.type == "cuda" and batched.shape == (64, 3, 224, 224)
