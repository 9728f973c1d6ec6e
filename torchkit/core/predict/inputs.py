"""What `predict IMAGES...` names: folders (labelled or not, searched recursively), split roots
and CSV indexes (through the one data resolver, `--split` honoured), image files, and `-` for
paths on stdin, one per line.

`-` alone is read as the paths arrive (`streamed_images`): rows can come out while the program
writing the list still runs, and only the paths being predicted are held.

Paths follow the data path convention: with one folder or CSV, relative to its root (recorded
as `root`); with several inputs, each folder's or CSV's paths are prefixed with the input as
typed, and image files (given or on stdin) are as typed, so every row names one image.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchkit.core.data.sources.discovery import is_image_file
from torchkit.core.data.sources.samples import (
    Samples,
    class_index,
    find_class,
    nfc,
    partial_labels_kept,
)
from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.io.files import STDIN, read_path_list
from torchkit.core.io.path_lists import PathStream


@dataclass
class ImageSet:
    samples: Samples
    root: str  # what `path` is relative to ("" when paths are as typed)
    notes: list[str]
    stream: PathStream | None = None  # the paths still to come, for `-` alone (StreamedSamples)
    classes_given: bool = False  # the data states its label order (`DataSource.classes_given`)
    # Each image's label as an index among its own input's classes, where `samples.labels`
    # are not (several IMAGES: their classes merged by name); None: `samples.labels` are.
    own_labels: list[int] | None = None
    # Several IMAGES: each input's classes and whether it states their order (`classes_given`),
    # which name a model's outputs together as one input would (`classes_of_inputs`).
    input_classes: list[tuple[list[str], bool]] | None = None
    # The inputs read whole, unlabelled, where a reader of labels may find class folders
    # (images beside them: `every_image`), by position among IMAGES: as typed.
    read_whole: dict[int, str] = field(default_factory=dict)
    # Of those, the classes a reader of labels reads each by, where its first read worked them
    # out (`DataSource.labelled_classes`): the others are listed again (`class_folder_names`).
    labelled_classes: dict[int, list[str]] = field(default_factory=dict)


def collect_images(
    items: Sequence[str],
    *,
    split: str | None = None,
    stdin: Iterable[str] | None = None,
    recorded: Mapping[str, Any] | None = None,
) -> ImageSet:
    """The images `items` name, in order; `stdin` is read for `-`. `recorded` (the model's
    checkpoint `data` entry) makes `--split val` pick the images its training run held out."""
    from torchkit.core.data.sources import open_data, select_split
    from torchkit.core.data.sources.containers import open_container_data

    if not items:
        raise UsageError("no IMAGES given", "give folders, image files, CSV indexes or - for stdin")
    if list(items).count(STDIN) > 1:
        raise UsageError("- (stdin) given more than once")
    sets, notes = [], []
    read_as_data = False  # a folder, CSV or digits: where --split can apply
    given = False  # the last data's `classes_given`
    stated: list[bool] = []  # each input's
    read_whole: dict[int, str] = {}  # `ImageSet.read_whole`
    labelled: dict[int, list[str]] = {}  # `ImageSet.labelled_classes`
    for item in items:
        if item == STDIN:
            sets.append((item, _files(read_path_list(stdin, "image"), from_stdin=True), ""))
            stated.append(False)
            continue
        # An image's name that is no regular file (a dangling link, a FIFO) is an image too, as
        # on stdin: "image not found", or its row "not a regular file", never opened.
        if is_image_file(item) and os.path.lexists(item) and not os.path.isdir(item):
            sets.append((item, _files([item], from_stdin=False), ""))
            stated.append(False)
            continue
        # Shards (a pattern names no file), a .tar of images, parquet files: data in containers.
        # Predict reads no labels: images beside class folders are read too (`every_image`).
        # Of partly labelled data each label is kept, the `label` column of its sample (class
        # "" where there is none), as `convert shards` keeps them: read all unlabelled, every
        # row's label was empty.
        with partial_labels_kept():
            source = open_container_data(item, None, True, every_image=True)
            if source is None:
                if os.path.isfile(item) and not item.lower().endswith(".csv"):
                    raise InputError(f"{item} is neither an image, a folder nor a CSV index")
                if item != "digits" and not os.path.lexists(item):
                    raise _not_found(item)
                source = open_data(item, allow_unlabelled=True, every_image=True)
        read_as_data = True
        samples, found_notes = select_split(source, split, default="all", recorded=recorded)
        notes += found_notes
        if _may_hold_class_folders(source):
            read_whole[len(sets)] = item
            if source.labelled_classes is not None:
                labelled[len(sets)] = list(source.labelled_classes)
        sets.append((item, samples, source.root))
        given = source.classes_given
        stated.append(given)
    if split is not None and not read_as_data:
        raise UsageError(f"--split {split}: IMAGES are image files, which have no splits")
    if len(sets) == 1:
        _, samples, root = sets[0]
        return ImageSet(
            samples,
            root,
            notes,
            classes_given=given,
            read_whole=read_whole,
            labelled_classes=labelled,
        )
    joined, own_labels = _joined(sets)
    input_classes = [
        (list(samples.classes), given) for (_, samples, _), given in zip(sets, stated, strict=True)
    ]
    return ImageSet(
        joined,
        "",
        notes,
        own_labels=own_labels,
        input_classes=input_classes,
        read_whole=read_whole,
        labelled_classes=labelled,
    )


# What a folder or a split root (a .tar of either) with images beside class folders is read
# as, whole and unlabelled (`every_image`); a reader of labels reads its class folders.
READ_WHOLE_KINDS = ("flat folder", "tar flat folder", "split root", "tar split root")


def _may_hold_class_folders(source: Any) -> bool:
    """Whether data read unlabelled, whole or in part, may be one that eval reads labelled, by
    its class folders: a folder (a .tar of one) of images in subfolders, read whole, or a split
    root (a .tar of one) of which a split folder of images in subfolders is read whole (the
    others may be labelled), whichever of its splits predict reads."""
    if source.kind not in READ_WHOLE_KINDS or "" not in source.classes:
        return False
    unlabelled = source.classes.index("")
    if not source.is_split:
        parts, split_folder = [source.whole], False
    else:
        parts, split_folder = list(source.splits.values()), True
    for samples in parts:
        for name, label in zip(samples.ids or (), samples.labels, strict=False):
            name = name.replace(os.sep, "/")
            if label == unlabelled and "/" in (name.partition("/")[2] if split_folder else name):
                return True  # an unlabelled image in a subfolder (of its split folder)
    return False


def classes_naming_outputs(image_set: ImageSet, data: str) -> tuple[list[str], bool, str | None]:
    """The classes IMAGES name the outputs of a model that records none by
    (`output_names_from_data`), whether their order is stated, and why it is unknown (None
    where it is not): of one input, its classes; of several, theirs together as one input of
    all their images would have them (`classes_of_inputs`). An input read whole, unlabelled,
    whose images lie beside class folders names them by those classes, as eval does: as its
    first read worked them out, or else listed again (`class_folder_names`)."""
    from torchkit.core.inference.class_names import classes_of_inputs

    read_whole = image_set.read_whole

    def labelled(at: int) -> list[str]:
        known = image_set.labelled_classes.get(at)
        return list(known) if known is not None else class_folder_names(read_whole[at])

    if image_set.input_classes is None:
        if 0 in read_whole:
            return labelled(0), False, None
        return list(image_set.samples.classes), image_set.classes_given, None
    inputs = [
        (labelled(at), False) if at in read_whole else (classes, given)
        for at, (classes, given) in enumerate(image_set.input_classes)
    ]
    return classes_of_inputs(inputs, data)


def class_folder_names(item: str) -> list[str]:
    """The classes of `item`, read whole by predict, as eval reads them (its class folders'
    names, in sorted order; a split root's of every split): [""] where it has none, or where a
    reader of labels refuses it. Read again without a word (its warnings were given once)."""
    import logging
    import threading

    from torchkit.core.data.sources import open_data
    from torchkit.core.data.sources.containers import open_container_data
    from torchkit.core.io.errors import TorchkitError

    reading = threading.get_ident()
    logger = logging.getLogger("torchkit")

    def quiet(record: logging.LogRecord) -> bool:
        return record.thread != reading

    logger.addFilter(quiet)
    try:
        source = open_container_data(item, None, True) or open_data(item, allow_unlabelled=True)
    except TorchkitError:
        return [""]
    finally:
        logger.removeFilter(quiet)
    return list(source.classes)


def streams_stdin(items: Sequence[str]) -> bool:
    """Whether IMAGES are read as they come: `-` alone, in one process (torchrun's ranks lay
    their batches out from the whole list, read first)."""
    from torchkit.core.runtime.distributed import joins_process_group

    return list(items) == [STDIN] and not joins_process_group()


def streamed_images(stdin: Iterable[str] | None, split: str | None = None) -> ImageSet:
    """`-` alone: the paths on stdin, read as they come (`ImageSet.stream`); a missing file
    is an error row, as `collect_images` makes it."""
    if split is not None:
        raise UsageError(f"--split {split}: IMAGES are image files, which have no splits")
    return ImageSet(StreamedSamples(), "", [], PathStream(stdin, "image"))


class PathKey(int):
    """A sample's index carrying its path: the loader's workers, started before the path was
    read, find it in the key (StreamedSamples)."""

    path: str

    def __new__(cls, index: int, path: str) -> PathKey:
        key = super().__new__(cls, index)
        key.path = path
        return key

    def __reduce__(self):
        return PathKey, (int(self), self.path)


class StreamedSamples(Samples):
    """Unlabelled image files named on stdin, indexed by PathKey: a sample's path is in its key
    (in the loader's workers) or among `pending`, the paths of the samples in work (by index,
    for indices that come back as plain numbers). Its length is the count read so far."""

    def __init__(self) -> None:
        self.pending: dict[int, str] = {}
        self.read = 0
        paths = _PathOfKey(self.pending)
        super().__init__([""], _NoLabels(), paths=paths, source="stdin", ids=paths)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.read

    def keys(self, paths: list[str]) -> list[PathKey]:
        """The keys of the next `paths`, which replace the pending ones."""
        keys = [PathKey(self.read + at, path) for at, path in enumerate(paths)]
        self.pending.clear()
        self.pending.update((int(key), key.path) for key in keys)
        self.read += len(paths)
        return keys


class LoaderPass:
    """The batches of one pass of a streamed run's loader (its batch sampler): each pass takes
    the paths piped so far, and the loader's persistent workers stay from one to the next."""

    def __init__(self) -> None:
        self.batches: Any = []  # a list, or batches made as they are read (Sized, Iterable)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class _PathOfKey:
    def __init__(self, pending: dict[int, str]) -> None:
        self.pending = pending

    def __getitem__(self, key: int) -> str:
        return key.path if isinstance(key, PathKey) else self.pending[key]

    def __bool__(self) -> bool:
        return True


class _NoLabels:
    """The label of every streamed image: 0, the class "" (predict does not read labels)."""

    def __getitem__(self, key: int) -> int:
        return 0

    def __bool__(self) -> bool:
        return True


def listed_images_check(output: str | os.PathLike) -> Callable[[Sequence[str]], None]:
    """The check of the images listed on stdin against -o FILE, as each comes (`-` alone, read
    as piped) or all at once (`-` beside other IMAGES): none may be FILE (a link or a hard
    link to it), whose replacement would lose the image. FILE may lie beside them, as beside
    image files given as arguments: a listed image is checked before it is read, and FILE is
    put in place only after the last has been. One stat a path (against FILE as it is now: a
    file made there since holds no image of this list)."""
    import stat

    from torchkit.core.io.output_paths import shown
    from torchkit.core.io.overlap import InputPath, OutputOverlapError, check_overlap

    try:
        info = os.stat(output)
    except (OSError, ValueError):  # no FILE yet: no listed image is it
        identity = None
    else:  # a FIFO or a device is written, never replaced; one listed is never opened
        identity = (info.st_dev, info.st_ino) if stat.S_ISREG(info.st_mode) else None

    def check(paths: Sequence[str]) -> None:
        if identity is None:
            return
        for path in paths:
            try:
                info = os.stat(path)
            except (OSError, ValueError):  # missing, or no name: its row says so
                continue
            if (info.st_dev, info.st_ino) == identity:  # refused with every output's words
                image = InputPath.of(path, "image listed on stdin")
                check_overlap(output, "output", [image])
                raise OutputOverlapError(
                    f"output {shown(output)} is the {image.what} {shown(path)}",
                    "choose another output",
                )

    return check


def require_images(items: Sequence[str]) -> None:
    """Each of `items` that names a path exists, with `collect_images`' error, without reading
    anything: checked before the outputs, so that a missing or mistyped input is not reported
    as an output that "already exists". `-`, `digits`, URLs and shard patterns name no path."""
    from torchkit.core.data.sources.required import names_no_path

    for item in items:
        if item != STDIN and not names_no_path(item) and not os.path.lexists(item):
            raise _not_found(item)


def _not_found(item: str) -> InputError:
    # A missing image is not a missing dataset: say what was looked for.
    from torchkit.core.data.sources.source import unfetched_url_error

    unfetched = unfetched_url_error(item)
    if unfetched is not None:
        return unfetched
    if is_image_file(item):
        return InputError(f"image not found: {item}", "check the path")
    return InputError(
        f"IMAGES not found: {item}", "give image files, folders, CSV indexes, digits or - for stdin"
    )


def _files(paths: list[str], *, from_stdin: bool) -> Samples:
    """Image files named one by one: no labels; a missing file becomes an error row (on stdin,
    where a list may name files that are gone) or an error (on the command line)."""
    if not from_stdin:
        for path in paths:
            if not os.path.exists(path):
                raise InputError(f"image not found: {path}")
    return Samples([""], [0] * len(paths), paths=list(paths), source="stdin", ids=list(paths))


def _joined(sets: list[tuple[str, Samples, str]]) -> tuple[Samples, list[int]]:
    """Several inputs as one list, each path prefixed with its input as typed, each image with
    its input's label (the `label` column, as of one input), and each label's index among its
    input's classes (`label_index`, as of one input). Its classes are "" (the class of
    unlabelled images, index 0) and then the labelled inputs' class names, merged by name in
    the order they come: not a model's class order (a model that records no class names has
    its outputs named by `ImageSet.input_classes`, as of one input)."""
    paths: list[str] = []
    ids: list[str] = []
    splits: list[str] = []
    labels: list[int] = []
    own_labels: list[int] = []
    classes = [""]
    index_of = class_index(classes)
    any_split = any(samples.splits for _, samples, _ in sets)
    for item, samples, root in sets:
        paths += list(samples.paths or [])
        ids += [os.path.join(item, name) if root else name for name in samples.ids]
        if any_split:
            splits += list(samples.splits or [""] * len(samples))
        mapping = []
        for name in samples.classes:
            found = find_class(index_of, name)
            if found is None:  # a new name: indexed as `class_index` would (no rebuild)
                found = len(classes)
                classes.append(name)
                index_of.setdefault(name, found)
                index_of.setdefault(nfc(name), found)
            mapping.append(found)
        labels += [mapping[label] for label in samples.labels]
        own_labels += list(samples.labels)
    if any(samples.paths is None for _, samples, _ in sets):
        raise UsageError("digits cannot be combined with other IMAGES", "predict it on its own")
    joined = Samples(classes, labels, paths=paths, source="IMAGES", ids=ids)
    if any_split:
        joined.splits = splits
    return joined, own_labels
