"""Matroska/WebM: EBML elements, the Segment's size, the video track's own length (its
tags), its projection, and the frames its clusters hold for the damage check."""

from __future__ import annotations

import itertools
import math
import os
import re
import struct

from torchkit.core.video.held import NOT_CODED_BYTES, HeldFrames, frames_between


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


def ebml_segment_end(handle, size: int) -> int | None:
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
    found = _matroska_video_track(handle)
    if found is None:
        return None
    track, (start, length) = found
    # a live recording's Segment or Clusters of unknown size: past bytes that are no element,
    # the walk goes on at the next Cluster (as FFmpeg's reader does), the frames it passed
    # counted from the times either side; a file of known sizes gives its break alone
    walk = _ClusterWalk(handle, track, live=length < 0)
    try:
        return walk.segment(start, size if walk.live else min(start + length, size))
    except _WalkEnds as ended:
        return ended.held


def _matroska_video_track(handle) -> tuple[int, tuple[int, int]] | None:
    """(the video track's number, (where the Segment's data starts, its size: -1 unknown)) of
    the Matroska/WebM file open as `handle`, from its first `_MKV_HEAD` bytes; None where they
    name no video track or Segment."""
    head = handle.read(_MKV_HEAD)
    elements = _matroska_head_elements(head)
    if elements is None or _MKV_TRACKS not in elements[1]:
        return None
    entry = _matroska_video_entry(head, *elements[1][_MKV_TRACKS])
    number = None if entry is None else entry.get(0xD7)  # TrackNumber
    segment = next(((s, n) for i, s, n in _ebml_elements(head, 0) if i == _MKV_SEGMENT), None)
    if not number or segment is None:
        return None
    return int.from_bytes(number, "big"), segment


class _WalkEnds(Exception):
    """The walk of a file's clusters ends before its Segment's end: `held`, what it found (a
    file of known sizes whose bytes stop being elements), or None (too many elements)."""

    def __init__(self, held: HeldFrames | None) -> None:
        super().__init__()
        self.held = held


class _ClusterWalk:
    """The walk of a Matroska/WebM file's clusters for the frames of its video track `track`,
    counted as its blocks are read: the frames shown, those that lead its first key frame,
    those of a few bytes, and for a live recording (`live`: its Segment or a Cluster of
    unknown size) each frame's time and place and the runs of bytes passed, for the frames
    they took."""

    def __init__(self, handle, track: int, *, live: bool) -> None:
        self.handle, self.track, self.live = handle, track, live
        self.frames, self.leading, self.not_coded = 0, 0, 0
        self.key_time: int | None = None  # the first key frame's time
        self.cluster_time = 0
        self.here = 0  # where the block being counted starts
        self.times: list[int] = []
        self.places: list[int] = []
        self.firsts: list[int] = []  # where each run of bytes passed starts
        self.lasts: list[int] = []  # and its last byte
        self.budget = _MKV_MAX_ELEMENTS

    def segment(self, at: int, end: int) -> HeldFrames | None:
        """Walk the Segment's top-level elements from `at` to `end`, each Cluster's children
        (`cluster`); past bytes that are no element, a live recording's walk goes on at the
        next Cluster. None for an element of unknown size that holds no frames."""
        while at < end:
            found = self.element(at)
            if found is not None and found[2] < 0 and found[0] != _MKV_CLUSTER:
                return None  # an element of unknown size that holds no frames
            if found is None or found[1] + max(found[2], 0) > end:
                resumed = _matroska_cluster_after(self.handle, at, end) if self.live else None
                if resumed is None:  # the file's end: a live recording cut there reads so
                    return self.held(None if self.live else at)
                at = self.passed(at, resumed)
                continue
            kind, start, length, _ = found
            if kind == _MKV_CLUSTER:
                self.live = self.live or length < 0
                child = self.cluster(start, length, end)
                if length < 0 or child < start + length:
                    at = child
                    continue
            at = start + length
        return self.held(None)

    def cluster(self, start: int, length: int, end: int) -> int:
        """Walk the children of the Cluster whose data starts at `start` (`length` bytes, or
        -1: to where the next top-level element starts, up to `end`), counting its blocks;
        where the walk goes on. Bytes that are no element end a file of known sizes there
        (`_WalkEnds`); a live recording's walk passes the rest of a Cluster of known size."""
        child, cluster_end = start, end if length < 0 else start + length
        while child < cluster_end:
            self.budget -= 1
            inner = self.element(child)
            if self.budget < 0:
                raise _WalkEnds(None)
            if length < 0 and inner is not None and inner[0] in _MKV_LEVEL_1:
                break  # a Cluster of unknown size ends where the next one starts
            if inner is None or inner[2] < 0 or inner[1] + inner[2] > cluster_end:
                if not self.live:
                    raise _WalkEnds(self.held(child))
                if length >= 0:  # the rest of a Cluster of known size passed
                    child = self.passed(child, cluster_end)
                break  # else the walk goes on from there: the next Cluster
            self.here = child
            self.read(*inner)
            child = inner[1] + inner[2]
        return child

    def read(self, kind: int, start: int, length: int, first: bytes) -> None:
        """Read a Cluster's child: its time, a SimpleBlock, or a BlockGroup's Block."""
        if kind == _MKV_CLUSTER_TIME:
            self.cluster_time = int.from_bytes(first[: min(length, 8)], "big")
        elif kind == _MKV_SIMPLE_BLOCK:
            self.count(first, length)
        elif kind == _MKV_BLOCK_GROUP:
            block, referenced = _ebml_group(self.element, start, length)
            if block is not None:
                self.count(*block, key=not referenced)

    def element(self, at: int) -> tuple[int, int, int, bytes] | None:
        """(ID, where its data starts, its length, its first bytes) of the element at `at`;
        None where its bytes are no element's, or one that runs past its parent's end."""
        self.handle.seek(at)
        data = self.handle.read(24)
        found = _ebml_number(data, 0, keep_marker=True)
        length = found and _ebml_number(data, found[1], keep_marker=False)
        if not length:
            return None
        return found[0], at + found[1] + length[1], length[0], data[found[1] + length[1] :]

    def count(self, block: bytes, length: int, key: bool | None = None) -> None:
        """Count the shown frames of a Block or SimpleBlock of the video track (its first
        bytes, `length` in all), and those of them that lead the first key frame: `key` for a
        Block (its group refers to no other), a SimpleBlock's own flag where None, and those of
        `NOT_CODED_BYTES` or fewer."""
        owner = _ebml_number(block, 0, keep_marker=False)
        if owner is None or owner[0] != self.track or len(block) < owner[1] + 3:
            return
        flags = block[owner[1] + 2]
        if flags & 0x08:  # invisible
            return
        key = bool(flags & 0x80) if key is None else key
        laced = flags >> 1 & 3
        shown = 1 if not laced else (block[owner[1] + 3] + 1 if len(block) > owner[1] + 3 else 0)
        if not laced and length - owner[1] - 3 <= NOT_CODED_BYTES:
            self.not_coded += 1
        # its time: the cluster's and its own offset from it (a signed 16-bit number)
        offset = int.from_bytes(block[owner[1] : owner[1] + 2], "big", signed=True)
        time = self.cluster_time + offset
        if self.key_time is None and key:
            self.key_time = time
        elif self.key_time is None or time <= self.key_time:  # a time before 0 lifted to 0
            self.leading += shown
        self.frames += shown
        self.times.append(time)
        self.places.append(self.here)

    def passed(self, at: int, resumed: int) -> int:
        """Note the bytes from `at` to `resumed` passed (no elements); `resumed`."""
        self.firsts.append(at)
        self.lasts.append(resumed - 1)
        return resumed

    def held(self, broken_at: int | None) -> HeldFrames:
        """What the walk found: a live recording's frames with those the bytes it passed
        took, else its frames and where its bytes stopped being elements (`broken_at`)."""
        # no key frame flagged: a writer that sets no flags, which tells nothing of them
        leading = self.leading if self.key_time is not None else 0
        if not self.live:
            return HeldFrames(self.frames, leading, self.not_coded, broken_at)
        import numpy as np

        runs = (self.times, self.places, self.firsts, self.lasts)
        missing = frames_between(*(np.array(run, np.int64) for run in runs))
        broken = self.firsts[0] if self.firsts else None
        return HeldFrames(self.frames + missing, leading, self.not_coded, broken, past_breaks=True)


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
