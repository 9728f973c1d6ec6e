"""Videos for video-info's damage checks: zeroed copies of whole files, the frames OpenCV
decodes of a file (counted apart from torchkit's code), and files a real encoder writes, made
with the `ffmpeg` command where this machine has one (a test that needs it skips without it,
or without the encoder or muxer it names)."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import cv2
import pytest


def zeroed_copy(source: Path, folder: Path, at: float = 0.5, share: float = 0.1) -> Path:
    """A copy of `source` whose bytes from `at` of the way in, `share` of them, are zeroes:
    as an unfinished download's preallocated file or a failing disk leaves a file, every
    byte its container declares there."""
    data = bytearray(source.read_bytes())
    start, length = int(len(data) * at), int(len(data) * share)
    data[start : start + length] = bytes(length)
    target = folder / f"zeroed-{int(at * 100)}-{source.name}"
    target.write_bytes(bytes(data))
    return target


def decoded_by_opencv(path: Path) -> int:
    """The frames OpenCV's FFmpeg decodes of `path`, counted apart from torchkit's code."""
    capture, frames = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG), 0
    while capture.grab():
        frames += 1
    capture.release()
    return frames


def ffprobe_entries(path: Path, entries: str) -> list[str] | None:
    """The values `ffprobe -show_entries ENTRIES` gives for the first video stream of `path`,
    one a line (`stream=r_frame_rate`: its rate; `packet=duration_time`: each packet's), to
    check figures against apart from torchkit; None where this machine has no ffprobe."""
    if shutil.which("ffprobe") is None:
        return None
    command = ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", entries]
    probed = subprocess.run(
        [*command, "-of", "csv=p=0", str(path)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [line.strip(",") for line in probed.stdout.split()]


@functools.cache
def _ffmpeg_offers(listing: str) -> frozenset[str]:
    """The names `ffmpeg -encoders` or `-muxers` lists (none without ffmpeg)."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        return frozenset()
    done = subprocess.run(
        [ffmpeg, "-hide_banner", f"-{listing}"], capture_output=True, text=True, check=False
    )
    # " V..... libx264  libx264 H.264 ..." (encoders), " E mp4  MP4 (MPEG-4 Part 14)" (muxers),
    # after a legend of lines like " V..... = Video" and a " ------" line
    rows = [line.split() for line in done.stdout.splitlines() if line[:1] == " "]
    return frozenset(row[1] for row in rows if len(row) > 2 and row[1] != "=")


def ffmpeg_made(target: Path, *args: str, encoders: tuple[str, ...] = (), muxer: str = "") -> Path:
    """`target`, written by `ffmpeg -y ARGS target`: skips the test where this machine has no
    ffmpeg, or one without the `encoders` or the `muxer` named."""
    if shutil.which("ffmpeg") is None:
        pytest.skip("no ffmpeg command on this machine")
    missing = [e for e in encoders if e not in _ffmpeg_offers("encoders")]
    missing += [muxer] if muxer and muxer not in _ffmpeg_offers("muxers") else []
    if missing:
        pytest.skip(f"this ffmpeg has no {', '.join(missing)}")
    command = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin", "-y", *args]
    done = subprocess.run([*command, str(target)], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and target.exists(), done.stderr
    return target


def ffmpeg_packet_sizes(path: Path) -> list[int]:
    """The sizes of the packets FFmpeg's demuxer reads of the first video stream of `path`
    (`ffmpeg -c copy -f framecrc`), in order, to check a count against apart from torchkit:
    an encoder's packets of no bytes (a Theora frame repeated) among them."""
    command = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin", "-i", str(path)]
    done = subprocess.run(
        [*command, "-map", "0:v:0", "-c", "copy", "-f", "framecrc", "-"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    # "0,  11,  11,  1,  0, 0x00000000, F=0x0": stream, dts, pts, duration, size, checksum
    rows = [line.split(",") for line in done.stdout.splitlines() if not line.startswith("#")]
    return [int(row[4]) for row in rows if len(row) > 5]


def moving_picture(seconds: float, size: str = "64x48", rate: int = 25) -> tuple[str, ...]:
    """ffmpeg input options of a moving test picture of `seconds` at `rate` fps."""
    return ("-f", "lavfi", "-i", f"testsrc=size={size}:rate={rate}:duration={seconds}")
