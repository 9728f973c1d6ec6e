"""Benchmark: `torchkit video-info` metadata of 200 small videos against a plain sequential
`cv2.VideoCapture` loop (the cheat-sheet snippet), on the same files in the same run.

    uv run python benchmarks/bench_video_info.py [--videos 200] [--repeats 5] [--exact]

Prints files/s for both and the ratio (best of --repeats, after one warm-up pass each, so both
read from the page cache). torchkit does more per file than the loop: it also stats the file,
sniffs the container, reads the FOURCC and decodes one frame to prove the file is readable;
`--no-decode-check`, timed too, skips that decode and does the loop's work.
With --exact both sides also count frames by decoding every one. Also timed, the same work:
torchkit reading on threads of one process only (as before worker processes), and with FFmpeg's
own thread count for every decoder instead of one each. `--extract K` also times
`--segments K --extract-frames` (PNG frames written) with one decoder thread a video against
FFmpeg's count. `--list N` instead times finding the videos among N files in 10 folders
(`find_videos`) against `Path.rglob` with a `Path` check of each entry (its way before).
`--piped N` instead times N videos (links to two small clips) listed on stdin (`video-info -`)
against the same folder given whole, with stdin's chunks after the first 16 times larger (now) and
all of the first size (each chunk waits for its last videos; one set of worker processes reads
every chunk, where each started its own before).
`--raw` makes raw MPEG-2 streams (`.m2v`), whose container gives no frame count, and times
`--segments 3` on them (each counted by decoding, as the loop then counts them too).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")  # the writer's notes on the MPG2 tag

import cv2  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torchkit.core.video import default_video_workers, inspect_videos  # noqa: E402
from torchkit.core.video import run as video_run  # noqa: E402


def make_videos(folder: Path, count: int, raw: bool = False) -> list[Path]:
    """Small clips in two common containers: MJPG/AVI and MPEG-4/MP4, 160x120, 2 s at 24 fps
    (`raw`: raw MPEG-2 streams, which record no frame count)."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    paths = []
    for index in range(count):
        fourcc, ext = ("MJPG", ".avi") if index % 2 else ("mp4v", ".mp4")
        if raw:
            fourcc, ext = "MPG2", ".m2v"
        path = folder / f"clip_{index:04d}{ext}"
        writer = cv2.VideoWriter(
            str(path), cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*fourcc), 24.0, (160, 120)
        )
        for frame in range(48):
            writer.write(np.roll(base, 3 * frame, axis=1))
        writer.release()
        paths.append(path)
    return paths


def baseline(paths: list[Path], exact: bool) -> list[tuple]:
    """The cheat-sheet snippet in a loop (with fps kept as a float)."""
    rows = []
    for path in paths:
        video = cv2.VideoCapture(str(path))
        height = int(video.get(cv2.CAP_PROP_FRAME_HEIGHT))
        width = int(video.get(cv2.CAP_PROP_FRAME_WIDTH))
        num_frames = int(video.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = video.get(cv2.CAP_PROP_FPS)
        if exact:
            num_frames = 0
            while video.grab():
                num_frames += 1
        video.release()
        rows.append((width, height, num_frames, fps))
    return rows


def workers_of(args: argparse.Namespace) -> int:
    return default_video_workers() if args.workers is None else args.workers


def extract_time(folder: Path, args: argparse.Namespace, threads: int | None) -> float:
    """`--segments K --extract-frames` of every video, with `threads` per decoder."""
    videos, frames = folder / "videos", folder / "frames"
    if not videos.exists():
        videos.mkdir()
        for path in folder.glob("clip_*"):
            path.rename(videos / path.name)
    one_each = video_run.DECODER_THREADS
    video_run.DECODER_THREADS = threads
    try:
        return best_time(
            lambda: inspect_videos(
                [videos], segments=args.extract, extract_dir=frames, force=True,
                workers=args.workers,
            ),
            args.repeats,
        )  # fmt: skip
    finally:
        video_run.DECODER_THREADS = one_each


def rglob_videos(root: Path) -> list[Path]:
    """Videos under `root` found as video-info found them before: `Path.rglob`, each entry's
    relative parts checked for hidden names, its suffix and `is_file`."""
    from torchkit.core.video import is_video_file

    def visible(path: Path) -> bool:
        hidden = any(part.startswith(".") for part in path.relative_to(root).parts)
        return not hidden and is_video_file(path) and path.is_file()

    return sorted((p for p in root.rglob("*") if visible(p)), key=lambda p: p.as_posix())


def compare_listing(count: int, repeats: int) -> None:
    from torchkit.core.video import find_videos

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for index in range(count):
            folder = root / f"d{index % 10}"
            folder.mkdir(exist_ok=True)
            (folder / f"clip_{index:07d}.mp4").write_bytes(b"")
        assert [Path(p) for p in find_videos([root])] == rglob_videos(root)
        ours = best_time(lambda: find_videos([root]), repeats)
        before = best_time(lambda: rglob_videos(root), repeats)
    print(f"finding {count:,} videos in 10 folders, best of {repeats}")
    print(f"torchkit find_videos:  {ours * 1e6 / count:6.1f} us a file ({ours:.3f} s)")
    print(f"Path.rglob and checks: {before * 1e6 / count:6.1f} us a file ({before:.3f} s)")
    print(f"ratio (rglob / torchkit): {before / ours:.2f}x")


def compare_piped(count: int, repeats: int) -> None:
    import io

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        clips = make_videos(root, 2)
        folder = root / "many"
        folder.mkdir()
        for index in range(count):
            os.link(clips[index % 2], folder / f"v{index:07d}{clips[index % 2].suffix}")
        listed = "".join(f"{path}\n" for path in sorted(folder.iterdir()))

        def streamed(paths, stdin=None) -> int:
            rows = []
            video_run.stream_videos(paths, stdin=stdin)(rows.append)
            assert len(rows) == count and all(row.error is None for row in rows)
            return len(rows)

        whole = best_time(lambda: streamed([folder]), repeats)
        piped = best_time(lambda: streamed(["-"], io.StringIO(listed)), repeats)
        growth = video_run.STREAMED_CHUNK_GROWTH
        video_run.STREAMED_CHUNK_GROWTH = 1
        try:
            before = best_time(lambda: streamed(["-"], io.StringIO(listed)), repeats)
        finally:
            video_run.STREAMED_CHUNK_GROWTH = growth
    print(f"{count:,} small videos, best of {repeats}, s")
    print(f"folder given whole:                 {whole:7.2f}")
    print(f"piped, larger chunks (now):         {piped:7.2f}")
    print(f"piped, chunks of one size:          {before:7.2f}")
    print(f"ratio (before / now): {before / piped:.2f}x; now / folder: {piped / whole:.2f}x")


def best_time(function, repeats: int) -> float:
    function()  # warm-up: FFmpeg initialisation and the page cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--exact", action="store_true", help="count frames by decoding")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--extract", type=int, metavar="K", help="also time K frames extracted")
    parser.add_argument("--list", type=int, metavar="N", help="time finding N videos, only")
    parser.add_argument("--raw", action="store_true", help="raw MPEG-2 streams, --segments 3")
    parser.add_argument("--piped", type=int, metavar="N", help="time N videos listed on stdin")
    args = parser.parse_args()
    if args.list:
        compare_listing(args.list, args.repeats)
        return
    if args.piped:
        compare_piped(args.piped, args.repeats)
        return

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = make_videos(folder, args.videos, args.raw)
        counting = args.exact or args.raw  # a raw stream's frames are counted to be sampled
        reading = {"exact": args.exact, "workers": args.workers}
        if args.raw:
            reading["segments"] = 3
        expected = baseline(paths, counting)
        infos = inspect_videos([folder], **reading)
        got = [(i.width, i.height, i.frames, i.fps) for i in infos]
        assert got == expected, "torchkit and the baseline disagree"
        assert all(info.error is None for info in infos)

        plain = best_time(lambda: baseline(paths, counting), args.repeats)
        ours = best_time(
            lambda: inspect_videos([folder], **reading),
            args.repeats,
        )
        processes = video_run._worker_processes(len(paths), workers_of(args))
        # Threads of one process alone: no count of videos is enough for a worker process.
        at_least = video_run.MIN_VIDEOS_PER_PROCESS
        video_run.MIN_VIDEOS_PER_PROCESS = 10**9
        threads_only = best_time(
            lambda: inspect_videos([folder], **reading),
            args.repeats,
        )
        threads_only_headers = best_time(
            lambda: inspect_videos([folder], decode_check=False, workers=args.workers),
            args.repeats,
        )
        video_run.MIN_VIDEOS_PER_PROCESS = at_least
        one_each = video_run.DECODER_THREADS
        video_run.DECODER_THREADS = None  # FFmpeg's choice: a thread per core for each decoder
        ffmpeg_threads = best_time(
            lambda: inspect_videos([folder], **reading),
            args.repeats,
        )
        video_run.DECODER_THREADS = one_each
        gathered = None
        if args.raw:  # the count left to the process that gathers the rows (as before)
            in_processes = video_run._read_in_processes

            def uncounted(videos, how, *rest):
                return in_processes(videos, dataclasses.replace(how, count_missing=False), *rest)

            video_run._read_in_processes = uncounted
            gathered = best_time(lambda: inspect_videos([folder], **reading), args.repeats)
            video_run._read_in_processes = in_processes
        headers_only = None
        if not counting:  # --no-decode-check: the same work as the plain loop
            headers_only = best_time(
                lambda: inspect_videos([folder], decode_check=False, workers=args.workers),
                args.repeats,
            )
        extraction = None  # last: its frames folder would be searched by the runs above
        if args.extract:
            extraction = {
                threads: extract_time(folder, args, threads) for threads in (one_each, None)
            }

    workers = workers_of(args)
    mode = "exact frame counts" if counting else "header metadata"
    kinds = "MPEG-2 raw streams, --segments 3" if args.raw else "MJPG/AVI + MPEG-4/MP4"
    print(f"{args.videos} videos (160x120, 48 frames, {kinds}), {mode}")
    print(f"CPUs: {os.cpu_count()}, torchkit: {workers} at once in {processes} process(es)")
    print(f"plain cv2.VideoCapture loop: {args.videos / plain:9.1f} files/s  ({plain:.3f} s)")
    print(f"torchkit video-info:         {args.videos / ours:9.1f} files/s  ({ours:.3f} s)")
    print(f"ratio (torchkit / loop):     {plain / ours:9.2f}x")
    print(f"torchkit, threads of one process: {args.videos / threads_only:9.1f} files/s")
    print(f"ratio (torchkit / one process):   {threads_only / ours:9.2f}x")
    print(f"torchkit, FFmpeg's decoder threads: {args.videos / ffmpeg_threads:9.1f} files/s")
    print(f"ratio (one decoder thread / FFmpeg's): {ffmpeg_threads / ours:6.2f}x")
    if gathered is not None:
        print(
            f"torchkit, counted where the rows are gathered: {args.videos / gathered:9.1f} files/s"
        )
        print(f"ratio (counted in the workers / there): {gathered / ours:6.2f}x")
    if headers_only is not None:
        rate = args.videos / headers_only
        print(f"torchkit --no-decode-check:  {rate:9.1f} files/s  ({headers_only:.3f} s)")
        print(f"ratio (no decode check / loop): {plain / headers_only:6.2f}x")
        rate = args.videos / threads_only_headers
        print(f"the same, threads of one process: {rate:9.1f} files/s")
        print(f"ratio (torchkit / one process):   {threads_only_headers / headers_only:9.2f}x")
    if extraction is not None:
        ours, ffmpegs = extraction[video_run.DECODER_THREADS], extraction[None]
        print(f"--segments {args.extract} --extract-frames, one decoder thread each: {ours:.3f} s")
        print(f"the same, FFmpeg's decoder threads: {ffmpegs:.3f} s")
        print(f"ratio (one decoder thread / FFmpeg's): {ffmpegs / ours:6.2f}x")


if __name__ == "__main__":
    main()
