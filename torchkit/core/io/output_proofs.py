"""Content proofs for the files torchkit writes under names others use too (a `curves.png`,
a `split.csv`, a `predictions.csv` a user made beside a run): `folder_contents.proven` names
such a file torchkit's, for `--force` to replace, only where its content shows torchkit wrote
it. A proof reads a few hundred bytes at most and never fails: an unreadable file is not
proven (and so is refused, never deleted).

- A PNG torchkit draws carries the text chunk `Software: torchkit VERSION` (`PNG_METADATA`,
  given to every savefig). One drawn by an earlier version, without it, is proven only where
  its pixel size is one only torchkit's figure has (train's curves.png and lr_find.png), or
  it was written with the file its run wrote just before it (`drawn_with`: eval's plots,
  whose size depends on the data, and train's under a matplotlibrc's other size).
- A CSV is proven by the header line torchkit writes, whole or (where it goes on with columns
  that depend on the data) its first columns; a text file by its first line.
- Formats torchkit cannot write a mark of its own into are proven by the format's own start: a
  TensorBoard event file (its first record, TensorBoard's `brain.Event` version, or a file
  cut inside that record by a full disk: a start of it, its length's CRC checked), a Chrome
  trace (Kineto's `schemaVersion` first, or the autograd profiler's array of events where
  torch has no Kineto): another program's file of that format under that name passes too.
- A tar torchkit writes names torchkit as each member's owner (`tar_by`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Collection
from pathlib import Path

from torchkit import __version__
from torchkit.core.io.image_magic import HEAD_BYTES, PNG_SIGNATURE, image_format

PNG_SOFTWARE = b"torchkit"
PNG_METADATA = {"Software": f"torchkit {__version__}"}  # savefig(..., metadata=PNG_METADATA)
_CHUNKS_READ = 64  # chunks before the image data: a PNG's header and text come first
_MAX_HEADER_BYTES = 4096


def _png_size_and_texts(
    path: Path, kinds: set[bytes] | None = None
) -> tuple[tuple[int, int], dict[bytes, bytes]] | None:
    """A PNG's (width, height) and the tEXt/iTXt/zTXt chunks before its image data, or None
    where `path` is not a PNG (or cannot be read). `kinds`: filled with the chunk types read
    before the image data."""
    texts: dict[bytes, bytes] = {}
    kinds = set() if kinds is None else kinds
    try:
        with open(path, "rb") as handle:
            if handle.read(8) != PNG_SIGNATURE:
                return None
            size = None
            for _ in range(_CHUNKS_READ):
                head = handle.read(8)
                if len(head) < 8:
                    return None
                length, kind = struct.unpack(">I4s", head)
                kinds.add(kind)
                if kind in (b"IDAT", b"IEND"):
                    break
                if length > 1 << 20:
                    return None
                body = handle.read(length)
                handle.read(4)  # its CRC
                if kind == b"IHDR" and length >= 8:
                    size = struct.unpack(">II", body[:8])
                elif kind in (b"tEXt", b"zTXt", b"iTXt"):
                    key, _, value = body.partition(b"\0")
                    if kind == b"zTXt":
                        # at most 256 bytes out: a chunk of 1 MB unpacks to 1 GB
                        value = zlib.decompressobj().decompress(value[1:], 256)
                    elif kind == b"iTXt":  # flag, method, language\0, translated key\0, text
                        value = value[2:].split(b"\0", 2)[-1]
                    texts[key] = value
    except (OSError, struct.error, zlib.error):
        return None
    return None if size is None else (size, texts)


def torchkit_png(
    legacy_sizes: Collection[tuple[int, int]] = (),
    *,
    legacy_bare: bool | Collection[tuple[int, int]] = False,
) -> Callable[[Path], bool]:
    """The proof of a PNG torchkit writes: its `Software` text (`PNG_METADATA`, or
    `with_software_text`), or, written by a version before that text, Matplotlib's with a
    pixel size of `legacy_sizes` (the sizes only torchkit's figure of that name has), or where
    `legacy_bare` (an image OpenCV encoded: `imencode` writes no chunk but IHDR before the
    image data) such a bare PNG, of any size (True) or of these sizes."""

    def proof(path: Path) -> bool:
        kinds: set[bytes] = set()
        found = _png_size_and_texts(path, kinds)
        if found is None:
            return False
        size, texts = found
        software = texts.get(b"Software", b"")
        if software.startswith(PNG_SOFTWARE + b" "):
            return True
        if legacy_bare and kinds <= {b"IHDR", b"IDAT", b"IEND"}:
            return legacy_bare is True or tuple(size) in set(legacy_bare)
        return software.startswith(b"Matplotlib") and tuple(size) in set(legacy_sizes)

    return proof


def with_software_text(png: bytes) -> bytes:
    """`png` (as OpenCV's `imencode` writes it: IHDR first) with the `Software: torchkit
    VERSION` text chunk after its IHDR, the mark `torchkit_png` proves it by."""
    if png[:8] != PNG_SIGNATURE or png[12:16] != b"IHDR":
        return png
    end = 8 + 12 + struct.unpack(">I", png[8:12])[0]  # past IHDR's length, type, data, CRC
    body = b"tEXtSoftware\0" + PNG_METADATA["Software"].encode("latin-1")
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    return png[:end] + chunk + png[end:]


def any_of(*proofs: Callable[[Path], bool]) -> Callable[[Path], bool]:
    """The proof that holds where one of `proofs` holds (a file of this version or of an
    earlier one)."""
    return lambda path: any(proof(path) for proof in proofs)


def empty_file(path: Path) -> bool:
    """Whether `path` is an empty regular file: one a run made and was stopped before it wrote
    in it (nothing in it to lose)."""
    try:
        return path.stat().st_size == 0 and path.is_file()
    except OSError:
        return False


SAME_RUN_S = 120.0  # a plot and the file its run wrote just before it: seconds apart


def drawn_with(
    records: dict[str, Callable[[Path], bool]], *, at_most: tuple[int, int] | None = None
) -> Callable[[Path], bool]:
    """The proof of a plot an earlier version drew without the Software text, whatever its
    size: Matplotlib's, written within `SAME_RUN_S` of a file beside it that its run wrote
    just before (`records`: each name and the proof that the file of that name is the run's),
    and where given no wider or taller than `at_most` pixels (its figure's size, cropped by
    a matplotlibrc's `savefig.bbox: tight`, padded). A plot of yours made since is not."""

    def proof(path: Path) -> bool:
        found = _png_size_and_texts(path)
        if found is None or not found[1].get(b"Software", b"").startswith(b"Matplotlib"):
            return False
        if at_most is not None and (found[0][0] > at_most[0] or found[0][1] > at_most[1]):
            return False
        try:
            drawn = path.stat().st_mtime
        except OSError:
            return False
        for name, record_proof in records.items():
            written = path.with_name(name)
            try:
                apart = abs(drawn - written.stat().st_mtime)
            except OSError:
                continue
            if apart <= SAME_RUN_S and record_proof(written):
                return True
        return False

    return proof


def csv_header(columns: Collection[str], *, whole: bool = True) -> Callable[[Path], bool]:
    """The proof of a CSV torchkit writes: its first line is `columns` (`whole`), or begins
    with them (a header that goes on with columns that depend on the data)."""
    head = ",".join(columns).encode("utf-8")

    def proof(path: Path) -> bool:
        try:
            with open(path, "rb") as handle:
                first = handle.readline(_MAX_HEADER_BYTES)
        except OSError:
            return False
        first = first.removeprefix(b"\xef\xbb\xbf").rstrip(b"\r\n")
        return first == head if whole else first == head or first.startswith(head + b",")

    return proof


def text_start(start: bytes) -> Callable[[Path], bool]:
    """The proof of a text file torchkit writes: it begins with `start` (a heading that names
    torchkit's command)."""

    def proof(path: Path) -> bool:
        try:
            with open(path, "rb") as handle:
                return handle.read(len(start)) == start
        except OSError:
            return False

    return proof


_TF_EVENT_VERSION = b"brain.Event:"  # the file_version of the first event of every event file


def is_tensorboard_events(path: Path) -> bool:
    """Whether `path` is a TensorBoard event file: its first TFRecord (an 8-byte length, its
    4-byte CRC) holds an Event whose `file_version` (field 3) is `brain.Event:N`, as every
    writer's first record does; or a file cut inside that record (a full disk, a writer killed
    as it wrote it: `_is_first_record_start`), an empty one too (nothing in it to lose)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(12 + _MAX_HEADER_BYTES)
    except OSError:
        return False
    if len(head) < 12:
        return _is_first_record_start(head)
    (length,) = struct.unpack("<Q", head[:8])
    if length > _MAX_HEADER_BYTES:
        return False
    event = head[12 : 12 + length]
    return _TF_EVENT_VERSION in event or (len(event) < length and _is_first_record_start(head))


# The start of every writer's first Event: its wall_time (field 1, a double: 8 bytes of any
# value), then its file_version (field 3, a string of a one-byte length) `brain.Event:N`.
_EVENT_START = (b"\x09", *(None,) * 8, b"\x1a", None, *(bytes([c]) for c in _TF_EVENT_VERSION))


_FIRST_EVENT_MIN = len(_EVENT_START) + 1  # with a one-digit version: brain.Event:2


def _is_first_record_start(head: bytes) -> bool:
    """Whether `head` (all a file holds, or all of it up to the end of its first record) is a
    start of the first record an event file writer writes, however short: a length of one
    byte, that length's masked CRC32C, and an Event beginning as every writer's does
    (`_EVENT_START`). Nothing else begins so (a CSV, a text, an image, another format):
    a user's file is not taken for one."""
    if not head:
        return True
    # A first record is short: wall_time and file_version (24 bytes), a writer's name (72): its
    # length, little-endian, is one byte and zeros.
    if head[0] < _FIRST_EVENT_MIN or any(head[1:8]):
        return False
    length = head[0]
    if not struct.pack("<I", _masked_crc32c(head[:8])).startswith(head[8:12]):
        return False
    event = head[12 : 12 + length]
    for index, (byte, expected) in enumerate(zip(event, _EVENT_START, strict=False)):
        if index == 10:  # the length of file_version: `brain.Event:` and a version
            if not len(_TF_EVENT_VERSION) < byte < 0x80:
                return False
        elif expected is not None and bytes([byte]) != expected:
            return False
    return True


def _crc32c_table() -> list[int]:
    table = []
    for value in range(256):
        for _ in range(8):
            value = (value >> 1) ^ (0x82F63B78 if value & 1 else 0)
        table.append(value)
    return table


_CRC32C = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum of `data`: CRC32C (Castagnoli), rotated and offset ("masked")."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def is_chrome_trace(path: Path) -> bool:
    """Whether `path` is a trace as torch.profiler's Kineto writes it (`export_chrome_trace`):
    a JSON object whose first key is `schemaVersion`; or, from a torch built without Kineto,
    the autograd profiler's array of events (each `{"name": ...`, or none)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return False
    body = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if body.startswith(b"["):
        events = body[1:].lstrip()
        return events.startswith(b"]") or events.startswith(b'{"name": ')
    return body.startswith(b"{") and body[1:].lstrip().startswith(b'"schemaVersion"')


_TAR_BLOCK = 512


def tar_by(owner: str) -> Callable[[Path], bool]:
    """The proof of a tar torchkit writes: a ustar header (past a PAX header of its own)
    whose user name is `owner`, as every member's is; or an archive of no member (its end
    blocks only)."""
    name = owner.encode("utf-8")

    def proof(path: Path) -> bool:
        try:
            with open(path, "rb") as handle:
                for _ in range(2):  # a PAX header ('x', 'g') before the first member
                    block = handle.read(_TAR_BLOCK)
                    if len(block) < _TAR_BLOCK or block[257:262] != b"ustar":
                        return len(block) == _TAR_BLOCK and block == bytes(_TAR_BLOCK)
                    if block[156:157] not in (b"x", b"g"):
                        return block[265:297].rstrip(b"\0") == name
                    size = int(block[124:136].rstrip(b"\0 ") or b"0", 8)
                    handle.seek(-(-size // _TAR_BLOCK) * _TAR_BLOCK, 1)
        except (OSError, ValueError):
            return False
        return False

    return proof


def is_npy(path: Path) -> bool:
    """Whether `path` is a NumPy `.npy` file: its magic `\\x93NUMPY` and a version."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError:
        return False
    return head[:6] == b"\x93NUMPY" and len(head) == 8


def is_torch_save(path: Path) -> bool:
    """Whether `path` is a file `torch.save` wrote: a zip whose first record is its
    `ARCHIVE/data.pkl`."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(30 + 256)
    except OSError:
        return False
    if head[:4] != b"PK\x03\x04" or len(head) < 30:
        return False
    (length,) = struct.unpack("<H", head[26:28])
    return head[30 : 30 + length].endswith(b"/data.pkl")


_SAFETENSORS_HEADER_LIMIT = 1 << 20  # a header of a few tensors: a few hundred bytes


def is_safetensors(path: Path) -> bool:
    """Whether `path` is a `.safetensors` file: a little-endian u64 length, then a JSON object
    of that length whose entries (but `__metadata__`) each give a tensor's dtype, shape and
    data offsets."""
    import json

    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return False
            (length,) = struct.unpack("<Q", head)
            if not 2 <= length <= _SAFETENSORS_HEADER_LIMIT:
                return False
            header = json.loads(handle.read(length))
    except (OSError, ValueError):
        return False
    if not isinstance(header, dict):
        return False
    tensors = [value for key, value in header.items() if key != "__metadata__"]
    return all(
        isinstance(value, dict) and {"dtype", "shape", "data_offsets"} <= value.keys()
        for value in tensors
    )


# The image format of each extension torchkit writes images under (`convert tensor`).
_IMAGE_FORMATS = {
    ".png": "PNG",
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".bmp": "BMP",
    ".webp": "WebP",
    ".tif": "TIFF",
    ".tiff": "TIFF",
}
_FILE_PROOFS: dict[str, Callable[[Path], bool]] = {
    ".npy": is_npy,
    ".pt": is_torch_save,
    ".pth": is_torch_save,
    ".safetensors": is_safetensors,
}


def of_its_format(path: Path) -> bool:
    """Whether `path` is a file of the format its extension names (in any case): an image's
    magic, a .npy, a torch.save zip, a safetensors header. Nothing shows which program wrote
    it: the proof of a file torchkit writes in another program's format, nothing of its own."""
    extension = path.suffix.lower()
    if extension in _FILE_PROOFS:
        return _FILE_PROOFS[extension](path)
    expected = _IMAGE_FORMATS.get(extension)
    if expected is None:
        return False
    try:
        with open(path, "rb") as handle:
            return image_format(handle.read(HEAD_BYTES)) == expected
    except OSError:
        return False
