"""CIFAR-10 / CIFAR-100 "python version" (archive or folder) to PNG image folders.

Layout written: `OUT/{train,test}/<class>/<index>.png`, where `<index>` is the image's position in
its split (the batches concatenated in order, as torchvision's `CIFAR10`/`CIFAR100` number them),
zero-padded so that names sort in that order.

Archives are never extracted: the members needed are read into memory, and an archive with a
member path that could escape a folder (`../`, absolute) is refused outright. What a member may
expand to is bounded (`MAX_MEMBER_BYTES`, and `MAX_ARCHIVE_BYTES` for all of them), checked on
its tar header before a byte of it is decompressed and again while it is read in chunks: a small
crafted archive cannot make the process hold gigabytes. The pickles are read with a restricted
unpickler (see `safe_pickle`).
"""

from __future__ import annotations

import os
import re
import tarfile
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import Any

from torchkit.core.convert.safe_pickle import restricted_loads
from torchkit.core.data.sources.discovery import class_folder_problem
from torchkit.core.io.claims import reporting_write_errors
from torchkit.core.io.errors import InputError, OutputWriteError, UsageError, short_repr
from torchkit.core.io.files import require_input
from torchkit.core.io.folder_contents import proven
from torchkit.core.io.output_proofs import torchkit_png, with_software_text
from torchkit.core.io.outputs import OutputFolder
from torchkit.core.io.overlap import InputPath
from torchkit.core.io.progress import Progress
from torchkit.core.io.write_errors import named_as_final
from torchkit.core.runtime.cpus import check_workers
from torchkit.core.runtime.pool import chunked, default_workers, map_chunks

CIFAR10 = "cifar-10"
CIFAR100 = "cifar-100"
SIDE = 32
ROW_BYTES = 3 * SIDE * SIDE
LABEL_TYPES = ("fine", "coarse")
# `--variant`'s names of the two datasets.
VARIANTS = {"cifar10": CIFAR10, "cifar100": CIFAR100}
SPLITS = ("train", "test")
# What a conversion writes into OUT (`folder_contents` patterns, see `image_paths`): --force
# refuses an OUT holding anything else, which replacing it would delete.
# Each PNG only where its content shows torchkit wrote it (the Software text it carries, or
# from an earlier version a bare 32x32 PNG as OpenCV encodes one): an image of yours is refused.
CIFAR_OUTPUTS = tuple(
    proven(f"{split}/*/[0-9]*.png", torchkit_png(legacy_bare={(32, 32)})) for split in SPLITS
)

MIB = 1 << 20
# The largest genuine member, CIFAR-100's `train`, is 155 MB, and a whole archive expands to about
# 180 MB: a member (or file of a folder) over MAX_MEMBER_BYTES, or an archive whose members add up
# to more than MAX_ARCHIVE_BYTES, is not a CIFAR download, and is refused before it is read.
MAX_MEMBER_BYTES = 512 * MIB
MAX_ARCHIVE_BYTES = 2048 * MIB
_CHUNK_BYTES = 4 * MIB

_CIFAR10_TRAIN = re.compile(r"data_batch_(\d+)")
_CIFAR_NAMES = re.compile(r"data_batch_\d+|test_batch|batches\.meta|train|test|meta")


@dataclass
class CifarData:
    """The decoded dataset: per split, images as (N, 32, 32, 3) RGB uint8 and labels (N,)."""

    dataset: str
    classes: list[str]
    images: dict[str, Any]
    labels: dict[str, Any]
    label_type: str | None = None


@dataclass
class CifarReport:
    dataset: str
    label_type: str | None
    output: str
    classes: list[str]
    counts: dict[str, int]
    class_counts: dict[str, list[int]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def images(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict:
        return {
            "dataset": self.dataset,
            "label_type": self.label_type,
            "output": self.output,
            "images": self.images,
            "splits": dict(self.counts),
            "classes": list(self.classes),
            "class_counts": {k: list(v) for k, v in self.class_counts.items()},
            "seconds": round(self.seconds, 3),
            "images_per_second": round(self.images / self.seconds, 1) if self.seconds else None,
        }


# --- finding the files ------------------------------------------------------------------------


def _unsafe_member_path(name: str) -> bool:
    path = PurePosixPath(name.replace("\\", "/"))
    return path.is_absolute() or ".." in path.parts or bool(re.match(r"^[A-Za-z]:", name))


def _is_wanted(relative: str) -> bool:
    """A file a CIFAR folder holds, at the top or one folder down (`cifar-10-batches-py/...`)."""
    parts = PurePosixPath(relative).parts
    return 1 <= len(parts) <= 2 and bool(_CIFAR_NAMES.fullmatch(parts[-1]))


def _too_large(source: Path, name: str, size: int) -> InputError:
    return InputError(
        f"refused to read {source}: {name} expands to {size / MIB:,.0f} MiB, more than the "
        f"{MAX_MEMBER_BYTES / MIB:,.0f} MiB a CIFAR file may hold (the largest, CIFAR-100's "
        "train, is 155 MB)",
        "it is not a genuine CIFAR download; it may be crafted to exhaust memory",
    )


def _read_bounded(handle: Any, source: Path, name: str) -> bytes:
    """All of `handle`, read in chunks, refused as soon as it passes MAX_MEMBER_BYTES (never
    read whole first)."""
    data = bytearray()
    while chunk := handle.read(_CHUNK_BYTES):
        data += chunk
        if len(data) > MAX_MEMBER_BYTES:
            raise _too_large(source, name, len(data))
    return bytes(data)


def _read_archive(archive: Path) -> dict[str, bytes]:
    """The CIFAR members of a tar archive (any compression), read in one streaming pass. Each
    member's size is checked on its header before its data is decompressed (read or skipped)."""
    found: dict[str, bytes] = {}
    expanded = 0
    try:
        with tarfile.open(archive, mode="r|*") as tar:
            for member in tar:
                if _unsafe_member_path(member.name) or (
                    (member.issym() or member.islnk()) and _unsafe_member_path(member.linkname)
                ):
                    raise InputError(
                        f"refused to read {archive}: its member {member.name!r} points outside "
                        "its folder",
                        "the archive is not a genuine CIFAR download; it may be malicious",
                    )
                name = PurePosixPath(member.name.replace("\\", "/")).as_posix()
                if member.size > MAX_MEMBER_BYTES:
                    raise _too_large(archive, f"its member {member.name!r}", member.size)
                expanded += member.size
                if expanded > MAX_ARCHIVE_BYTES:
                    raise InputError(
                        f"refused to read {archive}: its members expand to more than "
                        f"{MAX_ARCHIVE_BYTES / MIB:,.0f} MiB (a CIFAR archive holds about 180 MB)",
                        "it is not a genuine CIFAR download; it may be crafted to exhaust memory",
                    )
                if member.isfile() and _is_wanted(name):
                    handle = tar.extractfile(member)
                    if handle is not None:
                        found[name] = _read_bounded(handle, archive, f"its member {member.name!r}")
    except InputError:
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        raise InputError(
            f"cannot read archive {archive}: {error or type(error).__name__}",
            "the file is truncated or not a .tar.gz archive",
        ) from None
    return found


def _read_folder(folder: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    children = [path for path in folder.iterdir() if not path.name.startswith(".")]
    grandchildren = [path for child in children if child.is_dir() for path in child.iterdir()]
    expanded = 0
    for path in children + grandchildren:
        relative = path.relative_to(folder).as_posix()
        if path.is_file() and _is_wanted(relative):
            size = path.stat().st_size
            if size > MAX_MEMBER_BYTES:
                raise _too_large(folder, relative, size)
            expanded += size
            if expanded > MAX_ARCHIVE_BYTES:
                raise InputError(
                    f"refused to read {folder}: its CIFAR files add up to more than "
                    f"{MAX_ARCHIVE_BYTES / MIB:,.0f} MiB (a CIFAR dataset holds about 180 MB)",
                    "it is not a genuine CIFAR folder",
                )
            with open(path, "rb") as handle:
                found[relative] = _read_bounded(handle, folder, relative)
    return found


def _group_files(
    files: Mapping[str, bytes], source: Path, variant: str | None = None
) -> tuple[str, dict[str, bytes]]:
    """Pick the one CIFAR dataset (of `variant`, if given) in the files; return (dataset,
    {basename: bytes}). Two datasets are refused, never one picked: CIFAR-10 and CIFAR-100
    files may sit in one folder."""
    groups: dict[str, dict[str, bytes]] = {}
    for relative, data in files.items():
        path = PurePosixPath(relative)
        groups.setdefault(str(path.parent), {})[path.name] = data
    candidates = []
    for folder, members in sorted(groups.items()):
        if "batches.meta" in members:
            candidates.append((CIFAR10, folder, members))
        if "meta" in members and ("train" in members or "test" in members):
            candidates.append((CIFAR100, folder, members))
    if not candidates:
        raise InputError(
            f"{source} is not a CIFAR-10 or CIFAR-100 python dataset (no batches.meta or meta)",
            "give cifar-10-python.tar.gz, cifar-100-python.tar.gz or the folder extracted from it",
        )
    if variant is not None:
        chosen = [candidate for candidate in candidates if candidate[0] == VARIANTS[variant]]
        if not chosen:
            found = " and ".join(sorted({dataset.upper() for dataset, _, _ in candidates}))
            raise UsageError(
                f"--variant {variant}: {source} holds no {VARIANTS[variant].upper()} dataset, "
                f"only {found}",
                "leave out --variant",
            )
        candidates = chosen
    if len(candidates) > 1:
        choose = "choose one with --variant cifar10 or --variant cifar100"
        folders = {folder for _, folder, _ in candidates}
        if len(folders) == 1:  # CIFAR-10's and CIFAR-100's files side by side
            folder = folders.pop()
            raise InputError(
                f"{source} holds both CIFAR-10 (batches.meta, data_batch_N, test_batch) and "
                "CIFAR-100 (meta, train, test) files" + ("" if folder == "." else f" in {folder}"),
                choose,
            )
        where = ", ".join(f"{folder} ({dataset})" for dataset, folder, _ in candidates)
        hint = "point at one of them"
        if len({dataset for dataset, _, _ in candidates}) > 1:
            hint += f", or {choose}"
        raise InputError(f"{source} holds several CIFAR datasets: {where}", hint)
    dataset, _, members = candidates[0]
    return dataset, members


def _split_files(dataset: str, members: Mapping[str, bytes], source: Path) -> dict[str, list]:
    """{split: [(name, bytes), ...]} in the order torchvision reads them."""
    if dataset == CIFAR100:
        missing = [name for name in ("train", "test") if name not in members]
        if missing:
            raise InputError(f"{source} is an incomplete CIFAR-100 folder: {missing[0]} is missing")
        return {"train": [("train", members["train"])], "test": [("test", members["test"])]}
    found = {name: m.group(1) for name in members if (m := _CIFAR10_TRAIN.fullmatch(name))}
    # data_batch_01 or data_batch_0 is no batch of CIFAR-10's (which would it be?): refused,
    # never read as data_batch_1 nor left out.
    odd = sorted(name for name, number in found.items() if number != str(int(number) or ""))
    if odd:
        raise InputError(
            f"{source} holds {odd[0]}, which is not a CIFAR-10 batch name",
            "CIFAR-10's training batches are data_batch_1, data_batch_2, ... data_batch_5",
        )
    numbers = sorted(int(number) for number in found.values())
    if not numbers or numbers != list(range(1, len(numbers) + 1)):
        expected = next(i for i in range(1, len(numbers) + 2) if i not in numbers)
        raise InputError(
            f"{source} is an incomplete CIFAR-10 folder: data_batch_{expected} is missing"
        )
    if "test_batch" not in members:
        raise InputError(f"{source} is an incomplete CIFAR-10 folder: test_batch is missing")
    train = [(f"data_batch_{i}", members[f"data_batch_{i}"]) for i in numbers]
    return {"train": train, "test": [("test_batch", members["test_batch"])]}


# --- decoding ---------------------------------------------------------------------------------


def _text(value: Any) -> Any:
    return value.decode("latin1") if isinstance(value, bytes) else value


def _as_dict(obj: Any, source: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise InputError(f"{source} is not a CIFAR file: it holds a {type(obj).__name__}")
    return {_text(key): value for key, value in obj.items()}


def _class_names(meta: Mapping[str, Any], key: str, source: str) -> list[str]:
    names = meta.get(key)
    if not isinstance(names, (list, tuple)) or not names:
        raise InputError(f"{source} has no {key} list", "it is not a CIFAR meta file")
    # casefold: on macOS and Windows names that differ only by case share one folder.
    folded: dict[str, str] = {}
    for raw in names:
        name = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        # Class names become folders that image-folder readers must see.
        problem = class_folder_problem(name) if isinstance(name, str) else "it is not text"
        if problem is not None:
            shown = short_repr(name if isinstance(name, str) else raw)
            raise InputError(f"{source} has an unusable class name {shown}", problem)
        twin = folded.get(name.casefold())
        if twin == name:
            raise InputError(f"{source} lists the same class name twice: {name!r}")
        if twin is not None:
            raise InputError(
                f"{source} has class names that differ only by case: {twin!r} and {name!r}",
                "they would share one folder on macOS and Windows",
            )
        folded[name.casefold()] = name
    return list(folded.values())


def _decode_batch(raw: bytes, source: str, label_key: str, num_classes: int) -> tuple[Any, Any]:
    import numpy as np

    batch = _as_dict(restricted_loads(raw, source=source), source)
    data = batch.get("data")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise InputError(f"{source} has no uint8 `data` array", "it is not a CIFAR batch")
    if data.shape[1] != ROW_BYTES:
        raise InputError(
            f"{source} holds rows of {data.shape[1]} bytes, not {ROW_BYTES} (32x32 RGB)",
            "it is not a CIFAR batch",
        )
    if label_key not in batch:
        raise InputError(f"{source} has no `{label_key}` list", "it is not a CIFAR batch")
    listed = batch[label_key]
    if isinstance(listed, (list, tuple)):
        # A pickle may list one list many times (by reference, a few bytes each), nested: a
        # 3 KB file whose labels np.asarray expands to billions of numbers held the process
        # for minutes and gigabytes. Labels are one flat list of numbers, one per image.
        if len(listed) != len(data):
            raise InputError(f"{source} has {len(data)} images but {len(listed)} labels")
        scalars = (int, float, complex, str, bytes, np.generic)
        odd = [value for value in listed if not isinstance(value, scalars)][:1]
        if odd:
            raise InputError(
                f"{source} has labels that are not class numbers (one is a "
                f"{type(odd[0]).__name__})",
                "it is not a CIFAR batch",
            )
    try:
        labels = np.asarray(listed).reshape(-1)
    except (TypeError, ValueError) as error:
        raise InputError(f"{source} has unreadable labels: {error}") from None
    if len(labels) != len(data):
        raise InputError(f"{source} has {len(data)} images but {len(labels)} labels")
    # Class indices are integers: 1.7 is no class, and a number past int64 is none either.
    if len(labels) and labels.dtype.kind not in "iu":
        raise InputError(
            f"{source} has labels that are not class numbers (they are {labels.dtype})",
            "it is not a CIFAR batch",
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise InputError(
            f"{source} has labels outside 0..{num_classes - 1}", "the meta file does not match"
        )
    labels = labels.astype(np.int64)
    # Each row is 1024 red, 1024 green, then 1024 blue bytes, each plane row-major.
    images = data.reshape(-1, 3, SIDE, SIDE).transpose(0, 2, 3, 1)
    return images, labels


def read_cifar(
    src: str | os.PathLike, *, label_type: str | None = None, variant: str | None = None
) -> CifarData:
    """Decode a CIFAR-10/100 python archive or folder. `label_type` (fine|coarse) is CIFAR-100's
    choice of labels; fine by default. `variant` (cifar10|cifar100) picks the dataset where
    the source holds both; by default the source must hold only one."""
    import numpy as np

    source = require_input(src, what="CIFAR source")
    if label_type is not None and label_type not in LABEL_TYPES:
        raise UsageError(f"--label-type must be fine or coarse, not {label_type!r}")
    if variant is not None and variant not in VARIANTS:
        raise UsageError(f"--variant must be cifar10 or cifar100, not {variant!r}")
    if source.is_dir():
        files = _read_folder(source)
    elif tarfile.is_tarfile(source):
        files = _read_archive(source)
    else:
        raise InputError(
            f"{source} is neither a folder nor a tar archive",
            "give cifar-10-python.tar.gz, cifar-100-python.tar.gz or the folder extracted from it",
        )
    dataset, members = _group_files(files, source, variant)
    split_files = _split_files(dataset, members, source)
    meta_name = "batches.meta" if dataset == CIFAR10 else "meta"
    meta = _as_dict(restricted_loads(members[meta_name], source=meta_name), meta_name)
    if dataset == CIFAR10:
        if label_type == "coarse":
            raise UsageError("CIFAR-10 has no coarse labels", "--label-type is for CIFAR-100 only")
        label_type = None
        classes = _class_names(meta, "label_names", meta_name)
        label_key = "labels"
    else:
        label_type = label_type or "fine"
        classes = _class_names(meta, f"{label_type}_label_names", meta_name)
        label_key = f"{label_type}_labels"
    images: dict[str, Any] = {}
    labels: dict[str, Any] = {}
    for split, parts in split_files.items():
        decoded = [_decode_batch(raw, name, label_key, len(classes)) for name, raw in parts]
        images[split] = np.concatenate([d[0] for d in decoded])
        labels[split] = np.concatenate([d[1] for d in decoded])
    return CifarData(dataset, classes, images, labels, label_type)


# --- writing ----------------------------------------------------------------------------------


def image_paths(labels, classes: list[str], split: str) -> list[str]:
    """`split/<class>/<index>.png` for each image, the index zero-padded to sort in order."""
    width = len(str(max(len(labels) - 1, 0)))
    return [f"{split}/{classes[label]}/{index:0{width}d}.png" for index, label in enumerate(labels)]


def _write_pngs(task: tuple[str, str, Any, list[str]]) -> int:
    """Worker: encode each (32, 32, 3) BGR image as PNG and write it under `root` (the hidden
    folder that becomes `final`). A write error is fatal and names the file under `final`."""
    import cv2

    root, final, images, paths = task
    for image, relative in zip(images, paths, strict=True):
        ok, encoded = cv2.imencode(".png", image)
        if not ok:
            raise OSError(f"cannot encode {relative} as PNG")
        target = os.path.join(root, relative)
        try:
            with reporting_write_errors(target), open(target, "wb") as handle:
                handle.write(with_software_text(encoded.tobytes()))
        except OutputWriteError as error:
            raise named_as_final(error, root, final) from None
    return len(paths)


def output_folder(
    out: str | os.PathLike,
    *,
    force: bool = False,
    inputs: Iterable[InputPath] = (),
    report_file: str | os.PathLike | None = None,
) -> OutputFolder:
    """The checked and locked output folder of `convert cifar`: never an input, never inside
    one; an existing one is replaced (with `force`) only if torchkit wrote it. `report_file`: the
    caller's `-o` file, which the folder may hold (a rerun's --force replaces it)."""
    # No `known_files`: class folders of `<index>.png` are anybody's (MNIST as PNG from
    # another script), so only the marker says that torchkit wrote a folder.
    return OutputFolder(
        Path(out),
        command="convert cifar",
        force=force,
        inputs=inputs,
        what="output folder",
        atomic=True,
        owned=CIFAR_OUTPUTS,
        reports=[report_file],
    )


def write_cifar(
    data: CifarData,
    out: str | os.PathLike | OutputFolder,
    *,
    force: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
    before_keep: Callable[[CifarReport], None] | None = None,
) -> CifarReport:
    """Write `data` as PNG folders into `out`: built in a hidden folder beside it that replaces
    it only once every image is written, so a failure or an interrupt leaves `out` as it was.
    `out` may be an `OutputFolder` made (checked and locked) beforehand with `output_folder`.
    `before_keep(report)` runs before that swap: if it raises, `out` stays as it was."""
    output = out if isinstance(out, OutputFolder) else output_folder(out, force=force)
    with output:
        report = _fill(output, data, workers, progress)
        if before_keep is not None:
            before_keep(report)  # raising: `output`'s exit puts the old folder back
        return report


def _fill(
    output: OutputFolder, data: CifarData, workers: int | None, progress: Progress | None
) -> CifarReport:
    import numpy as np

    started = time.perf_counter()
    workers = default_workers() if workers is None else workers
    total = sum(len(v) for v in data.labels.values())
    done = 0
    class_counts = {}
    final = str(output.final)
    try:
        root = output.begin()
        with reporting_write_errors(root):
            for split in SPLITS:
                for name in data.classes:
                    (root / split / name).mkdir(parents=True)
    except OutputWriteError as error:
        raise named_as_final(error, str(output.path), final) from None
    tasks = []
    for split in SPLITS:
        labels = data.labels[split]
        class_counts[split] = np.bincount(labels, minlength=len(data.classes)).tolist()
        paths = image_paths(labels.tolist(), data.classes, split)
        # Each chunk holds one class and neighbouring chunks different classes, so workers
        # create files in different folders (file creation in one folder serialises on the
        # folder's lock in the kernel).
        for label in range(len(data.classes)):
            members = np.flatnonzero(labels == label)
            # OpenCV writes BGR: one contiguous copy per class instead of one per image.
            bgr = np.ascontiguousarray(data.images[split][members][..., ::-1])
            for number, chunk in enumerate(chunked(range(len(members)), workers)):
                chosen = members[chunk.start : chunk.stop]
                images = bgr[chunk.start : chunk.stop]
                task = (str(root), final, images, [paths[i] for i in chosen])
                tasks.append(((number, split, label), task))
    tasks = [task for _, task in sorted(tasks, key=lambda item: item[0])]

    def advance(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    map_chunks(_write_pngs, tasks, workers=workers, on_result=advance)
    return CifarReport(
        dataset=data.dataset,
        label_type=data.label_type,
        output=final,
        classes=list(data.classes),
        counts={split: len(data.labels[split]) for split in SPLITS},
        class_counts=class_counts,
        seconds=time.perf_counter() - started,
    )


def writes_file(relative: PurePath) -> bool:
    """Whether `convert cifar` writes `relative` in OUT: anything in its split folders, or a
    hidden file of its own. Compared case-blind, as some disks are."""
    first = relative.parts[0].casefold()
    return first.startswith(".") or first in SPLITS


def convert_cifar(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    label_type: str | None = None,
    variant: str | None = None,
    force: bool = False,
    workers: int | None = None,
    progress: Progress | None = None,
    before_keep: Callable[[CifarReport], None] | None = None,
    report_file: str | os.PathLike | None = None,
) -> CifarReport:
    """CIFAR-10/100 python archive or folder -> `out/{train,test}/<class>/<index>.png`. The
    output is checked (never the source nor inside or around it; an existing one replaced only
    with `force`, and only if torchkit wrote it) and locked before the slow read.
    `before_keep(report)` runs once every PNG is written, before the new folder replaces an
    old one: if it raises (the caller's `-o` report did not fit on its disk), the old stays.
    `report_file`: the caller's `-o` file, which OUT may hold."""
    check_workers(workers)
    source = require_input(src, what="CIFAR source")
    output = output_folder(
        out, force=force, inputs=[InputPath.of(source, "CIFAR source")], report_file=report_file
    )
    started = time.perf_counter()

    def timed(report: CifarReport) -> None:
        report.seconds = time.perf_counter() - started  # the read included
        if before_keep is not None:
            before_keep(report)

    with output:
        data = read_cifar(source, label_type=label_type, variant=variant)
        return write_cifar(data, output, workers=workers, progress=progress, before_keep=timed)
