"""The marker and --force: the `.torchkit` marker an output folder carries, and what `--force`
may replace (`check_replaceable`): only the same command's output, holding nothing torchkit
did not write there, and no mount.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import BinaryIO, Literal, TypeVar

from torchkit import __version__
from torchkit.core.io.errors import (
    OutputExistsError,
    OutputWriteError,
)
from torchkit.core.io.file_kinds import file_kind
from torchkit.core.io.file_outputs import replaced_whole
from torchkit.core.io.folder_contents import exact_pattern, foreign_entries, names_file
from torchkit.core.io.mounts import MountTable, is_mount_point
from torchkit.core.io.non_utf8_names import json_text
from torchkit.core.io.output_paths import MARKER, WRITTEN_JOURNAL, real_path, shown
from torchkit.core.io.temporaries import (
    TEMPORARY,
    is_unlocked,
    remove_if_unlocked,
)

T = TypeVar("T")


def write_marker(
    folder: Path, command: str, *, replaces: str | None = None, reports: Iterable[str] = ()
) -> None:
    """`replaces`: the name the old output will be set aside under when this (whole, atomic)
    folder takes its place, so that a run killed between the swap and the old output's delete
    leaves a folder the next run knows to be the complete new output. `reports`: the -o files
    (paths relative to the folder, `/`-separated) the run writes inside it (`REPORTS_KEY`)."""
    record: dict[str, object] = {
        "written_by": "torchkit",
        "command": command,
        "torchkit_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if replaces is not None:
        record["replaces"] = replaces
    if reports:
        record[REPORTS_KEY] = [{"path": path} for path in reports]
    # Whole or not at all: written in place, a run killed between the file's creation and its
    # text left an empty marker, which names no command, so that the folder of a run that wrote
    # nothing was refused as "already exists" by the same command. A killed writer's temporary
    # is removed by the next run (`recover_leftovers`); a failed write leaves none.
    with replaced_whole(folder / MARKER, "w", encoding="utf-8", newline="") as handle:
        handle.write(json_text(record) + "\n")


def marker_field(folder: Path, key: str) -> str | None:
    """A text field of the folder's marker, or None: no marker, no such field, or one that
    cannot be read."""
    record = _json_record(folder / MARKER)
    value = record.get(key) if isinstance(record, dict) else None
    return value if isinstance(value, str) else None


def marker_command(folder: Path) -> str | None:
    """The command the folder's marker names (`train`, `split`...), or None: no marker, or one
    that cannot be read."""
    return marker_field(folder, "command")


def remove_marker(folder: Path) -> None:
    """Take back the marker `write_marker` left (a run that wrote nothing else)."""
    (folder / MARKER).unlink(missing_ok=True)


# The marker's list of the -o reports its command wrote inside the folder (`-o OUT/report.json`),
# each {"path": relative path, "bytes": size, "mtime_ns": time, "sha256": digest} once written
# (`note_report`; a copy with new times is known by its content):
# the next `--force` of the command replaces them as its own (`recorded_reports`), also under a
# name its own -o no longer gives. A name the marker lists but whose file differs from what was
# recorded (never written, changed or put there since) is the user's.
REPORTS_KEY = "reports"


def note_report(report: str | os.PathLike) -> None:
    """Record the size and time of the -o file `report`, just written, in the marker of the
    nearest folder above it where that marker lists it (`write_marker`'s `reports`). Nothing
    where none does; a marker that cannot be rewritten leaves the report the user's (the next
    `--force` refuses it): never an error of the run that wrote it."""
    real = Path(os.path.realpath(report))
    folder = next((above for above in real.parents if (above / MARKER).is_file()), None)
    if folder is None:
        return
    marker = folder / MARKER
    record = _json_record(marker)
    entries = record.get(REPORTS_KEY) if isinstance(record, dict) else None
    if not isinstance(record, dict) or not isinstance(entries, list):
        return
    name = real.relative_to(folder).as_posix()
    try:
        info = os.stat(real)
    except OSError:
        return
    listed = [e for e in entries if isinstance(e, dict) and e.get("path") == name]
    if not listed or not stat.S_ISREG(info.st_mode):
        return  # (never read: a report of another folder's below a run folder)
    # Its content's digest too: the output folder copied (new times) still holds its report.
    digest = _content_digest(real, info.st_size)
    for entry in listed:
        entry.update(bytes=info.st_size, mtime_ns=info.st_mtime_ns)
        if digest is not None:
            entry["sha256"] = digest
    _rewrite_marker(marker, record)


def list_reports(folder: Path, reports: Iterable[str]) -> None:
    """Add the -o files `reports` (as `write_marker`'s) to the list of the marker of `folder`
    where it does not name them yet: a run continued in the folder (`--resume`) writes them
    there too, and the next `--force` replaces them as the command's (`note_report` records
    each once written). Nothing where the folder has no marker that can be read."""
    marker = folder / MARKER
    record = _json_record(marker)
    if not isinstance(record, dict):
        return
    entries = record.get(REPORTS_KEY)
    entries = entries if isinstance(entries, list) else []
    named = {entry.get("path") for entry in entries if isinstance(entry, dict)}
    added = [{"path": path} for path in dict.fromkeys(reports) if path not in named]
    if added:
        record[REPORTS_KEY] = [*entries, *added]
        _rewrite_marker(marker, record)


def _rewrite_marker(marker: Path, record: dict) -> None:
    """The marker `marker` rewritten whole with `record`; a failure leaves the old one (what it
    does not record stays the user's: refused, never deleted)."""
    with (
        contextlib.suppress(OutputWriteError, OSError),
        replaced_whole(marker, "w", encoding="utf-8", newline="") as handle,
    ):
        handle.write(json_text(record) + "\n")


# The marker's list of the files a run wrote at its start, before anything worth keeping
# (`noting_started`): {"path": relative path, "bytes": size, "mtime_ns": time, "sha256": digest
# of its content (`_content_digest`; none for a file over `_DIGEST_LIMIT`)}, or for a file
# that grows (a TensorBoard log), recorded before it is made, the pattern its name matches:
# {"path": pattern, "pattern": true} (`note_starting_log`). A folder holding only those is a run
# killed before its first result (`killed_start_leftovers`); a file under such a name that the
# marker does not record as written (a split.csv of yours, put there since) is not.
STARTED_KEY = "started_with"


def noting_started(folder: Path, name: str) -> Callable[[Path], None]:
    """The `check` of the atomic write of the start file `folder/name` (`atomic_write`'s):
    records the finished temporary's size and time under `name` before it is renamed into
    place, which keeps both: a kill at any moment leaves a temporary or the file as recorded.
    Recorded after the writes, a kill between them (a split.csv of a million images: seconds)
    left a config.json the marker did not know, and the same command was refused."""

    def note(temporary: Path) -> None:
        try:
            info = os.lstat(temporary)
        except OSError:
            return
        if stat.S_ISREG(info.st_mode):
            sized: dict[str, object] = {"bytes": info.st_size, "mtime_ns": info.st_mtime_ns}
            # Its content too: a killed start copied (`cp -r`, `rsync` without -t) has new
            # times, and is known by what its files hold (`_as_recorded`).
            digest = _content_digest(temporary, info.st_size)
            if digest is not None:
                sized["sha256"] = digest
            _record_started(folder, {"path": name, **sized})

    return note


def note_starting_log(folder: Path, pattern: str) -> None:
    """Record in the marker of `folder`, before a log's writer makes it (a name it chooses, such
    as TensorBoard's event file), the pattern its path in `folder` matches (`fnmatch`, made
    unique by a suffix the writer is given): a kill at any moment after leaves a log that the
    marker names. Recorded by name once made, a kill before the record left a log that was
    not, and the same command was refused."""
    _record_started(folder, {"path": pattern, "pattern": True})


def _record_started(folder: Path, entry: dict) -> None:
    """`entry` added to (or replacing its path's in) the `STARTED_KEY` list of the marker of
    `folder`. Nothing where the folder has no marker."""
    marker = folder / MARKER
    record = _json_record(marker)
    if not isinstance(record, dict):
        return
    started = _started_entries(record)
    started[entry["path"]] = entry
    record[STARTED_KEY] = list(started.values())
    _rewrite_marker(marker, record)


def _started_entries(record: object) -> dict[str, dict]:
    """The `STARTED_KEY` entries of the marker's `record`, by path."""
    entries = record.get(STARTED_KEY) if isinstance(record, dict) else None
    return {
        entry["path"]: entry
        for entry in (entries if isinstance(entries, list) else ())
        if isinstance(entry, dict) and isinstance(entry.get("path"), str)
    }


def _with_recorded_reports(folder: Path, owned: Collection[str]) -> tuple[str, ...]:
    """`owned` (what a command writes in `folder`) and the -o reports an earlier run of it
    wrote there (`recorded_reports`): what `--force` replaces as the command's own."""
    return (*owned, *recorded_reports(folder))


def recorded_reports(folder: Path) -> list[str]:
    """Exact patterns (`folder_contents`) of the reports the marker of `folder` lists as written
    there whose file is still the one recorded: regular, of the recorded size and time."""
    record = _json_record(folder / MARKER)
    entries = record.get(REPORTS_KEY) if isinstance(record, dict) else None
    found = []
    for entry in entries if isinstance(entries, list) else ():
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not path or PurePath(path).is_absolute():
            continue
        if ".." in PurePath(path).parts:
            continue
        try:
            info = os.lstat(folder / path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and _is_recorded_file(entry, folder / path, info):
            found.append(exact_pattern(path))
    return found


def is_torchkit_folder(folder: Path, known_files: Collection[str] = ()) -> bool:
    """Written by torchkit: it carries the marker, or (for folders written before the marker
    existed) holds only names the command writes (`known_files`, shell-style patterns)."""
    if (folder / MARKER).is_file():
        return True
    if not known_files:
        return False
    from fnmatch import fnmatch

    names = [entry.name for entry in os.scandir(folder)]
    return bool(names) and all(any(fnmatch(n, pattern) for pattern in known_files) for n in names)


def holds_json_record(path: Path, keys: Collection[str]) -> bool:
    """`path` is a JSON object with every one of `keys`: how a command recognises a folder it
    wrote before torchkit marked its outputs, by the record it always wrote there (config.json,
    metrics.json). Names alone are anybody's: another trainer's `best.pt` and `last.pt`, another
    tool's `metrics.json`, photos called `IMG_20240315_142530.png`."""
    record = _json_record(path, _RUN_RECORD_LIMIT)
    return isinstance(record, dict) and all(key in record for key in keys)


_RECORD_LIMIT = 1 << 20  # markers are a few KB


# A run's config.json lists its classes, an eval's metrics.json a record per class and every
# skipped file: 1.4 MB at 30,000 classes, and more. Under a smaller limit such a record read as
# another tool's file, and --force refused the command's own output folder.
_RUN_RECORD_LIMIT = 64 << 20  # read whole: 64 MB is about 0.5 s of json.loads


def _json_record(path: Path, limit: int = _RECORD_LIMIT) -> object:
    """The JSON value in the regular file `path` of at most `limit` bytes, or None: not there,
    not JSON, too large, or not a regular file (`_read_regular`)."""
    return _read_regular(
        path, limit, lambda handle, _: json.loads(handle.read(limit).decode("utf-8"))
    )


def _read_regular(path: Path, limit: int, read: Callable[[BinaryIO, int], T]) -> T | None:
    """`read(handle, size)` of the regular file `path` of at most `limit` bytes, or None: not
    there, not a regular file, larger, or unreadable (`read` raising OSError or ValueError).
    Opened without blocking and read only when regular, so a FIFO or a device planted under a
    record's name cannot hang the check (or feed it without end)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return read(handle, info.st_size)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def is_empty_dir(folder: Path) -> bool:
    with os.scandir(folder) as entries:
        return next(entries, None) is None


def killed_start_leftovers(
    folder: Path, command: str, start_files: Collection[str] = ()
) -> list[Path] | None:
    """What is in `folder` besides the marker when all it holds is what a run of `command`
    killed before its first result left: the marker naming `command`, temporaries no live
    writer holds, and the files `start_files` names (what the command writes before anything
    worth keeping: train's config.json, split.csv and TensorBoard log, see `_is_start_file`)
    that the marker records as the run's (`noting_started`, `note_starting_log`). None when it
    holds anything else (or another command's marker, or none). To that command such a folder
    is as good as empty (with `start_files`: replaced without `--force`)."""
    if not folder.is_dir() or folder.is_symlink():
        return None
    record = _json_record(folder / MARKER)  # (read once: its command, the files it started)
    if not isinstance(record, dict) or record.get("command") != command:
        return None
    started = _started_entries(record) if start_files else {}
    leftovers = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:  # a folder of a million files: judged by its first few
                if entry.name == MARKER:
                    continue
                path = folder / entry.name
                temporary = TEMPORARY.fullmatch(entry.name) and is_unlocked(path)
                if not (temporary or _is_start_file(entry, start_files, started)):
                    return None
                leftovers.append(path)
    except OSError:
        return None
    return leftovers


def _is_start_file(
    entry: os.DirEntry, start_files: Collection[str], started: dict[str, dict]
) -> bool:
    """Whether `entry` is one of `start_files` (fnmatch patterns) that the marker records
    (`started`): a regular file whose name matches one, of the size and time recorded, or a
    folder holding only regular files that `FOLDER/PATTERN` patterns match, each recorded (a
    TensorBoard log's event files, never a user's notes or logs put beside them). A
    `ProvenPattern`'s file passes only where its proof holds too."""
    if entry.is_file(follow_symlinks=False):
        return names_file(start_files, entry.name, Path(entry.path)) and _as_recorded(
            started.get(entry.name), entry
        )
    inside = [p for p in start_files if p.startswith(f"{entry.name}/")]
    if not inside or not entry.is_dir(follow_symlinks=False):
        return False
    with os.scandir(entry.path) as files:
        return all(
            file.is_file(follow_symlinks=False)
            and names_file(inside, f"{entry.name}/{file.name}", Path(file.path))
            and _as_recorded(_recorded_entry(started, f"{entry.name}/{file.name}"), file)
            for file in files
        )


def _recorded_entry(started: dict[str, dict], name: str) -> dict | None:
    """The entry of `started` for the file `name`: by its name, or by a pattern it matches
    (`note_starting_log`)."""
    from fnmatch import fnmatchcase

    if name in started:
        return started[name]
    return next(
        (e for p, e in started.items() if e.get("pattern") is True and fnmatchcase(name, p)), None
    )


def _as_recorded(entry: dict | None, file: os.DirEntry) -> bool:
    """The file is the one `noting_started` recorded (`entry`, `_is_recorded_file`)."""
    if entry is None:
        return False
    if "bytes" not in entry and "mtime_ns" not in entry:
        return True  # a log that grows: recorded by its name
    try:
        info = file.stat(follow_symlinks=False)
    except OSError:
        return False
    return _is_recorded_file(entry, Path(file.path), info)


def _is_recorded_file(entry: dict, path: Path, info: os.stat_result) -> bool:
    """The file at `path` (`info`, its lstat) is the one a marker's `entry` records: of that
    size and time, or (its time changed by a copy: `cp -r`, `rsync` without -t) of that size
    and content where the entry records the content's digest."""
    if info.st_size != entry.get("bytes"):
        return False
    if info.st_mtime_ns == entry.get("mtime_ns"):
        return True  # the fast path: not read
    digest = entry.get("sha256")
    return isinstance(digest, str) and _content_digest(path, info.st_size) == digest


# Start files are small (a config.json, a split.csv: about 60 bytes an image); one larger than
# this is recorded by size and time only, never read whole to be recognised.
_DIGEST_LIMIT = 256 << 20


def _content_digest(path: Path, size: int) -> str | None:
    """The SHA-256 (hex) of the regular file `path` of `size` bytes, or None: larger than
    `_DIGEST_LIMIT`, not a regular file, not of that size, or unreadable (`_read_regular`: a
    FIFO put under a start file's name cannot hang the check)."""
    import hashlib

    def digest(handle: BinaryIO, found: int) -> str | None:
        if found != size:
            return None
        sha256 = hashlib.sha256()
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            sha256.update(chunk)
        return sha256.hexdigest()

    return _read_regular(path, _DIGEST_LIMIT, digest) if size <= _DIGEST_LIMIT else None


def clear_killed_start(folder: Path, command: str) -> bool:
    """Empty `folder` (its lock held) when `killed_start_leftovers` finds only a killed run's
    start in it, so that running the command again is not refused as "already exists" and an
    atomic output can take the folder's place. Whether it was emptied."""
    leftovers = killed_start_leftovers(folder, command)
    if leftovers is None or not all([remove_if_unlocked(path) for path in leftovers]):
        return False
    remove_marker(folder)
    return True


def check_replaceable(
    folder: Path,
    force: bool,
    *,
    what: str,
    known_files: Collection[str] = (),
    hint: str | Callable[[], str] = "",
    command: str | None = None,
    owned: Collection[str] | None = None,
) -> bool:
    """May `folder` be written? Returns whether it has content that `--force` will replace:
    with `command`, only an output of that command (`eval --out RUN --force` never deletes a
    training run whose marker says `train`); with `owned` (the patterns of what the command
    writes there, see `folder_contents`), only a folder holding nothing else. `hint`: that of
    "already exists" (a callable: asked only then), else `force_hint`'s."""
    if not (folder.exists() or folder.is_symlink()):
        return False
    if folder.is_symlink():
        raise ForceRefusal("symlink").error(folder, what)
    if not folder.is_dir():  # a file, or a FIFO, socket or device: said which
        kind = file_kind(os.stat(folder).st_mode)
        raise OutputExistsError(f"{what} is {kind}, not a folder: {folder}", "give a folder name")
    if is_empty_dir(folder):
        return False
    if command is not None and killed_start_leftovers(folder, command) is not None:
        return False  # emptied by `OutputFolder` (`clear_killed_start`), its lock held
    if not force:
        raise OutputExistsError(
            f"{what} already exists: {folder}",
            (hint() if callable(hint) else hint)
            or force_hint(
                folder,
                "pass --force to overwrite it",
                known_files=known_files,
                command=command,
                owned=owned,
            ),
        )
    # (OUT itself a mount point: refused by `OutputFolder`, where it would set the output aside)
    refusal = force_refusal(folder, known_files, command, owned, mount_point=False)
    if refusal is not None:
        raise refusal.error(folder, what)
    return True


RefusalKind = Literal[
    "symlink", "not_torchkit", "other_command", "foreign", "mount_point", "mounts_inside"
]


@dataclass(frozen=True)
class ForceRefusal:
    """A refusal `--force` meets replacing a folder (`force_refusal`): its `kind` and the facts
    it names (`names`: for "other_command" the command whose output the folder holds and the
    one run, for "foreign" the user's entries inside, for "mounts_inside" the mount points).
    The one source of both the refusal's error (`error`) and the hint that warns of it
    before `--force` is suggested (`hint`)."""

    kind: RefusalKind
    names: tuple[str, ...] = ()

    @property
    def by_owner(self) -> bool:
        """Whether the folder is refused for whom its content is from (`_owner_refusal`): not
        torchkit, or another command of it."""
        return self.kind in ("not_torchkit", "other_command")

    def error(self, folder: Path, what: str) -> OutputExistsError:
        """The refusal of `--force` itself (`check_replaceable`, `OutputFolder`)."""
        if self.kind == "symlink":
            return OutputExistsError(
                f"{what} is a symbolic link: {folder}", "give the real folder or a new name"
            )
        if self.kind == "not_torchkit":
            return OutputExistsError(
                f"{what} {folder} is not empty and was not written by torchkit",
                "--force only replaces torchkit's own outputs: choose another folder, or remove "
                "it yourself",
            )
        if self.kind == "other_command":
            other, command = self.names
            return OutputExistsError(
                f"{what} {folder} holds the output of torchkit {other}, not of {command}",
                f"--force only replaces an earlier output of {command}: choose another folder",
            )
        if self.kind == "foreign":
            return _foreign_error(folder, self.names, what=what)
        if self.kind == "mount_point":
            return OutputExistsError(
                f"{what} {shown(folder)} is a mount point, which cannot be renamed to "
                "set the earlier output in it aside",
                f"give a new folder inside it, or empty {shown(folder)} yourself",
            )
        points = self.names
        more = f" and {len(points) - 1} more" if len(points) > 1 else ""
        return OutputExistsError(
            f"{what} {shown(folder)} holds a mount at {points[0]}{more}, whose files "
            "--force would delete with it",
            f"unmount it, or choose another folder than {shown(folder)}",
        )

    def hint(self, folder: Path, subject: str = "it") -> str:
        """What to do instead, said before `--force` is suggested (`force_hint`); `subject`
        names the folder."""
        if self.kind == "symlink":
            return (
                f"{subject} is a symbolic link, which --force does not replace: give the real "
                "folder or a new name"
            )
        if self.kind == "not_torchkit":
            return (
                f"{subject} was not written by torchkit, which --force does not replace: choose "
                "another folder, or empty it yourself"
            )
        if self.kind == "other_command":
            other, command = self.names
            return (
                f"{subject} holds torchkit {other}'s output, which {command} --force does not "
                "replace: choose another folder"
            )
        if self.kind == "foreign":
            return (
                f"{subject} holds {shown(folder / self.names[0])} that torchkit did not write, "
                "so --force is refused too: move it out first, or choose another folder"
            )
        if self.kind == "mount_point":
            return (
                f"{subject} is a mount point, which cannot be renamed to set the earlier output "
                "in it aside: give a new folder inside it, or empty it yourself"
            )
        return (
            f"{subject} holds a mount at {self.names[0]}, whose files --force would "
            "delete with it: unmount it, or choose another folder"
        )


def force_refusal(
    folder: Path,
    known_files: Collection[str] = (),
    command: str | None = None,
    owned: Collection[str] | None = None,
    *,
    mount_point: bool = True,
) -> ForceRefusal | None:
    """The first refusal `check_replaceable(force=True)` would meet on `folder` as it is now
    (with `mount_point`, also `OutputFolder`'s of a mount point, which cannot be set aside),
    or None where --force may replace it. Arguments as `check_replaceable`'s."""
    if folder.is_symlink():
        return ForceRefusal("symlink")
    is_dir = folder.is_dir()
    if is_dir:
        refusal = _owner_refusal(folder, known_files, command)
        if refusal is not None:
            return refusal
    if owned is not None:
        foreign = foreign_entries(
            folder, _with_recorded_reports(folder, owned), top_level=(MARKER, WRITTEN_JOURNAL)
        )
        if foreign:
            return ForceRefusal("foreign", tuple(foreign))
    if not is_dir:
        return None
    if mount_point and is_mount_point(folder):
        return ForceRefusal("mount_point")
    points = _mounts_below(folder)
    return ForceRefusal("mounts_inside", tuple(points)) if points else None


def _owner_refusal(
    folder: Path, known_files: Collection[str], command: str | None
) -> ForceRefusal | None:
    """The refusal of the existing folder `folder` by whom its content is from: not torchkit,
    or (with `command`) another command of it."""
    if not is_torchkit_folder(folder, known_files):
        return ForceRefusal("not_torchkit")
    other = marker_command(folder)
    if command is not None and other is not None and other != command:
        return ForceRefusal("other_command", (other, command))
    return None


def _mounts_below(folder: Path) -> list[str]:
    """The mount points inside `folder` (its real path), sorted: what `--force` would delete
    with it (`force_refusal`)."""
    return sorted(MountTable.read().points_below(os.fspath(real_path(folder))))


def force_hint(
    folder: Path,
    default: str,
    *,
    known_files: Collection[str] = (),
    command: str | None = None,
    owned: Collection[str] | None = None,
    subject: str = "it",
) -> str:
    """The hint of a refusal that would send the user to `--force` (`default`, such as "pass
    --force to start over"): `default` where `check_replaceable(force=True)` would replace the
    folder as it is now, else why --force would be refused too and what to do instead, so
    that no hint leads to a second refusal (`force_refusal`). `subject` names the folder in
    that sentence."""
    refusal = force_refusal(folder, known_files, command, owned)
    return default if refusal is None else refusal.hint(folder, subject)


def refuse_foreign_entries(
    folder: Path,
    owned: Collection[str],
    *,
    what: str,
    within: str | Collection[re.Pattern[str]] | None = None,
    option: str = "--force",
) -> None:
    """`--force` replaces `folder` whole: refused, before any work, where it holds an entry that
    `owned` (what the command writes there) does not name, which would be deleted with it (your
    notes.txt in a run folder, a plot, a folder of analysis, a link). `within`: only the
    entries that `option` deletes count: those below that folder of it (extract-features'
    `--resume`, its `.partial`), or for regular expressions (a collection of them), the
    regular files directly in `folder` whose whole names match one (convert shards finishing
    a run removes stale shards: no link, and no other name, which it keeps)."""
    foreign = foreign_entries(folder, owned, top_level=(MARKER, WRITTEN_JOURNAL))
    if isinstance(within, str):
        foreign = [entry for entry in foreign if entry.startswith(f"{within}/")]
    elif within is not None:
        foreign = [
            entry
            for entry in foreign
            if any(name.fullmatch(entry) for name in within) and _is_regular(folder / entry)
        ]
    if foreign:
        place = folder / within if isinstance(within, str) else folder
        raise _foreign_error(folder, foreign, what=what, option=option, place=place)


def _foreign_error(
    folder: Path,
    foreign: Sequence[str],
    *,
    what: str,
    option: str = "--force",
    place: Path | None = None,
) -> OutputExistsError:
    """The refusal of `option` where `folder` holds the entries `foreign` (relative paths) that
    torchkit did not write (`refuse_foreign_entries`); `place`: where to move them from."""
    more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
    return OutputExistsError(
        f"{what} {shown(folder)} holds {shown(folder / foreign[0])}"
        f"{'/' if foreign[0].endswith('/') else ''}{more} that torchkit did not write, "
        f"which {option} would delete with it",
        f"move them out of {shown(place or folder)}, or delete them yourself",
    )


def _is_regular(path: Path) -> bool:
    """A regular file, not a link to one."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
