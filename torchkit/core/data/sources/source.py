"""`open_data(spec) -> DataSource`: what a `--data` argument names, read once, in one place."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchkit.core.data.sources.csv_index import (
    IndexRows,
    absolute_paths,
    class_order,
    index_folder,
    read_index_rows,
    repeated_rows_warning,
    unlabelled_lines_of_split,
    unlabelled_rows_warning,
)
from torchkit.core.data.sources.digits import DIGITS, digits_splits
from torchkit.core.data.sources.discovery import (
    NoImagesError,
    Numbered,
    dead_links,
    discover_flat_folder,
    discover_image_folder,
    flat_folder_and_class_folders,
    is_apple_double,
    is_image_file,
    is_skipped_folder,
    list_non_image_files,
    no_class_folders_error,
    numbered_flat_folder,
    numbered_flat_folder_by_class,
    numbered_image_folder,
    refuse_one_file_in_two_places,
    relative_ids,
    warn_dead_links,
)
from torchkit.core.data.sources.moving import (
    lock_for_reading,
    lock_listed_for_reading,
    lock_subfolders_for_reading,
)
from torchkit.core.data.sources.samples import (
    Samples,
    class_index,
    classes_named_alike,
    find_class,
    nfc,
    partial_labels_are_kept,
    partial_labels_kept,
    refuse_a_label_of_two_classes,
    refuse_spelling_twins,
    refuse_unshowable_classes,
    with_unlabelled_class,
)
from torchkit.core.data.sources.splitting import (
    SPLIT_NAMES,
    unfinished_split,
    written_split_names,
)
from torchkit.core.io.errors import InputError, TorchkitError, first_and_more
from torchkit.core.io.force import marker_command
from torchkit.core.io.shell_words import shell_word

log = logging.getLogger("torchkit")

KINDS = (
    "digits",
    "image folder",
    "flat folder",
    "split root",
    "csv",
    "split csv",
    "parquet",  # datasource.parquet: a folder of HF parquet files
    "split parquet",
    "parquet file",
    "shards",  # datasource.shards: WebDataset tar shards
    "split shards",  # a folder of {train,val,test}-NNNNNN.tar shards
    "tar image folder",  # datasource.shards: a .tar of an image folder
    "tar flat folder",
    "tar split root",
)
GRAMMAR_HINT = (
    "give an image folder ROOT/<class>/<image>, a split root ROOT/{train,val,test}/, "
    "a CSV index or `digits`"
)


@dataclass
class DataSource:
    """The data a `--data` argument names.

    Split data (`digits`, a split root, a CSV with a `split` column) has `splits` (those present,
    in the order train, val, test) and no `whole`; other data has `whole` and no `splits`. Every
    sample's `ids` entry is its path relative to `root` (for a CSV index, as the CSV writes it),
    and the samples of split data know their split (`Samples.splits`).
    """

    spec: str  # --data as typed
    kind: str  # one of KINDS
    root: str  # what every `ids` entry (`path` column) is relative to; "" for digits
    splits: dict[str, Samples]
    whole: Samples | None
    classes: list[str]  # class names in label order ([""] for unlabelled images)
    # Whether the data states its label order (HF's ClassLabel names, classes.txt beside
    # shards, class indices) rather than torchkit sorting the names (folders, CSV, string labels).
    classes_given: bool = False
    # The split folders there that hold no image, by split name, each as messages show it
    # (`sr/test`): left out of `splits`; asking for one is an error, the others are warned of.
    empty_splits: dict[str, str] = field(default_factory=dict)
    # Images beside class folders, which no reader of labels reads (the class-folder rule): by
    # folder as messages show it (`D`, `sr/train`, `x.tar:train`), their names in it, sorted.
    strays: dict[str, list[str]] = field(default_factory=dict)
    # .tar files in an image folder or split root, which its reader does not read (shards kept
    # beside a class or split folder): by folder as messages show it, their names, sorted.
    unread_archives: dict[str, list[str]] = field(default_factory=dict)
    # Data read whole (`every_image`) where images lie beside class folders: the classes a
    # reader of labels reads it by (`open_data` without `every_image`: its class folders'
    # names, sorted, those without images too; [""] where they hold no image or it refuses
    # the layout), worked out from the same listing; None where not (other data, or a reader
    # of labels would list it otherwise: linked folders).
    labelled_classes: list[str] | None = None
    # A `.tar` of a folder: the files it unpacks to that are not images (hidden ones aside), by
    # their paths in the data, as `non_image_files` lists a folder's (None for other data).
    tar_non_images: list[str] | None = None

    @property
    def is_split(self) -> bool:
        return bool(self.splits)

    @property
    def labelled(self) -> bool:
        return self.classes != [""]

    def describe(self) -> str:
        """`ROOT (split root: train, val, test)` for messages."""
        parts = f": {', '.join(self.splits)}" if self.splits else ""
        return f"{self.spec} ({self.kind}{parts})"


def open_data(
    spec: str | os.PathLike,
    *,
    classes: Sequence[str] | None = None,
    allow_unlabelled: bool = False,
    every_image: bool = False,
) -> DataSource:
    """The data `spec` names (the one `--data` grammar of every command):

    - `digits`: scikit-learn's 8x8 digits, split 80/10/10 (always the built-in set: a folder of
      that name is `./digits`);
    - a split root: a folder whose subfolders are `train/`, `val/` and/or `test/` (nothing else),
      each an image folder (with `allow_unlabelled`, one of images without class folders is read
      unlabelled, class "": a split of a flat folder, an unlabelled test split);
    - an image folder `ROOT/<class>/<image>` (images searched recursively in each class);
    - a CSV index `path,label` with an optional `split` column;
    - with `allow_unlabelled`: also a folder of images without class folders ("flat folder", one
      class "") and a CSV without a label column (dataset-stats, split, predict).

    `classes`: label by these names (a model's classes) instead of the data's own; a class the
    data has that is not among them is an InputError.

    The class-folder rule: a folder whose subfolders hold images is an image folder, and image
    files beside those subfolders are read by no reader of labels (`DataSource.strays`; the
    caller warns, `select.warn_stray_images`); a folder with images only at its top level is
    flat. `every_image` (with `allow_unlabelled`; predict and extract-features, which read no
    labels): such a folder is read whole instead, as a flat folder.

    Partly labelled data (shards, parquet rows, CSV rows of which only some have a label) is
    refused without `allow_unlabelled`, and read all unlabelled with it, with a warning; inside
    `samples.partial_labels_kept` (predict, extract-features, dataset-stats, convert shards)
    its labels are kept, the samples without one of class "".

    The data's own class names are held to what a report can show (`refuse_unshowable_classes`),
    whichever reader gave them.
    """
    source = _open_data(spec, classes, allow_unlabelled, every_image)
    if classes is None:
        refuse_unshowable_classes(source.classes, source.spec)
    return source


def _open_data(
    spec: str | os.PathLike,
    classes: Sequence[str] | None,
    allow_unlabelled: bool,
    every_image: bool,
) -> DataSource:
    text = os.fspath(spec)
    every_image = every_image and allow_unlabelled
    if text == DIGITS:
        return _open_digits(classes)
    from torchkit.core.data.sources.containers import open_container_data

    stored = open_container_data(text, classes, allow_unlabelled, every_image)
    if stored is not None:
        return stored
    path = Path(text)
    if not path.exists():
        raise not_found(text)
    if path.is_file():
        if path.suffix.lower() != ".csv":
            from torchkit.core.data.sources.containers import refuse_a_shard_list

            refuse_a_shard_list(path)
            raise InputError(f"{path} is neither a folder nor a CSV index", GRAMMAR_HINT)
        return _open_csv(path, text, classes, allow_unlabelled)
    if not path.is_dir():
        raise InputError(f"{path} is neither a folder nor a CSV index", GRAMMAR_HINT)
    try:
        return _open_folder(path, text, classes, allow_unlabelled, every_image)
    except NoImagesError as error:
        # A folder of shards is one of only .tar files (and their side files): one beside a
        # folder (old shards in `old/`) is read as an image folder, whose "no images in"
        # would not say why. An image folder with a stray .tar reads as one, as before.
        raise _shards_beside_folders_error(path) or error from None


def _shards_beside_folders_error(path: Path) -> InputError | None:
    """The error for a folder of `.tar` files beside subfolders holding no images, or None
    where it holds no `.tar` file or no subfolder."""
    try:
        with os.scandir(path) as entries:
            listed = [(entry.name, entry.is_dir()) for entry in entries]
    except OSError:
        return None
    tars = sorted(n for n, is_dir in listed if not is_dir and n.lower().endswith(".tar"))
    folders = sorted(n + "/" for n, is_dir in listed if is_dir and not is_skipped_folder(n))
    if not tars or not folders:
        return None

    def shown(names: list[str]) -> str:
        more = f", ... {len(names)} in all" if len(names) > 3 else ""
        return ", ".join(names[:3]) + more

    some = "a folder" if len(folders) == 1 else "folders"
    them = folders[0] if len(folders) == 1 else "them"
    return InputError(
        f"{path} holds .tar shards ({shown(tars)}) beside {some} ({shown(folders)}): a "
        "folder of shards holds no folder, and as an image folder it holds no images",
        f"move {them} out of it to read it as a folder of shards, or name the shards with a "
        f"pattern, {path}/NAME-{{000000..000009}}.tar",
    )


def open_labelled(
    spec: str | os.PathLike, refused: Callable[[DataSource], bool] | None = None
) -> tuple[DataSource, InputError | None]:
    """The data `spec` names, with labels (`open_data`); and, for split data whose unlabelled
    split sits beside labelled ones (HF's test split of label -1, shards without labels), that
    data with the unlabelled split's images of class "" and the error such images are refused
    with (eval scores, and train trains on, the labelled splits). Other unlabelled data is
    refused with that error. `refused(source)`: whether the caller will refuse that split data
    (a split it needs labelled has images without one); its warnings are then not given."""
    said = _Warnings(hold=False)
    log.addFilter(said)
    try:
        return open_data(spec), None
    except InputError as error:
        # The second read's warnings are held: given where its data is read (not those the
        # first read gave already), never before the refusal of data that is not (`Warning:
        # i.csv has 2 row(s) without a label ...: its images are read unlabelled`, then the
        # error that no image is read).
        held = _Warnings(hold=True)
        log.removeFilter(said)
        log.addFilter(held)
        try:
            source = open_data(spec, allow_unlabelled=True)
        except InputError:
            raise error from None
        finally:
            log.removeFilter(held)
        if not source.splits or "" not in source.classes or source.classes == [""]:
            raise error from None
        if refused is not None and refused(source):
            # Its refusal names the split and its images: `its images are read unlabelled`
            # before it said what is not so.
            return source, error
        for record in held.records:
            if record.getMessage() not in said.messages:
                log.handle(record)
        return source, error
    finally:
        log.removeFilter(said)


class _Warnings(logging.Filter):
    """The records a logger is given: their messages noted (`hold=False`), or the records
    kept back from its handlers (`hold=True`), for `open_labelled`."""

    def __init__(self, *, hold: bool) -> None:
        super().__init__()
        self.hold = hold
        self.messages: set[str] = set()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if self.hold:
            self.records.append(record)
            return False
        self.messages.add(record.getMessage())
        return True


def split_without_labels_error(
    source: DataSource, split: str, unlabelled: InputError
) -> InputError:
    """Where labels are needed (train, eval), the error for the split `split` of `source` (of
    `open_labelled`) holding images without a label: naming that split and its first images
    without one as the data has them (of a CSV index, their lines), where `unlabelled`, the
    data's first refusal, may name another split's file (a partly labelled test file where
    val is scored). Its hint is kept."""
    if source.kind == "split csv":
        lines = unlabelled_lines_of_split(read_index_rows(source.spec, labelled=False), split)
        if lines:
            return InputError(
                f"the {split} split of {source.spec} has {len(lines)} row(s) without a label "
                f"(line {', '.join(map(str, lines[:10]))}{', ...' if len(lines) > 10 else ''})",
                unlabelled.hint,
            )
        return unlabelled
    missing = images_without_a_label(source, split) or []
    samples = source.splits[split]
    count = len(missing) or samples.class_counts()[samples.classes.index("")]
    shown = f" ({first_and_more(missing, 3)})" if missing else ""
    return InputError(
        f"the {split} split of {source.spec} has {count} image(s) without a label{shown}",
        unlabelled.hint,
    )


def images_without_a_label(source: DataSource, split: str) -> list[str] | None:
    """The images of `split` that have no label, as the data has them: its readers read a
    split of which only some images have one (shards, parquet files) all unlabelled, whose
    count was no count of them. Read again keeping the labels there are (an error path
    only); None where that read fails."""
    level = log.level
    log.setLevel(logging.ERROR)  # its warnings were given at the first read
    try:
        with partial_labels_kept():
            samples = open_data(source.spec, allow_unlabelled=True).splits[split]
    except (TorchkitError, KeyError):
        return None
    finally:
        log.setLevel(level)
    if "" not in samples.classes:
        return None
    blank = samples.classes.index("")
    return [samples.ids[i] for i, label in enumerate(samples.labels) if label == blank]


def not_found(path: Path | str) -> InputError:
    """The error for data `spec` names that is not there."""
    return unfetched_url_error(os.fspath(path)) or InputError(
        f"dataset not found: {path}", GRAMMAR_HINT
    )


# `pipe:CMD` and `s3://`, `gs://`... (webdataset's other sources), also with the `//` a path
# argument lost (`s3:/bucket`); a scheme of one letter is a Windows drive.
_UNFETCHED = re.compile(r"^(pipe):|^([A-Za-z][A-Za-z0-9+.-]+):/", re.IGNORECASE)


def unfetched_url_error(name: str) -> InputError | None:
    """The error for a missing `name` that is a URL torchkit does not fetch (only http and
    https), or webdataset's `pipe:` command, which was "not found" with a hint about folders
    or shard patterns; None for any other name."""
    found = _UNFETCHED.match(name)
    if found is None or (found.group(2) or "").lower() in ("http", "https", "file"):
        return None
    if found.group(1):
        return InputError(
            f"{name} is a webdataset pipe: command, which torchkit does not run",
            "give the shards' http or https URL, such as "
            "https://HOST/DIR/NAME-{000000..000009}.tar, or copy them to a folder first",
        )
    return InputError(
        f"{name}: torchkit reads files and http(s) URLs, not {found.group(2).lower()}:// URLs",
        "copy the data to a folder first with aws s3 cp, gsutil cp..., or give an https URL to "
        "it, such as a presigned one",
    )


def tagged(samples: Samples, split: str) -> Samples:
    """`samples`, every one of them marked as being in `split`."""
    samples.splits = [split] * len(samples)
    return samples


def concatenate(parts: Sequence[Samples]) -> Samples:
    """One Samples of `parts` (same classes), in order."""
    first = parts[0]
    images = None
    if first.images is not None:
        import numpy as np

        images = np.concatenate([p.images for p in parts])
    with_splits = all(p.splits is not None for p in parts)
    return Samples(
        classes=first.classes,
        labels=[label for p in parts for label in p.labels],
        paths=None if first.paths is None else [x for p in parts for x in p.paths],
        images=images,
        source=first.source,
        ids=[i for p in parts for i in p.ids],
        splits=[s for p in parts for s in p.splits] if with_splits else None,
    )


def relabelled(samples: Samples, classes: Sequence[str], where: str) -> Samples:
    """`samples` labelled by `classes` (matched by name; where the two are one list of names
    but for the unlabelled class "", by place)."""
    classes = list(classes)
    if classes == samples.classes:
        return samples
    by_place = _by_place_but_unlabelled(samples, classes)
    if by_place is not None:
        return dataclasses.replace(samples, classes=classes, labels=by_place)
    index_of = class_index(classes)
    unknown = _unknown_classes(samples, index_of)
    if unknown:
        raise _unknown_classes_error(unknown, where, classes)
    _refuse_names_of_two_outputs(samples, classes, where)
    mapping = [find_class(index_of, name) for name in samples.classes]
    mapping = [-1 if index is None else index for index in mapping]
    return Samples(
        classes=classes,
        labels=[mapping[label] for label in samples.labels],
        paths=samples.paths,
        images=samples.images,
        source=samples.source,
        ids=samples.ids,
        splits=samples.splits,
    )


def _by_place_but_unlabelled(samples: Samples, classes: list[str]) -> list[int] | None:
    """The labels of `samples` in `classes` where the two list the same class names in the same
    order but for the unlabelled class "" (which split data adds to the classes of its labelled
    splits where one split has no labels), None otherwise: the same classes, also those of one
    name (ImageNet's two "crane"s), which matched by name were refused as a guess."""
    if "" not in classes and "" not in samples.classes:
        return None
    named = [i for i, name in enumerate(classes) if name]
    if [classes[i] for i in named] != [name for name in samples.classes if name]:
        return None
    given = iter(named)
    blank = classes.index("") if "" in classes else -1
    mapping = [next(given) if name else blank for name in samples.classes]
    labels = [mapping[label] for label in samples.labels]
    return None if -1 in labels else labels


def _unknown_classes(samples: Samples, known: Mapping[str, int]) -> list[str]:
    """The class names `samples` uses that are not in `known` (a `class_index`), sorted."""
    present = sorted({samples.classes[label] for label in samples.labels})
    return [name for name in present if find_class(known, name) is None]


def _refuse_names_of_two_outputs(samples: Samples, classes: list[str], where: str) -> None:
    """InputError when a class `samples` uses is matched by a name that is two classes: two of
    the model's outputs (torchvision's ImageNet names hold two `crane`s and two `maillot`s),
    whose first alone its images were scored against, or two of the data's own (classes.txt
    beside shards labelled by `KEY.cls`), both scored against the model's one output so named.
    Identical names in the data and the model are never matched (`relabelled`)."""
    outputs = classes_named_alike(classes)
    own = classes_named_alike(samples.classes)
    if not outputs and not own:
        return
    for name in sorted({samples.classes[label] for label in samples.labels}):
        shown = _shown_class(name)
        refuse_a_label_of_two_classes(
            name,
            outputs,
            f"class {shown} of {where}",
            "the model's outputs",
            "pass --classes with one distinct name per output, in the order of the outputs",
        )
        refuse_a_label_of_two_classes(
            name,
            own,
            f"the model's class {shown}",
            f"the classes of {where}",
            "give the model the data's class names in the data's order with --classes, or the "
            "data's classes one distinct name each",
        )


def _unknown_classes_error(unknown: Sequence[str], where: str, classes: list[str]) -> InputError:
    return InputError(
        f"class(es) {', '.join(map(_shown_class, unknown[:5]))} of {where} are not among the "
        f"model's {len(classes)} classes",
        "the classes are: "
        + ", ".join(map(_shown_class, classes[:10]))
        + (" ..." if len(classes) > 10 else ""),
    )


def _shown_class(name: str) -> str:
    """A class name as an error shows it: quoted where spaces around it would be invisible
    (a folder `cat ` against the model's `cat` read "class(es) cat  ... not among: cat")."""
    return repr(name) if not name or name != name.strip() else name


def _union_classes(parts: dict[str, Samples]) -> list[str]:
    """Class names of split data: train's in its order first, then the others' new ones."""
    return _union_of([samples.classes for samples in parts.values()])


def _union_of(class_lists: Sequence[Sequence[str]]) -> list[str]:
    """`_union_classes` of the splits' class names, in split order."""
    names: list[str] = []
    seen: set[str] = set()  # not `in names`: 40,000 classes took seconds per split
    for classes in class_lists:
        # A class spelled in NFC in train/ and in NFD in val/ is one class (`find_class`).
        new = [name for name in classes if nfc(name) not in seen]
        names += new
        seen.update(nfc(name) for name in new)
    return names


def _split_source(
    spec: str, kind: str, root: str, parts: dict[str, Samples], classes: Sequence[str] | None
) -> DataSource:
    names = list(classes) if classes is not None else _union_classes(parts)
    # A class the model lacks is named with every split that has it (all are relabelled here,
    # before one is picked): "of digits (train)" alone misleads a run that reads test.
    known = class_index(names)
    unknown = {name: _unknown_classes(parts[name], known) for name in parts}
    failing = [name for name in SPLIT_NAMES if unknown.get(name)]
    if failing:
        every = sorted({label for name in failing for label in unknown[name]})
        raise _unknown_classes_error(every, f"{spec} ({', '.join(failing)})", names)
    splits = {
        name: tagged(relabelled(parts[name], names, f"{spec} ({name})"), name)
        for name in SPLIT_NAMES
        if name in parts
    }
    return DataSource(spec, kind, root, splits, None, names)


def split_root_source(
    spec: str,
    kind: str,
    root: str,
    parts: dict[str, Samples],
    empty: dict[str, str],
    classes: Sequence[str] | None,
    *,
    flat: bool,
) -> DataSource:
    """The DataSource of a split root's `parts` (unpacked or in a .tar), its `empty` split
    folders (name: as shown) left out; `flat`: every split is images without class folders.
    A split root whose every split folder is empty is an InputError."""
    if not parts:
        shown = ", ".join(name + "/" for name in empty)
        raise NoImagesError(
            f"no images in {spec}: its split folders ({shown}) hold none",
            "a split root holds ROOT/{train,val,test}/<class>/<image>",
        )
    if flat:
        splits = {name: tagged(parts[name], name) for name in parts}
        source = DataSource(spec, kind, root, splits, None, [""])
    else:
        source = _split_source(spec, kind, root, parts, classes)
    source.empty_splits = empty
    return source


def _open_digits(classes: Sequence[str] | None) -> DataSource:
    return _split_source(DIGITS, "digits", "", digits_splits(), classes)


def _open_csv(
    path: Path, spec: str, classes: Sequence[str] | None, allow_unlabelled: bool
) -> DataSource:
    lock_for_reading(path)
    samples = csv_samples(path, classes=classes, allow_unlabelled=allow_unlabelled)
    lock_listed_for_reading(path, samples.paths)
    root = str(index_folder(path, samples.ids))
    if samples.splits is None:
        return DataSource(spec, "csv", root, {}, samples, list(samples.classes))
    parts = {}
    for name in SPLIT_NAMES:
        members = [i for i, split in enumerate(samples.splits) if split == name]
        if members:
            parts[name] = samples.subset(members)
    return DataSource(spec, "split csv", root, parts, None, list(samples.classes))


def csv_samples(
    path: str | os.PathLike,
    *,
    classes: Sequence[str] | None = None,
    allow_unlabelled: bool = False,
) -> Samples:
    """Every row of a CSV index, in file order (`splits` set when it has a split column).
    `allow_unlabelled`: rows without a label are taken, as unlabelled images; where only some
    rows lack one, all (of split data, the splits that hold such rows) are read unlabelled,
    with a warning, as partly labelled shards and parquet files are (inside
    `partial_labels_kept`, the labels there are kept, the rows without one of class "", the
    last)."""
    rows = read_index_rows(path, labelled=not allow_unlabelled)
    source = rows.source
    repeated = repeated_rows_warning(rows)
    if repeated:
        log.warning(repeated)
    if rows.unlabelled_lines and not partial_labels_are_kept():
        _read_unlabelled(rows)
    if rows.labels is None:  # unlabelled images
        names, labels = [""], [0] * len(rows.paths)
    else:
        given_labels, given_splits = rows.labels, rows.splits
        if rows.unlabelled_lines:  # partly labelled, kept: the classes of the labelled rows
            given = [i for i, label in enumerate(rows.labels) if label]
            given_labels = [rows.labels[i] for i in given]
            given_splits = None if rows.splits is None else [rows.splits[i] for i in given]
        present = class_order(given_labels, given_splits, where=str(source))
        names = list(classes) if classes is not None else present
        index_of = class_index(names)
        # every spelling (a val label in NFD is train's NFC class: `class_order`)
        found = {name: find_class(index_of, name) for name in dict.fromkeys(present + given_labels)}
        unknown = [name for name in found if found[name] is None]
        if unknown:
            raise InputError(
                f"label(s) {', '.join(unknown[:5])} in {source} are not known classes",
                "the classes are: " + ", ".join(names[:10]) + (" ..." if len(names) > 10 else ""),
            )
        if rows.unlabelled_lines:
            names, labels = with_unlabelled_class(
                names, [found[label] if label else None for label in rows.labels]
            )
        else:
            labels = [found[label] for label in rows.labels]
    return Samples(
        classes=names,
        labels=labels,
        paths=absolute_paths(rows),
        source=str(source),
        ids=list(rows.paths),
        splits=rows.splits,
    )


def _read_unlabelled(rows: IndexRows) -> None:
    """Partly labelled rows read unlabelled, with a warning, as shards and parquet files are:
    all of them, or of split data the splits that hold rows without a label (an unlabelled
    test split leaves train and val labelled, which train trains on)."""
    assert rows.labels is not None
    labels, splits = rows.labels, rows.splits
    pairs = [] if splits is None else list(zip(splits, labels, strict=True))
    missing = {split for split, label in pairs if not label}
    if splits is None or missing >= set(splits):
        log.warning(unlabelled_rows_warning(rows))
        rows.labels = None
        return
    log.warning(unlabelled_rows_warning(rows, [s for s in SPLIT_NAMES if s in missing]))
    rows.labels = ["" if split in missing else label for split, label in pairs]


def _subfolders(path: Path) -> tuple[list[str], list[str]]:
    """(visible subfolder names, the image files directly in `path`: both sorted names)."""
    folders, images, _ = _listing(path)
    return folders, images


def _listing(path: Path) -> tuple[list[str], list[str], list[str]]:
    """`_subfolders`, and the `.tar` files directly in `path` (sorted names), from one
    listing."""
    try:
        entries = list(path.iterdir())
    except OSError as error:
        raise InputError(f"cannot list {path}: {error.strerror or error}") from None
    folders = sorted(p.name for p in entries if not is_skipped_folder(p.name) and p.is_dir())
    images = sorted(
        p.name for p in entries if is_image_file(p) and not is_apple_double(p.name) and p.is_file()
    )
    archives = sorted(p.name for p in entries if p.name.lower().endswith(".tar") and p.is_file())
    return folders, images, archives


def _class_folder_samples(
    folder: Path, classes: Sequence[str] | None = None, within: Path | None = None
) -> tuple[Samples, list[tuple[str, Numbered]]] | None:
    """`folder` read as an image folder where its subfolders hold images (the class-folder
    rule), with its files numbered by class (`numbered_image_folder`), None where they hold
    none."""
    try:
        return numbered_image_folder(folder, classes=classes, within=within)
    except NoImagesError:
        return None


def _open_folder(
    path: Path,
    spec: str,
    classes: Sequence[str] | None,
    allow_unlabelled: bool,
    every_image: bool = False,
) -> DataSource:
    if unfinished_split(path):
        from torchkit.core.io.folder_locks import held_exclusively
        from torchkit.core.io.output_locks import lock_path

        if held_exclusively(lock_path(path)):  # the split writing it runs now: not stopped
            raise InputError(
                f"{path} is an unfinished split: a torchkit split is writing it now",
                "wait for it to finish",
            )
        raise InputError(
            f"{path} is an unfinished split (a torchkit split was stopped while writing it)",
            "run the split command again",
        )
    lock_for_reading(path)
    folders, top_images, archives = _listing(path)
    source = _open_listed(path, spec, classes, allow_unlabelled, every_image, folders, top_images)
    _refuse_shards_beside_images(path, archives, [f"{name}/" for name in folders] + top_images)
    # Other .tar files beside class or split folders (`backup.tar`) are not read: the caller
    # warns (`select.warn_stray_images`), where they were left out without a word.
    if archives:
        source.unread_archives[str(path)] = archives
    return source


def _refuse_shards_beside_images(path: Path, archives: list[str], images: list[str]) -> None:
    """InputError where a folder that reads as images (`images`: its subfolders and image
    files) also holds `.tar` files named as shards are (`NAME-NNNNNN.tar`): a folder of shards
    with a subfolder of images in it (`previews/`) was read as an image folder of one class,
    the shards left out with a warning alone, and which of the two is the data is a guess. A
    `.tar` named otherwise (`backup.tar`) beside class folders is a stray archive."""
    from torchkit.core.data.sources.containers import is_numbered_shard_name

    shards = [name for name in archives if is_numbered_shard_name(name)]
    if not shards:
        return
    raise InputError(
        f"{path} holds WebDataset shards ({first_and_more(shards, 3)}) and images "
        f"({first_and_more(images, 3)}): which of them is the data is a guess",
        f"name the shards, {shell_word(_shards_pattern(path, shards))}, or move the images "
        f"or the .tar files out of {path}",
    )


def _shards_pattern(path: Path, shards: list[str]) -> str:
    """A brace pattern naming `shards` (`D/shard-{000000..000002}.tar`) where they are one
    name numbered without a gap, else the general form, `D/NAME-{000000..000009}.tar`. A hint
    writes it as one shell word (quoted): pasted bare, a shell expands the braces into a word
    a shard, and the command took the second for an extra argument."""
    from torchkit.core.data.sources.containers import numbered_shard_parts

    # A `.TAR` spelled otherwise gets the general form, as the brace pattern ends in `.tar`.
    found = [numbered_shard_parts(name) if name.endswith(".tar") else None for name in shards]
    if all(found):
        names = {stem for stem, _ in found}
        widths = {len(digits) for _, digits in found}
        numbers = sorted(int(digits) for _, digits in found)
        if len(names) == 1 and len(widths) == 1 and numbers[-1] - numbers[0] == len(numbers) - 1:
            if len(shards) == 1:
                return os.path.join(path, shards[0])
            width = widths.pop()
            first, last = f"{numbers[0]:0{width}d}", f"{numbers[-1]:0{width}d}"
            return os.path.join(path, f"{names.pop()}-{{{first}..{last}}}.tar")
    return os.path.join(path, "NAME-{000000..000009}.tar")


def _open_listed(
    path: Path,
    spec: str,
    classes: Sequence[str] | None,
    allow_unlabelled: bool,
    every_image: bool,
    folders: list[str],
    top_images: list[str],
) -> DataSource:
    """`_open_folder` of the folder `path`, locked for reading, whose listing is given."""
    root = str(path)
    lock_subfolders_for_reading(path, folders)
    _refuse_renamed_split(path, folders)
    refuse_other_split_names(
        str(path),
        folders,
        lambda name: _listed(path / name),
        lambda name: str(path / name),
    )
    split_folders = [name for name in SPLIT_NAMES if name in folders]
    if split_folders:
        others = [name for name in folders if name not in SPLIT_NAMES]
        if others:
            raise InputError(
                f"{path} mixes split folders ({', '.join(n + '/' for n in split_folders)}) "
                f"with other folders ({', '.join(n + '/' for n in others[:3])})",
                "a split root holds only train/, val/ and test/; an image folder only class "
                "folders",
            )
        if top_images:
            raise InputError(
                f"{path} holds image files beside its split folders "
                f"({', '.join(n + '/' for n in split_folders)})",
                "move them into a split's class folders, or elsewhere",
            )
        return _open_split_root(path, spec, split_folders, classes, allow_unlabelled, every_image)
    no_images: NoImagesError | None = None
    if folders and not (every_image and top_images):
        try:
            found = numbered_image_folder(path, classes=classes)
        except NoImagesError as error:  # the same error read again below: warned of once
            found, no_images = None, error
        if found is not None:
            samples = found[0]
            source = DataSource(spec, "image folder", root, {}, samples, list(samples.classes))
            if top_images:
                source.strays[root] = top_images
            return source
    if allow_unlabelled and (top_images or not folders):
        if not (every_image and top_images and folders and classes is None):
            samples = discover_flat_folder(path)
            return DataSource(spec, "flat folder", root, {}, samples, list(samples.classes))
        # Read whole, images beside class folders: what a reader of labels reads, from the
        # same listing (predict names a model's outputs by it, as eval does).
        samples, labelled = flat_folder_and_class_folders(path, folders)
        source = DataSource(spec, "flat folder", root, {}, samples, list(samples.classes))
        if labelled is not None:
            source.labelled_classes = _showable_or_none(labelled, spec)
        return source
    if top_images and folders:  # subfolders without images beside images: unlabelled
        raise no_class_folders_error(str(path), beside_empty_ones=True)
    # Class folders without images, or no folder: its error. (Listing them again repeated
    # the warning of the folders that cannot be listed.)
    if no_images is not None:
        raise no_images
    samples = discover_image_folder(path, classes=classes)
    return DataSource(spec, "image folder", root, {}, samples, list(samples.classes))


def _showable_or_none(classes: list[str], spec: str) -> list[str]:
    """`classes`, or [""] where `open_data` refuses them (`refuse_unshowable_classes`)."""
    try:
        refuse_unshowable_classes(classes, spec)
    except TorchkitError:
        return [""]
    return classes


def _listed(folder: Path) -> tuple[list[str], bool]:
    """(visible subfolder names, whether images lie directly in `folder`)."""
    folders, images = _subfolders(folder)
    return folders, bool(images)


def _open_split_root(
    path: Path,
    spec: str,
    split_folders: list[str],
    classes: Sequence[str] | None,
    allow_unlabelled: bool,
    every_image: bool,
) -> DataSource:
    """The split root `path` of `split_folders`: each an image folder, or images without class
    folders (read unlabelled), by the class-folder rule of `open_data`."""
    root = str(path)
    warn_dead_links(dead_links(path), path)  # a split folder linked to a disk not mounted
    listed = {name: _subfolders(path / name) for name in split_folders}
    # split folders read to tell their layout, with their files numbered by class
    read: dict[str, tuple[Samples, list[tuple[str, Numbered]]]] = {}
    unlabelled = []  # split folders of images without class folders holding any
    for name in split_folders:
        folders, images = listed[name]
        if not images:
            continue
        if folders and not every_image:
            found = _class_folder_samples(path / name, within=path)
            if found is not None:
                read[name] = found
                continue
        unlabelled.append(name)
    # An empty split folder (no class folder, no image) says nothing of the layout.
    laid_out = [name for name in split_folders if any(listed[name])]
    # A split of a flat folder (`split` writes OUT/train/x.png): unlabelled split data.
    flat = bool(laid_out) and all(name in unlabelled for name in laid_out)
    # A split folder of images without class folders beside labelled ones: an unlabelled
    # test split (HF's label -1), read unlabelled where unlabelled images are taken, as
    # parquet and shards read theirs (`open_labelled`).
    if unlabelled and not allow_unlabelled:
        raise unlabelled_split_error(root, [str(path / name) for name in unlabelled], whole=flat)
    parts, empty, strays = {}, {}, {}
    numbered: list[tuple[tuple[str | None, str], Numbered]] = []  # by (split, class)
    # The split folders read whole (images beside class folders), each's images by class
    # folder, as a reader of labels finds them (None: not known, linked folders met).
    whole: dict[str, dict[str, Numbered] | None] = {}
    for name in split_folders:
        try:
            if name in read:
                samples, by_class = read[name]
            elif name in unlabelled and listed[name][0] and every_image and classes is None:
                samples, files, whole[name] = numbered_flat_folder_by_class(
                    path / name, listed[name][0], within=path
                )
                by_class = [("", files)]
            elif name in unlabelled:
                samples, files = numbered_flat_folder(path / name, within=path)
                by_class = [("", files)]
            else:
                samples, by_class = numbered_image_folder(path / name, within=path)
        except NoImagesError:
            empty[name] = str(path / name)
            continue
        if name in read:
            strays[str(path / name)] = listed[name][1]
        samples.ids = relative_ids(samples.paths, path)
        samples.source = root
        parts[name] = samples
        numbered += [((name, label), files) for label, files in by_class]
    # One file in two splits (`test/cat -> ../train/cat`, a hard link): it would leak.
    refuse_one_file_in_two_places(numbered, path)
    source = split_root_source(spec, "split root", root, parts, empty, classes, flat=flat)
    source.strays = strays
    if every_image and classes is None:
        source.labelled_classes = _split_root_labelled_classes(
            path, source.classes, parts, numbered, whole
        )
    return source


def _split_root_labelled_classes(
    path: Path,
    read: list[str],
    parts: dict[str, Samples],
    numbered: list[tuple[tuple[str | None, str], Numbered]],
    whole: dict[str, dict[str, Numbered] | None],
) -> list[str] | None:
    """`DataSource.labelled_classes` of the split root `path` read with `every_image` by
    `_open_split_root` (its classes `read`, its `parts`, their images `numbered` by (split,
    class), and the split folders read `whole`, each's images by class folder): the classes
    it reads the split root by without `every_image`, from the same listing; None where a
    split read whole met linked folders."""
    if any(by_class is None for by_class in whole.values()):
        return None  # a reader of labels lists them otherwise
    labelled = {
        name: by_class
        for name, by_class in whole.items()
        if by_class is not None and any(paths for paths, _ in by_class.values())
    }
    if not labelled:  # no split read whole, or none of their class folders holds an image
        return list(read)
    try:
        listed = [place for place in numbered if place[0][0] not in labelled]
        for name, by_class in labelled.items():
            refuse_spelling_twins(list(by_class), f"class folders in {path / name}:")
            listed += [((name, label), files) for label, files in by_class.items()]
        refuse_one_file_in_two_places(listed, path)
        names = _union_of(
            [list(labelled[name]) if name in labelled else parts[name].classes for name in parts]
        )
        refuse_unshowable_classes(names, str(path))
    except TorchkitError:
        return [""]
    return names


def unlabelled_split_error(root: str, unlabelled: Sequence[str], *, whole: bool) -> InputError:
    """The error for a split root's split folders of images without class folders (`unlabelled`,
    as shown), where labels are needed: `whole` when every split is such a folder."""
    hint = (
        "labels need class folders, ROOT/{train,val,test}/<class>/<image>; predict, "
        "extract-features and dataset-stats read it unlabelled"
    )
    if whole:
        return InputError(
            f"{root} is a split of unlabelled images: its split folders hold images without "
            "class folders",
            hint,
        )
    verb = "holds" if len(unlabelled) == 1 else "hold"
    return InputError(f"{' and '.join(unlabelled)} {verb} images but no class folders", hint)


def _refuse_renamed_split(path: Path, folders: Sequence[str]) -> None:
    """A split that `torchkit split --names` wrote with other split folders than train, val and
    test (OUT/tr, OUT/va): read as an image folder they would be three classes, and a model
    trained on them would learn which split an image is in."""
    if all(name in SPLIT_NAMES for name in folders) or marker_command(path) != "split":
        return
    written = written_split_names(path) - set(SPLIT_NAMES)
    renamed = [name for name in folders if name in written]
    if renamed:
        shown = ", ".join(name + "/" for name in renamed)
        raise InputError(
            f"{path} is a split into {shown} (split --names): torchkit reads only train/, val/ "
            "and test/ as splits, and would take these for classes",
            "rename them train, val and test, or split again without --names; or read one as "
            f"an image folder: {path / renamed[0]}",
        )


# Split folders as other tools name them (Roboflow's valid/, Keras' validation/, Fruits-360's
# Training/ and Test/), casefolded: read as an image folder they would be classes.
SPLIT_LIKE_NAMES = frozenset(
    {"train", "training", "val", "valid", "validation", "dev", "test", "testing"}
)


def refuse_other_split_names(
    root: str,
    folders: Sequence[str],
    listed: Callable[[str], tuple[Sequence[str], bool]],
    readable: Callable[[str], str] | None = None,
) -> None:
    """Folders of `root` (a folder, or a .tar of one) that are all splits under other names than
    train, val and test: beside one of those (`train/` and `valid/`), or each holding class
    folders and no image of its own (`Training/cat/`, `Test/cat/`), where they would silently
    be classes, and a model trained on them would learn which split an image is in.
    `listed(name)`: (the folders in `name`, whether images lie directly in it); `readable(name)`:
    the --data that reads folder `name` as an image folder (None: none, a tar's member)."""
    if not folders or any(name.casefold() not in SPLIT_LIKE_NAMES for name in folders):
        return
    if all(name in SPLIT_NAMES for name in folders):
        return
    if not any(name in SPLIT_NAMES for name in folders):
        for name in folders:
            classes, images = listed(name)
            if images or not classes:
                return  # images of their own: classes that happen to be named so
    shown = ", ".join(name + "/" for name in folders)
    trained = next((name for name in folders if name.casefold() in ("train", "training")), None)
    hint = "rename them train, val and test"
    if readable is not None:
        hint += f", or read one as an image folder: {readable(trained or folders[0])}"
    raise InputError(
        f"{root} holds {shown}: splits under other names than train/, val/ and test/, the "
        "only ones torchkit reads as splits (it would take them for classes)",
        hint,
    )


def non_image_files(source: DataSource, splits: Sequence[str] | None = None) -> list[str]:
    """The files in the folders `source` reads that are not images (hidden ones aside),
    relative to its root: in the `splits` folders of a split root (all of it with None), also
    of a `.tar` of one (from its listing); none for a CSV index or digits."""
    if source.tar_non_images is not None:
        if source.kind != "tar split root" or splits is None:
            return list(source.tar_non_images)
        inside = tuple(f"{name}/" for name in SPLIT_NAMES if name in splits)
        return [path for path in source.tar_non_images if path.startswith(inside)]
    if source.kind not in ("image folder", "flat folder", "split root"):
        return []
    root = Path(source.root)
    if source.kind != "split root" or splits is None:
        return list_non_image_files(root)
    found: list[str] = []
    for name in SPLIT_NAMES:
        if name in splits:
            found += [f"{name}{os.sep}{p}" for p in list_non_image_files(root / name, within=root)]
    return found
