"""Which still-image format a file's first bytes name: one table for the commands that tell an
image by its magic (video-info refusing a still image, `--force` proving convert tensor's files)."""

from __future__ import annotations

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

_MAGIC = (
    (PNG_SIGNATURE, "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)

HEAD_BYTES = 12  # enough for every format here (WebP's RIFF size, then its form type)


def image_format(head: bytes) -> str | None:
    """ "PNG", "JPEG", "GIF", "BMP", "TIFF" or "WebP" where `head` (a file's first
    `HEAD_BYTES` or more) starts as that format does; None otherwise."""
    kind = next((name for magic, name in _MAGIC if head.startswith(magic)), None)
    if kind is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        kind = "WebP"
    return kind
