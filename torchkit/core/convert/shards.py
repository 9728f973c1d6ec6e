"""`convert shards`: any data torchkit reads -> shuffled WebDataset shards, written safely and
resumably.

Layout of OUT (what the shard reader, `core/data/sources/shards.py`, reads as split data):

- `{split}-000000.tar`, ... one set per split (train, val, test); `shard-000000.tar`, ... for
  data without splits;
- in each tar, one WebDataset sample per image: `KEY.EXT`, the image's bytes exactly as the
  source file has them (in-memory data such as `digits`: a PNG), `KEY.cls` its class index as
  decimal text (labelled data only), `KEY.json` `{"label": name or null, "path": original id}`;
  KEY is `{split}_{position:08d}` (`sample_...` without splits), the position in the set's
  writing order, never with a dot (WebDataset groups members by the name up to the first dot);
- `classes.txt`: the class names, one a line, in label order (empty for unlabelled data);
- `manifest.json`, written last: the source, the options, counts per split and class, and per
  shard its name, samples, bytes and SHA-256, its positions `start` to `end` and each sample's
  image extension and class index (`extensions`, `labels`: the shard's samples without reading
  it, which is how a web server's shards are streamed); the unreadable images skipped.

The same data and options give the same shards byte for byte: the order is a seeded shuffle of
each split (or the source order), and the tar headers carry fixed times, owners and modes.

Each shard is written to a temporary name and renamed when complete, and listed in
`manifest.partial.json` (a line a shard, appended: `_PartialManifest`) before the next begins: a
run that is stopped (Ctrl-C, SIGTERM, a kill, a full disk) leaves only complete shards, and the
same command run again keeps those whose size and SHA-256 still match and writes the rest. A run
with other data or options is refused without `--force`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import re
import sys
import tarfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

from torchkit import __version__
from torchkit.core.convert.sample_tar import SampleTarWriter
from torchkit.core.data.image_files import (
    UNREADABLE_WARNINGS,
    image_path,
    strict_unreadable_error,
    unreadable_reason,
)
from torchkit.core.data.sources.discovery import (
    IMAGE_EXTENSIONS,
    collecting_not_unpacked,
    collecting_unlisted,
    place_in_source,
)
from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.io import sizes
from torchkit.core.io.claims import synced_when_kept
from torchkit.core.io.errors import InputError, OutputExistsError, UsageError, first_and_more
from torchkit.core.io.files import (
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    remove_stale_temporaries,
)
from torchkit.core.io.folder_contents import exact_pattern, proven
from torchkit.core.io.force import check_replaceable, force_hint
from torchkit.core.io.incomplete import incomplete_run
from torchkit.core.io.non_utf8_names import json_text
from torchkit.core.io.output_paths import MARKER, REPLACED_SUFFIX, leftovers, remove_tree, shown
from torchkit.core.io.output_proofs import tar_by
from torchkit.core.io.outputs import OutputFolder, reports_inside
from torchkit.core.io.overlap import InputPath, check_overlap
from torchkit.core.io.progress import Progress
from torchkit.core.io.records import read_record_bytes
from torchkit.core.io.redaction import redact_url
from torchkit.core.io.wording import counted
from torchkit.core.runtime.ahead import read_ahead
from torchkit.deferred_signals import signals_deferred

log = logging.getLogger("torchkit")

COMMAND = "convert shards"
WHAT = "output folder"
MANIFEST = "manifest.json"
PARTIAL_MANIFEST = "manifest.partial.json"
CLASSES_FILE = "classes.txt"
TAR_OWNER = "torchkit"  # every member's user and group name
# Everything a run writes into OUT (`folder_contents` patterns): --force refuses an OUT holding
# anything else, which replacing it would delete. Shards and manifests only where their content
# shows torchkit wrote them (another tool's train-000000.tar or manifest.json is refused): each
# member's owner `torchkit` (TAR_OWNER), the manifest's `written_by`, classes.txt's names those
# its manifest lists (`_is_classes_file`).
SHARDS_OUTPUTS = (
    *(
        proven(f"{name}-[0-9][0-9][0-9][0-9][0-9][0-9]*.tar", tar_by(TAR_OWNER))
        for name in ("train", "val", "test", "shard")
    ),
    proven(MANIFEST, lambda path: _is_manifest(path)),  # (defined below)
    proven(PARTIAL_MANIFEST, lambda path: _is_manifest(path)),
    proven(CLASSES_FILE, lambda path: _is_classes_file(path)),
)
UNSPLIT = "shard"  # the shard names of data without splits: shard-000000.tar
UNSPLIT_KEY = "sample"  # and its sample keys: sample_00000000
FORMAT_VERSION = 1
DEFAULT_SHARD_SIZE = "1GB"
# Fixed tar header fields, so that the same data and options give the same bytes. An integer
# mtime: a float one makes tarfile add a PAX header to every member.
TAR_MTIME = 0
TAR_MODE = 0o444
_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE  # tarfile pads a closed archive to a multiple of this
_END_BLOCKS = 2 * _BLOCK  # the two zero blocks that end an archive

_SHARD_FILE = re.compile(r"(?:train|val|test|shard)-\d{6,}\.tar")
# PIL format -> the extension an image of it is stored under, when its file's own is not one
# that shard readers take for an image: a CSV index may name `x.dat`, `x.json` or `x.cls` (the
# latter two replaced the sample's label member and left it without an image).
_FORMAT_EXTENSIONS = {
    "JPEG": "jpg",
    "MPO": "jpg",
    "PNG": "png",
    "GIF": "gif",
    "BMP": "bmp",
    "WEBP": "webp",
    "TIFF": "tif",
    "PPM": "ppm",
}
# PIL formats said with "an" that begin with a consonant letter: initialisms whose first
# letter's name sounds a vowel (an SGI file; a FITS or a SUN file, words, take "a").
_AN_FORMATS = frozenset({"FLI", "FTEX", "HDF5", "MPEG", "MSP", "SGI", "XBM", "XPM", "XVTHUMB"})


def parse_size(text: str) -> int:
    """Bytes of a `--shard-size`: `1GB` (10^9), `256MiB` or `256M` (2^20 each), `1.5GB`."""
    return sizes.parse_size(text, "--shard-size")


@dataclass(frozen=True)
class ShardOptions:
    """What decides the shards' bytes (a re-run resumes only with the same)."""

    shard_size: int | None  # bytes a shard may not pass; None: no limit by size
    per_shard: int | None  # samples in a shard at most; None: no limit by count
    seed: int = 0
    shuffle: bool = True
    verify: bool = False  # decode every image fully (else its header is checked)

    def to_dict(self) -> dict:
        return {
            "shard_size": self.shard_size,
            "per_shard": self.per_shard,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "verify": self.verify,
        }


def shard_options(
    *,
    shard_size: str | int | None = None,
    per_shard: int | None = None,
    seed: int = 0,
    shuffle: bool = True,
    verify: bool = False,
) -> ShardOptions:
    """The options of `convert shards`: `shard_size` a size (`1GB`) or bytes; with neither
    limit, shards of at most DEFAULT_SHARD_SIZE. Both: a shard closes at the first reached."""
    if per_shard is not None and per_shard < 1:
        raise UsageError(f"--per-shard must be at least 1, not {per_shard}")
    if isinstance(shard_size, str):
        shard_size = parse_size(shard_size)
    elif shard_size is not None and shard_size < 1:
        raise UsageError(f"--shard-size must be at least one byte, not {shard_size}")
    if shard_size is None and per_shard is None:
        shard_size = parse_size(DEFAULT_SHARD_SIZE)
    return ShardOptions(shard_size, per_shard, seed, shuffle, verify)


# --- the plan: which samples, in which order --------------------------------------------------


@dataclass
class ShardSet:
    """The samples of one split (or of data without splits), in writing order."""

    name: str  # train | val | test | shard: the shard file names
    key_prefix: str  # train | val | test | sample: the sample keys
    samples: Any  # datasource.Samples
    order: list[int]  # sample indices in writing order
    # The class index each label of `samples` is written as (None: no label), see
    # `written_classes`.
    written: list[int | None] = field(default_factory=list)

    def label(self, index: int) -> int | None:
        """The class index sample `index` is written with (None: unlabelled)."""
        return self.written[self.samples.labels[index]]

    def key(self, position: int) -> str:
        return f"{self.key_prefix}_{position:08d}"

    def shard_name(self, number: int) -> str:
        return f"{self.name}-{number:06d}.tar"


def written_classes(classes: Sequence[str]) -> tuple[list[str], list[int | None]]:
    """(the class names classes.txt lists, the index each of `classes` is written as): "" is
    no class but unlabelled images (all of unlabelled data; an unlabelled split, such as HF's
    test split, beside labelled ones), written without a label."""
    names: list[str] = []
    written: list[int | None] = []
    for name in classes:
        # By place, not by name: two classes named alike (ImageNet's two "crane"s) stay two.
        written.append(None if name == "" else len(names))
        if name != "":
            names.append(name)
    return names, written


def plan_sets(data: Any, options: ShardOptions) -> list[ShardSet]:
    """Each split of `data` (a DataSource), or its whole, in writing order: shuffled with a
    seed of its own (`SEED:SPLIT`: a split's order does not depend on the others), or as the
    source lists them with `shuffle=False`."""
    parts = list(data.splits.items()) if data.is_split else [(UNSPLIT, data.whole)]
    written = written_classes(data.classes)[1]
    sets = []
    for name, samples in parts:
        order = list(range(len(samples)))
        if options.shuffle:
            random.Random(f"{options.seed}:{name}").shuffle(order)
        key_prefix = UNSPLIT_KEY if name == UNSPLIT else name
        sets.append(ShardSet(name, key_prefix, samples, order, written))
    return sets


def fingerprint(classes: Sequence[str], sets: Sequence[ShardSet]) -> str:
    """SHA-256 of what the data is: its classes and each set's samples (id, label), in source
    order. A re-run on other data does not resume."""
    digest = hashlib.sha256(json.dumps(list(classes)).encode())
    for shard_set in sets:
        samples = shard_set.samples
        for sample_id, label in zip(samples.ids, samples.labels, strict=True):
            line = f"{shard_set.name}\t{sample_id}\t{label}\n"
            digest.update(line.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


# --- reading the source -----------------------------------------------------------------------


@dataclass
class Loaded:
    """One source image, read: its extension and bytes, or why it could not be read."""

    extension: str = ""
    data: bytes = b""
    error: str | None = None


def _extension(name: str) -> str:
    """The image extension of a file `name`, lower-cased ("" if it has none readers know)."""
    last = name[name.rfind("/") + 1 :]
    if last in ("", "."):  # `a/b.png/`, `a/b.png/.`: the component before (pathlib's name)
        last = PurePosixPath(name).name
    # PurePosixPath(name).suffix without making one a sample (a tenth of a sample's CPU).
    dot = last.rfind(".")
    suffix = last[dot:].lower() if 0 < dot < len(last) - 1 else ""
    return suffix[1:] if suffix in IMAGE_EXTENSIONS else ""


def _png(pixels: Any) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def load_sample(
    samples: Any, index: int, *, verify: bool = False, read: bytes | Exception | None = None
) -> Loaded:
    """The bytes of sample `index` as the source file has them (in-memory pixels as a PNG),
    checked to be an image PIL can open (`verify`: decoded in full, so that a truncated file
    is caught too). An unreadable image is a `Loaded` with its `error`, never an exception.
    `read`: the file's bytes read already (`read_file`), or what reading them raised."""
    from torchkit.core.data.image_files import (
        opened_image,
        read_regular_file,
        unreadable_image_errors,
    )

    if samples.images is not None:
        return Loaded("png", _png(samples.images[index]))
    path = samples.paths[index]
    name = image_path(samples, index)  # as its warning names it
    try:
        data = read_regular_file(path) if read is None else read
        if isinstance(data, Exception):
            raise data
        with opened_image(data, name=name) as image:
            if verify:
                image.load()
            image_format = image.format or ""
    except unreadable_image_errors() as error:
        return Loaded(error=unreadable_reason(error))
    extension = _extension(str(path)) or _FORMAT_EXTENSIONS.get(image_format, "")
    if not extension:
        kind = image_format or "non-image"
        article = "an" if kind[0] in "AEIO" or kind in _AN_FORMATS else "a"
        return Loaded(
            error=f"{article} {kind} file, which shards cannot store as an image (they hold "
            f"{', '.join(sorted(set(_FORMAT_EXTENSIONS.values())))}: convert it first)"
        )
    return Loaded(extension, data)


def read_file(samples: Any, index: int) -> bytes | Exception:
    """The bytes of sample `index`'s file, or the exception reading them raised (raised again
    by `load_sample(..., read=)`, where it is told unreadable or not)."""
    from torchkit.core.data.image_files import read_regular_file

    try:
        return read_regular_file(samples.paths[index])
    except Exception as error:
        # Kept until the sample is written (a window, a spill: the whole set later): its
        # traceback's frames let go of their locals, a parquet reader's whole row group.
        traceback.clear_frames(error.__traceback__)
        return error


# --- writing shards ---------------------------------------------------------------------------


@dataclass
class ShardRecord:
    """A complete shard: positions `start` to `end` of its set's order (its samples, and the
    unreadable images skipped among them)."""

    name: str
    split: str
    samples: int
    bytes: int
    sha256: str
    start: int
    end: int
    unreadable: list[dict] = field(default_factory=list)  # {"position", "path", "reason"}
    # Each sample's image extension and class index (None: unlabelled), in member order: what
    # a reader streaming the shards from a web server lists them by before it fetches one.
    # None in records of a run from before they were kept (resumed from its partial manifest).
    extensions: list[str] | None = None
    labels: list[int | None] | None = None

    def to_dict(self) -> dict:
        entry = {
            "name": self.name,
            "split": self.split,
            "samples": self.samples,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "start": self.start,
            "end": self.end,
            "unreadable": [dict(entry) for entry in self.unreadable],
        }
        if self.extensions is not None and self.labels is not None:
            entry["extensions"], entry["labels"] = list(self.extensions), list(self.labels)
        return entry

    @classmethod
    def from_dict(cls, entry: dict) -> ShardRecord:
        return cls(
            name=str(entry["name"]),
            split=str(entry["split"]),
            samples=int(entry["samples"]),
            bytes=int(entry["bytes"]),
            sha256=str(entry["sha256"]),
            start=int(entry["start"]),
            end=int(entry["end"]),
            unreadable=[dict(e) for e in entry.get("unreadable", [])],
            extensions=entry.get("extensions"),
            labels=entry.get("labels"),
        )


def _member_bytes(name: str, size: int) -> int:
    """What a member takes in the tar: its header (as tarfile writes it) and padded data."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, TAR_MTIME, TAR_MODE
    info.uname = info.gname = TAR_OWNER
    header = info.tobuf(tarfile.DEFAULT_FORMAT, tarfile.ENCODING, "surrogateescape")
    return len(header) + -(-size // _BLOCK) * _BLOCK


def closed_size(offset: int) -> int:
    """The size of a tar archive closed after `offset` bytes of members."""
    return -(-(offset + _END_BLOCKS) // _RECORD) * _RECORD


class _Digesting:
    """A file object that passes writes on and keeps their count and SHA-256."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.count = 0

    def write(self, data: bytes) -> int:
        self.handle.write(data)
        self.digest.update(data)
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        self.handle.flush()


class _ShardFile:
    """One shard being written: a temporary file beside its name (atomic_write) that a
    SampleTarWriter fills; renamed into place by `close`, removed by `abort`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stack = contextlib.ExitStack()
        handle = self._stack.enter_context(atomic_write(path, "wb"))
        self._stream = _Digesting(handle)
        try:
            self._tar = SampleTarWriter(
                self._stream, owner=TAR_OWNER, mode=TAR_MODE, mtime=TAR_MTIME
            )
        except BaseException:
            self.abort()
            raise
        self.samples = 0

    def size_with(self, extra: int) -> int:
        """The shard's size, closed, with `extra` more bytes of members."""
        return closed_size(self._tar.offset + extra)

    def write(self, sample: dict) -> None:
        self._tar.write(sample)
        self.samples += 1

    def close(self) -> tuple[int, str]:
        """Finish the archive and rename it into place: (bytes, SHA-256)."""
        self._tar.close()
        self._stack.close()
        return self._stream.count, self._stream.digest.hexdigest()

    def abort(self) -> None:
        """Remove the temporary file (the exception being handled goes on)."""
        if hasattr(self, "_tar"):  # closed, or tarfile flushes into the closed file when freed
            with contextlib.suppress(Exception):
                self._tar.close()
        self._stack.__exit__(*sys.exc_info())


def sample_members(
    shard_set: ShardSet, position: int, loaded: Loaded, classes: Sequence[str]
) -> dict:
    """The WebDataset sample of the image at `position` of the set: `__key__` and members
    (`classes`: the names classes.txt lists)."""
    index = shard_set.order[position]
    label = shard_set.label(index)
    sample: dict = {"__key__": shard_set.key(position), loaded.extension: loaded.data}
    about = {
        "label": None if label is None else classes[label],
        "path": shard_set.samples.ids[index],
    }
    sample["json"] = json_text(about, sort_keys=True).encode("utf-8")  # as JSON files are
    if label is not None:
        sample["cls"] = str(label).encode()
    return sample


def _sample_bytes(sample: dict) -> int:
    key = sample["__key__"]
    return sum(_member_bytes(f"{key}.{k}", len(v)) for k, v in sample.items() if k != "__key__")


@dataclass
class _Writing:
    """What one run shares across sets: where, how, and what to call after each shard."""

    folder: Path
    options: ShardOptions
    classes: list[str]
    labelled: bool
    strict: bool
    workers: int
    on_shard: Callable[[ShardRecord], None]  # a shard complete (or the last one grown)
    advance: Callable[[int], None]
    warned: int = 0
    status: Callable[[str | None], None] | None = None  # what is done now, beside the progress


def write_set(run: _Writing, shard_set: ShardSet, records: list[ShardRecord]) -> None:
    """Write the shards of `shard_set` after its complete ones in `records` (appended to as
    each shard is complete)."""
    options = run.options
    total = len(shard_set.order)
    position = records[-1].end if records else 0
    start = position
    skipped: list[dict] = []
    extensions: list[str] = []
    labels: list[int | None] = []
    shard: _ShardFile | None = None
    samples = shard_set.samples

    def load(position: int, read: bytes | Exception | None = None) -> Loaded:
        return load_sample(samples, shard_set.order[position], verify=options.verify, read=read)

    def finish(end: int) -> None:
        nonlocal shard, start, skipped, extensions, labels
        assert shard is not None
        count = shard.samples
        # Ctrl-C or SIGTERM waits until the shard renamed into place is also in the records (and
        # the partial manifest the stop writes): a stop in between left a whole shard unlisted.
        with signals_deferred():
            size, digest = shard.close()
            shard = None
            records.append(
                ShardRecord(
                    shard_set.shard_name(len(records)),
                    shard_set.name,
                    count,
                    size,
                    digest,
                    start,
                    end,
                    skipped,
                    extensions,
                    labels,
                )
            )
            start, skipped, extensions, labels = end, [], [], []
            run.on_shard(records[-1])

    def check(position: int, read: bytes | Exception) -> None:
        # --strict: an image the spill cannot read, or whose bytes are no image PIL can open
        # (its header read; --verify's full decode waits for its turn), stops the run then,
        # not after the spill of every other sample (all of the data's images, before a word).
        loaded = load_sample(samples, shard_set.order[position], read=read)
        if loaded.error is not None:
            _skip(run, shard_set, position, loaded.error, skipped)

    try:
        positions = range(position, total)
        costs = _window_costs(samples)
        if costs is None:  # image files, tar members: each read alone
            reads = read_ahead(load, positions, run.workers)
        else:
            reads = _read_in_windows(
                lambda position: read_file(samples, shard_set.order[position]),
                load,
                positions,
                shard_set.order,
                costs,
                run.workers,
                spill_folder=run.folder,
                status=run.status,
                check=check if run.strict else None,
            )
        for position, loaded in zip(positions, reads, strict=True):
            if loaded.error is not None:
                _skip(run, shard_set, position, loaded.error, skipped)
                continue
            sample = sample_members(shard_set, position, loaded, run.classes)
            if shard is not None and (
                shard.samples == options.per_shard
                or (
                    options.shard_size is not None
                    and shard.size_with(_sample_bytes(sample)) > options.shard_size
                )
            ):
                finish(position)
            if shard is None:
                shard = _ShardFile(run.folder / shard_set.shard_name(len(records)))
            shard.write(sample)
            extensions.append(loaded.extension)
            labels.append(shard_set.label(shard_set.order[position]))
            run.advance(1)
        if shard is not None:
            finish(total)
    except BaseException:
        if shard is not None:
            shard.abort()
        raise
    if skipped:  # unreadable images after the last shard: they belong to it
        if not records:
            first = skipped[0]
            named = image_path(shard_set.samples, shard_set.order[first["position"]])
            raise InputError(
                f"none of the {total} images of {_set_words(shard_set)} could be read",
                f"the first, {named}: {first['reason']}",  # as its warning named it
            )
        records[-1].unreadable += skipped
        records[-1].end = total
        run.on_shard(records[-1])


# The bytes of read samples `write_set` holds at most (about) where the source reads images in
# blocks (parquet row groups, streamed shards): the samples of the next positions that fit are
# read in source order, so each block once, then written in the set's order. Read in the
# shuffled order, nearly every sample read its whole block again once the blocks outgrew the
# reader's cache (a million tiny parquet images: 7 s of CPU a shard instead of 1).
WINDOW_BYTES = 256 << 20
# What a read sample holds beyond its image's bytes: its `Loaded`, the bytes object, a list slot.
_SAMPLE_OVERHEAD = 400


@dataclass
class _BlockCosts:
    """The bytes sample `index` takes read (`costs(index)`): its block's image bytes shared
    among the block's samples, plus what holding it costs."""

    ids: Sequence[int]  # each sample's block
    sizes: Sequence[int]  # each block's image bytes
    each: list[int]  # a sample of each block, read

    def __call__(self, index: int) -> int:
        return self.each[self.ids[index]]


def _window_costs(samples: Any) -> _BlockCosts | None:
    """The bytes each sample of `samples` takes read, where the source reads images in blocks
    of known size; else None."""
    from torchkit.core.data.stored_image import read_blocks

    blocks = read_blocks(samples.paths)
    if blocks is None or blocks.sizes is None:
        return None  # no blocks, or (streamed shards without a cache limit) all kept anyway
    counts = [0] * len(blocks.sizes)
    for block in blocks.ids:
        counts[block] += 1
    pairs = zip(blocks.sizes, counts, strict=True)
    each = [size // max(1, count) + _SAMPLE_OVERHEAD for size, count in pairs]
    return _BlockCosts(blocks.ids, blocks.sizes, each)


def _windows(
    positions: range, order: Sequence[int], cost: Callable[[int], int], window_bytes: int
) -> list[range]:
    """`positions` cut into windows of consecutive positions whose samples take up to
    `window_bytes` read (at least one sample each)."""
    windows = []
    start, held = positions.start, 0
    sizes_read = map(cost, order[positions.start : positions.stop])
    for position, size in zip(positions, sizes_read, strict=True):
        if position > start and held + size > window_bytes:
            windows.append(range(start, position))
            start, held = position, 0
        held += size
    if start < positions.stop:
        windows.append(range(start, positions.stop))
    return windows


def _spill_pays(windows: list[range], order: Sequence[int], costs: _BlockCosts) -> bool:
    """Whether reading the windows one at a time would read more than twice the bytes of the
    blocks they need: a full shuffle of data many windows large reads nearly every block once a
    window, where spilling the samples to disk reads each block once and the samples twice. The
    block a window reads last (its samples are read in source order) is taken as still held
    by the reader for the next window."""
    if len(windows) < 3:
        return False
    needed: set[int] = set()
    held = None
    read = 0
    for window in windows:
        sources = order[window.start : window.stop]  # sliced and mapped: no Python loop a sample
        blocks = set(map(costs.ids.__getitem__, sources))
        read += sum(costs.sizes[block] for block in blocks if block != held)
        needed |= blocks
        held = costs.ids[max(sources)]
    return read > 2 * sum(costs.sizes[block] for block in needed)


def _read_in_windows(
    read: Callable[[int], bytes | Exception],
    load: Callable[[int, bytes | Exception], Loaded],
    positions: range,
    order: Sequence[int],
    cost: Callable[[int], int],
    workers: int,
    *,
    spill_folder: Path | None = None,
    window_bytes: int | None = None,
    status: Callable[[str | None], None] | None = None,
    check: Callable[[int, bytes | Exception], None] | None = None,
) -> Iterator[Loaded]:
    """The samples at `positions`, in order, a window of consecutive positions at a time (as
    many as take `window_bytes`, WINDOW_BYTES unless given): each window's files `read` in the
    order of their source indices (`order`: the set's writing order), in this thread, which
    reads each block of the source once a window, then checked by `load` in `workers` threads,
    in order. In threads, two samples of neighbouring blocks read at once dropped each other's
    block from a cache that holds one (100 MB row groups), and read it again.

    Where a window holds few of the blocks' samples (large images in a full shuffle), reading
    every block once a window is quadratic: then, with `spill_folder` and block `cost`s
    (`_BlockCosts`), every sample is read once in source order into an unnamed temporary file
    there, and each window read back from it (`status` told how far that is: no sample is
    written meanwhile). `check`: called with each sample the spill reads (its bytes, or what
    reading them raised), which raises to stop the run (`--strict`); else an unreadable
    sample's error is kept for its turn."""
    windows = _windows(
        positions, order, cost, WINDOW_BYTES if window_bytes is None else window_bytes
    )
    spill = None
    if (
        spill_folder is not None
        and isinstance(cost, _BlockCosts)
        and _spill_pays(windows, order, cost)
    ):
        spill = _spill(read, positions, order, cost, spill_folder, status, check)
    # Each window read in source order, or where the spill holds it
    fetch, key = (read, order.__getitem__) if spill is None else (spill.read, spill.offset)
    try:
        for window in windows:
            first = window.start
            files: list[bytes | Exception | None] = [None] * len(window)
            for position in sorted(window, key=key):
                files[position - first] = fetch(position)

            def checked(position: int, first: int = first, files: list = files) -> Loaded:
                data, files[position - first] = files[position - first], None  # freed once taken
                return load(position, data)

            yield from read_ahead(checked, window, workers)
    finally:
        if spill is not None:
            spill.close()


class _SpilledSamples:
    """Samples' bytes in an unnamed temporary file (gone when closed, or when the process
    ends however it ends), each read back by its position."""

    def __init__(self, folder: Path, positions: range) -> None:
        import tempfile
        from array import array

        # Unnamed (O_TMPFILE, or unlinked at once): nothing is left behind, whatever stops the run.
        self._file = tempfile.TemporaryFile(dir=folder, prefix=".spill-")  # noqa: SIM115
        self._first = positions.start
        self._offsets = array("q", bytes(8 * len(positions)))
        self._sizes = array("q", bytes(8 * len(positions)))
        self._errors: dict[int, Exception] = {}  # what reading a sample's file raised
        self._end = 0

    def write(self, position: int, data: bytes | Exception) -> None:
        if isinstance(data, Exception):
            self._errors[position] = data
            return
        self._offsets[position - self._first] = self._end
        self._sizes[position - self._first] = len(data)
        self._file.write(data)
        self._end += len(data)

    def written(self) -> None:
        """Every sample written: flushed, to be read back."""
        self._file.flush()

    def offset(self, position: int) -> int:
        return self._offsets[position - self._first]

    def read(self, position: int) -> bytes | Exception:
        if position in self._errors:
            return self._errors.pop(position)
        from torchkit.core.data.sources.shards import _pread_all

        size, at = self._sizes[position - self._first], self.offset(position)
        # In parts: a read returns at most 2 GiB less a page on Linux, any read may return less.
        data = _pread_all(self._file.fileno(), at, size)
        if len(data) < size:
            raise OSError(
                f"the temporary file of samples read back short ({len(data)} of {size} bytes)"
            )
        return data

    def close(self) -> None:
        # What is still buffered is dropped with the file: a full disk raises again in the flush.
        with contextlib.suppress(OSError):
            self._file.close()


# What a sample's members take in a shard beyond its image's bytes, reckoned up: the headers
# of three members (image, .json, .cls), the last two's bytes, the padding of all three.
_SHARD_SAMPLE_BYTES = 3 << 10


def _spill(
    read: Callable[[int], bytes | Exception],
    positions: range,
    order: Sequence[int],
    cost: Callable[[int], int],
    folder: Path,
    status: Callable[[str | None], None] | None = None,
    check: Callable[[int, bytes | Exception], None] | None = None,
) -> _SpilledSamples | None:
    """Every sample at `positions` read in the order of its source index, each block once, into
    a temporary file in `folder`. None, with a warning, where `folder`'s disk has no room for
    the images twice (the spill and the shards: checked first) or fills meanwhile: the windows
    then read the blocks again, as slow as before but with the room it had."""
    from array import array

    from torchkit.core.io.write_errors import WRITE_ONLY_ERRNOS

    images = sum(map(cost, order[positions.start : positions.stop]))  # and holding them
    needed = 2 * images + _SHARD_SAMPLE_BYTES * len(positions)
    free = sizes.free_bytes(folder)
    if free is not None and free < needed:
        _no_spill(
            f"{shown(folder)} has no room for a temporary copy of the images beside the shards "
            f"({sizes.format_megabytes(free / 1e6)} MB free, about "
            f"{sizes.format_megabytes(needed / 1e6)} MB needed)"
        )
        return None
    try:
        spill = _SpilledSamples(folder, positions)
    except OSError as error:
        if error.errno not in WRITE_ONLY_ERRNOS:
            raise
        _no_spill(
            f"cannot make a temporary copy of the images in {shown(folder)} ({error.strerror})"
        )
        return None
    try:
        # Each source index's position (-1: none), 8 bytes an index where a sorted list of the
        # positions took about 36 a sample.
        position_of = array("q", [-1]) * (max(order[p] for p in positions) + 1 if positions else 0)
        for position in positions:
            position_of[order[position]] = position
        count, every = 0, max(1, len(positions) // 100)
        for position in position_of:
            if position >= 0:
                if status is not None and count % every == 0:
                    status(f"copying images to a temporary file, {count:,} of {len(positions):,}")
                data = read(position)
                if check is not None:
                    check(position, data)
                spill.write(position, data)
                count += 1
        spill.written()
    except OSError as error:
        spill.close()
        if error.errno not in WRITE_ONLY_ERRNOS:
            raise
        _no_spill(
            f"the temporary copy of the images in {shown(folder)} could not be written "
            f"({error.strerror})"
        )
        return None
    except BaseException:
        spill.close()
        raise
    finally:
        if status is not None:
            status(None)
    return spill


def _no_spill(why: str) -> None:
    log.warning(
        f"{why}: reading the source's row groups (or streamed shards) again for each "
        f"{WINDOW_BYTES >> 20} MiB of the shuffled order instead, which is slower; the shards "
        "are the same"
    )


def _set_words(shard_set: ShardSet) -> str:
    return "the data" if shard_set.name == UNSPLIT else f"split {shard_set.name}"


def _skip(run: _Writing, shard_set: ShardSet, position: int, reason: str, skipped: list) -> None:
    index = shard_set.order[position]
    sample_id = shard_set.samples.ids[index]  # manifest.json's "path": relative to the data
    if run.strict:
        raise strict_unreadable_error(f"{image_path(shard_set.samples, index)}: {reason}")
    if run.warned < UNREADABLE_WARNINGS:
        log.warning(f"skipped unreadable image {image_path(shard_set.samples, index)}: {reason}")
    run.warned += 1
    skipped.append({"position": position, "path": sample_id, "reason": reason})
    run.advance(1)


# --- the manifest, and resuming ---------------------------------------------------------------


@dataclass
class ShardsReport:
    """What `convert shards` wrote (and what `manifest.json` says)."""

    source: str
    kind: str
    root: str
    output: str
    classes: list[str]
    labelled: bool
    options: ShardOptions
    fingerprint: str
    sets: list[ShardSet]
    records: dict[str, list[ShardRecord]]
    kept_shards: int = 0  # complete shards of an interrupted run that were kept
    seconds: float = 0.0
    # The folders in the source that could not be listed: their images are in no shard.
    unlisted_folders: list[str] = field(default_factory=list)
    # The tar members with a `..` in their names (not unpacked by tar -x): in no shard.
    not_unpacked: list[str] = field(default_factory=list)

    @property
    def shards(self) -> list[ShardRecord]:
        return [record for records in self.records.values() for record in records]

    def split_counts(self, *, per_class: bool = True) -> dict[str, dict]:
        """Per set: shards, samples, bytes, unreadable images and (`per_class`) samples per
        class."""
        counts = {}
        for shard_set in self.sets:
            records = self.records.get(shard_set.name, [])
            counts[shard_set.name] = {
                "shards": len(records),
                "samples": sum(r.samples for r in records),
                "bytes": sum(r.bytes for r in records),
                "unreadable": sum(len(r.unreadable) for r in records),
            }
            if per_class:
                counts[shard_set.name]["class_counts"] = self._class_counts(shard_set, records)
        return counts

    def _class_counts(self, shard_set: ShardSet, records: list[ShardRecord]) -> dict[str, int]:
        if not self.labelled:
            return {}
        counts = [0] * len(self.classes)
        for record in records:
            left_out = {entry["position"] for entry in record.unreadable}
            for position in range(record.start, record.end):
                label = shard_set.label(shard_set.order[position])
                if position not in left_out and label is not None:
                    counts[label] += 1
        return dict(zip(self.classes, counts, strict=True))

    def unreadable(self) -> list[dict]:
        return [
            {"split": record.split, "path": entry["path"], "reason": entry["reason"]}
            for record in self.shards
            for entry in record.unreadable
        ]

    def incomplete(self) -> InputError | None:
        """The error a run that did not write every image ends in, once the rest is written
        (as `cp -r` exits 1): unreadable images and folders that could not be listed, which a
        run that exited 0 let `convert shards src out && rm -r src` delete."""
        unreadable = len(self.unreadable())
        manifest = Path(self.output) / MANIFEST
        samples = sum(r.end - r.start for r in self.shards)
        failed = (
            f"{unreadable} of {samples} images could not be read and are in no shard in "
            f"{self.output} (listed in {manifest})"
        )
        if self.not_unpacked and not unreadable:
            left_out = self.not_unpacked
            are = "is" if len(left_out) == 1 else "are"
            return InputError(
                f"{counted(len(left_out), 'member')} of {self.source} with '..' in the path, "
                f"which tar -x does not unpack, {are} in no shard in {self.output} (listed in "
                f"{manifest}): {first_and_more(left_out, 3)}",
                "unpack the archive with the members renamed and convert the folder; "
                "--strict stops before writing any",
            )
        return incomplete_run(
            self.source,
            self.unlisted_folders,
            failed=failed if unreadable else None,
            left_out=f"their images are in no shard in {self.output} (listed in {manifest})",
            again="make them readable and convert again with --force; --strict stops before "
            "writing any",
        )

    def manifest(self, *, complete: bool) -> dict:
        """manifest.json's record; an interrupted run's (not `complete`) leaves out the counts
        per class (a pass over every sample, after each shard)."""
        splits = self.split_counts(per_class=complete)
        return {
            "written_by": f"torchkit {COMMAND}",
            "torchkit_version": __version__,
            "format": "webdataset",
            "format_version": FORMAT_VERSION,
            "complete": complete,
            "source": {"spec": self.source, "kind": self.kind, "root": self.root},
            "fingerprint": self.fingerprint,
            "options": self.options.to_dict(),
            "classes": list(self.classes),
            "labelled": self.labelled,
            "samples": sum(s["samples"] for s in splits.values()),
            "bytes": sum(s["bytes"] for s in splits.values()),
            "unreadable": sum(s["unreadable"] for s in splits.values()),
            "splits": splits,
            "shards": [record.to_dict() for record in self.shards],
            "unreadable_images": self.unreadable(),
            "unlisted_folders": list(self.unlisted_folders),
            "members_not_unpacked": list(self.not_unpacked),
        }

    def to_dict(self) -> dict:
        splits = self.split_counts()
        return {
            "source": self.source,
            "kind": self.kind,
            "output": self.output,
            "classes": len(self.classes) if self.labelled else 0,
            "shards": len(self.shards),
            "samples": sum(s["samples"] for s in splits.values()),
            "bytes": sum(s["bytes"] for s in splits.values()),
            "unreadable": sum(s["unreadable"] for s in splits.values()),
            "kept_shards": self.kept_shards,
            "options": self.options.to_dict(),
            "splits": splits,
            "unreadable_images": self.unreadable(),
            "unlisted_folders": list(self.unlisted_folders),
            "members_not_unpacked": list(self.not_unpacked),
            "seconds": round(self.seconds, 3),
        }


class _PartialManifest:
    """`manifest.partial.json`, what a stopped run leaves for the same command to resume from,
    in JSON Lines: its first line the manifest as the run began (the identity of the data and
    options, the shards kept from an interrupted run), then one line a shard, appended as each is
    complete. Each shard's record is written once: rewriting the growing list after each shard
    (every sample's extension and class) made the bytes written grow with the square of the
    data. A line for a shard already listed replaces it (the unreadable images after the last
    shard). A shard is listed, on disk, before the next one begins, so a stop at any moment
    loses none but the one being listed (a torn last line is ignored: the run that resumes
    writes that shard again)."""

    def __init__(self, path: Path, report: ShardsReport) -> None:
        self.path = path
        self.report = report
        self._whole = False  # written whole by this run: what follows is appended
        self._fd: int | None = None  # open for appends

    def start(self) -> None:
        """Written whole, listing the shards so far: at the start of a run (none: OUT is an
        interrupted run from the start), and by the first shard of a run that began otherwise
        (a resumed run's file may list shards after the ones it kept)."""
        self.close()
        header = self.report.manifest(complete=False)
        del header["shards"]  # one line each after the header: appended alike, read alike
        lines = [json_text(header), *(_record_line(r) for r in self.report.shards)]
        atomic_write_text(self.path, "".join(f"{line}\n" for line in lines))
        self._whole = True

    def shard_done(self, record: ShardRecord) -> None:
        """List `record` (a shard complete, or the last one grown): one line, on disk when this
        returns (the shard itself was synced before its rename)."""
        if not self._whole:
            self.start()  # lists it with the others
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        data = (_record_line(record) + "\n").encode("utf-8", "surrogateescape")
        while data:
            data = data[os.write(self._fd, data) :]
        if not synced_when_kept(self.path):
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)


def _record_line(record: ShardRecord) -> str:
    return json_text(record.to_dict())


def _partial_lines(text: str) -> dict | None:
    """The partial manifest `text` as one dict with every shard in "shards": one JSON
    document (the header alone, or a file of a torchkit before the lines), or the header line
    and a line a shard, a later line for a shard replacing the earlier. Reading stops at a
    line that is not a whole record: a torn last line lists nothing."""
    try:
        whole = json.loads(text)
    except ValueError:
        pass
    else:
        if isinstance(whole, dict):
            whole.setdefault("shards", [])  # the header alone: none listed yet
        return whole
    lines = text.split("\n")
    try:
        header = json.loads(lines[0])
    except ValueError:
        return None
    if not isinstance(header, dict):
        return None
    listed = {}
    for line in lines[1:]:
        try:
            record = json.loads(line)
        except ValueError:
            break
        if not isinstance(record, dict) or not isinstance(record.get("name"), str):
            break
        listed[record["name"]] = record  # a replaced record keeps its place
    header["shards"] = list(listed.values())
    return header


def _read_record(path: Path) -> str:
    """The text of a manifest (or partial manifest) in OUT, where it is a regular file: a FIFO
    under its name is `NotARegularFile`, never opened to wait on (it hung the run for ever)."""
    return read_record_bytes(path).decode("utf-8")


def _is_manifest(path: Path) -> bool:
    """Whether `path` is a manifest (or partial manifest, its lines) a run wrote: its record
    written by this command, as every run's, old or new."""
    try:
        found = _partial_lines(_read_record(path))
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and found.get("written_by") == f"torchkit {COMMAND}"


_CLASSES_LIMIT = 64 << 20  # a million class names of 60 characters


def _is_classes_file(path: Path) -> bool:
    """Whether `path` is the classes.txt a run wrote: empty (unlabelled data), or the class
    names, one a line, that the manifest beside it (or its partial manifest, which a run
    writes before classes.txt) lists. A list of yours under that name is not: its names are
    not the manifest's, or there is no manifest (a list beside a run's marker alone, however
    soon after the marker it was written)."""
    try:
        if path.stat().st_size > _CLASSES_LIMIT:
            return False
        text = read_record_bytes(path).decode("utf-8", "surrogateescape")
    except (OSError, ValueError):
        return False
    if not text:
        return True
    names = text.split("\n")
    if names.pop() != "":
        return False  # each name a line, ended by "\n"
    for manifest in (path.with_name(MANIFEST), path.with_name(PARTIAL_MANIFEST)):
        try:
            record = _partial_lines(_read_record(manifest))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("written_by") != f"torchkit {COMMAND}":
            continue
        classes = record.get("classes")
        if isinstance(classes, list) and names in (classes, [name for name in classes if name]):
            return True
    return False


def read_partial(folder: Path) -> dict | None:
    """The partial manifest of an interrupted `convert shards` run in `folder`, or None (no
    such run: nothing there, a complete output, or a folder torchkit did not write)."""
    if folder.is_symlink() or not (folder / MARKER).is_file() or (folder / MANIFEST).exists():
        return None
    try:
        partial = _partial_lines(_read_record(folder / PARTIAL_MANIFEST))
    except (OSError, ValueError):
        return None
    if not isinstance(partial, dict) or partial.get("written_by") != f"torchkit {COMMAND}":
        return None
    return partial


def _differences(partial: dict, identity: dict) -> list[str]:
    """How the interrupted run differs from this one, in words (none: it resumes)."""
    found = []
    if partial.get("format_version") != FORMAT_VERSION:
        found.append(f"shard format {partial.get('format_version')}")
    if partial.get("fingerprint") != identity["fingerprint"]:
        found.append("other data")
    before = partial.get("options") or {}
    for name, value in identity["options"].items():
        if before.get(name) != value:
            option = "--" + name.replace("_", "-")
            found.append(f"{option} {before.get(name)} instead of {value}")
    return found


def _verified(folder: Path, partial: dict, sets: Sequence[ShardSet]) -> dict[str, list]:
    """The complete shards of the interrupted run that are still as it wrote them, per set:
    each set's records up to the first shard that is missing or differs in size or SHA-256."""
    from torchkit.core.data.hashing import file_digest

    kept: dict[str, list[ShardRecord]] = {s.name: [] for s in sets}
    try:
        records = [ShardRecord.from_dict(entry) for entry in partial.get("shards", [])]
    except (KeyError, TypeError, ValueError):
        return kept
    for shard_set in sets:
        mine = [r for r in records if r.split == shard_set.name]
        for number, record in enumerate(mine):
            path = folder / record.name
            expected_start = mine[number - 1].end if number else 0
            if (
                record.name != shard_set.shard_name(number)
                or record.start != expected_start
                or not path.is_file()
                or path.stat().st_size != record.bytes
                or file_digest(path).hex() != record.sha256
            ):
                break
            kept[shard_set.name].append(record)
    return kept


def _remove_leftovers(folder: Path, keep: Iterable[str] = ()) -> None:
    """Remove what a killed run left in `folder` (locked: no other writer): the temporaries of
    the files this command writes, and (given `keep`, the shards of the finished output) shard
    files that are not among them, which a reader of the folder would take for its own."""
    remove_stale_temporaries(folder, _writes_name)
    kept = set(keep)
    if not kept:
        return
    for entry in os.scandir(folder):
        stale_shard = _SHARD_FILE.fullmatch(entry.name) and entry.name not in kept
        if stale_shard and entry.is_file(follow_symlinks=False):
            remove_tree(Path(entry.path), ignore_errors=False)


def _writes_name(name: str) -> bool:
    """Whether `name` is a file this command writes in OUT (its temporaries are its own)."""
    return name in (MANIFEST, PARTIAL_MANIFEST, CLASSES_FILE) or bool(_SHARD_FILE.fullmatch(name))


def _container_inputs(data: Any) -> list[InputPath]:
    """The container files (tar shards, parquet files) that stored images are read from: a
    spec such as `OUT/train-{000000..000009}.tar` names no folder that data_inputs sees."""
    from torchkit.core.data.stored_image import is_stored

    parts = list(data.splits.values()) if data.is_split else [data.whole]
    readers = {
        id(path.reader): path.reader
        for samples in parts
        for path in samples.paths or ()
        if is_stored(path)
    }
    files = sorted({os.fspath(r.path) for r in readers.values() if getattr(r, "path", None)})
    return [InputPath.of(file, "source file") for file in files]


def _warn_partly_labelled(sets: Sequence[ShardSet], labelled: bool) -> None:
    """A warning for each set of which only some samples have a label: they are written so,
    and train and eval refuse such shards as they refuse the source, but for a test split,
    read unlabelled beside the others (train trains on those, without testing)."""
    if not labelled:
        return
    for shard_set in sets:
        total = len(shard_set.order)
        missing = sum(1 for index in range(total) if shard_set.label(index) is None)
        if 0 < missing < total:
            read = (
                "train and eval read such a test split unlabelled: best.pt is not tested on it"
                if shard_set.name == "test"
                else "train and eval refuse such shards"
            )
            log.warning(
                f"{missing} of the {total} images of {_set_words(shard_set)} have no label: "
                f"written without one, the others with theirs ({read})"
            )


def _classes_text(classes: Sequence[str], labelled: bool) -> str:
    if not labelled:
        return ""
    # Every reader of the shards takes the names from classes.txt: one that file would give
    # back otherwise (split over lines, its spaces dropped) left every sample of its class
    # unreadable ("labelled ' cat', which the class names beside the shards lack").
    broken = [name for name in classes if name.splitlines() != [name] or name != name.strip()]
    if broken:
        raise InputError(
            f"class name {broken[0]!r} cannot be a line of classes.txt, which is read one name "
            "a line without the spaces around it",
            "rename the class",
        )
    return "".join(f"{name}\n" for name in classes)


# --- the command ------------------------------------------------------------------------------


def writes_file(relative: PurePath) -> bool:
    """Whether `convert shards` writes `relative` in OUT: a shard, a manifest, classes.txt or a
    hidden file of its own (the marker, temporaries). Compared case-blind, as some disks are."""
    first = relative.parts[0].casefold()
    own = (MANIFEST, PARTIAL_MANIFEST, CLASSES_FILE)
    return first.startswith(".") or first in own or _SHARD_FILE.fullmatch(first) is not None


def check_report(
    output: str | os.PathLike | None,
    force: bool,
    *,
    source: str | os.PathLike,
    destination: str | os.PathLike,
) -> None:
    """Check a `-o FILE` report before any work (`check_report_output`): nor is it an image a
    CSV index names or a shard a pattern names, nor inside their folders (`--force` wrote the
    report over a source image)."""
    from torchkit.core.convert.report_file import check_report_output

    if output is None or os.fspath(output) == "-":
        return
    check_report_output(
        output,
        force,
        source=source,
        destination=destination,
        writes=writes_file,
        inputs=data_inputs(source, "source"),
    )


def convert_shards(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    options: ShardOptions | None = None,
    strict: bool = False,
    force: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
    status: Callable[[str | None], None] | None = None,
    before_keep: Callable[[ShardsReport], None] | None = None,
    report_file: str | os.PathLike | None = None,
) -> ShardsReport:
    """Write the data `src` names (any `--data` torchkit reads, unlabelled folders and CSVs
    too) as WebDataset shards into the folder `out` (module docstring). `out` may not be,
    contain or lie inside the source; an existing output is replaced only with `force` (and
    only one torchkit wrote), except an interrupted run of the same command on the same data
    with the same options, which is finished. Unreadable images are skipped with a warning
    and counted (`strict`: the first stops the run). `before_keep(report)` runs once every
    shard is written, before manifest.json says the output is complete: if it raises (the
    caller's `-o` report did not fit on its disk), `out` is left as an interrupted run, which
    the same command finishes, keeping every shard. `report_file`: the caller's `-o` file,
    which, written into `out`, is this command's to replace there with the rest. `status(text)`:
    what the run does meanwhile where no shard is written for a while (the images copied to a
    temporary file first), `status(None)` once it is done."""
    from torchkit.core.data.sources import open_data, warn_empty_splits, warn_stray_images
    from torchkit.core.data.sources.samples import partial_labels_kept
    from torchkit.core.runtime.cpus import check_workers
    from torchkit.core.runtime.pool import default_workers

    check_workers(workers)
    started = time.perf_counter()
    options = options or shard_options()
    target = Path(out)
    inputs = data_inputs(src, "source")
    # Refused before the source is listed: an output that overlaps it, or that exists (an
    # interrupted run of this command aside: whether it resumes depends on the data; and a
    # --force run killed before its first shard, whose old output `OutputFolder` puts back).
    check_overlap(target, WHAT, inputs)
    # What --force replaces in OUT (`OutputFolder`'s `owned`): a hint to pass --force is given
    # only where --force would not be refused too (a file of yours in OUT).
    owned = (*SHARDS_OUTPUTS, *map(exact_pattern, reports_inside(target, [report_file])))
    if read_partial(target) is None and not force and not leftovers(target, REPLACED_SUFFIX):
        check_replaceable(target, False, what=WHAT, command=COMMAND, owned=owned)
    # written again: a sample without a label stays so, no other; the folders that cannot be
    # listed (warned of) fail the run once the rest is written (`ShardsReport.incomplete`)
    with (
        partial_labels_kept(),
        collecting_unlisted() as unlisted,
        collecting_not_unpacked() as not_unpacked,
    ):
        data = open_data(src, allow_unlabelled=True)
    warn_empty_splits(data)
    warn_stray_images(data)
    check_overlap(target, WHAT, _container_inputs(data))
    labelled = data.labelled
    # The names classes.txt lists: not the "" of an unlabelled split beside labelled ones.
    classes = written_classes(data.classes)[0] if labelled else list(data.classes)
    classes_text = _classes_text(classes, labelled)
    sets = plan_sets(data, options)
    _warn_partly_labelled(sets, labelled)
    identity = {"fingerprint": fingerprint(data.classes, sets), "options": options.to_dict()}
    partial = read_partial(target)
    differences = _differences(partial, identity) if partial is not None else []
    if differences and not force:
        refused = force_hint(target, "", command=COMMAND, owned=owned)  # where --force is too
        raise OutputExistsError(
            f"{WHAT} {target} holds an interrupted {COMMAND} run with " + ", ".join(differences),
            "run it with the same SRC and options to finish it"
            + (f"; {refused}" if refused else ", or pass --force to start over"),
        )
    resume = partial is not None and not differences
    report = ShardsReport(
        source=redact_url(os.fspath(src)),  # a URL's password or token never recorded
        kind=data.kind,
        root=data.root,
        output=os.fspath(target),
        classes=list(classes),
        labelled=labelled,
        options=options,
        fingerprint=identity["fingerprint"],
        sets=sets,
        records={s.name: [] for s in sets},
        unlisted_folders=[place_in_source(path, data.root) for path in unlisted],
        not_unpacked=not_unpacked,
    )
    # Finishing a run removes the shard files its manifest does not list (`_remove_leftovers`):
    # refused where one is not a shard this command wrote (a file of yours of such a name).
    listed = [s.get("name") for s in (partial or {}).get("shards", []) if isinstance(s, dict)]
    output = OutputFolder(
        target,
        command=COMMAND,
        force=force,
        inputs=inputs,
        resume=resume,
        owned=(*SHARDS_OUTPUTS, *(exact_pattern(n) for n in listed if isinstance(n, str))),
        reports=[report_file],
        resume_removes=(_SHARD_FILE,),  # as `_remove_leftovers` removes them
        resume_option="finishing the interrupted run",
    )
    with output:
        if resume:  # read again under the lock
            partial = read_partial(target)
            if partial is not None and not _differences(partial, identity):
                report.records = _verified(target, partial, sets)
                report.kept_shards = len(report.shards)
        folder = output.begin()
        partial_manifest = _PartialManifest(folder / PARTIAL_MANIFEST, report)
        with output.reporting_write_errors():
            _remove_leftovers(folder)
            if not (resume or output.has_content):
                # Before anything else in OUT: a run killed before its first shard is listed
                # is resumed by the same command, where classes.txt alone (or a whole shard
                # not listed yet) made it "already exists (pass --force)"; and classes.txt is
                # always the run's by the names its manifest lists (`_is_classes_file`). (A
                # --force run that set an old output aside starts it at its first shard: one
                # killed before is undone by the next run, which puts the old output back,
                # never resumed into it.)
                partial_manifest.start()
            atomic_write_text(folder / CLASSES_FILE, classes_text)
        total = sum(len(s.order) for s in sets)
        done = sum(r.end - r.start for r in report.shards)
        if progress is not None:
            progress(done, total)

        def advance(count: int) -> None:
            nonlocal done
            done += count
            if progress is not None:
                progress(done, total)

        def on_shard(record: ShardRecord) -> None:
            partial_manifest.shard_done(record)
            output.keep()  # complete shards are worth keeping: an interrupt leaves them

        run = _Writing(
            folder=folder,
            options=options,
            classes=list(classes),
            labelled=labelled,
            strict=strict,
            workers=default_workers() if workers is None else workers,
            on_shard=on_shard,
            advance=advance,
            status=status,
        )
        with output.reporting_write_errors():
            try:
                for shard_set in sets:
                    write_set(run, shard_set, report.records[shard_set.name])
                report.seconds = time.perf_counter() - started
                if before_keep is not None:
                    before_keep(report)
            finally:
                partial_manifest.close()  # every complete shard is listed in it already
            manifest = report.manifest(complete=True)
            atomic_write_json(folder / MANIFEST, manifest, indent=1)
            remove_tree(folder / PARTIAL_MANIFEST, ignore_errors=False)
            _remove_leftovers(folder, keep=[r.name for r in report.shards])
    return report
