"""Photo-like test images (smooth gradients and waves, a little grain) and folders of them as JPEGs:
what the decode tests on the CPU and the GPU compare paths on."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Smooth, structured RGB content (gradients and waves, a little grain), like a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for c in range(3):
        fx, fy = rng.uniform(2, 9, 2) * 2 * np.pi
        channels.append(
            128 + 60 * np.sin(fx * x / width + c) * np.cos(fy * y / height) + 40 * x / width
        )
    pixels = np.stack(channels, axis=-1) + rng.normal(0, 3, (height, width, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def jpeg_split_folder(root: Path, *, train: int, val: int, size: tuple[int, int]) -> None:
    """ROOT/{train,val}/{a,b}/i.jpg: that many photos of `size` per class, each its own."""
    seed = 0
    for split, count in (("train", train), ("val", val)):
        for label in ("a", "b"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                seed += 1
                Image.fromarray(photo(*size, seed)).save(folder / f"{i}.jpg", quality=85)


MAX_LEVELS, MEAN_LEVELS = 1.0, 0.25  # device (CPU) vs exact PIL path, 8-bit levels


def device_decode_cases(folder: Path) -> dict[str, Path]:
    """The files the device-decode tests (train's and inference's) compare with the exact path:
    photos of each shape and mode, a PNG named .jpg, an MPO, and broken files of each kind."""
    names = ("wide.jpg", "tall.jpg", "gray.jpg", "cmyk.jpg", "rgb.png", "png_named.jpg",
             "trailing.jpg", "truncated.jpg", "garbage.jpg", "magic.jpg", "corrupt.jpg",
             "big.jpg", "mpo.jpg")  # fmt: skip
    paths = {name: folder / name for name in names}
    Image.fromarray(photo(500, 375, 1)).save(paths["wide.jpg"], quality=90)
    Image.fromarray(photo(375, 500, 2)).save(paths["tall.jpg"], quality=90)
    Image.fromarray(photo(500, 375, 3)).convert("L").save(paths["gray.jpg"], quality=90)
    Image.fromarray(photo(300, 200, 4)).convert("CMYK").save(paths["cmyk.jpg"], quality=90)
    Image.fromarray(photo(120, 90, 5)).save(paths["rgb.png"])
    Image.fromarray(photo(120, 90, 6)).save(paths["png_named.jpg"], format="PNG")
    paths["trailing.jpg"].write_bytes(paths["wide.jpg"].read_bytes() + b"junk after the end")
    data = paths["tall.jpg"].read_bytes()
    paths["truncated.jpg"].write_bytes(data[: len(data) // 2])
    paths["garbage.jpg"].write_bytes(b"not an image at all")
    paths["magic.jpg"].write_bytes(b"\xff\xd8\xff" + bytes(100))
    # A camera's multi-picture JPEG (PIL says MPO): the first picture is the image.
    second = Image.fromarray(photo(300, 200, 10))
    Image.fromarray(photo(300, 200, 9)).save(
        paths["mpo.jpg"], format="MPO", save_all=True, append_images=[second], quality=90
    )
    big = Image.fromarray(photo(500, 375, 7)).resize((1000, 750), Image.BICUBIC)
    big.save(paths["big.jpg"], quality=90)
    # Whole (it ends with the end-of-image marker, so it reaches the decoder), but a run of 0xFF
    # bytes in its scan: libjpeg stops on it, in torchvision as in PIL (as in data/test_decode.py).
    buffer = io.BytesIO()
    huge = Image.fromarray(photo(500, 375, 0)).resize((2000, 1500), Image.BICUBIC)
    huge.save(buffer, format="JPEG", quality=90)
    corrupt = bytearray(buffer.getvalue())
    corrupt[len(corrupt) // 3 : len(corrupt) // 3 + 8] = b"\xff" * 8
    paths["corrupt.jpg"].write_bytes(bytes(corrupt))
    return paths


def level_differences(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.to(torch.float32) - b.to(torch.float32)).abs()
