"""`video-info`: the metadata of many videos at once, in the order given, with TSN frame indices
and the sampled frames written when asked.

OpenCV opens one capture at a time per process (FFmpeg's open runs behind a process-wide lock),
and opening is most of the work of a header read, so threads alone are bounded by that lock
however many cores there are. Many videos are therefore read by worker processes (the pool
`convert` and `dataset-stats` share), each with a few threads of its own, which overlap decoding
and waiting on the disk. Writing sampled frames (`--extract-frames`) stays on threads of this
process, which owns the frames folder.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import PurePath
from typing import Any

from torchkit.core.io.claims import reporting_write_errors
from torchkit.core.io.errors import UsageError
from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.io.files import STDIN, folds_case
from torchkit.core.io.outputs import OutputFolder
from torchkit.core.io.overlap import (
    InputPath,
    check_distinct_outputs,
    check_not_written_in,
    check_overlap,
)
from torchkit.core.io.path_lists import PathStream
from torchkit.core.io.progress import Progress
from torchkit.core.runtime.cpus import usable_cpus
from torchkit.core.runtime.pool import WorkerPool, chunked, map_chunks
from torchkit.core.runtime.seeding import check_seed
from torchkit.core.video.containers import find_named_videos, input_name, video_key
from torchkit.core.video.frames import (
    FRAME_FILES,
    MAX_SEGMENTS,
    SAMPLE_MODES,
    SegmentOptions,
    _FramesFolder,
    _sample_into,
    frame_name_prefixes,
)
from torchkit.core.video.held import walks_kept
from torchkit.core.video.probe import VideoInfo, _Stopped, probe_video, recount_frames

# Upper bounds of the numeric options: a larger value is a usage error (exit 2), so that no value
# makes the command run out of memory (--segments: frames.MAX_SEGMENTS). Each worker thread holds
# an open decoder (FFmpeg starts its own threads for it): 64 at once is more than a disk or the
# cores can feed. --seed is one of every command's seeds (runtime.seeding.SEEDS).
MAX_WORKERS = 64
# Videos per worker process at the least: fewer are read sooner by this process's threads than a
# process is started for them.
MIN_VIDEOS_PER_PROCESS = 64
# FFmpeg threads of each video's decoder while several videos are read at once (None: FFmpeg's
# choice, one per core): the videos are the parallel work (probe._open_capture).
DECODER_THREADS: int | None = 1
# How much larger than the first (`_chunk_size`) the later chunks of the videos listed on stdin
# are: each chunk waits for the last of its videos (and started its worker processes afresh, 0.5-1
# s for 2 processes here, before they were kept across chunks: `WorkerPool`), which, 2,048 videos
# a chunk, tripled the time of 100,000 empty files; 16x holds at most some 50 MB of records.
STREAMED_CHUNK_GROWTH = 16
# Videos handed to a worker process at a time: few enough that the progress moves and the
# workers finish together, many enough that sending them costs little.
VIDEOS_PER_CHUNK = 64


def video_inputs(
    paths: Iterable[str | os.PathLike], videos: Iterable[str | os.PathLike] = ()
) -> list[InputPath]:
    """What video-info reads: every path given (a folder: its whole tree) and every video found
    (a link in a folder: the video it points to). No output may be, hold or lie in one."""
    inputs = [InputPath.of(p, "video folder" if os.path.isdir(p) else "video") for p in paths]
    return inputs + [InputPath.of(v, "video") for v in videos]


def default_video_workers() -> int:
    """Threads: OpenCV releases the GIL while it opens and decodes, and reading headers waits on
    the disk more than on the CPU, so a few more threads than cores pay off."""
    return max(1, min(16, 2 * usable_cpus()))


def inspect_videos(
    paths: Sequence[str | os.PathLike],
    *,
    exact: bool = False,
    decode_check: bool = True,
    segments: int | None = None,
    sample_mode: str = "test",
    seed: int = 0,
    extract_dir: str | os.PathLike | None = None,
    force: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
    report: str | os.PathLike | None = None,
    stdin: Iterable[str] | None = None,
    before_keep: Callable[[list[VideoInfo]], None] | None = None,
) -> list[VideoInfo]:
    """Metadata of every video in `paths` (files, or folders searched recursively), in order.

    `exact` counts frames by decoding; `decode_check` decodes the first (see `probe_video`).
    `segments` also samples TSN frame indices from each video's frame count (train mode draws
    from an independent stream per video, seeded by `seed` and the video's name in its input,
    `containers.input_name`: neither the thread schedule nor the other videos listed change
    it); `extract_dir` writes those frames as PNG (through
    `core.outputs`: never a video or a folder of them, `--force` only over an earlier frames
    folder, locked, filled beside it and put in place at the end: the old one stays if the run
    fails, is stopped or writes no frame). `report` is the `-o` file the caller will write:
    checked with the rest, before any work. Unreadable videos come back with `error` set. A
    path `-` stands for the files `stdin` lists. `before_keep(results)` runs before the new
    frames replace the old folder (the caller writes its report there): if it raises, the old
    frames folder stays.
    """
    _check_options(segments, workers, seed, sample_mode)
    if extract_dir is not None and segments is None:
        raise UsageError("--extract-frames needs --segments K", "say how many frames to sample")
    named = find_named_videos(paths, stdin)
    videos = list(named)
    inputs = video_inputs([p for p in paths if os.fspath(p) != STDIN], videos)
    if report is not None:
        check_output_file(report, force, inputs)
        if extract_dir is not None:
            # -o naming the frames folder itself failed only once every frame was written
            check_distinct_outputs((extract_dir, "frames folder"), (report, "output (-o)"))
            check_not_written_in(report, extract_dir, _writes_frame, "frames folder")
    with contextlib.ExitStack() as stack:
        frames_folder = None
        if segments is not None and extract_dir is not None:
            out = OutputFolder(
                extract_dir,
                command="video-info",
                force=force,
                inputs=inputs,
                # No `known_files`: frame names (`<video>_<frame>.png`) are those of anybody's
                # photos too (`IMG_20240315_142530.png`): --force replaces a marked folder only.
                what="frames folder",
                atomic=True,  # filled as a hidden temporary folder, in place at once at the end
                owned=FRAME_FILES,
                reports=[report],  # this run's -o report, where it is written into the folder
            )
            stack.callback(out.release)
            # The frames go to a temporary folder beside it, on the same file system, which
            # the probe's file is made in (and removed from).
            with reporting_write_errors(out.final):
                folding = folds_case(out.final.parent)
            frames_folder = _FramesFolder(out, folding)
        # Abandoned here on any failure or stop until the new frames are kept, not only in
        # the steps that catch their own: Python raises a signal's exception at the next
        # call's start, so one that came as the last video was handed over was raised as
        # `finish` below was entered, before its clean-up was in place, and left the hidden
        # folder with every new frame in it.
        try:
            results = _inspect(
                videos, exact, decode_check, segments, sample_mode, seed, frames_folder,
                workers, progress, named,
            )  # fmt: skip
            if before_keep is not None:
                before_keep(results)
            if frames_folder is not None:
                # Keep the new frames (they replace the old folder) once there are any; with
                # none written, the old frames folder stays as if nothing had run. A stop or an
                # error in the swap itself abandons them too (`finish`): `keep()` alone left
                # the hidden folder with every new frame in it.
                frames_folder.folder.finish(bool(frames_folder.frames))
        except BaseException as error:
            if frames_folder is not None:  # nothing to do where finish() has kept or abandoned
                frames_folder.folder.finish(False, error)
            raise
        return results


def stream_videos(
    paths: Sequence[str | os.PathLike],
    *,
    exact: bool = False,
    decode_check: bool = True,
    segments: int | None = None,
    sample_mode: str = "test",
    seed: int = 0,
    force: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
    report: str | os.PathLike | None = None,
    stdin: Iterable[str] | None = None,
) -> Callable[[Callable[[VideoInfo], None]], None]:
    """`inspect_videos` without frames written, as a reading to start (`read(on_record)`)
    that hands each record to `on_record` as soon as those before it are, keeping none:
    memory does not grow with the records. Every check is made here, before any output is
    opened. `-` alone reads the paths on stdin as they are piped, a thousand or more at a time
    (`_chunk_size`), then 16 times as many at a time (`_ListedVideos.chunks`; a video listed
    twice is read once, as in `find_videos`), each checked against `report` as it comes, by one
    set of worker processes (started at the first chunk long enough for them);
    `progress` then gets (done, None)."""
    _check_options(segments, workers, seed, sample_mode)
    options = (exact, decode_check, segments, sample_mode, seed)
    if [os.fspath(p) for p in paths] != [STDIN]:
        named = find_named_videos(paths, stdin)
        videos = list(named)
        if report is not None:
            inputs = video_inputs([p for p in paths if os.fspath(p) != STDIN], videos)
            check_output_file(report, force, inputs)

        def read(on_record: Callable[[VideoInfo], None]) -> None:
            _inspect(videos, *options, None, workers, progress, named, on_record)

        return read
    size = _chunk_size(workers)
    chunks = _ListedVideos(stdin).chunks(size, size * STREAMED_CHUNK_GROWTH)
    first = next(chunks)  # the videos piped so far, checked with the rest before any work
    if report is not None:
        check_output_file(report, force, video_inputs([], first))

    def read_listed(on_record: Callable[[VideoInfo], None]) -> None:
        done = 0
        threads = default_video_workers() if workers is None else workers
        most = _worker_processes(size * STREAMED_CHUNK_GROWTH, threads)
        with WorkerPool(most, start_fresh=True) as pool:  # see _read_in_processes
            for chunk in itertools.chain([first], chunks):
                if report is not None and chunk is not first:  # -o is none of the videos listed
                    check_overlap(report, "output", video_inputs([], chunk))

                def advance(count: int, _total: int | None, before: int = done) -> None:
                    progress(before + count, None)  # type: ignore[misc]

                chunk_progress = advance if progress is not None else None
                _inspect(chunk, *options, None, workers, chunk_progress, None, on_record, pool)
                done += len(chunk)

    return read_listed


def _chunk_size(workers: int | None) -> int:
    """Videos read at a time by `stream_videos`: every worker process and thread busy (as
    `_worker_processes` starts them for a list this long) long enough that the start of the
    processes and the wait for the last of them cost little (1.6 KB a record held)."""
    threads = default_video_workers() if workers is None else max(1, workers)
    return MIN_VIDEOS_PER_PROCESS * min(usable_cpus(), threads) * 16


class _ListedVideos:
    """The videos listed on stdin, each once, taken as they are piped."""

    def __init__(self, stdin: Iterable[str] | None) -> None:
        self.stream = PathStream(stdin, "video")
        self.seen: set[str] = set()

    def chunks(self, first: int, most: int) -> Iterator[list[str]]:
        """A chunk of up to `first` videos, then of up to `most`: the first rows come soon,
        and a long list starts few sets of worker processes."""
        size = first
        while paths := self.stream.take(size):
            fresh = [path for path in paths if self._first_time(path)]
            if fresh:
                yield fresh
            size = most

    def _first_time(self, path: str) -> bool:
        key = video_key(path)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def _check_options(segments: int | None, workers: int | None, seed: int, sample_mode: str) -> None:
    if segments is not None and not 1 <= segments <= MAX_SEGMENTS:
        raise UsageError(
            f"--segments must be between 1 and {MAX_SEGMENTS:,}, not {segments}",
            "every video's row holds its K frame indices",
        )
    if workers is not None and not 0 <= workers <= MAX_WORKERS:
        raise UsageError(
            f"--workers must be between 0 and {MAX_WORKERS}, not {workers}",
            "more videos at once than a disk or the cores can feed only costs memory",
        )
    check_seed(seed)
    if sample_mode not in SAMPLE_MODES:
        raise UsageError(f"unknown sample mode {sample_mode!r}", "use 'test' or 'train'")


def _writes_frame(relative: PurePath) -> bool:
    """Whether a frames folder holds `relative`: a frame (`<video>_<frame>.png`, any
    video's) or a hidden file of its own (the marker, the temporary folder)."""
    return relative.parts[0].startswith(".") or fnmatchcase(
        relative.name.casefold(), FRAME_FILES[0]
    )


def _inspect(
    videos: list[str],
    exact: bool,
    decode_check: bool,
    segments: int | None,
    sample_mode: str,
    seed: int,
    frames_folder: _FramesFolder | None,
    workers: int | None,
    progress: Progress | None,
    names: dict[str, str] | None = None,
    on_record: Callable[[VideoInfo], None] | None = None,
    pool: WorkerPool | None = None,
) -> list[VideoInfo]:
    """The records of `videos` (`names`: each one's name in its input, which seeds its
    train-mode sampling; None: its path as listed), in order; with `on_record`, each handed to
    it as soon as those before it are, and none kept (the list returned is empty). `pool`: the
    worker processes to read them in, where they are many (kept across calls), instead of a
    set started for them."""
    threads = default_video_workers() if workers is None else workers
    # One video decoded at length alone (--exact, or its frames extracted; one video or -j 1)
    # keeps FFmpeg's threads for itself.
    at_length = exact or frames_folder is not None
    alone = at_length and (threads <= 1 or len(videos) == 1)
    # Sampling needs a count: one the header does not give is decoded where the video is read
    # (a worker process, many at once), not one video at a time where the records are gathered.
    count_missing = segments is not None
    reading = _Reading(exact, decode_check, None if alone else DECODER_THREADS, count_missing)
    options = None
    if segments is not None:
        options = SegmentOptions(segments, sample_mode, seed)
        options.decoder_threads = reading.decoder_threads  # to extract, or count, its frames
        if frames_folder is not None:
            options.extract_dir = frames_folder.folder.final
            options.names = frame_name_prefixes(videos, fold_case=frames_folder.folds_case)
    train = options is not None and sample_mode == "train"
    stop = threading.Event()
    records: list[VideoInfo] = []
    hand = on_record or records.append

    def sample(position: int, info: VideoInfo) -> VideoInfo:
        if options is not None and info.status == "ok":
            video = videos[position]
            name = names[video] if names is not None else input_name(video)
            stream = _video_seed(seed, name) if train else None
            _sample_into(info, options, stream, frames_folder, stop)
        return info

    processes = _worker_processes(len(videos), threads) if frames_folder is None else 1
    if processes > 1:

        def arrived(position: int, info: VideoInfo) -> None:
            hand(sample(position, info))

        _read_in_processes(videos, reading, processes, threads, progress, arrived, pool)
        return records

    def work(position: int) -> VideoInfo:
        if stop.is_set():
            raise _Stopped()
        return sample(position, reading.probe(videos[position], stop))

    try:
        _run_all(work, len(videos), threads, progress, stop, hand)
        return records
    except BaseException:
        if frames_folder is not None:
            frames_folder.folder.abandon()  # this run's frames removed, the old folder stays
        raise


def _worker_processes(total: int, threads: int) -> int:
    """Processes for `total` videos read `threads` at a time: one per core at most, and none
    that would get fewer than MIN_VIDEOS_PER_PROCESS videos (1: this process alone)."""
    return max(1, min(usable_cpus(), threads, total // MIN_VIDEOS_PER_PROCESS))


@dataclass
class _Reading:
    """How each video is read: `probe_video`'s options, and whether a video whose container
    gives no frame count has its frames counted by decoding (`count_missing`: to sample them)."""

    exact: bool
    decode_check: bool
    decoder_threads: int | None
    count_missing: bool = False

    def probe(self, path: str | os.PathLike, stop: threading.Event | None = None) -> VideoInfo:
        # One scope for both: an Ogg file's pages are walked once for the probe and the count
        with walks_kept():
            info = probe_video(
                path,
                exact=self.exact,
                decode_check=self.decode_check,
                stop=stop,
                decoder_threads=self.decoder_threads,
            )
            if self.count_missing and info.status == "ok" and info.frames is None:
                try:
                    recount_frames(info, stop, self.decoder_threads)
                except _Stopped:
                    raise
                except Exception:  # left uncounted: sampling counts it again and says why not
                    pass
        return info


def _read_in_processes(
    videos: list[str],
    reading: _Reading,
    processes: int,
    threads: int,
    progress: Progress | None,
    hand: Callable[[int, VideoInfo], None],
    pool: WorkerPool | None = None,
) -> None:
    """`probe_video` of every video in `processes` worker processes (`pool`'s, where given),
    `threads` videos at a time in all; each (position, record) handed over in the order of
    `videos` as soon as those before it are (the records that come early wait: a few chunks'
    worth, those in flight). Ctrl-C, SIGTERM or an error stops the workers at once
    (core.runtime.pool)."""
    total = len(videos)
    early: dict[int, VideoInfo] = {}
    done = 0
    if progress:
        progress(0, total)

    def arrived(chunk_result: list[tuple[int, VideoInfo]]) -> None:
        nonlocal done
        early.update(chunk_result)
        while done in early:
            hand(done, early.pop(done))
            done += 1
        if progress:
            progress(done, total)

    if pool is not None:
        processes = pool.workers  # each busy: as many as the longest chunk would start
    per_process = max(1, -(-threads // processes))
    positions = list(range(total))
    jobs = [
        _ChunkJob([(at, str(videos[at])) for at in chunk], reading, per_process)
        for chunk in chunked(positions, processes, most=VIDEOS_PER_CHUNK)
    ]
    # Workers start as new interpreters, not forks of this process: a fork of a process whose
    # OpenCV or FFmpeg threads ran copies their locks mid-use, and a worker that takes one hangs
    # (a library user's process, or one that read videos before).
    if pool is not None:
        pool.map(_read_chunk, jobs, arrived)
        return
    map_chunks(_read_chunk, jobs, workers=processes, on_result=arrived, start_fresh=True)


@dataclass
class _ChunkJob:
    """The videos (position, path) one worker process reads, and how."""

    videos: list[tuple[int, str]]
    reading: _Reading
    threads: int


def _read_chunk(job: _ChunkJob) -> list[tuple[int, VideoInfo]]:
    """In a worker process: `probe_video` of the job's videos, `job.threads` at a time (a
    worker that is stopped is terminated: no stop event to watch)."""

    def read(video: tuple[int, str]) -> tuple[int, VideoInfo]:
        position, path = video
        return position, job.reading.probe(path)

    if job.threads <= 1 or len(job.videos) == 1:
        return [read(video) for video in job.videos]
    with ThreadPoolExecutor(max_workers=job.threads, thread_name_prefix="video-info") as pool:
        return list(pool.map(read, job.videos))


def _run_all(
    work,
    total: int,
    threads: int,
    progress: Progress | None,
    stop: threading.Event,
    hand: Callable[[VideoInfo], None],
) -> None:
    """`work(position)` of every position on `threads` threads, each record handed over in
    order; a few videos a thread are asked for ahead (not a future for every video at once)."""
    if progress:
        progress(0, total)
    if threads <= 1 or total == 1:
        for position in range(total):
            hand(work(position))
            if progress:
                progress(position + 1, total)
        return
    pool = ThreadPoolExecutor(max_workers=min(threads, total), thread_name_prefix="video-info")
    ahead: deque = deque()
    positions = iter(range(total))
    try:
        for position in itertools.islice(positions, 4 * threads):
            ahead.append(pool.submit(work, position))
        done = 0
        while ahead:
            info = ahead.popleft().result()
            for position in itertools.islice(positions, 1):
                ahead.append(pool.submit(work, position))
            hand(info)
            done += 1
            if progress:
                progress(done, total)
    except BaseException:
        stop.set()  # the workers still decoding stop at their next frames
        raise
    finally:
        # On Ctrl-C, drop the videos not started yet instead of reading them all first.
        pool.shutdown(wait=True, cancel_futures=True)


def _video_seed(seed: int, name: str) -> Any:
    """The stream of the video `name`d so in its input (`containers.input_name`): one of
    `SeedSequence(seed)`'s, keyed by the name's hash, whatever else the list holds and
    wherever in it the video is."""
    import hashlib

    import numpy as np

    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).digest()
    return np.random.SeedSequence(seed, spawn_key=(int.from_bytes(digest[:16], "little"),))
