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

import os

from torchkit.core.video.containers import M2TS_PACKET, TS_PACKET, HeldFrames

# --- MPEG-TS ------------------------------------------------------------------------------------

# The stream types of a PMT that are video: MPEG-1, MPEG-2, MPEG-4 Part 2, H.264, HEVC, VVC,
# AVS, Dirac, VC-1
_TS_VIDEO_TYPES = frozenset({0x01, 0x02, 0x10, 0x1B, 0x24, 0x33, 0x42, 0xD1, 0xEA})
_TS_CHUNK_PACKETS = 1 << 16  # packets read at a time (12 MiB)
_TS_TABLE_PACKETS = 1 << 14  # the PAT and PMT are sought in the first packets (FFmpeg: each 0.1 s)
# An open GOP's leading pictures follow its key frame at once: the frames after it whose time
# is at or before its own are sought this far (past it, a 33-bit time that wraps misleads)
_LEADING_WINDOW = 64


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
    broken_at = int(lost[0]) * size if len(lost) else None
    frames = len(times) + _frames_between(times, places, lost)
    return HeldFrames(frames, _leading(times, keys), 0, broken_at, past_breaks=True)


def _frames_between(times, places, lost) -> int:
    """The frames whose starts lay in the lost packets (numbered `lost`, sorted): for each run
    of them, the frame times missing between the latest time of the frames stored before it
    and the earliest of those after (`times`, the frames' starts at the packets numbered
    `places`, sorted), at the video's frame interval (the commonest step between its times).
    Frames stored out of their order (B-frames) make the gap smaller, never larger."""
    import numpy as np

    steps = np.diff(np.unique(times))
    if not len(lost) or not len(steps):
        return 0
    values, counts = np.unique(steps, return_counts=True)
    interval = int(values[np.argmax(counts)])
    gaps = np.flatnonzero(np.diff(lost) > 1)  # the last lost packet of each run but the last
    firsts, lasts = lost[np.r_[0, gaps + 1]], lost[np.r_[gaps, len(lost) - 1]]
    missing = 0
    for start, end in zip(firsts, lasts, strict=True):
        before = np.searchsorted(places, start)
        after = np.searchsorted(places, end, side="right")
        if before == 0 or after == len(places):
            continue
        shown_before = times[max(0, before - _LEADING_WINDOW) : before].max()
        shown_after = times[after : after + _LEADING_WINDOW].min()
        missing += max(0, int((shown_after - shown_before) // interval) - 1)
    return missing


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


def _leading(times, keys) -> int:
    """The frames, in stored order, with their times (`times`) and key flags (`keys`, one at
    least), that a whole file gives no picture for: those before the first key frame, and
    those after it within `_LEADING_WINDOW` shown at or before it."""
    import numpy as np

    first = int(np.argmax(keys))
    after = times[first + 1 : first + 1 + _LEADING_WINDOW]
    return first + int((after <= times[first]).sum())
