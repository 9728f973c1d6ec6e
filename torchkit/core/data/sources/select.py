"""Picking samples out of a DataSource: one split (`--split`), or train's train/val(/test)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from torchkit.core.data.sources.record import recorded_splits
from torchkit.core.data.sources.samples import Samples
from torchkit.core.data.sources.source import DataSource, concatenate, tagged
from torchkit.core.data.sources.splitting import (
    SPLIT_NAMES,
    sample_keys,
    spread_note,
    stratified_split,
)
from torchkit.core.io.errors import InputError, UsageError, first_and_more
from torchkit.core.io.wording import counted

log = logging.getLogger("torchkit")

ALL = "all"
SPLIT_CHOICES = (*SPLIT_NAMES, ALL)
DEFAULT_VAL_SPLIT = 0.1


def _unsplit_hint() -> str:
    return (
        "--split picks train/, val/ or test/ of a split root, the rows of a CSV index with a "
        "split column, or the split a training run recorded, given its checkpoint; drop --split"
    )


def empty_split_error(source: DataSource, name: str, hint: str | None = None) -> InputError:
    """The error for a split asked for whose folder holds no image (`DataSource.empty_splits`);
    the hint names the splits there are, for --split."""
    others = f"it has: {', '.join(source.splits)}; " if source.splits else ""
    return InputError(
        f"no images in {source.empty_splits[name]}: the {name} split of {source.spec} is empty",
        hint or f"{others}--split NAME picks another",
    )


def warn_empty_splits(source: DataSource, used: Collection[str] = ()) -> None:
    """One warning for each split folder of `source` that holds no image, but those named in
    `used` (a split a training run held out of another, read under that name)."""
    for name, where in source.empty_splits.items():
        if name not in used:
            log.warning(f"{where} holds no images: {source.spec} is read without a {name} split")


def warn_stray_images(source: DataSource, fate: str = "") -> None:
    """One warning per folder of `source` with image files beside its class folders
    (`DataSource.strays`), which no reader of labels reads: `N images beside the class folders
    of D are not read: a.png, b.png and 3 more`; `fate` adds what follows for the command
    (split's `and not copied`). The same for `.tar` files in an image folder or split root
    (`DataSource.unread_archives`), which its reader does not read."""
    for where, names in source.strays.items():
        count = len(names)
        what = counted(count, "image")
        verb = "is" if count == 1 else "are"
        log.warning(
            f"{what} beside the class folders of {where} {verb} not read"
            + (f" {fate}" if fate else "")
            + f": {first_and_more(names, 3)}"
        )
    # Not `with_article`: the docs' message check reads a string expression named once, not a
    # call, into the template of the warning below.
    read_as = ("an " if source.kind[:1] in "aeiou" else "a ") + source.kind
    for where, names in source.unread_archives.items():
        verb = "is" if len(names) == 1 else "are"
        log.warning(
            f"{counted(len(names), '.tar file')} in {where}, read as {read_as}, {verb} "
            f"not read" + (f" {fate}" if fate else "") + f": {first_and_more(names, 3)} (to "
            f"read shards, name them: {where}/NAME-{{000000..000009}}.tar)"
        )


def select_split(
    source: DataSource,
    split: str | None,
    *,
    default: str,
    recorded: Mapping | None = None,
    default_reason: str = "",
    held_out_default: bool = False,
    quiet: bool = False,
) -> tuple[Samples, list[str]]:
    """The samples `--split` names in `source`, and notes for the user.

    `split`: train, val, test, `all` (every split, each sample knowing its split) or None.
    None takes the whole of unsplit data, and the `default` split (or `all`) of split data,
    with a note (`default_reason` says why that one). A split works wherever splits exist: in
    split data, and in unsplit data (or a split root without val/) whose held-out split a
    training run recorded (`recorded`: the checkpoint's `data` entry). Anywhere else it is a
    UsageError, never ignored. A split whose folder holds no image (`empty_splits`) is an
    InputError when it is the one asked for (or the default), and a warning otherwise.

    `held_out_default` (eval): without --split, the data a training run used (`recorded`, same
    root) that has no test split of its own gives the split the run held out (its val), not
    the whole data, most of which the model trained on.

    `quiet`: no warning of empty splits or stray images (the samples only, looked at before
    they are read).
    """
    chosen = _select_split(source, split, default, recorded, default_reason, held_out_default)
    if quiet:
        return chosen
    warn_empty_splits(source, set(chosen[0].splits or ()))
    warn_stray_images(source)
    return chosen


def _select_split(
    source: DataSource,
    split: str | None,
    default: str,
    recorded: Mapping | None,
    default_reason: str,
    held_out_default: bool,
) -> tuple[Samples, list[str]]:
    if split is not None and split not in SPLIT_CHOICES:
        raise UsageError(f"unknown --split {split!r}", "use train, val, test or all")
    if split is None and held_out_default and recorded and "test" not in source.splits:
        held_out = _held_out_of_run(source, recorded)
        if held_out is not None:
            return held_out
    notes: list[str] = []
    parts = source.splits
    # The record is only read when a split is asked for: other data than the run's (a new test
    # folder) given without --split is taken whole, not matched against the run's images.
    rebuilt = recorded_splits(source, dict(recorded) if recorded and split else None)
    if rebuilt is not None:
        parts, notes = rebuilt
    if split is None:
        if not source.splits:
            return source.whole, notes
        split = default
        if default != ALL:
            if default not in parts and default in source.empty_splits:
                raise empty_split_error(source, default)
            if default not in parts:
                raise UsageError(
                    f"{source.spec} has no {default} split (it has {', '.join(parts)})",
                    "choose one with --split NAME, or --split all",
                )
            why = f" ({default_reason})" if default_reason else ""
            notes.append(
                f"{source.spec} is split into {', '.join(parts)}: using {default}{why}; "
                "--split NAME picks another, --split all takes every split"
            )
    if not parts:
        raise UsageError(f"--split {split}: {source.spec} is not split data", _unsplit_hint())
    if split == ALL:
        return concatenate(list(parts.values())), notes
    if split not in parts and split in source.empty_splits:
        raise empty_split_error(source, split)
    if split not in parts:
        raise UsageError(
            f"{source.spec} has no {split} split", f"it has: {', '.join(parts)}; or --split all"
        )
    if parts[split] is not source.splits.get(split):
        notes.append(f"the {split} split the training run made: {len(parts[split])} images")
    return parts[split], notes


def is_run_data(source: DataSource, recorded: Mapping) -> bool:
    """Whether `source` is the data a training run recorded (`recorded`: its `data` entry)."""
    import os

    if source.kind == "digits" or recorded.get("kind") == "digits":
        return source.kind == recorded.get("kind")
    root = recorded.get("root")
    return bool(root) and bool(source.root) and os.path.abspath(source.root) == root


def _held_out_of_run(source: DataSource, recorded: Mapping) -> tuple[Samples, list[str]] | None:
    """The val split a run held out of `source` (or `source`'s own val), with a note saying so;
    None when `source` is not the run's data or the run held nothing out."""
    if not is_run_data(source, recorded):
        return None
    rebuilt = recorded_splits(source, dict(recorded))
    parts, notes = rebuilt if rebuilt is not None else (dict(source.splits), [])
    if "val" not in parts:
        return None
    held = parts["val"]
    notes.append(
        f"{source.spec} is the data the model was trained on: scoring the val split its run "
        f"held out ({len(held)} images), not the images it trained on; --split train or "
        "--split all scores those too"
    )
    return held, notes


def training_splits(
    source: DataSource,
    *,
    val_split: float | None,
    seed: int,
    recorded: Mapping | None = None,
) -> tuple[dict[str, Samples], list[str]]:
    """train, val (and test) for training on `source`, and notes for the user.

    Data with its own val split trains as it is (a `val_split` given is ignored, with a
    warning). Otherwise a stratified, seeded share (`val_split`, default 0.1) of train (split
    data without val, e.g. a CIFAR root with train/ and test/) or of everything (unsplit data)
    is held out for validation, with a note. `recorded` (a resumed run's checkpoint `data`
    entry) gives back exactly the split that run held out. A split folder that holds no image
    counts as no split, with a warning (train's is an error).
    """
    if val_split is not None and not 0 < val_split < 1:
        raise UsageError(f"--val-split must be between 0 and 1, not {val_split}")
    if source.splits and "train" not in source.splits:
        if "train" in source.empty_splits:
            raise empty_split_error(source, "train", "train reads ROOT/train/<class>/<image>")
        raise InputError(
            f"{source.spec} has no training split (it has {', '.join(source.splits)})",
            "add train/, or rows with split train",
        )
    warn_empty_splits(source)
    warn_stray_images(source)
    rebuilt = recorded_splits(source, dict(recorded) if recorded else None)
    if rebuilt is not None:
        return rebuilt
    if recorded:
        _check_resumed_val_split(source, recorded)
    if "val" in source.splits:
        # a resumed run's --val-split is the recorded one, warned of when the run began
        if val_split is not None and not recorded:
            log.warning("--val-split is ignored: %s has its own validation split", source.spec)
        return dict(source.splits), []
    fraction = DEFAULT_VAL_SPLIT if val_split is None else val_split
    if source.splits:
        donor, what = source.splits["train"], "its train split"
    else:
        donor, what = source.whole, "its images"
    # keyed by path, as `split` is: the same images listed in another order (a folder, its CSV
    # index, its .tar) hold out the same ones
    keys = sample_keys(donor)
    filled: list[int] = []
    train_part, val_part = stratified_split(
        donor.labels, (1 - fraction, fraction), seed, keys=keys, filled=filled
    )
    splits = {
        "train": tagged(donor.subset(train_part), "train"),
        "val": tagged(donor.subset(val_part), "val"),
    }
    if "test" in source.splits:
        splits["test"] = source.splits["test"]
    has = f"has no val split ({', '.join(source.splits)})" if source.splits else "is not split"
    note = (
        f"{source.spec} {has}: holding out {fraction:g} of {what} for validation "
        f"({len(val_part)} images; stratified, --seed {seed}"
        + ("" if val_split is not None else "; --val-split sets the share")
        + "), recorded in the run's split.csv"
    )
    notes = [note]
    if filled:
        notes.append(spread_note("val", len(val_part), len({donor.labels[i] for i in val_part})))
    return splits, notes


def _check_resumed_val_split(source: DataSource, recorded: Mapping) -> None:
    """A resumed run (`recorded`: its checkpoint's `data` entry) validates on the images it
    validated on. Data given in another form that would make another val split is refused
    (InputError): a val split of its own where the run held its val images out itself, or no
    val split (a fresh one would be held out) where the run had the data's own. Either moves
    validation images into training, and best.pt would be picked on other images."""
    where = recorded.get("root") or recorded.get("spec")
    hint = f"resume with the data the run started with: {where}"
    if recorded.get("held_out"):  # `recorded_splits` found no split to take them back from
        has = (
            "has a val split of its own"
            if "val" in source.splits
            else f"has no {recorded.get('held_out_of')} split to hold them out of"
        )
        raise InputError(
            f"the run validated on images it held out of {where}; {source.spec} {has}", hint
        )
    if "val" in (recorded.get("sizes") or {}) and "val" not in source.splits:
        raise InputError(
            f"the run validated on the val split of {where}; {source.spec} has none (a new "
            "one would move validation images into training)",
            hint,
        )
