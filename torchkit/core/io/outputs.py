"""The output-safety layer: every output a command writes goes through here, so the rule that
torchkit never loses a user's file is enforced in one place.

- An output may not be, contain or lie inside an input of the same command (`check_overlap`).
- `--force` replaces a folder only if it is empty or the same command wrote it (a `.torchkit`
  marker naming it, or only files that command writes beside the record it always writes:
  `holds_json_record`), and only if it holds nothing that command does not write
  (`folder_contents`: a user's notes.txt is refused, never deleted with the folder); `/`, `~`,
  the working directory and its parents never. A folder holding only the same command's
  marker (and its dead writers' temporaries) is empty: a run killed before its first file
  (`clear_killed_start`).
- A folder being written is locked (`.NAME.torchkit-lock` beside it, `flock`); a second command
  on the same folder is refused at once with the holder's PID.
- An old output replaced with `--force` is set aside (`.NAME.<hex>.replaced`) and put back if
  the new run fails, is interrupted or terminated before it has written something worth keeping;
  one left behind by a killed run is put back (or reported) by the next run on that folder,
  which removes only the names the killed run wrote (`.torchkit-written`, appended before each).
  An old file output is set aside the same way (`ReplacedFiles`, flocked while its run lives);
  one a killed run left is removed by the next run replacing that file.

Everything is checked before any work; nothing here prints (warnings go to the `torchkit` log).
This module writes output folders (`OutputFolder`); the rest lives beside it, a job a module:
`overlap` (outputs against inputs), `special_files`, `file_outputs` (a file output's checks,
its atomic publishing, `ReplacedFiles`), `write_errors`, `force` (the marker and what `--force`
replaces), `output_locks`, `claims` (the folders being written), `output_paths` (the names
beside an output), `mounts`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import IO

from torchkit.core.io.claims import (
    CLAIMED,
    Claim,
    OutputFolderReplacedError,
    check_claimed,
    claim_folder,
    kept_note,
    lstat_id,
    remove_written,
    reporting_write_errors,
    tell_note,
    what_is_at,
    written_into,
)
from torchkit.core.io.durability import fsync_directory, sync_file_system
from torchkit.core.io.errors import OutputWriteError
from torchkit.core.io.file_outputs import check_folders_above
from torchkit.core.io.folder_contents import exact_pattern, path_inside
from torchkit.core.io.force import (
    ForceRefusal,
    check_replaceable,
    clear_killed_start,
    force_hint,
    is_empty_dir,
    killed_start_leftovers,
    list_reports,
    marker_field,
    refuse_foreign_entries,
    write_marker,
)
from torchkit.core.io.mounts import is_mount_point
from torchkit.core.io.open_outputs import closed, opened
from torchkit.core.io.output_locks import FolderLock
from torchkit.core.io.output_paths import (
    DISCARDED_SUFFIX,
    MARKER,
    PARTIAL_SUFFIX,
    REPLACED_SUFFIX,
    WRITTEN_JOURNAL,
    leftovers,
    remove_tree,
    shown,
    sibling,
)
from torchkit.core.io.overlap import InputPath, check_not_protected, check_overlap
from torchkit.core.io.records import read_record_bytes
from torchkit.core.io.special_files import check_not_stdout
from torchkit.core.io.temporaries import (
    folder_permissions,
    give_folder_permissions,
    remove_dead_temporaries,
    temporary_stem,
    temporary_stems,
)
from torchkit.core.io.write_errors import is_write_error, write_error
from torchkit.deferred_signals import signals_deferred

log = logging.getLogger("torchkit")


def discard_tree(path: Path, gone: Path | None = None) -> None:
    """Rename first (atomic) to `gone`, then delete: a kill half-way through the delete leaves
    a folder named as discarded, never a half-deleted one that looks like a set-aside output."""
    if gone is None:
        gone = path.with_name(path.name.rsplit(".", 1)[0] + DISCARDED_SUFFIX)
    try:
        try:
            os.replace(path, gone)
        except OSError:
            gone = path
        remove_tree(gone)
    except BaseException:
        # Ctrl-C or SIGTERM half-way (the CLI ignores a second one): the delete decided is
        # finished, not left as a hidden folder of the old output until a next run.
        remove_tree(gone if os.path.lexists(gone) else path)
        raise


def recover_leftovers(folder: Path) -> list[str]:
    """Clean up after a torchkit run on `folder` that was killed (SIGKILL, power cut), with the
    folder's lock held: half-written temporaries are removed, a set-aside old output is put back
    when the killed run had not written anything worth keeping. Returns what was done, as
    sentences for a warning."""
    notes: list[str] = []
    if folder.is_dir() and not folder.is_symlink():
        # A run killed as it wrote the marker left the marker's temporary: without it, the
        # folder is what a run killed just before its marker left (empty, or its own files).
        remove_dead_temporaries(folder / MARKER)
    for leftover in leftovers(folder, PARTIAL_SUFFIX) + leftovers(folder, DISCARDED_SUFFIX):
        remove_tree(leftover)
    for aside in leftovers(folder, REPLACED_SUFFIX):
        # A whole (atomic) output in place names the set-aside it replaced in its marker: it got
        # there whole, so its run was killed after the swap, before deleting the old output.
        whole = folder.is_dir() and not folder.is_symlink()
        replaced = marker_field(folder, "replaces") if whole else None
        if aside.name == replaced:
            discard_tree(aside)
            notes.append(
                f"kept {folder}, the complete output of a torchkit run killed just after putting "
                f"it in place, and removed the earlier output it replaced (set aside at {aside})"
            )
            continue
        current = folder.exists() or folder.is_symlink()
        # Only a folder that a torchkit run created and never marked as worth keeping (the
        # set-aside would be gone) makes room: the names that run wrote are removed, and the
        # folder once that leaves it empty; files someone else put there stay, and so does it.
        if (
            current
            and replaced is None  # never a whole output, which is complete
            and folder.is_dir()
            and not folder.is_symlink()
            and (is_empty_dir(folder) or (folder / MARKER).is_file())
        ):
            others = remove_written(folder, _killed_runs_names(folder))
            if others:
                notes.append(
                    kept_note("output folder", folder, others, "a killed torchkit run")
                    + f"; an earlier output of it, which that run had set aside, is at {aside}:"
                    " move it back"
                )
                continue
            with contextlib.suppress(OSError):
                folder.rmdir()
            current = os.path.lexists(folder)
        if current:
            notes.append(
                f"an earlier output of {folder}, set aside by a torchkit run that was killed, is "
                f"still at {aside}: move it back or remove it"
            )
            continue
        os.replace(aside, folder)
        notes.append(f"put back {folder}, which a killed torchkit run had set aside")
    return notes


def _killed_runs_names(folder: Path) -> list[str]:
    """What a killed run that had set an old output aside wrote into `folder`: the names in its
    `WRITTEN_JOURNAL` (a torn last line is one it never began), the temporaries of those names
    (no one writes them now: the folder is locked), its marker and the journal itself."""
    journal = folder / WRITTEN_JOURNAL
    names = []
    with contextlib.suppress(OSError):
        for line in read_record_bytes(journal).splitlines():  # a FIFO there: no names
            with contextlib.suppress(ValueError):
                name = json.loads(line)
                if isinstance(name, str) and not os.path.isabs(name):
                    names.append(os.path.normpath(os.path.join(folder, name)))
    by_parent: dict[str, set[str]] = {}  # what `temporary_stem` reads from their temporaries
    for path in names:
        by_parent.setdefault(os.path.dirname(path), set()).update(
            temporary_stems(os.path.basename(path))
        )
    for parent, own in by_parent.items():
        with contextlib.suppress(OSError):
            for entry in os.listdir(parent):
                if temporary_stem(entry) in own:
                    names.append(os.path.join(parent, entry))
    return [*names, os.fspath(folder / MARKER), os.fspath(journal)]


def _close_quietly(journal: IO[bytes]) -> None:
    """Close a `WRITTEN_JOURNAL`: a line its failed flush left in the buffer (the disk filled)
    fails the close again, which stopped `abandon` before the old output went back (left set
    aside, hidden, behind a raw OSError). The file is closed all the same; the names it lists
    are in `written_into` too, and the journal is removed with them."""
    with contextlib.suppress(OSError):
        journal.close()


def reports_inside(folder: Path, reports: Iterable[str | os.PathLike | None]) -> list[str]:
    """The -o files of `reports` that lie inside `folder`, as paths relative to it
    (`/`-separated): the run's own to replace there with the rest (`OutputFolder`'s
    `reports`). None and `-` (stdout) are none."""
    return [
        inside.as_posix()
        for report in reports
        if report is not None and os.fspath(report) != "-"
        for inside in [path_inside(report, folder)]
        if inside is not None
    ]


class OutputFolder:
    """One output folder of one command, from the checks to the end of the run.

    Create it before the slow work (the checks and the lock happen at once), call `begin()` when
    the first file is about to be written (an old output is set aside, the folder made and
    marked), `keep()` once the new output is worth more than the old one, and `finish(ok)` at
    the end (or use it as a context manager): a run that fails before `keep()` leaves the old
    output back in place and no trace of itself.

    `resume=True` continues an existing folder in place: no `--force` rules, nothing set aside.
    `owned` names what the command writes into the folder (`folder_contents`): `--force` refuses
    a folder holding anything else, which replacing it whole would delete. `reports`: the -o
    files of the run, which are its own where they lie inside the folder (`REPORTS_KEY`).
    `start_files` names what the command writes before anything worth keeping
    (`killed_start_leftovers`): a folder holding only those, the marker and temporaries, is a
    run of the command killed before its first result, replaced without `--force` (set aside
    like an old output, and put back if the new run keeps nothing: `replaces_killed_start`).
    `atomic=True` fills a hidden temporary folder that replaces the output only at the end, so
    the output never holds a half-written result. `resume_removes` names what a continued
    run removes inside it: work folders (extract-features' `.partial`, its rows moved out at
    the end) and regular expressions of the names of regular files directly in it (convert
    shards' stale shards):
    `resume=True` is refused, before any work, where those hold an entry that `owned` does not
    name (a file of yours), which would go with it (`resume_option` says what would).

    From `begin()` on, every write through `atomic_write`/`atomic_path` (and `check()`) checks
    that the folder is still the one begun: one removed, renamed away or replaced stops the
    command (`replaced_hint` says what to do then) and is never made again nor deleted.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        command: str,
        force: bool = False,
        inputs: Iterable[InputPath | None] = (),
        known_files: Collection[str] = (),
        what: str = "output folder",
        resume: bool = False,
        atomic: bool = False,
        exists_hint: str | Callable[[], str] = "",
        replaced_hint: str = "",
        start_files: Collection[str] = (),
        owned: Collection[str] | None = None,
        reports: Iterable[str | os.PathLike | None] = (),
        resume_removes: Collection[str | re.Pattern[str]] = (),
        resume_option: str = "--resume",
    ) -> None:
        check_not_stdout(path, what)
        self.final = Path(path)
        # The -o files this run writes inside the folder: its own to replace, and recorded in
        # the marker as the command's (`note_report`), so that the next --force replaces them.
        self.reports = reports_inside(self.final, reports)
        if owned is not None:
            owned = (*owned, *(exact_pattern(name) for name in self.reports))
        self.known_files = known_files
        self.owned = owned
        self.replaced_hint = replaced_hint
        self._claim: Claim | None = None
        self.command = command
        self.what = what
        self.resume = resume
        self.atomic = atomic
        self.notes: list[str] = []
        self._aside: Path | None = None
        self._swap_aside: Path | None = None  # atomic: where `_swap_in` sets the old output aside
        self._began = False
        self._kept = False
        self._lock: FolderLock | None = None
        self._journal: IO[bytes] | None = None  # WRITTEN_JOURNAL, while an old output is aside
        if not resume:  # continuing in place replaces nothing, wherever it is
            check_not_protected(self.final, what)
        check_overlap(self.final, what, inputs)
        check_folders_above(self.final, what)
        # Open from before its lock until released: a stop anywhere in between, also where no
        # try of this class is running (as `__exit__` or `finish` is entered, or in the
        # caller's steps before its `with`), is closed by the end of the command.
        self._token: int | None = opened(self)
        try:
            # Lock first: a second command is refused with the holder's PID whatever its
            # options, and a killed run's set-aside is put back before the folder is judged.
            # Signals deferred: the lock file is made and its descriptor kept, or neither.
            with signals_deferred():
                self._lock = FolderLock(self.final, what)
            self.notes = recover_leftovers(self.final)
            for note in self.notes:
                log.warning(note)
            if not resume:  # a run of this command killed before its first file
                clear_killed_start(self.final, command)
            self._existed = self.final.is_dir()
            self.replaces_killed_start = (
                not resume
                and bool(start_files)
                and killed_start_leftovers(self.final, command, start_files) is not None
            )
            if not resume:
                # A callable hint judges the folder as it is now (a killed run's leftovers
                # gone), and only where it is told (`check_replaceable`)
                self.has_content = check_replaceable(
                    self.final,
                    force or self.replaces_killed_start,
                    what=what,
                    known_files=known_files,
                    hint=exists_hint,
                    command=command,
                    owned=owned,
                )
            else:
                self.has_content = self.final.is_dir() and not is_empty_dir(self.final)
                self._refuse_foreign_work(resume_removes, owned, resume_option)
            if self._existed and is_mount_point(self.final):
                self._written_in_place(resume)
            # The old output judged replaceable here: an atomic `keep()` replaces that folder
            # only, never one made at its place while the command ran.
            self._replacing = lstat_id(self.final) if self.has_content else None
        except BaseException:
            self.release()
            raise
        self.path = self.final  # where to write; a temporary folder once begun with `atomic`

    def _refuse_foreign_work(
        self, work: Collection[str], owned: Collection[str] | None, option: str
    ) -> None:
        """A continued run removes `work` inside the output (`resume_removes`): refused where
        that holds an entry `owned` does not name (the same proofs as --force's), which would
        be deleted with it."""
        if not self.has_content or self.final.is_symlink():
            return
        patterns = tuple(name for name in work if isinstance(name, re.Pattern))
        folders = [name for name in work if isinstance(name, str) and (self.final / name).is_dir()]
        for within in [*folders, *([patterns] if patterns else [])]:
            refuse_foreign_entries(
                self.final, owned or (), what=self.what, within=within, option=option
            )

    def force_hint(self, default: str) -> str:
        """The hint of a later refusal that would send the user to `--force` (`default`):
        `default` where --force would replace this folder as it is now, else what to do
        instead (`force.force_hint`)."""
        return force_hint(
            self.final,
            default,
            known_files=self.known_files,
            command=self.command,
            owned=self.owned,
        )

    def _written_in_place(self, resume: bool) -> None:
        """The output folder is a mount point (a volume mounted at OUT): it cannot be renamed
        (EBUSY), so an old output in it cannot be set aside for `--force`, refused here before
        any work; nor can a finished hidden folder take its place, so an atomic output is
        written into it in place, as other outputs are (a failed run removes what it wrote)."""
        if self.has_content and not resume:
            raise ForceRefusal("mount_point").error(self.final, self.what)
        self.atomic = False

    def begin(self) -> Path:
        """Set the old output aside (with `--force`), make the folder and mark it."""
        if self._began:
            return self.path
        self._began = True
        with reporting_write_errors(self.final):
            replaced_permissions = folder_permissions(self.final)
            if self.atomic:
                self.path = sibling(self.final, PARTIAL_SUFFIX)
                self.path.mkdir(parents=True)
                give_folder_permissions(self.path, replaced_permissions)
                # Claimed before the marker is written into it: the marker too is synced with
                # the whole folder before the swap, not on its own.
                self._claim_folder()
                if self._replacing is not None:
                    self._swap_aside = sibling(self.final, REPLACED_SUFFIX)
            else:
                if self.has_content and not self.resume:
                    # Named before the rename: a signal that lands as the rename returns still
                    # finds the old output to put back (`abandon` checks that it moved).
                    self._aside = sibling(self.final, REPLACED_SUFFIX)
                    os.replace(self.final, self._aside)
                else:  # an empty folder there is written into: its permissions are its own
                    replaced_permissions = None
                self.final.mkdir(parents=True, exist_ok=True)
                give_folder_permissions(self.final, replaced_permissions)
            if not (self.path / MARKER).exists():
                replaces = None if self._swap_aside is None else self._swap_aside.name
                try:
                    write_marker(self.path, self.command, replaces=replaces, reports=self.reports)
                except OutputWriteError as error:  # name the output, not the hidden temporary
                    raise write_error(self.final, error.__cause__ or error) from error
            elif self.reports:  # continued in place (--resume): its -o reports are its own too
                list_reports(self.path, self.reports)
            if self._aside is not None:  # a kill leaves the next run to remove what it wrote
                self._journal = open(self.final / WRITTEN_JOURNAL, "ab")  # noqa: SIM115
            self._claim_folder()
        return self.path

    def _claim_folder(self) -> None:
        """Record what the folder being written is (see `check_claimed`)."""
        self._unclaim()
        claim_folder(
            self.path,
            what=self.what,
            command=self.command,
            hint=self.replaced_hint,
            shown=self.final,
            synced_when_kept=self.atomic and self.path != self.final,
            records_written=self.path == self.final,
            journal=self._journal,
        )
        self._claim = CLAIMED[os.path.abspath(self.path)]

    def wrote(self, path: str | os.PathLike) -> None:
        """Record `path` (a file, or a folder wholly the command's own) as written into the
        folder by a writer that does not go through `atomic_write`/`atomic_path`: a failed run
        removes what was recorded, and no other name (see `abandon`)."""
        check_claimed(path, writing=True)

    def _unclaim(self) -> None:
        if self._claim is not None:
            CLAIMED.pop(os.path.abspath(self._claim.path), None)
            self._claim = None

    def _changed(self) -> str | None:
        return None if self._claim is None else self._claim.change()

    def check(self) -> None:
        """The folder begun is still in place (one stat): for writers that do not go through
        `atomic_write`/`atomic_path`, before each write."""
        change = self._changed()
        if change is not None:
            raise self._claim.error(change)

    @contextlib.contextmanager
    def reporting_write_errors(self) -> Iterator[Path]:
        """Write errors inside the block name the output folder, not its hidden temporary."""
        try:
            yield self.path
        except OutputFolderReplacedError:
            raise
        except OSError as error:
            change = self._changed()
            if change is not None:  # a write that failed because the folder went
                raise self._claim.error(change) from error
            if is_write_error(error, self.path):
                raise write_error(self.final, error) from error
            raise
        except OutputWriteError as error:
            change = self._changed()
            if change is not None:
                raise self._claim.error(change) from error
            if self.path == self.final:
                raise
            raise write_error(self.final, error.__cause__ or error) from error
        except RuntimeError as error:
            if is_write_error(error, self.path):
                raise write_error(self.final, error) from error
            raise

    def keep(self) -> None:
        """The new output is worth keeping: the set-aside old one is deleted, and a later
        failure leaves the new one in place."""
        if self._kept or not self._began:
            return
        if self.atomic:
            self.check()  # the hidden folder filled is still there, whole, to be swapped in
            with reporting_write_errors(self.final):
                # On disk before the swap: a power cut after it finds the whole new output,
                # never its names over empty files with the old output deleted.
                sync_file_system(self.path)
                self._swap_in()
                fsync_directory(self.final.parent)
            self.path = self.final
            if self._claim is not None:
                self._claim_folder()
        else:
            self._make_durable()  # before the old output set aside is deleted
            if self._aside is not None:
                discard_tree(self._aside)
                self._aside = None
            self._close_journal(remove=True)  # nothing is left for a next run to clean up
        self._kept = True

    def _close_journal(self, *, remove: bool) -> None:
        if self._journal is not None:
            journal, self._journal = self._journal, None
            if self._claim is not None:  # no more appends; the names written stay recorded
                self._claim = dataclasses.replace(self._claim, journal=None)
                CLAIMED[os.path.abspath(self._claim.path)] = self._claim
            _close_quietly(journal)
            if remove:
                with contextlib.suppress(OSError):
                    os.unlink(self.final / WRITTEN_JOURNAL)

    def _make_durable(self) -> None:
        """What was written into the (non-atomic) folder so far on disk: files written without
        an fsync each (copies, encoded images) are whole after a power cut."""
        if not self.final.is_dir():  # removed or replaced meanwhile: `check` reports that
            return
        with reporting_write_errors(self.final):
            sync_file_system(self.final)
            fsync_directory(self.final.parent)

    def _swap_in(self) -> None:
        """Rename the finished temporary folder to the output's name: over the old output
        judged at the checks (set aside, then deleted), or where nothing or an empty folder
        stood. Anything else there now was made by another process while the command ran: it
        is neither deleted nor merged into (`_refuse_swap`)."""
        if self._replacing is not None and os.path.lexists(self.final):
            # The name the new output's marker records: a kill after the second rename leaves
            # the next run to delete it (`recover_leftovers`).
            old = self._swap_aside or sibling(self.final, REPLACED_SUFFIX)
            ours = False
            try:
                os.replace(self.final, old)
                # Checked once set aside, under a name no one else knows: what is deleted
                # below is the old output, whatever came and went at its name meanwhile.
                ours = lstat_id(old) == self._replacing
                if ours:
                    os.replace(self.path, self.final)
                    # In the block: a signal raised as the delete is entered, before its own
                    # clean-up is in place, left the old output hidden until a next run.
                    discard_tree(old)
            except BaseException:
                # A signal (or an error) between the two renames: the old output goes back,
                # not left hidden with no output in its place.
                if os.path.lexists(old) and not os.path.lexists(self.final):
                    os.replace(old, self.final)
                    remove_tree(self.path)  # the new one goes, as `abandon` drops it
                elif ours and os.path.lexists(old):  # the new output is whole and in place
                    discard_tree(old)
                raise
            if not ours:
                self._refuse_swap(what_is_at(old), put_back=old)
            return
        try:
            # The kernel replaces nothing or an empty folder only: a file, or a folder with
            # something in it (put there while the command ran), fails the rename.
            os.replace(self.path, self.final)
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            self._refuse_swap(what_is_at(self.final))

    def _refuse_swap(self, found: str, *, put_back: Path | None = None) -> None:
        """Something not judged at the checks stands at the output's name: it stays (put back
        from `put_back`, where it was set aside to be checked), and the finished output is
        renamed beside it under a visible name (`NAME.new`), so that neither is lost."""
        if put_back is not None:
            try:
                os.rename(put_back, self.final)
            except OSError:
                found += f" (set aside at {put_back}: move it back)"
        kept = self.path
        for number in range(1, 100):
            name = self.final.with_name(
                self.final.name + (f".new-{number}" if number > 1 else ".new")
            )
            if not os.path.lexists(name):
                with contextlib.suppress(OSError):
                    os.rename(self.path, name)
                    kept = name
                break
        self._unclaim()
        self._began = False  # nothing of this run is left to remove
        self.path = kept
        raise OutputFolderReplacedError(
            f"{self.what} {shown(self.final)} was made or changed by another process while "
            f"{self.command} was writing: {found}; the finished output is at {shown(kept)}",
            f"nothing at {shown(self.final)} was changed: compare the two, keep what you want",
        )

    def abandon(self, error: BaseException | None = None) -> None:
        """The run failed before `keep()`: remove what it wrote and put the old output back.
        Files that someone else put into the folder meanwhile stay, and so does the folder:
        `error` (the failure ending the command) says so."""
        if self._began and not self._kept:
            if self._changed() is not None:
                self._abandon_replaced()
            elif self.atomic:
                # Still the output's own name where the stop came before the hidden folder
                # was named (`begin`): the old output there is not this run's to delete.
                if self.path != self.final:
                    remove_tree(self.path)
            else:
                if self._aside is not None and not os.path.lexists(self._aside):
                    self._aside = None  # stopped before the rename: the old output is in place
                if not self.resume and (self._aside is not None or not self.has_content):
                    self._remove_written(error)
                if self._aside is not None:
                    os.replace(self._aside, self.final)
                    self._aside = None
            self.path = self.final
        self._began = False
        if self._lock is None:  # released before (`finish` after a failed keep): all done
            closed(self._token)

    def _remove_written(self, error: BaseException | None) -> None:
        """Remove the names this run wrote into the folder (it made the folder, or found it
        empty), then the folder if this run made it and nothing else is in it."""
        self._close_journal(remove=False)  # removed below with the rest
        written = written_into(self.final) | {
            os.path.abspath(self.final / name) for name in (MARKER, WRITTEN_JOURNAL)
        }
        others = remove_written(self.final, written)
        if others:
            note = kept_note(self.what, self.final, others)
            if self._aside is not None:  # the earlier output cannot go back over them
                note += f"; the earlier output is at {shown(self._aside)}: move it back"
                self._aside = None
            tell_note(note, error)
        elif not self._existed or self._aside is not None:
            with contextlib.suppress(OSError):
                self.final.rmdir()

    def _abandon_replaced(self) -> None:
        """The folder begun was removed or replaced: what is at its place now is not this
        run's to delete; an old output set aside goes back only to an empty place."""
        aside, self._aside = self._aside, None
        if aside is None or not os.path.lexists(aside):
            return
        if self.atomic or os.path.lexists(self.final):
            log.warning(
                f"an earlier output of {self.final}, set aside by this run, is still at {aside}: "
                "move it back or remove it"
            )
            return
        os.replace(aside, self.final)

    def release(self) -> None:
        if self._journal is not None:
            _close_quietly(self._journal)
            self._journal = None
        self._unclaim()
        CLAIMED.pop(os.path.abspath(self.final), None)  # one made under this lock
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if not (self._began and not self._kept):  # else still to abandon: open until then
            closed(self._token)

    def close_unfinished(self, error: BaseException | None) -> None:
        """Left open by its command (stopped where none of this class's clean-up was in
        place): abandoned unless kept, and released."""
        self.finish(False, error)

    def finish(self, ok: bool, error: BaseException | None = None) -> None:
        """Keep the output (`ok`) or abandon it; `error` is the failure ending the command."""
        try:
            if ok:
                try:
                    if self._kept and self._began and not self.atomic:
                        self._make_durable()  # what was written since `keep()`, before success
                    self.keep()
                except BaseException as failure:  # not made durable (an I/O error): failed
                    self.abandon(failure)
                    raise
            else:
                self.abandon(error)
        finally:
            self.release()

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(exc_type is None, exc)
