"""Whether `--resume` trains and validates on the images the run started with.

A run records in its checkpoint's `data` entry a digest of each split's samples (`digests`):
what names each sample (`Samples.ids`: the path relative to the data root, for a CSV index as
it writes it; `digits/0042`, `FILE/ROW`, `SHARD/KEY.EXT`), as `path_key` spells it and below
the deepest folder all of the split's names lie in (an index's absolute paths first below the
folder they all lie in), less a folder named for the split that this folder ends in (`_cut`:
a split root's `val/`), and its label in the run's class order. So the data moved to another
machine or mount point, a CSV's `./a.png` for `a.png`, or a split folder's `val/ant/a.png`
listed by an index beside the folder as `data/val/ant/a.png` is the same data (and so is a
split's every image swapped for a file of its name and label in another folder: no file is
read), while the same-named images of the folder's `test/` (`data/test/ant/a.png`, numbered
per split) are not its validation images. A million names spelled as keys already, listed in
order (a folder, shards, parquet files), take about a tenth of a second, a fifth where a
folder is cut off the front of each (an index's `data/` before a split folder's `train/`),
with no second list of them; names respelled one by one, or a set listed out of order
(sorted), take a second or two.

The training digest follows the order the run draws from (another order trains other batches);
the validation and test digests are of the samples as a set, since their metrics do not depend
on the order. On `--resume` (`check_resumed_samples`), with as many images as the checkpoint
recorded: other validation images are refused, as --seed and --val-split are (the metrics so
far and best.pt's choice were measured on the run's own); other training images are a warning,
as another number of them is. The test digest is recorded, never compared: nothing of the run
so far was measured on it. Checkpoints without digests resume as before, without the
comparison; those of digests an earlier version made (v1: names counted from the data root;
v2: below their split's folder, cut off whole; v3: a folder named for the split before the last
kept only where the split is of one class) are compared with the data digested as that
version made them (`_earlier_digest`), not resumed uncompared: the digests recorded then would
be the data's it resumed on, and a run could go on validating on other images. Either records
this version's digests.
"""

from __future__ import annotations

import array
import hashlib
import itertools
import logging
import operator
import os
import sys
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

from torchkit.core.data.sources.parquet import SPLIT_KEYWORDS
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.sources.splitting import is_absolute_key, path_key, shared_folder
from torchkit.core.io.errors import CheckpointError
from torchkit.core.io.shell_words import shell_word

log = logging.getLogger("torchkit")

DIGESTS = "digests"  # the key of the `data` record that holds them
# Each digest names how it was made: one of another making is not compared. v1 counted names
# from the data root (`val/ant/a.png`); v2 below the folder all of a split's names lie in
# (`ant/a.png`, the val/ and test/ images of a split root named alike where numbered alike);
# v3 as v2, but a folder named for the split that it ends in is kept (`val/ant/a.png`), or
# that it ends in but one where the split is of one class (`val/ant/` all its images); v4 as
# v3, the folder before the last kept whatever the classes (an index's flat `val/images/`).
IN_ORDER = "ids-in-order-v4:"
AS_A_SET = "ids-as-set-v4:"
# The earlier makings, which a checkpoint of one is compared by (`_earlier_digest`), never
# recorded anew: each prefix's version, and whether it is of the samples in their order.
EARLIER = {
    "ids-in-order-v1:": (1, True),
    "ids-as-set-v1:": (1, False),
    "ids-in-order-v2:": (2, True),
    "ids-as-set-v2:": (2, False),
    "ids-in-order-v3:": (3, True),
    "ids-as-set-v3:": (3, False),
}
_CHUNK = 65536  # names joined at a time: a million images' names are never held twice


def sample_digests(splits: Mapping[str, Samples], held_out_of: str | None = None) -> dict[str, str]:
    """The digest of each split of `splits` (train in its order, the others as sets); none for
    a split whose samples have no names. `held_out_of`, the data record's: "train" where the
    run held its val split out of a split root's train split, "all" out of unsplit data (an
    image folder, an index without a split column). A folder named for a split is kept of the
    names (`_cut`) only where the data's own layout made that split: neither of images held
    out (they lie in train's folder), nor of unsplit data (an image folder named `val/`, which
    an index beside it names `val/ant/1.png`, its own listing `ant/1.png`)."""
    digests = {}
    for name, samples in splits.items():
        if len(samples.ids) != len(samples.labels):
            continue
        made = IN_ORDER if name == "train" else AS_A_SET
        digests[name] = made + _split_digest(
            samples.ids,
            samples.labels,
            in_order=name == "train",
            split=_kept_split(name, held_out_of),
        )
    return digests


def _kept_split(name: str, held_out_of: str | None) -> str | None:
    """`name`, where the data's layout made split `name` (a folder named for it is kept of its
    names, `_cut`), else None (`sample_digests`' `held_out_of`)."""
    own = held_out_of != "all" and not (held_out_of == "train" and name == "val")
    return name if own else None


def _split_digest(
    ids: Sequence[str],
    labels: Sequence[int],
    *,
    in_order: bool,
    split: str | None,
    version: int = 4,
    first_v3: bool = False,
) -> str:
    """The digest (`_digest`) of the samples named `ids`, in their order or as a set (in their
    keys' order), of split `split` (its folder kept, `_cut`; None: v2's, none kept), as
    `version` (3 or 4) keeps it; `first_v3`: as v3 was first made (`_as_first_made`). A listing
    whose names are their own keys below the folder they all lie in (`_encoded`), in order or
    sorted, as a folder's almost always is, is digested in one pass over its names, no list
    made; others make a list of their keys (`_keys`), sorted for a set."""
    # v3 kept the folder before the last only of a split of one class (its labels say); as
    # first made, never (no labels are of one class).
    rule = (() if first_v3 else labels) if version == 3 else None
    if ids and (in_order or _ascending(ids)):
        # The folder the first and the last name lie in, all of them in a sorted listing (and
        # checked for each name as it is cut off); else the one all lie in, found in a pass.
        tried = shared_folder([ids[0], ids[-1]])
        found = _digest(ids, labels, below=tried, cut=len(_cut(tried, split, rule)))
        if found is None and (folder := shared_folder(ids)) != tried:
            found = _digest(ids, labels, below=folder, cut=len(_cut(folder, split, rule)))
        if found is not None:
            return found
    keys = _keys(ids, split, rule)
    if not in_order:
        keys, labels = _sorted(keys, labels)
    found = _digest(keys, labels, checked=True)
    assert found is not None
    return found


def _cut(folder: str, split: str | None, labels: Sequence[int] | None = None) -> str:
    """The part of `folder` (the one all of a split's names lie in, "" or ended by "/") that
    the digests of split `split` cut off its names: all of it, less its last folder where that
    is named for the split (`val/`, or `valid/`, `validation/`, `dev/`, as parquet folders are
    read: SPLIT_KEYWORDS), so a split root's validation images, named `val/ant/1.png` from the
    root and `data/val/ant/1.png` by an index beside it, are not the same-named ones of its
    `test/` (`ant/1.png`), while a folder named for another split (a class `test/` in `val/`,
    the image folder `train/` a run held images out of) is cut off as any other. A split that
    lies in one folder of its split's folder (a split of one class in its class folder,
    `val/ant/`; an index's flat `val/images/`) keeps the folder named for the split before it
    too (`val/ant/`, `val/images/`, kept whole), as where the split has more; v3 kept it only
    for a split of one class (its `labels`, all alike; None: v4's rule, any). All of it for
    `split` None (v2's, and a split that the data's layout did not make)."""
    if split is None or not folder:
        return folder
    start = folder.rfind("/", 0, -1) + 1
    if SPLIT_KEYWORDS.get(folder[start:-1].lower()) == split:
        return folder[:start]
    before = folder.rfind("/", 0, start - 1) + 1 if start else 0
    if (
        start
        and SPLIT_KEYWORDS.get(folder[before : start - 1].lower()) == split
        # (checked last: a pass)
        and (labels is None or min(labels, default=None) == max(labels, default=-1))
    ):
        return folder[:before]
    return folder


def _ascending(keys: Sequence[str]) -> bool:
    """Whether each of `keys` sorts after the one before (none twice)."""
    return all(map(operator.lt, keys, itertools.islice(keys, 1, None)))


def _digest(
    keys: Sequence[str],
    labels: Sequence[int],
    *,
    checked: bool = False,
    below: str = "",
    cut: int | None = None,
) -> str | None:
    """SHA-256 of the count, the keys (each ended by NUL, which no path holds) and the labels
    (64-bit little-endian), in this order. Unless `checked` (`keys` are keys), `keys` are
    names less the first `cut` characters (all) of the folder `below`, and None where one of
    them does not begin with it or is not its own key below it: keys are made of them then
    (`_keys`)."""
    hashed = hashlib.sha256(len(keys).to_bytes(8, "little"))
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        encoded = _encoded(chunk, checked=checked, below=below, cut=cut)
        if encoded is None:
            return None
        hashed.update(memoryview(encoded)[1:])  # (less the NUL before the first)
    numbers = array.array("q", labels)
    if sys.byteorder == "big":
        numbers.byteswap()
    hashed.update(numbers.tobytes())
    return hashed.hexdigest()


def _encoded(
    names: Sequence[str], *, checked: bool, below: str = "", cut: int | None = None
) -> bytes | None:
    """`names` (less the first `cut` characters, all by default, of the folder `below` every
    one begins with), each between NULs, in UTF-8 (surrogatepass: a file name of bytes that
    are not UTF-8, `os.fsdecode`'s surrogates); unless `checked`, None where one of them does
    not begin with `below` or is not its own key: not in NFC, or a path `path_key` spells
    otherwise (`./a`, `a//b`, `a/./b`, `a/`) or an absolute one (`_keys` takes it relative).
    Checked in C, over all of them at once: a function called per name took as long as the
    rest of the digest. Where nothing is cut (`below` a split's own folder, kept: `_cut`),
    whether they all begin with it is not checked: nothing would be cut below the folder they
    do share either (`below` itself, or none above it)."""
    joined = "\0".join(["", *names, ""])  # a NUL begins and ends every name, and no path holds one
    if not checked and os.sep != "/" and (os.sep in joined or ":" in joined):
        return None
    cut = len(below) if cut is None else cut
    if cut:
        # The NUL keeps it to the front of each name; what is kept of `below` (a split's
        # folder, `_cut`) is put back, one pass in C still.
        less = joined.replace("\0" + below, "\0" + below[cut:])
        if len(less) != len(joined) - cut * len(names):
            return None  # a name that does not begin with it
        joined = less
    if not checked and not joined.isascii() and not unicodedata.is_normalized("NFC", joined):
        return None  # (NUL, a character of its own in NFC, keeps the names apart)
    encoded = joined.encode("utf-8", "surrogatepass")
    if checked:
        return encoded
    # Every name's own key: no `/` or NUL (where one name ends) beside a `/` or a NUL, or on
    # both sides of a `.`. UTF-8 makes no other character of these bytes, so bytes will do.
    import numpy as np

    text = np.frombuffer(encoded, np.uint8)
    ends = (text == ord("/")) | (text == 0)
    respelled = bool((ends[:-1] & ends[1:]).any()) or bool(
        (ends[:-2] & (text[1:-1] == ord(".")) & ends[2:]).any()
    )
    return None if respelled else encoded


def _keys(
    ids: Sequence[str], split: str | None, labels: Sequence[int] | None = None
) -> Sequence[str]:
    """What names each of `ids` (of split `split`) for the digests: its `path_key` below the
    deepest folder all of them lie in (an absolute path, a CSV index's, first below the folder
    all the absolute ones lie in: `_below_their_folder`), less a folder named for the split
    that it ends in (`_cut`), so a split folder's images listed by an index beside it, or an
    index rewritten for the images' new place, name the same images. Each of `ids` less that
    folder, unrespelled, where each is its own key below it already."""
    folder = _cut(shared_folder(ids), split, labels) if ids else ""
    if all(
        _encoded(ids[start : start + _CHUNK], checked=False, below=folder) is not None
        for start in range(0, len(ids), _CHUNK)
    ):
        return [ident[len(folder) :] for ident in ids] if folder else ids
    return _below_their_folder([path_key(ident) for ident in ids], split, labels)


def _below_their_folder(
    keys: list[str], split: str | None, labels: Sequence[int] | None = None
) -> list[str]:
    """`keys`, the absolute ones relative to the deepest folder they all lie in, then all of
    them relative to the deepest folder they all lie in (each less a folder named for `split`
    that it ends in, `_cut`), in place."""
    _absolute_below_their_folder(keys, split, labels)
    cut = len(_cut(shared_folder(keys), split, labels)) if keys else 0
    if cut:
        keys[:] = [key[cut:] for key in keys]
    return keys


def _absolute_below_their_folder(
    keys: list[str], split: str | None = None, labels: Sequence[int] | None = None
) -> list[str]:
    """`keys`, the absolute ones relative to the deepest folder they all lie in (less a folder
    named for `split` that it ends in, `_cut`), in place."""
    absolute = [at for at, key in enumerate(keys) if is_absolute_key(key)]
    if absolute:
        cut = len(_cut(shared_folder([keys[at] for at in absolute]), split, labels))
        for at in absolute:
            keys[at] = keys[at][cut:]
    return keys


def _earlier_digest(made: str, samples: Samples, split: str | None = None) -> str | None:
    """The digest of `samples` as an earlier version made it, where `made` (a recorded
    digest's prefix) names one (EARLIER): `-v3`, as this version's, of split `split` (its
    folder kept: `_kept_split`), but the folder named for it before the last kept only for a
    split of one class; `-v2`, names below the folder all of the split's lie
    in, that folder cut off whole (a split root's `val/` too); `-v1`, names counted from the
    data root (each one's `path_key`, an index's absolute paths from the folder all of those
    lie in), not below their split's folder. None for any other making. As v1 made it: a
    listing of names that are their own keys, in order or sorted, as they are (those of an
    index's absolute paths all below their folder), else their keys one by one."""
    if made not in EARLIER:
        return None
    version, in_order = EARLIER[made]
    ids, labels = samples.ids, samples.labels
    if version == 3:
        return made + _split_digest(ids, labels, in_order=in_order, split=split, version=3)
    if version == 2:
        return made + _split_digest(ids, labels, in_order=in_order, split=None)
    folder = ""  # where all are absolute ("/..."), the one they lie in
    if ids and ids[0][:1] == "/" and (shared := shared_folder(ids))[:1] == "/":
        folder = shared
    if in_order or _ascending(ids):
        found = _digest(ids, labels, below=folder)
        if found is not None:
            return made + found
    keys: Sequence[str] = [ident[len(folder) :] for ident in ids]
    if not all(
        _encoded(ids[start : start + _CHUNK], checked=False, below=folder) is not None
        for start in range(0, len(ids), _CHUNK)
    ):
        keys = _absolute_below_their_folder([path_key(ident) for ident in ids])
    if not in_order:
        keys, labels = _sorted(keys, labels)
    found = _digest(keys, labels, checked=True)
    assert found is not None
    return made + found


def _sorted(keys: Sequence[str], labels: Sequence[int]) -> tuple[Sequence[str], Sequence[int]]:
    """`keys` and their `labels` in the keys' order (a key listed twice, by its labels)."""
    if _ascending(keys):  # a sorted listing
        return keys, labels
    order = sorted(range(len(keys)), key=keys.__getitem__)
    ordered = [keys[i] for i in order]
    if any(map(operator.eq, ordered, itertools.islice(ordered, 1, None))):  # a key twice
        order = sorted(range(len(keys)), key=lambda i: (keys[i], labels[i]))
        ordered = [keys[i] for i in order]
    return ordered, [labels[i] for i in order]


# Two makings changed after a version was first recorded, under the same prefixes: v1's first
# (torchkit's commit 308accd9) spelled an index's absolute paths whole, not from the folder they
# lie in; v3's first (commits 32a1d1f2 to f75a73bd) kept the folder named for a split only where
# it is the last that all of the split's names lie in, whatever the layout (held-out validation
# images, unsplit data), never the one before it. A checkpoint of them was refused its own
# data ("not those the run was validated on") where the later making differs.
def _as_first_made(made: str, name: str, samples: Samples) -> str | None:
    """The digest of split `name`'s `samples` as version `made` (a recorded prefix of EARLIER)
    was first made, where that differs from its later making; None for any other."""
    version, in_order = EARLIER.get(made, (None, False))
    if version == 1:
        keys: Sequence[str] = [path_key(ident) for ident in samples.ids]
        labels: Sequence[int] = samples.labels
        if not in_order:
            keys, labels = _sorted(keys, labels)
        found = _digest(keys, labels, checked=True)
        assert found is not None
        return made + found
    if version == 3:
        return made + _split_digest(
            samples.ids,
            samples.labels,
            in_order=in_order,
            split=name,
            version=3,
            first_v3=True,
        )
    return None


def check_resumed_samples(
    recorded: Mapping | None,
    digests: Mapping[str, str],
    sizes: Mapping[str, int],
    run: Path,
    splits: Mapping[str, Samples] | None = None,
    held_out_of: str | None = None,
) -> None:
    """Compare this run's `digests` (of splits of `sizes` images) with the resumed checkpoint's
    `recorded` data entry: another number of validation images is a warning (another number
    of training images is `setup._train_size_changed`'s); for each of train and val with as
    many images as recorded, other validation images are refused, other training images a
    warning. A recorded digest an earlier version made is compared with `splits` digested as
    it made them (`_earlier_digest`), not left uncompared: the digests recorded then would be
    the data's the run resumed on, other validation images held as the run's own from then on.
    `run`: the resumed checkpoint, whose folder's split.csv lists the run's images;
    `held_out_of`: `sample_digests`'."""
    saved = (recorded or {}).get(DIGESTS) or {}
    saved_sizes = (recorded or {}).get("sizes") or {}
    listed = run.parent / "split.csv"
    where = f", which {listed} lists," if listed.is_file() else ""
    _val_size_changed(saved_sizes.get("val"), sizes.get("val"), where)
    ours = dict(digests)
    for name in ("val", "train"):
        made = str(saved.get(name)).split(":", 1)[0] + ":"
        if (
            splits is not None
            and name in ours
            and name in splits
            and saved_sizes.get(name) == sizes.get(name)
            and not _comparable(saved.get(name), ours[name])
        ):
            earlier = _earlier_digest(made, splits[name], _kept_split(name, held_out_of))
            if earlier is not None and earlier != saved.get(name):  # or as first made?
                first = _as_first_made(made, name, splits[name])
                earlier = first if first == saved.get(name) else earlier
            ours[name] = earlier or ours[name]
    changed = [
        name
        for name in ("val", "train")
        if _comparable(saved.get(name), ours.get(name))
        and saved_sizes.get(name) == sizes.get(name)
        and saved[name] != ours[name]
    ]
    if "val" in changed:
        raise CheckpointError(
            f"the data's {sizes['val']} validation images are not those the run was validated "
            "on (other files or other labels: the data split again, or its index edited), and "
            "its metrics so far and best.pt's choice were measured on those",
            f"resume with the data the run started with{where} or start a new run from its "
            f"weights with --weights {shell_word(run)}",
        )
    if "train" in changed:
        log.warning(
            "the data's %d training images are not those the run started with (other files, "
            "other labels or another order): the run continues, but not as it would have (its "
            "batches hold other images); resume with the data the run started with%s to "
            "continue it exactly",
            sizes["train"],
            where,
        )


def _val_size_changed(saved: object, images: int | None, where: str) -> None:
    """Another number of validation images than the checkpoint's (images added to the data's
    val/, or other data of the run's classes), said once in a warning: the run goes on."""
    if not isinstance(saved, int) or images is None or saved == images:
        return
    log.warning(
        "the checkpoint was validated on %d images, the data has %d: the run continues, but "
        "its validation metrics from here on are of other images than those so far, and "
        "best.pt is picked among both; resume with the data the run started with%s to compare "
        "like with like",
        saved,
        images,
        where,
    )


def _comparable(saved: object, ours: str | None) -> bool:
    """Whether a recorded digest and ours were made the same way (and both exist)."""
    if not isinstance(saved, str) or ours is None:
        return False
    made = ours.split(":", 1)[0]
    return saved.split(":", 1)[0] == made
