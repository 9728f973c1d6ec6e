"""Whether `--resume` trains and validates on the images the run started with.

A run records in its checkpoint's `data` entry a digest of each split's samples (`digests`):
what names each sample (`Samples.ids`: the path relative to the data root, for a CSV index as
it writes it; `digits/0042`, `FILE/ROW`, `SHARD/KEY.EXT`), as `path_key` spells it (so the data
moved to another machine or mount point, or a CSV's `./a.png` for `a.png`, is the same data),
and its label in the run's class order. No file is read: a million samples take about a third
of a second.

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
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.sources.splitting import sample_keys
from torchkit.core.io.errors import CheckpointError

log = logging.getLogger("torchkit")

DIGESTS = "digests"  # the key of the `data` record that holds them
# Each digest names how it was made: one of another making is not compared.
IN_ORDER = "ids-in-order-v1:"
AS_A_SET = "ids-as-set-v1:"
_CHUNK = 65536  # keys joined at a time: a million images' names are never held twice


def sample_digests(splits: Mapping[str, Samples]) -> dict[str, str]:
    """The digest of each split of `splits` (train in its order, the others as sets); none for
    a split whose samples have no names."""
    digests = {}
    for name, samples in splits.items():
        if len(samples.ids) != len(samples.labels):
            continue
        keys, labels = sample_keys(samples), list(samples.labels)
        if name == "train":
            digests[name] = IN_ORDER + _digest(keys, labels)
        else:
            digests[name] = AS_A_SET + _digest(*_sorted(keys, labels))
    return digests


def _sorted(keys: list[str], labels: list[int]) -> tuple[list[str], list[int]]:
    """`keys` and their `labels` in the keys' order (a key listed twice, by its labels)."""
    if all(map(operator.lt, keys, itertools.islice(keys, 1, None))):  # a sorted listing
        return keys, labels
    order = sorted(range(len(keys)), key=keys.__getitem__)
    ordered = [keys[i] for i in order]
    if any(map(operator.eq, ordered, itertools.islice(ordered, 1, None))):  # a key twice
        order = sorted(range(len(keys)), key=lambda i: (keys[i], labels[i]))
        ordered = [keys[i] for i in order]
    return ordered, [labels[i] for i in order]


def _digest(keys: Sequence[str], labels: Sequence[int]) -> str:
    """SHA-256 of the count, the keys (each ended by NUL, which no path holds) and the labels
    (64-bit little-endian), in this order."""
    hashed = hashlib.sha256(len(keys).to_bytes(8, "little"))
    for start in range(0, len(keys), _CHUNK):
        # surrogatepass: a file name of bytes that are not UTF-8 (`os.fsdecode`'s surrogates)
        hashed.update("\0".join(keys[start : start + _CHUNK]).encode("utf-8", "surrogatepass"))
        hashed.update(b"\0")
    numbers = array.array("q", labels)
    if sys.byteorder == "big":
        numbers.byteswap()
    hashed.update(numbers.tobytes())
    return hashed.hexdigest()


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
