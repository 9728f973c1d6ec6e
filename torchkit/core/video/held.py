"""What the damage checks share: the frames a file's index or structure holds (`HeldFrames`),
how many of them lead its first key frame or were lost across a break, MPEG presentation
times, one walk of a file's structure a probe (`walks_kept`), the bounds a walk of a corrupt
file keeps to, and small bitstream readers."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import ParamSpec, TypeVar


def fourcc_text(raw: bytes) -> str | None:
    """Four bytes as a FOURCC's text, padding spaces and NULs dropped (None when empty or not
    printable ASCII)."""
    text = raw.decode("latin-1").strip("\x00 ")
    return text if text and text.isprintable() and text.isascii() else None


@dataclass(frozen=True)
class HeldFrames:
    """The frames a file's index or clusters hold for its video (`frames`), and of them those
    a whole file may give no picture for: `leading`, before its first key frame, in the order
    they are stored or shown (a stream cut where no key frame starts it, or at an open GOP's
    key frame, whose leading pictures refer to frames before it: FFmpeg decodes none of
    them; an MPEG-TS walk stopped where a PMT switches the video's codec adds those from the
    last key frame before it), and `not_coded`, frames of `NOT_CODED_BYTES` or fewer;
    `broken_at`, where its bytes stop being its structure inside the sizes it records (None
    where they never do); `past_breaks`: `frames` counts those after it too (the structure
    found again past it), else the frames before it alone. `end_s`: where the walk tells it
    (an FLV's tags), the time in seconds its streams end: the last video frame's shown (its
    time and composition offset), the last audio tag's time plus the time from the one
    before it. `span_s`: where the walk reads the video's times (MPEG-TS and MPEG-PS), the
    seconds they span, a frame's time added for each run of them (files joined by `cat`
    restart their times: each file's run counts), which bounds the frames one each its
    units can be."""

    frames: int
    leading: int
    not_coded: int
    broken_at: int | None = None
    past_breaks: bool = False
    end_s: float | None = None
    span_s: float | None = None


# --- one walk of a file's structure a probe -----------------------------------------------------

_Params = ParamSpec("_Params")
_Walked = TypeVar("_Walked")
# The walks kept within `walks_kept`: (the walk, the file's path, its other arguments) to what
# it gave; None outside it
_WALKS_KEPT: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "walks_kept", default=None
)


@contextlib.contextmanager
def walks_kept() -> Iterator[None]:
    """Within it (in this thread), a walk made `walked_once` walks a file once and gives what
    it gave to every later call: one probe asks an FLV's tags where its streams end, whether
    it was cut between two tags and how many frames it holds, an Ogg file's pages its
    repeated frames and its frames, each a walk of every tag or page of the file. What was
    walked is let go at its end (a file is read afresh by the next probe). A scope inside
    another keeps to the outer one's walks."""
    if _WALKS_KEPT.get() is not None:
        yield
        return
    token = _WALKS_KEPT.set({})
    try:
        yield
    finally:
        _WALKS_KEPT.reset(token)


def walked_once(walk: Callable[_Params, _Walked]) -> Callable[_Params, _Walked]:
    """`walk` (of a file's path and hashable arguments), called once for each file and
    arguments within `walks_kept`, and each time outside it."""

    @functools.wraps(walk)
    def kept(*args: _Params.args, **kwargs: _Params.kwargs) -> _Walked:
        walks = _WALKS_KEPT.get()
        if walks is None:
            return walk(*args, **kwargs)
        path, *rest = args
        # the path as `Path` spells it: a probe passes both the path given (`./clip.ogv`, as
        # `find .` prints it) and its `Path` (`clip.ogv`), which name the same file
        key = (walk, os.fspath(Path(path)), *rest, *sorted(kwargs.items()))
        if key not in walks:
            walks[key] = walk(*args, **kwargs)
        return walks[key]

    return kept


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


# The frame rates of an MPEG-1/2 sequence header's frame_rate_code, as FFmpeg reads them (9 to
# 13 are Xing's and libmpeg3's, outside the standard)
_MPEG_FRAME_RATES = {
    1: Fraction(24000, 1001),
    2: Fraction(24),
    3: Fraction(25),
    4: Fraction(30000, 1001),
    5: Fraction(30),
    6: Fraction(50),
    7: Fraction(60000, 1001),
    8: Fraction(60),
    9: Fraction(15),
    10: Fraction(5),
    11: Fraction(10),
    12: Fraction(12),
    13: Fraction(15),
}


def mpeg_frame_rate(header: bytes, extension: bytes = b"") -> Fraction | None:
    """The frame rate of an MPEG-1/2 video sequence, from its sequence header's bytes after the
    start code (`header`, 4 at least: its frame_rate_code) and an MPEG-2 sequence extension's
    after its start code (`extension`, 6 at least; none for MPEG-1), whose
    frame_rate_extension_n and _d make it the code's rate x (n + 1) / (d + 1): a rate the
    codes lack, as FFmpeg writes it (15 fps: 25 x 3/5, 120: 30 x 4/1). None for a code of no
    rate."""
    rate = _MPEG_FRAME_RATES.get(header[3] & 0x0F) if len(header) >= 4 else None
    if rate is None or len(extension) < 6 or extension[0] >> 4 != 1:
        return rate
    return rate * Fraction((extension[5] >> 5 & 3) + 1, (extension[5] & 0x1F) + 1)


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


# Bounds a walk of a corrupt file keeps to, and what every MPEG start code begins with
MAX_BOXES = 100_000  # a fragmented MP4 has two boxes per fragment; a bound for a corrupt one
MPEG_START = b"\x00\x00\x01"  # the prefix of every MPEG start code (program stream, video)
