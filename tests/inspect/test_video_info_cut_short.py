"""`video-info --format jsonl`: one JSON object a line, so that a run stopped part-way (SIGTERM,
Ctrl-C) leaves on stdout whole records of the videos done, each of which a reader can take (the
JSON array such a stop leaves unclosed, so that no parser takes the part for the whole list:
test_video_info.py)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
from processes import PipeLines, run_torchkit_in_process, signal_and_wait, start_torchkit_process


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """A 12-frame 16x16 MJPG AVI."""
    path = tmp_path_factory.mktemp("clips") / "clip.avi"
    writer = cv2.VideoWriter(
        str(path), cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (16, 16)
    )
    if not writer.isOpened():
        pytest.skip("this OpenCV build cannot write MJPG AVI")
    for index in range(12):
        writer.write(np.full((16, 16, 3), index * 20, dtype=np.uint8))
    writer.release()
    return path


def test_sigterm_part_way_leaves_whole_json_lines_of_the_videos_done(tmp_path, clip):
    second = tmp_path / "second.avi"
    second.write_bytes(clip.read_bytes())
    process = start_torchkit_process("video-info", "-", "--format", "jsonl", stdin=subprocess.PIPE)
    # The list on stdin is still open: the rows of the two videos listed come out, and the
    # run waits for more paths when it is stopped.
    process.stdin.write(f"{clip}\n{second}\n")
    process.stdin.flush()
    lines = PipeLines(process.stdout)
    done = [lines.next(), lines.next()]
    code, _, err = signal_and_wait(process, signal.SIGTERM)
    assert code == 143 and "Terminated" in err and "Traceback" not in err
    done += lines.rest()
    assert all(line.endswith("\n") for line in done)
    records = [json.loads(line) for line in done]
    assert [r["path"] for r in records] == [str(clip), str(second)]
    assert [r["frames"] for r in records] == [12, 12]
    assert [r["status"] for r in records] == ["ok", "ok"]


def test_jsonl_is_the_format_an_o_file_named_so_gets_with_frames_too(tmp_path, clip):
    report, frames = tmp_path / "info.jsonl", tmp_path / "frames"
    done = run_torchkit_in_process("video-info", clip, "-o", report)
    assert done.returncode == 0, done.stderr
    (record,) = [json.loads(line) for line in report.read_text().splitlines()]
    assert record["path"] == str(clip) and record["width"] == 16
    # --extract-frames gathers every video first; the lines are the same records.
    done = run_torchkit_in_process(
        "video-info", clip, clip, "-k", "2", "--extract-frames", frames, "--format", "jsonl"
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["frame_indices"] for r in records] == [[3, 9]]  # a path listed twice: read once
    assert records[0]["frame_files"] == [str(frames / f"clip_00000{i}.png") for i in (3, 9)]
