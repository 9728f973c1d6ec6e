"""Outputs against inputs: an output may not be, contain or lie inside an input of the same
command (`check_overlap`, bind mounts included), `/`, `~` and the working directory and its
parents are never an output folder, two outputs of one command are never one file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath

from torchkit.core.io.errors import TorchkitError
from torchkit.core.io.folder_contents import path_inside
from torchkit.core.io.mounts import MountTable
from torchkit.core.io.output_paths import FileId, is_within, real_path, shown
from torchkit.core.io.special_files import is_special_file


class OutputOverlapError(TorchkitError):
    """An output that is, contains or lies inside an input of the same command."""


@dataclass(frozen=True)
class InputPath:
    """Something a command reads: a file, or a folder whose whole tree it reads."""

    path: Path
    what: str

    @classmethod
    def of(cls, path: str | os.PathLike, what: str) -> InputPath:
        return cls(Path(path), what)


class _Resolver:
    """Real paths of the inputs of one overlap check, and whether each is named through the
    output folder (`--data OUT/link`, a link inside OUT to data elsewhere: gone from its name
    once OUT is replaced). Each path is walked a name at a time from `/`, as realpath walks it,
    and each folder's result is kept (`walked`): a million input folders `ID/` below one data
    folder cost an lstat each, not a dozen (realpath's). The output folder is recognised
    however either path spells it: `//OUT`, `.` segments, a link to a folder on the way."""

    def __init__(self, output: Path | None) -> None:
        self.output = output  # the real output folder where it exists (else nothing is through)
        self.cwd: str | None = None  # at a relative path: absolute ones pass a deleted cwd
        # each folder's (real path, named through OUT, a link inside OUT followed on the way)
        self.walked: dict[str, tuple[str, bool, bool]] = {"": ("/", False, False)}

    def resolve(self, path: str | os.PathLike) -> tuple[Path, bool]:
        """`real_path(path)`, and whether `path` goes through the output folder on its way. A `..`
        after a link inside OUT is taken from the link's target (as the kernel takes it), but
        the name still hangs on the link (`OUT/link/..`): through OUT, wherever it leads."""
        text = os.fspath(path)
        if os.name != "posix":  # names compare without case there: realpath's and Path's rules
            named = Path(os.path.abspath(text))
            return real_path(text), self.output is not None and is_within(named, self.output)
        if not text.startswith("/") and self.cwd is None:
            self.cwd = os.getcwd()
        absolute = text if text.startswith("/") else f"{self.cwd}/{text}"
        # `//` and `/./` are `/` (POSIX leaves a leading `//` to the system; Linux: `/`)
        names = [name for name in absolute.split("/") if name not in ("", ".")]
        known = len(names)
        while "/".join(names[:known]) not in self.walked:
            known -= 1
        real, through, linked = self.walked["/".join(names[:known])]
        for index in range(known, len(names)):
            name = names[index]
            if name == "..":
                real = os.path.dirname(real)
                # `OUT/sub/..` leaves OUT by name; `OUT/link/..` never does (`linked`)
                through = linked or (self.output is not None and is_within(Path(real), self.output))
            else:
                candidate = os.path.join(real, name)
                # the name itself inside OUT, before a link is followed: the link goes with OUT
                through = through or (
                    self.output is not None and is_within(Path(candidate), self.output)
                )
                if os.path.islink(candidate):
                    linked = linked or through
                    real = os.path.realpath(candidate)
                else:
                    real = candidate
            if index < len(names) - 1:  # the folders on the way, not each input (a million)
                self.walked["/".join(names[: index + 1])] = (real, through, linked)
        return Path(real), through


def _file_ids(
    path: Path, known: dict[Path, FileId | None], chains: dict[Path, list[FileId]]
) -> list[FileId]:
    """The identities of `path` and the existing folders above it, nearest first (`known`
    caches each place's identity, `chains` the list of each folder above an input, across the
    inputs of one check: a folder's list is its own identity and its parent's list, so inputs
    that share folders stat and walk each folder once). Walked in a loop, not by recursion: a
    folder a thousand deep (2,000 characters of `d/d/...`) is a path like any other."""
    places = []  # `path` and the folders above it up to the nearest with a list already
    place = path
    while place not in chains:
        places.append(place)
        parent = place.parent
        if parent == place:  # the root: nothing above it
            chain: list[FileId] = []
            break
        place = parent
    else:
        chain = chains[place]
    for place in reversed(places):
        if place not in known:
            try:
                info = os.stat(place)
                known[place] = (info.st_dev, info.st_ino)
            except (OSError, ValueError):
                known[place] = None
        identity = known[place]
        chain = chain if identity is None else [identity, *chain]
        if place is not path:  # a folder above inputs (an input's own list is asked for once)
            chains[place] = chain
    return chain


def check_overlap(output: str | os.PathLike, what: str, inputs: Iterable[InputPath | None]) -> None:
    """Refuse an output that is an input, contains one (so replacing it would delete the input)
    or lies inside an input folder (so writing it would change the input). Paths are compared
    resolved, and by identity where they exist: a second path to the same folder (a bind
    mount, another case of the name on a case-insensitive disk) is the same folder. A bind
    mount that shows the output, or a folder of its tree, at another path (OUT mounted inside
    an input, an input's folder mounted inside OUT) is checked at that path too."""
    out = real_path(output)
    known: dict[Path, FileId | None] = {}
    chains: dict[Path, list[FileId]] = {}
    out_chain = _file_ids(out, known, chains)
    out_id = known[out]
    out_is_dir = out_id is not None and os.path.isdir(out)
    # An input named through the output folder (`--data OUT/link`, the link to a folder
    # elsewhere) is gone from its name once OUT is replaced, however it resolves.
    resolver = _Resolver(out if out_is_dir else None)
    places: list[MountedPlace] | None = None
    for item in inputs:
        if item is None:
            continue
        source, named_through_out = resolver.resolve(item.path)
        source_chain = _file_ids(source, known, chains)
        source_id = known[source]
        if out == source or (out_id is not None and out_id == source_id):
            raise OutputOverlapError(
                f"{what} {shown(output)} is the {item.what} {shown(item.path)}",
                "choose another output",
            )
        if is_within(source, out) or (out_is_dir and out_id in source_chain) or named_through_out:
            raise OutputOverlapError(
                f"{what} {shown(output)} contains the {item.what} {shown(item.path)}",
                "choose an output outside the inputs",
            )
        inside = is_within(out, source) or (source_id is not None and source_id in out_chain)
        if inside and os.path.isdir(source):
            raise OutputOverlapError(
                f"{what} {shown(output)} lies inside the {item.what} {shown(item.path)}",
                "choose an output outside the inputs",
            )
        if places is None:  # read once, at the first input: most checks have none
            places = _mounted_places(out, out_is_dir)
        if places:
            _check_mounted_overlap(output, out, what, item, source, places)


# A place where a bind mount shows the output's folder, or a folder inside its tree: (the folder
# of the output's tree it shows, whether it is the output whole, the place).
MountedPlace = tuple[str, bool, Path]


def _mounted_places(out: Path, out_is_dir: bool) -> list[MountedPlace]:
    """Where bind mounts show the output `out` (or a part of it) at another path: the output
    itself (`OUT` mounted inside an input), or a mount inside the output folder (an input's
    folder mounted inside OUT, which replacing OUT would empty)."""
    table = MountTable.read()
    pieces = [str(out), *(table.points_below(str(out)) if out_is_dir else ())]
    found = []
    for piece in pieces:
        whole, parts = table.places(piece)
        found += [(piece, piece == str(out), Path(place)) for place in whole]  # OUT whole
        found += [(piece, False, Path(place)) for place in parts]
    return found


def _check_mounted_overlap(
    output: str | os.PathLike,
    out: Path,
    what: str,
    item: InputPath,
    source: Path,
    places: list[MountedPlace],
) -> None:
    """`check_overlap` for the other paths of the output's tree (`_mounted_places`), `out` the
    output's real path, `source` the input's (each worked out once a check, not once an input
    and place: a million inputs)."""
    for piece, is_whole, place in places:
        if is_within(source, place):
            relation = "contains"
        elif is_within(place, source) and os.path.isdir(source):
            # OUT there whole, a folder of OUT there, or a folder of the input mounted in OUT
            relation = (
                "lies inside"
                if is_whole
                else "lies partly inside"
                if piece == str(out)
                else "contains a folder of"
            )
        else:
            continue
        if is_whole:
            how = f"it is mounted at {place} too"
        elif piece == str(out):
            how = f"a folder in it is mounted at {place}"
        else:
            how = f"{piece} in it is a mount of {place}"
        raise OutputOverlapError(
            f"{what} {shown(output)} {relation} the {item.what} {shown(item.path)} ({how})",
            "choose an output outside the inputs, or unmount what joins them",
        )


def folders_of_files(paths: Iterable[str | os.PathLike], what: str) -> list[InputPath]:
    """The distinct folders that hold `paths` (e.g. the images a CSV index names), as inputs: an
    output folder may not contain them nor lie inside one."""
    texts = [os.fspath(p) for p in paths]
    # A file's folder is abspath(dirname(p)): made absolute once per folder, not per file (a
    # million CSV rows in a hundred folders). A path ending in `/`, `.` or `..` names no file
    # in a folder: its own abspath says where it is.
    ends = tuple(sep + name for sep in (os.sep, os.altsep) if sep for name in ("", ".", ".."))
    odd = {t for t in texts if t.endswith(ends) or t in ("", ".", "..")}
    heads = {os.path.dirname(t) for t in texts if t not in odd}
    folders = {os.path.abspath(head) for head in heads}
    folders |= {os.path.dirname(os.path.abspath(t)) for t in odd}
    return [InputPath(Path(folder), what) for folder in sorted(folders)]


def _protected_reason(real: Path) -> str | None:
    cwd = real_path(os.getcwd())
    if real == cwd:
        return "the working directory"
    if real in cwd.parents:
        return "a parent of the working directory"
    if real == real_path(Path.home()):
        return "the home folder"
    return None


def check_not_protected(folder: str | os.PathLike, what: str) -> None:
    """`/`, the home folder, the working directory and its parents are never an output folder."""
    reason = _protected_reason(real_path(folder))
    if reason:
        raise OutputOverlapError(
            f"{what} {shown(folder)} is {reason}",
            "torchkit never writes over it: give a new folder",
        )


def check_distinct_outputs(*outputs: tuple[str | os.PathLike | None, str]) -> None:
    """Two outputs of one command (`-o` and `--plot`, DST and `-o`) may not be one file: one
    would overwrite the other. A device (/dev/null, a terminal) may take several; a FIFO or
    this process's stdout (a pipe) may not: its reader would get one file after the other."""
    seen: dict[object, str] = {}
    for path, what in outputs:
        if path is None or os.fspath(path) == "-":
            continue
        if is_special_file(path):
            try:
                info = os.stat(path)
            except OSError:  # a closed descriptor: refused by check_output_file
                continue
            if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
                continue
            real: object = (info.st_dev, info.st_ino)
        else:
            real = real_path(path)
        if real in seen:
            raise OutputOverlapError(
                f"{what} {shown(path)} is the same file as {seen[real]}",
                "give each output its own file",
            )
        seen[real] = f"{what} {shown(path)}"


def check_not_written_in(
    report: str | os.PathLike,
    folder: str | os.PathLike,
    writes: Callable[[PurePath], bool],
    what: str,
) -> None:
    """A `-o` report inside the output `folder` (fine: `OUT/report.json`) may not be a file the
    command writes there (`writes(path relative to folder)`): with --force the report would
    overwrite it after the work, without it the run would fail only after all the work."""
    if os.fspath(report) == "-" or is_special_file(report):
        return
    inside = path_inside(report, folder)
    if inside is None or not writes(inside):
        return
    raise OutputOverlapError(
        f"report {shown(report)} is a file the command writes in the {what} {shown(folder)}",
        "choose another output file",
    )
