"""Training JPEGs decoded on the device (`train --decode device`): the loader workers only read
each file's bytes and draw its random crop and flip; the main process decodes the whole batch
in one call (`torchvision.io.decode_jpeg(list, device=...)`: nvJPEG on CUDA, libjpeg-turbo on
the CPU), then crops, resizes and flips the images there (`core.crop_resize`: on CUDA the
whole batch in two batched products, on a CPU image by image), and the loop normalises the batch as
it normalises the other paths' 8-bit batches (`core.decode.NormalizedPixels`). The pixels are
the ones stored, EXIF orientation ignored, as every loader reads them (`core.image_files`).

The draws are the fast path's (`core.decode.CropDraws` on the size in the JPEG's header, then
the flip's `torch.rand(1) < 0.5`): the same random numbers from torch's generator in the same
order, so a seeded image gets the same crop box and the same flip as with `--decode fast` or
`exact`. The crop is then taken from the whole decoded image (no reduced decode) and resized to
`image_size` with PIL's filters (bilinear and bicubic antialiased, nearest-exact for nearest),
in float32, rounded to 8 bits: what PIL's `crop(box).resize(size)` computes up to rounding.
`torchvision.ops.roi_align`, the usual one call for a batch, averages bilinear samples instead
of applying PIL's filter, and lands much further from PIL's pixels (below).

Measured on the CPU (photo-like 500x375 and 375x500 JPEGs, quality 90, RGB and grayscale, 40
seeds, 64 and 224 px crops; `tests/data/test_device_decode.py` holds it): libjpeg-turbo's pixels
through `decode_jpeg` are PIL's, bit for bit, so against the exact path (PIL decodes whole,
crops, resizes) the device path's 8-bit crops differ by at most 1 level of 255, mean 0.09-0.17
(bilinear and bicubic; like PIL, the resize rounds its first pass, the width's, to 8 bits), and
not at all for nearest. On high-contrast images (binary noise) bilinear stays within 2 levels,
and bicubic within 1 where Pillow resizes the width first; Pillow 13 resizes the height first
for some shapes (python-pillow/Pillow#9549), and there bicubic's clipping of its first pass
falls elsewhere: up to 25 levels at such pixels, mean under 0.2. `roi_align` differs by up to 5
levels (mean 0.4). Against the fast
path (reduced decode) the mean difference is the fast path's own distance from the exact path,
under 2.5 levels. The tests hold max 1, mean 0.25. nvJPEG's IDCT and chroma upsampling are not
libjpeg's, so on CUDA the decode itself differs by a few levels (tested against the CPU decode
where there is a GPU).

What takes today's path (the fast path's PIL crop, made in the worker) for one item: the
`--decode-cpu-share` of the JPEGs (by a CRC-32 of the path: the same files every epoch), so
that the workers' cores decode beside the device's decoder, files that
are not JPEGs (by their first bytes), JPEGs PIL reads as neither RGB nor grayscale (CMYK,
YCCK), JPEGs that do not end with the end-of-image marker (truncated ones: PIL refuses them as
before, and the worker reports them as before). A JPEG the device cannot decode is decoded by
PIL in the main process with the same box and flip, and one PIL cannot decode either is
skipped with the error today's path gives (`path: reason`), counted or fatal (--strict) as
before. Policies that work on PIL images (trivialaugment, randaugment, autoaugment), random
erasing and `--augment none` are not run on the device: `--decode device` refuses them
(`device_decode_refusal`), and `--decode auto` takes `fast` for them.
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Any

from torchkit.core.data.batches import Batch, collate_skipping_unreadable
from torchkit.core.data.crop_resize import resize_crops
from torchkit.core.data.decode import JPEG_SUFFIXES, pil_resample
from torchkit.core.data.eval_crop import resized_size
from torchkit.core.data.stored_image import is_stored
from torchkit.core.io.errors import UsageError

log = logging.getLogger("torchkit")

JPEG_START = b"\xff\xd8\xff"  # SOI and the first marker's 0xFF
JPEG_END = b"\xff\xd9"  # EOI
# PIL modes of JPEGs decode_jpeg(mode=RGB) turns into PIL's RGB pixels (CMYK it converts
# differently: those take PIL's path).
DEVICE_MODES = ("RGB", "L")
# The unnamed stored images (parquet rows) whose bytes `--decode auto` looks at to judge them.
SNIFFED_UNNAMED = 16
# torchvision 0.29 deprecates its decoders in favour of TorchCodec, with a warning each call.
_DEPRECATION = r"The image decoding and encoding capabilities of TorchVision are deprecated"


def device_decode_refusal(augment: str, random_erasing: float) -> str | None:
    """Why the device path cannot run these train transforms (None: it can)."""
    if augment == "none":
        return "--augment none resizes and centre-crops in PIL, with no random crop"
    if augment != "basic":
        return f"--augment {augment} works on PIL images in the loader workers"
    if random_erasing > 0:
        return "--random-erasing draws its boxes in the loader workers after the crop"
    return None


def check_device_decode(augment: str, random_erasing: float) -> None:
    """A UsageError for `--decode device` with transforms it cannot run."""
    why = device_decode_refusal(augment, random_erasing)
    if why is not None:
        raise UsageError(f"--decode device cannot run these transforms: {why}", "use --decode fast")


def resolve_decode(
    decode: str,
    *,
    device_type: str,
    paths: list[str] | None,
    augment: str,
    random_erasing: float,
) -> tuple[str, str | None]:
    """(mode, note) for `--decode auto`: `device` when training on CUDA from JPEG files (at
    least half of the training files named .jpg/.jpeg/.jfif, parquet rows counted by the share
    of JPEGs among the first `SNIFFED_UNNAMED`'s bytes) with transforms the device path runs,
    `fast` otherwise; the note says why a CUDA run on JPEGs keeps `fast`. Any other
    `decode` is returned as it is."""
    if decode != "auto":
        return decode, None
    if device_type != "cuda" or not paths:
        return "fast", None
    jpegs = sum(1 for path in paths if str(path).lower().endswith(JPEG_SUFFIXES))
    unnamed = [path for path in paths if _unnamed(path)]
    if unnamed:  # parquet rows: judged by the bytes of the first few
        jpegs += round(_share_of_jpegs(unnamed[:SNIFFED_UNNAMED]) * len(unnamed))
    if 2 * jpegs < len(paths):
        return "fast", None
    why = device_decode_refusal(augment, random_erasing)
    if why is not None:
        return "fast", f"training JPEGs are decoded in the loader workers (--decode fast): {why}"
    return "device", None


def _unnamed(path: Any) -> bool:
    """Whether `path` is a stored image whose name says nothing of its format (a parquet row,
    `FILE/ROW`): its bytes alone tell a JPEG, as they do for every image the device path
    takes (`device_jpeg`)."""
    return is_stored(path) and "." not in os.path.basename(os.fspath(path))


def may_be_device_jpeg(path: Any) -> bool:
    """Whether the device path reads `path`'s bytes to see if it takes it: an image named as a
    JPEG (a file, a .tar member, a shard sample) or one named no way at all (a parquet row),
    so that the same JPEGs decode alike from every kind of data."""
    return os.fspath(path).lower().endswith(JPEG_SUFFIXES) or _unnamed(path)


def _share_of_jpegs(paths: list[Any]) -> float:
    """The share of stored images `paths` whose bytes start as a JPEG's, read through copies of
    their readers, dropped afterwards with what they cached: the run's reader kept the row
    group read (its whole image column, 77 MB for 1,000 images of 77 kB) in the main process
    for the whole run, which reads no image where loader workers do."""
    copies: dict[int, Any] = {}
    found = 0
    for path in paths:
        reader = copies.get(id(path.reader))
        if reader is None:
            reader = copies[id(path.reader)] = copy.copy(path.reader)
        found += _starts_as_jpeg(reader, path.locator)
    for reader in copies.values():
        close = getattr(reader, "close", None)
        if close is not None:
            close()
    return found / len(paths)


def _starts_as_jpeg(reader: Any, locator: Any) -> bool:
    try:
        return reader.read(locator).startswith(JPEG_START)
    except Exception:  # an unreadable row: the loaders say so when they read it
        return False


@dataclass
class EncodedJpeg:
    """What a worker gives for a JPEG: its bytes, the crop drawn for it (top, left, height,
    width, in the pixels of the whole image), whether to flip it, and what to resize it to."""

    data: bytes
    box: tuple[int, int, int, int]
    flip: bool
    path: str
    size: int
    interpolation: str
    # Evaluation's resize then centre crop: (resized height, resized width, top, left) of the
    # size x size window kept (`eval_view`); None: the box is resized to size x size.
    view: tuple[int, int, int, int] | None = None


class DeviceDecodeTransform:
    """The train transform of `--decode device`. `pixels_from_file` (what the train dataset
    calls in the workers) gives an `EncodedJpeg` for JPEGs the device path takes, and today's
    uint8 crop (`fallback.pixels_from_file`) for anything else (module doc). On PIL images
    (in-memory data) it is the fast path's transform."""

    def __init__(
        self,
        fallback: Any,
        *,
        flip: bool,
        interpolation: str = "bilinear",
        cpu_share: float = 0.0,
    ) -> None:
        self.fallback = fallback  # a core.decode.FileTrainTransform: crop, flip, no policy
        self.draws = fallback.crop.draws
        self.size = fallback.crop.image_size
        self.flip = bool(flip)
        self.interpolation = interpolation
        self.normalized = fallback.normalized
        self.cpu_share = float(cpu_share)

    def __call__(self, image: Any) -> Any:
        return self.fallback(image)

    def pixels_from_file(self, path: str | os.PathLike, mode: str) -> Any:
        import torch

        name = os.fspath(path)
        if mode != "RGB" or not may_be_device_jpeg(path):
            return self.fallback.pixels_from_file(path, mode)
        if self.cpu_share > 0 and decoded_on_cpu(name, self.cpu_share):
            return self.fallback.pixels_from_file(path, mode)  # the same draws, in the worker
        found = device_jpeg(name)
        if found is None:
            return self.fallback.pixels_from_file(path, mode)  # nothing drawn yet
        data, width, height = found
        # The fast path's draws, in its order: the crop from the header's size, then the flip.
        top, left, crop_height, crop_width = self.draws.draw(width, height)
        flip = bool(torch.rand(1) < 0.5) if self.flip else False
        return EncodedJpeg(
            data, (top, left, crop_height, crop_width), flip, name, self.size, self.interpolation
        )

    def from_file(self, path: str | os.PathLike, mode: str) -> Any:
        """The normalised (C, H, W) tensor of one file, decoded on the CPU as the device path
        would decode it (what `make_dataset` calls without `pixels`)."""
        item = self.pixels_from_file(path, mode)
        if isinstance(item, EncodedJpeg):
            images = collate_encoded([(item, 0, 0, "")]).images
            pixels, _, failures = images.decode("cpu")
            if failures:
                raise failures[0][1]
            item = pixels[0]
        return self.normalized(item)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, flip={self.flip}, "
            f"interpolation={self.interpolation!r}, cpu_share={self.cpu_share}, "
            f"fallback={self.fallback!r})"
        )


def device_jpeg(path: str) -> tuple[bytes, int, int] | None:
    """(bytes, width, height) of a JPEG file the device path takes, from its header alone (no
    pixel is decoded); None for a file that takes PIL's path (module doc). An unreadable file
    raises the error every loader gives."""
    from torchkit.core.data.image_files import opened_image, read_regular_file

    data = read_regular_file(path)
    if not data.startswith(JPEG_START):
        return None
    with opened_image(data, name=path) as image:
        width, height = image.size
        # Zero padding after the end marker is common and harmless; anything else there (or
        # no end marker: a truncated file) takes PIL's path, which judges it as before.
        whole = data.rstrip(b"\x00").endswith(JPEG_END)
        # MPO: a camera's JPEG with more pictures after the first, which both decode.
        jpeg = image.format in ("JPEG", "MPO")
        if not (jpeg and image.mode in DEVICE_MODES and whole):
            return None
    return data, width, height


def eval_view(
    width: int, height: int, resize_size: int, image_size: int, crop_mode: str = "center"
) -> tuple[int, int, int, int] | None:
    """(resized height, resized width, top, left): what the eval transform's resize and centre
    crop do to a width x height image in `crop_mode` (`core.eval_crop`; `center`: torchvision's
    Resize(resize_size), the shorter side to resize_size, the longer truncated in proportion;
    the window's corner rounded). None where the resized image is smaller than the crop, which
    is padded (with zeros, or the mean colour in `border` mode): PIL's path does that."""
    resized_width, resized_height = resized_size(width, height, resize_size, crop_mode)
    if min(resized_width, resized_height) < image_size:
        return None
    top = int(round((resized_height - image_size) / 2.0))
    left = int(round((resized_width - image_size) / 2.0))
    return resized_height, resized_width, top, left


class DeviceEvalTransform:
    """The evaluation transform (resize, centre crop) of `--decode device` in eval, predict and
    extract-features (built by `core.transforms.eval_transform(decode="device")`):
    `pixels_from_file` gives an `EncodedJpeg` (the whole image as the box, the
    resize and crop as its view) for JPEGs the device path takes, and the 8-bit crop of
    `core.transforms.eval_transform(pixels=True)` for anything else. On PIL images (in-memory
    data) it is that transform."""

    def __init__(self, pixels: Any, preprocess: Any) -> None:
        self.pixels = pixels  # `core.transforms.eval_transform(preprocess, pixels=True)`
        self.resize_size, self.size = preprocess.resize_size, preprocess.image_size
        self.interpolation = preprocess.interpolation
        self.crop_mode = preprocess.crop_mode

    def __call__(self, image: Any) -> Any:
        return self.pixels(image)

    def pixels_from_file(self, path: str | os.PathLike, mode: str) -> Any:
        from torchkit.core.data.crop_resize import INTERPOLATE_MODES
        from torchkit.core.data.image_files import load_image

        name = os.fspath(path)
        # A checkpoint's preprocessing may name a filter only PIL has (lanczos): PIL's path.
        supported = self.interpolation in INTERPOLATE_MODES
        if supported and mode == "RGB" and may_be_device_jpeg(path):
            found = device_jpeg(name)
            if found is not None:
                data, width, height = found
                view = eval_view(width, height, self.resize_size, self.size, self.crop_mode)
                if view is not None:
                    box = (0, 0, height, width)
                    return EncodedJpeg(data, box, False, name, self.size, self.interpolation, view)
        return self.pixels(load_image(path, mode))  # already in `mode`

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(resize_size={self.resize_size}, size={self.size}, "
            f"interpolation={self.interpolation!r}, crop_mode={self.crop_mode!r})"
        )


def decoded_on_cpu(path: str, share: float) -> bool:
    """Whether `--decode-cpu-share share` gives the JPEG at `path` to the loader workers: a
    stable hash of the path (CRC-32, not Python's salted hash), so the same files every epoch,
    in every worker and every run, and no random number taken from the crops' generator."""
    import zlib

    return zlib.crc32(path.encode("utf-8", "surrogateescape")) < share * 2**32


def _byte_buffer(size: int) -> Any:
    """An empty uint8 tensor of `size` bytes: in shared memory in a DataLoader worker (as
    default_collate allocates its batches), so the batch reaches the main process uncopied."""
    import torch

    if torch.utils.data.get_worker_info() is not None:
        try:
            prototype = torch.empty(0, dtype=torch.uint8)
            storage = prototype._typed_storage()._new_shared(size, device=prototype.device)
            return prototype.new(storage).resize_(size)
        except (AttributeError, RuntimeError, TypeError):
            pass
    return torch.empty(size, dtype=torch.uint8)


class EncodedImages:
    """A batch's images as the workers left them: the JPEGs' bytes end to end in one uint8
    tensor (one shared-memory block per batch, not one per image; `data.split(lengths)` gives
    the per-image byte tensors decode_jpeg takes), their boxes and flips, and the 8-bit crops of
    the items that took today's path, with each one's place in the batch."""

    def __init__(
        self,
        data: Any,
        lengths: list[int],
        boxes: list[tuple[int, int, int, int]],
        flips: list[bool],
        paths: list[str],
        encoded_at: list[int],
        pixels: Any,
        pixels_at: list[int],
        size: int,
        interpolation: str,
        views: list | None = None,
    ) -> None:
        self.data, self.lengths, self.boxes, self.flips = data, lengths, boxes, flips
        self.paths, self.encoded_at = paths, encoded_at
        self.pixels, self.pixels_at = pixels, pixels_at
        self.size, self.interpolation = size, interpolation
        self.views = views or [None] * len(encoded_at)  # EncodedJpeg.view of each

    def __len__(self) -> int:
        return len(self.encoded_at) + len(self.pixels_at)

    def pin_memory(self) -> EncodedImages:
        """The same batch in page-locked memory (DataLoader(pin_memory=True) calls it through
        `Batch.pin_memory`): the bytes reach the GPU's decoder asynchronously."""
        return EncodedImages(
            self.data.pin_memory(),
            self.lengths,
            self.boxes,
            self.flips,
            self.paths,
            self.encoded_at,
            None if self.pixels is None else self.pixels.pin_memory(),
            self.pixels_at,
            self.size,
            self.interpolation,
            self.views,
        )

    def reasons(self, failures: list[tuple[int, BaseException]]) -> list[tuple[int, str]]:
        """(position, "path: reason") of `decode`'s failures, in batch order: what today's
        path reports for an unreadable image."""
        from torchkit.core.data.image_files import unreadable_reason

        return [
            (position, f"{self.paths[self.encoded_at.index(position)]}: {unreadable_reason(error)}")
            for position, error in sorted(failures, key=lambda failure: failure[0])
        ]

    def decode(self, device: Any) -> tuple[Any, list[int], list[tuple[int, BaseException]]]:
        """(pixels, kept, failures): the batch's uint8 (N, 3, size, size) crops on `device`
        (None if none was readable), the batch positions they are of, in order, and (position,
        error) of each JPEG that neither the device nor PIL could decode."""
        return self.crops(self.jpegs(device), device)

    def jpegs(self, device: Any) -> list:
        """The JPEGs decoded whole on `device` (`decode_jpegs`: None for each it could not
        decode), the first half of `decode`."""
        chunks = list(self.data.split(self.lengths)) if self.lengths else []
        return decode_jpegs(chunks, device)

    def crops(
        self, decoded: list, device: Any
    ) -> tuple[Any, list[int], list[tuple[int, BaseException]]]:
        """`decode`'s result from `jpegs`' images: their crops resized, PIL for the JPEGs the
        device could not decode, and the items the workers decoded put in their places."""
        import torch

        device = torch.device(device)
        crops: dict[int, Any] = {}
        failures: list[tuple[int, BaseException]] = []
        readable: list[tuple[int, Any, tuple[int, int, int, int], bool]] = []
        for j, image in enumerate(decoded):
            position = self.encoded_at[j]
            top, left, height, width = self.boxes[j]
            if image is None or image.shape[-2] < top + height or image.shape[-1] < left + width:
                # The device could not decode it (or not to the header's size): PIL can.
                try:
                    crops[position] = pil_crop(
                        self.paths[j],
                        self.boxes[j],
                        self.flips[j],
                        self.size,
                        self.interpolation,
                        self.views[j],
                    ).to(device, non_blocking=True)
                except pil_errors() as error:
                    failures.append((position, error))
                continue
            readable.append((position, image, self.boxes[j], self.flips[j], self.views[j]))
        if readable:
            positions, images, boxes, flips, views = (
                list(column) for column in zip(*readable, strict=True)
            )
            resized = resize_crops(images, boxes, flips, self.size, self.interpolation, views=views)
            if len(readable) == len(self):  # the whole batch, in order: already one tensor
                return resized, list(range(len(self))), failures
            for position, crop in zip(positions, resized, strict=True):
                crops[position] = crop
        if self.pixels_at:
            pixels = self.pixels.to(device, non_blocking=True)
            for position, crop in zip(self.pixels_at, pixels, strict=True):
                crops[position] = crop
        kept = sorted(crops)
        if not kept:
            return None, kept, failures
        return torch.stack([crops[position] for position in kept]), kept, failures


# Copies of the JPEG `ready_decoder` decodes at once: a batched call (torchvision decodes lists
# through nvJPEG's batched API), mirrored and not, as a training batch is.
READY_COPIES = 4


def ready_decoder(path: str, device: Any, size: int, interpolation: str) -> None:
    """Decode copies of the JPEG at `path` on `device` and resize them to `size`, as a batch
    is: what a process's first batch would otherwise pay for (`core.decoder_warm_up`)."""
    import torch

    from torchkit.core.runtime.device import use_in_this_thread

    device = torch.device(device)
    use_in_this_thread(device)  # called in a thread of its own
    with open(path, "rb") as file:
        data = torch.frombuffer(bytearray(file.read()), dtype=torch.uint8)
    images = [image for image in decode_jpegs([data] * READY_COPIES, device) if image is not None]
    if images:
        height, width = images[0].shape[-2:]
        boxes = [(0, 0, int(height), int(width))] * len(images)
        flips = [index % 2 == 1 for index in range(len(images))]
        resize_crops(images, boxes, flips, size, interpolation)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()


def pil_errors() -> tuple[type[BaseException], ...]:
    """What PIL raises for an unreadable image: what `core.dataset.make_dataset` catches."""
    from torchkit.core.data.image_files import unreadable_image_errors

    return unreadable_image_errors()


def decode_jpegs(chunks: list, device: Any) -> list:
    """Each JPEG of `chunks` (1-D uint8 CPU tensors) decoded to a uint8 (3, H, W) RGB tensor on
    `device`, in one batched call; when that call fails (one bad file fails it all), one call
    per image, None for each image that fails."""
    if not chunks:
        return []
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return _decode_each(chunks, device)
    from torchkit.core.data.decoder_warm_up import wait_for_decoder_warm_up

    wait_for_decoder_warm_up()  # the decoder readied during the set-up, if it was
    # nvJPEG's hardware engine writes its outputs without waiting for the stream it is given,
    # and torchvision allocates them on the caller's stream: from the caching allocator's
    # blocks just freed there, which kernels still queued on that stream (the last step's
    # backward and optimiser) have yet to read. Training then reads overwritten activations:
    # NaN losses within a few steps (seen on an H100; pytorch/vision#9606). Decoding on a
    # stream of its own takes the outputs from that stream's blocks, which nothing queued
    # reads; the caller's stream then waits for the decode, and owns the outputs. The decode
    # does not wait for the caller's stream (its inputs are host bytes): it runs while the
    # last step's kernels still run, as the decode in a loader worker would.
    current = torch.cuda.current_stream(device)
    side = _decode_stream(device)
    with torch.cuda.stream(side):
        decoded = _decode_each(chunks, device)
    current.wait_stream(side)
    for image in decoded:
        if image is not None:
            image.record_stream(current)
    return decoded


_STREAMS: dict[Any, Any] = {}


def _decode_stream(device: Any) -> Any:
    """One CUDA stream per device for the decoder (streams are not freed: one is enough)."""
    import torch

    stream = _STREAMS.get(device)
    if stream is None:
        stream = _STREAMS[device] = torch.cuda.Stream(device)
    return stream


def _decode_each(chunks: list, device: Any) -> list:
    """decode_jpegs on the current stream: one batched call, else one call per image."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    # The pixels as stored, as every loader reads them (core.image_files' EXIF rule).
    decode = {"mode": ImageReadMode.RGB, "device": device, "apply_exif_orientation": False}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DEPRECATION)
        if str(device) not in _NO_LISTS:
            try:
                return list(decode_jpeg(chunks, **decode))
            except torch.OutOfMemoryError:
                raise  # the run's own error (a smaller --batch-size), not a bad file
            except RuntimeError:
                pass
        decoded, first_error = [], None
        for chunk in chunks:
            try:  # one tensor, not a list of one: torchvision 0.19 takes lists on CUDA only
                decoded.append(decode_jpeg(chunk, **decode))
            except torch.OutOfMemoryError:
                raise
            except RuntimeError as error:
                decoded.append(None)
                first_error = first_error or error
        if first_error is None and len(chunks) > 1:
            # Every image decoded alone, so the list itself was refused: decode alone from now.
            _NO_LISTS.add(str(device))
        if len(chunks) > 1 and all(image is None for image in decoded):
            _warn_once(device, first_error)
        return decoded


# Devices whose decode_jpeg refused a list of JPEGs that it decoded one by one (torchvision 0.19
# on the CPU).
_NO_LISTS: set[str] = set()


_WARNED: set[str] = set()


def _warn_once(device: Any, error: BaseException | None) -> None:
    """One warning per device when its decoder refused a whole batch, file by file: a decoder
    that cannot run (torchvision without nvJPEG) leaves every JPEG to PIL in the main process."""
    from torchkit.core.io.errors import first_line

    if str(device) in _WARNED:
        return
    _WARNED.add(str(device))
    log.warning(
        "the %s JPEG decoder refused every image of a batch (%s): PIL decodes such images in "
        "the main process, slowly; --decode fast decodes them in the loader workers",
        device,
        first_line(error) if error is not None else "?",
    )


def pil_crop(
    path: str,
    box: tuple[int, int, int, int],
    flip: bool,
    size: int,
    interpolation: str,
    view: tuple[int, int, int, int] | None = None,
) -> Any:
    """Today's path for one JPEG, with a box and flip already drawn: PIL decodes it whole, crops,
    resizes and flips (with a `view`, resizes to its size and keeps its window, as evaluation
    does); its uint8 (3, size, size) pixels. Raises what PIL raises."""
    from PIL import Image

    from torchkit.core.data.decode import PixelTensor
    from torchkit.core.data.image_files import opened_image, pixels_in_mode

    with opened_image(path, in_memory=True) as image:
        image = pixels_in_mode(image, "RGB", exif=False)  # as stored, as the workers read it
    top, left, height, width = box
    image = image.crop((left, top, left + width, top + height))
    if view is None:
        image = image.resize((size, size), pil_resample(interpolation))
    else:
        resized_height, resized_width, view_top, view_left = view
        image = image.resize((resized_width, resized_height), pil_resample(interpolation))
        image = image.crop((view_left, view_top, view_left + size, view_top + size))
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return PixelTensor()(image).contiguous()


def collate_encoded(items: list | Batch) -> Any:
    """`core.batches.collate_skipping_unreadable` for the device path's items: a `Batch` whose
    images are `EncodedImages` when any item is an `EncodedJpeg` (otherwise exactly what
    collate_skipping_unreadable gives, such as an in-memory batch the dataset collated)."""
    import numpy as np
    import torch

    if isinstance(items, Batch):  # in-memory images (digits): no JPEG bytes to decode
        return items
    good = [item for item in items if item[0] is not None]
    encoded = [(at, item[0]) for at, item in enumerate(good) if isinstance(item[0], EncodedJpeg)]
    if not encoded:
        return collate_skipping_unreadable(items)
    errors = [item[3] for item in items if item[0] is None]
    lengths = [len(jpeg.data) for _, jpeg in encoded]
    data = _byte_buffer(sum(lengths))
    view = data.numpy()
    offset = 0
    for (_, jpeg), length in zip(encoded, lengths, strict=True):
        view[offset : offset + length] = np.frombuffer(jpeg.data, dtype=np.uint8)
        offset += length
    others = [(at, item[0]) for at, item in enumerate(good) if not isinstance(item[0], EncodedJpeg)]
    first = encoded[0][1]
    images = EncodedImages(
        data,
        lengths,
        [jpeg.box for _, jpeg in encoded],
        [jpeg.flip for _, jpeg in encoded],
        [jpeg.path for _, jpeg in encoded],
        [at for at, _ in encoded],
        torch.utils.data.default_collate([pixels for _, pixels in others]) if others else None,
        [at for at, _ in others],
        first.size,
        first.interpolation,
        [jpeg.view for _, jpeg in encoded],
    )
    return Batch(
        images,
        torch.tensor([item[1] for item in good], dtype=torch.long),
        torch.tensor([item[2] for item in good], dtype=torch.long),
        errors,
    )


def decoded_batch(batch: Any, device: Any) -> Any:
    """`batch` with its `EncodedImages` decoded on `device` (uint8 crops there), the items
    nothing could decode dropped (labels and indices too) and reported in `errors` as today's
    path reports them (`path: reason`); any other batch as it is."""
    return cropped_batch(jpegs_decoded(batch, device), device)


class DecodedJpegs:
    """A batch whose JPEGs `jpegs_decoded` decoded whole, its crops still to make
    (`cropped_batch`): `decoded_batch` in two halves, for two threads."""

    def __init__(self, batch: Any, decoded: list) -> None:
        self.batch, self.decoded = batch, decoded


def jpegs_decoded(batch: Any, device: Any) -> Any:
    """The first half of `decoded_batch`: a `DecodedJpegs` for a batch of `EncodedImages`, any
    other batch as it is."""
    if not isinstance(batch.images, EncodedImages):
        return batch
    return DecodedJpegs(batch, batch.images.jpegs(device))


def cropped_batch(started: Any, device: Any) -> Any:
    """The second half of `decoded_batch`, from what `jpegs_decoded` gave."""
    import torch

    if not isinstance(started, DecodedJpegs):
        return started
    batch = started.batch
    images = batch.images
    pixels, kept, failures = images.crops(started.decoded, device)
    errors = [*batch.errors, *(reason for _, reason in images.reasons(failures))]
    if pixels is None:
        return Batch(None, None, None, errors)
    labels, indices = batch.labels, batch.indices
    if len(kept) < len(images):
        keep = torch.tensor(kept, dtype=torch.long)
        labels, indices = labels[keep], indices[keep]
    return Batch(pixels, labels, indices, errors)


def collate_encoded_with_failures(items: list) -> tuple[Any, list[tuple[int, str]]]:
    """(`collate_encoded` of the readable items, (index, "path: reason") of the items the
    workers could not read): for the commands that report unreadable images by index (predict,
    extract-features)."""
    failed = [(item[2], item[3]) for item in items if item[0] is None]
    return collate_encoded([item for item in items if item[0] is not None]), failed


def decoded_with_indices(
    collated: tuple[Any, list[tuple[int, str]]], device: Any
) -> tuple[Any, list[int], list[tuple[int, str]]]:
    """What `collate_encoded_with_failures` gave, decoded on `device`: (the uint8 images, or None
    if none was readable; their dataset indices, in batch order; (index, "path: reason") of every
    image that the workers, the device and PIL all failed to read)."""
    batch, failed = collated
    if batch.images is None:
        return None, [], failed
    indices = batch.indices.tolist()
    if not isinstance(batch.images, EncodedImages):
        return batch.images, indices, failed
    encoded = batch.images
    pixels, kept, failures = encoded.decode(device)
    failed = [*failed, *((indices[at], reason) for at, reason in encoded.reasons(failures))]
    return pixels, [indices[position] for position in kept], failed
