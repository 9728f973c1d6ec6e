"""AVI (RIFF): the chunks' sizes, the codec's FOURCC its stream header records, and the frames
its index (idx1) lists, of them those that lead its first key frame."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from torchkit.core.video.held import MAX_BOXES, NOT_CODED_BYTES, HeldFrames, exp_golomb, fourcc_text

_MAX_HEADERS = 1 << 20  # an AVI's stream headers bigger than this are not read for its tag


def _riff_children(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """The chunks of a RIFF list in `data[start:end]`: (id, where its data starts, ends)."""
    offset = start
    while offset + 8 <= end:
        length = int.from_bytes(data[offset + 4 : offset + 8], "little")
        yield data[offset : offset + 4], offset + 8, min(offset + 8 + length, end)
        offset += 8 + length + (length & 1)


def avi_fourcc(handle, size: int) -> str | None:
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
            indexed = _avi_video_index(handle)
            if indexed is None:
                return None
            entries, movi, _ = indexed
            video = entries[entries[:, 3] > 0]
            keys = np.flatnonzero(video[:, 1] & _AVI_KEY_FRAME)
            # an index that flags no key frame tells nothing of them (a writer that sets none)
            leading = int(keys[0]) if len(keys) else 0
            if len(keys) and movi is not None:
                size = os.fstat(handle.fileno()).st_size
                handle.seek(0)
                codec = (avi_fourcc(handle, size) or "").lower()
                key, after = video[keys[0] : keys[0] + 1], video[keys[0] + 1 :]
                if codec in _AVC_TAGS or codec in _HEVC_TAGS:
                    leading += _avi_leading_nal_pictures(handle, key, after, movi, codec)
                else:
                    leading += _avi_leading_b_frames(handle, after, movi)
    except OSError:
        return None
    return HeldFrames(len(video), leading, int((video[:, 3] <= NOT_CODED_BYTES).sum()))


def avi_frames_with_data(path: str | os.PathLike, container: str | None) -> tuple[int, int] | None:
    """(The frames of an AVI's first video stream, the chunks its stream header's length
    counts) where its index (`idx1`) lists that many chunks of the stream and some of them
    are empty: no frame, FFmpeg decodes none for them (`-c copy` of a 25 fps MP4 into an AVI
    gives one of 600 fps in FFmpeg 9, each frame's chunk followed by 23 empty ones, as a
    capture may mark the frames it dropped), though its count is the stream's length. None for
    other formats, a file without `idx1`, an index that lists another number of chunks (an
    OpenDML file's `idx1` lists its first part's) or none empty."""
    if container != "avi":
        return None
    try:
        with open(path, "rb") as handle:
            indexed = _avi_video_index(handle)
    except OSError:
        return None
    if indexed is None:
        return None
    entries, _, header = indexed
    if len(header) < 36:
        return None
    length = int.from_bytes(header[32:36], "little")  # dwLength, in the stream's time units
    with_data = int((entries[:, 3] > 0).sum())
    if len(entries) != length or with_data == length:
        return None
    return with_data, length


def _avi_video_index(handle) -> tuple[Any, int | None, bytes] | None:
    """(The `idx1` entries of an AVI's first video stream, its empty chunks' too: the chunk's
    ID, flags, offset and size a row; where its movi list's type is, from which their offsets
    count; the stream's header, `strh`) from its open file `handle`. None where it has no
    video stream or no `idx1` in its first RIFF."""
    import numpy as np

    size = os.fstat(handle.fileno()).st_size
    head = handle.read(24)
    if head[12:16] != b"LIST" or head[20:24] != b"hdrl":
        return None
    headers = handle.read(min(int.from_bytes(head[16:20], "little") - 4, _MAX_HEADERS))
    stream = _avi_video_stream(headers)
    index, movi, offset = None, None, 12
    for _ in range(MAX_BOXES):  # the chunks of the first RIFF: hdrl, movi, idx1
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
    number, header = stream
    entries = np.frombuffer(index[: len(index) - len(index) % 16], "<u4").reshape(-1, 4)
    # an entry: the chunk's ID ("00dc": stream 0, compressed video; "00db": uncompressed),
    # flags, offset and size
    ids = [int.from_bytes(b"%02d" % number + kind, "little") for kind in (b"dc", b"db")]
    return entries[np.isin(entries[:, 0], ids)], movi, header


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


def _avi_video_stream(headers: bytes) -> tuple[int, bytes] | None:
    """The number of the first video stream (its `strl` list's place) in an AVI's hdrl data,
    and its stream header's (`strh`) data."""
    streams = 0
    for chunk, start, end in _riff_children(headers, 0, len(headers)):
        if chunk != b"LIST" or headers[start : start + 4] != b"strl":
            continue
        parts = {part: headers[s:e] for part, s, e in _riff_children(headers, start + 4, end)}
        header = parts.get(b"strh", b"")
        if header[:4] == b"vids":
            return streams, header
        streams += 1
    return None


def riff_chunks_end(handle, size: int) -> int | None:
    """The end of the last RIFF chunk of an AVI (OpenDML files over 1 GiB hold several)."""
    offset = 0
    for _ in range(MAX_BOXES):
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
