"""The frames the formats made for streaming hold for their video, counted from their own
structure without decoding (for `--exact`'s damage check): MPEG-TS and M2TS packets, FLV tags.

These formats record no frame count: FFmpeg's is their duration times the rate. Their packets
or tags are walked, a frame each where the format says one starts, past a region zeroed or
overwritten to the structure after it (FFmpeg's readers go on there too), so a whole file's
count is known however much of it decodes. Where a walk cannot tell its units for frames, or
which frame is the first that decodes, it gives None: no judgement, rather than a whole file
called damaged.
"""

from __future__ import annotations

import mmap
import os
import re

from torchkit.core.video.containers import (
    M2TS_PACKET,
    TS_PACKET,
    HeldFrames,
    frames_between,
    leading_frames,
)

# --- MPEG-TS ------------------------------------------------------------------------------------

# The stream types of a PMT that are video: MPEG-1, MPEG-2, MPEG-4 Part 2, H.264, HEVC, VVC,
# AVS, Dirac, VC-1
_TS_VIDEO_TYPES = frozenset({0x01, 0x02, 0x10, 0x1B, 0x24, 0x33, 0x42, 0xD1, 0xEA})
_TS_CHUNK_PACKETS = 1 << 16  # packets read at a time (12 MiB)
_TS_TABLE_PACKETS = 1 << 14  # the PAT and PMT are sought in the first packets (FFmpeg: each 0.1 s)


def ts_video_frames(path: str | os.PathLike, container: str | None) -> HeldFrames | None:
    """The frames an MPEG-TS (or M2TS) file holds for its first video stream: its PES packets
    that carry a presentation time, each the start of a frame (a PES packet may carry more
    frames, but one time, so this never counts more than there are; FFmpeg's and broadcast
    muxers write a frame a PES packet), and where TS packets that do not start with the sync
    byte lie inside the file (zeroed or overwritten: `broken_at`, the first), the frames
    whose times fall between the video's times either side of them (`_frames_between`).
    `leading`: those before the first whose packet flags a random access point (its key
    frame), and those after it shown at or before it (an open GOP's leading pictures). None
    for other formats, no video stream in the first packets' PMT, or a file that flags no
    random access point (which frame decodes first is not told)."""
    import numpy as np

    if container not in ("mpeg-ts", "m2ts"):
        return None
    size, prefix = (TS_PACKET, 0) if container == "mpeg-ts" else (M2TS_PACKET, 4)
    times, keys, places, lost = [], [], [], []
    try:
        with open(path, "rb") as handle:
            video = _ts_video_pid(handle, size, prefix)
            if video is None:
                return None
            handle.seek(0)
            first = 0  # the number of the chunk's first packet
            while True:
                data = handle.read(size * _TS_CHUNK_PACKETS)
                whole = len(data) - len(data) % size
                if not whole:
                    break
                packets = np.frombuffer(data[:whole], np.uint8).reshape(-1, size)[:, prefix:]
                lost.append(first + np.flatnonzero(packets[:, 0] != 0x47))
                chunk_times, chunk_keys, chunk_places = _ts_pes_starts(packets, video)
                times.append(chunk_times)
                keys.append(chunk_keys)
                places.append(first + chunk_places)
                first += len(packets)
                if len(data) < size * _TS_CHUNK_PACKETS:
                    break
    except OSError:
        return None
    times, keys, places, lost = (np.concatenate(part) for part in (times, keys, places, lost))
    if not keys.any():
        return None
    broken_at, frames = None, len(times)
    if len(lost):
        broken_at = int(lost[0]) * size
        gaps = np.flatnonzero(np.diff(lost) > 1)  # the last lost packet of a run, but the last
        firsts, lasts = lost[np.r_[0, gaps + 1]], lost[np.r_[gaps, len(lost) - 1]]
        frames += frames_between(times, places, firsts, lasts)
    return HeldFrames(frames, leading_frames(times, keys), 0, broken_at, past_breaks=True)


def _ts_pes_starts(packets, video: int):
    """(the presentation time of each PES packet of the PID `video` that carries one, whether
    its first TS packet flags a random access point, that packet's number) in the TS packets
    `packets` (188 bytes a row, sync byte first)."""
    import numpy as np

    pid = (packets[:, 1].astype(np.int32) & 0x1F) << 8 | packets[:, 2]
    control = packets[:, 3] >> 4 & 3  # 2: an adaptation field, 1: a payload, 3: both
    starts = (packets[:, 0] == 0x47) & (pid == video) & (packets[:, 1] & 0x40 > 0)
    starts &= control & 1 > 0
    numbers = np.flatnonzero(starts)
    rows = packets[starts]
    adapted = rows[:, 3] >> 4 & 2 > 0
    field = np.where(adapted, rows[:, 4].astype(np.int64) + 1, 0)
    random_access = adapted & (rows[:, 4] > 0) & (rows[:, 5] & 0x40 > 0)
    payload = 4 + field
    fits = payload + 14 <= rows.shape[1]
    rows, payload, random_access, numbers = (
        rows[fits],
        payload[fits],
        random_access[fits],
        numbers[fits],
    )
    head = np.take_along_axis(rows, payload[:, None] + np.arange(14), axis=1).astype(np.int64)
    # a PES header: 00 00 01, its stream ID, its length, two bytes of flags (the PTS flag,
    # 0x80 of the second), its header's length, then the PTS in 5 bytes
    timed = (head[:, 0] == 0) & (head[:, 1] == 0) & (head[:, 2] == 1) & (head[:, 7] & 0x80 > 0)
    head, random_access, numbers = head[timed], random_access[timed], numbers[timed]
    pts = (
        (head[:, 9] >> 1 & 7) << 30
        | head[:, 10] << 22
        | (head[:, 11] >> 1) << 15
        | head[:, 12] << 7
        | head[:, 13] >> 1
    )
    return pts, random_access, numbers


def _ts_video_pid(handle, size: int, prefix: int) -> int | None:
    """The PID of the first video stream the first PMT of an MPEG-TS file lists (its PAT's
    first program's), found in its first `_TS_TABLE_PACKETS` packets."""
    handle.seek(0)
    data = handle.read(size * _TS_TABLE_PACKETS)
    tables: dict[int, int] = {0: -1}  # PID: the program's PMT (-1: the PAT)
    for at in range(0, len(data) - size + 1, size):
        packet = data[at + prefix : at + size]
        pid = (packet[1] & 0x1F) << 8 | packet[2]
        if packet[0] != 0x47 or pid not in tables or not packet[1] & 0x40:
            continue
        control, payload = packet[3] >> 4 & 3, 4
        if control & 2:
            payload += 1 + packet[4]
        if not control & 1 or payload >= len(packet):
            continue
        section = packet[payload + 1 + packet[payload] :]  # after the pointer field
        length = (section[1] & 0x0F) << 8 | section[2] if len(section) > 3 else 0
        body = section[8 : min(3 + length - 4, len(section))]  # the CRC left out
        if tables[pid] == -1 and section[:1] == b"\x00":  # the PAT: program, PID pairs
            programs = [
                (int.from_bytes(body[i : i + 2], "big"), (body[i + 2] & 0x1F) << 8 | body[i + 3])
                for i in range(0, len(body) - 3, 4)
            ]
            maps = [pmt for number, pmt in programs if number != 0]  # 0: the network's PID
            if maps:
                tables = {maps[0]: maps[0]}
        elif tables[pid] != -1 and section[:1] == b"\x02":  # the PMT
            at_stream = 4 + ((body[2] & 0x0F) << 8 | body[3]) if len(body) > 3 else len(body)
            while at_stream + 5 <= len(body):
                kind = body[at_stream]
                stream_pid = (body[at_stream + 1] & 0x1F) << 8 | body[at_stream + 2]
                if kind in _TS_VIDEO_TYPES:
                    return stream_pid
                at_stream += 5 + ((body[at_stream + 3] & 0x0F) << 8 | body[at_stream + 4])
            return None
    return None


def _mapped(handle) -> mmap.mmap:
    """The file open as `handle`, mapped to be read as bytes (a tag or page at a time, without
    a read call each); ValueError for an empty file."""
    return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


# --- FLV ----------------------------------------------------------------------------------------

_FLV_TAG = 11  # type, data size (3 bytes), timestamp (3 + 1), stream ID (3)
# A tag's start: its type (audio, video, script data), size and time, then a stream ID of 0
_FLV_TAG_START = re.compile(rb"[\x08\x09\x12][\s\S]{7}\x00\x00\x00")
_FLV_RESYNC_BYTES = 1 << 26  # past a break, the next tag is searched for this far
_FLV_AVC, _FLV_HEVC = 7, 12  # codec IDs whose tags say whether they hold a frame (packet type)
_MAX_FLV_TAGS = 10_000_000


def flv_video_frames(path: str | os.PathLike, container: str | None) -> HeldFrames | None:
    """The frames an FLV file holds: its video tags but those of no frame (a video info or
    command frame; an H.264 or HEVC sequence header or end of sequence), walked tag by tag
    (each records its size, and the size of the one before follows it); past bytes that are
    no tag inside the file (`broken_at`, the first), from the next tag found (its start, and
    the size after it that matches its own), the frames whose tags they took counted from
    the video's times either side. `leading`: those before the first tag flagged a key
    frame, and after it shown at or before it (its time and an H.264/HEVC composition
    offset). `end_s`: when its streams end (the last video tag's time with the first frame's
    composition offset, the last audio tag's with the time from the one before it). None for
    other formats, a file without video tags or none flagged a key frame, or a structure that
    cannot be read."""
    import numpy as np

    if container != "flv":
        return None
    times, keys, places, firsts, lasts = [], [], [], [], []
    audio: list[int] = []  # the last two audio tags' times (ms)
    unpassed = None  # where bytes that are no tag run on past the search for the next
    # the first frame's composition offset (the delay B-frames add to every frame's time) and
    # the last frame's tag time (ms)
    delay, last_video = None, 0
    try:
        with (
            open(path, "rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data,
        ):
            size = len(data)
            at = int.from_bytes(data[5:9], "big") + 4  # the header, the size of no tag before
            for _ in range(_MAX_FLV_TAGS):
                if at + _FLV_TAG > size:
                    break
                length = int.from_bytes(data[at + 1 : at + 4], "big")
                end = at + _FLV_TAG + length
                if data[at] & 0x1F not in (8, 9, 18) or data[at + 8 : at + 11] != b"\x00" * 3:
                    found = _flv_tag_after(data, at, size)
                    if found is None:
                        # bytes past the search the walk could not pass: their frames untold
                        unpassed = at if at + _FLV_RESYNC_BYTES < size else None
                        break
                    firsts.append(at)
                    lasts.append(found - 1)
                    at = found
                    continue
                if data[at] & 0x1F == 8:
                    time = int.from_bytes(data[at + 4 : at + 7], "big") | data[at + 7] << 24
                    audio = [*audio[-1:], time]
                if data[at] & 0x1F == 9 and length:
                    frame = _flv_frame(data[at + _FLV_TAG : at + _FLV_TAG + min(length, 5)])
                    if frame is not None:
                        time = int.from_bytes(data[at + 4 : at + 7], "big") | data[at + 7] << 24
                        times.append(time + frame[1])
                        delay = frame[1] if delay is None else delay
                        last_video = time
                        keys.append(frame[0])
                        places.append(at)
                at = end + 4
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return None
    times, keys, places = np.array(times, np.int64), np.array(keys, bool), np.array(places)
    if not keys.any():
        return None
    firsts, lasts = np.array(firsts, np.int64), np.array(lasts, np.int64)
    frames = len(times) + frames_between(times, places, firsts, lasts)
    broken_at = int(firsts[0]) if len(firsts) else unpassed
    # the video ends where its last frame is shown: its time and the delay B-frames add (not
    # the latest time shown: past a cut, a P-frame stored before the B-frames lost), an audio
    # tag lasts as long as the time from the one before it (ADPCM's 4096 samples a tag: 0.19
    # s at 22 kHz), which FFmpeg's duration counts
    end_ms = max(last_video + (delay or 0), 2 * audio[1] - audio[0] if len(audio) == 2 else 0)
    return HeldFrames(
        frames,
        leading_frames(times, keys),
        0,
        broken_at,
        past_breaks=unpassed is None,
        end_s=end_ms / 1000,
    )


def _flv_frame(head: bytes) -> tuple[bool, int] | None:
    """(whether it is a key frame, its composition offset in ms) of a video tag whose data
    starts with `head`; None for a tag that holds no frame (or none of whose data the file
    holds: a last tag cut off after its header)."""
    if not head:
        return None
    kind, codec = head[0] >> 4 & 7, head[0] & 0x0F
    if kind == 5 or head[0] & 0x80:  # a video info or command frame; an extended header
        return None
    if codec in (_FLV_AVC, _FLV_HEVC):  # then its packet type (1: a frame) and the offset
        if len(head) < 5 or head[1] != 1:
            return None
        return kind == 1, int.from_bytes(head[2:5], "big", signed=True)
    return kind == 1, 0


def _flv_tag_after(data, at: int, size: int) -> int | None:
    """Where the first whole tag after byte `at` of an FLV file starts: a tag's start whose
    size the 4 bytes after it repeat (or that ends the file), within `_FLV_RESYNC_BYTES`."""
    end = min(size, at + _FLV_RESYNC_BYTES)
    for found in _FLV_TAG_START.finditer(data, at + 1, end):
        start = found.start()
        length = int.from_bytes(data[start + 1 : start + 4], "big")
        after = start + _FLV_TAG + length
        if (
            after + 4 <= size
            and int.from_bytes(data[after : after + 4], "big") == length + _FLV_TAG
        ):
            return start
    return None


# --- Ogg ----------------------------------------------------------------------------------------

_OGG_PAGE = 27  # "OggS", version, flags, granule position (8), serial (4), number (4), CRC (4),
# then the segment count and table
_OGG_RESYNC_BYTES = 1 << 26  # past a break, the next page is searched for this far
_MAX_OGG_PAGES = 50_000_000
_NO_GRANULE = (1 << 64) - 1  # a page on which no packet ends


def ogg_video_frames(path: str | os.PathLike, container: str | None) -> HeldFrames | None:
    """The frames an Ogg file holds for its Theora or VP8 stream: its packets but its headers
    (and a VP8 frame not shown, an alternate reference), walked page by page (each records
    its packets' sizes); past bytes that are no page inside the file (`broken_at`, the
    first), from the next page found (its capture pattern, and the page after it where it
    says), the frames whose packets they took counted from the frame numbers the granule
    positions either side give. `leading`: those before the first key frame (its packet's
    own flag); `not_coded`: packets of a few bytes or none (a Theora encoder's repeated
    frame). None for other formats, another video codec, no video stream, or a structure
    that cannot be read."""
    from torchkit.core.video.containers import NOT_CODED_BYTES

    if container != "ogg":
        return None
    video, codec, shift = None, None, 0
    frames, leading, not_coded, keyed = 0, 0, 0, False
    counted: list[int] = []  # at each video page with a granule position: the frames counted,
    numbers: list[int] = []  # and the frame number it gives its last packet
    # where the walk passed bytes that are no page, the frames counted and the marks by then
    breaks: list[tuple[int, int, int]] = []
    pending = b""  # the first bytes of a video packet that goes on to the next page
    unpassed = None  # where bytes that are no page run on past the search for the next
    try:
        with open(path, "rb") as handle, _mapped(handle) as data:
            size, at = len(data), 0
            for _ in range(_MAX_OGG_PAGES):
                if at + _OGG_PAGE > size:
                    break
                end = _ogg_page_end(data, at, size)
                if end is None:
                    found = _ogg_page_after(data, at, size)
                    if found is None:
                        # bytes past the search the walk could not pass: their frames untold
                        unpassed = at if at + _OGG_RESYNC_BYTES < size else None
                        break
                    breaks.append((at, frames, len(counted)))
                    at, pending = found, b""
                    continue
                lacing = data[at + _OGG_PAGE : at + _OGG_PAGE + data[at + 26]]
                start = at + _OGG_PAGE + len(lacing)
                serial = data[at + 14 : at + 18]
                if video is None and data[at + 5] & 2:  # a stream's first page: its codec
                    codec = _ogg_codec(data[start : start + 42])
                    if codec is not None:
                        video, shift = serial, _theora_shift(data[start : start + 42])
                if serial != video:
                    at = end
                    continue
                if not data[at + 5] & 1:  # no packet goes on from the page before
                    pending = b""
                length = 0
                for value in lacing:
                    length += value
                    if value == 255:  # the packet goes on
                        continue
                    head = (pending + data[start : start + min(length, 8)])[:8]
                    pending = b""
                    key = _ogg_frame(codec, head)
                    if key is not None:
                        frames += 1
                        not_coded += length <= NOT_CODED_BYTES
                        keyed = keyed or key
                        leading += not keyed
                    start, length = start + length, 0
                if length:
                    pending = (pending + data[start : start + min(length, 8)])[:8]
                granule = int.from_bytes(data[at + 6 : at + 14], "little")
                if granule != _NO_GRANULE:
                    counted.append(frames)
                    numbers.append(_ogg_frame_number(codec, granule, shift))
                at = end
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return None
    if video is None or not frames:
        return None
    missing = _numbers_missing(breaks, counted, numbers)
    broken_at = breaks[0][0] if breaks else unpassed
    leading = leading if keyed else 0
    return HeldFrames(frames + missing, leading, not_coded, broken_at, unpassed is None)


def _numbers_missing(
    breaks: list[tuple[int, int, int]], counted: list[int], numbers: list[int]
) -> int:
    """The frames a file's breaks took, each break (where, the frames counted by then, the
    marks made by then) between the last mark before it and the first after it: a mark is
    the frames counted at a point and the frame number the file gives there (an Ogg page's
    granule position, an MPEG GOP header's time code); the frame numbers between the two
    that no frame counted were in the bytes the break took."""
    missing = 0
    for _, _, after in breaks:
        if 0 < after < len(counted):
            numbered = numbers[after] - numbers[after - 1]
            missing += max(0, numbered - (counted[after] - counted[after - 1]))
    return missing


def _ogg_page_end(data, at: int, size: int) -> int | None:
    """Where the Ogg page (version 0) that starts at `at` ends, where that is the file's end
    or another page's start (a page whose segment table a zeroed region reached, its sizes
    then wrong, is no page); None where no such page starts there."""
    if data[at : at + 5] != b"OggS\x00" or at + _OGG_PAGE > size:
        return None
    table = at + _OGG_PAGE + data[at + 26]
    end = table + sum(data[at + _OGG_PAGE : table])
    return end if end == size or (end < size and data[end : end + 4] == b"OggS") else None


def _ogg_page_after(data, at: int, size: int) -> int | None:
    """Where the first page after byte `at` of an Ogg file starts (`_ogg_page_end`), within
    `_OGG_RESYNC_BYTES`."""
    stop = min(size, at + _OGG_RESYNC_BYTES)
    found = data.find(b"OggS\x00", at + 1, stop)
    while found >= 0 and _ogg_page_end(data, found, size) is None:
        found = data.find(b"OggS\x00", found + 1, stop)
    return found if found >= 0 else None


def _ogg_codec(head: bytes) -> str | None:
    """The video codec whose identification header `head` (a stream's first packet) is."""
    if head.startswith(b"\x80theora"):
        return "theora"
    return "vp8" if head.startswith(b"OVP80\x01") else None


def _theora_shift(head: bytes) -> int:
    """The bits of a Theora granule position that count the frames since its key frame
    (KFGSHIFT, 5 bits of its identification header's 41st and 42nd bytes); 0 for another."""
    if len(head) < 42 or not head.startswith(b"\x80theora"):
        return 0
    return (head[40] & 0x03) << 3 | head[41] >> 5


def _ogg_frame(codec: str | None, head: bytes) -> bool | None:
    """Whether the packet whose first bytes are `head` is a key frame; None for one that is
    no frame shown (a header; a VP8 frame not shown)."""
    if codec == "theora":
        if head[:1] and head[0] & 0x80:  # a header packet
            return None
        return bool(head) and not head[0] & 0x40
    if not head or head[:1] == b"O":  # a VP8 header packet ("OVP80")
        return None if head else False
    return None if not head[0] & 0x10 else not head[0] & 1  # show_frame, then its type


def _ogg_frame_number(codec: str | None, granule: int, shift: int) -> int:
    """The frame number a granule position gives (Theora: the key frame's and the frames
    since; VP8: its upper 32 bits)."""
    if codec == "theora":
        return (granule >> shift) + (granule & ((1 << shift) - 1))
    return granule >> 32


# --- MPEG-PS ------------------------------------------------------------------------------------

_PS_VIDEO = 0xE0  # the first video stream's ID
_PS_RESYNC_BYTES = 1 << 26  # past a break, the next pack is searched for this far
_MAX_PS_PACKETS = 100_000_000
# A picture's, a sequence header's and a GOP header's start codes in MPEG-1/2 video
_PS_CODES = re.compile(rb"\x00\x00\x01[\x00\xb3\xb8]")
# The time codes' nominal rates of the frame rate codes (23.976 counts 24, 29.97 counts 30)
_PS_TIMECODE_RATES = {1: 24, 2: 24, 3: 25, 4: 30, 5: 30, 6: 50, 7: 60, 8: 60}


def ps_video_frames(path: str | os.PathLike, container: str | None) -> HeldFrames | None:
    """The frames an MPEG-PS file (.mpg, .vob) holds for its first video stream, MPEG-1/2
    video: the pictures (their start codes) of its video packets' data, walked pack by pack
    and packet by packet (each records its length); past bytes that are no pack or packet
    inside the file (`broken_at`, the first), from the next pack found, the pictures they
    took counted from the time codes of the GOP headers either side. `leading`: those before
    the first I-picture and the B-pictures right after it (an open GOP's, which refer to
    frames before it: FFmpeg decodes none of them). None for other formats, other video (no
    picture start code), or a structure that cannot be read."""
    if container != "mpeg-ps":
        return None
    state = _PsPictures()
    breaks: list[tuple[int, int, int]] = []
    unpassed = None  # where bytes that are no pack run on past the search for the next
    try:
        with open(path, "rb") as handle, _mapped(handle) as data:
            size, at = len(data), 0
            for _ in range(_MAX_PS_PACKETS):
                if at + 4 > size:
                    break
                length = _ps_unit_length(data, at, size)
                if length is None:
                    found = _ps_pack_after(data, at, size)
                    if found is None:
                        # bytes past the search the walk could not pass: their frames untold
                        unpassed = at if at + _PS_RESYNC_BYTES < size else None
                        break
                    breaks.append((at, state.frames, len(state.counted)))
                    state.carry = b""  # a picture's start split by the break is lost
                    at = found
                    continue
                if length == 0:  # the end code
                    break
                if data[at + 3] == _PS_VIDEO:
                    state.read(data[_ps_payload(data, at) : at + length])
                at += length
    except (OSError, ValueError):
        return None
    if not state.frames or state.first_key is None:
        return None
    missing = _numbers_missing(breaks, state.counted, state.numbers)
    broken_at = breaks[0][0] if breaks else unpassed
    return HeldFrames(
        state.frames + missing, state.leading, 0, broken_at, past_breaks=unpassed is None
    )


class _PsPictures:
    """The pictures of an MPEG-1/2 video stream's data, given a packet's data at a time: how
    many, those that lead its first I-picture (before it, and the B-pictures right after
    it), and at each GOP header the pictures counted before it (`counted`) and the frame
    number its time code gives (`numbers`)."""

    def __init__(self) -> None:
        self.frames, self.leading, self.first_key = 0, 0, None
        self.following = False  # the pictures since the first I-picture are all B-pictures
        self.rate, self.counted, self.numbers = 0, [], []
        self.carry = b""  # the last bytes of the data before: a start code split between two

    def read(self, payload: bytes) -> None:
        data, stop = self.carry + payload, None
        for found in _PS_CODES.finditer(data):
            at, code = found.start(), data[found.start() + 3]
            if at + 8 > len(data):
                stop = at  # read with the next packet's data
                break
            if code == 0x00:  # a picture: its type after 10 bits of temporal reference
                self.count(data[at + 5] >> 3 & 7)
            elif code == 0xB3:  # a sequence header: its frame rate code
                self.rate = _PS_TIMECODE_RATES.get(data[at + 7] & 0x0F, 0)
            elif code == 0xB8 and self.rate:  # a GOP header: its time code
                self.counted.append(self.frames)
                self.numbers.append(_gop_frame_number(data[at + 4 : at + 8], self.rate))
        # a start code's first bytes at the end (one read whole ends 8 bytes before it at most)
        self.carry = data[stop:] if stop is not None else data[-3:]

    def count(self, kind: int) -> None:
        """Count a picture of type `kind` (1: I, 2: P, 3: B)."""
        if self.first_key is None:
            if kind == 1:
                self.first_key, self.following = self.frames, True
            else:
                self.leading += 1
        elif self.following:
            self.following = kind == 3
            self.leading += kind == 3
        self.frames += 1


def _gop_frame_number(field: bytes, rate: int) -> int:
    """The frame number a GOP header's time code gives (drop-frame: two frame numbers a
    minute left out, but each tenth minute's)."""
    bits = int.from_bytes(field, "big") >> 7  # 25 bits: drop, hours, minutes, marker, ...
    drop, hours, minutes = bits >> 24 & 1, bits >> 19 & 0x1F, bits >> 13 & 0x3F
    seconds, pictures = bits >> 6 & 0x3F, bits & 0x3F
    total_minutes = 60 * hours + minutes
    number = ((total_minutes * 60) + seconds) * rate + pictures
    return number - (2 * (total_minutes - total_minutes // 10) if drop else 0)


def _ps_pack_after(data, at: int, size: int) -> int | None:
    """Where the first pack header after byte `at` of an MPEG program stream starts (its
    start code and a length `_ps_unit_length` reads: bytes that only look like its start
    code, a run of them, are passed in one search), within `_PS_RESYNC_BYTES`."""
    stop = min(size, at + _PS_RESYNC_BYTES)
    found = data.find(b"\x00\x00\x01\xba", at + 1, stop)
    while found >= 0 and _ps_unit_length(data, found, size) is None:
        found = data.find(b"\x00\x00\x01\xba", found + 1, stop)
    return found if found >= 0 else None


def _ps_unit_length(data, at: int, size: int) -> int | None:
    """The length of the pack header or packet at `at` of an MPEG program stream (0 for the
    end code); None where none starts there or it runs past the file's end."""
    if data[at : at + 3] != b"\x00\x00\x01" or data[at + 3] < 0xB9:
        return None
    if data[at + 3] == 0xB9:
        return 0
    if data[at + 3] == 0xBA:
        if at + 14 > size:
            return None
        if data[at + 4] >> 6 == 1:  # MPEG-2: 14 bytes and up to 7 of stuffing
            length = 14 + (data[at + 13] & 7)
        elif data[at + 4] >> 4 == 2:  # MPEG-1: 12 bytes
            length = 12
        else:
            return None
    else:
        length = 6 + int.from_bytes(data[at + 4 : at + 6], "big")
    return length if at + length <= size else None


def _ps_payload(data, at: int) -> int:
    """Where the data of the PES packet at `at` starts, after its header (MPEG-2's: its
    length at byte 8; MPEG-1's: stuffing, a buffer size and its time stamps)."""
    if data[at + 6] >> 6 == 2:
        return at + 9 + data[at + 8]
    at += 6
    while data[at] == 0xFF:  # stuffing
        at += 1
    if data[at] >> 6 == 1:  # the STD buffer's scale and size
        at += 2
    flags = data[at] >> 4
    return at + (5 if flags == 2 else 10 if flags == 3 else 1)
