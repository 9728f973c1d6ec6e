"""`split`'s options: the sizes (`--ratio`, `--fixed`), the split names and `--group`."""

from __future__ import annotations

import logging
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from torchkit.core.data.sources.discovery import is_folder_name, is_skipped_folder
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.sources.splitting import SPLIT_MANIFEST, SPLIT_NAMES
from torchkit.core.io.errors import UsageError, short_repr
from torchkit.core.io.option_lists import list_items

log = logging.getLogger("torchkit")

SPLIT_MODES = ("copy", "symlink", "hardlink", "move", "manifest")
MANIFEST = SPLIT_MANIFEST
RESERVED_PREFIX = ".torchkit"  # the marker, the journal, temporaries: never a split name
# The report's own columns and keys beside the split names (a class's row in the table and CSV,
# its object in JSON): a split of one of these names would overwrite or repeat them.
REPORT_KEYS = ("class", "name", "total", "repeats")
# `--group stem`: the files of one folder sharing a name before the extension go together.
STEM_GROUP = "stem"


_RATIO_PART = re.compile(r"(?=.{1,32}$)(\d+(\.\d*)?|\.\d+|\d+/\d+)", re.ASCII)


def parse_ratio(text: str | Sequence[float]) -> list[Fraction]:
    """`8:1:1`, `0.7,0.3`, `70:20:10`...: two or three positive parts, as exact fractions of 1.

    Parts that add up to 1 are fractions; otherwise they are proportions, each at least 1 (so a
    mistyped `0.7,0.2` is an error, not a silent 78/22 split).
    """
    hint = "write it like 8:1:1 or 0.7,0.3, in two or three parts"
    raw = (
        [str(p) for p in text]
        if not isinstance(text, str)
        else list_items(text, "--ratio", separators=":,", hint=hint)
    )
    # Plain numbers only, and short ones: Fraction("1e100000000") would compute a number of
    # 100 million digits (the command would hang and run out of memory).
    if any(not _RATIO_PART.fullmatch(p.strip()) for p in raw):
        raise UsageError(f"cannot read --ratio {short_repr(text)}", hint)
    try:
        parts = [Fraction(p.strip()) for p in raw]
    except (ValueError, ZeroDivisionError):
        raise UsageError(f"cannot read --ratio {short_repr(text)}", hint) from None
    if len(parts) not in (2, 3):
        raise UsageError(f"--ratio needs two or three parts, not {len(parts)}", hint)
    if any(p <= 0 for p in parts):
        raise UsageError(f"every part of --ratio must be positive: {short_repr(text)}", hint)
    total = sum(parts)
    if total != 1 and any(p < 1 for p in parts):
        raise UsageError(
            f"--ratio {short_repr(text)} adds up to {float(total):g}, not 1",
            "fractions must add up to 1; or give proportions like 8:1:1",
        )
    return [p / total for p in parts]


def parse_fixed(text: str | Sequence[int]) -> list[int]:
    """`N` or `N,M`: N images per class in the second split (val), M in the third (test)."""
    hint = "e.g. --fixed 10 for 10 per class in val, or --fixed 10,20 for 20 more in test"
    raw = (
        [str(p).strip() for p in text]
        if not isinstance(text, str)
        else list_items(text, "--fixed", hint=hint)
    )
    if len(raw) not in (1, 2) or not all(re.fullmatch(r"[0-9]{1,9}", p.strip()) for p in raw):
        raise UsageError(f"cannot read --fixed {short_repr(text)}", hint)
    counts = [int(p) for p in raw]
    if any(c < 1 for c in counts):
        raise UsageError(f"every count of --fixed must be at least 1: {short_repr(text)}", hint)
    return counts


def check_names(names: Sequence[str], parts: int, sizes: str = "--ratio") -> list[str]:
    """`names` stripped, one per split: `sizes` is the option that made `parts` splits."""
    names = [n.strip() for n in names]
    if len(names) != parts:
        given = f"{len(names)} split name{'' if len(names) == 1 else 's'}"
        raise UsageError(
            f"--names gives {given} for the {parts} splits of {sizes}",
            f"give one name per split, e.g. --names {','.join(SPLIT_NAMES[:parts])}",
        )
    for name in names:
        if not is_folder_name(name):
            raise UsageError(f"{name!r} cannot be a split folder name", "use names like train")
        if name.casefold() == MANIFEST or name.casefold().startswith(RESERVED_PREFIX):
            # casefold: on macOS and Windows `.TorchKit-split.json` is the journal too
            raise UsageError(
                f"{name!r} cannot be a split folder name: torchkit keeps its own files in OUT "
                f"under {MANIFEST} and names starting with {RESERVED_PREFIX}",
                "use names like train",
            )
        if is_skipped_folder(name):  # `.git`: a split no image-folder reader would see
            raise UsageError(
                f"{name!r} cannot be a split folder name: readers skip hidden folders and "
                "__MACOSX, so the split would vanish",
                "use names like train",
            )
    taken = [name for name in names if name in REPORT_KEYS]
    if taken:
        raise UsageError(
            f"{taken[0]!r} cannot be a split name: the report has a {taken[0]!r} of its own "
            "beside the split counts",
            "use names like train, val, test",
        )
    if len({n.casefold() for n in names}) != len(names):
        raise UsageError(f"split names must differ: {', '.join(names)}", "e.g. train,val,test")
    return names


def group_names(samples: Samples, keys: Sequence[str], pattern: str) -> list[str]:
    """The group of each file: the first capture group (or the whole match) of `pattern`
    searched in its file name; a file that does not match is a group of its own.

    `stem` (STEM_GROUP) groups the files of one folder whose names differ only in the extension
    (`cat/001.jpg` with `cat/001.png`, not with `dog/001.jpg`), as split-folders' `group="stem"`
    does: a regex sees only file names, so it would tie every class's `001.jpg` together."""
    if pattern == STEM_GROUP:
        return ["stem\0" + posixpath.splitext(key)[0] for key in keys]
    try:
        regex = re.compile(pattern)
    except re.error as error:
        raise UsageError(
            f"--group {pattern!r} is not a valid regular expression ({error})",
            r"e.g. '^(patient\d+)_' groups files by the text the parentheses capture",
        ) from None
    groups, unmatched = [], 0
    for key in keys:
        found = regex.search(key.rsplit("/", 1)[-1])
        value = None if found is None else found.group(1 if regex.groups else 0)
        if value is None:
            unmatched += 1
            groups.append("file\0" + key)
        else:
            groups.append("group\0" + value)
    if unmatched == len(keys):
        example = keys[0].rsplit("/", 1)[-1]
        raise UsageError(
            f"--group {pattern!r} matches no file name",
            f"it is searched in names such as {example!r}",
        )
    if unmatched:
        log.warning(f"{unmatched} file name(s) do not match --group; each is a group of its own")
    return groups


@dataclass
class SplitOptions:
    fractions: list[Fraction] | None  # --ratio, or None with --fixed
    fixed: list[int] | None
    names: list[str]
    seed: int
    stratify: bool
    group: str | None
    mode: str
    dedup: bool
    oversample: bool
    strict: bool = False  # a CSV row naming a file that is not an image is an error

    @property
    def ratio(self) -> list[float] | None:
        return None if self.fractions is None else [float(f) for f in self.fractions]
