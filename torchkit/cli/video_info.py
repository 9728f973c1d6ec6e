"""`torchkit video-info`: metadata of videos, exact frame counts, TSN segment sampling."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from torchkit.cli import console
from torchkit.cli.options import (
    ForceOption,
    NullOption,
    OutputOption,
    piped_paths,
    seed_in_range,
)
from torchkit.cli.progress import progress_bar
from torchkit.cli.render import (
    JsonArrayWriter,
    ReportAtSwap,
    StreamedOutputFormat,
    Table,
    binary_size,
    render_json,
    report_file,
    resolve_format,
    streamed_rows,
)
from torchkit.core.io.wording import counted

CSV_COLUMNS = [
    "path",
    "size_bytes",
    "width",
    "height",
    "frames",
    "frames_source",
    "frames_header",
    "frames_decoded",
    "fps",
    "duration_s",
    "codec",
    "container",
    "frame_indices",
    "frame_files",
    "status",
    "error",
]


class SampleMode(str, Enum):
    test = "test"
    train = "train"


def video_info(
    paths: Annotated[
        list[str],  # str, not Path: a row echoes the path as given (`./clip.mp4`)
        typer.Argument(
            help="Video files, folders searched recursively for video files, or - for paths "
            "on stdin (one per line; with --null, NUL-separated).",
            metavar="PATH",
            show_default=False,
        ),
    ],
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Count frames by decoding them (slow, but right where container headers are "
            "estimates: variable frame rate, some AVI/MKV/WebM/MPEG files).",
        ),
    ] = False,
    decode_check: Annotated[
        bool,
        typer.Option(
            "--decode-check/--no-decode-check",
            help="Decode the first frame of each video to prove it is readable and, in formats "
            "that record no sizes (FLV, Ogg, MPEG-PS...), the last frames its header declares "
            "to prove it is whole. --no-decode-check decodes nothing (but a raw DV file's first "
            "two frames, for its rate): it reads the headers, and "
            "the sizes MP4/MOV, AVI, MKV/WebM, WMV/ASF, MPEG-TS and FLV files record, which a copy "
            "cut short falls short of.",
        ),
    ] = True,
    skip_errors: Annotated[
        bool,
        typer.Option(
            "--skip-errors",
            help="Exit 0 even when some videos are truncated, damaged or unreadable.",
        ),
    ] = False,
    segments: Annotated[
        Optional[int],
        typer.Option(
            "--segments",
            min=1,
            metavar="K",
            help="Also give the K frame indices Temporal Segment Networks sample: one frame "
            "from each of K segments as equal as whole frames allow (at most 10,000).",
            show_default=False,
        ),
    ] = None,
    # -k is --topk in eval and predict: --segments' former short flag works, unlisted.
    segments_short: Annotated[Optional[int], typer.Option("-k", min=1, hidden=True)] = None,
    sample_mode: Annotated[
        SampleMode,
        typer.Option(
            "--sample-mode",
            case_sensitive=False,
            help="test: the middle frame of each segment; train: a random frame of each.",
        ),
    ] = SampleMode.test,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            callback=seed_in_range,
            help="Seed of the train-mode sampling: same seed, same frames of a video, whatever "
            "else is listed (its stream follows its path in the folder given).",
        ),
    ] = 0,
    extract_frames: Annotated[
        Optional[Path],
        typer.Option(
            "--extract-frames",
            help="Write the sampled frames to DIR as PNG files <video>_<frame>.png (a new or "
            "empty folder; --force replaces only an earlier frames folder).",
            file_okay=False,
            metavar="DIR",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[
        Optional[int],
        typer.Option(
            "--workers",
            "-j",
            min=0,
            help="Videos read at the same time (default: twice the CPU count up to 16, at "
            "most 64; 0 or 1: one at a time). Many videos are spread over up to one worker "
            "process per CPU, each reading several at once on threads.",
            show_default=False,
        ),
    ] = None,
    fmt: Annotated[
        Optional[StreamedOutputFormat],
        typer.Option(
            "--format",
            help="Output format; csv, json and jsonl (one JSON object a line) stream one row "
            "per video, and a run stopped part-way leaves jsonl's lines whole. [default: that "
            "of -o FILE.csv, FILE.json or FILE.jsonl, else table]",
            case_sensitive=False,
            show_default=False,
        ),
    ] = None,
    output: OutputOption = None,
    force: ForceOption = False,
    null: NullOption = False,
) -> None:
    """Width, height, frames, fps, duration, codec, container and size of videos.

    Each video gets a status: ok; truncated, a copy cut short (the file is shorter than the
    sizes its container records say or, in formats that record none, the frames its header
    declares do not all decode); damaged (with --exact: every byte its container declares is
    there, but its frames do not all decode, as where a region is zeroed); or unreadable
    (empty, not a video, corrupt). A video that is not ok is a row with its error, and the
    exit code is 1 at the end (0 with --skip-errors).

    Examples:

      torchkit video-info clips/

      torchkit video-info a.mp4 b.avi --format json

      find clips -name '*.mp4' | torchkit video-info - --format jsonl

      torchkit video-info clips/ --exact -o info.csv --format csv

      torchkit video-info clip.mp4 --segments 8 --sample-mode train --extract-frames frames/
    """
    from torchkit.cli.options import former_short_flag
    from torchkit.core.data.sources.discovery import collecting_unlisted
    from torchkit.core.video import inspect_videos

    segments = former_short_flag(segments, segments_short, option="--segments", flag="-k")

    fmt = resolve_format(fmt, output, StreamedOutputFormat)
    if fmt == StreamedOutputFormat.csv and extract_frames is not None:
        _check_csv_frames_folder(extract_frames)
    # The folders that cannot be listed fail the run too, once the rest is read (as `cp -r`).
    with collecting_unlisted() as unlisted:
        stdin = piped_paths(paths, null)
        if fmt != StreamedOutputFormat.table and extract_frames is None:
            # One row per video as it is read: nothing held but the videos in work.
            tally = _write_streamed(
                paths,
                fmt=fmt,
                output=output,
                force=force,
                stdin=stdin,
                exact=exact,
                decode_check=decode_check,
                segments=segments,
                sample_mode=sample_mode.value,
                seed=seed,
                workers=workers,
            )
            _finish(tally, skip_errors, unlisted, _source(paths))
            return

        def render(infos) -> tuple[list[Table], list]:
            if fmt == StreamedOutputFormat.csv:
                table = _csv_table(infos)
            else:
                table = _table(infos, exact=exact, segments=segments is not None)
            return [table], [info.to_dict() for info in infos]

        # An -o file is written before the new frames replace an old folder (ReportAtSwap), one
        # inside the frames folder after.
        with ReportAtSwap(
            render, fmt=fmt, output=output, force=force, swapped_in=extract_frames
        ) as report:
            with progress_bar("reading videos", eta=False, refresh_in_thread=True) as advance:
                infos = inspect_videos(
                    paths,
                    exact=exact,
                    decode_check=decode_check,
                    segments=segments,
                    sample_mode=sample_mode.value,
                    seed=seed,
                    extract_dir=extract_frames,
                    force=force,
                    workers=workers,
                    progress=advance,
                    report=report_file(output),  # checked against the videos before the work
                    stdin=stdin,
                    before_keep=report.before_keep,
                )
            report.after(infos)
        tally = _Tally()
        for info in infos:
            tally.add(info)
        if extract_frames is not None:
            written = {f for info in infos for f in info.frame_files or []}
            if written:
                console.note(f"wrote {counted(len(written), 'frame')} to {extract_frames}")
            else:
                console.note(f"no frame was written: {extract_frames} is as it was")
        _finish(tally, skip_errors, unlisted, _source(paths))


def _source(paths: list[str] | None) -> str:
    """What the folders that could not be listed are in, for the closing error."""
    if not paths or paths == ["-"]:
        return "the paths on stdin"
    return paths[0] if len(paths) == 1 else "the paths given"


class _Tally:
    """What the closing lines say of the videos read: how many, of each status, and how many
    decode to another frame count than their header's."""

    def __init__(self) -> None:
        self.videos = 0
        self.differing = 0
        self.statuses: dict[str, int] = {}

    def add(self, info) -> None:
        self.videos += 1
        self.differing += bool(info.frames_differ)
        self.statuses[info.status] = self.statuses.get(info.status, 0) + 1


def _finish(tally: _Tally, skip_errors: bool, unlisted: list[str], source: str) -> None:
    """The closing lines; the error (exit 1) where a video could not be read or a folder in
    `source` listed (`unlisted`, warned of: its videos have no row), unless `skip_errors`."""
    from torchkit.core.io.incomplete import incomplete_run

    if tally.differing:
        console.note(
            f"{tally.differing} of {tally.videos} videos decode to a different number of "
            "frames than their header says"
        )
    failure = incomplete_run(
        source,
        unlisted,
        left_out="their videos were not read",
        again="the warning above names them: make them readable; --skip-errors exits 0",
        failed=_problems(tally),
        failed_hint="see the status and error columns; --skip-errors exits 0",
    )
    if failure is not None and skip_errors:
        console.warn(failure.message)
    elif failure is not None:
        raise failure


def _problems(tally: _Tally) -> str | None:
    """`2 of 5 videos could not be read: 1 truncated, 1 unreadable`, or None when all are ok."""
    from torchkit.core.video import STATUSES

    bad = tally.videos - tally.statuses.get("ok", 0)
    if not bad:
        return None
    kinds = ", ".join(f"{tally.statuses[s]} {s}" for s in STATUSES[1:] if tally.statuses.get(s))
    return f"{bad} of {tally.videos} videos could not be read: {kinds}"


def _write_streamed(
    paths, *, fmt: StreamedOutputFormat, output: Path | None, force: bool, **options
) -> _Tally:
    """The CSV, the JSON array or the JSON Lines, a row per video as it is read
    (`stream_videos`): on stdout, each row at once (a reader of the pipe gets it while the list
    on stdin is still being written); with -o, written to a temporary file put in place at the
    end."""
    from torchkit.core.io.files import atomic_write
    from torchkit.core.video import stream_videos

    to_file = report_file(output) is not None
    tally = _Tally()

    def write(handle, read, flush: bool, encoding: str | None = None) -> None:
        add, close = _row_writer(fmt, handle, encoding)

        def row(info) -> None:
            tally.add(info)
            add(info)
            if flush:
                handle.flush()

        streamed_rows(lambda: read(row), close)  # a failure part-way: the rows so far, whole

    with progress_bar("reading videos", eta=False, refresh_in_thread=True) as advance:
        # Every check first (the inputs, the listed videos, -o), before any output is opened.
        read = stream_videos(
            paths, force=force, progress=advance, report=output if to_file else None, **options
        )
        if to_file:
            with atomic_write(output, "w", encoding="utf-8", newline="") as handle:
                write(handle, read, flush=False)
        else:
            stdout = console.stdout.file
            write(stdout, read, flush=True, encoding=getattr(stdout, "encoding", None))
    if to_file:
        console.note(f"wrote {output}")
    return tally


def _row_writer(
    fmt: StreamedOutputFormat, handle, encoding: str | None
) -> tuple[Callable[[Any], None], Callable[[], None]]:
    """(add a video's row, end the output) for `fmt` on `handle`: CSV rows under their header,
    the items of a JSON array, or JSON Lines (each as `emit` renders the whole list)."""
    from torchkit.core.io.csv_rows import CsvWriter

    if fmt == StreamedOutputFormat.json:
        array = JsonArrayWriter(handle, encoding)
        return (lambda info: array.add(info.to_dict())), array.close
    if fmt == StreamedOutputFormat.jsonl:

        def add_line(info) -> None:
            handle.write(render_json(info.to_dict(), encoding, indent=None))

        return add_line, (lambda: None)
    writer = CsvWriter(handle)
    writer.writerow(CSV_COLUMNS)
    return (lambda info: writer.writerow(_csv_row(info))), (lambda: None)


def _table(infos: list, *, exact: bool, segments: bool) -> Table:
    """The terminal table: sizes, fps and durations formatted for people."""
    frames_label = "frames (decoded)" if exact else "frames (header)"
    columns = ["path", "size", "resolution", frames_label, "fps", "duration (s)", "codec"]
    columns.append("container")
    if segments:
        columns.append("frame indices")
    columns.append("status")
    if any(info.error for info in infos):
        columns.append("error")
    rows = []
    for info in infos:
        frames: Any = info.frames
        if info.frames_differ:
            frames = f"{info.frames} (header {info.frames_header})"
        elif not exact and info.frames_header is None and info.frames_source == "decoded":
            frames = f"{info.frames} (decoded)"
        resolution = None if info.width is None else f"{info.width}x{info.height}"
        row: list[Any] = [
            info.path,
            _human_size(info.size_bytes),
            resolution,
            frames,
            _format_fps(info.fps),
            _format_duration(info.duration_s),
            info.codec,
            info.container,
        ]
        if segments:
            row.append(_join(info.frame_indices, " "))
        row.append(info.status)
        if "error" in columns:
            row.append(info.error)
        rows.append(row)
    table = Table(
        columns=columns,
        rows=rows,
        align_right={"size", "resolution", frames_label, "fps", "duration (s)"},
    )
    return table


def _csv_table(infos: list) -> Table:
    """The CSV form: raw values (bytes, full-precision fps) under the JSON key names."""
    return Table(columns=CSV_COLUMNS, rows=[_csv_row(info) for info in infos])


def _csv_row(info) -> list[Any]:
    from torchkit.core.video import FRAME_FILES_SEPARATOR

    values = info.to_dict()
    values["frame_indices"] = _join(info.frame_indices, " ")
    values["frame_files"] = _join(info.frame_files, FRAME_FILES_SEPARATOR)
    return [values[column] for column in CSV_COLUMNS]


def _check_csv_frames_folder(folder: Path) -> None:
    """The CSV's frame_files cell joins a video's frame files with `;`, which no frame name
    holds: a frames folder whose name held one would make the cell ambiguous."""
    from torchkit.core.io.errors import UsageError
    from torchkit.core.video import FRAME_FILES_SEPARATOR

    if FRAME_FILES_SEPARATOR in str(folder):
        raise UsageError(
            f"--extract-frames {folder} holds '{FRAME_FILES_SEPARATOR}', which separates a "
            "video's frame files in the CSV's frame_files column",
            "give a frames folder without it, or --format json",
        )


def _join(values: list | None, separator: str) -> str | None:
    return None if values is None else separator.join(str(v) for v in values)


def _format_fps(fps: float | None) -> str | None:
    """29.97 stays 29.97 and 25.0 shows as 25 (3 decimals at most; JSON/CSV carry all of them);
    below 1, 3 significant digits: a time-lapse of a frame an hour is 0.000278, not 0."""
    if fps is None:
        return None
    if fps < 1:
        return f"{fps:.3g}"
    return f"{fps:.3f}".rstrip("0").rstrip(".")


def _format_duration(seconds: float | None) -> str | None:
    """3 decimals; 3 significant digits below a millisecond, which 3 decimals show as 0.000 (a
    frame of a 10,000 fps camera)."""
    if seconds is None:
        return None
    return f"{seconds:.3g}" if 0 < seconds < 0.001 else f"{seconds:.3f}"


def _human_size(size: int | None) -> str | None:
    return None if size is None else binary_size(size)


def register(app: typer.Typer) -> None:
    app.command("video-info")(video_info)
