"""Finding video files, telling their container from their first bytes, and the size their
container structure declares (which tells a copy cut short from a whole file), read by each
format's module (avi, mp4, matroska, asf, raw, streams)."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from torchkit.core.data.image_files import opened_image
from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.io.files import STDIN, read_path_list, tree_entries
from torchkit.core.io.image_magic import image_format
from torchkit.core.video.asf import asf_objects_end
from torchkit.core.video.avi import avi_fourcc, riff_chunks_end
from torchkit.core.video.matroska import ebml_segment_end
from torchkit.core.video.mp4 import iso_boxes_end, iso_fourcc
from torchkit.core.video.raw import dv_frames_end, y4m_frames_end
from torchkit.core.video.streams import (
    M2TS_PACKET,
    TS_PACKET,
    flv_tags_end,
    mpeg_ps_end,
    ogg_pages_end,
)

logger = logging.getLogger("torchkit")

VIDEO_EXTENSIONS = frozenset(
    {
        ".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".flv", ".wmv", ".asf", ".mpg", ".mpeg",
        ".m2v", ".ts", ".mts", ".m2ts", ".3gp", ".3g2", ".ogv", ".mxf", ".vob", ".dv", ".y4m",
        ".mjpeg", ".mjpg",
    }
)  # fmt: skip
SNIFF_BYTES = 512  # enough for an EBML DocType and two MPEG-TS packet starts


# --- finding videos -----------------------------------------------------------------------------


def is_video_file(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in VIDEO_EXTENSIONS


def _videos_in(folder: str | os.PathLike) -> list[str]:
    """The video files under `folder`, sorted by path. Hidden files and folders are left out:
    macOS leaves "._clip.mp4" resource forks beside every clip on shared drives, and tools keep
    caches in dot-folders. A link to a video counts, and so does a FIFO or a link to nothing
    named like one (a row with its error); links to folders are not followed. A folder in it
    that cannot be listed (permission denied) is named in a warning, as the data readers name
    one (it was passed over without a word); `folder` itself is an InputError."""
    from torchkit.core.data.sources.discovery import listing_error, warn_unlistable

    found = []
    unlistable: list[tuple[str, OSError]] = []
    for path, entry in tree_entries(folder, skip_hidden=True, unlistable=unlistable):
        try:
            # Named like a video and no folder: a FIFO or a link to nothing too, which is a
            # row saying what it is (never opened), as the data readers make it an unreadable
            # image, not left out without a word
            if os.path.splitext(entry.name)[1].lower() in VIDEO_EXTENSIONS and not entry.is_dir():
                found.append(path)
        except OSError:  # vanished while listing
            continue
    if unlistable and unlistable[0][0] == str(Path(folder)):  # the folder given
        reason = listing_error(unlistable[0][1])
        raise InputError(f"cannot list folder {folder}: {reason}", "make it readable")
    warn_unlistable(unlistable, folder, files="videos", strict_option=False)
    found.sort()
    return found


def find_videos(
    paths: Iterable[str | os.PathLike], stdin: Iterable[str] | None = None
) -> list[str]:
    """Files as given (whatever their extension) and video files found recursively in folders
    (hidden ones left out), sorted within each folder, each once, in the order given; `-`: the
    files `stdin` lists, one per line (one that is gone is a row with its error, as in predict).
    A file given or listed keeps its spelling (`./clip.mp4`, as `find .` prints it), which the
    rows echo as predict's do; a folder's videos are spelled as `tree_entries` spells them."""
    return list(find_named_videos(paths, stdin))


def find_named_videos(
    paths: Iterable[str | os.PathLike], stdin: Iterable[str] | None = None
) -> dict[str, str]:
    """`find_videos`' videos, in order, each with its name in the input it was found in
    (`input_name`): what seeds its train-mode sampling, whatever else is in the list."""
    found: dict[str, str] = {}
    seen: set[str] = set()
    named = [os.fspath(p) for p in paths]
    if not named:
        raise UsageError("no video files or folders given", "pass one or more paths")
    if named.count(STDIN) > 1:
        raise UsageError("- (stdin) given more than once")
    for path in named:
        folder = None
        if path == STDIN:
            candidates = read_path_list(stdin, "video")
        elif not os.path.exists(path) and not _link_loop(path):
            raise InputError(f"path not found: {path}", "check the path")
        elif os.path.isdir(path):
            videos = _videos_in(path)
            if not videos:
                if len(named) == 1:
                    raise InputError(
                        f"no video files in {path}",
                        f"looked for {', '.join(sorted(VIDEO_EXTENSIONS))}",
                    )
                logger.warning("no video files in %s", path)
            candidates, folder = videos, path
        else:
            candidates = [path]
        for candidate in candidates:
            key = video_key(candidate)
            if key not in seen:
                seen.add(key)
                found[candidate] = input_name(candidate, folder)
    if not found:
        raise InputError("no video files found in the given folders", "check the paths")
    return found


def _link_loop(path: str) -> bool:
    """Whether `path` is a symbolic link that leads back to itself (ELOOP): it exists, but no
    file is found through it. Named on the command line, it is a row with that error (as an
    unreadable file is), not `path not found`."""
    try:
        os.stat(path)
    except OSError as error:
        return error.errno == errno.ELOOP
    return False


def input_name(video: str, folder: str | None = None) -> str:
    """The name of `video` in the input it comes from: its path relative to the `folder` given
    that it was found in (`clips/a/v.mp4` in `clips/` is `a/v.mp4`, however `clips` is
    spelled), else its path as given or listed, `.` and `//` aside; `/`-separated."""
    if folder is not None:
        video = os.path.relpath(video, folder)
    return os.path.normpath(video).replace(os.sep, "/")


def video_key(path: str | os.PathLike) -> str:
    """What two names of one video share (the same file named twice is read once)."""
    return os.path.normcase(os.path.abspath(path))


# --- sniffing ----------------------------------------------------------------------------------


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
    if head[4:5] == b"\x47" and head[4 + M2TS_PACKET : 5 + M2TS_PACKET] == b"\x47":
        return "m2ts"  # the same sync bytes, 192 bytes apart after the first timestamp
    if head[:8] == b"\x30\x26\xb2\x75\x8e\x66\xcf\x11":
        return "asf"
    if head[:9] == b"YUV4MPEG2":
        return "y4m"
    if head[:4] == b"\x06\x0e\x2b\x34":
        return "mxf"
    if head[:3] == b"\x1f\x07\x00" and head[3:4] in (b"\x3f", b"\xbf"):
        return "dv"  # raw DV: the header block of its first frame (the top bit: 625/50 lines)
    # Animated images FFmpeg reads as videos (a GIF saved as .mp4 is common): their own names, as
    # the column says what the bytes are. Still ones are refused before (`still_image_format`).
    image = image_format(head)
    return image.lower() if image in ("GIF", "PNG", "WebP") else None


def declares_no_video(head: bytes, container: str | None) -> bool:
    """Whether a file's first bytes say it holds audio and no video (where FFmpeg then finds no
    video to open, the file is not damaged): an FLV header's flags with the audio bit alone, an
    MPEG-PS system header's video bound of 0 (after the first pack's header)."""
    if container == "flv":
        return len(head) > 4 and head[4] & 0x05 == 0x04
    if container == "mpeg-ps":
        at = head.find(b"\x00\x00\x01\xbb", 0, 32)  # the system header: bounds at 9 and 10
        return at >= 0 and len(head) > at + 10 and head[at + 10] & 0x1F == 0 and head[at + 9] > 3
    return False


def still_image_format(path: str | os.PathLike, head: bytes) -> str | None:
    """The format ("PNG", "JPEG", "GIF"...) when the file is a still image (one frame), which
    FFmpeg would otherwise open as a one-frame "video" at a made-up 25 fps; None for anything
    else, an animated GIF, PNG or WebP included (those are left to FFmpeg)."""
    kind = image_format(head)
    if kind is None:
        return None
    try:
        with opened_image(path) as image:
            frames = int(getattr(image, "n_frames", 1) or 1)
    except Exception:  # the magic bytes, but not an image PIL reads: leave it to FFmpeg
        return None
    if kind == "JPEG" and _jpeg_followed_by_another(path):
        return None  # a raw MJPEG stream (an IP camera's `.mjpeg`): a JPEG a frame
    return kind if frames <= 1 else None


_JPEG_JOIN = b"\xff\xd9\xff\xd8"  # one JPEG's end (EOI) and the next one's start (SOI)


def _jpeg_followed_by_another(path: str | os.PathLike) -> bool:
    """Whether a JPEG file holds a second JPEG right after its first (a raw MJPEG stream, which
    FFmpeg reads a JPEG a frame, and PIL as the first image alone): an EOI marker followed by an
    SOI, looked for from the first image's coded data on, where it cannot occur inside one JPEG
    (the coded data escapes every 0xFF byte). The segments before it are skipped by their
    lengths: an EXIF thumbnail, a camera's previews or a comment may hold those bytes."""
    chunk = 1 << 20
    with open(path, "rb") as handle:
        if not _to_first_scan(handle):
            return False
        tail = b""
        while block := handle.read(chunk):
            if _JPEG_JOIN in tail + block:
                return True
            tail = block[-(len(_JPEG_JOIN) - 1) :]
    return False


def _to_first_scan(handle: BinaryIO) -> bool:
    """Move `handle` (a JPEG file, at its start) past the segments before its first scan's
    coded data (their lengths read, their bytes not); False where its markers end first."""
    if handle.read(2) != b"\xff\xd8":
        return False
    while True:
        marker = handle.read(2)
        while marker[:1] == b"\xff" and marker[1:] == b"\xff":  # fill bytes before a marker
            marker = marker[1:] + handle.read(1)
        if len(marker) < 2 or marker[0] != 0xFF:
            return False
        if marker[1] == 0xDA:  # start of scan: its header, then the coded data
            return True
        if marker[1] == 0x01 or 0xD0 <= marker[1] <= 0xD7:
            continue  # markers without a segment
        size = handle.read(2)
        if len(size) < 2 or int.from_bytes(size, "big") < 2:
            return False
        handle.seek(int.from_bytes(size, "big") - 2, os.SEEK_CUR)


# --- the codec's FOURCC as the container records it ---------------------------------------------
#
# FFmpeg (and so OpenCV) reports its own tag for a codec (FMP4 for any MPEG-4 Part 2 stream),
# where ffprobe's codec_tag_string and other tools show the one the file records (XVID, DIVX,
# mp4v): AVI and ISO files name it where it is cheap to read.


def container_fourcc(path: str | os.PathLike, container: str | None) -> str | None:
    """The video stream's FOURCC as the container records it (what ffprobe shows as
    codec_tag_string): an AVI's BITMAPINFOHEADER compression (its stream header's handler when
    that is empty), an MP4/MOV/3GP video track's sample entry; None for other formats or a
    structure that cannot be read. A few small reads: the headers, not the index or frames."""
    reader = {"avi": avi_fourcc, "mp4": iso_fourcc, "mov": iso_fourcc, "3gp": iso_fourcc}
    if container not in reader:
        return None
    try:
        with open(path, "rb") as handle:
            return reader[container](handle, os.fstat(handle.fileno()).st_size)
    except OSError:
        return None


# --- truncation ---------------------------------------------------------------------------------
#
# A copy cut short (a download or transfer that stopped, a disk that filled up) often still opens:
# its header says how many frames there are and decoding starts fine. Two cheap checks tell it
# from a whole file. (1) Container structure: MP4/MOV boxes, AVI RIFF chunks, the Matroska/WebM
# segment, ASF (WMV) objects and MPEG-TS packets carry their sizes, so reading a few bytes at a
# few offsets says how long the file must be; a shorter file ends mid-stream. Y4M frames are all
# one size (its header gives it), and MPEG-PS packs and packets and FLV tags carry their lengths.
# (2) Where the format records no sizes (Ogg, a live recording), or a cut between two packets or
# tags leaves none short: decoding at the end, the last frames the header declares sought and
# decoded (`--exact` decodes them all anyway). The header's count of a Y4M or MPEG-PS file is
# reckoned from its size, so that check cannot see a cut there.


def declared_size(path: str | os.PathLike, container: str | None, size: int) -> int | None:
    """How many bytes the container structure of a `size`-byte file says it holds, for the
    formats that record it (MP4/MOV/3GP, AVI, Matroska/WebM, ASF/WMV, MPEG-TS, M2TS, Y4M, MPEG-PS,
    raw DV, FLV and Ogg, the last three where their ends say);
    None when the format does not say or the structure cannot be read (so nothing is claimed
    about the file)."""
    packet = {"mpeg-ts": TS_PACKET, "m2ts": M2TS_PACKET}.get(container or "")
    if packet is not None:
        return -(-size // packet) * packet  # a partial last packet ends mid-stream
    readers = {
        "mp4": iso_boxes_end,
        "mov": iso_boxes_end,
        "3gp": iso_boxes_end,
        "avi": riff_chunks_end,
        "mkv": ebml_segment_end,
        "webm": ebml_segment_end,
        "asf": asf_objects_end,
        "y4m": y4m_frames_end,
        "mpeg-ps": mpeg_ps_end,
        "dv": dv_frames_end,
        "flv": flv_tags_end,
        "ogg": ogg_pages_end,
    }
    reader = readers.get(container or "")
    if reader is None:
        return None
    try:
        with open(path, "rb") as handle:
            return reader(handle, size)
    except OSError:
        return None
