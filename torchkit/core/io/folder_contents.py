"""What in an output folder torchkit did not write: the entries `--force` would delete with the
folder it replaces, so that the command refuses instead (`force.check_replaceable`).

A command says what it writes into its output folder as shell patterns, relative to the folder
and separated by `/` (`best.pt`, `epoch-[0-9][0-9][0-9]*.pt`, `tensorboard/events.out.tfevents.*`,
`train/*/*.png`); a `**` segment stands for any number of folders (`**/*.npy`: at any depth).
A pattern names regular files, and the folders on their way: a name torchkit writes in another
place (`extra/best.pt`), a symbolic link (never followed), a FIFO or a folder no pattern goes
through is not torchkit's. Whatever the command, the temporaries of killed writers (no live
writer holds their flock), the set-asides of replaced outputs (`.NAME.<hex>.replaced`) and what
a file browser leaves in a folder it shows (`.DS_Store`) are torchkit's or no one's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterable
from fnmatch import fnmatchcase
from pathlib import Path, PurePath

from torchkit.core.io.temporaries import TEMPORARY, is_unlocked

# The hidden siblings an output writer makes beside an output it replaces (`output_paths.sibling`):
# a file output inside a folder (`convert tensor FILE FOLDER`) leaves its set-aside there.
_SET_ASIDE = re.compile(r"\..+\.[0-9a-f]{12}\.(?:replaced|partial|discarded)", re.DOTALL)

# What a file browser leaves in each folder it shows (Finder, Explorer): no one's data.
BROWSER_FILES = frozenset({".ds_store", "thumbs.db", "desktop.ini"})


def is_apple_double(name: str) -> bool:
    """`._NAME`: the AppleDouble file macOS writes beside NAME (its extended attributes) on
    other disks, in zips and in tars; never an image, whatever its extension."""
    return name.startswith("._")


def is_browser_file(name: str) -> bool:
    """`.DS_Store`, `Thumbs.db`, `desktop.ini` or an AppleDouble `._NAME`: no one's data,
    whichever folder holds it."""
    return name.casefold() in BROWSER_FILES or is_apple_double(name)


def extension_pattern(extension: str) -> str:
    """A shell pattern for `extension` in any case (`.png`: `.[pP][nN][gG]`), for a command
    that keeps the case a name was given in."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.lower() != c.upper() else c for c in extension)


def exact_pattern(relative: str) -> str:
    """A pattern that names `relative` (a path below the folder, `/`-separated) and nothing
    else: its glob characters bracketed."""
    return re.sub(r"([*?\[])", r"[\1]", relative)


def path_inside(path: str | os.PathLike, folder: str | os.PathLike) -> PurePath | None:
    """`path` relative to `folder` where it lies inside it (both resolved: links, `..`), else
    None (outside it, or the folder itself): the one test of "an -o report inside the output"."""
    inside = PurePath(os.path.relpath(os.path.realpath(path), os.path.realpath(folder)))
    return None if not inside.parts or inside.parts[0] == os.pardir else inside


def names_inside(folder: str | os.PathLike, paths: Iterable[str | os.PathLike | None]) -> list[str]:
    """Exact patterns for those of `paths` that lie inside `folder` (a report written there
    with `-o` by this run, which will replace it anyway)."""
    found = []
    for path in paths:
        if path is None or os.fspath(path) == "-":
            continue
        inside = path_inside(path, folder)
        if inside is not None:
            found.append(exact_pattern(inside.as_posix()))
    return found


class ProvenPattern(str):
    """A pattern of files whose names others use too (another trainer's `best.pt`, another
    tool's `metrics.json`): a file it names is the command's only where `proof(path)` shows
    torchkit wrote it (a checkpoint with torchkit's keys, a record with the command's keys).
    `--force` named a user's own file of such a name torchkit's, and deleted it."""

    proof: Callable[[Path], bool]


def proven(pattern: str, proof: Callable[[Path], bool]) -> ProvenPattern:
    """`pattern`, naming only the files `proof` accepts (`ProvenPattern`)."""
    made = ProvenPattern(pattern)
    made.proof = proof
    return made


class _Patterns:
    """Compiled `/`-separated patterns: which files they name (one regular expression for all,
    matched against the `/`-joined path: a folder of a million files is judged in a second),
    which folders they go through. A `ProvenPattern` names a file only where its proof holds."""

    def __init__(self, patterns: Iterable[str]) -> None:
        patterns = [p for p in patterns if p.strip("/")]
        self.split = [tuple(p.strip("/").split("/")) for p in patterns]
        plain = [p for p in patterns if not isinstance(p, ProvenPattern)]
        either = "|".join(_path_regex(tuple(p.strip("/").split("/"))) for p in plain) or "(?!)"
        self.files = re.compile(f"(?:{either})", re.DOTALL)
        self.proven = [
            (re.compile(_path_regex(tuple(p.strip("/").split("/"))), re.DOTALL), p.proof)
            for p in patterns
            if isinstance(p, ProvenPattern)
        ]

    def names_file(self, parts: tuple[str, ...], path: Path | None = None) -> bool:
        """Whether a pattern names the file `parts` (at `path`, which a proof reads)."""
        joined = "/".join(parts)
        if self.files.fullmatch(joined) is not None:
            return True
        return any(
            pattern.fullmatch(joined) is not None and path is not None and proof(path)
            for pattern, proof in self.proven
        )

    def goes_through(self, parts: tuple[str, ...]) -> bool:
        """Whether some pattern names a file below the folder `parts`."""
        return any(_matches_prefix(pattern, parts) for pattern in self.split)


def names_file(patterns: Collection[str], relative: str, path: Path) -> bool:
    """Whether one of `patterns` names the file `relative` (`/`-separated) at `path`, as
    `foreign_entries` judges it: a `ProvenPattern` only where its proof holds for `path`."""
    return _Patterns(patterns).names_file(tuple(relative.split("/")), path)


def _path_regex(pattern: tuple[str, ...]) -> str:
    """The regular expression of a `/`-separated pattern: each segment as `fnmatchcase` reads
    it, never across a `/`; `**` any number of folders (at the end: anything below)."""
    text = ""
    for index, segment in enumerate(pattern):
        last = index == len(pattern) - 1
        if segment == "**":
            text += ".+" if last else "(?:[^/]+/)*"
        else:
            text += _segment_regex(segment) + ("" if last else "/")
    return text


def _segment_regex(segment: str) -> str:
    """`fnmatch.translate` for one segment, its `*`, `?` and `[...]` kept within the segment."""
    out = []
    i, n = 0, len(segment)
    while i < n:
        char = segment[i]
        i += 1
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = i + (i < n and segment[i] == "!")
            end += end < n and segment[end] == "]"
            end = segment.find("]", end)
            if end < 0:  # no closing bracket: a literal `[`, as fnmatch reads it
                out.append(re.escape(char))
                continue
            inside, i = segment[i:end], end + 1
            negated = inside.startswith("!")
            # fnmatch takes a backslash as itself; `[`, `]`, `&`, `~`, `|`, `^` would be set syntax
            inside = "".join("\\" + c if c in "\\[]&~|^" else c for c in inside[negated:])
            out.append(f"[^/{inside}]" if negated else f"[{inside}]")
        else:
            out.append(re.escape(char))
    return "".join(out)


def _matches_prefix(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """Whether `pattern` can name something below the folder `parts`: its first segments match
    them with at least one segment left over."""
    if not parts:
        return bool(pattern)
    if not pattern:
        return False
    if pattern[0] == "**":
        return True  # any depth of folders, then the rest
    return fnmatchcase(parts[0], pattern[0]) and _matches_prefix(pattern[1:], parts[1:])


def _is_dead_temporary(entry: os.DirEntry) -> bool:
    """A temporary torchkit's writers leave whatever the command, whose writer is dead: one a
    live writer holds is still being written, not ours to delete."""
    return bool(TEMPORARY.fullmatch(entry.name)) and is_unlocked(Path(entry.path))


def foreign_entries(
    folder: Path, owned: Collection[str], *, top_level: Collection[str] = ()
) -> list[str]:
    """The entries of `folder` (paths relative to it, `/`-separated, a folder's ending in `/`)
    that no pattern of `owned` names, in the order found, sorted within each folder: what a
    command whose outputs `owned` describes did not write there. `top_level`: names directly
    in `folder` that are torchkit's whatever the command (its marker, its journal). A folder
    none of `owned` goes through counts as one entry, its content unlisted; an unreadable one
    too (its content cannot be judged)."""
    patterns = _Patterns(owned)
    foreign: list[str] = []
    pending: list[tuple[str, ...]] = [()]
    while pending:
        parts = pending.pop()
        try:
            with os.scandir(folder.joinpath(*parts)) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            foreign.append("/".join(parts) + "/")
            continue
        below = []
        for entry in entries:
            here = (*parts, entry.name)
            shown = "/".join(here)
            if (not parts and entry.name in top_level) or is_browser_file(entry.name):
                continue
            if _SET_ASIDE.fullmatch(entry.name) and not entry.is_symlink():
                continue  # an output replaced inside the folder, set aside: ours
            try:
                if entry.is_dir(follow_symlinks=False):
                    if patterns.goes_through(here):
                        below.append(here)
                    else:
                        foreign.append(shown + "/")
                    continue
                regular = entry.is_file(follow_symlinks=False)
            except OSError:  # gone while listed
                continue
            named = regular and patterns.names_file(here, Path(entry.path))
            if named or (regular and _is_dead_temporary(entry)):
                continue
            foreign.append(shown)  # a link, a FIFO, a socket, or a file of someone else's
        pending.extend(reversed(below))  # depth first, in name order
    return foreign
