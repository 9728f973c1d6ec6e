"""Files of frames with no container index: Y4M and raw DV frames of one size, and a raw
MPEG video stream's frame rate and last picture (whether a copy stops inside it)."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from fractions import Fraction

from torchkit.core.video.held import MAX_BOXES, MPEG_START, mpeg_frame_rate
from torchkit.core.video.streams import mpeg_pictures_shown

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


def y4m_frames_end(handle, size: int) -> int | None:
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
    for _ in range(MAX_BOXES):  # frame lines with parameters: one frame at a time
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


def dv_frames_end(handle, size: int) -> int | None:
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


_MPEG_TAIL = 1 << 20  # the last picture of a raw MPEG video stream is sought this far from its end


def _start_codes(data: bytes, start: int = 0) -> Iterator[tuple[int, int]]:
    """(position, code) of each MPEG start code (00 00 01 xx) in `data` from `start`; coded
    data never holds one, so the stream's structure is read without decoding it."""
    at = data.find(MPEG_START, start)
    while 0 <= at < len(data) - 3:
        yield at, data[at + 3]
        at = data.find(MPEG_START, at + 3)


_MPEG_HEAD = 256  # a stream's first bytes: its sequence header (140 with both matrices), extension


def _first_sequence(head: bytes) -> tuple[int | None, int | None]:
    """Where a raw MPEG video stream's first bytes `head` hold its first sequence header and
    sequence extension (MPEG-2 only), each whole (None where they do not)."""
    codes = [(at, code) for at, code in _start_codes(head) if at + 10 <= len(head)]
    header = next((at for at, code in codes if code == 0xB3), None)
    extension = next((at for at, code in codes if code == 0xB5 and head[at + 4] >> 4 == 1), None)
    return header, extension


def sequence_frame_rate(head: bytes) -> Fraction | None:
    """The rate an MPEG-1/2 video stream's first bytes `head` record: its first sequence
    header's, and its MPEG-2 sequence extension's (`mpeg_frame_rate`); None where they hold
    no sequence header."""
    header, extension = _first_sequence(head)
    if header is None:
        return None
    extended = head[extension + 4 :] if extension is not None else b""
    return mpeg_frame_rate(head[header + 4 :], extended)


# A stream's first pictures, which tell whether they repeat fields (5 s of a film), read this
# far at most (2.5 s of a DVD's 6 Mb/s), a chunk at a time
_SHOWN_PICTURES, _SHOWN_HEAD, _SHOWN_CHUNK = 120, 2 << 20, 1 << 16
_SHOWN_MORE = _SHOWN_HEAD // _SHOWN_CHUNK - 1  # the chunks after the head


def raw_mpeg_frame_rate(path: str | os.PathLike) -> Fraction | None:
    """The frame rate of a raw MPEG-1/2 video stream (.m2v), as its pictures are shown: its
    first sequence header's rate, and its MPEG-2 sequence extension's (`mpeg_frame_rate`),
    times its first pictures over the frames they are shown for where they repeat a field,
    the pattern's where it is one (a film's soft telecine, 3:2 pulldown: 4 pictures shown
    for 5 frames at 29.97 are 23.976 fps; a picture shown twice at 59.94, 29.97). (OpenCV's
    FFmpeg reads 25 fps for any such stream.) None where they cannot be read."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_MPEG_HEAD)
            rate = sequence_frame_rate(head)
            if rate is None:
                return None
            # the head read, then the file on from it a chunk at a time
            more = itertools.islice(iter(lambda: handle.read(_SHOWN_CHUNK), b""), _SHOWN_MORE)
            chunks = itertools.chain((head,), more)
            pictures, shown = mpeg_pictures_shown(chunks, _SHOWN_PICTURES)
    except OSError:
        return None
    if not pictures or shown <= pictures:
        return rate
    # the frames a picture is shown for, of pictures that may stop inside the pattern's cycle
    ratio = Fraction(pictures) / Fraction(shown)
    pattern = ratio.limit_denominator(5)  # 4/5: 3:2 pulldown; 1/2, 2/5: progressive's
    return rate * (pattern if abs(pattern - ratio) <= ratio / 50 else ratio)


def last_picture_rows(path: str | os.PathLike, size: int) -> tuple[int, int] | None:
    """For a raw MPEG-2 video stream (.m2v), which records neither sizes nor a frame count:
    (the macroblock rows its last picture's slices reach, the rows a picture has). A copy cut
    short stops inside a picture, whose slices then do not reach its last row. None where this
    cannot be told: MPEG-1 (a slice may span rows), a field picture, a stream ended by its end
    code, pictures over 2,800 lines high, or no picture in its last megabyte."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_MPEG_HEAD)
            header, extension = _first_sequence(head)
            if header is None or extension is None:  # MPEG-1 (no extension): its tail unread
                return None
            start = max(0, size - _MPEG_TAIL)
            handle.seek(start)
            tail = handle.read(size - start)
    except OSError:
        return None
    lines = (head[header + 5] & 0x0F) << 8 | head[header + 6]
    lines |= (head[extension + 6] >> 5 & 3) << 12
    progressive = head[extension + 5] >> 3 & 1
    if lines > 2800 or tail.endswith(MPEG_START + b"\xb7"):
        return None
    rows = -(-lines // 16) if progressive else 2 * -(-lines // 32)
    picture = tail.rfind(MPEG_START + b"\x00")
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
