"""Datasets: image folders and the built-in `digits` (CSV indexes, and what `--data` names as a
whole, split roots included, are read by `core.datasource`); splitting; transforms; a Dataset that
skips unreadable images instead of crashing the DataLoader."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Batch and its collate live in core.batches (below core.device_decode); named here too.
from torchkit.core.batches import Batch as Batch
from torchkit.core.batches import collate_skipping_unreadable as collate_skipping_unreadable
from torchkit.core.errors import CheckpointError, InputError, UsageError

IMAGE_EXTENSIONS = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm", ".jfif"}
)
SPLIT_NAMES = ("train", "val", "test")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DIGITS = "digits"


@dataclass
class Samples:
    """A labelled set of images: files on disk (`paths`) or arrays in memory (`images`)."""

    classes: list[str]
    labels: list[int]
    paths: list[str] | None = None
    images: Any = None  # uint8 array (N, H, W) or (N, H, W, C) for in-memory data
    source: str = ""
    # The printable name of each sample, the `path` column of every output that names images:
    # the path relative to the data root (for a CSV index, as the CSV writes it).
    ids: list[str] = field(default_factory=list)
    # The split (train, val, test) of each sample, for data that has splits; None otherwise.
    splits: list[str] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: Sequence[int]) -> Samples:
        return Samples(
            classes=self.classes,
            labels=[self.labels[i] for i in indices],
            paths=None if self.paths is None else [self.paths[i] for i in indices],
            images=None if self.images is None else self.images[list(indices)],
            source=self.source,
            ids=[self.ids[i] for i in indices] if self.ids else [],
            splits=None if self.splits is None else [self.splits[i] for i in indices],
        )

    def class_counts(self) -> list[int]:
        counts = [0] * len(self.classes)
        for label in self.labels:
            counts[label] += 1
        return counts


def is_image_file(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def _scan_tree(folder: str | os.PathLike) -> tuple[list[str], list[str], list[str]]:
    """(image files, other files not hidden, symbolic links named like images that point
    nowhere) under `folder`, unsorted, spelled as pathlib spells them; symlinked files are
    included, symlinked folders not entered and unreadable folders skipped, as `Path.rglob`
    does."""
    images: list[str] = []
    others: list[str] = []
    dangling: list[str] = []
    pending = [str(Path(folder))]
    while pending:
        directory = pending.pop()
        prefix = "" if directory == "." else directory + os.sep
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    name = entry.name
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(prefix + name)
                            continue
                        is_file = entry.is_file()
                        if not is_file and not entry.is_symlink():
                            continue
                    except OSError:  # vanished while listing
                        continue
                    dot = name.rfind(".")  # Path.suffix's rule, without making a Path
                    image = 0 < dot < len(name) - 1 and name[dot:].lower() in IMAGE_EXTENSIONS
                    if not is_file:  # a link to a folder, a FIFO... or to nothing
                        if image and not os.path.exists(prefix + name):
                            dangling.append(prefix + name)
                    elif image:
                        images.append(prefix + name)
                    elif not name.startswith("."):
                        others.append(prefix + name)
        except OSError:
            continue
    return images, others, dangling


def list_image_files(folder: str | os.PathLike) -> list[str]:
    """Image files under `folder`, recursively, sorted: what `sorted(Path.rglob("*"))` filtered
    by `is_file()` and extension gives, but with `os.scandir`, so 100,000 files take a fraction of
    a second instead of several."""
    return sorted(_scan_tree(folder)[0])


def list_non_image_files(folder: str | os.PathLike) -> list[str]:
    """Files under `folder` that image datasets leave out (not hidden ones such as .DS_Store),
    relative to `folder`, sorted."""
    return relative_ids(sorted(_scan_tree(folder)[1]), folder)


def list_dangling_image_links(folder: str | os.PathLike) -> list[str]:
    """Symbolic links under `folder`, recursively, named like image files but pointing nowhere,
    sorted (spelled as `list_image_files` spells paths, which leaves them out)."""
    return sorted(_scan_tree(folder)[2])


def relative_ids(paths: Sequence[str], folder: str | os.PathLike) -> list[str]:
    """`os.path.relpath(p, folder)` for paths under `folder`, by slicing where that is exact."""
    base = str(Path(folder))
    prefix = base + os.sep
    if base == ".":
        return [os.path.relpath(p, base) for p in paths]
    return [p[len(prefix) :] if p.startswith(prefix) else os.path.relpath(p, base) for p in paths]


def stratified_split(
    labels: Sequence[int],
    fractions: Sequence[float],
    seed: int,
    *,
    keys: Sequence[str] | None = None,
    groups: Sequence[str] | None = None,
    at_least_one: bool = False,
) -> list[list[int]]:
    """Split indices class by class in the given proportions, seeded and reproducible.

    Counts per class are allocated by largest remainder, so every part that is due a share gets
    one; each class is shuffled with its own generator seeded from (seed, label) so adding a
    class does not change how the others are split.

    With `keys` (a stable name per sample, e.g. its path relative to the dataset root; equal keys
    stay together) the order within a class is a SHA-256 of (seed, key) instead: the same on every
    machine and NumPy version, and independent of the order the samples are listed in. With
    `groups`, samples of one group always land in the same part: a group counts in the class most
    of its samples have, and groups are dealt, in that hashed order, to the part furthest below
    its share of the class's samples (exact for groups of one, close otherwise). `at_least_one`:
    every part with a positive fraction gets at least one sample (or group) of each class that has
    enough of them (see `largest_remainder_counts`).
    """
    import numpy as np

    total = sum(fractions)  # Fractions stay exact; floats and ints divide as before
    weights = [f / total for f in fractions]
    if keys is not None or groups is not None:
        units = groups if groups is not None else keys
        return _split_units(labels, weights, seed, units, at_least_one)
    parts: list[list[int]] = [[] for _ in fractions]
    by_class: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        by_class.setdefault(label, []).append(index)
    for label in sorted(by_class):
        members = by_class[label]
        rng = np.random.default_rng([seed, label])
        order = [members[i] for i in rng.permutation(len(members))]
        counts = largest_remainder_counts(len(order), weights, at_least_one=at_least_one)
        start = 0
        for part, count in zip(parts, counts, strict=True):
            part.extend(order[start : start + count])
            start += count
    return [sorted(part) for part in parts]


def _split_units(
    labels: Sequence[int], weights: Sequence, seed: int, unit_names: Sequence[str], at_least_one
) -> list[list[int]]:
    members: dict[str, list[int]] = {}
    for index, name in enumerate(unit_names):
        if name in members:
            members[name].append(index)
        else:
            members[name] = [index]
    salt = f"{seed}\0".encode()  # the rank of a unit depends on the seed and its name only
    strata: dict[int, list[tuple[bytes, str]]] = {}
    for name, indices in members.items():
        if len(indices) == 1:
            label = labels[indices[0]]
        else:
            votes: dict[int, int] = {}
            for index in indices:
                votes[labels[index]] = votes.get(labels[index], 0) + 1
            label = min(votes, key=lambda lab: (-votes[lab], lab))  # majority, then smallest
        rank = hashlib.sha256(salt + name.encode("utf-8", "surrogateescape")).digest()
        strata.setdefault(label, []).append((rank, name))
    parts: list[list[int]] = [[] for _ in weights]
    for label in sorted(strata):
        units = [members[name] for _, name in sorted(strata[label])]
        targets = largest_remainder_counts(
            sum(len(unit) for unit in units), weights, at_least_one=at_least_one
        )
        dealt = _deal_units(units, targets, weights, at_least_one)
        for part, chosen in zip(parts, dealt, strict=True):
            for unit in chosen:
                part.extend(unit)
    return [sorted(part) for part in parts]


def _deal_units(
    units: list[list[int]], targets: list[int], weights: Sequence, at_least_one: bool
) -> list[list[list[int]]]:
    """Give each unit to the part with the most samples still missing from its target."""
    candidates = [j for j, w in enumerate(weights) if w > 0]
    filled = [0] * len(targets)
    chosen: list[list[list[int]]] = [[] for _ in targets]
    for unit in units:
        part, gap = candidates[0], targets[candidates[0]] - filled[candidates[0]]
        for j in candidates[1:]:  # the largest gap; the earlier part on a tie
            if targets[j] - filled[j] > gap:
                part, gap = j, targets[j] - filled[j]
        chosen[part].append(unit)
        filled[part] += len(unit)
    if at_least_one and len(units) >= len(candidates):
        for j in candidates:
            if not chosen[j]:  # big groups filled the other parts: take the donor's smallest
                donor = max(candidates, key=lambda d: (len(chosen[d]), -d))
                smallest = min(range(len(chosen[donor])), key=lambda u: len(chosen[donor][u]))
                chosen[j].append(chosen[donor].pop(smallest))
    return chosen


def largest_remainder_counts(
    n: int, weights: Sequence[float], *, at_least_one: bool = False
) -> list[int]:
    """Integers summing to n, proportional to weights (Hamilton's method).

    With `at_least_one`, when n is at least the number of parts with a positive weight, a part
    that came out 0 takes one from the largest part: 5 at 8:1:1 gives 3/1/1, not 4/1/0.
    """
    exact = [n * w for w in weights]
    counts = [int(x) for x in exact]
    remainders = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in remainders[: n - sum(counts)]:
        counts[i] += 1
    positive = [i for i, w in enumerate(weights) if w > 0]
    if at_least_one and n >= len(positive):
        for i in positive:
            if counts[i] == 0:
                donor = max(positive, key=lambda j: (counts[j], exact[j] - counts[j], -j))
                counts[donor] -= 1
                counts[i] += 1
    return counts


def _sklearn_digits() -> tuple[Any, Any]:
    """(images N,8,8 floats 0..16, targets) of scikit-learn's digits: read from the CSV that
    ships inside scikit-learn, as `load_digits` reads it, without importing sklearn.datasets
    (2 s, a tenth of the README's training run); `load_digits` itself if the file moved."""
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "datasets", "data", "digits.csv.gz")
        if os.path.isfile(path):
            data = np.loadtxt(path, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images, bunch.target


def digits_splits() -> dict[str, Samples]:
    """scikit-learn's 1,797 real 8x8 digits, split 80/10/10 stratified with seed 0."""
    import numpy as np

    pixels, targets = _sklearn_digits()
    # Pixel values are 0..16; scale to 0..255 so they behave like any 8-bit grayscale image.
    images = np.rint(pixels * (255.0 / 16.0)).astype(np.uint8)
    labels = [int(y) for y in targets]
    classes = [str(c) for c in range(10)]
    ids = [f"digits/{i:04d}" for i in range(len(labels))]
    everything = Samples(classes, labels, images=images, source=DIGITS, ids=ids)
    parts = stratified_split(labels, (0.8, 0.1, 0.1), seed=0)
    return {name: everything.subset(part) for name, part in zip(SPLIT_NAMES, parts, strict=True)}


def discover_image_folder(
    root: str | os.PathLike, *, classes: Sequence[str] | None = None, allow_empty_classes=True
) -> Samples:
    """`ROOT/<class>/<image>` (searched recursively inside each class folder)."""
    folder = Path(root)
    if not folder.is_dir():
        raise InputError(f"dataset folder not found: {folder}", "check --data")
    class_dirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        if any(is_image_file(p) for p in folder.iterdir()):
            raise InputError(
                f"{folder} holds images but no class folders",
                "arrange it as ROOT/<class>/<image>",
            )
        raise InputError(f"no class folders in {folder}", "arrange it as ROOT/<class>/<image>")
    names = [d.name for d in class_dirs]
    class_list = list(classes) if classes is not None else names
    index_of = {name: i for i, name in enumerate(class_list)}
    unknown = [name for name in names if name not in index_of]
    if unknown:
        raise InputError(
            f"class folder(s) {', '.join(unknown[:5])} in {folder} are not among the model's "
            f"{len(class_list)} classes",
            "the classes are: "
            + ", ".join(class_list[:10])
            + (" ..." if len(class_list) > 10 else ""),
        )
    paths, labels = [], []
    for class_dir in class_dirs:
        files = list_image_files(class_dir)
        paths.extend(files)
        labels.extend([index_of[class_dir.name]] * len(files))
    if not paths:
        raise InputError(
            f"no images in {folder}", "supported: " + ", ".join(sorted(IMAGE_EXTENSIONS))
        )
    ids = relative_ids(paths, folder)
    return Samples(class_list, labels, paths=paths, source=str(folder), ids=ids)


def discover_flat_folder(root: str | os.PathLike) -> Samples:
    """A folder of images with no class folders (searched recursively): one unnamed class ""."""
    folder = Path(root)
    if not folder.is_dir():
        raise InputError(f"folder not found: {folder}", "check the path")
    paths = list_image_files(folder)
    if not paths:
        raise InputError(
            f"no images in {folder}", "supported: " + ", ".join(sorted(IMAGE_EXTENSIONS))
        )
    ids = relative_ids(paths, folder)
    return Samples([""], [0] * len(paths), paths=paths, source=str(folder), ids=ids)


@dataclass
class Preprocess:
    """What eval-time preprocessing a model expects; stored in every torchkit checkpoint."""

    image_size: int = 224
    resize_size: int = 256
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    in_channels: int = 3
    interpolation: str = "bilinear"

    def to_dict(self) -> dict:
        return {
            "image_size": self.image_size,
            "resize_size": self.resize_size,
            "mean": list(self.mean),
            "std": list(self.std),
            "in_channels": self.in_channels,
            "interpolation": self.interpolation,
        }

    @classmethod
    def from_dict(cls, data: dict | None, source: str | None = None) -> Preprocess:
        """The preprocessing a checkpoint or an exported file records (`to_dict`'s keys; a
        missing one takes the default). A value of the wrong kind (a size that is not a whole
        number, a mean that is not numbers) is a CheckpointError naming `source` (the file;
        "the model's file" when not given) and the field. Whether the values can be used is
        `check`'s question: commands that feed images ask it once overrides are applied."""
        data = data or {}
        default = cls()
        where = source or "the model's file"

        def bad(name: str, why: str) -> CheckpointError:
            return CheckpointError(
                f"the preprocessing recorded in {where} is unusable: {name} is "
                f"{_shown_value(data.get(name))}, {why}",
                "the file is damaged or was not written by torchkit",
            )

        def whole(name: str, fallback: int) -> int:
            value = data.get(name, fallback)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad(name, "not a whole number")
            if isinstance(value, float) and not value.is_integer():
                raise bad(name, "not a whole number")
            return int(value)

        def numbers(name: str, fallback: tuple[float, ...]) -> tuple[float, ...]:
            values = data.get(name, fallback)
            if isinstance(values, (int, float)) and not isinstance(values, bool):
                values = [values]
            try:
                if isinstance(values, (str, bytes, dict)) or any(
                    isinstance(v, (bool, str, bytes)) for v in values
                ):
                    raise TypeError(name)
                return tuple(float(v) for v in values)
            except (TypeError, ValueError):
                raise bad(name, "not a list of numbers") from None

        channels = whole("in_channels", default.in_channels)
        mean, std = default.mean, default.std
        if channels != len(mean):  # not recorded: ImageNet's, averaged over a non-RGB stem's
            mean, std = (sum(mean) / len(mean),) * channels, (sum(std) / len(std),) * channels
        return cls(
            image_size=whole("image_size", default.image_size),
            resize_size=whole("resize_size", default.resize_size),
            mean=numbers("mean", mean),
            std=numbers("std", std),
            in_channels=channels,
            interpolation=str(data.get("interpolation", default.interpolation)),
        )

    def problem(self) -> tuple[str, str] | None:
        """(field, what is wrong with it) for the first value images cannot be preprocessed
        with, None when all can: sizes and channels positive whole numbers, mean and std one
        finite value per input channel (or one for all), std above 0 (dividing by 0 turns
        every pixel into inf or NaN)."""
        for name in ("image_size", "resize_size", "in_channels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return name, f"{name} is {value!r}, not a positive whole number"
        for name in ("mean", "std"):
            values = list(getattr(self, name))
            if len(values) not in (1, self.in_channels):
                return name, (
                    f"{name} has {len(values)} value(s) for {self.in_channels}-channel images "
                    f"({_shown_value(values)})"
                )
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                return name, f"{name} {_shown_value(values)} is not all finite numbers"
        if any(v <= 0 for v in self.std):
            return "std", (
                f"std {_shown_value(list(self.std))} has a value that is not above 0 (images "
                "would be divided by it)"
            )
        return None

    def check(self, source: str) -> Preprocess:
        """`self`, or a CheckpointError naming `source` (the model file it came from) and the
        first unusable value (see `problem`): one error before any image is read, instead of
        every image failing, or a shape error after the output has begun."""
        found = self.problem()
        if found is not None:
            name, what = found
            option = {"image_size": "--image-size", "resize_size": "--resize-size"}.get(
                name, f"--{name}"
            )
            raise CheckpointError(
                f"the preprocessing recorded in {source} is unusable: {what}",
                f"it is the model file's fault, not the images'; give {option} to override it"
                if name != "in_channels"
                else "the file is damaged or was not written by torchkit",
            )
        return self


def _shown_value(value: Any) -> str:
    """A recorded value for a message: short, lists as lists, floats as written."""
    if isinstance(value, (list, tuple)):
        shown = [float(v) if isinstance(v, (int, float)) else v for v in list(value)[:8]]
        return repr(shown)[:-1] + (", ...]" if len(value) > 8 else "]")
    return repr(value)


def eval_transform(preprocess: Preprocess):
    """Resize the shorter side, centre-crop, to tensor, normalise (torchvision's eval recipe)."""
    from torchvision import transforms as T

    mode = T.InterpolationMode(preprocess.interpolation)
    return T.Compose(
        [
            T.Resize(preprocess.resize_size, interpolation=mode, antialias=True),
            T.CenterCrop(preprocess.image_size),
            T.ToTensor(),
            T.Normalize(preprocess.mean, preprocess.std),
        ]
    )


AUGMENT_POLICIES = ("none", "basic", "trivialaugment", "randaugment", "autoaugment")
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


def train_transform(
    preprocess: Preprocess,
    *,
    flip: bool = True,
    crop_scale: tuple[float, float] = (0.08, 1.0),
    augment: str = "basic",
    randaugment_magnitude: int = 9,
    random_erasing: float = 0.0,
    decode: str = "exact",
):
    """torchvision's train recipe: RandomResizedCrop + horizontal flip (`basic`), then a policy
    (`trivialaugment`, `randaugment` at `randaugment_magnitude`, `autoaugment`'s ImageNet
    policy), to tensor, normalise, RandomErasing with probability `random_erasing`. `none` is
    the eval transform (resize, centre crop). Random draws come from torch's generator, which
    the training loaders seed per image and epoch.

    `decode="fast"` (with a random crop): the same transform on PIL images, but `make_dataset`
    decodes JPEG files at 1/2, 1/4 or 1/8 of their size where the crop keeps `image_size`
    pixels (`core.decode`); `exact` decodes every image whole. `device` (flip and crop only):
    the fast path's transform on PIL images and non-JPEG files, while JPEG files reach the
    batch as their bytes, crop box and flip, decoded on the training device
    (`core.device_decode`)."""
    from torchvision import transforms as T

    from torchkit.core.decode import check_decode

    if augment not in AUGMENT_POLICIES:
        raise UsageError(f"unknown --augment {augment!r}", "use " + ", ".join(AUGMENT_POLICIES))
    check_decode(decode)
    if decode == "device":
        from torchkit.core.device_decode import DeviceDecodeTransform, check_device_decode

        check_device_decode(augment, random_erasing)
        fast = _fast_train_transform(preprocess, flip, crop_scale, augment, 9, 0.0)
        return DeviceDecodeTransform(fast, flip=flip, interpolation=preprocess.interpolation)
    mode = T.InterpolationMode(preprocess.interpolation)
    if decode == "fast" and augment != "none":
        return _fast_train_transform(
            preprocess, flip, crop_scale, augment, randaugment_magnitude, random_erasing
        )
    if augment == "none":
        steps = [
            T.Resize(preprocess.resize_size, interpolation=mode, antialias=True),
            T.CenterCrop(preprocess.image_size),
        ]
    else:
        steps = [
            T.RandomResizedCrop(
                preprocess.image_size, scale=crop_scale, interpolation=mode, antialias=True
            )
        ]
        if flip:
            steps.append(T.RandomHorizontalFlip())
    steps += _policy_steps(augment, randaugment_magnitude, mode)
    steps += [T.ToTensor(), T.Normalize(preprocess.mean, preprocess.std)]
    if random_erasing > 0:
        steps.append(T.RandomErasing(p=random_erasing))
    return T.Compose(steps)


def _policy_steps(augment: str, randaugment_magnitude: int, mode) -> list:
    """The --augment policy's own transform (none for `basic` and `none`)."""
    from torchvision import transforms as T

    if augment == "trivialaugment":
        return [T.TrivialAugmentWide(interpolation=mode)]
    if augment == "randaugment":
        return [T.RandAugment(magnitude=randaugment_magnitude, interpolation=mode)]
    if augment == "autoaugment":
        return [T.AutoAugment(T.AutoAugmentPolicy.IMAGENET, interpolation=mode)]
    return []


def _fast_train_transform(
    preprocess: Preprocess,
    flip: bool,
    crop_scale: tuple[float, float],
    augment: str,
    randaugment_magnitude: int,
    random_erasing: float,
):
    """`train_transform`'s steps with its crop a `ReducedDecodeCrop`, its flip and ToTensor +
    Normalize leaner equivalents (bit for bit the same), in the same order, drawing the same
    random numbers."""
    from torchvision import transforms as T

    from torchkit.core.decode import (
        FileTrainTransform,
        HorizontalFlip,
        NormalizedTensor,
        ReducedDecodeCrop,
    )

    mode = T.InterpolationMode(preprocess.interpolation)
    crop = ReducedDecodeCrop(
        preprocess.image_size, scale=crop_scale, interpolation=preprocess.interpolation
    )
    steps: list = [HorizontalFlip()] if flip else []
    steps += _policy_steps(augment, randaugment_magnitude, mode)
    after = [T.RandomErasing(p=random_erasing)] if random_erasing > 0 else []
    return FileTrainTransform(crop, steps, NormalizedTensor(preprocess.mean, preprocess.std), after)


def loader_context():
    """The multiprocessing context of DataLoaders over `make_dataset`: fork where there is one,
    because the Dataset class is local and spawn or forkserver (the Linux default from Python
    3.14) could not pickle it; None (the platform's default) elsewhere. Workers never touch
    CUDA."""
    import multiprocessing

    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return None


def make_dataset(samples: Samples, transform, *, mode: str = "RGB", pixels: bool = False):
    """A torch Dataset over `samples` whose items are (tensor, label, index, error).

    Files are read by `core.image_files.load_image`: 16-bit images scaled to 8 bits, the pixels
    as stored (no EXIF rotation), and a path that is not a regular file (a FIFO, a dangling
    symlink) unreadable without being opened.
    An unreadable image gives `(None, label, index, "path: reason")` instead of raising, so one
    corrupt file does not kill a DataLoader worker; `collate_skipping_unreadable` drops it and
    reports it to the main process, which counts it (or stops, with --strict).

    A transform with a `from_file(path, mode)` method (`train_transform(decode="fast")`) reads
    image files itself, through the same opener. With `pixels`, such a transform's
    `pixels_from_file` is called instead: its items are uint8 pixels where it can give them
    (no random erasing), which the training loop normalises a batch at a time on the device
    (`FileTrainTransform.normalized`), a quarter of the bytes to pass along.
    """
    import torch
    from PIL import Image

    from torchkit.core.image_files import load_image, unreadable_image_errors

    from_file = getattr(transform, "pixels_from_file" if pixels else "from_file", None)
    unreadable = unreadable_image_errors()

    class _ImageDataset(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(samples)

        def __getitem__(self, index: int):
            label = samples.labels[index]
            try:
                if samples.images is not None:
                    image = Image.fromarray(samples.images[index])
                elif from_file is not None:
                    return from_file(samples.paths[index], mode), label, index, ""
                else:
                    # Regular files only (a FIFO would block), high bit depths scaled.
                    image = load_image(samples.paths[index], mode)
                if image.mode != mode:
                    image = image.convert(mode)
                return transform(image), label, index, ""
            except unreadable as error:
                name = samples.paths[index] if samples.paths else str(index)
                return None, label, index, f"{name}: {error}"

    return _ImageDataset()


def seed_worker(worker_id: int) -> None:
    """Seed NumPy and `random` in each DataLoader worker from torch's per-worker seed."""
    import random

    import numpy as np
    import torch

    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def default_workers() -> int:
    return max(0, min(8, (os.cpu_count() or 1) - 1))
