"""`convert tensor`: image files <-> NumPy .npy <-> torch .pt/.pth <-> .safetensors.

One file to one file (or to several, for a batch written as images), or a whole folder tree in
worker processes. The format of each file is chosen by its extension. See `pixels` for what the
values mean on each side and how they are converted.
"""

from __future__ import annotations

import logging
import os
import pickle
import stat
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from torchkit.core.convert import pixels as px
from torchkit.core.data.image_files import (
    NotARegularFile,
    apply_exif_orientation,
    exif_orientation,
    expanded_mode,
    open_regular_file,
    opened_image,
    orientation_on_load,
    read_regular_file,
    sixteen_bit_colour,
    strict_unreadable_error,
    undoing_orientation,
    unreadable_image_errors,
    unreadable_reason,
)
from torchkit.core.data.sources.discovery import IMAGE_EXTENSIONS
from torchkit.core.io.claims import OutputFolderReplacedError, check_claimed, reporting_write_errors
from torchkit.core.io.errors import (
    InputError,
    OutputWriteError,
    TorchkitError,
    UsageError,
    first_line,
)
from torchkit.core.io.file_kinds import file_kind
from torchkit.core.io.file_outputs import ReplacedFiles, check_output_file
from torchkit.core.io.files import (
    atomic_path,
    refuse_case_twins,
    require_input,
    safetensors_save,
    torch_save,
)
from torchkit.core.io.folder_contents import extension_pattern, proven
from torchkit.core.io.incomplete import incomplete_run
from torchkit.core.io.output_proofs import of_its_format
from torchkit.core.io.outputs import OutputFolder
from torchkit.core.io.overlap import InputPath, check_overlap
from torchkit.core.io.progress import Progress
from torchkit.core.io.special_files import check_not_stdout, is_special_file, names_a_folder
from torchkit.core.io.wording import counted
from torchkit.core.io.write_errors import as_write_error, named_as_final
from torchkit.core.runtime.cpus import check_workers
from torchkit.core.runtime.pool import chunked, default_workers, map_chunks

log = logging.getLogger("torchkit")

IMAGE_FORMATS = {
    ".png": "PNG",
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".bmp": "BMP",
    ".webp": "WEBP",
    ".tif": "TIFF",
    ".tiff": "TIFF",
}
# Images read but not written: the other image files every dataset reader takes (GIF, PPM, PGM,
# JFIF). A folder's were left out as non-images, so that its arrays lacked images training read.
READ_ONLY_IMAGE_EXTENSIONS = tuple(sorted(IMAGE_EXTENSIONS - IMAGE_FORMATS.keys()))
ARRAY_EXTENSIONS = (".npy",)
TENSOR_EXTENSIONS = (".pt", ".pth", ".safetensors")
WRITTEN_EXTENSIONS = (*IMAGE_FORMATS, *ARRAY_EXTENSIONS, *TENSOR_EXTENSIONS)
EXTENSIONS = (*IMAGE_FORMATS, *READ_ONLY_IMAGE_EXTENSIONS, *ARRAY_EXTENSIONS, *TENSOR_EXTENSIONS)
SIXTEEN_BIT_FORMATS = ("PNG", "TIFF")
FORMAT_NAMES = {"WEBP": "WebP"}  # as messages spell them (Pillow's names otherwise)
DEFAULT_TENSOR_NAME = "image"
SAFETENSORS_METADATA = "__metadata__"  # the header entry of a .safetensors file, no tensor
DEFAULT_NROW = 8
DEFAULT_QUALITY = 95
QUALITY_FORMATS = ("JPEG", "WEBP")  # the formats --quality applies to


def kind_of(extension: str, *, output: bool = False) -> str:
    """'image', 'array' (.npy) or 'tensor' (.pt, .pth, .safetensors); `output`: of a file to
    write (READ_ONLY_IMAGE_EXTENSIONS are refused)."""
    extension = extension.lower()
    if extension in READ_ONLY_IMAGE_EXTENSIONS:
        if output:
            raise UsageError(
                f"{extension} files are read, not written",
                "write one of: " + " ".join(WRITTEN_EXTENSIONS),
            )
        return "image"
    if extension in IMAGE_FORMATS:
        return "image"
    if extension in ARRAY_EXTENSIONS:
        return "array"
    if extension in TENSOR_EXTENSIONS:
        return "tensor"
    raise UsageError(
        f"unknown file extension {extension or '(none)'!r}", "supported: " + " ".join(EXTENSIONS)
    )


@dataclass
class TensorOptions:
    """How to read and write the array/tensor side of a conversion.

    `layout`, `dtype` and `scale` describe the array or tensor side: the output when it is a
    .npy/.pt/.safetensors file, else the input. None means the convention of the format: .npy is
    HWC uint8 (uint16 for 16-bit images), .pt and .safetensors are CHW float32 in [0, 1]. A
    `scale` for a .npy output implies float32.
    """

    to: str | None = None  # output extension (".png") when the destination is a folder
    layout: str | None = None
    dtype: str | None = None
    scale: int | None = None
    key: str | None = None
    exif: bool = True
    grid: bool = False
    nrow: int | None = None  # images a grid row, with `grid`; None: DEFAULT_NROW
    quality: int | None = None  # of JPEG and WebP outputs; None: DEFAULT_QUALITY


@dataclass
class Written:
    path: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict:
        return {"path": self.path, "shape": list(self.shape), "dtype": self.dtype}


@dataclass
class FileResult:
    source: str
    written: list[Written] = field(default_factory=list)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    # What a format did to every file alike (WebP has no grayscale): said once for a folder,
    # with a count, not once a file; each said once a file.
    notices: list[str] = field(default_factory=list)
    unreadable: bool = False  # `error` is why an image file could not be read


class UnreadableImage(InputError):
    """An image file that cannot be read; `reason`: why, in the words every command uses
    (`unreadable_reason`): a folder's conversion counts it as the other commands skip one."""

    reason = ""


def _unreadable_image(source: Path, error: BaseException) -> UnreadableImage:
    reason = unreadable_reason(error)
    # The decoder's failure, not the file system's: the file's content is at fault
    decoded = not isinstance(error, OSError) or (
        error.errno is None and not isinstance(error, NotARegularFile)
    )
    if decoded:
        hint = "the file is truncated, corrupt or not an image"
    elif isinstance(error, NotARegularFile):  # a FIFO, a folder, a link to nothing
        hint = "give an image file"
    else:  # no read permission, an I/O error: the file system's answer
        hint = "make it readable, or give another file"
    unreadable = UnreadableImage(f"cannot read image {source}: {reason}", hint)
    unreadable.reason = reason
    return unreadable


@dataclass
class TensorReport:
    source: str
    destination: str
    folder: bool
    converted: int = 0
    skipped: int = 0
    failed: int = 0
    written: list[Written] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    skipped_files: list[str] = field(default_factory=list)
    # The folders in a folder SRC that could not be listed: their files were not converted.
    unlisted_folders: list[str] = field(default_factory=list)

    def incomplete(self) -> InputError | None:
        """The error a run that did not convert every file ends in, once the rest is converted
        (as `cp -r` exits 1): files that failed, folders that could not be listed (whose files
        a run that exited 0 left out: `convert tensor src dst --to npy && rm -r src`)."""
        failed = (
            f"{self.failed} of {self.converted + self.failed} files could not be converted "
            f"into {self.destination}"
        )
        return incomplete_run(
            self.source,
            self.unlisted_folders,
            failed=failed if self.failed else None,
            left_out=f"their files were not converted into {self.destination}",
            again="make them readable and convert again; --strict stops before converting any",
        )

    def to_dict(self) -> dict:
        data = {
            "source": self.source,
            "destination": self.destination,
            "converted": self.converted,
            "skipped": self.skipped,
            "failed": self.failed,
            "files_written": len(self.written),
            "failures": [{"path": path, "error": error} for path, error in self.failures],
            "skipped_files": list(self.skipped_files),
            "unlisted_folders": list(self.unlisted_folders),
        }
        if not self.folder:
            data["written"] = [w.to_dict() for w in self.written]
        return data


# --- reading ----------------------------------------------------------------------------------


def _pil_to_array(image, source: Path) -> Any:
    import numpy as np

    mode = image.mode
    if mode.startswith("I;16"):
        return np.asarray(image).astype(np.uint16)
    if mode == "I":
        array = np.asarray(image)
        if array.size and (array.min() < 0 or array.max() > 65535):
            # A readable file whose samples no image format torchkit writes can hold as they are.
            raise InputError(
                f"cannot convert image {source}: its 32-bit integer samples lie in "
                f"{array.min()}..{array.max()}, outside 0..65535",
                "an unsupported sample range: save it as 16-bit or as 32-bit float",
            )
        return array.astype(np.uint16)
    if mode == "F":
        return np.asarray(image, dtype=np.float32)
    # A file's own channels, as dataset-stats --mode native counts them: palettes expanded,
    # bilevel as L; then the four layouts an image file can be written back in.
    wanted = {"RGBa": "RGBA", "La": "LA"}.get(mode, expanded_mode(mode, image.info))
    if wanted not in ("L", "LA", "RGB", "RGBA"):  # CMYK, YCbCr, LAB, HSV, RGBX...
        wanted = "RGB"
    return np.asarray(image if wanted == mode else image.convert(wanted))


def read_image(path: str | os.PathLike, *, exif: bool = True, name: str | None = None) -> px.Pixels:
    """An image file as Pixels: grayscale, RGBA and 16-bit keep their channels and depth,
    palette images become RGB(A), EXIF orientation is applied unless `exif=False` (the picture
    as viewed: see `core.image_files` for the one EXIF rule)."""
    source = Path(path)
    try:
        data = read_regular_file(source)
        with opened_image(data, name=os.fspath(source)) as image:
            # Before getexif(), which loads a PNG: 16-bit colour is told by the tile loading drops.
            array = sixteen_bit_colour(image)
            tag = exif_orientation(image, exif=True)
            # A TIFF's decoders (Pillow's loader, OpenCV's for 16-bit colour) turn the pixels by
            # the tag: turned again here, a TIFF came out turned twice (6 and 8 upside down, 3
            # not turned), and `exif=False` gave it turned, not as stored: that turn is undone.
            turned = orientation_on_load(image)  # before loading: Pillow 13 drops the tag
            if turned == 1:
                orientation = tag if exif else 1
            else:
                orientation = 1 if exif else undoing_orientation(turned)
            if array is None:
                array = _pil_to_array(image, source)
    except unreadable_image_errors() as error:
        raise _unreadable_image(source, error) from None
    if array.ndim == 2:
        array = array[..., None]
    array = apply_exif_orientation(array, orientation)
    return px.Pixels(array, name or source.name)


def read_npy(path: str | os.PathLike) -> Any:
    import numpy as np

    source = Path(path)
    with open(source, "rb") as handle:
        magic = handle.read(6)
    if not magic:
        raise InputError(f"{source} is empty (0 bytes)", "it is not a NumPy array file")
    if magic != b"\x93NUMPY":
        raise InputError(f"{source} is not a .npy file (no NumPy header)")
    _check_npy_size(source)
    try:
        array = np.load(source, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        if "allow_pickle" in str(error):
            raise InputError(
                f"{source} holds Python objects, not numbers",
                "it can only be loaded by unpickling, which could run code",
            ) from None
        raise InputError(
            f"cannot read {source}: {first_line(error)}", "the file is truncated or corrupt"
        ) from None
    return array


def _check_npy_size(source: Path) -> None:
    """A .npy file shorter than the array its header declares is cut short. np.load allocates
    the whole declared array first: a copy cut short of a large array (or a crafted header of
    a few bytes) was a MemoryError ("Unable to allocate 27.9 GiB"), not a truncated file."""
    import math

    import numpy as np

    readers = {(1, 0): np.lib.format.read_array_header_1_0}
    readers[(2, 0)] = np.lib.format.read_array_header_2_0
    with open(source, "rb") as handle:
        try:
            reader = readers.get(np.lib.format.read_magic(handle))
            if reader is None:  # a newer header: np.load reads it (or says why not)
                return
            shape, _, dtype = reader(handle)
        except (ValueError, OSError, EOFError):  # np.load says what is wrong with it
            return
        held = os.fstat(handle.fileno()).st_size - handle.tell()
    if dtype.hasobject:  # pickled objects: refused by np.load
        return
    declared = math.prod(shape) * dtype.itemsize
    if held < declared:
        raise InputError(
            f"cannot read {source}: its header declares a {'x'.join(map(str, shape))} "
            f"{dtype} array of {declared:,} bytes, and {held:,} follow it",
            "the file is truncated or corrupt",
        )


def _pick_tensor(obj: Any, key: str | None, source: Path) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        if key is not None:
            raise UsageError(f"{source} holds a single tensor", "drop --key")
        return obj
    if not isinstance(obj, Mapping):
        raise InputError(
            f"{source} holds a {type(obj).__name__}, not a tensor or a dict of tensors"
        )
    tensors = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if key is not None:
        if key not in obj:
            raise UsageError(
                f"{source} has no key {key!r}", "its keys are: " + ", ".join(map(str, list(obj)))
            )
        if not isinstance(obj[key], torch.Tensor):
            raise InputError(f"{source}[{key!r}] is a {type(obj[key]).__name__}, not a tensor")
        return obj[key]
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    if not tensors:
        _refuse_dict_without_top_level_tensors(obj, source)
    raise UsageError(
        f"{source} holds {len(tensors)} tensors", "pick one with --key: " + ", ".join(tensors)
    )


def _holds_tensors(obj: Any) -> bool:
    import torch

    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, Mapping):
        return any(_holds_tensors(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_holds_tensors(value) for value in obj)
    return False


def _refuse_dict_without_top_level_tensors(obj: Mapping, source: Path) -> None:
    """A training checkpoint or a nested state dict keeps its tensors below the top level,
    where --key (a top-level name) cannot reach: saying it holds none sent users looking for a
    broken file."""
    if not obj:
        raise InputError(f"{source} holds no tensors (it is empty)")
    if not _holds_tensors(obj):
        raise InputError(f"{source} holds no tensors (its keys are: {_listed_keys(obj)})")
    raise InputError(
        f"{source} holds its tensors inside nested dicts, not at the top level "
        f"(its keys are: {_listed_keys(obj)})",
        "a model checkpoint? `torchkit convert checkpoint` converts its weights; "
        "--key picks a tensor at the top level only",
    )


def _listed_keys(obj: Mapping, limit: int = 12) -> str:
    keys = [str(key) for key in obj]
    return ", ".join(keys[:limit]) + (" ..." if len(keys) > limit else "")


def _tensor_to_numpy(tensor: Any) -> Any:
    import torch

    numpy_floats = (torch.float16, torch.float32, torch.float64)

    if tensor.is_meta:  # `.cpu()` raised NotImplementedError, shown as an unexpected failure
        raise InputError(
            "a meta tensor holds no values, only a shape",
            "save the tensor once its values are computed, on a device that holds them",
        )
    tensor = tensor.detach().cpu()
    if tensor.layout != torch.strided:
        raise InputError(
            f"a {str(tensor.layout).removeprefix('torch.')} tensor is not an image",
            "save `tensor.to_dense()` instead",
        )
    if tensor.is_complex():
        raise InputError("complex tensors are not images")
    if tensor.is_floating_point() and tensor.dtype not in numpy_floats:
        tensor = tensor.float()  # bfloat16, float8...: NumPy has none of them
    try:
        return tensor.contiguous().numpy()
    except (TypeError, RuntimeError):  # quantized and other dtypes NumPy lacks
        raise InputError(
            f"{str(tensor.dtype).removeprefix('torch.')} tensors are not images"
        ) from None


def read_torch(path: str | os.PathLike, key: str | None = None) -> Any:
    """A tensor from a .pt/.pth file (loaded with weights_only=True, on the CPU) as NumPy."""
    import torch

    # As every checkpoint is read: torch.load unpacks deflated records (which torch.save never
    # writes) into memory, a 300 KB file into 300 MB, without a look at their size; and a file
    # that is no torch.save file (a PNG or a text named .pt) is said to be none, where it was
    # "a pickled Python object" or "KeyError: 101".
    from torchkit.core.models.checkpoint import (
        blocked_global,
        is_torch_save_file,
        refuse_expanding_archive,
    )

    source = Path(path)
    if source.stat().st_size == 0:
        raise InputError(f"{source} is empty (0 bytes)", "it is not a PyTorch file")
    if not is_torch_save_file(source):
        raise InputError(
            f"cannot read {source}: not a PyTorch file (neither torch.save's zip archive nor a "
            "pickle)",
            "give the .pt/.pth file torch.save wrote",
        )
    refuse_expanding_archive(source)
    try:
        obj = torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "weights only" not in str(error).lower():
            raise InputError(
                f"cannot read {source}: {first_line(error)}",
                "the file is truncated or not a PyTorch file",
            ) from None
        if blocked_global(error) is None:  # weights_only fails on garbage too
            raise InputError(
                f"cannot read {source}: not a pickle of tensors that torch.save wrote",
                "the file is truncated or not a PyTorch file",
            ) from None
        raise InputError(
            f"{source} holds a pickled Python object, not tensors",
            "only tensors and dicts of tensors are read, with weights_only=True, so loading "
            "never runs code from the file",
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as error:
        raise InputError(
            f"cannot read {source}: {first_line(error)}",
            "the file is truncated or not a PyTorch file",
        ) from None
    except Exception as error:  # a damaged pickle raises anything (KeyError, IndexError...)
        raise InputError(
            f"cannot read {source}: {first_line(error, with_type=True)}",
            "the file is truncated or not a PyTorch file",
        ) from None
    return _tensor_to_numpy(_pick_tensor(obj, key, source))


def read_safetensors(path: str | os.PathLike, key: str | None = None) -> Any:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from torchkit.core.io.non_utf8_names import name_native_code_opens

    source = Path(path)
    try:
        with name_native_code_opens(source) as name:
            tensors = load_file(name, device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise InputError(
            f"cannot read {source}: {first_line(error)}",
            "the file is truncated or not a .safetensors file",
        ) from None
    return _tensor_to_numpy(_pick_tensor(tensors, key, source))


def read_pixels(
    path: Path, options: TensorOptions, *, describes_input: bool, name: str | None = None
) -> px.Pixels:
    """Read any supported file. `describes_input`: the layout/scale options are the input's."""
    extension = path.suffix.lower()
    kind = kind_of(extension)
    name = name or path.name
    if kind == "image":
        return read_image(path, exif=options.exif, name=name)
    try:  # a FIFO named a.npy in a folder was opened and waited on for good
        open_regular_file(path).close()
    except NotARegularFile as error:
        raise InputError(f"cannot read {path}: {error}", "give a file") from None
    if kind == "array":
        array, default_layout = read_npy(path), "hwc"
    elif extension == ".safetensors":
        array, default_layout = read_safetensors(path, options.key), "chw"
    else:
        array, default_layout = read_torch(path, options.key), "chw"
    return px.from_array(
        array,
        name=name,
        layout=options.layout if describes_input else None,
        default_layout=default_layout,
        scale=options.scale if describes_input else None,
    )


# --- writing ----------------------------------------------------------------------------------


# The largest side each encoder takes (libjpeg, libwebp): a larger image is not written.
MAX_SIDE = {"JPEG": 65_500, "WEBP": 16_383}


def _write_image(path: Path, array: Any, quality: int, extension: str) -> None:
    import numpy as np

    image_format = IMAGE_FORMATS[extension]
    channels = 1 if array.ndim == 2 else array.shape[-1]
    if image_format == "JPEG" and channels not in (1, 3):
        raise InputError(
            f"JPEG cannot store {'an alpha channel' if channels in (2, 4) else 'this image'}",
            "write PNG, WebP or TIFF instead",
        )
    if image_format == "BMP" and channels == 2:
        raise InputError("BMP cannot store grayscale with alpha", "write PNG or TIFF instead")
    if image_format == "BMP" and channels == 4:
        # Pillow writes it as 32-bit BGRX, which Pillow and OpenCV read back as RGB: the alpha
        # was gone without a word (and the report said 4 channels).
        raise InputError(
            "BMP cannot store an alpha channel (readers take a 32-bit BMP for RGB)",
            "write PNG, WebP or TIFF instead",
        )
    limit = MAX_SIDE.get(image_format)
    if limit is not None and max(array.shape[:2]) > limit:
        height, width = array.shape[:2]
        raise InputError(
            f"{image_format} cannot store a {width}x{height} image: at most {limit:,} pixels "
            "a side",
            "write PNG or TIFF instead",
        )
    with atomic_path(path) as tmp, reporting_write_errors(path):
        if array.dtype == np.uint16 and channels in (3, 4):
            import cv2

            bgr = array[..., [2, 1, 0, 3][:channels]]
            # Encoded in memory and written here: OpenCV given a file name that is not UTF-8
            # crashes the process, and says nothing of why a write failed.
            encoded, data = cv2.imencode(extension, np.ascontiguousarray(bgr))
            if not encoded:
                raise OutputWriteError(
                    f"cannot write {path}: OpenCV could not encode the 16-bit image",
                    "write PNG or TIFF instead",
                )
            tmp.write_bytes(data.tobytes())
            return
        from PIL import Image

        image = Image.fromarray(array)
        extra = {"quality": quality} if image_format in QUALITY_FORMATS else {}
        image.save(tmp, format=image_format, **extra)  # a regular file: atomic_path's


def _write_npy(path: Path, array: Any) -> None:
    import numpy as np

    with atomic_path(path) as tmp, reporting_write_errors(path), open(tmp, "wb") as handle:
        np.save(handle, array, allow_pickle=False)


def _write_torch(path: Path, array: Any, name: str, extension: str) -> None:
    import torch

    # An image's pixels as PIL gives them are read-only: torch warns of such an array (on
    # stderr, a UserWarning a user cannot act on), so it gets its own writable copy.
    tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
    with atomic_path(path) as tmp, reporting_write_errors(path):
        if extension == ".safetensors":
            safetensors_save({name: tensor}, tmp)
        else:
            torch_save(tensor, tmp)


def _as_webp_stores(array: Any, note: px.Warn) -> Any:
    """The pixels a WebP file holds, so that the report tells what a reader gets: libwebp has
    no grayscale (Pillow writes gray as RGB, gray+alpha as RGBA) and drops an alpha channel
    that is opaque everywhere. The report said 8x8 for the 8x8x3 RGB file a gray image became."""
    import numpy as np

    channels = 1 if array.ndim == 2 else array.shape[-1]
    if channels in (1, 2):
        note("WebP has no grayscale: grayscale images were written as RGB (R = G = B)")
        gray = array if array.ndim == 2 else array[..., 0]
        colour = [gray, gray, gray] + ([array[..., 1]] if channels == 2 else [])
        array = np.stack(colour, axis=-1)
    if array.shape[-1] == 4 and (array[..., 3] == 255).all():
        note(
            "WebP drops an alpha channel that is opaque everywhere: such images were written as RGB"
        )
        array = array[..., :3]
    return np.ascontiguousarray(array)


def write_pixels(
    pixels: px.Pixels,
    target: Path,
    options: TensorOptions,
    warn: px.Warn,
    extension: str | None = None,
    note: px.Warn | None = None,
) -> Written:
    """Write one image (or, for array/tensor formats, one batch) to `target`, in the format of
    `extension` (by default its own). `note` (by default `warn`) is told what the format does
    to every file alike (WebP has no grayscale)."""
    extension = (extension or target.suffix).lower()
    kind = kind_of(extension, output=True)
    note = note or warn
    if kind == "image":
        # 16-bit gray+alpha has no writer here (PIL has no such mode, OpenCV no 2-channel PNG).
        image_format = IMAGE_FORMATS[extension]
        sixteen = image_format in SIXTEEN_BIT_FORMATS and pixels.array.shape[-1] != 2
        if str(pixels.array.dtype) == "uint16" and not sixteen:
            note(
                f"{FORMAT_NAMES.get(image_format, image_format)} holds 8 bits a channel: "
                "16-bit values were scaled to 8 bits"
                if image_format not in SIXTEEN_BIT_FORMATS
                else "16-bit grayscale with alpha is written with 8 bits a channel: 16-bit "
                "values were scaled to 8 bits"
            )
        array = px.to_image(pixels, sixteen_bit=sixteen, warn=warn)
        if IMAGE_FORMATS[extension] == "WEBP":
            array = _as_webp_stores(array, note)
        quality = DEFAULT_QUALITY if options.quality is None else options.quality
        _write_image(target, array, quality, extension)
    else:
        layout = options.layout or ("hwc" if kind == "array" else "chw")
        if options.dtype:
            dtype = options.dtype
        elif kind == "array" and options.scale is None:
            dtype = "uint16" if str(pixels.array.dtype) == "uint16" else "uint8"
        else:
            dtype = "float32"
        array = px.to_array(pixels, layout=layout, dtype=dtype, scale=options.scale, warn=warn)
        if kind == "array":
            _write_npy(target, array)
        else:
            _write_torch(target, array, options.key or DEFAULT_TENSOR_NAME, extension)
    return Written(str(target), tuple(int(n) for n in array.shape), str(array.dtype))


def convert_file(
    source: Path,
    target: Path,
    options: TensorOptions,
    *,
    split_batch: bool,
    force: bool = True,
    inputs: Sequence[InputPath] | None = None,
    name: str | None = None,
    extension: str | None = None,
    replaced: ReplacedFiles | None = None,
) -> FileResult:
    """Convert one file, into the format of `extension` (by default `target`'s own). A batch
    written as images becomes `<stem>_<i><ext>` beside `target` when `split_batch`, else it
    needs --grid. Raises TorchkitError on bad input. With `inputs`, every file about to be
    written is checked first (`check_output_file`: not an input, not inside an input folder,
    an existing one only with `force`). With `replaced`, each old file is set aside there
    first and each new one recorded: the caller's later failure puts the old files back."""
    result = FileResult(str(source))
    extension = (extension or target.suffix).lower()
    target_kind = kind_of(extension, output=True)
    source_kind = kind_of(source.suffix)
    pixels = read_pixels(
        source,
        options,
        describes_input=target_kind == "image" and source_kind != "image",
        name=name,
    )
    if options.grid:
        pixels = px.make_grid(pixels, nrow=options.nrow or DEFAULT_NROW)
    if target_kind == "image":  # a 16-bit image's floats: its 16 bits, for a batch as a whole
        pixels = px.sixteen_bit_floats(pixels)
    if target_kind == "image" and pixels.batch:
        images = pixels.images()
        if len(images) == 1:
            outputs = [(images[0], target)]
        elif not split_batch:
            raise UsageError(
                f"{source} holds a batch of {len(images)} images; {target} is one image",
                "for one file per image give a folder as DST, with --to; or pass --grid",
            )
        else:
            width = len(str(len(images) - 1))
            outputs = [
                (image, target.with_name(f"{target.stem}_{i:0{width}d}{target.suffix}"))
                for i, image in enumerate(images)
            ]
    else:
        outputs = [(pixels, target)]
    for _, path in outputs:
        if replaced is not None:
            replaced.set_aside(path)  # before its last check, which records the old file
        if inputs is not None:
            check_output_file(path, force, inputs)
    for image, path in outputs:
        written = write_pixels(
            image, path, options, result.warnings.append, extension, result.notices.append
        )
        if replaced is not None:
            replaced.wrote(path)
        result.written.append(written)
    result.notices = list(dict.fromkeys(result.notices))  # a batch's images: said once
    return result


# --- the command ------------------------------------------------------------------------------


def _target_extension(to: str | None) -> str | None:
    if to is None:
        return None
    extension = "." + to.lower().lstrip(".")
    kind_of(extension, output=True)  # validates
    return extension


def _validate(options: TensorOptions, target_kind: str | None) -> None:
    if options.dtype == "uint8" and options.scale == 1:
        raise UsageError("--scale 1 needs a float --dtype", "uint8 values are always 0..255")
    if options.dtype and target_kind == "image":
        raise UsageError(
            "--dtype sets the dtype of .npy/.pt/.safetensors outputs",
            "image files are 8-bit, or 16-bit for 16-bit PNG/TIFF sources",
        )
    if options.nrow is not None and options.nrow < 1:
        raise UsageError("--nrow must be at least 1")


def _check_image_options(options: TensorOptions, target_extension: str) -> None:
    """--quality shapes JPEG and WebP outputs, --nrow a --grid: given where they do nothing,
    they would be ignored, so they are refused (as --key and --dtype are)."""
    quality_format = IMAGE_FORMATS.get(target_extension.lower()) in QUALITY_FORMATS
    if options.quality is not None and not quality_format:
        raise UsageError(
            f"--quality {options.quality} has no effect here: it sets the quality of JPEG and "
            "WebP outputs",
            "drop --quality",
        )
    if options.nrow is not None and not options.grid:
        raise UsageError(f"--nrow {options.nrow} goes with --grid", "add --grid, or drop --nrow")


def _check_reading_options(
    options: TensorOptions, sources: Sequence[Path], target_extension: str
) -> None:
    """--layout and --scale describe the .npy/.pt/.safetensors side of a conversion (its output,
    or an image output's source), --no-exif how an image source is read: given where there is
    no such side or source (PNG to JPEG; .npy to .pt), they would be ignored, so they are
    refused (as --key and --dtype are)."""
    kinds = {kind_of(path.suffix) for path in sources}
    if kind_of(target_extension) == "image" and kinds == {"image"}:
        for option, value in (("--layout", options.layout), ("--scale", options.scale)):
            if value is not None:
                raise UsageError(
                    f"{option} {value} has no effect here: it describes the .npy/.pt/.safetensors "
                    "side of a conversion, and both sides are image files",
                    f"drop {option}",
                )
    if not options.exif and "image" not in kinds:
        raise UsageError(
            "--no-exif has no effect here: it says how image files are read, and no source is one",
            "drop --no-exif",
        )


def _check_key(key: str | None, sources: Sequence[Path], target_extension: str) -> None:
    """--key names the tensor read from a .pt/.safetensors source or written to a .safetensors
    output: given where neither is converted, it would be ignored, so it is refused (as --dtype
    for an image output)."""
    if key is None:
        return
    if target_extension.lower() == ".safetensors":
        if key == SAFETENSORS_METADATA:
            # Written, it made a header no safetensors reader parses (and exit code 0).
            raise UsageError(
                f"--key {key} cannot name a tensor of a .safetensors file: the format keeps "
                "that name for its metadata",
                "choose another name",
            )
        return
    if any(path.suffix.lower() in TENSOR_EXTENSIONS for path in sources):
        return
    raise UsageError(
        f"--key {key} has no effect here: it names the tensor of a .pt/.safetensors source or "
        "of a .safetensors output",
        "drop --key",
    )


def _scan(
    folder: Path,
    *,
    linked: list[str] | None = None,
    unlisted: list[str] | None = None,
    strict: bool = False,
) -> tuple[list[Path], list[Path]]:
    """(convertible, skipped) files under `folder`, recursively, hidden ones left out, in the
    order of their paths' parts (as pathlib sorts them). Listed as every dataset reader lists a
    folder (`list_folders`): linked folders are entered (`cat -> /mnt/big/cat`: before, its
    images were left out without a word, where train read them), a link back into the data
    is not (with a warning). An image name that is no file to read (a link to nothing, a FIFO)
    is convertible, an unreadable image when read (it was left out without a word); a folder
    that cannot be listed and the other links to nothing are warned of (with `strict`, the
    folder is an error), as the dataset readers do. One `os.scandir` a folder, whose entries
    know their type: `rglob` with a `Path`, `relative_to` and an `os.stat` (`is_file`) for
    each file took about 16 times as long (about 5 minutes of listing for a million files).
    `linked`: given, the linked folders entered are added to it; `unlisted`: given, the folders
    that could not be listed (their paths in `folder`)."""
    from torchkit.core.data.sources.discovery import (
        list_folders,
        listing_error,
        warn_dead_links,
        warn_unentered,
        warn_unlistable,
    )
    from torchkit.core.data.strict_reading import reading_strictly, strict_reading

    base = str(Path(folder))
    top = 0 if base == "." else len(base) + 1  # list_folders spells paths as pathlib does
    listing = list_folders([folder])
    if listing.unlistable and listing.unlistable[0][0] == base:  # SRC itself, as video-info's
        # (it was `no convertible files in SRC`, or with --strict a hint to leave it out)
        reason = listing_error(listing.unlistable[0][1])
        raise InputError(f"cannot list folder {folder}: {reason}", "make it readable")
    warn_unentered(listing.unentered, folder)
    with reading_strictly(strict or strict_reading()):
        # Not "--strict makes this an error": without it the run ends in one too, once the
        # rest is converted (see `TensorReport.incomplete`).
        warn_unlistable(listing.unlistable, folder, files="files", strict_option=False)
    if unlisted is not None:
        unlisted.extend(path[top:] for path, _ in listing.unlistable)
    # An array or tensor name that is no file to read (a link to nothing): a file that
    # fails, as an image name is; other links to nothing are warned of. A FIFO, socket or
    # device is a file like any other by its name: one that fails, or one skipped as
    # `notes.txt` is (it was left out of the count without a word).
    arrays = [p for p in listing.dead if _convertible_name(p)]
    warn_dead_links([p for p in listing.dead if not _convertible_name(p)], folder)
    if linked is not None:
        linked.extend(listing.entered)
    found = []
    for path in (
        *listing.images[0],
        *listing.dangling[0],
        *listing.others,
        *arrays,
        *listing.special,
    ):
        relative = path[top:]
        parts = relative.split(os.sep)
        if any(part.startswith(".") for part in parts):
            continue
        extension = os.path.splitext(parts[-1])[1].lower()
        found.append((parts, relative, extension in EXTENSIONS))
    convertible, skipped = [], []
    for _parts, relative, known in sorted(found):
        (convertible if known else skipped).append(Path(relative))
    return convertible, skipped


def _convertible_name(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in EXTENSIONS


def _convert_chunk(
    task: tuple[str, str, str, list[Path], str, TensorOptions],
) -> list[FileResult]:
    """Worker: convert files of a folder into `target_root` (the temporary folder that becomes
    `final_root`). A file that cannot be read or converted is reported, not raised; a write
    error (full disk, read-only) is raised: it is fatal, never a skipped input."""
    source_root, target_root, final_root, relatives, extension, options = task
    results = []
    made: set[Path] = set()
    for relative in relatives:
        source = Path(source_root) / relative
        target = Path(target_root) / relative.with_suffix(extension)
        try:
            if target.parent not in made:
                # The folder being filled is still the one begun: a removed one is not made
                # again by its subfolder's mkdir (one stat per folder, not per file).
                check_claimed(target.parent)
                with reporting_write_errors(target.parent):
                    target.parent.mkdir(parents=True, exist_ok=True)
                made.add(target.parent)
            result = convert_file(source, target, options, split_batch=True, name=str(relative))
            result.written = [
                Written(os.path.relpath(w.path, target_root), w.shape, w.dtype)
                for w in result.written
            ]
        except OutputWriteError as error:
            raise named_as_final(error, target_root, final_root) from None
        except OutputFolderReplacedError:
            raise  # the output's error, not this file's
        except UnreadableImage as error:
            result = FileResult(str(relative), error=error.reason, unreadable=True)
        except TorchkitError as error:
            result = FileResult(str(relative), error=str(error))
        except Exception as error:  # a broken file must not stop the others
            found = as_write_error(error, target)
            if found is not None:
                raise named_as_final(found, target_root, final_root) from None
            result = FileResult(str(relative), error=first_line(error, with_type=True))
        result.source = str(relative)
        results.append(result)
    return results


def writes_file(to: str | None) -> Callable[[PurePath], bool]:
    """Whether `convert tensor --to TO` may write a file at a path relative to a folder DST:
    one with TO's extension, or a hidden one (the folder is filled in a hidden temporary)."""
    extension = _target_extension(to)

    def writes(relative: PurePath) -> bool:
        hidden = any(part.startswith(".") for part in relative.parts)
        return hidden or relative.suffix.lower() == extension

    return writes


def convert_tensor(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    options: TensorOptions | None = None,
    *,
    force: bool = False,
    workers: int | None = None,
    strict: bool = False,
    progress: Progress | None = None,
    before_keep: Callable[[TensorReport], None] | None = None,
    replaced: ReplacedFiles | None = None,
    report_file: str | os.PathLike | None = None,
) -> TensorReport:
    """Convert one file, or every supported file of a folder tree, by extension. Every output
    is checked before any work: never an input, never inside the input folder, an existing one
    replaced only with `force` (a folder only if torchkit wrote it). `before_keep(report)` runs
    (a folder SRC) once every file is written, before the new folder replaces an old DST: if
    it raises (the caller's `-o` report did not fit on its disk), the old DST stays. A file
    SRC's outputs (DST, or the files it writes into a folder DST) are set aside in `replaced`
    instead, whose `put_back` gives the old ones back when the caller fails after this.
    `report_file`: the caller's `-o` file, which a folder DST may hold (a rerun's --force replaces
    it with the rest)."""
    check_workers(workers)
    options = options or TensorOptions()
    source = require_input(src, what="source")
    target = Path(dst)
    to = _target_extension(options.to)
    if os.fspath(dst) == "-":
        # Meant as stdout, as `-o -` is: say how to get that, not that a folder cannot go there.
        raise UsageError(
            "DST cannot go to standard output: '-' is stdout only for -o",
            "give a folder name, \"$PWD/-\" for one called '-'"
            if source.is_dir()
            else "for stdout give /dev/stdout with --to npy, pt, safetensors, png...; else a "
            "file name, \"$PWD/-\" for one called '-'",
        )
    if source.is_dir():
        return _convert_folder(
            source, target, to, options, force, workers, strict, progress, before_keep, report_file
        )

    source_kind = kind_of(source.suffix)  # an unknown source extension is a usage error
    mode = os.stat(source).st_mode
    # An image's reader says so itself; a .npy/.pt/.safetensors FIFO was opened and waited on
    # for good (SIGTERM too).
    if source_kind != "image" and not stat.S_ISREG(mode):
        raise InputError(
            f"cannot read {source}: not a regular file ({file_kind(mode)})", "give a file"
        )
    special = is_special_file(target)  # /dev/stdout, /dev/fd/N, a FIFO: written into
    named_folder = names_a_folder(dst)  # `out.pt/`: a folder, whatever its extension says
    new_folder = target.suffix == "" and not target.exists() and not special
    if target.is_dir() or named_folder or new_folder:
        check_not_stdout(target, "output folder")  # a batch's images into a folder named '-'
        if to is None:
            # A new name without an extension is taken as a folder: say so, not that it is one.
            what = "is a folder" if target.is_dir() else "has no extension: a new folder"
            if named_folder and not target.is_dir():
                what = f"names a folder (ends in {os.sep})"
            shown = os.fspath(dst) if named_folder else target
            raise UsageError(
                f"{shown} {what}", "pass --to png|npy|pt|safetensors|..., or end DST with one"
            )
        file_target, split_batch, extension = target / (source.stem + to), True, to
    else:
        # A name without an extension (/dev/stdout, /dev/fd/N) takes --to's format.
        named = target.suffix.lower()
        if to is not None and named and to != named:
            raise UsageError(f"--to {options.to} contradicts the extension of {target}")
        extension = to or named
        if not extension:
            raise UsageError(
                f"{target} has no extension to say its format", "pass --to png|npy|pt|..."
            )
        file_target, split_batch = target, False
    _validate(options, kind_of(extension, output=True))  # also refuses an unknown extension
    _check_key(options.key, [source], extension)
    _check_image_options(options, extension)
    _check_reading_options(options, [source], extension)
    inputs = [InputPath.of(source, "source")]
    if not split_batch:
        check_output_file(file_target, force, inputs)
    result = convert_file(
        source,
        file_target,
        options,
        split_batch=split_batch,
        force=force,
        inputs=inputs,
        extension=extension,
        replaced=replaced,
    )
    for message in [*result.warnings, *result.notices]:
        log.warning(message)
    report = TensorReport(str(source), str(target), folder=False, converted=1)
    report.written = result.written
    if progress is not None:
        progress(1, 1)
    return report


def _convert_folder(
    source: Path,
    target: Path,
    to: str | None,
    options: TensorOptions,
    force: bool,
    workers: int | None,
    strict: bool,
    progress: Progress | None,
    before_keep: Callable[[TensorReport], None] | None = None,
    report_file: str | os.PathLike | None = None,
) -> TensorReport:
    if to is None:
        raise UsageError(
            "converting a folder needs the output format", "pass --to png|npy|pt|safetensors|..."
        )
    _validate(options, kind_of(to))
    if target.exists() and not target.is_dir():
        kind = file_kind(os.stat(target).st_mode)  # a file, a FIFO, a device: said which
        raise UsageError(f"{source} is a folder but {target} is {kind}", "give a folder as DST")
    # Checked and locked before the scan; filled in a hidden folder that replaces DST at the end.
    output = OutputFolder(
        target,
        command="convert tensor",
        force=force,
        inputs=[InputPath.of(source, "source folder")],
        what="output folder",
        atomic=True,
        # The converted files, named as their sources, in any format convert writes.
        # each file only where it is of the format its extension names (a text of yours
        # named a.npy is refused); another program's image or array passes: judged by format
        owned=[proven(f"**/*{extension_pattern(e)}", of_its_format) for e in WRITTEN_EXTENSIONS],
        reports=[report_file],
    )
    with output:
        report = _convert_into(output, source, target, to, options, workers, strict, progress)
        report.failures.sort()
        report.written.sort(key=lambda w: w.path)
        if before_keep is not None:
            before_keep(report)  # raising: `output`'s exit puts the old folder back
    return report


def _convert_into(
    output: OutputFolder,
    source: Path,
    target: Path,
    to: str,
    options: TensorOptions,
    workers: int | None,
    strict: bool,
    progress: Progress | None,
) -> TensorReport:
    linked: list[str] = []
    unlisted: list[str] = []
    files, skipped = _scan(source, linked=linked, unlisted=unlisted, strict=strict)
    # A linked folder read is an input too: DST may not be one, nor hold one (`prev -> ../DST`
    # read the old DST's files as sources while --force replaced it).
    check_overlap(
        target, "output folder", [InputPath.of(p, "linked source folder") for p in linked]
    )
    if not files:
        raise InputError(f"no convertible files in {source}", "supported: " + " ".join(EXTENSIONS))
    _check_key(options.key, files, to)
    _check_image_options(options, to)
    _check_reading_options(options, files, to)
    seen: dict[Path, Path] = {}
    for relative in files:
        produced = relative.with_suffix(to)
        if produced in seen:
            raise UsageError(
                f"{seen[produced]} and {relative} would both become {produced}",
                "convert them separately",
            )
        seen[produced] = relative

    workers = default_workers() if workers is None else workers
    if workers > 1 and (
        to in TENSOR_EXTENSIONS or any(f.suffix.lower() in TENSOR_EXTENSIONS for f in files)
    ):
        import torch  # noqa: F401 - import once here, not in every forked worker

    report = TensorReport(str(source), str(target), folder=True, skipped=len(skipped))
    report.skipped_files = [str(p) for p in skipped]
    report.unlisted_folders = unlisted
    done = 0
    # Output file -> the source that wrote it: a batch's images (`x.pt` -> `x_0.png`, `x_1.png`)
    # are named only once it is read, and may be another source's output (`x_0.png` itself).
    writer_of: dict[str, str] = {}
    notices: dict[str, int] = {}  # a notice -> the files it was said of

    def collect(results: list[FileResult]) -> None:
        nonlocal done
        for result in results:
            done += 1
            for message in result.warnings:
                log.warning(message)
            for message in result.notices:
                notices[message] = notices.get(message, 0) + 1
            if result.error is None:
                for written in result.written:
                    first = writer_of.setdefault(written.path, result.source)
                    if first != result.source:
                        raise UsageError(
                            f"{first} and {result.source} would both become {written.path}",
                            "convert them separately",
                        )
                report.converted += 1
                report.written.extend(result.written)
                continue
            if strict and result.unreadable:  # named as the other commands name one
                raise strict_unreadable_error(f"{source / result.source}: {result.error}")
            if strict:
                raise InputError(
                    f"{result.source}: {result.error}",
                    "leave out --strict to skip files that fail",
                )
            report.failed += 1
            report.failures.append((result.source, result.error))
            log.warning(f"failed to convert {result.source}: {result.error}")  # "failed" column
        if progress is not None:
            progress(done, len(files))

    try:
        root = output.begin()
    except OutputWriteError as error:
        raise named_as_final(error, str(output.path), str(target)) from None
    with reporting_write_errors(target):  # the probe writes a file into the output
        refuse_case_twins(
            [produced.as_posix() for produced in seen],
            root,
            "rename one of them in the source, or convert into a folder on a file system that "
            "tells case apart",
            shown=target,
        )
    tasks = [
        (str(source), str(root), str(target), list(chunk), to, options)
        for chunk in chunked(files, workers, most=64)
    ]
    map_chunks(_convert_chunk, tasks, workers=workers, on_result=collect)
    for message, count in notices.items():
        log.warning(f"{message} ({counted(count, 'file')})")
    if report.converted == 0:
        first_path, first_error = report.failures[0]
        raise InputError(
            f"none of the {len(files)} files in {source} could be converted",
            f"first failure: {first_path}: {first_error}",
        )
    return report
