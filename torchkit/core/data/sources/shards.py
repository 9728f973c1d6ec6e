"""WebDataset tar shards and `.tar` archives of image folders, read in place (map-style).

What `--data` (or IMAGES) may name here, before folders and CSV indexes are tried:

- WebDataset shards: a brace pattern as webdataset (braceexpand) reads them
  (`DIR/train-{000000..000127}.tar`; ranges `{a..b}` and `{a..b..step}`, zero padded where a
  bound is written with a leading zero, lists `{a,b}`), specs joined by `::` (webdataset's list
  of URLs), one `NAME-NNNNNN.tar`, or a folder holding only `.tar` shards (with `classes.txt`,
  `classes.json`, `manifest.json` beside them). A folder whose shards are all named
  `{train,val,test}-NNNNNN.tar` is split data, like a split root; shards named one by one or by
  a pattern are the data as given (unsplit).
  A sample is the members `KEY.EXT` sharing a KEY (webdataset's rule: the member path up to the
  first dot of its basename): one image (an extension `is_image_file` knows) and its label, a
  `KEY.cls` (the class index as decimal text) or a `KEY.json` with "label" (a class name or an
  index) or "cls" (an index). Class names: `classes.txt` (one per line) or `classes.json` (a
  list, or {name: index}) beside the shards; without one, the names in the order of the
  indices beside them where every sample has both and each index one name
  (`_classes_by_index`; two indices of one name are two classes: the index is the label),
  else the label names sorted naturally (as class folders are; a name of two indices is an
  error then), or, for indices only, "0", "1", ... up to the largest index. Two names of one
  index that differ only by the spaces around them are an error (they would be two classes);
  so is a sample whose index and name are two classes of classes.txt / classes.json
  (webdataset reads the index). A name given twice there (ImageNet's two "crane"s) is two
  classes, told apart by the samples' indices; a sample labelled by such a name alone is an
  error (`refuse_a_label_of_two_classes`). A label member past MAX_LABEL_MEMBER_BYTES is an
  error, never read whole. A sample's id (the `path` column) is `SHARD/KEY.EXT`
  (`train-000003.tar/00042.jpg`), relative to the shards' folder; samples are in shard order,
  then member order (a name stored again at the place it first took).
- a `.tar` of an image folder (`class/img.JPEG`, a split root `train/class/img.jpg`, or, where
  unlabelled images are taken, flat images or a split of them, `train/img.jpg`), read with the
  rules of folders on disk; all of it may lie in one folder named as the archive
  (`tar cf X.tar X`), or in one folder of another name holding class or split folders
  (`tar cf flowers-v2.tar flowers`: `_wrapping_folder`). A `.tar` is a shard when some image
  in it has a `.cls`/`.json` label
  beside it (not a `.json` in a folder holding no "label" or "cls": metadata), or when it is
  named `NAME-NNNNNN.tar` and does not lay out as an image folder (`_holds_an_image_folder`:
  `caltech-101.tar` of `class/img.jpg` is a folder, also with such metadata beside). Ids
  are the member paths (inside that one folder), as the unpacked folder's would be.

Indexing is one pass over the tar headers (no data is read but the labels); an image is read by
offset and size (`TarReader`), each process opening its own file. A FIFO or device member is
listed as the file tar -x makes of it, and read as the folder reader reads such a file on disk:
an image that cannot be read (`NotRegularMember`), never dropped from the listing. A damaged or
truncated tar is an error naming it; an image that cannot be decoded is an unreadable image like
any other.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import functools
import json
import logging
import os
import posixpath
import re
import stat
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from torchkit.core.data.image_files import NotARegularFile
from torchkit.core.data.sources.class_files import class_names_in_json, class_names_in_text
from torchkit.core.data.sources.containers import is_numbered_shard_name
from torchkit.core.data.sources.csv_index import natural_key
from torchkit.core.data.sources.discovery import (
    CLASS_FOLDERS_HINT,
    IMAGE_EXTENSIONS,
    NoImagesError,
    Numbered,
    by_class_folder,
    is_apple_double,
    is_image_file,
    is_skipped_folder,
    no_class_folders_error,
    no_images_error,
    note_not_unpacked,
    refuse_one_file_in_two_places,
    reported_files_in_two_splits,
    warn_unentered,
)
from torchkit.core.data.sources.samples import (
    Samples,
    classes_named_alike,
    how_they_differ,
    index_class_names,
    is_blank_name,
    nfc,
    partial_labels_are_kept,
    refuse_a_label_of_two_classes,
    refuse_spelling_twins,
    refuse_unshowable_classes,
    with_unlabelled_class,
)
from torchkit.core.data.sources.source import (
    DataSource,
    _split_source,
    _union_of,
    refuse_other_split_names,
    relabelled,
    split_root_source,
    unfetched_url_error,
    unlabelled_split_error,
)
from torchkit.core.data.sources.splitting import SPLIT_NAMES, refuse_mixed_splits
from torchkit.core.data.stored_image import Stamp, StoredImage, check_unchanged, file_stamp
from torchkit.core.io.errors import InputError, TorchkitError, first_and_more, short_repr
from torchkit.core.io.file_kinds import LINK_TO_NOTHING, file_kind
from torchkit.core.io.files import read_text
from torchkit.core.io.wording import counted
from torchkit.core.runtime.fork_safe import ForkSafeLock

log = logging.getLogger("torchkit")

_SPLIT_SHARD = re.compile(r"^(train|val|test)-\d+\.tar$")
_SIDE_FILES = ("classes.txt", "classes.json", "manifest.json")
_SHARDS_HINT = (
    "shards are DIR/NAME-{000000..000009}.tar, a folder of .tar shards, or NAME.tar files "
    "joined by ::"
)
_SHOWN = 5  # names listed in one error
_SPACES = how_they_differ("a", "a ")  # what tells `cat` and `cat ` apart, as errors say it
# The most bytes a sample's label member (`KEY.cls`, `KEY.json`) may hold, read whole: a label
# is a few bytes, its JSON of metadata some kilobytes; a member of gigabytes (mislabelled, or a
# hostile shard) would take all memory.
MAX_LABEL_MEMBER_BYTES = 16 << 20
# Names one brace pattern may expand to: more is a typo (`{0..9999999999}`) that would take
# all memory to list.
MAX_PATTERN_NAMES = 1_000_000


# --- reading a member's bytes -------------------------------------------------------------


class TarReader:
    """Reads members of one tar file by (offset, size): picklable (it holds only the path and
    `stamp`); each process opens the file once, lazily, and never uses a descriptor across a
    fork. `stamp`: the listed file's `file_stamp`, which the file read must still have
    (`check_unchanged`)."""

    def __init__(self, path: str, stamp: Stamp | None = None) -> None:
        self.path = os.path.abspath(path)
        self.stamp = stamp

    def __reduce__(self):
        return (TarReader, (self.path, self.stamp))

    def read(self, locator: Any) -> bytes:
        # A link that reads no file, in the words its unpacked link's read gives (the
        # message it goes into names the image: never the archive's path again).
        if locator is None:  # to a member the archive does not hold
            raise NotARegularFile(f"not a regular file ({LINK_TO_NOTHING})")
        if isinstance(locator, NotRegularMember):
            raise locator.error()
        if locator == _LOOPING:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
        if locator == LEADS_OUT:
            raise OSError(LEADS_OUT)
        offset, size = locator
        if not hasattr(os, "pread"):  # Windows: no positioned read, a handle per read
            with open(self.path, "rb") as handle:
                self._check(handle.fileno())
                handle.seek(offset)
                data = handle.read(size)
        else:
            data = _pread(self.path, offset, size, self._check)
        if len(data) < size:
            raise OSError(
                f"{self.path} is truncated: a member of {size} bytes at byte {offset} runs past "
                "its end"
            )
        return data

    def _check(self, fd: int) -> None:
        check_unchanged(fd, self.stamp, self.path)

    def recorded_path(self, locator: Any) -> str | None:
        """The "path" the `KEY.json` of the sample whose image lies at `locator` records (the
        source file `convert shards` made it from), for the message about an unreadable image;
        None where there is none. Asked only then: never held per sample."""
        try:
            return _recorded_paths(self.path).get(locator)
        except Exception:  # noqa: BLE001 - a detail of a message already being given
            return None


@functools.lru_cache(maxsize=4)
def _recorded_paths(path: str) -> dict[tuple[int, int], str]:
    """Each image's locator in the shard at `path` -> the "path" its sample's `KEY.json`
    records, from the shard's headers listed again (a process lists a shard once for this,
    on its first unreadable image)."""
    listing = list_tar(path, labels=True)
    reader = TarReader(path, listing.stamp)
    by_key = {}
    others: list[tuple[str, tuple[int, int]]] = []  # (key, locator) of each other member
    for member in listing.members:
        locator = listing.locator(member)
        split = _key_and_extension(member)
        if split is None:
            continue
        key, extension = split
        if extension != "json" and isinstance(locator, tuple):  # a FIFO's: nothing recorded
            others.append((key, locator))
            continue
        try:
            meta = json.loads(_member_bytes(listing, reader, member, path))
        except (ValueError, RecursionError, TorchkitError):
            continue
        if isinstance(meta, dict) and isinstance(meta.get("path"), str) and meta["path"]:
            by_key[key] = meta["path"]
    return {locator: by_key[key] for key, locator in others if key in by_key}


# Descriptors of this process (pread: no shared file position, so threads may read at once).
# Up to _KEPT_OPEN shards stay open; beyond that a read opens and closes its own.
_KEPT_OPEN = 128
_descriptors: dict[str, int] = {}
_descriptors_pid = os.getpid()
# A forked child's own: one another thread held at the fork (reading a shard while a DataLoader
# forked its workers) is never released in the child, whose first read waited on it for good.
_descriptors_lock = ForkSafeLock()


def _pread(path: str, offset: int, size: int, check: Callable[[int], None]) -> bytes:
    """`size` bytes of the file at `path` from `offset`, once `check` passed the descriptor."""
    global _descriptors_pid
    with _descriptors_lock:
        if _descriptors_pid != os.getpid():  # forked: the parent's descriptors are not ours
            for fd in _descriptors.values():
                _close_quietly(fd)
            _descriptors.clear()
            _descriptors_pid = os.getpid()
        fd = _descriptors.get(path)
        if fd is None and len(_descriptors) < _KEPT_OPEN:
            fd = _descriptors[path] = os.open(path, os.O_RDONLY)
    if fd is not None:
        check(fd)
        return _pread_all(fd, offset, size)
    fd = os.open(path, os.O_RDONLY)
    try:
        check(fd)
        return _pread_all(fd, offset, size)
    finally:
        os.close(fd)


def _forget_if_replaced(path: str) -> None:
    """Close this process's descriptor of `path` when the file there is no longer the one it
    opened (shards written again in place): a new listing's offsets are read from the new
    file, never from the replaced one that the descriptor keeps alive."""
    path = os.path.abspath(path)
    with _descriptors_lock:
        fd = _descriptors.get(path) if _descriptors_pid == os.getpid() else None
        if fd is None:
            return
        try:
            held, now = os.fstat(fd), os.stat(path)
            same = (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)
        except OSError:
            same = False
        if not same:
            del _descriptors[path]
            _close_quietly(fd)


def _pread_all(fd: int, offset: int, size: int) -> bytes:
    chunks, done = [], 0
    while done < size:
        chunk = os.pread(fd, size - done, offset + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


# --- one pass over a tar's headers ----------------------------------------------------------


# The locator of a symbolic link member that leads out of the archive (at the host's files,
# once unpacked), and why reading it reads nothing: it is never followed.
LEADS_OUT = "a symbolic link out of the archive, never followed"


@dataclass(frozen=True)
class NotRegularMember:
    """The locator of a member that is a FIFO or a device (`what`: "a FIFO", "a device"): tar -x
    makes one, which the folder reader lists and never opens (opening a FIFO waits for a
    writer). Read, it is the unreadable image a folder's FIFO is: `NotARegularFile`."""

    what: str

    def error(self) -> NotARegularFile:
        return NotARegularFile(f"not a regular file ({self.what})")


@dataclass
class TarListing:
    """The members of a tar that unpack as files (name -> (offset, size), in archive order:
    the regular ones, and the FIFOs and devices, `special`) and its links (name -> the member
    at the end of its chain of links, or None: `_link_ends`)."""

    path: str
    members: dict[str, tuple[int, int]]
    links: dict[str, str | None]
    folders: set[str]  # names of its directory members
    stamp: Stamp | None = None  # `file_stamp` of the file listed
    # The links whose chain never ends (a loop), each with the name it holds (resolved in its
    # folder): read as links to nothing (a folder's tar: an unreadable image, as the unpacked
    # folder's link is; a shard refuses them).
    looped: dict[str, str] = field(default_factory=dict)
    # The links that lead to a folder of the archive (a member `img` -> `real/`, whose files
    # are `real/x.png`), each with that folder: a linked class folder (`_linked_class_images`).
    folder_links: dict[str, str] = field(default_factory=dict)
    # The bytes of small label members (`KEY.cls`, `KEY.json`), read with their headers when
    # asked (`list_tar(labels=True)`): a shard's labels cost no read of their own.
    labels: dict[str, bytes] = field(default_factory=dict)
    # The symbolic links that lead out of the archive (an absolute target, or one above its
    # root), each with its target as stored, and those of the links its chain goes on
    # through (`_links_out`): tar -x unpacks them pointing there, at the host's files; never
    # followed: a sample's or a folder's image so is an unreadable image (`LEADS_OUT`).
    outside: dict[str, str] = field(default_factory=dict)
    # The members stored sparse (`tar --sparse`: GNU's old format, or pax's `GNU.sparse.*`
    # records, listed under `GNUSparseFile.NNN/` names by readers that know them not), by the
    # names tar -x unpacks them to: not read (a folder's tar says so).
    sparse: list[str] = field(default_factory=list)
    # Each link's target as stored (what `ls -l` shows once unpacked), for messages.
    link_texts: dict[str, str] = field(default_factory=dict)
    # The hard links to a folder, each with its target as stored: tar -x makes none (a folder
    # takes no hard link), so they are not in `links` (a folder's tar says so).
    hard_to_folders: dict[str, str] = field(default_factory=dict)
    # Each link's place in the tar, and each name stored more than once, the place of its
    # first member (`_PlainMembers`): the order of a shard's samples.
    link_places: dict[str, int] = field(default_factory=dict)
    first_places: dict[str, int] = field(default_factory=dict)
    # The members and links tar -x does not write where a file and a folder of one name meet
    # (`_leave_out_what_tar_writes_not`), each with why: not listed (a folder's tar says so).
    unwritten: dict[str, str] = field(default_factory=dict)
    # The hard links tar -x does not make, their target holding nothing where the archive
    # stores them (stored before it, or never), where nothing else is at their name, each
    # with its target as stored: not listed (a folder's tar says so).
    unmade_hard_links: dict[str, str] = field(default_factory=dict)
    # The members that are FIFOs or devices (in `members`, their data of no bytes), each with
    # what it is: "a FIFO", "a device" (`locator`: a `NotRegularMember`).
    special: dict[str, str] = field(default_factory=dict)

    def in_tar_order(self) -> list[str]:
        """The members and links, each where its name first appears in the tar."""
        names = [*self.members, *self.links]
        if not self.links and not self.first_places:
            return names  # the members' order
        members, links, first = self.members, self.link_places, self.first_places

        def place(name: str) -> int:
            found = first.get(name)
            if found is not None:
                return found
            return members[name][0] if name in members else links[name]

        return sorted(names, key=place)

    def locator(self, name: str) -> tuple[int, int] | NotRegularMember | str | None:
        """Where the data of member or link `name` lies; a `NotRegularMember` where it is (or
        its chain of links ends at) a FIFO or a device; `LEADS_OUT` for a link out of the
        archive; None where it reads no member."""
        end = name if name in self.members else self.links.get(name)
        where = None if end is None else self.members.get(end)
        if where is not None and self.special and end in self.special:
            return NotRegularMember(self.special[end])
        if where is None and self.outside and name in self.outside:
            return LEADS_OUT
        return where


def _link_target(name: str, linkname: str, *, symbolic: bool) -> str:
    """The member a link `name` holding `linkname` names: a symbolic link's relative to the
    folder it unpacks to (`/cat/s.png` -> `a.png` is cat/a.png; one leading out of the archive
    starts with `/` or `..`: `_leaves_archive`); a hard link's a member's name, without what
    GNU tar -x strips from it: its leading slashes, as from the members' (`/cat/a.png` is the
    member cat/a.png, or `/cat/a.png` itself where stored so: `_respelled_members`), and all
    up to its last `..` part (`cat/x/../b.png` is b.png, not cat/b.png). A symbolic link to
    `/` is one to the host's root, not to the archive's (`.`). A symbolic link's target with a
    `..` part is returned as joined, not normalised: whether `link/..` is the folder `link` is
    in depends on the links of the archive (`_through_links`, once all are listed), and so is
    one ending in `/` (`a.png/` names no file where a.png is one)."""
    if symbolic:
        stored, linkname = linkname, posixpath.join(posixpath.dirname(name.lstrip("/")), linkname)
        if not linkname.startswith("/") and (
            ".." in linkname.split("/")
            or (linkname.endswith(_FOLDER_ENDS) and posixpath.normpath(stored) != ".")
        ):
            # A `..` after a link, or after a file, and a final `/` after a file, are the
            # system's to take: `_through_links`
            return linkname
    else:
        parts = linkname.split("/")
        if ".." in parts:
            linkname = "/".join(parts[len(parts) - parts[::-1].index("..") :])
        linkname = linkname.lstrip("/") or linkname
    return posixpath.normpath(_member_name(linkname) or linkname)


def _member_name(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


class DamagedTar(InputError):
    """A tar cut short or damaged (`list_tar`)."""


def list_tar(path: str, *, whole: bool = False, labels: bool = False) -> TarListing:
    """Every member of the uncompressed tar at `path`, from its headers only (the data is
    skipped by seeking): O(members). InputError naming the file when it is not a tar, is
    compressed, or is truncated or damaged (DamagedTar: a header or a member's data past its
    end). `whole=True`: a tar that ends right after a member, without the end-of-archive
    marker, is truncated too (what a download cut short at a member's end leaves).
    `labels=True`: the listing also holds the bytes of its small `.cls` and `.json` members
    (`TarListing.labels`), read in the same pass where the tar's headers are plain."""
    _forget_if_replaced(path)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            # A FIFO named like a shard (in a folder of shards) held the open below for good.
            raise InputError(
                f"{path} is not a regular file ({file_kind(info.st_mode)})",
                "shards and archives are .tar files: move it out of the folder, or name the "
                "shards with a pattern",
            )
        stamp = file_stamp(info)
        size = stamp[1]
        with open(path, "rb") as handle:
            first = handle.read(tarfile.BLOCKSIZE)
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror or error}") from None
    if first[:2] == b"\x1f\x8b" or first[:3] == b"BZh" or first[:6] == b"\xfd7zXZ\x00":
        raise compressed_tar_error(path)
    fast = _read_plain_headers(path, size, labels)
    if fast is not None:
        fast.stamp = stamp
        return fast
    found = _PlainMembers(None, size, labels=False)
    count = 0
    try:
        with tarfile.open(path, "r:") as tar:
            while (info := tar.next()) is not None:
                tar.members.clear()  # one pass: keep no TarInfo (1M members would be ~1 GB)
                if info.size < 0:
                    # tarfile takes a size field of `-1000` and goes back to this header, or
                    # one before it, for ever (Python 3.11).
                    raise tarfile.ReadError(f"{info.name} has a negative size ({info.size})")
                count += 1
                name = _member_name(info.name)
                if (
                    info.isdir()
                    or info.type in _FOLDER_KINDS
                    or (info.type in _REGULAR and info.name.endswith("/"))
                ):
                    # (a file's kind and a name ending in `/`: a folder to GNU tar -x, as to the
                    # plain headers' pass; tarfile makes only the old `\0` kind so)
                    found.folder(name, info.offset_data)
                elif info.issym() or info.islnk():
                    found.link(name, info.linkname, info.issym(), info.offset_data)
                elif info.issparse():  # its real name (pax: GNU.sparse.name), its data in pieces
                    found.replace(name)
                    found.sparse[name] = None
                elif info.isreg() or info.type not in _KNOWN_KINDS:
                    # (a kind tar does not know: GNU tar -x, and tarfile's extract, make a file
                    # of it, "Unknown file type 'Z', extracted as normal file")
                    if info.offset_data + info.size > size:
                        raise tarfile.ReadError(f"{name} runs past the end of the file")
                    found.replace(name)
                    found.members[name] = (info.offset_data, info.size)
                elif info.type in _SPECIAL:
                    found.special_member(name, _SPECIAL[info.type], info.offset_data)
                    if info.size > 0:
                        tar.offset = _after_special_member(path, info.offset_data, info.size)
            end = tar.offset
    except tarfile.ReadError as error:
        if not count and first[257:262] != b"ustar":
            raise InputError(
                f"{path} is not a tar archive ({error})", "give an uncompressed .tar"
            ) from None
        raise _damaged(path, count, str(error)) from None
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror or error}") from None
    # tarfile ends quietly at a header it cannot read after the first: only zeros (the end of
    # archive marker) or the end of the file may follow the last member.
    with open(path, "rb") as handle:
        handle.seek(end)
        tail = handle.read(tarfile.BLOCKSIZE)
    if tail and (tail != bytes(len(tail)) or len(tail) < tarfile.BLOCKSIZE):
        raise _damaged(path, count, f"no tar header at byte {end}")
    if whole and not tail:
        raise _damaged(path, count, f"it ends at byte {end} without the end-of-archive marker")
    listing = _listing(path, found)
    listing.stamp = stamp
    return listing


def _after_special_member(path: str, data: int, size: int) -> int:
    """Where the header after a FIFO or device member whose size field says `size` lies (its
    header's data would begin at `data`): POSIX stores no data for one, so tarfile reads the
    next header at `data`; some writers store `size` bytes there all the same (as the plain
    headers' pass reads them). Those bytes, read as a header by tarfile, made the archive
    "damaged" (GNU tar skips them to the next header, with a warning): past them where no
    header lies at `data` and one (or the end-of-archive marker) lies after them."""
    after = data + -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    with open(path, "rb") as handle:
        handle.seek(data)
        here = handle.read(tarfile.BLOCKSIZE)
        handle.seek(after)
        there = handle.read(tarfile.BLOCKSIZE)
    return after if not _is_header(here) and _is_header(there) else data


def _is_header(block: bytes) -> bool:
    """Whether `block` is a tar header whose checksum holds, or the end-of-archive marker."""
    if block == _ZERO_BLOCK:
        return True
    if len(block) < tarfile.BLOCKSIZE:
        return False
    try:
        checksum = int(block[148:156].split(b"\0", 1)[0].strip() or b"-1", 8)
    except ValueError:
        return False
    return checksum in tarfile.calc_chksums(block)


def _listing(path: str, found: _PlainMembers) -> TarListing:
    if found.unlinked:
        found.settle_hard_links_to_nothing()
    _leave_out_what_tar_writes_not(found)
    members, links = found.members, found.links
    deepest = 0  # the most parts a link's name has: no deeper path is a link
    is_folder = _folder_test(members, links, found.folders)  # sorts at its first question
    for name, target in links.items():
        if ".." in target.split("/") or target.endswith(_FOLDER_ENDS):
            if not deepest:
                deepest = max(name.count("/") for name in links) + 1
            links[name] = _through_links(target, links, deepest, members, is_folder)
    # The symbolic links whose target ends in `/` (`f/`): their chain must end at a folder
    slashed = {
        name
        for name, text in found.link_texts.items()
        if text.endswith(_FOLDER_ENDS) and name not in found.hard
    }
    resolved, looped = _link_ends(members, links, slashed)
    linked_folders = _folder_link_ends(members, links, found.folders, resolved, looped)
    # A hard link to a folder (not to a symbolic link to one, which it copies): tar -x makes
    # nothing there ("Cannot hard link: Operation not permitted"), having removed what an
    # earlier member left under its name.
    to_folders = {
        name: found.link_texts[name]
        for name in linked_folders
        if name in found.hard and links[name] not in links
    }
    for name in to_folders:
        del links[name], found.link_texts[name], resolved[name], linked_folders[name]
    outside = _links_out(members, links, looped, found.link_texts)
    # Never to a member stored under the host path it names (`/etc/passwd`): unpacked, the
    # link names the host's file.
    resolved.update(dict.fromkeys(outside))
    return TarListing(
        path,
        members,
        resolved,
        found.folders,
        looped=looped,
        folder_links=linked_folders,
        labels=found.label_bytes,
        outside=outside,
        sparse=list(found.sparse),
        link_texts=found.link_texts,
        hard_to_folders=to_folders,
        link_places=found.link_places,
        unwritten=found.unwritten,
        first_places=found.first_places,
        unmade_hard_links={
            name: text
            for name, text in found.unmade.items()
            if name not in members and name not in links and name not in found.folders
        },
        special=found.special,
    )


def _leave_out_what_tar_writes_not(found: _PlainMembers) -> None:
    """Take out of `found` what GNU tar -xf does not write where a file (or link) and a folder
    of one name meet: a file, link or hard link stored when a folder of its name holds
    something ("Cannot open: File exists": `x.png/r.png`, then `x.png`), and the members stored
    under a file after it ("Not a directory": `notes`, then `notes/q.png`, also spelled
    `/notes/q.png` or `notes//q.png`: names meet as the paths tar -x unpacks them to); where
    the folder was empty the member stored after it takes its place. (Members stored under a
    link: their own rules, `_leave_out_members_under_links`.) The names that may be such a
    folder are found from the folders the names lie in, a look-up at each `/` of those folders
    whose length is that of a file's or link's name: a few for most archives, and no string
    made for the folders on the way to a path thousands deep."""
    members, links, folders = found.members, found.links, found.folders
    if found.files_made_folders:
        _leave_out_what_was_stored_in_a_file_made_a_folder(found)
    # Each path tar -x unpacks -> its one stored name (`_PlainMembers.replace` keeps one a
    # path), for the files and links, and -> its stored names, for the folders.
    files: dict[str, str] = {}
    folder_names: dict[str, list[str]] = {}
    if found.spellings:
        for name in (*members, *links):
            path = _unpacked_path(name)
            if path is not None:
                files[path] = name
        for name in folders:
            path = _unpacked_path(name)
            if path is not None:
                folder_names.setdefault(path, []).append(name)
    else:
        files = {name: name for name in members}
        files.update((name, name) for name in links)
        folder_names = {name: [name] for name in folders}
    parents = {path.rpartition("/")[0] for path in files}
    parents.update(path.rpartition("/")[0] for path in folder_names)
    parents.discard("")
    lengths = set(map(len, files))
    both = {path for path in folder_names if path in files}  # emptied, or not
    for folder in parents:
        slash = folder.find("/")
        while True:
            end = len(folder) if slash == -1 else slash
            if end in lengths:
                path = folder[:end]
                if path in files:
                    both.add(path)
            if slash == -1:
                break
            slash = folder.find("/", slash + 1)
    if not both:
        return
    ordered = sorted({*files, *folder_names})

    place = found.place

    def path_place(path: str) -> int:
        stored = files.get(path)
        if stored is not None:
            return place(stored)
        return min(map(place, folder_names[path]))

    # The first place of what each such folder holds: the folders in one another, each
    # counted from those it holds, deepest first: each name read once, not once a folder it
    # lies in (a chain of 200 such folders over 50k files took 4 s of CPU).
    ranges = {}
    for path in sorted(both, reverse=True):
        start = bisect.bisect_left(ordered, path + "/")
        end = bisect.bisect_left(ordered, path + "0", start)  # `0` follows `/`
        if start == end:
            continue
        first, at = None, start
        while at < end:
            held = ranges.get(at)
            if held is not None:
                at, earliest = held
            else:
                earliest = path_place(ordered[at])
                at += 1
            first = earliest if first is None or earliest < first else first
        ranges[start] = (end, first)
    for path in sorted(both):  # a folder before those in it
        if path not in files or files[path] not in members and files[path] not in links:
            continue  # left out already, under a file
        stored = files[path]
        start = bisect.bisect_left(ordered, path + "/")
        held = ranges.get(start)
        if held is not None and held[1] < place(stored):
            _leave_out(found, stored, "a folder of its name holds files")  # the folder stays
            continue
        for name in folder_names.get(path, ()):
            folders.discard(name)  # empty when the file or link was written: replaced by it
        if held is not None and stored in members:  # a file: nothing is written under it
            for inside in ordered[start : held[0]]:
                if inside in files:
                    _leave_out(found, files[inside], f"in {path}, a file")
                for name in folder_names.get(inside, ()):
                    folders.discard(name)


def _leave_out_what_was_stored_in_a_file_made_a_folder(found: _PlainMembers) -> None:
    """Take out of `found` the members and links stored under a file before a folder member of
    the file's name replaced it (`cat/f`, `cat/f/x.png`, then `cat/f/`): tar -x wrote nothing
    there ("Not a directory"), then made the folder, empty. Not where something was stored
    under the file's name before it (`cat/f/a.png`, then `cat/f`: the folder stays, the file
    is not written). Each name's folders looked up at its `/`s whose length is that of such a
    file's path: each name twice."""
    made = found.files_made_folders
    lengths = set(map(len, made))
    written_at: list[tuple[str, int]] = []  # each name, where it was last written
    for name, (data, _) in found.members.items():
        # a hard link whose file was replaced holds the file's data, stored before it
        written_at.append((name, max(data, found.first_places.get(name, data))))
    written_at.extend(found.link_places.items())
    written_at.extend(found.folder_places.items())
    placed = [  # and its path as unpacked
        (name, path, written)
        for name, written in written_at
        if (path := _unpacked_path(name)) is not None
    ]
    earliest: dict[str, int] = {}  # each such file's path -> the first place of what it holds
    for _, path, written in placed:
        slash = path.find("/")
        while slash != -1:
            if slash in lengths and path[:slash] in made:
                held = earliest.get(path[:slash])
                earliest[path[:slash]] = written if held is None else min(held, written)
            slash = path.find("/", slash + 1)

    def file_it_lay_in(path: str, written: int) -> str | None:
        slash = path.find("/")
        while slash != -1:
            folder = path[:slash]
            if slash in lengths and folder in made:
                for start, end in made[folder]:
                    if start < written < end and earliest[folder] > start:
                        return folder
            slash = path.find("/", slash + 1)
        return None

    for name, path, written in placed:
        if name in found.members or name in found.links:
            file = file_it_lay_in(path, written)
            if file is not None:
                _leave_out(found, name, f"in {file}, a file")


def _leave_out(found: _PlainMembers, name: str, why: str) -> None:
    """`name`'s member or link, as not written by tar -x (`why`, for the warning): a hard link
    to it links to nothing (not to its data, as where a newer member replaces it:
    `_PlainMembers._forget`)."""
    found.hard_links.pop(name, None)
    found._forget(name)
    found.first_places.pop(name, None)
    found.unwritten[name] = why


def _links_out(
    members: dict[str, tuple[int, int]],
    links: dict[str, str],
    looped: dict[str, str],
    link_texts: dict[str, str],
) -> dict[str, str]:
    """The links whose chain leads out of the archive (`_leaves_archive`), each with its target
    as stored (`ls -l` of the unpacked link), and on through the links its chain follows to the
    one leading out (`via.png -> up.png -> ../../host.png`): also where a member is stored under
    the path outside (`../up.png`, which tar does not unpack; `/etc/p.png`, which it unpacks as
    etc/p.png), and where a link on the way leads out (`x.png -> y.png -> /etc/p.png`: unpacked,
    x.png is the host's file too). Chains are walked, through links and linked folders as
    `_link_ends` goes, for the links that name no member themselves only (most name one)."""
    found = {name: link_texts[name] for name, at in links.items() if _leaves_archive(at)}
    for name in [name for name, at in links.items() if at not in members]:
        if name in found or name in looped:
            continue
        at: str | None = links[name]
        chain = [link_texts[name]]
        for _ in range(_MOST_LINKS):
            followed = _first_link_on(at, links)
            if followed is None:
                break
            at = _one_link_on(at, links)
            chain.append(link_texts[followed])
            if _leaves_archive(at) or at in members:
                break
        if at is not None and _leaves_archive(at):
            found[name] = " -> ".join(chain)
    return found


def _through_links(
    target: str,
    links: dict[str, str],
    deepest: int,
    members: dict[str, tuple[int, int]],
    is_folder: Callable[[str], bool],
) -> str:
    """The path a symbolic link's `target` (from the archive's root, its `..` parts as stored:
    `_link_target`) names once unpacked: a `..` after a folder that is a link steps out of the
    folder the link leads to, as the system resolves a path (`link/../x.png`, where `link ->
    sub/deeper`, is sub/x.png; `posixpath.normpath` took it for x.png). A path above the
    archive's root starts with `../` (`_leaves_archive`); links are followed only where a `..`
    comes after them (the rest of a chain is `_link_ends`'). A `..` after a file or a name the
    archive does not hold (`a.png/../b.png`), or a final `/` after a file (`a.png/`), names no
    file, as the system says "Not a directory" (ENOTDIR, ENOENT): `_NOWHERE` then. `deepest`:
    the most parts of a link's name; `members`: the regular members; `is_folder`: whether a
    path is a folder of the archive (`_folder_test`). A target longer than the system resolves
    (PATH_MAX) is taken as text: no file is there once unpacked (and a hostile one costs no
    more than its length)."""
    if len(target) > _PATH_MAX:
        return posixpath.normpath(target)
    ahead = target.split("/")[::-1]  # the parts still to walk, the next one last
    ups = ahead.count("..")  # the `..` parts among them: counted, not searched for at each part
    walked: list[str] = []  # the path walked, and each folder on it: one string a part
    hops = 0
    while ahead:
        if not ups:  # no `..` to come: the rest is text
            rest = posixpath.normpath("/".join([*walked[-1:], *ahead[::-1]]))
            if rest in members and target.endswith(_FOLDER_ENDS):
                return _NOWHERE + target
            return rest
        part = ahead.pop()
        if part in ("", "."):
            continue
        if part == "..":
            ups -= 1
            if not walked:
                return posixpath.normpath("/".join(["..", *ahead[::-1]]))
            if not is_folder(walked[-1]):
                return _NOWHERE + target
            walked.pop()
            continue
        walked.append(f"{walked[-1]}/{part}" if walked else part)
        if len(walked) > deepest:
            continue
        linked = links.get(walked[-1])
        if linked is None:
            continue
        hops += 1
        if hops > _MOST_LINKS:  # a loop: no file is there (`b.png -> b.png/../a.png`)
            return _NOWHERE + target
        if linked.startswith("/"):  # out to the host's files
            return posixpath.normpath("/".join([linked, *ahead[::-1]]))
        if len(linked) > _PATH_MAX:
            return posixpath.normpath(target)
        spliced = linked.split("/")
        ups += spliced.count("..")
        ahead += spliced[::-1]
        walked = []
    if walked and walked[-1] in members and target.endswith(_FOLDER_ENDS):
        return _NOWHERE + target
    return walked[-1] if walked else "."


# A symbolic link's target ends so where it names a folder (`dog/`, `dog/.`): a file there is
# "Not a directory".
_FOLDER_ENDS = ("/", "/.")
# What a symbolic link's target (`_through_links`) starts with where it names no file once
# unpacked (a `..` after a file, `a.png/`): no member's or folder's name starts so (a tar name
# holds no NUL), and no link is followed from it.
_NOWHERE = "\0"


def _folder_test(
    members: dict[str, tuple[int, int]], links: dict[str, str], folders: set[str]
) -> Callable[[str], bool]:
    """Whether a path is a folder of the archive once unpacked: a folder member, or one that a
    member, link or folder lies in. The names are sorted at the first path that is no folder
    member (only for the archives whose links' targets hold `..`)."""
    ordered: list[str] = []

    def is_folder(path: str) -> bool:
        if path in folders:
            return True
        if not ordered:
            # by the paths they unpack to (`/cat/a.png` is in cat; `cat/x/../b.png`, which tar
            # does not unpack, in no folder)
            unpacked = (
                n if n[:1] != "/" and "/." not in n else _unpacked_path(n)
                for n in (*(f + "/" for f in folders), *members, *links)
            )
            ordered.extend(sorted(n for n in unpacked if n is not None))
        start = path + "/"
        place = bisect.bisect_left(ordered, start)
        return place < len(ordered) and ordered[place].startswith(start)

    return is_folder


# The longest path the system resolves (Linux's PATH_MAX): a symbolic link's target longer
# than this names no file once unpacked.
_PATH_MAX = 4096

# How a symbolic link's target (`_link_target`) outside the archive's folder starts.
_OUTSIDE = ("/", "../")


def _leaves_archive(target: str) -> bool:
    """Whether a symbolic link's target (`_link_target`) lies outside the folder the archive
    unpacks to: an absolute path, or one above its root (`cat/x.png` -> `../../etc/passwd`)."""
    return target.startswith(_OUTSIDE) or target == ".."


# Links followed in one chain before it counts as a loop: Linux's limit (ELOOP) in one path.
_MOST_LINKS = 40


def _link_ends(
    members: dict[str, tuple[int, int]], links: dict[str, str], slashed: set[str]
) -> tuple[dict[str, str | None], dict[str, str]]:
    """(each link -> the regular member its chain ends at, None where it ends at no member;
    the links whose chain goes on past `_MOST_LINKS` links, a loop -> the name each holds).
    `links`: each link -> the name it holds, resolved in its folder. A chain goes through
    links (a symbolic link to a hard link, as tar stores a second name of a file it met) and
    linked folders on the way (`t.png -> rose2/a.png`, where `rose2 -> rose`); most links lead
    straight to a member: one lookup each. `slashed`: the symbolic links whose target ends in
    `/`: a chain through one names a folder, no file ("Not a directory": `x.png -> y.png`,
    `y.png -> f/`, `f -> a.png` reads nothing), wherever in the chain it is."""
    ends: dict[str, str | None] = {}
    looped: dict[str, str] = {}
    respelled: dict[str, str] | None = None  # made at the first link that misses a member
    for name, target in links.items():
        at: str | None = target
        hops = 0
        folder_only = name in slashed
        while at is not None and at not in members:
            if respelled is None:
                respelled = _respelled_members(members)
            if at in slashed:
                folder_only = True
            at = respelled.get(at) or _one_link_on(at, links)
            hops += 1
            if hops > _MOST_LINKS:
                looped[name], at = target, None
        ends[name] = None if folder_only else at
    return ends, looped


def _respelled_members(members: dict[str, tuple[int, int]]) -> dict[str, str]:
    """The members stored under a name `posixpath.normpath` spells otherwise (`dog/./c.png`,
    `dog//c.png`), by that spelling: the file a link's target (normalised) names once
    unpacked. Where two such names are one file, the last, as unpacking leaves it. Also a name
    with a leading slash (`/cat/a.png`, unpacked as cat/a.png: a hard link names it so). Not
    one of a `..` part, which tar does not unpack (`_unpacked_path`)."""
    return {
        posixpath.normpath(name.lstrip("/")): name
        for name in members
        if ("//" in name or "/." in name or name.startswith("/")) and ".." not in name.split("/")
    }


def _folder_link_ends(
    members: dict[str, tuple[int, int]],
    links: dict[str, str],
    folders: set[str],
    ends: dict[str, str | None],
    looped: dict[str, str],
) -> dict[str, str]:
    """Each link whose chain ends at a folder of the archive (a folder member, or one that a
    member's path holds) -> that folder; its chain goes on through links as `_link_ends`
    does. Only the links that lead to no member are looked at (most lead to one)."""
    pending = [name for name, end in ends.items() if end is None and name not in looped]
    if not pending:
        return {}
    # The folders' and members' paths, sorted: those under a folder follow its path and `/`.
    # (A set of every folder on the way to each took the square of a path's depth, in memory
    # too: 4 GB for one member 64,000 folders deep.)
    ordered = sorted([*(folder + "/" for folder in folders), *members])

    def holds(at: str) -> bool:
        """Whether `at` is a folder of the archive: one that a folder or member lies in."""
        if at == ".":  # the archive's root (`all` -> `.`), as normpath spells it
            return True
        start = at + "/"
        place = bisect.bisect_left(ordered, start)
        return place < len(ordered) and ordered[place].startswith(start)

    found: dict[str, str] = {}
    for name in pending:
        at: str | None = links[name]
        for _ in range(_MOST_LINKS):
            if at is None or holds(at):
                break
            at = _one_link_on(at, links)
        if at is not None and holds(at):
            found[name] = "" if at == "." else at
    return found


def _one_link_on(name: str, links: dict[str, str]) -> str | None:
    """`name` with the first link on its way followed (a linked folder holding it, or `name`
    itself), None where none is."""
    link = _first_link_on(name, links)
    if link is None or link == name:
        return links.get(name)
    return posixpath.normpath(links[link] + name[len(link) :])


def _first_link_on(name: str, links: dict[str, str]) -> str | None:
    """The first link on the way to `name`: a linked folder holding it, or `name` itself;
    None where none is."""
    slash = name.find("/")
    while slash != -1:
        folder = name[:slash]
        if folder in links:
            return folder
        slash = name.find("/", slash + 1)
    return name if name in links else None


_REGULAR, _FOLDER, _HARD_LINK, _SYMBOLIC_LINK = (b"0", b"\0", b"7"), b"5", b"1", b"2"
# GNU's incremental dump of a folder (`tar -g`): a folder. Its volume label, a file continued
# from another volume and its old long names are no file of the archive; tarfile knows none of
# these, nor any other kind, which tar -x makes a file of (`_KNOWN_KINDS`).
_FOLDER_KINDS = (b"D",)
_KNOWN_KINDS = (*tarfile.SUPPORTED_TYPES, *_FOLDER_KINDS, b"V", b"M", b"N")
# The FIFOs and devices (tar stores no socket), by what each is, in the words `file_kind` gives
# such a file on disk: tar -x makes them, and the folder reader lists one named like an image as
# an image that cannot be read.
_SPECIAL = {
    tarfile.CHRTYPE: file_kind(stat.S_IFCHR),
    tarfile.BLKTYPE: file_kind(stat.S_IFBLK),
    tarfile.FIFOTYPE: file_kind(stat.S_IFIFO),
}
_ZERO_BLOCK = bytes(tarfile.BLOCKSIZE)


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


_LABEL_SUFFIXES = (".cls", ".json")
# Label members up to this size are read with their header (a class index, a small JSON
# object); a larger one is read on its own, where its size is checked (`_member_bytes`).
_LABEL_READ_BYTES = 4096


def _read_plain_headers(path: str, size: int, labels: bool = False) -> TarListing | None:
    """`list_tar`'s listing, about five times faster than tarfile (which parses every field of
    every header) for the tars shards and image folders are: ustar/GNU headers with GNU long
    names or pax path/size/linkpath records. None for anything else (a damaged or truncated
    tar, base-256 sizes, sparse files, global pax headers): tarfile then reads it, and says
    what is wrong. `labels`: keep the bytes of small label members (`TarListing.labels`);
    they follow their header, so the read is from the buffer the header came in."""
    try:
        with open(path, "rb", buffering=0) as handle:
            chunks = _CheckedChunks(handle)
            found = _PlainMembers(chunks, size, labels)
            if not _walk_plain_headers(chunks, found):
                return None
    except (OSError, ValueError):
        return None
    return _listing(path, found)


def _walk_plain_headers(chunks: _CheckedChunks, found: _PlainMembers) -> bool:
    """Every header of the tar from its start to its end-of-archive marker, its members into
    `found`; False where a plain reading is not enough (tarfile's job). ValueError where a
    field does not parse or a checksum does not hold."""
    offset = 0
    long_name = long_link = None  # a GNU long name or long link, for the header after it
    pax: dict[str, str] = {}  # the pax records for the header after them
    read, take = chunks.read, found.take  # looked up once, not at each header
    # the headers of the chunk read last to check (the lists are cleared, never replaced)
    unchecked, checksums = chunks.unchecked, chunks.checksums
    while True:
        block = read(offset, tarfile.BLOCKSIZE)
        if len(block) < tarfile.BLOCKSIZE:
            return False  # no end-of-archive marker: let tarfile judge
        if block == _ZERO_BLOCK:
            return chunks.checksums_hold()
        fields = _plain_header_fields(block)
        if fields is None:
            return False
        checksum, length, kind = fields
        unchecked.append(offset - chunks.start)
        checksums.append(checksum)
        data = offset + tarfile.BLOCKSIZE
        offset = data + -(-length // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE  # whole blocks
        if kind in _EXTENDED_HEADERS:
            payload = _extended_payload(chunks, block, checksum, data, length)
            if payload is None:
                return False
            if kind == b"L":
                long_name = _text(payload)
            elif kind == b"K":
                long_link = _text(payload)
            else:
                pax = _pax_records(payload)
            continue
        if pax and any(key.startswith("GNU.sparse.") for key in pax):
            return False  # stored sparse: tarfile lists it by its real name
        name = _plain_member_path(block, long_name, pax)
        if "size" in pax:
            length = int(pax["size"])
            if length < 0:
                return False
            offset = data + -(-length // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
        linkname = (pax.get("linkpath") if pax else None) or long_link
        if not take(block, kind, name, data, length, linkname):
            return False
        long_name = long_link = None
        pax = {}


# GNU long name, GNU long link, pax extended header: each says more of the header after it.
_EXTENDED_HEADERS = (b"L", b"K", b"x")


def _plain_header_fields(block: bytes) -> tuple[int, int, bytes] | None:
    """A header's (checksum, data length, kind); None for a length tarfile must read (base-256,
    negative). ValueError where a field is not a number."""
    checksum = int(block[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
    if block[124] & 0x80:  # base-256 size (over 8 GiB)
        return None
    length = int(block[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
    if length < 0:  # `-1000` parses; the next header would be this one or before
        return None
    return checksum, length, block[156:157]


def _extended_payload(
    chunks: _CheckedChunks, block: bytes, checksum: int, data: int, length: int
) -> bytes | None:
    """The data of an extended header (`block`, its data `length` bytes at `data`); None where
    its checksum does not hold (checked before its length is trusted to read) or the file ends
    first."""
    if checksum != sum(block) - sum(block[148:156]) + 256:
        return None
    payload = chunks.read(data, length)
    return None if len(payload) < length else payload


def _plain_member_path(block: bytes, long_name: str | None, pax: dict[str, str]) -> str:
    """The path of header `block`'s member: a pax path, a GNU long name, or its own name field
    (after a POSIX ustar prefix)."""
    name = pax.get("path") or long_name or _text(block[0:100])
    if block[257:263] == b"ustar\0" and block[345] and "path" not in pax:
        name = _text(block[345:500]) + "/" + name  # POSIX ustar's prefix field
    return name


class _CheckedChunks:
    """A tar read a chunk at a time (as a buffered file would), the checksums of the headers in
    a chunk checked together before it is dropped: at a few microseconds a header in Python,
    the sums were most of a listing."""

    __slots__ = ("handle", "chunk", "start", "unchecked", "checksums")

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.chunk, self.start = b"", 0  # the bytes of the file read last, and where they begin
        # The headers of `chunk` not yet checked: where each begins in it, and its checksum.
        self.unchecked: list[int] = []
        self.checksums: list[int] = []

    def read(self, at: int, length: int) -> bytes:
        """`length` bytes from `at` (fewer at the end of the file), from the chunk where it
        holds them, else read with the bytes after them into a new chunk. ValueError where a
        header of the chunk dropped does not hold its checksum."""
        chunk, start = self.chunk, self.start
        if at < start or at + length > start + len(chunk):
            if not self.checksums_hold():
                raise ValueError("a header's checksum does not hold")
            self.unchecked.clear()
            self.checksums.clear()
            self.handle.seek(at)
            chunk = self.chunk = _read_up_to(self.handle, max(length, _CHUNK_BYTES))
            start = self.start = at
        return chunk[at - start : at - start + length]

    def checksums_hold(self) -> bool:
        return _checksums_hold(self.chunk, self.unchecked, self.checksums)


class _PlainMembers:
    """The members `_read_plain_headers` finds in the tar `chunks` reads (`size` bytes), or that
    tarfile lists (`chunks` None): regular members (name -> (offset, size)), the bytes of small
    label members where asked (`labels`), links (name -> the name each holds; `link_texts`: its
    target as stored), members stored sparse, and folders. A name met again (`tar -rf` appends
    a newer version of a file; a file stored again as a link, or the other way round) keeps
    its last member only, as `tar -xf` leaves the last in place; so does a path met under
    another spelling (`/cat/a.png` after `cat/a.png`: `_unpacked_path`)."""

    __slots__ = (
        "chunks",
        "size",
        "labels",
        "members",
        "label_bytes",
        "links",
        "link_texts",
        "sparse",
        "folders",
        "spellings",
        "hard_links",
        "hard",
        "link_places",
        "first_places",
        "folder_places",
        "unwritten",
        "files_made_folders",
        "unlinked",
        "unmade",
        "special",
    )

    def __init__(self, chunks: _CheckedChunks | None, size: int, labels: bool) -> None:
        self.chunks, self.size, self.labels = chunks, size, labels
        self.members: dict[str, tuple[int, int]] = {}
        self.label_bytes: dict[str, bytes] = {}
        self.links: dict[str, str] = {}
        self.link_texts: dict[str, str] = {}
        self.sparse: dict[str, None] = {}
        self.folders: set[str] = set()
        # Each unpacked path stored under a spelling of its own (`/cat/a.png`, `cat//a.png`)
        # -> that name: few archives hold one, so a plain name costs one look-up of an empty
        # dict.
        self.spellings: dict[str, str] = {}
        # Each regular member that hard links name -> those links with the name each holds: a
        # newer member of its name leaves them the data they were made to (`_forget`).
        self.hard_links: dict[str, list[tuple[str, str]]] = {}
        # The names of the hard links (a hard link to a folder is made by no tar -x).
        self.hard: set[str] = set()
        # Each link's place in the tar (where its header's data would begin), and each name
        # stored more than once, the place of its first member: a shard's samples are in the
        # order their names first appear (a sample appended again with `tar -rf` keeps its
        # place, as in the folder `tar -xf` unpacks, listed in order).
        self.link_places: dict[str, int] = {}
        self.first_places: dict[str, int] = {}
        self.folder_places: dict[str, int] = {}  # each folder member's first place in the tar
        # The members and links tar -x does not write, a file and a folder of one name meeting
        # (`_leave_out_what_tar_writes_not`), each with why.
        self.unwritten: dict[str, str] = {}
        # Each file a folder member replaced (its path as unpacked) -> (the file's place, the
        # folder's) each time: what was stored under it in between was not written.
        self.files_made_folders: dict[str, list[tuple[int, int]]] = {}
        # The hard links whose target no member, link or folder held when each was met:
        # (its name, its target as stored, its place), settled once all are listed
        # (`settle_hard_links_to_nothing`).
        self.unlinked: list[tuple[str, str, int]] = []
        # Of those, the ones tar -x does not make (to nothing), each with its target as stored.
        self.unmade: dict[str, str] = {}
        # The members that are FIFOs or devices, each with what it is (`special_member`).
        self.special: dict[str, str] = {}

    def take(
        self, block: bytes, kind: bytes, name: str, data: int, length: int, linkname: str | None
    ) -> bool:
        """The member of header `block` (its path `name`, its data `length` bytes at `data`;
        `linkname` from the headers before it) into the listing; False for what tarfile must
        read: data past the end of the file, a kind of member not known here."""
        member = _member_name(name)
        if kind in _REGULAR and not name.endswith("/"):
            if data + length > self.size:
                return False
            members = self.members
            # Most names are new and plain: two look-ups, no call (`replace`'s test inline).
            if (
                member in members
                or member in self.links
                or self.spellings
                or member[:1] == "/"
                or "//" in member
                or "/." in member
            ):
                self.replace(member)
            members[member] = (data, length)
            if (
                self.labels
                and length <= _LABEL_READ_BYTES
                and member.lower().endswith(_LABEL_SUFFIXES)
            ):
                payload = self.chunks.read(data, length)
                if len(payload) < length:
                    return False
                self.label_bytes[member] = payload
        elif kind in _REGULAR or kind == _FOLDER:
            self.folder(member, data)
        elif kind in (_HARD_LINK, _SYMBOLIC_LINK):
            self.link(member, linkname or _text(block[157:257]), kind == _SYMBOLIC_LINK, data)
        elif kind in _SPECIAL:
            self.special_member(member, _SPECIAL[kind], data)
        else:
            return False
        return True

    def special_member(self, member: str, what: str, at: int) -> None:
        """A FIFO or a device (`what`), its header's data at `at`: a member of no bytes that
        no read opens (`TarListing.locator`), replacing what was stored under its name."""
        self.replace(member)
        self.members[member] = (at, 0)
        self.special[member] = what

    def folder(self, member: str, at: int) -> None:
        """A folder member (`at`: its place in the tar): tar -x replaces a link or file stored
        before it under its name by the folder (`cat/s.png -> a.png`, then `cat/s.png/`: its
        files are written into it)."""
        if (
            member in self.links
            or member in self.members
            or self.spellings
            or member[:1] == "/"
            or "//" in member
            or "/." in member
        ):
            path = _unpacked_path(member)
            stored = self.spellings.get(path, path) if path is not None else member
            since = self.place(stored) if stored in self.members or stored in self.links else at
            if stored in self.members:  # tar -x unlinks the file and makes the folder
                self.files_made_folders.setdefault(path or member, []).append((since, at))
            self.replace(member)
            # the file it replaces is gone: a file stored again takes its own place
            self.first_places.pop(member, None)
            # something has been at its path since the file or link it replaced was written:
            # a file of the name of a folder above it, stored after that, is not written
            self.folder_places.setdefault(member, since)
        self.folders.add(member)
        self.folder_places.setdefault(member, at)

    def place(self, name: str) -> int:
        """Where the member, link or folder `name` first appears in the tar (where stored
        again: its first member's place, `first_places`)."""
        first = self.first_places.get(name)
        if first is not None:
            return first
        if name in self.members:
            return self.members[name][0]
        return self.link_places[name] if name in self.links else self.folder_places[name]

    def link(self, member: str, linkname: str, symbolic: bool, at: int) -> None:
        """A link member (`at`: where its header's data would begin, its place in the tar). A
        hard link to a symbolic link is a second name of that symbolic link, as tar -x makes
        it: its target read from the hard link's own folder (`cp -al cat dog`: dog/s.png ->
        a.png is dog/a.png, not cat's)."""
        if not symbolic:
            target = _link_target(member, linkname, symbolic=False)
            if target == (_unpacked_path(member) or member) and (
                target in self.members or target in self.links or target in self.spellings
            ):
                return  # a hard link to itself: tar -x leaves the file there as it is
            if self.sparse and (target in self.sparse or self.spellings.get(target) in self.sparse):
                # A second name of a file stored sparse (`tar --sparse` of a folder with hard
                # links): tar -x makes it; not read, as that file is not, and said with it
                self.replace(member)
                self.sparse[member] = None
                return
            stored = target if target in self.links else self.spellings.get(target)
            if stored in self.links and stored not in self.hard:
                linkname, symbolic = self.link_texts[stored], True
            elif stored is None and target not in self.members and target not in self.folders:
                # tar -x links to what its target's path holds at this point: maybe nothing
                # (stored after it, or never), a folder only its members imply, or a path
                # through a link to a folder; the first leaves what is at its name as it is
                self.unlinked.append((member, linkname, at))
                return
        self.replace(member)
        target = self.links[member] = _link_target(member, linkname, symbolic=symbolic)
        self.link_places[member] = at
        self.link_texts[member] = linkname
        if not symbolic:
            self.hard.add(member)
            stored = target if target in self.members else self.spellings.get(target)
            if stored in self.members:
                self.hard_links.setdefault(stored, []).append((member, target))

    def settle_hard_links_to_nothing(self) -> None:
        """The hard links `link` put aside (`unlinked`), as tar -x met each: one whose target's
        path was then a folder (a member stored in it before the link) or lay through a link
        (a linked folder on its way) is a link as any other; one to nothing is not made ("Cannot
        hard link: No such file or directory": a hard link stored before its target, or to a
        name never stored), leaving what was at its name, and the folder it lies in, which tar
        makes for it. The targets, and the links, are looked up a folder at a time in a tree of
        their parts (`_part_tree`, `_links_by_part`): linear in the names' length, however many
        there are."""
        pending = [
            (name, text, at, _link_target(name, text, symbolic=False))
            for name, text, at in self.unlinked
        ]
        targets = _part_tree((target, target) for *_, target in pending)
        earliest: dict[str, int] = {}  # each target -> the first place of a name inside it
        for name in [*self.members, *self.links, *self.folders]:
            path = _unpacked_path(name)
            if path is not None:
                for folder in _tree_folders_of(targets, path):
                    place = self.place(name)
                    earliest[folder] = min(place, earliest.get(folder, place))
        links = _links_by_part(self.links)
        made: dict = {}  # the folders tar made for the links before not made, by their parts
        for name, text, at, target in pending:
            node: dict | None = made
            for part in target.split("/"):
                node = node.get(part) if node is not None else None
            implied = earliest.get(target, at) < at or node is not None
            # (a link on the way to a file: "Not a directory", nothing is made)
            through = any(
                self.link_places[link] < at and self.links[link] not in self.members
                for link in _tree_folders_of(links, target)
            )
            if implied or through:
                stored_again = name in self.members or name in self.links or name in self.folders
                if stored_again and self.place(name) > at:
                    continue  # stored again after the link: that stays
                self.replace(name)
                self.links[name] = target
                self.link_places[name] = at
                self.link_texts[name] = text
                self.hard.add(name)
                continue
            self.unmade[name] = text
            folder = posixpath.dirname(name)
            if folder and folder not in self.members and folder not in self.links:
                self.folders.add(folder)
                self.folder_places.setdefault(folder, at)
                node = made
                for part in posixpath.dirname(_unpacked_path(name) or name).split("/"):
                    node = node.setdefault(part, {})
        self.unlinked = []

    def replace(self, member: str) -> None:
        """Forget what an earlier member of the path `member` unpacks to left: the member
        about to be kept replaces it, in the listing's order too, and takes its place in the
        tar (`first_places`)."""
        first = self._forget(member)
        if member[:1] == "/" or "//" in member or "/." in member:
            unpacked = _unpacked_path(member)
            if unpacked is None or unpacked == member:
                self._keep_place(member, first)
                return
            earlier: str | None = self.spellings.get(unpacked, unpacked)
            self.spellings[unpacked] = member
        elif self.spellings:
            earlier = self.spellings.pop(member, None)
        else:
            self._keep_place(member, first)
            return
        if earlier is not None and earlier != member:
            place = self._forget(earlier)
            place = self.first_places.pop(earlier, place)
            first = place if first is None or (place is not None and place < first) else first
        self._keep_place(member, first)

    def _keep_place(self, member: str, place: int | None) -> None:
        """`member` stored again: its first place in the tar, where its earlier member was."""
        if place is not None:
            self.first_places[member] = min(place, self.first_places.get(member, place))

    def _forget(self, member: str) -> int | None:
        """Forget `member`'s entry; its place in the tar (None for a folder, a sparse member,
        or none)."""
        earlier = self.members.pop(member, None)
        if earlier is not None:
            self.label_bytes.pop(member, None)
            what = self.special.pop(member, None) if self.special else None
            # A hard link is a second name of the file it was made to: tar -x replaces the
            # file under this name and leaves the link the earlier data (or FIFO).
            for link, target in self.hard_links.pop(member, ()):
                if self.links.get(link) == target:
                    del self.links[link], self.link_texts[link]
                    self.hard.discard(link)
                    self.members[link] = earlier
                    if what is not None:
                        self.special[link] = what
                    self._keep_place(link, self.link_places.pop(link))
            return earlier[0]
        if self.links.pop(member, None) is not None:
            del self.link_texts[member]
            self.hard.discard(member)
            return self.link_places.pop(member)
        if self.sparse:
            self.sparse.pop(member, None)
        return None


def _part_tree(held: Iterable[tuple[str, str]]) -> dict:
    """A tree of the paths of `held` (each `a/b/c` with what is held there) by their
    `/`-parts: each node a dict of parts -> nodes, the node where a path ends holding what is
    held there under the key None (the last of a path given twice)."""
    tree: dict = {}
    for path, value in held:
        node = tree
        for part in path.split("/"):
            node = node.setdefault(part, {})
        node[None] = value
    return tree


def _tree_folders_of(tree: dict, path: str) -> list[str]:
    """What `tree` (`_part_tree`, `_links_by_part`) holds at the folders `path` lies in (a
    path, a link's name), outermost first: one look-up a part, up to where the tree has no
    more."""
    found, node = [], tree
    for part in path.split("/")[:-1]:
        node = node.get(part)
        if node is None:
            break
        if None in node:
            found.append(node[None])
    return found


# `_read_plain_headers` reads the file this much at a time (as a buffered file would).
_CHUNK_BYTES = 1 << 16


def _read_up_to(handle: BinaryIO, length: int) -> bytes:
    """Up to `length` bytes from the handle's position: fewer only at the end of the file."""
    parts, got = [], 0
    while got < length:
        part = handle.read(length - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _checksums_hold(chunk: bytes, places: list[int], checksums: list[int]) -> bool:
    """Whether each tar header in `chunk` (beginning at `places`) holds its checksum
    (`checksums`): the sum of its bytes, its checksum field counted as spaces. Checked a chunk
    at a time: at a few microseconds a header in Python, the sums were most of a listing."""
    if len(places) < 16:
        return all(
            stored == sum(chunk[at : at + 512]) - sum(chunk[at + 148 : at + 156]) + 256
            for at, stored in zip(places, checksums, strict=True)
        )
    import numpy as np

    rows = np.frombuffer(chunk, np.uint8)[np.add.outer(np.array(places), np.arange(512))]
    sums = rows.sum(axis=1, dtype=np.int64) - rows[:, 148:156].sum(axis=1, dtype=np.int64)
    return bool(np.array_equal(sums + 256, np.array(checksums, np.int64)))


def _pax_records(payload: bytes) -> dict[str, str]:
    """The records of a pax extended header (`LEN key=value\\n` each)."""
    records, position = {}, 0
    while position < len(payload) and payload[position : position + 1] != b"\0":
        space = payload.index(b" ", position)
        end = position + int(payload[position:space])
        key, _, value = payload[space + 1 : end - 1].partition(b"=")
        records[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        position = end
    return records


def _damaged(path: str, count: int, reason: str) -> DamagedTar:
    return DamagedTar(
        f"{path} is truncated or damaged after {count} members ({reason})",
        "write or copy it again; `tar tvf` shows where it breaks",
    )


# --- which specs are ours -------------------------------------------------------------------


def expand_braces(pattern: str) -> list[str]:
    """`a-{000..002}.tar` -> a-000.tar, a-001.tar, a-002.tar; `{x,y}` -> x, y (nested too), as
    webdataset (braceexpand) expands shard names; `{a..b..step}` steps, and a range is padded
    to its longer bound where a bound has a leading zero (`{00..12}`, not `{0..12}`)."""
    start = pattern.find("{")
    if start < 0:
        return [pattern]
    depth = 0
    for end in range(start, len(pattern)):
        depth += {"{": 1, "}": -1}.get(pattern[end], 0)
        if depth == 0:
            break
    else:
        raise InputError(f"unbalanced braces in {pattern!r}", _SHARDS_HINT)
    body, head, tail = pattern[start + 1 : end], pattern[:start], pattern[end + 1 :]
    numbers = re.fullmatch(r"(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?", body)
    if numbers:
        low, high, by = numbers.groups()
        if max(len(low), len(high), len(by or "")) > 30:  # int() refuses 4,300 digits
            raise InputError(
                f"{short_repr(pattern)} has a range of numbers over 30 digits long",
                "check the braces: {000000..000127} names 128 shards",
            )
        # braceexpand's padding: a bound written with a leading zero (`00`, `-05`, not `0`
        # itself) pads every number to the longer bound; `{0..15}` is 0, 1, ... 15.
        padded = any(b.startswith(("0", "-0")) for b in (low, high) if b not in ("0", "-0"))
        width = max(len(low), len(high)) if padded else 0
        step = (int(by) or 1) if by else 1  # `{0..10..2}`: a step, its sign ignored
        first, last = int(low), int(high)
        count = abs(last - first) // step + 1
        _check_count(pattern, count)
        step = step if last >= first else -step
        choices = [str(first + i * step).zfill(width) for i in range(count)]
    else:
        choices, depth, part = [], 0, ""
        for char in body:
            depth += {"{": 1, "}": -1}.get(char, 0)
            if char == "," and depth == 0:
                choices.append(part)
                part = ""
            else:
                part += char
        choices.append(part)
        choices = [word for choice in choices for word in expand_braces(choice)]
    rests = expand_braces(tail)
    _check_count(pattern, len(choices) * len(rests))
    return [head + choice + rest for choice in choices for rest in rests]


def _check_count(pattern: str, count: int) -> None:
    if count > MAX_PATTERN_NAMES:
        raise InputError(
            f"{pattern!r} names {count:,} shards, more than {MAX_PATTERN_NAMES:,}",
            "check the braces: {000000..000127} names 128 shards",
        )


def _is_tar_name(name: str) -> bool:
    return name.lower().endswith(".tar")


# Compressed tars, which webdataset decompresses as it streams them: torchkit reads a shard in
# place by offset, so one so named is refused naming it (it was "dataset not found", or "no
# images" for a folder of them, though the files were there).
_COMPRESSED_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst")


def is_compressed_tar_name(name: str) -> bool:
    return name.lower().endswith(_COMPRESSED_TAR_SUFFIXES)


def compressed_tar_error(path: str, more: int = 0) -> InputError:
    """The error of a compressed tar at `path` (`more`: how many others there are)."""
    others = f" (and {more} more)" if more else ""
    return InputError(
        f"{path} is a compressed tar{others}", "shards are read in place: decompress it to a .tar"
    )


def is_shard_pattern(spec: str) -> bool:
    """Whether `spec` reads as a brace pattern or a `::` list of shards (a name, not a file)."""
    return ("::" in spec or ("{" in spec and "}" in spec)) and not os.path.exists(spec)


def _shard_list(spec: str) -> list[str] | None:
    """The shards a pattern or `::` list names (each must exist), or None if `spec` is neither."""
    if not is_shard_pattern(spec):
        return None
    names = [name for part in spec.split("::") for name in expand_braces(part)]
    if names and all(is_compressed_tar_name(name) for name in names):
        there = [name for name in names if os.path.isfile(name)]
        if there:
            raise compressed_tar_error(there[0], len(there) - 1)
    if not names or not all(_is_tar_name(name) for name in names):
        return None
    missing = [name for name in names if not os.path.isfile(name)]
    if missing:
        unfetched = unfetched_url_error(missing[0])
        if unfetched is not None:
            raise unfetched
        raise InputError(
            f"shard not found: {missing[0]}"
            + (
                f" ({len(missing)} of the {len(names)} shards named are missing)"
                if len(missing) > 1
                else ""
            ),
            "check the pattern: {000000..000009} names every shard from the first to the last",
        )
    return names


def _folder_shards(folder: Path) -> list[str] | None:
    """The `.tar` files of a folder that holds only shards, naturally sorted; None when it
    holds a subfolder or an image (a folder of images), found without listing it all."""
    tars, others = [], []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if is_skipped_folder(entry.name):  # hidden, or __MACOSX
                    continue
                if entry.is_dir() or is_image_file(entry.name):
                    return None
                if _is_tar_name(entry.name):
                    tars.append(entry.name)
                elif entry.name not in _SIDE_FILES:
                    others.append(entry.name)
    except OSError:
        return None
    compressed = sorted(name for name in others if is_compressed_tar_name(name))
    if compressed:  # also beside .tar shards, where "other files" asked for a pattern
        raise compressed_tar_error(str(folder / compressed[0]), len(compressed) - 1)
    if not tars:
        return None
    if others:
        raise InputError(
            f"{folder} holds .tar shards and other files ({', '.join(sorted(others)[:_SHOWN])})",
            "a folder of shards holds only .tar shards and classes.txt, classes.json or "
            "manifest.json; name the shards with a pattern, DIR/NAME-{000000..000009}.tar",
        )
    return [str(folder / name) for name in sorted(tars, key=_shard_order)]


def _shard_order(name: str) -> tuple:
    return tuple(natural_key(part) for part in re.split(r"(\d+)", name) if part)


# --- the data -------------------------------------------------------------------------------


def open_stored(
    spec: str, classes: Sequence[str] | None, allow_unlabelled: bool, every_image: bool = False
) -> DataSource | None:
    """The shards or `.tar` archive `spec` names (module docstring), or None if it names none.
    `every_image`: a `.tar` of a folder is read as `source.open_data` reads one with it."""
    listed = _shard_list(spec)
    if listed is not None:
        return _open_shards(spec, listed, classes, allow_unlabelled, by_split=False, named=spec)
    path = Path(spec)
    if path.is_dir():
        found = _folder_shards(path)
        if found is None:
            return None
        # Named as given, as a folder of images is (not by its absolute path).
        return _open_shards(spec, found, classes, allow_unlabelled, by_split=True, named=str(path))
    if is_compressed_tar_name(spec) and path.is_file():
        raise compressed_tar_error(spec)
    if not _is_tar_name(spec) or not path.is_file():
        return None
    listing = list_tar(spec, labels=True)
    if (
        _has_labelled_samples(listing)
        or _is_flat_with_unread_labels(listing)
        or (is_numbered_shard_name(path.name) and not _holds_an_image_folder(listing))
    ):
        return _open_shards(
            spec, [spec], classes, allow_unlabelled, by_split=False, listed=[listing], named=spec
        )
    return _open_folder_tar(spec, listing, classes, allow_unlabelled, every_image)


@dataclass(slots=True)
class ShardSample:
    shard: str  # as shown: relative to the shards' folder
    key: str
    image: str  # the path `tar -x` unpacks its image member to (`/000.png` is 000.png)
    locator: tuple[int, int] | None  # where its bytes are
    name: str | None  # the class name its label gives
    index: int | None  # the class index its label gives
    # Of a sample without a label, its first member torchkit does not read that may be one
    # (`_unread_label_like`: `KEY.label`, `KEY.class`, `KEY.txt`), named where it is read
    # unlabelled or refused: such shards read as unlabelled without a word.
    unread: str | None = None


# Members other shards label a sample by, which torchkit does not read as its label (it reads
# `KEY.cls`, as timm's webdataset reader does, and `KEY.json`): webdataset's own decoder reads
# `class` and `cls2` as integers, other writers a class name in `label` or `txt`. In the order
# one is named: the likeliest label first.
_LABEL_NAMED_EXTENSIONS = ("label", "labels", "class", "cls2", "target", "idx", "index")
_LABEL_LIKE_EXTENSIONS = (*_LABEL_NAMED_EXTENSIONS, "txt")
_LABELS_READ = 'torchkit reads a label from KEY.cls, the class index, or KEY.json: "label", "cls"'


def _key_and_extension(member: str) -> tuple[str, str] | None:
    """webdataset's grouping: (member path up to the first dot of its basename, the rest), of
    the path `tar -x` unpacks the member to where it is spelled otherwise (`/000.png` appended
    after `000.png` and `000.cls` replaces the image of sample 000, as in the listing: it was a
    sample `/000` of no label, and 000 one of no image)."""
    if member[:1] == "/" or "//" in member or "/./" in member:
        member = _unpacked_path(member) or member
    slash = member.rfind("/") + 1
    dot = member.find(".", slash)
    if dot <= slash or dot == len(member) - 1:
        return None
    return member[:dot], member[dot + 1 :].lower()


def _has_labelled_samples(listing: TarListing) -> bool:
    """Whether some image in the tar has a `.cls` or `.json` label beside it (a shard). Not a
    `KEY.json` in a folder that holds no "label" or "cls" (`_holds_no_label`): an annotation
    tool's metadata beside each image of a class folder (LabelMe's `img.json`) made a `.tar` of
    class folders a shard of unlabelled samples, its classes lost without a word, where the
    folder it unpacks to reads as an image folder."""
    keys = [(member, _key_and_extension(member)) for member in listing.members]
    images = {split[0] for member, split in keys if split and is_image_file(member)}
    special = listing.special  # a FIFO or a device holds no label (a folder's file, unread)
    return any(
        split[0] in images
        and (split[1] == "cls" or split[1] == "json" and not _holds_no_label(listing, member))
        and member not in special
        for member, split in keys
        if split
    )


def _is_flat_with_unread_labels(listing: TarListing) -> bool:
    """Whether the tar's images all lie at its top (no class folder) and one has a member
    other writers label by beside it (`KEY.label`, `KEY.class`: `_LABEL_NAMED_EXTENSIONS`, not
    a `KEY.txt` caption): webdataset samples whose label torchkit does not read, said so as a
    shard's are. Read as flat images, train said to arrange them in class folders."""
    keys = [(member, _key_and_extension(member)) for member in listing.members]
    images = {split[0] for member, split in keys if split and is_image_file(member)}
    if not images or any("/" in key for key in images):
        return False
    special = listing.special
    return any(
        split[0] in images and split[1] in _LABEL_NAMED_EXTENSIONS and member not in special
        for member, split in keys
        if split
    )


def _holds_no_label(listing: TarListing, member: str) -> bool:
    """Whether the `KEY.json` `member`, in a folder, holds no label: a JSON value of at most
    `_LABEL_READ_BYTES` (as read with its header) that is not an object, or an object without
    "label" and "cls". A larger one, or one not JSON, may be a label (the shard's reading says
    what is wrong)."""
    if "/" not in member:
        return False
    data = listing.labels.get(member)
    if data is None:  # listed by tarfile, which reads no data: read alone
        where = listing.locator(member)
        if not isinstance(where, tuple) or where[1] > _LABEL_READ_BYTES:
            return False
        try:
            data = TarReader(listing.path, listing.stamp).read(where)
        except OSError:
            return False
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError):
        return False
    return not isinstance(meta, dict) or ("label" not in meta and "cls" not in meta)


def _holds_an_image_folder(listing: TarListing) -> bool:
    """Whether the tar lays out as an image folder: images, each in a folder and with no other
    member of its webdataset sample beside it (a `KEY.cls`, `KEY.txt`), but a `KEY.json` that
    holds no label (`_holds_no_label`: an annotation tool's metadata, a file the folder reads as
    no image, as in a `.tar` of any other name). A tar named like a shard (`flowers-2024.tar`,
    `caltech-101.tar`) that holds one was read as unlabelled shards: one class in
    dataset-stats, and train and eval refused it for want of `KEY.cls`."""
    keys = [(member, _key_and_extension(member)) for member in listing.members]
    mixed = {
        split[0]
        for member, split in keys
        if split
        and not is_image_file(member)
        and not (split[1] == "json" and _holds_no_label(listing, member))
    }
    images = [(member, split) for member, split in keys if is_image_file(member)]
    return bool(images) and all(
        "/" in _member_name(member) and split[0] not in mixed
        for member, split in images
        if split is not None
    )


def _shard_samples(
    listing: TarListing,
    shown: str,
    reader: TarReader,
    labels: dict | None = None,
    not_unpacked: list[str] | None = None,
) -> list[ShardSample]:
    """The samples of one shard, in member order, each where its first member is (a name stored
    again keeps its first place; `shown`: the shard's name in messages).
    `labels`: the class names and indices met so far (each its own key and value), so that the
    samples of one class share one object: each `KEY.json` parses its name into a new str (and
    an index past 256 is a new int), about 60 bytes a sample held until the labels are made.
    `not_unpacked`: where the sample members of a `..` part are added (`SHARD/MEMBER`), which
    are not read, as tar -x does not unpack them (and a `.tar` of a folder does not read them):
    read, `../000.png` was a sample `s.tar/../000.png`."""
    labels = {} if labels is None else labels
    groups: dict[str, dict[str, str]] = {}
    looping: list[str] = []
    for member in listing.in_tar_order():
        split = _key_and_extension(member)
        if split is None or member.startswith("__") and "/" not in member:  # webdataset meta
            continue
        if _unpacked_path(member) is None:
            if not_unpacked is not None and _read_by_its_sample(member):
                not_unpacked.append(f"{shown}/{member}")
            continue
        if member in listing.looped:
            looping.append(member)
        key, extension = split
        group = groups.setdefault(key, {})
        if extension in group:
            # Two spellings of one extension (`000.PNG`, `000.png`), named as stored: the
            # lowered `000.png twice` named a member `tar -tf` lists once.
            raise InputError(
                f"{shown} holds {group[extension]} and {member}, two .{extension} members of "
                f"sample {key}",
                "one member per extension a sample: remove or rename one",
            )
        group[extension] = member
    if looping:
        # A broken shard (unpacked, a link to nothing): one error naming the member, where its
        # sample read as one of no label, or its image as unreadable.
        stored = listing.link_texts[looping[0]]  # its target as stored, as `ls -l` shows it
        raise InputError(
            f"{shown}:{looping[0]} -> {stored} is a link that leads round in a loop of links, to "
            "no file" + (f" (and {len(looping) - 1} more)" if len(looping) > 1 else ""),
            "remove the link, or point it at a member of the shard",
        )
    # A sample's image or label stored sparse: its sample said to have no image ('it holds
    # cls'), or read unlabelled. Other members (`KEY.npy`, `KEY.seg.png`) are never read.
    unread = [member for member in listing.sparse if _read_by_its_sample(member)]
    if unread:
        more = f" (and {len(unread) - 1} more)" if len(unread) > 1 else ""
        raise InputError(
            f"{shown}:{unread[0]} is stored sparse (tar --sparse), which torchkit does "
            f"not read{more}",
            "write the shard without --sparse",
        )
    if listing.unmade_hard_links:
        _refuse_unmade_label_links(listing, groups, shown)
    samples = []
    for key, group in groups.items():
        images = [ext for ext in group if "." + ext.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS]
        images = [ext for ext in images if "." not in ext]  # `seg.png` is not the image
        if len(images) != 1:
            raise _not_one_image(key, group, images, shown, listing)
        name, index = _label(group, listing, reader, f"{key} in {shown}")
        if name is not None:
            name = labels.setdefault(name, name)
        if index is not None:
            index = labels.setdefault(index, index)
        image = group[images[0]]
        unread = _unread_label_like(group) if name is None and index is None else None
        # Named by the path tar -x unpacks it to (`/000.png` is 000.png): its id was
        # `s.tar//000.png`, which names no member `tar -xf` gives.
        unpacked = _unpacked_path(image) or image
        where = listing.locator(image)
        samples.append(ShardSample(shown, key, unpacked, where, name, index, unread))
    return samples


def _unread_label_like(group: dict[str, str]) -> str | None:
    """The member of a sample without a label (its members by extension: `group`) that may be
    the label torchkit does not read (`_LABEL_LIKE_EXTENSIONS`), the likeliest first; None
    without one."""
    for extension in _LABEL_LIKE_EXTENSIONS:
        if extension in group:
            return group[extension]
    return None


def _not_one_image(
    key: str, group: dict[str, str], images: list[str], shown: str, listing: TarListing
) -> InputError:
    """The error for sample `key` of shard `shown` (its members by extension: `group`), whose
    `images` are not one; where it has none, the image-named hard link tar -x does not make,
    if it has one, and why."""
    what = "no image" if not images else f"{len(images)} images ({', '.join(images)})"
    message = f"sample {key} in {shown} has {what}; it holds {', '.join(sorted(group))}"
    unmade = [] if images else _unmade_images_of(key, listing)
    # `a.b.png` is sample a's `b.png`, as webdataset (and timm's reader) group it: said so, the
    # error named only the extensions (`it holds b.cls, b.png`), not why no image was found.
    dotted = [
        group[e]
        for e in sorted(group)
        if "." in e and "." + e.rsplit(".", 1)[1] in IMAGE_EXTENSIONS
    ]
    if not images and not unmade and dotted:
        folder, name = posixpath.split(dotted[0])
        renamed = posixpath.join(folder, name.replace(".", "_", name.count(".") - 1))
        return InputError(
            f"{message}: {dotted[0]} is sample {key}'s {dotted[0][len(key) + 1 :]}, no image, "
            "as webdataset reads a sample's KEY up to the first dot of a member's name",
            f"name members KEY.EXT with no dot in KEY, as {renamed} for {dotted[0]}, and the "
            "label beside it alike",
        )
    if unmade:
        return InputError(
            f"{message} ({unmade[0]} is a hard link to {listing.unmade_hard_links[unmade[0]]}, "
            "stored before it or to no member: tar -x does not make it)",
            "store the file, or the link after its target, as tar -cf does",
        )
    return InputError(
        message,
        "one image per sample, as KEY."
        + ", KEY.".join(e.lstrip(".") for e in sorted(IMAGE_EXTENSIONS)),
    )


def _refuse_unmade_label_links(
    listing: TarListing, groups: dict[str, dict[str, str]], shown: str
) -> None:
    """An InputError for the first sample (of `groups`, by key) whose `KEY.cls` or `KEY.json` is
    a hard link tar -x does not make (stored before its target, or to no member), where it has
    no such label of its own: its sample read as unlabelled, without a word (an image link so
    is named in the error of a sample without an image)."""
    for name, target in sorted(listing.unmade_hard_links.items()):
        split = _key_and_extension(name)
        if split is None or split[1] not in ("cls", "json"):
            continue
        key, extension = split
        if key in groups and extension not in groups[key]:
            raise InputError(
                f"sample {key} in {shown} has no label: {name} is a hard link to {target}, "
                "stored before it or to no member: tar -x does not make it",
                "store the file, or the link after its target, as tar -cf does",
            )


def _unmade_images_of(key: str, listing: TarListing) -> list[str]:
    """The image-named hard links of sample `key` that tar -x does not make (stored before
    their target, or to no member: `TarListing.unmade_hard_links`), sorted: why it has no
    image, where `tar -tvf` lists one (webdataset's reader, which reads no link, gives that
    sample no image either)."""
    return sorted(
        name
        for name in listing.unmade_hard_links
        if _read_by_its_sample(name)
        and is_image_file(name)
        and (_key_and_extension(name) or ("",))[0] == key
    )


def _read_by_its_sample(member: str) -> bool:
    """Whether a shard's member is one `_shard_samples` reads: a sample's image (`KEY.png`,
    not `KEY.seg.png`) or label (`KEY.cls`, `KEY.json`)."""
    split = _key_and_extension(member)
    if split is None:
        return False
    extension = split[1]
    return extension in ("cls", "json") or (
        "." not in extension and "." + extension in IMAGE_EXTENSIONS
    )


def _label(
    group: dict[str, str], listing: TarListing, reader: TarReader, where: str
) -> tuple[str | None, int | None]:
    """(class name, class index) a sample's `.cls` / `.json` give (None where absent)."""
    name = index = None
    if "cls" in group:
        data = _member_bytes(listing, reader, group["cls"], where)
        text = data.decode("utf-8", "replace").strip()
        if text == "-1":
            pass  # HF's "no label" (an unlabelled test split), as a KEY.json's -1 and parquet's
        elif not re.fullmatch(r"[0-9]{1,30}", text):  # int() refuses 4,300 digits
            raise InputError(
                f"{where}: {group['cls']} holds {text[:20]!r}, not a class index",
                "KEY.cls holds the class index as decimal text, or -1 for no label",
            )
        else:
            index = int(text)
    if "json" in group:
        try:
            meta = json.loads(_member_bytes(listing, reader, group["json"], where))
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            raise InputError(f"{where}: {group['json']} is not JSON") from None
        if isinstance(meta, dict):
            label = _json_label(meta, "label", f"{where}: {group['json']}")
            if isinstance(label, str):
                name = label
            elif label is not None and index is None:
                index = label
            cls = _json_label(meta, "cls", f"{where}: {group['json']}", names=False)
            if cls is not None and index is None:
                index = cls
    return name, index


def _json_label(meta: dict, key: str, where: str, names: bool = True) -> str | int | None:
    """A `.json`'s "label" (a class name or index) or "cls" (an index), a whole-number float
    counting as an index; None where absent, null or -1 (HF's "no label", as parquet reads it).
    Anything else (-2, 1.5, true, "") is an error, as a bad `.cls` is: such a sample was read
    silently as unlabelled; so is a name of spaces (or invisible characters) alone, a class no
    report can show."""
    value = meta.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value == -1 and not isinstance(value, bool):
        return None
    if value is None or names and isinstance(value, str) and not is_blank_name(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InputError(
        f'{where} has "{key}": {short_repr(value)}, not a class index'
        + (" or name" if names else ""),
        'a KEY.json "label" is a class name or a class index 0, 1, ...; "cls" a class index',
    )


def _member_bytes(listing: TarListing, reader: TarReader, member: str, where: str) -> bytes:
    """A label member's bytes (`where`: its sample, "KEY in SHARD"); an InputError, before
    any is read, for one past MAX_LABEL_MEMBER_BYTES."""
    locator = listing.locator(member)
    if isinstance(locator, tuple) and locator[1] > MAX_LABEL_MEMBER_BYTES:
        raise InputError(
            f"{where}: {member} holds {locator[1]:,} bytes, more than the "
            f"{MAX_LABEL_MEMBER_BYTES >> 20} MiB a label member may",
            'a KEY.cls holds a class index, a KEY.json an object with a "label": check what '
            "the shard holds under that name",
        )
    read_with_header = listing.labels.get(member)
    if read_with_header is not None:
        return read_with_header
    try:
        return reader.read(locator)
    except OSError as error:
        raise InputError(f"cannot read {member} in {listing.path}: {error}") from None


def _class_file(folder: str) -> list[str] | None:
    """The class names `classes.txt` or `classes.json` beside the shards give, in label order
    (none for an empty one), or None without either."""
    text_file, json_file = Path(folder, "classes.txt"), Path(folder, "classes.json")
    try:
        if text_file.is_file():
            text = read_text(text_file, "utf-8-sig")
            names = class_names_in_text(text, str(text_file))
        elif json_file.is_file():
            text = read_text(json_file, "utf-8-sig")
            names = class_names_in_json(text, str(json_file))
        else:
            # One that is no file (a FIFO, a folder, a link to nothing) was passed over without
            # a word: the classes were named "0", "1", ... or by the labels, not as it names them.
            _refuse_a_class_file_that_is_no_file(text_file)
            _refuse_a_class_file_that_is_no_file(json_file)
            return None
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read the class names beside the shards: {error}") from None
    # A name given twice exactly (ImageNet's two "crane"s) is two classes, told apart by the
    # samples' `KEY.cls`; a sample labelled by such a name alone is refused (`_labelled`).
    # An empty one is what `convert shards` writes beside unlabelled images: no names, which
    # only labelled samples need (`_labelled`).
    return names


def _refuse_a_class_file_that_is_no_file(path: Path) -> None:
    """An InputError where `path` (`classes.txt` or `classes.json` beside the shards) is there
    but no regular file, never opened (opening a FIFO waits for a writer)."""
    if not os.path.lexists(path):
        return
    try:
        what = file_kind(os.stat(path).st_mode)
    except OSError:  # a link to nothing, or round a loop of links
        what = LINK_TO_NOTHING
    raise InputError(
        f"cannot read the class names beside the shards: {path} is not a regular file ({what})",
        f"make {path.name} a file of the class names, or remove it",
    )


def _refuse_respelled_names_of_one_index(found: list[ShardSample]) -> None:
    """InputError where two samples of one class index (`KEY.cls`) name it in names that differ
    only by the spaces around them (or in Unicode spelling): `cat` and `cat ` were two classes,
    the index of every later class one higher than the shards give, and two outputs that print
    alike. Names that differ otherwise stay apart (a fine label beside a coarse index)."""
    first: dict[int, ShardSample] = {}
    for sample in found:
        if sample.name is None or sample.index is None:
            continue
        seen = first.setdefault(sample.index, sample)
        if seen.name != sample.name and nfc(seen.name.strip()) == nfc(sample.name.strip()):
            how = how_they_differ(seen.name, sample.name)
            raise InputError(
                f"sample {sample.key} in {sample.shard} names class index {sample.index} "
                f"{sample.name!r}, and sample {seen.key} in {seen.shard} {seen.name!r}: one "
                f"class would be two whose names differ only by {how}",
                "give the samples of one class one name in KEY.json",
            )


def _refuse_spaced_names(samples: list[ShardSample]) -> None:
    """InputError where two samples (of any split) name their class (`KEY.json` "label", no
    class index to tell) in names that differ only by the spaces around them: `cat` and `cat `
    were two classes that print alike, as two such names of one `KEY.cls` index are refused
    (`_refuse_respelled_names_of_one_index`). Names in two Unicode spellings alone are
    `refuse_spelling_twins`'s to refuse."""
    first: dict[str, ShardSample] = {}
    for sample in samples:
        if sample.name is None:
            continue
        seen = first.setdefault(nfc(sample.name.strip()), sample)
        if seen.name != sample.name and how_they_differ(seen.name, sample.name) == _SPACES:
            raise InputError(
                f"sample {sample.key} in {sample.shard} is labelled {sample.name!r}, and sample "
                f"{seen.key} in {seen.shard} {seen.name!r}: one class would be two whose names "
                f"differ only by {_SPACES}",
                "give the samples of one class one name in KEY.json",
            )


def _refuse_index_and_name_that_disagree(
    found: list[ShardSample], file_classes: list[str], folder: str
) -> None:
    """InputError where a sample's class index (`KEY.cls`, "cls") and label name (`KEY.json`)
    are two classes of the file of names beside the shards: with classes.txt [a, b], `cls` 1
    beside "label": "a" was read as a, silently, while webdataset's reader takes 1; so was
    `cls` 5, an index past the file's names, beside a name the file holds. Only
    there: a name the file lacks is refused in `_labelled`, and without a file two names of
    one index are a fine label beside a coarse index (`_refuse_respelled_names_of_one_index`)."""
    indices_of: dict[str, list[int]] = {}  # a name given twice (two "crane"s) is two classes
    for index, name in enumerate(file_classes):
        indices_of.setdefault(name, []).append(index)
    clashes = [
        s
        for s in found
        if s.name in indices_of and s.index is not None and s.index not in indices_of[s.name]
    ]
    if not clashes:
        return
    first = clashes[0]
    file = "classes.txt" if Path(folder, "classes.txt").is_file() else "classes.json"
    more = f"; {len(clashes)} samples disagree so" if len(clashes) > 1 else ""
    # An index past the file's names (cls 5 of 2 classes) was read by the name, silently.
    named = (
        f"which {file} names {file_classes[first.index]!r}"
        if first.index < len(file_classes)
        else f"past the {len(file_classes)} classes {file} names"
    )
    classes_of_name = " or ".join(map(str, indices_of[first.name]))
    raise InputError(
        f"sample {first.key} in {first.shard} has class index {first.index}, {named}, and "
        f"the label {first.name!r}, class {classes_of_name} of {file}{more}",
        'fix the sample\'s KEY.cls or its KEY.json "label", whichever is wrong: webdataset '
        "reads the index",
    )


def _classes_by_index(found: list[ShardSample]) -> list[str] | None:
    """The class names in the order the samples' own indices give, where every labelled sample
    has a name (`KEY.json` "label") and an index (`KEY.cls`, "cls"), and each index 0, 1, ...
    has one name (as `ShardWriter` writes a dataset's names and indices): class i is the name
    beside index i, as webdataset's reader labels it. Two indices may have one name (ImageNet's
    two `crane`s): the index is the label, the name what shows it. None otherwise (the names
    are sorted)."""
    pairs = {(s.name, s.index) for s in found if s.name is not None or s.index is not None}
    if not pairs or any(name is None or index is None for name, index in pairs):
        return None
    by_index = {index: name for name, index in pairs}
    if sorted(by_index) != list(range(len(pairs))):  # an index of two names, or one skipped
        return None
    return [by_index[index] for index in range(len(pairs))]


def _refuse_a_name_of_two_indices(found: list[ShardSample]) -> None:
    """InputError where samples give one name to two class indices (`KEY.cls` 0 and 2 both
    "crane") and no file of names beside the shards, nor the samples' pairs
    (`_classes_by_index`), says which name each index has: read by name, as such labels are,
    the two classes were one, silently. The index is the label."""
    first: dict[str, ShardSample] = {}
    for sample in found:
        if sample.name is None or sample.index is None:
            continue
        seen = first.setdefault(sample.name, sample)
        if seen.index != sample.index:
            raise InputError(
                f"sample {sample.key} in {sample.shard} has class index {sample.index} and the "
                f"label {sample.name!r}, which sample {seen.key} in {seen.shard} gives class "
                f"index {seen.index}: read by name they would be one class, and the samples do "
                "not name each class index 0, 1, ... once",
                "the index is the label: put classes.txt beside the shards, one class name per "
                "line in label order",
            )


def _labelled(
    samples: list[ShardSample], file_classes: list[str] | None, allow_unlabelled: bool, where: str
) -> tuple[list[str], list[int]]:
    """(class names in label order, each sample's label; `where`: the samples' name in
    errors)."""
    unlabelled = [s for s in samples if s.name is None and s.index is None]
    if unlabelled:
        if allow_unlabelled and len(unlabelled) < len(samples) and partial_labels_are_kept():
            # `convert shards`: the labels there are, written again, the others class "".
            labelled = [s for s in samples if s.name is not None or s.index is not None]
            names, labels = _labelled(labelled, file_classes, False, where)
            given = iter(labels)
            return with_unlabelled_class(
                names,
                [None if s.name is None and s.index is None else next(given) for s in samples],
            )
        if allow_unlabelled and len(unlabelled) < len(samples):
            # Some labelled, some not: all read unlabelled, said, as parquet reads a file of
            # some rows without a label (they were refused, which predict, extract-features
            # and dataset-stats need no labels for). A bad label is still an error.
            labelled = [s for s in samples if s.name is not None or s.index is not None]
            _labelled(labelled, file_classes, False, where)
            log.warning(
                "%s has %d sample(s) without a label (no KEY.cls, no label in KEY.json, or -1; "
                "sample %s) among %d labelled ones: its images are read unlabelled",
                where,
                len(unlabelled),
                _first_samples(unlabelled),
                len(labelled),
            )
        if allow_unlabelled:
            _warn_unread_labels(unlabelled, where)
            return [""], [0] * len(samples)
        first = unlabelled[0]
        hint = 'give each sample a KEY.cls holding its class index, or a KEY.json with a "label"'
        unread = next((s for s in unlabelled if s.unread is not None), None)
        if unread is not None:
            # `KEY.label`, `KEY.class`: the label is there, under a name torchkit does not read
            hint = f"{_LABELS_READ}; {_what_to_rename(unread.unread)}"
        elif len(unlabelled) == len(samples):  # what `convert shards` writes of unlabelled images
            hint = (
                "the shards hold unlabelled images, which predict, extract-features and "
                f"dataset-stats read; to train or evaluate, {hint}"
            )
        else:
            hint += "; predict, extract-features and dataset-stats read them unlabelled"
        raise InputError(
            f"sample {first.key} in {first.shard} has no label"
            + (f" ({len(unlabelled)} samples have none)" if len(unlabelled) > 1 else "")
            + (
                f": {unread.unread} in {unread.shard} is not read as a label"
                if unread is not None
                else ""
            ),
            hint,
        )
    if file_classes == []:
        raise InputError(
            f"the classes.txt / classes.json beside the shards names no class, while sample "
            f"{samples[0].key} in {samples[0].shard} is labelled",
            "one class name per line, in label order",
        )
    if file_classes is not None:
        names = file_classes
    elif any(s.name is not None for s in samples):
        index_only = [s for s in samples if s.name is None]
        if index_only:
            raise InputError(
                f"sample {index_only[0].key} in {index_only[0].shard} has a class index and no "
                "class name, while other samples name their class",
                "put classes.txt beside the shards, one class name per line in label order",
            )
        names = sorted({s.name for s in samples}, key=natural_key)
        # `café` composed in one sample, decomposed in another: two classes that print alike,
        # refused as two such class folders (or CSV labels) are
        refuse_spelling_twins(names, f"labels of {where}:")
    else:
        top = max(samples, key=lambda s: s.index)
        names = index_class_names(
            top.index,
            f"sample {top.key} in {top.shard}",
            "put classes.txt beside the shards, one class name per line in label order",
        )
    index_of = {name: i for i, name in enumerate(names)}
    # Names only classes.txt / classes.json can give twice (ImageNet's two "crane"s): a sample
    # with its class index is that class (`_refuse_index_and_name_that_disagree` checked the
    # name is the index's); one labelled by the name alone is refused.
    named_alike = classes_named_alike(names)
    labels = []
    for sample in samples:
        if sample.name is not None and sample.name not in index_of:
            raise InputError(
                f"sample {sample.key} in {sample.shard} is labelled {sample.name!r}, which "
                "the class names beside the shards lack",
                "add it to classes.txt / classes.json",
            )
        if sample.name is not None and sample.index is not None and named_alike:
            labels.append(sample.index)
        elif sample.name is not None:
            refuse_a_label_of_two_classes(
                sample.name,
                named_alike,
                f"the label {sample.name!r} of sample {sample.key} in {sample.shard}",
                "the classes beside the shards",
                'give the sample its class index in KEY.cls, or as "cls" in its KEY.json: '
                "webdataset reads the index",
            )
            labels.append(index_of[sample.name])
        elif sample.index >= len(names):
            raise InputError(
                f"sample {sample.key} in {sample.shard} has class index {sample.index}, but "
                f"there are {len(names)} class names",
                "classes.txt / classes.json beside the shards name every class, in label order",
            )
        else:
            labels.append(sample.index)
    return names, labels


def _warn_unread_labels(unlabelled: list[ShardSample], where: str) -> None:
    """One warning where samples read unlabelled hold a member that may be their label, which
    torchkit does not read (`ShardSample.unread`): dataset-stats showed one class "" without a
    word. A `KEY.txt` alone is a caption as often (LAION's): named in train's error only."""
    holding = [s for s in unlabelled if s.unread is not None and not s.unread.endswith(".txt")]
    if holding:
        first = holding[0]
        log.warning(
            f"{where}: {counted(len(holding), 'sample')} without a label "
            f"{'holds' if len(holding) == 1 else 'hold'} a member torchkit does not read as "
            f"a label ({first.unread} in {first.shard}): read unlabelled; {_LABELS_READ}; "
            f"{_what_to_rename(first.unread)}"
        )


def _what_to_rename(member: str) -> str:
    """What to do with `member`, a label torchkit does not read (`KEY.label`): its name, and
    the name torchkit reads a class index by."""
    key, extension = _key_and_extension(member) or (member, "")
    return (
        f"rename each KEY.{extension} that holds a class index to KEY.cls, as {member} to "
        f'{key}.cls, or write a class name as the "label" of a KEY.json'
    )


def _first_samples(samples: list[ShardSample]) -> str:
    """`3 in train-000000.tar, 8 in train-000000.tar, ...`: the first samples a warning names."""
    shown = ", ".join(f"{s.key} in {s.shard}" for s in samples[:_SHOWN])
    return shown + (", ..." if len(samples) > _SHOWN else "")


def _open_shards(
    spec: str,
    shards: list[str],
    classes: Sequence[str] | None,
    allow_unlabelled: bool,
    *,
    by_split: bool,
    listed: list[TarListing] | None = None,
    named: str | None = None,
) -> DataSource:
    """The DataSource of `shards`; `named`: what the samples' source is called, where not
    their folder (`shards_source`)."""
    names = [os.path.basename(shard) for shard in shards]
    by_split = split_by_name(spec, names) if by_split else False
    folders = {os.path.dirname(os.path.abspath(shard)) for shard in shards}
    root = os.path.commonpath(sorted(folders))
    found: list[ShardSample] = []
    readers: dict[str, TarReader] = {}
    shown_names = [
        os.path.relpath(os.path.abspath(shard), root).replace(os.sep, "/") for shard in shards
    ]
    splits = [name.split("-", 1)[0] if by_split else None for name in names]
    reported = _shards_named_twice(spec, shards, shown_names, splits)
    starts = []  # where each shard's samples begin in `found`
    labels: dict = {}  # one object a class name and a class index, over every shard
    not_unpacked: list[str] = []
    for position, shard in enumerate(shards):
        listing = listed[position] if listed else list_tar(shard, labels=True)
        shown = shown_names[position]
        readers[shown] = TarReader(shard, listing.stamp)
        starts.append(len(found))
        found += _shard_samples(listing, shown, readers[shown], labels, not_unpacked)
    starts.append(len(found))
    if not_unpacked:
        note_not_unpacked(spec, not_unpacked)
        one = len(not_unpacked) == 1
        log.warning(
            f"{spec}: {counted(len(not_unpacked), 'sample member')} with '..' in "
            f"{'its' if one else 'their'} path {'is' if one else 'are'} not read, as tar -x "
            f"does not unpack such members: {first_and_more(not_unpacked, 3)}"
        )
    paths = [StoredImage(f"{s.shard}/{s.image}", readers[s.shard], s.locator) for s in found]
    for positions in reported:
        # One listing, read under each name: sample i of one is sample i of the others.
        ranges = [range(starts[p], starts[p + 1]) for p in positions]
        reported_files_in_two_splits().extend(
            tuple(str(paths[i]) for i in same) for same in zip(*ranges, strict=True)
        )
    return shards_source(
        spec,
        root,
        found,
        paths,
        classes,
        allow_unlabelled,
        by_split=by_split,
        named=named,
        shard_names=shown_names,
    )


def _shards_named_twice(
    spec: str, shards: Sequence[str], shown: Sequence[str], splits: Sequence[str | None]
) -> list[list[int]]:
    """The positions of each shard file that `shards` name more than once (the same name
    twice, `a.tar::./a.tar`, a symbolic or hard link to another shard: one (st_dev, st_ino)),
    where they lie in two splits of a folder and dataset-stats reports such files
    (`files_in_two_splits_reported`); an InputError for any other: its samples would be
    trained and counted twice, or leak from one split into the other. One stat a shard."""
    where: dict[tuple[int, int], list[int]] = {}
    for position, shard in enumerate(shards):
        try:
            info = os.stat(shard)
        except OSError:  # gone: `list_tar` says so
            continue
        where.setdefault((info.st_dev, info.st_ino), []).append(position)
    repeated = [positions for positions in where.values() if len(positions) > 1]
    if not repeated:
        return []
    reported = []
    for positions in repeated:
        by_split: dict[str | None, int] = {}
        twice = next(
            ((by_split[splits[p]], p) for p in positions if by_split.setdefault(splits[p], p) != p),
            None,
        )
        if twice is not None:
            first, second = twice
            said = (
                f"names {shown[first]} twice"
                if shown[first] == shown[second]
                else f"names one shard twice, as {shown[first]} and {shown[second]}"
            )
            raise InputError(
                f"{spec} {said}",
                "its samples would be read, trained and counted twice: name each shard once",
            )
        if reported_files_in_two_splits() is not None:
            reported.append(positions)
            continue
        first, second = positions[0], positions[1]
        raise InputError(
            f"{spec}: {shown[first]} and {shown[second]} are one file in two splits, "
            f"{splits[first]} and {splits[second]}",
            "its samples would leak from one split into the other: remove the link, or give "
            "each split its own shards",
        )
    return reported


def split_by_name(spec: str, names: Sequence[str]) -> bool:
    """Whether a folder's shards `names` are split data (all named `{train,val,test}-N.tar`);
    an error when some are and some not."""
    split_named = [bool(_SPLIT_SHARD.match(name)) for name in names]
    if any(split_named) and not all(split_named):
        others = [name for name, is_split in zip(names, split_named, strict=True) if not is_split]
        raise InputError(
            f"{spec} mixes split shards (train-, val-, test-NNNNNN.tar) with others "
            f"({', '.join(others[:_SHOWN])})",
            "a folder of split shards holds only train-, val- and test- shards",
        )
    if not all(split_named):
        _refuse_splits_named_otherwise(spec, names)
    return bool(split_named) and all(split_named)


def _refuse_splits_named_otherwise(spec: str, names: Sequence[str]) -> None:
    """InputError where a folder's shards name two splits otherwise than `train-N.tar`
    (`imagenet1k-train-0000.tar` beside `imagenet1k-validation-00.tar`, as timm's ImageNet
    shards are named): read as one unsplit dataset, train trained on the validation shards
    too, holding out a tenth of both, without a word; as folders `Training/` and `Test/` are
    refused. Split words are HF's (`validation`, `valid`, `dev`...), between `-`, `_`, `.`."""
    from torchkit.core.data.sources.parquet import SPLIT_KEYWORDS

    def split_of(name: str) -> str | None:
        words = re.split(r"[-_.]", name.lower())
        return next((SPLIT_KEYWORDS[w] for w in words if w in SPLIT_KEYWORDS), None)

    refuse_mixed_splits(
        spec,
        names,
        split_of,
        files="shards",
        named="named otherwise than train-, val- and test-NNNNNN.tar",
        hint="name one split's shards with a pattern, DIR/NAME-train-{0000..0009}.tar, or "
        "rename them train-NNNNNN.tar, val-NNNNNN.tar and test-NNNNNN.tar",
    )


def shards_source(
    spec: str,
    root: str,
    found: list[ShardSample],
    paths: list[StoredImage],
    classes: Sequence[str] | None,
    allow_unlabelled: bool,
    *,
    by_split: bool,
    named: str | None = None,
    shard_names: Sequence[str] = (),
) -> DataSource:
    """The DataSource of the shards' samples `found` (shard order, then member order), read
    through `paths`; class names from `classes.txt`/`classes.json` in `root`, split by their
    shards' names when `by_split` (`split_by_name`). The samples' source is `named` (a folder,
    one shard or a pattern, as given: a pattern's folder would name more than the data), else
    `root`.
    `shard_names`: every shard read (as `ShardSample.shard`), for the splits whose shards
    hold no sample (`DataSource.empty_splits`)."""
    if not found:
        # Named as shards are (the grammar's hint misled): they hold no `KEY.EXT` member.
        raise InputError(
            f"no samples in the shards {spec} names: they hold no member named KEY.EXT",
            "a sample is an image KEY.jpg, KEY.png... beside its KEY.cls or KEY.json; "
            "tar -tvf SHARD lists what a shard holds",
        )
    file_classes = _class_file(root)
    if file_classes:
        _refuse_index_and_name_that_disagree(found, file_classes, root)
    if file_classes is None:
        _refuse_respelled_names_of_one_index(found)
        file_classes = _classes_by_index(found)
        if file_classes is not None:
            refuse_spelling_twins(file_classes, f"labels of {spec}:")
        else:  # the names are the classes: over every split, val's `cat ` beside train's `cat`
            _refuse_spaced_names(found)
            _refuse_a_name_of_two_indices(found)
    # classes.txt (or the samples' own name-index pairs) states the label order; names in the
    # samples alone are sorted (`_labelled`).
    given = bool(file_classes) or all(s.name is None for s in found)
    ids = [str(path) for path in paths]

    def samples_of(indices: list[int], where: str) -> Samples:
        part = [found[i] for i in indices]
        class_names, labels = _labelled(part, file_classes, allow_unlabelled, where)
        return Samples(
            class_names,
            labels,
            paths=[paths[i] for i in indices],
            source=named or root,
            ids=[ids[i] for i in indices],
        )

    if by_split:
        parts = {}
        for split in SPLIT_NAMES:
            prefix = split + "-"
            members = [
                i for i, s in enumerate(found) if posixpath.basename(s.shard).startswith(prefix)
            ]
            if members:
                parts[split] = samples_of(members, f"{spec} ({split})")
        source = _split_source(spec, "split shards", root, parts, classes)
        source.classes_given = given
        # A split of shards without a sample (a writer stopped before its first) is no
        # split, as an empty split folder is: said, where it was left out without a word.
        for split in SPLIT_NAMES:
            empty = [n for n in shard_names if posixpath.basename(n).startswith(split + "-")]
            if empty and split not in parts:
                more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
                source.empty_splits[split] = f"{spec.rstrip('/')}/{empty[0]}{more}"
        return source
    whole = samples_of(list(range(len(found))), spec)
    if classes is not None and whole.classes != [""]:
        whole = relabelled(whole, classes, spec)
    return DataSource(spec, "shards", root, {}, whole, list(whole.classes), given)


def _open_folder_tar(
    spec: str,
    listing: TarListing,
    classes: Sequence[str] | None,
    allow_unlabelled: bool,
    every_image: bool = False,
) -> DataSource:
    """A `.tar` of an image folder, a split root or (unlabelled) flat images: the rules of
    `source._open_folder` (the class-folder rule, `DataSource.strays`), on the member paths."""
    tree = _unpacked_tar(spec, listing)
    tops = {folder.split("/")[0] for folder in tree.folders if folder}
    top_folders = sorted(top for top in tops if not is_skipped_folder(top))
    top_images = any("/" not in name for name in tree.names)
    refuse_other_split_names(spec, top_folders, tree.listed)
    split_folders = [name for name in SPLIT_NAMES if name in top_folders]
    if split_folders:
        others = [name for name in top_folders if name not in SPLIT_NAMES]
        if others or top_images:
            what = (
                f"other folders ({', '.join(n + '/' for n in others[:3])})" if others else "images"
            )
            raise InputError(
                f"{spec} mixes split folders ({', '.join(n + '/' for n in split_folders)}) "
                f"with {what}",
                "a split root holds only train/, val/ and test/; an image folder only class "
                "folders",
            )
        source = _tar_split_root(tree, split_folders, classes, allow_unlabelled, every_image)
    else:
        source = _tar_image_folder(
            tree, bool(top_folders), top_images, classes, allow_unlabelled, every_image
        )
    source.tar_non_images = _non_image_files(tree)
    if every_image and classes is None:
        # The folders read whole where images lie beside class folders holding some: a reader
        # of labels reads those by their class folders (`DataSource.labelled_classes`).
        if split_folders:
            whole = [n for n in split_folders if tree.listed(n)[1] and tree.in_subfolders(n)]
        else:
            whole = [""] if top_images and top_folders and tree.in_subfolders("") else []
        source.labelled_classes = (
            _labelled_classes(tree, list(source.splits) or [""], whole)
            if whole
            else list(source.classes)
        )
    return source


def _non_image_files(tree: _UnpackedTar) -> list[str]:
    """The files the folder `tree`'s tar unpacks to holds that are not images, hidden ones and
    AppleDouble files aside, by their paths in it (inside its wrapping folder), sorted: as
    `discovery.list_non_image_files` lists a folder's. Members and links to a file; not FIFOs
    or devices, nor links to nothing (a folder's listing sets those apart too)."""
    listing, prefix = tree.listing, tree.prefix
    found = []
    for name in (*listing.members, *listing.links):
        if is_image_file(name) or name in listing.special:
            continue
        if name in listing.links and (listing.links[name] is None or name in listing.outside):
            continue
        path = _unpacked_path(name)
        if path is None or not path.startswith(prefix):
            continue
        base = posixpath.basename(path)
        if not base.startswith(".") and not is_apple_double(base):
            found.append(path[len(prefix) :])
    return sorted(found)


def _labelled_classes(tree: _UnpackedTar, read: list[str], whole: list[str]) -> list[str]:
    """`DataSource.labelled_classes` of a folder's tar read with `every_image`: the classes a
    reader of labels reads it by (`_open_folder_tar` without `every_image`), from the images
    the first read numbered (`_UnpackedTar.numbered`) of the folders it `read` (a split
    root's splits; "" = the archive's root), `whole` those of them read whole beside their
    class folders; [""] where it refuses the data or its class names."""
    numbered: list[tuple[tuple[str | None, str], Numbered]] = []
    each: list[list[str]] = []  # each folder's classes
    try:
        for base in read:
            groups = tree.numbered[base]
            if base in whole:
                groups = tree.by_class_folder(base, tree.class_folders(base))
            each.append([label for label, _ in groups])
            numbered += [((base or None, label), files) for label, files in groups]
        refuse_one_file_in_two_places(numbered, tree.spec, archive_links=tree.links)
        names = _union_of(each)
        refuse_unshowable_classes(names, tree.spec)
    except TorchkitError:
        return [""]
    return names


def _tar_split_root(
    tree: _UnpackedTar,
    split_folders: list[str],
    classes: Sequence[str] | None,
    allow_unlabelled: bool,
    every_image: bool,
) -> DataSource:
    """The split root a folder's tar unpacks to (`split_folders`: its train/, val/, test/), as
    `source._open_split_root` reads one unpacked: a split folder is unlabelled where its
    subfolders hold no image (a split of a flat folder, `split` writes OUT/train/x.png; an
    unlabelled test split beside labelled ones)."""
    spec = tree.spec
    inside = {name: tree.listed(name) for name in split_folders}
    unlabelled = [
        name
        for name in split_folders
        if inside[name][1] and (every_image or not tree.in_subfolders(name))
    ]
    # An empty split folder (no class folder, no image) says nothing of the layout.
    laid_out = [name for name in split_folders if inside[name][0] or inside[name][1]]
    flat = bool(laid_out) and all(name in unlabelled for name in laid_out)
    if unlabelled and not allow_unlabelled:
        shown = [f"{spec}:{name}" for name in unlabelled]
        raise unlabelled_split_error(spec, shown, whole=flat)
    parts, empty, strays = {}, {}, {}
    for name in split_folders:
        try:
            parts[name] = tree.samples_under(name, name in unlabelled)
        except NoImagesError:
            empty[name] = f"{spec}:{name}"
            continue
        if inside[name][1] and name not in unlabelled:
            strays[f"{spec}:{name}"] = tree.beside(name)
    refuse_one_file_in_two_places(
        [((name, label), files) for name in parts for label, files in tree.numbered[name]],
        spec,
        archive_links=tree.links,
    )
    source = split_root_source(spec, "tar split root", spec, parts, empty, classes, flat=flat)
    source.strays = strays
    return source


def _tar_image_folder(
    tree: _UnpackedTar,
    top_folders: bool,
    top_images: bool,
    classes: Sequence[str] | None,
    allow_unlabelled: bool,
    every_image: bool,
) -> DataSource:
    """The image folder (or, where unlabelled images are taken, the flat folder) a folder's tar
    unpacks to, as `source._open_folder` reads one: `top_folders`, `top_images`: whether its
    root holds visible folders, images."""
    spec = tree.spec
    flat = not top_folders or top_images and (every_image or not tree.in_subfolders(""))
    if allow_unlabelled and flat:
        samples = tree.samples_under("", True)
        return DataSource(spec, "tar flat folder", spec, {}, samples, [""])
    if top_images and top_folders and not tree.in_subfolders(""):
        raise no_class_folders_error(spec, beside_empty_ones=True)
    samples = tree.samples_under("", False)
    refuse_one_file_in_two_places(
        [((None, label), files) for label, files in tree.numbered[""]],
        spec,
        archive_links=tree.links,
    )
    if classes is not None:
        samples = relabelled(samples, classes, spec)
    source = DataSource(spec, "tar image folder", spec, {}, samples, list(samples.classes))
    if top_images:
        source.strays[spec] = tree.beside("")
    return source


# The locator of a link round a loop of links: read, the error of the unpacked link's open
# ("Too many levels of symbolic links").
_LOOPING = "a link round a loop of links, to no file"


@dataclass
class _UnpackedTar:
    """The folder a folder's tar unpacks to (`_unpacked_tar`), read as `source._open_folder`
    reads one on disk: its images and folders by their paths inside the wrapping folder
    `prefix` (`_wrapping_folder`), ids as the unpacked folder's would be."""

    spec: str
    listing: TarListing
    member_of: dict[str, str]  # each image's unpacked path (`prefix` and all) -> its member
    names: list[str]  # the images' paths inside `prefix`, those through linked classes too
    folders: set[str]  # the folders' paths inside `prefix`
    prefix: str
    # Each image under a linked class folder (`img/x.png`) -> the unpacked path it is
    # (`_linked_class_images`).
    through: dict[str, str]
    # Each link by its unpacked path inside `prefix` (`cat/./s.png` is cat/s.png) -> its target
    # as stored, and the linked class folders: named in the error of one file in two classes.
    links: dict[str, str | None]
    reader: TarReader  # one for every image of the archive
    # Per split folder read ("" = the archive's root), its images by class as
    # `refuse_one_file_in_two_places` takes them: each numbered by its data's offset.
    numbered: dict[str, list[tuple[str, Numbered]]] = field(default_factory=dict)

    def locator(self, member: str) -> tuple[int, int] | NotRegularMember | str | None:
        """Where `member`'s data lies; None for a link to a member of a `..` part, which tar
        does not unpack (the link is left pointing at nothing), as that member is not read;
        `_LOOPING` for a link round a loop of links."""
        listing = self.listing
        if member in listing.looped:
            return _LOOPING
        end = member if member in listing.members else listing.links.get(member)
        if end is not None and ".." in end.split("/"):
            return None
        return listing.locator(member)

    def samples_under(self, base: str, unlabelled: bool) -> Samples:
        """The images under `base` ("" = all), as `discover_image_folder` or
        `discover_flat_folder` read them (ids relative to the archive's root)."""
        spec, names, prefix = self.spec, self.names, self.prefix
        start = base + "/" if base else ""
        if unlabelled:
            chosen = sorted(n for n in names if n.startswith(start))
            class_names, labels, ends = [""], [0] * len(chosen), [len(chosen)]
        else:
            class_names = self.class_folders(base)
            # One pass over the names, by class folder: a scan per class took 20 s for 1,000
            # classes of 40 images, and hours for ImageNet's 1,000 classes of 1,300.
            by_class: dict[str, list[str]] = {}
            for n in names:
                if n.startswith(start):
                    folder, slash, _ = n[len(start) :].partition("/")
                    if slash:
                        by_class.setdefault(folder, []).append(n)
            chosen, labels, ends = [], [], []  # ends: where each class's names end
            for label, name in enumerate(class_names):
                inside = sorted(by_class.get(name, ()))
                chosen += inside
                labels += [label] * len(inside)
                ends.append(len(chosen))
        if not chosen:
            raise no_images_error(f"{spec}:{base}" if base else spec)
        members = [
            self.member_of.get(full, full)
            for full in (self.through.get(n, prefix + n) for n in chosen)
        ]
        located = [self.locator(member) for member in members]
        archive = os.path.basename(spec)
        paths = [
            StoredImage(f"{archive}/{prefix}{n}", self.reader, where)
            for n, where in zip(chosen, located, strict=True)
        ]
        # A link to nothing, and a FIFO or device (and its hard links), a number of its own (no
        # member starts before the archive), as a folder's listing numbers no such file: no
        # image is read from it, in one class or in two.
        offsets = [
            where[0] if isinstance(where, tuple) else -1 - i for i, where in enumerate(located)
        ]
        self.numbered[base] = [
            (name, (chosen[first:end], offsets[first:end]))
            for name, first, end in zip(class_names, [0, *ends], ends, strict=False)
        ]
        return Samples(class_names, labels, paths=paths, source=spec, ids=list(chosen))

    def by_class_folder(self, base: str, class_names: list[str]) -> list[tuple[str, Numbered]]:
        """The images under `base` that `samples_under(base, True)` numbered, by class folder
        (`class_names`, in that order), as `samples_under(base, False)` numbers them."""
        ((_, (chosen, offsets)),) = self.numbered[base]
        start = len(base) + 1 if base else 0
        names = (name[start:] for name in chosen)
        by_class = by_class_folder(chosen, names, offsets, class_names, "/")
        if not any(found for found, _ in by_class.values()):
            raise no_images_error(f"{self.spec}:{base}" if base else self.spec)
        return list(by_class.items())

    def class_folders(self, base: str) -> list[str]:
        """The class folders in folder `base` ("" = the root), sorted; NoImagesError where
        there is none (InputError where images lie in `base` without one)."""
        start = base + "/" if base else ""
        class_names = sorted(
            {
                f[len(start) :].split("/")[0]
                for f in self.folders
                if f.startswith(start) and f != base
            }
            - {""}
        )
        class_names = [c for c in class_names if not is_skipped_folder(c)]
        if not class_names:
            where = f"{self.spec}:{base}" if base else self.spec
            if any("/" not in n[len(start) :] for n in self.names if n.startswith(start)):
                captions = self.captions_beside(base)
                if captions:
                    raise InputError(
                        f"{where} holds images but no class folders, and its KEY.txt members "
                        f"({first_and_more(captions, 1)}) are read as captions, not class labels",
                        f"{CLASS_FOLDERS_HINT}; or {_what_to_rename(captions[0])}",
                    )
                raise no_class_folders_error(where)
            raise NoImagesError(f"no class folders in {where}", CLASS_FOLDERS_HINT)
        return class_names

    def captions_beside(self, base: str) -> list[str]:
        """The `KEY.txt` files directly in folder `base` ("" = the root) beside an image of
        their KEY (a captioning data set's), as named in it, sorted: train asked such a tar
        for class folders without a word of what its .txt files are."""
        keys = {_key_and_extension(name)[0] for name in self.beside(base) if "." in name[1:]}
        start = base + "/" if base else ""
        found = []
        for path in _non_image_files(self):
            name = path[len(start) :] if path.startswith(start) else None
            split = _key_and_extension(name) if name and "/" not in name else None
            if split and split[1] == "txt" and split[0] in keys:
                found.append(name)
        return found

    def listed(self, base: str) -> tuple[list[str], bool]:
        """(the folders in folder `base`, whether images lie directly in it), as
        `source._subfolders` lists an unpacked folder."""
        start = base + "/"
        inside = {f[len(start) :].split("/")[0] for f in self.folders if f.startswith(start)}
        images = any(n.startswith(start) and "/" not in n[len(start) :] for n in self.names)
        return sorted(f for f in inside if f and not is_skipped_folder(f)), images

    def in_subfolders(self, base: str) -> bool:
        """Whether images lie in the visible subfolders of folder `base` ("" = the root)."""
        start = base + "/" if base else ""
        return any(
            n.startswith(start)
            and "/" in n[len(start) :]
            and not is_skipped_folder(n[len(start) :].split("/")[0])
            for n in self.names
        )

    def beside(self, base: str) -> list[str]:
        """The images directly in folder `base` ("" = the root), as named in it, sorted."""
        start = base + "/" if base else ""
        return sorted(
            n[len(start) :]
            for n in self.names
            if n.startswith(start) and "/" not in n[len(start) :]
        )


def _unpacked_tar(spec: str, listing: TarListing) -> _UnpackedTar:
    """The folder `listing`'s tar unpacks to: its images (`_images_by_unpacked_path`), inside
    the folder named as the archive where all lie in it, and its linked class folders read as a
    folder on disk reads them (`list_folders`, which warns of the links it does not enter)."""
    member_of = _images_by_unpacked_path(spec, listing)
    names = list(member_of)
    folders = {
        folder
        for folder in map(_unpacked_path, listing.folders)
        if folder is not None and folder != "."
    } | {posixpath.dirname(name) for name in names}
    prefix = _wrapping_folder(spec, names, folders)
    if prefix:
        names = [name[len(prefix) :] for name in names]
        folders = {f[len(prefix) :] for f in folders if f.startswith(prefix)}
    class_links, unentered = _class_folder_links(spec, listing, prefix)
    warn_unentered([os.path.join(spec, name) for name in unentered], spec)
    _warn_class_links_out(spec, listing, prefix)
    through = _linked_class_images(class_links, [prefix + name for name in names])
    names += list(through)
    folders |= {posixpath.dirname(name) for name in through} | set(class_links)
    # By the links' unpacked paths, as the images are named (`cat/./s.png` is cat/s.png),
    # each with its target as stored (as `ls -l` shows it once unpacked).
    texts = listing.link_texts
    links: dict[str, str | None] = {
        name[len(prefix) :]: texts[stored]
        for name, stored in ((_unpacked_path(n), n) for n in listing.links)
        if name is not None and name.startswith(prefix)
    }
    links.update({name: texts.get(prefix + name, end) for name, end in class_links.items()})
    reader = TarReader(spec, listing.stamp)
    return _UnpackedTar(spec, listing, member_of, names, folders, prefix, through, links, reader)


def _images_by_unpacked_path(spec: str, listing: TarListing) -> dict[str, str]:
    """Each image of a folder's tar by the path `tar -xf` unpacks it to (`/abs/x.png` is
    abs/x.png) -> the member it is (links out of the archive too, never followed: unreadable
    images); the images it does not read said in warnings: members stored sparse, members of
    a `..` part (which tar does not unpack, also where they stay inside the archive:
    `cat/../dog/e.png`), and members in a folder that is a link tar -x writes nothing through
    (`_leave_out_members_under_links`)."""
    # A link out of the archive (which tar -x unpacks pointing at the host's file: an
    # attacker's archive at /etc/passwd) is listed and never followed: an unreadable image
    # (`LEADS_OUT`), as a shard's is and as a link to nothing is on disk. It was left out with a
    # warning here, while a shard counted it: two rules for one link.
    stored = _image_members(listing)
    member_of: dict[str, str] = {}
    not_unpacked = []
    for name in stored:
        unpacked = _unpacked_path(name)
        if unpacked is None:
            not_unpacked.append(name)
        else:
            member_of[unpacked] = name
    _warn_sparse_images(spec, listing)
    _warn_hard_links_to_folders(spec, listing)
    _warn_unmade_hard_links(spec, listing)
    _warn_unwritten_images(spec, listing)
    if not_unpacked:
        note_not_unpacked(spec, not_unpacked)
        log.warning(
            f"{spec}: {counted(len(not_unpacked), 'image member')} with '..' in "
            f"{'its' if len(not_unpacked) == 1 else 'their'} path "
            f"{'is' if len(not_unpacked) == 1 else 'are'} not read, as tar -x does not unpack "
            f"such members: {first_and_more(not_unpacked, 3)}"
        )
    _leave_out_members_under_links(spec, listing, member_of)
    return member_of


def _image_members(listing: TarListing) -> list[str]:
    """The members and links of a folder's tar named as images, in the listing's order. Not
    macOS tar's `._NAME` members (extended attributes), nor a link to a folder (`cat/f.png ->
    ../dog/`), a folder once unpacked whatever its name: a linked folder
    (`_class_folder_links`)."""
    return [
        name
        for name in (*listing.members, *listing.links)
        if is_image_file(name)
        and not is_apple_double(posixpath.basename(name))
        and name not in listing.folder_links
    ]


def _warn_unwritten_images(spec: str, listing: TarListing) -> None:
    """One warning naming the images tar -x does not write where a file and a folder of one
    name meet (`TarListing.unwritten`), where torchkit read both."""
    shown = sorted(
        f"{name} ({why})" for name, why in listing.unwritten.items() if is_image_file(name)
    )
    if shown:
        log.warning(
            f"{spec}: {counted(len(shown), 'image member')} {'is' if len(shown) == 1 else 'are'} "
            "not read, as tar -x writes no file where a folder of its name holds files, nor "
            f"anything in a file: {first_and_more(shown, 3)}"
        )


def _warn_hard_links_to_folders(spec: str, listing: TarListing) -> None:
    """One warning naming the hard links to a folder: nothing is there once unpacked, where
    torchkit read the folder under the link's name (a class of another's images, or one file
    in two classes)."""
    found = listing.hard_to_folders
    if found:
        shown = sorted(f"{name} link to {target}" for name, target in found.items())  # tar -tv
        log.warning(
            f"{spec}: {counted(len(found), 'hard link')} to a folder "
            f"{'is' if len(found) == 1 else 'are'} not read, as tar -x makes no hard link to "
            f"a folder: {first_and_more(shown, 3)}"
        )


def _warn_unmade_hard_links(spec: str, listing: TarListing) -> None:
    """One warning naming the image-named hard links tar -x does not make, their target
    holding nothing where the archive stores them ('Cannot hard link to ...: No such file or
    directory'): nothing is there once unpacked."""
    shown = sorted(
        f"{name} link to {target}"  # as tar -tv lists it
        for name, target in listing.unmade_hard_links.items()
        if is_image_file(name) and not is_apple_double(posixpath.basename(name))
    )
    if shown:
        log.warning(
            f"{spec}: {counted(len(shown), 'hard link')} named as an image "
            f"{'is' if len(shown) == 1 else 'are'} not read, as tar -x makes no hard link to "
            f"a file stored after the link, or not at all: {first_and_more(shown, 3)}"
        )


def _warn_sparse_images(spec: str, listing: TarListing) -> None:
    sparse = [name for name in listing.sparse if is_image_file(name)]
    if sparse:
        log.warning(
            f"{spec}: {counted(len(sparse), 'image member')} "
            f"{'is' if len(sparse) == 1 else 'are'} stored sparse (tar --sparse), which torchkit "
            f"does not read: {first_and_more(sparse, 3)} (write the archive without --sparse, "
            "or give the folder tar -x unpacks)"
        )


def _leave_out_members_under_links(
    spec: str, listing: TarListing, member_of: dict[str, str]
) -> None:
    """Take out of `member_of` (unpacked path -> member) the images stored under a folder that
    is a link GNU tar -x writes no member through ("Cannot open: Not a directory"): a link out
    of the archive (`out -> /tmp`, then `out/x.png`), or one to a file, or whose target starts
    with `/` or holds `..` (tar makes those last, a plain file till then). torchkit read them
    (as class out). Said in one warning naming each with its link as stored. A plain link to
    a folder of the archive (`cat/plain -> sub`) is written through: the member
    `cat/plain/z.png` is read as cat/sub/z.png, where tar -x puts it."""
    if not listing.links:
        return
    links_by_part = _links_by_part(listing.links)
    held: dict[str, tuple[str | None, str]] = {}  # each image's folder -> `_folder_written`
    shown = []
    for name in list(member_of):
        folder = name.rpartition("/")[0]
        if folder not in held:
            held[folder] = _folder_written(folder, listing, links_by_part)
        link, written = held[folder]
        if link is not None:
            shown.append(f"{name} (in {link})")
            del member_of[name]
        elif written != folder:
            # Written through a link: where tar -x puts it, unless a member written there
            # later replaces it.
            member = member_of.pop(name)
            there = f"{written}/{name[len(folder) + 1 :]}" if written else name[len(folder) + 1 :]
            earlier = member_of.get(there)
            if earlier is None or _data_at(listing, earlier) < _data_at(listing, member):
                member_of[there] = member
    if shown:
        log.warning(
            f"{spec}: {counted(len(shown), 'image member')} "
            f"{'lies' if len(shown) == 1 else 'lie'} in a folder that is a link, not read, as "
            "tar -x writes no member through a link out of the archive, to a file, or whose "
            f"target starts with '/' or holds '..': {first_and_more(sorted(shown), 3)}"
        )


def _data_at(listing: TarListing, member: str) -> int:
    """Where `member`'s data lies in the archive (-1 for a link): the later member of two."""
    return listing.members[member][0] if member in listing.members else -1


def _links_by_part(links: dict[str, str | None]) -> dict:
    """The links' paths (a link stored under another spelling, `cat//in`, by the path it
    unpacks to) as a tree of their parts: `{"cat": {"in": {None: "cat//in"}}}`, each link's
    name under the key None. A folder's walk down it (`_folder_written`) costs its length: a
    look-up of each path on the way cost the square of its depth (2 s of CPU for one image
    24,000 folders deep)."""
    respelled = dict.fromkeys(
        link for link in links if link[:1] == "/" or "//" in link or "/." in link
    )
    # The links of plain names last: a path is the link stored under it where one is.
    paths = [(_unpacked_path(link), link) for link in respelled]
    paths += [(link, link) for link in links if link not in respelled]
    return _part_tree((path, link) for path, link in paths if path is not None)


def _folder_written(
    folder: str, listing: TarListing, links_by_part: dict
) -> tuple[str | None, str]:
    """(`LINK -> TARGET`, as stored, of the first folder on the way to `folder`, itself too,
    that is a link tar -x writes nothing through (`_leave_out_members_under_links`), else
    None; the folder tar -x writes `folder`'s members to: through each plain link to a folder
    of the archive on the way, `cat/plain` is cat/sub where `cat/plain -> sub`).
    `links_by_part`: the links' paths as a tree of their parts (`_links_by_part`)."""
    for _ in range(_MOST_LINKS):
        parts = folder.split("/") if folder else []
        node = links_by_part
        for depth, part in enumerate(parts, 1):
            node = node.get(part)
            if node is None:
                return None, folder
            link = node.get(None)
            if link is None:
                continue
            path = "/".join(parts[:depth])
            text = listing.link_texts[link]
            plain = not (text.startswith("/") or ".." in text.split("/"))
            if not plain or link not in listing.folder_links or link in listing.outside:
                return f"{path} -> {listing.outside.get(link, text)}", folder
            # written through: on to the folder it leads to, and its links
            linked = listing.folder_links[link]
            folder = "/".join(filter(None, [linked, *parts[depth:]]))
            break
        else:
            return None, folder
    return None, folder  # links round in a loop: as stored


def _class_folder_links(
    spec: str, listing: TarListing, prefix: str
) -> tuple[dict[str, str], list[str]]:
    """(the links among a folder's tar members that a class folder on disk could be, each
    (its name inside `prefix`, the wrapping folder) with the folder of the archive it leads
    to: a link beside class folders (`img` -> `real/`) or split folders, or in a split folder
    (`val/cat` -> `train/cat/`); the links to folders deeper inside a class, sorted). Those are
    not followed, as on disk (`list_folders` enters no link that leads back into the data, and
    says so). A class folder linked to a folder that holds it (`cat` -> `.`) is an
    InputError, as on disk."""
    found: dict[str, str] = {}
    unentered: list[str] = []
    for link, folder in listing.folder_links.items():
        if not link.startswith(prefix):
            continue
        name = link[len(prefix) :]
        parent, _, _ = name.rpartition("/")
        if parent and parent not in SPLIT_NAMES:
            if not any(is_skipped_folder(part) for part in parent.split("/")):
                unentered.append(name)
            continue
        if not folder or link.startswith(folder + "/") or folder.startswith(link + "/"):
            raise InputError(
                f"{spec}:{name} -> {folder or '.'} is a class folder linked to a folder that "
                "holds it, or that it holds",
                "remove the link, or link to the class's own folder",
            )
        found[name] = folder
    return found, sorted(unentered)


def _warn_class_links_out(spec: str, listing: TarListing, prefix: str) -> None:
    """One warning naming the links out of the archive where a class or split folder could be
    (`bird -> /data/birds`, as `tar -cf` stores a linked folder): never followed, their images
    are not read, where the class went missing without a word (`prefix`: the wrapping folder).
    Those that lead to nothing the archive holds (`rose -> .missing`, or round a loop) are
    named in a warning of their own, as a folder on disk names its links to nothing."""

    def where_a_class_could_be(link: str) -> str | None:
        name = _unpacked_path(link)
        if name is None or is_image_file(link) or not name.startswith(prefix):
            return None
        parent, _, base = name[len(prefix) :].rpartition("/")
        if (not parent or parent in SPLIT_NAMES) and not is_skipped_folder(base):
            return name[len(prefix) :]
        return None

    shown, nowhere = [], []
    for link, target in listing.outside.items():
        name = where_a_class_could_be(link)
        if name is not None:
            shown.append(f"{name} -> {target}")
    for link, end in listing.links.items():
        if end is None and link not in listing.outside and link not in listing.folder_links:
            name = where_a_class_could_be(link)
            if name is not None:
                nowhere.append(f"{name} -> {listing.link_texts.get(link, '?')}")
    if nowhere:
        log.warning(
            f"{spec}: {counted(len(nowhere), 'link')} where a class folder could be "
            f"{'leads' if len(nowhere) == 1 else 'lead'} to nothing the archive holds, not "
            f"read: {first_and_more(sorted(nowhere), 3)} (its images are left out, a class "
            "folder's class)"
        )
    if shown:
        log.warning(
            f"{spec}: {counted(len(shown), 'link')} where a class folder could be "
            f"{'leads' if len(shown) == 1 else 'lead'} out of the archive, not followed, as "
            f"torchkit follows no link out of an archive: {first_and_more(sorted(shown), 3)} "
            "(tar -h stores the files a link leads to)"
        )


def _unpacked_path(name: str) -> str | None:
    """The path the member `name` of a tar unpacks to with GNU tar's `tar -xf`: without its
    leading slashes (`/abs/x.png` is abs/x.png, as Python's tarfile with its `data` filter
    unpacks it too) and spelled plainly (`dog/./c.png`, `dog//c.png` are dog/c.png). None for a
    name with a `..` part, which GNU tar (and bsdtar) do not unpack ("Member name contains
    '..'"), also where it stays inside the archive (`cat/../dog/e.png`)."""
    if ".." in name.split("/"):
        return None
    return posixpath.normpath(name.lstrip("/") or ".")


def _linked_class_images(class_links: dict[str, str], images: list[str]) -> dict[str, str]:
    """Each image under a linked class folder, named through the link as on disk
    (`img/x.png` for `real/x.png`, where `img` -> `real/`) -> the member (`images`: full
    member names) it is. One sort, then a search a link: a scan of every image a link took
    52 s for a thousand linked classes of 100 images each (0.5 s so)."""
    through: dict[str, str] = {}
    if not class_links:
        return through
    ordered = sorted(images)
    for link, folder in class_links.items():
        start = folder + "/"
        at = bisect.bisect_left(ordered, start)
        while at < len(ordered) and ordered[at].startswith(start):
            through[link + ordered[at][len(folder) :]] = ordered[at]
            at += 1
    return through


def _wrapping_folder(spec: str, names: list[str], folders: set[str]) -> str:
    """`X/` when everything in `X.tar` lies in one folder `X` (`tar cf X.tar X`; hidden folders
    and __MACOSX aside); else `T/` when it all lies in one folder of another name that holds
    the data's class folders (two or more holding images) or its split folders (`tar cf
    flowers-v2.tar flowers`: tar -x gives flowers/<class>/img, which read from the archive's
    root was one class `flowers`, trained as none, without a word); else "". A folder of
    images alone (`cat/x.png`), or of one subfolder of them, stays one class; a split folder
    (`train/`) stays a split."""
    stem = os.path.basename(spec)[: -len(".tar")]
    shown = [f for f in folders if f and not is_skipped_folder(f.split("/")[0])]
    tops = {name.split("/")[0] for name in names} | {f.split("/")[0] for f in shown}
    if len(tops) != 1 or not names:
        return ""
    (top,) = tops
    prefix = top + "/"
    if not all(n.startswith(prefix) for n in names) or top in SPLIT_NAMES and top != stem:
        return ""
    if top == stem:
        return prefix
    inside = {
        n[len(prefix) :].split("/")[0]
        for n in names
        if "/" in n[len(prefix) :] and not is_skipped_folder(n[len(prefix) :].split("/")[0])
    }
    return prefix if len(inside) >= 2 or inside & set(SPLIT_NAMES) else ""
