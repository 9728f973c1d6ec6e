"""Who goes where: the data read, its files grouped (`--group`, byte-identical files) and ranked
by seed, the split sizes met (`--ratio` or `--fixed`), `--oversample`'s repeats, and each file's
place in OUT."""

from __future__ import annotations

import bisect
import hashlib
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from torchkit.core.data.hashing import content_groups, is_label_conflict
from torchkit.core.data.image_files import opened_image
from torchkit.core.data.sources.discovery import (
    class_folder_problem,
    is_image_file,
    list_left_out,
)
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.sources.splitting import deal_units
from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.io.files import absolute_as_opened
from torchkit.core.io.temporaries import NAME_MAX, cut_to_bytes
from torchkit.core.io.wording import counted

log = logging.getLogger("torchkit")


@dataclass
class Plan:
    sources: list[str]  # absolute
    labels: list[str]  # class name per file
    dests: list[str]  # relative to OUT, "/"-separated
    splits: list[int]  # index into names
    repeats: list[int] | None = None  # --oversample: 0 for a file, k for its k-th repeat


def dedup_units(
    paths: Sequence[str], keys: Sequence[str], groups: Sequence[str] | None
) -> tuple[list[str] | None, list[list[int]]]:
    """(the unit of each file, the groups of byte-identical files: indices, two or more): files
    with the same bytes share a unit, and so do files of one `--group` (`groups`, else each
    file is its own unit, named by its key). A unit is named by the smallest name among its
    members' own, so a dataset without duplicates is split exactly as before. None: no
    duplicates at all."""
    identical = content_groups(paths)
    if not identical:
        return (None if groups is None else list(groups)), []
    own = list(groups) if groups is not None else list(keys)
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        root = name
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(name, name) != root:  # path compression
            parent[name], name = root, parent[name]
        return root

    for members in identical:
        roots = {find(own[i]) for i in members}
        smallest = min(roots)
        for root in roots:
            parent[root] = smallest
    units = [find(name) for name in own]
    return units, identical


def label_conflicts(
    identical: Sequence[Sequence[int]],
    labels: Sequence[int],
    classes: Sequence[str],
    names: Sequence[str],
    split_of: Sequence[int],
    paths: Sequence[str],
    sources: Sequence[str],
) -> list[dict]:
    """The groups of byte-identical files (`identical`) filed under more than one class: the
    same image labelled twice, common in scraped data. Each {"paths": the files (`paths`, as
    the data names them), "classes": their classes (in class order), "split": the one split
    the group went to whole}. Every file keeps its own class; only the group's place in the
    stratified split follows the class most of its files have. Copies of bytes that are no
    image PIL can open (a scraper's saved "404 Not Found" page, `sources` the files read) are
    no image labelled twice, and every command skips them as unreadable: one header is read
    for each group across classes, none for the others."""
    conflicts = []
    for members in identical:
        found = [classes[label] for label in sorted({labels[i] for i in members})]
        if not is_label_conflict(found):
            continue
        if _opens_as_image(sources[members[0]]):
            conflicts.append(
                {
                    "paths": [paths[i] for i in members],
                    "classes": found,
                    "split": names[split_of[members[0]]],
                }
            )
    return conflicts


def _unit_rank(seed: int, name: str) -> bytes:
    """The seeded rank of a unit (file or group), as `core.datasource.splitting.stratified_split`
    ranks them."""
    return hashlib.sha256(f"{seed}\0".encode() + name.encode("utf-8", "surrogateescape")).digest()


def fixed_split(
    labels: Sequence[int],
    fixed: Sequence[int],
    seed: int,
    units: Sequence[str],
    classes: Sequence[str],
    names: Sequence[str],
    stratify: bool,
) -> list[list[int]]:
    """Indices per split for `--fixed N[,M]`: N images of each class in the second split, M in
    the third, the rest in the first. Units (files or groups) are taken in their seeded order
    (as the ratio split takes them), each to the split furthest below its count; a group never
    splits, so with groups the counts are met as closely as groups allow. A class with fewer
    than N + M + 1 images is an InputError naming it."""
    by_class: dict[int, int] = {}
    for label in labels:
        by_class[label] = by_class.get(label, 0) + 1
    need = sum(fixed) + 1
    wanted = ", ".join(f"{n} in {name}" for n, name in zip(fixed, names[1:], strict=True))
    for label, count in sorted(by_class.items()):
        if count < need:
            what = f"class {classes[label] or '(unlabelled)'!r}" if stratify else "the dataset"
            raise InputError(
                f"{what} has {count} image(s): --fixed {','.join(map(str, fixed))} needs at "
                f"least {need}: {wanted} and 1 in {names[0]}",
                "lower --fixed, or add images" + (" to that class" if stratify else ""),
            )
    members: dict[str, list[int]] = {}
    for index, name in enumerate(units):
        members.setdefault(name, []).append(index)
    strata: dict[int, list[tuple[bytes, str]]] = {}
    for name, indices in members.items():
        votes: dict[int, int] = {}
        for index in indices:
            votes[labels[index]] = votes.get(labels[index], 0) + 1
        label = min(votes, key=lambda lab: (-votes[lab], lab))  # majority, then smallest
        strata.setdefault(label, []).append((_unit_rank(seed, name), name))
    parts: list[list[int]] = [[] for _ in range(len(fixed) + 1)]
    for label in sorted(strata):
        ranked = [members[name] for _, name in sorted(strata[label])]
        total = sum(len(unit) for unit in ranked)
        targets = [total - sum(fixed), *fixed]
        # Every split gets a group where the class has enough of them (as a ratio split does).
        dealt = deal_units(ranked, targets, [1] * len(targets), at_least_one=True)
        _closer_to_counts(dealt, targets)
        for part, units in zip(parts, dealt, strict=True):
            for unit in units:
                part.extend(unit)
    return [sorted(part) for part in parts]


def _closer_to_counts(dealt: list[list[list[int]]], targets: list[int]) -> None:
    """Bring one class's held-out parts (all but the first) nearer their `--fixed` counts where
    dealing the units in turn missed counts whole units can meet (train took a pair when one
    image was missing, and test stayed one short while singles stayed in train): one or two
    units of a part given to another for none or one of its own, while that brings the
    held-out parts closer, the best step first (the fewest units moved, then the earlier
    parts); a part keeps at least one unit. Counts met by the dealing are left alone (no step
    brings them closer). Not every count whole units could meet is found (some need three
    parts to trade at once), and a warning then names the class.

    Each part's units by size, the last dealt of a size moving first. The images a step moves
    (what one part gains and the other loses) are best nearest the range that brings both
    parts to their counts, so each size given (or pair of sizes) looks up the size taken back
    by bisection, not every one of them: a step costs the square of the number of sizes (the
    pairs only where no smaller step does as well), not its cube, and each one brings the
    counts one image closer: a class of 10,000 groups of 1 to 1,000 images is traded in a
    tenth of a second where the counts can be met, a few seconds where they cannot."""
    parts = range(len(dealt))
    by_size: list[dict[int, list[list[int]]]] = [{} for _ in parts]
    for j in parts:
        for unit in dealt[j]:
            by_size[j].setdefault(len(unit), []).append(unit)
    filled = [sum(len(unit) for unit in units) for units in dealt]

    def missing(j: int, change: int) -> int:  # how far part j would be from its count
        return 0 if j == 0 else abs(targets[j] - filled[j] - change)

    while True:
        best: tuple | None = None  # (images off after it, units moved, from, to, given, back)
        sizes = [sorted(by_size[j]) for j in parts]
        for a, b in ((a, b) for a in parts for b in parts if a != b):
            now = missing(a, 0) + missing(b, 0)
            # What b gains (a loses) that meets a's count, b's: the step is best in between.
            ends = [filled[a] - targets[a]] * (a > 0) + [targets[b] - filled[b]] * (b > 0)
            low, high = min(ends), max(ends)
            if low <= 0 <= high:
                continue  # no step brings both closer
            moves: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # (given, taken back)
            keeps = len(dealt[a]) > 1  # a may give one more unit than it takes back
            if keeps:
                moves += [((s,), ()) for s in _nearest(sizes[a], low, high)]
            for s in sizes[a]:
                moves += [((s,), (t,)) for t in _nearest(sizes[b], s - high, s - low)]
            best = _best_step(best, moves, a, b, now, missing)
            bound = missing(a, -low) + missing(b, low) - now  # the best any step does
            if keeps and sizes[b] and (best is None or best > (bound, 3, a, b)):
                moves, counts = [], by_size[a]
                for i, s in enumerate(sizes[a]):
                    for u in sizes[a][i if len(counts[s]) > 1 else i + 1 :]:
                        moves += [
                            ((s, u), (t,)) for t in _nearest(sizes[b], s + u - high, s + u - low)
                        ]
                best = _best_step(best, moves, a, b, now, missing)
            # (A pair for none is the two singles one after the other; a unit given for one
            # of its own size, or a pair for one of its sizes, a smaller step does as well.)
        if best is None:
            return
        _, _, a, b, out, back = best
        for size in back:
            _move_unit(dealt, by_size, filled, b, a, size)
        for size in out:
            _move_unit(dealt, by_size, filled, a, b, size)


def _best_step(best, moves, a: int, b: int, now: int, missing) -> tuple | None:
    """`best`, or the better of the `moves` from part `a` to `b` (`_closer_to_counts`)."""
    for out, back in moves:
        change = sum(out) - sum(back)
        off = missing(a, -change) + missing(b, change) - now
        step = (off, len(out) + len(back), a, b, out, back)
        if change and off < 0 and (best is None or step < best):
            best = step
    return best


def _nearest(sizes: list[int], low: int, high: int) -> list[int]:
    """The sizes (sorted) nearest the range low..high: the smallest within it, else the
    nearest below and the nearest above (`_closer_to_counts`)."""
    at = bisect.bisect_left(sizes, low)
    if at < len(sizes) and sizes[at] <= high:
        return [sizes[at]]
    return sizes[max(0, at - 1) : at + 1]


def _move_unit(dealt, by_size, filled, a: int, b: int, size: int) -> None:
    """Move the last dealt unit of `size` from part `a` to part `b` (`_closer_to_counts`)."""
    unit = by_size[a][size].pop()
    if not by_size[a][size]:
        del by_size[a][size]
    dealt[a].remove(unit)
    dealt[b].append(unit)
    by_size[b].setdefault(size, []).append(unit)
    filled[a] -= size
    filled[b] += size


def oversample_repeats(
    labels: Sequence[int],
    split_of: Sequence[int],
    keys: Sequence[str],
    seed: int,
    classes: int,
    groups: Sequence[str] | None = None,
) -> tuple[list[tuple[int, int]], list[int]]:
    """([(file index, repeat number)], extra copies per class) that bring every class of the
    first split (train) up to its largest class: each class's files in their seeded order,
    round-robin, so no file is repeated twice before every other one is repeated once.

    With `groups` (`--group`'s name of each file) a class repeats its files of one group
    together, each under the same number (`cat/001.jpg` with `cat/001.png`), as split-folders
    repeats a stem group whole: round-robin over the class's groups, a group passed over where
    it would overshoot, and the count met as closely as whole groups taken in turn allow (one
    group more where that comes closer)."""
    # Each class's units in train: {name: its files}, a file its own unit without `groups`.
    train: dict[int, dict[str | int, list[int]]] = {}
    for index, (label, part) in enumerate(zip(labels, split_of, strict=True)):
        if part == 0:
            unit = index if groups is None else groups[index]
            train.setdefault(label, {}).setdefault(unit, []).append(index)
    extra = [0] * classes
    if not train:
        return [], extra
    largest = max(sum(map(len, units.values())) for units in train.values())

    def rank(unit: str | int) -> bytes:
        return _unit_rank(seed, keys[unit] if isinstance(unit, int) else unit)

    repeats: list[tuple[int, int]] = []
    for label in sorted(train):
        units = [train[label][unit] for unit in sorted(train[label], key=rank)]
        taken = _repeated_units([len(files) for files in units], largest - sum(map(len, units)))
        for u, number in taken:
            repeats += [(index, number) for index in sorted(units[u], key=lambda i: keys[i])]
            extra[label] += len(units[u])
    return repeats, extra


def _repeated_units(sizes: list[int], need: int) -> list[tuple[int, int]]:
    """[(unit, repeat number)] that add up to `need` files, or as close as units of `sizes`
    come: round-robin in order, a unit that would overshoot passed over; then one unit more
    (the smallest, the least repeated) where overshooting by it is nearer than falling short."""
    taken: list[tuple[int, int]] = []
    times = [0] * len(sizes)
    added = True
    while need > 0 and added:
        added = False
        for u, size in enumerate(sizes):
            if 0 < size <= need:
                times[u] += 1
                taken.append((u, times[u]))
                need -= size
                added = True
    if need > 0:
        u = min(range(len(sizes)), key=lambda u: (sizes[u], times[u], u))
        if sizes[u] - need < need:
            times[u] += 1
            taken.append((u, times[u]))
    return taken


class FreeNames:
    """Destination names not yet taken, compared by casefold (also distinct on macOS and
    Windows): `base + stem + tag + suffix`, else the first free `base + stem + tag-N + suffix`
    (N = 1, 2...). A file name over NAME_MAX bytes has its stem shortened (never the tag, the
    number or the suffix) so that the file system takes it.

    The number each name last took is kept: numbers below it stay taken, so the next file of
    that name starts there (k files named `image.jpg` in one class: k tries, not k*k/2)."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self.taken = {name.casefold() for name in taken}
        self._last: dict[str, int] = {}

    def claim(self, base: str, stem: str, suffix: str, tag: str = "") -> str:
        name = (base + stem + tag + suffix).casefold()
        n = self._last.get(name, 0)
        candidate = base + _fitting(stem, f"{tag}-{n}{suffix}" if n else tag + suffix)
        while candidate.casefold() in self.taken:
            n += 1
            candidate = base + _fitting(stem, f"{tag}-{n}{suffix}")
        self._last[name] = n
        self.taken.add(candidate.casefold())
        return candidate

    def claim_together(self, names: Sequence[tuple[str, str, str]], tag: str = "") -> list[str]:
        """`claim` for files that go together, each `(base, stem, suffix)`: all of them under
        one and the same tag, `tag` else the first `tag-N` under which none is taken, so that
        they stay alike (a --group group's repeats: `001-repeat1-1.jpg` with
        `001-repeat1-1.png`, where `001-repeat1.jpg` was taken). One file: `claim`'s name."""

        def named(n: int) -> list[str]:
            tail = f"{tag}-{n}" if n else tag
            return [base + _fitting(stem, tail + suffix) for base, stem, suffix in names]

        if len(names) == 1:
            return [self.claim(*names[0], tag=tag)]
        # Each number below one a name last took is taken for that name, so for the group too.
        n = max((self._last.get((b + s + tag + x).casefold(), 0) for b, s, x in names), default=0)
        while True:
            candidates = named(n)
            folded = [candidate.casefold() for candidate in candidates]
            if len(set(folded)) < len(folded):
                # Two long stems cut to fit meet, as they do under every longer tag: no one
                # name for two files, each takes a name of its own.
                return [self.claim(*name, tag=tag) for name in names]
            if not self.taken.intersection(folded):
                break
            n += 1
        # `_last` is left as it was: a number below this one may be free for one of the names.
        self.taken.update(folded)
        return candidates


def _fitting(stem: str, tail: str) -> str:
    """The file name `stem + tail`, its stem cut by whole characters to fit in NAME_MAX bytes
    (left as it is when even the tail alone does not fit: the file system says so)."""
    name = f"{stem}{tail}"
    if len(name) * 4 <= NAME_MAX:  # UTF-8 takes at most 4 bytes a character
        return name
    room = NAME_MAX - len(os.fsencode(tail))
    if len(os.fsencode(name)) <= NAME_MAX or room < 0:
        return name
    return cut_to_bytes(stem, room) + tail


def _repeat_dests(dests: list[str], number: int, free: FreeNames) -> list[str]:
    """`<split>/<class>/<stem>-repeat<k><suffix>` beside each of `dests` (the files of one
    unit, repeated together), not yet taken, all under the same tag (the stem shortened where
    a name would not fit)."""
    names = []
    for dest in dests:
        folder, name = dest.rsplit("/", 1) if "/" in dest else ("", dest)
        stem, suffix = os.path.splitext(name)
        names.append((f"{folder}/" if folder else "", stem, suffix))
    return free.claim_together(names, tag=f"-repeat{number}")


def destinations(samples: Samples, split_of: list[int], names: list[str], is_csv: bool):
    """OUT-relative destinations: <split>/<id> for folders (class folder and subfolders kept),
    <split>/<label>/<file name> for CSV indexes (made unique where names collide), and
    <split>/<file name> for a CSV index without labels (a split of flat images, as a flat
    folder's: no class folder named "")."""
    if not is_csv:
        ids = samples.ids
        return [f"{names[s]}/{i.replace(os.sep, '/')}" for s, i in zip(split_of, ids, strict=True)]
    unlabelled = samples.classes == [""]
    for name in [] if unlabelled else samples.classes:
        problem = class_folder_problem(name)
        if problem is not None:
            raise InputError(
                f"label {name!r} cannot be a class folder: {problem}",
                "fix the label, or use --mode manifest",
            )
    free = FreeNames()
    dests = []
    for s, path, label in zip(split_of, samples.paths, samples.labels, strict=True):
        stem, suffix = os.path.splitext(os.path.basename(path))
        folder = f"{names[s]}/" if unlabelled else f"{names[s]}/{samples.classes[label]}/"
        dests.append(free.claim(folder, stem, suffix))
    return dests


def listed_images(
    samples: Samples, sources: list[str], source: Path, strict: bool = False
) -> tuple[Samples, list[str]]:
    """The rows of the CSV index `source` that name images, and their `sources` (files
    `check_csv_sources` found): a listed file that is not named like an image and that PIL
    cannot open (`notes.txt`) is left out with a warning counting them, as train and
    dataset-stats skip it as unreadable; `strict` (or none left): an InputError instead.
    (Files named like images are not opened, as no image of a folder is: split copies bytes.)"""
    others = [
        index
        for index, path in enumerate(sources)
        if not is_image_file(path) and not _opens_as_image(path)
    ]
    if not others:
        return samples, sources
    shown = ", ".join(samples.ids[i] for i in others[:3]) + (" ..." if len(others) > 3 else "")
    if strict or len(others) == len(samples):
        raise InputError(
            f"{source} lists {len(others)} file(s) that are not images: {shown}",
            "a CSV index lists image files"
            if len(others) == len(samples)
            else "remove those rows, or drop --strict to leave them out",
        )
    log.warning(f"{source} lists {len(others)} file(s) that are not images, left out: {shown}")
    dropped = set(others)
    kept = [i for i in range(len(samples)) if i not in dropped]
    return samples.subset(kept), [sources[i] for i in kept]


def _opens_as_image(path: str) -> bool:
    """Whether PIL recognizes the file `path` as an image (its header alone is read), as every
    reader opens one (`opened_image`: regular files only, PIL's raw warnings of a large image's
    size off)."""
    try:
        with opened_image(path):
            return True
    except Exception:  # PIL raises OSError, SyntaxError, ValueError... for what it cannot read
        return False


def check_csv_sources(samples: Samples, source: Path) -> list[str]:
    """The absolute path of every file the CSV index lists (`absolute_as_opened`); an InputError
    when one is missing or listed twice (also by way of a linked folder: `kitty/a.png` where
    `kitty` links to `cat`)."""
    absent = [
        (i, p) for i, p in zip(samples.ids, samples.paths, strict=True) if not os.path.isfile(p)
    ]
    # A folder or a FIFO is there, but no file to split ("do not exist" misled).
    others = [i for i, p in absent if os.path.exists(p)]
    missing = [i for i, p in absent if not os.path.exists(p)]
    if others:
        raise InputError(
            f"{len(others)} path(s) listed in {source} are not files (a folder?): "
            + ", ".join(others[:3])
            + (" ..." if len(others) > 3 else ""),
            "a CSV index lists image files",
        )
    if missing:
        raise InputError(
            f"{len(missing)} file(s) listed in {source} do not exist: {', '.join(missing[:3])}"
            + (" ..." if len(missing) > 3 else ""),
            "fix the paths; relative ones are relative to the CSV's folder",
        )
    sources = absolute_as_opened(samples.paths)
    seen: dict[str, str] = {}
    real_dirs: dict[str, str] = {}  # a folder reached through a symbolic link: the same files
    for ident, path in zip(samples.ids, sources, strict=True):
        folder, name = os.path.split(path)
        if folder not in real_dirs:
            real_dirs[folder] = os.path.realpath(folder)
        real = path if real_dirs[folder] == folder else os.path.join(real_dirs[folder], name)
        real = os.path.normcase(real)
        if real in seen:
            raise InputError(
                f"{source} lists the same file twice: {seen[real]} and {ident}",
                "remove the repeated row, or it could land in two splits",
            )
        seen[real] = ident
    return sources


def add_repeats(
    plan: Plan, repeats: list[tuple[int, int]], mode: str, groups: Sequence[str] | None = None
) -> None:
    """Append --oversample's repeats to the plan: the same source and label in the first
    split, under a name of its own (none in a manifest: the row is repeated).

    With `groups` (`--group`'s name of each file) the files of one group that
    `oversample_repeats` repeats together (one after another, in one class, under one number)
    are named under one tag: where `<stem>-repeat<k>` is taken for one of them, all of them
    take the first `<stem>-repeat<k>-N` free for each."""
    plan.repeats = [0] * len(plan.sources)
    free = FreeNames(plan.dests)
    units: list[tuple[list[int], int]] = []  # (the files repeated together, their number)
    for index, number in repeats:
        plan.sources.append(plan.sources[index])
        plan.labels.append(plan.labels[index])
        plan.splits.append(plan.splits[index])
        plan.repeats.append(number)
        if groups is not None and units and units[-1][1] == number:
            last = units[-1][0][-1]
            if (groups[last], plan.labels[last]) == (groups[index], plan.labels[index]):
                units[-1][0].append(index)
                continue
        units.append(([index], number))
    if mode != "manifest":
        for unit, number in units:
            plan.dests += _repeat_dests([plan.dests[i] for i in unit], number, free)


# What becomes of the images beside the class folders, which are not split, by --mode.
STRAYS_FATE = {
    "copy": "and not copied",
    "symlink": "and not linked",
    "hardlink": "and not linked",
    "move": "and stay where they are",
    "manifest": "and not listed",
}


def load_split_input(
    source: str | os.PathLike, mode: str = "copy"
) -> tuple[Samples, tuple[list[str], list[str]], bool]:
    """(samples, what the reader left out of a folder (`list_left_out`: non-image files,
    image links to nothing), whether it is a CSV index) of the data to
    split: an image folder, a flat folder or a CSV index, read by `core.datasource`. Data
    that is split already (a split root, a CSV with a split column, digits) is refused.
    Images beside class folders are warned of, with what `mode` does with them (nothing)."""
    from torchkit.core.data.sources import open_data, warn_stray_images
    from torchkit.core.data.sources.samples import partial_labels_kept
    from torchkit.core.data.stored_image import is_stored

    with partial_labels_kept():  # refused below, never split with every label dropped
        data = open_data(source, allow_unlabelled=True)
    if data.is_split:
        hint = (
            f"split one of its parts, such as {Path(data.spec) / 'train'}, or the data it came from"
            if data.kind == "split root"
            # the built-in digits come from scikit-learn, split 80/10/10: no data to give
            else "`digits` is built in, split already; ./digits for a folder named so"
            if data.kind == "digits"
            else "give the data it came from"
            + (", or drop the CSV's split column" if data.kind == "split csv" else "")
        )
        raise InputError(f"{data.describe()} is split already", hint)
    if data.whole.paths and is_stored(data.whole.paths[0]):
        # Its images lie inside container files: there are no files to copy, link or name.
        raise InputError(
            f"{data.describe()} holds its images in container files, not as image files",
            "train holds a validation split out itself with --val-split, recorded in RUN/split.csv",
        )
    _refuse_partly_labelled(data.whole, data.describe())
    warn_stray_images(data, STRAYS_FATE[mode])
    folder = data.kind in ("image folder", "flat folder")
    left_out = list_left_out(Path(data.root)) if folder else ([], [])
    samples = data.whole
    if left_out[1]:  # image links to nothing: the reader lists them, no split can write them
        dead = set(left_out[1])
        samples = samples.subset([i for i, name in enumerate(samples.ids) if name not in dead])
    return samples, left_out, data.kind == "csv"


def _refuse_partly_labelled(samples: Samples, described: str) -> None:
    """InputError for a CSV index of which only some rows have a label: split writes each
    image into its class's folder (or row), and the commands that read no labels read such
    data all unlabelled, so its split would lose every label."""
    if "" not in samples.classes or samples.classes == [""]:
        return
    unlabelled = samples.classes.index("")
    missing = [i for i, label in enumerate(samples.labels) if label == unlabelled]
    shown = ", ".join(samples.ids[i] for i in missing[:3]) + (", ..." if len(missing) > 3 else "")
    raise InputError(
        f"{described} has {len(missing)} image(s) without a label ({shown}) among "
        f"{len(samples) - len(missing)} labelled ones",
        "give every row a label, or none: a label column empty in every row splits "
        "unlabelled images",
    )


def refuse_linked_folders(sources: list[str], root: Path) -> None:
    """--mode move takes only what lies in ROOT: a folder of ROOT that is a symbolic link to
    one elsewhere (`ROOT/bird -> /data/birds`) would have that folder emptied, and one that
    leads to another folder the move reads (`ROOT/kitty -> cat`) would move its files twice.
    (A linked file is moved as the link it is.)"""
    real_root = os.path.realpath(root)
    spelled: dict[str, str] = {}  # real folder -> the first folder of ROOT leading there
    for folder in sorted({os.path.dirname(source) for source in sources}):
        real = os.path.realpath(folder)
        if os.path.commonpath([real, real_root]) != real_root:
            raise UsageError(
                f"--mode move would empty {real}, outside {root}: {folder} leads there "
                "through a symbolic link",
                "use --mode copy, symlink or hardlink, or put the folder itself in ROOT",
            )
        if real in spelled:
            # Its files are listed twice (`ROOT/kitty -> cat`): the second move of each found
            # it gone, and stopped half-way as if another process had deleted it.
            raise UsageError(
                f"--mode move would move each file of {real} twice: {spelled[real]} and "
                f"{folder} are one folder (a symbolic link leads from one to the other)",
                "remove the link from ROOT, or use --mode copy, symlink or hardlink",
            )
        spelled[real] = folder


def warn_dangling_links(dangling: list[str], root: str | os.PathLike) -> None:
    """A warning naming the links in ROOT named like images that point nowhere, and one
    naming the FIFOs, sockets and devices (or links to one) so named, `dangling` relative to
    `root`: the split leaves them out (torchvision's ImageFolder lists them, and fails on
    reading one; no copy or link of one is an image)."""
    links, special = [], []
    for name in dangling:
        (special if os.path.exists(os.path.join(root, name)) else links).append(name)
    for found, what in (
        (links, "image link(s) point nowhere"),
        (special, "image name(s) are no regular file (a FIFO, socket or device)"),
    ):
        if found:
            log.warning(
                f"{len(found)} {what} and are left out: "
                + ", ".join(found[:3])
                + (" ..." if len(found) > 3 else "")
            )


def warn_fixed_unmet(
    classes: list[str], counts: list[list[int]], names: list[str], fixed: list[int], stratify: bool
) -> None:
    """--fixed with groups (`--group`, byte-identical files) that cannot be cut to its counts:
    a warning naming the classes (or, unstratified, the splits) that got other counts."""

    def held_out(row: list[int]) -> str:
        return ", ".join(f"{n} {c}" for n, c in zip(names[1:], row[1:], strict=True))

    wanted = held_out([0, *fixed])
    if not stratify:
        totals = [sum(row[j] for row in counts) for j in range(len(names))]
        if totals[1:] != fixed:
            log.warning(f"--fixed ({wanted}) is not met with whole groups: {held_out(totals)}")
        return
    unmet = [
        f"{name or '(unlabelled)'} ({held_out(row)})"
        for name, row in zip(classes, counts, strict=True)
        if sum(row) and row[1:] != fixed
    ]
    if unmet:
        log.warning(
            f"--fixed ({wanted}) is not met with whole groups for {len(unmet)} class(es): "
            + ", ".join(unmet[:5])
            + (" ..." if len(unmet) > 5 else "")
        )


def warn_unbalanced(
    classes: list[str], counts: list[list[int]], names: list[str], extra: list[int]
) -> None:
    """--oversample repeats train images: a class with none there (its few files all went to
    the other splits) stays out of the first split, so the warning names it; so does one that
    whole --group groups bring only near the largest class (`extra`: its repeats)."""
    absent = [
        name or "(unlabelled)"
        for name, row in zip(classes, counts, strict=True)
        if sum(row) and not row[0]
    ]
    if absent:
        shown = ", ".join(absent[:5]) + (" ..." if len(absent) > 5 else "")
        log.warning(
            f"--oversample cannot balance {names[0]} for "
            f"{counted(len(absent), 'class', 'classes')} with no image in it: {shown}"
        )
    target = max((row[0] for row in counts), default=0)  # the largest class's, never repeated
    unmet = [
        f"{name or '(unlabelled)'} ({row[0] + more})"
        for name, row, more in zip(classes, counts, extra, strict=True)
        if row[0] and row[0] + more != target
    ]
    if unmet:
        shown = ", ".join(unmet[:5]) + (" ..." if len(unmet) > 5 else "")
        log.warning(
            f"--oversample repeats whole groups: {counted(len(unmet), 'class', 'classes')} "
            f"{'has' if len(unmet) == 1 else 'have'} other than {target} images in {names[0]}: "
            f"{shown}"
        )


def warn_small(classes: list[str], counts: list[list[int]], names: list[str], stratify: bool):
    totals = [sum(row[j] for row in counts) for j in range(len(names))]
    empty = [n for n, t in zip(names, totals, strict=True) if not t]
    if not stratify:
        if empty:
            log.warning(f"too few files: split(s) {', '.join(empty)} are empty")
        return
    if empty:
        # Said apart from the classes below: with byte-identical files kept together, classes
        # of thousands of images can each be one group, and no class spares one for a split.
        log.warning(
            f"split(s) {', '.join(empty)} are empty: no class could spare an image, or a group "
            "of images kept together, for them"
        )
    short = [
        f"{name or '(unlabelled)'} ({sum(row)}: none in "
        + "/".join(n for n, c in zip(names, row, strict=True) if not c)
        + ")"
        for name, row in zip(classes, counts, strict=True)
        if sum(row) and not all(row)
    ]
    if short:
        log.warning(
            f"{len(short)} class(es) have too few images for every split: {', '.join(short[:5])}"
            + (" ..." if len(short) > 5 else "")
        )
