"""`Samples`: a labelled set of images, what every reader of data gives and every command reads."""

from __future__ import annotations

import contextvars
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torchkit.core.io.errors import InputError

# Classes data without class names may have: they are named "0".."N-1" from the largest class
# index, and an index past this is damaged data that would take all memory to name.
MAX_INDEX_CLASSES = 1_000_000

_PARTIAL_LABELS_KEPT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "partial_labels_kept", default=False
)


@contextmanager
def partial_labels_kept() -> Iterator[None]:
    """Within it, every reader that takes unlabelled images (`allow_unlabelled`) keeps the
    labels of partly labelled data (shards, parquet rows, CSV rows of which only some have a
    label): the samples without one are of class "", the last class, where outside it all of
    them are read unlabelled, with a warning. For the commands that need no labels and keep
    those there are (`predict`, `extract-features`, `dataset-stats`, `convert shards`), or
    refuse such data (`split`)."""
    token = _PARTIAL_LABELS_KEPT.set(True)
    try:
        yield
    finally:
        _PARTIAL_LABELS_KEPT.reset(token)


def partial_labels_are_kept() -> bool:
    """Whether the readers keep partial labels here (`partial_labels_kept`)."""
    return _PARTIAL_LABELS_KEPT.get()


def with_unlabelled_class(
    names: Sequence[str], labels: Sequence[int | None]
) -> tuple[list[str], list[int]]:
    """(class names, labels) of partly labelled data (`labels` None where a sample has none):
    `names`, and class "" after them where some sample has no label, its label."""
    if all(label is not None for label in labels):
        return list(names), list(labels)
    unlabelled = len(names)
    return [*names, ""], [unlabelled if label is None else label for label in labels]


def class_index(classes: Sequence[str]) -> dict[str, int]:
    """Each class name's index, under its own spelling and its Unicode NFC one (`find_class`)."""
    index: dict[str, int] = {}
    for i, name in enumerate(classes):
        index.setdefault(name, i)
    for i, name in enumerate(classes):
        index.setdefault(nfc(name), i)
    return index


def find_class(index: Mapping[str, int], name: str) -> int | None:
    """The index of class `name` in `class_index(...)`, None if none: matched as spelled, else
    in Unicode NFC, so a folder named on macOS ("e" + a combining accent, NFD) is the class the
    same name typed elsewhere (one "é", NFC) names in a checkpoint or a CSV index."""
    found = index.get(name)
    return found if found is not None else index.get(nfc(name))


def nfc(name: str) -> str:
    """`name` in Unicode NFC, the spelling `find_class` matches names by (ASCII is NFC)."""
    return name if name.isascii() else unicodedata.normalize("NFC", name)


def is_blank_name(name: str) -> bool:
    """Whether `name` shows nothing printed: empty, or only spaces and invisible characters (a
    zero-width space, a byte-order mark, control characters). A class so named is a row of no
    name in every report, and " " and "  " two such classes no one can tell apart."""
    return all(char.isspace() or unicodedata.category(char) in ("Cc", "Cf") for char in name)


def spelling_twin_pair(names: Sequence[str]) -> tuple[int, int] | None:
    """(i, j), i < j, of the first two of `names` that are one name in two Unicode spellings
    (`café` composed and decomposed), which print alike and `find_class` matches as one; None
    where there are none. A name given twice exactly is no such pair (torchvision's ImageNet
    names hold two "crane"s), nor are names that differ by the spaces around them."""
    first: dict[str, int] = {}
    for j, name in enumerate(names):
        i = first.setdefault(nfc(name), j)
        if names[i] != name:
            return i, j
    return None


def classes_named_alike(classes: Sequence[str]) -> dict[str, list[int]]:
    """The indices of each name (in NFC, as `find_class` matches names) that two or more of
    `classes` give, as torchvision's ImageNet names give `crane` to classes 134 and 517: empty
    where every class has a name of its own. Such names are no error where labels are class
    indices (a checkpoint's outputs, `KEY.cls`, parquet's ClassLabel); a label given by the name
    alone is (`refuse_a_label_of_two_classes`)."""
    indices: dict[str, list[int]] = {}
    for index, name in enumerate(classes):
        indices.setdefault(nfc(name), []).append(index)
    return {name: found for name, found in indices.items() if len(found) > 1}


def shown_class_names(classes: Sequence[str]) -> list[str]:
    """Each class's name as every table, CSV file and plot shows it: with its index,
    `crane (#134)`, where another class has that name too (ImageNet's two `crane`s, 134 and
    517: labels are indices), so that a reader can tell which one is meant; the name alone
    otherwise, so most data shows as it always did. JSON gives the name as it is, beside an
    "index"."""
    named_alike = classes_named_alike(classes)
    if not named_alike:
        return list(classes)
    return [
        f"{name} (#{index})" if nfc(name) in named_alike else name
        for index, name in enumerate(classes)
    ]


def refuse_a_label_of_two_classes(
    name: str, named_alike: Mapping[str, list[int]], labelled: str, of: str, hint: str
) -> None:
    """InputError where `name`, a label given by a class name alone (a class folder, a CSV
    label, a shard's `KEY.json` "label"), is the name of two or more classes (`named_alike`:
    `classes_named_alike` of them): which of them its images belong to would be a guess, and
    matching by name took the first. `labelled` says whose label it is ("class crane of DATA"),
    `of` whose classes ("the model's outputs"), both in the one message every reader gives."""
    indices = named_alike.get(nfc(name))
    if indices:
        raise InputError(
            f"{labelled} is the name of {len(indices)} of {of} "
            f"({', '.join(map(str, indices))}): which one it stands for is a guess",
            hint,
        )


def how_they_differ(a: str, b: str) -> str:
    """What tells apart two names that are one without the spaces around them and in NFC
    (`cat`, `cat `; `café` composed and decomposed), as messages say it."""
    spaced = a.strip() != a or b.strip() != b
    return "the spaces around them" if spaced else "Unicode spelling"


def refuse_spelling_twins(names: Iterable[str], what: str) -> None:
    """InputError when two of `names` (one listing: the class folders of one folder, the labels
    of one split) are one name in two Unicode spellings (NFC "é", NFD "e" + a combining accent:
    a folder made on macOS beside one typed elsewhere): `find_class` matches them as one name,
    so they would be one class silently, or two classes that look the same. `what`: "class
    folders in ROOT", "labels of X"."""
    listed = list(names)
    pair = spelling_twin_pair(listed)
    if pair is not None:
        first, second = (listed[index] for index in pair)
        raise InputError(
            f"{what} {ascii(first)} and {ascii(second)} are one name in two Unicode "
            "spellings (composed and decomposed accents)",
            "rename one to the other's spelling: torchkit reads them as one class",
        )


def refuse_unshowable_classes(names: Sequence[str], spec: str) -> None:
    """InputError where the class names of the data `spec` (a class folder, a CSV label, a
    parquet ClassLabel name) hold a name of spaces or invisible characters alone (a folder
    ` `: a row of no name in every report, and a checkpoint no torchkit loads), or one name
    in two Unicode spellings (`refuse_spelling_twins`, as each reader refuses within one
    listing). "" is unlabelled images. Names that differ only by the spaces around them
    (` cat`, `cat `) stay two classes: CSV and JSON outputs keep them apart."""
    blank = next((i for i, name in enumerate(names) if name and is_blank_name(name)), None)
    if blank is not None:
        raise InputError(
            f"{spec} has class {blank} named {names[blank]!r}, which no report can show",
            "name every class by visible text: rename the class folder or label of spaces "
            "or invisible characters alone",
        )
    refuse_spelling_twins(names, f"class names of {spec}:")


@dataclass
class Samples:
    """A labelled set of images: files on disk (`paths`) or arrays in memory (`images`)."""

    classes: list[str]
    labels: list[int]
    paths: list[str] | None = None
    images: Any = None  # uint8 array (N, H, W) or (N, H, W, C) for in-memory data
    source: str = ""
    # The printable name of each sample, the `path` column of every output that names images:
    # the path relative to the data root (for a CSV index, as the CSV writes it).
    ids: list[str] = field(default_factory=list)
    # The split (train, val, test) of each sample, for data that has splits; None otherwise.
    splits: list[str] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: Sequence[int]) -> Samples:
        return Samples(
            classes=self.classes,
            labels=[self.labels[i] for i in indices],
            paths=None if self.paths is None else [self.paths[i] for i in indices],
            images=None if self.images is None else self.images[list(indices)],
            source=self.source,
            ids=[self.ids[i] for i in indices] if self.ids else [],
            splits=None if self.splits is None else [self.splits[i] for i in indices],
        )

    @property
    def has_unlabelled(self) -> bool:
        """Whether some images have no label: class "", the unlabelled split of split data
        read with `allow_unlabelled` (HF's test split of label -1 beside labelled ones)."""
        return "" in self.classes and self.classes.index("") in self.labels

    def class_counts(self) -> list[int]:
        counts = [0] * len(self.classes)
        for label in self.labels:
            counts[label] += 1
        return counts


def index_class_names(largest: int, where: str, hint: str) -> list[str]:
    """ "0", "1", ... up to the class index `largest`, the names of data that names no class;
    InputError (naming `where`, the sample that has it) for an index past MAX_INDEX_CLASSES."""
    if largest >= MAX_INDEX_CLASSES:
        raise InputError(
            f"{where} has class index {largest:,}, and no class names say there are that many "
            f"classes (at most {MAX_INDEX_CLASSES:,} without them)",
            hint,
        )
    return [str(i) for i in range(largest + 1)]
