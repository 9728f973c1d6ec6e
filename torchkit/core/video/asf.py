"""ASF/WMV: the objects' sizes and the data packets, which a region zeroed breaks."""

from __future__ import annotations

import os

from torchkit.core.video.held import MAX_BOXES

_ASF_HEADER = bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c")
_ASF_DATA = bytes.fromhex("3626b2758e66cf11a6d900aa0062ce6c")
_ASF_FILE_PROPERTIES = bytes.fromhex("a1dcab8c47a9cf118ee400c00c205365")
_ASF_TOP_LEVEL = (  # the objects an ASF file holds: header, data, then the indexes
    _ASF_HEADER,
    _ASF_DATA,
    bytes.fromhex("90080033b1e5cf1189f400a0c90349cb"),  # Simple Index
    bytes.fromhex("d329e2d6da35d111903400a0c90349be"),  # Index
    bytes.fromhex("f803b1fead12644c840f2a1d2f7ad48c"),  # Media Object Index
    bytes.fromhex("d03fb73c4a0c0348953dedf7b6228f0c"),  # Timecode Index
)
_ASF_OBJECT_HEADER = 24  # a GUID and a 64-bit little-endian size
_ASF_MAX_HEADER = 1 << 20  # read at most this much of the header to find its file properties


def _asf_broadcast(header: bytes) -> bool:
    """Whether the ASF header's File Properties set the broadcast flag (a live stream, whose
    sizes are not filled in); True also when the header cannot be read through."""
    offset = 30  # the header object's own fields: GUID, size, object count, two reserved bytes
    while offset + _ASF_OBJECT_HEADER <= len(header):
        length = int.from_bytes(header[offset + 16 : offset + 24], "little")
        if header[offset : offset + 16] == _ASF_FILE_PROPERTIES:
            flags = header[offset + 88 : offset + 92]
            return len(flags) < 4 or bool(flags[0] & 1)
        if length < _ASF_OBJECT_HEADER:
            return True
        offset += length
    return True


def asf_objects_end(handle, size: int) -> int | None:
    """The end of the last top-level object of an ASF file (WMV, WMA): the header, the data
    and the indexes each record their size. None for a live stream (broadcast flag)."""
    handle.seek(0)
    header = handle.read(_ASF_MAX_HEADER)
    if not header.startswith(_ASF_HEADER) or len(header) < _ASF_OBJECT_HEADER:
        return None
    header_length = int.from_bytes(header[16:24], "little")
    if len(header) < min(header_length, _ASF_MAX_HEADER):
        return header_length  # the file ends inside its header
    if _asf_broadcast(header[:header_length]):
        return None
    offset = 0
    for _ in range(MAX_BOXES):
        if offset >= size:
            return offset
        handle.seek(offset)
        head = handle.read(_ASF_OBJECT_HEADER)
        if len(head) < _ASF_OBJECT_HEADER:  # the file ends inside an object's GUID or size
            ours = any(guid.startswith(head[:16]) for guid in _ASF_TOP_LEVEL)
            return offset + _ASF_OBJECT_HEADER if ours else offset
        if head[:16] not in _ASF_TOP_LEVEL:
            return offset  # junk after the last object is not ours
        length = int.from_bytes(head[16:24], "little")
        if length < _ASF_OBJECT_HEADER:  # a writer that never went back to fill it in
            return None
        offset += length
    return None


_ASF_DATA_HEADER = 50  # the Data object's GUID, size, file ID, packet count and 2 reserved bytes
_ASF_MAX_PACKETS = 50_000_000


def asf_packet_break(path: str | os.PathLike, container: str | None) -> int | None:
    """Where the first data packet of an ASF file (WMV, WMA) that does not start as its first
    one lies: the packets are all one size (its File Properties give it), and WMV writers
    start each with the same error correction data (0x82 0 0), so a zeroed or overwritten
    one does not. A byte read a packet (about 1 s for an hour of video): for --exact alone.
    None where every packet starts so, the first does not (nothing to compare with), the
    packets are not all one size, other formats, or a structure that cannot be read."""
    if container != "asf":
        return None
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            header = handle.read(_ASF_MAX_HEADER)
            packet = _asf_packet_size(header)
            at = int.from_bytes(header[16:24], "little")  # the Data object: after the header
            handle.seek(at)
            data = handle.read(_ASF_OBJECT_HEADER)
            if packet is None or data[:16] != _ASF_DATA or len(data) < _ASF_OBJECT_HEADER:
                return None
            length = int.from_bytes(data[16:24], "little")
            start, end = at + _ASF_DATA_HEADER, min(at + length, size)
            handle.seek(start)
            first = handle.read(3)
            if first != b"\x82\x00\x00":
                return None
            for offset in range(start + packet, end, packet)[:_ASF_MAX_PACKETS]:
                handle.seek(offset)
                if handle.read(3) != first:
                    return offset
    except OSError:
        return None
    return None


def _asf_packet_size(header: bytes) -> int | None:
    """The data packets' size that an ASF header's File Properties give (its minimum and
    maximum the same), None where they differ or are not found."""
    offset = 30  # the header object's own fields: GUID, size, object count, two reserved bytes
    while offset + _ASF_OBJECT_HEADER <= len(header):
        length = int.from_bytes(header[offset + 16 : offset + 24], "little")
        if header[offset : offset + 16] == _ASF_FILE_PROPERTIES:
            sizes = header[offset + 92 : offset + 100]
            smallest, largest = (
                int.from_bytes(sizes[:4], "little"),
                int.from_bytes(sizes[4:], "little"),
            )
            return smallest if len(sizes) == 8 and smallest == largest > 0 else None
        if length < _ASF_OBJECT_HEADER:
            return None
        offset += length
    return None
