"""`torchkit video-info` never loses a file (issue #13), seen as a user sees it: exit codes, the
`Error:` line, and the bytes of the videos before and after; a signal and a full disk in real
processes.

`--extract-frames DIR` is never a video, a folder of them or inside one, nor `.`; `--force` only
over an earlier frames folder; a locked DIR is refused; the old frames folder is back after
SIGTERM or a run that wrote no frame; a full disk is an error; the numeric options have bounds.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import cv2
import numpy as np
import pytest
from disks import fill_disk, slow_io_env
from output_checks import check_refused_untouched, error_line, tree_digest
from processes import (
    processes_in_group,
    run_each_in_process,
    run_torchkit_in_process,
    signal_and_wait,
    start_torchkit_process,
    wait_until,
)
from signal_placement import signalled_on_entry

from torchkit.core.io import outputs
from torchkit.core.io.errors import UsageError
from torchkit.core.io.output_paths import remove_tree
from torchkit.core.io.outputs import OutputFolder
from torchkit.core.video import MAX_SEGMENTS, tsn_frame_indices
from torchkit.core.video import run as video_run


def write_video(path: Path, frames: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(
        str(path), cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (16, 16)
    )
    if not writer.isOpened():
        pytest.skip("this OpenCV build cannot write MJPG AVI")
    rng = np.random.default_rng(frames)
    for _ in range(frames):
        writer.write(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
    writer.release()
    return path


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """One 24-frame 16x16 video, copied where a test needs it."""
    return write_video(tmp_path_factory.mktemp("source") / "clip.avi", 24)


@pytest.fixture
def clips(tmp_path, clip) -> Path:
    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / "a.avi").write_bytes(clip.read_bytes())
    (folder / "b.avi").write_bytes(clip.read_bytes())
    return folder


def video_info(*args, **kwargs):
    return run_torchkit_in_process("video-info", *args, **kwargs)


# --------------------------------------------------------------------------- outputs and inputs


def test_frames_folder_or_report_that_is_in_or_holds_a_video_is_refused(tmp_path, clips):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "real.avi").write_bytes((clips / "a.avi").read_bytes())
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "link.avi").symlink_to(elsewhere / "real.avi")
    (tmp_path / "cwd").mkdir()
    before = tree_digest(tmp_path)
    cases = [
        ([clips, "-k", "2", "--extract-frames", clips, "--force"], "is the video folder"),
        ([clips, "-k", "2", "--extract-frames", clips / "frames"], "lies inside the video folder"),
        ([clips / "a.avi", "-k", "2", "--extract-frames", clips, "--force"], "contains the video"),
        ([linked, "-k", "2", "--extract-frames", elsewhere, "--force"], "contains the video"),
        ([clips, "-k", "2", "--extract-frames", tmp_path, "--force"], "contains the video"),
        ([clips / "a.avi", "-o", clips / "a.avi", "--force"], "is the video"),
        ([clips, "--format", "json", "-o", clips / "b.avi", "--force"], "lies inside the video"),
        ([linked, "-o", elsewhere / "real.avi", "--force"], "is the video"),
    ]
    for (args, message), result in zip(
        cases, run_each_in_process([["video-info", *c] for c, _ in cases]), strict=True
    ):
        assert result.returncode == 1, (args, result.stderr)
        assert message in error_line(result.stderr), args
    here = [
        ["video-info", clips, "-k", "2", "--extract-frames", out, "--force"] for out in (".", "..")
    ]
    for result in run_each_in_process(here, cwd=tmp_path / "cwd"):
        assert result.returncode == 1 and "working directory" in error_line(result.stderr)
    assert tree_digest(tmp_path) == before  # the videos' bytes, and nothing created, no lock left


def test_a_report_that_is_a_frame_of_the_run_is_refused_before_any_work(tmp_path, clips):
    # With --force the report replaced the frame after the extraction (exit 0).
    args = ["video-info", clips, "-k", "2", "--extract-frames", "frames", "--force"]
    check_refused_untouched(
        [*args, "-o", "frames/a_000006.png"], "is a file the command writes in the frames folder",
        cwd=tmp_path,
    )  # fmt: skip
    result = run_torchkit_in_process(*args, "--format", "json", "-o", "frames/a.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(json.loads((tmp_path / "frames" / "a.json").read_text())) == 2


def test_a_report_named_as_the_frames_folder_is_refused_before_any_work(tmp_path, clips):
    # It failed once every frame was written ("output is a folder"), leaving the frames, exit 1.
    check_refused_untouched(
        ["video-info", clips, "-k", "2", "--extract-frames", "frames", "-o", "frames"],
        "output (-o) frames is the same file as frames folder frames",
        cwd=tmp_path,
    )


def test_force_replaces_only_an_earlier_frames_folder(tmp_path, clips):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "holiday.png").write_bytes(b"not a frame of ours")
    result = video_info(clips, "-k", "2", "--extract-frames", mine, "--force")
    assert result.returncode == 1 and "was not written by torchkit" in error_line(result.stderr)
    assert tree_digest(mine) == {"holiday.png": hashlib.sha256(b"not a frame of ours").hexdigest()}
    # Photos named as frames are (<name>_<6 digits>.png) are still the user's: only a frames
    # folder torchkit marked is replaced.
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("IMG_20240315_142530.png", "Screenshot_20240316_090000.png"):
        (photos / name).write_bytes(b"a photo")
    before = tree_digest(photos)
    result = video_info(clips, "-k", "2", "--extract-frames", photos, "--force")
    assert result.returncode == 1 and "was not written by torchkit" in error_line(result.stderr)
    assert tree_digest(photos) == before
    old = tmp_path / "old"
    assert video_info(clips, "-k", "2", "--extract-frames", old).returncode == 0
    result = video_info(clips, "-k", "3", "--extract-frames", old, "--force")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in old.glob("*.png")) == [
        f"{v}_{i:06d}.png" for v in "ab" for i in (4, 12, 20)
    ]


def test_frames_of_videos_named_alike_but_for_case_stay_apart_where_case_is_ignored(
    tmp_path, clip, monkeypatch
):
    # Clip_000012.png and clip_000012.png are one file on an exFAT disk, macOS or a Samba
    # share: there the second video's frames are named as a repeated name's, clip-2_...
    videos = tmp_path / "videos"
    for name in ("a/Clip.avi", "b/clip.avi"):
        (videos / name).parent.mkdir(parents=True)
        (videos / name).write_bytes(clip.read_bytes())
    monkeypatch.setattr(video_run, "folds_case", lambda folder: True)
    result = video_info(videos, "-k", "1", "--extract-frames", tmp_path / "folded")
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in (tmp_path / "folded").glob("*.png"))
    assert names == ["Clip_000012.png", "clip-2_000012.png"]
    monkeypatch.undo()  # a file system that tells case apart: the names as before
    result = video_info(videos, "-k", "1", "--extract-frames", tmp_path / "plain")
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in (tmp_path / "plain").glob("*.png"))
    assert names == ["Clip_000012.png", "clip_000012.png"]


def test_a_second_run_on_a_locked_frames_folder_is_refused_at_once(tmp_path, clips):
    from torchkit.core.io.output_locks import FolderLock

    frames = tmp_path / "frames"
    lock = FolderLock(frames, "frames folder")  # as another torchkit process writing it would
    try:
        result = video_info(clips, "-k", "2", "--extract-frames", frames)
    finally:
        lock.release()
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert "being written by another torchkit process" in line and f"PID {os.getpid()}" in line
    assert not frames.exists()


def test_a_run_that_writes_no_frame_puts_the_old_frames_folder_back(tmp_path, clips):
    frames = tmp_path / "frames"
    assert video_info(clips, "-k", "2", "--extract-frames", frames).returncode == 0
    before = tree_digest(frames)
    notes = tmp_path / "notes.mp4"
    notes.write_text("not a video")
    result = video_info(notes, "-k", "5", "--extract-frames", frames, "--force")
    assert result.returncode == 1 and "could not be read" in error_line(result.stderr)
    assert tree_digest(frames) == before
    assert sorted(os.listdir(tmp_path)) == ["clips", "frames", "notes.mp4"]


# --------------------------------------------------------------------------- numeric options


def test_segments_workers_and_seed_have_bounds_and_the_largest_values_work(tmp_path, clips):
    video = clips / "a.avi"
    refused = [
        ["-k", str(MAX_SEGMENTS + 1)],
        ["-k", "1000000000000000"],
        ["-k", "0"],
        ["-j", "65"],
        ["-j", "100000000"],
        ["--seed", "-1"],
    ]
    results = run_each_in_process([["video-info", video, *args] for args in refused])
    for args, result in zip(refused, results, strict=True):
        assert result.returncode == 2, (args, result.stderr)
        assert error_line(result.stderr)
    frames = tmp_path / "frames"
    result = video_info(
        clips, "-k", str(MAX_SEGMENTS), "-j", "64", "--sample-mode", "train",
        "--seed", str(2**32 - 1), "--extract-frames", frames, "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    for row in rows:
        assert len(row["frame_indices"]) == MAX_SEGMENTS == len(row["frame_files"])
        assert sorted(set(row["frame_indices"])) == list(range(24))  # every frame, repeated
    assert len(list(frames.glob("*.png"))) == 2 * 24  # each frame written once


def test_segments_bound_holds_in_core_before_any_allocation():
    with pytest.raises(UsageError, match="more than 10,000"):
        tsn_frame_indices(10, 10**15)  # would need petabytes if it were attempted
    assert len(tsn_frame_indices(10**12, MAX_SEGMENTS, "train", 0)) == MAX_SEGMENTS


# --------------------------------------------------------------------------- signals, full disk


def test_sigterm_mid_extraction_leaves_the_old_frames_folder(tmp_path, clip):
    video = write_video(tmp_path / "long" / "long.avi", 60)
    frames = tmp_path / "frames"
    assert video_info(video, "-k", "2", "--extract-frames", frames).returncode == 0
    before = tree_digest(frames)
    process = start_torchkit_process(
        "video-info", str(video), "-k", "40", "--extract-frames", str(frames), "--force",
        env=slow_io_env(tmp_path, tmp_path / ".frames.", calls=["os.replace"]),
    )  # fmt: skip
    # The new frames go to a hidden folder beside the old one, which they replace at the end.
    wait_until(
        lambda: len(list(tmp_path.glob(".frames.*.partial/*.png"))) >= 3,
        process=process,
        what="a few new frames",
    )
    assert tree_digest(frames) == before
    code, _, err = signal_and_wait(process, signal.SIGTERM)
    assert code == 143 and "Terminated" in err and "Traceback" not in err
    assert not processes_in_group(process.pid)
    assert tree_digest(frames) == before
    assert sorted(os.listdir(tmp_path)) == ["frames", "long", "slow-io"]  # no temporary, lock


def test_sigterm_as_the_new_frames_take_their_place_leaves_no_hidden_folder(tmp_path, clip):
    # A stop in the swap at the end (all frames written in the hidden folder) was not
    # abandoned: exit 143, the old folder in place, and .frames.XXXX.partial left with every
    # new frame in it until a next run on the same folder.
    video = tmp_path / "clip.avi"
    video.write_bytes(clip.read_bytes())
    frames = tmp_path / "frames"
    slow = slow_io_env(tmp_path, frames, calls=["os.replace"], delay=3)  # the swap's renames
    process = start_torchkit_process(
        "video-info", str(video), "-k", "4", "--extract-frames", str(frames), env=slow
    )
    wait_until(
        lambda: len(list(tmp_path.glob(".frames.*.partial/*.png"))) == 4,
        process=process,
        what="every new frame",
    )
    code, _, err = signal_and_wait(process, signal.SIGTERM)
    assert code == 143 and "Terminated" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["clip.avi", "slow-io"]  # no frames, no temporary


@pytest.fixture
def earlier_frames(tmp_path, clip) -> tuple[Path, Path]:
    """clip.avi and the frames folder an earlier run extracted from it (2 frames)."""
    video = tmp_path / "clip.avi"
    video.write_bytes(clip.read_bytes())
    frames = tmp_path / "frames"
    assert video_info(video, "-k", "2", "--extract-frames", frames).returncode == 0
    return video, frames


def test_sigterm_as_the_frames_folder_is_finished_leaves_no_hidden_folder(
    tmp_path, earlier_frames, monkeypatch
):
    # Every frame written, the signal handled as the frames folder's finish() is entered,
    # before that method's own clean-up is in place (Python runs a pending handler at a call's
    # start; a signal that came during the last progress update is raised there): exit 143,
    # and .frames.XXXX.partial was left with every new frame in it.
    video, frames = earlier_frames
    before = tree_digest(frames)
    signalled = signalled_on_entry(monkeypatch, OutputFolder, "finish", lambda _, ok, *a, **k: ok)
    result = video_info(video, "-k", "4", "--extract-frames", frames, "--force")
    assert signalled and result.returncode == 143 and "Terminated" in result.stderr
    assert tree_digest(frames) == before  # the old frames as they were
    assert sorted(os.listdir(tmp_path)) == ["clip.avi", "frames"]  # no hidden folder, no lock


def test_sigterm_while_the_old_frames_are_deleted_leaves_no_hidden_folder(tmp_path, earlier_frames):
    # The new frames were in place and the old folder, renamed .frames.XXXX.discarded, was
    # being deleted: the stop ended the delete half-way (exit 143), the hidden folder stayed.
    video, frames = earlier_frames
    slow = slow_io_env(tmp_path, Path(".discarded"), calls=["os.replace"], delay=3, after=True)
    process = start_torchkit_process(
        "video-info", str(video), "-k", "4", "--extract-frames", str(frames), "--force", env=slow
    )
    wait_until(
        lambda: list(tmp_path.glob(".frames.*.discarded")), process=process, what="the delete"
    )
    code, _, err = signal_and_wait(process, signal.SIGTERM)
    assert code == 143 and "Terminated" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["clip.avi", "frames", "slow-io"]
    assert len(list(frames.glob("*.png"))) == 4  # the new frames, whole


def test_sigterm_as_the_old_frames_delete_begins_leaves_no_hidden_folder(
    tmp_path, earlier_frames, monkeypatch
):
    # The new frames in place, the signal handled as the delete of the old folder (set aside
    # as .frames.XXXX.replaced) was entered, before the delete's own clean-up was in place:
    # exit 143, and the old frames stayed hidden until a next run on the same folder.
    video, frames = earlier_frames
    signalled = signalled_on_entry(monkeypatch, outputs, "discard_tree")
    result = video_info(video, "-k", "4", "--extract-frames", frames, "--force")
    assert signalled[0][0].name.endswith(".replaced") and result.returncode == 143
    assert "Terminated" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["clip.avi", "frames"]  # no hidden folder, no lock
    assert len(list(frames.glob("*.png"))) == 4  # the new frames, whole


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="worker processes need 2 cores")
def test_sigterm_while_worker_processes_read_stops_them_all(tmp_path):
    """Many videos are read by worker processes: SIGTERM to the command ends it with 143 and
    leaves none of them running."""
    from torchkit.core.video.run import MIN_VIDEOS_PER_PROCESS

    long_video = write_video(tmp_path / "source" / "long.avi", 6_000)  # ~0.07 s to count
    folder = tmp_path / "videos"
    folder.mkdir()
    for index in range(2 * MIN_VIDEOS_PER_PROCESS + 8):
        os.link(long_video, folder / f"{index:03d}.avi")
    process = start_torchkit_process("video-info", str(folder), "--exact", "-j", "4")
    wait_until(
        lambda: len(processes_in_group(process.pid)) >= 3,
        process=process,
        what="the worker processes",
    )
    code, out, err = signal_and_wait(process, signal.SIGTERM)
    assert code == 143 and "Terminated" in err and "Traceback" not in err
    assert out == ""  # no partial table
    # The workers are gone when it ends; multiprocessing's resource tracker (spawned workers
    # have one) ends as soon as it reads that they are.
    wait_until(lambda: not processes_in_group(process.pid), timeout=30, what="every process")


def test_a_full_disk_is_an_error_not_a_skipped_video(tmp_path, small_tmpfs, clips):
    disk = small_tmpfs(16)  # four 4 KiB pages: the lock, the marker, two frames
    before = tree_digest(clips)
    args = [clips, "-k", "10", "--extract-frames", disk / "frames", "-j", "0"]
    result = run_torchkit_in_process("video-info", *map(str, args))
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert f"cannot write {disk / 'frames'}" in line and "No space left" in line
    assert "could not be read" not in result.stderr
    assert tree_digest(clips) == before and os.listdir(disk) == []


def test_a_report_the_full_disk_refuses_leaves_the_old_frames_and_report(
    tmp_path, small_tmpfs, clips
):
    """`video-info -k K --extract-frames DIR -o REPORT --force` where REPORT's disk is full: the
    new frames had replaced the old folder while the command failed. The old frames folder and
    report are as they were now, and nothing is left beside them."""
    old = tmp_path / "frames"
    assert video_info(clips, "-k", "2", "--extract-frames", old).returncode == 0
    before = tree_digest(old)
    disk = small_tmpfs(64)
    report = disk / "report.json"
    report.write_text('{"old": "report"}\n')
    fill_disk(disk)
    args = ["-k", "3", "--extract-frames", old, "-o", report, "--force", "-j", "0"]
    result = video_info(clips, *args)
    assert result.returncode == 1, result.stderr
    assert error_line(result.stderr).startswith(f"Error: cannot write {report}: No space left")
    assert report.read_text() == '{"old": "report"}\n'
    assert sorted(os.listdir(disk)) == ["filler", "report.json"]
    assert tree_digest(old) == before
    assert sorted(os.listdir(tmp_path)) == ["clips", "frames", disk.name]


def test_a_frames_folder_removed_while_frames_are_written_stops_the_run(
    tmp_path, clips, monkeypatch
):
    """The error of the folder, once, not a failed video each."""
    from torchkit.core.video import frames

    written = frames.atomic_write_bytes

    def then_removed(target, data):
        written(target, data)
        if os.path.isdir(target.parent):
            remove_tree(target.parent)  # the hidden folder being filled

    monkeypatch.setattr(frames, "atomic_write_bytes", then_removed)
    out = tmp_path / "frames"
    result = video_info(clips, "-k", "2", "--extract-frames", out, "-j", "0")
    assert result.returncode == 1, result.stderr
    assert error_line(result.stderr).startswith(
        f"Error: frames folder {out} was removed or replaced while video-info was writing into "
        "it: it is gone"
    )
    assert "could not be read" not in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["clips"]
