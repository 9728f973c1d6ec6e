"""The formats made for streaming (MPEG-TS and M2TS, FLV, Ogg, MPEG-PS): the frames they hold
for their video, counted from their own structure without decoding (for `--exact`'s damage
check: packets, tags, pages, pictures), and where an FLV, Ogg or MPEG-PS file ends (a copy
cut short).

These formats record no frame count: FFmpeg's is their duration times the rate. Their packets
or tags are walked, a frame each where the format says one starts, past a region zeroed or
overwritten to the structure after it (FFmpeg's readers go on there too), so a whole file's
count is known however much of it decodes. Where a walk cannot tell its units for frames, or
which frame is the first that decodes, it gives None: no judgement, rather than a whole file
called damaged.
"""

from __future__ import annotations

import array
import collections
import functools
import itertools
import math
import mmap
import os
import re
import struct
from collections.abc import Iterable, Iterator
from fractions import Fraction
from typing import NamedTuple

from torchkit.core.video.held import (
    MPEG_START,
    NOT_CODED_BYTES,
    PTS_CLOCK,
    HeldFrames,
    exp_golomb,
    frames_between,
    leading_frames,
    mpeg_frame_rate,
    pts_span_s,
    unwrapped_pts,
    walked_once,
)

TS_PACKET = 188
M2TS_PACKET = 192  # M2TS/MTS (AVCHD, Blu-ray): a 4-byte timestamp before each TS packet

# --- MPEG-TS ------------------------------------------------------------------------------------

# The stream types of a PMT that are video: MPEG-1, MPEG-2, MPEG-4 Part 2, H.264, HEVC, VVC,
# AVS, Dirac, VC-1
_TS_VIDEO_TYPES = frozenset({0x01, 0x02, 0x10, 0x1B, 0x24, 0x33, 0x42, 0xD1, 0xEA})
_TS_CHUNK_PACKETS = 1 << 16  # packets read at a time (12 MiB)
# the most pictures a decoder holds back to show later: H.264's and HEVC's largest picture
# buffer (FFmpeg's decoder fed another codec's data after them drops 1-3 of them: H.264 with
# 0-16 B-frames, HEVC, MPEG-2, 1-16 decoder threads)
_DECODER_HOLDS = 16
_TS_SECTION = 1024  # the most bytes of a PAT's or PMT's section
_TS_TABLES_KEPT = 64  # the sections read kept, to read each table's repeats once
# FFmpeg reads a section whose CRC fails where those on its PID before it failed too, this
# many in a row (its crc_validity: one that holds sets it to 100, each that fails takes 1)
_TS_CRC_FAILS_READ = 10
_TS_CRC_HELD = 100


def ts_video_frames(path: str | os.PathLike, container: str | None) -> HeldFrames | None:
    """The frames an MPEG-TS (or M2TS) file holds for its first video stream: its PES packets
    that carry a presentation time, each the start of a frame (a PES packet may carry more
    frames, but one time, so this never counts more than there are; FFmpeg's and broadcast
    muxers write a frame a PES packet), and where TS packets that do not start with the sync
    byte lie inside the file (zeroed or overwritten: `broken_at`, the first), the frames
    whose times fall between the video's times either side of them (`_frames_between`).
    `leading`: those before the first whose packet flags a random access point (its key
    frame), and those after it shown at or before it (an open GOP's leading pictures). Where
    a later PMT no longer lists the video's PID with its stream type (files of another codec
    joined by `cat`, FFmpeg's decoder fed their data), the walk stops there: the frames after
    it are not counted, and those from the last key frame before it, `_DECODER_HOLDS` at
    most, are `leading` too (a decoder fed another codec's data may never show those it
    still held: 3 of 90 H.264 frames, 1 to 3 MPEG-2); the tables are its first program's
    (`_TsTables`); where the first chunk's packets hold no PMT that is read, the first
    PID whose PES packets are a video stream's (as FFmpeg guesses the streams of a file
    whose tables it cannot read). None for other formats, no video stream in that program's
    first PMT (read in the first chunk's packets), or a file that flags no random access
    point (which frame decodes first is not told)."""
    import numpy as np

    if container not in ("mpeg-ts", "m2ts"):
        return None
    size, prefix = (TS_PACKET, 0) if container == "mpeg-ts" else (M2TS_PACKET, 4)
    times, keys, places, lost = [], [], [], []
    try:
        with open(path, "rb") as handle:
            tables, switch = _TsTables(), None
            first = 0  # the number of the chunk's first packet
            while True:
                data = handle.read(size * _TS_CHUNK_PACKETS)
                whole = len(data) - len(data) % size
                if not whole:
                    break
                packets = np.frombuffer(data[:whole], np.uint8).reshape(-1, size)[:, prefix:]
                switch = tables.switch_in(packets)
                if tables.video is None and not tables.mapped and not first:
                    tables.video = _ts_guessed_video(packets)  # no PMT read
                if tables.video is None:  # no video stream in its first PMT (or none read)
                    return None
                packets = packets[:switch]  # (all of them where the codec stays)
                lost.append(first + np.flatnonzero(packets[:, 0] != 0x47))
                chunk_times, chunk_keys, chunk_places = _ts_pes_starts(packets, tables.video[1])
                times.append(chunk_times)
                keys.append(chunk_keys)
                places.append(first + chunk_places)
                first += len(packets)
                if switch is not None or len(data) < size * _TS_CHUNK_PACKETS:
                    break
    except OSError:
        return None
    times, keys, places, lost = (np.concatenate(part) for part in (times, keys, places, lost))
    if not keys.any():
        return None
    # the frames a decoder may still hold where another codec's data follows: from the last
    # key frame before the switch, but no more than a decoder holds (a whole GOP of hundreds
    # would excuse any damage before it)
    held_at_switch = 0
    if switch is not None:
        held_at_switch = min(_DECODER_HOLDS, len(keys) - int(np.flatnonzero(keys)[-1]))
    times = unwrapped_pts(times)  # a recording's times may wrap (33 bits at 90 kHz: 26.5 h)
    broken_at, frames = None, len(times)
    if len(lost):
        broken_at = int(lost[0]) * size
        gaps = np.flatnonzero(np.diff(lost) > 1)  # the last lost packet of a run, but the last
        firsts, lasts = lost[np.r_[0, gaps + 1]], lost[np.r_[gaps, len(lost) - 1]]
        frames += frames_between(times, places, firsts, lasts)
    leading = min(len(times), leading_frames(times, keys) + held_at_switch)
    return HeldFrames(frames, leading, 0, broken_at, past_breaks=True, span_s=pts_span_s(times))


def _ts_guessed_video(packets) -> tuple[int, int] | None:
    """(0, its PID) of the first TS packet of `packets` (188 bytes a row, sync byte first)
    that starts a PES packet of a video stream (stream ID 0xE0 to 0xEF); None where none
    does."""
    import numpy as np

    starts = np.flatnonzero(_ts_unit_starts(packets))
    for number, pid in zip(starts.tolist(), _ts_pids(packets[starts]).tolist(), strict=True):
        payload = _ts_payload(packets[number].tobytes())
        if payload[:3] == MPEG_START and len(payload) > 3 and payload[3] & 0xF0 == _PS_VIDEO:
            return 0, pid
    return None


def _ts_pids(packets):
    """The PID of each TS packet of `packets` (188 bytes a row, sync byte first)."""
    import numpy as np

    return (packets[:, 1].astype(np.int32) & 0x1F) << 8 | packets[:, 2]


def _ts_unit_starts(packets):
    """Whether each TS packet of `packets` (188 bytes a row, sync byte first) holds the sync
    byte and starts a PES packet or section in a payload it carries."""
    return (packets[:, 0] == 0x47) & (packets[:, 1] & 0x40 > 0) & (packets[:, 3] & 0x10 > 0)


def _ts_pes_starts(packets, video: int):
    """(the presentation time of each PES packet of the PID `video` that carries one, whether
    its first TS packet flags a random access point, that packet's number) in the TS packets
    `packets` (188 bytes a row, sync byte first)."""
    import numpy as np

    starts = _ts_unit_starts(packets) & (_ts_pids(packets) == video)
    numbers = np.flatnonzero(starts)
    rows = packets[starts]
    adapted = rows[:, 3] >> 4 & 2 > 0  # its control: 2 an adaptation field, 1 a payload, 3 both
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


class _TsTables:
    """An MPEG-TS file's PAT and its first program's PMT, read as its packets come: the first
    video stream that program's first PMT lists, and where a later PMT of it no longer lists
    that stream's PID with its stream type (a file of another codec, or with its video on
    another PID, joined by `cat`). A section is joined across the packets it takes (a PMT
    listing many streams takes more than one) and read only whole, its CRC holding or the
    `_TS_CRC_FAILS_READ` before it on its PID failing theirs too (as FFmpeg reads them); a
    PMT is the program's only where it gives the program's number (programs may share a
    PMT's PID, each its own section)."""

    def __init__(self) -> None:
        self.program: tuple[int, int] | None = None  # the PAT's first program: number, PMT PID
        self.video: tuple[int, int] | None = None  # the first PMT's first video: type, PID
        self.mapped = False  # the first PMT read
        self.pending: dict[int, bytearray] = {}  # PID: the section begun on it
        self.read: dict[bytes, tuple[bool, object]] = {}  # a section's: its CRC holds, what
        # it says (they repeat)
        self.validity: dict[int, int] = {}  # a PID's: FFmpeg's crc_validity

    def switch_in(self, packets) -> int | None:
        """Reads the PATs and PMTs of the chunk `packets` (188 bytes a row, sync byte first);
        the number of the packet whose PMT switches the video's codec, None where none
        does."""
        import numpy as np

        pid = _ts_pids(packets)
        synced = packets[:, 0] == 0x47
        width, maps = packets.shape[1], {self.program[1]} if self.program else set()
        pats = packets[synced & (pid == 0) & (packets[:, 1] & 0x40 > 0)].tobytes()
        for packet in {pats[at : at + width] for at in range(0, len(pats), width)}:
            # the PMT PIDs the PATs may give (their first packets, read below in order)
            program = _ts_first_program(_ts_section_start(packet)[8:])
            maps.add(program[1] if program else 0)
        numbers = np.flatnonzero(synced & np.isin(pid, [0, *maps]))
        tables = packets[numbers].tobytes()
        for at, number in zip(range(0, len(tables), width), numbers.tolist(), strict=True):
            for section in self._sections(tables[at : at + width], int(pid[number])):
                said = self._said(section, int(pid[number]))
                if said is None:
                    continue
                if section[0] == 0x00 and pid[number] == 0:
                    self.program = said or self.program
                elif self.program and (section[0], pid[number]) == (0x02, self.program[1]):
                    program, streams = said
                    if program != self.program[0]:  # another program's, on the same PID
                        continue
                    if not self.mapped:
                        videos = [s for s in streams if s[0] in _TS_VIDEO_TYPES]
                        self.video, self.mapped = (videos[0] if videos else None), True
                    elif self.video is not None and self.video not in streams:
                        return number
        return None

    def _sections(self, packet: bytes, pid: int) -> list[bytes]:
        """The sections on `pid` that the TS packet `packet` ends whole: one begun in the
        packets before it, one it begins."""
        payload = _ts_payload(packet)
        if not payload:
            return []
        ended = []
        if packet[1] & 0x40:  # a section begins, where its pointer field says
            if pid in self.pending:  # the bytes before it end the one pending
                ended.append(self.pending.pop(pid) + payload[1 : 1 + payload[0]])
            self.pending[pid] = bytearray(payload[1 + payload[0] :])
        elif pid in self.pending:
            self.pending[pid] += payload
        whole = []
        for section in [*ended, self.pending.get(pid)]:
            if section is None or len(section) < 3:
                continue
            end = 3 + _ts_section_length(section)
            if end <= len(section):
                whole.append(bytes(section[:end]))
            if section is self.pending.get(pid) and (end <= len(section) or end > _TS_SECTION):
                del self.pending[pid]  # read, or no section (stuffing: 0xFF)
        return whole

    def _said(self, section: bytes, pid: int) -> object:
        """What a PAT (its first program: number, PMT PID) or a PMT (its program's number,
        (stream type, PID) of each stream) on `pid` says, as FFmpeg reads it: its CRC
        holding, or where the `_TS_CRC_FAILS_READ` sections on `pid` before it failed theirs
        too (a muxer that writes the CRC wrong); None otherwise."""
        if section not in self.read:
            said = None
            if len(section) >= 12:
                body = section[8:-4]
                if section[0] == 0x00:
                    said = _ts_first_program(body)
                elif section[0] == 0x02:
                    said = (int.from_bytes(section[3:5], "big"), _ts_pmt_streams(body))
            if len(self.read) > _TS_TABLES_KEPT:  # (a table changes rarely: versions kept)
                self.read.clear()
            holds = len(section) >= 12 and _crc32(section, 0xFFFFFFFF) == 0  # (over its CRC)
            self.read[section] = holds, said
        holds, said = self.read[section]
        validity = self.validity.get(pid, 0)
        if holds:
            self.validity[pid] = _TS_CRC_HELD
        elif validity > -_TS_CRC_FAILS_READ:
            self.validity[pid] = validity - 1
            return None
        return said


def _ts_payload(packet: bytes) -> bytes:
    """A TS packet's payload: its bytes after its header and adaptation field (none where it
    flags none)."""
    control, at = packet[3] >> 4 & 3, 4
    if control & 2:
        at += 1 + packet[4]
    return packet[at:] if control & 1 else b""


def _ts_section_start(packet: bytes) -> bytes:
    """The bytes of the PSI section (PAT, PMT) that a TS packet begins (it flags one), to the
    packet's end; empty where it holds none."""
    payload = _ts_payload(packet)
    return payload[1 + payload[0] :] if payload else b""  # after the pointer field


def _ts_section_length(section) -> int:
    """The length a PSI section's header gives for the bytes after its first 3."""
    return (section[1] & 0x0F) << 8 | section[2]


def _ts_first_program(body: bytes) -> tuple[int, int] | None:
    """(number, PMT PID) of the first program a PAT's body (its program, PID pairs) lists
    (program 0 is the network's PID)."""
    for at in range(0, len(body) - 3, 4):
        if number := int.from_bytes(body[at : at + 2], "big"):
            return number, (body[at + 2] & 0x1F) << 8 | body[at + 3]
    return None


def _ts_pmt_streams(body: bytes) -> list[tuple[int, int]]:
    """(stream type, PID) of each elementary stream a PMT's body lists, in order."""
    streams = []
    at = 4 + ((body[2] & 0x0F) << 8 | body[3]) if len(body) > 3 else len(body)
    while at + 5 <= len(body):
        streams.append((body[at], (body[at + 1] & 0x1F) << 8 | body[at + 2]))
        at += 5 + ((body[at + 3] & 0x0F) << 8 | body[at + 4])
    return streams


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

    tags = _flv_tags(path) if container == "flv" else None
    if tags is None:
        return None
    times, keys = np.asarray(tags.times, np.int64), np.asarray(tags.keys, bool)
    places = np.asarray(tags.places, np.int64)
    firsts, lasts = np.array(tags.firsts, np.int64), np.array(tags.lasts, np.int64)
    unpassed = tags.unpassed
    # the video ends where its last frame is shown: its time and the delay B-frames add (not
    # the latest time shown: past a cut, a P-frame stored before the B-frames lost)
    end_ms = max(tags.last_video + (tags.delay or 0), tags.audio_end_ms)
    if not keys.any():
        return None
    frames = len(times) + frames_between(times, places, firsts, lasts)
    return HeldFrames(
        frames,
        leading_frames(times, keys),
        0,
        int(firsts[0]) if len(firsts) else unpassed,
        past_breaks=unpassed is None,
        end_s=end_ms / 1000,
    )


class _FlvTags:
    """What one walk of an FLV file's tags reads (`_walk_flv_tags`). Of its video tags that
    hold a frame: each one's time shown (its tag's and its composition offset, ms), whether it
    is a key frame, where it starts; the first one's composition offset (`delay`, which
    B-frames add to every frame's time), the last one's tag time, the bytes the smallest and
    the largest takes (header, data and the size after it). Of its audio tags: the bytes they
    take, the first one's and the last two's times. The latest time of any tag. Where bytes
    that are no tag break the walk: each run's first and last byte (`firsts`, `lasts`: the
    walk went on from the next tag found), or where a run the search could not pass starts
    (`unpassed`; `broken` either way). `ends_whole`: its last tag ends the file, and the size
    after it repeats that tag's own. (A frame's entries are machine integers, 17 bytes a frame
    where lists of Python numbers take about 80: the walk is kept for the rest of the probe,
    `walked_once`.)"""

    def __init__(self) -> None:
        self.times = array.array("q")
        self.keys = array.array("b")
        self.places = array.array("q")
        self.firsts: list[int] = []
        self.lasts: list[int] = []
        self.unpassed: int | None = None
        self.broken = False
        self.delay: int | None = None
        self.last_video = 0
        self.smallest: int | None = None
        self.largest = 0
        self.latest = 0
        self.audio_bytes = 0
        self.audio_first: int | None = None
        self.audio = collections.deque[int](maxlen=3)  # the last three audio tags' times (ms)
        self.ends_whole = False

    @property
    def audio_end_ms(self) -> int:
        """When its audio ends: its last tag lasts as long as the time from the one before it
        (ADPCM's 4096 samples a tag: 0.19 s at 22 kHz), which FFmpeg's duration counts, or
        from the one before that to it where that is shorter (a gap in the audio before its
        last tag, a live recording's dropout, is no tag's length); 0 without two audio
        tags."""
        if len(self.audio) < 2:
            return 0
        return self.audio[-1] + min(b - a for a, b in itertools.pairwise(self.audio))


@walked_once
def _flv_tags(path: str | os.PathLike) -> _FlvTags | None:
    """`_walk_flv_tags` of the FLV file at `path`; None where it cannot be read. Walked once
    a probe: where its streams end, whether it was cut between two tags and the frames it
    holds are all read from it."""
    try:
        with open(path, "rb") as handle, _mapped(handle) as data:
            return _walk_flv_tags(data)
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return None


def _walk_flv_tags(data) -> _FlvTags:
    """The `_FlvTags` of an FLV file's bytes `data`, walked tag by tag from the header's end
    by the size each records, past bytes that are no tag from the next tag found."""
    tags, size = _FlvTags(), len(data)
    at = int.from_bytes(data[5:9], "big") + 4  # the header, the size of no tag before
    for _ in range(_MAX_FLV_TAGS):
        if at + _FLV_TAG > size:
            break
        if data[at] & 0x1F not in (8, 9, 18) or data[at + 8 : at + 11] != b"\x00" * 3:
            tags.broken = True
            found = _flv_tag_after(data, at, size)
            if found is None:
                # bytes past the search the walk could not pass: their frames untold
                tags.unpassed = at if at + _FLV_RESYNC_BYTES < size else None
                break
            tags.firsts.append(at)
            tags.lasts.append(found - 1)
            at = found
            continue
        kind, length = data[at] & 0x1F, int.from_bytes(data[at + 1 : at + 4], "big")
        time = int.from_bytes(data[at + 4 : at + 7], "big") | data[at + 7] << 24
        tags.latest, taken = max(tags.latest, time), _FLV_TAG + length + 4
        if kind == 8:
            tags.audio.append(time)
            tags.audio_bytes += taken
            tags.audio_first = time if tags.audio_first is None else tags.audio_first
        elif kind == 9 and length:
            frame = _flv_frame(data[at + _FLV_TAG : at + _FLV_TAG + min(length, 5)])
            if frame is not None:
                tags.times.append(time + frame[1])
                tags.delay = frame[1] if tags.delay is None else tags.delay
                tags.last_video = time
                tags.keys.append(frame[0])
                tags.places.append(at)
                tags.smallest = taken if tags.smallest is None else min(tags.smallest, taken)
                tags.largest = max(tags.largest, taken)
        tags.ends_whole = at + taken == size and (
            int.from_bytes(data[size - 4 : size], "big") == taken - 4
        )
        at += taken
    return tags


def flv_video_without_frames(path: str | os.PathLike, container: str | None) -> bool:
    """Whether an FLV file whose header declares video holds no frame of it, its tags walked
    whole to the file's end (a recording stopped before its first frame, which FFmpeg does not
    open), and the file size its metadata may record is not more than its own (a copy cut
    between two tags)."""
    if container != "flv":
        return False
    tags = _flv_tags(path)
    if tags is None or tags.broken or tags.unpassed is not None or len(tags.times):
        return False
    try:
        with open(path, "rb") as handle:
            head = handle.read(5)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return False
    declares_video = len(head) == 5 and bool(head[4] & 1)
    return declares_video and tags.ends_whole and flv_recorded_size(path, size) is None


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


@walked_once
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
    opened: set[bytes] = set()  # the streams whose first page was read, and last
    closed: set[bytes] = set()
    begun = False  # a page that begins no stream read: the streams of the first link begun
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
                        # but the video's last page, its header lost, where it alone is
                        # not closed by then (its packets' sizes still read to the end)
                        unclosed = video is not None and opened - closed == {video}
                        lost = _ogg_headless_page(data, at, size) if unclosed else None
                        if lost is not None:
                            breaks.append((at, frames, len(counted)))
                            frames += sum(
                                _ogg_frame(codec, (pending + head)[:8]) is not None for head in lost
                            )
                        break
                    breaks.append((at, frames, len(counted)))
                    at, pending = found, b""
                    continue
                lacing = data[at + _OGG_PAGE : at + _OGG_PAGE + data[at + 26]]
                start = at + _OGG_PAGE + len(lacing)
                serial = data[at + 14 : at + 18]
                if data[at + 5] & 2 and begun:
                    # a stream begun after the first link's pages: the next link of files
                    # joined by `cat` (its serial numbers new or the same), which OpenCV's
                    # FFmpeg does not decode; the frames of the first alone are counted
                    break
                begun = begun or not data[at + 5] & 2
                opened |= {serial} if data[at + 5] & 2 else set()
                closed |= {serial} if data[at + 5] & 4 else set()
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
    granule position); the frame numbers between the two
    that no frame counted were in the bytes the break took."""
    missing = 0
    # several breaks between the same two marks (zeroes a muxer pads with beside a region
    # zeroed) took the frame numbers between them once
    for after in sorted({after for _, _, after in breaks}):
        if 0 < after < len(counted):
            numbered = numbers[after] - numbers[after - 1]
            missing += max(0, numbered - (counted[after] - counted[after - 1]))
    return missing


def _ogg_page_end(data, at: int, size: int) -> int | None:
    """Where the Ogg page (version 0) that starts at `at` ends, where that is the file's end
    or another page's start, or its checksum holds (a page whose segment table a zeroed
    region reached, its sizes then wrong, is no page); None where no such page starts
    there."""
    if data[at : at + 5] != b"OggS\x00" or at + _OGG_PAGE > size:
        return None
    table = at + _OGG_PAGE + data[at + 26]
    end = table + sum(data[at + _OGG_PAGE : table])
    if end == size or (end < size and data[end : end + 4] == b"OggS"):
        return end
    return end if end < size and _ogg_checksum_holds(data[at:end]) else None


def _ogg_checksum_holds(page: bytes) -> bool:
    """Whether an Ogg page's CRC-32 (bytes 22 to 25: its own, taken as zeroes) is its bytes'
    (the polynomial 0x04C11DB7, not reflected, from 0)."""
    return _crc32(page[:22] + bytes(4) + page[26:], 0) == int.from_bytes(page[22:26], "little")


def _crc32(data: bytes, crc: int) -> int:
    """The CRC-32 of `data` by the polynomial 0x04C11DB7, not reflected, from `crc` (Ogg's
    from 0; MPEG's PSI sections from all ones, 0 over a section and its CRC)."""
    table = _crc32_table()
    for byte in data:
        crc = (crc << 8 & 0xFFFFFFFF) ^ table[crc >> 24 ^ byte]
    return crc


@functools.cache
def _crc32_table() -> tuple[int, ...]:
    table = []
    for index in range(256):
        crc = index << 24
        for _ in range(8):
            crc = (crc << 1 ^ 0x04C11DB7 if crc & 1 << 31 else crc << 1) & 0xFFFFFFFF
        table.append(crc)
    return tuple(table)


def _ogg_headless_page(data, at: int, size: int) -> list[bytes] | None:
    """The first bytes of each packet that ends on the page from `at` to the file's end whose
    first 27 bytes are lost (zeroed, overwritten: its capture pattern, granule position and
    segment count), where just one count of its segment table's entries makes the sizes
    they give reach the file's end; None where none does, or more than one."""
    fits = [
        count
        for count in range(1, 256)
        if at + _OGG_PAGE + count <= size
        and at + _OGG_PAGE + count + sum(data[at + _OGG_PAGE : at + _OGG_PAGE + count]) == size
    ]
    if len(fits) != 1:
        return None
    heads, start, length = [], at + _OGG_PAGE + fits[0], 0
    for value in data[at + _OGG_PAGE : at + _OGG_PAGE + fits[0]]:
        length += value
        if value < 255:
            heads.append(data[start : start + min(length, 8)])
            start, length = start + length, 0
    return heads


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


def ogg_video_without_frames(path: str | os.PathLike, container: str | None) -> bool:
    """Whether an Ogg file's pages, walked whole to its end, hold a Theora or VP8 stream's
    headers and no packet of it but them (a recording stopped before its first frame, which
    FFmpeg does not open)."""
    if container != "ogg":
        return False
    video, codec = None, None
    try:
        with open(path, "rb") as handle, _mapped(handle) as data:
            size, at = len(data), 0
            while at < size:  # each page is at least _OGG_PAGE bytes
                end = _ogg_page_end(data, at, size) if at + _OGG_PAGE <= size else None
                if end is None:
                    return False  # bytes that are no page: a damaged or cut file
                lacing = data[at + _OGG_PAGE : at + _OGG_PAGE + data[at + 26]]
                start = at + _OGG_PAGE + len(lacing)
                if video is None and data[at + 5] & 2:
                    codec = _ogg_codec(data[start : start + 42])
                    video = data[at + 14 : at + 18] if codec is not None else None
                if data[at + 14 : at + 18] == video:
                    begins = not data[at + 5] & 1  # no packet goes on from the page before
                    for value in lacing:
                        head = data[start : start + 8]
                        if begins and not (head and _ogg_header(codec, head)):
                            return False  # a frame (or an empty packet: a dropped one)
                        start, begins = start + value, value < 255
                at = end
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return False
    return video is not None


def _ogg_header(codec: str | None, head: bytes) -> bool:
    """Whether the packet whose first bytes are `head` is one of the stream's headers."""
    return bool(head[0] & 0x80) if codec == "theora" else head.startswith(b"OVP80")


def _ogg_frame_number(codec: str | None, granule: int, shift: int) -> int:
    """The frame number a granule position gives (Theora: the key frame's and the frames
    since; VP8: its upper 32 bits)."""
    if codec == "theora":
        return (granule >> shift) + (granule & ((1 << shift) - 1))
    return granule >> 32


# --- MPEG-PS ------------------------------------------------------------------------------------

_PS_VIDEO = 0xE0  # the video streams' IDs: 0xE0 to 0xEF
_PS_RESYNC_BYTES = 1 << 26  # past a break, the next pack is searched for this far
_VCD_SECTOR = 2324  # a VCD's sector: a pack and its padding
_PS_PADDING = 64  # zero bytes a muxer may write between packs elsewhere
_NONZERO = re.compile(rb"[^\x00]")
_MAX_PS_PACKETS = 100_000_000
_FIT_PICTURES = 8  # the pictures a run of anchors spans at least, to check the frame rate by
_MEDIAN_ANCHORS = 5  # the anchors of a run whose median keeps to the common offset
_LOCAL_PICTURES = 60  # the pictures either side of a break whose frames shown are weighed
_MPEG_START_CODE = re.compile(rb"\x00\x00\x01")


def _byte_class(kept) -> bytes:
    """A regular expression's class of the bytes for which `kept` holds."""
    return b"[" + b"".join(b"\\x%02x" % value for value in range(256) if kept(value)) + b"]"


# An MPEG-1/2 stream's start codes that count or number its pictures: a picture's, a sequence
# header's, a GOP header's, a sequence extension's (progressive_sequence), a picture coding
# extension's of a frame picture that repeats a field (it is shown for longer); not its
# slices' (a row of macroblocks each: 30 a DVD picture), nor the picture coding extension of
# every other picture (one each: as many matches again to pass over). An extension's start
# code whose next bytes are not all there yet matches, to be read with the next packet's.
_MPEG12_CODES = re.compile(
    rb"\x00\x00\x01(?:[\x00\xb3\xb8]|\xb5(?![^\x10-\x1f\x80-\x8f]|[\x80-\x8f].(?:"
    + _byte_class(lambda value: value & 3 != 3)  # picture_structure: a field, not a frame
    + b".|."
    + _byte_class(lambda value: not value & 2)  # repeat_first_field not set
    + b")))",
    re.DOTALL,
)
# The picture types (1: I, 2: P, 3: B) of an MPEG-4 Part 2 VOP's coding type (I, P, B, S)
_VOP_TYPES = (1, 2, 3, 2)


def mpeg_pictures_shown(chunks: Iterable[bytes], enough: int) -> tuple[int, float]:
    """(The pictures that start in an MPEG-1/2 video stream's bytes, given a chunk at a time
    until `enough` are counted, the frames they are shown for): one each, more where an
    MPEG-2 picture repeats a field (`_PsPictures`)."""
    pictures = _PsPictures()
    for chunk in chunks:
        pictures.read(chunk)
        if pictures.frames >= enough:
            break
    return pictures.frames, pictures.shown


def ps_video_frames(
    path: str | os.PathLike, container: str | None, fps: float | None = None
) -> HeldFrames | None:
    """The frames an MPEG-PS file (.mpg, .vob) holds for its first video stream (MPEG-1/2,
    MPEG-4 Part 2, H.264 or HEVC): the pictures that start in its video packets' data
    (`_PsPictures`), walked pack by pack and packet by packet (each records its length);
    past bytes that are no pack or packet inside the file (`broken_at`, the first), from the
    next pack found, the pictures they took counted from the presentation times of the video
    packets either side (`frames_between`). `leading`: those before the first I-picture and
    the B-pictures right after it (an open GOP's, which refer to frames before it: FFmpeg
    decodes none of them); `not_coded`: MPEG-4 VOPs of a few bytes. None for other formats,
    video of another codec, or a structure that cannot be read."""
    import numpy as np

    if container != "mpeg-ps":
        return None
    state = _PsPictures()
    breaks: list[int] = []  # where bytes that are no pack or packet start
    unpassed = None  # where bytes that are no pack run on past the search for the next
    try:
        with open(path, "rb") as handle, _mapped(handle) as data:
            for unit in _ps_video_walk(data, resync=True):
                if unit.kind == "video":
                    state.read(data[unit.start : unit.end], unit.pts)
                elif unit.kind == "padding":
                    # sectors empty, or zeroes ending there: the times either side tell
                    if unit.end - unit.start > _PS_PADDING:
                        state.lose(bytes_lost=False)
                elif unit.end is None:
                    # bytes past the search the walk could not pass: their frames untold
                    unpassed = unit.start if unit.start + _PS_RESYNC_BYTES < len(data) else None
                else:
                    breaks.append(unit.start)
                    state.lose()  # a picture's start split by the break is lost
    except (OSError, ValueError, IndexError):
        return None
    if not state.frames or state.first_key is None:
        return None
    return HeldFrames(
        state.frames + state.lost(fps),
        state.leading,
        state.not_coded,
        breaks[0] if breaks else unpassed,
        past_breaks=unpassed is None,
        span_s=pts_span_s(unwrapped_pts(np.array([t for _, t in state.anchors], np.int64))),
    )


_VIDEO_HEAD_BYTES = 1 << 18  # of a file, searched for its video's first data
_VIDEO_HEAD = 256  # of its video's data: a sequence header (140 with both matrices), extension


def mpeg_video_head(path: str | os.PathLike, container: str | None) -> bytes:
    """The first bytes of the first video stream's data of an MPEG-PS or MPEG-TS (M2TS) file,
    `_VIDEO_HEAD` where its first 256 KiB hold as many (an MPEG-1/2 stream's first sequence header
    and extension): its PS packets' data after their headers, or its TS packets' payloads on
    the video's PID from the first that starts a PES packet, after that packet's header.
    Empty for other formats, where the structure cannot be read, or where no video is found."""
    if container not in ("mpeg-ps", "mpeg-ts", "m2ts"):
        return b""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_VIDEO_HEAD_BYTES)
    except OSError:
        return b""
    try:
        return _ps_video_head(data) if container == "mpeg-ps" else _ts_video_head(data, container)
    except (ValueError, IndexError):
        return b""


def _ps_video_head(data: bytes) -> bytes:
    """`mpeg_video_head` of an MPEG-PS file's first bytes `data`: walked pack by pack (past a
    VCD's padding) to the first bytes that are none."""
    head = bytearray()
    for unit in _ps_video_walk(data, resync=False):
        if unit.kind == "video":
            head += data[unit.start : unit.end]
            if len(head) >= _VIDEO_HEAD:
                break
    return bytes(head[:_VIDEO_HEAD])


class _PsUnit(NamedTuple):
    """A step of `_ps_video_walk`. `kind`: "video", a packet of the first video stream, its
    data from `start` (after its header) to `end`, `pts` the presentation time it carries
    (None where it carries none); "padding", zero bytes from `start` to the pack at `end`
    (`_ps_padding_end`); "break", bytes that are no pack or packet from `start` to the next
    pack at `end`, None where none is found or none is sought (the walk ends there)."""

    kind: str
    start: int
    end: int | None
    pts: int | None = None


def _ps_video_walk(data, resync: bool) -> Iterator[_PsUnit]:
    """The packets of the first video stream (IDs 0xE0 to 0xEF: FFmpeg writes H.264 as 0xE2)
    of an MPEG program stream's bytes `data`, walked pack by pack and packet by packet (each
    records its length) from its start to its end code or its last byte, and the padding and
    breaks it passes between them (`_PsUnit`). Past bytes that are no pack or packet, with
    `resync` the walk goes on at the next pack found within `_PS_RESYNC_BYTES`; without, it
    ends there."""
    size, at, video = len(data), 0, None
    for _ in range(_MAX_PS_PACKETS):
        if at + 4 > size:
            return
        length = _ps_unit_length(data, at, size)
        if length is None:
            padded = _ps_padding_end(data, at, size)
            if padded is not None:
                yield _PsUnit("padding", at, padded)
                at = padded
                continue
            found = _ps_pack_after(data, at, size) if resync else None
            yield _PsUnit("break", at, found)
            if found is None:
                return
            at = found
            continue
        if length == 0:  # the end code
            return
        if video is None and data[at + 3] & 0xF0 == _PS_VIDEO:
            video = data[at + 3]
        if data[at + 3] == video:
            payload, pts = _ps_payload(data, at)
            yield _PsUnit("video", payload, at + length, pts)
        at += length


def _ts_video_head(data: bytes, container: str) -> bytes:
    """`mpeg_video_head` of an MPEG-TS (M2TS) file's first bytes `data`: the video its first
    program's PMT lists (or, where none is read, the first PID whose PES packets are video)."""
    import numpy as np

    size, prefix = (TS_PACKET, 0) if container == "mpeg-ts" else (M2TS_PACKET, 4)
    whole = len(data) - len(data) % size
    if not whole:
        return b""
    packets = np.frombuffer(data[:whole], np.uint8).reshape(-1, size)[:, prefix:]
    tables = _TsTables()
    tables.switch_in(packets)
    video = tables.video or (None if tables.mapped else _ts_guessed_video(packets))
    if video is None:
        return b""
    ours = (packets[:, 0] == 0x47) & (_ts_pids(packets) == video[1])
    starts = np.flatnonzero(ours & _ts_unit_starts(packets))
    if not len(starts):
        return b""
    numbers = np.flatnonzero(ours)
    payload = _ts_payload(packets[starts[0]].tobytes())
    if payload[:3] != MPEG_START or len(payload) < 9:
        return b""
    head = bytearray(payload[9 + payload[8] :])  # after the PES header: its length at byte 8
    end = starts[1] if len(starts) > 1 else len(packets)  # the PES packet's last TS packet
    for number in numbers[(numbers > starts[0]) & (numbers < end)].tolist():
        if len(head) >= _VIDEO_HEAD:
            break
        head += _ts_payload(packets[number].tobytes())
    return bytes(head[:_VIDEO_HEAD])


def _pictures_lost(
    anchors: list[tuple[float, float]],
    breaks: list[tuple[float, bool]],
    jump: float,
    per_picture: list[float],
    rate_checked: bool = False,
) -> int:
    """The frames the breaks of a stream took, from its pictures whose frame position is
    known (`anchors`: a picture's number, the frames the pictures stored before it are shown
    for (one each, more where a flag repeats a field), and its position in frames: its
    presentation time over the frame interval, or its GOP's time code and its temporal
    reference): in each run of anchors between breaks (`breaks`: the pictures counted
    before each, and whether it is bytes that are no pack, else a VCD's empty sectors), an
    anchor's position less its number is the same but for B-frames shown before frames
    stored before them; across a break it grows by the pictures lost. Each run's median is
    taken, less its error (the most an anchor strays from its run's median between the
    breaks of bytes that are no pack, where the run has few anchors, else a frame): a count
    that can fall short, never exceed the pictures lost (a variable frame rate strays
    more). Runs split where the positions step over `jump` frames either way (files joined,
    each restarting its times). `per_picture`: the frames a picture is shown for about each
    break (the frames it took over that are the pictures it took). `rate_checked`: none
    counted where the positions do not keep to one frame a picture (within a tenth, over a
    run of `_FIT_PICTURES`: a variable frame rate, FFmpeg's rate wrong)."""
    import numpy as np

    if len(anchors) < 2 or not breaks:
        return 0
    index = np.array([number for number, _ in anchors], np.float64)
    positions = np.array([position for _, position in anchors], np.float64)
    offset = positions - index
    jumps = set((np.flatnonzero(abs(np.diff(positions)) > jump) + 1).tolist())
    firsts = np.searchsorted(index, [number for number, _ in breaks])  # the anchor after
    hard = set(firsts[np.array([bytes_lost for _, bytes_lost in breaks], bool)].tolist())
    stray, checked = 0.0, not rate_checked
    for run in _runs(len(index), hard | jumps):
        stray = max(stray, float(abs(offset[run] - np.median(offset[run])).max()))
        if not rate_checked or index[run[-1]] - index[run[0]] < _FIT_PICTURES:
            continue
        if abs(_run_slope(index, positions, run) - 1) > 0.1:
            return 0
        checked = True
    if not checked:
        return 0
    starts = sorted((set(firsts.tolist()) | jumps) - {0, len(index)})
    runs = _runs(len(index), set(starts))
    medians = [float(np.median(offset[run])) for run in runs]
    errors = [stray if len(run) < _MEDIAN_ANCHORS else 1.0 for run in runs]
    run_of = np.searchsorted(starts, np.arange(len(index)), side="right")
    shown_for = np.ones(len(index) + 1)  # the frames a picture is shown for, by anchor after
    np.maximum.at(shown_for, firsts, per_picture)
    missing = 0
    for first in np.unique(firsts):
        if 0 < first < len(index):
            now, before = run_of[first], run_of[first - 1]
            grown = medians[now] - medians[before] - errors[now] - errors[before]
            missing += max(0, int(grown / shown_for[first] + 1e-9))
    return missing


def _runs(count: int, starts: set[int]) -> list:
    """The runs of `count` anchors' positions, a run starting at each of `starts`."""
    import numpy as np

    return np.split(np.arange(count), sorted(starts - {0, count}))


def _run_slope(index, positions, run) -> float:
    """The frames a picture of a run of anchors moves on: their positions' least-squares
    slope over their numbers (B-frames shown before frames stored before them stray either
    side)."""
    numbers = index[run] - index[run].mean()
    return float((numbers * (positions[run] - positions[run].mean())).sum() / (numbers**2).sum())


def _gop_frame_number(field: bytes, rate: int) -> int:
    """The frame number a GOP header's time code gives (drop-frame: two frame numbers a
    minute left out, but each tenth minute's)."""
    bits = int.from_bytes(field, "big") >> 7  # 25 bits: drop, hours, minutes, marker, ...
    drop, hours, minutes = bits >> 24 & 1, bits >> 19 & 0x1F, bits >> 13 & 0x3F
    seconds, pictures = bits >> 6 & 0x3F, bits & 0x3F
    total_minutes = 60 * hours + minutes
    number = ((total_minutes * 60) + seconds) * rate + pictures
    return number - (2 * (total_minutes - total_minutes // 10) if drop else 0)


class _PsPictures:
    """The pictures of a video stream's data (MPEG-1/2, MPEG-4 Part 2, H.264, HEVC; told by
    its first sequence header, VOL or parameter set), given a packet's data at a time: how
    many start in it (a picture start code, a VOP start code, the first slice of a picture),
    those that lead its first I-picture (before it, and the B-pictures right after it), and
    MPEG-4 VOPs of `NOT_CODED_BYTES` or fewer (not coded: FFmpeg shows no picture);
    `anchors`, the pictures that carry a time (the first to start in a packet that gives
    one: its number and the time), and `breaks`, the pictures counted before each break;
    numbered by the frames they are shown for (`shown`: one each, more where an MPEG-2
    picture repeats a field, as soft telecine's 3:2 pulldown flags do: FFmpeg decodes one
    frame a picture, while its times and time codes count the frames shown)."""

    def __init__(self) -> None:
        self.frames, self.leading, self.first_key, self.not_coded = 0, 0, None, 0
        self.following = False  # the pictures since the first I-picture are all B-pictures
        self.codec: str | None = None
        self.carry = b""  # the last bytes of the data before: a start code split between two
        self.read_bytes = 0  # the stream's bytes before `carry`'s first
        self.vop_at: int | None = None  # where the last MPEG-4 VOP started in the stream
        self.anchors: list[tuple[float, int]] = []
        self.breaks: list[tuple[float, bool]] = []
        self.shown = 0.0  # the frames the pictures counted are shown for
        # the frames the pictures before each are shown for (one each but where an MPEG-2
        # picture repeats a field), and the pictures counted before each break
        self.shown_before = array.array("d")
        self.broken_after: list[int] = []
        self.progressive = False  # an MPEG-2 sequence extension's progressive_sequence
        self.time: int | None = None  # a packet's time, for the next picture to start
        # MPEG-1/2: the time codes' rate, the frame number of the last GOP header's time
        # code (None past a break, until the next), the GOP headers read, and of each
        # picture a GOP's time code numbers: its number (`shown`), that frame number, its
        # temporal reference, the pictures counted before it and the GOP headers read
        self.rate, self.gop, self.gops = 0, None, 0
        self.sequence = b""  # the last sequence header's first bytes (its frame rate code)
        # the frames shown a second, which a picture's time moves on by: the first picture's
        # sequence's (its header's rate, and an MPEG-2 sequence extension's)
        self.frame_rate: float | None = None
        self.numbered: list[tuple[float, int, int, int, int]] = []

    def lose(self, bytes_lost: bool = True) -> None:
        """Bytes of the stream lost (`bytes_lost`: bytes that are no pack, else a VCD's
        empty sectors, which may end zeroes): a start code split by them, a VOP's size,
        and the picture a time was given for, untold."""
        self.read_bytes += len(self.carry)
        self.carry, self.vop_at, self.time, self.gop = b"", None, None, None
        self.breaks.append((self.shown, bytes_lost))
        self.broken_after.append(self.frames)

    def lost(self, fps: float | None) -> int:
        """The pictures the breaks took (`_pictures_lost`), from the pictures' times at the
        rate `fps`, or the time codes and temporal references of MPEG-1/2 pictures: the
        more of the two (each can fall short, never exceed them); the frames lost over the
        frames a picture is shown for about the break (`_shown_per_picture`: one but where
        pictures repeat fields)."""
        import numpy as np

        if not self.breaks:
            return 0
        shown = np.append(np.frombuffer(self.shown_before, np.float64), self.shown)
        per_picture = self._shown_per_picture(shown)
        by_codes = _pictures_lost(self._numbered(shown), self.breaks, self.rate, per_picture)
        if self.shown > self.frames and self.frame_rate:  # pictures that repeat fields:
            fps = self.frame_rate  # their times move on at this rate (FFmpeg's strays: 31.0)
        if fps and len(self.anchors) >= 2:
            times = unwrapped_pts(np.array([time for _, time in self.anchors], np.int64))
            numbers = [number for number, _ in self.anchors]
            positions = list(zip(numbers, times * fps / PTS_CLOCK, strict=True))
            by_times = _pictures_lost(positions, self.breaks, fps, per_picture, rate_checked=True)
            by_codes = max(by_codes, by_times)
        return by_codes

    def _shown_per_picture(self, shown) -> list[float]:
        """The frames a picture is shown for about each break: the more of the means of the
        `_LOCAL_PICTURES` pictures before it and after it (no further than the breaks either
        side), from `shown` (the frames the pictures before each are shown for); one where
        no picture lies either side."""
        edges = [0, *self.broken_after, self.frames]
        per_picture = []
        for before, at, after in zip(edges, edges[1:], edges[2:], strict=False):
            start, end = max(before, at - _LOCAL_PICTURES), min(after, at + _LOCAL_PICTURES)
            sides = [(shown[b] - shown[a]) / (b - a) for a, b in ((start, at), (at, end)) if b > a]
            per_picture.append(max(sides, default=1.0))
        return per_picture

    def _numbered(self, shown) -> list[tuple[float, float]]:
        """The MPEG-1/2 pictures a GOP's time code numbers: each one's number (`anchors` of
        `_pictures_lost`) and its place in frames shown, the time code's frame number and the
        frames the GOP's pictures before it in display order (a smaller temporal reference)
        are shown for (`shown`: the frames the pictures before each are shown for); a
        picture of the GOP not read (a break took it) is taken as shown for its GOP's mean."""
        places: list[tuple[float, float]] = []
        for _, group in itertools.groupby(self.numbered, key=lambda entry: entry[4]):
            pictures = list(group)
            lasting = {
                order: float(shown[index + 1] - shown[index]) for _, _, order, index, _ in pictures
            }
            mean = sum(lasting.values()) / len(lasting)
            ordered = sorted(lasting)
            before, place = {}, 0.0
            for rank, order in enumerate(ordered):
                unread = order - rank  # the orders before it that no picture read has
                before[order] = place + unread * mean
                place += lasting[order]
            for number, gop, order, _, _ in pictures:
                places.append((number, gop + before[order]))
        return places

    def read(self, payload: bytes, time: int | None = None) -> None:
        """Count the pictures that start in a packet's data `payload`, the first given the
        packet's `time` (a picture whose start code began in the packet before is not)."""
        data, stop = self.carry + payload, None
        if time is not None:
            self.time = None  # one the packet before gave, to no picture: not this one's
        fresh = len(self.carry)  # where this packet's own data starts
        codes = _MPEG12_CODES if self.codec == "mpeg12" else _MPEG_START_CODE
        for found in codes.finditer(data):
            at = found.start()
            if at + 8 > len(data) or (data[at + 3] == 0xB5 and at + 10 > len(data)):
                stop = at  # read with the next packet's data (a sequence extension's rate)
                break
            if self.vop_at is not None:  # the VOP before ends at this start code
                self.not_coded += self.read_bytes + at - self.vop_at <= NOT_CODED_BYTES
                self.vop_at = None
            if self.codec is None:
                self.codec = _ps_codec(data[at + 3 : at + 5], data[max(0, at - 4) : at])
            if self.codec == "mpeg12":
                self.time_code(data[at + 3 : at + 10])
            kind = _picture_type(self.codec, data[at + 3 : at + 8])
            if kind is not None:
                if at >= fresh and time is not None:
                    self.time, time = time, None
                if self.time is not None:
                    self.anchors.append((self.shown, self.time))
                    self.time = None
                self.count(kind)
                self.vop_at = self.read_bytes + at if self.codec == "mpeg4" else None
        # a start code's first bytes at the end (one read whole ends 8 bytes before it at most)
        kept = stop if stop is not None else max(0, len(data) - 3)
        self.read_bytes += kept
        self.carry = data[kept:]
        if time is not None:  # no picture started here: the next to start takes it
            self.time = time

    def time_code(self, head: bytes) -> None:
        """Read an MPEG-1/2 start code's next bytes `head`: a sequence header's rate, a GOP
        header's time code, a picture's temporal reference (its place in display order from
        the GOP's first), which numbers it; a sequence extension's progressive_sequence and
        rate (`mpeg_frame_rate`: 15 fps is 25 x 3/5), and the picture coding extension after
        a picture's header: a frame picture whose repeat_first_field is set is shown for a
        field more (in a progressive sequence, a frame more, two with top_field_first)."""
        if head[0] == 0xB3:  # a sequence header: its frame rate code
            self.sequence = head[1:5]
            rate = mpeg_frame_rate(self.sequence)
            # its time codes count at the code's rate, rounded: 30 for 29.97, and for the
            # 120 fps a sequence extension makes of 30 (FFmpeg writes them so: 6 bits)
            self.rate = int(rate + Fraction(1, 2)) if rate else 0
            self.take_rate(rate)
        elif head[0] == 0xB8:  # a GOP header: its time code
            self.gop = _gop_frame_number(head[1:5], self.rate) if self.rate else None
            self.gops += 1
        elif head[0] == 0x00 and self.gop is not None:
            order = head[1] << 2 | head[2] >> 6
            self.numbered.append((self.shown, self.gop, order, self.frames, self.gops))
        elif head[0] == 0xB5 and head[1] >> 4 == 1:  # a sequence extension
            self.progressive = bool(head[2] & 0x08)
            self.take_rate(mpeg_frame_rate(self.sequence, head[1:7]))
        elif head[0] == 0xB5 and head[1] >> 4 == 8 and head[3] & 3 == 3 and head[4] & 0x02:
            # a picture coding extension: a frame picture's repeat_first_field
            self.shown += (1 + (head[4] >> 7)) if self.progressive else 0.5

    def take_rate(self, rate: Fraction | None) -> None:
        """A sequence's frame `rate` (None unknown): the first picture's sequence gives the
        pictures' times their rate."""
        if not self.frames:
            self.frame_rate = float(rate) if rate else None

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
        self.shown_before.append(self.shown)
        self.frames += 1
        self.shown += 1


def _ps_codec(code: bytes, before: bytes) -> str | None:
    """The codec whose stream a start code's byte (and the one after) `code` begins: an
    MPEG-1/2 sequence header, an MPEG-4 visual object sequence or VOL, an H.264 sequence
    parameter set, an HEVC video or sequence parameter set; None for another start code.
    `before`: the 4 bytes before the start code. A VOL's codes (0x20 to 0x2F) are an MPEG-2
    slice's too (rows 32 to 47: a PAL DVD's last rows, where a part of a title split after a
    pack starts inside a picture): a VOL follows its VO's start code (0x00 to 0x1F, no data)."""
    if code[0] == 0xB3:
        return "mpeg12"
    after_vo = len(before) == 4 and before[:3] == b"\x00\x00\x01" and before[3] < 0x20
    if code[0] == 0xB0 or (0x20 <= code[0] <= 0x2F and after_vo):
        return "mpeg4"
    if code[0] in (0x67, 0x47):
        return "h264"
    if code[0] in (0x40, 0x42) and code[1:2] == b"\x01":
        return "hevc"
    return None


def _picture_type(codec: str | None, head: bytes) -> int | None:
    """The type (1: I, 2: P, 3: B) of the picture a start code whose next bytes are `head`
    starts in a `codec` stream; None where it starts none (another start code, a slice that
    is not its picture's first)."""
    code = head[0]
    if codec == "mpeg12":  # a picture: its type after 10 bits of temporal reference
        return head[2] >> 3 & 7 if code == 0x00 else None
    if codec == "mpeg4":  # a VOP: its coding type first
        return _VOP_TYPES[head[1] >> 6] if code == 0xB6 else None
    if codec == "h264":  # a slice NAL unit whose first_mb_in_slice is 0, then its type
        if code & 0x80 or code & 0x1F not in (1, 5) or not head[1] & 0x80:
            return None
        numbers = exp_golomb(head[1:], 2)
        if code & 0x1F == 5 or numbers is None:
            return 1 if code & 0x1F == 5 else 2
        return {2: 1, 4: 1, 1: 3}.get(numbers[1] % 5, 2)
    if codec == "hevc":  # a VCL NAL unit whose first_slice_segment_in_pic_flag is set
        kind = code >> 1 & 0x3F
        if code & 0x80 or kind > 21 or 9 < kind < 16 or not head[2] & 0x80:
            return None
        return 1 if kind >= 16 else 3 if kind in (8, 9) else 2  # IRAP, RASL, others
    return None


def _ps_padding_end(data, at: int, size: int) -> int | None:
    """Where the next pack starts after zero bytes a muxer pads packs with: a VCD ends each
    2,324-byte sector with 20 and writes sectors empty where it has nothing to send (a
    run of zeroes up to a sector's start), others a few; None where `at` starts none."""
    nonzero = _NONZERO.search(data, at, min(size, at + _PS_RESYNC_BYTES))
    found = nonzero.start() - 2 if nonzero else -1  # a pack's start code: 00 00 01 BA
    if found <= at or data[found : found + 4] != b"\x00\x00\x01\xba":
        return None
    if found - at > _PS_PADDING and found % _VCD_SECTOR:
        return None
    return found if _ps_unit_length(data, found, size) is not None else None


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


def _ps_payload(data, at: int) -> tuple[int, int | None]:
    """Where the data of the PES packet at `at` starts, after its header (MPEG-2's: its
    length at byte 8; MPEG-1's: stuffing, a buffer size and its time stamps), and the
    presentation time it carries (None where it carries none)."""
    if data[at + 6] >> 6 == 2:
        pts = _pts(data[at + 9 : at + 14]) if data[at + 7] & 0x80 else None
        return at + 9 + data[at + 8], pts
    at += 6
    while data[at] == 0xFF:  # stuffing
        at += 1
    if data[at] >> 6 == 1:  # the STD buffer's scale and size
        at += 2
    flags = data[at] >> 4
    pts = _pts(data[at : at + 5]) if flags in (2, 3) else None
    return at + (5 if flags == 2 else 10 if flags == 3 else 1), pts


def _pts(field: bytes) -> int:
    """The 33-bit presentation time of a PES header's 5 bytes (marker bits between)."""
    return (
        (field[0] >> 1 & 7) << 30
        | field[1] << 22
        | (field[2] >> 1) << 15
        | field[3] << 7
        | field[4] >> 1
    )


# --- where an FLV, Ogg or MPEG-PS file ends (a copy cut short) ------------------------------

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


def flv_tags_end(handle, size: int) -> int | None:
    """Where the last tag of an FLV file ends (with the 4-byte size that follows each tag): past
    the file's end when a copy is cut inside a tag, whose frame FFmpeg still decodes from what
    is there. A file ending on a tag's size says nothing (a cut between two tags looks the same):
    None, as for a structure that cannot be read. The tags are walked from the first only where
    the file's last 4 bytes lead to no tag. (The file size its metadata may record says
    nothing alone: a tool that rewrites the metadata may leave it stale, `flv_cut_short`.)"""
    if _flv_last_tag(handle, size) is not None:
        return None
    handle.seek(5)
    header = handle.read(4)
    if len(header) < 4:
        return None
    offset = int.from_bytes(header, "big") + 4  # the header, then the size of no tag before
    for _ in range(_MAX_FLV_TAGS):
        if offset >= size:
            return None  # ends on a tag's size
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


def flv_recorded_size(path: str | os.PathLike, size: int) -> int | None:
    """The file size an FLV's metadata records (`filesize`, as FFmpeg writes it) where it is
    more than the file's `size`; None where it records none, or no more."""
    try:
        with open(path, "rb") as handle:
            found = _FLV_FILESIZE.search(handle.read(_FLV_METADATA_BYTES))
    except OSError:
        return None
    if found is None:
        return None
    recorded = struct.unpack(">d", found.group(1))[0]
    if not math.isfinite(recorded) or not size < recorded < 1 << 50:
        return None
    return int(recorded)


class FlvVideoTail(NamedTuple):
    """What `flv_cut_short` weighs of an FLV file's tags: the bytes the smallest and the
    largest video tag that holds a frame takes (its header, data and the size after it), the
    last such tag's time, the latest time of any tag (an H.264 end of sequence after it
    carries its time), in ms, and the bytes its audio tags take a ms of the time they span;
    and the frames its video tags hold, the latest time one is shown (its tag's time and
    composition offset), in ms; when its audio ends (ms, 0 without two audio tags), and
    whether its last tag ends the file with the size after it that repeats its own."""

    smallest: int
    largest: int
    last_video_ms: int
    latest_ms: int
    audio_per_ms: float
    frames: int
    last_shown_ms: int
    audio_end_ms: int
    ends_whole: bool


def flv_video_tail(path: str | os.PathLike) -> FlvVideoTail | None:
    """An FLV file's `FlvVideoTail`, walked by its tags' sizes; None where it has no video
    frame, where the walk meets bytes that are no tag, or it cannot be read."""
    tags = _flv_tags(path)
    if tags is None or tags.broken or tags.smallest is None:
        return None
    audio_ms = tags.audio[-1] - tags.audio_first if tags.audio_first is not None else 0
    return FlvVideoTail(
        tags.smallest,
        tags.largest,
        tags.last_video,
        tags.latest,
        tags.audio_bytes / max(audio_ms, 1),
        len(tags.times),
        max(max(tags.times), 0),
        tags.audio_end_ms,
        tags.ends_whole,
    )


def flv_cut_short(
    tail: FlvVideoTail,
    size: int,
    recorded: int,
    frames_short: int,
    fps: float | None,
    frames_missing: int,
) -> bool:
    """Whether the `size`-byte FLV file whose tags are `tail`, and whose metadata records
    `recorded` bytes (`flv_recorded_size`), looks cut between two tags that lost
    `frames_short` video frames past the count's slack (`frames_missing` in all, at `fps`),
    which the tags' own sizes cannot tell: it falls short of that size by bytes that could
    hold those frames' tags (each as large as its smallest video tag: header, data and the
    size after it), and by no more than the tags of the frames missing and their time's
    audio could take (each as large as its largest video tag, twice its audio's bytes a
    second, and one more tag: a file of tags of its own past its video's end, or a size left
    stale by more, is whole); and its tags end within a frame of its last video frame's (a
    muxer writes tags in time order: where tags of other streams follow the video's last by
    more, the file went on past the video's end, which is its own). False where either fails
    (a tool that rewrote the metadata left the size stale: a whole file)."""
    if frames_short <= 0 or not fps:
        return False
    frame_ms = 1000 / fps
    missing_most = (frames_missing + 1) * (tail.largest + 2 * tail.audio_per_ms * frame_ms)
    if not frames_short * tail.smallest <= recorded - size <= missing_most:
        return False
    return tail.latest_ms - tail.last_video_ms <= frame_ms + 1


_OGG_TAIL = 65_307 + 27  # the most bytes of a page (255 segments of 255 bytes), and another's head


def ogg_pages_end(handle, size: int) -> int | None:
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


_PS_PACK = MPEG_START + b"\xba"
_PS_END_CODE = 0xB9
_PS_TAIL = 1 << 17  # the last bytes searched for a pack start (a PES packet is under 64 KiB)


def mpeg_ps_end(handle, size: int) -> int | None:
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
            whole_or_cut = end != len(tail) or tail[end - 4 : end] == MPEG_START + b"\xb9"
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
            return offset + 4 if MPEG_START.startswith(start_code[:3]) else None
        if start_code[:3] != MPEG_START or start_code[3] < _PS_END_CODE:
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
