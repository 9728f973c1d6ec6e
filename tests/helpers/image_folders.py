"""Tiny generated image folders (ROOT/<class>/<class>_<i>.png) and what PIL makes of 16-bit PNGs."""

from __future__ import annotations

from pathlib import Path


def write_image_folder(
    root: Path, counts: dict[str, int], *, size: int = 8, mode: str = "RGB", seed: int = 0
) -> Path:
    """ROOT/<class>/<class>_<i>.png with `counts[class]` random `size`x`size` images each."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    channels = {"L": (), "RGB": (3,), "RGBA": (4,)}[mode]
    for name, count in counts.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            pixels = rng.integers(0, 256, (size, size, *channels), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{name}_{index}.png")  # mode from the shape
    return root


def _sixteen_bit_gray_mode() -> str:
    """The mode PIL opens a 16-bit grayscale PNG in: "I" in Pillow 10, "I;16" from Pillow 11."""
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((2, 2), np.uint16)).save(buffer, format="PNG")
    buffer.seek(0)
    with Image.open(buffer) as image:
        return image.mode


SIXTEEN_BIT_GRAY = _sixteen_bit_gray_mode()


def make_class_files(root: Path, counts: dict[str, int]) -> Path:
    """ROOT/<class>/<class>_<i>.png with distinct bytes (split never decodes them)."""
    for name, count in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (root / name / f"{name}_{i:02d}.png").write_bytes(f"{name}/{i}".encode() * 7)
    return root
