"""Finding video files, telling their container from their first bytes, and the size their
container structure declares (which tells a copy cut short from a whole file)."""

from __future__ import annotations

import errno
import itertools
import logging
import math
import os
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkit.core.data.image_files import opened_image
from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.io.files import STDIN, read_path_list, tree_entries
from torchkit.core.io.image_magic import image_format

logger = logging.getLogger("torchkit")

VIDEO_EXTENSIONS = frozenset(
    {
        ".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".flv", ".wmv", ".asf", ".mpg", ".mpeg",
        ".m2v", ".ts", ".mts", ".m2ts", ".3gp", ".3g2", ".ogv", ".mxf", ".vob", ".dv", ".y4m",
    }
)  # fmt: skip
TS_PACKET = 188
M2TS_PACKET = 192  # M2TS/MTS (AVCHD, Blu-ray): a 4-byte timestamp before each TS packet
SNIFF_BYTES = 512  # enough for an EBML DocType and two MPEG-TS packet starts


# --- finding videos -----------------------------------------------------------------------------


def is_video_file(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in VIDEO_EXTENSIONS


def _videos_in(folder: str | os.PathLike) -> list[str]:
    """The video files under `folder`, sorted by path. Hidden files and folders are left out:
    macOS leaves "._clip.mp4" resource forks beside every clip on shared drives, and tools keep
    caches in dot-folders. A link to a video counts; links to folders are not followed, and a
    folder that cannot be listed is passed over (`core.io.files.tree_entries`)."""
    found = []
    for path, entry in tree_entries(folder, skip_hidden=True):
        try:
            if os.path.splitext(entry.name)[1].lower() in VIDEO_EXTENSIONS and entry.is_file():
                found.append(path)
        except OSError:  # vanished while listing
            continue
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


_FLV_TAG_HEADER = 11  # type, data size (3 bytes), timestamp (3 + 1), stream ID (3)


def flv_last_tag_s(path: str | os.PathLike) -> float | None:
    """The time, in seconds, of an FLV file's last tag of any stream (audio, video, script):
    its last 4 bytes give that tag's size, so one read finds it. None where they do not lead
    to a tag (a copy cut inside one, not an FLV file)."""
    try:
        with open(path, "rb") as handle:
            tag = _flv_last_tag(handle, os.fstat(handle.fileno()).st_size)
    except OSError:
        return None
    return None if tag is None else (int.from_bytes(tag[4:7], "big") | tag[7] << 24) / 1000


def _flv_last_tag(handle, size: int) -> bytes | None:
    """The header of the tag an FLV file's last 4 bytes (the size of the tag before them) lead
    to; None where they lead to none."""
    if size < 4 + _FLV_TAG_HEADER:
        return None
    handle.seek(size - 4)
    length = int.from_bytes(handle.read(4), "big")
    if not _FLV_TAG_HEADER <= length <= size - 4:
        return None
    handle.seek(size - 4 - length)
    tag = handle.read(_FLV_TAG_HEADER)
    if tag[0] & 0x1F not in (8, 9, 18) or int.from_bytes(tag[1:4], "big") + _FLV_TAG_HEADER != (
        length
    ):
        return None
    return tag


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
    return kind if frames <= 1 else None


# --- the codec's FOURCC as the container records it ---------------------------------------------
#
# FFmpeg (and so OpenCV) reports its own tag for a codec (FMP4 for any MPEG-4 Part 2 stream),
# where ffprobe's codec_tag_string and other tools show the one the file records (XVID, DIVX,
# mp4v): AVI and ISO files name it where it is cheap to read.

_MAX_HEADERS = 1 << 20  # an AVI's stream headers bigger than this are not read for its tag


def fourcc_text(raw: bytes) -> str | None:
    """Four bytes as a FOURCC's text, padding spaces and NULs dropped (None when empty or not
    printable ASCII)."""
    text = raw.decode("latin-1").strip("\x00 ")
    return text if text and text.isprintable() and text.isascii() else None


def container_fourcc(path: str | os.PathLike, container: str | None) -> str | None:
    """The video stream's FOURCC as the container records it (what ffprobe shows as
    codec_tag_string): an AVI's BITMAPINFOHEADER compression (its stream header's handler when
    that is empty), an MP4/MOV/3GP video track's sample entry; None for other formats or a
    structure that cannot be read. A few small reads: the headers, not the index or frames."""
    reader = {"avi": _avi_fourcc, "mp4": _iso_fourcc, "mov": _iso_fourcc, "3gp": _iso_fourcc}
    if container not in reader:
        return None
    try:
        with open(path, "rb") as handle:
            return reader[container](handle, os.fstat(handle.fileno()).st_size)
    except OSError:
        return None


def _riff_children(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """The chunks of a RIFF list in `data[start:end]`: (id, where its data starts, ends)."""
    offset = start
    while offset + 8 <= end:
        length = int.from_bytes(data[offset + 4 : offset + 8], "little")
        yield data[offset : offset + 4], offset + 8, min(offset + 8 + length, end)
        offset += 8 + length + (length & 1)


def _avi_fourcc(handle, size: int) -> str | None:
    """The first video stream's tag from an AVI's header list (hdrl, its first chunk)."""
    head = handle.read(24)
    if head[12:16] != b"LIST" or head[20:24] != b"hdrl":
        return None
    length = int.from_bytes(head[16:20], "little") - 4
    data = handle.read(min(length, _MAX_HEADERS))
    for stream, start, end in _riff_children(data, 0, len(data)):
        if stream != b"LIST" or data[start : start + 4] != b"strl":
            continue
        parts = {part: data[s:e] for part, s, e in _riff_children(data, start + 4, end)}
        header, form = parts.get(b"strh", b""), parts.get(b"strf", b"")
        if header[:4] == b"vids":
            return fourcc_text(form[16:20]) or fourcc_text(header[4:8])
    return None


_MAX_AVI_INDEX = 1 << 26  # bytes of an idx1 read (4M entries: over a day at 30 fps with audio)


@dataclass(frozen=True)
class HeldFrames:
    """The frames a file's index or clusters hold for its video (`frames`), and of them those
    a whole file may give no picture for: `leading`, before its first key frame, in the order
    they are stored or shown (a stream cut where no key frame starts it, or at an open GOP's
    key frame, whose leading pictures refer to frames before it: FFmpeg decodes none of
    them), and `not_coded`, frames of `NOT_CODED_BYTES` or fewer; `broken_at`, where its
    bytes stop being its structure inside the sizes it records (None where they never do);
    `past_breaks`: `frames` counts those after it too (the structure found again past it),
    else the frames before it alone. `end_s`: where the walk tells it (an FLV's tags), the
    time in seconds its streams end: the last video frame's shown (its time and composition
    offset), the last audio tag's time plus the time from the one before it. `span_s`: where
    the walk reads the video's times (MPEG-TS and MPEG-PS), the seconds they span, a frame's
    time added for each run of them (files joined by `cat` restart their times: each
    file's run counts), which bounds the frames one each its units can be."""

    frames: int
    leading: int
    not_coded: int
    broken_at: int | None = None
    past_breaks: bool = False
    end_s: float | None = None
    span_s: float | None = None


# An open GOP's leading pictures follow its key frame at once: the frames after it whose time
# is at or before its own are sought this far (past it, a 33-bit time that wraps misleads)
_LEADING_WINDOW = 64


def leading_frames(times, keys) -> int:
    """The frames, in stored order, with their times (`times`) and key flags (`keys`, one at
    least), that a whole file gives no picture for: those before the first key frame, and
    those after it within `_LEADING_WINDOW` shown at or before it."""
    import numpy as np

    first = int(np.argmax(keys))
    after = times[first + 1 : first + 1 + _LEADING_WINDOW]
    return first + int((after <= times[first]).sum())


def frame_interval(times) -> float | None:
    """The video's frame interval in the units of its frames' `times`: the mean of the steps
    between its distinct times within a tick of the commonest (33 and 34 ms steps of a 29.97
    fps video's millisecond times); None for fewer than two."""
    import numpy as np

    steps = np.diff(np.unique(times))
    if not len(steps):
        return None
    values, counts = np.unique(steps, return_counts=True)
    commonest = values[np.argmax(counts)]
    return float(steps[abs(steps - commonest) <= 1].mean())


_PTS_WRAP = 1 << 33  # an MPEG presentation time's 33 bits at 90 kHz wrap after 26.5 hours
PTS_CLOCK = 90_000


def unwrapped_pts(times):
    """MPEG presentation times (90 kHz, 33 bits) in stored order, each run after a wrap (a
    step back by over half the range) raised by the range, and lowered again after a step
    forward by as much (a B-frame stored after the wrap, shown before it)."""
    import numpy as np

    steps = np.diff(times)
    wraps = (steps < -(_PTS_WRAP // 2)).astype(np.int64) - (steps > _PTS_WRAP // 2)
    return times + np.r_[0, np.cumsum(wraps)] * _PTS_WRAP


def pts_span_s(times) -> float | None:
    """The seconds MPEG presentation times (90 kHz, unwrapped, in stored order) span: runs
    split where a step exceeds a second either way (files joined, a discontinuity), each
    run's first to last time and a frame's interval; None for fewer than two times."""
    import numpy as np

    interval = frame_interval(times)
    if interval is None:
        return None
    cuts = np.flatnonzero(abs(np.diff(times)) > PTS_CLOCK) + 1
    runs = np.split(times, cuts)
    return sum(float(run.max() - run.min()) + interval for run in runs) / PTS_CLOCK


def frames_between(times, places, firsts, lasts) -> int:
    """The frames whose starts lay in the lost runs of a file's structure (from `firsts` to
    `lasts`, in the units of `places`, sorted): for each, the frame times missing between
    the latest time of the frames stored before it and the earliest of those after
    (`times`, the frames' starts at `places`, sorted), at the video's frame interval (the
    mean of the steps between its times within a tick of the commonest: 33 and 34 ms steps
    of a 29.97 fps video's millisecond times). Frames stored out of their order (B-frames)
    make the gap smaller, never larger. The frames either side are taken up to a step back
    by more than `_LEADING_WINDOW` frames (files joined by `cat`, each restarting its
    times: those of the other file say nothing of this one's gap)."""
    import numpy as np

    interval = frame_interval(times)
    if not len(firsts) or interval is None:
        return 0
    missing = 0
    for start, end in zip(firsts, lasts, strict=True):
        before = np.searchsorted(places, start)
        after = np.searchsorted(places, end, side="right")
        if before == 0 or after == len(places):
            continue
        earlier = times[max(0, before - _LEADING_WINDOW) : before]
        later = times[after : after + _LEADING_WINDOW]
        jump = -_LEADING_WINDOW * interval  # a step back no reordering makes
        restarts = np.flatnonzero(np.diff(earlier) < jump)
        earlier = earlier[restarts[-1] + 1 :] if len(restarts) else earlier
        restarts = np.flatnonzero(np.diff(later) < jump)
        later = later[: restarts[0] + 1] if len(restarts) else later
        missing += max(0, round((later.min() - earlier.max()) / interval) - 1)
    return missing


# The most bytes of a frame that may decode to no picture in a whole file: an MPEG-4 Part 2
# VOP marked not coded (an N-VOP: its start code and a few bits, 6 to 8 bytes), which Xvid
# and DivX write for a frame that repeats the one before (FFmpeg shows nothing for it); in a
# packed bitstream the placeholder for the B-frame packed before it (`mpeg4_packed`), which
# FFmpeg shows.
NOT_CODED_BYTES = 8
# The user data DivX and Xvid write in a packed bitstream's frames: "DivX503b1393p"
_PACKED_MARK = re.compile(rb"DivX\d+(?:b|Build)\d+p")
_PACKED_SEARCH = 1 << 20  # bytes searched for it: the first frames carry it


def mpeg4_packed(path: str | os.PathLike) -> bool:
    """Whether a file's MPEG-4 Part 2 video is a packed bitstream, as DivX and Xvid write
    B-frames into AVI: its user data, in its first frames, ends in `p`. Its frames of a few
    bytes are then placeholders that FFmpeg shows the packed B-frame for."""
    try:
        with open(path, "rb") as handle:
            return _PACKED_MARK.search(handle.read(_PACKED_SEARCH)) is not None
    except OSError:
        return False


def avi_indexed_frames(path: str | os.PathLike, container: str | None) -> HeldFrames | None:
    """The frames of an AVI file's first video stream that its index (`idx1`) lists with data:
    the chunks a decoder is given, where the stream header's length may say more (a writer
    that counted frames it did not write) and a capture's empty chunks for dropped frames
    decode to nothing; those before the first it flags a key frame and those of a few bytes.
    None for other formats, a file without `idx1` (an OpenDML file's index is elsewhere) or
    a structure that cannot be read."""
    import numpy as np

    if container != "avi":
        return None
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(24)
            if head[12:16] != b"LIST" or head[20:24] != b"hdrl":
                return None
            headers = handle.read(min(int.from_bytes(head[16:20], "little") - 4, _MAX_HEADERS))
            stream = _avi_video_stream(headers)
            index, movi, offset = None, None, 12
            for _ in range(_MAX_BOXES):  # the chunks of the first RIFF: hdrl, movi, idx1
                handle.seek(offset)
                chunk = handle.read(12)
                if len(chunk) < 8 or offset >= size:
                    break
                length = int.from_bytes(chunk[4:8], "little")
                if chunk[:4] == b"LIST" and chunk[8:12] == b"movi":
                    movi = offset + 8  # where idx1's offsets count from
                if chunk[:4] == b"idx1":
                    handle.seek(offset + 8)
                    index = handle.read(min(length, _MAX_AVI_INDEX))
                    break
                offset += 8 + length + (length & 1)
            if stream is None or index is None:
                return None
            entries = np.frombuffer(index[: len(index) - len(index) % 16], "<u4").reshape(-1, 4)
            # an entry: the chunk's ID ("00dc": stream 0, compressed video; "00db":
            # uncompressed), flags, offset and size
            ids = [int.from_bytes(b"%02d" % stream + kind, "little") for kind in (b"dc", b"db")]
            video = entries[np.isin(entries[:, 0], ids) & (entries[:, 3] > 0)]
            keys = np.flatnonzero(video[:, 1] & _AVI_KEY_FRAME)
            # an index that flags no key frame tells nothing of them (a writer that sets none)
            leading = int(keys[0]) if len(keys) else 0
            if len(keys) and movi is not None:
                handle.seek(0)
                codec = (_avi_fourcc(handle, size) or "").lower()
                key, after = video[keys[0] : keys[0] + 1], video[keys[0] + 1 :]
                if codec in _AVC_TAGS or codec in _HEVC_TAGS:
                    leading += _avi_leading_nal_pictures(handle, key, after, movi, codec)
                else:
                    leading += _avi_leading_b_frames(handle, after, movi)
    except OSError:
        return None
    return HeldFrames(len(video), leading, int((video[:, 3] <= NOT_CODED_BYTES).sum()))


def _avi_leading_b_frames(handle, entries, movi: int) -> int:
    """The B-frames (MPEG-1/2 pictures, MPEG-4 Part 2 VOPs) that follow an AVI's first key
    frame, the idx1 `entries` after it: in an open GOP cut at its key frame they refer to the
    frames before it, which are not there, and FFmpeg drops them (a whole file's next frame is
    the P- or I-frame they are shown before). An AVI records no times to tell them by."""
    leading = 0
    for chunk_id, _, offset, length in entries[:_MAX_LEADING_B_FRAMES]:
        # offsets count from the movi list's type, or in some files from the file's start
        for base in (movi, 0):
            handle.seek(base + int(offset))
            if handle.read(4) == int(chunk_id).to_bytes(4, "little"):
                break
        else:
            return leading
        handle.seek(4, os.SEEK_CUR)
        data = handle.read(min(int(length), 64))
        picture = data.find(b"\x00\x00\x01\x00") + 5  # MPEG-1/2: its type after 10 bits
        vop = data.find(b"\x00\x00\x01\xb6") + 4  # MPEG-4: its type its first 2 bits
        b_picture = picture >= 5 and picture < len(data) and data[picture] >> 3 & 7 == 3
        b_vop = vop >= 4 and vop < len(data) and data[vop] >> 6 == 2
        if not (b_picture or b_vop):
            return leading
        leading += 1
    return leading


_MAX_LEADING_B_FRAMES = 16  # more B-frames in a row than any encoder writes
# The FOURCCs of H.264 and HEVC in AVI (lower case), whose pictures are NAL units
_AVC_TAGS = frozenset({"h264", "x264", "avc1", "davc", "vssh"})
_HEVC_TAGS = frozenset({"hevc", "h265", "hev1", "hvc1", "x265"})


def _avi_chunk(handle, entry, movi: int, wanted: int) -> bytes | None:
    """The first `wanted` bytes of the data of the idx1 `entry`'s chunk (its offset counts
    from the movi list's type, or in some files from the file's start); None where no chunk
    of its ID is there."""
    chunk_id, _, offset, length = entry
    for base in (movi, 0):
        handle.seek(base + int(offset))
        if handle.read(4) == int(chunk_id).to_bytes(4, "little"):
            handle.seek(4, os.SEEK_CUR)
            return handle.read(min(int(length), wanted))
    return None


def _nal_units(data: bytes) -> Iterator[bytes]:
    """The NAL units (their first bytes) of a frame's data: after start codes (Annex B), or
    each after its 4-byte length (as an MP4 stores them, and FFmpeg copies them into AVI)."""
    if data[:3] == b"\x00\x00\x01" or data[:4] == b"\x00\x00\x00\x01":
        at = data.find(b"\x00\x00\x01")
        while 0 <= at < len(data) - 3:
            end = data.find(b"\x00\x00\x01", at + 3)
            yield data[at + 3 : end if end >= 0 else len(data)]
            at = end
        return
    at = 0
    while at + 5 <= len(data):
        length = int.from_bytes(data[at : at + 4], "big")
        yield data[at + 4 : at + 4 + length]
        at += 4 + length


def _nal_picture(data: bytes, hevc: bool) -> str | None:
    """What the first picture NAL unit of a frame's data says of it: for HEVC its type, "RASL"
    (a random access skipped leading picture, which FFmpeg drops after a CRA that starts a
    stream), "IRAP" (a key frame: IDR, CRA, BLA) or "other"; for H.264 "IDR", or its first
    slice's type, "B" or "other". None where no picture is in the bytes read."""
    for unit in _nal_units(data):
        if not unit:
            continue
        if hevc:
            kind = unit[0] >> 1 & 0x3F
            if kind < 32:  # a picture's (VCL) unit
                return "RASL" if kind in (8, 9) else "IRAP" if 16 <= kind <= 23 else "other"
            continue
        kind = unit[0] & 0x1F
        if kind == 5:
            return "IDR"
        if kind == 1:  # a slice: first_mb_in_slice, then slice_type, two Exp-Golomb numbers
            numbers = exp_golomb(unit[1:9], 2)
            if numbers is None:
                return None
            return "B" if numbers[1] % 5 == 1 else "other"
    return None


def exp_golomb(data: bytes, count: int) -> list[int] | None:
    """The first `count` unsigned Exp-Golomb numbers of `data`; None where it ends first."""
    bits = "".join(f"{byte:08b}" for byte in data)
    numbers, at = [], 0
    for _ in range(count):
        zeros = bits.find("1", at) - at
        if zeros < 0 or at + 2 * zeros + 1 > len(bits):
            return None
        numbers.append(int(bits[at + zeros : at + 2 * zeros + 1], 2) - 1)
        at += 2 * zeros + 1
    return numbers


def _avi_leading_nal_pictures(handle, key, entries, movi: int, codec: str) -> int:
    """The pictures after an H.264 or HEVC AVI's first key frame (its idx1 entry `key`, the
    `entries` after it) that FFmpeg gives no picture for, told by their NAL units (an AVI
    records no times): an HEVC CRA's RASL pictures, which refer to frames before it, and an
    H.264 open GOP's B-frames right after its I-frame that is no IDR (a recovery point)."""
    hevc = codec in _HEVC_TAGS
    first = _avi_chunk(handle, key[0], movi, _NAL_BYTES) if len(key) else None
    start = first and _nal_picture(first, hevc)
    if start not in (("IRAP",) if hevc else ("other",)):
        return 0  # an IDR (or nothing read): every frame after it decodes
    leading = 0
    for entry in entries[:_MAX_LEADING_B_FRAMES]:
        data = _avi_chunk(handle, entry, movi, _NAL_BYTES)
        if data is None or _nal_picture(data, hevc) != ("RASL" if hevc else "B"):
            return leading
        leading += 1
    return leading


_NAL_BYTES = 4096  # the bytes of a frame read for its first picture NAL unit (after its SEI)
_AVI_KEY_FRAME = 0x10  # AVIIF_KEYFRAME, an idx1 entry's flag


def _avi_video_stream(headers: bytes) -> int | None:
    """The number of the first video stream (its `strl` list's place) in an AVI's hdrl data."""
    streams = 0
    for chunk, start, end in _riff_children(headers, 0, len(headers)):
        if chunk != b"LIST" or headers[start : start + 4] != b"strl":
            continue
        parts = {part: headers[s:e] for part, s, e in _riff_children(headers, start + 4, end)}
        if parts.get(b"strh", b"")[:4] == b"vids":
            return streams
        streams += 1
    return None


def _iso_box_header(head: bytes, room: int) -> tuple[int, int]:
    """(the box's length, its header's) from its first 16 bytes; a length of 0 runs to the end
    of its parent, `room` bytes on."""
    length = int.from_bytes(head[:4], "big")
    if length == 1:  # a 64-bit size follows the type
        return int.from_bytes(head[8:16], "big"), 16
    return (room if length == 0 else length), 8


# The boxes FFmpeg's MP4 reader reads as boxes of boxes (`mov_read_default`)
_ISO_CONTAINERS = frozenset(
    {b"moov", b"trak", b"edts", b"mdia", b"minf", b"stbl", b"dinf", b"mvex", b"moof", b"traf"}
)


def _iso_children(handle, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """The boxes of the file between `start` and `end`, each header read where it lies:
    (type, where its data starts, where it ends). A box of size 0 runs to the end of its
    parent, as FFmpeg reads it (ISO BMFF allows it for a file's last box alone); where it
    holds boxes (`_ISO_CONTAINERS`), the boxes after it are read inside it, and FFmpeg, which
    takes a box wherever it lies, reads them as it would beside it: an `edts` of size 0 holds
    the `mdia` after it, which is still the track's. So are they here: the walk goes on in it."""
    offset = start
    for _ in range(_MAX_BOXES):
        handle.seek(offset)
        head = handle.read(16)
        if offset + 8 > end or len(head) < 8:
            return
        length, header = _iso_box_header(head, end - offset)
        if length < header:
            return
        yield head[4:8], offset + header, min(offset + length, end)
        if head[:4] == bytes(4):  # size 0: to the end of its parent
            if head[4:8] not in _ISO_CONTAINERS:
                return
            length = header
        offset += length


def _iso_child(handle, kind: bytes, start: int, end: int) -> tuple[int, int] | None:
    """The first box of type `kind` between `start` and `end`: (where its data starts, ends)."""
    return next(((s, e) for k, s, e in _iso_children(handle, start, end) if k == kind), None)


def _iso_field(handle, box: tuple[int, int] | None, at: int, length: int = 4) -> bytes:
    """`length` bytes `at` bytes into `box`'s data (b"" for no box, fewer past its end)."""
    if box is None or box[0] + at >= box[1]:
        return b""
    handle.seek(box[0] + at)
    return handle.read(min(length, box[1] - box[0] - at))


def _iso_file_boxes(
    handle, size: int, breaks: list[int] | None = None
) -> Iterator[tuple[bytes, int, int]]:
    """The top-level boxes of an ISO file of `size` bytes, as `_iso_children` gives them. In a
    fragmented file (a `moov` with an `mvex`, or a `moof` met), bytes that are no box inside
    the file (a region zeroed or overwritten) are passed over to the next fragment
    (`_iso_fragment_after`), and where they start is added to `breaks`: FFmpeg's reader stops
    there, but the fragments after them are the file's (a cut copy ends instead)."""
    offset, fragmented = 0, False
    for _ in range(_MAX_BOXES):
        handle.seek(offset)
        head = handle.read(16)
        if offset + 8 > size or len(head) < 8:
            return
        length, header = _iso_box_header(head, size - offset)
        kind = head[4:8]
        if length >= header and (_iso_box_kind(kind) or not fragmented):
            yield kind, offset + header, min(offset + length, size)
            fragmented = (
                fragmented or kind == b"moof" or _iso_moov_extends(handle, offset, head, size)
            )
            if head[:4] == bytes(4) and kind in _ISO_CONTAINERS:
                length = header  # size 0: the boxes after it read inside it (_iso_children)
            offset += length
            continue
        resumed = _iso_fragment_after(handle, offset, size) if fragmented else None
        if resumed is None:
            return
        if breaks is not None:
            breaks.append(offset)
        offset = resumed


def _iso_box_kind(kind: bytes) -> bool:
    """Whether four bytes are a box's type: printable ASCII (a zeroed or overwritten region's
    bytes are not)."""
    return len(kind) == 4 and all(32 <= byte < 127 for byte in kind)


def _iso_moov_extends(handle, at: int, head: bytes, size: int) -> bool:
    """Whether the top-level box at `at`, whose first bytes are `head`, is a `moov` that holds
    an `mvex` (its file's samples go on in fragments)."""
    if head[4:8] != b"moov":
        return False
    length, header = _iso_box_header(head, size - at)
    return _iso_child(handle, b"mvex", at + header, min(at + length, size)) is not None


_ISO_RESYNC_BYTES = 1 << 26  # past a break, the next fragment is searched for this far
_MOOF_HEAD = re.compile(rb"moof\x00\x00\x00\x10mfhd")  # a moof's type, its first child's


def _iso_fragment_after(handle, at: int, size: int) -> int | None:
    """Where the first fragment (`moof` box) of an ISO file after byte `at` starts: one of
    those its fragment index (`mfra`, which FFmpeg writes last) lists, else one found by its
    first bytes (its type, then its first child, a 16-byte `mfhd`) in the next
    `_ISO_RESYNC_BYTES`; the `mfra` itself where no fragment is; None where none is."""
    index = _iso_fragment_index(handle, size)
    for start in index:
        if start > at and _iso_moof_at(handle, start, size):
            return start
    end = min(size, at + _ISO_RESYNC_BYTES)
    step = 1 << 20
    for chunk in range(at + 1, end, step):
        handle.seek(chunk)
        data = handle.read(min(step + 11, end - chunk))  # a head across the chunks' border
        for found in _MOOF_HEAD.finditer(data):
            if found.start() >= 4 and _iso_moof_at(handle, chunk + found.start() - 4, size):
                return chunk + found.start() - 4
    mfra = _iso_fragment_index_start(handle, size)
    return mfra if mfra is not None and mfra > at else None


def _iso_moof_at(handle, at: int, size: int) -> bool:
    """Whether a `moof` box that starts with an `mfhd` and ends inside the file is at `at`."""
    handle.seek(at)
    head = handle.read(16)
    length = int.from_bytes(head[:4], "big")
    return head[4:] == b"moof\x00\x00\x00\x10mfhd" and 24 <= length <= size - at


def _iso_fragment_index_start(handle, size: int) -> int | None:
    """Where the `mfra` box of an ISO file starts, as the `mfro` box that ends the file says
    (its last 4 bytes: the `mfra`'s size); None where there is none."""
    if size < 16:
        return None
    handle.seek(size - 16)
    tail = handle.read(16)
    start = size - int.from_bytes(tail[12:], "big")
    if tail[:8] != b"\x00\x00\x00\x10mfro" or not 0 <= start <= size - 24:
        return None
    handle.seek(start + 4)
    return start if handle.read(4) == b"mfra" else None


_MAX_INDEX_BYTES = 1 << 24  # an mfra bigger than this is not read


def _iso_fragment_index(handle, size: int) -> list[int]:
    """The `moof` offsets the `tfra` boxes of an ISO file's `mfra` list (a track's entries:
    each a time and an offset, 4 bytes each or 8 in version 1, then three numbers of the
    sizes its fields give), sorted; none where it has no `mfra`."""
    import numpy as np

    start = _iso_fragment_index_start(handle, size)
    if start is None:
        return []
    handle.seek(start)
    length = int.from_bytes(handle.read(4), "big")
    if length > _MAX_INDEX_BYTES:
        return []
    offsets: set[int] = set()
    for kind, box_start, box_end in _iso_children(handle, start + 8, min(start + length, size)):
        if kind != b"tfra":
            continue
        handle.seek(box_start)
        data = handle.read(box_end - box_start)
        if len(data) < 16:
            continue
        wide = 8 if data[0] == 1 else 4
        sizes = int.from_bytes(data[8:12], "big")
        entry = 2 * wide + sum((sizes >> shift & 3) + 1 for shift in (4, 2, 0))
        count = min(int.from_bytes(data[12:16], "big"), (len(data) - 16) // entry)
        table = np.frombuffer(data[16 : 16 + count * entry], np.uint8).reshape(count, entry)
        moofs = table[:, wide : 2 * wide].copy().view(">u8" if wide == 8 else ">u4")
        offsets.update(int(offset) for offset in moofs.ravel())
    return sorted(offsets)


def _iso_video_track(
    handle, moov: tuple[int, int]
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The `trak` box of the first video track (its handler is `vide`) in an ISO file's `moov`,
    and its `mdia` box; None when there is none."""
    tracks = [(s, e) for k, s, e in _iso_children(handle, *moov) if k == b"trak"]
    for track in tracks:
        media = _iso_child(handle, b"mdia", *track)
        if media is not None and _iso_field(handle, _iso_child(handle, b"hdlr", *media), 8) == (
            b"vide"
        ):
            return track, media
    return None


def _iso_movie_video_track(handle, size: int) -> tuple[Any, Any]:
    """The `moov` box of an ISO file of `size` bytes and its first video track (as
    `_iso_video_track` gives it), each falsy where the file has none."""
    moov = _iso_child(handle, b"moov", 0, size)
    return moov, moov and _iso_video_track(handle, moov)


def _iso_sample_table(handle, media: tuple[int, int]) -> tuple[int, int] | None:
    table = _iso_child(handle, b"minf", *media)
    return table and _iso_child(handle, b"stbl", *table)


def _iso_fourcc(handle, size: int) -> str | None:
    """The sample entry type of the first video track of an ISO file."""
    moov, track = _iso_movie_video_track(handle, size)
    table = track and _iso_sample_table(handle, track[1])
    # stsd: version and flags, the entry count, then the first entry's size and type
    return fourcc_text(_iso_field(handle, table and _iso_child(handle, b"stsd", *table), 12))


_ISO_FORMATS = ("mp4", "mov", "3gp")


def last_frame_duration(
    path: str | os.PathLike, container: str | None, frames: int, start_s: float | None = None
) -> float | None:
    """How long the last of the `frames` frames of an MP4/MOV/3GP file's video, decoded
    starting `start_s` seconds after the first, lasts, in seconds, as the file records it:
    the sample its `moov` lists at that time (`iso_sample_duration_at`: a packet that decodes
    to no frame leaves one sample more than frames), else, where as many frames decoded as
    the file holds samples, the last one's (`iso_video_samples`, a fragmented file's too).
    None for other formats, a frame matched to no sample, or a structure that cannot be
    read."""
    if frames <= 0:
        return None
    if start_s is not None:
        own = iso_sample_duration_at(path, container, start_s)
        if own is not None:
            return own
    samples = iso_video_samples(path, container)
    return samples.last_s if samples is not None and samples.count == frames else None


def iso_sample_duration_at(
    path: str | os.PathLike, container: str | None, start_s: float
) -> float | None:
    """How long the sample of an MP4/MOV/3GP file's first video track shown `start_s` seconds
    after its first shown one lasts, in seconds: its `stts` delta over the `mdhd` timescale,
    its time the decoding time and its `ctts` offset (`iso_timing`) from the earliest shown
    sample's, as FFmpeg's timestamps count from the stream's start. None for a fragmented
    file (its samples are in its fragments), other formats, no sample at that time (within
    half a tick), or a structure that cannot be read."""
    import numpy as np

    timing = iso_timing(path, container) if math.isfinite(start_s) and start_s >= 0 else None
    shown = timing and _iso_shown(timing.runs, timing.edits[:1] or None)
    if not shown or not shown[0]:
        return None
    count, at, delta = timing.runs
    wanted = shown[1] + start_s * timing.timescale
    steps = np.round((wanted - at) / np.maximum(delta, 1))
    # a sample of no duration is no frame's
    found = (delta > 0) & (steps >= 0) & (steps < count) & (abs(at + steps * delta - wanted) <= 0.5)
    return float(delta[found][0]) / timing.timescale if found.any() else None


def iso_edited_frame_count(path: str | os.PathLike, container: str | None) -> int | None:
    """The frames an MP4/MOV/3GP file's edit list (`elst`) shows of its first video track, as
    FFmpeg's demuxer keeps them: the samples whose time (`iso_timing`) lies inside an edit,
    once for each edit (the others it reads from the key frame before an edit's start are
    decoded and dropped). A clip cut without re-encoding (`ffmpeg -ss 0.5 -c copy`, a
    player's Trim) keeps every sample and shows those of its edit. Without an edit list, the
    samples the `stsz` box lists, which FFmpeg decodes, where the `stts` lists more or fewer.
    None where it shows each sample once (the `stts` count, as FFmpeg's header gives it), for
    a fragmented file, other formats, or a structure that cannot be read, or an edit list too
    long to count at its size (`_iso_shown`)."""
    timing = iso_timing(path, container)
    if timing is None:
        return None
    shown = _iso_shown(timing.runs, timing.edits if timing.edited else None)
    return None if shown is None or shown[0] == timing.listed else shown[0]


@dataclass(frozen=True)
class IsoTiming:
    """The sample times of an ISO file's first video track, in its `mdhd` timescale: runs of
    samples of one `stts` delta and one `ctts` offset, as three arrays (how many samples, the
    first one's time, the delta from one to the next), and the media time span [start, end)
    of each edit of its edit list that shows media (`edited`: the file has an edit list;
    without one, its samples are all shown). `listed`: the samples its `stts` lists (FFmpeg's
    header count), which may differ from the samples the runs hold (its `stsz` count)."""

    timescale: int
    runs: tuple[Any, Any, Any]
    edits: list[tuple[int, int]]
    edited: bool
    listed: int


def iso_timing(path: str | os.PathLike, container: str | None) -> IsoTiming | None:
    """`IsoTiming` of an unfragmented MP4/MOV/3GP file's first video track: a sample's time
    is its decoding time plus its `ctts` offset, signed as FFmpeg reads it, which an edit's
    media time is compared with; an edit's duration is in the `mvhd` timescale. Runs of the
    two tables are walked together, not sample by sample. As FFmpeg indexes them, the samples
    are those the `stsz` (or `stz2`) box counts, whatever the `stts` entries add up to, and an
    empty edit (media time -1) after one that shows media shows media from time -1 (before
    one, it only delays the track). None for a fragmented file, other formats, or a structure
    that cannot be read."""
    import numpy as np

    if not iso_lists_every_frame(path, container):
        return None
    try:
        with open(path, "rb") as handle:
            moov, track = _iso_movie_video_track(handle, os.fstat(handle.fileno()).st_size)
            table = track and _iso_sample_table(handle, track[1])
            if not table:
                return None
            scale = _iso_timescale(handle, _iso_child(handle, b"mdhd", *track[1]))
            movie_scale = _iso_timescale(handle, _iso_child(handle, b"mvhd", *moov))
            deltas = _iso_entries(handle, _iso_child(handle, b"stts", *table))
            offsets = _iso_entries(handle, _iso_child(handle, b"ctts", *table))
            sizes = _iso_child(handle, b"stsz", *table) or _iso_child(handle, b"stz2", *table)
            # stsz: version and flags, the sample size, then the count; stz2: its field size
            samples = _iso_field(handle, sizes, 8)
            edit_box = _iso_child(handle, b"edts", *track[0])
            edit_list = edit_box and _iso_child(handle, b"elst", *edit_box)
            edits = _iso_edits(handle, edit_list) if edit_list else None
    except OSError:
        return None
    count = int.from_bytes(samples, "big") if len(samples) == 4 else None
    runs = _iso_sample_runs(deltas, offsets, count)
    if not scale or runs is None:
        return None
    spans: list[tuple[int, int]] = []
    for duration, media in (edits or []) if movie_scale else ():
        if media != -1 or spans:
            shown = (duration * scale + movie_scale // 2) // movie_scale  # rounded
            # an edit that would end past the largest time FFmpeg holds shows nothing there
            spans.append((media, media + shown if media + shown < 1 << 63 else media))
    listed = int(np.frombuffer(deltas, ">u4")[::2].sum(dtype=np.int64))
    return IsoTiming(scale, runs, spans, edits is not None and bool(movie_scale), listed)


def _iso_timescale(handle, header: tuple[int, int] | None) -> int:
    """The timescale of an `mdhd` or `mvhd` box (after version and flags, two times of 4
    bytes, 8 in version 1); 0 where it is not there. One of 0, or negative as FFmpeg reads
    it (a signed 32-bit number), is 1, as FFmpeg takes it."""
    version = _iso_field(handle, header, 0, 1)
    scale = _iso_field(handle, header, 20 if version == b"\x01" else 12)
    if len(scale) != 4:
        return 0
    return max(int.from_bytes(scale, "big", signed=True), 0) or 1


def _iso_edits(handle, box: tuple[int, int]) -> list[tuple[int, int]] | None:
    """The (duration, media time) of each entry of an `elst` box (version and flags, the
    entry count, then per entry its duration and signed media time, 4 bytes each or, in
    version 1, 8, and its rate): as FFmpeg reads them, the whole entries the box holds,
    whatever its entry count says; None for none (no edit list)."""
    wide = _iso_field(handle, box, 0, 1) == b"\x01"
    size = 8 if wide else 4
    data = _iso_field(handle, box, 8, box[1] - box[0])
    data = data[: len(data) - len(data) % (2 * size + 4)]
    if not data:
        return None
    return [
        (
            int.from_bytes(data[at : at + size], "big"),
            int.from_bytes(data[at + size : at + 2 * size], "big", signed=True),
        )
        for at in range(0, len(data), 2 * size + 4)
    ]


# A few edits are counted one at a time over every run. More (thousands of edits of a long
# B-frame video took minutes, edits times runs) are counted on the sample times, sorted once,
# up to _MAX_SORTED_SAMPLES of them (3 arrays of 16 MiB: 9.7 hours at 60 fps); past that,
# one at a time again up to _EDIT_RUN_PAIRS edits times runs (about a second).
_FEW_EDITS = 8
_MAX_SORTED_SAMPLES = 1 << 21
_EDIT_RUN_PAIRS = 1 << 26


def _iso_shown(
    runs: tuple[Any, Any, Any], edits: list[tuple[int, int]] | None
) -> tuple[int, int | None] | None:
    """(how many samples of `runs` the `edits` show, once for each edit, the earliest shown
    one's time); all samples where `edits` is None. None for more edits and samples than
    can be counted in about a second (`_EDIT_RUN_PAIRS`)."""
    import numpy as np

    count, at, delta = runs
    if edits is None:
        return int(count.sum()), int(at.min())
    if len(edits) > _FEW_EDITS:
        if int(count.sum()) <= _MAX_SORTED_SAMPLES:
            return _iso_shown_sorted(runs, edits)
        if len(edits) * len(count) > _EDIT_RUN_PAIRS:
            return None
    shown, first = 0, None
    step = np.maximum(delta, 1)
    for start, end in edits:
        # the run's samples lie `delta` apart from `at`: those from `low` to `high` are shown
        low = np.clip(-((at - start) // step), 0, count)
        high = np.clip(-((at - end) // step), 0, count)
        still = delta == 0  # all of a run of no duration or none
        inside = (at >= start) & (at < end)
        low, high = np.where(still, 0, low), np.where(still, np.where(inside, count, 0), high)
        kept = high > low
        if kept.any():
            shown += int((high - low)[kept].sum())
            earliest = int((at + low * delta)[kept].min())
            first = earliest if first is None else min(first, earliest)
    return shown, first


def _iso_shown_sorted(
    runs: tuple[Any, Any, Any], edits: list[tuple[int, int]]
) -> tuple[int, int | None]:
    """`_iso_shown` for many edits: every sample's time, sorted, and each edit's first and
    last shown sample found by bisection, in time that grows as the samples and edits do,
    not as their product."""
    import numpy as np

    count, at, delta = runs
    # sample n of a run whose first is sample f lies at its time plus (n - f) deltas
    times = np.repeat(at - (np.cumsum(count) - count) * delta, count)
    steps = np.arange(len(times))
    steps *= np.repeat(delta, count)
    times += steps
    times.sort()
    spans = np.array(edits, dtype=np.int64).reshape(-1, 2)
    low, high = np.searchsorted(times, spans[:, 0]), np.searchsorted(times, spans[:, 1])
    kept = high > low
    if not kept.any():
        return 0, None
    return int((high - low)[kept].sum()), int(times[low[kept]].min())


def _iso_entries(handle, box: tuple[int, int] | None) -> bytes:
    """The entries of an `stts` or `ctts` box, 8 bytes each (after version and flags and the
    entry count); none for no box or a short one."""
    entries = int.from_bytes(_iso_field(handle, box, 4), "big")
    data = _iso_field(handle, box, 8, 8 * entries)
    return data if len(data) == 8 * entries else b""


def _iso_sample_runs(
    deltas: bytes, offsets: bytes, samples: int | None = None
) -> tuple[Any, Any, Any] | None:
    """Runs of samples of one `stts` delta and one `ctts` offset (signed, as FFmpeg reads it;
    0 past the `ctts` table's samples, as for a track without one), as three arrays: how
    many samples, the first one's time (its decoding time plus its offset), the delta. The
    two tables' entries (each a count, then a delta or offset) are merged where either's
    runs end, in NumPy: a long video's tables hold an entry a frame. `samples`: the track's
    sample count (`stsz`), where FFmpeg ends the `stts` runs, or lasts its last delta to
    (None: the `stts` count); with `ctts` offsets, it gives the samples past the `stts` runs
    no duration (it lists the times a sample at a time). None for no samples."""
    import numpy as np

    times = np.frombuffer(deltas, ">u4").reshape(-1, 2).astype(np.int64)
    if samples is not None and len(times):
        ends = np.minimum(np.cumsum(times[:, 0]), samples)
        times[:, 0] = np.diff(ends, prepend=0)
        if offsets and samples > ends[-1]:
            times = np.vstack((times, [(samples - ends[-1], 0)]))
        else:
            times[-1, 0] += samples - ends[-1]
    shifts = np.frombuffer(offsets, ">u4").reshape(-1, 2)
    if not times[:, 0].any():
        return None
    time_ends = np.cumsum(times[:, 0])
    shift_ends = np.cumsum(shifts[:, 0].astype(np.int64))
    starts = np.sort(np.concatenate(([0], time_ends[:-1], shift_ends)))
    starts = starts[(starts < time_ends[-1]) & np.append(True, starts[1:] != starts[:-1])]
    count = np.diff(np.append(starts, time_ends[-1]))
    entry = np.searchsorted(time_ends, starts, side="right")
    first_dts = np.concatenate(([0], np.cumsum(times[:, 0] * times[:, 1])[:-1]))
    delta = times[entry, 1]
    dts = first_dts[entry] + (starts - (time_ends - times[:, 0])[entry]) * delta
    shift_entry = np.searchsorted(shift_ends, starts, side="right")
    signed = np.append(shifts[:, 1].astype(np.uint32).view(np.int32).astype(np.int64), 0)
    return count, dts + signed[np.minimum(shift_entry, len(shifts))], delta


_MAX_ISO_SAMPLES = 50_000_000  # a day of 30 fps video, ten times over


def iso_frames_without_picture(path: str | os.PathLike, container: str | None) -> HeldFrames:
    """The samples of an MP4/MOV/3GP file's video (its `moov` sample table's and its
    fragments') that a whole file may give no picture for: `leading`, those before its first
    key frame (`stss`, or a fragment's sample flags), in the order they are stored, or after
    it but shown before it or at its time (`ctts` or a fragment's composition offsets: an
    open GOP's leading pictures, their times lifted to the start of a copy cut at the key
    frame), which a stream cut where no key frame starts it has nothing to decode from, and
    FFmpeg drops; `not_coded`, those of `NOT_CODED_BYTES` or fewer. `frames` is 0: the
    header's count is FFmpeg's. None of them for other formats or a structure that cannot
    be read."""
    import numpy as np

    if container not in _ISO_FORMATS:
        return HeldFrames(0, 0, 0)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            moov, track = _iso_movie_video_track(handle, size)
            if not track:
                return HeldFrames(0, 0, 0)
            table = _iso_sample_table(handle, track[1])
            listed = table and _iso_table_sample_array(handle, table)
            in_fragments = _iso_fragment_sample_arrays(handle, size, moov, track[0])
            if listed and _iso_child(handle, b"stss", *table) is None and in_fragments:
                listed = _iso_keys_before_fragments(listed, in_fragments)
    except OSError:
        return HeldFrames(0, 0, 0)
    samples = [s for s in [listed, *in_fragments] if s is not None and len(s[0])]
    if not samples:
        return HeldFrames(0, 0, 0)
    keys, durations, offsets, sizes = (np.concatenate(part) for part in zip(*samples, strict=True))
    shown = np.cumsum(durations) - durations + offsets
    first = int(np.argmax(keys)) if keys.any() else 0
    # at or before its time: a muxer lifts a time before the file's start to it
    leading = first + int((shown[first + 1 :] <= shown[first]).sum())
    return HeldFrames(0, leading, int((sizes <= NOT_CODED_BYTES).sum()))


# One array a sample: whether it is a key frame, its duration, its composition offset, its size
_SampleArrays = tuple[Any, Any, Any, Any]


def _iso_keys_before_fragments(
    listed: _SampleArrays, in_fragments: list[_SampleArrays]
) -> _SampleArrays:
    """The samples of a fragmented file's `moov` table without an `stss` box, whose fragments
    hold samples that are no key frame: FFmpeg's muxer leaves the `stss` out where none of
    the table's samples is a key frame as well as where all are. With `-movflags
    frag_keyframe` (without `empty_moov`) the table holds the samples before the first key
    frame, which starts the first fragment: a stream cut where none starts it (`-ss 3
    -copyinkf`) lists its leading frames there, none of them a key frame. Where the table's
    samples are key frames (an intra-only start) they are taken for leading ones too: their
    damage is not looked for, rather than a whole file called damaged."""
    import numpy as np

    if not any((~keys).any() for keys, *_ in in_fragments):
        return listed  # every sample a key frame: an intra-only stream, its table's too
    keys, *rest = listed
    return (np.zeros(len(keys), bool), *rest)


def _iso_table_sample_array(handle, table: tuple[int, int]) -> _SampleArrays | None:
    """The samples of a `moov` sample table (`stbl`): its `stsz` sizes, `stss` key frames
    (every sample where it has none), `stts` durations and `ctts` offsets (0 where none)."""
    import numpy as np

    sizes_box = _iso_child(handle, b"stsz", *table)
    # stsz: version and flags, one size for every sample (0: each its own), the sample count,
    # then the sizes
    head = _iso_field(handle, sizes_box, 4, 8)
    if len(head) < 8:
        return None
    one_size, count = int.from_bytes(head[:4], "big"), int.from_bytes(head[4:], "big")
    if count > _MAX_ISO_SAMPLES:
        return None
    if one_size:
        sizes = np.full(count, one_size, np.int64)
    else:
        data = _iso_field(handle, sizes_box, 12, 4 * count)
        sizes = np.frombuffer(data[: len(data) - len(data) % 4], ">u4").astype(np.int64)
        count = len(sizes)
    syncs = _iso_child(handle, b"stss", *table)
    if syncs is None:
        keys = np.ones(count, bool)
    else:
        # stss: version and flags, the entry count, then the key samples' numbers (from 1)
        listed = int.from_bytes(_iso_field(handle, syncs, 4), "big")
        numbers = np.frombuffer(_iso_field(handle, syncs, 8, 4 * min(listed, count)), ">u4")
        keys = np.zeros(count, bool)
        keys[numbers[(numbers >= 1) & (numbers <= count)].astype(np.int64) - 1] = True
    return (
        keys,
        _iso_expand(_iso_entries(handle, _iso_child(handle, b"stts", *table)), count),
        _iso_expand(_iso_entries(handle, _iso_child(handle, b"ctts", *table)), count),
        sizes,
    )


def _iso_expand(entries: bytes, count: int) -> Any:
    """An `stts` or `ctts` table's (count, value) runs as one value a sample (signed, as
    FFmpeg reads a `ctts` offset), `count` of them: 0 past its runs."""
    import numpy as np

    runs = np.frombuffer(entries, ">u4").reshape(-1, 2)
    repeats = np.minimum(np.cumsum(runs[:, 0].astype(np.int64)), count)
    values = np.repeat(runs[:, 1].astype(np.uint32).view(np.int32), np.diff(repeats, prepend=0))
    return np.concatenate((values.astype(np.int64), np.zeros(count - len(values), np.int64)))


def _iso_fragment_sample_arrays(
    handle, size: int, moov: tuple[int, int], track: tuple[int, int]
) -> list[_SampleArrays]:
    """The samples of `track` in the fragments (`moof` boxes) of an ISO file, a run (`trun`)
    at a time: each sample's flags (its own, the run's first sample's, the `tfhd` default or
    the `trex` one; a key frame where the non-sync bit 0x10000 is clear), duration and size
    (its own, else the defaults) and composition offset (its own, else 0)."""
    track_id, trex = _iso_track_extends(handle, moov, track, 12)  # duration, size, flags
    defaults = (
        [int.from_bytes(trex[i : i + 4], "big") for i in (0, 4, 8)]
        if len(trex) == 12
        else [0, 0, 0]
    )
    runs, total = [], 0
    for part_start, part_end, fields in _iso_track_fragments(handle, size, track_id):
        flags, at, own = int.from_bytes(fields[1:4], "big"), 8, list(defaults)
        at += 8 if flags & 0x1 else 0
        at += 4 if flags & 0x2 else 0
        for bit, slot in ((0x8, 0), (0x10, 1), (0x20, 2)):
            if flags & bit:
                own[slot] = int.from_bytes(fields[at : at + 4], "big")
                at += 4
        for run, run_start, run_end in _iso_children(handle, part_start, part_end):
            if run != b"trun":
                continue
            arrays = _iso_run_sample_array(handle, (run_start, run_end), own)
            total += len(arrays[0]) if arrays else 0
            if arrays is None or total > _MAX_ISO_SAMPLES:
                return runs
            runs.append(arrays)
    return runs


def _iso_track_extends(
    handle, moov: tuple[int, int], track: tuple[int, int], length: int
) -> tuple[bytes, bytes]:
    """(the ID of `track`, the first `length` bytes of its `trex` defaults from the default
    duration on: b"" where the `moov` gives none)."""
    # tkhd: version and flags, two times of 4 bytes (version 1: 8), then the track's ID
    header = _iso_child(handle, b"tkhd", *track)
    track_id = _iso_field(handle, header, 20 if _iso_field(handle, header, 0, 1) == b"\x01" else 12)
    extends = _iso_child(handle, b"mvex", *moov)
    # trex: version and flags, the track's ID, its default description index, then its
    # default duration, size and flags
    trex = next(
        (
            _iso_field(handle, (s, e), 12, length)
            for k, s, e in (_iso_children(handle, *extends) if extends else ())
            if k == b"trex" and _iso_field(handle, (s, e), 4) == track_id
        ),
        b"",
    )
    return track_id, trex


def _iso_track_fragments(handle, size: int, track_id: bytes) -> Iterator[tuple[int, int, bytes]]:
    """Each `traf` of the track `track_id` in the `moof` boxes of an ISO file: (its start, end,
    its `tfhd`'s first 40 bytes)."""
    for kind, start, end in _iso_file_boxes(handle, size):
        if kind != b"moof":
            continue
        for part, part_start, part_end in _iso_children(handle, start, end):
            if part != b"traf":
                continue
            # tfhd: version and flags, the track's ID, then the fields its flags say are there:
            # a base offset (8 bytes), a description index (4), the default duration (4),
            # size (4) and flags (4)
            fields = _iso_field(handle, _iso_child(handle, b"tfhd", part_start, part_end), 0, 40)
            if len(fields) >= 8 and fields[4:8] == track_id:
                yield part_start, part_end, fields


def _iso_run_sample_array(
    handle, run: tuple[int, int], defaults: list[int]
) -> _SampleArrays | None:
    """The samples of a `trun` box, `defaults` its fragment's duration, size and flags."""
    import numpy as np

    # trun: version and flags, the sample count, a data offset and the first sample's flags
    # where the flags say, then a record per sample of the fields the flags say (4 bytes each:
    # duration 0x100, size 0x200, flags 0x400, composition offset 0x800)
    head = _iso_field(handle, run, 0, 16)
    if len(head) < 8:
        return None
    flags, count = int.from_bytes(head[1:4], "big"), int.from_bytes(head[4:8], "big")
    if count > _MAX_ISO_SAMPLES:
        return None
    at = 8 + (4 if flags & 0x1 else 0)
    first_flags = int.from_bytes(head[at : at + 4], "big") if flags & 0x4 else None
    at += 4 if flags & 0x4 else 0
    fields = [bit for bit in (0x100, 0x200, 0x400, 0x800) if flags & bit]
    data = _iso_field(handle, run, at, 4 * len(fields) * count)
    if len(data) < 4 * len(fields) * count:
        return None
    records = np.frombuffer(data, ">u4").reshape(count, len(fields)) if fields else None

    def column(bit: int, default: int) -> Any:
        if bit in fields:
            return records[:, fields.index(bit)].astype(np.int64)
        return np.full(count, default, np.int64)

    sample_flags = column(0x400, defaults[2])
    if first_flags is not None and count and 0x400 not in fields:
        sample_flags[0] = first_flags
    offsets = column(0x800, 0)
    offsets = offsets.astype(np.uint32).view(np.int32).astype(np.int64)
    return (
        (sample_flags & 0x10000) == 0,
        column(0x100, defaults[0]),
        offsets,
        column(0x200, defaults[1]),
    )


def fragmented_frame_count(path: str | os.PathLike, container: str | None) -> int | None:
    """The frames of a fragmented MP4/MOV/3GP file's video (`moof` boxes): its `moov`'s
    samples and its fragments'. FFmpeg's count is the `moov`'s alone (1 of 6 frames when the
    first fragment is in the `moov`, as `-movflags frag_keyframe` writes it). None for an
    unfragmented file (its `moov` lists every frame) or another format."""
    if container not in _ISO_FORMATS or iso_lists_every_frame(path, container):
        return None
    samples = iso_video_samples(path, container)
    return samples.count if samples is not None and samples.fragmented and samples.count else None


@dataclass(frozen=True)
class IsoSamples:
    """The samples of an ISO file's first video track: how many, how long the last one lasts
    in seconds (None: not recorded), and whether fragments hold some."""

    count: int
    last_s: float | None
    fragmented: bool


def iso_video_samples(path: str | os.PathLike, container: str | None) -> IsoSamples | None:
    """The samples of an MP4/MOV/3GP file's first video track: those its `moov`'s sample table
    lists and those its fragments' runs (`moof` boxes) hold; the last one's duration, over the
    `mdhd` timescale, is its last fragment's last sample's (the `trun` duration, else its
    `tfhd`'s default, else the `trex` one), or the last `stts` entry's in a file without
    fragments. None for other formats or a structure that cannot be read."""
    if container not in _ISO_FORMATS:
        return None
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            moov, track = _iso_movie_video_track(handle, size)
            if not track:
                return None
            header = _iso_child(handle, b"mdhd", *track[1])
            # mdhd: version and flags, then two times of 4 bytes (version 1: 8) and the timescale
            version = _iso_field(handle, header, 0, 1)
            scale = _iso_field(handle, header, 20 if version == b"\x01" else 12)
            count, ticks = _iso_table_samples(handle, track[1])
            in_fragments, last_ticks = _iso_fragment_samples(handle, size, moov, track[0])
    except OSError:
        return None
    if in_fragments:
        count, ticks = count + in_fragments, last_ticks
    timescale = int.from_bytes(scale, "big") if len(scale) == 4 else 0
    last_s = ticks / timescale if timescale and ticks else None
    return IsoSamples(count, last_s, bool(in_fragments))


def _iso_table_samples(handle, media: tuple[int, int]) -> tuple[int, int]:
    """(the samples a track's `moov` sample table lists, the last one's duration in ticks):
    the `stts` entries' counts and the last entry's delta; (0, 0) for none."""
    table = _iso_sample_table(handle, media)
    times = table and _iso_child(handle, b"stts", *table)
    # stts: version and flags, the entry count, then (count, delta) entries
    entries = int.from_bytes(_iso_field(handle, times, 4), "big")
    data = _iso_field(handle, times, 8, 8 * entries)
    if not entries or len(data) != 8 * entries:
        return 0, 0
    counts = sum(int.from_bytes(data[i : i + 4], "big") for i in range(0, len(data), 8))
    return counts, int.from_bytes(data[-4:], "big")


def _iso_fragment_samples(
    handle, size: int, moov: tuple[int, int], track: tuple[int, int]
) -> tuple[int, int]:
    """(the samples of the `track` the fragments of an ISO file hold, the last one's duration
    in ticks); (0, 0) for a file without fragments. Each `moof` holds a `traf` per track (its
    `tfhd` names the track), each with `trun` runs of samples, whose durations are the run's
    own, else the `tfhd`'s default, else the `trex` one the `moov` gives the track."""
    track_id, default = _iso_track_extends(handle, moov, track, 4)  # the default duration
    samples, last = 0, 0
    for part_start, part_end, fields in _iso_track_fragments(handle, size, track_id):
        flags = int.from_bytes(fields[1:4], "big")
        at = 8 + (8 if flags & 0x1 else 0) + (4 if flags & 0x2 else 0)
        fragment_default = fields[at : at + 4] if flags & 0x8 else default
        for run, run_start, run_end in _iso_children(handle, part_start, part_end):
            if run == b"trun":
                count, ticks = _iso_run_samples(handle, (run_start, run_end), fragment_default)
                if count:
                    samples, last = samples + count, ticks
    return samples, last


def _iso_run_samples(handle, run: tuple[int, int], default: bytes) -> tuple[int, int]:
    """(the samples of a `trun` box, the last one's duration in ticks: its own where the run
    records durations, else `default`)."""
    # trun: version and flags, the sample count, a data offset and the first sample's flags
    # where the flags say, then a record per sample of the fields the flags say (4 bytes each:
    # duration 0x100, size 0x200, flags 0x400, composition offset 0x800)
    head = _iso_field(handle, run, 0, 8)
    if len(head) < 8:
        return 0, 0
    flags, count = int.from_bytes(head[1:4], "big"), int.from_bytes(head[4:8], "big")
    if not count or not flags & 0x100:
        return count, int.from_bytes(default, "big") if len(default) == 4 else 0
    record = 4 * bin(flags & 0xF00).count("1")
    first = 8 + 4 * bin(flags & 0x5).count("1")
    return count, int.from_bytes(_iso_field(handle, run, first + (count - 1) * record), "big")


def iso_display_mirrored(path: str | os.PathLike, container: str | None) -> bool:
    """Whether an MP4/MOV/3GP file's display matrix mirrors its video (QuickTime Player's Flip
    Horizontal or Vertical writes one): the video track's `tkhd` matrix times the movie's
    `mvhd` one turns the picture over (a negative determinant). FFmpeg's players show it
    mirrored; OpenCV turns its frames by the matrix's angle alone. False for other formats,
    or a structure that cannot be read."""
    if container not in _ISO_FORMATS:
        return False
    try:
        with open(path, "rb") as handle:
            moov, track = _iso_movie_video_track(handle, os.fstat(handle.fileno()).st_size)
            if not track:
                return False
            # the matrix after the times, IDs and volume: at 40 (version 1, 8-byte times: 52)
            # into a tkhd's data, at 36 (48) into an mvhd's
            turns = (
                _iso_matrix_turns_over(handle, _iso_child(handle, b"tkhd", *track[0]), 40, 52),
                _iso_matrix_turns_over(handle, _iso_child(handle, b"mvhd", *moov), 36, 48),
            )
    except OSError:
        return False
    return turns[0] != turns[1]


def _iso_matrix_turns_over(handle, box: tuple[int, int] | None, at: int, at_v1: int) -> bool:
    """Whether the 3x3 display matrix `at` bytes into `box` (`at_v1` in a version-1 box) has
    a negative determinant: its a, b, c, d (16.16 fixed point) are the first, second, fourth
    and fifth of its nine numbers. False where it is not there."""
    version = _iso_field(handle, box, 0, 1)
    matrix = _iso_field(handle, box, at_v1 if version == b"\x01" else at, 20)
    if len(matrix) < 20:
        return False
    a, b, _, c, d = (int.from_bytes(matrix[i : i + 4], "big", signed=True) for i in range(0, 20, 4))
    return a * d - b * c < 0


def iso_lists_every_frame(path: str | os.PathLike, container: str | None) -> bool:
    """Whether an MP4/MOV/3GP file's header count is its sample table's, a line per frame: a
    file whose moov holds its samples, not a fragmented one (`moof` boxes), whose count FFmpeg
    reckons from the duration. False for other formats, or a structure that cannot be read."""
    kinds = _iso_top_level_kinds(path, container)
    return b"moov" in kinds and b"moof" not in kinds


def iso_boxes_break(path: str | os.PathLike, container: str | None) -> int | None:
    """Where the top-level boxes of a fragmented MP4/MOV/3GP file stop being boxes, with
    fragments after (`_iso_file_boxes`): a region zeroed or overwritten inside a whole file.
    None where they never do, for an unfragmented file, other formats, or a structure that
    cannot be read."""
    if container not in _ISO_FORMATS:
        return None
    breaks: list[int] = []
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            for _ in _iso_file_boxes(handle, size, breaks):
                pass
    except OSError:
        return None
    return breaks[0] if breaks else None


def iso_index_missing(path: str | os.PathLike, container: str | None) -> bool:
    """Whether an MP4/MOV/3GP file holds media data (`mdat`) but no index (`moov`), which
    every whole file has: a recorder writes it when it finishes (FFmpeg, phones, OpenCV), so
    this is a recording still being written or stopped before the end, or a copy cut short."""
    kinds = _iso_top_level_kinds(path, container)
    return b"mdat" in kinds and b"moov" not in kinds


def _iso_top_level_kinds(path: str | os.PathLike, container: str | None) -> set[bytes]:
    """The types of an MP4/MOV/3GP file's top-level boxes (none for other formats, or where
    the file cannot be read)."""
    if container not in _ISO_FORMATS:
        return set()
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            return {kind for kind, _, _ in _iso_file_boxes(handle, size)}
    except OSError:
        return set()


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

_MAX_BOXES = 100_000  # a fragmented MP4 has two boxes per fragment; a bound for a corrupt one


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
        "mp4": _iso_boxes_end,
        "mov": _iso_boxes_end,
        "3gp": _iso_boxes_end,
        "avi": _riff_chunks_end,
        "mkv": _ebml_segment_end,
        "webm": _ebml_segment_end,
        "asf": _asf_objects_end,
        "y4m": _y4m_frames_end,
        "mpeg-ps": _mpeg_ps_end,
        "dv": _dv_frames_end,
        "flv": _flv_tags_end,
        "ogg": _ogg_pages_end,
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
    """The end of the last top-level box of an ISO base media file (MP4, MOV, 3GP). In a
    fragmented file, bytes that are no box are passed over to the next fragment, as
    `_iso_file_boxes` does: a region zeroed inside a whole file is damage, not a cut."""
    offset, fragmented = 0, False
    for _ in range(_MAX_BOXES):
        if offset >= size:
            return offset
        handle.seek(offset)
        header = handle.read(16)
        if len(header) < 8:  # the file ends inside a box header, or a few padding zeros
            return offset if not header.strip(b"\x00") else offset + 8
        kind = header[4:8]
        if header[:4] == b"\x00\x00\x00\x01" and len(header) < 16:
            return offset + 16  # the file ends inside a 64-bit size
        length, header_length = _iso_box_header(header, size - offset)  # 0: to the end
        if not _iso_box_kind(kind) or length < header_length:
            # not a box: trailing data we cannot judge, or in a fragmented file damage that
            # the fragments after it pass
            resumed = _iso_fragment_after(handle, offset, size) if fragmented else None
            if resumed is None:
                return None
            offset = resumed
            continue
        fragmented = (
            fragmented or kind == b"moof" or _iso_moov_extends(handle, offset, header, size)
        )
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


_ASF_HEADER = bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c")
_ASF_DATA = bytes.fromhex("3626b2758e66cf11a6d900aa0062ce6c")
_ASF_FILE_PROPERTIES = bytes.fromhex("a1dcab8c47a9cf118ee400c00c205365")
_ASF_TOP_LEVEL = (  # the objects an ASF file holds: header, data, then the indexes
    _ASF_HEADER,
    _ASF_DATA,
    bytes.fromhex("90080033b1e5cf1189f400a0c90349cb"),  # Simple Index
    bytes.fromhex("d329e2d6da35d111903400a0c90349be"),  # Index
    bytes.fromhex("f803b1fead12644c840f2a1d2f7ad48c"),  # Media Object Index
    bytes.fromhex("d03fb73c4a0c0348953dedf7b6228f0c"),  # Timecode Index
)
_ASF_OBJECT_HEADER = 24  # a GUID and a 64-bit little-endian size
_ASF_MAX_HEADER = 1 << 20  # read at most this much of the header to find its file properties


def _asf_broadcast(header: bytes) -> bool:
    """Whether the ASF header's File Properties set the broadcast flag (a live stream, whose
    sizes are not filled in); True also when the header cannot be read through."""
    offset = 30  # the header object's own fields: GUID, size, object count, two reserved bytes
    while offset + _ASF_OBJECT_HEADER <= len(header):
        length = int.from_bytes(header[offset + 16 : offset + 24], "little")
        if header[offset : offset + 16] == _ASF_FILE_PROPERTIES:
            flags = header[offset + 88 : offset + 92]
            return len(flags) < 4 or bool(flags[0] & 1)
        if length < _ASF_OBJECT_HEADER:
            return True
        offset += length
    return True


def _asf_objects_end(handle, size: int) -> int | None:
    """The end of the last top-level object of an ASF file (WMV, WMA): the header, the data
    and the indexes each record their size. None for a live stream (broadcast flag)."""
    handle.seek(0)
    header = handle.read(_ASF_MAX_HEADER)
    if not header.startswith(_ASF_HEADER) or len(header) < _ASF_OBJECT_HEADER:
        return None
    header_length = int.from_bytes(header[16:24], "little")
    if len(header) < min(header_length, _ASF_MAX_HEADER):
        return header_length  # the file ends inside its header
    if _asf_broadcast(header[:header_length]):
        return None
    offset = 0
    for _ in range(_MAX_BOXES):
        if offset >= size:
            return offset
        handle.seek(offset)
        head = handle.read(_ASF_OBJECT_HEADER)
        if len(head) < _ASF_OBJECT_HEADER:  # the file ends inside an object's GUID or size
            ours = any(guid.startswith(head[:16]) for guid in _ASF_TOP_LEVEL)
            return offset + _ASF_OBJECT_HEADER if ours else offset
        if head[:16] not in _ASF_TOP_LEVEL:
            return offset  # junk after the last object is not ours
        length = int.from_bytes(head[16:24], "little")
        if length < _ASF_OBJECT_HEADER:  # a writer that never went back to fill it in
            return None
        offset += length
    return None


_ASF_DATA_HEADER = 50  # the Data object's GUID, size, file ID, packet count and 2 reserved bytes
_ASF_MAX_PACKETS = 50_000_000


def asf_packet_break(path: str | os.PathLike, container: str | None) -> int | None:
    """Where the first data packet of an ASF file (WMV, WMA) that does not start as its first
    one lies: the packets are all one size (its File Properties give it), and WMV writers
    start each with the same error correction data (0x82 0 0), so a zeroed or overwritten
    one does not. A byte read a packet (about 1 s for an hour of video): for --exact alone.
    None where every packet starts so, the first does not (nothing to compare with), the
    packets are not all one size, other formats, or a structure that cannot be read."""
    if container != "asf":
        return None
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            header = handle.read(_ASF_MAX_HEADER)
            packet = _asf_packet_size(header)
            at = int.from_bytes(header[16:24], "little")  # the Data object: after the header
            handle.seek(at)
            data = handle.read(_ASF_OBJECT_HEADER)
            if packet is None or data[:16] != _ASF_DATA or len(data) < _ASF_OBJECT_HEADER:
                return None
            length = int.from_bytes(data[16:24], "little")
            start, end = at + _ASF_DATA_HEADER, min(at + length, size)
            handle.seek(start)
            first = handle.read(3)
            if first != b"\x82\x00\x00":
                return None
            for offset in range(start + packet, end, packet)[:_ASF_MAX_PACKETS]:
                handle.seek(offset)
                if handle.read(3) != first:
                    return offset
    except OSError:
        return None
    return None


def _asf_packet_size(header: bytes) -> int | None:
    """The data packets' size that an ASF header's File Properties give (its minimum and
    maximum the same), None where they differ or are not found."""
    offset = 30  # the header object's own fields: GUID, size, object count, two reserved bytes
    while offset + _ASF_OBJECT_HEADER <= len(header):
        length = int.from_bytes(header[offset + 16 : offset + 24], "little")
        if header[offset : offset + 16] == _ASF_FILE_PROPERTIES:
            sizes = header[offset + 92 : offset + 100]
            smallest, largest = (
                int.from_bytes(sizes[:4], "little"),
                int.from_bytes(sizes[4:], "little"),
            )
            return smallest if len(sizes) == 8 and smallest == largest > 0 else None
        if length < _ASF_OBJECT_HEADER:
            return None
        offset += length
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


def _ebml_elements(data: bytes, position: int, end: int | None = None):
    """The EBML elements of `data` from `position` to `end` (its length): (ID, where its data
    starts, its length: -1 for an unknown one, which runs to its parent's end and ends the
    walk). The last may run past `data`: the caller checks what it reads."""
    end = len(data) if end is None else end
    while position < end:
        element = _ebml_number(data, position, keep_marker=True)
        length = element and _ebml_number(data, position + element[1], keep_marker=False)
        if not length:
            return
        start = position + element[1] + length[1]
        yield element[0], start, length[0]
        if length[0] < 0:
            return
        position = start + length[0]


def _ebml_segment_end(handle, size: int) -> int | None:
    """The end of the Segment of a Matroska/WebM file (None when it is written as unknown, as
    live recordings do)."""
    handle.seek(0)
    head = handle.read(4096)
    # the EBML header, then perhaps Void elements, then the Segment
    for element_id, start, length in itertools.islice(_ebml_elements(head, 0), 8):
        if element_id == _MKV_SEGMENT:
            return None if length < 0 else start + length
    return None


# --- a Matroska/WebM video track's own length ---------------------------------------------------
#
# FFmpeg gives a Matroska file's duration, the longest stream's, as its video's, and OpenCV's
# frame count is that duration times the frame rate: 50 frames for 5 beside 2 s of audio. The
# muxers record each track's own length as a tag (FFmpeg's DURATION, mkvmerge's DURATION and
# NUMBER_OF_FRAMES) in the Tags near the start, or where the SeekHead says.

_MKV_SEGMENT, _MKV_SEEK_HEAD, _MKV_TRACKS, _MKV_TAGS = (
    0x18538067,
    0x114D9B74,
    0x1654AE6B,
    0x1254C367,
)
_MKV_CLUSTER = 0x1F43B675
_MKV_HEAD = 1 << 14  # the first bytes read for the Tracks and Tags (writers put them first)
_MKV_MAX_TAGS = 1 << 20  # Tags elsewhere in the file are read if no bigger than this
_MKV_DURATION = re.compile(r"(\d+):(\d\d):(\d\d(?:\.\d*)?)")


def matroska_video_frames(
    path: str | os.PathLike, container: str | None, fps: float | None
) -> int | None:
    """The frames of the first video track of a Matroska/WebM file as its tags record them:
    NUMBER_OF_FRAMES, or its DURATION times `fps`. None for other formats, a file without the
    tags (a browser's recording) or a structure that cannot be read."""
    if container not in ("mkv", "webm"):
        return None
    try:
        with open(path, "rb") as handle:
            tags = _matroska_track_tags(handle)
    except OSError:
        return None
    if tags is None:
        return None
    try:
        if "NUMBER_OF_FRAMES" in tags:
            return int(tags["NUMBER_OF_FRAMES"])
        match = _MKV_DURATION.fullmatch(tags.get("DURATION", ""))
    except ValueError:
        return None
    if match is None or not fps:
        return None
    hours, minutes, seconds = match.groups()
    return round((int(hours) * 3600 + int(minutes) * 60 + float(seconds)) * fps)


_MKV_SIMPLE_BLOCK, _MKV_BLOCK_GROUP, _MKV_BLOCK = 0xA3, 0xA0, 0xA1
_MKV_CLUSTER_TIME, _MKV_REFERENCE_BLOCK = 0xE7, 0xFB
_MKV_MAX_ELEMENTS = 50_000_000  # a day of 30 fps video and its audio; a bound for a corrupt file


def matroska_video_blocks(path: str | os.PathLike, container: str | None) -> HeldFrames | None:
    """The frames the clusters of a Matroska/WebM file hold for its first video track: its
    blocks (SimpleBlock, or a BlockGroup's Block), a laced one's frames each, those flagged
    invisible (a VP8 alternate reference, which decodes to no picture) left out; those before
    its first key frame and those of a few bytes; and where, inside the sizes its Segment and
    Clusters record, its bytes stop being elements (zeroed or overwritten). A header or two
    are read a block (7 us: about 2 s for an hour of 30 fps video and its audio), so for
    --exact alone, whose decode of every frame takes far longer. None for other formats,
    Tracks not in the first bytes, or a Cluster or the Segment of unknown size (a live
    recording)."""
    if container not in ("mkv", "webm"):
        return None
    try:
        with open(path, "rb") as handle:
            return _matroska_video_blocks(handle, os.fstat(handle.fileno()).st_size)
    except OSError:
        return None


def _matroska_video_blocks(handle, size: int) -> HeldFrames | None:
    """The frames a Matroska/WebM file's clusters hold for its video track, walked element by
    element (a block's first bytes read, never its frame); `broken_at` where an element's bytes
    stop being one inside the segment's size. None where the file's head names no video track,
    a cluster is of unknown size (live WebM), or the walk passes `_MKV_MAX_ELEMENTS`."""
    head = handle.read(_MKV_HEAD)
    elements = _matroska_head_elements(head)
    if elements is None or _MKV_TRACKS not in elements[1]:
        return None
    entry = _matroska_video_entry(head, *elements[1][_MKV_TRACKS])
    number = None if entry is None else entry.get(0xD7)  # TrackNumber
    segment = next(((s, n) for i, s, n in _ebml_elements(head, 0) if i == _MKV_SEGMENT), None)
    if not number or segment is None:
        return None
    track = int.from_bytes(number, "big")
    # a live recording's Segment or Clusters of unknown size: past bytes that are no element,
    # the walk goes on at the next Cluster (as FFmpeg's reader does), the frames it passed
    # counted from the times either side; a file of known sizes gives its break alone
    live = segment[1] < 0
    times: list[int] = []
    places: list[int] = []
    firsts: list[int] = []
    lasts: list[int] = []
    here = 0  # where the block being counted starts

    def element(at: int) -> tuple[int, int, int, bytes] | None:
        """(ID, where its data starts, its length, its first bytes) of the element at `at`;
        None where its bytes are no element's, or one that runs past its parent's end."""
        handle.seek(at)
        data = handle.read(24)
        found = _ebml_number(data, 0, keep_marker=True)
        length = found and _ebml_number(data, found[1], keep_marker=False)
        if not length:
            return None
        return found[0], at + found[1] + length[1], length[0], data[found[1] + length[1] :]

    frames, leading, not_coded, key_time, cluster_time = 0, 0, 0, None, 0

    def count(block: bytes, length: int, key: bool | None = None) -> None:
        """Count the shown frames of a Block or SimpleBlock of the video track (its first
        bytes, `length` in all), and those of them that lead the first key frame: `key` for a
        Block (its group refers to no other), a SimpleBlock's own flag where None, and those of
        `NOT_CODED_BYTES` or fewer."""
        nonlocal frames, leading, not_coded, key_time
        owner = _ebml_number(block, 0, keep_marker=False)
        if owner is None or owner[0] != track or len(block) < owner[1] + 3:
            return
        flags = block[owner[1] + 2]
        if flags & 0x08:  # invisible
            return
        key = bool(flags & 0x80) if key is None else key
        laced = flags >> 1 & 3
        shown = 1 if not laced else (block[owner[1] + 3] + 1 if len(block) > owner[1] + 3 else 0)
        if not laced and length - owner[1] - 3 <= NOT_CODED_BYTES:
            not_coded += 1
        # its time: the cluster's and its own offset from it (a signed 16-bit number)
        time = cluster_time + int.from_bytes(block[owner[1] : owner[1] + 2], "big", signed=True)
        if key_time is None and key:
            key_time = time
        elif key_time is None or time <= key_time:  # a muxer lifts a time before 0 to 0
            leading += shown
        frames += shown
        times.append(time)
        places.append(here)

    def held(broken_at: int | None) -> HeldFrames:
        # no key frame flagged: a writer that sets no flags, which tells nothing of them
        leads = leading if key_time is not None else 0
        if not live:
            return HeldFrames(frames, leads, not_coded, broken_at)
        import numpy as np

        missing = frames_between(*(np.array(x, np.int64) for x in (times, places, firsts, lasts)))
        broken = firsts[0] if firsts else None
        return HeldFrames(frames + missing, leads, not_coded, broken, past_breaks=True)

    def passed(at: int, resumed: int) -> int:
        firsts.append(at)
        lasts.append(resumed - 1)
        return resumed

    at, end = segment[0], size if live else min(segment[0] + segment[1], size)
    budget = _MKV_MAX_ELEMENTS
    while at < end:
        found = element(at)
        if found is not None and found[2] < 0 and found[0] != _MKV_CLUSTER:
            return None  # an element of unknown size that holds no frames
        if found is None or found[1] + max(found[2], 0) > end:
            resumed = _matroska_cluster_after(handle, at, end) if live else None
            if resumed is None:  # the file's end: a live recording cut there reads so
                return held(None if live else at)
            at = passed(at, resumed)
            continue
        kind, start, length, _ = found
        if kind == _MKV_CLUSTER:
            live = live or length < 0
            child, cluster_end = start, end if length < 0 else start + length
            while child < cluster_end:
                budget -= 1
                inner = element(child)
                if budget < 0:
                    return None
                if length < 0 and inner is not None and inner[0] in _MKV_LEVEL_1:
                    break  # a Cluster of unknown size ends where the next one starts
                if inner is None or inner[2] < 0 or inner[1] + inner[2] > cluster_end:
                    if not live:
                        return held(child)
                    if length >= 0:  # the rest of a Cluster of known size passed
                        child = passed(child, cluster_end)
                    break  # else the walk goes on from there: the next Cluster
                inner_kind, inner_start, inner_length, first = inner
                here = child
                if inner_kind == _MKV_CLUSTER_TIME:
                    cluster_time = int.from_bytes(first[: min(inner_length, 8)], "big")
                elif inner_kind == _MKV_SIMPLE_BLOCK:
                    count(first, inner_length)
                elif inner_kind == _MKV_BLOCK_GROUP:
                    block, referenced = _ebml_group(element, inner_start, inner_length)
                    if block is not None:
                        count(*block, key=not referenced)
                child = inner_start + inner_length
            if length < 0 or child < cluster_end:
                at = child
                continue
        at = start + length
    return held(None)


# The top-level elements of a Matroska Segment (and the EBML header of a stream that follows)
_MKV_LEVEL_1 = frozenset(
    {_MKV_CLUSTER, _MKV_SEEK_HEAD, _MKV_TRACKS, _MKV_TAGS, 0x1C53BB6B, 0x1043A770, 0x1941A469}
    | {0x1549A966, 0x1A45DFA3}
)
_MKV_RESYNC_BYTES = 1 << 26  # past a break, the next Cluster is searched for this far


def _matroska_cluster_after(handle, at: int, end: int) -> int | None:
    """Where the first Cluster after byte `at` of a Matroska/WebM file starts: its ID, a size,
    then (after a CRC-32 element, where one is) its time, as writers put it first, within
    `_MKV_RESYNC_BYTES`."""
    stop = min(end, at + _MKV_RESYNC_BYTES)
    step = 1 << 20
    for chunk in range(at + 1, stop, step):
        handle.seek(chunk)
        data = handle.read(min(step + 16, stop - chunk))
        found = data.find(b"\x1f\x43\xb6\x75")
        while found >= 0:
            length = _ebml_number(data, found + 4, keep_marker=False)
            child = found + 4 + length[1] if length is not None else len(data)
            if data[child : child + 2] == b"\xbf\x84":  # a CRC-32 element first (mkvmerge's)
                child += 6
            if data[child : child + 1] == b"\xe7":
                return chunk + found
            found = data.find(b"\x1f\x43\xb6\x75", found + 1)
    return None


def _ebml_group(element, start: int, length: int) -> tuple[tuple[bytes, int] | None, bool]:
    """The first bytes and the length of the Block of the BlockGroup whose data is at `start`
    (None if it holds none), and whether the group refers to other blocks (a ReferenceBlock:
    no key frame)."""
    block, referenced, at = None, False, start
    while at < start + length:
        found = element(at)
        if found is None or found[2] < 0:
            break
        if found[0] == _MKV_BLOCK:
            block = found[3], found[2]
        referenced = referenced or found[0] == _MKV_REFERENCE_BLOCK
        at = found[1] + found[2]
    return block, referenced


def _matroska_head_elements(head: bytes) -> tuple[int, dict[int, tuple[int, int]]] | None:
    """Where the Segment's data starts in a Matroska/WebM file's first bytes `head`, and the
    (start, end) of the data of its first SeekHead, Tracks and Tags wholly in `head`, before
    the first Cluster; None where `head` holds no Segment."""
    segment = next((s for i, s, _ in _ebml_elements(head, 0) if i == _MKV_SEGMENT), None)
    if segment is None:
        return None
    found: dict[int, tuple[int, int]] = {}
    for element_id, start, length in _ebml_elements(head, segment):
        if element_id == _MKV_CLUSTER:
            break
        if element_id in (_MKV_SEEK_HEAD, _MKV_TRACKS, _MKV_TAGS) and 0 <= start + length <= len(
            head
        ):
            found.setdefault(element_id, (start, start + length))
    return segment, found


def _matroska_track_tags(handle) -> dict[str, str] | None:
    """The simple tags (name: text) of the first video track of a Matroska/WebM file."""
    head = handle.read(_MKV_HEAD)
    elements = _matroska_head_elements(head)
    if elements is None or _MKV_TRACKS not in elements[1]:
        return None
    segment, found = elements
    uid = _matroska_video_uid(head, *found[_MKV_TRACKS])
    if uid is None:
        return None
    if _MKV_TAGS in found:
        tags, start, end = head, *found[_MKV_TAGS]
    else:
        at = _matroska_seek_position(head, found.get(_MKV_SEEK_HEAD), _MKV_TAGS)
        if at is None:
            return None
        handle.seek(segment + at)
        tags = handle.read(_MKV_MAX_TAGS)
        element = next(_ebml_elements(tags, 0), None)
        if element is None or element[0] != _MKV_TAGS or element[2] < 0:
            return None
        start, end = element[1], element[1] + element[2]
        if end > len(tags):
            return None
    return _matroska_simple_tags(tags, start, end, uid)


def _children(data: bytes, start: int, end: int) -> dict[int, bytes]:
    """The first child element of each ID of the element `data[start:end]`, as bytes."""
    found: dict[int, bytes] = {}
    for element_id, at, length in _ebml_elements(data, start, end):
        if length < 0:
            break
        found.setdefault(element_id, data[at : at + length])
    return found


def _matroska_video_entry(data: bytes, start: int, end: int) -> dict[int, bytes] | None:
    """The children of the first video track's TrackEntry (TrackType 1) in the Tracks
    `data[start:end]`."""
    for element_id, at, length in _ebml_elements(data, start, end):
        if element_id == 0xAE and length >= 0:  # TrackEntry
            entry = _children(data, at, at + length)
            if int.from_bytes(entry.get(0x83, b""), "big") == 1:  # TrackType: video
                return entry
    return None


def _matroska_video_uid(data: bytes, start: int, end: int) -> int | None:
    """The TrackUID of the first video track (TrackType 1) in the Tracks `data[start:end]`."""
    entry = _matroska_video_entry(data, start, end)
    uid = None if entry is None else entry.get(0x73C5)  # TrackUID
    return None if uid is None else int.from_bytes(uid, "big")


def matroska_mirroring_roll(path: str | os.PathLike, container: str | None) -> float | None:
    """The ProjectionPoseRoll (degrees, counter-clockwise) of a Matroska/WebM file whose first
    video track's Projection mirrors it, as FFmpeg reads one: rectangular (ProjectionType 0,
    the default), no ProjectionPrivate of another version, a pitch of 0 and a yaw of 180 or
    -180, which the specification says mirrors the picture left to right (FFmpeg makes it a
    display matrix that mirrors, then turns by the roll). None for another Projection or
    none, a roll that is no finite number (FFmpeg ignores a NaN one, and its matrix of an
    infinite one holds no angle: its cosine and sine are NaN), other formats, or a structure
    that cannot be read."""
    if container not in ("mkv", "webm"):
        return None
    try:
        with open(path, "rb") as handle:
            head = handle.read(_MKV_HEAD)
    except OSError:
        return None
    elements = _matroska_head_elements(head)
    if elements is None or _MKV_TRACKS not in elements[1]:
        return None
    entry = _matroska_video_entry(head, *elements[1][_MKV_TRACKS])
    video = None if entry is None else entry.get(0xE0)  # Video
    projection = None if video is None else _children(video, 0, len(video)).get(0x7670)
    if projection is None:
        return None
    fields = _children(projection, 0, len(projection))
    kind, private = fields.get(0x7671, b""), fields.get(0x7672, b"")
    if int.from_bytes(kind, "big") != 0 or private[:1] not in (b"", b"\x00"):
        return None
    yaw, pitch, roll = (_ebml_float(fields.get(i, b"")) for i in (0x7673, 0x7674, 0x7675))
    if pitch != 0 or yaw not in (180.0, -180.0) or roll is None or not math.isfinite(roll):
        return None
    return roll


def _ebml_float(data: bytes) -> float | None:
    """An EBML float element's value: 0 for no bytes, else 4 or 8 big-endian (None else)."""
    if not data:
        return 0.0
    return struct.unpack(">f" if len(data) == 4 else ">d", data)[0] if len(data) in (4, 8) else None


def _matroska_seek_position(
    data: bytes, seek_head: tuple[int, int] | None, wanted: int
) -> int | None:
    """Where the SeekHead says the element `wanted` is, from the Segment's data start."""
    if seek_head is None:
        return None
    for element_id, at, length in _ebml_elements(data, *seek_head):
        if element_id == 0x4DBB and length >= 0:  # Seek: SeekID, SeekPosition
            seek = _children(data, at, at + length)
            if int.from_bytes(seek.get(0x53AB, b""), "big") == wanted and 0x53AC in seek:
                return int.from_bytes(seek[0x53AC], "big")
    return None


def _matroska_simple_tags(data: bytes, start: int, end: int, uid: int) -> dict[str, str]:
    """The simple tags (TagName: TagString) of the Tags `data[start:end]` whose Targets name
    the track `uid`."""
    tags: dict[str, str] = {}
    for element_id, at, length in _ebml_elements(data, start, end):
        if element_id != 0x7373 or length < 0:  # Tag: Targets, SimpleTag...
            continue
        targets = _children(data, at, at + length).get(0x63C0, b"")
        track = _children(targets, 0, len(targets)).get(0x63C5)  # TagTrackUID
        if track is None or int.from_bytes(track, "big") != uid:
            continue
        for child_id, child_at, child_length in _ebml_elements(data, at, at + length):
            if child_id == 0x67C8 and child_length >= 0:  # SimpleTag: TagName, TagString
                simple = _children(data, child_at, child_at + child_length)
                name, text = (
                    simple.get(key, b"").decode("utf-8", "replace").rstrip("\x00")
                    for key in (0x45A3, 0x4487)
                )
                tags.setdefault(name, text)
    return tags


_Y4M_MAX_HEADER = 4096
_Y4M_FRAME = b"FRAME\n"  # a frame's header line without parameters, as writers have it
# A stream header's C tag: the chroma layout, then a sample depth over 8 bits (420p10, mono16)
_Y4M_COLOUR = re.compile(rb"(mono|411|420|422|444)(?:jpeg|paldv|mpeg2|(alpha))?p?(\d*)")


def _y4m_frame_bytes(width: int, height: int, colour: bytes) -> int | None:
    """The bytes of one Y4M frame of the `colour` layout (its C tag); None for one unknown."""
    match = _Y4M_COLOUR.fullmatch(colour)
    if match is None or width <= 0 or height <= 0:
        return None
    layout, alpha, depth = match.groups()
    half_width, half_height = -(-width // 2), -(-height // 2)  # odd sizes round chroma up
    chroma = {
        b"mono": 0,
        b"411": 2 * -(-width // 4) * height,
        b"420": 2 * half_width * half_height,
        b"422": 2 * half_width * height,
        b"444": 2 * width * height,
    }[layout]
    planes = width * height * (2 if alpha else 1) + chroma
    return planes * (2 if depth and int(depth) > 8 else 1)


def _y4m_frames_end(handle, size: int) -> int | None:
    """The end of the last frame of a YUV4MPEG2 file: a header line, then frames of one size
    (a "FRAME" line and the planes), so a cut copy ends inside one."""
    handle.seek(0)
    head = handle.read(_Y4M_MAX_HEADER)
    line_end = head.find(b"\n")
    if line_end < 0:
        return None
    tags = {field[:1]: field[1:] for field in head[:line_end].split()[1:]}
    try:
        width, height = int(tags[b"W"]), int(tags[b"H"])
    except (KeyError, ValueError):
        return None
    frame_bytes = _y4m_frame_bytes(width, height, tags.get(b"C", b"420jpeg"))
    if frame_bytes is None:
        return None
    offset = line_end + 1
    # Frame lines without parameters: the end is arithmetic, checked at the last frame's start.
    unit = len(_Y4M_FRAME) + frame_bytes
    frames = -(-(size - offset) // unit)
    if frames <= 0:
        return offset
    handle.seek(offset + (frames - 1) * unit)
    if handle.read(len(_Y4M_FRAME)) == _Y4M_FRAME:
        return offset + frames * unit
    for _ in range(_MAX_BOXES):  # frame lines with parameters: one frame at a time
        if offset >= size:
            return offset
        handle.seek(offset)
        line = handle.read(256)
        line_end = line.find(b"\n")
        if not line.startswith(b"FRAME") and not b"FRAME".startswith(line):
            return None  # not a frame: trailing data we cannot judge
        if line_end < 0:  # the file ends inside the frame's line
            if len(line) == 256:
                return None
            return offset + max(len(line) + 1, len(_Y4M_FRAME)) + frame_bytes
        offset += line_end + 1 + frame_bytes
    return None


_DIF_SEQUENCE = 150 * 80  # bytes: 150 DIF blocks of 80 bytes
_DIF_SEQUENCES = 48  # a DV frame's at most (DVCPRO HD 1080i50: 12 sequences on 4 channels)


def _dv_frames_end(handle, size: int) -> int | None:
    """The end of the last frame of a raw DV file: its frames are all one size, whole DIF
    sequences up to the next frame's first (the header block of sequence 0, channel 0), so a
    cut copy ends inside one. None where the second frame's start is not found."""
    for sequences in range(1, _DIF_SEQUENCES + 1):
        start = sequences * _DIF_SEQUENCE
        if start >= size:
            return None
        handle.seek(start)
        block = handle.read(3)
        if len(block) == 3 and block[0] == 0x1F and block[1] >> 3 == 0 and block[2] == 0:
            return -(-size // start) * start
    return None


_MAX_FLV_TAGS = 10_000_000  # hours of audio and video tags; a bound for a corrupt file


def _flv_tags_end(handle, size: int) -> int | None:
    """Where the last tag of an FLV file ends (with the 4-byte size that follows each tag): past
    the file's end when a copy is cut inside a tag, whose frame FFmpeg still decodes from what
    is there. A file ending on a tag's size says nothing (a cut between two tags looks the same):
    None, as for a structure that cannot be read. The tags are walked from the first only where
    the file's last 4 bytes lead to no tag. Where it ends on a tag's size, the file's size
    its metadata records (`_flv_recorded_size`), where that is more: a copy cut between two
    tags."""
    if _flv_last_tag(handle, size) is not None:
        return _flv_recorded_size(handle, size)
    handle.seek(5)
    header = handle.read(4)
    if len(header) < 4:
        return None
    offset = int.from_bytes(header, "big") + 4  # the header, then the size of no tag before
    for _ in range(_MAX_FLV_TAGS):
        if offset >= size:
            return _flv_recorded_size(handle, size)  # ends on a tag's size
        handle.seek(offset)
        tag = handle.read(_FLV_TAG_HEADER)
        # its type, and a stream ID of 0 (always, the specification says), of as much as is there
        if tag[0] & 0x1F not in (8, 9, 18) or tag[8:11].strip(b"\x00"):
            return None  # not a tag: trailing data we cannot judge
        if len(tag) < _FLV_TAG_HEADER:  # the file ends inside a tag's header
            return offset + _FLV_TAG_HEADER + 4
        end = offset + _FLV_TAG_HEADER + int.from_bytes(tag[1:4], "big") + 4
        if end - 4 > size:
            return end
        offset = end
    return None


# The file size an FLV's onMetaData records (an AMF0 number), as FFmpeg writes it once the
# file is written (a live stream's recording has none)
_FLV_FILESIZE = re.compile(rb"\x00\x08filesize\x00([\s\S]{8})")
_FLV_METADATA_BYTES = 1 << 16  # the first bytes searched for it: the first tag holds it


def _flv_recorded_size(handle, size: int) -> int | None:
    """The file size an FLV's metadata records where it is more than the file's `size` (a
    copy cut between two tags, which the tags' own sizes cannot tell); None where it records
    none, or no more (a writer that fills in the tags' metadata before the end)."""
    handle.seek(0)
    found = _FLV_FILESIZE.search(handle.read(_FLV_METADATA_BYTES))
    if found is None:
        return None
    recorded = struct.unpack(">d", found.group(1))[0]
    if not math.isfinite(recorded) or not size < recorded < 1 << 50:
        return None
    return int(recorded)


_OGG_TAIL = 65_307 + 27  # the most bytes of a page (255 segments of 255 bytes), and another's head


def _ogg_pages_end(handle, size: int) -> int | None:
    """Where the last page of an Ogg file ends, found in its last bytes: past the file's end
    when a copy is cut inside it; the file's end where that page ends it and closes its
    stream (the end-of-stream flag, which a whole file's last page sets). A file that ends on
    a page's end without it says nothing (a copy cut between two pages, a live stream's
    recording): None, as for a structure that cannot be read."""
    start = max(0, size - _OGG_TAIL)
    handle.seek(start)
    tail = handle.read(size - start)
    at = tail.rfind(b"OggS\x00")
    if at < 0 or at + 27 > len(tail):
        return None if at < 0 else start + at + 27  # the file ends inside the page's header
    table = at + 27 + tail[at + 26]
    if table > len(tail):
        return start + table  # inside its segment table
    end = table + sum(tail[at + 27 : table])
    if end > len(tail):
        return start + end
    return size if end == len(tail) and tail[at + 5] & 4 else None


_MPEG_START = b"\x00\x00\x01"  # the prefix of every MPEG start code (program stream, video)
_PS_PACK = _MPEG_START + b"\xba"
_PS_END_CODE = 0xB9
_PS_TAIL = 1 << 17  # the last bytes searched for a pack start (a PES packet is under 64 KiB)


def _mpeg_ps_end(handle, size: int) -> int | None:
    """Where the last packet of an MPEG program stream (.mpg, .vob) ends, walked from a pack
    start near the end: past the file's end when a copy is cut inside a pack. A stream that
    ends on a packet boundary without the end code (FFmpeg writes none) says nothing: None,
    as for a structure that cannot be read."""
    start = max(0, size - _PS_TAIL)
    handle.seek(start)
    tail = handle.read(size - start)
    at = tail.find(_PS_PACK)
    while at >= 0:  # a pack start code may also occur inside a packet's data: walk from each
        end = _ps_packets_end(tail, at)
        if end is not None:
            whole_or_cut = end != len(tail) or tail[end - 4 : end] == _MPEG_START + b"\xb9"
            return start + end if whole_or_cut else None
        at = tail.find(_PS_PACK, at + 1)
    return None


def _ps_packets_end(data: bytes, offset: int) -> int | None:
    """The end of the packs and packets of `data` from `offset` (past its end when the last
    is cut short; the end code's end when one is found); None when they are not a program
    stream's."""
    while offset < len(data):
        start_code = data[offset : offset + 4]
        if len(start_code) < 4:  # the file ends inside a start code
            return offset + 4 if _MPEG_START.startswith(start_code[:3]) else None
        if start_code[:3] != _MPEG_START or start_code[3] < _PS_END_CODE:
            return None
        if start_code[3] == _PS_END_CODE:
            return offset + 4
        if start_code == _PS_PACK:
            if offset + 5 > len(data):
                return offset + 12
            marker = data[offset + 4] >> 4
            if marker >> 2 == 0b01:  # MPEG-2: 14 bytes and up to 7 of stuffing
                if offset + 14 > len(data):
                    return offset + 14
                length = 14 + (data[offset + 13] & 7)
            elif marker == 0b0010:  # MPEG-1: 12 bytes
                length = 12
            else:
                return None
        else:  # a system header or a PES packet: its length follows the start code
            if offset + 6 > len(data):
                return offset + 6
            length = 6 + int.from_bytes(data[offset + 4 : offset + 6], "big")
        offset += length
    return offset


_MPEG_TAIL = 1 << 20  # the last picture of a raw MPEG video stream is sought this far from its end


def _start_codes(data: bytes, start: int = 0) -> Iterator[tuple[int, int]]:
    """(position, code) of each MPEG start code (00 00 01 xx) in `data` from `start`; coded
    data never holds one, so the stream's structure is read without decoding it."""
    at = data.find(_MPEG_START, start)
    while 0 <= at < len(data) - 3:
        yield at, data[at + 3]
        at = data.find(_MPEG_START, at + 3)


def last_picture_rows(path: str | os.PathLike, size: int) -> tuple[int, int] | None:
    """For a raw MPEG-2 video stream (.m2v), which records neither sizes nor a frame count:
    (the macroblock rows its last picture's slices reach, the rows a picture has). A copy cut
    short stops inside a picture, whose slices then do not reach its last row. None where this
    cannot be told: MPEG-1 (a slice may span rows), a field picture, a stream ended by its end
    code, pictures over 2,800 lines high, or no picture in its last megabyte."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
            start = max(0, size - _MPEG_TAIL)
            handle.seek(start)
            tail = handle.read(size - start)
    except OSError:
        return None
    # The first sequence header (its height) and sequence extension (MPEG-2 only)
    codes = [(at, code) for at, code in _start_codes(head) if at + 7 <= len(head)]
    header = next((at for at, code in codes if code == 0xB3), None)
    extension = next((at for at, code in codes if code == 0xB5 and head[at + 4] >> 4 == 1), None)
    if header is None or extension is None:
        return None
    lines = (head[header + 5] & 0x0F) << 8 | head[header + 6]
    lines |= (head[extension + 6] >> 5 & 3) << 12
    progressive = head[extension + 5] >> 3 & 1
    if lines > 2800 or tail.endswith(_MPEG_START + b"\xb7"):
        return None
    rows = -(-lines // 16) if progressive else 2 * -(-lines // 32)
    picture = tail.rfind(_MPEG_START + b"\x00")
    if picture < 0:
        return None
    reached = 0
    for at, code in _start_codes(tail, picture + 4):
        if code == 0xB5 and at + 7 <= len(tail) and tail[at + 4] >> 4 == 8:
            if tail[at + 6] & 3 != 3:  # picture_structure: a field, half the rows
                return None
        elif 0x01 <= code <= 0xAF:  # a slice: its code is its row (1 the first)
            reached = max(reached, code)
    return reached, rows
