"""OUT while a split writes it: the move's journal, the earlier split set aside under `--force`
and put back when the new one fails, what a killed split left, and the `-o` report's place."""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
from collections.abc import Collection, Sequence
from pathlib import Path

from torchkit.core.data.sources.inputs import data_inputs
from torchkit.core.data.sources.moving import moving_record
from torchkit.core.data.sources.required import require_data
from torchkit.core.data.sources.splitting import (
    SPLIT_JOURNAL,
    SPLIT_NAMES,
    path_key,
    written_split_names,
)
from torchkit.core.io.claims import (
    claim_folder,
    claimed_change,
    kept_note,
    remove_written,
    reporting_write_errors,
    tell_note,
)
from torchkit.core.io.errors import InputError, OutputExistsError, OutputWriteError, first_and_more
from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.io.files import NAME_ERRORS, atomic_write_json, tree_entries
from torchkit.core.io.folder_contents import is_browser_file
from torchkit.core.io.force import clear_killed_start, remove_marker, write_marker
from torchkit.core.io.open_outputs import closed, opened
from torchkit.core.io.output_paths import MARKER, remove_tree
from torchkit.core.io.outputs import discard_tree
from torchkit.core.io.overlap import OutputOverlapError
from torchkit.core.io.records import open_record
from torchkit.core.io.special_files import is_special_file
from torchkit.core.io.temporaries import remove_dead_temporaries
from torchkit.core.split.options import MANIFEST, RESERVED_PREFIX, is_folder_name

log = logging.getLogger("torchkit")

# A move's record that OUT holds the only copies; a copy's (symlink's, hardlink's) that OUT is
# half-written, removed once it is finished.
JOURNAL = SPLIT_JOURNAL
REPLACED = ".torchkit-split-replaced"  # the earlier split, set aside while --force replaces it
DISCARDED = ".torchkit-split-discarded"  # the same, being deleted once the new split is kept
WHAT = "output folder"


def read_journal(out: Path) -> dict | None:
    try:
        with open_record(out / JOURNAL) as handle:  # a FIFO there: an error, never a wait
            record = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read {out / JOURNAL}: {error}") from None
    if not isinstance(record, dict):
        raise InputError(f"cannot read {out / JOURNAL}: not a torchkit split journal")
    return record


def write_journal(out: Path, record: dict) -> None:
    atomic_write_json(out / JOURNAL, record)


def remove_journal(out: Path) -> None:
    """The journal of a split that finished (or whose leftovers are removed): last, since a
    split whose journal is there is unfinished to every reader."""
    remove_tree(out / JOURNAL, ignore_errors=False)


def note_moving(root: Path, out: Path, folders: Sequence[str | os.PathLike] = ()) -> None:
    """Record beside ROOT's files that a move into `out` begins (`moving_record`: a second
    split out of that ROOT, and every reader of it, learns from it and from OUT's journal that
    the move has not finished), and in each of the `folders` a CSV index ROOT lists files in
    (a reader of such a folder, or a move out of it, learns it from there: the record names
    ROOT). Where that place cannot be written (a CSV index in a read-only folder) the move
    goes on without it."""
    moved = os.path.realpath(root)
    notes = [(moving_record(root), {"out": os.path.realpath(out)})]
    notes += [
        (moving_record(Path(f)), {"out": os.path.realpath(out), "root": moved}) for f in folders
    ]
    for place, record in notes:
        # OutputWriteError: atomic_write's word for the read-only (or full) disk
        with contextlib.suppress(OSError, OutputWriteError):
            atomic_write_json(place, record, indent=None)


def forget_moving(root: Path, folders: Sequence[str | os.PathLike] = ()) -> None:
    """The move's records in ROOT and in the `folders` of a CSV index, once the move is
    done."""
    for place in [moving_record(root), *(moving_record(Path(f)) for f in folders)]:
        with contextlib.suppress(OSError):
            place.unlink(missing_ok=True)


def previous_split_names(out: Path) -> set[str]:
    """The split folders of the earlier split in OUT, as its split.csv names them."""
    names = written_split_names(out)
    return {n for n in names if is_folder_name(n) and not n.startswith(RESERVED_PREFIX)}


def refuse_files_not_written(out: Path, folders: Collection[str]) -> None:
    """`--force` sets the split folders of OUT (the earlier split's and those of the names this
    split writes) aside whole, and deletes them once the new split is kept: a file in them
    that the earlier split.csv does not list (one you put into `train/cat/`, a `test/` folder
    of yours beside a two-part split or a manifest's OUT) is not torchkit's, and is refused
    before anything changes rather than deleted with them."""
    listed = _listed_paths(out)
    entries = os.listdir(out)
    foreign: list[str] = []
    for name in sorted({_spelled(out, name, entries) for name in folders} - {None}):
        folder = out / name
        if folder.is_symlink() or not folder.is_dir():
            foreign.append(name)
            continue
        prefix = len(str(folder)) + 1
        for path, entry in tree_entries(folder):
            relative = f"{name}/{path[prefix:]}"
            if path_key(relative) not in listed and not is_browser_file(entry.name):
                foreign.append(relative)
    if foreign:
        raise OutputExistsError(
            f"{WHAT} {out} holds files in its split folders that the earlier split did not "
            f"write, which --force would delete with them: {first_and_more(foreign, 3)}",
            "move them out of those folders, or choose another output folder",
        )


def _spelled(out: Path, name: str, entries: list[str]) -> str | None:
    """The entry of OUT (`entries`) that `name` finds: itself, or where OUT ignores case the one
    spelled in another case (which split.csv names as it is spelled)."""
    if name in entries:
        return name
    if not os.path.lexists(out / name):  # a folder TRAIN beside train/ is not train's
        return None
    return next((entry for entry in entries if entry.casefold() == name.casefold()), None)


def _listed_paths(out: Path) -> set[str]:
    """The `path` of every row of OUT's split.csv (none when there is none), as `path_key`s."""
    rows = read_split_rows(out, ("path",), "the earlier split", missing_ok=True)
    return {path_key(row["path"]) for row in rows}


def read_split_rows(
    out: Path, columns: Sequence[str], what: str, *, missing_ok: bool = False
) -> list[dict[str, str]]:
    """The rows of the split.csv that torchkit split wrote in OUT (none when there is none and
    `missing_ok`), each with a value in every one of `columns`: a file without one of them, or
    a row cut short (an edit, a disk that filled), is an InputError naming `what` it is, never
    a KeyError half-way through the move that follows it."""
    path = out / MANIFEST
    try:
        with open_record(path, NAME_ERRORS) as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
            header = reader.fieldnames or []
    except FileNotFoundError:
        if missing_ok:
            return []
        raise InputError(f"cannot read {what} {path}: it is gone") from None
    except (OSError, csv.Error, UnicodeDecodeError) as error:
        raise InputError(f"cannot read {what} {path}: {error}") from None
    absent = [name for name in columns if name not in header]
    if absent:
        raise InputError(
            f"cannot read {what} {path}: it has no {', '.join(absent)} column",
            "torchkit split writes the columns path, label, split, source",
        )
    for number, row in enumerate(rows, start=2):  # line 1 is the header
        if any(row[name] is None for name in columns):
            raise InputError(f"cannot read {what} {path}: row {number} is cut short")
    return rows


def discard_replaced(out: Path) -> None:
    """Delete the set-aside earlier split: renamed first (atomic), so that a kill half-way
    through the delete never leaves a half-deleted split that looks like one to put back."""
    aside, gone = out / REPLACED, out / DISCARDED
    if gone.is_dir():
        remove_tree(gone)
    if aside.is_dir():
        discard_tree(aside, gone)


def put_back_replaced(out: Path) -> list[str]:
    """Put the set-aside earlier split back in place of a new one that did not finish: its
    split.csv over the new one, each split folder where the new one's is gone or holds no
    files. A
    folder that still holds files (someone else's, put there while the new split ran) is not
    put back: that part of the earlier split stays set aside. Returns the names put back."""
    aside = out / REPLACED
    if not aside.is_dir():
        return []
    names = []
    for name in sorted(os.listdir(aside)):
        target = out / name
        if name == MANIFEST:
            remove_tree(target, ignore_errors=False)
        elif (
            target.is_dir() and not target.is_symlink() and next(tree_entries(target), None) is None
        ):
            remove_tree(target, ignore_errors=False)  # empty folders only: one with files stays
        if not os.path.lexists(target):
            os.replace(aside / name, target)
            names.append(name)
    with contextlib.suppress(OSError):  # not empty: some names are still set aside
        aside.rmdir()
    return names


def recover_split_leftovers(out: Path) -> None:
    """What a killed split left in OUT, with OUT's lock held: a copy's half-written split is
    removed (only what that run wrote: the files its journal lists, then the split folders
    this leaves empty, split.csv, the marker it added; files someone else put there stay), an
    earlier split still set aside is put back (a move that had started, with its journal
    written, had discarded it already), one being deleted is deleted."""
    if not out.is_dir():  # nothing, or not a folder: `check_replaceable` says which
        return
    for name in (JOURNAL, MANIFEST, MARKER):  # a write of them killed half-way
        remove_dead_temporaries(out / name)
    clear_killed_start(out, "split")  # killed before its journal: it wrote nothing else
    if (out / DISCARDED).exists():
        remove_tree(out / DISCARDED)
    journal = read_journal(out)
    if journal is not None and journal.get("state") == "copying":
        written = [
            n
            for n in journal.get("names") or []
            if isinstance(n, str) and is_folder_name(n) and not n.startswith(RESERVED_PREFIX)
        ]
        dests = journal.get("dests")
        if isinstance(dests, list):
            files = [d for d in dests if isinstance(d, str)]
            left = remove_split_files(out, [*files, MANIFEST], written, journal.get("made") is True)
        else:  # the journal of a torchkit that did not list the files: the split folders
            for name in [*written, MANIFEST]:
                remove_tree(out / name, ignore_errors=False)
            left = []
        if journal.get("marked"):
            remove_marker(out)
        remove_journal(out)
        note = (
            f"removed the unfinished split in {out} ({', '.join(written)}) that a killed "
            "torchkit split had left"
        )
        if left:
            note += "; " + kept_note(WHAT, out, left, "the killed split")
        log.warning(note)
    if (out / REPLACED).is_dir():
        journal = read_journal(out)
        if journal is not None and journal.get("mode") == "move":
            discard_replaced(out)  # killed after the move's plan was written: it is finished
        else:
            names = put_back_replaced(out)
            log.warning(
                f"put back the earlier split in {out} ({', '.join(names)}), which a killed "
                "torchkit split had set aside"
            )
    if (out / REPLACED).is_dir():  # its folders in OUT hold files of someone else's
        left = ", ".join(sorted(os.listdir(out / REPLACED)))
        raise OutputExistsError(
            f"{out / REPLACED} holds part of an earlier split ({left}) that a failed split set "
            "aside: the folders of that name in OUT hold files torchkit did not write",
            "move those files elsewhere, or the set-aside folders back yourself, then run "
            "the split again",
        )


def remove_split_files(
    out: Path, files: Sequence[str], folders: Collection[str], made: bool
) -> list[str]:
    """Remove the OUT-relative `files` an unfinished split wrote, then the folders this leaves
    empty; returns the names left in OUT that hold files someone else put there: the split
    folders (`folders`) still in it, or, in an OUT the split made (`made`), anything but its
    marker and journal."""
    remove_written(out, [os.path.join(out, name) for name in files])
    try:
        names = sorted(os.listdir(out))
    except OSError:
        return []
    return [n for n in names if n in folders or (made and n not in (MARKER, JOURNAL))]


class SplitOutput:
    """OUT while one split writes it: made and marked, the earlier split set aside, and on
    failure everything this run wrote removed and the earlier split put back. Open
    (`open_outputs`) until kept or abandoned: a stop where the split's own clean-up is not in
    place is finished by the end of the command as the split would have (`close_unfinished`)."""

    def __init__(self, out: Path, doomed: list[str]) -> None:
        self.out = out
        self.doomed = doomed
        self.existed = out.is_dir()
        self.marked = False
        self.written: list[str] = []  # every file this run may write into OUT
        self.folders: set[str] = set()  # its split folders
        self.keeping: bool | None = None  # keep() entered; True: the split is finished too
        self._token: int | None = opened(self)

    def begin(self, names: list[str], mode: str, dests: Sequence[str]) -> None:
        # Everything this run may write into OUT (a manifest split has no journal, and an
        # earlier move's journal never gets this far): removed again by abandon(), and
        # nothing else (the split folders, once that leaves them empty). Recorded only once
        # the earlier split is set aside: a stop or an error before that deleted the earlier
        # split's files at those names (its split.csv, a file of the same class and name).
        written = [*dests, MANIFEST] + ([JOURNAL] if mode != "manifest" else [])
        with reporting_write_errors(self.out):
            self.out.mkdir(parents=True, exist_ok=True)
            if not (self.out / MARKER).exists():
                write_marker(self.out, "split")
                self.marked = True
            claim_folder(self.out, what=WHAT, command="split")
            aside = False
            for name in self.doomed:
                # Looked up as each goes: where OUT ignores case, `Train` (the earlier split's)
                # and `train` (this one's) are one folder, set aside by the first.
                if os.path.lexists(self.out / name):
                    if not aside:
                        (self.out / REPLACED).mkdir()
                        aside = True
                    os.replace(self.out / name, self.out / REPLACED / name)
        self.written, self.folders = written, set(names)

    def keep(self, finished: bool = False) -> None:
        """The new split stays: the earlier one is deleted, and where the split is
        `finished` (every file in place; not a move, whose journal says what is left to move)
        its journal goes too, last: a kill before that redoes the split."""
        self.keeping = finished
        with reporting_write_errors(self.out):
            discard_replaced(self.out)
            if finished:
                remove_journal(self.out)
        closed(self._token)

    def close_unfinished(self, error: BaseException | None) -> None:
        if self.keeping is None:
            self.abandon(error)
        else:  # stopped in `keep`: what is kept is whole, so the keep is finished
            self.keep(self.keeping)

    def abandon(self, error: BaseException | None = None) -> None:
        """Remove what this run wrote and put the earlier split back; files someone else put
        into OUT meanwhile stay, and `error` (the failure ending the split) says so."""
        if claimed_change(self.out) is not None:
            closed(self._token)
            return  # removed or replaced meanwhile: what is there now is not this run's
        # Left: a split folder of this run's with someone else's files in it, or (in an OUT
        # this run made) anything at all but the marker.
        left = remove_split_files(self.out, self.written, self.folders, not self.existed)
        put_back_replaced(self.out)
        if self.marked:
            remove_marker(self.out)
        if not self.existed:
            with contextlib.suppress(OSError):
                self.out.rmdir()
        closed(self._token)
        if left:
            note = kept_note(WHAT, self.out, left)
            if (self.out / REPLACED).is_dir():
                note += f"; the earlier split is still set aside in {self.out / REPLACED}"
            tell_note(note, error)


def check_report_file(
    output: str | os.PathLike,
    force: bool,
    source: str | os.PathLike,
    out: str | os.PathLike,
    names: Sequence[str] | None = None,
) -> None:
    """Check the `-o FILE` report of a split before any work: not the dataset nor inside it (the
    output-safety rules), and not OUT nor a file the split writes there (split.csv, its own
    `.torchkit*` files, anything inside a split folder: in move mode the only copies). A file
    of your own beside the split is fine. A missing dataset is said first."""
    require_data(source)
    check_output_file(output, force, data_inputs(source), what="output")
    if is_special_file(output):
        return
    inside = os.path.relpath(os.path.realpath(output), os.path.realpath(out))
    if inside == os.pardir or inside.startswith(os.pardir + os.sep):
        return
    first = inside.split(os.sep)[0].casefold()
    split_folders = {n.casefold() for n in (names or SPLIT_NAMES)}
    ours = first in split_folders | {MANIFEST} or first.startswith(RESERVED_PREFIX)
    if inside != "." and not ours:
        return
    raise OutputOverlapError(
        f"output {output} is "
        + ("the output folder" if inside == "." else "a file the split writes in")
        + f" {out}",
        "choose another output file",
    )
