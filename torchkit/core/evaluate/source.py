"""What `eval` evaluates: a model with its class names and preprocessing, and a set of images.

The model is a `ModelSpec`, resolved as every command resolves one
(`torchkit.core.models.resolve_spec`): a torchkit checkpoint, a model name with
`--weights DEFAULT|FILE`, a plain state dict with `--model NAME`, or a pickled `nn.Module`
(trusted loading only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchkit.core.data.sources.samples import Samples
from torchkit.core.io.errors import InputError, UsageError
from torchkit.core.io.files import read_text
from torchkit.core.io.option_lists import list_items
from torchkit.core.io.shell_words import shell_word
from torchkit.core.models.spec import ModelSpec, refuse_weights_with_file

# A one-name --classes with such an ending, or a folder in it, names a file, not a class.
_CLASS_FILE_SUFFIXES = (".txt", ".csv", ".json", ".names", ".lst", ".list")


def parse_class_names(spec: str) -> list[str]:
    """`--classes`: a text file with one name per line in label order, with no blank line
    between two (a pipe too: `<(cut ...)`, /dev/stdin), a .json file as `classes.json` beside
    shards holds them (a list, or {name: index}), or names separated by commas. A name may be
    given twice exactly (ImageNet's two "crane"s), as in a checkpoint; blank names and one name
    in two Unicode spellings are refused, as the file readers refuse them."""
    path = Path(spec)
    try:
        # Anything but a folder: process substitution passes /dev/fd/N, a pipe, not a file.
        is_file = path.exists() and not path.is_dir()
    except OSError:  # a list of many names is longer than a file name may be (ENAMETOOLONG)
        is_file = False
    if not is_file and "," not in spec and (os.sep in spec or spec.endswith(_CLASS_FILE_SUFFIXES)):
        raise InputError(
            f"--classes file not found: {spec}",
            "check the path, or give the class names themselves, like a,b,c",
        )
    if is_file:
        from torchkit.core.data.sources.class_files import class_names_in_json, class_names_in_text

        try:
            text = read_text(path, "utf-8-sig")
        except OSError as error:  # unreadable: no permission, a socket, a folder's I/O error
            raise InputError(
                f"cannot read --classes file {spec}: {error.strerror or error}",
                "give a text file with one class name per line, or names like a,b,c",
            ) from None
        # A BOM (Notepad's "UTF-8") is no part of the first name, as in a CSV index.
        where = f"--classes file {spec}"
        if path.suffix.lower() != ".json":
            names = class_names_in_text(text, where)
        else:  # read as lines, `["cat",` would be a class name
            try:
                names = class_names_in_json(text, where)
            except ValueError as error:
                raise InputError(
                    f"{where} is not JSON: {error}",
                    "give a JSON list of class names in label order, or a text file with one "
                    "name a line",
                ) from None
    else:
        from torchkit.core.data.sources.class_files import refuse_unshowable_names

        names = list_items(spec, "--classes", hint="give class names like a,b,c, or a file")
        # As a file's names are held (`class_names_in_text`): `a,\u200b` printed as no name.
        refuse_unshowable_names(
            names, lambda index: f"--classes names class {index} {ascii(names[index])}", UsageError
        )
    if not names:
        raise UsageError(f"no class names in --classes {spec!r}")
    # A name given twice exactly names two outputs, as a checkpoint's may (torchvision's
    # ImageNet names hold two "crane"s): data labelled by it is refused where it is matched
    # (`relabelled`), which output its images belong to being a guess.
    return names


@dataclass
class EvalData:
    samples: Samples
    split: str | None  # the split scored (None: unsplit data, taken whole)
    root: str  # what the `path` column is relative to ("" for digits)
    notes: list[str]


def load_eval_samples(
    data: str,
    *,
    split: str | None = None,
    classes: Sequence[str] | None = None,
    recorded: Mapping[str, Any] | None = None,
) -> EvalData:
    """The images `--data` names (the one data resolver), labelled in the order of `classes`
    (matched by name): of split data (a split root, a CSV with a split column, digits) the test
    split unless `--split` says otherwise; unsplit data whole, or the split a training run held
    out of it (`recorded`: the checkpoint's `data` entry) with `--split`."""
    from torchkit.core.data.sources import DataSource, open_labelled, select_split
    from torchkit.core.data.sources.source import relabelled, split_without_labels_error

    # Labelled by the model's classes after the split is chosen: a class the model lacks is an
    # error only in the images scored, and names their split.

    def refused(opened: DataSource) -> bool:
        """Whether the images scored have one without a label (or none are: no split to score).
        Without a test split, the split a training run held out of its data is scored, not
        every split: a partly labelled train split gave no warning of its images read
        unlabelled while val was scored."""
        try:
            chosen, _ = select_split(
                opened, split, default="test", recorded=recorded, held_out_default=True, quiet=True
            )
        except (InputError, UsageError):  # refused below
            return True
        return chosen.has_unlabelled

    source, unlabelled = open_labelled(data, refused=refused)
    samples, notes = select_split(
        source,
        split,
        default="test",
        recorded=recorded,
        default_reason="held-out test data",
        held_out_default=True,
    )
    if unlabelled is not None and samples.has_unlabelled:
        # The error names the scored split's images without a label (the data's first refusal
        # may name another split's file); a split root's names its split folders of images
        # without class folders. Without --split, the test split, or the val split a run held
        # out where the data has no test split (it was said to be 'the test split').
        scored = split or _split_of(samples) or "test"
        refusal = unlabelled
        if scored in source.splits and source.kind not in ("split root", "tar split root"):
            refusal = split_without_labels_error(source, scored, unlabelled)
        if split is None:  # the default split: the labelled ones can still be scored
            labelled = [n for n in ("val", "train") if n in source.splits]
            labelled = [n for n in labelled if not source.splits[n].has_unlabelled] or ["all"]
            said = refusal.message  # the split named already, or not (a split root's)
            if refusal is unlabelled:
                said = f"the {scored} split of {source.spec} has no labels: {said}"
            raise InputError(
                said,
                f"--split {labelled[0]} scores a labelled split; predict reads unlabelled images",
            )
        raise refusal
    if unlabelled is not None:
        # The unlabelled split's class "" is no class of the labelled images scored: kept, it
        # was a third output a model of two lacked, or a blank name in the class order.
        samples = relabelled(samples, [name for name in source.classes if name], source.spec)
    used = split or _split_of(samples) or ("test" if source.splits else None)
    if classes:
        where = f"{source.spec} ({used})" if used else source.spec
        samples = relabelled(samples, classes, where)
    elif not source.classes_given:  # an order the data states is no guess (parquet, shards)
        refuse_guessed_class_order(samples.classes, source.spec)
    return EvalData(samples, used, source.root, notes)


def refuse_guessed_class_order(names: Sequence[str], data: str) -> None:
    """UsageError when a model that records no class names would be scored with the data's
    classes in an order sorting does not settle (`core.inference.class_names`): the same
    weights scored the same images differently by the data's form."""
    from torchkit.core.inference.class_names import unsettled_class_order

    unsettled = unsettled_class_order(names, data)
    if unsettled is not None:
        raise UsageError(
            f"the model records no class names, and {unsettled}",
            "pass --classes with the model's class names in the order of its outputs",
        )


def recorded_data(spec: ModelSpec) -> tuple[str, str]:
    """`--data` when it is not given: the data the checkpoint's training run recorded (digits,
    its image folder or split root, its CSV index), and a note saying so. UsageError when the
    model records none; InputError when that data is no longer where the run read it."""
    import os

    from torchkit.core.models import exported_format_of, is_model_file
    from torchkit.core.models.checkpoint import is_torchkit_checkpoint
    from torchkit.core.models.weights import read_model_file

    missing = UsageError(
        "--data is missing", "give the images to score: --data FOLDER, a CSV index or digits"
    )
    model, weights = spec.named()  # "nothing to evaluate" comes first
    refuse_weights_with_file(model, weights)
    path = weights or model
    if not path or not is_model_file(path) or not os.path.isfile(path):
        raise missing
    if exported_format_of(path) is not None:
        raise missing
    loaded = read_model_file(path, trust_checkpoint=spec.trust_checkpoint)
    record = loaded.get("data") if is_torchkit_checkpoint(loaded) else None
    if not isinstance(record, Mapping) or not record.get("kind"):
        raise UsageError(
            "--data is missing", f"{path} records no training data: give --data FOLDER|CSV|digits"
        )
    kind, root, typed = record.get("kind"), str(record.get("root") or ""), str(record.get("spec"))
    if kind == "digits":
        return "digits", f"--data digits: the data {path} was trained on"
    from torchkit.core.data.sources.http_shards import is_url

    if is_url(typed):  # shards named by URL: read again, through the cache
        return typed, f"--data {shell_word(typed)}: the data {path} was trained on"
    data = root
    # A CSV index, or one parquet file, lies in its root (paths relative to it).
    if kind in ("csv", "split csv", "parquet file"):
        data = typed if os.path.isabs(typed) else os.path.join(root, os.path.basename(typed))
    if not data or not os.path.exists(data):
        raise InputError(
            f"the data {path} was trained on is no longer at {data or typed}",
            "give --data where it is now",
        )
    return data, f"--data {shell_word(data)}: the data {path} was trained on"


def _split_of(samples: Samples) -> str | None:
    """The one split every sample belongs to (a held-out val chosen by default), else None."""
    names = set(samples.splits or ())
    return names.pop() if len(names) == 1 else None
