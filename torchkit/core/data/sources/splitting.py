"""Seeded, stratified splitting: the split names, `stratified_split` and the largest-remainder
counts it allocates by."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import unicodedata
from collections.abc import Callable, Sequence

from torchkit.core.data.sources.samples import Samples
from torchkit.core.io.errors import InputError
from torchkit.core.io.files import NAME_ERRORS
from torchkit.core.io.records import open_record  # split's records, read by the data readers too

SPLIT_NAMES = ("train", "val", "test")
# torchkit split's record in OUT of the split it is writing (its state: "copying" for a copy,
# symlink or hardlink split, removed once finished; "moving", then "done", for a move).
SPLIT_JOURNAL = ".torchkit-split.json"
UNFINISHED_STATES = ("copying", "moving")
SPLIT_MANIFEST = "split.csv"  # what torchkit split writes in OUT: path, label, split, source


def refuse_mixed_splits(
    spec: str,
    names: Sequence[str],
    split_of: Callable[[str], str | None],
    *,
    files: str,
    named: str,
    hint: str,
) -> None:
    """InputError where `names` (the files of one unsplit dataset) name two splits or more by
    `split_of` (a name's split, or None): read as one dataset, train would train on the
    held-out files too, without a word. The error shows the first file of each split."""
    found: dict[str, str] = {}  # split -> its first file
    for name in names:
        split = split_of(name)
        if split is not None:
            found.setdefault(split, name)
    if len(found) < 2:
        return
    shown = ", ".join(found[split] for split in SPLIT_NAMES if split in found)
    raise InputError(
        f"{spec} holds {files} of {len(found)} splits {named} ({shown}): read as one dataset, "
        "they would be mixed",
        hint,
    )


def split_journal(folder: str | os.PathLike) -> dict | None:
    """The journal torchkit split keeps in `folder` (None: none, or not one it can read)."""
    try:
        with open_record(os.path.join(folder, SPLIT_JOURNAL)) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def unfinished_split(folder: str | os.PathLike) -> bool:
    """Is `folder` a split that torchkit split has not finished writing (a killed run)? Its
    split folders hold only part of the images: read as data, it would pass for a split."""
    record = split_journal(folder)
    return record is not None and record.get("state") in UNFINISHED_STATES


def written_split_names(folder: str | os.PathLike) -> set[str]:
    """The split names in the `split` column of the split.csv that torchkit split wrote in
    `folder` (none when there is no such file or it cannot be read)."""
    try:
        with open_record(os.path.join(folder, SPLIT_MANIFEST), NAME_ERRORS) as handle:
            return {row.get("split") or "" for row in csv.DictReader(handle)}
    except (OSError, csv.Error, UnicodeDecodeError):
        return set()


def path_key(ident: str) -> str:
    """A stable name of the file a path names, for hashing and matching: "/"-separated,
    Unicode-NFC (macOS's NFD names and Linux's agree) and without the `.` and empty parts that
    name the same file (a CSV index's `./a.png` and `a//b.png` are `a.png` and `a/b.png`)."""
    # (No replace where the separator is "/" already: it would copy every path.)
    key = unicodedata.normalize("NFC", ident if os.sep == "/" else ident.replace(os.sep, "/"))
    if "//" in key or "/./" in key or key.startswith("./") or key.endswith(("/.", "/")):
        parts = [part for part in key.split("/") if part not in ("", ".")]
        key = ("/" if key.startswith("/") else "") + "/".join(parts)
    return key


def is_absolute_key(key: str) -> bool:
    """Whether the `path_key` `key` is an absolute path (`/data/a.png`, `C:/data/a.png`)."""
    return key[:1] == "/" or key[1:3] == ":/"


def shared_folder(keys: Sequence[str]) -> str:
    """The deepest folder every one of the non-empty `keys` lies in, ended by "/" ("" where
    none): what a split's names count from for the digests `train --resume` compares (less a
    last folder named for that split where the data's layout made it, which the names keep; a
    CSV index's absolute paths first), and what an index's absolute paths count from for
    finding the images of an index moved with them."""
    first, last = min(keys), max(keys)  # every key sorted between them starts as both do
    return first[: os.path.commonprefix([first, last]).rfind("/") + 1]


def sample_keys(samples: Samples) -> list[str]:
    """Stable names for hashing (`path_key`): the same file gets the same key however the data
    spells its path."""
    return [path_key(i) for i in samples.ids]


def stratified_split(
    labels: Sequence[int],
    fractions: Sequence[float],
    seed: int,
    *,
    keys: Sequence[str] | None = None,
    groups: Sequence[str] | None = None,
    at_least_one: bool = False,
    filled: list[int] | None = None,
) -> list[list[int]]:
    """Split indices class by class in the given proportions, seeded and reproducible.

    Counts per class are allocated by largest remainder, so every part that is due a share gets
    one; each class is shuffled with its own generator seeded from (seed, label) so adding a
    class does not change how the others are split.

    With `keys` (a stable name per sample, e.g. its path relative to the dataset root; equal keys
    stay together) the order within a class is a SHA-256 of (seed, key) instead: the same on every
    machine and NumPy version, and independent of the order the samples are listed in. With
    `groups`, samples of one group always land in the same part: a group counts in the class most
    of its samples have, and groups are dealt, in that hashed order, to the part furthest below
    its share of the class's samples (exact for groups of one, close otherwise). `at_least_one`:
    every part with a positive fraction gets at least one sample (or group) of each class that has
    enough of them (see `largest_remainder_counts`).

    Many small classes can leave a part with no sample at all (4 a class at 0.9:0.1: 0.4 of an
    image each, rounded down): such a part, when its share of all the samples rounds to one or
    more, takes them across classes instead (`_fill_empty_parts`), and its index goes into
    `filled`. A split with no empty part is never changed by this.
    """
    import numpy as np

    total = sum(fractions)  # Fractions stay exact; floats and ints divide as before
    weights = [f / total for f in fractions]
    if keys is not None or groups is not None:
        units = groups if groups is not None else keys
        dealt = _split_units(labels, weights, seed, units, at_least_one)

        def rank_of(label: int, unit: list[int]) -> bytes:
            return _rank(seed, units[unit[0]])
    else:
        by_class: dict[int, list[int]] = {}
        for index, label in enumerate(labels):
            by_class.setdefault(label, []).append(index)
        dealt = {}
        for label in sorted(by_class):
            members = by_class[label]
            rng = np.random.default_rng([seed, label])
            order = [members[i] for i in rng.permutation(len(members))]
            counts = largest_remainder_counts(len(order), weights, at_least_one=at_least_one)
            start, class_parts = 0, []
            for count in counts:
                class_parts.append([[i] for i in order[start : start + count]])
                start += count
            dealt[label] = class_parts

        def rank_of(label: int, unit: list[int]) -> bytes:
            return _rank(seed, f"class {label}")

    for j in _fill_empty_parts(dealt, weights, len(labels), rank_of):
        if filled is not None:
            filled.append(j)
    parts: list[list[int]] = [[] for _ in weights]
    for label in sorted(dealt):
        for part, chosen in zip(parts, dealt[label], strict=True):
            for unit in chosen:
                part.extend(unit)
    return [sorted(part) for part in parts]


def spread_note(name: str, images: int, classes: int) -> str:
    """What a user reads when `stratified_split` filled the part `name` across classes."""
    return (
        f"every class's share of {name} rounds to no image (too few images a class): {name} "
        f"takes {images} images instead, one from each of {classes} classes (the largest "
        "first, then in seeded order)"
    )


# One class's parts: in each, its units (the sample indices that stay together) in dealt order.
ClassParts = list[list[list[int]]]


def _rank(seed: int, name: str) -> bytes:
    """The seeded rank of a unit (or a class): a SHA-256 of the seed and its name."""
    return hashlib.sha256(f"{seed}\0".encode() + name.encode("utf-8", "surrogateescape")).digest()


def _fill_empty_parts(
    dealt: dict[int, ClassParts],
    weights: Sequence,
    total: int,
    rank_of: Callable[[int, list[int]], bytes],
) -> list[int]:
    """Give each part that class-by-class allocation left empty, though its share of all `total`
    samples (Hamilton's count) is one or more, that many samples across classes: one unit from
    each of the classes with the largest share of the part (the biggest classes), equal ones
    in seeded order (the rank of the unit that moves); a class gives the last unit of its
    largest part, and only while that part keeps one. Returns the parts filled so."""
    if not dealt:
        return []
    wanted = largest_remainder_counts(total, weights)
    filled = []
    for j, weight in enumerate(weights):
        if weight <= 0 or wanted[j] == 0:
            continue
        if any(class_parts[j] for class_parts in dealt.values()):
            continue
        candidates = []
        for label, class_parts in dealt.items():
            donor = max(range(len(class_parts)), key=lambda d: (len(class_parts[d]), -d))
            if len(class_parts[donor]) >= 2:
                size = sum(len(unit) for chosen in class_parts for unit in chosen)
                candidates.append((-size, rank_of(label, class_parts[donor][-1]), label, donor))
        taken = 0
        for _, _, label, donor in sorted(candidates):
            if taken >= wanted[j]:
                break
            moved = dealt[label][donor].pop()
            dealt[label][j].append(moved)
            taken += len(moved)
        if taken:
            filled.append(j)
    return filled


def _split_units(
    labels: Sequence[int], weights: Sequence, seed: int, unit_names: Sequence[str], at_least_one
) -> dict[int, ClassParts]:
    members: dict[str, list[int]] = {}
    for index, name in enumerate(unit_names):
        if name in members:
            members[name].append(index)
        else:
            members[name] = [index]
    salt = f"{seed}\0".encode()  # `_rank`, inlined: a call per file costs a third more
    strata: dict[int, list[tuple[bytes, str]]] = {}
    for name, indices in members.items():
        if len(indices) == 1:
            label = labels[indices[0]]
        else:
            votes: dict[int, int] = {}
            for index in indices:
                votes[labels[index]] = votes.get(labels[index], 0) + 1
            label = min(votes, key=lambda lab: (-votes[lab], lab))  # majority, then smallest
        rank = hashlib.sha256(salt + name.encode("utf-8", "surrogateescape")).digest()
        strata.setdefault(label, []).append((rank, name))
    dealt: dict[int, ClassParts] = {}
    for label in sorted(strata):
        units = [members[name] for _, name in sorted(strata[label])]
        targets = largest_remainder_counts(
            sum(len(unit) for unit in units), weights, at_least_one=at_least_one
        )
        dealt[label] = deal_units(units, targets, weights, at_least_one)
    return dealt


def deal_units(
    units: list[list[int]], targets: list[int], weights: Sequence, at_least_one: bool
) -> ClassParts:
    """Give each unit to the part with the most samples still missing from its target (the
    earlier part on a tie); with `at_least_one`, a part of positive weight left without a
    unit, where there are enough units, takes the smallest unit of the part with the most."""
    candidates = [j for j, w in enumerate(weights) if w > 0]
    filled = [0] * len(targets)
    chosen: ClassParts = [[] for _ in targets]
    for unit in units:
        part, gap = candidates[0], targets[candidates[0]] - filled[candidates[0]]
        for j in candidates[1:]:  # the largest gap; the earlier part on a tie
            if targets[j] - filled[j] > gap:
                part, gap = j, targets[j] - filled[j]
        chosen[part].append(unit)
        filled[part] += len(unit)
    if at_least_one and len(units) >= len(candidates):
        for j in candidates:
            if not chosen[j]:  # big groups filled the other parts: take the donor's smallest
                donor = max(candidates, key=lambda d: (len(chosen[d]), -d))
                smallest = min(range(len(chosen[donor])), key=lambda u: len(chosen[donor][u]))
                chosen[j].append(chosen[donor].pop(smallest))
    return chosen


def largest_remainder_counts(
    n: int, weights: Sequence[float], *, at_least_one: bool = False
) -> list[int]:
    """Integers summing to n, proportional to weights (Hamilton's method).

    With `at_least_one`, when n is at least the number of parts with a positive weight, a part
    that came out 0 takes one from the largest part: 5 at 8:1:1 gives 3/1/1, not 4/1/0.
    """
    exact = [n * w for w in weights]
    counts = [int(x) for x in exact]
    remainders = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in remainders[: n - sum(counts)]:
        counts[i] += 1
    positive = [i for i, w in enumerate(weights) if w > 0]
    if at_least_one and n >= len(positive):
        for i in positive:
            if counts[i] == 0:
                donor = max(positive, key=lambda j: (counts[j], exact[j] - counts[j], -j))
                counts[donor] -= 1
                counts[i] += 1
    return counts
