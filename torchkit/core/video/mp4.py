"""MP4/MOV/3GP (ISO base media files): boxes, the video track's sample table and fragments,
its edit list, display matrix and timing, and the frames it holds for the damage check."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torchkit.core.video.held import MAX_BOXES, NOT_CODED_BYTES, HeldFrames, fourcc_text


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
    for _ in range(MAX_BOXES):
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
    for _ in range(MAX_BOXES):
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


def iso_fourcc(handle, size: int) -> str | None:
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


def iso_boxes_end(handle, size: int) -> int | None:
    """The end of the last top-level box of an ISO base media file (MP4, MOV, 3GP). In a
    fragmented file, bytes that are no box are passed over to the next fragment, as
    `_iso_file_boxes` does: a region zeroed inside a whole file is damage, not a cut."""
    offset, fragmented = 0, False
    for _ in range(MAX_BOXES):
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
