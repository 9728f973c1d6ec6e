"""Datasets and DataLoaders for training, reproducible whatever the workers or processes.

The train order of epoch e is a permutation seeded with (seed + e), split over ranks as
DistributedSampler does; the augmentation of image i in epoch e draws from torch's generator
seeded with (seed, e, i) (in-memory images: from a generator keyed by that seed). So a run
gives the same batches with 0 or 8 workers, persistent or not, with one process or several,
and a resumed run (even mid-epoch) continues exactly.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

from torchkit.core.data.batches import Batch, collate_skipping_unreadable
from torchkit.core.data.dataset import (
    ShardSampler,
    WithholdingSampler,
    make_dataset,
    seed_worker,
    stop_workers,
    worker_options,
)
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.sources import DataSource, open_labelled, split_record, training_splits
from torchkit.core.data.sources.digits import DIGITS
from torchkit.core.data.sources.samples import Samples, shown_class_names
from torchkit.core.data.stored_image import Blocks, read_blocks
from torchkit.core.data.strict_reading import reading_strictly
from torchkit.core.data.transforms import eval_transform, train_transform
from torchkit.core.io.errors import InputError, first_and_more
from torchkit.core.io.redaction import redact_url
from torchkit.core.io.shell_words import shell_word
from torchkit.core.io.wording import counted
from torchkit.core.runtime.seeding import SPLITMIX_INCREMENT, SPLITMIX_MULTIPLIERS, splitmix_output
from torchkit.core.train.config import TrainConfig

log = logging.getLogger("torchkit")

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """A well-spread 63-bit seed from integers (splitmix64 over each part in turn)."""
    return _splitmix_state(parts) >> 1


def _splitmix_state(parts: tuple[int, ...]) -> int:
    first, second = SPLITMIX_MULTIPLIERS
    state = SPLITMIX_INCREMENT
    for part in parts:
        state = (state ^ (part & _MASK64)) & _MASK64
        state = (state + SPLITMIX_INCREMENT) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * first) & _MASK64
        z = ((z ^ (z >> 27)) * second) & _MASK64
        state = z ^ (z >> 31)
    return state


def mix_seeds(base: int, parts: Any) -> Any:
    """`mix_seed(base, part)` for each of `parts` (an integer array), in uint64 arithmetic:
    one array operation per step instead of a Python call per item."""
    import numpy as np

    after_base = _splitmix_state((base,))
    with np.errstate(over="ignore"):  # uint64 arithmetic is meant to wrap
        state = (np.uint64(after_base) ^ np.asarray(parts).astype(np.uint64)) + np.uint64(
            SPLITMIX_INCREMENT
        )
    return splitmix_output(state) >> np.uint64(1)


@dataclass
class TrainData:
    """What a run trains on: the data --data names, the train/val(/test) it uses, the record
    that goes into every checkpoint (`data`) and notes for the user."""

    source: DataSource
    splits: dict[str, Samples]
    record: dict
    notes: list[str]


def load_splits(config: TrainConfig, recorded: dict | None = None) -> TrainData:
    """train/val(/test) of --data (`core.datasource.training_splits`: a resumed run's
    `recorded` split comes back exactly), with clear errors for data that cannot train."""
    # Train and val need every label (`_labelled_splits` refuses them otherwise). --strict
    # also makes a folder that cannot be listed an error, as for every other command.
    with reading_strictly(config.strict, turn_off="pass --no-strict"):
        source, unlabelled = open_labelled(
            config.data,
            refused=lambda data: any(
                part.has_unlabelled for name, part in data.splits.items() if name != "test"
            ),
        )
    splits, notes = training_splits(
        source, val_split=config.val_split, seed=config.seed, recorded=recorded
    )
    if unlabelled is not None:
        splits = _labelled_splits(source, splits, unlabelled, notes)
    train = splits["train"]
    if len(train.classes) < 2:
        raise InputError(
            f"{redact_url(config.data)} has only one class "
            f"({train.classes[0] or 'no class folders'})",
            "a classifier needs at least two class folders",
        )
    counts = train.class_counts()
    # By shown name (`crane (#2)`): two classes of one name are two entries, either may be empty.
    shown = shown_class_names
    empty = [name for name, count in zip(shown(train.classes), counts, strict=True) if not count]
    held_out = "val" not in source.splits  # the val split is --val-split of train's images
    found = _images_of_classes(splits, empty) if empty else {}  # in other splits: train has none
    if empty and source.classes_given:
        empty = _train_classes_named_but_never_seen(source, empty, found)
    if empty:
        val = splits.get("val")
        in_val = dict(zip(shown(val.classes), val.class_counts(), strict=True)) if val else {}
        if held_out:  # train's images held out: a class no split has an image of has none
            _refuse_classes_without_images(source, [n for n in empty if not found[n]])
        raise InputError(
            f"{_classes_that(empty, 'has', 'have')} no training images",
            _empty_class_hint(
                held_out,
                [in_val.get(name, 0) for name in empty],
                source.kind,
                elsewhere=any(found[name] for name in empty),
                many=len(empty) > 1,
            ),
        )
    if len(splits.get("val", [])) == 0 and not config.find_lr:  # the range test never validates
        raise InputError("the validation set is empty", _empty_val_hint(held_out, counts))
    if log.isEnabledFor(logging.WARNING):  # not on the ranks that print nothing
        warn_cross_split_copies(redact_url(config.data), splits)
    return TrainData(source, splits, split_record(source, splits), notes)


# The advice for classes of one image, of which --val-split can hold out none without taking
# its only training image (a larger --val-split empties training, a smaller one validation).
ONE_IMAGE_A_CLASS = (
    "a class of one image cannot be both trained and validated on: add images, or give "
    "validation images of their own, as ROOT/train/ and ROOT/val/ folders or a CSV index with a "
    "split column"
)


# The kinds of data whose classes are folders (`DataSource.kind`).
FOLDER_KINDS = ("image folder", "split root", "tar image folder", "tar split root")


def _images_of_classes(splits: dict[str, Samples], names: list[str]) -> dict[str, int]:
    """The images of each of `names` (shown names) in all `splits` together."""
    found = dict.fromkeys(names, 0)
    for samples in splits.values():
        for name, count in zip(
            shown_class_names(samples.classes), samples.class_counts(), strict=True
        ):
            if name in found:
                found[name] += count
    return found


def _train_classes_named_but_never_seen(
    source: DataSource, empty: list[str], found: dict[str, int]
) -> list[str]:
    """Of `empty` (classes without training images) of data that states its classes (HF's
    ClassLabel names, classes.txt beside shards, class indices), those some split has images
    of (`found`: each one's images in all splits); the classes no split has an image of are
    trained as outputs of their own, with a warning. Their names and indices are the data's (a
    dataset filtered to some classes keeps the ClassLabel names of all; shards of part of
    ImageNet label by its 1,000 indices): no class can be left out without rewriting every
    label, as a class folder can be removed."""
    never = [name for name in empty if not found[name]]
    if never:
        kept, it = ("an output", "it") if len(never) == 1 else ("outputs", "them")
        log.warning(
            f"{_classes_that(never, 'has', 'have')} no images in {redact_url(source.spec)}: kept"
            f" as {kept} no image is labelled with, as the data's class names (or indices)"
            f" include {it}"
        )
    return [name for name in empty if found[name]]


def _refuse_classes_without_images(source: DataSource, names: list[str]) -> None:
    """One error for classes of unsplit data with no image at all (an empty class folder, or
    one of files no reader takes for images, such as a phone's .HEIC photos), naming what their
    folders hold: --val-split is no part of it."""
    if not names:
        return
    from torchkit.core.data.sources.discovery import IMAGE_EXTENSIONS, list_non_image_files

    others: list[str] = []
    if source.kind == "image folder":
        for name in names:
            found = list_non_image_files(os.path.join(source.root, name))
            others += [os.path.join(name, path) for path in found]
    elif source.kind == "tar image folder" and source.tar_non_images:
        # the files its class folders unpack to (`cat/x.heic`), listed when it was read
        others = [path for path in source.tar_non_images if path.split("/", 1)[0] in names]
    held = ""
    if others:
        folders = "its folder holds" if len(names) == 1 else "their folders hold"
        shown = ", ".join(others[:3]) + (" ..." if len(others) > 3 else "")
        held = f": {folders} {len(others)} file(s) not read as images ({shown})"
    raise InputError(
        f"{_classes_that(names, 'has', 'have')} no images{held}",
        "add images ending in " + ", ".join(sorted(IMAGE_EXTENSIONS)) + "; or remove the class",
    )


def _classes_that(names: list[str], one: str, many: str) -> str:
    """`class 'a', 'b' and 3 more have` (the first five named) for messages."""
    shown = first_and_more([repr(name) for name in names], 5)
    return f"class {shown} {one if len(names) == 1 else many}"


def _empty_class_hint(
    held_out: bool, held_out_counts: list[int], kind: str, *, elsewhere: bool, many: bool
) -> str:
    """What gives classes without training images some: `held_out_counts`, the images
    --val-split held out of each (all it had); `kind`, the data's (a class of a CSV index,
    shards or parquet has no folder to add images to); `elsewhere`, whether another split
    (val, test) has images of one, whose folder keeps the class when its empty train folder is
    removed; `many`, more than one class."""
    if not held_out or min(held_out_counts, default=0) == 0:  # none to give back
        if kind in FOLDER_KINDS and elsewhere:
            its, folder = ("their", "folders") if many else ("its", "folder")
            return (
                f"add images to {its} {folder} in the train split, or remove {its} folders from "
                "every split"
            )
        if kind in FOLDER_KINDS:
            return "add images to the folder or remove it"
        return "add training images, or remove the class's images from the other splits"
    if min(held_out_counts) >= 2:
        return "hold out a smaller --val-split, or add images"
    return ONE_IMAGE_A_CLASS


def _empty_val_hint(held_out: bool, train_counts: list[int]) -> str:
    """What gives a run a validation set: a larger --val-split only where a class has an image
    to spare."""
    if not held_out:
        return "add images to the val split"
    if max(train_counts, default=0) >= 2:
        return "use a larger --val-split or add images"
    return ONE_IMAGE_A_CLASS


def _labelled_splits(
    source: DataSource, splits: dict[str, Samples], unlabelled: InputError, notes: list[str]
) -> dict[str, Samples]:
    """`splits` of data whose unlabelled split sits beside labelled ones (`open_labelled`),
    labelled by the class names alone: an unlabelled test split is left out (best.pt is not
    tested, with a note); unlabelled train or val images are refused (`unlabelled`: the error
    of the data's first unlabelled file, whose hint says what reads such images)."""
    from torchkit.core.data.sources.source import relabelled, split_without_labels_error

    named = [name for name in source.classes if name]
    kept = {}
    for name, samples in splits.items():
        if not samples.has_unlabelled:
            kept[name] = relabelled(samples, named, f"{source.spec} ({name})")
        elif name == "test":
            notes.append(
                f"the test split of {source.spec} has no labels: best.pt is not tested "
                "(predict reads those images)"
            )
        else:
            raise split_without_labels_error(source, name, unlabelled)
    return kept


def cross_split_copies(splits: dict[str, Samples]) -> tuple[int, int]:
    """(files, groups): the image files of `splits` that have a byte-identical copy in another
    split, and the groups of identical files they form. Cheap: files are grouped by size
    first, and only files that share a size with a file of another split are read
    (`core.hashing.content_groups`). Empty files are no copies: no image, each is skipped as
    unreadable (an interrupted download leaves many). (0, 0) for in-memory data (digits)."""
    from torchkit.core.data.hashing import content_groups

    if any(samples.paths is None for samples in splits.values()):
        return 0, 0
    paths: list[str] = []
    owner: list[str] = []
    for name, samples in splits.items():
        paths += samples.paths
        owner += [name] * len(samples)
    by_size: dict[int, list[int]] = {}
    for index, path in enumerate(paths):
        try:
            by_size.setdefault(os.stat(path).st_size, []).append(index)
        except OSError:
            continue
    # Only sizes that occur in two splits can hide a copy across splits.
    candidates = [
        index
        for size, members in by_size.items()
        if size and len({owner[i] for i in members}) > 1
        for index in members
    ]
    files = groups = 0
    for group in content_groups([paths[i] for i in candidates]):
        if len({owner[candidates[i]] for i in group}) > 1:
            files += len(group)
            groups += 1
    return files, groups


def warn_cross_split_copies(data: str, splits: dict[str, Samples]) -> None:
    """One warning line when byte-identical files lie in different splits of the run."""
    files, groups = cross_split_copies(splits)
    if files:
        log.warning(
            f"{files} images have a byte-identical copy in another of the run's splits "
            f"({'/'.join(splits)}; {counted(groups, 'group')}): val and test figures are inflated; "
            f"see them with `torchkit dataset-stats {shell_word(data)}` (`torchkit split` keeps "
            "copies in one split)"
        )


def classes_never_read(train: Samples, errors: Collection[str]) -> dict[str, str]:
    """The classes of `train` none of whose images could be read, each with its first image:
    `errors` are the skipped images' `PATH: reason` (`core.dataset.make_dataset`). Known only
    once each image was tried (no file is decoded before training)."""
    if train.paths is None or not errors:
        return {}
    read_as = set()  # every `PATH` an error can start with (a path may hold ': ')
    for error in errors:
        at = error.find(": ")
        while at != -1:
            read_as.add(error[:at])
            at = error.find(": ", at + 1)
    unread = [0] * len(train.classes)
    first: dict[int, str] = {}
    for path, label in zip(train.paths, train.labels, strict=True):
        if str(path) in read_as:
            unread[label] += 1
            first.setdefault(label, str(path))
    counts = train.class_counts()
    names = shown_class_names(train.classes)  # two classes of one name: two entries
    return {names[label]: shown for label, shown in first.items() if unread[label] == counts[label]}


def warn_classes_never_read(train: Samples, errors: Collection[str], warned: set[str]) -> None:
    """One warning naming the training classes whose images were all unreadable (not yet in
    `warned`, which it adds them to): the model keeps an output for a class it never saw, as
    the "has no images" error refuses before training for a class without image files."""
    found = classes_never_read(train, errors)
    names = [name for name in found if name not in warned]
    if not names:
        return
    warned.update(names)
    log.warning(
        f"{_classes_that(names, 'has', 'have')} no readable training image (all skipped as "
        f"unreadable; the first: {found[names[0]]}): the model has an output for "
        f"{'it' if len(names) == 1 else 'them'} that it is never trained on; fix or remove the "
        "files, or remove the class"
    )


def preprocess_for(config: TrainConfig) -> Preprocess:
    return Preprocess(
        image_size=int(config.image_size),
        resize_size=int(config.resize_size),
        mean=tuple(config.mean),
        std=tuple(config.std),
        in_channels=3,
        interpolation=config.interpolation,
        crop_mode=config.crop_mode or "center",
    )


class EpochSampler(WithholdingSampler):
    """Yields (epoch, index) pairs: this rank's share of epoch `epoch`'s order.

    Shuffled orders are `randperm(n)` seeded with seed + epoch (as DistributedSampler), padded
    by repetition to a multiple of the world size, then every world_size-th from `rank`. So
    the global batch j of a world of N processes with batch B holds the same images as batch j
    of one process with batch N x B. `skip` leaves out the first images (mid-epoch resume).
    Images read in blocks (`blocks`: parquet row groups, streamed shards) are shuffled by
    `windowed_order` instead, seeded alike, before the split over ranks.
    """

    def __init__(
        self,
        size: int,
        *,
        shuffle: bool,
        seed: int,
        rank: int = 0,
        world: int = 1,
        weights: list[float] | None = None,
        blocks: Blocks | None = None,
    ):
        self.size, self.shuffle, self.seed = size, shuffle, seed
        if blocks is not None and len(blocks.ids) != size:
            raise ValueError(f"{len(blocks.ids)} block ids for {size} images")
        self.blocks = blocks
        self.rank, self.world = rank, world
        # --balanced-sampler: an epoch draws `size` images with replacement, each with this
        # weight (1 / its class's count), as WeightedRandomSampler does; seeded like the rest.
        self.weights = weights
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, skip

    def _order(self) -> list[int]:
        import torch

        if self.weights is not None:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            weights = torch.tensor(self.weights, dtype=torch.float64)
            order = weighted_draws(weights, self.size, generator).tolist()
        elif self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            if self.blocks is not None:
                order = windowed_order(self.blocks, generator)
            else:
                order = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(range(self.size))
        if self.world > 1:
            padded = -(-self.size // self.world) * self.world
            order = (order * (padded // max(1, len(order)) + 1))[:padded]
            order = order[self.rank :: self.world]
        return order

    def __iter__(self):
        if self._withheld:
            return
        for index in self._order()[self.skip :]:
            yield (self.epoch, index)

    @property
    def epoch_images(self) -> int:
        """The images of this rank's whole epoch (a resumed one's skipped images included)."""
        return -(-self.size // self.world)

    def __len__(self) -> int:
        return max(0, self.epoch_images - self.skip)


# The most categories torch.multinomial draws from (it raises a RuntimeError above).
MULTINOMIAL_MAX_CATEGORIES = 2**24


def weighted_draws(weights: Any, count: int, generator: Any) -> Any:
    """`count` indices drawn with replacement, each with probability proportional to its
    weight: torch.multinomial's draws, or for more than it takes (a training set of over 16.7
    million images) the inverse of the weights' cumulative sum at uniform points, which draws
    from the same distribution. Smaller sets keep multinomial's draws, so their orders (and
    the runs they resume) stay as they were."""
    import torch

    if len(weights) <= MULTINOMIAL_MAX_CATEGORIES:
        return torch.multinomial(weights, count, replacement=True, generator=generator)
    cumulative = torch.cumsum(weights, 0)
    points = torch.rand(count, generator=generator, dtype=cumulative.dtype) * cumulative[-1]
    # right=True: the first index whose cumulative weight exceeds the point (none of weight 0).
    drawn = torch.searchsorted(cumulative, points, right=True)
    return drawn.clamp_(max=len(weights) - 1)


def windowed_order(blocks: Blocks, generator: Any) -> list[int]:
    """A random order of images read in blocks that reads each block once: the blocks in
    random order, the images of each window of consecutive ones shuffled together (a window:
    `blocks.window` blocks, or as many as fit in `blocks.capacity` bytes where `blocks.sizes`
    gives theirs). A plain shuffle of parquet images larger than the reader's cache re-reads a
    row group for nearly every image (5.7-11 ms an image instead of 0.1-0.2 ms)."""
    import torch

    ids = torch.tensor(blocks.ids, dtype=torch.int64)
    count = int(ids.max()) + 1 if len(ids) else 0  # the blocks: ids count from 0 up
    if _one_window(blocks, count):
        # Every block is read together: the plain shuffle of image files, so the same images
        # train in the same order from a folder, parquet or a streamed shard folder.
        return torch.randperm(len(ids), generator=generator).tolist()
    shuffled = torch.randperm(count, generator=generator)
    place = torch.empty(count, dtype=torch.int64)
    place[shuffled] = torch.arange(count)
    if blocks.sizes is not None and blocks.capacity is not None:
        window_of_place = _packed_windows(
            [blocks.sizes[b] for b in shuffled.tolist()], blocks.capacity
        )
        window = torch.tensor(window_of_place, dtype=torch.int64)[place[ids]]
    else:
        window = torch.div(place[ids], blocks.window, rounding_mode="floor")
    # Sorted by window, then by a random permutation: uniform within each window, no ties.
    keys = window * len(ids) + torch.randperm(len(ids), generator=generator)
    return torch.argsort(keys).tolist()


def _one_window(blocks: Blocks, count: int) -> bool:
    """Whether all `count` of `blocks` fit in one window (as `windowed_order` packs them)."""
    if blocks.sizes is not None and blocks.capacity is not None:
        return count <= 1 or sum(blocks.sizes) <= blocks.capacity
    return count <= blocks.window


def _packed_windows(sizes: list[int], capacity: int) -> list[int]:
    """The window of each block of `sizes` (bytes, in reading order): consecutive blocks share
    one while their bytes together fit in `capacity`; a block larger alone has its own."""
    windows, window, held = [], 0, 0
    for size in sizes:
        if held and held + size > capacity:
            window, held = window + 1, 0
        held += size
        windows.append(window)
    return windows


def train_batch_images(loader: Any, sampler: EpochSampler) -> tuple[int, int]:
    """(images of a full batch, images of the epoch's last batch) of this rank's train
    `loader`: the last holds fewer when it keeps the rest of an epoch that is not a multiple
    of the batch size."""
    rest = sampler.epoch_images % loader.batch_size
    return loader.batch_size, rest if rest and not loader.drop_last else loader.batch_size


def balanced_sample_weights(samples: Samples) -> list[float]:
    """1 / (its class's count) for each image: every class is drawn equally often."""
    counts = samples.class_counts()
    return [1.0 / counts[label] for label in samples.labels]


class SeededDataset:
    """Wraps a dataset: item (epoch, i) is item i with torch's generator seeded from
    (seed, epoch, i), so its random augmentation does not depend on who loads it or when. In
    the main process (workers=0) the generator's state is restored afterwards, so the model's
    random numbers (dropout, mixup) are not disturbed."""

    def __init__(self, inner: Any, seed: int) -> None:
        self.inner, self.seed = inner, seed
        self._epoch_seeds: dict[int, int] = {}
        self._rendered: tuple[int, Any] | None = None  # (epoch, its images), in-memory data

    def __len__(self) -> int:
        return len(self.inner)

    def item_seed(self, epoch: int, index: int) -> int:
        return mix_seed(self._epoch_seed(epoch), index)

    def _epoch_seed(self, epoch: int) -> int:
        base = self._epoch_seeds.get(epoch)
        if base is None:
            base = self._epoch_seeds[epoch] = mix_seed(self.seed, epoch)
        return base

    def _epoch_images(self, epoch: int) -> Any:
        """Every image of the in-memory dataset as epoch `epoch` transforms it."""
        if self._rendered is None or self._rendered[0] != epoch:
            import numpy as np

            seeds = mix_seeds(self._epoch_seed(epoch), np.arange(len(self.inner)))
            self._rendered = (epoch, self.inner.render_all(self.inner.draw_arrays(seeds)))
        return self._rendered[1]

    def __getitem__(self, key):
        return self._items([key])[0]

    def __getitems__(self, keys: list) -> list | Batch:
        """A whole batch at once (the DataLoader calls this when it exists): the main process's
        generator state is saved and restored once per batch, not once per image. Small
        in-memory data transformed a whole epoch at a time gives the collated `Batch` itself,
        cut from the epoch's images (`collate_skipping_unreadable` passes it on): 32 images
        split apart and stacked again cost a quarter of a millisecond a batch, 5% of the
        digits job's step."""
        epoch = self._whole_epoch_of(keys)
        if epoch is not None:
            return self.inner.batch_of(self._epoch_images(epoch), [index for _, index in keys])
        return self._items(keys)

    def _whole_epoch_of(self, keys: list) -> int | None:
        """The epoch of `keys` where their images are cut from that epoch's, all transformed
        at once (small in-memory data, in the main process, keys of one epoch); else None."""
        if not hasattr(self.inner, "draw_arrays") or not self.inner.renders_whole_epochs:
            return None
        epoch = keys[0][0]
        if not all(key[0] == epoch for key in keys) or not _in_main_process():
            return None
        return epoch

    def _items(self, keys: list) -> list:
        if hasattr(self.inner, "draw_arrays"):
            # In-memory images: draws keyed by each image's seed (torch's generator is not
            # used), then one batched transform; small data has its whole epoch transformed
            # at its first batch, and its items cut from that (the same pixels).
            indices = [index for _, index in keys]
            epoch = self._whole_epoch_of(keys)
            if epoch is not None:
                return self.inner.items_of(self._epoch_images(epoch)[indices], indices)
            draws = self.inner.draw_arrays([self.item_seed(e, i) for e, i in keys])
            return self.inner.items(indices, draws)
        import torch

        generator = torch.default_generator
        in_main = torch.utils.data.get_worker_info() is None
        saved = generator.get_state() if in_main else None
        try:
            items = []
            for epoch, index in keys:
                generator.manual_seed(self.item_seed(epoch, index))
                items.append(self.inner[index])
            return items
        finally:
            if saved is not None:
                generator.set_state(saved)


def _in_main_process() -> bool:
    """Not in a DataLoader worker (each worker would transform a whole epoch for its share)."""
    import torch

    return torch.utils.data.get_worker_info() is None


def _worker_init(worker_id: int) -> None:
    # Ctrl-C reaches the whole process group, and so does SIGTERM from `timeout` or a batch
    # scheduler: the main process handles it (saving a checkpoint) and shuts the workers down
    # (`Loaders.close`); a worker dying of it would break that. A second SIGTERM (what
    # multiprocessing sends daemonic children at exit) ends the worker, and so does the one the
    # kernel sends when the main process dies (`OrphanedWorkerExit`'s PR_SET_PDEATHSIG).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, functools.partial(_first_sigterm_ignored, os.getppid()))
    seed_worker(worker_id)


def _first_sigterm_ignored(parent: int, signum, frame) -> None:
    if os.getppid() != parent:  # the main process died (SIGKILL, the OOM killer): end now,
        os._exit(0)  # not at torch's next look at it, up to 5 s on (see `OrphanedWorkerExit`)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@dataclass
class Loaders:
    train: Any
    train_sampler: EpochSampler
    val: Any
    test: Any | None
    train_size: int
    val_size: int
    test_size: int

    def close(self) -> None:
        """Stop the worker processes of the loaders now (persistent workers otherwise live
        until their loader is garbage-collected, which a traceback can put off to exit)."""
        for loader in (self.train, self.val, self.test):
            if getattr(loader, "_iterator", None) is not None:
                stop_workers(loader)
                loader._iterator = None

    def start_workers(self, *, train: bool = False) -> None:
        """Fork the validation and test loaders' workers now (and the train loader's with
        `train`: where no epoch is started early, a run resumed mid-epoch), before the train
        loader hands its own workers any index. Handing a worker indices starts a thread (the
        feeder of its multiprocessing queue), and a process forked beside a thread may
        deadlock in the child on a lock that thread held (Python 3.12+ warns of it at each
        fork): forked at their first evaluation, the validation workers were forked beside the
        train workers' feeder threads, and the test workers beside the checkpoint writer's
        too; the train workers of a resumed epoch beside Gloo's under torchrun. Forked here,
        every worker of the run is forked before any of those threads exists; each loader
        hands its workers their first indices when it is first read."""
        for loader in (self.val, self.test, self.train if train else None):
            if loader is not None and loader.num_workers > 0 and loader.persistent_workers:
                with loader.sampler.withheld():
                    iter(loader)  # persistent workers: the loader keeps them


# The smallest batch validation splits its images into to share them among the workers.
MIN_SHARED_EVAL_BATCH = 32


def eval_batch_size(images: int, batch_size: int, workers: int) -> int:
    """Validation's batch size for `images` (this rank's) read by `workers`: --batch-size, or
    smaller where that leaves workers idle, so that each worker has about two batches. A
    worker reads and decodes a whole batch alone: on the H200 (14 workers, batch 256) 800
    validation images made 4 batches, and validating took 1.2-1.7 s of resnet50's 3.5 s
    epochs while 10 workers waited. Not below MIN_SHARED_EVAL_BATCH; the sums it gives do
    not depend on the batching."""
    if workers <= 1:
        return batch_size
    shared = -(-images // (2 * workers))
    return min(batch_size, max(shared, MIN_SHARED_EVAL_BATCH))


def lone_last_batch(images: int, batch_size: int) -> bool:
    """Whether an epoch of `images` ends in a batch of one image after at least one full one."""
    return images > batch_size and images % batch_size == 1


def default_workers_for(data: str) -> int:
    """In-memory digits decode in microseconds: worker processes only add overhead there."""
    from torchkit.core.data.dataset import default_workers

    return 0 if data == DIGITS else default_workers()


def loader_workers(config: TrainConfig) -> int:
    """The worker processes of the run's loaders: --workers, else the data's default."""
    return config.workers if config.workers is not None else default_workers_for(config.data)


def train_preprocess(preprocess: Preprocess, config: TrainConfig) -> Preprocess:
    """The preprocessing of training batches: the run's (`preprocess`, which validation and the
    checkpoint keep) with its crop at --train-crop-size where one is given, for a random crop."""
    if config.train_crop_size is None or config.augment == "none":
        return preprocess
    return replace(preprocess, image_size=int(config.train_crop_size))


def train_dataset(samples: Samples, preprocess: Preprocess, config: TrainConfig):
    """The train split's dataset: in-memory images (digits) transformed in torch, files
    through `make_dataset` and torchvision's transforms, cropped to --train-crop-size."""
    from torchkit.core.train import memory_images

    preprocess = train_preprocess(preprocess, config)

    if memory_images.supports(
        samples,
        augment=config.augment,
        random_erasing=config.random_erasing,
        interpolation=config.interpolation,
    ):
        return memory_images.MemoryImages(
            samples,
            preprocess,
            train=True,
            flip=bool(config.flip),
            crop_scale=tuple(config.crop_scale),
            augment=config.augment,
        )
    return make_dataset(
        samples,
        train_transform(
            preprocess,
            flip=bool(config.flip),
            crop_scale=tuple(config.crop_scale),
            augment=config.augment,
            randaugment_magnitude=config.randaugment_magnitude,
            augmix_severity=config.augmix_severity,
            autoaugment_policy=config.autoaugment_policy,
            random_erasing=config.random_erasing,
            # JPEGs decoded at a reduced size where the crop allows (core.decode); `exact`
            # decodes them whole; `device` leaves them to the main process (device_decode).
            # `auto` is resolved by the run (runner); unresolved, it is `fast`.
            decode="fast" if config.decode == "auto" else config.decode,
            decode_cpu_share=config.decode_cpu_share,
        ),
        # uint8 batches where the transform allows: the loop normalises them (to_device).
        pixels=True,
    )


def eval_dataset(samples: Samples, preprocess: Preprocess):
    """Evaluation images: transformed once when they are in memory (digits)."""
    from torchkit.core.train import memory_images

    if samples.images is not None:  # any interpolation: PIL does the resize (eval_pixels)
        return memory_images.MemoryImages(samples, preprocess, train=False)
    return make_dataset(samples, eval_transform(preprocess, pixels=True))  # see to_device


# Evaluation batch size for in-memory images (digits' val/test) when --batch-size is smaller.
IN_MEMORY_EVAL_BATCH = 256


def build_loaders(
    splits: dict[str, Samples],
    preprocess: Preprocess,
    config: TrainConfig,
    *,
    rank: int = 0,
    world: int = 1,
    pin_memory: bool = False,
    drop_last: bool = False,
    drop_lone_image: Callable[[], bool] | None = None,
) -> Loaders:
    """The train, val and test loaders. `pin_memory`: batches in page-locked memory (CUDA),
    copied with non_blocking. `drop_last`: the train loader leaves out each epoch's last
    partial batch (when this rank has a full one), so a GPU run meets one batch shape only
    (cuDNN autotunes each new shape); the runner asks for it on CUDA with cudnn.benchmark.
    `drop_lone_image`: it leaves the last batch out also when that would hold one image (a
    model with BatchNorm cannot train on a batch of one: torch raises) and it answers True,
    asked only then (training builds its model after its loaders, `setup.prepare_state`)."""
    import torch

    workers = loader_workers(config)
    common: dict[str, Any] = {
        "num_workers": workers,
        "collate_fn": collate_skipping_unreadable,
        "pin_memory": pin_memory,
    }
    if workers > 0:
        common.update(
            persistent_workers=True,
            prefetch_factor=4,
            **worker_options(workers, _worker_init),
        )
    train_set = SeededDataset(train_dataset(splits["train"], preprocess, config), config.seed)
    sampler = EpochSampler(
        len(splits["train"]),
        shuffle=True,
        seed=config.seed,
        rank=rank,
        world=world,
        weights=balanced_sample_weights(splits["train"]) if config.balanced_sampler else None,
        blocks=read_blocks(splits["train"].paths),
    )
    generator = torch.Generator()
    generator.manual_seed(config.seed)
    train_collate = collate_skipping_unreadable
    if config.decode == "device":
        from torchkit.core.data.device_decode import collate_encoded

        train_collate = collate_encoded  # JPEG bytes, decoded on the device by the loop
    # Only where every epoch of this rank has a full batch: dropping the only one would leave
    # nothing to train on.
    drop_last = drop_last and len(sampler) >= config.batch_size
    if not drop_last and drop_lone_image and lone_last_batch(len(sampler), config.batch_size):
        drop_last = drop_lone_image()
    train = torch.utils.data.DataLoader(
        train_set,
        batch_size=config.batch_size,
        sampler=sampler,
        generator=generator,
        **{**common, "collate_fn": train_collate},
        drop_last=drop_last,
    )

    def eval_loader(samples: Samples):
        # Persistent like the others (the test set is read once), so that `Loaders.close`
        # reaches its workers too, even when a signal stops the run in the middle of it.
        dataset = eval_dataset(samples, preprocess)
        # In-memory images are transformed already: batches of tiny images cost more in
        # per-batch overhead than in compute, and forward-only batches hold no activations.
        batch_size = config.batch_size
        if samples.images is not None:
            batch_size = max(batch_size, IN_MEMORY_EVAL_BATCH)
        else:
            batch_size = eval_batch_size(-(-len(samples) // world), batch_size, workers)
        # A generator of its own: each iterator the loader makes draws its workers' seed from
        # it, not from torch's global random state (which the model is then built from when
        # `Loaders.start_workers` makes the first at set-up).
        generator = torch.Generator()
        generator.manual_seed(config.seed)
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=ShardSampler(len(samples), rank, world),
            generator=generator,
            **common,
        )

    test = splits.get("test")
    return Loaders(
        train=train,
        train_sampler=sampler,
        val=eval_loader(splits["val"]),
        test=eval_loader(test) if test is not None and len(test) else None,
        train_size=len(splits["train"]),
        val_size=len(splits["val"]),
        test_size=len(test) if test is not None else 0,
    )
