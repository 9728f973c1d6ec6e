"""Whether `--resume` trains and validates on the images the run started with.

A run records in its checkpoint's `data` entry a digest of each split's samples (`digests`):
what names each sample (`Samples.ids`: the path relative to the data root, for a CSV index as
it writes it; `digits/0042`, `FILE/ROW`, `SHARD/KEY.EXT`), as `path_key` spells it (so the data
moved to another machine or mount point, or a CSV's `./a.png` for `a.png`, is the same data;
an index's absolute paths count from the folder they all lie in), and its label in the run's
class order. No file is read: a million names spelled as keys already, listed in order (a
folder, shards, parquet files), take about a tenth of a second, with no second list of them;
names respelled one by one, or a set listed out of order (sorted), take a second or two.

The training digest follows the order the run draws from (another order trains other batches);
the validation and test digests are of the samples as a set, since their metrics do not depend
on the order. On `--resume` (`check_resumed_samples`), with as many images as the checkpoint
recorded: other validation images are refused, as --seed and --val-split are (the metrics so
far and best.pt's choice were measured on the run's own); other training images are a warning,
as another number of them is. Checkpoints without digests resume as before.
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

from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.sources.splitting import is_absolute_key, path_key, shared_folder
from torchkit.core.io.errors import CheckpointError

log = logging.getLogger("torchkit")

DIGESTS = "digests"  # the key of the `data` record that holds them
# Each digest names how it was made: one of another making is not compared.
IN_ORDER = "ids-in-order-v1:"
AS_A_SET = "ids-as-set-v1:"
_CHUNK = 65536  # names joined at a time: a million images' names are never held twice


def sample_digests(splits: Mapping[str, Samples]) -> dict[str, str]:
    """The digest of each split of `splits` (train in its order, the others as sets); none for
    a split whose samples have no names."""
    digests = {}
    for name, samples in splits.items():
        if len(samples.ids) != len(samples.labels):
            continue
        if name == "train":
            digests[name] = IN_ORDER + _split_digest(samples.ids, samples.labels, in_order=True)
        else:
            digests[name] = AS_A_SET + _split_digest(samples.ids, samples.labels, in_order=False)
    return digests


def _split_digest(ids: Sequence[str], labels: Sequence[int], *, in_order: bool) -> str:
    """The digest (`_digest`) of the samples named `ids`, in their order or as a set (in their
    keys' order). A listing whose names are their own keys (`_encoded`), in order or sorted, as
    a folder's almost always is, is digested in one pass over its names, no list made (an
    index's absolute paths, below their folder); others make a list of their keys (`_keys`),
    sorted for a set."""
    folder = _absolute_folder(ids)
    if in_order or _ascending(ids):
        found = _digest(ids, labels, below=folder)
        if found is not None:
            return found
    keys = _keys(ids, folder)
    if not in_order:
        keys, labels = _sorted(keys, labels)
    found = _digest(keys, labels, checked=True)
    assert found is not None
    return found


def _absolute_folder(ids: Sequence[str]) -> str:
    """Where every one of `ids` is an absolute path (a CSV index's), the deepest folder they
    all lie in, ended by "/"; "" otherwise."""
    if not ids or ids[0][:1] != "/":
        return ""
    folder = shared_folder(ids)
    # "/..." only where the least and the greatest name are absolute, and so all between them
    return folder if folder[:1] == "/" else ""


def _ascending(keys: Sequence[str]) -> bool:
    """Whether each of `keys` sorts after the one before (none twice)."""
    return all(map(operator.lt, keys, itertools.islice(keys, 1, None)))


def _digest(
    keys: Sequence[str], labels: Sequence[int], *, checked: bool = False, below: str = ""
) -> str | None:
    """SHA-256 of the count, the keys (each ended by NUL, which no path holds) and the labels
    (64-bit little-endian), in this order. Unless `checked` (`keys` are keys), `keys` are
    names (less the folder `below` they all begin with), and None where one of them is not
    its own key: keys are made of them then (`_keys`)."""
    hashed = hashlib.sha256(len(keys).to_bytes(8, "little"))
    for start in range(0, len(keys), _CHUNK):
        encoded = _encoded(keys[start : start + _CHUNK], checked=checked, below=below)
        if encoded is None:
            return None
        hashed.update(encoded)
    numbers = array.array("q", labels)
    if sys.byteorder == "big":
        numbers.byteswap()
    hashed.update(numbers.tobytes())
    return hashed.hexdigest()


def _encoded(names: Sequence[str], *, checked: bool, below: str = "") -> bytes | None:
    """`names` (less the folder `below` every one begins with) each ended by NUL, in UTF-8
    (surrogatepass: a file name of bytes that are not UTF-8, `os.fsdecode`'s surrogates);
    unless `checked`, None where one of them is not its own key: not in NFC, or a path
    `path_key` spells otherwise (`./a`, `a//b`, `a/./b`, `a/`) or an absolute one (`_keys`
    takes it relative). Checked in C, over all of them at once: a function called per name
    took as long as the rest of the digest."""
    joined = "\0".join(names)
    if below:  # each name begins with it, and a NUL only ends one
        joined = joined[len(below) :].replace("\0" + below, "\0")
    if not checked:
        if os.sep != "/" and (os.sep in joined or ":" in joined):
            return None
        if not joined.isascii() and not unicodedata.is_normalized("NFC", joined):
            return None  # (NUL, a character of its own in NFC, keeps the names apart)
    encoded = joined.encode("utf-8", "surrogatepass") + b"\0"
    if checked:
        return encoded
    # Every name's own key: no `/` or NUL (where one name ends) beside a `/` or a NUL, or on
    # both sides of a `.`. UTF-8 makes no other character of these bytes, so bytes will do.
    import numpy as np

    text = np.frombuffer(encoded, np.uint8)
    ends = (text == ord("/")) | (text == 0)
    respelled = (
        encoded[:1] == b"/"
        or encoded[:2] == b"./"
        or bool((ends[:-1] & ends[1:]).any())
        or bool((ends[:-2] & (text[1:-1] == ord(".")) & ends[2:]).any())
    )
    return None if respelled else encoded


def _keys(ids: Sequence[str], folder: str = "") -> Sequence[str]:
    """What names each of `ids` for the digests: its `path_key`, and an absolute path (a CSV
    index's) relative to the deepest folder all of the split's lie in (`folder`, where all of
    them are absolute; `_below_their_folder`), so an index rewritten for the images' new place
    names the same images. `ids` itself where each is its own key already."""
    if all(
        _encoded(ids[start : start + _CHUNK], checked=False, below=folder) is not None
        for start in range(0, len(ids), _CHUNK)
    ):
        return [ident[len(folder) :] for ident in ids] if folder else ids
    return _below_their_folder([path_key(ident) for ident in ids])


def _below_their_folder(keys: list[str]) -> list[str]:
    """`keys`, the absolute ones relative to the deepest folder they all lie in, in place."""
    absolute = [at for at, key in enumerate(keys) if is_absolute_key(key)]
    if not absolute:
        return keys
    cut = len(shared_folder([keys[at] for at in absolute]))
    for at in absolute:
        keys[at] = keys[at][cut:]
    return keys


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


def check_resumed_samples(
    recorded: Mapping | None, digests: Mapping[str, str], sizes: Mapping[str, int], run: Path
) -> None:
    """Compare this run's `digests` (of splits of `sizes` images) with the resumed checkpoint's
    `recorded` data entry: another number of validation images is a warning (another number
    of training images is `setup._train_size_changed`'s); for each of train and val with as
    many images as recorded, other validation images are refused, other training images a
    warning. `run`: the resumed checkpoint, whose folder's split.csv lists the run's images."""
    saved = (recorded or {}).get(DIGESTS) or {}
    saved_sizes = (recorded or {}).get("sizes") or {}
    listed = run.parent / "split.csv"
    where = f", which {listed} lists," if listed.is_file() else ""
    _val_size_changed(saved_sizes.get("val"), sizes.get("val"), where)
    changed = [
        name
        for name in ("val", "train")
        if _comparable(saved.get(name), digests.get(name))
        and saved_sizes.get(name) == sizes.get(name)
        and saved[name] != digests[name]
    ]
    if "val" in changed:
        raise CheckpointError(
            f"the data's {sizes['val']} validation images are not those the run was validated "
            "on (other files or other labels: the data split again, or its index edited), and "
            "its metrics so far and best.pt's choice were measured on those",
            f"resume with the data the run started with{where} or start a new run from its "
            f"weights with --weights {run}",
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
