"""Reading one video: size, frames, fps, duration, codec and container with OpenCV, exact frame
counting by decoding, and the checks that tell a truncated or corrupt file from a whole one.

OpenCV is imported inside functions only, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from torchkit.core.io.errors import first_line
from torchkit.core.io.file_kinds import LINK_TO_NOTHING, file_kind
from torchkit.core.io.non_utf8_names import holds_non_utf8
from torchkit.core.video.asf import (
    asf_packet_break,
)
from torchkit.core.video.avi import (
    avi_frames_with_data,
    avi_indexed_frames,
)
from torchkit.core.video.containers import (
    SNIFF_BYTES,
    container_fourcc,
    declared_size,
    declares_no_video,
    sniff_container,
    still_image_format,
)
from torchkit.core.video.held import (
    fourcc_text,
    mpeg4_packed,
    walks_kept,
)
from torchkit.core.video.matroska import (
    matroska_video_blocks,
    matroska_video_frames,
)
from torchkit.core.video.mp4 import (
    fragmented_frame_count,
    iso_boxes_break,
    iso_edited_frame_count,
    iso_frames_without_picture,
    iso_index_missing,
    last_frame_duration,
)
from torchkit.core.video.raw import (
    last_picture_rows,
    raw_mpeg_frame_rate,
    sequence_frame_rate,
)
from torchkit.core.video.streams import (
    FlvVideoTail,
    flv_cut_short,
    flv_last_tag_s,
    flv_recorded_size,
    flv_video_frames,
    flv_video_tail,
    flv_video_without_frames,
    mpeg_video_head,
    ogg_video_frames,
    ogg_video_without_frames,
    ps_video_frames,
    ts_video_frames,
)

STATUSES = ("ok", "truncated", "damaged", "unreadable")
# The frames the cheap end-of-file check decodes: it seeks to this many frames before the last
# one the header declares and reads on (seeking lands on a key frame and decodes forward, so
# this costs at most one group of pictures).
TAIL_FRAMES = 4


class _Stopped(Exception):
    """The run is being stopped (Ctrl-C, SIGTERM, a write error): a worker drops its video."""


@dataclass
class VideoInfo:
    """What is known about one video. `frames` is the count shown: `frames_decoded` when frames
    were counted by decoding (`frames_source == "decoded"`), else the container's estimate.
    `status` is `ok`, `truncated` (the file ends before what its container structure or its
    frame count declares), `damaged` (every byte its container declares is there, but its
    frames do not all decode: data zeroed or overwritten) or `unreadable`; `error` says why
    when it is not `ok`."""

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
    # Whether the container's sizes or a decode of its last frames say the file is all there
    # (a header count it falls short of is then wrong, not a cut). Not a column.
    known_whole: bool = field(default=False, repr=False)

    def fail(self, message: str, status: str = "unreadable") -> None:
        """Mark the video as not ok: `truncated` (it ends before what its container or header
        declares), `damaged` (all there, but its frames do not all decode) or `unreadable`
        (anything else that stops it being read)."""
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


def fourcc_to_text(code: float) -> str | None:
    """OpenCV's CAP_PROP_FOURCC number as its four characters (None for 0 or unprintable)."""
    number = int(code) if code and math.isfinite(code) else 0
    if number <= 0:
        return None
    return fourcc_text((number & 0xFFFFFFFF).to_bytes(4, "little"))


def _import_cv2():
    # FFmpeg's own log lines ("moov atom not found") would litter stderr for every broken file;
    # the error column says it instead. So would OpenCV's, which logs a video it cannot decode
    # at its ERROR level ("Could not find decoder for codec_id=0", "Failed to initialize
    # VideoCapture"): off. Users can still set these variables themselves.
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
    os.environ.setdefault("OPENCV_LOG_LEVEL", "OFF")
    import cv2

    return cv2


def _positive_int(value: float) -> int | None:
    return int(round(value)) if value and math.isfinite(value) and value > 0 else None


def _describe_unopenable(size: int, container: str | None, whole: bool = False) -> str:
    """Why FFmpeg could not open the file; `whole`: the container's sizes say it is all there
    (a recording stopped before its first frame holds no video track)."""
    if size == 0:
        return "empty file"
    if container is None:
        return "not a video file"
    if whole:
        return (
            f"no video FFmpeg can open in this {container} file (no video track, or a damaged one)"
        )
    return f"truncated or corrupt {container} file"


# The codec of a container that records no tag for it (FFmpeg gives none, so OpenCV's FOURCC is
# 0), as ffprobe names it: a Y4M file's frames are raw video.
_UNTAGGED_CODECS = {"y4m": "rawvideo"}


# AV1's tags (an MP4's, FFmpeg's). FFmpeg decodes AV1 with libdav1d or libaom, else with its own
# decoder, which needs a hardware one: an OpenCV build's FFmpeg without either library decodes
# no AV1 frame ("Your platform doesn't support hardware accelerated AV1 decoding")
_AV1_TAGS = frozenset({"av01", "AV01"})
# A 16x16 grey AV1 key frame in an IVF file (libaom's, 71 bytes), which any AV1 decoder decodes
_AV1_SAMPLE = bytes.fromhex(
    "444b4946000020004156303110001000190000000100000001000000000000001b0000000000000000000000"
    "12000a0a000000019ff9b5f20080320b1000c0000002800000009c"
)


@functools.cache
def opencv_decodes_av1() -> bool | None:
    """Whether this OpenCV's FFmpeg decodes AV1 (it has libdav1d, libaom or a hardware AV1
    decoder): a key frame of its own decoded, once a process; None where that cannot be
    tried (no temporary file)."""
    import tempfile

    cv2 = _import_cv2()
    try:
        with tempfile.TemporaryDirectory(prefix="torchkit-av1-") as folder:
            sample = Path(folder) / "key.ivf"
            sample.write_bytes(_AV1_SAMPLE)
            capture = _open_capture(cv2, sample, decoder_threads=1)
            if capture is None:
                return False
            try:
                return bool(capture.grab())
            finally:
                capture.release()
    except OSError:
        return None


def _undecodable(codec: str | None, declares_none: bool) -> str:
    """Why no frame of a video of `codec` (its tag) decodes: its header declares none
    (`declares_none`: `NO_FRAMES`); an AV1 video where this OpenCV decodes no AV1 (a whole
    file cannot be told from a corrupt one there: asked only here, where no frame decoded);
    else truncated or corrupt."""
    if declares_none:
        return NO_FRAMES
    decodes = opencv_decodes_av1() if codec in _AV1_TAGS else True
    if decodes:
        return "no frame decodes (truncated or corrupt)"
    if decodes is None:
        return (
            "no frame decodes: an AV1 video, which OpenCV's FFmpeg decodes only with libdav1d, "
            "libaom or a hardware AV1 decoder (else truncated or corrupt)"
        )
    return (
        "no frame decodes: an AV1 video, and this OpenCV's FFmpeg decodes no AV1 (it has "
        "neither libdav1d nor libaom, nor a hardware AV1 decoder)"
    )


# A video whose header declares no frame and none decodes: a recording stopped before its first
# frame (a writer opened and released), not a damaged file.
NO_FRAMES = "empty video: it holds no frames (its header declares none)"


# --- truncation (the container's sizes: containers.declared_size) ------------------------------


def _shortfall(info: VideoInfo, declared: int | None) -> str | None:
    if declared is None or info.size_bytes is None or declared <= info.size_bytes:
        return None
    return (
        f"truncated: the file holds {info.size_bytes:,} of the {declared:,} bytes its "
        f"{info.container} structure declares"
    )


def _picture_cut(path: Path, container: str | None, size: int) -> str | None:
    """A message when a raw MPEG-2 video stream stops inside its last picture (a copy cut
    short: such a stream records neither its size nor its frame count)."""
    rows = last_picture_rows(path, size) if container == "mpeg-video" else None
    if rows is None or rows[0] >= rows[1]:
        return None
    return f"truncated: its last picture stops at macroblock row {rows[0]:,} of {rows[1]:,}"


def _index_missing(path: Path, container: str | None) -> str | None:
    """A message when an MP4/MOV/3GP file has media data but no index (moov), whose sizes
    then say nothing: a recording not finished (its mdat runs to the end) or cut short."""
    if not iso_index_missing(path, container):
        return None
    return (
        "truncated: no index (moov box), which a recorder writes when it finishes: still "
        "being written, stopped before the end, or a copy cut short"
    )


def _frame_slack(header: int) -> int:
    """Frames a count may fall short of the header by without calling the file truncated: a
    header count can be an estimate (duration x fps) or count a frame a decoder drops. A real
    cut loses more, and the container check catches the small ones where the format says."""
    return max(1, header // 100)


def _frames_short(decoded: int, header: int | None, reached: int = 0) -> str | None:
    """A message when `decoded` frames (the last at position `reached` by its timestamp, 0
    unknown) fall short of the `header` count. Where formats record no sizes, the header count
    is the duration times the frame rate: a variable-rate video holds fewer frames than that
    and still runs to the end, so the last frame's time is the evidence, a count only where
    the timestamps say nothing."""
    if header is None or max(decoded, reached) >= header - _frame_slack(header):
        return None
    return f"truncated: {decoded:,} of the {header:,} frames its header declares decode"


# Formats whose header count FFmpeg reckons from the file's duration, its longest stream's,
# where the container's sizes say the bytes are all there but nothing of the video's own
# length: beside audio that runs on, the count overstates the video's frames (100 for 25). An
# MKV/WebM whose tags record its video track's own length is counted from them instead;
# MP4/MOV/3GP and AVI count the video's samples, Y4M and raw DV hold video alone.
_COUNT_FROM_FILE_DURATION = frozenset({"mpeg-ts", "m2ts", "mpeg-ps", "asf", "mkv", "webm", "ogg"})


# Formats whose header count is the frames the file holds, one by one: an MP4/MOV/3GP sample
# table (or the frames its edit list shows), a Y4M or raw DV file's frames of one size. An
# AVI's index and a Matroska/WebM file's clusters are counted (`avi_indexed_frames`,
# `matroska_video_blocks`), and an ASF file's packets checked (`asf_packet_break`).
# Elsewhere a whole file's count may overstate its frames (an AVI stream length a writer
# overstates, a duration times a variable rate): there the last frame's time must fall
# short too.
_HEADER_COUNTS_EVERY_FRAME = frozenset({"mp4", "mov", "3gp", "y4m", "dv"})


# What counts a file's frames where its structure does (`_frames_lost`): Matroska/WebM's
# clusters elsewhere
_LISTED_BY = {
    "avi": "its index lists",
    "mpeg-ts": "its video packets hold",
    "m2ts": "its video packets hold",
    "flv": "its video tags hold",
    "ogg": "its video packets hold",
    "mpeg-ps": "its video packets hold",
}


def _frames_lost(
    info: VideoInfo, path: Path, end_s: float | None, count_from_duration: bool = False
) -> str | None:
    """A message when a file whose container's sizes say it is whole decodes (--exact) to
    fewer frames than it holds, the last ending `end_s` seconds in: its data is damaged (a
    region zeroed, as an unfinished download's preallocated file or a bad sector leaves it,
    or overwritten), which a count an estimate cannot explain. A decoder that skips a frame
    here and there stays within `_frame_slack`.
    `count_from_duration`: the header's count is the file's duration times the rate, which
    audio that runs on overstates: only the clusters of a Matroska/WebM file tell, or the
    structure breaking inside the bytes it declares (a Matroska/WebM file's elements, an
    ASF file's data packets)."""
    container, decoded, header = info.container, info.frames_decoded, info.frames_header
    held, reached, listed_by = header, 0, "its header declares"
    indexed = (
        avi_indexed_frames(path, container)
        or matroska_video_blocks(path, container)
        or ts_video_frames(path, container)
        or flv_video_frames(path, container)
        or ogg_video_frames(path, container)
        or ps_video_frames(path, container, info.fps)
    )
    # frames counted one each its units are not many more than its header's count, or the
    # times its units span at its rate (files joined by `cat`, each restarting its times)
    spanned = max(header or 0, _position(indexed.span_s, info.fps)) if indexed else 0
    if indexed is not None and indexed.past_breaks and spanned and indexed.frames > 1.5 * spanned:
        return None  # its units are not frames one each (fields, each its own packet)
    if indexed is not None:
        broken_at = indexed.broken_at
    else:
        broken_at = asf_packet_break(path, container) or iso_boxes_break(path, container)
    if count_from_duration and indexed is None and broken_at is None:
        return None
    # frames that give no picture in a whole file are not damage: those before the first key
    # frame (stored or shown before it), which have nothing to be decoded from in a stream cut
    # where no key frame starts it, and VOPs marked not coded (but in a packed bitstream)
    without_picture = iso_frames_without_picture(path, container)
    leading, not_coded = without_picture.leading, without_picture.not_coded
    if indexed is not None:
        leading, not_coded = indexed.leading, indexed.not_coded
        if broken_at is None or indexed.past_breaks:
            held = indexed.frames
            listed_by = _LISTED_BY.get(container or "", "its clusters hold")
    elif broken_at is None and container not in _HEADER_COUNTS_EVERY_FRAME:
        reached = _position(end_s, info.fps)
    if not_coded and mpeg4_packed(path):
        not_coded = 0  # placeholders for the B-frames packed before them, which FFmpeg shows
    if held is None or decoded is None:
        return None
    if max(decoded, reached) >= held - leading - not_coded - _frame_slack(held):
        return None
    if broken_at is not None:  # its elements or packets stop being so
        return (
            f"damaged: {decoded:,} of the {held:,} frames {listed_by} decode, and its "
            f"{container} structure breaks at byte {broken_at:,}, inside the bytes it declares"
        )
    return (
        f"damaged: {decoded:,} of the {held:,} frames {listed_by} decode, though the file "
        f"holds every byte its {container} structure declares"
    )


def _runs_on_past_its_video(
    path: Path, container: str | None, info: VideoInfo, sizes_whole: bool
) -> bool:
    """Whether a file whose video ends before its header's count (reckoned from the file's
    duration) has other streams that run on to that duration (audio longer than the video),
    so it is whole, not cut: its container's sizes say it is all there (`sizes_whole`); an
    FLV's last tag, of any stream, reaches it; an MPEG-PS or MPEG-TS file's duration is what
    FFmpeg reads from the timestamps at its end, of any stream, so a video short of it always
    ends before another stream (a cut ends them all, and the duration)."""
    if sizes_whole or container in ("mpeg-ps", "mpeg-ts", "m2ts"):
        return True
    reached, header = _flv_streams_end(path, container, info), info.frames_header
    return bool(reached and header) and _frames_short(0, header, reached) is None


def _flv_streams_end(path: Path, container: str | None, info: VideoInfo) -> int:
    """The frame position (at `info.fps`) where an FLV file's streams end: its last tag's
    time, of any stream, or later where the walk of its tags tells (the last video frame
    shown after its tag's time: B-frames; the last audio tag lasting longer than a frame),
    the last tag starting a frame of its own; 0 where it is not told (another format)."""
    end_s = flv_last_tag_s(path) if container == "flv" else None
    walked = flv_video_frames(path, container) if end_s is not None else None
    if walked is not None and walked.end_s is not None:
        end_s = max(end_s, walked.end_s)
    return _position(end_s, info.fps) + 1 if end_s else 0


def _flv_cut_between_tags(
    path: Path, container: str | None, info: VideoInfo, reached: int
) -> str | None:
    """A message when an FLV file whose video ends at frame position `reached` (the frames
    decoded, 0 where none were; or later where its video tags tell: their count, the last
    one's time shown, which counts from 0 as the duration does where a decoder's counts from
    the first frame shown), short of its header's count, falls short of the file size its
    metadata records by bytes that could hold the frames missing: a copy cut between two
    tags (`flv_cut_short`). The recorded size alone says nothing (a tool that rewrote the
    metadata may leave it stale), nor does a file whose frames reach the count."""
    header, size = info.frames_header, info.size_bytes
    if container != "flv" or not header or size is None:
        return None
    recorded = flv_recorded_size(path, size)
    if recorded is None:  # (the tags walked only where it records more)
        return None
    tail = flv_video_tail(path)
    if tail is None or _flv_audio_whole(tail, info):
        return None
    reached = max(reached, tail.frames, _position(tail.last_shown_ms / 1000, info.fps) + 1)
    missing = header - reached
    if not flv_cut_short(tail, size, recorded, missing - _frame_slack(header), info.fps, missing):
        return None
    return (
        f"truncated: the file holds {size:,} of the {recorded:,} bytes its flv metadata "
        f"records, and its video ends at frame {reached:,} of the {header:,} its header "
        "declares"
    )


def _flv_audio_whole(tail: FlvVideoTail, info: VideoInfo) -> bool:
    """Whether an FLV file's tags say nothing it holds is missing, whatever size its metadata
    records: its last tag ends the file whole (the size after it repeats its own) and its
    audio plays to the header's count (its duration), to the frame, not within the count's
    slack (a cut that lost the last audio tag of a long file falls within that). A muxer
    writes tags in time order, so a copy cut between tags that lost any within that time
    lost audio with them; what such a cut may lose unseen is video shown after the last
    audio tag starts (ADPCM's plays 0.37 s at 11 kHz), which a whole file whose video ends
    there, its recorded size left stale by a tool that rewrote its metadata, cannot be told
    from."""
    header = info.frames_header
    audio_end = _position(tail.audio_end_ms / 1000, info.fps)
    return bool(tail.ends_whole and audio_end and header) and audio_end + 1 >= header


def _position(end_s: float | None, fps: float | None) -> int:
    """The frame position (1 for the first) of a frame that ends `end_s` seconds in, at `fps`,
    the rate the header's count is reckoned at; 0 when its time is unknown."""
    return int(round(end_s * fps)) if end_s and fps else 0


def _tail_decodes(cv2, capture, header: int, decoded: int) -> str | None:
    """Seek to the last frames the header declares and decode them (`decoded` frames have been
    read already); a message if they are not there. Only the end is decoded: one group of
    pictures at most, whatever the length of the video."""
    reached = decoded
    start = header - TAIL_FRAMES
    if start > decoded:
        if not capture.set(cv2.CAP_PROP_POS_FRAMES, start):
            return None  # this file cannot seek by frame: say nothing rather than guess
        # FFmpeg lets a seek past the video's end succeed: the frames before `start` are
        # there only if the one after it decodes (not counted, a 400-frame header's slack
        # of 4 took any cut: a cut FLV of 600 frames read ok)
        if not capture.grab():
            return _frame_missing(start, header)
        reached = start + 1
    while reached < header and capture.grab():
        reached += 1
    if reached >= header - _frame_slack(header):
        return None
    return _frame_missing(reached, header)


def _frame_missing(reached: int, header: int) -> str:
    return (
        f"truncated: frame {reached + 1:,} of the {header:,} its header declares does not "
        "decode (--exact counts those that do)"
    )


@contextlib.contextmanager
def _openable_name(path: Path) -> Iterator[str]:
    """A name of `path` that OpenCV can be given: the path itself, or, for a name that is not
    UTF-8 (bytes Python holds as surrogates), the file opened here and named by its descriptor:
    OpenCV's binding crashes the process (SIGSEGV) on a str it cannot encode. A relative name
    starts with `./`: FFmpeg reads `file:x.mp4`, `concat:a.mp4|b.mp4` or `data:...` as a URL of
    one of its protocols (another file, or none), where `./` leaves it a file name."""
    name = str(path)
    if not os.path.isabs(name):
        name = os.path.join(os.curdir, name)
    if not holds_non_utf8(name):
        yield name
        return
    descriptors = next((d for d in ("/proc/self/fd", "/dev/fd") if os.path.isdir(d)), None)
    if descriptors is None:
        raise OSError(errno.EILSEQ, "the file name is not UTF-8, which OpenCV cannot open")
    fd = os.open(path, os.O_RDONLY)
    try:
        yield f"{descriptors}/{fd}"  # FFmpeg opens the file itself: ours is closed after
    finally:
        os.close(fd)


def _open_capture(cv2, path: Path, decoder_threads: int | None = None):
    """The video opened by FFmpeg, or None. `decoder_threads`: the threads of its decoder (None:
    FFmpeg's choice, one per core). Where many videos are read at once, one each: FFmpeg starts
    its decoder's threads at every open, which for a small video costs more than the rest of
    the open (open and release: 380-550 us a file, 210-260 us with one thread; 2 cores)."""
    threads_option = getattr(cv2, "CAP_PROP_N_THREADS", None)
    with _openable_name(path) as name:
        if decoder_threads is None or threads_option is None:
            capture = cv2.VideoCapture(name, cv2.CAP_FFMPEG)
        else:
            capture = cv2.VideoCapture(name, cv2.CAP_FFMPEG, [threads_option, decoder_threads])
    if not capture.isOpened():
        capture.release()
        return None
    # Frames and sizes as displayed (a phone's display matrix applied): OpenCV 5 does it by
    # default, 4.x only when asked (it is not an open parameter there).
    auto_orientation = getattr(cv2, "CAP_PROP_ORIENTATION_AUTO", None)
    if auto_orientation is not None:
        capture.set(auto_orientation, 1)
    return capture


def count_frames(capture, stop: threading.Event | None = None) -> int:
    """Frames counted by decoding them (grab without retrieving, so no colour conversion); one
    frame at a time, so a video of any length counts in constant memory."""
    return _decode_to_end(None, capture, stop)[0]


def _decode_to_end(
    cv2, capture, stop: threading.Event | None = None, info: VideoInfo | None = None
) -> tuple[int, float | None]:
    """`count_frames`, and the time the last frame ends at by its timestamp (None unknown, or
    without `cv2` and `info`: not asked for): for a variable frame rate, the video's length,
    which the count over the rate is not. The last frame lasts as long as the container
    records (MP4/MOV/3GP), else 1 / `info.fps`: FFmpeg's rate, which in an MP4 is the frames
    over the duration, 400 s a frame for 3 frames 600 s apart.
    An Ogg Theora file's repeated frames (packets of no bytes, which FFmpeg gives no picture
    for) each make a grab fail, the frames after them decoding on: as many failures as it
    holds such packets are passed over."""
    count, start_ms, skips = 0, None, _failing_grabs(info)
    # an AVI records no times: FFmpeg gives its frames their chunks' places, but none to the
    # B-frames a decoder holds to the end (the latest frame that has one ends the video)
    latest = info is not None and info.container == "avi"
    while True:
        if not capture.grab():
            if skips <= 0:
                break
            skips -= 1
            continue
        count += 1
        if cv2 is not None:
            at_ms = capture.get(cv2.CAP_PROP_POS_MSEC)
            start_ms = start_ms if latest and not at_ms > 0 else at_ms
        if stop is not None and count % 64 == 0 and stop.is_set():
            raise _Stopped()
    fps = info.fps if info is not None else None
    if not fps or not start_ms or not math.isfinite(start_ms) or start_ms < 0:
        return count, None
    own = last_frame_duration(info.path, info.container, count, start_ms / 1000)
    return count, start_ms / 1000 + (own if own is not None else 1 / fps)


def _failing_grabs(info: VideoInfo | None) -> int:
    """The grabs of `info`'s video that fail with frames after them: an Ogg file's video
    packets of a few bytes or none (a Theora encoder's repeated frame); 0 elsewhere."""
    if info is None or info.container != "ogg":
        return 0
    held = ogg_video_frames(info.path, info.container)
    return held.not_coded if held is not None else 0


def _first_grab(capture, info: VideoInfo) -> bool:
    """Whether a frame of `info`'s video decodes: the first grab, or past the grabs that fail
    with frames after them (`_failing_grabs`, sought only where the first fails)."""
    return capture.grab() or any(capture.grab() for _ in range(_failing_grabs(info)))


def probe_video(
    path: str | os.PathLike,
    *,
    exact: bool = False,
    decode_check: bool = True,
    stop: threading.Event | None = None,
    decoder_threads: int | None = None,
) -> VideoInfo:
    """The metadata of one video. Failures become `VideoInfo.status` and `.error`, never
    exceptions. `decoder_threads`: as `_open_capture` (None: FFmpeg's choice).

    The sizes the container records are checked against the file's always (a few bytes read):
    a shorter file is `truncated`. `decode_check` decodes the first frame, which tells a
    readable video from one whose header is intact but whose frames are missing or corrupt, and,
    for formats that record no sizes, the last frames the header declares, which tells a whole
    file from a copy cut short; it about doubles the time per file (where those frames are not
    there, the whole file is decoded: a variable frame rate, or a cut). `exact` decodes every
    frame anyway; for formats that record no sizes, a count short of the header's whose last
    frame's time falls short of the duration too means truncated."""
    info = VideoInfo(path=str(path))
    try:
        with walks_kept():  # an FLV's tags, an Ogg file's pages: walked once for every check
            _probe_into(info, Path(path), exact, decode_check, stop, decoder_threads)
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
    info: VideoInfo,
    path: Path,
    exact: bool,
    decode_check: bool,
    stop: threading.Event | None,
    decoder_threads: int | None,
) -> None:
    """`probe_video`'s work: the file's first bytes, its sizes against its container's, the
    header FFmpeg reads and the frames decoded, into `info`."""
    cv2 = _import_cv2()
    start = _read_start(info, path)
    if start is None:
        return
    head, sniffed = start
    # Read before FFmpeg opens the file: a cut MP4 whose index was at its end cannot be opened,
    # and this still tells a truncated copy from a corrupt file.
    declared = declared_size(path, sniffed, info.size_bytes)
    cut = _shortfall(info, declared) or _picture_cut(path, sniffed, info.size_bytes)
    capture = _open_capture(cv2, path, decoder_threads)
    if capture is None:
        _fail_unopened(info, path, head, sniffed, declared, cut)
        return
    if info.container is None:  # FFmpeg knows a format we do not sniff: trust the name
        info.container = path.suffix.lower().lstrip(".") or None
    try:
        judged = _judge_opened(
            cv2, capture, info, path, sniffed, declared, cut,
            exact=exact, decode_check=decode_check, stop=stop, decoder_threads=decoder_threads,
        )  # fmt: skip
    finally:
        capture.release()
    if judged is not None:
        _conclude(info, declared, *judged)


def _read_start(info: VideoInfo, path: Path) -> tuple[bytes, str | None] | None:
    """The file's first bytes and the container they show, with its size and container into
    `info`; None, with `info` failed, for what is no video to open: a special file, an empty
    one, a still image."""
    try:
        status = path.stat()
    except FileNotFoundError:
        if not path.is_symlink():
            raise
        info.fail(f"not a regular file ({LINK_TO_NOTHING})")
        return None
    mode = status.st_mode
    if not stat.S_ISREG(mode):  # opening a FIFO waits for a writer: forever
        info.fail(f"not a regular file ({file_kind(mode)})")
        return None
    info.size_bytes = status.st_size
    with open(path, "rb") as handle:
        head = handle.read(SNIFF_BYTES)
    sniffed = sniff_container(head)
    info.container = sniffed
    if info.size_bytes == 0:
        info.fail(_describe_unopenable(0, sniffed))
        return None
    image = still_image_format(path, head)  # None for anything but an image's first bytes
    if image is not None:
        info.fail(f"a still image ({image}), not a video")
        return None
    return head, sniffed


def _fail_unopened(
    info: VideoInfo,
    path: Path,
    head: bytes,
    sniffed: str | None,
    declared: int | None,
    cut: str | None,
) -> None:
    """Why FFmpeg cannot open the file, into `info`: truncated where its bytes tell a cut,
    else unreadable (said as a whole file where nothing is missing)."""
    cut = cut or _index_missing(path, sniffed)
    if cut:
        info.fail(cut, "truncated")
        return
    whole = declared is not None and declared == info.size_bytes
    if whole and _track_without_frames(path, sniffed):
        info.fail(NO_TRACK_FRAMES)
        return
    if flv_video_without_frames(path, sniffed):  # read "truncated or corrupt flv file"
        info.fail(NO_FLV_FRAMES)
        return
    if ogg_video_without_frames(path, sniffed):
        info.fail(NO_OGG_FRAMES)
        return
    whole = whole or declares_no_video(head, sniffed)  # nothing cut: no video in it
    info.fail(_describe_unopenable(info.size_bytes, sniffed, whole))


# A whole Matroska/WebM file whose video track holds no block: a recording stopped before its
# first frame (OpenCV's VideoWriter opened and released), which FFmpeg does not open.
NO_TRACK_FRAMES = "empty video: it holds no frames (its video track holds none)"


# An FLV file whose header declares video and whose tags hold none, an Ogg file whose video
# stream holds its headers alone: recordings stopped before their first frame, as above.
NO_FLV_FRAMES = "empty video: it holds no frames (its header declares video, and no tag holds any)"
NO_OGG_FRAMES = "empty video: it holds no frames (its video stream ends after its headers)"


def _track_without_frames(path: Path, sniffed: str | None) -> bool:
    """Whether a Matroska/WebM file names a video track and its clusters hold no frame of it
    (none at all: frames before a key frame or not coded would be frames)."""
    held = matroska_video_blocks(path, sniffed)
    return held is not None and held.frames == 0 and held.broken_at is None


def _judge_opened(
    cv2,
    capture,
    info: VideoInfo,
    path: Path,
    sniffed: str | None,
    declared: int | None,
    cut: str | None,
    *,
    exact: bool,
    decode_check: bool,
    stop: threading.Event | None,
    decoder_threads: int | None,
) -> tuple[str | None, str | None] | None:
    """The header's fields into `info`, then the frames decoded (all of them with `exact`,
    else the first and, where the sizes say nothing, the last): (why it is cut, why it is
    damaged), each None where it is not; None where `info` has failed for good (no picture
    size: no video stream)."""
    # Where the container's sizes say the file is whole, frames short of the header's count
    # are an estimate or a decoder's quirk, not a cut: decoding is the evidence only where the
    # sizes say nothing (the end is not sought where they do, but for a count reckoned from
    # the file's duration, below: the frames there, not a cut).
    judge_by_frames = declared is None and not cut
    declared_frames, own = _read_header_fields(cv2, capture, info, path, sniffed, decoder_threads)
    # a count from the file's duration is checked against the video's frames, as where
    # the format records no sizes: the sizes tell a cut, not audio that runs on
    sizes_whole = declared is not None and not cut
    judge_by_frames = judge_by_frames or (
        sizes_whole and sniffed in _COUNT_FROM_FILE_DURATION and own is None
    )
    # 0: the header's duration is 0 (an unknown one reads as a negative count, shown as none)
    info.frames_header = 0 if declared_frames == 0 else _positive_int(declared_frames)
    # The tag the container records (XVID, mp4v), as ffprobe shows it; else FFmpeg's own;
    # else, for a container that records none, ffprobe's codec name
    info.codec = (
        container_fourcc(path, sniffed)
        or fourcc_to_text(capture.get(cv2.CAP_PROP_FOURCC))
        or _UNTAGGED_CODECS.get(sniffed or "")
    )
    declares_none = declared_frames == 0  # NO_FRAMES, where no frame decodes
    if info.width is None or info.height is None:
        if not cut:  # no stream: the rate and tag FFmpeg gave a file it cannot read say nothing
            info.fps = info.codec = None
        info.fail(cut or "no video stream", "truncated" if cut else "unreadable")
        return None
    if exact:
        return _judge_all_decoded(
            cv2, capture, info, path, sniffed, cut, stop,
            judge_by_frames=judge_by_frames, sizes_whole=sizes_whole, declares_none=declares_none,
        )  # fmt: skip
    cut = _judge_by_header(
        cv2, capture, info, path, sniffed, cut, stop, decoder_threads,
        decode_check=decode_check, judge_by_frames=judge_by_frames, sizes_whole=sizes_whole,
        declares_none=declares_none,
    )  # fmt: skip
    return cut, None


def _read_header_fields(
    cv2, capture, info: VideoInfo, path: Path, sniffed: str | None, decoder_threads: int | None
) -> tuple[float, int | None]:
    """The picture size and rate into `info`; the frame count the header declares, as the
    container's own records correct FFmpeg's, and the Matroska video track's own count (None
    for other containers, or where it records none)."""
    info.width = _positive_int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
    info.height = _positive_int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
    fps = capture.get(cv2.CAP_PROP_FPS)
    info.fps = float(fps) if fps and math.isfinite(fps) and fps > 0 else None
    declared_frames = capture.get(cv2.CAP_PROP_FRAME_COUNT)
    if sniffed == "mpeg-video":  # FFmpeg's raw reader gives 25 fps: the stream's own rate
        declared_frames = _raw_mpeg_timing(path, info, declared_frames)
    # FFmpeg tags MPEG-1/2 video mpg1, mpg2 (another codec may hold a start code 0xB3 too)
    mpeg12 = fourcc_to_text(capture.get(cv2.CAP_PROP_FOURCC)) in ("mpg1", "mpg2")
    if mpeg12 and sniffed in ("mpeg-ps", "mpeg-ts", "m2ts"):
        _packed_mpeg_timing(path, info, sniffed)
    if sniffed == "dv":
        declared_frames = _raw_dv_timing(cv2, path, decoder_threads, info, declared_frames)
    # FFmpeg counts a fragmented MP4's moov samples alone (those of its first fragment, as
    # `-movflags frag_keyframe` writes it): its fragments' runs hold the rest.
    declared_frames = fragmented_frame_count(path, sniffed) or declared_frames
    # and an MP4's count is its samples', where its edit list may show fewer (a clip cut
    # without re-encoding keeps the frames before its cut, which are decoded and dropped)
    edited = iso_edited_frame_count(path, sniffed)
    if edited is not None:
        declared_frames = float(edited)
    # and a Matroska file's count is its longest stream's duration times the video's rate
    # (50 frames for 5 beside 2 s of audio): the video track's own tags say less.
    own = matroska_video_frames(path, sniffed, info.fps)
    if own is not None and 0 < own < declared_frames:
        declared_frames = float(own)
    # and an AVI's count is its stream's length, where its index may list it in chunks many
    # of which are empty (FFmpeg 9 copies a 25 fps MP4 into an AVI of 600 fps, 24 chunks a
    # frame): those with data are the frames, over the length's time (1800 chunks at 600
    # fps: 75 frames over 3 s)
    with_data = avi_frames_with_data(path, sniffed)
    if with_data is not None and info.fps and declared_frames == with_data[1]:
        info.duration_s = declared_frames / info.fps
        declared_frames = float(with_data[0])
    return declared_frames, own


def _judge_all_decoded(
    cv2,
    capture,
    info: VideoInfo,
    path: Path,
    sniffed: str | None,
    cut: str | None,
    stop: threading.Event | None,
    *,
    judge_by_frames: bool,
    sizes_whole: bool,
    declares_none: bool,
) -> tuple[str | None, str | None]:
    """--exact: every frame decoded and counted into `info`; (why it is cut, why it is
    damaged) from the frames that decode, where its bytes have not told already."""
    damage = None
    decoded, end_s = _decode_to_end(cv2, capture, stop, info)
    _take_decoded_count(info, decoded, end_s)
    if info.frames_decoded == 0 and not cut:
        info.fail(_undecodable(info.codec, declares_none))
    elif not cut and judge_by_frames:
        reached = _position(end_s, info.fps)
        cut = _frames_short(info.frames_decoded, info.frames_header, reached)
        if cut and _runs_on_past_its_video(path, sniffed, info, sizes_whole):
            # whole, its audio running on after its video, but where the FLV's recorded size
            # backs the frames short
            video_end = max(info.frames_decoded, reached)
            cut = _flv_cut_between_tags(path, sniffed, info, video_end)
        if not cut:  # or frames lost, where its structure tells
            damage = _frames_lost(info, path, end_s, count_from_duration=True)
    elif not cut and sizes_whole:
        # all its bytes there, its header counting the video's own frames: frames
        # that do not decode are damage, not a cut
        damage = _frames_lost(info, path, end_s)
    return cut, damage


def _judge_by_header(
    cv2,
    capture,
    info: VideoInfo,
    path: Path,
    sniffed: str | None,
    cut: str | None,
    stop: threading.Event | None,
    decoder_threads: int | None,
    *,
    decode_check: bool,
    judge_by_frames: bool,
    sizes_whole: bool,
    declares_none: bool,
) -> str | None:
    """The header's count as the row's; with `decode_check`, the first frame decoded, and,
    where the sizes say nothing, the last ones the header declares: why it is cut, or None.
    `capture` may be released here (to decode from the start again)."""
    info.frames, info.frames_source = info.frames_header, "header"
    # Decoding the first frame tells a readable video from a header with broken data,
    # decoding the last ones a whole file from one that stops early.
    if decode_check and not cut and not _first_grab(capture, info):
        info.fail(_undecodable(info.codec, declares_none))
    elif not decode_check and not cut and judge_by_frames and sniffed == "flv":
        # no decode: where an FLV records a larger size, its video's end as its tags tell
        cut = _flv_cut_between_tags(path, sniffed, info, 0)
    elif decode_check and judge_by_frames and info.frames_header:
        cut = _tail_decodes(cv2, capture, info.frames_header, decoded=1)
        if cut:  # or a variable frame rate: decoded to the end, the last frame's time
            capture.release()
            cut = _cut_after_decoding_all(
                cv2, info, path, sniffed, cut, stop, decoder_threads, sizes_whole=sizes_whole
            )
        info.known_whole = not cut
    return cut


def _cut_after_decoding_all(
    cv2,
    info: VideoInfo,
    path: Path,
    sniffed: str | None,
    cut: str,
    stop: threading.Event | None,
    decoder_threads: int | None,
    *,
    sizes_whole: bool,
) -> str | None:
    """Where the header's last frames did not decode (`cut`): the file opened again and decoded
    to the end, a cut only if the last frame's time falls short too (a variable frame rate
    puts fewer frames in the same time); `cut` as it was where it cannot be opened again."""
    capture = _open_capture(cv2, path, decoder_threads)
    if capture is None:
        return cut
    try:
        decoded, end_s = _decode_to_end(cv2, capture, stop, info)
    finally:
        capture.release()
    reached = _position(end_s, info.fps)
    cut = _frames_short(decoded, info.frames_header, reached)
    if cut and _runs_on_past_its_video(path, sniffed, info, sizes_whole):
        video_end = max(decoded, reached)  # (an FLV's recorded size may back the frames short)
        cut = _flv_cut_between_tags(path, sniffed, info, video_end)
        if not cut:  # whole, with fewer frames: those decoded are the row's
            _take_decoded_count(info, decoded, end_s)
    return cut


def _conclude(info: VideoInfo, declared: int | None, cut: str | None, damage: str | None) -> None:
    """The row's duration where the header gave none, whether it is known whole, and its
    status: truncated where `cut`, else damaged where `damage`."""
    if info.duration_s is None and info.frames is not None and info.fps:
        info.duration_s = info.frames / info.fps
    if declared is not None and not cut:
        info.known_whole = True  # its sizes say so (a header count it falls short of is wrong)
    if cut:
        info.fail(cut, "truncated")
    elif damage:
        info.fail(damage, "damaged")


def _raw_dv_timing(
    cv2, path: Path, decoder_threads: int | None, info: VideoInfo, declared_frames: float
) -> float:
    """A raw DV file's rate (into `info.fps`) and frame count, from the time between its first
    two frames: FFmpeg's DV demuxer gives its time base (1/60000 s) as the average rate, so a
    PAL file of 10 frames read as 24,000 frames at 60,000 fps (and `--exact` called it
    truncated). DV runs at a constant rate, so one interval is the rate, and FFmpeg's duration
    (its frames over that rate) is right. The count is unchanged where the two frames are not
    there or agree with the header."""
    capture = _open_capture(cv2, path, decoder_threads)
    if capture is None:
        return declared_frames
    try:
        times = []
        while len(times) < 2 and capture.grab():
            times.append(capture.get(cv2.CAP_PROP_POS_MSEC))
    finally:
        capture.release()
    if len(times) < 2 or not all(math.isfinite(t) for t in times) or times[1] <= times[0]:
        return declared_frames
    # 25, 29.97 (30000/1001), 50, 59.94: whole rates or over 1001, as DV's are
    rate = float(Fraction(1000 / (times[1] - times[0])).limit_denominator(1001))
    if info.fps is None or declared_frames <= 0 or math.isclose(rate, info.fps, rel_tol=1e-3):
        return declared_frames
    duration = declared_frames / info.fps
    info.fps = rate
    return float(round(duration * rate))


def _packed_mpeg_timing(path: Path, info: VideoInfo, container: str) -> None:
    """An MPEG-PS or MPEG-TS file's rate (into `info.fps`) where it holds one or two MPEG-1/2
    pictures: FFmpeg has too few frames to average and OpenCV falls back on its field rate,
    twice the frame rate (50 for 25 fps), where ffprobe gives 25 (`r_frame_rate`). Where
    OpenCV's rate is twice the one the video's first sequence header records, that one is
    taken; any other (an average of more pictures: a film's soft telecine, 23.976 where the
    header records 29.97) stays. The frame count, an estimate at such rates, is left as is."""
    if not info.fps:
        return
    rate = sequence_frame_rate(mpeg_video_head(path, container))
    if rate is not None and math.isclose(info.fps, 2 * rate, rel_tol=1e-3):
        info.fps = float(rate)


def _raw_mpeg_timing(path: Path, info: VideoInfo, declared_frames: float) -> float:
    """A raw MPEG-1/2 video stream's rate (into `info.fps`: its sequence header's,
    `raw_mpeg_frame_rate`) and frame count. FFmpeg's raw reader gives 25 fps for any, and
    OpenCV counts the duration FFmpeg estimates from the bit rate the header records at those
    25 fps (an MPEG-1 clip of 60 frames at 15 fps: 94, `truncated`; of 200 at 50 fps: 94,
    1.88 s): the count is that duration at the stream's own rate. A stream of a variable
    rate records no bit rate to estimate from (MPEG-1's largest, 0x3FFFF, gives 0.7 ms):
    its count under a frame is none, as an MPEG-2 stream's, not 0 frames."""
    rate = raw_mpeg_frame_rate(path)
    if rate is None or info.fps is None:
        return declared_frames
    if declared_frames > 0:
        declared_frames = float(round(declared_frames / info.fps * rate))
    info.fps = float(rate)
    return declared_frames if declared_frames >= 1 else -1.0


def _take_decoded_count(info: VideoInfo, decoded: int, end_s: float | None) -> None:
    """`decoded` frames, the last ending `end_s` seconds in, as the row's count and duration
    (what --exact shows): frames / fps, or the end of the last frame where the frames lie
    further apart than 1 / fps (a variable rate)."""
    info.frames_decoded = info.frames = decoded
    info.frames_source = "decoded"
    if info.fps and end_s and end_s > (decoded + 0.5) / info.fps:
        info.duration_s = end_s
    elif info.fps:
        info.duration_s = decoded / info.fps


def recount_frames(
    info: VideoInfo, stop: threading.Event | None = None, decoder_threads: int | None = None
) -> bool:
    """Count `info`'s frames by decoding, as --exact does, once its header's count has turned
    out wrong (frames sampled past the end of a whole file); False if it cannot be opened. A
    file whose sizes say it is whole but whose frames do not all decode is `damaged`, as
    --exact finds it."""
    cv2 = _import_cv2()
    capture = _open_capture(cv2, Path(info.path), decoder_threads)
    if capture is None:
        return False
    with walks_kept():  # an Ogg file's pages: walked once for its repeated frames and its damage
        try:
            decoded, end_s = _decode_to_end(cv2, capture, stop, info)
        finally:
            capture.release()
        _take_decoded_count(info, decoded, end_s)
        if info.known_whole:
            from_duration = info.container in _COUNT_FROM_FILE_DURATION
            damage = _frames_lost(info, Path(info.path), end_s, count_from_duration=from_duration)
            if damage:
                info.fail(damage, "damaged")
    return True
