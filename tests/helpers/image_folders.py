"""Tiny generated image folders (ROOT/<class>/<class>_<i>.png), what PIL makes of 16-bit PNGs,
and 16-bit colour TIFFs with an orientation (which neither PIL nor OpenCV writes)."""

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


def write_sixteen_bit_colour_tiff(path: Path, pixels, orientation: int = 1) -> None:
    """An uncompressed little-endian RGB TIFF of uint16 `pixels` (H, W, 3), one strip, with
    an Orientation tag (PIL cannot write 16-bit colour, OpenCV writes no orientation)."""
    import struct

    import numpy as np

    pixels = np.asarray(pixels)
    height, width, _ = pixels.shape
    data = pixels.astype("<u2").tobytes()
    count = 11
    bits_at = 8 + 2 + 12 * count + 4  # after the header and the one IFD
    short, long = 3, 4
    entries = [  # (tag, type, value or offset): one value each but BitsPerSample
        (256, long, width), (257, long, height), (258, short, bits_at), (259, short, 1),
        (262, short, 2), (273, long, bits_at + 6), (274, short, orientation),
        (277, short, 3), (278, long, height), (279, long, len(data)), (284, short, 1),
    ]  # fmt: skip
    ifd = b"".join(  # a SHORT value is left-justified in its four bytes; 258's is an offset
        struct.pack("<HHI", tag, kind, 3 if tag == 258 else 1)
        + struct.pack("<I" if kind == long or tag == 258 else "<H2x", value)
        for tag, kind, value in entries
    )
    path.write_bytes(
        b"II*\0" + struct.pack("<IH", 8, count) + ifd + struct.pack("<I3H", 0, 16, 16, 16) + data
    )


def make_class_files(root: Path, counts: dict[str, int]) -> Path:
    """ROOT/<class>/<class>_<i>.png with distinct bytes (split never decodes them)."""
    for name, count in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (root / name / f"{name}_{i:02d}.png").write_bytes(f"{name}/{i}".encode() * 7)
    return root
