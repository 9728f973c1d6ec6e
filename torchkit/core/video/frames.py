"""Temporal Segment Network (TSN) frame sampling, and writing the sampled frames as PNG files."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkit.core.io.claims import OutputFolderReplacedError
from torchkit.core.io.errors import InputError, OutputWriteError, UsageError
from torchkit.core.io.files import atomic_write_bytes
from torchkit.core.io.folder_contents import proven
from torchkit.core.io.names import distinct_names
from torchkit.core.io.output_paths import remove_tree
from torchkit.core.io.output_proofs import torchkit_png, with_software_text
from torchkit.core.io.outputs import OutputFolder
from torchkit.core.io.temporaries import NAME_MAX, cut_to_bytes
from torchkit.core.io.write_errors import write_error
from torchkit.core.video.matroska import matroska_mirroring_roll
from torchkit.core.video.mp4 import iso_display_mirrored, iso_lists_every_frame
from torchkit.core.video.probe import (
    VideoInfo,
    _error_text,
    _import_cv2,
    _open_capture,
    _Stopped,
    recount_frames,
)

SAMPLE_MODES = ("test", "train")
# The K frame indices of every video are part of its row (table, CSV, JSON), so they are held in
# memory and printed: 10,000 is far beyond any TSN setting (3 to 32 segments) and still a dense
# sampling of a long clip, with rows of tens of KiB. Frames themselves are streamed: decoded one
# at a time, written and dropped, so neither a long video nor a large K holds more than one frame.
MAX_SEGMENTS = 10_000
# <video>_<frame, 6+ digits>.png, only where its content shows torchkit wrote it (a photo of
# yours under such a name is refused): the Software text each frame carries, or (frames of an
# earlier version) a bare PNG as OpenCV encodes one.
FRAME_FILES = (proven("*_[0-9][0-9][0-9][0-9][0-9][0-9]*.png", torchkit_png(legacy_bare=True)),)
# What separates a video's frame files in a CSV cell: never in a name torchkit gives a frame,
# nor in the frames folder's name where the report is CSV (the CLI refuses one that holds it).
FRAME_FILES_SEPARATOR = ";"


class _PastTheEnd(InputError):
    """A sampled frame the header declares does not decode: the video ends early."""


class _PastTheHeader(InputError):
    """Frames decode past the count the indices were sampled from: the header understates it
    (an MPEG-PS file's count reckoned from a duration that leaves out its first timestamp)."""


@dataclass
class SegmentOptions:
    """TSN sampling for each video, and where to write the sampled frames (if anywhere)."""

    num_segments: int
    mode: str = "test"
    seed: int = 0
    extract_dir: Path | None = None
    names: dict[str, str] = field(default_factory=dict)  # video path -> file name prefix
    decoder_threads: int | None = None  # of each video's decoder (probe._open_capture)


# --- TSN sampling -------------------------------------------------------------------------------


def tsn_frame_indices(
    num_frames: int, num_segments: int, mode: str = "test", rng: Any = None
) -> list[int]:
    """The `num_segments` sorted frame indices Temporal Segment Networks sample from a video.

    The frames are cut into K segments as equal as integers allow (segment i holds frames
    `i*n//K` up to `(i+1)*n//K - 1`, so no frame is left out). Test mode takes the middle frame of
    each segment; train mode one uniformly random frame of each (`rng`: a seed or a
    `numpy.random.Generator`). With fewer frames than segments, every frame is taken once and the
    rest repeated in order (0, 1, 2, 0, 1, ...), sorted, in both modes: exactly K indices.
    """
    if isinstance(num_segments, bool) or not isinstance(num_segments, int) or num_segments < 1:
        raise UsageError(f"the number of segments must be a positive integer, not {num_segments}")
    if num_segments > MAX_SEGMENTS:
        raise UsageError(
            f"{num_segments} segments are more than {MAX_SEGMENTS:,}",
            f"sample at most {MAX_SEGMENTS:,} frames per video",
        )
    if mode not in SAMPLE_MODES:
        raise UsageError(f"unknown sample mode {mode!r}", "use 'test' or 'train'")
    if num_frames is None or num_frames < 1:
        raise InputError(
            "the video has no frames to sample",
            "check the file, or pass --exact to count frames by decoding",
        )
    n, k = int(num_frames), num_segments
    if n < k:
        return sorted(i % n for i in range(k))
    bounds = [i * n // k for i in range(k + 1)]
    lengths = [bounds[i + 1] - bounds[i] for i in range(k)]
    if mode == "test":
        # The upper middle for even lengths, as in the TSN reference (offset (n / K) // 2).
        return [bounds[i] + lengths[i] // 2 for i in range(k)]
    import numpy as np

    generator = np.random.default_rng(rng)
    offsets = generator.integers(0, lengths)
    return [bounds[i] + int(offsets[i]) for i in range(k)]


# --- sampled frames -----------------------------------------------------------------------------


def frame_file_name(prefix: str, index: int) -> str:
    return f"{prefix}_{index:06d}.png"


def extract_frames(
    path: str | os.PathLike,
    indices: Sequence[int],
    out_dir: Path,
    prefix: str,
    stop: threading.Event | None = None,
    decoder_threads: int | None = None,
    sampled_from: int | None = None,
    container: str | None = None,
) -> list[Path]:
    """Decode `path` from the start and write the frames at `indices` (sorted, repeats allowed)
    as PNG files `<prefix>_<index>.png` in `out_dir`; one path per index, in order.

    Frames are read sequentially (grab, retrieve only the wanted ones) because seeking by frame
    number is inexact for many codecs; one frame is in memory at a time. `stop` set ends it
    early (`_Stopped`). `sampled_from`: the header's frame count the indices were drawn from,
    checked by decoding on to its end: a frame past it raises `_PastTheHeader` (the indices
    leave the video's last frames out). `container`: its format, as sniffed (an MP4/MOV/3GP
    file's display matrix may mirror its frames). A failure removes the frames already
    written: a video whose row is an error leaves no frames behind."""
    cv2 = _import_cv2()
    wanted = sorted(set(indices))
    written: dict[int, Path] = {}
    capture = _open_capture(cv2, Path(path), decoder_threads)
    if capture is None:
        raise InputError(f"cannot open {path} to extract frames")
    try:
        flip = _mirror_flip(cv2, capture, path, container)
        position = 0
        for index in wanted:
            while position <= index:
                if stop is not None and position % 64 == 0 and stop.is_set():
                    raise _Stopped()
                if not capture.grab():
                    raise _PastTheEnd(
                        f"only {position} frames could be decoded, frame {index} is past the end",
                        "the frame count in the header is wrong; pass --exact",
                    )
                position += 1
            ok, frame = capture.retrieve()
            if not ok or frame is None:
                raise InputError(f"frame {index} could not be decoded")
            if flip is not None:
                frame = cv2.flip(frame, flip)
            ok, encoded = cv2.imencode(".png", frame)
            if not ok:
                raise InputError(f"frame {index} could not be encoded as PNG")
            target = out_dir / frame_file_name(prefix, index)
            atomic_write_bytes(target, with_software_text(encoded.tobytes()))
            written[index] = target
        if sampled_from is not None:
            while capture.grab():  # the last segment's half at most, then one frame
                position += 1
                if position > sampled_from:
                    raise _PastTheHeader(
                        f"frames decode past the {sampled_from:,} its header declares"
                    )
                if stop is not None and position % 64 == 0 and stop.is_set():
                    raise _Stopped()
    except BaseException:
        for target in written.values():
            remove_tree(target)  # the command's own frames, in its locked output folder
        raise
    finally:
        capture.release()
    return [written[index] for index in indices]


def _mirror_flip(cv2, capture, path: str | os.PathLike, container: str | None) -> int | None:
    """The cv2.flip code that turns OpenCV's frames of a video whose display matrix mirrors it
    (an MP4/MOV one, or the one FFmpeg makes of a Matroska Projection) into those FFmpeg's
    players show, or None. OpenCV turns the frames by the matrix's angle alone, which for a
    mirroring matrix is the turn of the stored picture's x axis: its y axis is turned over
    too, which is the frame's vertical after a half turn or none (0: upside down) and its
    horizontal after a quarter turn (1: left to right)."""
    meta = getattr(cv2, "CAP_PROP_ORIENTATION_META", None)
    auto = getattr(cv2, "CAP_PROP_ORIENTATION_AUTO", None)
    if meta is None or auto is None or not capture.get(auto):
        return None  # the stored pixels, as read without a turn: nothing to undo
    angle = round(capture.get(meta))
    if container in ("mkv", "webm"):
        roll = matroska_mirroring_roll(path, container)
        # The matrix's angle is 180 - roll: another one is an FFmpeg that reads no Projection
        # (nor do its players), whose frames OpenCV gives as stored
        if roll is None or round(angle - 180 + roll) % 360:
            return None
    elif not iso_display_mirrored(path, container):
        return None
    return 1 if angle % 180 == 90 else 0


# The bytes of a stem in a frame's name: a file name holds 255 bytes at most (ext4, XFS, APFS),
# the frame is written as a temporary `.NAME.XXXXXXXX.tmp` (14 bytes more: core.io.files), and
# the frame's name adds up to 21 to the stem ("-2" for a repeat, up to 6 bytes, then "_", the
# index's digits, up to 10, and ".png"): a video whose stem held 231 bytes or more (a long
# title in Chinese is 3 bytes a character) made the whole run fail with "File name too long".
MAX_STEM_BYTES = NAME_MAX - 14 - 21


def frame_name_prefixes(
    videos: Sequence[str | os.PathLike], *, fold_case: bool = False
) -> dict[str, str]:
    """A distinct file-name prefix per video: its stem, with -2, -3... for repeated stems
    (`distinct_names`, in linear time for a dataset of `<clip>/video.mp4` folders). A `;` of the
    stem becomes `_`: the CSV's frame_files cell separates the files with `;`; a hidden video's
    leading dots are dropped (its frames would be hidden files, which `ls`, and torchkit reading
    the folder as a dataset, pass over); a stem too long for a frame's name to fit in a file
    name is cut to MAX_STEM_BYTES.
    `fold_case`: the frames folder's file system ignores case, so stems that differ only by
    case (`Clip`, `clip`) repeat too."""
    stems = [
        cut_to_bytes(
            Path(video).stem.replace(FRAME_FILES_SEPARATOR, "_").lstrip("."), MAX_STEM_BYTES
        )
        or "video"
        for video in videos
    ]
    prefixes = distinct_names(stems, separator="-", fold_case=fold_case)
    return {os.fspath(video): prefix for video, prefix in zip(videos, prefixes, strict=True)}


def _sample_into(
    info: VideoInfo,
    options: SegmentOptions,
    rng: Any,
    frames_folder: _FramesFolder | None = None,
    stop: threading.Event | None = None,
) -> None:
    try:
        # A container that records no frame count (a browser's MediaRecorder WebM, a live MKV,
        # a raw .m2v or .h264 stream): counted by decoding, as --exact counts.
        if info.frames is None and not recount_frames(info, stop, options.decoder_threads):
            info.fail("the video could not be opened again to count its frames")
            return
        if info.status != "ok":  # its count decoded: damaged
            return
        info.frame_indices = tsn_frame_indices(info.frames, options.num_segments, options.mode, rng)
        if frames_folder is not None:
            try:
                _extract_into(info, options, frames_folder, stop)
            except (_PastTheEnd, _PastTheHeader) as error:
                # A whole file whose header overstates its frames (an AVI's stream length, a
                # variable rate's duration x fps), or any whose frames go on past its header's
                # count (an MPEG-PS duration that leaves out its first timestamp): the header's
                # count is wrong, not the file. Its frames are counted as --exact counts them
                # and sampled from that count, the same row --exact gives; a file not known to
                # be whole that ends early is truncated.
                past_the_end = isinstance(error, _PastTheEnd)
                if (past_the_end and not info.known_whole) or info.frames_source == "decoded":
                    raise
                if not recount_frames(info, stop, options.decoder_threads):
                    raise
                if info.status != "ok":  # damaged: frames lost, not a header's mistake
                    return
                info.frame_indices = tsn_frame_indices(
                    info.frames, options.num_segments, options.mode, rng
                )
                _extract_into(info, options, frames_folder, stop)
    except (_Stopped, OutputFolderReplacedError):  # the frames folder's error, not this video's
        raise
    except OutputWriteError as error:
        # A full disk is the output's error, not this video's. The frames go to a hidden
        # temporary folder: the error names the folder that was asked for.
        raise write_error(options.extract_dir, error.__cause__ or error) from error
    except _PastTheEnd as error:
        info.fail(f"truncated: {error.message} ({error.hint})", "truncated")
    except Exception as error:
        info.fail(_error_text(error))


def _extract_into(
    info: VideoInfo,
    options: SegmentOptions,
    frames_folder: _FramesFolder,
    stop: threading.Event | None,
) -> None:
    """The frames at `info.frame_indices` written to the frames folder, named in the row."""
    folder = frames_folder.begin()  # only now, after every check: the first frame
    files = extract_frames(
        info.path,
        info.frame_indices,
        folder,
        options.names[info.path],
        stop,
        options.decoder_threads,
        sampled_from=None if _count_is_exact(info) else info.frames,
        container=info.container,
    )
    info.frame_files = [str(options.extract_dir / f.name) for f in files]
    frames_folder.wrote(len(files))


def _count_is_exact(info: VideoInfo) -> bool:
    """Whether `info.frames` is a count no frame lies past: decoded, or an MP4's sample table's
    (decoding on to its end to make sure would double the work of `--segments 1`). Elsewhere a
    header's count can be an estimate, and decoding on past it tells one that leaves frames
    out."""
    return info.frames_source == "decoded" or iso_lists_every_frame(info.path, info.container)


class _FramesFolder:
    """The `--extract-frames` folder, begun by the first worker thread about to write a frame:
    frames go to a hidden temporary folder beside it that replaces it (and an old one, with
    --force) only at the end, so it never holds a half-written set of frames."""

    def __init__(self, folder: OutputFolder, folds_case: bool = False) -> None:
        self.folder = folder
        self.folds_case = folds_case  # its file system ignores case: see frame_name_prefixes
        self.frames = 0
        self._lock = threading.Lock()

    def begin(self) -> Path:
        with self._lock:
            return self.folder.begin()

    def wrote(self, count: int) -> None:
        with self._lock:
            self.frames += count
