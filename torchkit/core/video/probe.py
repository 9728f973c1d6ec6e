"""Video metadata (size, frames, fps, duration, codec, container) read with OpenCV, many files at
once; exact frame counting by decoding; Temporal Segment Network (TSN) frame sampling.

OpenCV is imported inside functions only, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import stat
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkit.core.data.image_files import opened_image
from torchkit.core.io.errors import InputError, OutputWriteError, UsageError, first_line
from torchkit.core.io.files import STDIN, atomic_write_bytes, read_path_list
from torchkit.core.io.outputs import InputPath, OutputFolder, check_output_file, write_error
from torchkit.core.io.progress import Progress
from torchkit.core.runtime.cpus import usable_cpus

logger = logging.getLogger("torchkit")

VIDEO_EXTENSIONS = frozenset(
    {
        ".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".flv", ".wmv", ".asf", ".mpg", ".mpeg",
        ".m2v", ".ts", ".mts", ".m2ts", ".3gp", ".3g2", ".ogv", ".mxf", ".vob", ".dv", ".y4m",
    }
)  # fmt: skip
SAMPLE_MODES = ("test", "train")
STATUSES = ("ok", "truncated", "unreadable")
# The frames the cheap end-of-file check decodes: it seeks to this many frames before the last
# one the header declares and reads on (seeking lands on a key frame and decodes forward, so
# this costs at most one group of pictures).
TAIL_FRAMES = 4
TS_PACKET = 188
SNIFF_BYTES = 512  # enough for an EBML DocType and two MPEG-TS packet starts

# Upper bounds of the numeric options: a larger value is a usage error (exit 2), so that no value
# makes the command run out of memory. The K frame indices of every video are part of its row
# (table, CSV, JSON), so they are held in memory and printed: 10,000 is far beyond any TSN
# setting (3 to 32 segments) and still a dense sampling of a long clip, with rows of tens of KiB.
# Frames themselves are streamed: decoded one at a time, written and dropped, so neither a long
# video nor a large K holds more than one frame. Each worker thread holds an open decoder (FFmpeg
# starts its own threads for it): 64 at once is more than a disk or the cores can feed. --seed
# is any whole number of 0 or more (NumPy's seeds), of any size: it is hashed, not allocated.
MAX_SEGMENTS = 10_000
MAX_WORKERS = 64
FRAME_FILES = ("*_[0-9][0-9][0-9][0-9][0-9][0-9]*.png",)  # <video>_<frame, 6+ digits>.png


class _Stopped(Exception):
    """The run is being stopped (Ctrl-C, SIGTERM, a write error): a worker drops its video."""


class _PastTheEnd(InputError):
    """A sampled frame the header declares does not decode: the video ends early."""


@dataclass
class VideoInfo:
    """What is known about one video. `frames` is the count shown: `frames_decoded` when frames
    were counted by decoding (`frames_source == "decoded"`), else the container's estimate.
    `status` is `ok`, `truncated` (the file ends before what its container structure or its
    frame count declares) or `unreadable`; `error` says why when it is not `ok`."""

    path: str
    size_bytes: int | None = None
    width: int | None = None
    height: int | None = None
    frames: int | None = None
    frames_source: str | None = None
    frames_header: int | None = None
    frames_decoded: int | None = None
    fps: float | None = None
    duration_s: float | None = None
    codec: str | None = None
    container: str | None = None
    frame_indices: list[int] | None = None
    frame_files: list[str] | None = None
    status: str = "ok"
    error: str | None = None

    def fail(self, message: str, status: str = "unreadable") -> None:
        """Mark the video as not ok: `truncated` (it ends before what its container or header
        declares) or `unreadable` (anything else that stops it being read)."""
        self.status, self.error = status, message

    @property
    def frames_differ(self) -> bool:
        return (
            self.frames_decoded is not None
            and self.frames_header is not None
            and self.frames_decoded != self.frames_header
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size_bytes": self.size_bytes,
            "width": self.width,
            "height": self.height,
            "frames": self.frames,
            "frames_source": self.frames_source,
            "frames_header": self.frames_header,
            "frames_decoded": self.frames_decoded,
            "fps": self.fps,
            "duration_s": self.duration_s,
            "codec": self.codec,
            "container": self.container,
            "frame_indices": self.frame_indices,
            "frame_files": self.frame_files,
            "status": self.status,
            "error": self.error,
        }


@dataclass
class SegmentOptions:
    """TSN sampling for each video, and where to write the sampled frames (if anywhere)."""

    num_segments: int
    mode: str = "test"
    seed: int = 0
    extract_dir: Path | None = None
    names: dict[str, str] = field(default_factory=dict)  # video path -> file name prefix


# --- TSN sampling -------------------------------------------------------------------------------


def tsn_frame_indices(
    num_frames: int, num_segments: int, mode: str = "test", rng: Any = None
) -> list[int]:
    """The `num_segments` sorted frame indices Temporal Segment Networks sample from a video.

    The frames are cut into K segments as equal as integers allow (segment i holds frames
    `i*n//K` up to `(i+1)*n//K - 1`, so no frame is left out). Test mode takes the middle frame of
    each segment; train mode one uniformly random frame of each (`rng`: a seed or a
    `numpy.random.Generator`). With fewer frames than segments, every frame is taken once and the
    rest repeated in order (0, 1, 2, 0, 1, ...), sorted, in both modes: exactly K indices.
    """
    if isinstance(num_segments, bool) or not isinstance(num_segments, int) or num_segments < 1:
        raise UsageError(f"the number of segments must be a positive integer, not {num_segments}")
    if num_segments > MAX_SEGMENTS:
        raise UsageError(
            f"{num_segments} segments are more than {MAX_SEGMENTS:,}",
            f"sample at most {MAX_SEGMENTS:,} frames per video",
        )
    if mode not in SAMPLE_MODES:
        raise UsageError(f"unknown sample mode {mode!r}", "use 'test' or 'train'")
    if num_frames is None or num_frames < 1:
        raise InputError(
            "the video has no frames to sample",
            "check the file, or pass --exact to count frames by decoding",
        )
    n, k = int(num_frames), num_segments
    if n < k:
        return sorted(i % n for i in range(k))
    bounds = [i * n // k for i in range(k + 1)]
    lengths = [bounds[i + 1] - bounds[i] for i in range(k)]
    if mode == "test":
        # The upper middle for even lengths, as in the TSN reference (offset (n / K) // 2).
        return [bounds[i] + lengths[i] // 2 for i in range(k)]
    import numpy as np

    generator = np.random.default_rng(rng)
    offsets = generator.integers(0, lengths)
    return [bounds[i] + int(offsets[i]) for i in range(k)]


# --- finding videos -----------------------------------------------------------------------------


def is_video_file(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in VIDEO_EXTENSIONS


def _is_visible_video(path: Path, root: Path) -> bool:
    # Hidden files are not videos to report: macOS leaves "._clip.mp4" resource forks beside
    # every clip on shared drives, and tools keep caches in dot-folders.
    hidden = any(part.startswith(".") for part in path.relative_to(root).parts)
    return not hidden and is_video_file(path) and path.is_file()


def find_videos(
    paths: Iterable[str | os.PathLike], stdin: Iterable[str] | None = None
) -> list[Path]:
    """Files as given (whatever their extension) and video files found recursively in folders
    (hidden ones left out), sorted within each folder, each once, in the order given; `-`: the
    files `stdin` lists, one per line (one that is gone is a row with its error, as in predict)."""
    found: list[Path] = []
    seen: set[str] = set()
    named = [Path(p) for p in paths]
    if not named:
        raise UsageError("no video files or folders given", "pass one or more paths")
    if [os.fspath(p) for p in paths].count(STDIN) > 1:
        raise UsageError("- (stdin) given more than once")
    for path in named:
        if os.fspath(path) == STDIN:
            candidates = [Path(p) for p in read_path_list(stdin, "video")]
        elif not path.exists():
            raise InputError(f"path not found: {path}", "check the path")
        elif path.is_dir():
            videos = sorted(
                (p for p in path.rglob("*") if _is_visible_video(p, path)),
                key=lambda p: p.as_posix(),
            )
            if not videos:
                if len(named) == 1:
                    raise InputError(
                        f"no video files in {path}",
                        f"looked for {', '.join(sorted(VIDEO_EXTENSIONS))}",
                    )
                logger.warning("no video files in %s", path)
            candidates = videos
        else:
            candidates = [path]
        for candidate in candidates:
            key = os.path.normcase(os.path.abspath(candidate))
            if key not in seen:
                seen.add(key)
                found.append(candidate)
    if not found:
        raise InputError("no video files found in the given folders", "check the paths")
    return found


# --- reading one video --------------------------------------------------------------------------


def sniff_container(head: bytes) -> str | None:
    """The container format from a file's first bytes (None when it is not one we recognise)."""
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "avi"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand == b"qt  ":
            return "mov"
        return "3gp" if brand.startswith(b"3g") else "mp4"
    if head[4:8] in (b"moov", b"mdat", b"wide", b"free"):
        return "mov"
    if head[:4] == b"\x1a\x45\xdf\xa3":  # EBML: Matroska, or WebM when the DocType says so
        return "webm" if b"webm" in head else "mkv"
    if head[:3] == b"FLV":
        return "flv"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x00\x00\x01\xba":
        return "mpeg-ps"
    if head[:4] == b"\x00\x00\x01\xb3":
        return "mpeg-video"
    if head[:1] == b"\x47" and head[188:189] == b"\x47":  # sync bytes of two 188-byte packets
        return "mpeg-ts"
    if head[:8] == b"\x30\x26\xb2\x75\x8e\x66\xcf\x11":
        return "asf"
    if head[:9] == b"YUV4MPEG2":
        return "y4m"
    if head[:4] == b"\x06\x0e\x2b\x34":
        return "mxf"
    return None


_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)


def still_image_format(path: str | os.PathLike, head: bytes) -> str | None:
    """The format ("PNG", "JPEG", "GIF"...) when the file is a still image (one frame), which
    FFmpeg would otherwise open as a one-frame "video" at a made-up 25 fps; None for anything
    else, an animated GIF, PNG or WebP included (those are left to FFmpeg)."""
    kind = next((name for magic, name in _IMAGE_MAGIC if head.startswith(magic)), None)
    if kind is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        kind = "WebP"
    if kind is None:
        return None
    try:
        with opened_image(path) as image:
            frames = int(getattr(image, "n_frames", 1) or 1)
    except Exception:  # the magic bytes, but not an image PIL reads: leave it to FFmpeg
        return None
    return kind if frames <= 1 else None


def fourcc_to_text(code: float) -> str | None:
    """OpenCV's CAP_PROP_FOURCC number as its four characters (None for 0 or unprintable)."""
    number = int(code) if code and math.isfinite(code) else 0
    if number <= 0:
        return None
    text = "".join(chr((number >> (8 * i)) & 0xFF) for i in range(4))
    text = text.strip("\x00 ")
    return text if text and text.isprintable() and text.isascii() else None


def _import_cv2():
    # FFmpeg's own log lines ("moov atom not found") would litter stderr for every broken file;
    # the error column says it instead. Users can still set these variables themselves.
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
    os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")
    import cv2

    return cv2


def _positive_int(value: float) -> int | None:
    return int(round(value)) if value and math.isfinite(value) and value > 0 else None


def _describe_unopenable(size: int, container: str | None) -> str:
    if size == 0:
        return "empty file"
    if container is None:
        return "not a video file"
    return f"truncated or corrupt {container} file"


# --- truncation ---------------------------------------------------------------------------------
#
# A copy cut short (a download or transfer that stopped, a disk that filled up) often still opens:
# its header says how many frames there are and decoding starts fine. Two cheap checks tell it
# from a whole file. (1) Container structure: MP4/MOV boxes, AVI RIFF chunks, the Matroska/WebM
# segment and MPEG-TS packets carry their sizes, so reading a few bytes at a few offsets says
# how long the file must be; a shorter file ends mid-stream. (2) Where the format records no
# sizes (FLV, Ogg, MPEG-PS, a live recording): decoding at the end, the last frames the header
# declares sought and decoded (`--exact` decodes them all anyway).

_MAX_BOXES = 100_000  # a fragmented MP4 has two boxes per fragment; a bound for a corrupt one


def declared_size(path: str | os.PathLike, container: str | None, size: int) -> int | None:
    """How many bytes the container structure of a `size`-byte file says it holds, for the
    formats that record it (MP4/MOV/3GP, AVI, Matroska/WebM, MPEG-TS); None when the format
    does not say or the structure cannot be read (so nothing is claimed about the file)."""
    if container == "mpeg-ts":
        return -(-size // TS_PACKET) * TS_PACKET  # a partial last packet ends mid-stream
    readers = {
        "mp4": _iso_boxes_end,
        "mov": _iso_boxes_end,
        "3gp": _iso_boxes_end,
        "avi": _riff_chunks_end,
        "mkv": _ebml_segment_end,
        "webm": _ebml_segment_end,
    }
    reader = readers.get(container or "")
    if reader is None:
        return None
    try:
        with open(path, "rb") as handle:
            return reader(handle, size)
    except OSError:
        return None


def _iso_boxes_end(handle, size: int) -> int | None:
    """The end of the last top-level box of an ISO base media file (MP4, MOV, 3GP)."""
    offset = 0
    for _ in range(_MAX_BOXES):
        if offset >= size:
            return offset
        handle.seek(offset)
        header = handle.read(16)
        if len(header) < 8:  # the file ends inside a box header, or a few padding zeros
            return offset if not header.strip(b"\x00") else offset + 8
        length = int.from_bytes(header[:4], "big")
        kind = header[4:8]
        if not (kind.isascii() and all(32 <= byte < 127 for byte in kind)):
            return None  # not a box: trailing data we cannot judge
        if length == 1:  # a 64-bit size follows the type
            if len(header) < 16:
                return offset + 16
            length = int.from_bytes(header[8:16], "big")
            if length < 16:
                return None
        elif length == 0:  # the last box runs to the end of the file
            return size
        elif length < 8:
            return None
        offset += length
    return None


def _riff_chunks_end(handle, size: int) -> int | None:
    """The end of the last RIFF chunk of an AVI (OpenDML files over 1 GiB hold several)."""
    offset = 0
    for _ in range(_MAX_BOXES):
        if offset >= size:
            return offset
        handle.seek(offset)
        header = handle.read(12)
        if len(header) < 12:
            return offset + 12
        if header[:4] != b"RIFF" or header[8:12] not in (b"AVI ", b"AVIX"):
            return None if offset == 0 else offset  # junk after the last chunk is not ours
        length = int.from_bytes(header[4:8], "little")
        if length == 0:  # a writer that never went back to fill the size in
            return None
        offset += 8 + length + (length & 1)
    return None


def _ebml_number(data: bytes, position: int, *, keep_marker: bool) -> tuple[int, int] | None:
    """An EBML variable-length number at `position`: (value, its length); an element ID keeps
    its length marker bit, a size drops it. A size of all ones (unknown) comes back as -1."""
    if position >= len(data) or data[position] == 0:
        return None
    first = data[position]
    length = 9 - first.bit_length()
    if position + length > len(data):
        return None
    value = int.from_bytes(data[position : position + length], "big")
    if keep_marker:
        return value, length
    value &= (1 << (7 * length)) - 1
    return (-1 if value == (1 << (7 * length)) - 1 else value), length


def _ebml_segment_end(handle, size: int) -> int | None:
    """The end of the Segment of a Matroska/WebM file (None when it is written as unknown, as
    live recordings do)."""
    handle.seek(0)
    head = handle.read(4096)
    position = 0
    for _ in range(8):  # the EBML header, then perhaps Void elements, then the Segment
        element = _ebml_number(head, position, keep_marker=True)
        if element is None:
            return None
        element_id, id_length = element
        length = _ebml_number(head, position + id_length, keep_marker=False)
        if length is None or length[0] < 0:
            return None
        data_start = position + id_length + length[1]
        if element_id == 0x18538067:  # Segment
            return data_start + length[0]
        position = data_start + length[0]
    return None


def _shortfall(info: VideoInfo, declared: int | None) -> str | None:
    if declared is None or info.size_bytes is None or declared <= info.size_bytes:
        return None
    return (
        f"truncated: the file holds {info.size_bytes:,} of the {declared:,} bytes its "
        f"{info.container} structure declares"
    )


def _frame_slack(header: int) -> int:
    """Frames a count may fall short of the header by without calling the file truncated: a
    header count can be an estimate (duration x fps) or count a frame a decoder drops. A real
    cut loses more, and the container check catches the small ones where the format says."""
    return max(1, header // 100)


def _frames_short(decoded: int, header: int | None) -> str | None:
    if header is None or decoded >= header - _frame_slack(header):
        return None
    return f"truncated: {decoded:,} of the {header:,} frames its header declares decode"


def _tail_decodes(cv2, capture, header: int, decoded: int) -> str | None:
    """Seek to the last frames the header declares and decode them (`decoded` frames have been
    read already); a message if they are not there. Only the end is decoded: one group of
    pictures at most, whatever the length of the video."""
    reached = decoded
    start = header - TAIL_FRAMES
    if start > decoded:
        if not capture.set(cv2.CAP_PROP_POS_FRAMES, start):
            return None  # this file cannot seek by frame: say nothing rather than guess
        reached = start
    while reached < header and capture.grab():
        reached += 1
    if reached >= header - _frame_slack(header):
        return None
    return (
        f"truncated: frame {reached + 1:,} of the {header:,} its header declares does not "
        "decode (--exact counts those that do)"
    )


def _open_capture(cv2, path: Path):
    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    if not capture.isOpened():
        capture.release()
        return None
    return capture


def count_frames(capture, stop: threading.Event | None = None) -> int:
    """Frames counted by decoding them (grab without retrieving, so no colour conversion); one
    frame at a time, so a video of any length counts in constant memory."""
    count = 0
    while capture.grab():
        count += 1
        if stop is not None and count % 64 == 0 and stop.is_set():
            raise _Stopped()
    return count


def probe_video(
    path: str | os.PathLike,
    *,
    exact: bool = False,
    decode_check: bool = True,
    stop: threading.Event | None = None,
) -> VideoInfo:
    """The metadata of one video. Failures become `VideoInfo.status` and `.error`, never
    exceptions.

    The sizes the container records are checked against the file's always (a few bytes read):
    a shorter file is `truncated`. `decode_check` decodes the first frame, which tells a
    readable video from one whose header is intact but whose frames are missing or corrupt, and,
    for formats that record no sizes, the last frames the header declares, which tells a whole
    file from a copy cut short; it about doubles the time per file. `exact` decodes every frame
    anyway; for formats that record no sizes, a count short of the header's means truncated."""
    info = VideoInfo(path=str(path))
    try:
        _probe_into(info, Path(path), exact, decode_check, stop)
    except _Stopped:
        raise
    except Exception as error:  # one bad file must not stop the others
        info.fail(_error_text(error))
    return info


def _error_text(error: BaseException) -> str:
    if isinstance(error, PermissionError):
        return "permission denied"
    if isinstance(error, OSError):
        return f"cannot read: {error.strerror or error}"
    return first_line(error)


def _probe_into(
    info: VideoInfo, path: Path, exact: bool, decode_check: bool, stop: threading.Event | None
) -> None:
    cv2 = _import_cv2()
    status = path.stat()
    mode = status.st_mode
    if not stat.S_ISREG(mode):  # opening a FIFO waits for a writer: forever
        kind = (
            "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        )
        info.fail(f"not a regular file ({kind})")
        return
    info.size_bytes = status.st_size
    with open(path, "rb") as handle:
        head = handle.read(SNIFF_BYTES)
    sniffed = sniff_container(head)
    info.container = sniffed
    if info.size_bytes == 0:
        info.fail(_describe_unopenable(0, sniffed))
        return
    image = None if sniffed else still_image_format(path, head)
    if image is not None:
        info.fail(f"a still image ({image}), not a video")
        return
    # Read before FFmpeg opens the file: a cut MP4 whose index was at its end cannot be opened,
    # and this still tells a truncated copy from a corrupt file.
    declared = declared_size(path, sniffed, info.size_bytes)
    cut = _shortfall(info, declared)
    # Where the container's sizes say the file is whole, frames short of the header's count
    # are an estimate or a decoder's quirk, not a cut: decoding is the evidence only where the
    # sizes say nothing (and the end is not sought where they do: no time spent).
    judge_by_frames = declared is None
    capture = _open_capture(cv2, path)
    if capture is None:
        if cut:
            info.fail(cut, "truncated")
        else:
            info.fail(_describe_unopenable(info.size_bytes, sniffed))
        return
    if info.container is None:  # FFmpeg knows a format we do not sniff: trust the name
        info.container = path.suffix.lower().lstrip(".") or None
    try:
        width = _positive_int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = _positive_int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
        info.width, info.height = width, height
        fps = capture.get(cv2.CAP_PROP_FPS)
        info.fps = float(fps) if fps and math.isfinite(fps) and fps > 0 else None
        info.frames_header = _positive_int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        info.codec = fourcc_to_text(capture.get(cv2.CAP_PROP_FOURCC))
        if width is None or height is None:
            info.fail(cut or "no video stream", "truncated" if cut else "unreadable")
            return
        if exact:
            info.frames_decoded = count_frames(capture, stop)
            info.frames, info.frames_source = info.frames_decoded, "decoded"
            if info.frames_decoded == 0 and not cut:
                info.fail("no frame decodes (truncated or corrupt)")
            elif not cut and judge_by_frames:
                cut = _frames_short(info.frames_decoded, info.frames_header)
        else:
            info.frames, info.frames_source = info.frames_header, "header"
            # Decoding the first frame tells a readable video from a header with broken data,
            # decoding the last ones a whole file from one that stops early.
            if decode_check and not cut and not capture.grab():
                info.fail("no frame decodes (truncated or corrupt)")
            elif decode_check and judge_by_frames and info.frames_header:
                cut = _tail_decodes(cv2, capture, info.frames_header, decoded=1)
    finally:
        capture.release()
    if info.frames is not None and info.fps:
        info.duration_s = info.frames / info.fps
    if cut:
        info.fail(cut, "truncated")


# --- sampled frames -----------------------------------------------------------------------------


def frame_file_name(prefix: str, index: int) -> str:
    return f"{prefix}_{index:06d}.png"


def extract_frames(
    path: str | os.PathLike,
    indices: Sequence[int],
    out_dir: Path,
    prefix: str,
    stop: threading.Event | None = None,
) -> list[Path]:
    """Decode `path` from the start and write the frames at `indices` (sorted, repeats allowed)
    as PNG files `<prefix>_<index>.png` in `out_dir`; one path per index, in order.

    Frames are read sequentially (grab, retrieve only the wanted ones) because seeking by frame
    number is inexact for many codecs; one frame is in memory at a time. `stop` set ends it
    early (`_Stopped`)."""
    cv2 = _import_cv2()
    wanted = sorted(set(indices))
    written: dict[int, Path] = {}
    capture = _open_capture(cv2, Path(path))
    if capture is None:
        raise InputError(f"cannot open {path} to extract frames")
    try:
        position = 0
        for index in wanted:
            while position <= index:
                if stop is not None and position % 64 == 0 and stop.is_set():
                    raise _Stopped()
                if not capture.grab():
                    raise _PastTheEnd(
                        f"only {position} frames could be decoded, frame {index} is past the end",
                        "the frame count in the header is wrong; pass --exact",
                    )
                position += 1
            ok, frame = capture.retrieve()
            if not ok or frame is None:
                raise InputError(f"frame {index} could not be decoded")
            ok, encoded = cv2.imencode(".png", frame)
            if not ok:
                raise InputError(f"frame {index} could not be encoded as PNG")
            target = out_dir / frame_file_name(prefix, index)
            atomic_write_bytes(target, encoded.tobytes())
            written[index] = target
    finally:
        capture.release()
    return [written[index] for index in indices]


def frame_name_prefixes(videos: Sequence[Path]) -> dict[str, str]:
    """A distinct file-name prefix per video: its stem, with -2, -3... for repeated stems."""
    prefixes: dict[str, str] = {}
    used: set[str] = set()
    for video in videos:
        stem = video.stem or "video"
        prefix, n = stem, 1
        while prefix in used:
            n += 1
            prefix = f"{stem}-{n}"
        used.add(prefix)
        prefixes[str(video)] = prefix
    return prefixes


def _sample_into(
    info: VideoInfo,
    options: SegmentOptions,
    rng: Any,
    frames_folder: _FramesFolder | None = None,
    stop: threading.Event | None = None,
) -> None:
    if info.frames is None:
        info.fail("the container does not say how many frames it holds (pass --exact)")
        return
    try:
        info.frame_indices = tsn_frame_indices(info.frames, options.num_segments, options.mode, rng)
        if frames_folder is not None:
            folder = frames_folder.begin()  # only now, after every check: the first frame
            files = extract_frames(
                info.path, info.frame_indices, folder, options.names[info.path], stop
            )
            info.frame_files = [str(options.extract_dir / f.name) for f in files]
            frames_folder.wrote(len(files))
    except _Stopped:
        raise
    except OutputWriteError as error:
        # A full disk is the output's error, not this video's. The frames go to a hidden
        # temporary folder: the error names the folder that was asked for.
        raise write_error(options.extract_dir, error.__cause__ or error) from error
    except _PastTheEnd as error:
        info.fail(f"truncated: {error.message} ({error.hint})", "truncated")
    except Exception as error:
        info.fail(_error_text(error))


class _FramesFolder:
    """The `--extract-frames` folder, begun by the first worker thread about to write a frame:
    frames go to a hidden temporary folder beside it that replaces it (and an old one, with
    --force) only at the end, so it never holds a half-written set of frames."""

    def __init__(self, folder: OutputFolder) -> None:
        self.folder = folder
        self.frames = 0
        self._lock = threading.Lock()

    def begin(self) -> Path:
        with self._lock:
            return self.folder.begin()

    def wrote(self, count: int) -> None:
        with self._lock:
            self.frames += count


# --- many videos --------------------------------------------------------------------------------


def video_inputs(
    paths: Iterable[str | os.PathLike], videos: Iterable[str | os.PathLike] = ()
) -> list[InputPath]:
    """What video-info reads: every path given (a folder: its whole tree) and every video found
    (a link in a folder: the video it points to). No output may be, hold or lie in one."""
    inputs = [InputPath.of(p, "video folder" if os.path.isdir(p) else "video") for p in paths]
    return inputs + [InputPath.of(v, "video") for v in videos]


def default_video_workers() -> int:
    """Threads: OpenCV releases the GIL while it opens and decodes, and reading headers waits on
    the disk more than on the CPU, so a few more threads than cores pay off."""
    return max(1, min(16, 2 * usable_cpus()))


def inspect_videos(
    paths: Sequence[str | os.PathLike],
    *,
    exact: bool = False,
    decode_check: bool = True,
    segments: int | None = None,
    sample_mode: str = "test",
    seed: int = 0,
    extract_dir: str | os.PathLike | None = None,
    force: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
    report: str | os.PathLike | None = None,
    stdin: Iterable[str] | None = None,
) -> list[VideoInfo]:
    """Metadata of every video in `paths` (files, or folders searched recursively), in order.

    `exact` counts frames by decoding; `decode_check` decodes the first (see `probe_video`).
    `segments` also samples TSN frame indices from each video's frame count (train mode draws
    from an independent stream per video, seeded by `seed` and the video's position, so results
    do not depend on the thread schedule); `extract_dir` writes those frames as PNG (through
    `core.outputs`: never a video or a folder of them, `--force` only over an earlier frames
    folder, locked, filled beside it and put in place at the end: the old one stays if the run
    fails, is stopped or writes no frame). `report` is the `-o` file the caller will write:
    checked with the rest, before any work. Unreadable videos come back with `error` set. A
    path `-` stands for the files `stdin` lists.
    """
    if segments is not None and not 1 <= segments <= MAX_SEGMENTS:
        raise UsageError(
            f"--segments must be between 1 and {MAX_SEGMENTS:,}, not {segments}",
            "every video's row holds its K frame indices",
        )
    if workers is not None and not 0 <= workers <= MAX_WORKERS:
        raise UsageError(
            f"--workers must be between 0 and {MAX_WORKERS}, not {workers}",
            "more videos at once than a disk or the cores can feed only costs memory",
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"--seed must be a whole number of 0 or more, not {seed}")
    if sample_mode not in SAMPLE_MODES:
        raise UsageError(f"unknown sample mode {sample_mode!r}", "use 'test' or 'train'")
    if extract_dir is not None and segments is None:
        raise UsageError("--extract-frames needs --segments K", "say how many frames to sample")
    videos = find_videos(paths, stdin)
    inputs = video_inputs([p for p in paths if os.fspath(p) != STDIN], videos)
    if report is not None:
        check_output_file(report, force, inputs)
    with contextlib.ExitStack() as stack:
        frames_folder = None
        if segments is not None and extract_dir is not None:
            out = OutputFolder(
                extract_dir,
                command="video-info",
                force=force,
                inputs=inputs,
                known_files=FRAME_FILES,
                what="frames folder",
                atomic=True,  # filled as a hidden temporary folder, in place at once at the end
            )
            stack.callback(out.release)
            frames_folder = _FramesFolder(out)
        results = _inspect(
            videos, exact, decode_check, segments, sample_mode, seed, frames_folder, workers,
            progress,
        )  # fmt: skip
        if frames_folder is not None:
            # Keep the new frames (they replace the old folder) once there are any; with none
            # written, the old frames folder stays as if nothing had run.
            if frames_folder.frames:
                frames_folder.folder.keep()
            else:
                frames_folder.folder.abandon()
        return results


def _inspect(
    videos: list[Path],
    exact: bool,
    decode_check: bool,
    segments: int | None,
    sample_mode: str,
    seed: int,
    frames_folder: _FramesFolder | None,
    workers: int | None,
    progress: Progress | None,
) -> list[VideoInfo]:
    options = None
    if segments is not None:
        options = SegmentOptions(segments, sample_mode, seed)
        if frames_folder is not None:
            options.extract_dir = frames_folder.folder.final
            options.names = frame_name_prefixes(videos)
    streams = _per_video_seeds(seed, len(videos)) if options and sample_mode == "train" else None
    stop = threading.Event()

    def work(position: int) -> VideoInfo:
        if stop.is_set():
            raise _Stopped()
        info = probe_video(videos[position], exact=exact, decode_check=decode_check, stop=stop)
        if options is not None and info.status == "ok":
            _sample_into(info, options, streams[position] if streams else None, frames_folder, stop)
        return info

    try:
        return _run_all(work, len(videos), workers, progress, stop)
    except BaseException:
        if frames_folder is not None:
            frames_folder.folder.abandon()  # this run's frames removed, the old folder stays
        raise


def _run_all(
    work, total: int, workers: int | None, progress: Progress | None, stop: threading.Event
) -> list[VideoInfo]:
    if progress:
        progress(0, total)
    threads = default_video_workers() if workers is None else workers
    results: list[VideoInfo] = []
    if threads <= 1 or total == 1:
        for position in range(total):
            results.append(work(position))
            if progress:
                progress(position + 1, total)
        return results
    pool = ThreadPoolExecutor(max_workers=min(threads, total), thread_name_prefix="video-info")
    try:
        # map keeps the input order; results arrive in order, which is what the table shows.
        for done, info in enumerate(pool.map(work, range(total)), start=1):
            results.append(info)
            if progress:
                progress(done, total)
    except BaseException:
        stop.set()  # the workers still decoding stop at their next frames
        raise
    finally:
        # On Ctrl-C, drop the videos not started yet instead of reading them all first.
        pool.shutdown(wait=True, cancel_futures=True)
    return results


def _per_video_seeds(seed: int, count: int) -> list[Any]:
    import numpy as np

    return list(np.random.SeedSequence(seed).spawn(count))
