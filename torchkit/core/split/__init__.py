"""`split`: a stratified, seeded train/val/test split of an image dataset.

The assignment is decided by names alone: each file (or `--group`) is ranked by a SHA-256 of
(seed, its path relative to ROOT), so the split is the same on every machine and run whatever
order the filesystem lists files in. Counts per class are allocated by largest remainder (19
files at 8:1:1 give 15/2/2), with at least one file of a class in every split when it has enough.

Byte-identical files (the same photo saved twice) always land in the same split, as if they were
one file (`dedup`, on by default; combined with `--group` when both apply): found by size first,
then content hash (`core.hashing.content_groups`), so only files that share a size are read.
`fixed` takes N images per class for val (and M for test) and leaves the rest in train, as
split-folders' `fixed` does; `oversample` balances the train classes by repeating images
(round-robin over each class's files in their seeded order; with `group`, over its groups,
each repeated whole) up to the largest class: extra copies or links under distinct names
(`<stem>-repeat<k><suffix>`), or repeated rows in a manifest, each numbered in split.csv's
`repeat` column (0 for the image itself).

Files are copied, linked or moved into OUT/<split>/<class>/..., or only listed (`manifest`); every
mode writes OUT/split.csv (path, label, split, source; and repeat with `oversample`). `move` is
safe against a crash: the plan is written first, each file is renamed (atomic) or copied,
verified and only then removed, and rerunning the same command finishes an interrupted move
(or, once it is done, says so).

OUT goes through `core.outputs` (never the dataset, inside it or holding it, nor `.`; locked while
it is written; `--force` only over an empty folder or an earlier split). `--force` replaces only
the earlier split (its split folders and split.csv; other files in OUT stay): they are set aside
in OUT/.torchkit-split-replaced and put back if the new split fails or is interrupted, and by the
next run on OUT if it was killed.

Modules: options (the sizes, names and --group), plan (who goes where), files (copy, link, move,
split.csv), output (OUT's journal, the earlier split set aside), report (SplitResult) and run
(`split_dataset`).
"""

from torchkit.core.split.files import LinkTargets, move_file
from torchkit.core.split.options import (
    MANIFEST,
    RESERVED_PREFIX,
    SPLIT_MODES,
    check_names,
    group_names,
    is_folder_name,
    parse_fixed,
    parse_ratio,
)
from torchkit.core.split.output import (
    JOURNAL,
    WHAT,
    check_report_file,
    recover_split_leftovers,
)
from torchkit.core.split.plan import (
    dedup_units,
    fixed_split,
    load_split_input,
    oversample_repeats,
)
from torchkit.core.split.report import SplitResult
from torchkit.core.split.run import split_dataset

__all__ = [
    "JOURNAL",
    "MANIFEST",
    "RESERVED_PREFIX",
    "SPLIT_MODES",
    "WHAT",
    "LinkTargets",
    "SplitResult",
    "check_names",
    "check_report_file",
    "dedup_units",
    "fixed_split",
    "group_names",
    "is_folder_name",
    "load_split_input",
    "move_file",
    "oversample_repeats",
    "parse_fixed",
    "parse_ratio",
    "recover_split_leftovers",
    "split_dataset",
]
