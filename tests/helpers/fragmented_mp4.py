"""Fragmented MP4s made from an ordinary one (OpenCV writes only those): the samples of its one
video track moved into `moof` fragments with the durations asked for, as `ffmpeg -movflags
frag_keyframe(+empty_moov)`, browsers' MSE and DASH segmenters write them. A small box writer:
no test depends on PyAV or an ffmpeg binary."""

from __future__ import annotations

import struct
from collections.abc import Sequence

# Boxes that hold boxes (those of an OpenCV MP4's index the rewrite walks through)
_PARENTS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"dinf"}


def box(kind: bytes, *parts: bytes) -> bytes:
    payload = b"".join(parts)
    return struct.pack(">I4s", 8 + len(payload), kind) + payload


def full_box(kind: bytes, flags: int, *parts: bytes) -> bytes:
    """A box whose data starts with a version (0) and 24 bits of flags."""
    return box(kind, struct.pack(">I", flags & 0xFFFFFF), *parts)


def _boxes(data: bytes, start: int = 0, end: int | None = None) -> list[tuple[bytes, bytes]]:
    """The (type, data) of the boxes in `data[start:end]` (32-bit sizes, as OpenCV writes)."""
    end = len(data) if end is None else end
    found = []
    while start + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, start)
        found.append((kind, data[start + 8 : start + size]))
        start += size
    return found


def _find(boxes: list[tuple[bytes, bytes]], path: Sequence[bytes]) -> bytes:
    for kind, payload in boxes:
        if kind == path[0]:
            return payload if len(path) == 1 else _find(_boxes(payload), path[1:])
    raise AssertionError(f"no {path[0]!r} box")


def _samples(data: bytes, table: bytes) -> list[bytes]:
    """Each sample's bytes, from the sample table (stsz, stsc, stco) of `table` (an stbl)."""
    boxes = _boxes(table)
    sizes_box, chunks_box, offsets_box = (_find(boxes, [k]) for k in (b"stsz", b"stsc", b"stco"))
    fixed, count = struct.unpack_from(">II", sizes_box, 4)
    sizes = [fixed] * count if fixed else list(struct.unpack_from(f">{count}I", sizes_box, 12))
    runs = [struct.unpack_from(">III", chunks_box, 8 + 12 * i)[:2] for i in range(
        struct.unpack_from(">I", chunks_box, 4)[0]
    )]  # fmt: skip
    offsets = struct.unpack_from(f">{struct.unpack_from('>I', offsets_box, 4)[0]}I", offsets_box, 8)
    samples = []
    for chunk, offset in enumerate(offsets, start=1):
        per_chunk = next(n for first, n in reversed(runs) if first <= chunk)
        for _ in range(per_chunk):
            size = sizes[len(samples)]
            samples.append(data[offset : offset + size])
            offset += size
    return samples


def _rewritten(payload: bytes, replace: dict[bytes, bytes | None], path: bytes = b"") -> bytes:
    """A box tree's data with the boxes named (by their path, `moov/trak/...`) replaced by new
    data or (None) left out, every parent's size made right."""
    parts = []
    for kind, data in _boxes(payload):
        name = path + b"/" + kind if path else kind
        if name in replace:
            if replace[name] is not None:
                parts.append(box(kind, replace[name]))
        elif kind in _PARENTS:
            parts.append(box(kind, _rewritten(data, replace, name)))
        else:
            parts.append(box(kind, data))
    return b"".join(parts)


def fragmented_mp4(
    data: bytes,
    durations: Sequence[int],
    fragments: Sequence[int],
    *,
    in_moov: int = 0,
    last_from: str = "trun",
    default_duration: int = 0,
    key_frames: Sequence[bool] | None = None,
) -> bytes:
    """The MP4 `data` (one video track, moov last, as OpenCV writes it) with its first
    `in_moov` samples in its moov's sample table (0: an empty moov) and the others in
    fragments of `fragments` samples each; sample i lasts `durations[i]` ticks of the track's
    timescale (`mdhd`). The last fragment's durations are recorded where `last_from` says:
    in its `trun` records, as its `tfhd`'s default, or as the `trex` default (then each of
    its samples lasts `default_duration`, the trex default, whatever `durations` says).
    `key_frames`: each fragment's samples' flags in its `trun` records, the non-sync bit
    (0x10000) set where False (None: no flags, every sample a sync sample)."""
    top = _boxes(data)
    moov = _find(top, [b"moov"])
    trak = [b"moov", b"trak"]
    table = _find(top, [*trak, b"mdia", b"minf", b"stbl"])
    samples = _samples(data, table)
    assert len(durations) == len(samples) == in_moov + sum(fragments), "a duration per sample"
    track_id = struct.unpack_from(">I", _find(top, [*trak, b"tkhd"]), 12)[0]
    ftyp = box(b"ftyp", _find(top, [b"ftyp"]))
    stbl = b"moov/trak/mdia/minf/stbl/"

    def moov_box(chunk_at: int) -> bytes:
        times = [struct.pack(">II", 1, d) for d in durations[:in_moov]]
        sizes = [struct.pack(">I", len(s)) for s in samples[:in_moov]]
        chunks = [struct.pack(">III", 1, in_moov, 1)] if in_moov else []
        replace = {
            stbl + b"stts": struct.pack(">II", 0, len(times)) + b"".join(times),
            stbl + b"stsz": struct.pack(">III", 0, 0, len(sizes)) + b"".join(sizes),
            stbl + b"stsc": struct.pack(">II", 0, len(chunks)) + b"".join(chunks),
            stbl + b"stco": struct.pack(">II", 0, 1 if in_moov else 0)
            + (struct.pack(">I", chunk_at) if in_moov else b""),
            stbl + b"stss": None,  # every sample a sync sample (trex's default flags: 0)
            b"moov/trak/edts": None,  # an edit list of the old duration
        }
        trex = full_box(b"trex", 0, struct.pack(">IIIII", track_id, 1, default_duration, 0, 0))
        return box(b"moov", _rewritten(moov, replace, b"moov"), box(b"mvex", trex))

    first = box(b"mdat", *samples[:in_moov]) if in_moov else b""
    out = [ftyp, moov_box(len(ftyp) + len(moov_box(0)) + 8), first]  # first's data: after moov
    at, decoded = in_moov, sum(durations[:in_moov])
    for number, count in enumerate(fragments, start=1):
        mode = last_from if number == len(fragments) else "trun"
        records = [
            (struct.pack(">II", durations[i], len(samples[i])) if mode == "trun" else
             struct.pack(">I", len(samples[i])))
            + (b"" if key_frames is None else struct.pack(">I", 0 if key_frames[i] else 0x10000))
            for i in range(at, at + count)
        ]  # fmt: skip
        run_flags = 0x1 | 0x200 | (0x100 if mode == "trun" else 0)
        run_flags |= 0 if key_frames is None else 0x400
        # tfhd: default-base-is-moof (data offsets count from the moof's start), a default
        # duration where the flags say
        fields = struct.pack(">I", track_id)
        if mode == "tfhd":
            fields += struct.pack(">I", durations[at + count - 1])
        header = full_box(b"tfhd", 0x020000 | (0x8 if mode == "tfhd" else 0), fields)
        out += [
            _moof(number, header, decoded, run_flags, records),
            box(b"mdat", *samples[at : at + count]),
        ]
        decoded += sum(durations[at : at + count])
        at += count
    return b"".join(out)


def _moof(
    number: int, header: bytes, decoded: int, run_flags: int, records: Sequence[bytes]
) -> bytes:
    """A fragment's moof: one traf of its track (`header`: its tfhd), its samples' data
    following in the mdat right after it (the trun's data offset counts from the moof)."""

    def build(offset: int) -> bytes:
        run = full_box(b"trun", run_flags, struct.pack(">Ii", len(records), offset), *records)
        tfdt = full_box(b"tfdt", 0, struct.pack(">I", decoded))
        mfhd = full_box(b"mfhd", 0, struct.pack(">I", number))
        return box(b"moof", mfhd, box(b"traf", header, tfdt, run))

    return build(len(build(0)) + 8)


def media_timescale(data: bytes) -> int:
    """The `mdhd` timescale of an MP4's first track (version-0 box)."""
    return struct.unpack_from(">I", _find(_boxes(data), [b"moov", b"trak", b"mdia", b"mdhd"]), 12)[
        0
    ]
