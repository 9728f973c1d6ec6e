"""Image files on disk: which names are images, a fast recursive scan, and the two folder layouts
read as samples (`ROOT/<class>/<image>`, and a flat folder of images without classes)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from torchkit.core.data.sources.moving import MOVING, refuse_moved_inside
from torchkit.core.data.sources.samples import (
    Samples,
    class_index,
    find_class,
    nfc,
    refuse_spelling_twins,
)
from torchkit.core.io.errors import FS_ENCODING_HINT, InputError, first_and_more
from torchkit.core.io.files import tree_entries
from torchkit.core.io.folder_contents import is_apple_double

log = logging.getLogger("torchkit")

IMAGE_EXTENSIONS = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm", ".jfif"}
)


class NoImagesError(InputError):
    """A folder that holds no image (no class folders and no images, or class folders without
    images): a split root reads such a split folder as no split, not as a refusal."""


def no_images_error(where: str) -> NoImagesError:
    return NoImagesError(
        f"no images in {where}", "supported: " + ", ".join(sorted(IMAGE_EXTENSIONS))
    )


CLASS_FOLDERS_HINT = "arrange it as ROOT/<class>/<image>"


def no_class_folders_error(where: str, *, beside_empty_ones: bool = False) -> InputError:
    """Images in `where` (a folder, or one in a .tar), where labels are needed, but no class
    folders (`beside_empty_ones`: subfolders, none holding an image)."""
    holding = " holding any" if beside_empty_ones else ""
    return InputError(f"{where} holds images but no class folders{holding}", CLASS_FOLDERS_HINT)


def is_image_file(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def is_skipped_folder(name: str) -> bool:
    """A folder that is never a class or a split: a hidden one, or `__MACOSX` (the AppleDouble
    files macOS's Finder adds to a zip archive; torchvision's ImageFolder takes it for a class)."""
    return name.startswith(".") or name == "__MACOSX"


def is_folder_name(name: str) -> bool:
    """A name that can be one folder on this system: not empty, `.` or `..`, no separator or NUL,
    encodable, at most 255 bytes."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        return False
    try:
        return len(os.fsencode(name)) <= 255
    except UnicodeError:
        return False


def class_folder_problem(name: str) -> str | None:
    """Why `name` cannot be the folder of a class that image-folder readers see (None when it
    can): for the commands that write class folders (convert cifar, split of a CSV index)."""
    try:
        os.fsencode(name)
    except UnicodeError:  # an accent where the encoding is ascii (LC_ALL=C, PYTHONUTF8=0)
        encoding = sys.getfilesystemencoding()
        return f"not in this Python's file system encoding, {encoding}; {FS_ENCODING_HINT}"
    if not name.strip() or not is_folder_name(name):
        return (
            "a class folder must be one folder name: not blank, '.' or '..', without / \\ or "
            "NUL, at most 255 bytes"
        )
    if is_skipped_folder(name):
        return "image-folder readers skip hidden folders and __MACOSX: the class would vanish"
    return None


# Image paths, and the inode number of the file each names (in the same order).
Numbered = tuple[list[str], list[int]]


@dataclass
class FolderListing:
    """What one listing of folders found: per folder listed (`tops`, in order) its image files
    and its image names that are no file to read (`dangling`: links to nothing, to no file,
    round a loop, or through a file, `a.png/`; a FIFO, socket or device, or a link to one); in
    all of them the other files (hidden ones aside), the symbolic links to folders entered
    and left unentered, and the other links to nothing (`dead`: a linked folder whose disk is
    not mounted, `more -> /mnt/nas/more`; hidden ones aside). Paths are spelled from the
    folder given, through the links entered (`ROOT/cat/more/x.png`), sorted. `numbered`: per
    folder listed, its image files as listed (unsorted) and each one's inode number (a link's:
    its target's), for `refuse_one_file_in_two_places`. `unlistable`: the folders that could
    not be listed (permission denied), with the error, sorted: their files are not read.
    `special`: the FIFOs, sockets and devices (or links to one) not named like images, hidden
    ones aside, sorted (no reader of images reads them; `convert tensor` names a `.npy` one)."""

    images: list[list[str]]
    numbered: list[Numbered]
    dangling: list[list[str]]
    others: list[str]
    entered: list[str]
    unentered: list[str]
    dead: list[str]
    unlistable: list[tuple[str, OSError]] = field(default_factory=list)
    special: list[str] = field(default_factory=list)


def list_folders(
    tops: Sequence[str | os.PathLike],
    *,
    within: str | os.PathLike | None = None,
    links_only: bool = False,
) -> FolderListing:
    """The files under each of `tops`, recursively, as torchvision's `ImageFolder` walks a class
    folder (`os.walk(followlinks=True)`: linked files and folders are read), AppleDouble files
    (`._NAME`) left out and folders that cannot be listed passed over (`unlistable`). A
    linked folder is entered unless its real path lies in, or holds, a folder read already
    (`within`, one of `tops`, or a linked folder entered before it): a link back into the
    data (`cat/loop -> ..`) would read files twice, or forever. Linked folders are entered
    after the plain folders, the nearer and then the first by name first, so which path a file
    is read at does not depend on the order the system lists a folder in. One `os.scandir` a
    folder; one `realpath` a link. `links_only`: only the links are looked at (for
    `entered`), in half the time. A folder under `tops` that a move has half emptied (its
    record met) is an InputError (`moving.refuse_moved_inside`)."""
    read: set[str] = set()  # real paths of the folders read
    holding: set[str] = set()  # the folders above them

    def mark(real: str) -> None:
        read.add(real)
        parent = os.path.dirname(real)
        while parent not in holding and parent != real:
            holding.add(parent)
            real, parent = parent, os.path.dirname(parent)

    def read_already(real: str) -> bool:
        if real in holding:
            return True
        while real not in read:
            parent = os.path.dirname(real)
            if parent == real:
                return False
            real = parent
        return True

    for fence in ([within] if within is not None else []) + list(tops):
        mark(os.path.realpath(fence))
    images: list[list[str]] = [[] for _ in tops]
    inodes: list[list[int]] = [[] for _ in tops]
    dangling: list[list[str]] = [[] for _ in tops]
    others: list[str] = []
    entered: list[str] = []
    unentered: list[str] = []
    dead: list[str] = []
    unlistable: list[tuple[str, OSError]] = []
    special_files: list[str] = []
    pending = [(str(Path(top)), n) for n, top in enumerate(tops)]
    # The data's own record is its reader's to look at (`lock_for_reading`); those of folders
    # in it are looked at here, where the listing meets them.
    own = {folder for folder, _ in pending} if within is None else set()
    while pending:
        links: list[tuple[int, str, int]] = []  # (depth, path, top) of the linked folders met
        for folder, top in pending:
            for path, entry in tree_entries(folder, unlistable=unlistable):
                name = entry.name
                if is_apple_double(name):
                    continue
                if name == MOVING and (os.path.dirname(path) or ".") not in own:
                    refuse_moved_inside(os.path.dirname(path))  # a move emptied part of it
                try:
                    if links_only and not entry.is_symlink():
                        continue
                    try:
                        is_file = entry.is_file()
                    except OSError:
                        # A link round a loop, or through a file (`x.png -> a.png/`): a link
                        # to nothing, as one to a missing file is (it was passed over unsaid)
                        if not entry.is_symlink():
                            raise
                        is_file = False
                    special = not is_file and not entry.is_symlink()
                except OSError:  # vanished while listing
                    continue
                dot = name.rfind(".")  # Path.suffix's rule, without making a Path
                image = 0 < dot < len(name) - 1 and name[dot:].lower() in IMAGE_EXTENSIONS
                if special:
                    # A FIFO, socket or device named like an image: an image that cannot be
                    # read (never opened: opening a FIFO blocks), as a link to nothing is.
                    if image:
                        dangling[top].append(path)
                    elif not name.startswith("."):
                        special_files.append(path)
                elif not is_file:  # a link to a folder, a FIFO... or to nothing
                    if not os.path.exists(path):
                        if image:
                            dangling[top].append(path)
                        elif not name.startswith("."):
                            dead.append(path)
                    elif os.path.isdir(path):
                        links.append((path.count(os.sep), path, top))
                    elif image:  # a link to a FIFO, a socket or a device
                        dangling[top].append(path)
                    elif not name.startswith("."):
                        special_files.append(path)
                elif image:
                    # What finds one file under two names (`refuse_one_file_in_two_places`),
                    # without a stat of its own: a plain file's inode number is in the
                    # listing; a link's is its target's, from the stat `is_file` made of it.
                    try:
                        number = entry.stat().st_ino if entry.is_symlink() else entry.inode()
                    except OSError:  # vanished while listing
                        continue
                    images[top].append(path)
                    inodes[top].append(number)
                elif not name.startswith("."):
                    others.append(path)
        pending = []
        for _, path, top in sorted(links):
            real = os.path.realpath(path)
            if read_already(real):
                unentered.append(path)
            else:
                mark(real)
                entered.append(path)
                pending.append((path, top))
    return FolderListing(
        [sorted(found) for found in images],
        list(zip(images, inodes, strict=True)),
        [sorted(found) for found in dangling],
        sorted(others),
        sorted(entered),
        sorted(unentered),
        sorted(dead),
        sorted(unlistable, key=lambda found: found[0]),
        sorted(special_files),
    )


def list_non_image_files(
    folder: str | os.PathLike, *, within: str | os.PathLike | None = None
) -> list[str]:
    """Files under `folder` that image datasets leave out (not hidden ones such as .DS_Store),
    relative to `folder`, sorted."""
    return relative_ids(list_folders([folder], within=within).others, folder)


def list_left_out(folder: str | os.PathLike) -> tuple[list[str], list[str]]:
    """(files that are not images, hidden ones aside; names of images that are no file to
    read: symbolic links that point nowhere, FIFOs, sockets, devices) under `folder`, relative
    to it, sorted, in one listing: what `split` leaves out (the readers list such a name as an
    image, unreadable when read, as torchvision's ImageFolder lists a link to nothing; it
    cannot be copied or linked to)."""
    listing = list_folders([folder])
    return relative_ids(listing.others, folder), relative_ids(listing.dangling[0], folder)


def warn_unentered(unentered: Sequence[str], folder: str | os.PathLike) -> None:
    """The one warning naming the linked folders a listing of `folder` did not enter."""
    if unentered:
        shown = relative_ids(unentered[:3], folder)
        log.warning(
            f"{len(unentered)} linked folder(s) in {folder} not entered: each leads back into "
            f"the data, above it, or to a folder read already: {', '.join(shown)}"
            + (" ..." if len(unentered) > 3 else "")
        )


def dead_links(folder: str | os.PathLike) -> list[str]:
    """The symbolic links directly in `folder`, hidden ones and those named like images aside,
    that point nowhere (a class or split folder linked to a disk not mounted), sorted paths."""
    try:
        with os.scandir(folder) as entries:
            links = [entry.path for entry in entries if entry.is_symlink()]
    except OSError:  # unreadable: its reader says so
        return []
    return sorted(
        path
        for path in links
        if not os.path.basename(path).startswith(".")
        and not is_image_file(path)
        and not os.path.exists(path)
    )


# The folders `warn_unlistable` warned of, gathered for a command whose job is to write every
# file out (convert shards): it fails once the rest is written (`collecting_unlisted`).
_UNLISTED: ContextVar[list[str] | None] = ContextVar("unlisted_folders", default=None)


@contextmanager
def collecting_unlisted() -> Iterator[list[str]]:
    """Within it, each folder `warn_unlistable` warns of (its path as listed) is added to the
    list it gives: the data a reader left out, which a command that exits 0 would let
    `cmd src dst && rm -r src` delete."""
    with _gathering(_UNLISTED) as unlisted:
        yield unlisted


# The members of a tar named with a `..` part (which tar -x does not unpack) that a reader
# left out with a warning, gathered as `_UNLISTED` is (`collecting_not_unpacked`).
_NOT_UNPACKED: ContextVar[list[str] | None] = ContextVar("not_unpacked", default=None)


@contextmanager
def collecting_not_unpacked() -> Iterator[list[str]]:
    """Within it, each tar member `note_not_unpacked` is told of is added to the list it
    gives: the data a command that writes every file out (convert shards) fails on once the
    rest is written, as GNU tar -x exits 2 on such members."""
    with _gathering(_NOT_UNPACKED) as found:
        yield found


@contextmanager
def _gathering(gathered: ContextVar[list[str] | None]) -> Iterator[list[str]]:
    """Within it, `_gather(gathered, ...)` adds to the list it gives."""
    items: list[str] = []
    token = gathered.set(items)
    try:
        yield items
    finally:
        gathered.reset(token)


def _gather(gathered: ContextVar[list[str] | None], items: Iterable[str]) -> None:
    """`items` added, each once and in order, to the list a `_gathering` of `gathered` gives,
    if one is open."""
    into = gathered.get()
    if into is not None:
        known = set(into)
        for item in items:
            if item not in known:
                known.add(item)
                into.append(item)


def note_not_unpacked(spec: str, names: Sequence[str]) -> None:
    """Record the members of `spec` left out for a `..` in their names; with `--strict`
    (`strict_reading`) an InputError naming the first, before anything is written."""
    if not names:
        return
    from torchkit.core.data.strict_reading import strict_reading, strict_turn_off

    if strict_reading():
        raise InputError(
            f"{spec}: member {names[0]} has '..' in its path, which tar -x does not unpack",
            f"{strict_turn_off()} to read the data without it",
        )
    _gather(_NOT_UNPACKED, names)


def place_in_source(path: str, root: str | os.PathLike) -> str:
    """A folder of the source by its place in it (as reports and manifests list images), else
    as given."""
    try:
        return Path(path).relative_to(root).as_posix()
    except ValueError:
        return path


def warn_unlistable(
    unlistable: Sequence[tuple[str, OSError]],
    folder: str | os.PathLike,
    *,
    files: str = "images",
    strict_option: bool = True,
) -> None:
    """The one warning naming the folders in `folder` that could not be listed (permission
    denied on a subfolder), whose images (`files`) were left out without a word; with
    `--strict` (`strict_reading`) an InputError naming the first, as an unreadable image is.
    `strict_option`: whether the command has a --strict that the warning may point to."""
    if not unlistable:
        return
    from torchkit.core.data.strict_reading import strict_reading, strict_turn_off

    names = relative_ids([path for path, _ in unlistable], folder)
    reasons = [listing_error(error) for _, error in unlistable]
    if strict_reading():
        raise InputError(
            f"cannot list folder {unlistable[0][0]}: {reasons[0]}",
            f"make it readable, or {strict_turn_off()} to read the data without its images",
        )
    _gather(_UNLISTED, (path for path, _ in unlistable))
    shown = ", ".join(
        f"{name} ({reason})" for name, reason in zip(names[:3], reasons[:3], strict=True)
    )
    log.warning(
        f"{len(unlistable)} folder(s) in {folder} cannot be listed, their {files} not read: "
        + shown
        + (f" and {len(unlistable) - 3} more" if len(unlistable) > 3 else "")
        + (
            " (make them readable, or --strict makes this an error)"
            if strict_option
            else " (make them readable)"
        )
    )


def listing_error(error: OSError) -> str:
    """Why a folder could not be listed, in the words its warning and error give."""
    if isinstance(error, PermissionError):
        return "permission denied"
    return error.strerror or str(error)


def warn_dead_links(dead: Sequence[str], folder: str | os.PathLike) -> None:
    """The one warning naming the links in `folder` (not named like images: those are
    unreadable images) that point nowhere, passed over where they were left out unsaid: a
    class folder linked to a disk not mounted would be a class missing without a word."""
    if not dead:
        return
    shown = []
    for path, name in zip(dead[:3], relative_ids(dead[:3], folder), strict=True):
        try:
            shown.append(f"{name} -> {os.readlink(path)}")
        except OSError:  # gone meanwhile
            shown.append(name)
    log.warning(
        f"{len(dead)} symbolic link(s) in {folder} point nowhere and are not read: "
        + ", ".join(shown)
        + (f" and {len(dead) - 3} more" if len(dead) > 3 else "")
        + " (a folder linked to a disk not mounted leaves its images out, a class folder its "
        "class: mount it, or remove the link)"
    )


def relative_ids(paths: Sequence[str], folder: str | os.PathLike) -> list[str]:
    """`os.path.relpath(p, folder)` for paths under `folder`, by slicing where that is exact."""
    base = str(Path(folder))
    prefix = base + os.sep
    if base == ".":
        return [os.path.relpath(p, base) for p in paths]
    return [p[len(prefix) :] if p.startswith(prefix) else os.path.relpath(p, base) for p in paths]


# The files a reader reaches under names in two splits, where they are reported, not refused
# (`files_in_two_splits_reported`); None: they are refused.
_IN_TWO_SPLITS: ContextVar[list[tuple[str, ...]] | None] = ContextVar(
    "files_in_two_splits", default=None
)


@contextmanager
def files_in_two_splits_reported() -> Iterator[list[tuple[str, ...]]]:
    """Within it, an image file that the data's splits reach under names in two splits (a link
    across splits) is read under each name, its names (`Samples.ids`, relative to the data's
    root) added to the list it gives, one tuple a file, instead of being refused: for the
    leakage report of dataset-stats, whose job is to find such files. One file in two classes
    of one split is refused still. Other readers (train, eval, split) refuse it."""
    found: list[tuple[str, ...]] = []
    token = _IN_TWO_SPLITS.set(found)
    try:
        yield found
    finally:
        _IN_TWO_SPLITS.reset(token)


def reported_files_in_two_splits() -> list[tuple[str, ...]] | None:
    """The list `files_in_two_splits_reported` gives, inside it; None outside (refused)."""
    return _IN_TWO_SPLITS.get()


def refuse_one_file_in_two_places(
    listed: Sequence[tuple[tuple[str | None, str], Numbered]],
    root: str | os.PathLike,
    *,
    archive_links: Mapping[str, str | None] | None = None,
) -> None:
    """The one rule for a file that folder listings reach under two names (a symbolic link to
    it, a hard link, a linked class folder): in one class of one split it is read under each,
    as copies of it would be (split --oversample --mode symlink|hardlink writes its repeats
    so); in two classes (its label a guess) or two splits (it leaks from one into the other)
    an InputError names the first two such paths and the link that leads there. `listed`: per
    place, a (split or None, class) pair, its image paths under `root` and their inode numbers
    (`FolderListing.numbered`). Linear, in set operations: only names that share a number
    across places are looked at, and stat-ed: they are one file where their (st_dev, st_ino)
    agree (numbers repeat across disks, and some FUSE disks make them up). Inside
    `files_in_two_splits_reported` a file in two splits is reported there instead (in two
    classes of one split it is refused still).

    `archive_links` (the links among a .tar's members, named as the paths are: member -> the
    member it leads to): the paths are members of the archive `root` and the numbers their
    data's offsets, one file each."""
    shared = _names_of_shared_files(listed, archive=archive_links is not None)
    if not shared:
        return
    reported = _IN_TWO_SPLITS.get()
    pairs: list[tuple[tuple[int, str], tuple[int, str]]] = []
    for names in shared:
        if reported is None:
            other = next(name for name in names if name[0] != names[0][0])
            pairs.append((names[0], other))
            continue
        # Reported across splits, but never in two classes of one split.
        first_in: dict[str | None, tuple[int, str]] = {}
        for name in names:
            split, label = listed[name[0]][0]
            first = first_in.setdefault(split, name)
            if nfc(listed[first[0]][0][1]) != nfc(label):
                pairs.append((first, name))
                break
    if pairs:
        raise _one_file_error(pairs, listed, root, archive_links)
    if reported is None:
        return
    for names in shared:
        if len({listed[place][0][0] for place, _ in names}) > 1:
            paths = [path for _, path in names]
            # An archive's paths are its members' names, the ids already.
            archived = archive_links is not None
            reported.append(tuple(paths if archived else relative_ids(paths, root)))


def _names_of_shared_files(
    listed: Sequence[tuple[tuple[str | None, str], Numbered]], *, archive: bool
) -> list[list[tuple[int, str]]]:
    """Per file that `listed` names in more than one place, its (place, path) names, sorted
    (`refuse_one_file_in_two_places`)."""
    count = sum(len(numbers) for _, (_, numbers) in listed)
    if len(set().union(*(numbers for _, (_, numbers) in listed))) == count:
        return []
    # Numbers shared in one place (hard-linked repeats, as bench_scaling's data) are no error.
    seen: set[int] = set()
    crossing: set[int] = set()
    for _, (_, numbers) in listed:
        distinct = set(numbers)
        crossing |= distinct & seen
        seen |= distinct
    if not crossing:
        return []
    names_of: dict[int, list[tuple[int, str]]] = {}  # number -> (place, path) of each name
    for place, (_, (paths, numbers)) in enumerate(listed):
        if crossing.isdisjoint(numbers):
            continue
        for path, number in zip(paths, numbers, strict=True):
            if number in crossing:
                names_of.setdefault(number, []).append((place, path))
    shared: list[list[tuple[int, str]]] = []
    for names in names_of.values():
        # An archive member's offset is its file; an inode number, where stat agrees.
        files = [sorted(names)] if archive else _by_file(sorted(names))
        shared += [same for same in files if any(name[0] != same[0][0] for name in same)]
    return shared


def _one_file_error(
    pairs: list[tuple[tuple[int, str], tuple[int, str]]],
    listed: Sequence[tuple[tuple[str | None, str], Numbered]],
    root: str | os.PathLike,
    archive_links: Mapping[str, str | None] | None,
) -> InputError:
    """The error for the first of `pairs` ((place, path) of two names of one file)."""
    (place_a, a), (place_b, b) = min(pairs)
    (split_a, class_a), (split_b, class_b) = listed[place_a][0], listed[place_b][0]
    more = f" (and {len(pairs) - 1} more)" if len(pairs) > 1 else ""
    shown_a, shown_b = (a, b) if archive_links is None else (f"{root}:{a}", f"{root}:{b}")
    if archive_links is None:
        link, target = _link_on_the_way(b, root) or _link_on_the_way(a, root) or (None, None)
    else:
        member = _archive_link_on_the_way(b, archive_links) or _archive_link_on_the_way(
            a, archive_links
        )
        link = None if member is None else f"{root}:{member}"
        target = None if member is None else archive_links[member]
    remedy = (
        f"remove the link {link} -> {target}"
        if link is not None
        else "remove one of the two hard links"
    )
    if nfc(class_a) != nfc(class_b):
        return InputError(
            f"{shown_a} and {shown_b} are one file in two classes, {class_a} and {class_b}{more}",
            f"an image has one label: {remedy}",
        )
    return InputError(
        f"{shown_a} and {shown_b} are one file in two splits, {split_a} and {split_b}{more}",
        f"{remedy}: an image in two splits leaks from one into the other",
    )


def _archive_link_on_the_way(path: str, links: Mapping[str, str | None]) -> str | None:
    """The first of `links` (an archive's, by member name) on the way to member `path`: a
    linked class folder (`img` of `img/x.png`), a folder in it, or `path` itself."""
    slash = path.find("/")
    while slash != -1:
        if path[:slash] in links:
            return path[:slash]
        slash = path.find("/", slash + 1)
    return path if path in links else None


def _by_file(names: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """`names`, (place, path) pairs, grouped by the file each path leads to, (st_dev, st_ino)."""
    files: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for name in names:
        try:
            info = os.stat(name[1])
        except OSError:  # vanished: read as unreadable, if at all
            continue
        files.setdefault((info.st_dev, info.st_ino), []).append(name)
    return list(files.values())


def _link_on_the_way(path: str, root: str | os.PathLike) -> tuple[str, str] | None:
    """(the first symbolic link on the way from `root` to `path`: a class folder, a folder in
    it, or `path` itself; what it holds), None where there is none."""
    base = str(Path(root))
    place = base
    for name in relative_ids([path], base)[0].split(os.sep):
        place = os.path.join(place, name)
        try:
            return place, os.readlink(place)
        except OSError:  # not a link (or gone)
            continue
    return None


def discover_image_folder(
    root: str | os.PathLike,
    *,
    classes: Sequence[str] | None = None,
    within: str | os.PathLike | None = None,
) -> Samples:
    """`ROOT/<class>/<image>` (searched recursively inside each class folder, `list_folders`);
    `within`: the data ROOT lies in (a split root), whose folders links are not followed
    into. One file in two classes is an InputError (`refuse_one_file_in_two_places`)."""
    return numbered_image_folder(root, classes=classes, within=within)[0]


def _captions_beside(images: Sequence[Path], entries: Sequence[Path]) -> list[str]:
    """The names of the `KEY.txt` files among `entries` beside an image of their KEY
    (`000.txt` beside `000.png`), sorted: train asked for class folders without a word of
    what they are."""
    keys = {p.name.partition(".")[0] for p in images}  # cut at the first dot, as a tar's
    found = []
    for path in entries:
        key, _, extension = path.name.partition(".")
        if extension == "txt" and key in keys and not path.is_dir():
            found.append(path.name)
    return sorted(found)


def numbered_image_folder(
    root: str | os.PathLike,
    *,
    classes: Sequence[str] | None = None,
    within: str | os.PathLike | None = None,
) -> tuple[Samples, list[tuple[str, Numbered]]]:
    """`discover_image_folder`, and its files numbered (`FolderListing.numbered`) by class
    name, for a split root's check across its splits."""
    folder = Path(root)
    if not folder.is_dir():
        raise InputError(f"dataset folder not found: {folder}", "check --data")
    entries = list(folder.iterdir())
    class_dirs = sorted(p for p in entries if p.is_dir() and not is_skipped_folder(p.name))
    if not class_dirs:
        images = [p for p in entries if is_image_file(p) and not is_apple_double(p.name)]
        if images:
            captions = _captions_beside(images, entries)
            if captions:  # a captioning data set's, as a .tar's (`_UnpackedTar.captions_beside`)
                raise InputError(
                    f"{folder} holds images but no class folders, and its KEY.txt files "
                    f"({first_and_more(captions, 1)}) are captions, not class labels",
                    CLASS_FOLDERS_HINT,
                )
            raise no_class_folders_error(str(folder))
        raise NoImagesError(f"no class folders in {folder}", CLASS_FOLDERS_HINT)
    _refuse_links_around(folder, class_dirs)
    names = [d.name for d in class_dirs]
    refuse_spelling_twins(names, f"class folders in {folder}:")
    class_list = list(classes) if classes is not None else names
    index_of = class_index(class_list)
    unknown = [name for name in names if find_class(index_of, name) is None]
    if unknown:
        raise InputError(
            f"class folder(s) {', '.join(unknown[:5])} in {folder} are not among the model's "
            f"{len(class_list)} classes",
            "the classes are: "
            + ", ".join(class_list[:10])
            + (" ..." if len(class_list) > 10 else ""),
        )
    listing = list_folders(class_dirs, within=folder if within is None else within)
    warn_unentered(listing.unentered, folder)
    warn_unlistable(listing.unlistable, folder)
    paths, labels = [], []
    for class_dir, files, links in zip(class_dirs, listing.images, listing.dangling, strict=True):
        # An image link to nothing is an image that cannot be read: every loader skips it
        # with a warning and counts it (fatal with --strict), as it does a CSV index's.
        files = sorted(files + links) if links else files
        paths.extend(files)
        labels.extend([find_class(index_of, class_dir.name)] * len(files))
    if not paths:
        raise no_images_error(str(folder))
    warn_dead_links(sorted(dead_links(folder) + listing.dead), folder)
    numbered = list(zip(names, listing.numbered, strict=True))
    refuse_one_file_in_two_places([((None, name), files) for name, files in numbered], folder)
    ids = relative_ids(paths, folder)
    return Samples(class_list, labels, paths=paths, source=str(folder), ids=ids), numbered


def _refuse_links_around(folder: Path, class_dirs: list[Path]) -> None:
    """A class folder that links to ROOT or above would be one more class holding every other
    class's images again (`ROOT/loop -> ROOT`)."""
    root = os.path.realpath(folder)
    for class_dir in class_dirs:
        if not class_dir.is_symlink():
            continue
        real = os.path.realpath(class_dir)
        if os.path.commonpath([root, real]) == real:
            raise InputError(
                f"class folder {class_dir} links to {real}, which holds {folder} itself: its "
                "images would be counted again under another class",
                "remove the link, or link to the class's own folder",
            )


def discover_flat_folder(
    root: str | os.PathLike, *, within: str | os.PathLike | None = None
) -> Samples:
    """A folder of images with no class folders (searched recursively, `list_folders`): one
    unnamed class "" (one file under two names in it is read under each)."""
    return numbered_flat_folder(root, within=within)[0]


def numbered_flat_folder(
    root: str | os.PathLike, *, within: str | os.PathLike | None = None
) -> tuple[Samples, Numbered]:
    """`discover_flat_folder`, and its files numbered (`FolderListing.numbered`)."""
    samples, numbered, _ = numbered_flat_folder_by_class(root, (), within=within)
    return samples, numbered


def flat_folder_and_class_folders(
    root: str | os.PathLike, folders: Sequence[str]
) -> tuple[Samples, list[str] | None]:
    """`discover_flat_folder` of a folder whose images lie beside its subfolders `folders`
    (visible, sorted names), and, from the same listing, the classes `discover_image_folder`
    reads it by: `folders`, those without images too; [""] where none holds an image or it
    refuses them (names spelled alike, one file in two classes). None where the listing met
    linked folders that a listing of the class folders may read otherwise
    (`_class_links_read_already`: the caller reads them so, if it needs them)."""
    samples, _, by_class = numbered_flat_folder_by_class(root, folders)
    if by_class is None:
        return samples, None
    if not any(paths for paths, _ in by_class.values()):
        return samples, [""]  # read as a flat folder
    try:
        refuse_spelling_twins(list(by_class), f"class folders in {root}:")
        refuse_one_file_in_two_places([((None, n), found) for n, found in by_class.items()], root)
    except InputError:
        return samples, [""]
    return samples, list(by_class)


def numbered_flat_folder_by_class(
    root: str | os.PathLike, folders: Sequence[str], *, within: str | os.PathLike | None = None
) -> tuple[Samples, Numbered, dict[str, Numbered] | None]:
    """`numbered_flat_folder`, and from the same listing the images `numbered_image_folder`
    finds in each of the class folders `folders` (visible subfolders, sorted names), numbered,
    by name in that order (`_class_links_read_already`: linked ones too): None where that
    listing would find others, which this one cannot tell (or where `folders` is empty)."""
    folder = Path(root)
    if not folder.is_dir():
        raise InputError(f"folder not found: {folder}", "check the path")
    listing = list_folders([folder], within=within)
    warn_unentered(listing.unentered, folder)
    warn_unlistable(listing.unlistable, folder)
    # Image links to nothing are unreadable images, as in an image folder.
    paths = (
        sorted(listing.images[0] + listing.dangling[0])
        if listing.dangling[0]
        else listing.images[0]
    )
    if not paths:
        raise no_images_error(str(folder))
    warn_dead_links(listing.dead, folder)
    ids = relative_ids(paths, folder)
    samples = Samples([""], [0] * len(paths), paths=paths, source=str(folder), ids=ids)
    numbered = listing.numbered[0]
    if not folders:
        return samples, numbered, None
    listed, numbers = numbered
    by_class = by_class_folder(listed, relative_ids(listed, folder), numbers, folders, os.sep)
    if listing.entered or listing.unentered:
        again = _class_links_read_already(folder, folders, listing)
        if again is None:
            return samples, numbered, None
        by_class.update(again)
    return samples, numbered, by_class


def _class_links_read_already(
    folder: Path, folders: Sequence[str], listing: FolderListing
) -> dict[str, Numbered] | None:
    """The images a listing of the class folders `folders` of `folder` (`numbered_image_folder`)
    finds in those that are links `listing` (of `folder` whole) left unentered, as read already:
    a class folder is a top of that listing, entered whatever it leads to (`c -> a` reads `a`'s
    images again, as class `c`: one file in two classes). Linked folders the listing entered,
    and links below the class folders, are met alike by both listings (a class folder's target
    is fenced before any link in them is followed), so they are read alike. None where the
    listing cannot tell: a class link to a place other than a visible class folder of `folder`
    or below one, or to one that holds links, unlistable folders or images that are no file; a
    link outside the class folders."""
    base = str(Path(folder))
    spelled = (lambda name: name) if base == "." else (lambda name: base + os.sep + name)
    class_links = {spelled(name): name for name in folders}
    places = [spelled(name) + os.sep for name in folders]
    for link in [*listing.entered, *listing.unentered]:
        # one in a folder no class is read from (a hidden one): it may fence a target that a
        # listing of the class folders enters
        if link not in class_links and not link.startswith(tuple(places)):
            return None
    real_root = os.path.realpath(folder)
    found: dict[str, Numbered] = {}
    for link in listing.unentered:
        name = class_links.get(link)
        if name is None:  # a link below a class folder: unentered by both
            continue
        real = os.path.realpath(link)
        if real == real_root or os.path.commonpath([real_root, real]) != real_root:
            return None  # `folder` itself, above it, or elsewhere (behind another class link)
        place = os.path.relpath(real, real_root)
        first = place.split(os.sep)[0]
        if first not in folders or os.path.islink(spelled(first)):
            return None
        prefix = spelled(place) + os.sep
        others = [*listing.entered, *listing.unentered, *listing.dangling[0], *listing.dead]
        others += [path for path, _ in listing.unlistable]
        if any((path + os.sep).startswith(prefix) for path in others):
            return None
        paths, numbers = [], []
        for path, number in zip(*listing.numbered[0], strict=True):
            if path.startswith(prefix):
                paths.append(link + os.sep + path[len(prefix) :])
                numbers.append(number)
        found[name] = (paths, numbers)
    return found


def by_class_folder(
    files: Sequence[str],
    names: Iterable[str],
    numbers: Sequence[int],
    class_folders: Sequence[str],
    sep: str,
) -> dict[str, Numbered]:
    """`files` (numbered `numbers`) by the class folder of `class_folders` (in that order)
    their `names`, relative to the folder that holds those (`sep` between folders), begin
    with; files of no class folder (beside them, or in another folder) are left out."""
    by_class: dict[str, Numbered] = {name: ([], []) for name in class_folders}
    for file, name, number in zip(files, names, numbers, strict=True):
        head, slash, _ = name.partition(sep)
        found = by_class.get(head) if slash else None
        if found is not None:
            found[0].append(file)
            found[1].append(number)
    return by_class
