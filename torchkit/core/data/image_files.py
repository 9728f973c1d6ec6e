"""Image files into pixels: the one place every command opens and decodes an image file (train,
eval, predict, extract-features, dataset-stats, split's near-duplicate hashing, the reduced and
device decodes of training, `convert tensor`, video-info's check for stills).

- Only regular files are opened. A path that names a FIFO, a device, a socket or a folder, or a
  symbolic link that points nowhere, is refused with `NotARegularFile` (an OSError, so loaders
  count it as unreadable like any other): opening a FIFO for reading blocks until something
  writes to it, possibly forever. The check is race-free: the file is opened without blocking
  and `fstat`-ed before a byte is read.
- Images with more than 8 bits per sample (16-bit grayscale PNG/TIFF, PIL modes `I;16*`, and
  32-bit integer `I` whose samples all lie in 0..65535, taken as 16-bit data) are scaled to 8
  bits, `round(v / 257)` (65535 -> 255), before any mode conversion. PIL's own `convert()` clips
  them instead, so a 16-bit PNG becomes almost pure white. An `I` image with a sample outside
  0..65535, and any 32-bit float image (`F`), is refused (`UnsupportedSamples`, one of the
  unreadable errors): no fixed scale reads them right (PIL clips `I` to 0..255 and truncates
  `F`, so a float image of 0..1 turns black), and a scale of each file's own range would give
  the same pixels for different values. 16-bit RGB(A) PNGs and TIFFs and RGB PPMs of maxval
  over 255, which PIL reads as 8 bits itself, are decoded by OpenCV at full depth
  (`sixteen_bit_colour`) and scaled the same way.
  `dataset-stats --mode rgb|gray` measures exactly these 8-bit pixels, so its mean/std are
  those of what the model is fed (`--mode native` measures 32-bit images in their own values).
- Palette images are expanded to RGB, or to RGBA where the palette has a transparent entry, and
  bilevel images to L, wherever a file's own channels are kept (`expanded_mode`).
- EXIF orientation, one rule. Every command that feeds a model or measures pixels (train, eval,
  predict, extract-features, dataset-stats, split's near-duplicate hashing, the device decode)
  reads the pixels torchvision's ImageFolder and timm's loaders give (PIL's
  `Image.open(path).convert("RGB")`), so a checkpoint sees at eval and predict the pixels it was
  trained on, whichever tool trained it: a JPEG's, PNG's or WebP's as stored, the EXIF
  Orientation tag ignored; a TIFF's turned by its Orientation tag, which Pillow's TIFF loader
  applies as it loads the pixels (Pillow 10 as 13), and OpenCV's TIFF decoder too (4.11 as 5.0),
  so a 16-bit colour TIFF comes turned as an 8-bit one does: one rule whatever the bit depth
  (`orientation_on_load` says which turn a decoder made). `convert tensor` turns the pixels as
  the tag says unless `--no-exif` (a TIFF's turn then undone), because what it makes is the
  picture as viewed. Both ask `exif_orientation(image, exif=...)`, which has no default: every
  caller says which pixels it wants.
- Unreadable images raise one family of errors, `unreadable_image_errors()`, from whichever
  entry point reads them; every command words why with `unreadable_reason`, and --strict's
  error with `strict_unreadable_error`. Whatever else PIL's code raises
  for a file opened by `opened_image` (a damaged TIFF's TypeError) is `DamagedImage`, one of
  them: one bad file is skipped (or fatal with --strict), never the end of a run.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Iterator
from typing import Any, BinaryIO

from torchkit.core.io import records
from torchkit.core.io.errors import InputError, first_line
from torchkit.core.io.records import NotARegularFile
from torchkit.core.runtime.fork_safe import ForkSafeLock

SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})
# Integer modes with more than 8 bits per sample: scaled by `to_8bit`.
HIGH_BIT_DEPTH_MODES = SIXTEEN_BIT_MODES | {"I"}
EXIF_ORIENTATION_TAG = 0x0112
_ORIENTATIONS = frozenset(range(1, 9))


class DamagedImage(OSError):
    """A file PIL fails to decode with an error other than its usual ones (a damaged TIFF's
    TypeError, a struct.error or IndexError of a damaged header): unreadable like any other."""


class UnsupportedSamples(ValueError):
    """A readable 32-bit image whose samples the loaders cannot scale to 8 bits: `I` outside
    0..65535, or `F` (`refuse_unscalable_samples`)."""


def open_regular_file(path: str | os.PathLike) -> BinaryIO:
    """`open(path, "rb")` for regular files only (following symbolic links); anything else
    raises `NotARegularFile` without blocking. An image stored in a container (a
    `core.stored_image.StoredImage`: a tar shard's member, a parquet row) opens as its bytes."""
    from torchkit.core.data.stored_image import StoredImage

    if isinstance(path, StoredImage):
        return path.open()
    return records.open_regular_file(path)  # as the records torchkit wrote are opened


def read_regular_file(path: str | os.PathLike) -> bytes:
    """The whole contents of the regular file at `path` (`open_regular_file`'s refusals)."""
    with open_regular_file(path) as handle:
        return handle.read()


def unreadable_image_errors() -> tuple[type[BaseException], ...]:
    """What opening or decoding an unreadable image raises, from any function here: OSError
    (NotARegularFile and PIL's UnidentifiedImageError included; a truncated file), and the
    ValueError, SyntaxError, EOFError and DecompressionBombError of PIL's decoders."""
    from PIL import Image

    return (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


# Unreadable images a command names in a warning each (train, convert shards, extract-features);
# the rest are counted, not named: thousands of broken files would bury every other line.
UNREADABLE_WARNINGS = 10


# What `opened_image` adds to PIL's "cannot identify image file" for a file of no bytes.
_EMPTY_FILE = " (an empty file)"


def unreadable_reason(error: BaseException, size: int | None = None) -> str:
    """Why an image could not be read, in the same words in every command (the REASON of
    "PATH: REASON" in warnings, --strict's error and the reports' error columns): "empty file",
    "not an image PIL can read", "permission denied", "file not found", "not a regular file
    (a folder)", an I/O error's own words, "truncated file", else the first line of the
    decoder's message ("broken data stream when reading image file"; after "TypeName: " for
    an error outside `unreadable_image_errors()`). Never the path: the message it goes into
    names the file as the user reaches it. `size`: the bytes read, where the caller read them
    (0: an empty file, whatever the error)."""
    from PIL import UnidentifiedImageError

    unidentified = isinstance(error, UnidentifiedImageError)
    if size == 0 or (unidentified and str(error).endswith(_EMPTY_FILE)):
        return "empty file"
    if unidentified:
        return "not an image PIL can read"
    if isinstance(error, NotARegularFile):
        return str(error)
    if isinstance(error, FileNotFoundError):
        return "file not found"
    if isinstance(error, PermissionError):
        return "permission denied"
    if isinstance(error, OSError) and error.errno is not None and error.strerror:
        return error.strerror[:1].lower() + error.strerror[1:]  # "input/output error"
    if isinstance(error, OSError) and "truncated" in str(error).lower():
        # PIL's words for a cut file depend on where its decoder ran out ("image file is
        # truncated (151 bytes not processed)", "Truncated File Read"): one reason for one fault
        return "truncated file"
    # An error outside the family (a fault of the code that measured the pixels) says its type
    return first_line(error, with_type=not isinstance(error, unreadable_image_errors()))


def strict_unreadable_error(described: str, *, turn_off: str = "leave out --strict") -> InputError:
    """--strict's error for an unreadable image, in the same words in every command.
    `described`: "PATH: REASON", PATH the image as `image_path` names it. `turn_off`: how the
    command is told to skip unreadable images instead (train's "pass --no-strict": a recipe or
    a resumed run may be the one that set --strict)."""
    return InputError(
        f"unreadable image {described}",
        f"fix or remove it, or {turn_off} to skip unreadable images",
    )


def image_path(samples: Any, index: int) -> str:
    """Sample `index` of `samples` as messages about it name it: its file's path as reached from
    the working folder (the data folder as given, then the file's place in it), which the user
    can open or remove as it is; a shard's member or a parquet row by its id (no file of its
    own); in-memory data by its index. The `path: reason` of an unreadable item
    (`core.data.dataset.make_dataset`) names it so."""
    if samples.paths:
        return str(samples.paths[index])
    return samples.ids[index] if samples.ids else str(index)


_pil_warnings_quiet = False


def _quiet_pil_warnings() -> None:
    """PIL's warnings about a file it reads anyway (palette transparency, sizes past its bomb
    warning, odd EXIF or TIFF tags) off, once per process: raw `warnings.warn` lines, printed
    once by every loader worker, in the middle of the progress bar and the house's own lines.
    The file is still read, or counted unreadable, as before."""
    global _pil_warnings_quiet
    if not _pil_warnings_quiet:
        from PIL import Image

        warnings.filterwarnings("ignore", module=r"PIL(\.|$)")
        # whichever frame PIL names as the warning's origin
        warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
        _pil_warnings_quiet = True


@contextlib.contextmanager
def opened_image(
    source: str | os.PathLike | bytes, *, name: str | None = None, in_memory: bool = False
) -> Iterator[Any]:
    """The image file at `source` (a path, or a file's bytes) opened by PIL, its header read and
    its pixels not yet decoded (so a JPEG can still be `draft`-ed to a reduced size), for the
    block: whatever is kept must be loaded. Regular files only. A file PIL cannot identify
    raises UnidentifiedImageError naming `name`, else the path (bytes without a name: PIL's
    message). `in_memory`: a path is read whole first, in one call (PIL reads a JPEG's header
    in dozens of small reads)."""
    from PIL import Image, UnidentifiedImageError

    _quiet_pil_warnings()
    with contextlib.ExitStack() as stack:
        if isinstance(source, bytes):
            stream: Any = io.BytesIO(source)
        else:
            name = name or os.fspath(source)
            handle = stack.enter_context(open_regular_file(source))
            stream = io.BytesIO(handle.read()) if in_memory else handle
        try:
            try:
                image = Image.open(stream)
            except UnidentifiedImageError:
                if name is None:
                    raise
                # PIL names the file object (`<_io.BufferedReader name=13>`): name the path, as
                # Image.open(path) does, so messages and reports do not change from run to run.
                # An empty file (an interrupted download) is said to be one, as dataset-stats
                # says: PIL's words alone read as a format it does not know.
                empty = _EMPTY_FILE if _is_empty(stream) else ""
                message = f"cannot identify image file {name!r}{empty}"
                raise UnidentifiedImageError(message) from None
            with image:
                yield image
        except (MemoryError, *unreadable_image_errors()):
            raise  # out of memory is no fault of the file
        except Exception as error:
            if not _raised_by_pil(error):
                raise
            raise DamagedImage(f"damaged image data ({type(error).__name__}: {error})") from error


def _is_empty(stream: Any) -> bool:
    """Whether the file (or bytes) `stream` reads holds no byte at all."""
    try:
        return stream.seek(0, io.SEEK_END) == 0
    except (OSError, ValueError):
        return False


def _raised_by_pil(error: BaseException) -> bool:
    """Whether PIL's own code raised `error` (its last Python frame is in PIL): a decoder's
    answer to a damaged file, not a fault of the code around it."""
    traceback = error.__traceback__
    if traceback is None:
        return False
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    module = traceback.tb_frame.f_globals.get("__name__", "")
    return module == "PIL" or module.startswith("PIL.")


def uint16_to_uint8(array: Any) -> Any:
    """16-bit samples (a NumPy array) as 8-bit ones: the one 16 -> 8 bit conversion."""
    import numpy as np

    # 65535 / 257 == 255 exactly: the 8-bit value whose 16-bit expansion is closest.
    return np.rint(array / 257.0).astype(np.uint8)


def declares_16_bit_samples(image: Any) -> bool:
    """Whether an opened image's file declares unsigned samples of at most 16 bits: a 16-bit
    mode (`I;16*`); of an `I` image, a PNG (at most 16 bits a sample) or PGM/PPM (maxval at most
    65535), which some Pillow versions open as `I`, or a TIFF whose BitsPerSample (tag 258) is
    at most 16 and whose SampleFormat (tag 339) is unsigned. Any other `I` image (a 32-bit or
    signed TIFF) is 32-bit, whatever its values: they never decide its depth."""
    if image.mode in SIXTEEN_BIT_MODES:
        return True
    if image.mode != "I":
        return False
    if image.format in ("PNG", "PPM"):
        return True
    if image.format != "TIFF":
        return False

    def per_sample(tag: int) -> tuple:  # one value a sample; 1 (8 bits, unsigned) when absent
        value = image.tag_v2.get(tag, 1)
        return value if isinstance(value, tuple) else (value,)

    return all(bits <= 16 for bits in per_sample(258)) and set(per_sample(339)) == {1}


def is_sixteen_bit_colour(image: Any) -> bool:
    """Whether an opened, not yet loaded image is an RGB or RGBA PNG or TIFF with 16 bits per
    sample, which PIL decodes to 8 bits, keeping each sample's high byte, or an RGB PPM whose
    maxval is over 255, which PIL decodes to 8 bits, scaled. Only its tile says so: once the
    image is loaded (a PNG's `getexif()` loads it) this is False."""
    if image.format == "PPM":
        return image.mode == "RGB" and _ppm_maxval(image) > 255
    if image.mode not in ("RGB", "RGBA") or image.format not in ("PNG", "TIFF"):
        return False
    if not image.tile:
        return False
    # Index 3, not `.args`: Pillow before 11 gives plain tuples (decoder, extents, offset,
    # args), later ones a named tuple. A PNG's args are the raw mode, a TIFF's a tuple.
    args = image.tile[0][3]
    rawmode = args[0] if isinstance(args, tuple) else args
    return ";16" in str(rawmode or "")


def _ppm_maxval(image: Any) -> int:
    """The maxval of an opened, not yet loaded PPM/PGM: its tile's (rawmode, maxval) args
    when PIL scales its samples (any maxval but 255), else 255 (the raw 8-bit decoder)."""
    if not image.tile:
        return 255
    args = image.tile[0][3]
    if isinstance(args, tuple) and len(args) == 2 and isinstance(args[1], int):
        return args[1]
    return 255


def sixteen_bit_colour(image: Any) -> Any | None:
    """The full-depth pixels of an opened, not yet loaded 16-bit RGB(A) PNG or TIFF, or RGB PPM
    (`is_sixteen_bit_colour`): a uint16 (H, W, C) array in RGB(A) order, decoded by OpenCV
    from the image's own stream (left where it was); None for any other image. A TIFF's come
    turned by its Orientation tag, as PIL loads an 8-bit one (`orientation_on_load`). A PPM's
    samples are scaled from its maxval to 0..65535 as PIL scales a 16-bit PGM's, round(v /
    maxval * 65535), samples over maxval taken as maxval. Raises OSError when OpenCV cannot
    decode it."""
    if not is_sixteen_bit_colour(image):
        return None
    import cv2
    import numpy as np

    stream = image.fp
    position = stream.tell()
    stream.seek(0)
    data = stream.read()
    stream.seek(position)
    # libtiff reports an Orientation tag outside 1..8 through OpenCV's log on stderr ("Bad
    # value 9 for "Orientation" tag") and reads the pixels as stored, as PIL does: that read
    # alone is kept quiet. A file OpenCV cannot decode is still refused below.
    tag = image.tag_v2.get(EXIF_ORIENTATION_TAG, 1) if image.format == "TIFF" else 1
    quiet = tag not in _ORIENTATIONS
    with _opencv_log_silenced() if quiet else contextlib.nullcontext():
        array = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
    bands = len(image.getbands())
    if (
        array is None
        or array.dtype != np.uint16
        or array.ndim != 3
        or array.shape[1::-1] != size_as_read(image)
        or array.shape[-1] < bands
    ):
        raise OSError("OpenCV cannot decode this 16-bit image")
    array = np.ascontiguousarray(array[..., [2, 1, 0, 3][:bands]])  # BGR(A) -> RGB(A)
    if image.format == "PPM":  # OpenCV gives a PPM's samples as stored, 0..maxval
        maxval = _ppm_maxval(image)
        array = np.minimum(array, maxval)
        if maxval != 65535:
            array = np.rint(array / maxval * 65535).astype(np.uint16)
    return array


_opencv_log_lock = ForkSafeLock()


@contextlib.contextmanager
def _opencv_log_silenced() -> Iterator[None]:
    """OpenCV's log (where libtiff's messages go) silenced, and its level put back after. One
    at a time: two threads each putting back the level the other had set would leave it off."""
    import cv2

    # OpenCV 5 moved getLogLevel/setLogLevel to cv2.utils.logging; 4.x has them on cv2.
    logging = getattr(getattr(cv2, "utils", None), "logging", cv2)
    with _opencv_log_lock:
        level = logging.getLogLevel()
        logging.setLogLevel(0)  # LOG_LEVEL_SILENT in both
        try:
            yield
        finally:
            logging.setLogLevel(level)


def size_as_read(image: Any) -> tuple[int, int]:
    """(width, height) of an opened, not yet loaded image's pixels as its decoder gives them:
    a TIFF's stored size turned by `orientation_on_load` (Pillow 13 gives that size before
    loading, Pillow 10 the stored one: a turned 16-bit TIFF of 5..8 was refused as
    undecodable there), any other image's size."""
    if image.format != "TIFF":
        return image.size
    stored = (image.tag_v2.get(256, image.width), image.tag_v2.get(257, image.height))
    return stored[::-1] if orientation_on_load(image) >= 5 else stored


def to_8bit(image: Any) -> Any:
    """`image` (PIL) with 8 bits per sample: `I;16*` scaled, `I` clipped to 0..65535 and
    scaled, as an `L` image; a 16-bit RGB(A) PNG or TIFF not yet loaded read at full depth
    and scaled (`sixteen_bit_colour`); any other image is returned as it is."""
    import numpy as np
    from PIL import Image

    colour = sixteen_bit_colour(image)
    if colour is not None:
        return Image.fromarray(uint16_to_uint8(colour))
    if image.mode not in HIGH_BIT_DEPTH_MODES:
        return image
    values = np.asarray(image)
    if image.mode == "I":
        values = np.clip(values, 0, 65535)
    return Image.fromarray(uint16_to_uint8(values))


def refuse_unscalable_samples(image: Any) -> None:
    """Raise `UnsupportedSamples` for a 32-bit image the loaders cannot feed a model as it is
    (the module's rule): an `I` image with a sample outside 0..65535, any `F` image."""
    if image.mode not in ("I", "F"):
        return
    import numpy as np

    values = np.asarray(image)
    low, high = (values.min(), values.max()) if values.size else (0, 0)
    if image.mode == "I" and low >= 0 and high <= 65535:
        return  # 16-bit data in a 32-bit file: scaled by to_8bit
    kind = "integer" if image.mode == "I" else "float"
    where = "outside 0..65535, " if image.mode == "I" else ""
    raise UnsupportedSamples(
        f"its 32-bit {kind} samples lie in {low:g}..{high:g}, {where}which torchkit cannot "
        "scale to 8 bits: save it as 8- or 16-bit (dataset-stats --mode native measures it)"
    )


def expanded_mode(mode: str, info: dict) -> str:
    """The mode a file's own channels are kept in: a palette expanded (RGBA when it has a
    transparent entry, else RGB; RGBA from PA), bilevel as L, any other mode as it is."""
    if mode == "P":
        return "RGBA" if "transparency" in info else "RGB"
    if mode == "PA":
        return "RGBA"
    if mode == "1":
        return "L"
    return mode


def exif_orientation(image: Any, *, exif: bool) -> int:
    """The EXIF orientation (1..8) to turn `image`'s stored pixels by: its Orientation tag when
    `exif`, else 1, the pixels as stored (the module's EXIF rule: a TIFF's decoder turns them
    itself, `orientation_on_load`). Read it before loading a PNG whose tile matters: PIL loads a
    PNG to find its EXIF, and before loading a TIFF: Pillow 13 then drops the tag."""
    if not exif:
        return 1
    # Only the values PIL's decoders and exif_transpose turn by, compared as they compare them:
    # a tag written as the text "6" turns nothing there (int() read it as 6: a TIFF's size as
    # read was taken turned, and --no-exif turned its stored pixels back).
    try:
        value = image.getexif().get(EXIF_ORIENTATION_TAG, 1)
        return int(value) if value in _ORIENTATIONS else 1
    except (TypeError, ValueError):  # an EXIF block or a tag PIL cannot read: nothing to turn
        return 1


def orientation_on_load(image: Any) -> int:
    """The EXIF orientation (1..8) an opened, not yet loaded image's pixels come turned by from
    its decoder (the module's EXIF rule): a TIFF's Orientation tag, which Pillow's TIFF loader
    and OpenCV's TIFF decoder (`sixteen_bit_colour`) both apply; 1, as stored, for any other
    format. Ask before loading: Pillow 13 drops the tag once it has turned the pixels."""
    return exif_orientation(image, exif=True) if image.format == "TIFF" else 1


def apply_exif_orientation(array: Any, orientation: int) -> Any:
    """Turn an (H, W, ...) array the way EXIF orientation 1..8 says, as PIL's exif_transpose."""
    import numpy as np

    transforms = {
        2: lambda a: a[:, ::-1],
        3: lambda a: a[::-1, ::-1],
        4: lambda a: a[::-1],
        5: lambda a: np.swapaxes(a, 0, 1),
        6: lambda a: np.rot90(a, -1),
        7: lambda a: np.rot90(a, 2).swapaxes(0, 1),
        8: lambda a: np.rot90(a, 1),
    }
    transform = transforms.get(orientation)
    return array if transform is None else np.ascontiguousarray(transform(array))


def undoing_orientation(orientation: int) -> int:
    """The EXIF orientation whose turn undoes `orientation`'s: a quarter turn the other way for
    6 and 8, the same for the rest (flips, the half turn, the transposes undo themselves)."""
    return {6: 8, 8: 6}.get(orientation, orientation)


def _oriented(image: Any, orientation: int) -> Any:
    """A PIL image turned as `apply_exif_orientation` turns arrays (PIL's exif_transpose)."""
    from PIL import Image

    transpose = {
        2: Image.Transpose.FLIP_LEFT_RIGHT,
        3: Image.Transpose.ROTATE_180,
        4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE,
        6: Image.Transpose.ROTATE_270,
        7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_90,
    }.get(orientation)
    return image if transpose is None else image.transpose(transpose)


def pixels_in_mode(image: Any, mode: str, *, exif: bool) -> Any:
    """The pixels of an `opened_image` as a loaded 8-bit PIL image in `mode` (e.g. RGB): high
    bit depths scaled, then converted; turned by its EXIF orientation only when `exif` (a TIFF
    comes turned by its decoder either way: the module's EXIF rule). The image itself (loaded)
    when it is already in `mode`, else a copy. Raises what decoding an unreadable file raises
    (`unreadable_image_errors`), and `UnsupportedSamples`."""
    refuse_unscalable_samples(image)
    turned_on_load = orientation_on_load(image) != 1  # before loading: Pillow 13 drops the tag
    pixels = to_8bit(image)  # first: a PNG's EXIF loads it, and 16-bit colour needs its tile
    orientation = 1 if turned_on_load else exif_orientation(image, exif=exif)
    if pixels.mode == mode:
        pixels.load()  # the pixels outlive the file: no copy needed
    else:
        pixels = pixels.convert(mode)  # a loaded copy
    return _oriented(pixels, orientation)


def load_image(path: str | os.PathLike, mode: str) -> Any:
    """The image file at `path` as a loaded PIL image in `mode` (e.g. RGB), its pixels as PIL's
    loader gives them (no EXIF rotation but a TIFF's own: the rule of every loader that feeds a
    model), read as described above.
    Raises `unreadable_image_errors()` (NotARegularFile and PIL's errors) for unreadable files."""
    with opened_image(path) as image:
        return pixels_in_mode(image, mode, exif=False)
