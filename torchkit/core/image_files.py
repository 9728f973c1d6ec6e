"""Reading image files the same way in every loader (train, eval, extract-features, dataset-stats).

- Only regular files are opened. A path that names a FIFO, a device, a socket or a folder, or a
  symbolic link that points nowhere, is refused with `NotARegularFile` (an OSError, so loaders
  count it as unreadable like any other): opening a FIFO for reading blocks until something
  writes to it, possibly forever. The check is race-free: the file is opened without blocking
  and `fstat`-ed before a byte is read.
- Images with more than 8 bits per sample (16-bit grayscale PNG/TIFF, PIL modes `I;16*`, and
  32-bit integer `I`) are scaled to 8 bits, `round(v / 257)` (65535 -> 255), before any mode
  conversion. PIL's own `convert()` clips them instead, so a 16-bit PNG becomes almost pure
  white. `dataset-stats --mode rgb|gray` measures exactly these 8-bit pixels, so its mean/std are
  those of what the model is fed. Float images (`F`) keep PIL's conversion.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
from collections.abc import Iterator
from typing import Any, BinaryIO

SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})
# Integer modes with more than 8 bits per sample: scaled by `to_8bit`.
HIGH_BIT_DEPTH_MODES = SIXTEEN_BIT_MODES | {"I"}


class NotARegularFile(OSError):
    """An image path that names something other than a regular file."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a special file"


def open_regular_file(path: str | os.PathLike) -> BinaryIO:
    """`open(path, "rb")` for regular files only (following symbolic links); anything else
    raises `NotARegularFile` without blocking."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if os.path.islink(path):
            raise NotARegularFile("not a regular file (a symbolic link to nothing)") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(f"not a regular file ({_kind(info.st_mode)})")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def uint16_to_uint8(array: Any) -> Any:
    """16-bit samples (a NumPy array) as 8-bit ones: the one 16 -> 8 bit conversion."""
    import numpy as np

    # 65535 / 257 == 255 exactly: the 8-bit value whose 16-bit expansion is closest.
    return np.rint(array / 257.0).astype(np.uint8)


def to_8bit(image: Any) -> Any:
    """`image` (PIL) with 8 bits per sample: `I;16*` scaled, `I` clipped to 0..65535 and
    scaled, as an `L` image; any other mode is returned as it is."""
    if image.mode not in HIGH_BIT_DEPTH_MODES:
        return image
    import numpy as np
    from PIL import Image

    values = np.asarray(image)
    if image.mode == "I":
        values = np.clip(values, 0, 65535)
    return Image.fromarray(uint16_to_uint8(values))


@contextlib.contextmanager
def opened_image(path: str | os.PathLike, *, in_memory: bool = False) -> Iterator[Any]:
    """The image file at `path` opened by PIL, its header read and its pixels not yet decoded
    (so a JPEG can still be `draft`-ed to a reduced size), closed on leaving the block: whatever
    is kept must be a loaded copy. Regular files only; raises as `load_image` does.
    `in_memory`: the file is read whole first, in one call (PIL reads a JPEG's header in dozens
    of small reads)."""
    from PIL import Image, UnidentifiedImageError

    with open_regular_file(path) as handle:
        source = io.BytesIO(handle.read()) if in_memory else handle
        try:
            image = Image.open(source)
        except UnidentifiedImageError:
            # PIL names the file object (`<_io.BufferedReader name=13>`): name the path, as
            # Image.open(path) does, so messages and reports do not change from run to run.
            raise UnidentifiedImageError(
                f"cannot identify image file {os.fspath(path)!r}"
            ) from None
        with image:
            yield image


def load_image(path: str | os.PathLike, mode: str) -> Any:
    """The image file at `path` as a PIL image in `mode` (e.g. RGB), read as described above.
    Raises OSError (NotARegularFile included), ValueError or PIL's errors for unreadable files."""
    with opened_image(path) as image:
        # convert() always returns a loaded copy: nothing refers to the file afterwards.
        return to_8bit(image).convert(mode)
