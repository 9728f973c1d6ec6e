"""What `train` records of the data it used, and reading that record back.

RUN/split.csv lists every image of the run with its split (`path,label,split`, `path` relative to
the data root as everywhere). The checkpoint's `data` entry (`split_record`) says what the data
was (spec, kind, absolute root) and, when train held a validation split out itself (data without
one), exactly which images: so `--resume` continues with the same split even if files were added
since, and eval / extract-features / predict given the checkpoint and the same data with
`--split val` (or `train`) pick exactly those images (`recorded_splits`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from torchkit.core.data.sources.required import reads_relative_paths
from torchkit.core.data.sources.samples import Samples, shown_class_names
from torchkit.core.data.sources.source import DataSource, tagged
from torchkit.core.data.sources.splitting import (
    SPLIT_NAMES,
    is_absolute_key,
    path_key,
    shared_folder,
)
from torchkit.core.io.csv_rows import write_csv_file
from torchkit.core.io.errors import InputError

RECORD_VERSION = 1
SPLIT_CSV = "split.csv"
SPLIT_CSV_COLUMNS = ("path", "label", "split")


def split_record(source: DataSource, splits: dict[str, Samples]) -> dict:
    """The checkpoint's `data` entry for a run on `source` that used `splits` (plain values
    only, so it loads with weights_only=True):

    `spec` (--data as typed), `kind`, `root` (absolute; "" for digits), `workdir` (the working
    directory a relative `spec` was read from: `--resume` from elsewhere reads it there; ""
    for a `spec` of no relative path, where it is not needed and would only tell whoever the
    checkpoint is shared with where the run was started), `sizes` (per split),
    `held_out` ({"val": [ids]} when train held the val split out itself, else {}) and
    `held_out_of` ("train" for a split root without val/, "all" for unsplit data, else None).
    """
    held_out: dict[str, list[str]] = {}
    held_out_of = None
    if "val" in splits and "val" not in source.splits:
        held_out = {"val": list(splits["val"].ids)}
        held_out_of = "train" if source.splits else "all"
    return {
        "version": RECORD_VERSION,
        "spec": source.spec,
        "kind": source.kind,
        "root": os.path.abspath(source.root) if source.root else "",
        "workdir": _working_directory() if reads_relative_paths(source.spec) else "",
        "sizes": {name: len(samples) for name, samples in splits.items()},
        "held_out": held_out,
        "held_out_of": held_out_of,
    }


def _working_directory() -> str:
    try:
        return os.getcwd()
    except OSError:  # removed while the command ran: a relative --data could not be read
        return ""


def recorded_splits(
    source: DataSource, recorded: dict | None
) -> tuple[dict[str, Samples], list[str]] | None:
    """The splits a train run made of `source` by holding images out, rebuilt from its record
    (`split_record`), with notes; None when the record holds no such split or `source` has that
    split of its own (its own split is used then). InputError when images the run held out are
    not in `source` (other data than the run's)."""
    held = (recorded or {}).get("held_out") or {}
    if not held:
        return None
    ((name, ids),) = held.items()
    donor_name = recorded.get("held_out_of")
    if name in source.splits:
        return None
    donor = source.whole if donor_name == "all" else source.splits.get(str(donor_name))
    if donor is None:
        return None
    # Matched by `path_key`: the run's CSV index may spell a path `./a.png`, this one `a.png`.
    keys = [path_key(ident) for ident in donor.ids]
    position = {key: index for index, key in enumerate(keys)}
    wanted = [path_key(ident) for ident in ids]
    missing = [ident for ident, key in zip(ids, wanted, strict=True) if key not in position]
    where = recorded.get("root") or recorded.get("spec")
    notes = []
    if missing:
        moved = _moved_folder(wanted, position)
        if moved is not None:
            old, new = moved
            wanted = [new + key[len(old) :] if key.startswith(old) else key for key in wanted]
            still = [ident for ident, key in zip(ids, wanted, strict=True) if key not in position]
            missing = min(missing, still, key=len)  # those the folder that holds most lacks
        if missing:
            raise InputError(
                f"{len(missing)} of the {len(ids)} images the training run held out for {name} "
                f"are not in {source.spec} (e.g. {missing[0]})",
                f"give the data the run trained on: {where}",
            )
        lay, lie = _folder_of(recorded.get("root"), old), _folder_of(source.root, new)
        if lay != lie:  # (the same folder: the run's own files, named from another folder)
            notes.append(
                f"the training run's {name} images lay in {lay}: its {name} split is matched "
                f"by their paths below it in {lie}"
            )
        where = ""  # said so, or nothing to say
    chosen = set(wanted)
    kept = [i for i, key in enumerate(keys) if key not in chosen]
    parts = dict(source.splits)
    parts["train"] = tagged(donor.subset(kept), "train")
    parts[name] = tagged(donor.subset(sorted(position[key] for key in chosen)), name)
    if where and source.root and os.path.abspath(source.root) != where:
        notes.append(
            f"the training run read its data in {where}; its {name} split is matched by path "
            f"in {source.root}"
        )
    return {split: parts[split] for split in SPLIT_NAMES if split in parts}, notes


def _moved_folder(wanted: list[str], position: dict[str, int]) -> tuple[str, str] | None:
    """Where the held-out `wanted` keys lie in this data (`position`: its keys), as (the deepest
    folder they all lay in, the folder of this data that holds the most of them by their paths
    below it), each "" or ending in `/`: names counted below the folder all of them share, as
    the digests `--resume` compares count them. So a CSV index beside a class folder
    (`data/ant/1.png` for the folder's `ant/1.png`, either way round), an index of absolute
    paths moved with its images and rewritten for their new place, or an index of the folder's
    images by absolute paths names the same images by the same paths below that folder. Of an
    index with both, the absolute paths are moved, the relative ones found as they are. Of
    several folders that hold as many, the one whose own path ends as the old one's does most
    (a single held-out image lies below its class folder: the class folder of its name). None
    where no folder holds any of them but their own, or two hold as many alike (other images,
    another layout, a copy listed twice).

    The folders are found in one pass over this data's keys, by the paths of the first and the
    last held-out image below the old folder (either may be missing: the folder that holds the
    others is found by the other); each folder found is checked for the rest by look-ups."""
    absolute = [key for key in wanted if is_absolute_key(key)]
    if absolute and any(key not in position for key in wanted if not is_absolute_key(key)):
        return None
    moving = absolute or wanted
    old = shared_folder(moving)  # as the digests count their paths from it
    below = [key[len(old) :] for key in moving]
    ends = tuple({end for end in (below[0], below[-1]) if end})  # ("": no file's path)
    if not ends:
        return None
    found = {
        key[: len(key) - len(end)]
        for key in position
        if key.endswith(ends)
        for end in ends
        if key.endswith(end) and key[-len(end) - 1 : -len(end)] in ("", "/")
    }
    found.discard(old)
    if not found:
        return None
    held = {new: sum(new + rest in position for rest in below) for new in found}
    most = max(held.values())
    ending = {new: _shared_ending(old, new) for new in found if held[new] == most}
    closest = max(ending.values())
    fits = [new for new in ending if ending[new] == closest]
    return (old, fits[0]) if len(fits) == 1 else None


def _folder_of(root: str | None, folder: str) -> str:
    """The folder `folder` of `_moved_folder` (relative to `root`, the data's, where it is not
    absolute) as an absolute path, for notes."""
    if not is_absolute_key(folder) and root:
        folder = os.path.join(os.path.abspath(root), folder)
    return os.path.normpath(folder or ".")


def _shared_ending(one: str, other: str) -> int:
    """How many folders the paths `one` and `other` end with alike (`/a/b/c/`, `/d/b/c/`: 2)."""
    ones, others = one.rstrip("/").split("/")[::-1], other.rstrip("/").split("/")[::-1]
    return next(
        (n for n, (a, b) in enumerate(zip(ones, others, strict=False)) if a != b),
        min(len(ones), len(others)),
    )


def split_csv_rows(splits: dict[str, Samples]) -> Iterator[tuple]:
    """A row `path,label,split` for every image of `splits` (label: the class name as
    `shown_class_names` shows it, `crane (#134)` for a name two classes share), one at a
    time."""
    for name, samples in splits.items():
        classes = shown_class_names(samples.classes)
        for ident, label in zip(samples.ids, samples.labels, strict=True):
            yield ident, classes[label], name


def write_split_csv(
    path: str | os.PathLike,
    splits: dict[str, Samples],
    *,
    check: Callable[[Path], None] | None = None,
) -> Path:
    """Write split.csv (`split_csv_rows`) to `path` atomically, streamed: a million images'
    text (60 MB) is never held whole. `check`: `atomic_write`'s."""
    write_csv_file(path, split_csv_rows(splits), header=SPLIT_CSV_COLUMNS, check=check)
    return Path(path)
