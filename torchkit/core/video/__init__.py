"""Video metadata (size, frames, fps, duration, codec, container) read with OpenCV, many files at
once; exact frame counting by decoding; Temporal Segment Network (TSN) frame sampling.

OpenCV is imported inside functions only, so importing this package stays cheap.

The whole of it lives in probe for now (moved here to keep its history; split next).
"""

from torchkit.core.video.probe import (
    MAX_SEGMENTS,
    MAX_WORKERS,
    SAMPLE_MODES,
    STATUSES,
    VIDEO_EXTENSIONS,
    SegmentOptions,
    VideoInfo,
    count_frames,
    declared_size,
    default_video_workers,
    extract_frames,
    find_videos,
    fourcc_to_text,
    frame_file_name,
    frame_name_prefixes,
    inspect_videos,
    is_video_file,
    probe_video,
    sniff_container,
    still_image_format,
    tsn_frame_indices,
    video_inputs,
)

__all__ = [
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
    "find_videos",
    "fourcc_to_text",
    "frame_file_name",
    "frame_name_prefixes",
    "inspect_videos",
    "is_video_file",
    "probe_video",
    "sniff_container",
    "still_image_format",
    "tsn_frame_indices",
    "video_inputs",
]
