"""`torchkit video-info` and `torchkit.core.video`: metadata, exact counts, errors, TSN sampling."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest
from damaged_videos import (
    decoded_by_opencv,
    ffmpeg_made,
    ffprobe_entries,
    moving_picture,
    zeroed_copy,
)
from disks import deny_listing
from fragmented_mp4 import fragmented_mp4, media_timescale
from output_checks import error_line
from processes import PipeLines, run_torchkit_process, start_torchkit_process
from typer.testing import CliRunner

from torchkit.cli import app, console
from torchkit.cli.render import JsonArrayWriter, render_json
from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.video import (
    containers,
    find_videos,
    fourcc_to_text,
    inspect_videos,
    probe_video,
    sniff_container,
    streams,
    tsn_frame_indices,
)
from torchkit.core.video import run as video_run
from torchkit.core.video.avi import avi_frames_with_data, avi_indexed_frames

runner = CliRunner()

# (name, fourcc, width, height, fps, frames, container, codecs FFmpeg may report for it)
VIDEO_SPECS = [
    ("mjpg.avi", "MJPG", 32, 24, 29.97, 17, "avi", {"MJPG"}),
    ("mpeg4.mp4", "mp4v", 48, 32, 25.0, 10, "mp4", {"mp4v"}),
    ("mpeg4.mov", "mp4v", 40, 24, 30.0, 8, "mov", {"mp4v"}),
    ("lossless.mkv", "FFV1", 40, 30, 12.5, 12, "mkv", {"ffv1", "FFV1"}),
    ("vp8.webm", "VP80", 32, 16, 24.0, 9, "webm", {"VP80", "VP8 "}),
]


def frame_pixels(index: int, width: int, height: int) -> np.ndarray:
    """A distinct random picture per frame, so a wrong frame index cannot go unnoticed."""
    return np.random.default_rng(index).integers(0, 256, (height, width, 3), dtype=np.uint8)


def write_video(path: Path, fourcc: str, width: int, height: int, fps: float, frames: int) -> bool:
    writer = cv2.VideoWriter(
        str(path), cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*fourcc), fps, (width, height)
    )
    if not writer.isOpened():
        return False
    for index in range(frames):
        writer.write(frame_pixels(index, width, height))
    writer.release()
    return path.exists() and path.stat().st_size > 0


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, Path]:
    """The videos this OpenCV build can write (a build without an encoder skips its cases)."""
    root = tmp_path_factory.mktemp("videos")
    made = {}
    for name, fourcc, width, height, fps, frames, _, _ in VIDEO_SPECS:
        if write_video(root / name, fourcc, width, height, fps, frames):
            made[name] = root / name
    return made


@pytest.fixture(scope="module")
def broken(tmp_path_factory, videos) -> dict[str, Path]:
    """Files a real user trips over: truncated, empty, text named .mp4, header-only damage."""
    root = tmp_path_factory.mktemp("broken")
    files = {}
    if "mpeg4.mp4" in videos:  # the moov atom is at the end: cut it off
        data = videos["mpeg4.mp4"].read_bytes()
        (root / "truncated.mp4").write_bytes(data[: len(data) // 2])
        files["truncated"] = root / "truncated.mp4"
    (root / "empty.mp4").write_bytes(b"")
    files["empty"] = root / "empty.mp4"
    (root / "notes.mp4").write_text("these are my holiday notes, not a video\n")
    files["text"] = root / "notes.mp4"
    if "mjpg.avi" in videos:  # a copy cut short right after the header: no frame data at all
        data = videos["mjpg.avi"].read_bytes()
        (root / "header_only.avi").write_bytes(data[: data.find(b"movi") + 4])
        files["header_only"] = root / "header_only.avi"
    if "vp8.webm" in videos:  # the header still says 9 frames, the data holds fewer
        data = videos["vp8.webm"].read_bytes()
        (root / "cut.webm").write_bytes(data[: len(data) * 7 // 10])
        files["cut_webm"] = root / "cut.webm"
    return files


def need(mapping: dict, key: str) -> Path:
    if key not in mapping:
        pytest.skip(f"this OpenCV build cannot write {key}")
    return mapping[key]


def invoke(*args: str):
    return runner.invoke(app, ["video-info", *[str(a) for a in args]])


def table_text(folder: Path, *args: str) -> str:
    """The table as a file (-o renders it 200 columns wide, so no cell is cut short)."""
    target = folder / "table.txt"
    invoke(*args, "-o", target, "--force")
    return target.read_text()


def json_rows(*args: str) -> tuple[int, list[dict]]:
    result = invoke(*args, "--format", "json")
    return result.exit_code, json.loads(result.stdout)


# --- TSN sampling: the pure function -------------------------------------------------------------


def segment_bounds(n: int, k: int) -> list[tuple[int, int]]:
    edges = [i * n // k for i in range(k + 1)]
    return [(edges[i], edges[i + 1]) for i in range(k)]


def test_tsn_test_mode_divisible_matches_the_tsn_reference_formula():
    # The TSN reference: offset (n / K) // 2 into each of K segments of n // K frames.
    for n, k in [(12, 3), (16, 4), (9, 9), (96, 8)]:
        step = n // k
        expected = [step // 2 + step * i for i in range(k)]
        assert tsn_frame_indices(n, k, "test") == expected


def test_tsn_k_equals_one_takes_the_middle_frame_or_any_frame_in_train():
    assert tsn_frame_indices(10, 1, "test") == [5]
    assert tsn_frame_indices(1, 1, "test") == [0]
    draws = {tsn_frame_indices(10, 1, "train", seed)[0] for seed in range(200)}
    assert draws == set(range(10))  # uniform over the whole video, every frame reachable


def test_tsn_k_equals_frames_takes_every_frame_in_both_modes():
    assert tsn_frame_indices(7, 7, "test") == list(range(7))
    assert tsn_frame_indices(7, 7, "train", 3) == list(range(7))


@pytest.mark.parametrize("mode", ["test", "train"])
def test_tsn_fewer_frames_than_segments_repeats_in_order(mode):
    assert tsn_frame_indices(3, 7, mode, 0) == [0, 0, 0, 1, 1, 2, 2]
    assert tsn_frame_indices(1, 4, mode, 0) == [0, 0, 0, 0]
    assert tsn_frame_indices(4, 5, mode, 0) == [0, 0, 1, 2, 3]


def test_tsn_frames_not_divisible_by_k_use_all_frames():
    # 10 frames, 3 segments: frames 0-2, 3-5, 6-9 (no frame left out, unlike n // K strides).
    assert tsn_frame_indices(10, 3, "test") == [1, 4, 8]
    assert tsn_frame_indices(7, 2, "test") == [1, 5]
    for n, k in [(10, 3), (11, 4), (101, 7), (5, 4)]:
        for mode, seed in [("test", None), ("train", 0), ("train", 1)]:
            indices = tsn_frame_indices(n, k, mode, seed)
            assert len(indices) == k and indices == sorted(indices)
            for index, (start, stop) in zip(indices, segment_bounds(n, k), strict=True):
                assert start <= index < stop
                if mode == "test":
                    assert index == start + (stop - start) // 2


def test_tsn_train_mode_is_seeded_and_uniform_within_segments():
    assert tsn_frame_indices(100, 5, "train", 7) == tsn_frame_indices(100, 5, "train", 7)
    assert tsn_frame_indices(100, 5, "train", 7) != tsn_frame_indices(100, 5, "train", 8)
    generator = np.random.default_rng(0)
    draws = np.array([tsn_frame_indices(10, 3, "train", generator) for _ in range(600)])
    for column, (start, stop) in enumerate(segment_bounds(10, 3)):
        values, counts = np.unique(draws[:, column], return_counts=True)
        assert values.tolist() == list(range(start, stop))
        expected = 600 / (stop - start)
        assert np.all(np.abs(counts - expected) < 0.3 * expected)


def test_tsn_rejects_zero_frames_and_bad_arguments():
    with pytest.raises(InputError, match="no frames"):
        tsn_frame_indices(0, 3)
    with pytest.raises(UsageError):
        tsn_frame_indices(10, 0)
    with pytest.raises(UsageError):
        tsn_frame_indices(10, 3, "middle")


# --- small helpers -------------------------------------------------------------------------------


def test_sniff_container_and_fourcc():
    assert sniff_container(b"RIFF\x00\x00\x00\x00AVI LIST") == "avi"
    assert sniff_container(b"\x00\x00\x00\x1cftypisom") == "mp4"
    assert sniff_container(b"\x00\x00\x00\x14ftypqt  ") == "mov"
    assert sniff_container(b"\x1a\x45\xdf\xa3\x9fB\x86\x81\x01B\xf7\x81\x01B\x82\x84webm") == "webm"
    assert sniff_container(b"\x1a\x45\xdf\xa3\xa3B\x86\x81\x01B\x82\x88matroska") == "mkv"
    assert sniff_container(b"G" + b"x" * 300) is None  # one 'G' is not an MPEG-TS sync pattern
    # M2TS/MTS (AVCHD): a 4-byte timestamp before each 188-byte packet; was not recognised
    m2ts = (b"\x00\x01\x02\x03G" + bytes(187)) * 3
    assert sniff_container(m2ts) == "m2ts"
    assert sniff_container(m2ts[4:]) is None  # 192 bytes apart, not 188
    assert sniff_container(b"hello world") is None
    assert fourcc_to_text(cv2.VideoWriter_fourcc(*"MJPG")) == "MJPG"
    assert fourcc_to_text(0.0) is None


# --- metadata ------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", VIDEO_SPECS, ids=[s[0] for s in VIDEO_SPECS])
def test_every_field_of_generated_videos(videos, spec):
    name, _, width, height, fps, frames, container, codecs = spec
    path = need(videos, name)
    code, rows = json_rows(path)
    assert code == 0
    (row,) = rows
    assert row["path"] == str(path)
    assert row["size_bytes"] == os.path.getsize(path)
    assert (row["width"], row["height"]) == (width, height)
    assert row["frames"] == frames and row["frames_header"] == frames
    assert row["frames_source"] == "header" and row["frames_decoded"] is None
    assert row["fps"] == pytest.approx(fps, rel=1e-6)
    assert row["duration_s"] == pytest.approx(frames / fps, rel=1e-6)
    assert row["codec"] in codecs
    assert row["container"] == container
    assert row["error"] is None and row["frame_indices"] is None


@pytest.mark.parametrize(
    ("name", "fourcc", "codec"),
    [("xvid.avi", "XVID", "XVID"), ("divx.avi", "DIVX", "DIVX"), ("xvid.mp4", "XVID", "mp4v")],
)
def test_the_codec_column_is_the_fourcc_the_container_records(tmp_path, name, fourcc, codec):
    """FFmpeg calls every MPEG-4 Part 2 stream FMP4; the column is the tag the file records,
    which ffprobe's codec_tag_string shows (an MP4 records mp4v whatever the writer was told)."""
    path = tmp_path / name
    if not write_video(path, fourcc, 32, 24, 25.0, 3):
        pytest.skip(f"this OpenCV build cannot write {fourcc}")
    code, rows = json_rows(path)
    assert code == 0 and rows[0]["codec"] == codec


def test_container_fourcc_of_hand_made_files(tmp_path):
    from torchkit.core.video.containers import container_fourcc

    def fourcc(data: bytes, container: str) -> str | None:
        path = tmp_path / "file"
        path.write_bytes(data)
        return container_fourcc(path, container)

    chunk = lambda name, data: name + struct.pack("<I", len(data)) + data + bytes(len(data) % 2)  # noqa: E731
    riff = lambda *chunks: b"RIFF" + struct.pack("<I", 0) + b"AVI " + b"".join(chunks)  # noqa: E731
    stream = lambda kind, handler, compression: chunk(  # noqa: E731
        b"LIST",
        b"strl"
        + chunk(b"strh", kind + handler + bytes(48))
        + chunk(b"strf", bytes(16) + compression + bytes(20)),
    )
    audio = stream(b"auds", bytes(4), b"\x55\x00\x00\x00")
    header = chunk(b"avih", bytes(56))
    avi = riff(chunk(b"LIST", b"hdrl" + header + audio + stream(b"vids", b"xvid", b"XVID")))
    assert fourcc(avi, "avi") == "XVID"  # the video stream's compression, not its handler
    assert fourcc(avi.replace(b"XVID", bytes(4)), "avi") == "xvid"  # empty: the handler
    assert fourcc(avi.replace(b"XVID", bytes(4)).replace(b"xvid", bytes(4)), "avi") is None
    assert fourcc(riff(chunk(b"LIST", b"hdrl" + header + audio)), "avi") is None
    box = lambda kind, payload: struct.pack(">I4s", 8 + len(payload), kind) + payload  # noqa: E731
    entry = lambda kind: box(b"stsd", bytes(4) + struct.pack(">I", 1) + box(kind, bytes(20)))  # noqa: E731
    track = lambda handler, kind: box(  # noqa: E731
        b"trak",
        box(b"tkhd", bytes(20))
        + box(
            b"mdia",
            box(b"hdlr", bytes(8) + handler + bytes(12)) + box(b"minf", box(b"stbl", entry(kind))),
        ),
    )
    moov = box(b"moov", box(b"mvhd", bytes(20)) + track(b"soun", b"mp4a") + track(b"vide", b"avc1"))
    ftyp, mdat = box(b"ftyp", b"isom" * 3), box(b"mdat", b"x" * 50)
    assert fourcc(ftyp + mdat + moov, "mp4") == fourcc(ftyp + moov + mdat, "mov") == "avc1"
    large = struct.pack(">I4sQ", 1, b"mdat", 16 + 50) + b"x" * 50  # a 64-bit box size
    assert fourcc(ftyp + large + moov, "mp4") == "avc1"
    assert fourcc(ftyp + mdat, "mp4") is None and fourcc(ftyp + mdat + moov[:40], "mp4") is None
    assert fourcc(ftyp + moov, "mkv") is None


def test_an_animated_image_under_a_video_name_shows_its_own_container(tmp_path):
    """The container column is what the bytes are: a GIF saved as .mp4 (as sites serve them) or
    an animated PNG named .mov is read by FFmpeg, and is not called an MP4 or a MOV."""
    from PIL import Image

    pictures = [Image.fromarray(frame_pixels(i, 30, 20)) for i in range(5)]
    gif, apng = tmp_path / "clip.mp4", tmp_path / "clip.mov"
    pictures[0].save(gif, format="GIF", save_all=True, append_images=pictures[1:], duration=100)
    pictures[0].save(apng, format="PNG", save_all=True, append_images=pictures[1:], duration=100)
    code, rows = json_rows(gif, apng, "--exact")
    assert code == 0
    assert [(r["container"], r["frames"], r["status"]) for r in rows] == [
        ("gif", 5, "ok"),
        ("png", 5, "ok"),
    ]
    still = tmp_path / "still.mp4"
    pictures[0].save(still, format="PNG")  # one picture is still refused, as before
    _, (row,) = json_rows(still, "--skip-errors")
    assert (row["status"], row["error"]) == ("unreadable", "a still image (PNG), not a video")


def test_a_size_a_byte_under_a_mebibyte_reads_one_mebibyte(tmp_path):
    """An animated GIF named .mp4 with trailing bytes up to 1,048,575 read "1024.0 KiB"."""
    from PIL import Image

    pictures = [Image.fromarray(frame_pixels(i, 30, 20)) for i in range(3)]
    clip = tmp_path / "clip.mp4"
    pictures[0].save(clip, format="GIF", save_all=True, append_images=pictures[1:], duration=100)
    with clip.open("ab") as file:
        file.write(bytes(1_048_575 - clip.stat().st_size))
    text = table_text(tmp_path, clip)
    assert "1.0 MiB" in text and "KiB" not in text


def test_a_file_with_no_video_stream_shows_no_rate_or_codec(tmp_path):
    """A damaged PNG named .mp4: FFmpeg opens no stream, yet the row showed fps 25 and codec
    MPNG, as if it had read them, beside 'no video stream'."""
    damaged = tmp_path / "clip.mp4"
    damaged.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))
    _, (row,) = json_rows(damaged, "--skip-errors")
    assert (row["status"], row["error"]) == ("unreadable", "no video stream")
    assert (row["fps"], row["codec"], row["width"]) == (None, None, None)


def test_a_raw_mjpeg_stream_is_a_video_not_its_first_jpeg(tmp_path):
    """A raw MJPEG stream (JPEGs one after another, as an IP camera's `.mjpeg` recording holds
    them) is a video of a JPEG a frame to FFmpeg; PIL opens its first JPEG alone, and its row
    read "a still image (JPEG), not a video". A single JPEG stays a still image, and so does
    one whose EXIF holds a thumbnail (a JPEG inside its APP1 segment)."""
    from PIL import Image

    jpegs = []
    for index in range(7):
        buffer = io.BytesIO()
        Image.fromarray(frame_pixels(index, 32, 24)).save(buffer, format="JPEG")
        jpegs.append(buffer.getvalue())
    stream, still, with_thumbnail = tmp_path / "cam.mjpeg", tmp_path / "a.mp4", tmp_path / "b.mp4"
    stream.write_bytes(b"".join(jpegs))
    still.write_bytes(jpegs[0])
    exif = Image.Exif()
    exif[0x010F] = "camera"
    photo = Image.fromarray(frame_pixels(0, 32, 24))
    photo.save(with_thumbnail, format="JPEG", exif=exif.tobytes() + jpegs[1])
    info = probe_video(stream, exact=True)
    assert (info.status, info.frames, info.width, info.height) == ("ok", 7, 32, 24)
    for path in (still, with_thumbnail):
        info = probe_video(path)
        assert (info.status, info.error) == ("unreadable", "a still image (JPEG), not a video")
    (tmp_path / "cams").mkdir()  # a folder's .mjpeg and .mjpg files are videos too
    stream.rename(tmp_path / "cams" / "door.MJPG")
    assert find_videos([tmp_path / "cams"]) == [str(tmp_path / "cams" / "door.MJPG")]


def test_a_jpeg_whose_segments_hold_an_end_and_a_start_is_still_a_still_image(tmp_path):
    """The bytes of one JPEG's end and another's start inside a segment before the image (a
    comment here; a camera's previews in its EXIF, back to back) made a photo a raw MJPEG
    stream, a one-frame video. Only the coded data on is looked at; progressive too."""
    from PIL import Image

    photo = Image.fromarray(frame_pixels(0, 32, 24))
    for name, options in (("a.mp4", {}), ("b.mp4", {"progressive": True})):
        photo.save(
            tmp_path / name, format="JPEG", comment=b"\xff\xd9\xff\xd8 two previews", **options
        )
        info = probe_video(tmp_path / name)
        assert (info.status, info.error) == ("unreadable", "a still image (JPEG), not a video")
    stream = tmp_path / "cam.mjpeg"  # progressive frames one after another are still a stream
    stream.write_bytes((tmp_path / "b.mp4").read_bytes() * 3)
    assert containers._jpeg_followed_by_another(stream)


def test_fps_is_a_float_not_truncated(tmp_path, videos):
    path = need(videos, "mjpg.avi")
    _, (row,) = json_rows(path)
    assert row["fps"] == 29.97
    table = table_text(tmp_path, path)
    assert "29.97 " in table and "0.567" in table and "32x24" in table  # 17 / 29.97 s


def test_the_table_shows_a_slow_or_fast_rate_and_a_short_duration_not_zero(tmp_path, videos):
    """A time-lapse of a frame an hour showed fps 0, and a high-speed clip (17 frames at
    100,000 fps) a duration of 0.000: 3 decimals left no digit. Below 1 fps, and below a
    millisecond, the table gives 3 significant digits (JSON and CSV carry every digit)."""
    data = need(videos, "mjpg.avi").read_bytes()
    for name, scale, rate in (("hourly.avi", 3600, 1), ("fast.avi", 1, 100_000)):
        retimed = bytearray(data)
        struct.pack_into("<II", retimed, retimed.find(b"strh") + 28, scale, rate)
        (tmp_path / name).write_bytes(bytes(retimed))
    _, rows = json_rows(tmp_path / "hourly.avi", tmp_path / "fast.avi")
    assert [(row["fps"], row["duration_s"]) for row in rows] == [
        (pytest.approx(1 / 3600), pytest.approx(17 * 3600)),
        (pytest.approx(100_000), pytest.approx(17 / 100_000)),
    ]
    lines = table_text(tmp_path, tmp_path / "hourly.avi", tmp_path / "fast.avi").splitlines()
    hourly = next(line for line in lines if "hourly.avi" in line)
    fast = next(line for line in lines if "fast.avi" in line)
    assert " 0.000278 " in hourly and " 61200.000 " in hourly
    assert " 100000 " in fast and " 0.00017 " in fast


def test_a_raw_dv_file_has_its_own_rate_and_frame_count(tmp_path):
    """FFmpeg's DV demuxer gives its time base as the average rate: 5 PAL frames read as 12,000
    frames at 60,000 fps, and --exact called the whole file truncated (exit 1). The rate is
    the time between its first two frames, in every mode; a DV file under another name too."""
    dv = tmp_path / "tape.dv"
    if not write_video(dv, "dvsd", 720, 576, 25.0, 5):
        pytest.skip("this OpenCV build cannot write DV")
    assert sniff_container(dv.read_bytes()[:512]) == "dv"
    shutil.copyfile(dv, tmp_path / "renamed.mov")
    for mode in ((), ("--exact",), ("--no-decode-check",)):
        code, rows = json_rows(dv, tmp_path / "renamed.mov", *mode)
        assert code == 0, rows
        for row in rows:
            assert (row["fps"], row["frames"], row["frames_header"]) == (25.0, 5, 5), mode
            assert (row["duration_s"], row["container"], row["status"]) == (0.2, "dv", "ok")


def test_a_cut_copy_of_a_raw_dv_file_is_truncated(tmp_path):
    """Raw DV frames are all one size (144,000 bytes for PAL): a copy cut inside a frame read
    `ok`; it is `truncated`, a whole file and one cut between frames `ok`."""
    dv = tmp_path / "tape.dv"
    if not write_video(dv, "dvsd", 720, 576, 25.0, 5):
        pytest.skip("this OpenCV build cannot write DV")
    data = dv.read_bytes()
    assert len(data) == 5 * 144_000
    (tmp_path / "cut.dv").write_bytes(data[:600_000])
    (tmp_path / "four.dv").write_bytes(data[: 4 * 144_000])
    code, rows = json_rows(dv, tmp_path / "cut.dv", tmp_path / "four.dv", "--skip-errors")
    assert [row["status"] for row in rows] == ["ok", "truncated", "ok"]
    assert "600,000 of the 720,000 bytes" in rows[1]["error"]


def test_exact_counts_by_decoding(tmp_path, videos):
    paths = list(videos.values())
    code, rows = json_rows(*paths, "--exact")
    assert code == 0
    written = {spec[0]: spec[5] for spec in VIDEO_SPECS}
    for row in rows:
        expected = written[Path(row["path"]).name]
        assert row["frames_decoded"] == expected == row["frames"]
        assert row["frames_source"] == "decoded"
    assert "frames (decoded)" in table_text(tmp_path, *paths, "--exact")
    assert "frames (header)" in table_text(tmp_path, *paths)


def test_a_cut_copy_is_truncated_with_and_without_exact(tmp_path, broken):
    """The webm cut at 70%: its header still says 9 frames; only some decode."""
    cut = need(broken, "cut_webm")
    reference = cv2.VideoCapture(str(cut), cv2.CAP_FFMPEG)
    decodable = 0
    while reference.read()[0]:
        decodable += 1
    assert 0 < decodable < 9
    code, (header_row,) = json_rows(cut)
    assert code == 1
    assert header_row["frames"] == 9 and header_row["status"] == "truncated"
    assert header_row["error"].startswith("truncated: the file holds ")
    code, (row,) = json_rows(cut, "--exact")
    assert code == 1 and row["status"] == "truncated"
    assert (row["frames"], row["frames_header"], row["frames_decoded"]) == (decodable, 9, decodable)
    table = table_text(tmp_path, cut, "--exact")
    assert f"{decodable} (header 9)" in table and "truncated" in table
    result = invoke(cut, "--exact", "--skip-errors")
    assert result.exit_code == 0
    assert "Warning: 1 of 1 videos could not be read: 1 truncated" in result.stderr


def test_folders_are_searched_recursively_in_sorted_order_without_hidden_files(tmp_path, videos):
    source = need(videos, "mjpg.avi")
    (tmp_path / "b" / "deep").mkdir(parents=True)
    (tmp_path / "a").mkdir()
    for target in ["b/deep/z.avi", "a/y.AVI", "x.avi"]:
        (tmp_path / target).write_bytes(source.read_bytes())
    (tmp_path / "readme.txt").write_text("not a video")
    (tmp_path / "._x.avi").write_bytes(b"\x00\x05\x16\x07")  # a macOS resource fork
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "w.avi").write_bytes(source.read_bytes())
    code, rows = json_rows(tmp_path, tmp_path / "x.avi")  # x.avi named twice: reported once
    assert code == 0
    names = [Path(row["path"]).relative_to(tmp_path).as_posix() for row in rows]
    assert names == ["a/y.AVI", "b/deep/z.avi", "x.avi"]
    assert all(row["frames"] == 17 for row in rows)


def test_a_folder_search_counts_links_to_videos_fifos_and_dangling_links_but_no_linked_folder(
    tmp_path, videos
):
    """A FIFO or a link to nothing named like a video is a row saying what it is, as the data
    readers make such an image an unreadable one: it was left out without a word (a folder of
    only such files said "no video files")."""
    source = need(videos, "mjpg.avi")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "c.avi").write_bytes(source.read_bytes())
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.avi").write_bytes(source.read_bytes())
    (root / "b.avi").symlink_to(root / "sub" / "a.avi")  # a link to a video: a video
    (root / "linked").symlink_to(elsewhere, target_is_directory=True)  # not followed
    (root / "gone.avi").symlink_to(tmp_path / "nothing.avi")  # dangling
    os.mkfifo(root / "pipe.avi")  # opening it would wait for a writer
    (root / "folder.avi").mkdir()  # a folder named like a video, with one inside
    (root / "folder.avi" / "d.mp4").write_bytes(source.read_bytes())
    found = [Path(p).relative_to(root).as_posix() for p in find_videos([root])]
    assert found == ["b.avi", "folder.avi/d.mp4", "gone.avi", "pipe.avi", "sub/a.avi"]
    rows = {Path(info.path).name: info for info in map(probe_video, map(str, root.glob("*.avi")))}
    assert rows["gone.avi"].error == "not a regular file (a symbolic link to nothing)"
    assert rows["pipe.avi"].error == "not a regular file (a FIFO)"


def test_a_folder_search_names_the_folders_it_cannot_list(tmp_path, monkeypatch, caplog):
    """A subfolder without read permission was passed over without a word (its videos left
    out of the rows), and a folder given that cannot be listed said "no video files". The
    first is one warning, as the data readers give; the second an error that says why (root
    is not denied: the listing is made to fail)."""
    (tmp_path / "clips" / "sub").mkdir(parents=True)
    (tmp_path / "clips" / "a.avi").write_bytes(b"RIFF")
    (tmp_path / "clips" / "sub" / "b.avi").write_bytes(b"RIFF")
    deny_listing(monkeypatch, tmp_path / "clips" / "sub")
    with caplog.at_level("WARNING", logger="torchkit"):
        assert find_videos([tmp_path / "clips"]) == [str(tmp_path / "clips" / "a.avi")]
    assert [r.getMessage() for r in caplog.records] == [
        f"1 folder(s) in {tmp_path / 'clips'} cannot be listed, their videos not read: sub "
        "(permission denied) (make them readable)"
    ]
    deny_listing(monkeypatch, tmp_path / "clips")
    with pytest.raises(InputError) as refused:
        find_videos([tmp_path / "clips"])
    assert refused.value.message == f"cannot list folder {tmp_path / 'clips'}: permission denied"
    assert refused.value.hint == "make it readable"


def test_a_folder_that_cannot_be_listed_fails_the_run_once_the_rest_is_read(
    tmp_path, monkeypatch, videos
):
    """It warned and exited 0, so `video-info clips/ -o info.csv && rm -r clips` deleted the
    videos with no row; now exit 1 after every other row, as for a video that fails (exit 0
    with --skip-errors, a warning then)."""
    (tmp_path / "clips" / "sub").mkdir(parents=True)
    (tmp_path / "clips" / "a.avi").write_bytes(need(videos, "mjpg.avi").read_bytes())
    deny_listing(monkeypatch, tmp_path / "clips" / "sub")
    for fmt in ("table", "json"):
        result = invoke(tmp_path / "clips", "--format", fmt)
        assert result.exit_code == 1, result.stderr
        assert error_line(result.stderr) == (
            f"Error: 1 folder in {tmp_path / 'clips'} could not be listed: their videos were not "
            "read (the warning above names them: make them readable; --skip-errors exits 0)"
        )
        assert "a.avi" in result.stdout and result.stderr.count("cannot be listed") == 1
    skipped = invoke(tmp_path / "clips", "--skip-errors")
    assert skipped.exit_code == 0, skipped.stderr
    assert f"Warning: 1 folder in {tmp_path / 'clips'} could not be listed" in skipped.stderr


def test_csv_has_raw_values_under_the_json_names(videos):
    path = need(videos, "mjpg.avi")
    result = invoke(path, "--format", "csv", "--segments", "3")
    assert result.exit_code == 0
    (row,) = list(csv.DictReader(io.StringIO(result.stdout)))
    assert row["size_bytes"] == str(os.path.getsize(path))
    assert (row["width"], row["height"], row["frames"]) == ("32", "24", "17")
    assert row["fps"] == "29.97" and float(row["duration_s"]) == pytest.approx(17 / 29.97)
    assert (row["codec"], row["container"], row["error"]) == ("MJPG", "avi", "")
    assert row["frame_indices"] == "2 8 14"


def test_parallel_and_sequential_give_the_same_rows(videos):
    paths = list(videos.values())
    _, sequential = json_rows(*paths, "-j", "0", "-k", "4", "--sample-mode", "train")
    _, parallel = json_rows(*paths, "-j", "4", "-k", "4", "--sample-mode", "train")
    assert sequential == parallel
    assert [row["path"] for row in parallel] == [str(p) for p in paths]


@pytest.fixture
def many_videos(tmp_path, videos, broken) -> list[Path]:
    """Enough videos for worker processes (links to the generated ones, broken files among
    them), in a folder of their own."""
    folder = tmp_path / "many"
    folder.mkdir()
    sources = [*videos.values(), *broken.values()]
    for index in range(2 * video_run.MIN_VIDEOS_PER_PROCESS + 3):
        source = sources[index % len(sources)]
        os.link(source, folder / f"{index:03d}_{source.name}")
    return sorted(folder.iterdir())


def test_worker_processes_give_the_rows_of_one_at_a_time_and_count_missing_frames(
    many_videos, tmp_path, monkeypatch
):
    """Many videos are read by worker processes (OpenCV opens one capture at a time per
    process); the rows, train-mode frame indices included, are those of one video at a time,
    in the order given, and the progress counts every video once. From 128 videos on, those
    whose container gives no frame count (raw MPEG-2 clips, last) were counted by decoding one
    at a time in the process that gathers the rows (to sample them); the worker processes that
    read them count them now. (One pool for both: each worker is a new interpreter.)"""
    import torchkit.core.video.frames as frames

    clip = tmp_path / "clip.m2v"
    uncounted = []
    if write_video(clip, "MPG2", 48, 32, 25.0, 12):
        uncounted = [clip]
        for index in range(5):
            uncounted.append(tmp_path / f"clip{index}.m2v")
            os.link(clip, uncounted[-1])
    videos = [*many_videos, *uncounted]
    options = {"segments": 3, "sample_mode": "train", "seed": 5}
    one_at_a_time = [info.to_dict() for info in inspect_videos(videos, workers=0, **options)]
    counted = {(row["frames"], row["frames_source"]) for row in one_at_a_time[len(many_videos) :]}
    assert counted == ({(12, "decoded")} if uncounted else set())
    pools = []
    real_map_chunks = video_run.map_chunks

    def recorded(func, chunks, *, workers, on_result, preload=None, start_fresh=False):
        read = sum(len(chunk.videos) for chunk in chunks)
        pools.append((workers, read, {chunk.reading.decoder_threads for chunk in chunks}))
        return real_map_chunks(
            func,
            chunks,
            workers=workers,
            on_result=on_result,
            preload=preload,
            start_fresh=start_fresh,
        )

    def not_here(*args, **kwargs):
        raise AssertionError("counted in the process that gathers the rows")

    monkeypatch.setattr(video_run, "map_chunks", recorded)
    monkeypatch.setattr(video_run, "usable_cpus", lambda: 2)
    monkeypatch.setattr(frames, "recount_frames", not_here)
    calls = []
    parallel = inspect_videos(
        videos, workers=4, progress=lambda d, t: calls.append((d, t)), **options
    )
    assert pools == [(2, len(videos), {1})]  # one decoder thread a video
    assert [info.to_dict() for info in parallel] == one_at_a_time
    assert [info.path for info in parallel] == [str(p) for p in videos]
    assert {info.status for info in parallel} == {"ok", "truncated", "unreadable"}
    done = [d for d, _ in calls]
    assert calls[0] == (0, len(videos)) and done == sorted(done)
    assert calls[-1] == (len(videos), len(videos))
    if not uncounted:
        pytest.skip("checked but the counting in workers: no raw MPEG-2 writer in this OpenCV")


def test_videos_read_at_once_get_one_decoder_thread_each_and_the_same_rows(
    tmp_path, videos, monkeypatch
):
    """FFmpeg starts a thread per core for every decoder it opens, which costs more than a small
    video's first frame: where several videos are read at once, each decoder gets one thread
    (to read its header or to extract its frames). A video decoded at length alone (--exact or
    --extract-frames, one video or -j 1) keeps FFmpeg's threads."""
    import torchkit.core.video.frames as frames
    import torchkit.core.video.probe as probe

    paths = list(videos.values())
    for path in paths:
        for exact in (False, True):
            own = probe_video(path, exact=exact, decoder_threads=None).to_dict()
            assert probe_video(path, exact=exact, decoder_threads=1).to_dict() == own
    asked = []
    opened = probe._open_capture

    def recorded(cv2, path, decoder_threads=None):
        asked.append(decoder_threads)
        return opened(cv2, path, decoder_threads)

    monkeypatch.setattr(probe, "_open_capture", recorded)
    monkeypatch.setattr(frames, "_open_capture", recorded)
    extract = {"segments": 2, "extract_dir": tmp_path / "frames", "force": True}
    for paths_given, options, expected in [
        (paths, {"workers": 2}, {1}),
        (paths, {"workers": 2, "exact": True}, {1}),
        (paths, {"workers": 0}, {1}),
        (paths, {"workers": 1, "exact": True}, {None}),
        (paths[:1], {"exact": True}, {None}),
        (paths, {"workers": 2, **extract}, {1}),
        (paths[:1], extract, {None}),
    ]:
        asked.clear()
        assert len(inspect_videos(paths_given, **options)) == len(paths_given)
        assert set(asked) == expected, options


def test_few_videos_or_one_core_stay_in_this_process(many_videos, monkeypatch):
    def no_pool(*args, **kwargs):
        raise AssertionError("no worker process expected")

    monkeypatch.setattr(video_run, "map_chunks", no_pool)
    monkeypatch.setattr(video_run, "usable_cpus", lambda: 2)
    few = many_videos[: 2 * video_run.MIN_VIDEOS_PER_PROCESS - 1]
    assert len(inspect_videos(few, workers=4)) == len(few)
    monkeypatch.setattr(video_run, "usable_cpus", lambda: 1)
    assert len(inspect_videos(many_videos, workers=4)) == len(many_videos)


def test_progress_callback_counts_every_video(videos):
    calls = []
    inspect_videos(list(videos.values()), workers=2, progress=lambda d, t: calls.append((d, t)))
    total = len(videos)
    assert calls[0] == (0, total) and calls[-1] == (total, total) and len(calls) == total + 1


# --- errors --------------------------------------------------------------------------------------


def test_broken_files_are_rows_with_errors_and_exit_1(tmp_path, videos, broken):
    good = need(videos, "mjpg.avi")
    paths = [good, broken["empty"], broken["text"], need(broken, "truncated")]
    result = invoke(*paths, "--format", "json")
    assert result.exit_code == 1
    rows = {Path(row["path"]).name: row for row in json.loads(result.stdout)}
    assert rows["mjpg.avi"]["error"] is None and rows["mjpg.avi"]["frames"] == 17
    assert rows["empty.mp4"]["error"] == "empty file" and rows["empty.mp4"]["size_bytes"] == 0
    assert rows["notes.mp4"]["error"] == "not a video file"
    assert rows["notes.mp4"]["container"] is None and rows["notes.mp4"]["width"] is None
    # OpenCV writes the index (moov) at the end: the cut copy cannot be opened, and its box
    # sizes still tell that it is a cut copy rather than a corrupt file.
    assert rows["truncated.mp4"]["status"] == "truncated"
    assert rows["truncated.mp4"]["error"].startswith("truncated: the file holds ")
    assert rows["truncated.mp4"]["container"] == "mp4"
    assert [row["status"] for row in rows.values()] == [
        "ok",
        "unreadable",
        "unreadable",
        "truncated",
    ]
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: 3 of 4 videos could not be read: 1 truncated, 2 unreadable "
        "(see the status and error columns; --skip-errors exits 0)"
    )
    assert "Traceback" not in result.stderr
    table = table_text(tmp_path, *paths)
    assert "error" in table and "empty file" in table and "truncated: the file holds" in table
    assert "status" in table and "unreadable" in table


def test_a_header_without_frames_is_truncated_even_without_the_decode_check(broken):
    header_only = need(broken, "header_only")
    for options in ([], ["--no-decode-check"], ["--exact"]):
        code, rows = json_rows(header_only, *options)
        assert code == 1 and rows[0]["status"] == "truncated", options
        assert rows[0]["error"].startswith("truncated: the file holds "), options
        assert rows[0]["width"] and rows[0]["frames_header"] == 17  # what the header claims


@pytest.mark.parametrize(
    ("name", "fourcc", "error"),
    [
        ("empty.avi", "MJPG", "empty video: it holds no frames (its header declares none)"),
        (
            "empty.mp4",
            "mp4v",
            "no video FFmpeg can open in this mp4 file (no video track, or a damaged one)",
        ),
        # a video track and no cluster: it read "no video track, or a damaged one"
        ("empty.mkv", "XVID", "empty video: it holds no frames (its video track holds none)"),
        ("empty.webm", "VP80", "empty video: it holds no frames (its video track holds none)"),
        # an FLV's tags and an Ogg's pages whole, no frame in them: they read "truncated or
        # corrupt flv file" (ogg), where the containers above read as empty
        (
            "empty.flv",
            "FLV1",
            "empty video: it holds no frames (its header declares video, and no tag holds any)",
        ),
        (
            "empty.ogg",
            "VP80",
            "empty video: it holds no frames (its video stream ends after its headers)",
        ),
    ],
)
def test_a_recording_stopped_before_its_first_frame_is_not_called_truncated(
    tmp_path, name, fourcc, error
):
    """A writer opened and released without a frame leaves a whole file: it was 'no frame
    decodes (truncated or corrupt)' or 'truncated or corrupt mp4 file', sending users after a
    damaged copy that does not exist."""
    path = tmp_path / name
    if not write_video(path, fourcc, 32, 24, 25.0, 0):
        pytest.skip(f"this OpenCV build cannot write {name}")
    for options in ({}, {"exact": True}):
        info = probe_video(path, **options)
        assert (info.status, info.error) == ("unreadable", error), options
    if name.endswith(".avi"):  # its header's count: 0 frames, not unknown
        assert probe_video(path, decode_check=False).frames_header == 0


def test_a_whole_audio_only_flv_is_not_called_truncated(tmp_path):
    """An FLV whose header declares audio alone (a podcast's recording) read `truncated or
    corrupt flv file`: a whole file called damaged. It says there is no video in it."""
    from torchkit.core.video.containers import declares_no_video

    def tag(kind: int, data: bytes, ms: int) -> bytes:
        head = struct.pack(">B", kind) + len(data).to_bytes(3, "big") + ms.to_bytes(3, "big")
        return head + bytes(4) + data + struct.pack(">I", 11 + len(data))

    pcm = bytes([0x3E]) + bytes(882)  # linear PCM, 44.1 kHz, 16-bit, mono: 10 ms
    audio = b"FLV\x01\x04" + struct.pack(">I", 9) + bytes(4)  # flags: audio only
    audio += b"".join(tag(8, pcm, 10 * i) for i in range(20))
    (tmp_path / "podcast.flv").write_bytes(audio)
    code, (row,) = json_rows(tmp_path / "podcast.flv")
    assert code == 1 and (row["container"], row["status"]) == ("flv", "unreadable")
    assert row["error"].startswith("no video FFmpeg can open in this flv file"), row["error"]
    # An MPEG-PS file's system header bounds its streams: audio 1, video 0 (or 1)
    pack = b"\x00\x00\x01\xba\x44" + bytes(8) + b"\xf8"
    system = b"\x00\x00\x01\xbb\x00\x09\x80\x00\x01\x04"
    assert declares_no_video(pack + system + b"\x20\x7f", "mpeg-ps")
    assert not declares_no_video(pack + system + b"\x21\x7f", "mpeg-ps")
    assert not declares_no_video(pack + system + b"\x20\x7f", "mpg")
    assert not declares_no_video(b"FLV\x01\x05" + bytes(8), "flv")  # audio and video


def test_a_header_whose_frames_do_not_decode_is_unreadable(tmp_path, videos, monkeypatch):
    """The frame data overwritten (not cut): the size is whole, no frame decodes."""
    import torchkit.core.video as video

    data = bytearray(need(videos, "mjpg.avi").read_bytes())
    movi, index = data.find(b"movi") + 4, data.rfind(b"idx1")
    data[movi:index] = bytes(index - movi)  # every frame zeroed, the file as long as it was
    path = tmp_path / "zeroed.avi"
    path.write_bytes(bytes(data))
    info = video.probe_video(path)
    assert (info.status, info.error) == ("unreadable", "no frame decodes (truncated or corrupt)")
    assert video.probe_video(path, decode_check=False).status == "ok"  # headers only


def test_skip_errors_exits_0_with_a_warning(videos, broken):
    result = invoke(need(videos, "mjpg.avi"), broken["text"], "--skip-errors", "--format", "json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert [row["error"] for row in rows] == [None, "not a video file"]
    assert [row["status"] for row in rows] == ["ok", "unreadable"]
    assert "Warning: 1 of 2 videos could not be read: 1 unreadable" in result.stderr


def test_probe_video_never_raises(tmp_path, broken):
    missing = probe_video(tmp_path / "gone.mp4")
    assert missing.error and "cannot read" in missing.error
    assert probe_video(broken["empty"]).error == "empty file"
    assert probe_video(tmp_path).error == "not a regular file (a folder)"  # it said "a device"


def test_a_fifo_or_a_device_named_on_the_command_line_is_a_row_not_a_hang(tmp_path, videos):
    """Before: video-info opened a FIFO it was given and waited for a writer forever. A real
    process, so that a return of the hang fails on the timeout instead of holding the suite."""
    fifo = tmp_path / "camera.mp4"
    os.mkfifo(fifo)
    good = need(videos, "mjpg.avi")
    done = run_torchkit_process(
        "video-info", str(fifo), "/dev/null", str(good), "--format", "json", timeout=60
    )
    assert done.returncode == 1, done.stderr
    rows = {row["path"]: row for row in json.loads(done.stdout)}
    assert rows[str(fifo)]["error"] == "not a regular file (a FIFO)"
    assert rows["/dev/null"]["error"] == "not a regular file (a device)"
    assert [row["status"] for row in rows.values()] == ["unreadable", "unreadable", "ok"]
    assert "Traceback" not in done.stderr


def test_missing_path_and_empty_folder_are_one_line_errors(tmp_path, videos):
    result = invoke(tmp_path / "nope.mp4")
    assert result.exit_code == 1
    assert (
        result.stderr.strip() == f"Error: path not found: {tmp_path / 'nope.mp4'} (check the path)"
    )
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "photo.jpg").write_bytes(b"\xff\xd8")
    result = invoke(tmp_path / "empty")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: no video files in {tmp_path / 'empty'} (looked for ")
    # Beside other videos an empty folder is only a warning.
    result = invoke(tmp_path / "empty", need(videos, "mjpg.avi"))
    assert result.exit_code == 0 and "Warning: no video files in" in result.stderr
    with pytest.raises(InputError):
        find_videos([tmp_path / "nope.mp4"])


def test_a_symbolic_link_loop_named_is_a_row_not_a_path_not_found(tmp_path, videos):
    """A link that leads back to itself (or two that lead to each other) exists, but no file is
    found through it: named on the command line it stopped the run with `path not found` (a
    path that is there), where the same name piped to `-` was a row; it is a row with its
    error, the other videos read, as an unreadable file named is. A dangling link stays `path
    not found`."""
    loop, first, second = tmp_path / "loop.mp4", tmp_path / "a.mp4", tmp_path / "b.mp4"
    loop.symlink_to(loop.name)
    first.symlink_to(second.name)
    second.symlink_to(first.name)
    good = need(videos, "mjpg.avi")
    code, rows = json_rows(loop, first, good)
    assert code == 1 and [row["status"] for row in rows] == ["unreadable", "unreadable", "ok"]
    assert {row["error"] for row in rows[:2]} == {"cannot read: Too many levels of symbolic links"}
    dangling = tmp_path / "gone.mp4"
    dangling.symlink_to("nowhere.mp4")
    assert error_line(invoke(dangling, good).stderr) == (
        f"Error: path not found: {dangling} (check the path)"
    )


def test_output_file_needs_force(tmp_path, videos):
    target = tmp_path / "info.txt"  # a name that picks no format: --format does
    path = need(videos, "mjpg.avi")
    assert invoke(path, "--format", "json", "-o", target).exit_code == 0
    assert json.loads(target.read_text())[0]["frames"] == 17
    result = invoke(path, "-o", target)
    assert result.exit_code == 1 and "already exists" in result.stderr
    assert json.loads(target.read_text())[0]["frames"] == 17  # untouched
    assert invoke(path, "--format", "csv", "-o", target, "--force").exit_code == 0
    assert target.read_text().startswith("path,size_bytes,width,height,frames,")


def test_a_name_that_is_not_utf8_is_read_not_a_crash(tmp_path, videos):
    # OpenCV's binding dies of SIGSEGV on a str it cannot encode: a real process, since the old
    # code took the whole interpreter down with it (stdout as bytes: the name is not UTF-8).
    name = os.fsdecode(b"clip\xff.avi")
    shutil.copy(need(videos, "mjpg.avi"), tmp_path / name)
    frames = tmp_path / "frames"
    args = ["video-info", name, "-k", "2", "--extract-frames", frames, "--format", "json"]
    done = run_torchkit_process(*map(str, args), cwd=tmp_path, text=False)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout.decode("utf-8", "surrogateescape"))[0]
    assert [Path(f).name for f in row["frame_files"]] == sorted(
        f for f in os.listdir(frames) if f.endswith(".png")
    )
    assert (row["path"], row["status"], row["frames"], row["width"]) == (name, "ok", 17, 32)


def test_a_relative_name_like_an_ffmpeg_url_is_read_as_the_file(tmp_path, videos, monkeypatch):
    """`file:x.mp4` named relative to the working folder: FFmpeg read it as its file: URL, so
    the row and the extracted frames were those of x.mp4, another video."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(need(videos, "mpeg4.mp4"), tmp_path / "x.mp4")  # 48x32, 10 frames
    shutil.copy(need(videos, "mjpg.avi"), tmp_path / "file:x.mp4")  # 32x24, 17 frames
    frames = tmp_path / "frames"
    code, rows = json_rows("file:x.mp4", "--segments", "1", "--extract-frames", frames)
    assert code == 0
    assert [(r["width"], r["frames"], r["frame_indices"]) for r in rows] == [(32, 17, [8])]
    capture = cv2.VideoCapture(str(tmp_path / "file:x.mp4"), cv2.CAP_FFMPEG)
    for _ in range(9):
        ok, frame = capture.read()
    assert np.array_equal(cv2.imread(str(frames / "file:x_000008.png")), frame)


# --- truncated copies ---------------------------------------------------------------------------

CUT_FRACTIONS = (0.1, 0.5, 0.9, 0.99)
TRUNCATION_SPECS = [  # (name, fourcc): 40 frames each, long enough to cut anywhere
    ("clip.avi", "MJPG"),
    ("clip.mkv", "FFV1"),
    ("clip.webm", "VP80"),
    ("clip.mov", "mp4v"),
    ("clip.mp4", "mp4v"),
    ("clip.wmv", "WMV2"),  # ASF: cut copies opened and were ok, with no frame count to check
    ("clip.y4m", "I420"),  # Y4M: its header's count is reckoned from the size, cut or not
]


def iso_boxes(data: bytes, start: int, end: int):
    offset = start
    while offset < end:
        size, kind = struct.unpack(">I4s", data[offset : offset + 8])
        yield offset, size, kind
        offset += size


def faststart(data: bytes) -> bytes:
    """An MP4 with its index (moov) moved before the frames, as cameras, ffmpeg -movflags
    +faststart and web downloads have it (OpenCV writes it last): a cut copy of such a file
    still opens, which is what made video-info call it healthy."""
    top = list(iso_boxes(data, 0, len(data)))
    moov_at, moov_size = next((o, s) for o, s, k in top if k == b"moov")
    moov = bytearray(data[moov_at : moov_at + moov_size])

    def shift_chunk_offsets(start: int, end: int) -> None:
        for offset, size, kind in iso_boxes(moov, start, end):
            if kind in (b"trak", b"mdia", b"minf", b"stbl"):
                shift_chunk_offsets(offset + 8, offset + size)
            elif kind in (b"stco", b"co64"):
                width, code = (4, ">I") if kind == b"stco" else (8, ">Q")
                (count,) = struct.unpack(">I", moov[offset + 12 : offset + 16])
                for i in range(count):
                    at = offset + 16 + width * i
                    (value,) = struct.unpack(code, moov[at : at + width])
                    struct.pack_into(code, moov, at, value + moov_size)

    shift_chunk_offsets(8, moov_size)
    head = b"".join(data[o : o + s] for o, s, k in top if k == b"ftyp")
    rest = b"".join(data[o : o + s] for o, s, k in top if k not in (b"ftyp", b"moov"))
    return head + bytes(moov) + rest


@pytest.fixture(scope="module")
def whole_videos(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("whole")
    made = {}
    for name, fourcc in TRUNCATION_SPECS:
        if write_video(root / name, fourcc, 48, 32, 25.0, 40):
            made[name] = root / name
    if "clip.mp4" in made:
        made["faststart.mp4"] = root / "faststart.mp4"
        made["faststart.mp4"].write_bytes(faststart(made["clip.mp4"].read_bytes()))
    return made


def cut_copy(source: Path, folder: Path, fraction: float) -> Path:
    data = source.read_bytes()
    target = folder / f"{source.stem}-{int(fraction * 100)}{source.suffix}"
    target.write_bytes(data[: int(len(data) * fraction)])
    return target


def test_faststart_helper_keeps_every_frame(whole_videos):
    path = need(whole_videos, "faststart.mp4")
    assert path.read_bytes()[4:8] == b"ftyp" and path.read_bytes()[32:36] == b"moov"
    original = cv2.VideoCapture(str(whole_videos["clip.mp4"]), cv2.CAP_FFMPEG)
    moved = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    for _ in range(40):
        (ok, first), (same, second) = original.read(), moved.read()
        assert ok and same and np.array_equal(first, second)
    assert not moved.read()[0]


@pytest.mark.parametrize("name", [spec[0] for spec in TRUNCATION_SPECS] + ["faststart.mp4"])
def test_whole_videos_are_ok_and_their_containers_declare_their_size(whole_videos, name):
    from torchkit.core.video import declared_size

    path = need(whole_videos, name)
    info = probe_video(path)
    assert (info.status, info.error, info.frames) == ("ok", None, 40)
    assert declared_size(path, info.container, path.stat().st_size) == path.stat().st_size
    exact = probe_video(path, exact=True)
    assert (exact.status, exact.frames_decoded) == ("ok", 40)


@pytest.mark.parametrize("fraction", CUT_FRACTIONS)
@pytest.mark.parametrize("name", [spec[0] for spec in TRUNCATION_SPECS] + ["faststart.mp4"])
def test_cut_copies_are_truncated(tmp_path, whole_videos, name, fraction):
    """Cut anywhere (even the last 1%), every format is reported truncated, not healthy, in
    every mode; the container's sizes say so without decoding a frame."""
    cut = cut_copy(need(whole_videos, name), tmp_path, fraction)
    for options in ({}, {"decode_check": False}, {"exact": True}):
        info = probe_video(cut, **options)
        assert info.status == "truncated", (options, info)
        assert info.error.startswith("truncated: the file holds "), options
        declared = int(info.error.split(" of the ")[1].split()[0].replace(",", ""))
        # As far as the sizes reach: the whole file, or (a cut MP4 that lost its index at the
        # end) the end of the frame data.
        assert cut.stat().st_size < declared <= whole_videos[name].stat().st_size


@pytest.mark.parametrize("at", (0.3, 0.6))
@pytest.mark.parametrize("name", [spec[0] for spec in TRUNCATION_SPECS] + ["faststart.mp4"])
def test_copies_missing_bytes_in_their_middle_are_truncated_without_decoding(
    tmp_path, whole_videos, name, at
):
    """A tenth of the bytes cut out of the middle (a transfer that skipped a block): the file
    is shorter than its container's sizes say (an MP4 whose index is last: its index is not
    where its boxes say, so not found), caught from the sizes or the index alone, as a copy
    cut at its end is. (A Y4M file's frames then stop being frames: the bytes after them are
    not judged, its header's count, reckoned from the size, not decoding to its end.)"""
    data = need(whole_videos, name).read_bytes()
    start, length = int(len(data) * at), len(data) // 10
    gapped = tmp_path / f"gapped-{name}"
    gapped.write_bytes(data[:start] + data[start + length :])
    info = probe_video(gapped, decode_check=name == "clip.y4m")
    assert info.status == "truncated", info


@pytest.mark.parametrize("fraction", (0.3, 0.6, 0.9))
@pytest.mark.parametrize("name", ["clip.avi", "clip.mkv", "clip.webm", "faststart.mp4"])
def test_cut_copies_are_truncated_by_decoding_where_sizes_say_nothing(
    tmp_path, whole_videos, monkeypatch, name, fraction
):
    """Formats whose sizes are unknown (a live recording, FLV, Ogg...): the decode check seeks
    to the last frames the header declares; --exact counts short of the header."""
    import torchkit.core.video.probe as probe

    monkeypatch.setattr(probe, "declared_size", lambda *args: None)
    cut = cut_copy(need(whole_videos, name), tmp_path, fraction)
    info = probe_video(cut)
    exact = probe_video(cut, exact=True)
    assert info.status == exact.status == "truncated"
    message = f"truncated: {exact.frames_decoded} of the 40 frames its header declares decode"
    assert info.error == exact.error == message
    assert probe_video(cut, decode_check=False).status == "ok"  # headers only: nothing to see
    assert probe_video(need(whole_videos, name)).status == "ok"


def test_mpeg_ps_copies_cut_inside_a_pack_are_truncated(tmp_path):
    """MPEG-PS (.mpg, .vob): FFmpeg reckons the header's frame count from what the file holds,
    so a cut copy read `ok` in every mode; the packs and packets carry their lengths."""
    whole = tmp_path / "clip.mpg"
    if not write_video(whole, "MPG2", 48, 32, 25.0, 40):
        pytest.skip("this OpenCV build cannot write MPEG-PS")
    data = whole.read_bytes()
    assert data[:4] == b"\x00\x00\x01\xba" and len(data) > 8 * 2048
    for options in ({}, {"exact": True}):
        assert probe_video(whole, **options).status == "ok", options
    for packs in (1, 4, 8):  # FFmpeg's packs are 2,048 bytes: a cut inside one
        cut = tmp_path / f"cut-{packs}.mpg"
        cut.write_bytes(data[: packs * 2048 + 700])
        for options in ({}, {"decode_check": False}, {"exact": True}):
            info = probe_video(cut, **options)
            assert info.status == "truncated", (packs, options, info)
            assert info.error.startswith(f"truncated: the file holds {packs * 2048 + 700:,} of ")


def test_raw_mpeg2_video_cut_inside_a_picture_is_truncated(tmp_path):
    """A raw MPEG-2 stream (.m2v) records neither sizes nor a frame count (its header gives
    none), so a cut copy read `ok` with --exact too; its last picture's slices, one per row of
    macroblocks, stop short of the picture's last row."""
    whole = tmp_path / "clip.m2v"
    if not write_video(whole, "MPG2", 48, 32, 25.0, 40):  # 2 rows of macroblocks
        pytest.skip("this OpenCV build cannot write raw MPEG-2 video")
    data = whole.read_bytes()
    for options in ({}, {"exact": True}):
        assert probe_video(whole, **options).status == "ok", options
    pictures = [at for at in range(len(data) - 4) if data[at : at + 4] == b"\x00\x00\x01\x00"]
    for picture in pictures[5::10]:  # cut inside the first row of a picture
        first_slice = data.index(b"\x00\x00\x01\x01", picture)
        cut = tmp_path / "cut.m2v"
        cut.write_bytes(data[: first_slice + 10])
        for options in ({}, {"decode_check": False}, {"exact": True}):
            info = probe_video(cut, **options)
            assert (info.status, info.error) == (
                "truncated",
                "truncated: its last picture stops at macroblock row 1 of 2",
            ), options


def test_last_picture_rows_of_hand_made_mpeg2_streams(tmp_path):
    from torchkit.core.video.raw import last_picture_rows

    def rows(data: bytes) -> tuple[int, int] | None:
        path = tmp_path / "file.m2v"
        path.write_bytes(data)
        return last_picture_rows(path, len(data))

    start = lambda code: b"\x00\x00\x01" + bytes([code])  # noqa: E731
    sequence = start(0xB3) + bytes.fromhex("0300f013ffffe008")  # 48 x 240
    progressive = start(0xB5) + bytes.fromhex("148a00010000")
    interlaced = start(0xB5) + bytes.fromhex("148200010000")
    picture = lambda structure, last: (  # noqa: E731
        start(0x00)
        + bytes(4)
        + start(0xB5)
        + bytes([0x8F, 0xFF, 0xF0 | structure, 0x80, 0x80])
        + b"".join(start(row) + b"\x55" * 4 for row in range(1, last + 1))
    )
    assert rows(sequence + progressive + picture(3, 15) + picture(3, 15)) == (15, 15)
    assert rows(sequence + progressive + picture(3, 15) + picture(3, 7)) == (7, 15)
    assert rows(sequence + interlaced + picture(3, 16) + picture(3, 9)) == (9, 16)
    assert rows(sequence + progressive + picture(3, 15) + picture(1, 7)) is None  # a field
    assert rows(sequence + progressive + picture(3, 7) + start(0xB7)) is None  # the end code
    assert rows(sequence + picture(3, 7)) is None  # MPEG-1: a slice may span rows
    assert rows(sequence + progressive + b"\x55" * 40) is None  # no picture


def ebml_size(data: bytes, at: int) -> tuple[int, int]:
    """An EBML element size at `at`: (value, its length in bytes)."""
    length = 9 - data[at].bit_length()
    value = int.from_bytes(data[at : at + length], "big") & ((1 << (7 * length)) - 1)
    return value, length


def variable_rate_live_mkv(data: bytes, slow_from: int) -> bytes:
    """The Matroska file `data` (25 fps) as a variable-rate live recording: its frames from
    `slow_from` on 80 ms apart instead of 40, its Duration the new length and its Segment size
    unknown (as a recording that could not go back writes it): no size says it is whole, and
    its header count (duration x 25 fps) is more than it holds."""
    out = bytearray(data)
    frame = last = 0
    cluster = out.find(bytes.fromhex("1f43b675"))
    while cluster >= 0:
        size, length = ebml_size(out, cluster + 4)
        at, end, cluster_time = cluster + 4 + length, cluster + 4 + length + size, 0
        while at < end:
            id_length = 9 - out[at].bit_length()
            element = int.from_bytes(out[at : at + id_length], "big")
            size, length = ebml_size(out, at + id_length)
            body = at + id_length + length
            if element == 0xE7:  # the cluster's Timecode
                cluster_time = int.from_bytes(out[body : body + size], "big")
            elif element == 0xA3:  # a SimpleBlock: track number, then its int16 time
                track = ebml_size(out, body)[1]
                last = (
                    40 * frame if frame < slow_from else 40 * slow_from + 80 * (frame - slow_from)
                )
                struct.pack_into(">h", out, body + track, last - cluster_time)
                frame += 1
            at = body + size
        cluster = out.find(bytes.fromhex("1f43b675"), end)
    duration = out.find(bytes.fromhex("448988"))  # Duration, an 8-byte float in ms
    struct.pack_into(">d", out, duration + 3, last + 80.0)
    # and the video track's DURATION tag (TagString, FFmpeg's HH:MM:SS.nnnnnnnnn) to match
    tag = out.find(bytes.fromhex("4487"), out.find(b"DURATION")) + 3
    seconds = (last + 80) / 1000
    text = f"{int(seconds // 3600):02d}:{int(seconds % 3600 // 60):02d}:{seconds % 60:012.9f}"
    assert len(text) == 18 and out[tag + 2 : tag + 3] == b":"
    out[tag : tag + 18] = text.encode()
    segment = out.find(bytes.fromhex("18538067"))
    out[segment + 4 : segment + 12] = bytes.fromhex("01ffffffffffffff")
    return bytes(out)


def longer_than_its_video_mkv(data: bytes, tags_last: bool = False) -> bytes:
    """The Matroska file `data` (FFmpeg's: 1.6 s of video) with a Duration of 16 s, as beside a
    longer audio stream: FFmpeg gives the video that duration. Its video track's DURATION tag
    still says 1.6 s; `tags_last`: its Tags moved after the clusters (a Void where they were,
    the SeekHead pointing at them), as mkvmerge writes them."""
    out = bytearray(data)
    duration = out.find(bytes.fromhex("448988"))  # Duration, an 8-byte float in ms
    struct.pack_into(">d", out, duration + 3, 10 * struct.unpack_from(">d", out, duration + 3)[0])
    if not tags_last:
        return bytes(out)
    tags_id = bytes.fromhex("1254c367")
    tags = out.find(tags_id, out.find(tags_id) + 4)  # the first is the SeekHead's entry
    size, length = ebml_size(out, tags + 4)
    element = bytes(out[tags : tags + 4 + length + size])
    void = b"\xec\x01" + (len(element) - 9).to_bytes(7, "big")  # a Void of the same length
    out[tags : tags + len(element)] = void + bytes(len(element) - 9)
    segment = out.find(bytes.fromhex("18538067"))
    segment_data = segment + 4 + ebml_size(out, segment + 4)[1]
    seek = out.find(bytes.fromhex("53ab84") + tags_id) + 7  # then SeekPosition: 53ac, size
    assert out[seek : seek + 2] == bytes.fromhex("53ac")
    width = ebml_size(out, seek + 2)[0]
    out[seek + 3 : seek + 3 + width] = (len(out) - segment_data).to_bytes(width, "big")
    return bytes(out) + element  # the Segment's size runs to the file's end: unchanged


@pytest.mark.parametrize("tags_last", [False, True], ids=["tags-first", "tags-last"])
def test_an_mkv_whose_video_is_shorter_than_the_file_counts_the_video_s_frames(tmp_path, tags_last):
    """FFmpeg gives a Matroska video the file's duration (its longest stream's: 40 frames
    beside 16 s of audio), and OpenCV's count is that duration times the rate: the row read 400
    frames and 16 s, and --segments sampled frames past the video's end (row ok, exit 0). The
    video track's own DURATION tag counts it: 40."""
    path = tmp_path / "with-audio.mkv"
    if not write_video(path, "FFV1", 16, 16, 25.0, 40):  # small: SeekPositions of 2 bytes
        pytest.skip("this OpenCV build cannot write FFV1")
    path.write_bytes(longer_than_its_video_mkv(path.read_bytes(), tags_last))
    info = probe_video(path)
    assert (info.status, info.frames_header, info.duration_s) == ("ok", 40, 1.6)
    code, (row,) = json_rows(path, "--segments", "4")
    assert code == 0 and row["frame_indices"] == [5, 15, 25, 35]


def longer_audio_flv(data: bytes, seconds: float) -> bytes:
    """The FLV file `data` (OpenCV's: video alone) with audio from where its video ends up to
    `seconds`, its duration (onMetaData) that long: a whole file whose audio runs on."""
    out = bytearray(data)
    out[4] = 0x05  # the header's flags: audio and video
    at = out.find(b"duration\x00") + 9  # an AMF number: a big-endian double
    start = int(struct.unpack_from(">d", out, at)[0] * 1000)
    struct.pack_into(">d", out, at, seconds)
    for ms in range(start, int(seconds * 1000), 40):
        body = b"\x30" + bytes(220)  # PCM, 5.5 kHz, 8-bit mono: 40 ms
        time = (ms & 0xFFFFFF).to_bytes(3, "big") + bytes([ms >> 24])
        tag = b"\x08" + len(body).to_bytes(3, "big") + time + bytes(3) + body
        out += tag + struct.pack(">I", len(tag))  # each tag followed by its size
    return bytes(out)


def test_a_whole_flv_whose_audio_runs_on_after_its_video_is_not_truncated(tmp_path):
    """FLV records no sizes, so a count short of its header's (duration x fps) meant a cut:
    1.6 s of video beside 4 s of audio read `truncated: 40 of the 100 frames its header
    declares decode` (exit 1). Its last tag, of any stream, reaches the duration: the file is
    whole, its row the 40 frames decoded. A copy cut short is still truncated."""
    path = tmp_path / "talk.flv"
    if not write_video(path, "FLV1", 48, 32, 25.0, 40):
        pytest.skip("this OpenCV build cannot write FLV")
    path.write_bytes(longer_audio_flv(path.read_bytes(), 4.0))
    for options in ({}, {"exact": True}):
        info = probe_video(path, **options)
        assert (info.status, info.frames, info.frames_header) == ("ok", 40, 100), options
        assert (info.frames_source, info.duration_s) == ("decoded", 1.6), options
    cut = cut_copy(path, tmp_path, 0.7)
    for options in ({}, {"exact": True}):
        assert probe_video(cut, **options).status == "truncated", options


def mpeg_pts(b: bytes) -> int:
    """A PES packet's 33-bit PTS from its 5 bytes."""
    return (b[0] >> 1 & 7) << 30 | b[1] << 22 | (b[2] >> 1) << 15 | b[3] << 7 | b[4] >> 1


def longer_audio_mpg(data: bytes, seconds: float) -> bytes:
    """OpenCV's MPEG-1 program stream `data` (video alone) with an audio stream's packets
    (stream 0xC0, a PTS each, empty frames) every 40 ms from its first frame's time up to
    `seconds`: a whole file whose audio runs on after its video."""
    video = data.find(b"\x00\x00\x01\xe0")  # MPEG-1 PES: the length, then PTS (and DTS)
    first = mpeg_pts(data[video + 6 : video + 11])
    out = bytearray(data)
    for ms in range(0, int(seconds * 1000), 40):
        body = pts_field(first + 90 * ms) + bytes(200)
        out += data[:12] + b"\x00\x00\x01\xc0" + struct.pack(">H", len(body)) + body  # a pack
    return bytes(out)


def pts_field(pts: int) -> bytes:
    """A PES packet's 5 PTS bytes (prefix 0010, marker bits set) for a 33-bit `pts`."""
    field = bytes(
        [0x21 | (pts >> 29 & 0x0E), pts >> 22 & 0xFF, 0x01 | (pts >> 14 & 0xFE)]
        + [pts >> 7 & 0xFF, 0x01 | (pts << 1 & 0xFE)]
    )
    assert mpeg_pts(field) == pts
    return field


def mpeg_crc32(data: bytes) -> int:
    """The CRC-32 that ends an MPEG-TS table section (polynomial 0x04C11DB7, not reflected)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = (crc << 1 ^ 0x04C11DB7 if crc & 0x80000000 else crc << 1) & 0xFFFFFFFF
    return crc


def longer_audio_ts(data: bytes, seconds: float) -> bytes:
    """OpenCV's MPEG-TS `data` (video alone) with an MPEG audio stream (PID 0x101) added to
    its program map and its packets (a PTS each, empty frames) every 40 ms from its first
    frame's time up to `seconds`: a whole file whose audio runs on after its video."""
    packets = [bytearray(data[at : at + 188]) for at in range(0, len(data), 188)]

    def pid(packet: bytearray) -> int:
        return (packet[1] & 0x1F) << 8 | packet[2]

    pat = next(packet for packet in packets if pid(packet) == 0)
    pmt_pid = (pat[15] & 0x1F) << 8 | pat[16]  # the first program's map
    video_pid = None
    for packet in (packet for packet in packets if pid(packet) == pmt_pid):
        length = (packet[6] & 0x0F) << 8 | packet[7]  # the section's, from after this field
        section = bytes(packet[5 : 8 + length - 4])  # without its CRC
        video_pid = (section[13] & 0x1F) << 8 | section[14]  # its one stream, the video
        section += b"\x03\xe1\x01\xf0\x00"  # MPEG audio on PID 0x101, no descriptors
        section = section[:1] + (0xB000 | length + 5).to_bytes(2, "big") + section[3:]
        section += mpeg_crc32(section).to_bytes(4, "big")
        packet[5:] = (section + b"\xff" * 188)[:183]
    first = next(p for p in packets if pid(p) == video_pid and p[1] & 0x40)  # a PES starts
    at = first.find(b"\x00\x00\x01\xe0") + 9  # after the PES header's flags and length
    start = mpeg_pts(first[at : at + 5])
    out = b"".join(packets)
    for count, ms in enumerate(range(0, int(seconds * 1000), 40)):
        pes = b"\x00\x00\x01\xc0\x00\xb2\x80\x80\x05" + pts_field(start + 90 * ms) + bytes(170)
        out += bytes([0x47, 0x41, 0x01, 0x10 | count % 16]) + pes  # a PES starts, payload only
    return out


def longer_play_asf(data: bytes, seconds: float) -> bytes:
    """The ASF file `data` (OpenCV's WMV: video alone) whose File Properties give the play
    and send durations of `seconds` of media, as they do beside audio that runs on: FFmpeg
    reads the file's duration there, of all its streams."""
    out = bytearray(data)
    at = out.find(bytes.fromhex("a1dcab8c47a9cf118ee400c00c205365"))  # File Properties
    preroll_ms = struct.unpack_from("<Q", out, at + 80)[0]
    struct.pack_into("<QQ", out, at + 64, *[int((seconds * 1000 + preroll_ms) * 10_000)] * 2)
    return bytes(out)


def untagged_longer_than_its_video_mkv(data: bytes) -> bytes:
    """`longer_than_its_video_mkv` without its DURATION tags (renamed), as a muxer writes
    the file that records no track statistics: nothing of the video's own length."""
    out = longer_than_its_video_mkv(data)
    assert out.count(b"DURATION") >= 1
    return out.replace(b"DURATION", b"DURATIOX")


# (name, fourcc, the whole file beside audio that runs on to 4 s or so)
LONGER_AUDIO_SPECS = [
    ("talk.ts", "mp4v", lambda data: longer_audio_ts(data, 4.0)),
    ("talk.wmv", "WMV2", lambda data: longer_play_asf(data, 4.0)),
    ("talk.mpg", "MPG2", lambda data: longer_audio_mpg(data, 4.0) + b"\x00\x00\x01\xb9"),
    ("talk.mkv", "FFV1", untagged_longer_than_its_video_mkv),
]


@pytest.mark.parametrize(
    "name, fourcc, longer", LONGER_AUDIO_SPECS, ids=[s[0] for s in LONGER_AUDIO_SPECS]
)
def test_a_whole_file_sized_whole_whose_audio_runs_on_counts_its_video_s_frames(
    tmp_path, name, fourcc, longer
):
    """MPEG-TS, ASF, an MPEG-PS file ending in its end code and an MKV without track tags
    record their sizes, which said the file is whole, so the header count was taken as it
    is: FFmpeg's, the file's duration (its longest stream's) times the rate, 99 frames for 40
    of video beside 4 s of audio (row ok, exit 0; --exact counted 40). The last frames the
    header declares are sought as where no size is recorded; missing from a file sized whole,
    they are audio that runs on: the row gives the frames decoded, as --exact does."""
    path = tmp_path / name
    if not write_video(path, fourcc, 16, 16, 25.0, 40):
        pytest.skip(f"this OpenCV build cannot write {name}")
    path.write_bytes(longer(path.read_bytes()))
    for options in ({}, {"exact": True}):
        info = probe_video(path, **options)
        assert (info.status, info.frames, info.frames_source) == ("ok", 40, "decoded"), options
        assert info.frames_header >= 99 and info.duration_s == 1.6, options


def test_a_whole_mpeg_ps_whose_audio_runs_on_after_its_video_is_not_truncated(tmp_path):
    """FFmpeg reckons an MPEG-PS file's duration from the timestamps at its end, of any
    stream: 1.6 s of video beside 4 s of audio read `truncated: 40 of the 99 frames its header
    declares decode` (exit 1), which a cut never gives (it ends every stream, and the
    duration with them). The file is whole, its row the 40 frames decoded."""
    path = tmp_path / "talk.mpg"
    if not write_video(path, "MPG2", 48, 32, 25.0, 40):
        pytest.skip("this OpenCV build cannot write MPEG-PS")
    data = path.read_bytes()
    if data[:4] != b"\x00\x00\x01\xba" or data[4] >> 4 != 0b0010:
        pytest.skip("not the MPEG-1 program stream this test extends")
    path.write_bytes(longer_audio_mpg(data, 4.0))
    for options in ({}, {"exact": True}):
        info = probe_video(path, **options)
        assert (info.status, info.frames, info.frames_header) == ("ok", 40, 99), options
        assert (info.frames_source, info.duration_s) == ("decoded", 1.6), options


def flv_tag_ends(data: bytes) -> list[int]:
    """Where each tag of the FLV file `data` ends, with the 4-byte size that follows it."""
    ends, at = [], int.from_bytes(data[5:9], "big") + 4
    while at < len(data):
        at += 11 + int.from_bytes(data[at + 1 : at + 4], "big") + 4
        ends.append(at)
    return ends


def test_a_long_flv_cut_short_is_truncated_without_exact(tmp_path):
    """The decode check seeks 4 frames before the header's last and reads on; FFmpeg lets a
    seek past the video's end succeed, and the seek's target was counted as reached: within a
    header of 400 frames or more's slack (1%), so a 600-frame FLV cut in half read `ok`, 600
    frames (exit 0; --exact: truncated). A seek is counted only where a frame decodes after it.
    The copy is cut between two tags, where the tags' sizes say nothing, and its metadata
    records no file size (as a live stream's recording: that size is a cut's evidence too)."""
    path = tmp_path / "long.flv"
    if not write_video(path, "FLV1", 16, 16, 25.0, 600):
        pytest.skip("this OpenCV build cannot write FLV")
    assert probe_video(path).status == "ok"
    data = path.read_bytes().replace(b"\x08filesize", b"\x08filesizx", 1)
    half = min(flv_tag_ends(data), key=lambda end: abs(end - len(data) // 2))
    (tmp_path / "long-cut.flv").write_bytes(data[:half])
    cut = probe_video(tmp_path / "long-cut.flv")
    assert cut.status == "truncated" and "of the 600 frames its header declares" in cut.error


def test_an_flv_cut_inside_its_last_frame_is_truncated(tmp_path):
    """An FLV copy cut inside its last video tag read `ok` (exit 0) with and without --exact:
    FFmpeg still decodes a frame from what is left of that tag, so every frame the header
    declares decodes. Each tag records its size: the file holds fewer bytes than they declare."""
    path = tmp_path / "clip.flv"
    if not write_video(path, "FLV1", 48, 32, 25.0, 10):
        pytest.skip("this OpenCV build cannot write FLV")
    data = path.read_bytes()
    ends = flv_tag_ends(data)
    assert ends[-1] == len(data) and probe_video(path).status == "ok"
    cut = tmp_path / "cut.flv"
    cut.write_bytes(data[: (ends[-2] + ends[-1]) // 2])
    message = (
        f"truncated: the file holds {cut.stat().st_size:,} of the {len(data):,} bytes its flv "
        "structure declares"
    )
    for options in ({}, {"exact": True}, {"decode_check": False}):
        info = probe_video(cut, **options)
        assert (info.status, info.error) == ("truncated", message), options
    for tail in (bytes(3), b"\x09 trailing bytes"):  # after the last tag: not a tag
        (tmp_path / "tail.flv").write_bytes(data + tail)
        assert probe_video(tmp_path / "tail.flv").status == "ok", tail


def test_a_whole_variable_rate_file_without_sizes_is_ok_and_its_cut_copy_truncated(
    tmp_path, whole_videos
):
    """Where no size says a file is whole, its header count is the duration times the frame
    rate, which a variable-rate video does not reach: it was called truncated (and by --exact
    too) though every frame is there. Its last frame's time reaches the end; a cut copy's
    does not."""
    whole = tmp_path / "recording.mkv"
    whole.write_bytes(variable_rate_live_mkv(need(whole_videos, "clip.mkv").read_bytes(), 20))
    for options in ({}, {"exact": True}):
        info = probe_video(whole, **options)
        assert (info.status, info.error, info.frames_header) == ("ok", None, 60), options
    assert probe_video(whole, exact=True).frames_decoded == 40
    cut = cut_copy(whole, tmp_path, 0.8)
    for options in ({}, {"exact": True}):
        info = probe_video(cut, **options)
        assert info.status == "truncated", options
        assert info.error.endswith("of the 60 frames its header declares decode"), options


def test_exact_durations_of_a_variable_rate_video_run_to_its_last_frame(tmp_path, whole_videos):
    """40 frames, 20 at 40 ms then 20 at 80 ms, at a stated 25 fps: --exact gave 40 / 25 = 1.6 s
    for a video 2.4 s long (its header: 2.4 s); the last frame starts at 2.32 s and lasts a
    frame at the stated rate. A constant rate keeps frames / fps to the last digit."""
    whole = tmp_path / "recording.mkv"
    whole.write_bytes(variable_rate_live_mkv(need(whole_videos, "clip.mkv").read_bytes(), 20))
    assert probe_video(whole).duration_s == pytest.approx(2.4)
    assert probe_video(whole, exact=True).duration_s == pytest.approx(2.36)
    steady = probe_video(need(whole_videos, "clip.mkv"), exact=True)
    assert (steady.frames, steady.fps, steady.duration_s) == (40, 25.0, 40 / 25.0)


def _iso_box(data: bytes, kind: bytes, parent: tuple[int, int] | None) -> tuple[int, int]:
    """(start, end) of the first box `kind` in the box `parent` (start, end), or in the file."""
    at, end = (0, len(data)) if parent is None else (parent[0] + 8, parent[1])
    while at + 8 <= end:
        size, found = struct.unpack(">I4s", data[at : at + 8])
        if found == kind:
            return at, at + size
        at += size
    raise AssertionError(f"no {kind} box")


def _mp4_track_and_timescales(data: bytes) -> tuple[tuple[int, int], tuple[int, int], int, int]:
    """The `moov` and first `trak` boxes of an OpenCV MP4 (version-0 boxes), and its media's
    and movie's timescales (ticks a second)."""
    moov = _iso_box(data, b"moov", None)
    trak = _iso_box(data, b"trak", moov)
    media = struct.unpack_from(
        ">I", data, _iso_box(data, b"mdhd", _iso_box(data, b"mdia", trak))[0] + 20
    )[0]
    movie = struct.unpack_from(">I", data, _iso_box(data, b"mvhd", moov)[0] + 20)[0]
    return moov, trak, media, movie


def _retime_mp4(
    data: bytearray, numerator: int, denominator: int, runs: Callable[[int], list[tuple[int, int]]]
) -> None:
    """An OpenCV MP4 (version-0 boxes, moov last) made to last numerator / denominator seconds
    (movie, media, track and edit durations) with sample times `runs(media timescale)`: the stts
    box's (count, delta) runs."""

    def get(at: int) -> int:
        return struct.unpack_from(">I", data, at)[0]

    moov = _iso_box(data, b"moov", None)
    trak = _iso_box(data, b"trak", moov)
    mdia = _iso_box(data, b"mdia", trak)
    minf = _iso_box(data, b"minf", mdia)
    stbl = _iso_box(data, b"stbl", minf)
    mvhd, mdhd = _iso_box(data, b"mvhd", moov)[0] + 8, _iso_box(data, b"mdhd", mdia)[0] + 8
    movie, media = get(mvhd + 12), get(mdhd + 12)  # the timescales
    elst = _iso_box(data, b"elst", _iso_box(data, b"edts", trak))[0] + 8
    header = _iso_box(data, b"tkhd", trak)[0] + 28  # its duration (version 0)
    for at, scale in ((mvhd + 16, movie), (mdhd + 16, media), (elst + 8, movie), (header, movie)):
        struct.pack_into(">I", data, at, scale * numerator // denominator)
    entries = runs(media)
    flat = [number for run in entries for number in run]
    times = struct.pack(f">I4sII{len(flat)}I", 16 + 4 * len(flat), b"stts", 0, len(entries), *flat)
    stts = _iso_box(data, b"stts", stbl)
    grow = len(times) - (stts[1] - stts[0])
    data[stts[0] : stts[1]] = times
    for box in (moov, trak, mdia, minf, stbl):
        struct.pack_into(">I", data, box[0], get(box[0]) + grow)


def sparse_mp4(path: Path) -> bool:
    """3 frames 600 s apart, the last lasting 1/25 s (ffprobe: 1200.04 s): an OpenCV MP4 whose
    sample times (stts), durations and edit list are rewritten."""
    if not write_video(path, "mp4v", 16, 16, 25, 3):
        return False
    data = bytearray(path.read_bytes())
    _retime_mp4(data, 120004, 100, lambda media: [(2, 600 * media), (1, media // 25)])
    path.write_bytes(bytes(data))
    return True


def test_a_rotated_video_reads_as_displayed_and_its_frames_are_upright(tmp_path):
    """A phone's upright video is stored wide, with a display matrix (tkhd) that turns it a
    quarter: width and height are the displayed ones (OpenCV turns its frames as FFmpeg's
    players do), and --extract-frames writes the frames turned, as the row describes them."""
    path = tmp_path / "phone.mp4"
    if not write_video(path, "mp4v", 48, 32, 25, 3):
        pytest.skip("this OpenCV cannot write mp4v")
    data = bytearray(path.read_bytes())
    header = _iso_box(data, b"tkhd", _iso_box(data, b"trak", _iso_box(data, b"moov", None)))
    # version-0 tkhd: the matrix 40 bytes into its data, 16.16 fixed point (2.30 for w)
    struct.pack_into(
        ">9i", data, header[0] + 8 + 40, 0, 1 << 16, 0, -(1 << 16), 0, 0, 0, 0, 1 << 30
    )
    path.write_bytes(bytes(data))
    code, (row,) = json_rows(path, "--segments", "1", "--extract-frames", tmp_path / "frames")
    assert code == 0 and (row["width"], row["height"]) == (32, 48)
    assert cv2.imread(row["frame_files"][0]).shape == (48, 32, 3)


def assert_frame_1_extracted_as_displayed(path: Path, frames: Path, displayed) -> None:
    """`--segments 1 --extract-frames` of `path` writes frame 1 as `displayed` (a function of
    the frame as stored, OpenCV's turning off) shows it, and its row gives that size."""
    code, (row,) = json_rows(path, "--segments", "1", "--extract-frames", frames)
    assert code == 0 and row["frame_indices"] == [1]
    stored = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)  # frame 1 as stored, not turned
    if hasattr(cv2, "CAP_PROP_ORIENTATION_AUTO"):
        stored.set(cv2.CAP_PROP_ORIENTATION_AUTO, 0)
    stored.grab()
    expected = np.ascontiguousarray(displayed(stored.read()[1]))
    stored.release()
    assert (row["width"], row["height"]) == (expected.shape[1], expected.shape[0])
    assert np.array_equal(cv2.imread(row["frame_files"][0]), expected)


@pytest.mark.parametrize(
    ("matrix", "displayed"),
    [
        ((-1, 0, 0, 1), lambda stored: stored[:, ::-1]),  # QuickTime's Flip Horizontal
        ((1, 0, 0, -1), lambda stored: stored[::-1]),  # its Flip Vertical
        ((0, 1, 1, 0), lambda stored: stored.transpose(1, 0, 2)),  # a quarter turn, mirrored
    ],
)
def test_a_mirroring_display_matrix_mirrors_the_extracted_frames(tmp_path, matrix, displayed):
    """OpenCV turns a video's frames by its display matrix's angle alone: QuickTime's Flip
    Horizontal (x -> -x, an angle of 180) gave --extract-frames upside-down frames, its Flip
    Vertical frames not flipped at all, where FFmpeg's players show them mirrored. They are
    written as displayed."""
    path = tmp_path / "flipped.mov"
    if not write_video(path, "mp4v", 48, 32, 25, 3):
        pytest.skip("this OpenCV cannot write mp4v")
    data = bytearray(path.read_bytes())
    header = _iso_box(data, b"tkhd", _iso_box(data, b"trak", _iso_box(data, b"moov", None)))
    a, b, c, d = (v << 16 for v in matrix)
    struct.pack_into(">9i", data, header[0] + 8 + 40, a, b, 0, c, d, 0, 0, 0, 1 << 30)
    path.write_bytes(bytes(data))
    assert_frame_1_extracted_as_displayed(path, tmp_path / "frames", displayed)


def ebml_elements(data: bytes, start: int, end: int):
    """(ID, where the element starts, where its data starts, where it ends) of each EBML
    element in `data[start:end]`."""
    while start < end:
        id_length = 9 - data[start].bit_length()
        size, length = ebml_size(data, start + id_length)
        body = start + id_length + length
        yield int.from_bytes(data[start : start + id_length], "big"), start, body, body + size
        start = body + size


def ebml_child(data: bytes, element_id: int, start: int, end: int) -> tuple[int, int, int]:
    """(where it starts, its data starts, it ends) of the first `element_id` in data[start:end]."""
    return next(e[1:] for e in ebml_elements(data, start, end) if e[0] == element_id)


def projected_mkv(data: bytes, yaw: float, roll: float) -> bytes:
    """FFmpeg's Matroska file `data` with a Projection in its video track: rectangular (the
    default type), ProjectionPoseYaw `yaw` and ProjectionPoseRoll `roll` (degrees; a yaw of
    180 mirrors the picture left to right, the roll then turns it counter-clockwise). The
    Void FFmpeg leaves after its SeekHead gives up the bytes, so the clusters stay where
    the SeekHead and Cues say; the CRC-32s of the elements changed are made anew."""
    out = bytearray(data)
    poses = b"\x76\x73\x84" + struct.pack(">f", yaw) + b"\x76\x75\x84" + struct.pack(">f", roll)
    projection = b"\x76\x70" + bytes([0x80 | len(poses)]) + poses
    grow = len(projection)
    _, segment, segment_end = ebml_child(out, 0x18538067, 0, len(out))
    tracks = ebml_child(out, 0x1654AE6B, segment, segment_end)
    entry = ebml_child(out, 0xAE, tracks[1], tracks[2])
    video = ebml_child(out, 0xE0, entry[1], entry[2])
    void = ebml_child(out, 0xEC, segment, segment_end)
    assert void[2] < tracks[0] and void[2] - void[1] > grow  # FFmpeg's: before Info and Tracks

    def add_to_size(at: int, added: int) -> None:
        id_length = 9 - out[at].bit_length()
        size, length = ebml_size(out, at + id_length)
        width = at + id_length
        out[width : width + length] = ((size + added) | 1 << 7 * length).to_bytes(length, "big")

    out[video[2] : video[2]] = projection  # after the rest of Video: no start moves
    for start in (video[0], entry[0], tracks[0]):
        add_to_size(start, grow)
    add_to_size(void[0], -grow)
    del out[void[2] - grow : void[2]]
    seek_head = ebml_child(out, 0x114D9B74, segment, segment_end)
    for element_id, _, start, end in ebml_elements(out, seek_head[1], seek_head[2]):
        if element_id != 0x4DBB:  # Seek: SeekID, SeekPosition
            continue
        sought = ebml_child(out, 0x53AB, start, end)
        position = ebml_child(out, 0x53AC, start, end)
        if out[sought[1] : sought[2]] in (bytes.fromhex("1549a966"), bytes.fromhex("1654ae6b")):
            moved = int.from_bytes(out[position[1] : position[2]], "big") - grow
            out[position[1] : position[2]] = moved.to_bytes(position[2] - position[1], "big")
    for element_id in (0x114D9B74, 0x1654AE6B):  # their CRC-32 (ID BF) is their first child
        _, start, end = ebml_child(out, element_id, segment, segment_end)
        _, crc, crc_end = ebml_child(out, 0xBF, start, end)
        out[crc:crc_end] = struct.pack("<I", zlib.crc32(out[crc_end:end]))
    return bytes(out)


def skip_unless_ffmpeg_reads_a_projection(path: Path, data: bytes) -> None:
    """Skip where OpenCV's FFmpeg does not read a Projection (or the file `projected_mkv`
    makes of `data`: the FFmpeg of the lowest OpenCV refuses it), by a quarter turn written at
    `path`."""
    path.write_bytes(projected_mkv(data, 0.0, 90.0))
    turned = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    read = turned.get(getattr(cv2, "CAP_PROP_ORIENTATION_META", -1))
    turned.release()
    if not read:
        pytest.skip("this OpenCV's FFmpeg does not read a Matroska Projection")


@pytest.mark.parametrize(
    ("yaw", "roll", "displayed"),
    [
        (180.0, 0.0, lambda stored: stored[:, ::-1]),  # mirrored left to right
        (-180.0, 90.0, lambda stored: stored.transpose(1, 0, 2)),  # then a quarter turn
        (180.0, 180.0, lambda stored: stored[::-1]),  # then a half turn: upside down
        (0.0, 90.0, lambda stored: np.rot90(stored)),  # a turn alone, not mirrored
    ],
)
def test_a_mirroring_matroska_projection_mirrors_the_extracted_frames(
    tmp_path, yaw, roll, displayed
):
    """A Matroska video track's ProjectionPoseYaw of 180 mirrors it (the specification), and
    FFmpeg makes it a mirroring display matrix, which OpenCV turns the frames by the angle of:
    --extract-frames wrote a left-to-right mirrored clip upside down, and one mirrored and
    turned by a half turn not mirrored at all, as an MP4's display matrix did. They are
    written as displayed."""
    path = tmp_path / "mirrored.mkv"
    if not write_video(path, "FFV1", 48, 32, 25, 3):
        pytest.skip("this OpenCV build cannot write FFV1")
    data = path.read_bytes()
    skip_unless_ffmpeg_reads_a_projection(path, data)
    path.write_bytes(projected_mkv(data, yaw, roll))
    assert_frame_1_extracted_as_displayed(path, tmp_path / "frames", displayed)


def test_a_mirroring_matroska_projection_of_an_infinite_roll_is_written_as_opencv_gives_it(
    tmp_path,
):
    """A ProjectionPoseRoll of infinity (a float element can hold one): FFmpeg's display
    matrix of it holds no angle (its cosine and sine are NaN), and --extract-frames made the
    row of a readable video 'unreadable: cannot convert float infinity to integer' (exit 1).
    Its frames are written as OpenCV gives them."""
    path = tmp_path / "infinite.mkv"
    if not write_video(path, "FFV1", 48, 32, 25, 3):
        pytest.skip("this OpenCV build cannot write FFV1")
    data = path.read_bytes()
    skip_unless_ffmpeg_reads_a_projection(path, data)
    path.write_bytes(projected_mkv(data, 180.0, float("inf")))
    code, (row,) = json_rows(path, "--segments", "1", "--extract-frames", tmp_path / "frames")
    assert (code, row["status"], row["error"], row["frame_indices"]) == (0, "ok", None, [1])
    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    capture.grab()
    expected = capture.read()[1]
    capture.release()
    assert np.array_equal(cv2.imread(row["frame_files"][0]), expected)


def test_exact_duration_of_an_mp4_ends_with_its_last_frame_s_own_duration(tmp_path):
    """--exact added 1 / (average fps) for the last frame: 3 frames 600 s apart in 1200.04 s
    (an average of 0.0025 fps) read 1200 + 400 = 1600 s; the sample table says 0.04 s."""
    path = tmp_path / "sparse.mp4"
    if not sparse_mp4(path):
        pytest.skip("this OpenCV cannot write mp4v")
    exact = probe_video(path, exact=True)
    assert (exact.status, exact.frames_decoded) == ("ok", 3)
    assert exact.duration_s == pytest.approx(1200.04)
    assert probe_video(path).duration_s == pytest.approx(1200.04)  # the header's, as before


def slowing_mp4_with_an_uncoded_frame(path: Path) -> bool:
    """10 frames, 5 of 40 ms then 5 of 80 ms (0.6 s, as ffprobe gives it), whose frame 3 is a
    VOP marked not coded, which FFmpeg's decoder skips: 9 frames decode, the last starting at
    0.52 s and lasting 80 ms. An OpenCV MP4 whose sample times (stts) and durations are
    rewritten."""
    if not write_video(path, "mp4v", 16, 16, 25, 10):
        return False
    data = bytearray(path.read_bytes())

    def get(at: int) -> int:
        return struct.unpack_from(">I", data, at)[0]

    trak = _iso_box(data, b"trak", _iso_box(data, b"moov", None))
    stbl = _iso_box(data, b"stbl", _iso_box(data, b"minf", _iso_box(data, b"mdia", trak)))
    # frame 3's VOP header: 00 00 01 B6, P (01), modulo time base 0, marker, its time
    # increment (5 bits at 25 fps: 3), marker, then vop_coded, set to 0
    sizes = _iso_box(data, b"stsz", stbl)[0] + 20
    vop = get(_iso_box(data, b"stco", stbl)[0] + 16) + sum(get(sizes + 4 * i) for i in range(3))
    assert data[vop : vop + 4] == b"\x00\x00\x01\xb6" and data[vop + 4] == 0b01010001
    assert data[vop + 5] >> 5 == 0b111
    data[vop + 5] &= ~0b00100000
    _retime_mp4(data, 6, 10, lambda media: [(5, media // 25), (5, media // 25 * 2)])
    path.write_bytes(bytes(data))
    return True


def test_exact_duration_of_an_mp4_whose_packet_decodes_to_no_frame_ends_with_its_last_frame(
    tmp_path,
):
    """The last frame's own duration was the sample table's only where as many frames
    decoded as it lists: with one packet that decodes to no frame, --exact gave the last
    frame 1 / (average fps), 0.52 + 0.06 = 0.58 s for a 0.6 s video (ffprobe: 0.6 s). The
    frame is found in the table by its time: 80 ms."""
    path = tmp_path / "slowing.mp4"
    if not slowing_mp4_with_an_uncoded_frame(path):
        pytest.skip("this OpenCV cannot write mp4v")
    exact = probe_video(path, exact=True)
    assert (exact.status, exact.frames_decoded, exact.frames_header) == ("ok", 9, 10)
    assert exact.duration_s == pytest.approx(0.6)
    assert probe_video(path).duration_s == pytest.approx(0.6)  # the header's, as before


def test_an_mp4_cut_by_its_edit_list_counts_the_frames_it_shows(tmp_path):
    """A clip cut without re-encoding (`ffmpeg -ss 0.12 -c copy`, a player's Trim) keeps every
    sample from the key frame before the cut, and its edit list shows those after it: FFmpeg
    decodes the others and drops them. The header count was the samples': 10 frames and 0.4 s
    for a clip of 7 frames, 0.28 s (ffprobe: 0.28 s), and --segments sampled frames past its
    end (row ok)."""
    path = tmp_path / "cut.mp4"
    if not write_video(path, "mp4v", 16, 16, 25, 10):
        pytest.skip("this OpenCV cannot write mp4v")
    data = bytearray(path.read_bytes())
    moov, trak, media, movie = _mp4_track_and_timescales(data)
    elst = _iso_box(data, b"elst", _iso_box(data, b"edts", trak))[0] + 8
    assert struct.unpack_from(">II", data, elst + 4) == (1, movie * 10 // 25)  # one edit: all
    struct.pack_into(">Ii", data, elst + 8, movie * 7 // 25, media * 3 // 25)  # from frame 3
    path.write_bytes(bytes(data))
    info = probe_video(path)
    assert (info.status, info.frames_header, info.duration_s) == ("ok", 7, pytest.approx(0.28))
    exact = probe_video(path, exact=True)
    assert (exact.frames_decoded, exact.frames_differ, exact.duration_s) == (
        7,
        False,
        pytest.approx(0.28),
    )
    code, (row,) = json_rows(path, "--segments", "2")
    assert code == 0 and row["frame_indices"] == [1, 5]


def test_an_mp4_edts_box_of_size_0_holds_the_mdia_after_it(tmp_path):
    """An `edts` box of size 0 runs to the end of its track, over the `mdia` after it: FFmpeg
    reads that `mdia` as the track's all the same (it takes a box wherever it lies), where the
    parser found no video track: the header count was the samples' (10, not the 7 the edit
    list shows, which decode) and the codec FFmpeg's FMP4, not the file's mp4v."""
    path = tmp_path / "edts-0.mp4"
    if not write_video(path, "mp4v", 16, 16, 25, 10):
        pytest.skip("this OpenCV cannot write mp4v")
    data = bytearray(path.read_bytes())
    moov, trak, media, movie = _mp4_track_and_timescales(data)
    edts = _iso_box(data, b"edts", trak)
    assert edts[1] < _iso_box(data, b"mdia", trak)[1]  # the mdia after it, in the track
    struct.pack_into(">Ii", data, edts[0] + 24, movie * 7 // 25, media * 3 // 25)  # frames 3-9
    struct.pack_into(">I", data, edts[0], 0)
    path.write_bytes(bytes(data))
    assert decoded_by_opencv(path) == 7
    info = probe_video(path)
    assert (info.status, info.frames_header, info.codec) == ("ok", 7, "mp4v")
    exact = probe_video(path, exact=True)
    assert (exact.status, exact.frames_decoded, exact.frames_differ) == ("ok", 7, False)


@pytest.mark.parametrize(
    "pattern",
    [(1, 3, 0, 0), (2, 2, 2, 2), (0, 3, 1, 1), (1, -1)],
    ids=["IPBB", "shifted", "PBB", "negative"],
)
def test_an_mp4_ctts_out_of_its_frames_order_counts_the_frames_ffmpeg_decodes(tmp_path, pattern):
    """A `ctts` of B-frame offsets (in frames) on a video without B-frames: its edit list then
    leaves a frame or two of 100 outside, which FFmpeg's reader drops (98 decode of 100): the
    header count is those that decode, and the file is whole (ok, not damaged)."""
    path = tmp_path / "ctts.mp4"
    if not write_video(path, "mp4v", 16, 16, 25, 100):
        pytest.skip("this OpenCV cannot write mp4v")
    data = path.read_bytes()
    trak = _iso_box(data, b"trak", _iso_box(data, b"moov", None))
    delta = (
        struct.unpack_from(
            ">I", data, _iso_box(data, b"mdhd", _iso_box(data, b"mdia", trak))[0] + 20
        )[0]
        // 25
    )
    offsets = sample_table(*((1, pattern[i % len(pattern)] * delta) for i in range(100)))
    stbl = None
    for kind in TIMES[:-1]:
        stbl = _iso_box(data, kind, stbl)
    ctts = struct.pack(">I4sII", 16 + len(offsets), b"ctts", 0, 100) + offsets
    path.write_bytes(with_box(data, TIMES[:-1], data[stbl[0] + 8 : stbl[1]] + ctts))
    decoded = decoded_by_opencv(path)
    assert 97 <= decoded <= 100
    assert probe_video(path).frames_header == decoded
    exact = probe_video(path, exact=True)
    assert (exact.status, exact.frames_decoded, exact.frames_differ) == ("ok", decoded, False)


def sample_table(*entries: tuple[int, int]) -> bytes:
    """`stts` or `ctts` entries as the box holds them: a count, then a (signed) value."""
    return b"".join(struct.pack(">Ii", count, value) for count, value in entries)


@pytest.mark.parametrize(
    ("times", "offsets", "runs", "edit", "shown"),
    [
        # B-frames: an offset a frame (times 1024, 3072, 2048, 1536, 2560)
        (
            [(5, 512)],
            [(1, 1024), (1, 2560), (1, 1024), (1, 0), (1, 512)],
            [(1, 1024, 512), (1, 3072, 512), (1, 2048, 512), (1, 1536, 512), (1, 2560, 512)],
            (2048, 3072),
            (2, 2048),
        ),
        # two deltas, offsets for 4 of 5 samples: times 5, 15, 25, 35, 50
        ([(3, 10), (2, 20)], [(4, 5)], [(3, 5, 10), (1, 35, 20), (1, 50, 20)], (20, 40), (2, 25)),
        # entries of no samples, a negative offset: times -5, 13, 23
        (
            [(0, 9), (3, 10)],
            [(0, 7), (1, -5), (2, 3)],
            [(1, -5, 10), (2, 13, 10)],
            (-5, 20),
            (2, -5),
        ),
        ([(3, 10)], [], [(3, 0, 10)], (5, 40), (2, 10)),  # no ctts: the decoding times
    ],
)
def test_sample_times_are_merged_from_the_two_tables_and_counted_in_an_edit(
    times, offsets, runs, edit, shown
):
    """A sample's time is its decoding time (stts) plus its composition offset (ctts), the
    two tables' runs merged where either's end (NumPy); an edit [start, end) shows the
    samples whose time lies in it."""
    from torchkit.core.video.mp4 import _iso_sample_runs, _iso_shown

    merged = _iso_sample_runs(sample_table(*times), sample_table(*offsets))
    assert [tuple(int(v) for v in run) for run in zip(*merged, strict=True)] == runs
    assert _iso_shown(merged, [edit]) == shown
    assert _iso_shown(merged, None)[0] == sum(count for count, _ in times)


def with_box(data: bytes, path: tuple[bytes, ...], payload: bytes) -> bytes:
    """`data` with the box at `path` (its types, from the top level) holding `payload`, the
    boxes around it resized (an OpenCV MP4: its moov last, so no chunk offset moves)."""
    boxes, parent = [], None
    for kind in path:
        parent = _iso_box(data, kind, parent)
        boxes.append(parent)
    start, end = boxes[-1]
    grow = 8 + len(payload) - (end - start)
    size = struct.pack(">I", 8 + len(payload))
    out = bytearray(data[:start] + size + data[start + 4 : start + 8] + payload + data[end:])
    for box_start, _ in boxes[:-1]:
        struct.pack_into(">I", out, box_start, struct.unpack_from(">I", out, box_start)[0] + grow)
    return bytes(out)


EDIT_LIST = (b"moov", b"trak", b"edts", b"elst")
TIMES = (b"moov", b"trak", b"mdia", b"minf", b"stbl", b"stts")
MOVIE_SCALE = ("the mvhd timescale, set to 0",)
ZERO_OFFSETS = ("a ctts of offset 0 for the 10 samples, added",)


def edit_list(count: int, *edits: tuple[int, int], version: int = 0) -> bytes:
    """An `elst` payload: version, flags, an entry `count` (as given, right or not), then
    each (duration, media time) at rate 1."""
    entry = ">QqI" if version else ">IiI"
    return struct.pack(">BxxxI", version, count) + b"".join(
        struct.pack(entry, duration, media, 0x10000) for duration, media in edits
    )


def sample_count(samples: int, delta: int) -> bytes:
    """An `stts` payload of one entry: `samples` samples `delta` apart."""
    return struct.pack(">III", 0, 1, samples) + struct.pack(">I", delta)


@pytest.mark.parametrize(
    ("boxes", "frames"),
    [
        # no entries: no edit list (every frame), where it showed none (0 frames, ok)
        (lambda v, m: [(EDIT_LIST, edit_list(0))], 10),
        # the entries the box holds, whatever its count says (0 frames; all 10)
        (lambda v, m: [(EDIT_LIST, edit_list(0, (7 * v, 3 * m)))], 7),
        (lambda v, m: [(EDIT_LIST, edit_list(2, (7 * v, 3 * m)))], 7),
        # the 10 samples stsz lists, whatever stts adds up to: cut (12 shown), or its last
        # delta lasting to them (3 shown)
        (
            lambda v, m: [(EDIT_LIST, edit_list(1, (12 * v, 3 * m))), (TIMES, sample_count(15, m))],
            7,
        ),
        (lambda v, m: [(EDIT_LIST, edit_list(1, (12 * v, 3 * m))), (TIMES, sample_count(6, m))], 7),
        # so too without an edit list (15 and 6 frames counted)
        (lambda v, m: [(EDIT_LIST, edit_list(0)), (TIMES, sample_count(15, m))], 10),
        (lambda v, m: [(EDIT_LIST, edit_list(0)), (TIMES, sample_count(6, m))], 10),
        # with a ctts, samples past the stts runs have no duration: 6 to 9 all at frame 6's
        # time, inside an edit of frames 5 and 6 (2 shown)
        (
            lambda v, m: [
                (EDIT_LIST, edit_list(1, (2 * v, 5 * m))),
                (TIMES, sample_count(6, m)),
                (ZERO_OFFSETS, b""),
            ],
            5,
        ),
        # an empty edit after one that shows frames shows those from time -1 (4 shown)
        (lambda v, m: [(EDIT_LIST, edit_list(2, (4 * v, 0), (2 * v, -1)))], 6),
        # an edit ending past the largest time FFmpeg holds shows none (an error row's
        # 'Python int too large to convert to C long')
        (lambda v, m: [(EDIT_LIST, edit_list(1, (1 << 62, 0), version=1))], 0),
        # a movie timescale of 0 is 1: 1 s from frame 3 (10 frames: the edit list unread)
        (lambda v, m: [(MOVIE_SCALE, b""), (EDIT_LIST, edit_list(1, (1, 3 * m)))], 7),
    ],
    ids=[
        "no-entries",
        "count-0",
        "count-2",
        "stts-15",
        "stts-6",
        "no-edits-stts-15",
        "no-edits-stts-6",
        "stts-6-ctts",
        "later-empty",
        "past-int64",
        "movie-timescale-0",
    ],
)
def test_an_mp4_edit_list_is_read_as_ffmpeg_reads_it(tmp_path, boxes, frames):
    """A 10-frame MP4 (25 fps) whose edit list, sample times or timescale are rewritten:
    the frames counted are those FFmpeg's MP4 reader shows (OpenCV decodes as many)."""
    path = tmp_path / "edited.mp4"
    if not write_video(path, "mp4v", 16, 16, 25, 10):
        pytest.skip("this OpenCV cannot write mp4v")
    data = path.read_bytes()
    moov = _iso_box(data, b"moov", None)
    mdhd = _iso_box(data, b"mdhd", _iso_box(data, b"mdia", _iso_box(data, b"trak", moov)))
    mvhd = _iso_box(data, b"mvhd", moov)
    media, movie = (struct.unpack_from(">I", data, box[0] + 20)[0] for box in (mdhd, mvhd))
    for box, payload in boxes(movie // 25, media // 25):
        if box is MOVIE_SCALE:
            data = data[: mvhd[0] + 20] + bytes(4) + data[mvhd[0] + 24 :]
        elif box is ZERO_OFFSETS:  # the sample table, a ctts box added at its end
            stbl = None
            for kind in TIMES[:-1]:
                stbl = _iso_box(data, kind, stbl)
            offsets = struct.pack(">I4sIIII", 24, b"ctts", 0, 1, 10, 0)
            data = with_box(data, TIMES[:-1], data[stbl[0] + 8 : stbl[1]] + offsets)
        else:
            data = with_box(data, box, payload)
    path.write_bytes(data)
    info = probe_video(path)
    assert info.frames_header == frames
    assert (info.status, info.error) == (
        ("ok", None)
        if frames
        else ("unreadable", "empty video: it holds no frames (its header declares none)")
    )


def test_many_edits_are_counted_in_time_that_grows_as_the_data_does():
    """Each edit was counted over every run of the sample table: 5,000 edits of 50,000
    samples of their own offset (a B-frame video's ctts) took 5.4 s before a frame was
    read (a 1 MB file: 30 s). The sample times are sorted once and each edit bisected."""
    import time

    from torchkit.core.video.mp4 import _iso_sample_runs, _iso_shown

    samples, edits = 50_000, 5_000
    runs = _iso_sample_runs(sample_table((samples, 10)), sample_table((1, 0)) * samples)
    assert len(runs[0]) == samples  # a run a sample: times 0, 10, 20...
    # edit i shows 1 to 5 samples from sample 7i (modulo the samples): sample 0 first
    spans = [(10 * (i * 7 % samples), 10 * (i * 7 % samples + 1 + i % 5)) for i in range(edits)]
    started = time.process_time()
    shown = _iso_shown(runs, spans)
    assert time.process_time() - started < 1.0  # about 0.01 s
    assert shown == (sum(min(1 + i % 5, samples - i * 7 % samples) for i in range(edits)), 0)


def fragmented_copy(path: Path, **layout) -> Path:
    """A 5-frame MP4 in fragments (`fragmented_mp4`): 3 frames of 0.04 s, one of 2 s and a
    last of 0.04 s (2.16 s in all: an average of 2.31 fps, so 1 / fps is 0.432 s)."""
    source = path.with_name("plain.mp4")
    if not write_video(source, "mp4v", 16, 16, 25, 5):
        pytest.skip("this OpenCV cannot write mp4v")
    data = source.read_bytes()
    scale = media_timescale(data)
    frame = scale * 4 // 100
    durations = [frame] * 3 + [2 * scale, frame]
    layout.setdefault("fragments", [3, 1, 1])
    path.write_bytes(fragmented_mp4(data, durations, default_duration=frame, **layout))
    return path


@pytest.mark.parametrize(
    "layout",
    [
        {},
        {"last_from": "tfhd"},
        {"last_from": "trex"},
        {"in_moov": 3, "fragments": [1, 1]},
    ],
    ids=["trun", "tfhd", "trex", "moov-first"],
)
def test_exact_duration_of_a_fragmented_mp4_ends_with_its_last_frame_s_own_duration(
    tmp_path, layout
):
    """--exact gave a fragmented MP4's last frame 1 / (average fps), not the duration its
    fragment records (the run's own, its fragment header's default or the track's): 2.12 +
    0.432 = 2.552 s for a 2.16 s video (ffprobe: 2.16 s)."""
    path = fragmented_copy(tmp_path / "fragmented.mp4", **layout)
    exact = probe_video(path, exact=True)
    assert (exact.status, exact.frames_decoded) == ("ok", 5)
    assert exact.duration_s == pytest.approx(2.16)


def test_a_fragmented_mp4_whose_moov_holds_its_first_frames_counts_them_all(tmp_path):
    """`-movflags frag_keyframe` puts the first fragment's samples in the moov, and FFmpeg's
    frame count is theirs alone: 3 of 5 frames, so the duration read 1.3 s for 2.16 s and
    --segments sampled the first 3 frames only; the fragments' runs count the other 2."""
    path = fragmented_copy(tmp_path / "fragmented.mp4", in_moov=3, fragments=[1, 1])
    info = probe_video(path)
    assert (info.status, info.frames_header, info.frames_source) == ("ok", 5, "header")
    assert info.duration_s == pytest.approx(2.16)
    assert probe_video(path, exact=True).frames_differ is False
    code, rows = json_rows(path, "--segments", "5")
    assert code == 0 and rows[0]["frame_indices"] == [0, 1, 2, 3, 4]


def test_a_whole_file_whose_header_overstates_its_frames_is_not_truncated(
    tmp_path, whole_videos, monkeypatch
):
    """Decoders drop a frame here and there (a VOP marked not coded): where the container's
    sizes say the file is whole and its header counts the video's own samples (MP4), a frame
    short of the header is shown (and noted with --exact) but the file is ok, and its end is
    not sought. More frames short are damage (test_damaged_files_are_damaged_with_exact). (A
    count reckoned from the file's duration is checked at the end: audio may run on.)"""
    import torchkit.core.video.probe as probe

    path = need(whole_videos, "clip.mp4")
    opened = probe._open_capture
    overstated = 1

    class Overstating:
        def __init__(self, capture):
            self.capture = capture

        def get(self, prop):
            value = self.capture.get(prop)
            return value + overstated if prop == cv2.CAP_PROP_FRAME_COUNT else value

        def set(self, *args):
            raise AssertionError("the end of a whole file is not sought")

        def __getattr__(self, name):
            return getattr(self.capture, name)

    monkeypatch.setattr(
        probe, "_open_capture", lambda cv2, p, *threads: Overstating(opened(cv2, p, *threads))
    )
    info = probe_video(path)
    assert (info.status, info.frames_header) == ("ok", 41)
    exact = probe_video(path, exact=True)
    assert (exact.status, exact.frames_decoded, exact.frames_differ) == ("ok", 40, True)
    result = invoke(path, "--exact")
    assert result.exit_code == 0 and "different number of frames" in result.stderr
    overstated = 5
    assert probe_video(path).status == "ok"  # headers and a first frame: nothing to see
    assert probe_video(path, exact=True).status == "damaged"
    monkeypatch.setattr(probe, "declared_size", lambda *args: None)  # sizes unknown: judged
    assert probe_video(path, exact=True).status == "truncated"


def test_an_mp4_without_its_index_is_truncated_not_a_file_without_video(tmp_path, videos):
    """An MP4 recording still being written (FFmpeg's mdat says 0: to the end of the file,
    until its index, the moov, is written at the end), or a copy cut right before its moov:
    its boxes end with the file, so it read `unreadable`, "no video FFmpeg can open in this mp4
    file (no video track, or a damaged one)"; no whole MP4 lacks its index: truncated."""
    data = need(videos, "mpeg4.mp4").read_bytes()
    index = _iso_box(data, b"moov", None)[0]
    cut, recording = tmp_path / "cut.mp4", tmp_path / "recording.mp4"
    cut.write_bytes(data[:index])
    unfinished = bytearray(data[:index])
    struct.pack_into(">I", unfinished, _iso_box(data, b"mdat", None)[0], 0)
    recording.write_bytes(bytes(unfinished))
    code, rows = json_rows(cut, recording)
    assert code == 1 and [row["status"] for row in rows] == ["truncated", "truncated"]
    assert {row["error"] for row in rows} == {
        "truncated: no index (moov box), which a recorder writes when it finishes: still "
        "being written, stopped before the end, or a copy cut short"
    }


DAMAGED_MESSAGES = {  # what a 40-frame video's zeroed copy says it holds
    "clip.avi": "frames its index lists decode, though the file holds every byte its avi",
    "clip.mkv": "frames its header declares decode, and its mkv structure breaks at byte ",
    "clip.webm": "frames its header declares decode, and its webm structure breaks at byte ",
    "clip.mov": "frames its header declares decode, though the file holds every byte its mov",
    "clip.mp4": "frames its header declares decode, though the file holds every byte its mp4",
    "faststart.mp4": "frames its header declares decode, though the file holds every byte",
    "clip.y4m": "frames its header declares decode, though the file holds every byte its y4m",
    "clip.wmv": "frames its header declares decode, and its asf structure breaks at byte ",
}


@pytest.mark.parametrize("name", DAMAGED_MESSAGES)
def test_a_zeroed_copy_is_damaged_with_exact(tmp_path, whole_videos, name):
    """A tenth of a whole file zeroed in its middle read `ok` (--exact: 9 of 40 frames, still
    ok), as the container's sizes are whole: what decodes (OpenCV's own count) falls short of
    the frames the file holds (its sample table, AVI index, Matroska clusters, Y4M frames),
    or its structure breaks inside its sizes (Matroska elements, ASF data packets), so the
    file is damaged. Without --exact nothing past the first frame is decoded."""
    whole = need(whole_videos, name)
    zeroed = zeroed_copy(whole, tmp_path)
    decoded = decoded_by_opencv(zeroed)
    assert decoded < 40 - 1
    info = probe_video(zeroed)
    assert (info.status, info.frames, info.error) == ("ok", 40, None)
    exact = probe_video(zeroed, exact=True)
    assert (exact.status, exact.frames_decoded, exact.frames_header) == ("damaged", decoded, 40)
    assert exact.error.startswith(f"damaged: {decoded} of the 40 {DAMAGED_MESSAGES[name]}")
    whole_exact = probe_video(whole, exact=True)
    assert (whole_exact.status, whole_exact.frames_decoded) == ("ok", 40)


@pytest.fixture(scope="module")
def x264_clip(tmp_path_factory) -> Path:
    """An H.264 MP4 of 4 s at 25 fps as x264 writes it: a key frame a second, B-frames."""
    return ffmpeg_made(
        tmp_path_factory.mktemp("x264") / "x264.mp4",
        *moving_picture(4),
        *("-c:v", "libx264", "-g", "25", "-bf", "2", "-pix_fmt", "yuv420p"),
        encoders=("libx264",),
    )


def test_a_fragmented_mp4_whose_moov_lists_the_frames_before_its_first_key_frame(
    tmp_path, x264_clip
):
    """`ffmpeg -i a.mp4 -ss 1.4 -c copy -copyinkf -movflags frag_keyframe` keeps the frames
    before the first key frame in the moov's sample table, with no stss: FFmpeg writes none
    where none of its samples is a key frame, as where all are, so each read as one, and
    --exact called the whole file damaged (150 of 173 frames decode, those before the first
    key frame dropped). A table without stss in front of fragments that hold frames other
    than key frames is read as those frames; damage after them is still found."""
    cut = ffmpeg_made(
        tmp_path / "cut.mp4",
        *("-i", x264_clip, "-ss", "1.4", "-c", "copy", "-copyinkf"),
        *("-movflags", "frag_keyframe"),
    )
    data = cut.read_bytes()
    assert b"stss" not in data[: data.find(b"moof")] and b"stss" in x264_clip.read_bytes()
    decoded = decoded_by_opencv(cut)
    exact = probe_video(cut, exact=True)
    assert exact.frames_header - decoded >= 10  # 1.4 s to 2 s: no key frame to decode from
    assert (exact.status, exact.frames_decoded, exact.error) == ("ok", decoded, None)
    assert probe_video(zeroed_copy(cut, tmp_path), exact=True).status == "damaged"


@pytest.mark.parametrize("at", (0.3, 0.5, 0.7))
def test_a_zeroed_fragmented_mp4_is_damaged(tmp_path, whole_videos, at):
    """A fragmented MP4 with a tenth of its bytes zeroed: its fragments were counted up to the
    zeroes (the boxes stop there, where FFmpeg's reader stops too), so the frames before them
    decoded, the file read `ok` (or `truncated`, a fragment cut by the zeroes falling short of
    its count) under --exact. Past bytes that are no box, the walk goes on at the next
    fragment (its `moof`, as the `mfra` index FFmpeg writes last lists it, or found by its
    first bytes): the frames of the whole file are counted, and the file is damaged, its
    structure breaking where the zeroes start. (OpenCV's MP4 in fragments; and ffmpeg's.)"""
    clip = need(whole_videos, "clip.mp4")
    fragmented = tmp_path / "fragmented.mp4"
    fragmented.write_bytes(fragmented_mp4(clip.read_bytes(), [512] * 40, [10] * 4))
    assert probe_video(fragmented, exact=True).status == "ok"
    zeroed = zeroed_copy(fragmented, tmp_path, at)
    exact = probe_video(zeroed, exact=True)
    # (the count of a fragment whose moof the zeroes cover is lost with it: 10 frames)
    assert exact.status == "damaged" and exact.frames_header >= 30
    assert exact.frames_decoded == decoded_by_opencv(zeroed) < exact.frames_header - 1
    if at > 0.3:  # the first fragment's frames end at a third of the file: the boxes break
        start, size = int(fragmented.stat().st_size * at), fragmented.stat().st_size
        found = exact.error.split("mp4 structure breaks at byte ")[1].split(" ")[0]
        assert start <= int(found.rstrip(",").replace(",", "")) < start + size // 10
    assert probe_video(zeroed).status == "ok"  # damage is looked for with --exact alone
    assert probe_video(cut_copy(zeroed, tmp_path, 0.95), exact=True).status == "truncated"


def test_a_zeroed_fragmented_mp4_from_ffmpeg_is_damaged(tmp_path, x264_clip):
    """FFmpeg's fragmented MP4s (the first fragment in the moov or not), whose `mfra` lists
    where each fragment starts, zeroed a tenth at 30, 50 and 70% of the way in."""
    for flags in ("frag_keyframe", "frag_keyframe+empty_moov"):
        made = ffmpeg_made(tmp_path / "made.mp4", "-i", x264_clip, "-c", "copy", "-movflags", flags)
        assert made.read_bytes()[-12:-8] == b"mfro"  # its fragments' index
        assert probe_video(made, exact=True).status == "ok"
        for at in (0.3, 0.5, 0.7):
            exact = probe_video(zeroed_copy(made, tmp_path, at), exact=True)
            assert (exact.status, exact.frames_decoded < exact.frames_header - 1) == (
                "damaged",
                True,
            ), (flags, at, exact)


def test_damaged_rows_on_the_command_line(tmp_path, whole_videos):
    """The status column says `damaged`, the closing line counts it apart from `truncated`,
    and the exit code is 1 (0 with --skip-errors); the JSON keys are those of every row."""
    whole = need(whole_videos, "clip.mp4")
    zeroed = zeroed_copy(whole, tmp_path)
    cut = cut_copy(whole, tmp_path, 0.5)
    result = invoke(whole, zeroed, cut, "--exact", "--format", "json")
    assert result.exit_code == 1
    rows = json.loads(result.stdout)
    assert [row["status"] for row in rows] == ["ok", "damaged", "truncated"]
    assert rows[1]["error"].startswith("damaged: ") and rows[1]["frames"] < 40
    assert {tuple(row) for row in rows} == {tuple(rows[0])}
    assert error_line(result.stderr) == (
        "Error: 2 of 3 videos could not be read: 1 truncated, 1 damaged "
        "(see the status and error columns; --skip-errors exits 0)"
    )
    assert invoke(zeroed, "--exact", "--skip-errors").exit_code == 0
    table = table_text(tmp_path, zeroed, "--exact")
    assert any(zeroed.name in line and " damaged " in line for line in table.splitlines())


@pytest.mark.parametrize("name", ["clip.mp4", "clip.avi"])
def test_frames_extracted_from_a_zeroed_copy_make_it_damaged_not_sampled_again(
    tmp_path, whole_videos, name
):
    """--extract-frames finds the frames past the damage missing: where the sizes say the file
    is whole, it took the header's count for wrong, counted the frames by decoding and
    sampled again from them (row ok); the count that falls short of the frames the file holds
    is the damage --exact reports, and the row writes no frame."""
    zeroed = zeroed_copy(need(whole_videos, name), tmp_path)
    out = tmp_path / "frames"
    code, (row,) = json_rows(zeroed, "-k", "8", "--extract-frames", out)
    exact = probe_video(zeroed, exact=True)
    assert code == 1 and (row["status"], row["error"]) == (exact.status, exact.error)
    assert row["status"] == "damaged" and row["frames_decoded"] == exact.frames_decoded
    assert row["frame_files"] is None and not list(out.glob("*.png"))


def cluster_blocks(data: bytes) -> list[tuple[int, int, bool]]:
    """(where it starts, its data starts, a key frame) of each SimpleBlock of the Clusters of
    the Matroska file `data` (its flags byte follows the track number and time)."""
    blocks = []
    cluster = data.find(bytes.fromhex("1f43b675"))
    while cluster >= 0:
        size, length = ebml_size(data, cluster + 4)
        body = cluster + 4 + length
        blocks += [
            (start, data_start, bool(data[data_start + ebml_size(data, data_start)[1] + 2] & 0x80))
            for element, start, data_start, _ in ebml_elements(data, body, body + size)
            if element == 0xA3
        ]
        cluster = data.find(bytes.fromhex("1f43b675"), body + size)
    return blocks


def without_first_key_frames(data: bytes) -> bytes:
    """The Matroska file `data` with the SimpleBlocks before its first that is no key frame
    made Void elements of the same size: a stream that starts without a key frame, as a copy
    cut at a frame that is not one (`ffmpeg -i a.mp4 -ss 3 -c copy -copyinkf`) or a
    recording begun mid-GOP leaves it, every byte its sizes declare there."""
    out = bytearray(data)
    for start, _, key in cluster_blocks(data):
        if not key:
            return bytes(out)
        out[start] = 0xEC  # Void: FFmpeg and torchkit pass over it
    raise AssertionError("every frame a key frame")


def test_a_stream_that_starts_without_a_key_frame_is_not_damaged(tmp_path):
    """The frames stored before a stream's first key frame have nothing to be decoded from, and
    FFmpeg drops them: an x264 clip cut 3 s in with `-c copy -copyinkf` decodes to 50 of the
    223 frames its MP4/MKV/AVI index holds, and --exact called that whole file damaged. Frames
    before its first key frame are not counted against it; damage after it still is. (MPEG-2
    here: a VP8 or VP9 stream so cut decodes to no frame in OpenCV, unreadable.)"""
    whole = tmp_path / "whole.mkv"
    if not write_video(whole, "MPG2", 48, 32, 25.0, 40):
        pytest.skip("this OpenCV build writes no MPEG-2")
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(without_first_key_frames(whole.read_bytes()))
    decoded = decoded_by_opencv(cut)
    voided = sum(1 for a, b in zip(whole.read_bytes(), cut.read_bytes(), strict=True) if a != b)
    assert decoded < 40 - voided - 1  # those before the next key frame do not decode
    exact = probe_video(cut, exact=True)
    assert (exact.status, exact.frames_decoded, exact.error) == ("ok", decoded, None)
    code, (row,) = json_rows(cut, "-k", "4", "--extract-frames", tmp_path / "frames")
    assert code == 0 and row["status"] == "ok" and len(row["frame_files"]) == 4
    assert probe_video(zeroed_copy(cut, tmp_path), exact=True).status == "damaged"


def test_an_avi_cut_at_an_open_gop_s_key_frame_is_not_damaged(tmp_path):
    """An open GOP's B-frames that follow its key frame (stored after it, shown before it)
    refer to the frames before it: in a copy cut there (`ffmpeg -ss 2.5 -i a.avi -c copy`),
    FFmpeg drops them, and --exact called the whole file damaged (140 of the 142 frames its
    index lists). An AVI records no times: the MPEG-1/2 pictures and MPEG-4 VOPs right after
    its first key frame are B-frames by their own headers."""
    whole = tmp_path / "whole.avi"
    if not write_video(whole, "MPG2", 48, 32, 25.0, 40):  # I0 I3 B1 B2 I6 B4 B5 ...
        pytest.skip("this OpenCV build writes no MPEG-2")
    data = bytearray(whole.read_bytes())
    first = data.find(b"00dc", data.find(b"movi"))  # the first frame, I0, made a JUNK chunk
    data[first : first + 4] = b"JUNK"
    index = data.rfind(b"idx1") + 8
    assert data[index : index + 4] == b"00dc"
    data[index : index + 4] = b"JUNK"  # and its index entry
    cut = tmp_path / "cut.avi"
    cut.write_bytes(bytes(data))
    decoded = decoded_by_opencv(cut)
    assert decoded == 39 - 2  # B1 and B2, which refer to I0, do not decode
    exact = probe_video(cut, exact=True)
    assert (exact.status, exact.frames_decoded, exact.error) == ("ok", decoded, None)
    assert probe_video(whole, exact=True).status == "ok"
    assert probe_video(zeroed_copy(cut, tmp_path), exact=True).status == "damaged"


def test_an_hevc_avi_cut_at_a_cra_is_not_damaged(tmp_path):
    """An HEVC open GOP's key frame (a CRA) is followed by its RASL pictures, which refer to
    the frames before it: in an AVI cut there (its frames before it made JUNK chunks, as a
    copy cut there holds them), FFmpeg drops them, and --exact called the whole file damaged
    (50 of the 53 frames its index lists). An AVI records no times: they are told by their
    NAL unit types (H.264: the B-frames right after an I-frame that is no IDR)."""
    source = ffmpeg_made(
        tmp_path / "source.mp4",
        *moving_picture(3),
        *("-c:v", "libx265", "-pix_fmt", "yuv420p", "-x265-params"),
        "log-level=error:open-gop=1:keyint=25:min-keyint=25:scenecut=0:bframes=3:b-pyramid=1",
        encoders=("libx265",),
    )
    # a chunk a frame, at 25 fps: FFmpeg 9 copies the MP4's video into an AVI of 600 fps,
    # 23 empty chunks between frames, whose index then takes half the file (and the zeroes)
    time_base = ("-time_base", "1:25")
    whole = ffmpeg_made(tmp_path / "whole.avi", "-i", source, "-c", "copy", *time_base, muxer="avi")
    data = bytearray(whole.read_bytes())
    index, movi = data.rfind(b"idx1") + 8, data.find(b"movi")
    entries = [e for e in range(index, len(data) - 15, 16) if data[e + 2 : e + 4] == b"dc"]
    assert len(entries) == 75  # 3 s at 25 fps
    second_key = [e for e in entries if data[e + 4] & 0x10][1]
    for entry in entries[: entries.index(second_key)]:  # its chunk and its entry: JUNK
        chunk = movi + int.from_bytes(data[entry + 8 : entry + 12], "little")
        assert data[chunk : chunk + 4] == data[entry : entry + 4]
        data[chunk : chunk + 4] = data[entry : entry + 4] = b"JUNK"
    cut = tmp_path / "cut.avi"
    cut.write_bytes(bytes(data))
    decoded = decoded_by_opencv(cut)
    held = avi_indexed_frames(cut, "avi")
    assert (held.frames - decoded, held.leading) == (3, 3)  # its 3 RASL pictures
    exact = probe_video(cut, exact=True)
    assert (exact.status, exact.frames_decoded, exact.error) == ("ok", decoded, None)
    # (its first half is the JUNK: the frames are zeroed in the second)
    assert probe_video(zeroed_copy(cut, tmp_path, 0.75), exact=True).status == "damaged"


def test_an_avi_of_empty_chunks_between_frames_lasts_to_its_last_frame(tmp_path):
    """An MP4 copied into an AVI of a finer time base (FFmpeg 9's `-c copy` gives one of 600
    fps from a 25 fps MP4) stores its frames 24 chunks apart, the chunks between them empty.
    FFmpeg gives each frame its chunk's place, but none to the B-frames its decoder holds to
    the end, and --exact read the last of those as no time: 75 frames over 600 fps, 0.125 s
    for a 3 s video. The latest frame given a time ends it: 2.96 s, and a frame at 600 fps."""
    source = ffmpeg_made(
        tmp_path / "source.mp4", *moving_picture(3), "-c:v", "mpeg4", "-bf", "2",
        encoders=("mpeg4",),
    )  # fmt: skip
    clip = ffmpeg_made(
        tmp_path / "clip.avi", "-i", source, "-c", "copy", "-time_base", "1:600", muxer="avi"
    )
    if avi_frames_with_data(clip, "avi") != (75, 1800):
        pytest.skip("this ffmpeg does not copy into an AVI of the time base asked")
    info = probe_video(clip, exact=True)
    assert (info.status, info.frames, info.fps) == ("ok", 75, 600)
    assert info.duration_s == pytest.approx(2.96 + 1 / 600)
    plain = probe_video(clip, decode_check=False)
    assert (plain.frames, plain.frames_header, plain.duration_s) == (75, 75, pytest.approx(3.0))


def _empty_chunks_between_frames(data: bytes, empty: int, rate: int) -> bytes:
    """The AVI `data` (one video stream, a chunk a frame) with `empty` chunks of no bytes
    after each frame's, in its movi list and its index, and its stream's rate `rate` (a
    frame's time at the rate before is `empty + 1` chunks), as FFmpeg 9 copies a 25 fps MP4
    into an AVI of 600 fps with `-c copy`."""
    movi, index = data.find(b"movi"), data.rfind(b"idx1")
    flags = [struct.unpack_from("<I", data, at + 4)[0] for at in range(index + 8, len(data), 16)]
    chunks, entries, at = bytearray(), bytearray(), movi + 4
    while at < index:
        chunk_id, size = struct.unpack_from("<4sI", data, at)
        chunk = data[at : at + 8 + size + (size & 1)]
        for part in (chunk, *[chunk_id + bytes(4)] * empty):
            length = struct.unpack_from("<I", part, 4)[0]
            entries += struct.pack("<4s3I", chunk_id, flags.pop(0) if length else 0,
                                   4 + len(chunks), length)  # fmt: skip
            chunks += part
        at += len(chunk)
    movi_list = b"LIST" + struct.pack("<I", 4 + len(chunks)) + b"movi" + chunks
    body = bytearray(data[: movi - 8] + movi_list + b"idx1" + struct.pack("<I", len(entries)))
    body += entries
    frames = len(entries) // 16
    struct.pack_into("<I", body, 4, len(body) - 8)
    struct.pack_into("<I", body, body.find(b"avih") + 8, 1_000_000 // rate)
    struct.pack_into("<I", body, body.find(b"avih") + 24, frames)  # dwTotalFrames
    strh = body.find(b"strh") + 8
    struct.pack_into("<II", body, strh + 20, 1, rate)  # dwScale, dwRate
    struct.pack_into("<I", body, strh + 32, frames)  # dwLength
    if body.find(b"dmlh") >= 0:  # OpenDML's total frames
        struct.pack_into("<I", body, body.find(b"dmlh") + 8, frames)
    return bytes(body)


def test_an_avi_of_empty_chunks_between_frames_counts_its_frames_without_exact(tmp_path, videos):
    """An AVI whose frames' chunks lie 24 apart, the 23 between each two empty (FFmpeg 9's
    `-c copy` of a 25 fps MP4 into an AVI gives 600 fps; a capture marks the frames it
    dropped so): without --exact its count was the stream's length, 24 times the frames
    (1,800 for the 75 FFmpeg decodes), and --segments sampled frames past the last. The
    index lists the chunks: those with data are the frames, over the length's time."""
    source = need(videos, "mjpg.avi")
    clip = tmp_path / "clip.avi"
    clip.write_bytes(_empty_chunks_between_frames(source.read_bytes(), 23, 600))
    assert avi_indexed_frames(clip, "avi").frames == 17
    code, (row,) = json_rows(clip)
    assert code == 0 and row["status"] == "ok", row
    assert (row["frames"], row["frames_header"], row["fps"]) == (17, 17, 600)
    assert row["duration_s"] == pytest.approx(17 * 24 / 600)
    code, (exact,) = json_rows(clip, "--exact")
    assert code == 0 and (exact["frames_decoded"], exact["frames_header"]) == (17, 17), exact
    code, (sampled,) = json_rows(clip, "-k", "4", "--extract-frames", tmp_path / "frames")
    assert code == 0 and sampled["frame_indices"] == tsn_frame_indices(17, 4), sampled
    assert len(list((tmp_path / "frames").glob("*.png"))) == 4
    # an index that lists fewer chunks than the length (an OpenDML file's idx1, its first
    # part's) says nothing of the rest: the count stays FFmpeg's
    longer = bytearray(clip.read_bytes())
    struct.pack_into("<I", longer, longer.find(b"strh") + 40, 17 * 24 + 100)
    (tmp_path / "longer.avi").write_bytes(bytes(longer))
    assert avi_frames_with_data(tmp_path / "longer.avi", "avi") is None
    assert avi_frames_with_data(clip, "avi") == (17, 17 * 24)
    assert avi_frames_with_data(source, "avi") is None  # no empty chunk


def test_frames_before_the_first_key_frame_as_each_index_lists_them(tmp_path, whole_videos):
    """The frames an index holds before its first key frame, stored or shown before it or at
    its time (an open GOP's leading pictures, which refer to frames before it, their times
    lifted to the start of a copy cut at the key frame): a Matroska file's blocks
    (their key flag and times), an AVI's idx1 flags, an MP4's sync sample table."""
    from torchkit.core.video.held import HeldFrames
    from torchkit.core.video.matroska import matroska_video_blocks
    from torchkit.core.video.mp4 import iso_frames_without_picture

    webm = need(whole_videos, "clip.webm")
    data = webm.read_bytes()
    blocks = matroska_video_blocks(webm, "webm")
    assert (blocks.frames, blocks.leading, blocks.not_coded, blocks.broken_at) == (40, 0, 0, None)
    keys = [key for _, _, key in cluster_blocks(data)]
    cut = tmp_path / "cut.webm"
    cut.write_bytes(without_first_key_frames(data))
    voided, next_key = keys.index(False), keys.index(True, keys.index(False))
    blocks = matroska_video_blocks(cut, "webm")
    assert (blocks.frames, blocks.leading) == (40 - voided, next_key - voided)
    # the second block shown before the first (its time, after its track number, made -40 ms)
    (first, _, _), (second, _, _) = cluster_blocks(data)[:2]
    assert data.rfind(bytes.fromhex("1f43b675"), 0, second) < first  # both in one Cluster
    unflagged = bytearray(data)
    for _, data_start, _ in cluster_blocks(data):  # no key frame flagged: nothing told
        unflagged[data_start + 3] &= 0x7F
    (tmp_path / "unflagged.webm").write_bytes(bytes(unflagged))
    assert matroska_video_blocks(tmp_path / "unflagged.webm", "webm").leading == 0
    for time in (-40, 0):  # 0: its time lifted to the file's start, as a muxer does
        shown_before = bytearray(data)
        struct.pack_into(">h", shown_before, cluster_blocks(data)[1][1] + 1, time)
        (tmp_path / "early.webm").write_bytes(bytes(shown_before))
        assert matroska_video_blocks(tmp_path / "early.webm", "webm").leading == 1

    avi = bytearray(need(whole_videos, "clip.avi").read_bytes())  # MJPG: every frame a key
    assert avi_indexed_frames(need(whole_videos, "clip.avi"), "avi") == HeldFrames(40, 0, 0)
    index = avi.rfind(b"idx1") + 8
    entries = [e for e in range(index, len(avi) - 15, 16) if avi[e + 2 : e + 4] == b"dc"]
    for entry in entries[:3]:  # the first three not flagged key frames (AVIIF_KEYFRAME)
        avi[entry + 4] &= ~0x10
    (tmp_path / "late.avi").write_bytes(bytes(avi))
    assert avi_indexed_frames(tmp_path / "late.avi", "avi") == HeldFrames(40, 3, 0)
    for entry in entries:  # none flagged: the writer sets no flags, which tells nothing
        avi[entry + 4] &= ~0x10
    (tmp_path / "none.avi").write_bytes(bytes(avi))
    assert avi_indexed_frames(tmp_path / "none.avi", "avi") == HeldFrames(40, 0, 0)

    # a fragmented MP4's samples: their trun flags, the non-sync bit clear on a key frame
    fragmented = tmp_path / "fragmented.mp4"
    keys = [False] * 12 + [True] * 28
    data = need(whole_videos, "clip.mp4").read_bytes()
    fragmented.write_bytes(fragmented_mp4(data, [512] * 40, [10, 30], key_frames=keys))
    assert iso_frames_without_picture(fragmented, "mp4").leading == 12
    fragmented.write_bytes(fragmented_mp4(data, [512] * 40, [5, 30], in_moov=5))
    assert iso_frames_without_picture(fragmented, "mp4") == HeldFrames(0, 0, 0)
    # its moov's table, without stss, in front of fragments that hold frames other than key
    # frames: those before the first key frame (FFmpeg's muxer lists none where none is one)
    keys = [False] * 5 + ([True] + [False] * 9) * 3 + [True] + [False] * 4
    fragmented.write_bytes(fragmented_mp4(data, [512] * 40, [5, 30], in_moov=5, key_frames=keys))
    assert iso_frames_without_picture(fragmented, "mp4").leading == 5

    mp4 = bytearray(need(whole_videos, "clip.mp4").read_bytes())
    assert iso_frames_without_picture(need(whole_videos, "clip.mp4"), "mp4").leading == 0
    table = mp4.find(b"stss") + 4  # version and flags, the entry count, the key samples
    struct.pack_into(">II", mp4, table + 4, 1, 13)  # one key frame: the 13th sample
    (tmp_path / "late.mp4").write_bytes(bytes(mp4))
    assert iso_frames_without_picture(tmp_path / "late.mp4", "mp4").leading == 12


def not_coded_vops(data: bytes, every: int = 2) -> bytes:
    """The Matroska file `data` (MPEG-4 Part 2 at 25 fps, as OpenCV writes `mp4v`) with one
    frame in `every`, but the first, a VOP marked not coded: a P-VOP's
    header alone (6 bytes), as Xvid and DivX write a frame that repeats the one before. Its
    SimpleBlock keeps its size field's length, a Void element the bytes it gives up."""
    out = bytearray(data)
    increment_bits = (25 - 1).bit_length()  # FFmpeg's: the time base's denominator, less 1
    bits = "01" + "0" + "1" + "0" * increment_bits + "1" + "0"  # P, time, markers, not coded
    bits += "0" + "1" * (-(len(bits) + 1) % 8)  # stuffing to a byte
    vop = b"\x00\x00\x01\xb6" + int(bits, 2).to_bytes(len(bits) // 8, "big")
    for index, (start, data_start, _) in enumerate(cluster_blocks(data)):
        if index == 0 or index % every:
            continue
        size_length, total = data_start - start - 1, ebml_size(data, start + 1)[0]
        header = bytes(out[data_start : data_start + 4])  # track number, time, flags
        block = header + vop
        void = total - len(block) - 1 - 8  # Void: its ID, an 8-byte size, zeroes
        assert void >= 0 and size_length <= 8
        size = (len(block) | 1 << 7 * size_length).to_bytes(size_length, "big")
        rest = b"\xec" + (void | 1 << 56).to_bytes(8, "big") + bytes(void)
        out[data_start - size_length : data_start + total] = size + block + rest
    assert len(out) == len(data)
    return bytes(out)


def test_vops_marked_not_coded_are_not_damage(tmp_path, monkeypatch):
    """A VOP marked not coded decodes to no picture (FFmpeg shows none), and Xvid and DivX
    write one for each frame that repeats the one before: half the frames of a static scene.
    Such a whole file read `damaged` (53 of the 100 frames its index lists decode); frames of
    a few bytes (an AVI's index, a Matroska file's clusters, an MP4's sample sizes) are not
    counted among those that must decode, and damage elsewhere still is."""
    whole = tmp_path / "whole.mkv"
    if not write_video(whole, "mp4v", 48, 32, 25.0, 40):
        pytest.skip("this OpenCV build writes no MPEG-4 Part 2 into Matroska")
    static = tmp_path / "static.mkv"
    static.write_bytes(not_coded_vops(whole.read_bytes()))
    decoded = decoded_by_opencv(static)
    assert decoded < 40 - 2  # the VOPs marked not coded give no picture
    exact = probe_video(static, exact=True)
    assert (exact.status, exact.frames_decoded, exact.error) == ("ok", decoded, None)
    assert probe_video(zeroed_copy(static, tmp_path), exact=True).status == "damaged"
    # in a packed bitstream such frames are placeholders FFmpeg shows a picture for: missing
    import torchkit.core.video.probe as probe

    monkeypatch.setattr(probe, "mpeg4_packed", lambda path: True)
    assert probe_video(static, exact=True).status == "damaged"


def test_frames_of_a_few_bytes_are_not_counted_in_an_index(tmp_path, whole_videos):
    """An AVI's idx1 entries and an MP4's stsz sizes of 8 bytes or fewer (a VOP marked not
    coded) are not among the frames that must decode, but in a packed bitstream."""
    from torchkit.core.video.held import HeldFrames, mpeg4_packed
    from torchkit.core.video.mp4 import iso_frames_without_picture

    avi = bytearray(need(whole_videos, "clip.avi").read_bytes())
    index = avi.rfind(b"idx1") + 8
    entries = [e for e in range(index, len(avi) - 15, 16) if avi[e + 2 : e + 4] == b"dc"]
    for entry, size in zip(entries[1:4], (6, 8, 9), strict=True):
        struct.pack_into("<I", avi, entry + 12, size)
    (tmp_path / "nvop.avi").write_bytes(bytes(avi))
    assert avi_indexed_frames(tmp_path / "nvop.avi", "avi") == HeldFrames(40, 0, 2)
    assert not mpeg4_packed(tmp_path / "nvop.avi")
    # a packed bitstream's user data (DivX and Xvid write it in its frames): its frames of a
    # few bytes are placeholders for the B-frame packed before them, which FFmpeg shows
    packed = bytearray(avi)
    first_frame = packed.find(b"00dc", packed.find(b"movi")) + 8
    packed[first_frame + 16 : first_frame + 33] = b"\x00\x00\x01\xb2DivX503b1393p"
    (tmp_path / "packed.avi").write_bytes(bytes(packed))
    assert mpeg4_packed(tmp_path / "packed.avi")

    mp4 = bytearray(need(whole_videos, "clip.mp4").read_bytes())
    assert iso_frames_without_picture(need(whole_videos, "clip.mp4"), "mp4").not_coded == 0
    sizes = mp4.find(b"stsz") + 4  # version and flags, one size for all, the count, sizes
    assert struct.unpack_from(">II", mp4, sizes + 4) == (0, 40)
    struct.pack_into(">3I", mp4, sizes + 12 + 4, 6, 8, 9)
    (tmp_path / "nvop.mp4").write_bytes(bytes(mp4))
    assert iso_frames_without_picture(tmp_path / "nvop.mp4", "mp4").not_coded == 2


def test_a_y4m_file_s_codec_is_rawvideo_as_ffprobe_names_it(whole_videos):
    """A Y4M file records no codec tag (OpenCV's FOURCC is 0): the codec was empty."""
    assert probe_video(need(whole_videos, "clip.y4m")).codec == "rawvideo"


def _rate_extended(data: bytes, numerator: int, denominator: int) -> bytes:
    """A raw MPEG-2 stream `data` whose every sequence extension gives its rate times
    `numerator` / `denominator` (frame_rate_extension_n and _d one less each)."""
    out = bytearray(data)
    at = out.find(b"\x00\x00\x01\xb5")
    while at >= 0:
        if out[at + 4] >> 4 == 1:  # a sequence extension: its 6th byte holds n (2 bits), d (5)
            out[at + 9] = out[at + 9] & 0x80 | (numerator - 1) << 5 | (denominator - 1)
        at = out.find(b"\x00\x00\x01\xb5", at + 4)
    return bytes(out)


@pytest.mark.parametrize("encoder", ["mpeg2video", "mpeg1video"])
def test_a_raw_mpeg_stream_s_rate_is_its_sequence_header_s(tmp_path, encoder):
    """OpenCV's FFmpeg reads 25 fps for any raw MPEG-1/2 video stream (.m2v, .m1v), whose
    sequence header records its rate: a 29.97 fps clip of 60 frames read 25 fps, 2.4 s.
    Its sequence header's rate is read, and, in MPEG-2, its sequence extension's
    frame_rate_extension_n and _d, which make it the header's x (n + 1) / (d + 1) (FFmpeg
    writes them for a rate the codes lack): the rate ffprobe gives as r_frame_rate, and
    the rate an MPEG-PS file's pictures move on at where they repeat fields."""
    made = ffmpeg_made(
        tmp_path / "clip.m2v",
        *("-f", "lavfi", "-i", "testsrc=size=64x48:rate=30000/1001:duration=2"),
        *("-c:v", encoder, "-f", "mpeg2video" if encoder == "mpeg2video" else "mpeg1video"),
        encoders=(encoder,),
    )
    rates = {made: Fraction(30000, 1001)}
    if encoder == "mpeg2video":
        for numerator, denominator in ((2, 1), (1, 2)):  # 59.94 and 14.985 fps
            crafted = tmp_path / f"x{numerator}-{denominator}.m2v"
            crafted.write_bytes(_rate_extended(made.read_bytes(), numerator, denominator))
            rates[crafted] = Fraction(30000, 1001) * numerator / denominator
    for path, rate in rates.items():
        info = probe_video(path, exact=True)
        assert (info.status, info.frames, info.fps) == ("ok", 60, float(rate)), path
        assert info.duration_s == pytest.approx(60 / rate)
        # an MPEG-PS walk's pictures move on at that rate; their time codes count at 30
        pictures = streams._PsPictures()
        pictures.read(path.read_bytes())
        assert (pictures.frames, pictures.frame_rate, pictures.rate) == (60, float(rate), 30)
        probed = ffprobe_entries(path, "stream=r_frame_rate")
        assert probed is None or Fraction(probed[0]) == rate, path


@pytest.mark.parametrize(
    ("encoder", "muxer", "rate", "pictures"),
    [
        ("mpeg2video", ("-f", "vob"), "25", 2),
        ("mpeg2video", ("-f", "vob"), "30000/1001", 1),
        ("mpeg1video", ("-f", "mpeg"), "25", 2),
        ("mpeg2video", ("-f", "mpegts"), "25", 2),
        ("mpeg2video", ("-f", "mpegts"), "24000/1001", 1),
        ("mpeg2video", ("-f", "mpegts"), "15", 2),  # 25 x 3/5: the sequence extension's
        ("mpeg2video", ("-f", "mpegts", "-mpegts_m2ts_mode", "1"), "25", 2),
    ],
)
def test_an_mpeg_ps_or_ts_file_of_one_or_two_pictures_reads_its_sequence_header_s_rate(
    tmp_path, encoder, muxer, rate, pictures
):
    """An MPEG-PS or MPEG-TS file of one or two MPEG-1/2 pictures gives FFmpeg too few frames
    to average: OpenCV fell back on the field rate, 50 fps for 25 (59.94 for 29.97), where
    ffprobe's r_frame_rate is 25. Where OpenCV's rate is twice the one the video's first
    sequence header records (read from the first video packets), that one is the row's; a
    longer file keeps FFmpeg's average."""
    made = ffmpeg_made(
        tmp_path / "clip.mpg",
        *("-f", "lavfi", "-i", f"testsrc=size=64x48:rate={rate}"),
        *("-frames:v", str(pictures), "-c:v", encoder, *muxer),
        encoders=(encoder,),
        muxer=muxer[1],
    )
    info = probe_video(made)
    assert info.status == "ok" and info.fps == float(Fraction(rate)), info
    probed = ffprobe_entries(made, "stream=r_frame_rate")
    assert probed is None or Fraction(probed[0]) == Fraction(rate)
    longer = ffmpeg_made(
        tmp_path / "longer.mpg",
        *("-f", "lavfi", "-i", f"testsrc=size=64x48:rate={rate}"),
        *("-frames:v", "12", "-c:v", encoder, *muxer),
    )
    assert probe_video(longer).fps == pytest.approx(float(Fraction(rate)), rel=1e-3)


def test_an_mpeg_ps_file_s_video_head_is_its_packets_data_after_their_headers(tmp_path):
    """The first bytes of an MPEG-PS or TS file's video (the sequence header's place) are its
    video packets' data alone: no pack, packet or TS header between; other formats have
    none."""
    made = ffmpeg_made(
        tmp_path / "clip.ts",
        *moving_picture(0.2),
        *("-c:v", "mpeg2video", "-f", "mpegts"),
        encoders=("mpeg2video",),
    )
    raw = ffmpeg_made(tmp_path / "clip.m2v", "-i", str(made), "-c", "copy", "-f", "mpeg2video")
    vob = ffmpeg_made(tmp_path / "clip.vob", "-i", str(made), "-c", "copy", "-f", "vob")
    stream = raw.read_bytes()
    for path, container in ((made, "mpeg-ts"), (vob, "mpeg-ps")):
        head = streams.mpeg_video_head(path, container)
        assert len(head) == 256 and stream.startswith(head), container
    assert streams.mpeg_video_head(raw, "mpeg-video") == b""


def _ps_pack() -> bytes:
    """An MPEG-2 pack header: its start code, SCR and mux rate, no stuffing."""
    return b"\x00\x00\x01\xba\x44\x00\x04\x00\x04\x01\x00\x00\x03\xf8"


def _pes(stream_id: int, data: bytes) -> bytes:
    """An MPEG-2 PES packet of the stream `stream_id` carrying `data` and a presentation
    time of 0."""
    header = b"\x80\x80\x05\x21\x00\x01\x00\x01"
    length = struct.pack(">H", len(header) + len(data))
    return b"\x00\x00\x01" + bytes([stream_id]) + length + header + data


def test_an_mpeg_ps_file_s_video_head_and_frames_are_one_walk_of_its_packs(tmp_path):
    """The video head (the first sequence header's place) and the frame count of an MPEG-PS
    file walk its packs alike: the first video stream's packets (not another video stream's
    or an audio stream's), past the zero bytes a muxer pads packs with, to the end code. Past
    bytes that are no pack the frame count goes on at the next pack, the head stops there."""
    first, second, third = b"A" * 40, b"C" * 30, b"E" * 20
    padded = _ps_pack() + _pes(0xE0, first) + _pes(0xC0, b"audio")
    stream = padded + bytes(20) + _ps_pack() + _pes(0xE1, b"another video") + _pes(0xE0, second)
    ended = tmp_path / "ended.mpg"
    ended.write_bytes(stream + b"\x00\x00\x01\xb9" + _ps_pack() + _pes(0xE0, third))
    assert streams.mpeg_video_head(ended, "mpeg-ps") == first + second
    broken = stream + b"\xff" * 50 + _ps_pack() + _pes(0xE0, third)
    (tmp_path / "broken.mpg").write_bytes(broken)
    assert streams.mpeg_video_head(tmp_path / "broken.mpg", "mpeg-ps") == first + second
    walks = {
        resync: [
            (unit.kind, broken[unit.start : unit.end] if unit.kind == "video" else unit.start)
            for unit in streams._ps_video_walk(broken, resync=resync)
        ]
        for resync in (False, True)
    }
    stopped = [("video", first), ("padding", len(padded)), ("video", second)]
    assert walks[False] == [*stopped, ("break", len(stream))]
    assert walks[True] == [*stopped, ("break", len(stream)), ("video", third)]


@pytest.mark.parametrize("rate", [15, 50])
def test_a_raw_mpeg1_stream_s_count_is_its_estimated_duration_at_its_own_rate(tmp_path, rate):
    """A raw MPEG-1 stream records no frame count: OpenCV counts the duration FFmpeg
    estimates from the bit rate its sequence header records, at FFmpeg's 25 fps. At the
    stream's own rate beside it, a whole 15 fps clip of 30 frames read `truncated: 30 of
    the 44 frames its header declares decode` (exit 1), a 50 fps clip of 100 frames 44
    frames over 0.88 s. The count is that duration at the stream's own rate; a stream of
    a variable rate (the bit rate field's largest, 0x3FFFF: 0.7 ms) gives none, where it
    read 0 frames."""
    constant = ("-b:v", "300k", "-minrate", "300k", "-maxrate", "300k", "-bufsize", "300k")
    made = {}
    for kind, options in (("cbr", constant), ("vbr", ())):
        made[kind] = ffmpeg_made(
            tmp_path / f"{kind}.m1v",
            *moving_picture(2, rate=rate),
            *("-c:v", "mpeg1video", *options, "-strict", "unofficial", "-f", "mpeg1video"),
            encoders=("mpeg1video",),
        )
    header = made["cbr"].read_bytes()[:12]
    bits = (header[8] << 10 | header[9] << 2 | header[10] >> 6) * 400  # its bit rate field
    estimate_s = made["cbr"].stat().st_size * 8 / bits  # FFmpeg's duration, as ffprobe's
    for options in ({}, {"decode_check": False}):
        info = probe_video(made["cbr"], **options)
        assert (info.status, info.fps) == ("ok", rate), options
        assert info.frames_header == pytest.approx(estimate_s * rate, abs=1)
        assert info.duration_s == pytest.approx(estimate_s, abs=1 / rate)
        info = probe_video(made["vbr"], **options)
        assert (info.status, info.fps, info.frames, info.duration_s) == ("ok", rate, None, None)
    for path in made.values():
        exact = probe_video(path, exact=True)
        assert (exact.status, exact.frames, exact.duration_s) == ("ok", 2 * rate, 2.0)


_AV1_NOT_DECODED = (
    "no frame decodes: an AV1 video, and this OpenCV's FFmpeg decodes no AV1 (it has neither "
    "libdav1d nor libaom, nor a hardware AV1 decoder)"
)


def _av1_clip(tmp_path: Path) -> Path:
    return ffmpeg_made(
        tmp_path / "clip.mp4",
        *moving_picture(0.4, size="64x64"),  # (SVT-AV1's smallest)
        *("-c:v", "libsvtav1", "-preset", "12"),
        encoders=("libsvtav1",),
    )


def test_an_av1_video_opencv_cannot_decode_says_so(tmp_path):
    """An OpenCV build whose FFmpeg has neither libdav1d nor libaom decodes AV1 only with a
    hardware decoder: a whole AV1 MP4 read `no frame decodes (truncated or corrupt)`. The
    row says it is AV1, which this build does not decode, found by decoding an AV1 key
    frame of its own (where the build decodes AV1, the row is ok); exit code 1, status
    unreadable in JSON."""
    import torchkit.core.video.probe as probe

    clip = _av1_clip(tmp_path)
    decodes = decoded_by_opencv(clip) == 10
    assert probe.opencv_decodes_av1() is decodes
    info = probe_video(clip)
    assert (info.codec, info.frames_header) == ("av01", 10)
    if decodes:
        assert (info.status, info.error) == ("ok", None)
        return
    assert (info.status, info.error) == ("unreadable", _AV1_NOT_DECODED)
    result = invoke(clip, "--format", "json")
    assert result.exit_code == 1
    (row,) = json.loads(result.stdout)
    assert (row["status"], row["error"]) == ("unreadable", _AV1_NOT_DECODED)


@pytest.mark.parametrize("decodes", [True, False, None])
def test_a_corrupt_av1_video_is_told_from_one_this_opencv_cannot_decode(
    tmp_path, monkeypatch, decodes
):
    """Every AV1 video that decoded no frame read `which OpenCV's FFmpeg decodes only with
    libdav1d, libaom or a hardware AV1 decoder (else truncated or corrupt)`, on a build
    that decodes AV1 too, where it is corrupt. Whether this OpenCV decodes AV1 is found by
    decoding a key frame (here its answer is given): where it does, a whole AV1 file of
    which no frame decodes is corrupt; where it does not, the row says so; where it cannot
    be tried, the row says both. A cut copy is truncated either way."""
    import torchkit.core.video.probe as probe

    clip = _av1_clip(tmp_path)
    data = bytearray(clip.read_bytes())
    start = data.index(b"mdat") + 4  # the media data box's frames, after its size and type
    end = start - 8 + int.from_bytes(data[start - 8 : start - 4], "big")
    data[start:end] = bytes(end - start)  # zeroed
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(bytes(data))
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(clip.read_bytes()[:-300])
    assert decoded_by_opencv(corrupt) == 0
    monkeypatch.setattr(probe, "opencv_decodes_av1", lambda: decodes)
    expected = {
        True: "no frame decodes (truncated or corrupt)",
        False: _AV1_NOT_DECODED,
        None: "no frame decodes: an AV1 video, which OpenCV's FFmpeg decodes only with "
        "libdav1d, libaom or a hardware AV1 decoder (else truncated or corrupt)",
    }[decodes]
    for options in ({}, {"exact": True}):
        info = probe_video(corrupt, **options)
        assert (info.codec, info.status, info.error) == ("av01", "unreadable", expected)
        info = probe_video(cut, **options)
        assert info.status == "truncated", options


def test_whether_opencv_decodes_av1_is_unknown_where_no_temporary_file_can_be_written(
    tmp_path, monkeypatch
):
    """The AV1 key frame is decoded from a temporary file: where none can be written (a
    temporary folder that is not there), whether this OpenCV decodes AV1 is unknown (None:
    the row names both causes), not an error that fails the file's row."""
    import tempfile

    import torchkit.core.video.probe as probe

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "not-there"))
    assert probe.opencv_decodes_av1.__wrapped__() is None


def test_the_cut_mp4_of_the_issue_on_the_command_line(tmp_path, whole_videos):
    """`a copy of an MP4 cut to its first megabyte` (here: its first third), which opened and
    was reported healthy, `--exact` showing 71 (header 241) with exit code 0."""
    whole = need(whole_videos, "faststart.mp4")
    cut = cut_copy(whole, tmp_path, 1 / 3)
    result = invoke(whole, cut, "--format", "json")
    assert result.exit_code == 1
    rows = json.loads(result.stdout)
    assert [row["status"] for row in rows] == ["ok", "truncated"]
    assert rows[1]["frames"] == 40 and rows[1]["width"] == 48  # what the header says
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: 1 of 2 videos could not be read: 1 truncated "
        "(see the status and error columns; --skip-errors exits 0)"
    )
    exact = invoke(cut, "--exact", "--format", "json")
    assert exact.exit_code == 1
    (row,) = json.loads(exact.stdout)
    assert row["status"] == "truncated" and 0 < row["frames_decoded"] < 40
    assert invoke(cut, "--skip-errors").exit_code == 0
    table = table_text(tmp_path, whole, cut, "--exact")
    lines = table.splitlines()
    header = next(line for line in lines if "status" in line)
    assert header.index("status") < header.index("error")
    assert any(cut.name in line and "truncated" in line for line in lines)
    assert any(whole.name in line and " ok " in line for line in lines)
    rows = list(csv.DictReader(io.StringIO(invoke(cut, "--format", "csv").stdout)))
    assert rows[0]["status"] == "truncated" and rows[0]["error"].startswith("truncated: ")


def test_container_sizes_of_hand_made_files(tmp_path):
    from torchkit.core.video import declared_size

    def declared(data: bytes, container: str) -> int | None:
        path = tmp_path / "file"
        path.write_bytes(data)
        return declared_size(path, container, len(data))

    box = lambda kind, payload: struct.pack(">I4s", 8 + len(payload), kind) + payload  # noqa: E731
    mp4 = box(b"ftyp", b"isom" * 3) + box(b"moov", b"x" * 40) + box(b"mdat", b"y" * 100)
    assert declared(mp4, "mp4") == len(mp4)
    assert declared(mp4[:-30], "mp4") == len(mp4)  # the mdat box is cut short
    assert declared(mp4[:30], "mp4") == 20 + 48  # cut inside moov: where moov would end
    large = struct.pack(">I4sQ", 1, b"mdat", 16 + 50) + b"z" * 50  # a 64-bit box size
    assert declared(box(b"ftyp", b"isom") + large, "mp4") == 12 + 66
    to_end = box(b"ftyp", b"isom") + struct.pack(">I4s", 0, b"mdat") + b"z" * 9  # size 0: to EOF
    assert declared(to_end, "mp4") == len(to_end)
    assert declared(mp4 + b"\x00\x00\x00\x10\xff\xfe\xfd\xfc", "mp4") is None  # not a box
    assert declared(mp4 + bytes(3), "mp4") == len(mp4)  # padding zeros
    assert declared(mp4 + b"\x00\x00\x00\x10", "mp4") == len(mp4) + 8  # a box header cut
    riff = b"RIFF" + struct.pack("<I", 4 + 20) + b"AVI " + b"L" * 20
    assert declared(riff, "avi") == len(riff) and declared(riff[:20], "avi") == len(riff)
    avix = b"RIFF" + struct.pack("<I", 4 + 9) + b"AVIX" + b"M" * 9  # OpenDML, odd size padded
    assert declared(riff + avix + b"\x00", "avi") == len(riff) + len(avix) + 1
    assert declared(riff + avix, "avi") == len(riff) + len(avix) + 1  # the pad byte is missing
    assert declared(b"RIFF\x00\x00\x00\x00AVI " + b"L" * 20, "avi") is None  # never filled in
    ebml = bytes.fromhex("1a45dfa3 84") + b"webm"  # EBML header, 4 bytes of data
    segment = bytes.fromhex("18538067 8a") + b"s" * 10  # Segment, 10 bytes of data
    assert declared(ebml + segment, "webm") == len(ebml + segment)
    assert declared(ebml + segment[:-4], "webm") == len(ebml + segment)
    unknown = bytes.fromhex("18538067 01ffffffffffffff") + b"s" * 10  # a live recording
    assert declared(ebml + unknown, "mkv") is None
    packet = b"G" + bytes(187)
    assert declared(packet * 3, "mpeg-ts") == 3 * 188
    assert declared(packet * 3 + b"G" + bytes(10), "mpeg-ts") == 4 * 188
    m2ts = bytes(4) + packet  # a timestamp before each packet: 192 bytes
    assert declared(m2ts * 2, "m2ts") == 2 * 192
    assert declared(m2ts * 2 + bytes(10), "m2ts") == 3 * 192
    assert declared(packet, "flv") is None and declared(packet, None) is None
    guid = bytes.fromhex  # ASF objects: a GUID and a 64-bit little-endian size
    properties = guid("a1dcab8c47a9cf118ee400c00c205365") + struct.pack("<Q", 104) + bytes(80)
    header = guid("3026b2758e66cf11a6d900aa0062ce6c") + struct.pack("<QIH", 30 + 104, 1, 0x201)
    data = guid("3626b2758e66cf11a6d900aa0062ce6c") + struct.pack("<Q", 24 + 50) + b"d" * 50
    index = guid("90080033b1e5cf1189f400a0c90349cb") + struct.pack("<Q", 24 + 6) + b"i" * 6
    asf = header + properties + data + index
    assert declared(asf, "asf") == len(asf) and declared(asf + b"junk" * 9, "asf") == len(asf)
    assert declared(asf[:-3], "asf") == len(asf)  # the index is cut
    assert declared(asf[: len(asf) - 40], "asf") == len(asf) - 30  # the data: as far as known
    assert declared(asf[: len(header) + 50], "asf") == len(header) + 104  # inside the header
    assert declared(asf[:-25], "asf") == len(asf) - 6  # inside the index's GUID: its size field
    live = bytearray(asf)
    live[len(header) + 88] |= 1  # the broadcast flag: sizes not filled in
    assert declared(bytes(live), "asf") is None
    # Y4M: the header's size and chroma layout (C), frames of one size, "FRAME" lines that may
    # carry parameters; odd sizes round the chroma planes up
    y4m = b"YUV4MPEG2 W5 H3 F25:1 C420jpeg\n"
    frame = b"FRAME\n" + bytes(15 + 2 * 3 * 2)
    assert declared(y4m + frame * 3, "y4m") == len(y4m) + 3 * len(frame)
    assert declared(y4m + frame * 2 + frame[:9], "y4m") == len(y4m) + 3 * len(frame)
    assert declared(y4m + frame * 2 + frame[:3], "y4m") == len(y4m) + 3 * len(frame)
    assert declared(y4m, "y4m") == len(y4m)
    marked = b"FRAME Ixyz\n" + bytes(15 * 3)  # 4:4:4, a frame line with a parameter
    y444 = b"YUV4MPEG2 W5 H3 C444\n"
    assert declared(y444 + marked * 2, "y4m") == len(y444) + 2 * len(marked)
    assert declared(y444 + marked * 2 + marked[:20], "y4m") == len(y444) + 3 * len(marked)
    assert declared(b"YUV4MPEG2 W4 H2 Cmono16\n" + frame[:6] + bytes(16), "y4m") == 46
    assert declared(b"YUV4MPEG2 W4 H2 C420p10\n" + frame[:6] + bytes(24), "y4m") == 54
    assert declared(b"YUV4MPEG2 W4 H2 Cxyz\n" + frame, "y4m") is None  # unknown layout
    assert declared(y444 + marked + b"junk" * 20, "y4m") is None
    # MPEG-PS: packs (MPEG-2 headers: 14 bytes and stuffing) and packets with their lengths
    pack = b"\x00\x00\x01\xba" + bytes([0x44]) + bytes(8) + bytes([0xF8])
    pes = b"\x00\x00\x01\xe0" + struct.pack(">H", 30) + b"v" * 30
    ps = (pack + pes) * 3
    assert declared(ps, "mpeg-ps") is None  # ends on a packet, no end code: nothing said
    assert declared(ps + b"\x00\x00\x01\xb9", "mpeg-ps") == len(ps) + 4
    assert declared(ps[:-10], "mpeg-ps") == len(ps)  # inside a packet
    assert declared(ps[:-30], "mpeg-ps") == len(ps)
    assert declared(ps + pack[:9], "mpeg-ps") == len(ps) + 14  # inside a pack header
    assert declared(ps + b"\x00\x00", "mpeg-ps") == len(ps) + 4  # inside a start code
    mpeg1_pack = b"\x00\x00\x01\xba" + bytes([0x21]) + bytes(7)
    assert declared(mpeg1_pack + pes + mpeg1_pack + pes[:12], "mpeg-ps") == 2 * (12 + 36)
    assert declared(ps + b"\x00\x00\x01\x00junk", "mpeg-ps") is None  # not a system stream


def test_json_types_of_every_field(videos, broken):
    """Numbers are numbers, absent values null, status one of three words: for ok, truncated
    and unreadable rows alike."""
    paths = [need(videos, "mjpg.avi"), need(broken, "cut_webm"), broken["text"]]
    _, rows = json_rows(*paths, "-k", "2")
    types = {
        "path": (str,), "size_bytes": (int,), "width": (int, type(None)),
        "height": (int, type(None)), "frames": (int, type(None)),
        "frames_source": (str, type(None)), "frames_header": (int, type(None)),
        "frames_decoded": (int, type(None)), "fps": (float, type(None)),
        "duration_s": (float, type(None)), "codec": (str, type(None)),
        "container": (str, type(None)), "frame_indices": (list, type(None)),
        "frame_files": (list, type(None)), "status": (str,), "error": (str, type(None)),
    }  # fmt: skip
    for row in rows:
        assert set(row) == set(types)
        for key, allowed in types.items():
            assert isinstance(row[key], allowed) and not isinstance(row[key], bool), (key, row)
        assert row["status"] in ("ok", "truncated", "unreadable")
        assert (row["status"] == "ok") == (row["error"] is None)
    assert [row["status"] for row in rows] == ["ok", "truncated", "unreadable"]
    assert all(isinstance(i, int) for i in rows[0]["frame_indices"])


# --- segments and frame extraction ---------------------------------------------------------------


def test_segments_in_test_and_train_mode(tmp_path, videos):
    path = need(videos, "mjpg.avi")
    _, (row,) = json_rows(path, "--segments", "4")
    assert row["frame_indices"] == tsn_frame_indices(17, 4, "test") == [2, 6, 10, 14]
    _, (first,) = json_rows(path, "-k", "4", "--sample-mode", "train", "--seed", "5")
    _, (again,) = json_rows(path, "-k", "4", "--sample-mode", "train", "--seed", "5")
    assert first["frame_indices"] == again["frame_indices"]
    for index, (start, stop) in zip(first["frame_indices"], segment_bounds(17, 4), strict=True):
        assert start <= index < stop
    by_seed = {
        seed: json_rows(path, "-k", "4", "--sample-mode", "train", "--seed", seed)[1][0]
        for seed in ("1", "2", "3")
    }
    assert len({tuple(row["frame_indices"]) for row in by_seed.values()}) > 1
    _, (many,) = json_rows(path, "-k", "20")  # more segments than frames
    assert many["frame_indices"] == sorted(i % 17 for i in range(20))
    assert "2 6 10 14" in table_text(tmp_path, path, "-k", "4")


def test_a_video_s_train_mode_frames_do_not_change_with_the_others_listed(
    tmp_path, videos, monkeypatch
):
    """Train mode's "same seed, same frames" holds for each video whatever else is listed:
    its stream is seeded by --seed and its name in its input (relative to the folder given,
    however that is spelled), not by its place in the list. Before, a video added in front
    (a new clip sorted first) changed every other video's frames."""
    clips = tmp_path / "clips"
    clips.mkdir()
    for name in ("b.avi", "c.avi", "d.avi"):
        shutil.copyfile(need(videos, "mjpg.avi"), clips / name)
    options = {"segments": 6, "sample_mode": "train", "seed": 3, "workers": 1}

    def frames(*paths) -> dict[str, list[int]]:
        infos = inspect_videos(list(paths), **options)
        return {Path(info.path).name: info.frame_indices for info in infos}

    before = frames(clips)
    assert len({tuple(indices) for indices in before.values()}) == 3  # a stream each
    shutil.copyfile(need(videos, "mjpg.avi"), clips / "a.avi")
    after = frames(clips)
    assert list(after) == ["a.avi", "b.avi", "c.avi", "d.avi"]
    assert {name: after[name] for name in before} == before
    monkeypatch.chdir(tmp_path)
    assert frames("clips/") == frames(Path("clips").absolute()) == after
    assert frames("clips/c.avi") == frames("./clips/c.avi")  # a file: its path as given


def test_the_frames_written_are_counted_in_words(tmp_path, videos):
    """Before: "Note: wrote 1 frames to ..."."""
    from torchkit.core.io.wording import counted

    assert [counted(n, "frame") for n in (0, 1, 2)] == ["0 frames", "1 frame", "2 frames"]
    assert [counted(n, "class", "classes") for n in (1, 3)] == ["1 class", "3 classes"]
    clip = need(videos, "mjpg.avi")
    for segments, words in (("1", "wrote 1 frame to"), ("2", "wrote 2 frames to")):
        out = tmp_path / segments
        result = invoke(clip, "--segments", segments, "--extract-frames", out)
        assert result.exit_code == 0 and f"Note: {words} {out}\n" in result.stderr, result.stderr


def test_extract_frames_writes_the_sampled_frames_losslessly(tmp_path, videos):
    path = need(videos, "lossless.mkv")  # FFV1: decoded frames equal what was written
    out = tmp_path / "frames"
    result = invoke(path, "-k", "3", "--extract-frames", out, "--format", "json")
    assert result.exit_code == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["frame_indices"] == [2, 6, 10]
    assert sorted(p.name for p in out.iterdir()) == [
        ".torchkit",  # the marker: torchkit wrote this folder, --force may replace it
        "lossless_000002.png",
        "lossless_000006.png",
        "lossless_000010.png",
    ]
    assert row["frame_files"] == [str(out / f"lossless_{i:06d}.png") for i in (2, 6, 10)]
    for index in (2, 6, 10):
        written = cv2.imread(str(out / f"lossless_{index:06d}.png"))
        np.testing.assert_array_equal(written, frame_pixels(index, 40, 30))
    assert "wrote 3 frames" in result.stderr
    again = invoke(path, "-k", "3", "--extract-frames", out)
    assert again.exit_code == 1 and "already exists" in again.stderr
    assert invoke(path, "-k", "2", "--extract-frames", out, "--force").exit_code == 0
    frames = sorted(p.name for p in out.glob("*.png"))
    assert frames == ["lossless_000003.png", "lossless_000009.png"]


def test_frame_name_prefixes_are_the_lowest_free_numbers_in_linear_time():
    """Each video's frames are named after its stem, -2, -3... for repeats (the lowest number
    free, a stem like `v-2` included). A dataset of `<clip>/video.mp4` folders was named in
    quadratic time: 20,000 videos took a minute before the first frame was read."""
    import time

    from torchkit.core.video import frame_name_prefixes

    def lowest_free(videos: list[Path]) -> list[str]:
        used: list[str] = []
        for video in videos:
            prefix, n = video.stem, 1
            while prefix in used:
                n += 1
                prefix = f"{video.stem}-{n}"
            used.append(prefix)
        return used

    rng = np.random.default_rng(0)
    stems = ["v", "v-2", "v-3", "v-2-2", "w", "v-10"]
    mixed = [Path(f"{i}/{stems[rng.integers(len(stems))]}.mp4") for i in range(300)]
    assert list(frame_name_prefixes(mixed).values()) == lowest_free(mixed)
    same = [Path(f"clip{i}/video.mp4") for i in range(10_000)]
    started = time.process_time()  # CPU time: other processes' load does not stretch it
    prefixes = frame_name_prefixes(same)
    assert time.process_time() - started < 2.0  # about 0.06 s; 11 s before, on one core
    assert len(set(prefixes.values())) == 10_000 and prefixes["clip9999/video.mp4"] == "video-10000"


def test_extract_frames_with_repeats_and_same_named_videos(tmp_path, videos):
    source = need(videos, "lossless.mkv")
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "clip.mkv").write_bytes(source.read_bytes())
    out = tmp_path / "frames"
    code, rows = json_rows(tmp_path / "one", tmp_path / "two", "-k", "14", "--extract-frames", out)
    assert code == 0
    assert rows[0]["frame_indices"] == [0, 0, 1, 1] + list(range(2, 12))
    names = sorted(p.name for p in out.glob("*.png"))
    assert len(names) == 24 and "clip_000011.png" in names and "clip-2_000011.png" in names
    assert rows[1]["frame_files"][0] == str(out / "clip-2_000000.png")


def test_a_hidden_video_given_by_name_gets_frames_that_are_not_hidden(tmp_path, videos):
    """`.clip.avi` (given by name: a folder's search leaves hidden files out) wrote
    `.clip_000004.png`, a hidden file that `ls` and a dataset read of the folder pass over."""
    hidden, bare = tmp_path / ".clip.avi", tmp_path / ".avi"
    for video in (hidden, bare):
        shutil.copyfile(need(videos, "mjpg.avi"), video)
    out = tmp_path / "frames"
    code, rows = json_rows(hidden, bare, "-k", "1", "--extract-frames", out)
    assert code == 0, rows
    assert [Path(row["frame_files"][0]).name for row in rows] == [
        "clip_000008.png",
        "avi_000008.png",
    ]
    assert sorted(p.name for p in out.iterdir()) == [
        ".torchkit",
        "avi_000008.png",
        "clip_000008.png",
    ]


def test_videos_with_long_names_get_frames_whose_names_fit(tmp_path, videos):
    """A video named with 240 bytes (120 two-byte letters: a long title) is a valid name, but
    its frames' names (and their temporaries) were longer than a file name may be: the whole
    run failed with "File name too long". The stem is cut, whole letters at a time, and two
    videos that differ only after the cut are told apart as same-named ones are."""
    source = need(videos, "mjpg.avi")
    first, second = tmp_path / ("é" * 120 + ".avi"), tmp_path / ("é" * 119 + "x.avi")
    for video in (first, second):
        shutil.copyfile(source, video)
    out = tmp_path / "frames"
    code, rows = json_rows(first, second, "-k", "2", "--extract-frames", out)
    assert code == 0, rows
    names = [Path(f).name for row in rows for f in row["frame_files"]]
    assert sorted(names) == sorted(p.name for p in out.iterdir() if p.suffix == ".png")
    assert len(set(names)) == 4 and all(len(os.fsencode(n)) <= 255 - 14 for n in names)
    assert {n.rsplit("_", 1)[0] for n in names} == {"é" * 110, "é" * 110 + "-2"}


def test_the_csv_frame_files_cell_splits_on_semicolons_into_the_frames(tmp_path, videos):
    """The cell joins a video's frame files with `;`: `semi;colon.avi`'s frames, or a frames
    folder `a;b`, made it ambiguous. Frame names hold no `;`, and a CSV report refuses such a
    folder (JSON holds a list)."""
    video = tmp_path / "semi;colon.avi"
    shutil.copy(need(videos, "mjpg.avi"), video)
    out = tmp_path / "frames"
    result = invoke(video, "-k", "2", "--extract-frames", out, "--format", "csv")
    assert result.exit_code == 0, result.stderr
    (row,) = csv.DictReader(io.StringIO(result.stdout))
    files = row["frame_files"].split(";")
    assert files == [str(out / f"semi_colon_{i:06d}.png") for i in (4, 12)]
    assert all(os.path.isfile(f) for f in files)
    folder = tmp_path / "a;b"
    for args in (["--format", "csv"], ["-o", str(tmp_path / "info.csv")]):
        refused = invoke(video, "-k", "2", "--extract-frames", folder, *args)
        assert refused.exit_code == 2, args
        line = error_line(refused.stderr)
        assert line.startswith("Error: --extract-frames") and "--format json" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frames", "semi;colon.avi"]
    code, rows = json_rows(video, "-k", "2", "--extract-frames", folder)
    assert code == 0 and rows[0]["frame_files"][0] == str(folder / "semi_colon_000004.png")


def test_extract_frames_past_a_lying_header_is_a_truncated_row(tmp_path, broken, monkeypatch):
    """A header that promises frames the file does not hold, and checks that cannot see it (the
    container's sizes unknown, no decode check): sampling finds out, and says so."""
    import torchkit.core.video.probe as probe

    cut = need(broken, "cut_webm")
    monkeypatch.setattr(probe, "declared_size", lambda *args: None)
    # 9 segments of the 9 frames the header promises: the last one cannot be decoded.
    result = invoke(
        cut, "-k", "9", "--extract-frames", tmp_path / "f", "--no-decode-check", "--format", "json"
    )
    assert result.exit_code == 1
    (row,) = json.loads(result.stdout)
    assert row["status"] == "truncated"
    assert "past the end" in row["error"] and "--exact" in row["error"]


def test_extract_frames_of_a_whole_file_whose_header_overstates_samples_its_decoded_frames(
    tmp_path, videos, whole_videos
):
    """An AVI whose stream header says 25 frames for 17 (its sizes say it is whole), and a
    whole variable-rate MKV (header 60, 40 frames): `--segments 4` alone calls them ok, with
    --extract-frames they were `truncated` (exit 1). Now sampled from the decoded count: the
    row --exact gives, and its frames written."""
    data = bytearray(need(videos, "mjpg.avi").read_bytes())
    struct.pack_into("<I", data, data.find(b"strh") + 40, 25)  # the video stream's dwLength
    avi = tmp_path / "lying.avi"
    avi.write_bytes(bytes(data))
    mkv = tmp_path / "recording.mkv"
    mkv.write_bytes(variable_rate_live_mkv(need(whole_videos, "clip.mkv").read_bytes(), 20))
    code, plain = json_rows(avi, mkv, "-k", "4")
    assert code == 0 and [row["frames"] for row in plain] == [25, 60]
    code, exact = json_rows(avi, mkv, "-k", "4", "--exact")
    assert code == 0 and [row["frames"] for row in exact] == [17, 40]
    out = tmp_path / "frames"
    code, rows = json_rows(avi, mkv, "-k", "4", "--extract-frames", out)
    assert code == 0 and [row["status"] for row in rows] == ["ok", "ok"]
    for row, expected in zip(rows, exact, strict=True):
        assert len(row["frame_files"]) == 4 and {**row, "frame_files": None} == expected
    assert len(list(out.glob("*.png"))) == 8
    assert rows[0]["frame_indices"] == tsn_frame_indices(17, 4)


def test_extract_frames_of_a_file_whose_header_understates_samples_its_decoded_frames(
    tmp_path, videos
):
    """An AVI whose stream header says 11 frames for 17 (as an MPEG-PS file's count, reckoned
    from a duration that leaves out its first timestamp, says 30 for 40): --extract-frames
    sampled from the header's count, so the video's last frames were never sampled, and the
    row (`ok`) differed from --exact's. Now decoding on past the count tells, and the row is
    the one --exact gives, its frames written."""
    data = bytearray(need(videos, "mjpg.avi").read_bytes())
    struct.pack_into("<I", data, data.find(b"strh") + 40, 11)  # the video stream's dwLength
    avi = tmp_path / "short_header.avi"
    avi.write_bytes(bytes(data))
    code, exact = json_rows(avi, "-k", "4", "--exact")
    assert code == 0 and exact[0]["frames"] == 17 and exact[0]["frames_header"] == 11
    out = tmp_path / "frames"
    code, (row,) = json_rows(avi, "-k", "4", "--extract-frames", out)
    assert code == 0 and {**row, "frame_files": None} == exact[0]
    assert row["frame_indices"] == tsn_frame_indices(17, 4) == [2, 6, 10, 14]
    assert sorted(p.name for p in out.glob("*.png")) == [
        f"short_header_{index:06d}.png" for index in row["frame_indices"]
    ]


def test_only_an_unfragmented_iso_file_counts_its_frames_in_its_header(tmp_path):
    """Extraction decodes on past the header's count except where the count is a sample
    table's: an MP4 whose moov lists its samples. A fragmented MP4's count is FFmpeg's
    reckoning from the duration, as any other format's."""
    from torchkit.core.video.mp4 import iso_lists_every_frame

    box = lambda kind, payload: struct.pack(">I4s", 8 + len(payload), kind) + payload  # noqa: E731
    files = {
        "plain.mp4": box(b"ftyp", b"isom") + box(b"moov", b"x" * 8) + box(b"mdat", b"y" * 8),
        "fragmented.mp4": box(b"ftyp", b"isom") + box(b"moov", b"x") + box(b"moof", b"z" * 8)
        + box(b"mdat", b"y" * 8),
        "no_moov.mp4": box(b"ftyp", b"isom") + box(b"mdat", b"y" * 8),
    }  # fmt: skip
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    assert iso_lists_every_frame(tmp_path / "plain.mp4", "mp4")
    assert not iso_lists_every_frame(tmp_path / "plain.mp4", "avi")
    assert not iso_lists_every_frame(tmp_path / "fragmented.mp4", "mp4")
    assert not iso_lists_every_frame(tmp_path / "no_moov.mp4", "mp4")


def test_a_truncated_row_leaves_none_of_its_frames_in_the_folder(
    tmp_path, videos, broken, monkeypatch
):
    """The frames decoded before the end came early are removed: the folder holds the frames
    of the ok rows only, as many as the note says."""
    import torchkit.core.video.probe as probe

    cut, whole = need(broken, "cut_webm"), need(videos, "mjpg.avi")
    monkeypatch.setattr(probe, "declared_size", lambda *args: None)
    out = tmp_path / "f"
    result = invoke(
        cut, whole, "-k", "9", "--extract-frames", out, "--no-decode-check", "--format", "json"
    )
    assert result.exit_code == 1
    rows = json.loads(result.stdout)
    assert [row["status"] for row in rows] == ["truncated", "ok"]
    kept = {Path(f).name for f in rows[1]["frame_files"]}
    assert {p.name for p in out.glob("*.png")} == kept
    assert f"wrote {len(kept)} frames" in result.stderr


def test_extract_frames_needs_segments(tmp_path, videos):
    result = invoke(need(videos, "mjpg.avi"), "--extract-frames", tmp_path / "f")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: --extract-frames needs --segments K")
    assert invoke(need(videos, "mjpg.avi"), "--segments", "0").exit_code == 2


@pytest.mark.parametrize("frames", [0, None])
def test_zero_frames_is_an_error_row_and_an_unknown_count_is_decoded_when_sampling(
    monkeypatch, videos, frames
):
    """A header that says 0 frames is an empty video; one that gives no count (a browser's
    MediaRecorder WebM, a live MKV, a raw stream) is counted by decoding, as --exact counts.
    Before, no count was an `unreadable` row ("pass --exact"), even with --extract-frames."""
    import torchkit.core.video.run as run

    original = run.probe_video

    def without_frames(path, **options):
        info = original(path, **options)
        info.frames = info.frames_header = frames
        return info

    monkeypatch.setattr(run, "probe_video", without_frames)
    (info,) = inspect_videos([need(videos, "mjpg.avi")], segments=3)
    if frames == 0:
        assert info.error.startswith("the video has no frames to sample")
        assert info.frame_indices is None
    else:
        assert (info.status, info.frames, info.frames_source) == ("ok", 17, "decoded")
        assert info.frame_indices == tsn_frame_indices(17, 3)


def test_segments_of_a_raw_stream_without_a_frame_count(tmp_path):
    """A raw MPEG-2 stream (.m2v) gives no frame count: --segments counts its frames by
    decoding (the table says so), and --extract-frames writes them; before, its row was
    `unreadable` ("the container does not say how many frames it holds"), exit 1."""
    clip = tmp_path / "clip.m2v"
    if not write_video(clip, "MPG2", 48, 32, 25.0, 12):
        pytest.skip("this OpenCV build cannot write raw MPEG-2 video")
    assert probe_video(clip).frames is None
    code, (row,) = json_rows(clip, "--segments", "3")
    assert code == 0 and row["status"] == "ok", row
    assert (row["frames"], row["frames_source"], row["frame_indices"]) == (
        12,
        "decoded",
        [2, 6, 10],
    )
    assert "12 (decoded)" in table_text(tmp_path, clip, "--segments", "3")
    frames = tmp_path / "frames"
    result = invoke(clip, "--segments", "3", "--extract-frames", frames)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in frames.glob("*.png")) == [
        "clip_000002.png", "clip_000006.png", "clip_000010.png"
    ]  # fmt: skip


def test_k_is_no_longer_listed_but_old_scripts_still_run(videos, _torchkit_command):
    """-k is --topk in eval and predict: --segments lists no short flag, and `-k K` (its short
    flag before) still means --segments K, unlisted. Before: --help listed -k for --segments."""
    params = _torchkit_command.commands["video-info"].params
    (segments,) = [p for p in params if "--segments" in p.opts]
    assert segments.opts == ["--segments"]
    assert all(p.hidden for p in params if "-k" in p.opts)
    clip = need(videos, "mjpg.avi")
    assert json_rows(clip, "-k", "3") == json_rows(clip, "--segments", "3")
    both = invoke(clip, "-k", "3", "--segments", "3")
    assert both.exit_code == 2
    assert both.stderr.strip() == (
        "Error: --segments is given twice (also as -k) (give --segments once)"
    )


def test_dash_reads_video_paths_from_stdin(videos, tmp_path):
    """`-` lists videos on stdin, one per line, as predict and extract-features read images; a
    listed file that is gone is a row with its error. Before: "path not found: -"."""
    clip = need(videos, "mjpg.avi")
    gone = tmp_path / "gone.mp4"
    listed = f"{clip}\n\n{gone}\n"
    result = runner.invoke(app, ["video-info", "-", "--format", "json"], input=listed)
    assert result.exit_code == 1  # one video could not be read
    rows = json.loads(result.stdout)
    assert [row["path"] for row in rows] == [str(clip), str(gone)]
    assert [row["status"] for row in rows] == ["ok", "unreadable"]
    assert "No such file" in rows[1]["error"]
    empty = runner.invoke(app, ["video-info", "-"], input="\n")
    assert empty.exit_code == 1
    assert error_line(empty.stderr) == (
        "Error: no video paths on stdin (pipe one path per line, e.g. find ... |)"
    )


def test_a_path_given_or_listed_is_echoed_as_given(videos, tmp_path, monkeypatch):
    """`./clip.avi` (as `find .` lists it) was echoed as `clip.avi`, so the CSV did not join
    with find's list; predict and extract-features echo a path as given, and so does this."""
    shutil.copy(need(videos, "mjpg.avi"), tmp_path / "clip.avi")
    monkeypatch.chdir(tmp_path)
    given = invoke("./clip.avi", "--format", "csv", "-k", "2", "--extract-frames", "frames")
    assert given.exit_code == 0, given.stderr
    (row,) = csv.DictReader(io.StringIO(given.stdout))
    assert row["path"] == "./clip.avi" and row["frame_files"].startswith("frames/clip_")
    for args in (["--format", "csv"], ["--format", "json", "-j", "0"]):
        listed = runner.invoke(app, ["video-info", "-", *args], input="./clip.avi\n")
        assert listed.exit_code == 0 and listed.stdout.count("./clip.avi") == 1, args
    missing = invoke("./gone.avi")
    assert error_line(missing.stderr) == "Error: path not found: ./gone.avi (check the path)"


def test_csv_rows_come_out_while_the_list_on_stdin_is_still_being_written(videos):
    """video-info read the whole list and every video before writing a row: each CSV row now
    comes as its video is read."""
    clip = need(videos, "mjpg.avi")
    process = start_torchkit_process(
        "video-info", "-", "--format", "csv", "--skip-errors", stdin=subprocess.PIPE
    )
    try:
        rows = PipeLines(process.stdout)
        for at, path in enumerate([clip, clip.parent / "gone.mp4"]):
            process.stdin.write(f"{path}\n")
            process.stdin.flush()
            if at == 0:
                assert rows.next().startswith("path,size_bytes,")
            assert rows.next().startswith(f"{path},")  # its row, the list still open
        process.stdin.write(f"{clip}\n")  # listed twice: read once
        process.stdin.close()
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        process.kill()
    assert rows.rest() == []
    assert "1 of 2 videos could not be read: 1 unreadable" in process.stderr.read()


def streamed(paths, **options) -> list[dict]:
    records: list[dict] = []
    video_run.stream_videos(paths, **options)(lambda info: records.append(info.to_dict()))
    return records


def test_streamed_records_are_those_of_the_whole_list(videos, tmp_path, monkeypatch):
    # Handed over as they come: the same records, in order, train-mode frames included (each
    # video's stream follows its place in the whole list, not in a batch of the list).
    paths = [need(videos, name) for name in ("mjpg.avi", "mpeg4.mp4", "lossless.mkv")]
    options = {"segments": 3, "sample_mode": "train", "seed": 7, "workers": 2}
    whole = [info.to_dict() for info in inspect_videos(paths, **options)]
    assert streamed(paths, **options) == whole
    # On stdin, two at a time: a video gone and one listed twice as the whole list has them.
    monkeypatch.setattr(video_run, "_chunk_size", lambda workers: 2)
    listed = "".join(f"{path}\n" for path in [*paths, tmp_path / "gone.mp4", paths[0]])
    whole = inspect_videos(["-"], stdin=io.StringIO(listed), **options)
    assert len(whole) == 4
    from_stdin = streamed(["-"], stdin=io.StringIO(listed), **options)
    assert from_stdin == [info.to_dict() for info in whole]


def test_a_long_list_on_stdin_is_read_in_larger_chunks_after_the_first(monkeypatch):
    """Each chunk of the list on stdin starts its worker processes anew: 2,048 videos a chunk
    tripled the time of 100,000 empty files against a folder of them. After the first, the
    chunks are now 16 times its size; every video is read once, in order."""
    chunks: list[list[str]] = []

    def inspected(videos, *args, **kwargs):
        chunks.append(list(videos))
        return []

    monkeypatch.setattr(video_run, "_chunk_size", lambda workers: 3)
    monkeypatch.setattr(video_run, "_inspect", inspected)
    listed = [f"/clips/{at}.mp4" for at in range(200)]
    piped = io.StringIO("".join(f"{path}\n" for path in listed))
    video_run.stream_videos(["-"], stdin=piped)(lambda _: None)
    assert [len(chunk) for chunk in chunks] == [3, 48, 48, 48, 48, 5]
    assert [path for chunk in chunks for path in chunk] == listed


def test_a_list_on_stdin_is_read_by_one_set_of_worker_processes(videos, tmp_path, monkeypatch):
    """Each chunk of the list on stdin started its worker processes anew (0.5-1 s a chunk,
    about 1 s per 32,000 videos): one pool now reads every chunk, rows in order as before.
    (The pool runs inline here: what is counted is the executors made.)"""
    from concurrent import futures

    made = []

    class Inline:
        def __init__(self, max_workers, **_) -> None:
            made.append(max_workers)

        def submit(self, function, *args):
            future = futures.Future()
            future.set_result(function(*args))
            return future

        def shutdown(self, wait=True, cancel_futures=False) -> None:
            pass

    monkeypatch.setattr(futures, "ProcessPoolExecutor", Inline)
    monkeypatch.setattr(video_run, "usable_cpus", lambda: 2)
    monkeypatch.setattr(video_run, "MIN_VIDEOS_PER_PROCESS", 1)  # every chunk to processes
    monkeypatch.setattr(video_run, "_chunk_size", lambda workers: 2)
    monkeypatch.setattr(video_run, "STREAMED_CHUNK_GROWTH", 1)
    paths = []
    for at in range(7):
        paths.append(tmp_path / f"clip{at}.avi")
        shutil.copy(need(videos, "mjpg.avi"), paths[-1])
    listed = io.StringIO("".join(f"{path}\n" for path in paths))
    rows = streamed(["-"], stdin=listed, workers=4)
    assert [row["path"] for row in rows] == [str(path) for path in paths]
    assert all(row["status"] == "ok" for row in rows)
    assert made == [2]  # one pool for the 4 chunks (2, 2, 2, 1: the last read on threads)


def test_json_is_the_whole_list_an_object_a_line(videos, broken, tmp_path):
    """--format json streams its objects as they come: the list the whole run gives, each
    object a line of its own, the same text on stdout, in -o FILE and for paths on stdin."""
    paths = [need(videos, name) for name in ("mjpg.avi", "mpeg4.mp4", "lossless.mkv")]
    paths.append(broken["text"])
    whole = json.loads(render_json([info.to_dict() for info in inspect_videos(paths, segments=2)]))
    given = invoke(*paths, "-k", "2", "--format", "json")
    assert given.exit_code == 1 and _json_list_of_whole_lines(given.stdout) == whole
    target = tmp_path / "info.json"
    assert invoke(*paths, "-k", "2", "-o", target).exit_code == 1
    assert target.read_text(encoding="utf-8") == given.stdout
    listed = "".join(f"{path}\n" for path in paths)
    piped = runner.invoke(app, ["video-info", "-", "-k", "2", "--format", "json"], input=listed)
    assert piped.exit_code == 1 and piped.stdout == given.stdout


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_rows_are_written_as_the_videos_are_read(videos, tmp_path, monkeypatch, fmt):
    """The JSON array gathered every video before writing its first object; now each comes as
    its video is read, as CSV rows do. A run that fails part-way (here: at its last video)
    exits 1 with the rows written so far on stdout, whole: the JSON array closed, as predict
    closes its own (it was left open, no JSON at all), and no -o file at all."""
    paths = [need(videos, name) for name in ("mjpg.avi", "mpeg4.mp4", "lossless.mkv")]
    probe = video_run.probe_video

    def stopping_at_the_last(path, **options):
        if path == str(paths[-1]):
            raise InputError("stopped at the last video")
        return probe(path, **options)

    monkeypatch.setattr(video_run, "probe_video", stopping_at_the_last)
    failed = invoke(*paths, "--format", fmt, "-j", "0")
    assert failed.exit_code == 1
    assert error_line(failed.stderr) == "Error: stopped at the last video"
    first = inspect_videos(paths[:2])
    if fmt == "json":
        assert _json_list_of_whole_lines(failed.stdout) == json.loads(
            render_json([i.to_dict() for i in first])
        )
    else:
        assert [row["path"] for row in csv.DictReader(io.StringIO(failed.stdout))] == [
            str(p) for p in paths[:2]
        ]
    assert invoke(*paths, "-o", tmp_path / f"info.{fmt}", "-j", "0").exit_code == 1
    assert list(tmp_path.iterdir()) == []


def _json_list_of_whole_lines(text: str) -> list:
    """The items of a streamed JSON list, checked to be `[`, a line for each item whole (the
    comma that parts it from the one before at its start), and `]`."""
    # Split at line feeds only: a name may hold U+2028, a line break to str.splitlines.
    lines = [line + "\n" for line in text.removesuffix("\n").split("\n")]
    assert lines[0] == "[\n" and lines[-1] == "]\n", text
    items = [json.loads(line[1:] if at else line) for at, line in enumerate(lines[1:-1])]
    assert all(line.startswith(",") for line in lines[2:-1]), text
    assert json.loads(text) == items
    return items


def test_extract_frames_json_has_the_streamed_rows_shape(tmp_path, videos):
    """--extract-frames writes its rows once the frames are in place, not as the videos are
    read, but in the same shape as the streamed `--format json` (`[`, a video a line, `]`), on
    stdout and in an -o file. Before: an indented list, of another shape."""
    clip = need(videos, "mjpg.avi")
    frames = tmp_path / "frames"
    result = invoke(clip, "-k", "2", "--extract-frames", frames, "--format", "json")
    assert result.exit_code == 0, result.stderr
    (row,) = _json_list_of_whole_lines(result.stdout)
    assert len(row["frame_files"]) == 2
    streamed = invoke(clip, "-k", "2", "--format", "json")
    assert _json_list_of_whole_lines(streamed.stdout) == [{**row, "frame_files": None}]
    report = tmp_path / "info.json"
    written = invoke(clip, "-k", "2", "--extract-frames", frames, "--force", "-o", report)
    assert written.exit_code == 0, written.stderr
    assert _json_list_of_whole_lines(report.read_text()) == [row]


def test_a_json_array_written_an_item_at_a_time_holds_each_item_whole_as_it_is_added():
    """Each item is a line of its own, ended as it is added: the comma that parted it from the
    next one ended its line, so a reader of the stream got each row one video late."""
    items = [
        {"path": "caf\u00e9 \u2028 x\udcff.mp4", "fps": float("nan"), "frame_indices": []},
        {"nested": {"empty": {}, "list": [1, [2, 3]]}, "none": None},
        {},
    ]
    for encoding in (None, "utf-8", "ascii"):
        handle = io.StringIO()
        array = JsonArrayWriter(handle, encoding)
        for count, item in enumerate(items, start=1):
            array.add(item)
            so_far = handle.getvalue()
            assert so_far.endswith("\n"), (encoding, so_far)
            assert _json_list_of_whole_lines(so_far + "]\n") == json.loads(
                render_json(items[:count])
            )
            if encoding == "ascii":
                assert so_far.isascii()
        array.close()
        assert _json_list_of_whole_lines(handle.getvalue()) == json.loads(render_json(items))
    empty = io.StringIO()
    JsonArrayWriter(empty).close()
    assert json.loads(empty.getvalue()) == []


def test_a_json_row_is_on_stdout_whole_before_the_next_video_is_read(videos, monkeypatch):
    """`video-info --format json`'s first object ended its line only with the comma written
    when the second video was done: a reader of the stream waited a whole video for it."""
    paths = [need(videos, name) for name in ("mjpg.avi", "mpeg4.mp4")]
    probe = video_run.probe_video
    written_before: list[str] = []

    def probe_noting_stdout(path, **options):
        if path == str(paths[1]):
            results = console.stdout.file  # sys.stdout's stand-in while the command runs
            results.flush()
            written_before.append(results.buffer.getvalue().decode())
        return probe(path, **options)

    monkeypatch.setattr(video_run, "probe_video", probe_noting_stdout)
    result = invoke(*paths, "--format", "json", "-j", "0")
    assert result.exit_code == 0, result.stderr
    assert len(written_before) == 1
    assert [row["path"] for row in _json_list_of_whole_lines(written_before[0] + "]\n")] == [
        str(paths[0])
    ]
    assert [row["path"] for row in _json_list_of_whole_lines(result.stdout)] == list(
        map(str, paths)
    )


def test_a_video_listed_on_stdin_is_never_the_csv_output(videos, tmp_path):
    clip = tmp_path / "clip.avi"
    shutil.copy(need(videos, "mjpg.avi"), clip)
    before = clip.read_bytes()
    listed = f"{videos['mjpg.avi']}\n{clip}\n"
    args = ["video-info", "-", "--format", "csv", "-o", str(clip), "--force", "-j", "0"]
    refused = runner.invoke(app, args, input=listed)
    assert refused.exit_code == 1
    assert "is the video" in error_line(refused.stderr)
    assert clip.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.avi"]


def test_the_page_documents_every_json_key_and_csv_column_in_order():
    """docs/commands/video-info.md's key table lists the keys of a row, which the CSV's header
    repeats, in their order: a script reads them from the page."""
    import re

    from suite_paths import REPO

    from torchkit.cli.video_info import CSV_COLUMNS
    from torchkit.core.video.probe import VideoInfo

    page = (REPO / "docs" / "commands" / "video-info.md").read_text(encoding="utf-8")
    documented = [
        key for cell in re.findall(r"^\| (`[^|]+`) \|", page, flags=re.M)
        for key in re.findall(r"`(\w+)`", cell)
    ]  # fmt: skip
    assert documented == list(VideoInfo(path="clip.mp4").to_dict()) == CSV_COLUMNS


def test_a_video_no_decoder_opens_leaves_stderr_to_the_summary(tmp_path):
    """OpenCV logs a video whose codec FFmpeg cannot open at its ERROR level, two lines of
    `[ERROR:0@0.07] global cap_ffmpeg_impl.hpp:1471 open Could not open codec rawvideo` on
    stderr for every such file, which its row's error says already. (A process of its own:
    OpenCV reads its log level once, from the environment.)"""
    video = tmp_path / "raw.mov"  # I420 frames in a MOV, which FFmpeg's rawvideo does not open
    if not write_video(video, "I420", 32, 24, 25.0, 3):
        pytest.skip("this OpenCV build cannot write raw I420 into MOV")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCV_")}
    done = run_torchkit_process("video-info", str(video), "--format", "csv", env=env)
    assert done.returncode == 1
    assert list(csv.DictReader(io.StringIO(done.stdout)))[0]["status"] == "unreadable"
    assert error_line(done.stderr, besides="nothing").startswith("Error: 1 of 1 videos")


def test_the_page_lists_the_extensions_a_folder_is_searched_for():
    import re

    from suite_paths import REPO

    from torchkit.core.video import VIDEO_EXTENSIONS

    page = (REPO / "docs" / "commands" / "video-info.md").read_text(encoding="utf-8")
    paragraph = page[page.index("A folder is searched") :].split("\n\n")[0]
    assert set(re.findall(r"`(\.\w+)`", paragraph.split(" sorted by path")[0])) == set(
        VIDEO_EXTENSIONS
    )


def test_an_ogg_of_theora_headers_alone_holds_no_frames(tmp_path):
    """Theora's three headers (0x80, 0x81, 0x82) and no frame: a recording stopped before its
    first frame; a packet that is no header (its first bit clear) is a frame."""
    from torchkit.core.video.streams import ogg_video_without_frames

    def page(flags: int, number: int, *packets: bytes) -> bytes:
        lacing = b"".join(bytes([255] * (len(p) // 255) + [len(p) % 255]) for p in packets)
        head = b"OggS\x00" + bytes([flags]) + bytes(8) + b"\x01\x00\x00\x00"
        head += number.to_bytes(4, "little") + bytes(4) + bytes([len(lacing)])
        return head + lacing + b"".join(packets)

    ident = b"\x80theora\x03\x02\x01" + bytes(33)
    headers = page(2, 0, ident) + page(0, 1, b"\x81theora" + bytes(300), b"\x82theora" + bytes(9))
    (tmp_path / "empty.ogv").write_bytes(headers)
    (tmp_path / "one.ogv").write_bytes(headers + page(4, 2, b"\x00\x01\x02"))
    assert ogg_video_without_frames(tmp_path / "empty.ogv", "ogg")
    assert not ogg_video_without_frames(tmp_path / "one.ogv", "ogg")
    assert not ogg_video_without_frames(tmp_path / "empty.ogv", "flv")
    info = probe_video(tmp_path / "empty.ogv")
    assert (info.status, info.error) == (
        "unreadable",
        "empty video: it holds no frames (its video stream ends after its headers)",
    )


def test_an_flv_cut_before_its_first_frame_is_not_called_empty(tmp_path):
    """Its metadata records the size of the whole file: a copy cut between its metadata tag and
    its first frame holds whole tags and no frame, and is no recording stopped there."""
    from torchkit.core.video.streams import flv_video_without_frames

    if not write_video(tmp_path / "five.flv", "FLV1", 32, 24, 25.0, 5):
        pytest.skip("this OpenCV build cannot write FLV")
    data = (tmp_path / "five.flv").read_bytes()
    first_tag_end = 13 + 11 + int.from_bytes(data[14:17], "big") + 4
    (tmp_path / "cut.flv").write_bytes(data[:first_tag_end])
    assert not flv_video_without_frames(tmp_path / "cut.flv", "flv")
    assert probe_video(tmp_path / "cut.flv").error == "truncated or corrupt flv file"
