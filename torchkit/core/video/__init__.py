"""Video metadata (size, frames, fps, duration, codec, container) read with OpenCV, many files at
once; exact frame counting by decoding; Temporal Segment Network (TSN) frame sampling.

OpenCV is imported inside functions only, so importing this package stays cheap.

Modules: containers (finding video files, sniffing the container, the size its structure
declares, the FOURCC it records, the frames its index holds), streams (the frames MPEG-TS,
MPEG-PS, FLV and Ogg files hold, from their packets, tags and pages), probe (one video:
`VideoInfo`, the truncation and damage checks), frames
(TSN sampling, writing the sampled frames) and run (`inspect_videos`, many videos on worker
threads; `stream_videos`, their records as they come).
"""

from torchkit.core.video.containers import (
    VIDEO_EXTENSIONS,
    declared_size,
    find_named_videos,
    find_videos,
    is_video_file,
    sniff_container,
    still_image_format,
)
from torchkit.core.video.frames import (
    FRAME_FILES_SEPARATOR,
    MAX_SEGMENTS,
    SAMPLE_MODES,
    SegmentOptions,
    extract_frames,
    frame_file_name,
    frame_name_prefixes,
    tsn_frame_indices,
)
from torchkit.core.video.probe import (
    STATUSES,
    VideoInfo,
    count_frames,
    fourcc_to_text,
    probe_video,
)
from torchkit.core.video.run import (
    MAX_WORKERS,
    default_video_workers,
    inspect_videos,
    stream_videos,
    video_inputs,
)

__all__ = [
    "FRAME_FILES_SEPARATOR",
    "MAX_SEGMENTS",
    "MAX_WORKERS",
    "SAMPLE_MODES",
    "STATUSES",
    "VIDEO_EXTENSIONS",
    "SegmentOptions",
    "VideoInfo",
    "count_frames",
    "declared_size",
    "default_video_workers",
    "extract_frames",
    "find_named_videos",
    "find_videos",
    "fourcc_to_text",
    "frame_file_name",
    "frame_name_prefixes",
    "inspect_videos",
    "is_video_file",
    "probe_video",
    "sniff_container",
    "still_image_format",
    "stream_videos",
    "tsn_frame_indices",
    "video_inputs",
]
