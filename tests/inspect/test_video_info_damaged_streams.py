"""`video-info --exact` on the formats made for streaming, which record no frame count (MPEG-TS,
M2TS, MPEG-PS, FLV, Ogg, a live Matroska recording): a whole file reads `ok`, one with a region
zeroed `damaged`, counted from its packets, tags or clusters (test_video_info.py holds the formats
whose index or sizes count the frames). The files are ffmpeg's, made at test time: each test
skips where this machine has no ffmpeg."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest
from damaged_videos import (
    decoded_by_opencv,
    ffmpeg_made,
    ffmpeg_packet_sizes,
    ffprobe_entries,
    moving_picture,
    zeroed_copy,
)

from torchkit.core.video import probe_video, streams
from torchkit.core.video.matroska import matroska_video_blocks
from torchkit.core.video.streams import (
    flv_video_frames,
    ogg_video_frames,
    ps_video_frames,
    ts_video_frames,
)

ZEROED_AT = (0.3, 0.5, 0.7)


def assert_whole_and_zeroed(
    path: Path, folder: Path, held_by: str, zeroed_at: tuple[float, ...] = ZEROED_AT
) -> None:
    """`path` reads ok under --exact, every frame its packets hold decoding; each copy with a
    tenth of it zeroed (at 30, 50, 70%) reads damaged: fewer frames decode than it holds."""
    whole = probe_video(path, exact=True)
    assert (whole.status, whole.error) == ("ok", None), whole
    for at in zeroed_at:
        zeroed = zeroed_copy(path, folder, at)
        exact = probe_video(zeroed, exact=True)
        assert exact.status == "damaged", (at, exact)
        assert exact.frames_decoded == decoded_by_opencv(zeroed)
        assert exact.error.startswith(f"damaged: {exact.frames_decoded} of the ")
        assert f" frames {held_by} decode" in exact.error


@pytest.fixture(scope="module")
def mpeg2_ts(tmp_path_factory) -> Path:
    """An MPEG-2 MPEG-TS of 4 s at 25 fps with MP2 audio, as ffmpeg writes it (a key frame
    every 12, B-frames, its key frames' packets flagged random access points)."""
    return ffmpeg_made(
        tmp_path_factory.mktemp("ts") / "clip.ts",
        *moving_picture(4),
        *("-f", "lavfi", "-i", "sine=duration=4", "-c:v", "mpeg2video", "-g", "12", "-bf", "2"),
        *("-c:a", "mp2"),
        encoders=("mpeg2video", "mp2"),
        muxer="mpegts",
    )


def test_a_zeroed_mpeg_ts_is_damaged(tmp_path, mpeg2_ts):
    """An MPEG-TS records no frame count (FFmpeg's is its duration times the rate, which
    audio that runs on overstates): a copy with a tenth zeroed read `ok` under --exact (225
    of 250 frames decode). Its video's PES packets that carry a time are its frames, and the
    frames whose packets the zeroes took are the video's times missing across them."""
    held = ts_video_frames(mpeg2_ts, "mpeg-ts")
    assert (held.frames, held.leading, held.broken_at) == (100, 0, None)
    assert_whole_and_zeroed(mpeg2_ts, tmp_path, "its video packets hold")
    zeroed = probe_video(zeroed_copy(mpeg2_ts, tmp_path, 0.5), exact=True)
    start = int(mpeg2_ts.stat().st_size * 0.5)
    assert f"its mpeg-ts structure breaks at byte {-(-start // 188) * 188:,}," in zeroed.error
    # (B-frames stored after the zeroes, shown before their last frame, narrow the gap)
    assert 98 <= ts_video_frames(zeroed_copy(mpeg2_ts, tmp_path, 0.5), "mpeg-ts").frames <= 100
    # an M2TS file: the same packets, each after a 4-byte time
    m2ts = ffmpeg_made(
        tmp_path / "clip.m2ts",
        "-i",
        mpeg2_ts,
        "-c",
        "copy",
        "-f",
        "mpegts",
        "-mpegts_m2ts_mode",
        "1",
    )
    assert ts_video_frames(m2ts, "m2ts").frames == 100
    assert_whole_and_zeroed(m2ts, tmp_path, "its video packets hold")


def test_an_mpeg_ts_cut_where_no_key_frame_starts_it_is_not_damaged(tmp_path, mpeg2_ts):
    """A copy cut where no key frame starts it (`-ss 1.1 -c copy -copyinkf`): the frames
    before the first whose packet flags a random access point have nothing to decode from,
    and those shown before it (an open GOP's), and are not counted against it."""
    cut = ffmpeg_made(tmp_path / "cut.ts", "-i", mpeg2_ts, "-ss", "1.1", "-c", "copy", "-copyinkf")
    held = ts_video_frames(cut, "mpeg-ts")
    assert held.leading > 0 and decoded_by_opencv(cut) < held.frames - 1
    assert_whole_and_zeroed(cut, tmp_path, "its video packets hold")


def test_an_mpeg_ts_that_flags_no_random_access_point_is_not_judged(tmp_path, mpeg2_ts):
    """Which frame decodes first is not told where no packet flags a random access point (a
    muxer that sets none): a copy cut anywhere may give no picture for many frames, so no
    count is taken for the damage check (its row gives the frames decoded)."""
    data = np.frombuffer(mpeg2_ts.read_bytes(), np.uint8).reshape(-1, 188).copy()
    adapted = (data[:, 3] & 0x20 > 0) & (data[:, 4] > 0)
    assert (data[adapted, 5] & 0x40 > 0).any()
    data[adapted, 5] &= 0xBF
    unflagged = tmp_path / "unflagged.ts"
    unflagged.write_bytes(data.tobytes())
    assert ts_video_frames(unflagged, "mpeg-ts") is None
    exact = probe_video(zeroed_copy(unflagged, tmp_path), exact=True)
    assert (exact.status, exact.frames_decoded < 100 - 1) == ("ok", True)


@pytest.fixture(scope="module")
def flv1_flv(tmp_path_factory) -> Path:
    """A Sorenson Spark (flv1) FLV of 4 s at 25 fps with audio, as ffmpeg writes it."""
    return ffmpeg_made(
        tmp_path_factory.mktemp("flv") / "clip.flv",
        *moving_picture(4),
        *("-f", "lavfi", "-i", "sine=duration=4", "-c:v", "flv", "-g", "12"),
        *("-c:a", "aac"),
        encoders=("flv", "aac"),
        muxer="flv",
    )


def test_a_zeroed_flv_is_damaged(tmp_path, flv1_flv):
    """An FLV records no frame count (FFmpeg's is its duration times the rate): a copy with
    a tenth zeroed read `ok` under --exact (225 of 250 frames decode). Its video tags are
    its frames, walked by their sizes past the zeroes to the next whole tag (FFmpeg's reader
    finds it too), those the zeroes took counted from the times either side."""
    held = flv_video_frames(flv1_flv, "flv")
    assert (held.frames, held.leading, held.broken_at) == (100, 0, None)
    zeroed = zeroed_copy(flv1_flv, tmp_path, 0.5)
    found = flv_video_frames(zeroed, "flv")
    assert found.frames == 100 and 0.5 * zeroed.stat().st_size <= found.broken_at
    assert_whole_and_zeroed(flv1_flv, tmp_path, "its video tags hold")
    assert " its flv structure breaks at byte " in probe_video(zeroed, exact=True).error


def test_an_flv_cut_after_a_video_tags_header_is_walked(tmp_path, flv1_flv):
    """A copy cut right after its last video tag's header (none of its data there): the walk
    read the first byte of no data (IndexError); the tags before it are counted."""
    data = flv1_flv.read_bytes()
    last = [end for end in _flv_tag_ends(flv1_flv) if data[end : end + 1] == b"\x09"][-1]
    cut = tmp_path / "cut.flv"
    cut.write_bytes(data[: last + 11])
    held = flv_video_frames(cut, "flv")
    assert held is not None and held.frames == 99


def test_an_flv_cut_where_no_key_frame_starts_it_is_not_damaged(tmp_path):
    """An H.264 FLV cut where no key frame starts it (`-ss 1.4 -c copy -copyinkf`): the
    frames before the first tag flagged a key frame do not decode, and are not counted
    against it."""
    source = ffmpeg_made(
        tmp_path / "source.flv",
        *moving_picture(4),
        *("-c:v", "libx264", "-g", "25", "-bf", "2", "-pix_fmt", "yuv420p"),
        encoders=("libx264",),
        muxer="flv",
    )
    cut = ffmpeg_made(tmp_path / "cut.flv", "-i", source, "-ss", "1.4", "-c", "copy", "-copyinkf")
    held = flv_video_frames(cut, "flv")
    assert held.leading >= 10 and decoded_by_opencv(cut) < held.frames - 10
    assert_whole_and_zeroed(cut, tmp_path, "its video tags hold")


def _flv_tag_ends(path: Path) -> list[int]:
    """Where each tag of an FLV file ends (with the size after it that repeats its own)."""
    data = path.read_bytes()
    at, ends = int.from_bytes(data[5:9], "big") + 4, []
    while at + 11 <= len(data):
        at += 11 + int.from_bytes(data[at + 1 : at + 4], "big") + 4
        ends.append(at)
    return ends


@pytest.mark.parametrize(
    ("video", "audio"),
    [
        (("-c:v", "libx264", "-bf", "3", "-pix_fmt", "yuv420p"), ()),
        (("-c:v", "flv"), ("-f", "lavfi", "-i", "sine=duration=2", "-c:a", "adpcm_swf")),
    ],
    ids=["h264-b-frames", "adpcm-audio"],
)
def test_a_whole_flv_whose_streams_end_after_their_last_tags_is_ok(tmp_path, video, audio):
    """FFmpeg's duration of an FLV runs to where its streams end: its last video frame shown
    (B-frames: 2 frames after the last tag's time) or its last audio tag played (ADPCM's: 0.37
    s at 11 kHz). A whole file read `truncated: 50 of the 52 frames its header declares
    decode` under --exact (of 55 with ADPCM), its last tag's time short of that; the same file
    cut at a tag's end, a third gone, still reads `truncated`."""
    encoder = "libx264" if "libx264" in video else "flv"
    whole = ffmpeg_made(
        tmp_path / "clip.flv",
        *moving_picture(2),
        *audio[:4],
        *video,
        *audio[4:],
        *(("-ar", "11025") if audio else ()),
        encoders=(encoder, "adpcm_swf") if audio else (encoder,),
        muxer="flv",
    )
    exact = probe_video(whole, exact=True)
    assert (exact.status, exact.error, exact.frames_decoded) == ("ok", None, 50)
    cut = tmp_path / "cut.flv"
    ends = _flv_tag_ends(whole)
    cut.write_bytes(whole.read_bytes()[: [end for end in ends if end < ends[-1] * 0.7][-1]])
    short = probe_video(cut, exact=True)
    assert short.status == "truncated" and short.frames_decoded < 40, short


@pytest.mark.parametrize("encoder", ["libtheora", "libvpx"])
def test_a_zeroed_ogg_is_damaged_and_one_cut_inside_a_page_truncated(tmp_path, encoder):
    """An Ogg file records no frame count: a copy with a tenth zeroed read `ok` under --exact
    (215 of 250 Theora frames decode), a VP8 one `truncated` (51 of 250: FFmpeg's reader
    stopped at the zeroes). Its video packets (Theora, VP8) are its frames, walked page by
    page past the zeroes to the next page, those the zeroes took counted from the frame
    numbers of the granule positions either side; its last page, which closes its stream,
    says the file is whole, and a copy cut inside it is truncated without decoding."""
    clip = ffmpeg_made(
        tmp_path / "clip.ogv",
        *moving_picture(4),
        *("-f", "lavfi", "-i", "sine=duration=4", "-c:v", encoder, "-g", "12", "-c:a", "flac"),
        *(("-deadline", "realtime", "-cpu-used", "8") if encoder == "libvpx" else ()),
        encoders=(encoder, "flac"),
        muxer="ogg",
    )
    held = ogg_video_frames(clip, "ogg")
    assert (held.frames, held.leading, held.not_coded, held.broken_at) == (100, 0, 0, None)
    assert ogg_video_frames(zeroed_copy(clip, tmp_path, 0.5), "ogg").frames == 100
    assert_whole_and_zeroed(clip, tmp_path, "its video packets hold")
    data = clip.read_bytes()
    cut = tmp_path / "cut.ogv"
    cut.write_bytes(data[: len(data) - 100])
    info = probe_video(cut, decode_check=False)
    assert info.status == "truncated" and info.error.startswith(
        f"truncated: the file holds {len(data) - 100:,} of the {len(data):,} bytes its ogg "
    )


def test_a_theora_ogg_with_repeated_frames_is_ok(tmp_path):
    """A Theora encoder writes a frame repeated (a dropped frame filled in at a constant
    rate) as a packet of no bytes, which FFmpeg gives no picture for: OpenCV's grab fails
    there and the frames after it decode on. The decode stopped at the first, and a whole
    file read `damaged: 10 of the 50 frames its video packets hold decode` under --exact;
    each such packet's failure is passed over."""
    clip = ffmpeg_made(
        tmp_path / "clip.ogv",
        *("-f", "lavfi", "-i", "testsrc=size=64x48:rate=25:duration=2"),
        # a frame in 7 dropped, then repeated
        *("-vf", "select='not(eq(mod(n\\,7)\\,3))'", "-fps_mode", "cfr", "-c:v", "libtheora"),
        encoders=("libtheora",),
        muxer="ogg",
    )
    # how many of the 7 repeats libtheora writes as packets of no bytes is its own (one
    # right after a key frame, or one whose blocks it codes anyway, takes some bytes), and
    # differs between builds (FFmpeg 9.0.2's static build: 5): FFmpeg's demuxer counts them,
    # apart from torchkit
    repeated = ffmpeg_packet_sizes(clip).count(0)
    assert 1 <= repeated <= 7
    held = ogg_video_frames(clip, "ogg")
    assert (held.frames, held.not_coded) == (50, repeated)
    capture, grabbed = cv2.VideoCapture(str(clip), cv2.CAP_FFMPEG), []
    for _ in range(60):
        grabbed.append(capture.grab())
    capture.release()
    decodable = 50 - repeated
    assert sum(grabbed) == decodable  # each repeated frame's grab fails ...
    assert not all(grabbed[:decodable])  # ... before the last frame: the frames after decode
    exact = probe_video(clip, exact=True)
    assert (exact.status, exact.error, exact.frames_decoded) == ("ok", None, decodable)
    zeroed = probe_video(zeroed_copy(clip, tmp_path, 0.5), exact=True)
    assert zeroed.status == "damaged" and zeroed.frames_decoded < decodable - 4, zeroed


def test_a_still_theora_ogg_is_readable(tmp_path):
    """A still picture's Theora file holds a key frame, then repeated frames (packets of no
    bytes) but at its key frames: the first grabs fail, and it read `unreadable: no frame
    decodes` without --exact. Its repeated frames' failures are passed over there too."""
    clip = ffmpeg_made(
        tmp_path / "still.ogv",
        *("-f", "lavfi", "-i", "color=c=red:size=64x48:rate=25:duration=1", "-c:v", "libtheora"),
        encoders=("libtheora",),
        muxer="ogg",
    )
    capture, grabbed = cv2.VideoCapture(str(clip), cv2.CAP_FFMPEG), []
    for _ in range(40):
        grabbed.append(capture.grab())
    capture.release()
    assert not grabbed[0] and sum(grabbed) >= 1
    info = probe_video(clip)
    assert (info.status, info.error, info.frames) == ("ok", None, 25)
    exact = probe_video(clip, exact=True)
    assert (exact.status, exact.frames_decoded) == ("ok", sum(grabbed))


@pytest.mark.parametrize("walk", ["ogg", "flv", "mpeg-ps"])
def test_bytes_no_search_passes_are_a_break(tmp_path, monkeypatch, walk, flv1_flv, mpeg2_ts):
    """Where bytes that are no page (tag, pack) run on past the search for the next (64 MiB;
    here made 32 KiB), the walk stopped there as at the file's end: an Ogg file with them
    inserted read `ok` under --exact with 37 of its 100 frames (FFmpeg's reader stops there
    too). They are where its structure breaks, and its frames are judged by the header's."""
    if walk == "ogg":
        source = ffmpeg_made(
            tmp_path / "clip.ogv",
            *moving_picture(4),
            *("-c:v", "libtheora", "-g", "12"),
            encoders=("libtheora",),
            muxer="ogg",
        )
    elif walk == "flv":
        source = flv1_flv
    else:
        source = ffmpeg_made(tmp_path / "clip.mpg", "-i", mpeg2_ts, "-c", "copy", muxer="mpeg")
    monkeypatch.setattr(streams, f"_{walk.split('-')[-1].upper()}_RESYNC_BYTES", 1 << 15)
    data = source.read_bytes()
    inserted = tmp_path / f"inserted{source.suffix}"
    inserted.write_bytes(data[: len(data) // 3] + bytes(100_000) + data[len(data) // 3 :])
    walker = {"ogg": ogg_video_frames, "flv": flv_video_frames, "mpeg-ps": ps_video_frames}
    held = walker[walk](inserted, walk)
    assert held.broken_at is not None and not held.past_breaks
    assert abs(held.broken_at - len(data) // 3) < 65_536  # at the unit the zeroes split
    exact = probe_video(inserted, exact=True)
    if walk == "ogg":  # FFmpeg's reader stops there; FLV's and MPEG-PS's go on
        assert exact.status == "damaged" and f"breaks at byte {held.broken_at:,}" in exact.error
    else:
        assert exact.status == "ok" and exact.frames_decoded == decoded_by_opencv(inserted)


def unknown_sizes(data: bytes) -> bytes:
    """The Matroska file `data` with its Segment's and each Cluster's size written as unknown
    (every bit of its value set, in as many bytes), as a live recording (a browser's
    MediaRecorder, a stream's capture) leaves them."""
    out = bytearray(data)
    for element_id in (b"\x18\x53\x80\x67", b"\x1f\x43\xb6\x75"):  # Segment, Cluster
        at = data.find(element_id)
        while at >= 0:
            length = 9 - data[at + 4].bit_length()  # the size's bytes, by its first
            out[at + 4 : at + 4 + length] = ((1 << 7 * length + 1) - 1).to_bytes(length, "big")
            at = data.find(element_id, at + 4) if element_id[0] == 0x1F else -1
    return bytes(out)


def test_a_zeroed_live_matroska_recording_is_damaged(tmp_path):
    """A live recording's Segment and Clusters record no size (a browser's MediaRecorder
    WebM), so its clusters were not walked and a copy with a tenth zeroed read `ok` under
    --exact (no count to judge it by). A Cluster of unknown size ends where the next one
    starts; past bytes that are no element, the walk goes on at the next Cluster (as FFmpeg's
    reader does), the frames whose blocks the zeroes took counted from the times either
    side."""
    made = ffmpeg_made(
        tmp_path / "made.mkv",
        *moving_picture(4),
        *("-c:v", "mpeg4", "-g", "12", "-cluster_time_limit", "400"),
        encoders=("mpeg4",),
        muxer="matroska",
    )
    live = tmp_path / "live.mkv"
    live.write_bytes(unknown_sizes(made.read_bytes()))
    assert decoded_by_opencv(live) == 100
    held = matroska_video_blocks(live, "mkv")
    assert (held.frames, held.leading, held.broken_at, held.past_breaks) == (100, 0, None, True)
    assert matroska_video_blocks(zeroed_copy(live, tmp_path, 0.5), "mkv").frames == 100
    assert_whole_and_zeroed(live, tmp_path, "its clusters hold")


def _pmts_failing(path: Path, first: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The TS packets of `path` (188 bytes a row) with the CRC of each PMT of the PAT's first
    program made to fail (its first `first` where given), and each packet's PID."""
    data = np.frombuffer(path.read_bytes(), np.uint8).reshape(-1, 188).copy()
    pid = (data[:, 1].astype(np.int32) & 0x1F) << 8 | data[:, 2]
    pat = data[np.flatnonzero(pid == 0)[0]]
    section = pat[5 + pat[4] :].tobytes()  # the PAT's first program's PMT PID
    pmt_pid = (section[10] & 0x1F) << 8 | section[11]
    pmts = np.flatnonzero((pid == pmt_pid) & (data[:, 1] & 0x40 > 0))
    assert len(pmts) > 1
    for number in pmts[:first]:
        start = 5 + data[number, 4]  # after the pointer field: its CRC ends the section
        end = start + 3 + ((data[number, start + 1] & 0x0F) << 8 | data[number, start + 2])
        data[number, end - 1] ^= 0xFF
    return data, pid


def test_an_mpeg_ts_whose_pmts_fail_their_crc_is_judged_by_its_video_pes(tmp_path, mpeg2_ts):
    """A PMT is read only where its CRC holds: one that fails is passed over for the next
    (FFmpeg's too, but where the 10 before it on its PID failed theirs too). Where none in
    the first chunk is read (a file of one PMT, damaged; a muxer that writes the CRC
    wrong), the walk gave up, and a copy with a tenth of it zeroed read `ok`; FFmpeg guesses
    the streams from their PES packets and decodes the video: so does the walk, the first
    PID whose PES packets are a video stream's (0xE0-0xEF)."""
    for first, which in ((1, "first"), (None, "all")):
        failing = tmp_path / f"{which}-pmt-fails.ts"
        failing.write_bytes(_pmts_failing(mpeg2_ts, first)[0].tobytes())
        held = ts_video_frames(failing, "mpeg-ts")
        assert (held.frames, held.leading, held.broken_at) == (100, 0, None), which
    assert_whole_and_zeroed(failing, tmp_path, "its video packets hold")


def test_an_mpeg_ts_whose_pmts_all_fail_their_crc_is_walked_by_the_pmt_ffmpeg_reads(tmp_path):
    """FFmpeg reads a PMT whose CRC fails where the 10 sections on its PID before it failed
    theirs too (a muxer that writes the CRC wrong, every PMT of a file damaged alike), and
    decodes that PMT's first video stream. The walk took the first PID whose PES packets
    are a video stream's: of a file of two video streams cut where the second's PES packet
    comes first (a recording started anywhere), it counted the second's frames (113 where
    52 decode: `damaged` on a file that lost none), and zeroed copies whose second stream
    was the shorter read `ok`. It reads such a PMT as FFmpeg does: the 11th failing, not
    the 10th (with the 10 PMTs of the cut's start alone, none is read, and FFmpeg decodes
    the stream whose PES comes first, as the walk counts)."""
    two = ffmpeg_made(
        tmp_path / "two.ts",
        *moving_picture(4, "64x48"),
        *moving_picture(6, "96x64"),
        *("-map", "0:v", "-map", "1:v", "-c:v", "mpeg2video"),
        encoders=("mpeg2video",),
        muxer="mpegts",
    )
    data, pid = _pmts_failing(two)
    videos = []  # the PIDs whose PES packets are a video stream's, in order
    for number in np.flatnonzero(data[:, 1] & 0x40 > 0):
        at = 4 + (1 + data[number, 4] if data[number, 3] & 0x20 else 0)
        payload = data[number, at : at + 4].tobytes()
        if payload[:3] == b"\x00\x00\x01" and payload[3] >> 4 == 0xE and pid[number] not in videos:
            videos.append(int(pid[number]))
    assert len(videos) == 2
    starts = np.flatnonzero((data[:, 1] & 0x40 > 0) & (pid == videos[1]))
    cut = tmp_path / "cut.ts"
    cut.write_bytes(data[starts[len(starts) // 4] :].tobytes())  # the second's PES first
    held = ts_video_frames(cut, "mpeg-ts")
    assert decoded_by_opencv(cut) == held.frames - held.leading
    assert probe_video(cut).width == 64
    assert_whole_and_zeroed(cut, tmp_path, "its video packets hold", (0.5,))
    whole = np.frombuffer(two.read_bytes(), np.uint8).reshape(-1, 188)
    pmt_pid = pid[np.flatnonzero((data != whole).any(axis=1))[0]]
    data, pid = data[starts[len(starts) // 4] :], pid[starts[len(starts) // 4] :]
    pmts = np.flatnonzero(pid == pmt_pid)
    for kept, width in ((11, 64), (10, 96)):  # the cut's PMTs left, the stream decoded
        few = tmp_path / f"{kept}-pmts.ts"
        data[pmts[kept:]] = np.frombuffer(b"\x47\x1f\xff\x10" + b"\xff" * 184, np.uint8)
        few.write_bytes(data.tobytes())
        held = ts_video_frames(few, "mpeg-ts")
        assert decoded_by_opencv(few) == held.frames - held.leading, kept
        assert probe_video(few).width == width, kept


def test_an_mpeg_ts_whose_one_pmt_fails_its_crc_is_walked_by_its_first_video_pes(
    tmp_path, mpeg2_ts
):
    """A file of one PMT, whose CRC fails, has no PMT FFmpeg reads (not 10 failing before
    it): FFmpeg guesses the streams from their PES packets and decodes the video, and the
    walk takes the first PID whose PES packets are a video stream's (0xE0-0xEF), not none."""
    data, pid = _pmts_failing(mpeg2_ts)
    whole = np.frombuffer(mpeg2_ts.read_bytes(), np.uint8).reshape(-1, 188)
    pmts = np.flatnonzero(pid == pid[np.flatnonzero((data != whole).any(axis=1))[0]])
    data[pmts[1:]] = np.frombuffer(b"\x47\x1f\xff\x10" + b"\xff" * 184, np.uint8)  # null
    one = tmp_path / "one-pmt-fails.ts"
    one.write_bytes(data.tobytes())
    held = ts_video_frames(one, "mpeg-ts")
    assert (held.frames, held.leading, held.broken_at) == (100, 0, None)
    assert decoded_by_opencv(one) == 100


def test_a_zeroed_mpeg_ps_is_damaged_and_a_cut_without_a_key_frame_not(tmp_path, mpeg2_ts):
    """An MPEG-PS file (.mpg, .vob) records no frame count: a copy with a tenth zeroed read
    `ok` under --exact (223 of 250 frames decode). The pictures of its video packets'
    MPEG-1/2 data are its frames, walked pack by pack past the zeroes to the next pack, those
    the zeroes took counted from the time codes of the GOP headers either side; a copy cut
    where no I-picture starts it gives no picture for those before the first, nor for the
    B-pictures right after it (an open GOP's), and is not counted against it."""
    vob = ffmpeg_made(tmp_path / "clip.vob", "-i", mpeg2_ts, "-c", "copy", "-f", "vob")
    held = ps_video_frames(vob, "mpeg-ps", 25.0)
    assert (held.frames, held.leading, held.broken_at) == (100, 0, None)
    # (the frames the zeroes took, from the times either side, less a frame each side for
    # where a time's picture may stray: never more than there were)
    assert 98 <= ps_video_frames(zeroed_copy(vob, tmp_path, 0.5), "mpeg-ps", 25.0).frames <= 100
    # (its last tenth is audio: zeroes at 70% take its last pictures, with none after them
    # to tell that any were there)
    assert_whole_and_zeroed(vob, tmp_path, "its video packets hold", (0.3, 0.5))
    cut = ffmpeg_made(
        tmp_path / "cut.mpg", "-i", vob, "-ss", "1.1", "-c", "copy", "-copyinkf", "-f", "mpeg"
    )
    held = ps_video_frames(cut, "mpeg-ps")
    assert held.leading > 0 and decoded_by_opencv(cut) < held.frames - 1
    assert_whole_and_zeroed(cut, tmp_path, "its video packets hold", (0.3,))


_PULLDOWN = ((1, 1), (0, 0), (0, 1), (1, 0))  # (top_field_first, repeat_first_field)


def _soft_telecined(
    stream: bytes, flags=lambda shown: _PULLDOWN[shown % 4], progressive=False
) -> bytes:
    """A 23.976 fps progressive MPEG-2 video stream flagged for 3:2 pulldown at 29.97, as
    DGPulldown does it (soft telecine): its sequence header's rate 29.97, its sequence
    interlaced, each picture's top_field_first and repeat_first_field in turn (3, 2, 3, 2
    fields shown, in display order), each GOP's time code counting the frames shown.
    `flags`: a picture's (top_field_first, repeat_first_field) by its place in display
    order; `progressive`: a progressive sequence at 59.94 (a picture shown for 1 frame, 2
    where it repeats its first field, 3 where top_field_first is set too)."""
    data, at, counted = bytearray(stream), 0, 0
    base = shown = 0  # the pictures before the GOP, in display order
    halves = 1 if progressive else 2  # the units a frame shown takes: frames, or fields
    lasting = (lambda top, repeat: 1 + repeat * (1 + top)) if progressive else (lambda t, r: 2 + r)
    while (at := data.find(b"\x00\x00\x01", at)) >= 0 and at + 9 <= len(data):
        code = data[at + 3]
        if code == 0xB3:  # frame rate code 4: 29.97 (7: 59.94)
            data[at + 7] = data[at + 7] & 0xF0 | (7 if progressive else 4)
        elif code == 0xB5 and data[at + 4] >> 4 == 1:  # progressive_sequence
            data[at + 5] = data[at + 5] & ~0x08 | progressive << 3
        elif code == 0xB8:  # its time code: the frames shown before it (non-drop)
            rate = 60 if progressive else 30
            base, units = counted, sum(lasting(*flags(k)) for k in range(counted))
            minutes, pictures = divmod(units // halves, 60 * rate)
            seconds, pictures = divmod(pictures, rate)
            code_bits = minutes << 13 | 1 << 12 | seconds << 6 | pictures
            field = int.from_bytes(data[at + 4 : at + 8], "big") & 0x7F | code_bits << 7
            data[at + 4 : at + 8] = field.to_bytes(4, "big")
        elif code == 0x00:
            shown = base + (data[at + 4] << 2 | data[at + 5] >> 6)  # its temporal reference
        elif code == 0xB5 and data[at + 4] >> 4 == 8:  # its picture coding extension
            top, repeat = flags(shown)
            data[at + 7] = data[at + 7] & ~0x82 | top << 7 | repeat << 1
            data[at + 8] |= 0x80  # progressive_frame
            counted += 1
        at += 4
    return bytes(data)


def test_a_zeroed_soft_telecined_mpeg_ps_is_damaged(tmp_path):
    """Soft telecine (3:2 pulldown flags: a 23.976 fps film shown at 29.97, 4 pictures for
    5 frames) decodes to one frame a picture, while its times and time codes count the
    frames shown. The pictures a zeroed region took were counted from those as if each
    were a frame: this copy zeroed at 50% counted 163 pictures of 144, and copies muxed
    otherwise counted fewer than decode and read `ok` (123 of 144). A picture that repeats a
    field counts its frames shown as such (its picture coding extension's
    repeat_first_field), and the frames lost over the frames a picture is shown for are the
    pictures lost: never more than there were."""
    film = ffmpeg_made(
        tmp_path / "film.m2v",
        *("-f", "lavfi", "-i", "testsrc=size=176x120:rate=24000/1001:duration=6"),
        *("-c:v", "mpeg2video", "-g", "12", "-bf", "2", "-b:v", "2M"),
        encoders=("mpeg2video",),
        muxer="mpeg2video",
    )
    soft = tmp_path / "soft.m2v"
    soft.write_bytes(_soft_telecined(film.read_bytes()))
    vob = ffmpeg_made(tmp_path / "clip.vob", "-i", soft, "-c", "copy", "-f", "vob", muxer="vob")
    assert decoded_by_opencv(vob) == 144
    held = ps_video_frames(vob, "mpeg-ps", 29.97)
    assert (held.frames, held.leading, held.broken_at) == (144, 0, None)
    for at in (0.5, 0.7):
        zeroed = ps_video_frames(zeroed_copy(vob, tmp_path, at), "mpeg-ps", 29.97)
        assert zeroed.broken_at is not None and 140 <= zeroed.frames <= 144, at
    assert_whole_and_zeroed(vob, tmp_path, "its video packets hold", (0.5, 0.7))


@pytest.mark.parametrize("progressive", [False, True], ids=["interlaced", "progressive"])
def test_a_soft_telecined_raw_mpeg2_stream_s_rate_is_its_pictures(tmp_path, progressive):
    """A film's raw MPEG-2 stream flagged for 3:2 pulldown (soft telecine, as a film DVD's
    video demuxed to .m2v is) records 29.97 fps (59.94 in a progressive sequence), at which
    its 4 pictures are shown for 5 frames (10): 144 pictures of a 6 s film read 29.97 fps
    and 4.8 s under --exact. Its rate is its header's times the pictures over the frames
    they are shown for: 23.976, 6.006 s, as the durations ffprobe gives its packets add up
    to."""
    film = ffmpeg_made(
        tmp_path / "film.m2v",
        *("-f", "lavfi", "-i", "testsrc=size=176x120:rate=24000/1001:duration=6"),
        *("-c:v", "mpeg2video", "-g", "12", "-bf", "2"),
        encoders=("mpeg2video",),
        muxer="mpeg2video",
    )

    def flags(shown: int) -> tuple[int, int]:  # 3 frames, 2 frames in turn
        return ((1, 1) if shown % 2 == 0 else (0, 1)) if progressive else _PULLDOWN[shown % 4]

    soft = tmp_path / "soft.m2v"
    soft.write_bytes(_soft_telecined(film.read_bytes(), flags, progressive))
    for options in ({}, {"decode_check": False}):
        info = probe_video(soft, **options)
        assert (info.status, info.fps) == ("ok", 24000 / 1001), options
    exact = probe_video(soft, exact=True)
    assert (exact.status, exact.frames, exact.fps) == ("ok", 144, 24000 / 1001)
    assert exact.duration_s == pytest.approx(6.006)
    durations = ffprobe_entries(soft, "packet=duration_time")
    if durations is not None:
        assert len(durations) == 144
        assert sum(map(float, durations)) == pytest.approx(6.006, abs=1e-3)


def test_a_raw_mpeg2_stream_repeating_fields_in_no_pattern_reads_its_pictures_own_rate(tmp_path):
    """A raw MPEG-2 stream whose pictures repeat a field in no pulldown's pattern (2 of
    each 12, as video edited after telecine leaves it) is read at its header's rate times
    its pictures over the frames they are shown for, not snapped to a pattern's: 120
    pictures shown for 130 frames at 29.97 are 27.67 fps, 4.338 s, as the durations ffprobe
    gives its packets add up to."""
    film = ffmpeg_made(
        tmp_path / "film.m2v",
        *("-f", "lavfi", "-i", "testsrc=size=176x120:rate=24000/1001", "-frames:v", "120"),
        *("-c:v", "mpeg2video", "-g", "12", "-bf", "2"),
        encoders=("mpeg2video",),
        muxer="mpeg2video",
    )

    def flags(shown: int) -> tuple[int, int]:  # 3 fields, 3 fields, then 2 each
        return {0: (1, 1), 1: (0, 1)}.get(shown % 12, (1, 0))

    mixed = tmp_path / "mixed.m2v"
    mixed.write_bytes(_soft_telecined(film.read_bytes(), flags))
    rate = 30000 / 1001 * 120 / 130
    for options in ({}, {"decode_check": False}):
        info = probe_video(mixed, **options)
        assert (info.status, info.fps) == ("ok", pytest.approx(rate)), options
    exact = probe_video(mixed, exact=True)
    assert (exact.status, exact.frames, exact.fps) == ("ok", 120, pytest.approx(rate))
    assert exact.duration_s == pytest.approx(130 * 1001 / 30000)
    durations = ffprobe_entries(mixed, "packet=duration_time")
    if durations is not None:
        assert len(durations) == 120
        assert sum(map(float, durations)) == pytest.approx(130 * 1001 / 30000, abs=1e-3)


def _zeroes_between_packs(path: Path, every: int) -> bytes:
    """The bytes of the MPEG-PS file `path` with 2,048 zero bytes before each `every`th pack
    (bytes that are no pack: a break that takes nothing)."""
    data = path.read_bytes()
    packs = [found.start() for found in re.finditer(b"\x00\x00\x01\xba", data)][every::every]
    parts = [data[start:end] for start, end in zip([0, *packs], [*packs, len(data)], strict=True)]
    return bytes(2048).join(parts)


@pytest.mark.parametrize("progressive", [False, True], ids=["interlaced", "progressive"])
def test_an_mpeg_ps_soft_telecined_in_part_counts_no_more_pictures_than_it_holds(
    tmp_path, progressive
):
    """A stream whose first half is pulled down (a film's 3:2 flags: 5 fields shown for 2
    pictures; in a progressive sequence at 59.94, 5 frames) and whose second half is not (a
    picture a frame) counted the pictures a break took as the frames it took over the mean
    frames a picture is shown for, and placed a GOP's pictures by that mean: a copy zeroed
    at 30% counted 246 pictures of 240 (258 in the progressive sequence), and a copy with
    zeroes between its packs that took no picture read `damaged: 240 of the 243 frames its
    video packets hold decode`. The frames lost are over the frames a picture is shown for
    either side of the break (the more), and a GOP's pictures are placed by the frames the
    pictures before them are shown for."""
    film = ffmpeg_made(
        tmp_path / "film.m2v",
        *("-f", "lavfi", "-i", "testsrc=size=176x120:rate=24000/1001:duration=10"),
        *("-c:v", "mpeg2video", "-g", "12", "-bf", "2", "-b:v", "2M"),
        encoders=("mpeg2video",),
        muxer="mpeg2video",
    )

    def flags(shown: int) -> tuple[int, int]:
        if shown >= 120:  # a picture a frame
            return (0, 0) if progressive else (1, 0)
        if progressive:  # 3 frames, 2 frames in turn
            return (1, 1) if shown % 2 == 0 else (0, 1)
        return _PULLDOWN[shown % 4]

    soft = tmp_path / "soft.m2v"
    soft.write_bytes(_soft_telecined(film.read_bytes(), flags, progressive))
    mpg = ffmpeg_made(tmp_path / "clip.mpg", "-i", soft, "-c", "copy", "-f", "mpeg", muxer="mpeg")
    assert decoded_by_opencv(mpg) == 240
    fps = probe_video(mpg).fps
    for at in (0.3, 0.5, 0.7):
        zeroed = ps_video_frames(zeroed_copy(mpg, tmp_path, at), "mpeg-ps", fps)
        assert zeroed.broken_at is not None and 220 <= zeroed.frames <= 240, (at, zeroed)
    for every in (7, 13, 29):
        padded = tmp_path / f"padded-{every}.mpg"
        padded.write_bytes(_zeroes_between_packs(mpg, every))
        held = ps_video_frames(padded, "mpeg-ps", fps)
        assert held.broken_at is not None and held.frames == 240, (every, held)
        whole = probe_video(padded, exact=True)
        assert (whole.status, whole.frames_decoded) == ("ok", 240), whole


def test_a_zeroed_vcd_is_damaged(tmp_path):
    """A VCD's program stream (`-target vcd`) ends each 2,324-byte sector with 20 zero
    bytes: the walk took them for a break and counted its pictures from there, so a copy
    with a tenth zeroed at 50% read `ok` under --exact (91 of 101). The padding is passed
    as such, and the zeroes are found."""
    vcd = ffmpeg_made(
        tmp_path / "clip.mpg",
        *("-f", "lavfi", "-i", "testsrc=size=352x288:rate=25:duration=2"),
        *("-target", "pal-vcd", "-an"),
        encoders=("mpeg1video",),
        muxer="vcd",
    )
    held = ps_video_frames(vcd, "mpeg-ps", 25.0)
    assert (held.frames, held.leading, held.broken_at) == (50, 0, None)
    assert_whole_and_zeroed(vcd, tmp_path, "its video packets hold", (0.5,))


def test_a_zeroed_mpeg_ts_whose_times_wrap_is_damaged(tmp_path):
    """A recording's 33-bit presentation times wrap after 26.5 hours: across the wrap a
    frame's time fell by 2^33, its first key frame then seemed shown after every frame
    after it (all of them leading), and a copy with a tenth zeroed read `ok` under --exact
    (88 of 100). The times are unwrapped."""
    wraps = ffmpeg_made(
        tmp_path / "wraps.ts",
        *moving_picture(4),
        *("-c:v", "mpeg2video", "-g", "12", "-bf", "2", "-output_ts_offset", "95441.5"),
        encoders=("mpeg2video",),
        muxer="mpegts",
    )
    held = ts_video_frames(wraps, "mpeg-ts")
    assert (held.frames, held.leading) == (100, 0)
    assert_whole_and_zeroed(wraps, tmp_path, "its video packets hold")


def test_mpeg_ts_files_of_two_codecs_joined_by_cat_are_judged_by_the_first(tmp_path):
    """An H.264 MPEG-TS and an MPEG-2 one joined by `cat` (the second file's PMT gives the
    same video PID another stream type) read `damaged: 72 of the 150 frames its video
    packets hold decode` under --exact, exit 1, though both are whole: OpenCV's FFmpeg
    decodes the first codec alone, and the walk counted the second's packets as frames. The
    walk stops at the PMT that switches the codec: the frames after it are not judged, nor
    those of the first codec's last GOP (a decoder fed the other codec's data may never show
    them: 3 here); zeroes in the first file are still damage. Files whose video moves to
    another PID are walked to the switch too; pictures of another size, one codec, are not
    a switch."""
    h264, mpeg2, moved, larger = (
        ffmpeg_made(
            tmp_path / name,
            *moving_picture(3, size),
            *options,
            encoders=(options[1],),
            muxer="mpegts",
        )
        for name, size, options in (
            ("h264.ts", "64x48", ("-c:v", "libx264", "-g", "10", "-pix_fmt", "yuv420p")),
            ("mpeg2.ts", "64x48", ("-c:v", "mpeg2video", "-g", "12", "-bf", "2")),
            ("moved.ts", "64x48", ("-c:v", "mpeg2video", "-mpegts_start_pid", "0x200")),
            ("larger.ts", "128x96", ("-c:v", "libx264", "-g", "10", "-pix_fmt", "yuv420p")),
        )
    )
    for first, second in ((h264, mpeg2), (mpeg2, h264), (mpeg2, moved)):
        joined = tmp_path / f"{first.stem}-{second.stem}.ts"
        joined.write_bytes(first.read_bytes() + second.read_bytes())
        held = ts_video_frames(joined, "mpeg-ts")
        assert (held.frames, held.span_s) == (75, 3.0), joined.name
        assert 0 < held.leading <= 12, joined.name  # the first file's last GOP at most
        for options in ({}, {"exact": True}):
            info = probe_video(joined, **options)
            assert (info.status, info.error) == ("ok", None), (joined.name, options)
    zeroed = probe_video(zeroed_copy(tmp_path / "h264-mpeg2.ts", tmp_path, 0.2), exact=True)
    assert zeroed.status == "damaged", zeroed
    assert zeroed.error.startswith(f"damaged: {zeroed.frames_decoded} of the 7")
    resized = tmp_path / "resized.ts"
    resized.write_bytes(h264.read_bytes() + larger.read_bytes())
    assert ts_video_frames(resized, "mpeg-ts").frames == 150
    assert probe_video(resized, exact=True).status == "ok"


def test_a_zeroed_mpeg_ts_of_two_codecs_whose_first_is_one_gop_is_damaged(tmp_path):
    """Where a PMT switches the codec, the first codec's frames from its last key frame are
    not held against the file (a decoder may never show those it still held); a first file
    of one GOP (a key frame every 250 frames: 75 here) was not judged at all, so a copy with
    a tenth of it zeroed read `ok`. No decoder holds more than 16 pictures (H.264's and
    HEVC's largest buffer): no more are excused, and the damage is told."""
    h264, mpeg2 = (
        ffmpeg_made(
            tmp_path / name,
            *moving_picture(3),
            *options,
            encoders=(options[1],),
            muxer="mpegts",
        )
        for name, options in (
            ("h264.ts", ("-c:v", "libx264", "-g", "250", "-bf", "8", "-pix_fmt", "yuv420p")),
            ("mpeg2.ts", ("-c:v", "mpeg2video", "-g", "12", "-bf", "2")),
        )
    )
    joined = tmp_path / "joined.ts"
    joined.write_bytes(h264.read_bytes() + mpeg2.read_bytes())
    held = ts_video_frames(joined, "mpeg-ts")
    assert (held.frames, held.leading) == (75, 16)
    for threads in (1, 16):
        whole = probe_video(joined, exact=True, decoder_threads=threads)
        assert (whole.status, whole.error) == ("ok", None), threads
    zeroed = probe_video(zeroed_copy(joined, tmp_path, 0.2), exact=True)
    assert zeroed.status == "damaged", zeroed
    assert zeroed.error.startswith(f"damaged: {zeroed.frames_decoded} of the 7")


def _mpeg_crc(data: bytes) -> int:
    """The CRC-32 of an MPEG PSI section (polynomial 0x04C11DB7, not reflected, from all
    ones), bit by bit."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = (crc << 1 ^ 0x04C11DB7 if crc & 1 << 31 else crc << 1) & 0xFFFFFFFF
    return crc


def test_an_mpeg_ts_whose_programs_share_a_pmt_pid_is_judged(tmp_path):
    """Two programs whose PMTs share a PID, each its own section (the PAT gives both
    programs PID 0x1000): the walk took program 2's PMT, which lists no stream of program
    1's video, for a switch of codec at the file's first packets and judged nothing, so a
    copy with a tenth of it zeroed read `ok`. A PMT is its program's only where it gives the
    program's number: the file is judged as one whose PMTs have PIDs of their own."""
    made = ffmpeg_made(
        tmp_path / "programs.ts",
        *moving_picture(2),
        *("-f", "lavfi", "-i", "testsrc2=size=64x48:rate=25:duration=2"),
        *("-map", "0:v", "-map", "1:v", "-c:v:0", "libx264", "-g", "10", "-pix_fmt", "yuv420p"),
        *("-c:v:1", "mpeg2video", "-program", "title=A:st=0", "-program", "title=B:st=1"),
        encoders=("libx264", "mpeg2video"),
        muxer="mpegts",
    )
    packets = [bytearray(p) for p in re.findall(rb"\x47[\s\S]{187}", made.read_bytes())]
    for packet in packets:
        pid = (packet[1] & 0x1F) << 8 | packet[2]
        if pid == 0x1001:  # program 2's PMT onto program 1's PID
            packet[1:3] = bytes([packet[1] & 0xE0 | 0x10, 0x00])
        elif pid == 0 and packet[1] & 0x40:  # the PAT: programs 1 and 2, both PMTs at 0x1000
            start = 5 + packet[4]
            assert packet[start + 8 : start + 16] == bytes.fromhex("0001f0000002f001")
            packet[start + 15] = 0x00
            packet[start + 16 : start + 20] = _mpeg_crc(packet[start : start + 16]).to_bytes(4)
    shared = tmp_path / "shared.ts"
    shared.write_bytes(b"".join(packets))
    held = ts_video_frames(shared, "mpeg-ts")
    assert (held.frames, held.span_s) == (50, 2.0)
    assert_whole_and_zeroed(shared, tmp_path, "its video packets hold")


def test_mpeg_ts_files_of_two_codecs_whose_pmt_takes_two_packets_joined_by_cat(tmp_path):
    """A PMT listing many streams takes more than one TS packet (here a video and 20 audio
    streams, each with its language: 241 bytes). Only sections a packet holds whole were
    read, so an H.264 file and an MPEG-2 one of such PMTs joined by `cat` read `damaged: 47
    of the 100 frames its video packets hold decode` under --exact, exit 1, though both are
    whole: a section is joined across the packets it takes, and the walk stops at the PMT
    that switches the codec, as for a short one."""
    parts = []
    for codec, options in (
        ("libx264", ("-g", "10", "-pix_fmt", "yuv420p")),
        ("mpeg2video", ("-g", "12", "-bf", "2")),
    ):
        audio = [("-map", "1:a", f"-metadata:s:a:{n}", "language=eng") for n in range(20)]
        parts.append(
            ffmpeg_made(
                tmp_path / f"{codec}.ts",
                *moving_picture(2),
                *("-f", "lavfi", "-i", "sine=duration=2:sample_rate=8000", "-map", "0:v"),
                *(option for stream in audio for option in stream),
                *("-c:v", codec, *options, "-c:a", "mp2", "-b:a", "32k"),
                encoders=(codec, "mp2"),
                muxer="mpegts",
            ).read_bytes()
        )
    pmt_packets = re.findall(rb"\x47[\x10\x50]\x00[\s\S]{185}", parts[0])
    assert pmt_packets[1][1] == 0x10  # (the PMT runs on into a second packet)
    joined = tmp_path / "joined.ts"
    joined.write_bytes(b"".join(parts))
    held = ts_video_frames(joined, "mpeg-ts")
    assert (held.frames, held.span_s) == (50, 2.0)
    for options in ({}, {"exact": True}):
        info = probe_video(joined, **options)
        assert (info.status, info.error) == ("ok", None), options


def test_mpeg_ts_files_joined_by_cat_are_judged(tmp_path, mpeg2_ts):
    """Two MPEG-TS files joined by `cat` (each restarting its times) hold twice the frames
    FFmpeg's header counts, which read as units that are no frames one each: a copy with a
    tenth zeroed read `ok` (179 of 200). Their count is checked against the times they
    span (8 s here), and the frames either side of the zeroes are taken from the file the
    zeroes lie in."""
    joined = tmp_path / "joined.ts"
    joined.write_bytes(mpeg2_ts.read_bytes() * 2)
    held = ts_video_frames(joined, "mpeg-ts")
    assert (held.frames, held.span_s) == (200, 8.0)
    assert_whole_and_zeroed(joined, tmp_path, "its video packets hold", (0.3, 0.7))


@pytest.mark.parametrize(
    ("encoder", "options"),
    [("libx264", ("-bf", "3", "-pix_fmt", "yuv420p")), ("mpeg4", ("-bf", "2"))],
    ids=["h264", "mpeg4"],
)
def test_a_zeroed_mpeg_ps_of_h264_or_mpeg4_is_damaged(tmp_path, encoder, options):
    """An MPEG-PS file of H.264 or MPEG-4 Part 2 video was not judged (its pictures were
    not counted: 0x00 00 01 00 is MPEG-1/2's picture start code alone, and FFmpeg writes
    H.264 as stream 0xE2): a copy with a tenth zeroed read `ok` under --exact (122 of 150
    frames). Its pictures (an H.264 picture's first slice, an MPEG-4 VOP) are counted, those
    the zeroes took from the times of the pictures either side; audio zeroed whole, its
    video all there, stays `ok`."""
    clip = ffmpeg_made(
        tmp_path / "clip.mpg",
        *("-f", "lavfi", "-i", "testsrc2=size=320x180:rate=25:duration=3"),
        *("-f", "lavfi", "-i", "sine=duration=3", "-c:v", encoder, "-g", "25", *options),
        *("-b:v", "1500k", "-c:a", "mp2", "-f", "mpeg"),
        encoders=(encoder, "mp2"),
        muxer="mpeg",
    )
    held = ps_video_frames(clip, "mpeg-ps", 25.0)
    assert (held.frames, held.leading, held.broken_at) == (75, 0, None)
    assert_whole_and_zeroed(clip, tmp_path, "its video packets hold")
    data, at = bytearray(clip.read_bytes()), 0
    while 0 <= at < len(data):  # each pack of audio alone, from a third of the way in, zeroed
        end = data.find(b"\x00\x00\x01\xba", at + 4)
        end = len(data) if end < 0 else end
        video = re.search(rb"\x00\x00\x01[\xe0-\xef]", bytes(data[at:end]))
        if len(data) // 3 < at < len(data) // 2 and not video:
            data[at:end] = bytes(end - at)
        at = end if end < len(data) else -1
    audio_zeroed = tmp_path / "audio-zeroed.mpg"
    audio_zeroed.write_bytes(bytes(data))
    assert ps_video_frames(audio_zeroed, "mpeg-ps", 25.0).broken_at is not None
    exact = probe_video(audio_zeroed, exact=True)
    assert (exact.status, exact.frames_decoded) == ("ok", 75)


def _adpcm_flv(target: Path, seconds: float, audio_seconds: float) -> Path:
    """An FLV of `seconds` of FLV1 video at 25 fps and `audio_seconds` of ADPCM audio at
    11 kHz (4096 samples a tag: 0.37 s), as FFmpeg writes it."""
    return ffmpeg_made(
        target,
        *moving_picture(seconds),
        *("-f", "lavfi", "-i", f"sine=duration={audio_seconds}", "-c:v", "flv"),
        *("-c:a", "adpcm_swf", "-ar", "11025"),
        encoders=("flv", "adpcm_swf"),
        muxer="flv",
    )


def test_an_flv_cut_between_tags_losing_audio_is_truncated(tmp_path):
    """A copy cut at a tag's end that loses its last audio tag and the video tags after it
    (an ADPCM tag plays 0.37 s at 11 kHz) is truncated, by the decode check and --exact (47
    of the 56 frames its header declares decode), and without decoding (it falls short of
    the size its metadata records, `filesize`, by bytes that could hold the frames missing).
    A copy that loses only the video tags after its last audio tag, that audio playing to
    the file's duration, cannot be told from a whole file whose video ends there and whose
    recorded size a tool left stale: it reads ok, with the 47 frames that decode (as it
    does where its metadata records no size)."""
    whole = _adpcm_flv(tmp_path / "clip.flv", 2, 2)
    data = whole.read_bytes()
    starts = [int.from_bytes(data[5:9], "big") + 4, *_flv_tag_ends(whole)[:-1]]
    last_audio = max(i for i, start in enumerate(starts) if data[start] == 8)
    assert probe_video(whole, exact=True).status == "ok"
    cut_at = starts[last_audio]  # its last audio tag and the video tags after it gone
    cut = tmp_path / "cut.flv"
    cut.write_bytes(data[:cut_at])
    header = probe_video(cut, decode_check=False).frames_header
    expected = {
        "default": f"truncated: 47 of the {header} frames its header declares decode",
        "exact": f"truncated: 47 of the {header} frames its header declares decode",
        "no-decode": (
            f"truncated: the file holds {cut_at:,} of the {len(data):,} bytes its flv "
            f"metadata records, and its video ends at frame 47 of the {header} its header "
            "declares"
        ),
    }
    modes = {"default": {}, "exact": {"exact": True}, "no-decode": {"decode_check": False}}
    for mode, options in modes.items():
        info = probe_video(cut, **options)
        assert (info.status, info.error) == ("truncated", expected[mode]), mode
    video_lost = tmp_path / "video-lost.flv"
    video_lost.write_bytes(data[: starts[last_audio + 1]])
    for options in modes.values():
        info = probe_video(video_lost, **options)
        assert (info.status, info.error) == ("ok", None), options
    assert probe_video(video_lost, exact=True).frames_decoded == 47


def test_a_long_flv_cut_before_its_last_audio_tag_is_truncated(tmp_path):
    """A 40 s FLV whose ADPCM audio plays past its 39.4 s of video, cut at its last audio
    tag's start (0.37 s of audio gone): its audio's end falls 6 to 9 frames short of the
    1,000 to 1,003 its header declares (FFmpeg 9 records the audio's own 40 s, earlier
    muxers its last tag's end, 40.12 s), within the count's slack (10), so nothing but the
    size its metadata records tells the cut, which it falls short of by that tag's bytes,
    its video ending 15 or more frames short (past the slack): truncated, by the decode
    check and --exact, and without decoding. Whole, it is ok. (A video of 39.6 s would end
    within the slack of FFmpeg 9's 1,000, and a cut that loses no frame of it cannot be told
    from a whole file whose recorded size a tool left stale.)"""
    whole = _adpcm_flv(tmp_path / "clip.flv", 39.4, 40)
    data = whole.read_bytes()
    starts = [int.from_bytes(data[5:9], "big") + 4, *_flv_tag_ends(whole)[:-1]]
    cut_at = max(start for start in starts if data[start] == 8)
    cut = tmp_path / "cut.flv"
    cut.write_bytes(data[:cut_at])
    header = probe_video(whole, decode_check=False).frames_header
    assert header in (1_000, 1_003)  # its duration at 25 fps: the audio's, or its last tag's
    assert probe_video(whole, exact=True).status == "ok"
    for options in ({}, {"exact": True}, {"decode_check": False}):
        info = probe_video(cut, **options)
        assert (info.status, info.error) == (
            "truncated",
            f"truncated: the file holds {cut_at:,} of the {len(data):,} bytes its flv metadata "
            f"records, and its video ends at frame 985 of the {header:,} its header declares",
        ), options


def test_an_flv_whose_audio_has_a_gap_cut_after_it_is_truncated(tmp_path):
    """An FLV whose audio stops for a while (a live recording's dropout: no audio tags from
    4 to 6 s), cut at the end of the first audio tag after the gap: its last tag was taken
    to last as long as the time from the one before it, the gap, so its audio played to
    the 8 s its header declares and the cut, 2 s of video gone, read `ok`. The last tag
    lasts the shorter of the times between the last three; the whole file stays ok."""
    made = _adpcm_flv(tmp_path / "made.flv", 8, 8)
    data = made.read_bytes()
    ends = _flv_tag_ends(made)
    tags = []  # (start, end, kind, time in ms) of each tag
    for start, end in zip([int.from_bytes(data[5:9], "big") + 4, *ends[:-1]], ends, strict=True):
        time = int.from_bytes(data[start + 4 : start + 7], "big") | data[start + 7] << 24
        tags.append((start, end, data[start], time))
    kept = [tag for tag in tags if not (tag[2] == 8 and 4000 < tag[3] < 6000)]  # the gap
    whole = tmp_path / "gap.flv"
    whole.write_bytes(data[: tags[0][0]] + b"".join(data[start:end] for start, end, *_ in kept))
    at, cut_at = tags[0][0], None
    for start, end, kind, time in kept:
        at += end - start
        if kind == 8 and time >= 6000:
            cut_at = at
            break
    cut = tmp_path / "cut.flv"
    cut.write_bytes(whole.read_bytes()[:cut_at])
    assert probe_video(whole, exact=True).status == "ok"
    for options in ({}, {"exact": True}, {"decode_check": False}):
        assert probe_video(cut, **options).status == "truncated", options


def _recorded_size(data: bytes, size: float) -> bytes:
    """An FLV file `data` whose metadata records `size` as its file size (`filesize`)."""
    found = re.search(rb"\x00\x08filesize\x00([\s\S]{8})", data)
    assert found is not None
    return data[: found.start(1)] + struct.pack(">d", size) + data[found.end(1) :]


@pytest.mark.parametrize("duration", [True, False], ids=["duration", "no-duration"])
def test_an_flv_whose_metadata_records_a_stale_size_is_ok(tmp_path, duration):
    """A tool that rewrites an FLV's metadata may leave the file size it records stale: a
    whole H.264 FLV recording 25 bytes more than it holds read `truncated: the file holds
    23,903 of the 23,928 bytes its flv structure declares`, exit 1 (with and without --exact,
    and without decoding), as one 100 kB short did. The recorded size says nothing alone: a
    cut's evidence only where the frames fall short of the header's count (its AAC runs 2
    frames past its video) by frames the missing bytes could hold, and the file's tags end
    within a frame of its last video frame (a muxer writes tags in time order: here its
    audio's run 117 ms on, so the file went on past its video's end). A copy cut between
    tags, its last 2 video frames and audio gone, is still truncated."""
    made = ffmpeg_made(
        tmp_path / "clip.flv",
        *moving_picture(2),
        *("-f", "lavfi", "-i", "sine=duration=2", "-c:v", "libx264", "-pix_fmt", "yuv420p"),
        *("-c:a", "aac"),
        encoders=("libx264", "aac"),
        muxer="flv",
    )
    data = made.read_bytes()
    if not duration:  # as a tool that writes no duration leaves it: FFmpeg's from the last tag
        data = data.replace(b"\x08duration", b"\x08duratioX", 1)
    for extra in (25, 100_000):
        stale = tmp_path / f"stale-{extra}.flv"
        stale.write_bytes(_recorded_size(data, len(data) + extra))
        for options in ({}, {"exact": True}, {"decode_check": False}):
            info = probe_video(stale, **options)
            assert (info.status, info.error) == ("ok", None), (extra, options)
    cut = tmp_path / "cut.flv"
    ends = _flv_tag_ends(made)
    cut.write_bytes(data[: ends[-12]])  # its last 2 video frames, audio and end of sequence gone
    exact = probe_video(cut, exact=True)
    if duration:
        assert (exact.status, exact.error) == (
            "truncated",
            "truncated: 48 of the 52 frames its header declares decode",
        )
        assert probe_video(cut).status == "truncated"
    else:  # its header's count from its last tag: the frames are not short of it
        assert (exact.status, exact.frames_decoded) == ("ok", 48)


@pytest.mark.parametrize("container", ["flv", "ogg"])
def test_a_probe_walks_a_files_tags_or_pages_once(tmp_path, monkeypatch, container):
    """A probe asks an FLV's tags where its streams end, whether it was cut between two tags
    and how many frames it holds, an Ogg file's pages its repeated frames and its frames:
    each walked every tag or page of the file again (3 walks of an FLV whose audio runs on
    past its video and whose metadata records a stale size, under --exact: 0.3 s each for
    10 minutes; 2 of an Ogg file). One walk a probe serves them all, the rows unchanged."""
    if container == "flv":
        made = _adpcm_flv(tmp_path / "made.flv", 2, 2.4)
        data = made.read_bytes()
        path = tmp_path / "stale.flv"
        path.write_bytes(_recorded_size(data, len(data) + 500))
    else:
        path = ffmpeg_made(
            tmp_path / "clip.ogv",
            *moving_picture(2),
            *("-f", "lavfi", "-i", "sine=duration=2.4", "-c:v", "libtheora", "-c:a", "flac"),
            encoders=("libtheora", "flac"),
            muxer="ogg",
        )
    walks, mapped = [], streams._mapped
    monkeypatch.setattr(streams, "_mapped", lambda handle: walks.append(1) or mapped(handle))
    for options in ({"exact": True}, {}, {"decode_check": False}):
        walks.clear()
        info = probe_video(path, **options)
        assert (info.status, info.error) == ("ok", None), options
        assert len(walks) <= 1, options
    assert info.frames_decoded is None and probe_video(path, exact=True).frames_decoded == 50


def test_an_ogg_files_probe_and_frame_count_by_decoding_walk_its_pages_once(tmp_path, monkeypatch):
    """A video whose container gives no frame count is counted by decoding where its frames
    are sampled (`recount_frames` after `probe_video`): an Ogg file's pages were walked by
    each in a scope of its own, twice a file. One walk serves both, the row unchanged."""
    from torchkit.core.video import run as video_run

    path = ffmpeg_made(
        tmp_path / "clip.ogv",
        *moving_picture(2),
        *("-f", "lavfi", "-i", "sine=duration=2.4", "-c:v", "libtheora", "-c:a", "flac"),
        encoders=("libtheora", "flac"),
        muxer="ogg",
    )
    probed = video_run.probe_video

    def no_count(*args, **kwargs):  # as a container that records none gives it
        info = probed(*args, **kwargs)
        info.frames = None
        return info

    monkeypatch.setattr(video_run, "probe_video", no_count)
    walks, mapped = [], streams._mapped
    monkeypatch.setattr(streams, "_mapped", lambda handle: walks.append(1) or mapped(handle))
    reading = video_run._Reading(False, True, None, count_missing=True)
    info = reading.probe(path)
    assert (info.status, info.frames, info.frames_source) == ("ok", 50, "decoded")
    assert len(walks) == 1


def test_a_probe_walks_an_ogg_file_once_however_its_path_is_spelled(tmp_path, monkeypatch):
    """A path given as `find .` prints it (`./clip.ogv`) was walked twice under --exact: the
    check for repeated frames asked with the path as given, the damage check with its
    `Path` (`clip.ogv`), two names for one walk."""
    made = ffmpeg_made(
        tmp_path / "clip.ogv",
        *moving_picture(2),
        *("-f", "lavfi", "-i", "sine=duration=2.4", "-c:v", "libtheora", "-c:a", "flac"),
        encoders=("libtheora", "flac"),
        muxer="ogg",
    )
    monkeypatch.chdir(made.parent)
    walks, mapped = [], streams._mapped
    monkeypatch.setattr(streams, "_mapped", lambda handle: walks.append(1) or mapped(handle))
    for spelled in (f"./{made.name}", f"{made.parent}//{made.name}"):
        walks.clear()
        info = probe_video(spelled, exact=True)
        assert (info.status, info.frames_decoded, info.path) == ("ok", 50, spelled)
        assert len(walks) == 1, spelled


def test_a_video_only_flv_whose_first_frame_shows_later_and_records_a_stale_size_is_ok(
    tmp_path,
):
    """An H.264 FLV of B-frames (x264's defaults) shows its first frame 80 ms in: its
    duration, and the header's count (52), counts from 0, while the decoder's times count
    from the first frame shown (50 frames, the last ending at frame 50). A whole one of video
    alone whose metadata records a size 300-700 bytes over the file's read `truncated: the
    file holds 4,681 of the 5,181 bytes its flv metadata records, and its video ends at frame
    50 of the 52 its header declares`, exit 1, with and without --exact: where its video
    ends is read from its tags' times too (the last frame shown, from 0): ok."""
    made = ffmpeg_made(
        tmp_path / "clip.flv",
        *moving_picture(2),
        *("-c:v", "libx264", "-pix_fmt", "yuv420p"),
        encoders=("libx264",),
        muxer="flv",
    )
    data = made.read_bytes()
    assert probe_video(made, exact=True).frames_header == 52
    for extra in (300, 500, 700):
        stale = tmp_path / f"stale-{extra}.flv"
        stale.write_bytes(_recorded_size(data, len(data) + extra))
        for options in ({}, {"exact": True}, {"decode_check": False}):
            info = probe_video(stale, **options)
            assert (info.status, info.error) == ("ok", None), (extra, options)


def test_an_flv_whose_audio_plays_past_its_video_and_records_a_stale_size_is_ok(tmp_path):
    """A whole FLV whose video (1.88 s) ends short of its ADPCM audio (2 s; a tag plays
    0.37 s), its last audio tag starting within a frame of its last video frame, and whose
    metadata records a file size 100 kB larger than the file (left stale by a tool that
    rewrote it) read `truncated: the file holds 27,504 of the 127,504 bytes its flv metadata
    records, and its video ends at frame 47 of the 56 its header declares`, exit 1, with
    and without --exact; so did one whose recorded size is 1-10 kB over the file's, bytes
    the video's missing frames could take. Its last tag ends the file whole and its audio
    plays to its duration, so none of its tags is missing: ok, whatever size is recorded."""
    made = _adpcm_flv(tmp_path / "clip.flv", 1.88, 2)
    data = made.read_bytes()
    assert probe_video(made, exact=True).frames_decoded == 47
    for extra in (1_000, 3_000, 10_000, 100_000):
        stale = tmp_path / f"stale-{extra}.flv"
        stale.write_bytes(_recorded_size(data, len(data) + extra))
        for options in ({}, {"exact": True}, {"decode_check": False}):
            info = probe_video(stale, **options)
            assert (info.status, info.error) == ("ok", None), (extra, options)


@pytest.mark.parametrize("audio", [False, True], ids=["video-alone", "with-audio"])
def test_an_ogg_whose_last_page_header_is_zeroed(tmp_path, audio):
    """An Ogg file whose last page's 27-byte header is zeroed (its capture pattern, granule
    position and segment count) read `ok` under --exact with 97 of its 100 frames: the walk
    stopped at the page before it (no page after it to end at) and FFmpeg's count stopped
    with the frames decoded. A page whose checksum holds is one, and the video's last page,
    where its stream alone is not closed by then, is read from its segment table to the
    file's end: `damaged`. Where the lost page is the audio's (the video closed before it),
    every frame decodes and none is counted lost (the row reads `truncated`, as before: the
    header's count runs to an audio end the lost page took)."""
    clip = ffmpeg_made(
        tmp_path / "clip.ogv",
        *moving_picture(4),
        *(("-f", "lavfi", "-i", "sine=duration=4.5", "-c:a", "flac") if audio else ()),
        *("-c:v", "libtheora", "-g", "12"),
        encoders=("libtheora", "flac") if audio else ("libtheora",),
        muxer="ogg",
    )
    data = bytearray(clip.read_bytes())
    last = data.rfind(b"OggS")
    data[last : last + 27] = bytes(27)
    zeroed = tmp_path / "zeroed.ogv"
    zeroed.write_bytes(bytes(data))
    assert probe_video(clip, exact=True).status == "ok"
    held = ogg_video_frames(zeroed, "ogg")
    exact = probe_video(zeroed, exact=True)
    if audio:
        assert (held.frames, held.broken_at) == (100, None)
        assert (exact.status, exact.frames_decoded) == ("truncated", 100)
    else:
        assert (held.frames, held.broken_at) == (100, last)
        assert exact.status == "damaged" and exact.frames_decoded == decoded_by_opencv(zeroed)
        assert exact.error.startswith(f"damaged: {exact.frames_decoded} of the 100 frames ")


@pytest.mark.parametrize("serials", ["same", "new"])
def test_ogg_files_joined_by_cat_are_ok(tmp_path, serials):
    """Ogg files joined by `cat` (a chained Ogg file: each link begins its streams again)
    decode in OpenCV's FFmpeg to the first link's frames. Where the links' streams have the
    same serial numbers (ffmpeg's `-fflags +bitexact` numbers them from 0), the walk counted
    every link's frames: a whole file of a 1 s link and a 2 s one read `damaged: 25 of the
    75 frames its video packets hold decode`, exit 1. The walk stops where a stream begins
    after the first link's pages: the first link's frames are counted, as where the serial
    numbers are new."""
    links = [
        ffmpeg_made(
            tmp_path / f"link{seconds}.ogv",
            *moving_picture(seconds),
            *("-c:v", "libtheora", "-g", "12"),
            *(("-fflags", "+bitexact") if serials == "same" else ()),
            encoders=("libtheora",),
            muxer="ogg",
        )
        for seconds in (1, 2)
    ]
    joined = tmp_path / "joined.ogv"
    joined.write_bytes(links[0].read_bytes() + links[1].read_bytes())
    assert ogg_video_frames(joined, "ogg").frames == 25
    exact = probe_video(joined, exact=True)
    assert (exact.status, exact.error, exact.frames_decoded) == (
        "ok",
        None,
        decoded_by_opencv(joined),
    )
    assert exact.frames_decoded == 25


def test_a_pal_dvd_title_part_starting_inside_a_picture_is_judged(tmp_path):
    """A DVD title is stored in parts (VTS_01_1.VOB, VTS_01_2.VOB, ...) split after a pack,
    so a part after the first starts inside a picture. In a PAL DVD (576 rows), the start
    code of a slice of row 32 to 36 met before the first sequence header was taken for an
    MPEG-4 VOL (0x20 to 0x2F): no picture was counted, the part was not judged and a copy
    with a tenth zeroed read `ok` under --exact. A VOL is one right after its VO's start
    code: the part's pictures are counted from its first sequence header."""
    title = ffmpeg_made(
        tmp_path / "title.vob",
        *moving_picture(3, size="720x576"),
        *("-target", "pal-dvd"),
        encoders=("mpeg2video",),
        muxer="dvd",
    )
    data = title.read_bytes()
    part = tmp_path / "VTS_01_2.VOB"
    part.write_bytes(data[len(data) // 3 // 2048 * 2048 :])
    held = ps_video_frames(part, "mpeg-ps", 25.0)
    assert held is not None and held.frames - held.leading == decoded_by_opencv(part)
    assert_whole_and_zeroed(part, tmp_path, "its video packets hold", zeroed_at=(0.3,))


def test_an_mpeg2_picture_coding_extension_split_between_packets_is_read():
    """The walk stops at the picture coding extensions that repeat a field only (a frame
    picture's repeat_first_field: those of other pictures are passed over in the search
    for start codes): one whose bytes two packets split is read with the second's, and one
    that repeats no field, or codes a field picture, adds no frame shown."""
    sequence = b"\x00\x00\x01\xb3\x0b\x00\x78\x34\xff\xff\xe0\x18"  # 176x120, 29.97
    extension = b"\x00\x00\x01\xb5\x14\x82\x00\x01\x00\x00"  # interlaced sequence
    gop = b"\x00\x00\x01\xb8\x00\x08\x00\x00"

    def picture(order: int, structure: int, flags: int) -> bytes:
        header = b"\x00\x00\x01\x00" + bytes([order >> 2, (order & 3) << 6 | 1 << 3, 0, 0])
        coding = b"\x00\x00\x01\xb5\x8f\xff" + bytes([0xF0 | structure, flags, 0x80])
        return header + coding + b"\x00\x00\x01\x01" + bytes(20)  # then its first slice

    # (structure 3: a frame; flags: top_field_first 0x80, repeat_first_field 0x02)
    pictures = [(3, 0x82), (3, 0x00), (3, 0x02), (1, 0x02), (3, 0x80), (2, 0x02), (3, 0x82)]
    stream = b"".join(picture(order, *kind) for order, kind in enumerate(pictures))
    for split in range(len(stream) + 1):
        state = streams._PsPictures()
        state.read(sequence + extension)  # (the codec told: its start codes searched for)
        state.read(gop + stream[:split])
        state.read(stream[split:] + b"\x00\x00\x01\xb3")  # (the next start code ends it)
        assert (state.frames, state.shown) == (7, 8.5), split
